//! Stepping one vCPU over a breakpoint of vmtrace's, as a debugger steps
//! over its own: where the instruction at the breakpoint is real (a direct
//! entry's first instruction, a return address), nothing moves RIP past it.
//!
//! The breakpoint is removed, only the vCPU that hit it is single-stepped
//! (`vCont;s:THREAD`), the breakpoint set again at its stop reply, and the
//! VM resumed by the caller. In QEMU's gdbstub (gdbstub.c; gdbstub/system.c
//! since 8.0: gdb_handle_vcont -> gdb_continue_partial, system mode) only
//! the vCPUs given an action are resumed, so no other vCPU runs, let alone
//! passes the address, while its breakpoint is out; and the step runs with
//! QEMU's default flags SSTEP_ENABLE|SSTEP_NOIRQ|SSTEP_NOTIMER
//! (gdb_init_gdbserver_state), masked by what the accelerator supports:
//! under TCG, no interrupt or timer is taken inside the step.

use std::time::Duration;

use super::gdb::{Gdb, GdbError};
use super::guest::{Hit, QemuStop};
use super::rsp::ThreadId;
use super::trap::StopReply;

/// SIGTRAP: a breakpoint's or a step's stop.
pub const SIGTRAP: u8 = 5;
/// How long one instruction's step may take to report (a loaded host).
const STEP_WAIT: Duration = Duration::from_secs(10);

/// What a step over a breakpoint did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stepped {
    /// The vCPU ran the instruction (RIP moved); the breakpoint is back.
    Moved,
    /// The step ended with RIP still at the breakpoint (nothing ran).
    Stayed,
    /// Someone else stopped the VM during the step (the stop reply's
    /// signal): the VM stays stopped; `moved` tells if the instruction ran.
    Stopped { signal: u8, moved: bool },
}

impl Stepped {
    /// The step's outcome from its stop reply and RIP after it.
    pub fn of(reply: &StopReply, addr: u64, rip: u64) -> Stepped {
        let moved = rip != addr;
        match (reply.signal, moved) {
            (SIGTRAP, true) => Stepped::Moved,
            (SIGTRAP, false) => Stepped::Stayed,
            (signal, moved) => Stepped::Stopped { signal, moved },
        }
    }
}

impl Gdb {
    /// Single-steps thread `t` alone (`vCont;s:T`: the others stay
    /// stopped) and waits for its stop reply.
    pub fn step_alone(&mut self, t: ThreadId) -> Result<StopReply, GdbError> {
        self.send(format!("vCont;s:{t}").as_bytes(), "vCont;s")?;
        self.running = true;
        self.selected = None;
        match self.wait_stop(STEP_WAIT)? {
            Some(r) => Ok(r),
            None => Err(self.target_error(format!("the single step of thread {t} did not end"))),
        }
    }
}

/// Breakpoints set and removed inside a stop (a hit's, or vmtrace's own).
pub trait BreakOps {
    fn set(&self, addr: u64) -> Result<(), GdbError>;
    fn clear(&self, addr: u64) -> Result<(), GdbError>;
    /// Sets vCPU `cpu`'s register `name` (gdb's name: `rax`).
    fn set_reg(&self, cpu: usize, name: &str, value: u64) -> Result<(), GdbError>;
}

impl BreakOps for Hit<'_> {
    fn set(&self, addr: u64) -> Result<(), GdbError> {
        self.guest.stub().set_breakpoint(addr)
    }
    fn clear(&self, addr: u64) -> Result<(), GdbError> {
        self.guest.stub().clear_breakpoint(addr)
    }
    fn set_reg(&self, cpu: usize, name: &str, value: u64) -> Result<(), GdbError> {
        let t = self.guest.thread(cpu)?;
        self.guest.stub().set_reg(t, name, value)
    }
}

impl BreakOps for QemuStop<'_> {
    fn set(&self, addr: u64) -> Result<(), GdbError> {
        self.set_breakpoint(addr)
    }
    fn clear(&self, addr: u64) -> Result<(), GdbError> {
        self.clear_breakpoint(addr)
    }
    fn set_reg(&self, cpu: usize, name: &str, value: u64) -> Result<(), GdbError> {
        self.set_vcpu_reg(cpu, name, value)
    }
}

impl Hit<'_> {
    /// Step vCPU `cpu`, stopped at the breakpoint at `addr`, over the
    /// instruction there; the breakpoint is set again after the step.
    pub fn step_over(&self, cpu: usize, addr: u64) -> Result<Stepped, GdbError> {
        let t = self.guest.thread(cpu)?;
        let mut s = self.guest.stub();
        s.clear_breakpoint(addr)?;
        let reply = s.step_alone(t)?;
        // Stopped again (whoever stopped it): the breakpoint goes back
        // before anything runs.
        s.set_breakpoint(addr)?;
        let rip = s.regs(t)?.rip;
        Ok(Stepped::of(&reply, addr, rip))
    }
}

/// A `BreakOps` for unit tests: breakpoints taken as set, the registers
/// set kept in order.
#[cfg(test)]
#[derive(Default)]
pub(super) struct RecordedOps(pub std::cell::RefCell<Vec<(String, u64)>>);

#[cfg(test)]
impl BreakOps for RecordedOps {
    fn set(&self, _: u64) -> Result<(), GdbError> {
        Ok(())
    }
    fn clear(&self, _: u64) -> Result<(), GdbError> {
        Ok(())
    }
    fn set_reg(&self, _: usize, name: &str, value: u64) -> Result<(), GdbError> {
        self.0.borrow_mut().push((name.into(), value));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_is_judged_by_its_stop_reply_and_where_rip_went() {
        let trap = StopReply::parse("T05thread:p01.01;").unwrap();
        let paused = StopReply::parse("T02thread:p01.01;").unwrap();
        assert_eq!(Stepped::of(&trap, 0x1000, 0x1004), Stepped::Moved);
        // A step into an exception handler moved too.
        assert_eq!(
            Stepped::of(&trap, 0x1000, 0xffff_ffff_8100_0000),
            Stepped::Moved
        );
        assert_eq!(Stepped::of(&trap, 0x1000, 0x1000), Stepped::Stayed);
        // A user's `stop` (QMP) during the step: QEMU's stop reply says
        // SIGINT (gdb_vm_state_change, RUN_STATE_PAUSED).
        assert_eq!(
            Stepped::of(&paused, 0x1000, 0x1000),
            Stepped::Stopped {
                signal: 2,
                moved: false
            }
        );
        assert_eq!(
            Stepped::of(&paused, 0x1000, 0x1001),
            Stepped::Stopped {
                signal: 2,
                moved: true
            }
        );
    }
}
