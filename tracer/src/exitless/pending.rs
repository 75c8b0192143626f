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

use crossbeam_channel::Sender;
use vm_memory::GuestMemoryMmap;
use vmm::pause::GuestClock;

use super::collect::Drainer;
use super::layout::RingLayout;
use crate::model::Event;
use crate::record::{Counters, SiteIndex};

/// What only the attach's pause knows: how to date the records, and where
/// to count them.
struct Go {
    clock: GuestClock,
    counters: Arc<Counters>,
    index: Arc<SiteIndex>,
}

/// How often the waiting thread looks for its start: the records wait in
/// the rings meanwhile (at most this long after the attach). It waits
/// through the guest's boot too (minutes of a Linux boot on an emulating
/// host), so not much more often than this.
const POLL: Duration = Duration::from_millis(4);

/// What the attach hands the waiting thread, and whether it should give up.
#[derive(Default)]
struct Slot {
    go: Mutex<Option<Go>>,
    /// `start` was called (once is all it takes).
    told: AtomicBool,
    closed: AtomicBool,
}

/// A thread waiting to start the drainer.
pub struct PendingDrainer {
    slot: Arc<Slot>,
    thread: JoinHandle<Option<Drainer>>,
}

impl PendingDrainer {
    /// Spawn the waiting thread; it owns the events' way to the collector
    /// (`sink`) from now on and drops it if never told to start.
    pub fn spawn(
        mem: GuestMemoryMmap,
        layout: RingLayout,
        sink: Sender<Vec<Event>>,
    ) -> std::io::Result<PendingDrainer> {
        let slot = Arc::new(Slot::default());
        let seen = Arc::clone(&slot);
        let thread = std::thread::Builder::new()
            .name("drainer-start".into())
            .spawn(move || loop {
                if let Some(g) = seen.go.lock().unwrap_or_else(|e| e.into_inner()).take() {
                    return Some(Drainer::start(
                        mem, layout, g.clock, g.counters, g.index, sink,
                    ));
                }
                if seen.closed.load(Ordering::Acquire) {
                    return None;
                }
                std::thread::sleep(POLL);
            })?;
        Ok(PendingDrainer { slot, thread })
    }

    /// Start draining (the first call; later ones do nothing): left where
    /// the waiting thread looks, no spawn and no wake-up in the caller's
    /// pause.
    pub fn start(&self, clock: GuestClock, counters: Arc<Counters>, index: Arc<SiteIndex>) {
        if self.slot.told.swap(true, Ordering::AcqRel) {
            return;
        }
        *self.slot.go.lock().unwrap_or_else(|e| e.into_inner()) = Some(Go {
            clock,
            counters,
            index,
        });
    }

    /// The drainer, if it was started; None if not (the waiting thread
    /// ends, dropping its sender). Err: the thread panicked.
    pub fn join(self) -> Result<Option<Drainer>, ()> {
        self.slot.closed.store(true, Ordering::Release);
        self.thread.join().map_err(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestAddress;

    #[test]
    fn a_drainer_never_started_ends_and_lets_the_collector_finish() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let layout = RingLayout::new(1, 4, None, false).unwrap();
        let (sink, events) = crossbeam_channel::unbounded();
        let pending = PendingDrainer::spawn(mem, layout, sink).unwrap();
        assert!(matches!(pending.join(), Ok(None)));
        // Its sender is gone with it: the collector sees the end.
        assert!(events.recv().is_err());
    }
}
