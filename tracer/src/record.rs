//! Recording function entries on the trap path.
//!
//! Each vCPU thread owns a `Recorder`: it finds the site from RIP, counts the
//! call in its own counters, reads the caller from [RSP] through a cached
//! translation, and appends an event to its own buffer; full buffers go to the
//! collector thread over a channel. Nothing on this path takes a lock.
//! Counts are always exact; events beyond `--max-events` are counted as
//! dropped, never lost silently.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use vmm::gva::TlbCache;
use vmm::{Trap, TrapHandler};

use crate::sites::SITE_LEN;
use crate::trace::Event;

/// Events a vCPU buffers before handing them to the collector.
pub const BATCH: usize = 4096;

/// Length of `out imm8, al`: on hosts whose KVM completes the `out` before
/// exiting (this CI host), RIP is already this far past the site.
const OUT_LEN: u64 = 2;

/// The patchable sites, sorted by address, each with its traced function.
#[derive(Debug, Default)]
pub struct SiteIndex {
    pub addrs: Vec<u64>,
    pub funcs: Vec<u32>,
}

impl SiteIndex {
    /// `sites`: (address, function index), any order.
    pub fn new(mut sites: Vec<(u64, u32)>) -> Self {
        sites.sort_unstable();
        sites.dedup_by_key(|s| s.0);
        SiteIndex {
            addrs: sites.iter().map(|s| s.0).collect(),
            funcs: sites.iter().map(|s| s.1).collect(),
        }
    }

    fn exact(&self, addr: u64) -> Option<usize> {
        self.addrs.binary_search(&addr).ok()
    }

    /// The site a trap at `rip` came from: RIP at the `out` (bare-metal KVM's
    /// fast PIO path) or just past it (KVM's emulator). Sites are five bytes
    /// apart at least, so the two cannot both match.
    pub fn find(&self, rip: u64) -> Option<usize> {
        self.exact(rip)
            .or_else(|| self.exact(rip.wrapping_sub(OUT_LEN)))
    }
}

/// Counters and budget shared between the recorders and the controller.
pub struct Shared {
    /// Calls per site, one array per vCPU (written only by that vCPU).
    pub counts: Vec<Box<[AtomicU64]>>,
    /// Events that may still be stored.
    budget: AtomicI64,
    pub dropped: AtomicU64,
    pub parent_unreadable: AtomicU64,
}

/// One vCPU's trap handler.
pub struct Recorder {
    cpu: u32,
    index: Arc<SiteIndex>,
    shared: Arc<Shared>,
    buf: Vec<Event>,
    /// Events this recorder may still store without touching `budget`.
    reserved: usize,
    tx: Sender<Vec<Event>>,
    tlb: TlbCache,
}

impl Recorder {
    fn reserve(&mut self) {
        let before = self
            .shared
            .budget
            .fetch_sub(BATCH as i64, Ordering::Relaxed);
        self.reserved = before.clamp(0, BATCH as i64) as usize;
    }
}

impl TrapHandler for Recorder {
    fn on_trap(&mut self, trap: &mut Trap<'_>) -> Result<(), String> {
        let ts_ns = Trap::now_ns();
        let Some(i) = self.index.find(trap.rip) else {
            return Err(format!(
                "vCPU {} trapped at {:#x}, which is not a patched site (guest text changed under vmtrace?)",
                trap.cpu, trap.rip
            ));
        };
        trap.set_rip(self.index.addrs[i] + SITE_LEN as u64);
        let c = &self.shared.counts[self.cpu as usize][i];
        // Single writer: a plain load and store, no locked instruction.
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        if self.reserved == 0 {
            self.reserve();
            if self.reserved == 0 {
                self.shared.dropped.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
        }
        self.reserved -= 1;
        let parent = match self.tlb.read_u64(trap.mem, trap.cr3, trap.paging, trap.rsp) {
            Ok(p) => p,
            Err(_) => {
                self.shared
                    .parent_unreadable
                    .fetch_add(1, Ordering::Relaxed);
                0
            }
        };
        self.buf.push(Event {
            ts_ns,
            parent,
            func: self.index.funcs[i],
            cpu: self.cpu,
        });
        if self.buf.len() >= BATCH {
            self.flush();
        }
        Ok(())
    }

    fn flush(&mut self) {
        // The guest may change its page tables while we are parked.
        self.tlb.flush();
        if !self.buf.is_empty() {
            let batch = std::mem::replace(&mut self.buf, Vec::with_capacity(BATCH));
            // The collector only goes away after every recorder is dropped.
            let _ = self.tx.send(batch);
        }
    }
}

/// Build the recorders (one per vCPU) and the collector thread.
pub fn recorders(
    index: Arc<SiteIndex>,
    ncpus: usize,
    max_events: u64,
) -> (Arc<Shared>, Vec<Recorder>, JoinHandle<Vec<Event>>) {
    let nsites = index.addrs.len();
    let shared = Arc::new(Shared {
        counts: (0..ncpus)
            .map(|_| (0..nsites).map(|_| AtomicU64::new(0)).collect())
            .collect(),
        budget: AtomicI64::new(i64::try_from(max_events).unwrap_or(i64::MAX)),
        dropped: AtomicU64::new(0),
        parent_unreadable: AtomicU64::new(0),
    });
    let (tx, rx) = crossbeam_channel::unbounded();
    let recs = (0..ncpus)
        .map(|cpu| Recorder {
            cpu: cpu as u32,
            index: Arc::clone(&index),
            shared: Arc::clone(&shared),
            buf: Vec::with_capacity(BATCH),
            reserved: 0,
            tx: tx.clone(),
            tlb: TlbCache::new(),
        })
        .collect();
    let collector = std::thread::Builder::new()
        .name("collector".into())
        .spawn(move || collect(rx))
        .expect("spawn the collector thread");
    (shared, recs, collector)
}

/// The collector: append batches until every recorder is gone, then sort by time.
fn collect(rx: Receiver<Vec<Event>>) -> Vec<Event> {
    let mut events = Vec::new();
    for batch in rx {
        events.extend_from_slice(&batch);
    }
    events.sort_by_key(|e| (e.ts_ns, e.cpu));
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_accepts_rip_at_and_past_the_out() {
        let idx = SiteIndex::new(vec![(0x1000, 0), (0x2000, 1), (0x1000, 0)]);
        assert_eq!(idx.addrs, vec![0x1000, 0x2000]);
        assert_eq!(idx.find(0x1000), Some(0));
        assert_eq!(idx.find(0x1002), Some(0));
        assert_eq!(idx.find(0x2002), Some(1));
        assert_eq!(idx.find(0x1001), None);
        assert_eq!(idx.find(0x1005), None);
    }
}
