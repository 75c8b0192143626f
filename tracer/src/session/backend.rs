//! The driver's loops, the same for every guest a session traces: attach
//! once the guest is ready (each attempt in a stop of its own, retried
//! while the guest is not ready), then trace until the guest, the caller
//! or the duration ends it. Whoever runs the guest, vmtrace's own VMM
//! (`driver`) or a QEMU attached to (`crate::qemu::session`), is behind
//! [`Backend`]; its stops are `vmm::Stopped`, its memory `vmm::GuestRam`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::patch::AttachCounts;
use super::Progress;
use super::{NotReady, Tracer};

/// What the driver tells its front end while it runs; every method has a
/// default that does nothing.
pub trait Observer {
    /// The guest is booting and not ready yet (called every [`POLL`]).
    fn waiting(&mut self, _since_start: Duration) {}
    /// The attach happened.
    fn attached(&mut self, _attached: &Attached, _tracer: &Tracer) {}
    /// Tracing (called every [`POLL`]); `left`: of the duration, if any.
    fn tracing(&mut self, _progress: &Progress, _elapsed: Duration, _left: Option<Duration>) {}
    /// The guest's VMM keeps vmtrace waiting (called every [`POLL`] while
    /// it does): vmtrace waits it out.
    fn held_up(&mut self, _why: &HeldUp) {}
}

/// Why vmtrace waits on a VMM that is still there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeldUp {
    /// Its monitor has not answered for `since` (its main loop is busy, or
    /// its process is stopped).
    Unanswered { since: Duration },
    /// Someone else stopped the VM `since` ago, for `why` (QEMU's run
    /// state): vmtrace leaves that stop alone.
    Stopped { why: String, since: Duration },
}

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
}

/// What one attach in a stop did: its counts, how long every vCPU stood
/// still, and how long stopping them took.
pub type AttachedIn = (AttachCounts, Duration, Duration);

/// A guest as the driver's loops see it.
pub trait Backend {
    type Error;

    /// Is the guest worth stopping for an attach now? A look that stops
    /// nothing; yes by default.
    fn looks_ready(&self, _tracer: &Tracer) -> bool {
        true
    }

    /// One attach, in a stop of its own: what it did, or why the guest was
    /// not ready (nothing written then). On an error, nothing the attach
    /// wrote is left in the guest.
    fn attach_once(
        &mut self,
        tracer: &mut Tracer,
    ) -> Result<Result<AttachedIn, NotReady>, Self::Error>;

    /// Let the guest run for up to `step`, serving meanwhile what it asks
    /// of vmtrace (a QEMU's breakpoint hits); why tracing must end, once it
    /// must.
    fn run_for(&mut self, step: Duration) -> Option<TraceEnd>;

    /// What keeps vmtrace waiting now, if anything (a stalled or stopped
    /// VMM); nothing by default.
    fn held_up(&self) -> Option<HeldUp> {
        None
    }
}

/// Why tracing ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TraceEnd {
    /// The duration asked for elapsed.
    Duration,
    /// The guest stopped on its own (its VMM says why).
    GuestStopped,
    /// A termination signal.
    Signal(i32),
    /// The VMM closed its sockets (it quit or was killed).
    VmmGone(String),
    /// The debugger stub failed while serving breakpoints (the VMM still
    /// answers its monitor).
    Stub(String),
    /// The VMM's monitor now answers for another VMM (one restarted
    /// behind the same socket path): the VMM traced is worked on through
    /// its debugger stub only.
    MonitorLost(String),
    /// The guest was reset or shut down (the VMM says why): its memory is
    /// no longer the traced kernel's.
    GuestReset(String),
    /// The guest suspended to RAM (S3): its firmware runs at the wake-up.
    Suspended,
    /// The caller said so.
    Done,
}

/// How long an attach waits for the guest to be ready.
#[derive(Clone, Copy, Debug)]
pub struct Patience {
    /// Between two looks.
    pub step: Duration,
    /// Attempts (stops) before giving up; None: until the guest ends.
    pub attempts: Option<u32>,
}

/// How the attach's wait ended.
pub enum Waited {
    Attached(Attached),
    /// The guest ended first.
    Ended(TraceEnd),
    /// `Patience::attempts` stops found the guest not ready: the last
    /// one's reason.
    GaveUp(Option<NotReady>),
}

/// Attach once the guest is ready, each attempt in a stop of its own.
pub fn attach<B: Backend>(
    tracer: &mut Tracer,
    guest: &mut B,
    patience: Patience,
    observer: &mut dyn Observer,
) -> Result<Waited, B::Error> {
    let (mut retries, mut last_not_ready) = (0u32, None);
    let booting = Instant::now();
    loop {
        if guest.looks_ready(tracer) {
            match guest.attach_once(tracer)? {
                Ok((counts, window, latency)) => {
                    let attached = Attached {
                        counts,
                        window,
                        latency,
                        retries,
                        last_not_ready,
                    };
                    observer.attached(&attached, tracer);
                    return Ok(Waited::Attached(attached));
                }
                Err(why) => {
                    retries += 1;
                    last_not_ready = Some(why);
                }
            }
            if patience.attempts.is_some_and(|n| retries >= n) {
                return Ok(Waited::GaveUp(last_not_ready));
            }
        }
        observer.waiting(booting.elapsed());
        if let Some(end) = guest.run_for(patience.step) {
            return Ok(Waited::Ended(end));
        }
    }
}

/// Trace until the guest ends it, `done` is set (by another thread), or
/// `duration` (if any) elapses, `step` between two looks.
pub fn trace<B: Backend>(
    tracer: &Tracer,
    guest: &mut B,
    duration: Option<Duration>,
    done: &AtomicBool,
    step: Duration,
    observer: &mut dyn Observer,
) -> TraceEnd {
    let start = Instant::now();
    loop {
        if done.load(Ordering::Acquire) {
            return TraceEnd::Done;
        }
        if duration.is_some_and(|d| start.elapsed() >= d) {
            return TraceEnd::Duration;
        }
        if let Some(end) = guest.run_for(step) {
            return end;
        }
        if let Some(why) = guest.held_up() {
            observer.held_up(&why);
        }
        let left = duration.map(|d| d.saturating_sub(start.elapsed()));
        observer.tracing(&tracer.progress(), start.elapsed(), left);
    }
}
