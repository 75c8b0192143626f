//! qemu/drain's stand-in for the guest's trampoline: a host thread that
//! appends records to one ring as the trampoline does
//! (`tracer::session::exitless` has the protocol), at memory speed, so
//! the drain is what sets the pace.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tracer::plan::exitless::layout::{
    RingLayout, HEAD_OFF, LIMIT_OFF, REC_COMMIT, REC_PARENT, REC_SLOT, REC_TASK, REC_TSC,
};
use vm_memory::{
    GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, MemoryRegionAddress,
};

/// How long a producer sleeps when its ring is full (the trampoline
/// would count a drop instead; the bench waits, so the figure is the
/// drain's sustained rate and every record is kept).
const FULL_WAIT: Duration = Duration::from_micros(20);
/// Guest TSC ticks between two records (the stamps only need to ascend).
const TSC_STEP: u64 = 100;

/// One ring's words and records, in the host's mapping of its memory.
pub struct RingPtrs<'a> {
    head: &'a AtomicU64,
    limit: &'a AtomicU64,
    /// The first record.
    records: *mut u8,
    cap: u64,
    record_len: u64,
}

// SAFETY: the pointers are into a mapping (`GuestMemoryMmap`) that the
// caller keeps alive for `'a` (the lifetime ties them to it), and every
// access through them is atomic.
unsafe impl Send for RingPtrs<'_> {}
// SAFETY: as for `Send`: shared use is atomic accesses only.
unsafe impl Sync for RingPtrs<'_> {}

impl<'a> RingPtrs<'a> {
    /// `cpu`'s ring of `layout` in `mem`, which holds the whole ring.
    pub fn new(
        mem: &'a GuestMemoryMmap,
        layout: &RingLayout,
        cpu: usize,
    ) -> Result<RingPtrs<'a>, String> {
        let base = layout.ring_gpa(cpu);
        let len = layout.ring_bytes as usize;
        let gpa = GuestAddress(base);
        let missing = || format!("ring {cpu} ({len} bytes at {base:#x}) is not in one region");
        let region = mem.find_region(gpa).ok_or_else(missing)?;
        let off = base - region.start_addr().0;
        if off + len as u64 > region.len() {
            return Err(missing());
        }
        let host = region
            .get_host_address(MemoryRegionAddress(off))
            .map_err(|e| format!("ring {cpu} at {base:#x}: {e}"))?;
        // SAFETY: `host` maps `len` bytes of `mem` (in one region: above),
        // which outlives 'a; the head and limit words are 8-byte aligned
        // (a ring starts on a page) and within the ring's header.
        let word = |off: u64| unsafe { AtomicU64::from_ptr(host.add(off as usize).cast()) };
        Ok(RingPtrs {
            head: word(HEAD_OFF),
            limit: word(LIMIT_OFF),
            // SAFETY: `records_off` is within the ring (its records follow).
            records: unsafe { host.add(layout.records_off as usize) },
            cap: layout.cap,
            record_len: layout.record_len(),
        })
    }

    /// The u64 at `off` of the record in `slot`.
    fn word(&self, slot: u64, off: u64) -> &AtomicU64 {
        let at = (slot & (self.cap - 1)) * self.record_len + off;
        // SAFETY: the slot is masked into the ring's `cap` records and
        // `off` is a field of a record; records and fields are 8-byte
        // aligned; the mapping outlives `self`.
        unsafe { AtomicU64::from_ptr(self.records.add(at as usize).cast()) }
    }

    fn commit(&self, slot: u64) -> &AtomicU32 {
        let at = (slot & (self.cap - 1)) * self.record_len + REC_COMMIT;
        // SAFETY: as `word`; the commit is the record's first u32.
        unsafe { AtomicU32::from_ptr(self.records.add(at as usize).cast()) }
    }
}

/// What one producer did.
#[derive(Clone, Copy, Debug, Default)]
pub struct Produced {
    pub records: u64,
    /// Times it found its ring full and waited.
    pub full_waits: u64,
}

/// Append `n` records to `ring`, cycling through `template` (site index,
/// caller), as the trampoline does: reserve (the head; one writer per
/// ring, so a store), write the fields, commit last (Release). A full ring
/// (the head at the limit) is waited out.
pub fn produce(ring: &RingPtrs<'_>, template: &[(u32, u64)], n: u64) -> Produced {
    let mut out = Produced::default();
    if template.is_empty() {
        return out;
    }
    for i in 0..n {
        let (site, parent) = template[(i % template.len() as u64) as usize];
        let head = ring.head.load(Ordering::Relaxed);
        if head >= ring.limit.load(Ordering::Acquire) {
            out.full_waits += 1;
            while head >= ring.limit.load(Ordering::Acquire) {
                std::thread::sleep(FULL_WAIT);
            }
        }
        ring.head.store(head + ring.record_len, Ordering::Relaxed);
        let slot = head / ring.record_len;
        ring.word(slot, REC_TSC)
            .store(i * TSC_STEP, Ordering::Relaxed);
        ring.word(slot, REC_PARENT).store(parent, Ordering::Relaxed);
        ring.word(slot, REC_SLOT).store(0, Ordering::Relaxed);
        ring.word(slot, REC_TASK).store(0, Ordering::Relaxed);
        // The site index + 1 commits the record (the pid beside it stays 0).
        ring.commit(slot).store(site + 1, Ordering::Release);
        out.records += 1;
    }
    out
}
