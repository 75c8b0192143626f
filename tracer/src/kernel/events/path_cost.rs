//! What an event recorded in exitless mode costs the guest beyond a traced
//! function entry, in instructions, counted in the kernel's own text with
//! iced-x86 along the path the event takes (docs/events.md, "What an event
//! costs"). With its `tp->funcs` load redirected (`enabled_branch`), each
//! event runs, beyond the untraced kernel:
//!
//! - its enabled branch from that load to the call of the static call
//!   (the load, `test`, `je` not taken, `__data` and the arguments, the
//!   `call`), decoded straight as `enabled_branch` checked it;
//! - the static call's trampoline, a `jmp` to `__traceiter_NAME`, when
//!   the call goes to it (`__SCT__tp_func_NAME`) at run time: not with
//!   inline static calls (every x86-64 kernel built with objtool: the
//!   project's guests, Debian's), whose call sites the kernel makes call
//!   the function itself at boot (kernel/static_call_inline.c);
//! - `__traceiter_NAME` from its entry to its `ret` with `tp->funcs` NULL
//!   (no probe of the guest's: the `je` after its test taken), its ftrace
//!   site aside: that site's call and vmtrace's trampoline behind it are
//!   a traced function entry's cost, which `vmtrace bench` measures
//!   (`call/exitless`).
//!
//! Not counted: what the enabled branch runs before the load (a kernel
//! without jump labels tests the key's count, then `cpu_online()`, and
//! disables preemption), whose branches depend on the guest's state.

use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, OpKind, Register};

use super::enabled_branch::FuncsTest;
use crate::kernel::symbols::KernelImage;

/// The most instructions followed in one part before giving up.
const MAX_PART: usize = 64;

/// x86's 5-byte NOP, `nopl 0x0(%rax,%rax,1)`: an ftrace site at
/// `__traceiter_NAME`'s entry (after its `endbr64`, with IBT).
const NOP5: [u8; 5] = [0x0f, 0x1f, 0x44, 0x00, 0x00];

/// Named only by a kernel whose static calls are inline.
const INLINE_UPDATE: &str = "__static_call_update";

/// `endbr64`'s length: the most bytes before an ftrace site.
const ENDBR_LEN: u64 = 4;

/// An event's instructions beyond a function entry's, by part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventPathCost {
    /// From the `tp->funcs` load to the static call's `call`, both in.
    pub branch: usize,
    /// The static call's trampoline (its `jmp`), 0 or 1.
    pub trampoline: usize,
    /// `__traceiter_NAME`, its ftrace site aside, up to its `ret` in.
    pub iterator: usize,
}

impl EventPathCost {
    pub fn total(&self) -> usize {
        self.branch + self.trampoline + self.iterator
    }
}

fn decode(image: &KernelImage, at: u64) -> Option<Instruction> {
    let bytes = image.file_bytes(at, 15)?;
    let i = Decoder::with_ip(64, bytes, at, DecoderOptions::NONE).decode();
    (!i.is_invalid()).then_some(i)
}

/// The cost of the event whose enabled branch `test` is, its `tp->funcs`
/// at `funcs` and `__traceiter_NAME` at `iterator` (link-time addresses);
/// None where the path does not decode as expected.
pub fn event_path_cost(
    image: &KernelImage,
    test: &FuncsTest,
    funcs: u64,
    iterator: u64,
) -> Option<EventPathCost> {
    let (branch, call) = to_call(image, test.load)?;
    let callee = test.callee?;
    // With inline static calls (`__static_call_update` a function of its
    // own, kernel/static_call_inline.c) the kernel made each call site
    // call its function at boot: no trampoline runs.
    let inline = image.symbol(INLINE_UPDATE).is_some();
    let trampoline = match callee == iterator || inline {
        true => 0,
        false => {
            // `__SCT__tp_func_NAME`: `jmp __traceiter_NAME`.
            let j = decode(image, callee)?;
            let to_iterator = j.mnemonic() == Mnemonic::Jmp
                && j.op0_kind() == OpKind::NearBranch64
                && j.near_branch_target() == iterator;
            if !to_iterator {
                return None;
            }
            1
        }
    };
    debug_assert_eq!(call.near_branch_target(), callee);
    let iterator = iterator_path(image, iterator, funcs)?;
    Some(EventPathCost {
        branch,
        trampoline,
        iterator,
    })
}

/// Instructions from `load` to the first `call`, both counted, straight.
fn to_call(image: &KernelImage, load: u64) -> Option<(usize, Instruction)> {
    let mut at = load;
    for n in 1..=MAX_PART {
        let i = decode(image, at)?;
        if i.mnemonic() == Mnemonic::Call {
            return Some((n, i));
        }
        // (The `je` after the test falls through: `tp->iterator` is never NULL.)
        if i.is_jmp_short_or_near() || i.mnemonic() == Mnemonic::Ret {
            return None;
        }
        at = i.next_ip();
    }
    None
}

/// `__traceiter_NAME` from `entry` to its `ret` with `tp->funcs` (at
/// `funcs`) NULL: its ftrace site not counted, its test's `je` taken (a
/// `jne` not), unconditional jumps followed (a return thunk's), any other
/// conditional branch refused (None).
fn iterator_path(image: &KernelImage, entry: u64, funcs: u64) -> Option<usize> {
    let mut at = entry;
    let mut count = 0;
    // The register loaded from `tp->funcs`, and whether it was tested.
    let mut loaded: Option<Register> = None;
    let mut tested = false;
    for _ in 0..MAX_PART {
        let i = decode(image, at)?;
        let site = image.file_bytes(at, NOP5.len()) == Some(&NOP5[..])
            || (i.mnemonic() == Mnemonic::Call && i.len() == NOP5.len());
        if site && at.saturating_sub(entry) <= ENDBR_LEN {
            // The ftrace site (at the entry, or after `endbr64`).
            at = i.next_ip();
            continue;
        }
        count += 1;
        match i.mnemonic() {
            Mnemonic::Ret => return Some(count),
            Mnemonic::Jmp if i.op0_kind() == OpKind::NearBranch64 => {
                at = i.near_branch_target();
                continue;
            }
            Mnemonic::Mov
                if i.op1_kind() == OpKind::Memory
                    && i.memory_index() == Register::None
                    && matches!(i.memory_base(), Register::RIP | Register::None)
                    && i.memory_displacement64() == funcs =>
            {
                loaded = Some(i.op0_register());
            }
            Mnemonic::Test => {
                tested = loaded.is_some_and(|r| i.op0_register() == r && i.op1_register() == r);
            }
            Mnemonic::Je if tested => {
                at = i.near_branch_target();
                continue;
            }
            Mnemonic::Jne if tested => {}
            _ if i.is_jcc_short_or_near() || i.is_jmp_short_or_near() => return None,
            _ => {}
        }
        at = i.next_ip();
    }
    None
}
