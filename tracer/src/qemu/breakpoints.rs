//! Trap mode through QEMU's gdbstub, where no guest memory is free for
//! exitless mode: a breakpoint of QEMU's own (`Z0`) at every selected site
//! (under TCG QEMU keeps them in its translator: guest text is never
//! written), each hit a stop of every vCPU that the trap-mode recorders
//! (`session::record`) take as a trap at the site, the vCPU then moved past
//! the site's 5-byte NOP (checked at the attach) as running it would, and
//! the VM resumed. Per hit the stub sees two packets: `g` (QEMU selected
//! the vCPU that hit) and `c ADDR` (resume, that vCPU past the site; no
//! reply). Still slow: QEMU stops every vCPU for each hit, and under TCG
//! flushes its translations at every breakpoint stop (gdb_vm_state_change
//! up to QEMU 10), about 0.7 ms a call here; but it needs nothing of the
//! guest.

use std::collections::HashSet;
use std::time::Duration;

use vmm::{Trap, TrapHandler};

use super::gdb::GdbError;
use super::guest::{QemuGuest, QemuStop};
use super::trap::StopReply;
use crate::session::Tracer;

/// SIGTRAP: a breakpoint's stop.
const SIGTRAP: u8 = 5;

/// The breakpoints set, and the recorders their hits go to.
pub struct Breakpoints {
    sites: HashSet<u64>,
    /// One per vCPU, in the stub's thread order.
    handlers: Vec<Box<dyn TrapHandler>>,
    /// Traps at no site of vmtrace's: resumed.
    pub other_stops: u64,
}

/// What one wait for a stop found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Served {
    /// A stop at a breakpoint, recorded; the VM runs again.
    Hit,
    /// The VM ran on.
    Idle,
    /// The VM stopped for someone else (gdb `signal`: 2 a QMP `stop`, 29
    /// an I/O error, 14 a watchdog, ...; QEMU's gdb_vm_state_change), and
    /// stays stopped.
    NotOurs { signal: u8 },
}

/// Why a hit could not be handled.
#[derive(Debug, thiserror::Error)]
pub enum HitError {
    #[error(transparent)]
    Gdb(#[from] GdbError),
    #[error(transparent)]
    Trap(#[from] vmm::TrapError),
}

impl Breakpoints {
    /// Set a breakpoint at each of `sites` inside `stop`; on an error, the
    /// ones set are removed again.
    pub fn set(
        stop: &QemuStop<'_>,
        sites: &[u64],
        handlers: Vec<Box<dyn TrapHandler>>,
    ) -> Result<Breakpoints, GdbError> {
        let mut set = HashSet::with_capacity(sites.len());
        for &a in sites {
            if let Err(e) = stop.set_breakpoint(a) {
                for &b in &set {
                    let _ = stop.clear_breakpoint(b);
                }
                return Err(e);
            }
            set.insert(a);
        }
        Ok(Breakpoints {
            sites: set,
            handlers,
            other_stops: 0,
        })
    }

    /// Breakpoints set.
    pub fn len(&self) -> usize {
        self.sites.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sites.is_empty()
    }

    /// Waits up to `timeout` for the running VM to stop; records a hit and
    /// resumes the VM. A stop that is no breakpoint's (a user's `stop`, an
    /// I/O error, a watchdog: the stop reply's signal says which) is left
    /// alone: resuming it would undo it.
    pub fn serve(&mut self, guest: &QemuGuest, timeout: Duration) -> Result<Served, HitError> {
        let Some(hit) = guest.wait_hit(timeout)? else {
            return Ok(Served::Idle);
        };
        if hit.reply.signal != SIGTRAP {
            let signal = hit.reply.signal;
            hit.hold();
            return Ok(Served::NotOurs { signal });
        }
        let moved = match hit.cpu {
            Some(cpu) => {
                let snap = hit.snapshot(cpu)?;
                self.record(cpu, &snap, &**hit.ram())?
            }
            None => None,
        };
        if moved.is_none() {
            // A trap at no site of vmtrace's (one just removed): resumed.
            self.other_stops += 1;
        }
        // The vCPU moved past the site as the VM resumes: one packet.
        hit.resume(moved.flatten())?;
        Ok(Served::Hit)
    }

    /// A hit on `cpu` (registers `snap`): to its recorder, which finds the
    /// site by RIP (at the site: trap mode's "at the out"), counts it,
    /// reads the caller at [RSP], and says where to resume (past the
    /// site). None if RIP is at no breakpoint of vmtrace's; else the RIP
    /// to resume at, if the recorder moved it.
    fn record(
        &mut self,
        cpu: usize,
        snap: &vmm::pause::VcpuSnapshot,
        ram: &dyn vmm::GuestRam,
    ) -> Result<Option<Option<u64>>, HitError> {
        if !self.sites.contains(&snap.regs.rip) {
            return Ok(None);
        }
        let Some(h) = self.handlers.get_mut(cpu) else {
            return Ok(None);
        };
        let mut trap = Trap::new(cpu, &snap.regs, &snap.sregs, ram);
        h.on_trap(&mut trap)?;
        Ok(Some(trap.new_rip()))
    }

    /// Inside vmtrace's own final stop: a hit that came just before it (its
    /// stop reply was the stop's) is recorded as any other; then every
    /// breakpoint is removed, the recorders flushed and dropped. Returns
    /// the breakpoints removed.
    pub fn remove(
        &mut self,
        guest: &QemuGuest,
        stop: &QemuStop<'_>,
        last: Option<StopReply>,
    ) -> Result<usize, HitError> {
        let hit = last
            .filter(|r| r.signal == SIGTRAP)
            .and_then(|r| guest.cpu_of(r.thread?));
        if let Some(cpu) = hit {
            if let Some(snap) = vmm::Stopped::snapshot(stop, cpu) {
                // Not moved: with the breakpoints gone it runs the NOP.
                self.record(cpu, &snap, &**vmm::Stopped::ram(stop))?;
            }
        }
        let mut removed = 0;
        for &a in &self.sites {
            stop.clear_breakpoint(a)?;
            removed += 1;
        }
        self.sites.clear();
        self.finish();
        Ok(removed)
    }

    /// Flush and drop the recorders: the store ends once they are gone.
    pub fn finish(&mut self) {
        for h in &mut self.handlers {
            h.flush();
        }
        self.handlers.clear();
    }
}

/// Set the breakpoints of `tracer`'s watched sites (`Tracer::watch_sites`)
/// under `stop`, and count them as its attach.
pub fn watch(
    tracer: &mut Tracer,
    stop: &QemuStop<'_>,
    sites: &[u64],
    others: usize,
    handlers: Vec<Box<dyn TrapHandler>>,
) -> Result<Breakpoints, GdbError> {
    let b = Breakpoints::set(stop, sites, handlers)?;
    tracer.watching(b.len(), others, stop);
    Ok(b)
}
