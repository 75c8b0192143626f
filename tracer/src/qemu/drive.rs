//! A QEMU as the session driver's loops see it (`session::backend`): each
//! attach attempt in a stop through its gdbstub, and while tracing, its
//! breakpoint hits served (trap mode), its monitor asked whether it still
//! runs, and the termination signals taken.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vmm::{Stopped, TrapHandler};

use super::breakpoints::{self, Breakpoints};
use super::error::QemuError;
use super::guest::QemuGuest;
use super::qmp::Qmp;
use crate::session::backend::{AttachedIn, Backend, TraceEnd};
use crate::session::exitless::backing::RegionPages;
use crate::session::watch::Watch;
use crate::session::{Attach, NotReady, Tracer};

/// Where the gdbstub is: one vmtrace opened through QMP (and closes at
/// the end, reopening the one it replaced), or one the user gave.
pub(super) enum Stub {
    Opened(super::stub::OwnStub),
    Given,
}

/// How calls reach vmtrace in this QEMU, with what only that mode has.
pub(super) enum Arming {
    /// vmtrace's region in the guest's free low memory.
    Exitless { pages: Arc<Mutex<RegionPages>> },
    /// Breakpoints through the stub: the trap handlers until the attach
    /// sets the breakpoints, which serve them from then on.
    Trap {
        handlers: Option<Vec<Box<dyn TrapHandler>>>,
        breakpoints: Option<Breakpoints>,
    },
}

/// A QEMU whose guest a session traces.
pub(super) struct QemuVm {
    pub(super) qmp: Qmp,
    pub(super) guest: QemuGuest,
    pub(super) stub: Stub,
    pub(super) arming: Arming,
    /// Attached: from here on a wait also serves hits, asks the monitor
    /// and takes the termination signals.
    pub(super) tracing: bool,
}

impl Backend for QemuVm {
    type Error = QemuError;

    /// One attach in a stop: exitless, the tracer's attach (whatever it
    /// wrote taken out again on an error); trap mode, a breakpoint at each
    /// site found ready (nothing written).
    fn attach_once(
        &mut self,
        tracer: &mut Tracer,
    ) -> Result<Result<AttachedIn, NotReady>, QemuError> {
        let stop = self.guest.stop(false)?;
        let times = |t: &Tracer| (t.attach_counts.clone(), stop.window(), stop.latency());
        let attached = match &mut self.arming {
            Arming::Exitless { .. } => match tracer.attach(&stop) {
                Ok(Attach::Attached(_)) => Ok(times(tracer)),
                Ok(Attach::NotReady(why)) => Err(why),
                Err(e) => {
                    // Whatever was written comes out before the error is said.
                    let _ = tracer.detach(&**stop.ram());
                    return Err(e.into());
                }
            },
            Arming::Trap {
                handlers,
                breakpoints,
            } => match tracer.watch_sites(&stop)? {
                Watch::Ready { sites, others } => {
                    let hs = handlers.take().unwrap_or_default();
                    let mut b = breakpoints::watch(tracer, &stop, &sites, others, hs)?;
                    let t = times(tracer);
                    if let Err(e) = stop.resume() {
                        b.finish();
                        return Err(e.into());
                    }
                    *breakpoints = Some(b);
                    self.tracing = true;
                    return Ok(Ok(t));
                }
                Watch::NotReady(why) => Err(why),
            },
        };
        stop.resume()?;
        self.tracing = attached.is_ok();
        Ok(attached)
    }

    fn run_for(&mut self, step: Duration) -> Option<TraceEnd> {
        if !self.tracing {
            std::thread::sleep(step);
            return None;
        }
        if let Some(sig) = vmm::run::take_terminate_signal() {
            return Some(TraceEnd::Signal(sig));
        }
        match &mut self.arming {
            Arming::Trap {
                breakpoints: Some(b),
                ..
            } => {
                let until = Instant::now() + step;
                loop {
                    // (A socket takes no zero timeout: the step is over.)
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    match b.serve(&self.guest, left) {
                        // Hits keep coming: QMP is asked every step, not
                        // every hit.
                        Ok(true) => continue,
                        Ok(false) => break,
                        Err(e) => {
                            return Some(match self.qmp.status() {
                                Err(gone) => TraceEnd::VmmGone(gone.to_string()),
                                Ok(_) => TraceEnd::Stub(e.to_string()),
                            })
                        }
                    }
                }
            }
            _ => std::thread::sleep(step),
        }
        self.qmp
            .status()
            .err()
            .map(|e| TraceEnd::VmmGone(e.to_string()))
    }
}
