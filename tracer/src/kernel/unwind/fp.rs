//! The frame-pointer unwinder (placeholder: being written).

use super::{EntryRegs, Stack, StackEnd, StackMemory, UnwindCtx};

pub fn unwind(_regs: EntryRegs, _mem: &mut dyn StackMemory, _ctx: &UnwindCtx<'_>) -> Stack {
    Stack {
        frames: Vec::new(),
        end: StackEnd::NoUnwindInfo,
    }
}
