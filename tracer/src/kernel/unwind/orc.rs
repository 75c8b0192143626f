//! The ORC unwinder: `unwind_next_frame` of arch/x86/kernel/unwind_orc.c
//! (Linux 6.1 and 6.12 alike but for the entry layout, `orc_table`), run
//! host-side over guest memory from a traced function's entry site.
//!
//! Where the kernel would fall back to guessing a frame-pointer frame for
//! an address without an entry (generated code such as BPF), this one
//! stops with `NoUnwindInfo`: the guess is what makes the kernel's own
//! unwind unreliable.

pub use super::orc_table::{OrcEntry, OrcError, OrcLayout, OrcTable, OrcType};

use super::orc_table::reg;
use super::{EntryRegs, Stack, StackEnd, StackMemory, UnwindCtx, MAX_FRAMES};

/// Offsets in x86-64 `struct pt_regs` (arch/x86/include/asm/ptrace.h, the
/// same in 6.1 and 6.12).
pub mod pt_regs {
    pub const R13: u64 = 2 * 8;
    pub const BP: u64 = 4 * 8;
    pub const R10: u64 = 7 * 8;
    pub const DX: u64 = 12 * 8;
    pub const DI: u64 = 14 * 8;
    /// `IRET_FRAME_OFFSET` (asm/unwind.h): the hardware's iret frame (ip,
    /// cs, flags, sp, ss) starts here.
    pub const IP: u64 = 16 * 8;
    pub const CS: u64 = 17 * 8;
    pub const SP: u64 = 19 * 8;
    /// `sizeof(struct pt_regs)`.
    pub const SIZE: u64 = 21 * 8;
}

/// Where the registers of an interrupted frame are (unwind_orc.c's
/// `state->regs`, `full_regs` and `prev_regs`).
#[derive(Clone, Copy, Debug, Default)]
struct Regs {
    /// The `struct pt_regs` of the last REGS or REGS_PARTIAL step, and
    /// whether all of it was saved (REGS) or only its iret frame.
    at: Option<(u64, bool)>,
    /// After a REGS_PARTIAL step that followed a REGS one: the full regs
    /// before (an NMI in early interrupt entry code), still good for
    /// registers the partial frame lacks.
    prev: Option<u64>,
}

/// The unwind's registers between steps (running addresses).
struct State {
    ip: u64,
    sp: u64,
    bp: u64,
    /// Look `ip` up exactly (the entry site, an interrupted address), not
    /// the byte before it (a return address, whose call may be the last
    /// instruction of a noreturn call's block).
    signal: bool,
    regs: Regs,
}

/// The stack at a traced function's entry site, by the kernel's ORC tables.
pub fn unwind(
    t: &OrcTable,
    regs: EntryRegs,
    mem: &mut dyn StackMemory,
    ctx: &UnwindCtx<'_>,
) -> Stack {
    let mut st = State {
        ip: regs.ip,
        sp: regs.sp,
        bp: regs.bp,
        // The entry site is where the function is, not a return address.
        signal: true,
        regs: Regs::default(),
    };
    let mut frames = Vec::new();
    let mut exact = 0u64;
    let end = loop {
        if let Err(end) = step(t, &mut st, mem, ctx) {
            break end;
        }
        // As the kernel's stack traces (arch_stack_walk): every new ip is
        // a frame, while it is kernel text (unwind_get_return_address).
        let link = st.ip.wrapping_sub(ctx.slide as u64);
        if !ctx.in_text(link) {
            break StackEnd::NotText;
        }
        if frames.len() == MAX_FRAMES {
            break StackEnd::TooDeep;
        }
        // After a pt_regs step the ip is the interrupted instruction.
        if st.signal {
            exact |= 1 << frames.len();
        }
        frames.push(link);
    };
    Stack { frames, end, exact }
}

fn read(mem: &mut dyn StackMemory, va: u64) -> Result<u64, StackEnd> {
    mem.read_u64(va).ok_or(StackEnd::Unreadable)
}

/// One frame outward: `st` becomes the caller's (or the interrupted
/// code's) registers, or the stack ends.
fn step(
    t: &OrcTable,
    st: &mut State,
    mem: &mut dyn StackMemory,
    ctx: &UnwindCtx<'_>,
) -> Result<(), StackEnd> {
    let link = st.ip.wrapping_sub(ctx.slide as u64);
    let key = if st.signal {
        link
    } else {
        link.wrapping_sub(1)
    };
    // A module loaded during the trace has its own entries, as the
    // kernel's orc_find() looks a module's address up in its table.
    let own = ctx.modules.iter().find(|m| m.covers(key));
    let found = own.map_or_else(|| t.find(key), |m| m.table.find(key));
    let orc = *found.ok_or(StackEnd::NoUnwindInfo)?;
    match orc.kind {
        OrcType::Undefined => return Err(StackEnd::NoUnwindInfo),
        OrcType::EndOfStack => return Err(StackEnd::Bottom),
        _ => {}
    }
    let (sp, switches) = previous_sp(&orc, st, mem)?;
    match orc.kind {
        OrcType::Call => {
            // A direct (SP or BP based) step stays on its stack, and the
            // caller's frame lies above: anything else is bad data or a
            // loop (unwind_orc.c "stack going in the wrong direction").
            if !switches && sp <= st.sp {
                return Err(StackEnd::NotMoving);
            }
            let slot = sp.wrapping_sub(8);
            st.ip = ctx.fixup.real(slot, read(mem, slot)?);
            st.regs = Regs::default();
        }
        OrcType::Regs | OrcType::RegsPartial => {
            let full = orc.kind == OrcType::Regs;
            // A partial frame is the iret frame at `sp`: struct pt_regs
            // starts IRET_FRAME_OFFSET below it.
            let base = if full {
                sp
            } else {
                sp.wrapping_sub(pt_regs::IP)
            };
            let ip = read(mem, base.wrapping_add(pt_regs::IP))?;
            let new_sp = read(mem, base.wrapping_add(pt_regs::SP))?;
            let cs = read(mem, base.wrapping_add(pt_regs::CS))?;
            // user_mode(): the interrupted code ran in ring 3, and its ip
            // is no kernel frame.
            if cs & 3 != 0 {
                return Err(StackEnd::User);
            }
            // As unwind_recover_rethook: interrupted right at a hooked
            // return, the hook's slot is just below the interrupted sp.
            st.ip = ctx.fixup.real(new_sp.wrapping_sub(8), ip);
            st.sp = new_sp;
            let prev = match st.regs.at {
                Some((at, true)) if !full => Some(at),
                _ => None,
            };
            st.regs = Regs {
                at: Some((base, full)),
                prev,
            };
        }
        OrcType::Undefined | OrcType::EndOfStack => unreachable!("handled above"),
    }
    st.bp = previous_bp(&orc, st, sp, mem)?;
    if orc.kind == OrcType::Call {
        st.sp = sp;
    }
    st.signal = orc.signal;
    Ok(())
}

/// The previous frame's stack pointer (the CFA) by `orc.sp_reg`, and
/// whether it may be on another stack (an indirect or register-based
/// rule: the IRQ stack's link back, realigned stacks).
fn previous_sp(
    orc: &OrcEntry,
    st: &State,
    mem: &mut dyn StackMemory,
) -> Result<(u64, bool), StackEnd> {
    let off = i64::from(orc.sp_offset);
    let sp = match orc.sp_reg {
        reg::SP => return Ok((st.sp.wrapping_add_signed(off), false)),
        reg::BP => return Ok((st.bp.wrapping_add_signed(off), false)),
        // Since Linux 5.12 (both 6.1 and 6.12 read it so) the offset is
        // added after the load: call_on_stack() stores the old stack
        // pointer at the top of the IRQ stack, and the offset is the old
        // frame's; earlier kernels loaded from sp + offset, and used only
        // offset 0, where the two agree.
        reg::SP_INDIRECT => read(mem, st.sp)?.wrapping_add_signed(off),
        reg::BP_INDIRECT => read(mem, st.bp.wrapping_add_signed(off))?,
        reg::R10 => reg_value(st, pt_regs::R10, mem)?,
        reg::R13 => reg_value(st, pt_regs::R13, mem)?,
        reg::DI => reg_value(st, pt_regs::DI, mem)?,
        reg::DX => reg_value(st, pt_regs::DX, mem)?,
        _ => return Err(StackEnd::NoUnwindInfo),
    };
    Ok((sp, true))
}

/// A general register of the frame, known only from a pt_regs frame
/// (unwind_orc.c get_reg): else no way on.
fn reg_value(st: &State, offset: u64, mem: &mut dyn StackMemory) -> Result<u64, StackEnd> {
    get_reg(st, offset, mem)?.ok_or(StackEnd::NoUnwindInfo)
}

/// unwind_orc.c get_reg: from the full regs of the last step, or from the
/// full regs before a partial frame; None when neither saved it.
fn get_reg(st: &State, offset: u64, mem: &mut dyn StackMemory) -> Result<Option<u64>, StackEnd> {
    let at = match st.regs {
        Regs {
            at: Some((at, true)),
            ..
        } => at,
        Regs {
            at: Some(_),
            prev: Some(prev),
        } => prev,
        _ => return Ok(None),
    };
    read(mem, at.wrapping_add(offset)).map(Some)
}

/// The previous frame's base pointer by `orc.bp_reg` (`sp` is the CFA,
/// `st` has the step's new regs but still the old bp).
fn previous_bp(
    orc: &OrcEntry,
    st: &State,
    sp: u64,
    mem: &mut dyn StackMemory,
) -> Result<u64, StackEnd> {
    let off = i64::from(orc.bp_offset);
    match orc.bp_reg {
        // Unchanged by this frame, unless a pt_regs frame saved it.
        reg::UNDEFINED => Ok(get_reg(st, pt_regs::BP, mem)?.unwrap_or(st.bp)),
        reg::PREV_SP => read(mem, sp.wrapping_add_signed(off)),
        reg::BP => read(mem, st.bp.wrapping_add_signed(off)),
        _ => Err(StackEnd::NoUnwindInfo),
    }
}
