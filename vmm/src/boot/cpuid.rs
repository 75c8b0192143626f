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

/// KVM's paravirtual feature leaf (EAX = feature bits).
const LEAF_KVM_FEATURES: u32 = 0x4000_0001;
/// KVM features the guest uses through the `vmcall` hypercall: PV unhalt
/// (KVM_HC_KICK_CPU), PV IPIs (KVM_HC_SEND_IPI), PV sched yield
/// (KVM_HC_SCHED_YIELD). Bits from Linux's `kvm_para.h`.
const KVM_HYPERCALL_FEATURES: u32 = (1 << 7) | (1 << 11) | (1 << 13);

/// Install `supported` (from KVM_GET_SUPPORTED_CPUID) on `vcpu`, patched with
/// its APIC id (= its index) and the vCPU count. With `hide_hypercalls`, the
/// guest is not offered the KVM features that need `vmcall`: on hosts whose KVM
/// emulates guest ring 0 (the CI host), a `vmcall` never returns, so a Linux
/// guest hangs at its first PV IPI.
pub fn setup_cpuid(
    vcpu: &VcpuFd,
    cpu: usize,
    ncpus: usize,
    supported: &CpuId,
    hide_hypercalls: bool,
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
            LEAF_KVM_FEATURES if hide_hypercalls => e.eax &= !KVM_HYPERCALL_FEATURES,
            _ => {}
        }
    }
    vcpu.set_cpuid2(&cpuid)
        .map_err(|source| CpuidError { cpu, source })
}
