//! Unwinding a guest kernel stack host-side (`--stack`): from the registers
//! at a traced function's entry site, through guest memory, to the chain of
//! return addresses that led there, as the kernel's own `stack_trace_save`
//! would find it. Two unwinders, as the kernel has:
//!
//! - **ORC** (`orc`): objtool's tables (`.orc_unwind_ip`, `.orc_unwind`),
//!   read from the image like kallsyms (`orc_table`); what distribution kernels use
//!   (`CONFIG_UNWINDER_ORC`). Follows interrupt and exception frames
//!   (`pt_regs`) and stack switches (the IRQ stack).
//! - **Frame pointers** (`fp`): the RBP chain, for kernels (and the mini
//!   guest) built with `-fno-omit-frame-pointer` and no ORC tables.
//!
//! Frames are return addresses, innermost first, at their link addresses
//! (the KASLR slide taken off, as `Event::parent`); the traced function
//! itself is the event's, not a frame.

pub mod fp;
pub mod orc;
pub mod orc_table;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use crate::kernel::symbols::KernelImage;

/// The most frames one stack keeps (perf's default `kernel.perf_event_max_stack`
/// is 127; ftrace keeps 8 per event unless it spills). Deeper stacks end
/// with `StackEnd::TooDeep`.
pub const MAX_FRAMES: usize = 64;

/// The registers an unwind starts from: at a traced function's entry site,
/// before the function has pushed anything (`[sp]` is its return address).
/// Running addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryRegs {
    /// The site (the function's `call __fentry__`).
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
}

/// Guest memory as the unwinder reads it: 8 bytes at a guest-virtual
/// address, None where nothing is mapped.
pub trait StackMemory {
    fn read_u64(&mut self, va: u64) -> Option<u64>;
}

/// Where a function-graph trace has hooked a return: the return address in
/// the stack slot is vmtrace's hook, and the unwinder must see the real one
/// (what ftrace's `ftrace_graph_ret_addr` does for the kernel's unwinders).
pub trait ReturnFixup {
    /// The real return address for `value` read from `slot` (`value`
    /// itself when that slot is not hooked).
    fn real(&self, slot: u64, value: u64) -> u64;
}

/// No hooked returns (no function graph).
pub struct NoFixup;

impl ReturnFixup for NoFixup {
    fn real(&self, _slot: u64, value: u64) -> u64 {
        value
    }
}

/// What an unwind needs besides memory and registers.
pub struct UnwindCtx<'a> {
    /// Running minus link address of the kernel (KASLR); 0 without.
    pub slide: i64,
    /// Kernel text ranges at link addresses (core text, init text): a
    /// return address elsewhere ends the stack (`StackEnd::NotText`).
    pub text: &'a [(u64, u64)],
    pub fixup: &'a dyn ReturnFixup,
    /// Modules the guest loaded during the trace: their text and ORC
    /// entries, looked up before the kernel's table (empty: none).
    pub modules: &'a [orc_table::ModuleTable],
}

impl UnwindCtx<'_> {
    /// Whether link address `addr` is kernel text: the image's, a module's
    /// read at the attach, or one loaded since.
    pub(crate) fn in_text(&self, addr: u64) -> bool {
        in_text(self.text, addr) || self.modules.iter().any(|m| m.covers(addr))
    }
}

/// Whether link address `addr` is in one of the `text` ranges.
pub(crate) fn in_text(text: &[(u64, u64)], addr: u64) -> bool {
    text.iter()
        .any(|&(start, end)| (start..end).contains(&addr))
}

/// Why a stack's frames end where they do. `Bottom` and `User` are
/// complete stacks; the others were cut short.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum StackEnd {
    /// The stack's bottom: ORC's end-of-stack entry, a zero frame pointer,
    /// or a task's first frame.
    #[default]
    Bottom = 0,
    /// An interrupt, exception or system call frame from user mode.
    User = 1,
    /// A stack word could not be read (unmapped, or not a stack).
    Unreadable = 2,
    /// No unwind information for an address (ORC has no entry, or an
    /// undefined one).
    NoUnwindInfo = 3,
    /// A return address outside kernel text.
    NotText = 4,
    /// More than `MAX_FRAMES` frames.
    TooDeep = 5,
    /// The stack pointer did not move outward (a corrupt or looping chain).
    NotMoving = 6,
}

impl StackEnd {
    /// The stack reached its true end (nothing was cut off).
    pub fn is_complete(self) -> bool {
        matches!(self, StackEnd::Bottom | StackEnd::User)
    }

    pub fn from_u8(v: u8) -> Option<StackEnd> {
        use StackEnd::*;
        [
            Bottom,
            User,
            Unreadable,
            NoUnwindInfo,
            NotText,
            TooDeep,
            NotMoving,
        ]
        .get(v as usize)
        .copied()
    }

    /// Why the stack ends, in a few words (`script`, the report).
    pub fn describe(self) -> &'static str {
        match self {
            StackEnd::Bottom => "end of stack",
            StackEnd::User => "entered from user mode",
            StackEnd::Unreadable => "stack unreadable",
            StackEnd::NoUnwindInfo => "no unwind information",
            StackEnd::NotText => "return address outside kernel text",
            StackEnd::TooDeep => "too deep",
            StackEnd::NotMoving => "stack pointer did not move",
        }
    }
}

/// One unwound stack.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Stack {
    /// Return addresses, innermost (the traced function's caller) first,
    /// at link addresses.
    pub frames: Vec<u64>,
    pub end: StackEnd,
    /// Bit i set: frame i is not a return address but the exact address
    /// of an interrupted instruction (from a `pt_regs` frame), named by
    /// the function holding it rather than by the byte before it (an
    /// interrupt can land on a function's first instruction). At most
    /// `MAX_FRAMES` (64) frames, so one bit each fits.
    pub exact: u64,
}

impl Stack {
    /// Is frame `i` an interrupted instruction's exact address.
    pub fn is_exact(&self, i: usize) -> bool {
        i < 64 && self.exact >> i & 1 == 1
    }

    /// Frame `i`'s address to name it by: a return address by its call
    /// (the byte before it: a call that is its function's last
    /// instruction returns to the next function), an exact address by
    /// itself.
    pub fn lookup_addr(&self, i: usize) -> u64 {
        let a = self.frames[i];
        if self.is_exact(i) {
            a
        } else {
            a.saturating_sub(1)
        }
    }
}

/// How a kernel's stacks are unwound.
#[derive(Clone, Debug)]
pub enum Unwinder {
    Orc(Arc<orc::OrcTable>),
    FramePointer,
}

impl Unwinder {
    /// The unwinder for `image`: ORC when it has the tables, else frame
    /// pointers; with a note saying which and why (`TraceMeta::stacks`).
    pub fn for_image(
        image: &KernelImage,
        btf: Option<&crate::kernel::btf::KernelBtf>,
    ) -> (Unwinder, String) {
        match orc::OrcTable::from_image(image, btf) {
            Ok(t) => {
                // Loaded modules' entries join the kernel's, at the link
                // addresses their functions have in the image.
                let t = t.with_entries(image.modules.iter().flat_map(|m| {
                    m.orc
                        .iter()
                        .map(move |&(ip, raw)| (ip.wrapping_sub(m.virt as u64), raw))
                }));
                let note = format!("ORC ({} entries, {})", t.len(), t.layout_name());
                (Unwinder::Orc(Arc::new(t)), note)
            }
            Err(why) => (Unwinder::FramePointer, format!("frame pointers ({why})")),
        }
    }

    /// The stack at a traced function's entry.
    pub fn unwind(&self, regs: EntryRegs, mem: &mut dyn StackMemory, ctx: &UnwindCtx<'_>) -> Stack {
        match self {
            Unwinder::Orc(t) => orc::unwind(t, regs, mem, ctx),
            Unwinder::FramePointer => fp::unwind(regs, mem, ctx),
        }
    }
}
