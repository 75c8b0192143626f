//! The frame-pointer unwinder: the RBP chain, as
//! arch/x86/kernel/unwind_frame.c follows it, from a traced function's
//! entry site (where the function has not pushed its own frame yet).
//!
//! Each frame is `[bp]` = the caller's bp and `[bp + 8]` = the return
//! address. Entry code marks a `struct pt_regs` in the chain by setting
//! bit 0 of the bp it leaves (ENCODE_FRAME_POINTER in asm/frame.h;
//! decode_frame_pointer); the chain goes on from the interrupted code's
//! saved bp.

use std::convert::Infallible;

use super::orc::pt_regs;
use super::{EntryRegs, Stack, StackEnd, StackMemory, UnwindCtx, MAX_FRAMES};

/// How far below the previous frame a frame may be and still count as
/// another stack rather than a loop: the kernel's stacks (task, IRQ,
/// exception) are at most 32 KiB (THREAD_SIZE with KASAN), so a jump of
/// more than this is the IRQ stack's first frame linking back to the
/// interrupted stack, which lies anywhere.
const STACK_SWITCH: u64 = 64 << 10;

/// The stack at a traced function's entry site, by the RBP chain.
pub fn unwind(regs: EntryRegs, mem: &mut dyn StackMemory, ctx: &UnwindCtx<'_>) -> Stack {
    let mut stack = Stack::default();
    stack.end = match walk(regs, mem, ctx, &mut stack) {
        Ok(never) => match never {},
        Err(end) => end,
    };
    stack
}

fn read(mem: &mut dyn StackMemory, va: u64) -> Result<u64, StackEnd> {
    mem.read_u64(va).ok_or(StackEnd::Unreadable)
}

/// Pushes the return address `ip` (running), read from `slot`, as a frame
/// (`exact`: an interrupted instruction's address instead).
fn push(
    stack: &mut Stack,
    ctx: &UnwindCtx<'_>,
    slot: u64,
    ip: u64,
    exact: bool,
) -> Result<(), StackEnd> {
    let link = ctx.fixup.real(slot, ip).wrapping_sub(ctx.slide as u64);
    if !ctx.in_text(link) {
        return Err(StackEnd::NotText);
    }
    if stack.frames.len() == MAX_FRAMES {
        return Err(StackEnd::TooDeep);
    }
    if exact {
        stack.exact |= 1 << stack.frames.len();
    }
    stack.frames.push(link);
    Ok(())
}

/// Follows the chain until it ends; the error says why.
fn walk(
    regs: EntryRegs,
    mem: &mut dyn StackMemory,
    ctx: &UnwindCtx<'_>,
    frames: &mut Stack,
) -> Result<Infallible, StackEnd> {
    // At the entry site the return address is at sp and bp is still the
    // caller's.
    push(frames, ctx, regs.sp, read(mem, regs.sp)?, false)?;
    // The next frame must lie at or above the end of the last (the
    // kernel's update_stack_state: it only unwinds up and does not
    // overlap the previous frame).
    let mut prev_end = regs.sp.wrapping_add(8);
    let mut bp = regs.bp;
    loop {
        if bp == 0 {
            return Err(StackEnd::Bottom);
        }
        let encoded = bp & 1 == 1;
        let frame = bp & !1;
        if frame < prev_end && prev_end - frame <= STACK_SWITCH {
            return Err(StackEnd::NotMoving);
        }
        if encoded {
            if read(mem, frame.wrapping_add(pt_regs::CS))? & 3 != 0 {
                return Err(StackEnd::User);
            }
            let slot = frame.wrapping_add(pt_regs::IP);
            push(frames, ctx, slot, read(mem, slot)?, true)?;
            prev_end = frame.wrapping_add(pt_regs::SIZE);
            bp = read(mem, frame.wrapping_add(pt_regs::BP))?;
        } else {
            let slot = frame.wrapping_add(8);
            push(frames, ctx, slot, read(mem, slot)?, false)?;
            prev_end = frame.wrapping_add(16);
            bp = read(mem, frame)?;
        }
    }
}
