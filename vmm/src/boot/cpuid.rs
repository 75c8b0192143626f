//! CPUID for each vCPU: what KVM supports, with the vCPU's own APIC id.

use kvm_bindings::{kvm_cpuid_entry2, CpuId, KVM_CPUID_FLAG_SIGNIFCANT_INDEX};
use kvm_ioctls::VcpuFd;

#[derive(Debug, thiserror::Error)]
pub enum CpuidError {
    #[error("KVM_SET_CPUID2 failed on vCPU {cpu}: {source}")]
    Set {
        cpu: usize,
        source: kvm_ioctls::Error,
    },
    #[error("vCPU {cpu}: too many CPUID entries for KVM_SET_CPUID2: {source:?}")]
    TooMany {
        cpu: usize,
        source: vmm_sys_util::fam::Error,
    },
}

/// Leaf 1: EBX[31:24] initial APIC id, EBX[23:16] logical processor count,
/// ECX[31] "running on a hypervisor", EDX[28] HTT (the count is valid).
const LEAF_FEATURES: u32 = 1;
const LEAF1_ECX_HYPERVISOR: u32 = 1 << 31;
const LEAF1_EDX_HTT: u32 = 1 << 28;
/// Leaf 4: deterministic cache parameters, one subleaf per cache.
/// EAX[4:0] cache type (0: no more caches), EAX[7:5] cache level,
/// EAX[25:14] logical processors sharing it - 1, EAX[31:26] cores per
/// package - 1.
const LEAF_CACHES: u32 = 4;
const LEAF4_TYPE_MASK: u32 = 0x1f;
const LEAF4_LEVEL_SHIFT: u32 = 5;
const LEAF4_LEVEL_MASK: u32 = 0x7;
const LEAF4_SHARING_SHIFT: u32 = 14;
const LEAF4_SHARING_MASK: u32 = 0xfff;
const LEAF4_CORES_SHIFT: u32 = 26;
const LEAF4_CORES_MASK: u32 = 0x3f;
/// Leaves 0xb and 0x1f: extended topology. Per subleaf (level): EAX[4:0]
/// bits to shift the x2APIC id right to get the next level's id, EBX[15:0]
/// logical processors at this level, ECX[7:0] the subleaf, ECX[15:8] the
/// level type (1 SMT, 2 core, 0 invalid: the end), EDX the x2APIC id.
const LEAF_TOPOLOGY: u32 = 0xb;
const LEAF_TOPOLOGY_V2: u32 = 0x1f;
const TOPOLOGY_LEVEL_SMT: u32 = 1;
const TOPOLOGY_LEVEL_CORE: u32 = 2;
const TOPOLOGY_TYPE_SHIFT: u32 = 8;

/// KVM's paravirtual feature leaf (EAX = feature bits).
const LEAF_KVM_FEATURES: u32 = 0x4000_0001;
/// KVM features the guest uses through the `vmcall` hypercall: PV unhalt
/// (KVM_HC_KICK_CPU), PV IPIs (KVM_HC_SEND_IPI), PV sched yield
/// (KVM_HC_SCHED_YIELD). Bits from Linux's `kvm_para.h`.
const KVM_HYPERCALL_FEATURES: u32 = (1 << 7) | (1 << 11) | (1 << 13);

/// Install `supported` (from KVM_GET_SUPPORTED_CPUID) on `vcpu`, patched with
/// its APIC id (= its index), the vCPU count and the machine's topology. With
/// `hide_hypercalls`, the guest is not offered the KVM features that need
/// `vmcall`: on hosts whose KVM emulates guest ring 0 (the CI host), a
/// `vmcall` never returns, so a Linux guest hangs at its first PV IPI.
pub fn setup_cpuid(
    vcpu: &VcpuFd,
    cpu: usize,
    ncpus: usize,
    supported: &CpuId,
    hide_hypercalls: bool,
) -> Result<(), CpuidError> {
    let entries = vcpu_entries(supported.as_slice(), cpu, ncpus, hide_hypercalls);
    let cpuid =
        CpuId::from_entries(&entries).map_err(|source| CpuidError::TooMany { cpu, source })?;
    vcpu.set_cpuid2(&cpuid)
        .map_err(|source| CpuidError::Set { cpu, source })
}

/// The CPUID entries of vCPU `cpu` of `ncpus`.
///
/// The topology is the machine vmtrace builds, not the host's: one package
/// of `ncpus` cores, one thread each, APIC ids `0..ncpus`; L1 and L2 caches
/// per core, the last level shared by the package. Passing the host's
/// leaves through (here: 2 cores, the L3 shared by 2 threads, an empty leaf
/// 0xb) gives Linux sibling and cache masks that do not nest, and with 4
/// vCPUs it prints `BUG: arch topology borken` (kernel/sched/topology.c).
pub fn vcpu_entries(
    supported: &[kvm_cpuid_entry2],
    cpu: usize,
    ncpus: usize,
    hide_hypercalls: bool,
) -> Vec<kvm_cpuid_entry2> {
    let apic_id = cpu as u32;
    // APIC id bits for the core within the package.
    let core_bits = (ncpus.max(1) as u32).next_power_of_two().trailing_zeros();
    let per_package = 1u32 << core_bits;
    let last_level = supported
        .iter()
        .filter(|e| e.function == LEAF_CACHES && e.eax & LEAF4_TYPE_MASK != 0)
        .map(|e| (e.eax >> LEAF4_LEVEL_SHIFT) & LEAF4_LEVEL_MASK)
        .max()
        .unwrap_or(0);
    let mut out: Vec<kvm_cpuid_entry2> = Vec::with_capacity(supported.len() + 3);
    for e in supported {
        let mut e = *e;
        match e.function {
            LEAF_FEATURES => {
                e.ebx = (e.ebx & 0x0000_ffff) | (apic_id << 24) | ((per_package & 0xff) << 16);
                e.ecx |= LEAF1_ECX_HYPERVISOR;
                e.edx |= LEAF1_EDX_HTT;
            }
            LEAF_CACHES if e.eax & LEAF4_TYPE_MASK != 0 => {
                let level = (e.eax >> LEAF4_LEVEL_SHIFT) & LEAF4_LEVEL_MASK;
                let sharing = if level == last_level { per_package } else { 1 };
                e.eax &= !((LEAF4_SHARING_MASK << LEAF4_SHARING_SHIFT)
                    | (LEAF4_CORES_MASK << LEAF4_CORES_SHIFT));
                e.eax |= ((sharing - 1) & LEAF4_SHARING_MASK) << LEAF4_SHARING_SHIFT;
                e.eax |= ((per_package - 1) & LEAF4_CORES_MASK) << LEAF4_CORES_SHIFT;
            }
            // Replaced below: leaf 0xb by ours, leaf 0x1f by nothing (Linux
            // then reads 0xb).
            LEAF_TOPOLOGY | LEAF_TOPOLOGY_V2 => continue,
            LEAF_KVM_FEATURES if hide_hypercalls => e.eax &= !KVM_HYPERCALL_FEATURES,
            _ => {}
        }
        out.push(e);
    }
    // Leaf 0xb: SMT level (1 thread, 0 bits), core level (all vCPUs), end.
    let levels = [
        (0, 1, TOPOLOGY_LEVEL_SMT),
        (core_bits, ncpus as u32, TOPOLOGY_LEVEL_CORE),
        (0, 0, 0),
    ];
    for (index, (shift, count, kind)) in levels.into_iter().enumerate() {
        out.push(kvm_cpuid_entry2 {
            function: LEAF_TOPOLOGY,
            index: index as u32,
            flags: KVM_CPUID_FLAG_SIGNIFCANT_INDEX,
            eax: shift,
            ebx: count,
            ecx: (kind << TOPOLOGY_TYPE_SHIFT) | index as u32,
            edx: apic_id,
            ..Default::default()
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What this CI host's KVM_GET_SUPPORTED_CPUID says (2026-11-22): two
    /// cores, L1d/L1i/L2 per core, the L3 shared by 2 threads, empty 0xb/0x1f.
    fn host() -> Vec<kvm_cpuid_entry2> {
        let e = |function, index, flags, eax, ebx, ecx, edx| kvm_cpuid_entry2 {
            function,
            index,
            flags,
            eax,
            ebx,
            ecx,
            edx,
            ..Default::default()
        };
        vec![
            e(
                0x1,
                0,
                0,
                0x000a_0671,
                0x0002_0800,
                0x8120_2000,
                0x0f8b_fbff,
            ),
            e(0x4, 0, 1, 0x0400_0121, 0x02c0_003f, 0x3f, 0),
            e(0x4, 1, 1, 0x0400_0122, 0x03c0_003f, 0x3f, 0),
            e(0x4, 2, 1, 0x0400_0143, 0x03c0_003f, 0x7ff, 0),
            e(0x4, 3, 1, 0x0400_4163, 0x03c0_003f, 0x77fff, 4),
            e(0x4, 4, 1, 0, 0, 0, 0),
            e(0xb, 0, 1, 0, 0, 0, 0),
            e(0x1f, 0, 1, 0, 0, 0, 0),
        ]
    }

    /// Linux's view (arch/x86/kernel/cpu/topology.c, cacheinfo.c): a
    /// vCPU's (core id, package id, id of each cache's sharing group).
    fn linux_view(entries: &[kvm_cpuid_entry2]) -> (u32, u32, Vec<(u32, u32)>) {
        let leaf = |f: u32, i: u32| entries.iter().find(|e| e.function == f && e.index == i);
        let smt = leaf(0xb, 0).expect("leaf 0xb SMT level");
        assert_eq!((smt.ecx >> 8) & 0xff, TOPOLOGY_LEVEL_SMT);
        let core = leaf(0xb, 1).expect("leaf 0xb core level");
        assert_eq!((core.ecx >> 8) & 0xff, TOPOLOGY_LEVEL_CORE);
        assert_eq!((leaf(0xb, 2).unwrap().ecx >> 8) & 0xff, 0, "the levels end");
        assert!(leaf(0x1f, 0).is_none());
        let apic = smt.edx;
        assert_eq!(core.edx, apic);
        assert_eq!(leaf(1, 0).unwrap().ebx >> 24, apic);
        let caches = entries
            .iter()
            .filter(|e| e.function == 4 && e.eax & 0x1f != 0)
            .map(|e| {
                let sharing = ((e.eax >> 14) & 0xfff) + 1;
                let msb = sharing.next_power_of_two().trailing_zeros();
                ((e.eax >> 5) & 7, apic >> msb)
            })
            .collect();
        (apic >> smt.eax, apic >> core.eax, caches)
    }

    #[test]
    fn every_vcpu_count_gets_one_package_of_single_thread_cores() {
        for ncpus in [1, 2, 3, 4, 5, 8, 64] {
            let views: Vec<_> = (0..ncpus)
                .map(|cpu| linux_view(&vcpu_entries(&host(), cpu, ncpus, false)))
                .collect();
            for (cpu, (core, package, caches)) in views.iter().enumerate() {
                assert_eq!(*core, cpu as u32, "{ncpus} vCPUs: a core each");
                assert_eq!(*package, 0, "{ncpus} vCPUs: one package");
                for &(level, group) in caches {
                    // L1 and L2 per core, L3 per package: nested as the
                    // scheduler's SMT < MC < DIE domains must be.
                    let want = if level == 3 { 0 } else { cpu as u32 };
                    assert_eq!(group, want, "{ncpus} vCPUs, vCPU {cpu}, L{level}");
                }
            }
        }
    }

    #[test]
    fn leaf_1_and_hypercall_features_are_patched() {
        let mut h = host();
        h.push(kvm_cpuid_entry2 {
            function: LEAF_KVM_FEATURES,
            eax: u32::MAX,
            ..Default::default()
        });
        let e = vcpu_entries(&h, 3, 4, true);
        let l1 = e.iter().find(|e| e.function == 1).unwrap();
        assert_eq!(l1.ebx >> 24, 3);
        assert_eq!((l1.ebx >> 16) & 0xff, 4);
        assert_ne!(l1.ecx & LEAF1_ECX_HYPERVISOR, 0);
        let kvm = e.iter().find(|e| e.function == LEAF_KVM_FEATURES).unwrap();
        assert_eq!(kvm.eax & KVM_HYPERCALL_FEATURES, 0);
    }
}
