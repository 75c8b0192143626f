//! A traced run from start to end, the one driver every front end uses (the
//! CLI's runs and records, the bench's measured runs): start the guest with
//! the tracer's trap handlers, attach once the guest is ready (under a
//! pause, retried while it is not), trace until the guest stops or the
//! duration ends (then detach under a pause first), and end: stop the
//! guest, restore every site whatever happened, drain, and close the trace.
//!
//! The guest here is vmtrace's own VMM (`vmm::Running`); a QEMU guest
//! attached through its monitor (`crate::qemu::session`) runs through the
//! same loops (`backend`), the two differing only in their `Backend`. The bench's measurements that
//! set one tracer against another on one guest drive both tracers
//! themselves: a session has one.
//!
//! A session dropped without `end` still ends: the guest is stopped and
//! every site restored (what was recorded is dropped).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;
use vmm::GuestRam;

use vmm::advice::{Advice, Words};
use vmm::boot::Protocol;
use vmm::{RunReport, Running, StopReason, Stopped, TrapHandler, Vm};

use super::backend::{self, Attached, Backend, Observer, Patience, TraceEnd, Waited};
use super::patch::DetachCounts;
use super::{Attach, NotReady, Recording, Saved, Tracer};
use crate::error::TracerError;
use crate::plan::TracePlan;
use crate::trace::datafile::TraceFileError;
use crate::trace::model::Trace;

/// How often the driver looks at the guest while it runs.
pub const POLL: Duration = Duration::from_millis(20);

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The tracer could not be set up or could not attach: nothing was
    /// written to the guest.
    #[error(transparent)]
    Attach(TracerError),
    /// Restoring the guest's text failed.
    #[error("cannot restore the guest's text: {0}")]
    Restore(TracerError),
    #[error("cannot start the guest: {0}")]
    Start(vmm::VmError),
}

/// How the guest starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// For [`Session::trace`]: a kernel that does not patch its own sites
    /// waits before its first instruction, so that the attach sees every
    /// call.
    ForTrace,
    /// At once; the caller attaches when it chooses.
    Running,
}

/// A tracer made for a plan, its guest not started yet: what can refuse
/// the run has been checked (the caller may say so before the guest's
/// console starts).
pub struct Prepared {
    tracer: Tracer,
    handlers: Vec<Box<dyn TrapHandler>>,
    kernel: PathBuf,
}

impl Prepared {
    /// Start `vm`, the one it was prepared for, under it.
    pub fn start(self, vm: Vm) -> Result<Session, SessionError> {
        let Prepared {
            tracer,
            handlers,
            kernel,
        } = self;
        Session::with_tracer(vm, tracer, handlers, &kernel, Start::ForTrace)
    }
}

/// A guest running under a tracer.
pub struct Session {
    /// Taken by `end` (or by `drop`, which ends it too).
    live: Option<Live>,
}

/// What a session holds while it runs.
struct Live {
    tracer: Tracer,
    vm: OwnVm,
    mem: Arc<dyn GuestRam>,
    kernel: PathBuf,
}

/// vmtrace's own VMM running the guest, as the driver's loops see it
/// (`backend::Backend`).
struct OwnVm {
    running: Running,
    /// The guest does not patch its own sites (direct boot): attach at once.
    attach_now: bool,
}

impl Session {
    /// The tracer for `plan` on `vm`'s vCPUs. With `recording.storage` a
    /// data file, its header is written now.
    pub fn prepare(
        plan: TracePlan,
        vm: &Vm,
        recording: Recording,
    ) -> Result<Prepared, SessionError> {
        let kernel = recording.kernel.clone();
        let (tracer, handlers) = Tracer::create(plan.plan, vm.cpus(), plan.mode, recording)
            .map_err(SessionError::Attach)?;
        Ok(Prepared {
            tracer,
            handlers,
            kernel,
        })
    }

    /// `prepare`, then start `vm` under it.
    pub fn start(vm: Vm, plan: TracePlan, recording: Recording) -> Result<Session, SessionError> {
        Session::prepare(plan, &vm, recording)?.start(vm)
    }

    /// Start `vm` under a tracer made by the caller (the bench's own
    /// configurations, which attach and detach as they measure), with its
    /// `handlers`.
    pub fn with_tracer(
        vm: Vm,
        tracer: Tracer,
        handlers: Vec<Box<dyn TrapHandler>>,
        kernel: &Path,
        start: Start,
    ) -> Result<Session, SessionError> {
        // A kernel that does not patch its own sites (the mini guest) is
        // traced from its first instruction; Linux once its ftrace_init made
        // the sites NOPs.
        let attach_now = vm.boot_plan().protocol == Protocol::Direct;
        let start_paused = attach_now && start == Start::ForTrace;
        let running = vm
            .start(handlers, start_paused)
            .map_err(SessionError::Start)?;
        let mem = Arc::clone(running.ram());
        Ok(Session {
            live: Some(Live {
                tracer,
                vm: OwnVm {
                    running,
                    attach_now,
                },
                mem,
                kernel: kernel.to_owned(),
            }),
        })
    }

    fn live(&self) -> &Live {
        // Only `end` and `drop` take it, and neither leaves a session behind.
        self.live.as_ref().expect("a session is live until it ends")
    }

    fn live_mut(&mut self) -> &mut Live {
        self.live.as_mut().expect("a session is live until it ends")
    }

    pub fn tracer(&self) -> &Tracer {
        &self.live().tracer
    }

    pub fn running(&self) -> &Running {
        &self.live().vm.running
    }

    /// Both at once, for callers that pause the guest themselves.
    pub fn parts(&mut self) -> (&Running, &mut Tracer) {
        let live = self.live_mut();
        (&live.vm.running, &mut live.tracer)
    }

    /// Attach when the guest is ready, trace until it stops or `duration`
    /// ends (then detach under a pause first, so the guest never runs
    /// half-restored text, and stop it). Returns what the attach did (None:
    /// the guest stopped before it could attach).
    pub fn trace(
        &mut self,
        duration: Option<Duration>,
        observer: &mut dyn Observer,
    ) -> Result<Option<Attached>, SessionError> {
        let live = self.live_mut();
        let attached = live.attach(observer)?;
        if attached.is_some() {
            live.trace(duration, observer)?;
        }
        Ok(attached)
    }

    /// Stop the guest if it still runs, then put every byte back, drain what
    /// the stopped guest left in its rings, and close the trace (the data
    /// file's footer is written: it is complete from here on). `words`: how
    /// the front end words the stop reason that the trace keeps.
    pub fn end(mut self, words: &dyn Words) -> Ended {
        let live = self.live.take().expect("a session is live until it ends");
        live.end(words)
    }
}

impl Drop for Session {
    /// Ended without `end` (a caller's early return): stop the guest and
    /// restore every site all the same.
    fn drop(&mut self) {
        if let Some(live) = self.live.take() {
            let _ = live.end(&vmm::advice::Plain);
        }
    }
}

impl Live {
    /// Trace until the guest stops or `duration` ends (then detach under a
    /// pause first, so the guest never runs half-restored text, and stop
    /// it).
    fn trace(
        &mut self,
        duration: Option<Duration>,
        observer: &mut dyn Observer,
    ) -> Result<(), SessionError> {
        let never = AtomicBool::new(false);
        let end = backend::trace(&self.tracer, &mut self.vm, duration, &never, POLL, observer);
        if end == TraceEnd::Duration {
            let paused = self.vm.running.pause_all();
            self.tracer
                .detach(paused.memory())
                .map_err(SessionError::Restore)?;
            drop(paused);
            self.vm.running.request_stop(StopReason::DurationReached);
        }
        Ok(())
    }

    /// Attach once the guest's ftrace_init is done (polled), under a pause
    /// only if every selected site agrees; otherwise resume and retry.
    /// Exitless code and rings are written before, not inside the pause.
    fn attach(&mut self, observer: &mut dyn Observer) -> Result<Option<Attached>, SessionError> {
        let memory = Arc::clone(self.vm.running.ram());
        if let Err(e) = self.tracer.stage(&memory) {
            self.vm.running.request_stop(StopReason::Requested);
            return Err(SessionError::Attach(e));
        }
        let patience = Patience {
            step: POLL,
            attempts: None,
        };
        match backend::attach(&mut self.tracer, &mut self.vm, patience, observer)? {
            Waited::Attached(a) => Ok(Some(a)),
            // Only the guest's end ends the wait here.
            Waited::Ended(_) | Waited::GaveUp(_) => Ok(None),
        }
    }

    fn end(self, words: &dyn Words) -> Ended {
        let Live {
            mut tracer,
            vm: OwnVm { running, .. },
            mem,
            kernel,
        } = self;
        let report = running.finish();
        // What every detach of the run restored, including one at the end
        // of a duration.
        let detached = tracer.detach(&*mem).map(|_| tracer.detached.clone());
        // (A trace of modules only patches no site at the attach.)
        let attached = tracer.attach_counts.patched + tracer.attach_counts.module_traps;
        let drained = tracer.stop_draining();
        // Exits at the trace port: one per traced call in trap mode, none
        // in exitless mode (traps happen only while sites hold them); the
        // module loader's traps apart (said with the detach).
        let trap_exits = report
            .vcpus
            .iter()
            .map(|v| v.get(vmm::exit::ExitKind::Trap))
            .sum::<u64>()
            .saturating_sub(tracer.module_trap_exits());
        // The kernel numbered its events after the attach: their ids now.
        tracer.read_event_ids(&*mem);
        let places = stop_places(&report, &tracer);
        let reason = report.reason.say(words);
        let (summary, saved) = tracer.finish_stored(&kernel, reason, trap_exits);
        Ended {
            report,
            detached,
            attached,
            drained,
            places,
            summary,
            saved,
        }
    }
}

impl Backend for OwnVm {
    type Error = SessionError;

    /// A kernel that does not patch its own sites is ready at once; Linux
    /// once its ftrace_init is done, which the tracer polls without a pause.
    fn looks_ready(&self, tracer: &Tracer) -> bool {
        self.attach_now || tracer.guest_ready(&**self.running.ram())
    }

    /// One attach under a pause. A refused attach stops the guest (while
    /// still paused).
    fn attach_once(
        &mut self,
        tracer: &mut Tracer,
    ) -> Result<Result<backend::AttachedIn, NotReady>, SessionError> {
        let paused = self.running.pause_all();
        let attempt = match tracer.attach(&paused) {
            Ok(a) => a,
            Err(e) => {
                self.running.request_stop(StopReason::Requested);
                return Err(SessionError::Attach(e));
            }
        };
        let c = match attempt {
            Attach::Attached(c) => c.clone(),
            Attach::NotReady(why) => return Ok(Err(why)),
        };
        Ok(Ok((c, paused.window(), paused.latency())))
    }

    fn run_for(&mut self, step: Duration) -> Option<TraceEnd> {
        self.running.wait_stop(step).map(|_| TraceEnd::GuestStopped)
    }
}

/// How a session ended.
pub struct Ended {
    /// Why and when the guest stopped, and how it ran.
    pub report: RunReport,
    /// What every detach restored, or why restoring failed.
    pub detached: Result<DetachCounts, TracerError>,
    /// Sites patched at the attach, the module loader's traps included
    /// (0: it never attached).
    pub attached: usize,
    /// Exitless: an error draining the rings (the counts stay exact).
    pub drained: Result<(), TracerError>,
    /// The guest addresses the report names (where a vCPU stopped), each
    /// as `function+0xoffset`.
    pub places: HashMap<u64, String>,
    /// The trace's counts and facts (its events too without a data file).
    pub summary: Trace,
    /// With a data file: how its writing ended.
    pub saved: Option<Result<Saved, TraceFileError>>,
}

/// Where a failing guest (and each vCPU) stopped, each address with its
/// function.
fn stop_places(report: &RunReport, tracer: &Tracer) -> HashMap<u64, String> {
    let rips = report
        .reason
        .rip()
        .into_iter()
        .chain(report.last_regs.iter().flatten().map(|s| s.regs.rip));
    rips.filter_map(|rip| Some((rip, tracer.function_at(rip)?)))
        .collect()
}
