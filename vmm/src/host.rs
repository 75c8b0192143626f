//! What this host's KVM can run.

use std::path::Path;

/// Present when the host's KVM is the pagetable-based nested one (kvm_pvm),
/// which runs guest ring 0 in its instruction emulator.
const EMULATOR_HOST_MARKER: &str = "/sys/module/kvm_pvm";

/// Does this host's KVM run guest ring 0 in its instruction emulator? There
/// a guest instruction costs about a microsecond, `int3` cannot run, and
/// the guest command line and CPUID must avoid what the emulator lacks
/// (docs/emulating-kvm.md; `boot::cmdline`, `boot::cpuid`).
pub fn emulates_ring0() -> bool {
    Path::new(EMULATOR_HOST_MARKER).exists()
}
