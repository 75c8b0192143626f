//! The host side of the rings: setting them up and draining them (the
//! reader of the protocol in the module comment of `exitless`). Pure over
//! guest memory: the collector thread calls `RingReader::drain` while the
//! guest runs, so every access to a word the guest may be writing is a
//! single aligned atomic access through vm-memory, never a plain read.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use vmm::GuestRam;

use vm_memory::GuestAddress;
use vmm::RamError;

use crate::plan::exitless::layout::{
    RingLayout, DATA_LEN, DROPS_OFF, FILTERED_OFF, HEAD_OFF, HIGH_RINGS_MAX, LIMIT_OFF, REC_ARGS,
    REC_COMMIT, REC_PARENT, REC_RET, REC_SLOT, REC_STRINGS, REC_TASK, REC_TSC,
};
use crate::plan::exitless::strcopy::STRINGS_LEN;
use crate::trace::model::ARG_REGS;

use super::held::HeldDrops;
pub use super::span::Record;
use super::span::{clear_records, MemFault, Span};

/// Why a ring cannot be set up or read.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    #[error("CPU {cpu} has no ring: the rings are for {cpus} CPUs")]
    NoRing { cpu: usize, cpus: usize },
    #[error(
        "{cpus} rings of {ring_bytes:#x} bytes do not fit vmtrace's {} MiB of ring memory",
        DATA_LEN >> 20
    )]
    TooBig { cpus: usize, ring_bytes: u64 },
    #[error("{what} of CPU {cpu}'s ring at guest-physical {gpa:#x}")]
    Memory {
        what: &'static str,
        cpu: usize,
        gpa: u64,
        #[source]
        source: RamError,
    },
}

/// Guest-physical address of a field at `off` in `cpu`'s ring.
fn field(layout: &RingLayout, cpu: usize, off: u64) -> u64 {
    layout.ring_gpa(cpu) + off
}

fn memory_error(what: &'static str, cpu: usize, gpa: u64) -> impl FnOnce(RamError) -> RingError {
    move |source| RingError::Memory {
        what,
        cpu,
        gpa,
        source,
    }
}

/// A bulk access's failure (`span`), as `cpu`'s ring's error.
fn fault(cpu: usize, (what, gpa, source): MemFault) -> RingError {
    RingError::Memory {
        what,
        cpu,
        gpa,
        source,
    }
}

fn check_cpu(layout: &RingLayout, cpu: usize) -> Result<(), RingError> {
    if cpu < layout.cpus {
        Ok(())
    } else {
        Err(RingError::NoRing {
            cpu,
            cpus: layout.cpus,
        })
    }
}

/// Sets up every ring of `layout` before any site calls the trampoline:
/// header, drop counters and records zeroed (head 0, every commit word 0:
/// nothing committed), and `limit` = `cap` records (the whole ring free).
pub fn init_rings(mem: &dyn GuestRam, layout: &RingLayout) -> Result<(), RingError> {
    let total = (layout.cpus as u64).checked_mul(layout.ring_bytes);
    let most = match layout.is_high() {
        true => HIGH_RINGS_MAX,
        false => DATA_LEN,
    };
    if total.is_none_or(|t| t > most) {
        return Err(RingError::TooBig {
            cpus: layout.cpus,
            ring_bytes: layout.ring_bytes,
        });
    }
    // Zero in chunks: a ring can be megabytes.
    const CHUNK: u64 = 64 << 10;
    let zeros = vec![0u8; CHUNK.min(layout.ring_bytes) as usize];
    // Rings past the data window are in a ring device's fresh file, all
    // zeros already: only its header words are written (and its pages
    // taken as the rings fill, not here).
    let zeroed = match layout.is_high() {
        true => layout.records_off,
        false => layout.ring_bytes,
    };
    for cpu in 0..layout.cpus {
        let base = layout.ring_gpa(cpu);
        let mut off = 0;
        while off < zeroed {
            let len = (zeroed - off).min(CHUNK) as usize;
            mem.write_slice(&zeros[..len], GuestAddress(base + off))
                .map_err(memory_error("zeroing", cpu, base + off))?;
            off += len as u64;
        }
        let limit = field(layout, cpu, LIMIT_OFF);
        mem.store(
            layout.cap * layout.record_len(),
            GuestAddress(limit),
            Ordering::Release,
        )
        .map_err(memory_error("setting the limit", cpu, limit))?;
    }
    Ok(())
}

/// The per-site drop counters of `cpu`'s ring: calls not recorded because
/// the ring was full, by site index.
pub fn drops(mem: &dyn GuestRam, layout: &RingLayout, cpu: usize) -> Result<Vec<u64>, RingError> {
    counters(mem, layout, cpu, DROPS_OFF)
}

/// The per-site counters of returns not recorded because `cpu`'s ring was
/// full (function graph; all 0 without it).
pub fn ret_drops(
    mem: &dyn GuestRam,
    layout: &RingLayout,
    cpu: usize,
) -> Result<Vec<u64>, RingError> {
    if !layout.graph {
        check_cpu(layout, cpu)?;
        return Ok(vec![0; layout.sites]);
    }
    counters(mem, layout, cpu, layout.ret_drops_off())
}

fn counters(
    mem: &dyn GuestRam,
    layout: &RingLayout,
    cpu: usize,
    off: u64,
) -> Result<Vec<u64>, RingError> {
    check_cpu(layout, cpu)?;
    (0..layout.sites as u64)
        .map(|k| {
            // One atomic load per counter: the guest may be incrementing it.
            let gpa = field(layout, cpu, off + k * 8);
            mem.load(GuestAddress(gpa), Ordering::Relaxed)
                .map_err(memory_error("reading a drop counter", cpu, gpa))
        })
        .collect()
}

/// Calls the pid filter rejected on `cpu` (its ring's counter).
pub fn filtered(mem: &dyn GuestRam, layout: &RingLayout, cpu: usize) -> Result<u64, RingError> {
    check_cpu(layout, cpu)?;
    let gpa = field(layout, cpu, FILTERED_OFF);
    mem.load(GuestAddress(gpa), Ordering::Relaxed)
        .map_err(memory_error("reading the filtered counter", cpu, gpa))
}

/// The `head` of `cpu`'s ring: how many records its calls have reserved
/// (the ring keeps it in bytes).
pub fn head(mem: &dyn GuestRam, layout: &RingLayout, cpu: usize) -> Result<u64, RingError> {
    check_cpu(layout, cpu)?;
    let gpa = field(layout, cpu, HEAD_OFF);
    let bytes: u64 = mem
        .load(GuestAddress(gpa), Ordering::Acquire)
        .map_err(memory_error("reading the head", cpu, gpa))?;
    Ok(bytes / layout.record_len())
}

/// How long a slot may stay reserved and not committed before the drain
/// reads past it (a writer preempted between the two, on a preemptible
/// kernel; an interrupt between them lasts microseconds).
pub const STALL: Duration = Duration::from_millis(10);

/// How long the drain stops at a reserved slot before the drops behind
/// it count as the drain's own (`held_drops`): an interrupt between the
/// writer's reservation and its commit lasts microseconds.
pub const HELD: Duration = Duration::from_millis(1);

/// Drains the rings of one attach, each record exactly once, in order
/// except for a record whose slot the drain read past while it was
/// reserved (`STALL`): that one comes when it commits. Made for rings that
/// `init_rings` set up (every tail at 0).
#[derive(Clone, Debug)]
pub struct RingReader {
    layout: RingLayout,
    /// Per CPU, the next index to read: every slot below it is read or in
    /// `skipped`.
    tails: Vec<u64>,
    /// Per CPU, the slots read past while reserved and not committed,
    /// oldest first: read when they commit; the limit stays below the
    /// oldest, so none is reused meanwhile.
    skipped: Vec<Vec<u64>>,
    /// Per CPU, the reserved slot the drain last stopped at, and since when.
    stalled: Vec<Option<(u64, Instant)>>,
    /// Per CPU, records consumed so far.
    consumed: Vec<u64>,
    /// Per CPU, slots reserved and never committed (`drain_final`).
    unfinished: Vec<u64>,
    stall: Duration,
    /// The bulk read's buffers, and zeros to clear with (kept between
    /// drains).
    span: Span,
    zeros: Vec<u8>,
    /// The ring-full drops while a ring's drain was held (`held`).
    held: HeldDrops,
}

/// A record's copied strings at `gpa` (`REC_STRINGS` in its slot), zeroed
/// for the next lap, whose body may copy none: its status words then say
/// so (0, not copied).
fn take_strings(mem: &dyn GuestRam, cpu: usize, gpa: u64) -> Result<[u8; STRINGS_LEN], RingError> {
    let mut b = [0u8; STRINGS_LEN];
    mem.read_slice(&mut b, GuestAddress(gpa))
        .map_err(memory_error("reading a record's strings", cpu, gpa))?;
    mem.write_slice(&[0u8; STRINGS_LEN], GuestAddress(gpa))
        .map_err(memory_error("clearing a record's strings", cpu, gpa))?;
    Ok(b)
}

impl RingReader {
    pub fn new(layout: RingLayout) -> RingReader {
        RingReader::with_stall(layout, STALL)
    }

    /// A reader that reads past a reserved slot after `stall` (`STALL` by
    /// default).
    pub fn with_stall(layout: RingLayout, stall: Duration) -> RingReader {
        RingReader {
            tails: vec![0; layout.cpus],
            skipped: vec![Vec::new(); layout.cpus],
            stalled: vec![None; layout.cpus],
            consumed: vec![0; layout.cpus],
            unfinished: vec![0; layout.cpus],
            layout,
            stall,
            span: Span::default(),
            zeros: Vec::new(),
            held: HeldDrops::new(layout.cpus),
        }
    }

    pub fn layout(&self) -> &RingLayout {
        &self.layout
    }

    /// Records consumed from `cpu`'s ring so far (0 for a CPU without one).
    pub fn consumed(&self, cpu: usize) -> u64 {
        self.consumed.get(cpu).copied().unwrap_or(0)
    }

    /// Records consumed from every ring so far.
    pub fn consumed_total(&self) -> u64 {
        self.consumed.iter().sum()
    }

    /// Slots of `cpu`'s ring that `drain_final` found reserved and never
    /// committed: calls whose writer stopped between the two.
    pub fn unfinished(&self, cpu: usize) -> u64 {
        self.unfinished.get(cpu).copied().unwrap_or(0)
    }

    /// Ring-full drops (calls and returns) counted while the drain was
    /// held at a reserved record, all CPUs: the stall rule's, not the
    /// drain's speed's.
    pub fn held_drops(&self) -> u64 {
        self.held.total()
    }

    /// Passes every committed record not read yet to `f(cpu, record)`,
    /// ring by ring in index order, and frees the slots read; returns how
    /// many. A record reserved but not committed yet (its writer was
    /// interrupted) stops its ring's drain, for `STALL` at most: then the
    /// drain reads past it, and reads it when it commits.
    pub fn drain(
        &mut self,
        mem: &dyn GuestRam,
        mut f: impl FnMut(usize, Record),
    ) -> Result<usize, RingError> {
        let mut total = 0;
        for cpu in 0..self.layout.cpus {
            total += self.drain_cpu(mem, cpu, &mut f)?;
        }
        Ok(total)
    }

    /// `drain` for the ring of one CPU.
    pub fn drain_cpu(
        &mut self,
        mem: &dyn GuestRam,
        cpu: usize,
        f: impl FnMut(usize, Record),
    ) -> Result<usize, RingError> {
        self.drain_ring(mem, cpu, false, f)
    }

    /// The last drain, once the guest has stopped: every committed record
    /// not read yet, past any slot reserved and not committed, which is
    /// counted instead (`unfinished`): its writer will never commit it.
    /// Calls per CPU = records + drops + unfinished, exactly.
    pub fn drain_final(
        &mut self,
        mem: &dyn GuestRam,
        mut f: impl FnMut(usize, Record),
    ) -> Result<usize, RingError> {
        let mut total = 0;
        for cpu in 0..self.layout.cpus {
            total += self.drain_ring(mem, cpu, true, &mut f)?;
        }
        Ok(total)
    }

    fn drain_ring(
        &mut self,
        mem: &dyn GuestRam,
        cpu: usize,
        last: bool,
        mut f: impl FnMut(usize, Record),
    ) -> Result<usize, RingError> {
        check_cpu(&self.layout, cpu)?;
        let before = self.consumed[cpu];
        let floor = self.floor(cpu);
        // Slots read past earlier: those that committed since.
        let mut skipped = std::mem::take(&mut self.skipped[cpu]);
        let mut kept = Vec::new();
        for index in skipped.drain(..) {
            if !self.read_slot(mem, cpu, index, &mut f)? {
                if last {
                    self.unfinished[cpu] += 1;
                } else {
                    kept.push(index);
                }
            }
        }
        self.skipped[cpu] = kept;
        // At most one ring's worth past the oldest slot not read: the guest
        // cannot reserve beyond the limit; this also bounds the loop
        // against a guest that scribbles on its rings. The head (Acquire:
        // every slot below it is reserved) bounds the span read in bulk.
        let head = head(mem, &self.layout, cpu)?;
        let end = head.min(floor + self.layout.cap);
        while self.tails[cpu] < end {
            if !self.drain_span(mem, cpu, end, last, &mut f)? {
                break;
            }
        }
        if self.floor(cpu) != floor {
            // Free the slots read. Release: every read above happens before
            // the guest can see the slots free and overwrite them. Written
            // only when it moves, to leave the cache line alone otherwise.
            let gpa = field(&self.layout, cpu, LIMIT_OFF);
            let limit = (self.floor(cpu) + self.layout.cap) * self.layout.record_len();
            mem.store(limit, GuestAddress(gpa), Ordering::Release)
                .map_err(memory_error("moving the limit", cpu, gpa))?;
        }
        // Held: stopped at a reserved slot for `HELD` already, or a slot
        // read past still keeps the limit back. (A writer between its
        // reservation and its commit for less is merely in progress: the
        // drops then are the ring's size's. The last drain holds nothing.)
        let stopped = matches!(self.stalled[cpu],
            Some((i, since)) if i == self.tails[cpu] && since.elapsed() >= HELD);
        let held = !last && (stopped || !self.skipped[cpu].is_empty());
        let layout = &self.layout;
        self.held.note(cpu, held, || {
            let calls: u64 = drops(mem, layout, cpu)?.iter().sum();
            let returns: u64 = ret_drops(mem, layout, cpu)?.iter().sum();
            Ok::<_, RingError>(calls + returns)
        })?;
        Ok((self.consumed[cpu] - before) as usize)
    }

    /// Reads the records from `cpu`'s tail towards `end` in one bulk read
    /// (`Span`), passes the committed ones to `f` in order, and clears
    /// them; a reserved slot not committed stops it (false), is read past
    /// once stalled, or (`last`) is counted unfinished. True while there
    /// may be more to read before `end`.
    fn drain_span(
        &mut self,
        mem: &dyn GuestRam,
        cpu: usize,
        end: u64,
        last: bool,
        f: &mut impl FnMut(usize, Record),
    ) -> Result<bool, RingError> {
        let from = self.tails[cpu];
        let mut span = std::mem::take(&mut self.span);
        span.read(mem, &self.layout, cpu, from, end)
            .map_err(|f| fault(cpu, f))?;
        // Runs of records read, cleared after (one write each).
        let mut runs: Vec<(u64, u64)> = Vec::new();
        let mut more = true;
        while self.tails[cpu] < span.end() {
            let index = self.tails[cpu];
            if let Some(r) = span.record(index, &self.layout) {
                f(cpu, r);
                self.consumed[cpu] += 1;
                match runs.last_mut() {
                    Some((start, n)) if *start + *n == index => *n += 1,
                    _ => runs.push((index, 1)),
                }
            } else if last {
                self.unfinished[cpu] += 1;
            } else if self.stalled_long(cpu, index) {
                self.skipped[cpu].push(index);
            } else {
                more = false;
                break;
            }
            self.tails[cpu] = index + 1;
        }
        self.span = span;
        for (start, n) in runs {
            clear_records(mem, &self.layout, cpu, start, n, &mut self.zeros)
                .map_err(|f| fault(cpu, f))?;
        }
        Ok(more)
    }

    /// The oldest slot of `cpu`'s ring not read yet: the limit is one ring
    /// past it.
    fn floor(&self, cpu: usize) -> u64 {
        self.skipped[cpu]
            .first()
            .map_or(self.tails[cpu], |&s| s.min(self.tails[cpu]))
    }

    /// Has the drain stopped at reserved slot `index` of `cpu`'s ring for
    /// `stall` or more? (The first time it stops there starts the clock.)
    fn stalled_long(&mut self, cpu: usize, index: u64) -> bool {
        let now = Instant::now();
        match self.stalled[cpu] {
            Some((i, since)) if i == index => now.duration_since(since) >= self.stall,
            _ => {
                self.stalled[cpu] = Some((index, now));
                self.stall.is_zero()
            }
        }
    }

    /// Read slot `index` of `cpu`'s ring if its record is committed: pass
    /// it to `f`, clear its commit word; whether it was.
    fn read_slot(
        &mut self,
        mem: &dyn GuestRam,
        cpu: usize,
        index: u64,
        f: &mut impl FnMut(usize, Record),
    ) -> Result<bool, RingError> {
        let layout = self.layout;
        let records = field(&layout, cpu, layout.records_off);
        let slot = records + (index & (layout.cap - 1)) * layout.record_len();
        let load = |off: u64, what| {
            let gpa = slot + off;
            move |order| {
                mem.load::<u64>(GuestAddress(gpa), order)
                    .map_err(memory_error(what, cpu, gpa))
            }
        };
        // The commit first, with Acquire: the fields read after it are
        // the ones the writer stored before it (x86 keeps stores in
        // order; Acquire keeps the compiler from hoisting the reads).
        let commit_gpa = slot + REC_COMMIT;
        // The commit word and the pid beside it (`REC_PID`), in one load.
        let word: u64 = mem
            .load(GuestAddress(commit_gpa), Ordering::Acquire)
            .map_err(memory_error("reading a record's commit", cpu, commit_gpa))?;
        let (commit, pid) = (word as u32, (word >> 32) as u32);
        if commit == 0 {
            // Reserved and not committed yet, or not reserved at all.
            // Never the previous lap's record: its commit word was
            // zeroed when it was read, before its slot was freed.
            return Ok(false);
        }
        let tsc = load(REC_TSC, "reading a record's TSC")(Ordering::Relaxed)?;
        let parent = load(REC_PARENT, "reading a record's parent")(Ordering::Relaxed)?;
        let stack_slot = load(REC_SLOT, "reading a record's slot")(Ordering::Relaxed)?;
        let task = load(REC_TASK, "reading a record's task")(Ordering::Relaxed)?;
        let is_return = stack_slot & crate::trace::model::RETURN_BIT != 0;
        let ret = if is_return {
            load(REC_RET, "reading a record's return value")(Ordering::Relaxed)?
        } else {
            0
        };
        let args = if layout.args && !is_return {
            let mut regs = [0u64; ARG_REGS];
            for (i, r) in regs.iter_mut().enumerate() {
                *r = load(REC_ARGS + 8 * i as u64, "reading a record's arguments")(
                    Ordering::Relaxed,
                )?;
            }
            Some(regs)
        } else {
            None
        };
        let strings = match layout.strings && !is_return {
            true => Some(take_strings(mem, cpu, slot + REC_STRINGS)?),
            false => None,
        };
        // Empty the slot for its next lap; the limit store (Release) makes
        // the guest see this before the slot is free.
        mem.store(0u32, GuestAddress(commit_gpa), Ordering::Relaxed)
            .map_err(memory_error("clearing a record's commit", cpu, commit_gpa))?;
        f(
            cpu,
            Record {
                tsc,
                parent,
                site: commit - 1,
                slot: stack_slot,
                task,
                pid,
                ret,
                args,
                strings,
            },
        );
        // Kept per record: if a later read fails, what `f` saw is not
        // passed again.
        self.consumed[cpu] += 1;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::exitless::layout::{DATA_GPA, RECORD_LEN, REGION_GPA, REGION_LEN};
    use vm_memory::{Bytes, GuestMemoryMmap};

    fn memory() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), 1 << 20),
            (GuestAddress(REGION_GPA), REGION_LEN as usize),
        ])
        .unwrap()
    }

    fn load(mem: &GuestMemoryMmap, gpa: u64) -> u64 {
        mem.load(GuestAddress(gpa), Ordering::SeqCst).unwrap()
    }

    /// The trampoline's protocol in Rust, one step at a time: reserve (or
    /// count a drop), then commit.
    struct Writer<'a> {
        mem: &'a GuestMemoryMmap,
        layout: RingLayout,
    }

    impl Writer<'_> {
        fn at(&self, cpu: usize, off: u64) -> GuestAddress {
            GuestAddress(field(&self.layout, cpu, off))
        }
        fn get(&self, cpu: usize, off: u64) -> u64 {
            self.mem.load(self.at(cpu, off), Ordering::Acquire).unwrap()
        }
        fn put(&self, cpu: usize, off: u64, v: u64) {
            self.mem
                .store(v, self.at(cpu, off), Ordering::Release)
                .unwrap();
        }
        /// The index reserved, or `None` when the ring was full (a drop).
        fn reserve(&self, cpu: usize, site: u32) -> Option<u64> {
            let head = self.get(cpu, HEAD_OFF);
            if head >= self.get(cpu, LIMIT_OFF) {
                let drop = DROPS_OFF + u64::from(site) * 8;
                self.put(cpu, drop, self.get(cpu, drop) + 1);
                return None;
            }
            self.put(cpu, HEAD_OFF, head + RECORD_LEN);
            Some(head / RECORD_LEN)
        }
        fn commit(&self, cpu: usize, index: u64, rec: Record) {
            let slot = self.layout.records_off + (index & (self.layout.cap - 1)) * RECORD_LEN;
            self.put(cpu, slot + REC_TSC, rec.tsc);
            self.put(cpu, slot + REC_PARENT, rec.parent);
            self.put(cpu, slot + REC_SLOT, rec.slot);
            self.mem
                .store(
                    rec.site + 1,
                    self.at(cpu, slot + REC_COMMIT),
                    Ordering::Release,
                )
                .unwrap();
        }
        /// One traced call: whether it was recorded.
        fn call(&self, cpu: usize, rec: Record) -> bool {
            match self.reserve(cpu, rec.site) {
                Some(index) => {
                    self.commit(cpu, index, rec);
                    true
                }
                None => false,
            }
        }
    }

    fn rec(n: u64, site: u32) -> Record {
        Record {
            tsc: 1000 + n,
            parent: 0xffff_ffff_8100_0000 + n,
            site,
            slot: 0,
            task: 0,
            pid: 0,
            ret: 0,
            args: None,
            strings: None,
        }
    }

    fn drain(reader: &mut RingReader, mem: &GuestMemoryMmap) -> Vec<(usize, Record)> {
        let mut out = Vec::new();
        let n = reader.drain(mem, |cpu, r| out.push((cpu, r))).unwrap();
        assert_eq!(n, out.len());
        out
    }

    #[test]
    fn init_sets_up_empty_rings_over_old_contents() {
        let mem = memory();
        let layout = RingLayout::new(3, 5, Some(8), false).unwrap();
        // Leftovers of an earlier attach.
        mem.write_slice(
            &vec![0xa5; (3 * layout.ring_bytes) as usize],
            GuestAddress(DATA_GPA),
        )
        .unwrap();
        init_rings(&mem, &layout).unwrap();
        for cpu in 0..3 {
            assert_eq!(head(&mem, &layout, cpu).unwrap(), 0);
            assert_eq!(load(&mem, field(&layout, cpu, LIMIT_OFF)), 8 * RECORD_LEN);
            assert_eq!(drops(&mem, &layout, cpu).unwrap(), [0; 5]);
            let mut ring = vec![1u8; layout.ring_bytes as usize];
            mem.read_slice(&mut ring, GuestAddress(layout.ring_gpa(cpu)))
                .unwrap();
            // The limit's only non-zero byte (8 records of 64 bytes: 0x200).
            assert_eq!(8 * RECORD_LEN, 0x200);
            assert_eq!(ring[LIMIT_OFF as usize + 1], 2);
            ring[LIMIT_OFF as usize + 1] = 0;
            assert!(
                ring.iter().all(|&b| b == 0),
                "CPU {cpu}'s ring is not zeroed"
            );
        }
        let mut reader = RingReader::new(layout);
        assert!(drain(&mut reader, &mem).is_empty());
    }

    #[test]
    fn committed_records_drain_in_order_per_cpu() {
        let mem = memory();
        let layout = RingLayout::new(2, 4, Some(16), false).unwrap();
        init_rings(&mem, &layout).unwrap();
        let w = Writer { mem: &mem, layout };
        for n in 0..5 {
            assert!(w.call(1, rec(n, n as u32 % 4)));
        }
        assert!(w.call(0, rec(99, 3)));
        let mut reader = RingReader::new(layout);
        let got = drain(&mut reader, &mem);
        let mut want = vec![(0, rec(99, 3))];
        want.extend((0..5).map(|n| (1, rec(n, n as u32 % 4))));
        assert_eq!(got, want);
        assert_eq!(
            (
                reader.consumed(0),
                reader.consumed(1),
                reader.consumed_total()
            ),
            (1, 5, 6)
        );
        // The slots read are free again, their commit words cleared for the
        // next lap.
        for (cpu, n) in [(0, 1), (1, 5)] {
            for index in 0..n {
                let commit = layout.records_off + index * RECORD_LEN + REC_COMMIT;
                let word: u32 = mem
                    .load(GuestAddress(field(&layout, cpu, commit)), Ordering::SeqCst)
                    .unwrap();
                assert_eq!(word, 0, "CPU {cpu} record {index}");
            }
        }
        assert_eq!(
            load(&mem, field(&layout, 0, LIMIT_OFF)),
            (1 + 16) * RECORD_LEN
        );
        assert_eq!(
            load(&mem, field(&layout, 1, LIMIT_OFF)),
            (5 + 16) * RECORD_LEN
        );
        assert!(drain(&mut reader, &mem).is_empty());
    }

    #[test]
    fn an_uncommitted_record_stops_the_drain_until_it_commits() {
        let mem = memory();
        let layout = RingLayout::new(1, 2, Some(8), false).unwrap();
        init_rings(&mem, &layout).unwrap();
        let w = Writer { mem: &mem, layout };
        // Index 1's writer is interrupted after reserving; 2 and 3 (the
        // interrupt's own calls) commit before it.
        assert!(w.call(0, rec(0, 0)));
        let held = w.reserve(0, 1).unwrap();
        assert!(w.call(0, rec(2, 0)));
        assert!(w.call(0, rec(3, 1)));
        let mut reader = RingReader::new(layout);
        assert_eq!(drain(&mut reader, &mem), [(0, rec(0, 0))]);
        assert_eq!(
            load(&mem, field(&layout, 0, LIMIT_OFF)),
            (1 + 8) * RECORD_LEN
        );
        assert!(
            drain(&mut reader, &mem).is_empty(),
            "read past an uncommitted record"
        );
        w.commit(0, held, rec(1, 1));
        assert_eq!(
            drain(&mut reader, &mem),
            [(0, rec(1, 1)), (0, rec(2, 0)), (0, rec(3, 1))]
        );
        assert_eq!(
            load(&mem, field(&layout, 0, LIMIT_OFF)),
            (4 + 8) * RECORD_LEN
        );
    }

    /// The guest stopped while a slot was reserved (its writer between the
    /// reservation and the commit, for good): the last drain reads the
    /// records committed behind it and counts it, so records + drops +
    /// unfinished = calls. (It used to stop there: the records behind were
    /// lost, and the counts at stop short of the calls.)
    #[test]
    fn the_last_drain_reads_past_a_slot_never_committed() {
        let mem = memory();
        let layout = RingLayout::new(1, 2, Some(8), false).unwrap();
        init_rings(&mem, &layout).unwrap();
        let w = Writer { mem: &mem, layout };
        // Index 1 reserved, never committed; 2 and 3 committed behind it.
        assert!(w.call(0, rec(0, 0)));
        w.reserve(0, 1).unwrap();
        assert!(w.call(0, rec(2, 0)));
        assert!(w.call(0, rec(3, 1)));
        let mut reader = RingReader::with_stall(layout, Duration::MAX);
        assert_eq!(drain(&mut reader, &mem), [(0, rec(0, 0))]);
        assert!(drain(&mut reader, &mem).is_empty(), "read past too soon");
        let mut last = Vec::new();
        let n = reader
            .drain_final(&mem, |cpu, r| last.push((cpu, r)))
            .unwrap();
        assert_eq!(last, [(0, rec(2, 0)), (0, rec(3, 1))]);
        assert_eq!((n, reader.unfinished(0), reader.consumed(0)), (2, 1, 3));
        assert_eq!(drops(&mem, &layout, 0).unwrap(), [0, 0]);
        // 3 records + 0 drops + 1 unfinished = the 4 calls.
        assert_eq!(
            reader.consumed(0) + reader.unfinished(0),
            head(&mem, &layout, 0).unwrap()
        );
        // Every slot accounted for: a second last drain finds nothing more.
        assert_eq!(reader.drain_final(&mem, |_, _| {}).unwrap(), 0);
        assert_eq!(reader.unfinished(0), 1);
    }

    /// A writer preempted between reserving and committing (a preemptible
    /// kernel) no longer stalls its ring's drain past `stall`: the records
    /// behind its slot are read, the slot is read when it commits, and the
    /// limit never passes it, so no call reuses it meanwhile (the ring
    /// fills one lap past it, and further calls are counted as drops).
    #[test]
    fn a_slot_stalled_past_the_bound_is_read_past_then_read_when_it_commits() {
        let mem = memory();
        let layout = RingLayout::new(1, 2, Some(4), false).unwrap();
        init_rings(&mem, &layout).unwrap();
        let w = Writer { mem: &mem, layout };
        let limit = || load(&mem, field(&layout, 0, LIMIT_OFF)) / RECORD_LEN;
        assert!(w.call(0, rec(0, 0)));
        let held = w.reserve(0, 1).unwrap();
        assert!(w.call(0, rec(2, 0)));
        let mut reader = RingReader::with_stall(layout, Duration::ZERO);
        assert_eq!(drain(&mut reader, &mem), [(0, rec(0, 0)), (0, rec(2, 0))]);
        // One ring past the held slot (index 1), not past the tail (3).
        assert_eq!(limit(), 1 + 4);
        assert!(w.call(0, rec(3, 1)));
        assert!(w.call(0, rec(4, 1)));
        // Index 5 would reuse the held slot: a drop.
        assert!(!w.call(0, rec(5, 1)));
        assert_eq!(drops(&mem, &layout, 0).unwrap(), [0, 1]);
        assert_eq!(drain(&mut reader, &mem), [(0, rec(3, 1)), (0, rec(4, 1))]);
        assert_eq!(limit(), 1 + 4);
        // The preempted writer runs again and commits: its record comes
        // now, and the ring is free again up to a lap past the tail.
        w.commit(0, held, rec(1, 1));
        assert_eq!(drain(&mut reader, &mem), [(0, rec(1, 1))]);
        assert_eq!(limit(), 5 + 4);
        assert!(w.call(0, rec(6, 0)));
        assert_eq!(drain(&mut reader, &mem), [(0, rec(6, 0))]);
        // Every call: 6 records, 1 drop; nothing unfinished at the end.
        assert_eq!(reader.drain_final(&mem, |_, _| {}).unwrap(), 0);
        assert_eq!((reader.consumed(0), reader.unfinished(0)), (6, 0));
    }

    /// A slot read past and never committed before the guest stopped is
    /// counted by the last drain, once.
    #[test]
    fn a_slot_read_past_and_never_committed_is_unfinished() {
        let mem = memory();
        let layout = RingLayout::new(2, 1, Some(8), false).unwrap();
        init_rings(&mem, &layout).unwrap();
        let w = Writer { mem: &mem, layout };
        w.reserve(1, 0).unwrap();
        assert!(w.call(1, rec(1, 0)));
        assert!(w.call(0, rec(2, 0)));
        let mut reader = RingReader::with_stall(layout, Duration::ZERO);
        assert_eq!(drain(&mut reader, &mem), [(0, rec(2, 0)), (1, rec(1, 0))]);
        assert_eq!(reader.drain_final(&mem, |_, _| {}).unwrap(), 0);
        assert_eq!((reader.unfinished(0), reader.unfinished(1)), (0, 1));
        assert_eq!(reader.consumed_total(), 2);
    }

    #[test]
    fn wraps_around_over_several_laps() {
        let mem = memory();
        let layout = RingLayout::new(1, 1, Some(4), false).unwrap();
        init_rings(&mem, &layout).unwrap();
        let w = Writer { mem: &mem, layout };
        let mut reader = RingReader::new(layout);
        let mut n = 0;
        // Batches of 3 then 4 records: the slots are reused at offsets that
        // move every lap, and a full batch fills the ring exactly.
        for lap in 0..6 {
            let batch = 3 + lap % 2;
            let first = n;
            for _ in 0..batch {
                assert!(w.call(0, rec(n, 0)), "call {n} dropped");
                n += 1;
            }
            if batch == 4 {
                // Full now: the next call is a drop, not an overwrite.
                assert!(!w.call(0, rec(1000, 0)));
            }
            let got = drain(&mut reader, &mem);
            let want: Vec<_> = (first..n).map(|i| (0, rec(i, 0))).collect();
            assert_eq!(got, want, "lap {lap}");
            assert_eq!(
                load(&mem, field(&layout, 0, LIMIT_OFF)),
                (n + 4) * RECORD_LEN
            );
        }
        assert_eq!(head(&mem, &layout, 0).unwrap(), n);
        assert_eq!(drops(&mem, &layout, 0).unwrap(), [3]);
    }

    #[test]
    fn drops_read_back_per_cpu_and_site() {
        let mem = memory();
        let layout = RingLayout::new(2, 3, Some(2), false).unwrap();
        init_rings(&mem, &layout).unwrap();
        let w = Writer { mem: &mem, layout };
        for (cpu, site, times) in [(0, 2, 5u64), (1, 0, 3), (1, 1, 1)] {
            for i in 0..times + 2 {
                w.call(cpu, rec(i, site));
            }
        }
        // Each CPU's first two calls were recorded.
        assert_eq!(drops(&mem, &layout, 0).unwrap(), [0, 0, 5]);
        assert_eq!(drops(&mem, &layout, 1).unwrap(), [3, 3, 0]);
        assert!(matches!(
            drops(&mem, &layout, 2),
            Err(RingError::NoRing { cpu: 2, cpus: 2 })
        ));
    }

    /// A host that falls behind: calls keep coming on both CPUs while the
    /// host drains only now and then; the guest counts what it cannot
    /// record, and records + drops = calls exactly, per CPU and site.
    #[test]
    fn a_host_that_falls_behind_loses_no_count() {
        let mem = memory();
        let layout = RingLayout::new(2, 5, Some(16), false).unwrap();
        init_rings(&mem, &layout).unwrap();
        let w = Writer { mem: &mem, layout };
        let mut reader = RingReader::new(layout);
        let mut calls = [[0u64; 5]; 2];
        let mut records = [[0u64; 5]; 2];
        let mut last_tsc = [0u64; 2];
        let mut seen = |cpu: usize, r: Record| {
            records[cpu][r.site as usize] += 1;
            // In order: the writer's TSCs grow with each recorded call.
            assert!(r.tsc > last_tsc[cpu]);
            last_tsc[cpu] = r.tsc;
        };
        // A fixed pseudo-random schedule (xorshift), bursts longer than a
        // ring between drains.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut rand = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut dropped_some = false;
        for n in 1..=5000u64 {
            let r = rand();
            let cpu = (r & 1) as usize;
            let site = ((r >> 8) % 5) as u32;
            calls[cpu][site as usize] += 1;
            dropped_some |= !w.call(cpu, rec(n, site));
            if r >> 60 == 0 {
                reader.drain(&mem, &mut seen).unwrap();
            }
        }
        reader.drain(&mem, &mut seen).unwrap();
        assert!(dropped_some, "the schedule never filled a ring");
        for cpu in 0..2 {
            let d = drops(&mem, &layout, cpu).unwrap();
            for site in 0..5 {
                assert_eq!(
                    records[cpu][site] + d[site],
                    calls[cpu][site],
                    "CPU {cpu} site {site}"
                );
            }
        }
        assert_eq!(
            reader.consumed_total(),
            records.iter().flatten().sum::<u64>()
        );
    }

    #[test]
    fn memory_errors_say_what_and_where() {
        // Guest RAM only: no vmtrace region.
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let layout = RingLayout::new(2, 1, Some(2), false).unwrap();
        let err = init_rings(&mem, &layout).unwrap_err();
        assert!(matches!(err, RingError::Memory { cpu: 0, .. }), "{err}");
        assert_eq!(
            err.to_string(),
            format!("zeroing of CPU 0's ring at guest-physical {DATA_GPA:#x}")
        );
        let mut reader = RingReader::new(layout);
        let err = reader.drain(&mem, |_, _| {}).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("reading the head of CPU 0's ring"),
            "{err}"
        );
        let too_big = RingLayout {
            cpus: 2,
            ring_bytes: DATA_LEN,
            ..layout
        };
        assert!(matches!(
            init_rings(&memory(), &too_big),
            Err(RingError::TooBig { .. })
        ));
    }

    /// Guest memory that counts the calls made into it, and whose first
    /// bulk read of records, when `torn`, copies the fields of the records
    /// it finds committed as zero: a copy that read them before the
    /// writer stored them, and the commit after.
    struct Counted<'a> {
        mem: &'a GuestMemoryMmap,
        calls: std::sync::atomic::AtomicUsize,
        torn: std::sync::atomic::AtomicBool,
    }

    impl GuestRam for Counted<'_> {
        fn read_bytes(&self, buf: &mut [u8], addr: GuestAddress) -> Result<(), RamError> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            GuestRam::read_bytes(self.mem, buf, addr)?;
            if self.torn.swap(false, Ordering::Relaxed) {
                for r in buf.chunks_mut(RECORD_LEN as usize) {
                    r[REC_TSC as usize..].fill(0);
                }
            }
            Ok(())
        }
        fn write_bytes(&self, data: &[u8], addr: GuestAddress) -> Result<(), RamError> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            GuestRam::write_bytes(self.mem, data, addr)
        }
        fn load_u32(&self, addr: GuestAddress, order: Ordering) -> Result<u32, RamError> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            self.mem.load_u32(addr, order)
        }
        fn load_u64(&self, addr: GuestAddress, order: Ordering) -> Result<u64, RamError> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            self.mem.load_u64(addr, order)
        }
        fn store_u32(&self, v: u32, addr: GuestAddress, order: Ordering) -> Result<(), RamError> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            self.mem.store_u32(v, addr, order)
        }
        fn store_u64(&self, v: u64, addr: GuestAddress, order: Ordering) -> Result<(), RamError> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            self.mem.store_u64(v, addr, order)
        }
        fn contains(&self, addr: GuestAddress, len: usize) -> bool {
            self.mem.contains(addr, len)
        }
    }

    fn counted(mem: &GuestMemoryMmap) -> Counted<'_> {
        Counted {
            mem,
            calls: Default::default(),
            torn: Default::default(),
        }
    }

    #[test]
    fn a_drain_reads_a_ring_in_a_few_accesses_however_many_records() {
        let mem = memory();
        let layout = RingLayout::new(1, 1, Some(4096), false).unwrap();
        init_rings(&mem, &layout).unwrap();
        let w = Writer { mem: &mem, layout };
        let mut reader = RingReader::new(layout);
        // Twice round the ring, the second lap's span wrapping.
        for lap in 0..2u64 {
            let n = if lap == 0 { 3000 } else { 4000 };
            for k in 0..n {
                assert!(w.call(0, rec(lap * 10_000 + k, 0)));
            }
            let c = counted(&mem);
            let mut got = Vec::new();
            reader.drain(&c, |_, r| got.push(r)).unwrap();
            let want: Vec<_> = (0..n).map(|k| rec(lap * 10_000 + k, 0)).collect();
            assert_eq!(got, want, "lap {lap}");
            // The head; two reads of the span and one write clearing it,
            // each in two pieces where it wraps; the limit.
            let calls = c.calls.load(Ordering::Relaxed);
            assert!(calls <= 8, "lap {lap}: {calls} accesses for {n} records");
        }
        assert_eq!(reader.consumed(0), 7000);
    }

    #[test]
    fn a_record_seen_committed_takes_its_fields_from_a_later_read() {
        let mem = memory();
        let layout = RingLayout::new(1, 2, Some(16), false).unwrap();
        init_rings(&mem, &layout).unwrap();
        let w = Writer { mem: &mem, layout };
        for n in 0..3 {
            assert!(w.call(0, rec(n, 1)));
        }
        let c = counted(&mem);
        c.torn.store(true, Ordering::Relaxed);
        let mut reader = RingReader::new(layout);
        let mut got = Vec::new();
        reader.drain(&c, |_, r| got.push(r)).unwrap();
        assert_eq!(got, (0..3).map(|n| rec(n, 1)).collect::<Vec<_>>());
    }
}
