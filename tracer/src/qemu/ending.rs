//! How a QEMU session ends: the detach (sites restored, breakpoints
//! removed) in one stop, vmtrace's region taken out in another after a
//! grace period, the rings drained a last time in it, the stub closed and
//! the trace finished; and why it ended. A stalled QEMU is waited for, a
//! stop someone else made is worked inside and left, a reset guest or a
//! gone QEMU is not written to.

use std::time::{Duration, Instant};

use vmm::Stopped;

use super::drive::{Arming, QemuVm};
use super::error::QemuError;
use super::guest::{QemuGuest, QemuStop};
use super::liveness::{QemuProcess, RunState};
use crate::error::TracerError;
use crate::session::backend::{HeldUp, TraceEnd};
use crate::session::patch::DetachCounts;
use crate::session::{Observer, Saved, Tracer};
use crate::trace::datafile::TraceFileError;
use crate::trace::model::Trace;

/// How a QEMU session ended.
pub struct QemuEnded {
    /// What the detach restored, or why it could not.
    pub detached: Result<DetachCounts, QemuError>,
    /// vmtrace's page-table entries taken out, or why its region stays
    /// (the QEMU was gone, a hooked call never returned, ...); trap mode
    /// has none (0).
    pub removed: Result<usize, String>,
    /// Sites patched (or breakpoints set) at the attach.
    pub attached: usize,
    /// Traced through breakpoints: no region was there to take out.
    pub trap: bool,
    /// An error draining the rings (the counts stay exact).
    pub drained: Result<(), TracerError>,
    pub summary: Trace,
    pub saved: Option<Result<Saved, TraceFileError>>,
    /// Someone else's stop vmtrace detached inside and left (QEMU's run
    /// state): the VM stays stopped.
    pub left_stopped: Option<String>,
    /// Why the ring device (`super::ivshmem`) stays in the VM, its journal
    /// kept for the repair; None when there was none or it is gone.
    pub ring_device: Option<String>,
}

/// Why a trace ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndReason {
    Duration,
    Signal(i32),
    /// QEMU closed its sockets (it quit or was killed).
    QemuGone(String),
    /// The gdbstub failed while tracing through its breakpoints (QEMU
    /// still answers its monitor).
    Stub(String),
    /// Another QEMU answers at the QMP socket's path (the error says
    /// which): the QEMU traced is detached through its gdbstub.
    MonitorReplaced(String),
    /// The machine was reset or shut down (QEMU's reason): the trace ends
    /// there, and vmtrace writes nothing more to the guest.
    GuestReset(String),
    /// The guest suspended to RAM (S3): vmtrace detaches inside that stop.
    Suspended,
    /// The caller said so (`QemuSession::trace_until`).
    Done,
}

impl From<TraceEnd> for EndReason {
    fn from(end: TraceEnd) -> EndReason {
        match end {
            TraceEnd::Duration => EndReason::Duration,
            TraceEnd::Signal(sig) => EndReason::Signal(sig),
            // A QEMU's guest never stops on its own: its monitor goes.
            TraceEnd::GuestStopped => EndReason::QemuGone("the guest stopped".into()),
            TraceEnd::VmmGone(why) => EndReason::QemuGone(why),
            TraceEnd::Stub(why) => EndReason::Stub(why),
            TraceEnd::MonitorLost(why) => EndReason::MonitorReplaced(why),
            TraceEnd::GuestReset(why) => EndReason::GuestReset(why),
            TraceEnd::Suspended => EndReason::Suspended,
            TraceEnd::Done => EndReason::Done,
        }
    }
}

/// Whose the VM's stop will be: vmtrace's when the VM runs, else (someone
/// else stopped it) that stop, never resumed (true). A stalled QEMU is
/// waited for while its process lives.
fn held_for_end(vm: &mut QemuVm, observer: &mut dyn Observer) -> Result<bool, QemuError> {
    let state = vm.state_patient(&mut |w| observer.held_up(w))?;
    // (Followed modules: the hooks' stops are vmtrace's, as in trap mode.)
    let trap = matches!(vm.arming, Arming::Trap { .. }) || vm.serves_stops();
    Ok(match state {
        RunState::Running => false,
        // Trap mode: a breakpoint's stop not served yet (or a step's) is
        // vmtrace's own; only its stub stops a VM in `debug`. (A busy
        // traced function made this the common case at a detach.)
        RunState::Stopped(why) if trap && why == "debug" && vm.held.is_none() => false,
        RunState::Stopped(why) => {
            // QEMU's reason, not the stub's signal; since when it was seen.
            let since = vm.held.take().map_or_else(Instant::now, |(_, t)| t);
            vm.held = Some((why, since));
            true
        }
    })
}

/// A stop of every vCPU for the detach (`held`: see `held_for_end`),
/// waiting for a stalled QEMU's stub while the QEMU lives.
fn stop_for_end<'a>(
    guest: &'a QemuGuest,
    process: &QemuProcess,
    held: bool,
    observer: &mut dyn Observer,
) -> Result<QemuStop<'a>, QemuError> {
    let since = Instant::now();
    let mut wait_on = || {
        let alive = !process.is_gone();
        if alive {
            observer.held_up(&HeldUp::Unanswered {
                since: since.elapsed(),
            });
        }
        alive
    };
    Ok(guest.stop_patient(held, &mut wait_on)?)
}

impl std::fmt::Display for EndReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EndReason::Duration => write!(f, "duration elapsed"),
            EndReason::Signal(sig) => write!(f, "signal {sig}"),
            EndReason::QemuGone(why) => write!(f, "QEMU went away: {why}"),
            EndReason::Stub(why) => write!(f, "the gdbstub failed: {why}"),
            EndReason::MonitorReplaced(why) => write!(f, "{why}"),
            EndReason::GuestReset(why) => write!(f, "the guest was reset ({why})"),
            EndReason::Suspended => write!(f, "the guest suspended to RAM (S3)"),
            EndReason::Done => write!(f, "done"),
        }
    }
}

/// After the sites are restored: the guest runs this long before vmtrace's
/// code is taken out, so that any context interrupted inside it finishes;
/// tries before the region is left in place.
pub(super) const GRACE: Duration = Duration::from_millis(50);
pub(super) const REMOVE_ATTEMPTS: u32 = 100;

/// The detach's parts, on a session's QEMU and tracer.
pub(super) struct Detach<'a> {
    pub(super) vm: &'a mut QemuVm,
    pub(super) tracer: &'a mut Tracer,
}

impl Detach<'_> {
    /// Trap mode's detach: in one stop, record a hit that came just
    /// before it, remove every breakpoint, and hand the guest back.
    pub(super) fn remove_breakpoints(
        &mut self,
        observer: &mut dyn Observer,
    ) -> Result<DetachCounts, QemuError> {
        if !matches!(
            self.vm.arming,
            Arming::Trap {
                breakpoints: Some(_),
                ..
            }
        ) {
            return Ok(DetachCounts::default());
        }
        // Only the reply of the stop below counts.
        let _ = self.vm.guest.take_last_stop();
        let held = held_for_end(self.vm, observer)?;
        let stop = stop_for_end(&self.vm.guest, &self.vm.process, held, observer)?;
        let last = self.vm.guest.take_last_stop();
        let Arming::Trap {
            breakpoints: Some(b),
            ..
        } = &mut self.vm.arming
        else {
            unreachable!("checked above");
        };
        // The guard's hit just before the stop served and every site still
        // vmtrace's given its NOP (`super::guarded_sites`) before the
        // count-checking restore, as the exitless detach does.
        // Not in the memory of a module gone (given back at its unload, or
        // its unload not followed).
        let (released, event_sites) = b.released_events();
        let released = released.to_vec();
        self.vm
            .jumps
            .retain(|j| !released.iter().any(|t| t.contains(&j.va)));
        let image = &self.tracer.plan().image;
        let before = self.vm.jumps.len();
        let gone = super::event_sites::drop_freed(&**stop.ram(), image, &mut self.vm.jumps);
        let freed = before - self.vm.jumps.len();
        b.forget_events(&gone);
        // The events of modules loaded again, written at their loads.
        let again = b
            .reload
            .as_ref()
            .map(|r| (r.live.clone(), r.again, r.untraced));
        let (live, events_again, events_untraced) = again.unwrap_or_default();
        self.vm.jumps.extend(live);
        let n = b.remove(&self.vm.guest, &stop, last)?;
        super::event_sites::restore(&stop, &self.vm.jumps)?;
        let (unloads, reloads, untraced) = b.module_cycles();
        let (first, unslotted) = b.modules_first_loaded();
        let c = DetachCounts {
            module_unloads: unloads,
            module_reloads: reloads,
            module_untraced: untraced,
            module_first: first,
            module_unslotted: unslotted,
            module_refused: b.modules_first_refused(),
            module_event_sites: event_sites,
            module_events_again: events_again,
            module_events_untraced: events_untraced,
            module_event_sites_freed: freed,
            ..self.tracer.unwatched(n)
        };
        stop.detach()?;
        Ok(c)
    }

    pub(super) fn detach_sites(
        &mut self,
        observer: &mut dyn Observer,
    ) -> Result<DetachCounts, QemuError> {
        // Only the reply of the stop below counts.
        let _ = self.vm.guest.take_last_stop();
        let held = held_for_end(self.vm, observer)?;
        let stop = stop_for_end(&self.vm.guest, &self.vm.process, held, observer)?;
        let last = self.vm.guest.take_last_stop();
        // Not in the memory of a module gone (given back at its unload).
        if let Some(f) = self.vm.follow.as_ref() {
            let gone = |va: &u64| f.released.iter().any(|t| t.contains(va));
            self.vm.jumps.retain(|j| !gone(&j.va));
        }
        let image = &self.tracer.plan().image;
        let before = self.vm.jumps.len();
        let gone = super::event_sites::drop_freed(&**stop.ram(), image, &mut self.vm.jumps);
        let freed = before - self.vm.jumps.len();
        if let Some(g) = self.vm.guard.as_mut() {
            gone.iter().for_each(|t| g.forget(t));
        }
        // The events of modules loaded again, written at their loads (the
        // guard has them already).
        if let Some(ev) = self.vm.follow.as_ref().map(|f| &f.reload) {
            self.vm.jumps.extend(ev.live.iter().cloned());
        }
        if let Some(g) = self.vm.guard.as_mut() {
            g.detach(&self.vm.guest, &stop, last)
                .map_err(|e| QemuError::NotTraceable(e.to_string()))?;
        }
        super::event_sites::restore(&stop, &self.vm.jumps)?;
        if let Some(f) = self.vm.follow.as_ref() {
            self.tracer.forget_sites(f.given_back());
        }
        let mut c = self.tracer.detach(&**stop.ram())?;
        c.module_event_sites_freed = freed;
        if let Some(f) = self.vm.follow.as_mut() {
            let (since, records) = f
                .detach(&stop)
                .map_err(|e| QemuError::NotTraceable(e.to_string()))?;
            (c.module_unloads, c.module_reloads, c.module_untraced) = f.cycles();
            (c.module_first, c.module_unslotted) = f.first_loaded();
            c.module_refused = f.first_refused();
            c.module_restored = f.restored;
            c.module_event_sites = f.event_sites_released;
            c.module_events_again = f.reload.again;
            c.module_events_untraced = f.reload.untraced;
            c.module_in_use = f.in_use;
            c.module_displaced = f.displaced;
            c.restored += since;
            let g = &mut c.guest_ftrace;
            g.cleared += records.cleared;
            g.kept += records.kept;
            g.why = g.why.or(records.why);
        }
        stop.resume()?;
        Ok(c)
    }

    /// Take the region out once no vCPU runs in it and (function graph)
    /// no hooked call has yet to return through it, trying for
    /// `REMOVE_ATTEMPTS` x `GRACE`; drain the rings a last time in that stop
    /// (calls in flight at the detach have finished by then), then hand
    /// the guest back to QEMU from it. Never while a site may still lead
    /// there (`sites_out` false: the detach failed); inside someone
    /// else's stop, once (the guest does not run to leave vmtrace's code).
    /// Returns the entries cleared, or why the region stays, and how the
    /// last drain went.
    pub(super) fn remove_region(
        &mut self,
        sites_out: bool,
        observer: &mut dyn Observer,
    ) -> (Result<usize, String>, Result<(), TracerError>) {
        if !sites_out {
            let drained = self.tracer.stop_draining();
            if let Ok(held) = held_for_end(self.vm, observer) {
                if let Ok(stop) = stop_for_end(&self.vm.guest, &self.vm.process, held, observer) {
                    let _ = stop.detach();
                }
            }
            let why = "the sites could not all be restored, and may lead to it";
            return (Err(why.into()), drained);
        }
        for attempt in 1..=REMOVE_ATTEMPTS {
            std::thread::sleep(GRACE);
            let stop = match held_for_end(self.vm, observer)
                .and_then(|held| stop_for_end(&self.vm.guest, &self.vm.process, held, observer))
            {
                Ok(s) => s,
                Err(e) => return (Err(e.to_string()), self.tracer.stop_draining()),
            };
            let busy = match self.tracer.region_busy(&stop) {
                Ok(b) => b,
                Err(e) => {
                    let _ = stop.detach();
                    return (Err(e.to_string()), self.tracer.stop_draining());
                }
            };
            match busy {
                Some(_) if attempt < REMOVE_ATTEMPTS && !stop.is_held() => {
                    if let Err(e) = stop.resume() {
                        return (Err(e.to_string()), self.tracer.stop_draining());
                    }
                    continue;
                }
                Some(busy) => {
                    let _ = stop.detach();
                    let why = match self.vm.held.is_some() {
                        true => format!(
                            "{busy}, and the VM is stopped by someone else: `vmtrace detach` takes it out once it runs"
                        ),
                        false => busy.to_string(),
                    };
                    return (Err(why), self.tracer.stop_draining());
                }
                None => {}
            }
            // Nothing runs vmtrace's code: every record is in the rings.
            let drained = self.tracer.stop_draining();
            let removed = match self.tracer.remove_region(&stop) {
                Ok(Ok(n)) => Ok(n),
                Ok(Err(busy)) => Err(busy.to_string()),
                Err(e) => Err(e.to_string()),
            };
            let detached = stop.detach().map_err(|e| e.to_string());
            return (removed.and_then(|n| detached.map(|()| n)), drained);
        }
        (Err("no stop".into()), self.tracer.stop_draining())
    }
}
