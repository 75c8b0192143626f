//! Emulation assist.
//!
//! On hosts where KVM runs guest ring-0 code in its instruction emulator (a
//! nested KVM like the CI host's, see docs/emulating-kvm.md), some instructions
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

use crate::advice::{Advice, Input, Plain, Words};
use crate::gva::{AddressSpace, PAGE_SIZE_4K};

/// #BP, the breakpoint exception `int3` raises.
pub const BP_VECTOR: u8 = 3;
/// #MF, the x87 floating-point error `fwait` raises when one is pending.
pub const MF_VECTOR: u8 = 16;
/// x87 status word: ES, an unmasked exception is pending.
pub const FSW_ES: u16 = 1 << 7;
/// Longest x86 instruction.
const MAX_INSN_LEN: usize = 15;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AssistError {
    #[error("{}", self.say(&Plain))]
    Unsupported {
        cpu: usize,
        insn: String,
        rip: u64,
        /// How to avoid it; `CMDLINE_REPLACE` in it stands for that input.
        hint: &'static str,
    },
    #[error("vCPU {cpu} stopped with KVM internal error (suberror {suberror}) at {rip:#x}")]
    Internal { cpu: usize, suberror: u32, rip: u64 },
    #[error("{assist} assist on vCPU {cpu}: {source}")]
    Ioctl {
        cpu: usize,
        assist: &'static str,
        source: kvm_ioctls::Error,
    },
}

/// In a hint, where it names the input that replaces the default command
/// line (`Input::CmdlineReplace`), which the front end words.
const CMDLINE_REPLACE: &str = "{cmdline-replace}";

impl Advice for AssistError {
    fn problem(&self, w: &dyn Words) -> String {
        match self {
            AssistError::Unsupported {
                cpu,
                insn,
                rip,
                hint,
            } => {
                let hint = hint.replace(CMDLINE_REPLACE, w.input(Input::CmdlineReplace));
                format!(
                    "vCPU {cpu} executed `{insn}` at {rip:#x}, which this host's KVM cannot \
                     emulate; {hint}"
                )
            }
            e => e.to_string(),
        }
    }
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

/// What carrying out an assist does to the vCPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Effect {
    /// Resume here (None: RIP unchanged).
    pub rip: Option<u64>,
    /// Inject this exception (no error code).
    pub inject: Option<u8>,
}

/// The effect of `what` at `rip`; `fsw` is the x87 status word (read only
/// for `fwait`). RIP wraps like the CPU's in 64-bit mode, so a guest at the
/// top of the address space cannot overflow the VMM's arithmetic.
pub fn effect(what: Assist, rip: u64, fsw: u16) -> Effect {
    match what {
        // #BP is a trap: reported after the int3, RIP past it.
        Assist::Int3 => Effect {
            rip: Some(rip.wrapping_add(1)),
            inject: Some(BP_VECTOR),
        },
        Assist::Fwait(len) if fsw & FSW_ES == 0 => Effect {
            rip: Some(rip.wrapping_add(u64::from(len))),
            inject: None,
        },
        // #MF is a fault: reported at the fwait, RIP unchanged.
        Assist::Fwait(_) => Effect {
            rip: None,
            inject: Some(MF_VECTOR),
        },
    }
}

/// The instruction at `rip` read through the guest's page tables, for when
/// KVM did not include its bytes: up to 15 bytes, stopping at the first
/// unmapped page, so an instruction near the end of the last mapped page
/// still decodes.
pub fn fetch_insn(space: &mut AddressSpace<'_>, rip: u64) -> Vec<u8> {
    let mut buf = [0u8; MAX_INSN_LEN];
    let mut got = 0;
    while got < MAX_INSN_LEN {
        let at = rip.wrapping_add(got as u64);
        // One 4 KiB piece at a time: no mapping is finer than that.
        let to_page_end = PAGE_SIZE_4K - (at & (PAGE_SIZE_4K - 1));
        let n = (MAX_INSN_LEN - got).min(to_page_end as usize);
        if space.read(at, &mut buf[got..got + n]).is_err() {
            break;
        }
        got += n;
    }
    buf[..got].to_vec()
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
             does, unless {cmdline-replace} drops it), or run on a bare-metal KVM host"
        }
        Lsl => {
            "boot Linux with `nofsgsbase` (the default command line does, unless \
             {cmdline-replace} drops it: its NMI entry then reads the GS base MSR instead), or \
             run on a bare-metal KVM host"
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
    use crate::gva::PagingMode;
    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

    #[test]
    fn int3_is_assisted_and_xrstor_is_named() {
        assert_eq!(choose(0, 0x1000, &[0xcc, 0x90]).unwrap(), Assist::Int3);
        assert_eq!(choose(0, 0x1000, &[0x9b, 0x65]).unwrap(), Assist::Fwait(1));
        let err = choose(1, 0xffff_ffff_8100_0000, &[0x0f, 0xae, 0x28]).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("xrstor"), "{msg}");
        assert!(msg.contains("0xffffffff81000000"), "{msg}");
        assert!(msg.contains("noxsave"), "{msg}");
        // The input that drops it is named in the library's words.
        assert!(
            msg.contains(
                "(the default command line does, unless a replacement command line drops it)"
            ),
            "{msg}"
        );
        let msg = choose(0, 0, &[0x0f, 0xae, 0x54, 0x24, 0x04])
            .unwrap_err()
            .to_string();
        assert!(msg.contains("ldmxcsr") && !msg.contains("noxsave"), "{msg}");
        assert!(describe(0, &[0x0f, 0xff]).starts_with("undecodable"));
    }

    #[test]
    fn effects_wrap_rip_at_the_top_of_the_address_space() {
        let top = u64::MAX;
        assert_eq!(
            effect(Assist::Int3, top, 0),
            Effect {
                rip: Some(0),
                inject: Some(BP_VECTOR)
            }
        );
        assert_eq!(effect(Assist::Fwait(1), top, 0).rip, Some(0));
        assert_eq!(effect(Assist::Fwait(2), top, 0).rip, Some(1));
        assert_eq!(effect(Assist::Fwait(1), 0x1000, 0).rip, Some(0x1001));
        assert_eq!(
            effect(Assist::Fwait(1), top, FSW_ES),
            Effect {
                rip: None,
                inject: Some(MF_VECTOR)
            }
        );
    }

    /// The boot page tables (first 4 GiB identity-mapped with 2 MiB pages)
    /// with 2 MiB..4 MiB unmapped.
    fn memory_with_a_hole() -> GuestMemoryMmap {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 8 << 20)]).unwrap();
        crate::boot::regs::setup_page_tables(&mem).unwrap();
        mem.write_obj(0u64, GuestAddress(crate::layout::PD_START + 8))
            .unwrap();
        mem
    }

    #[test]
    fn fetch_stops_at_the_first_unmapped_page() {
        let mem = memory_with_a_hole();
        let cr3 = crate::layout::PML4_START;
        let hole = 2 << 20;
        // int3 three bytes before the unmapped page.
        mem.write_slice(&[0xcc, 0x90, 0x90], GuestAddress(hole - 3))
            .unwrap();
        let bytes = fetch_insn(
            &mut AddressSpace::new(&mem, cr3, PagingMode::Level4),
            hole - 3,
        );
        assert_eq!(bytes, [0xcc, 0x90, 0x90]);
        assert_eq!(choose(0, hole - 3, &bytes).unwrap(), Assist::Int3);
        // Fully mapped: all 15 bytes, across a page boundary.
        mem.write_slice(&[0x9b], GuestAddress(0x1ff8)).unwrap();
        let bytes = fetch_insn(
            &mut AddressSpace::new(&mem, cr3, PagingMode::Level4),
            0x1ff8,
        );
        assert_eq!(bytes.len(), MAX_INSN_LEN);
        assert_eq!(choose(0, 0x1ff8, &bytes).unwrap(), Assist::Fwait(1));
        // Nothing mapped at RIP: nothing fetched, and the error says so.
        let bytes = fetch_insn(&mut AddressSpace::new(&mem, cr3, PagingMode::Level4), hole);
        assert!(bytes.is_empty());
        assert!(choose(0, hole, &bytes)
            .unwrap_err()
            .to_string()
            .contains("undecodable bytes []"));
    }
}
