//! Kernel stacks (`--stack`) as every output names them: a frame is a
//! return address, shown as the function of the call it returns to,
//! `function+0xoffset`, or in hex when no known function holds it.
//!
//! The function is looked up at the address minus one, as perf and the
//! kernel's `%pB` do: a call that is its function's last instruction
//! returns to the next function's first byte, and the frame belongs to
//! the caller, not to what follows it; an interrupted instruction's exact
//! address (`Stack::is_exact`) is looked up as it is. The offset printed
//! is the address's own.

use std::borrow::Cow;

use crate::kernel::symbols::Symbol;
use crate::trace::model::{Stack, Trace};
use crate::trace::report::escape;

/// One frame of a stack, symbolized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackFrame<'t> {
    /// The return address (link address).
    pub addr: u64,
    /// The function of the call, if the trace knows it (`Trace::callers`).
    pub function: Option<&'t Symbol>,
}

impl<'t> StackFrame<'t> {
    /// Frame `i` of `stack`, one of `trace`'s stacks.
    pub fn of(trace: &'t Trace, stack: &Stack, i: usize) -> StackFrame<'t> {
        StackFrame {
            addr: stack.frames[i],
            function: trace.caller_of(stack.lookup_addr(i)),
        }
    }

    /// `addr` minus the function's start (0 when it is unknown).
    pub fn offset(&self) -> u64 {
        self.function.map_or(0, |f| self.addr - f.addr)
    }

    /// The function's name through `escape`, None when unknown.
    pub fn name(&self) -> Option<Cow<'t, str>> {
        self.function.map(|f| escape(&f.name))
    }

    /// `function+0xoffset`, or `0xffffffff81234567` when unknown.
    pub fn label(&self) -> String {
        match self.name() {
            Some(n) => format!("{n}+{:#x}", self.offset()),
            None => format!("{:#x}", self.addr),
        }
    }
}

/// The frames of `stack`, innermost first, symbolized.
pub fn frames<'t>(trace: &'t Trace, stack: &Stack) -> Vec<StackFrame<'t>> {
    (0..stack.frames.len())
        .map(|i| StackFrame::of(trace, stack, i))
        .collect()
}

/// Entries that carry a stack.
pub fn entries_with_stacks(trace: &Trace) -> u64 {
    trace.events.iter().filter(|e| e.stack != 0).count() as u64
}
