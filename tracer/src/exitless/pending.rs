//! The ring drainer, made ready before the attach's pause: starting it
//! means spawning a thread (tens to hundreds of µs on a busy host), which
//! inside the pause was most of what an exitless attach still cost once
//! its rings were staged. A thread spawned beforehand waits for the guest
//! clock the pause reads, then starts the drainer while the guest runs on.

use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{bounded, Sender};
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

/// A thread waiting to start the drainer.
pub struct PendingDrainer {
    go: Sender<Go>,
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
        let (go, wait) = bounded::<Go>(1);
        let thread = std::thread::Builder::new()
            .name("drainer-start".into())
            .spawn(move || {
                let g = wait.recv().ok()?;
                Some(Drainer::start(
                    mem, layout, g.clock, g.counters, g.index, sink,
                ))
            })?;
        Ok(PendingDrainer { go, thread })
    }

    /// Start draining (the first call; later ones do nothing): one message
    /// to the waiting thread, no spawn in the caller's pause.
    pub fn start(&self, clock: GuestClock, counters: Arc<Counters>, index: Arc<SiteIndex>) {
        // Full or gone: told already.
        let _ = self.go.try_send(Go {
            clock,
            counters,
            index,
        });
    }

    /// The drainer, if it was started; None if not (the waiting thread
    /// ends, dropping its sender). Err: the thread panicked.
    pub fn join(self) -> Result<Option<Drainer>, ()> {
        drop(self.go);
        self.thread.join().map_err(|_| ())
    }
}
