//! The recorders' counters and event budget, shared by the recorders (trap
//! mode), the exitless drainer, the store thread and the session.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use crate::trace::model::Event;

/// Events a vCPU buffers before handing them to the collector.
pub const BATCH: usize = 4096;

/// The recorders' counters and event budget, shared with the tracing session.
pub struct Counters {
    /// Calls per site, one array per vCPU (written only by that vCPU).
    pub counts: Vec<Box<[AtomicU64]>>,
    /// Returns per site (function graph), one array per vCPU: the vCPU the
    /// return ran on. Written only by that vCPU in trap mode; by the
    /// drainer in exitless mode.
    pub returns: Vec<Box<[AtomicU64]>>,
    /// Returns counted but not stored (over `--max-events`).
    pub returns_dropped: AtomicU64,
    /// Entries whose return could not be hooked (the slot was unreadable
    /// or unwritable).
    pub unhooked: AtomicU64,
    /// Events that may still be stored.
    budget: AtomicI64,
    pub dropped: AtomicU64,
    pub parent_unreadable: AtomicU64,
    /// Calls the task filter (`--pid`, `--comm`) rejected: in no count.
    pub filtered: AtomicU64,
    /// Events (entries and returns) per vCPU that could not be kept: the
    /// data file's writer fell behind, or the disk refused them. Also in
    /// `dropped` / `returns_dropped`.
    pub lost: Box<[AtomicU64]>,
    /// Events (entries and returns) over `--max-events`. Also in
    /// `dropped` / `returns_dropped`.
    pub over_budget: AtomicU64,
    /// Stored events overwritten by newer ones (`--overwrite`). Also in
    /// `dropped` / `returns_dropped`.
    pub overwritten: AtomicU64,
}

impl Counters {
    /// Zeroed counters for `ncpus` vCPUs and `nsites` sites, with a budget
    /// of `max_events` events to store.
    pub fn new(ncpus: usize, nsites: usize, max_events: u64) -> Self {
        Counters {
            counts: (0..ncpus)
                .map(|_| (0..nsites).map(|_| AtomicU64::new(0)).collect())
                .collect(),
            returns: (0..ncpus)
                .map(|_| (0..nsites).map(|_| AtomicU64::new(0)).collect())
                .collect(),
            returns_dropped: AtomicU64::new(0),
            unhooked: AtomicU64::new(0),
            budget: AtomicI64::new(i64::try_from(max_events).unwrap_or(i64::MAX)),
            dropped: AtomicU64::new(0),
            parent_unreadable: AtomicU64::new(0),
            filtered: AtomicU64::new(0),
            lost: (0..ncpus).map(|_| AtomicU64::new(0)).collect(),
            over_budget: AtomicU64::new(0),
            overwritten: AtomicU64::new(0),
        }
    }

    /// Counts stored events that were then not kept: entries as dropped,
    /// returns as returns dropped (the counts stay exact).
    pub fn drop_stored(&self, e: &Event) {
        let c = if e.is_return() {
            &self.returns_dropped
        } else {
            &self.dropped
        };
        c.fetch_add(1, Ordering::Relaxed);
        self.overwritten.fetch_add(1, Ordering::Relaxed);
    }

    /// An event (a return if `is_return`) counted, not stored: the
    /// `--max-events` budget is spent.
    pub fn over_budget(&self, is_return: bool) {
        let c = if is_return {
            &self.returns_dropped
        } else {
            &self.dropped
        };
        c.fetch_add(1, Ordering::Relaxed);
        self.over_budget.fetch_add(1, Ordering::Relaxed);
    }

    /// A batch that could not be kept (see `lost`): three atomic adds per
    /// vCPU in it, not one per event (recorders may be losing batches
    /// side by side).
    pub fn lose(&self, batch: &[Event]) {
        let mut cpu = None;
        let (mut entries, mut returns, mut n) = (0u64, 0u64, 0u64);
        let flush = |cpu: Option<u32>, entries: &mut u64, returns: &mut u64, n: &mut u64| {
            if let Some(l) = cpu.and_then(|c| self.lost.get(c as usize)) {
                l.fetch_add(*n, Ordering::Relaxed);
            }
            self.dropped.fetch_add(*entries, Ordering::Relaxed);
            self.returns_dropped.fetch_add(*returns, Ordering::Relaxed);
            (*entries, *returns, *n) = (0, 0, 0);
        };
        for e in batch {
            if cpu != Some(e.cpu) && n > 0 {
                flush(cpu, &mut entries, &mut returns, &mut n);
            }
            cpu = Some(e.cpu);
            n += 1;
            if e.is_return() {
                returns += 1;
            } else {
                entries += 1;
            }
        }
        if n > 0 {
            flush(cpu, &mut entries, &mut returns, &mut n);
        }
    }

    /// Take up to `want` events from the `--max-events` budget; returns how
    /// many may be stored.
    pub fn reserve(&self, want: usize) -> usize {
        let want = want.min(i64::MAX as usize) as i64;
        let before = self.budget.fetch_sub(want, Ordering::Relaxed);
        before.clamp(0, want) as usize
    }
}
