//! A traced run from start to end, the one driver every front end uses (the
//! CLI's runs and records, the bench's measured runs): start the guest with
//! the tracer's trap handlers, attach once the guest is ready (under a
//! pause, retried while it is not), trace until the guest stops or the
//! duration ends (then detach under a pause first), and end: stop the
//! guest, restore every site whatever happened, drain, and close the trace.
//!
//! The guest here is vmtrace's own VMM (`vmm::Running`): a second backend
//! (a QEMU guest attached through its monitor) gives the same pause, memory
//! and stop operations to the same driver.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vm_memory::GuestMemoryMmap;
use vmm::boot::Protocol;
use vmm::{RunReport, Running, StopReason, TrapHandler, Vm};

use super::exitless::map::Mapped;
use super::patch::{AttachCounts, DetachCounts};
use super::{Attach, NotReady, Progress, Recording, Saved, Tracer};
use crate::error::TracerError;
use crate::kernel::kaslr::KernelOffset;
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

/// What the driver tells its front end while it runs; every method has a
/// default that does nothing.
pub trait Observer {
    /// The guest is booting and not ready yet (called every [`POLL`]).
    fn waiting(&mut self, _since_start: Duration) {}
    /// The attach happened.
    fn attached(&mut self, _attached: &Attached, _tracer: &Tracer) {}
    /// Tracing (called every [`POLL`]); `left`: of the duration, if any.
    fn tracing(&mut self, _progress: &Progress, _elapsed: Duration, _left: Option<Duration>) {}
}

/// An observer that says nothing.
pub struct Silent;
impl Observer for Silent {}

/// What an attach did and found.
#[derive(Clone, Debug)]
pub struct Attached {
    pub counts: AttachCounts,
    /// How long every vCPU stood still, and how long stopping them took.
    pub window: Duration,
    pub latency: Duration,
    /// Attempts that found the guest not ready, and the last one's reason.
    pub retries: u32,
    pub last_not_ready: Option<NotReady>,
    /// Where vmtrace's pages went (exitless mode, trap-mode graph).
    pub mapped: Option<Mapped>,
    pub kernel_offset: Option<KernelOffset>,
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

/// A guest running under a tracer.
pub struct Session {
    tracer: Tracer,
    running: Running,
    mem: GuestMemoryMmap,
    /// The guest does not patch its own sites (direct boot): attach at once.
    attach_now: bool,
    kernel: PathBuf,
}

impl Session {
    /// Create the tracer for `plan`, start `vm` with its trap handlers.
    /// With `recording.storage` a data file, its header is written now.
    pub fn start(vm: Vm, plan: TracePlan, recording: Recording) -> Result<Session, SessionError> {
        let kernel = recording.kernel.clone();
        let (tracer, handlers) =
            Tracer::create(plan.plan, vm.cpus(), plan.mode, plan.ring_events, recording)
                .map_err(SessionError::Attach)?;
        Session::with_tracer(vm, tracer, handlers, &kernel, Start::ForTrace)
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
        let mem = running.memory().clone();
        Ok(Session {
            tracer,
            running,
            mem,
            attach_now,
            kernel: kernel.to_owned(),
        })
    }

    pub fn tracer(&self) -> &Tracer {
        &self.tracer
    }

    pub fn tracer_mut(&mut self) -> &mut Tracer {
        &mut self.tracer
    }

    pub fn running(&self) -> &Running {
        &self.running
    }

    /// Both at once, for callers that pause the guest themselves.
    pub fn parts(&mut self) -> (&Running, &mut Tracer) {
        (&self.running, &mut self.tracer)
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
        let attached = self.attach(observer)?;
        if attached.is_none() {
            return Ok(None);
        }
        let start = Instant::now();
        loop {
            if self.running.wait_stop(POLL).is_some() {
                break;
            }
            if duration.is_some_and(|d| start.elapsed() >= d) {
                let paused = self.running.pause_all();
                self.tracer
                    .detach(paused.memory())
                    .map_err(SessionError::Restore)?;
                drop(paused);
                self.running.request_stop(StopReason::Requested);
                break;
            }
            let left = duration.map(|d| d.saturating_sub(start.elapsed()));
            observer.tracing(&self.tracer.progress(), start.elapsed(), left);
        }
        Ok(attached)
    }

    /// Attach once the guest's ftrace_init is done (polled), under a pause
    /// only if every selected site agrees; otherwise resume and retry.
    /// Exitless code and rings are written before, not inside the pause.
    fn attach(&mut self, observer: &mut dyn Observer) -> Result<Option<Attached>, SessionError> {
        let refused = |running: &Running, e| {
            running.request_stop(StopReason::Requested);
            SessionError::Attach(e)
        };
        let memory = self.running.memory().clone();
        if let Err(e) = self.tracer.stage(&memory) {
            return Err(refused(&self.running, e));
        }
        let (mut retries, mut last_not_ready) = (0u32, None);
        let booting = Instant::now();
        loop {
            if self.attach_now || self.tracer.guest_ready(&memory) {
                let paused = self.running.pause_all();
                let attempt = match self.tracer.attach(&paused) {
                    Ok(a) => a,
                    Err(e) => {
                        drop(paused);
                        return Err(refused(&self.running, e));
                    }
                };
                match attempt {
                    Attach::Attached(c) => {
                        let attached = Attached {
                            counts: c.clone(),
                            window: paused.window(),
                            latency: paused.latency(),
                            retries,
                            last_not_ready,
                            mapped: c.exitless,
                            kernel_offset: None,
                        };
                        drop(paused);
                        let attached = Attached {
                            kernel_offset: self.tracer.kernel_offset(),
                            ..attached
                        };
                        observer.attached(&attached, &self.tracer);
                        return Ok(Some(attached));
                    }
                    Attach::NotReady(why) => {
                        drop(paused);
                        retries += 1;
                        last_not_ready = Some(why);
                    }
                }
            } else {
                observer.waiting(booting.elapsed());
            }
            if self.running.wait_stop(POLL).is_some() {
                return Ok(None);
            }
        }
    }

    /// Stop the guest if it still runs, then put every byte back, drain what
    /// the stopped guest left in its rings, and close the trace (the data
    /// file's footer is written: it is complete from here on).
    pub fn end(self) -> Ended {
        let Session {
            mut tracer,
            running,
            mem,
            kernel,
            ..
        } = self;
        let report = running.finish();
        // What every detach of the run restored, including one at the end
        // of a duration.
        let detached = tracer.detach(&mem).map(|_| tracer.detached.clone());
        let attached = tracer.attach_counts.patched;
        let drained = tracer.stop_draining();
        // Exits at the trace port: one per traced call in trap mode, none
        // in exitless mode (traps happen only while sites hold them).
        let trap_exits = report
            .vcpus
            .iter()
            .map(|v| v.get(vmm::exit::ExitKind::Trap))
            .sum();
        let places = stop_places(&report, &tracer);
        let (summary, saved) = tracer.finish_stored(&kernel, report.reason.to_string(), trap_exits);
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

/// How a session ended.
pub struct Ended {
    /// Why and when the guest stopped, and how it ran.
    pub report: RunReport,
    /// What every detach restored, or why restoring failed.
    pub detached: Result<DetachCounts, TracerError>,
    /// Sites patched at the attach (0: it never attached).
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
