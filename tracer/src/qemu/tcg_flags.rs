//! A QEMU bug that corrupts guests under TCG, and that a trace makes
//! likelier: which QEMUs have it.
//!
//! QEMU up to 7.2 computes `cmpxchg16b`'s flags in a helper
//! (target/i386/tcg/mem_helper.c `helper_cmpxchg16b_unlocked`:
//! `cpu_cc_compute_all(env, CC_OP)`) from the flags state TCG keeps lazily,
//! which its translator does not bring up to date before the call
//! (target/i386/tcg/translate.c, `case 0x1c7`). When the translation block
//! began with that state "the flags as they are" (`CC_OP_EFLAGS`: after a
//! compare-and-exchange that failed and is retried, or a `popf`) and an
//! arithmetic instruction before the exchange left its operand where the
//! flags are kept, the flags after the exchange are that operand: TF, DF,
//! AC, reserved bits. Until the next instruction that sets flags, an
//! interrupt taken there pushes them, and its `iret` loads them: a
//! single-step #DB in the kernel (`WARNING: ... exc_debug_kernel`), string
//! copies run backwards, a crash. Linux's SLUB allocator retries exactly
//! so (`__update_cpu_freelist_fast`'s `cmpxchg16b %gs:(%rsi)`, after `add
//! %rdi,%rax`) when an interrupt allocated from the same cache between its
//! read and its exchange. Seen here three times in about thirty runs of
//! tests/qemu_modules.rs: oopses right after that exchange in
//! `__kmalloc_noprof` and `__kmalloc_cache_noprof`, the EFLAGS printed
//! once equal to RDI with bit 1 set. A trap-mode trace stops the VM at every
//! traced call; interrupts pend meanwhile and are taken at the first
//! instruction boundary after each resume, which is how the trace makes
//! both rare events likelier. QEMU 8.0 inlines the instruction
//! (`gen_cmpxchg16b`), its flags from the translator's own state.

use super::monitor::Monitor;
use super::qmp::{QemuVersion, QmpError};
use super::queries::Queries;

/// The first QEMU release whose TCG computes `cmpxchg16b`'s flags right.
const FIXED_IN: (u32, u32) = (8, 0);

/// Whether a guest of this QEMU (`accel`: "tcg" or "kvm"; `cx16`: its
/// vCPU's `cx16` feature, None when QEMU did not say) runs `cmpxchg16b`
/// through the helper above.
pub fn cmpxchg16b_flags_bug(version: &QemuVersion, accel: &str, cx16: Option<bool>) -> bool {
    accel == "tcg" && (version.major, version.minor) < FIXED_IN && cx16 == Some(true)
}

/// `cmpxchg16b_flags_bug` of the QEMU behind `qmp` (`accel` its
/// accelerator), its first vCPU (`qom_path`) asked for `cx16` under TCG.
pub fn asked(qmp: &mut Monitor, accel: &str, qom_path: &str) -> Result<bool, QmpError> {
    let cx16 = match accel {
        "tcg" => qmp.cpu_feature(qom_path, "cx16")?,
        _ => None,
    };
    Ok(cmpxchg16b_flags_bug(qmp.version(), accel, cx16))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qemu(major: u32, minor: u32) -> QemuVersion {
        QemuVersion {
            major,
            minor,
            micro: 0,
            package: String::new(),
        }
    }

    #[test]
    fn only_tcg_before_8_0_with_cx16_has_the_bug() {
        assert!(cmpxchg16b_flags_bug(&qemu(7, 2), "tcg", Some(true)));
        assert!(cmpxchg16b_flags_bug(&qemu(6, 2), "tcg", Some(true)));
        assert!(!cmpxchg16b_flags_bug(&qemu(8, 0), "tcg", Some(true)));
        assert!(!cmpxchg16b_flags_bug(&qemu(7, 2), "kvm", Some(true)));
        assert!(!cmpxchg16b_flags_bug(&qemu(7, 2), "tcg", Some(false)));
        assert!(!cmpxchg16b_flags_bug(&qemu(7, 2), "tcg", None));
    }
}
