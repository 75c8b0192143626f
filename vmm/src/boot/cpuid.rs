//! CPUID for each vCPU: what KVM supports, with the vCPU's own APIC id.

use kvm_bindings::CpuId;
use kvm_ioctls::VcpuFd;

#[derive(Debug, thiserror::Error)]
#[error("KVM_SET_CPUID2 failed on vCPU {cpu}: {source}")]
pub struct CpuidError {
    cpu: usize,
    source: kvm_ioctls::Error,
}

/// Leaf 1: EBX[31:24] initial APIC id, EBX[23:16] logical processor count,
/// ECX[31] "running on a hypervisor", EDX[28] HTT (the count is valid).
const LEAF_FEATURES: u32 = 1;
const LEAF1_ECX_HYPERVISOR: u32 = 1 << 31;
const LEAF1_EDX_HTT: u32 = 1 << 28;
/// Leaves 0xb and 0x1f: extended topology, EDX = x2APIC id.
const LEAF_TOPOLOGY: u32 = 0xb;
const LEAF_TOPOLOGY_V2: u32 = 0x1f;

/// Install `supported` (from KVM_GET_SUPPORTED_CPUID) on `vcpu`, patched with
/// its APIC id (= its index) and the vCPU count.
pub fn setup_cpuid(
    vcpu: &VcpuFd,
    cpu: usize,
    ncpus: usize,
    supported: &CpuId,
) -> Result<(), CpuidError> {
    let mut cpuid = supported.clone();
    let apic_id = cpu as u32;
    for e in cpuid.as_mut_slice() {
        match e.function {
            LEAF_FEATURES => {
                e.ebx = (e.ebx & 0x0000_ffff) | (apic_id << 24) | ((ncpus as u32 & 0xff) << 16);
                e.ecx |= LEAF1_ECX_HYPERVISOR;
                e.edx |= LEAF1_EDX_HTT;
            }
            LEAF_TOPOLOGY | LEAF_TOPOLOGY_V2 => e.edx = apic_id,
            _ => {}
        }
    }
    vcpu.set_cpuid2(&cpuid)
        .map_err(|source| CpuidError { cpu, source })
}
