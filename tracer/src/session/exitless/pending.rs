//! The ring drainer, made ready before the attach's pause: starting it
//! means spawning a thread (tens to hundreds of µs on a busy host), which
//! inside the pause was most of what an exitless attach still cost once
//! its rings were staged. A thread spawned beforehand looks every `POLL`
//! for the guest clock the pause reads, then starts the drainer while the
//! guest runs on. It polls rather than being woken: a thread woken from
//! inside the pause could be run at once on the pausing thread's CPU and
//! spawn the drainer there, the very cost this avoids (measured: some
//! exitless attaches took 170-230 µs with a wake-up, against 40-60 µs).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use vmm::GuestRam;

use super::collect::{DrainStart, Drainer, Sink};
use crate::plan::exitless::layout::RingLayout;

/// What only the attach's pause knows: how to date the records, and where
/// to count them.
type Go = DrainStart;

/// How often the waiting thread looks for its start: the records wait in
/// the rings meanwhile (at most this long after the attach). It waits
/// through the guest's boot too (minutes of a Linux boot on an emulating
/// host), so not much more often than this.
const POLL: Duration = Duration::from_millis(4);

/// What the attach hands the waiting thread (`Go`; any type in tests), and
/// whether it should give up.
struct Slot<G = Go> {
    go: Mutex<Option<G>>,
    /// `start` was called (once is all it takes).
    told: AtomicBool,
    closed: AtomicBool,
}

impl<G> Default for Slot<G> {
    fn default() -> Self {
        Slot {
            go: Mutex::new(None),
            told: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        }
    }
}

/// A thread waiting to start the drainer. Dropped without `join` (an
/// attach given up without `finish`), it tells the thread to end and
/// waits for it (at most one `POLL`): a thread left polling would hold the
/// guest's memory and the events' sender, and the collector never ends.
pub struct PendingDrainer {
    slot: Arc<Slot>,
    thread: Option<JoinHandle<Option<Drainer>>>,
}

/// What the waiting thread does after one look at its slot.
enum Look<G> {
    Start(G),
    End,
    Wait,
}

/// One look at the slot. `closed` is read BEFORE `go`: `start` fills `go`
/// before `join` sets `closed`, so a thread that sees `closed` and then an
/// empty `go` was never started. Read the other way round, a thread
/// preempted between the two reads while both `start` and `join` happened
/// would end with `go` set: no drainer, the events lost, and `finish` Ok.
/// `between` runs between the two reads (tests force the interleaving).
fn look<G>(slot: &Slot<G>, between: impl FnOnce()) -> Look<G> {
    let closed = slot.closed.load(Ordering::Acquire);
    between();
    if let Some(g) = slot.go.lock().unwrap_or_else(|e| e.into_inner()).take() {
        return Look::Start(g);
    }
    if closed {
        Look::End
    } else {
        Look::Wait
    }
}

impl PendingDrainer {
    /// Spawn the waiting thread; it owns the events' way to the collector
    /// (`sink`) from now on and drops it if never told to start.
    pub fn spawn(
        mem: Arc<dyn GuestRam>,
        layout: RingLayout,
        sink: Sink,
    ) -> std::io::Result<PendingDrainer> {
        let slot = Arc::new(Slot::<Go>::default());
        let seen = Arc::clone(&slot);
        let thread = std::thread::Builder::new()
            .name("drainer-start".into())
            .spawn(move || loop {
                match look(&seen, || {}) {
                    Look::Start(g) => return Some(Drainer::start(mem, layout, sink, g)),
                    Look::End => return None,
                    Look::Wait => std::thread::sleep(POLL),
                }
            })?;
        Ok(PendingDrainer {
            slot,
            thread: Some(thread),
        })
    }

    /// Start draining (the first call; later ones do nothing): left where
    /// the waiting thread looks, no spawn and no wake-up in the caller's
    /// pause.
    pub fn start(&self, go: DrainStart) {
        if self.slot.told.swap(true, Ordering::AcqRel) {
            return;
        }
        *self.slot.go.lock().unwrap_or_else(|e| e.into_inner()) = Some(go);
    }

    /// The drainer, if it was started; None if not (the waiting thread
    /// ends, dropping its sender). Err: the thread panicked.
    pub fn join(mut self) -> Result<Option<Drainer>, ()> {
        self.close().map_err(|_| ())
    }

    /// Tell the waiting thread to end and wait for it.
    fn close(&mut self) -> std::thread::Result<Option<Drainer>> {
        self.slot.closed.store(true, Ordering::Release);
        match self.thread.take() {
            Some(t) => t.join(),
            None => Ok(None),
        }
    }
}

impl Drop for PendingDrainer {
    fn drop(&mut self) {
        // Dropped without `join`: the drainer, if it had started, is
        // stopped too (its thread would otherwise drain forever); its
        // result has nobody to go to.
        if let Ok(Some(d)) = self.close() {
            let _ = d.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestAddress;
    use vm_memory::GuestMemoryMmap;

    #[test]
    fn a_drainer_never_started_ends_and_lets_the_collector_finish() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let layout = RingLayout::new(1, 4, None, false).unwrap();
        let (sink, events) = crossbeam_channel::unbounded::<Vec<crate::trace::model::Event>>();
        let pending = PendingDrainer::spawn(Arc::new(mem), layout, sink.into()).unwrap();
        assert!(matches!(pending.join(), Ok(None)));
        // Its sender is gone with it: the collector sees the end.
        assert!(events.recv().is_err());
    }

    #[test]
    fn a_start_and_a_join_between_the_threads_two_reads_still_start_the_drainer() {
        // The waiting thread preempted between its two reads while the
        // attach's pause calls `start` and `finish` calls `join`.
        let slot = Slot::<u32>::default();
        let look = look(&slot, || {
            *slot.go.lock().unwrap() = Some(7);
            slot.closed.store(true, Ordering::Release);
        });
        assert!(matches!(look, Look::Start(7)));
    }

    #[test]
    fn a_pending_drainer_dropped_without_join_ends_its_thread() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let layout = RingLayout::new(1, 4, None, false).unwrap();
        let (sink, events) = crossbeam_channel::unbounded::<Vec<crate::trace::model::Event>>();
        drop(PendingDrainer::spawn(Arc::new(mem), layout, sink.into()).unwrap());
        // The thread ended and dropped its sender. (The timeout only keeps
        // a failing test from hanging: a thread left polling never ends.)
        assert_eq!(
            events.recv_timeout(Duration::from_secs(60)),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected)
        );
    }
}
