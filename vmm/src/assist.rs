//! Emulation assist.
//!
//! On hosts where KVM runs guest ring-0 code in its instruction emulator (a
//! nested KVM like the CI host's, see shared/KVM-HOST.md), some instructions
//! cannot be emulated and come back as KVM_EXIT_INTERNAL_ERROR with the
//! emulation suberror and the instruction bytes. `int3` is one of them and
//! Linux executes it at boot (its alternatives self-test), so the VMM carries
//! it out: RIP past the 0xcc, #BP injected, the guest's own handler runs.
//! `fwait` is another (stock kernels run it in `fpu__drop` when a task
//! exits): with no unmasked x87 exception pending it does nothing, so the VMM
//! steps over it, else it raises #MF like the CPU would.
//! Anything else stops the run with the instruction decoded and a hint. On
//! bare-metal KVM none of this triggers.

use iced_x86::{Decoder, DecoderOptions, Formatter, IntelFormatter, Mnemonic};
use kvm_bindings::{
    kvm_run, KVM_INTERNAL_ERROR_EMULATION, KVM_INTERNAL_ERROR_EMULATION_FLAG_INSTRUCTION_BYTES,
};

/// #BP, the breakpoint exception `int3` raises.
pub const BP_VECTOR: u8 = 3;
/// #MF, the x87 floating-point error `fwait` raises when one is pending.
pub const MF_VECTOR: u8 = 16;
/// x87 status word: ES, an unmasked exception is pending.
pub const FSW_ES: u16 = 1 << 7;
/// Longest x86 instruction.
const MAX_INSN_LEN: usize = 15;

#[derive(Debug, thiserror::Error)]
pub enum AssistError {
    #[error(
        "vCPU {cpu} executed `{insn}` at {rip:#x}, which this host's KVM cannot emulate; {hint}"
    )]
    Unsupported {
        cpu: usize,
        insn: String,
        rip: u64,
        hint: &'static str,
    },
    #[error("vCPU {cpu} stopped with KVM internal error (suberror {suberror}) at {rip:#x}")]
    Internal { cpu: usize, suberror: u32, rip: u64 },
}

/// What the VMM does for a failed emulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Assist {
    /// Skip the one-byte `int3` and inject #BP.
    Int3,
    /// `fwait` of this length: skip it, or inject #MF if the x87 status
    /// word has an unmasked exception pending.
    Fwait(u8),
}

/// The instruction bytes KVM reports with an emulation failure, if any.
pub fn failure_bytes(run: &kvm_run) -> Result<Vec<u8>, u32> {
    // SAFETY: the caller saw exit_reason == KVM_EXIT_INTERNAL_ERROR, for which
    // the kernel fills the `internal`/`emulation_failure` union member; both
    // views are plain integers, valid for any bit pattern.
    let failure = unsafe { run.__bindgen_anon_1.emulation_failure };
    if failure.suberror != KVM_INTERNAL_ERROR_EMULATION {
        return Err(failure.suberror);
    }
    if failure.flags & u64::from(KVM_INTERNAL_ERROR_EMULATION_FLAG_INSTRUCTION_BYTES) == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: as above; the flag says the instruction bytes are present.
    let insn = unsafe { failure.__bindgen_anon_1.__bindgen_anon_1 };
    let len = usize::from(insn.insn_size).min(MAX_INSN_LEN);
    Ok(insn.insn_bytes[..len].to_vec())
}

/// Decode `bytes` (fetched at `rip`) and choose the assist, or explain why not.
pub fn choose(cpu: usize, rip: u64, bytes: &[u8]) -> Result<Assist, AssistError> {
    let mut decoder = Decoder::with_ip(64, bytes, rip, DecoderOptions::NONE);
    let insn = decoder.decode();
    if !insn.is_invalid() && insn.mnemonic() == Mnemonic::Int3 {
        return Ok(Assist::Int3);
    }
    if !insn.is_invalid() && insn.mnemonic() == Mnemonic::Wait {
        return Ok(Assist::Fwait(insn.len() as u8));
    }
    Err(AssistError::Unsupported {
        cpu,
        insn: describe(rip, bytes),
        rip,
        hint: hint(&insn),
    })
}

/// How to keep a Linux guest away from an instruction the emulator cannot run.
fn hint(insn: &iced_x86::Instruction) -> &'static str {
    use Mnemonic::*;
    match insn.mnemonic() {
        Xsave | Xsave64 | Xsaveopt | Xsaveopt64 | Xsavec | Xsavec64 | Xsaves | Xsaves64
        | Xrstor | Xrstor64 | Xrstors | Xrstors64 | Xgetbv | Xsetbv | Cmpxchg16b | Popcnt
        | Clac | Stac => {
            "boot Linux with `noxsave clearcpuid=cx16,popcnt,smap` (the default command line \
             does, unless --cmdline-replace drops it), or run on a bare-metal KVM host"
        }
        _ if insn.is_invalid() => "run on a bare-metal KVM host",
        _ => {
            "the guest kernel runs it in ring 0, which this host emulates; if it is kernel-mode \
             SIMD (between kernel_fpu_begin/end, e.g. crypto or BLAKE2s), clearing the CPU \
             features that code checks may avoid it (see docs/linux-guest-notes.md), \
             else run on a bare-metal KVM host"
        }
    }
}

/// An instruction in Intel syntax, or its bytes when it does not decode.
pub fn describe(rip: u64, bytes: &[u8]) -> String {
    let mut decoder = Decoder::with_ip(64, bytes, rip, DecoderOptions::NONE);
    let insn = decoder.decode();
    if bytes.is_empty() || insn.is_invalid() {
        let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
        return format!("undecodable bytes [{}]", hex.join(" "));
    }
    let mut out = String::new();
    IntelFormatter::new().format(&insn, &mut out);
    out
}

/// Name of an assist, for `--stats`.
pub fn name(a: Assist) -> &'static str {
    match a {
        Assist::Int3 => "int3",
        Assist::Fwait(_) => "fwait",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int3_is_assisted_and_xrstor_is_named() {
        assert_eq!(choose(0, 0x1000, &[0xcc, 0x90]).unwrap(), Assist::Int3);
        assert_eq!(choose(0, 0x1000, &[0x9b, 0x65]).unwrap(), Assist::Fwait(1));
        let err = choose(1, 0xffff_ffff_8100_0000, &[0x0f, 0xae, 0x28]).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("xrstor"), "{msg}");
        assert!(msg.contains("0xffffffff81000000"), "{msg}");
        assert!(msg.contains("noxsave"), "{msg}");
        let msg = choose(0, 0, &[0x0f, 0xae, 0x54, 0x24, 0x04])
            .unwrap_err()
            .to_string();
        assert!(msg.contains("ldmxcsr") && !msg.contains("noxsave"), "{msg}");
        assert!(describe(0, &[0x0f, 0xff]).starts_with("undecodable"));
    }
}
