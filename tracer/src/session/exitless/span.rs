//! A ring's records read in bulk: the span from the drain's tail to the
//! head, a few system calls for thousands of records where guest memory is
//! another process's (`/proc/PID/mem`: one `pread` per contiguous piece),
//! instead of one per word.
//!
//! A bulk copy is no atomic read of each record: it may copy a record's
//! fields before the writer stored them and its commit word after. So the
//! span is read twice. The first read says which records are committed;
//! the second, which starts after the first has ended, reads their fields:
//! the writer stores a record's fields before its commit (x86 keeps stores
//! in order), and never again until the drain frees the slot. A record
//! committed only in the second read waits for the next drain.
//!
//! Where the memory is mapped here and read a word at a time in address
//! order (`GuestRam::reads_in_order`: the own VMM's memory, a ring
//! device's), one read is enough: a record's commit is its first word, so
//! its fields are loaded after it, and x86 does not let a load pass an
//! older one. The second read cost a fifth of the drain there.

use std::sync::atomic::{fence, Ordering};

use vm_memory::GuestAddress;
use vmm::GuestRam;

use crate::plan::exitless::layout::{
    RingLayout, REC_ARGS, REC_COMMIT, REC_PARENT, REC_PID, REC_RET, REC_SLOT, REC_STRINGS,
    REC_TASK, REC_TSC,
};
use crate::plan::exitless::strcopy::STRINGS_LEN;
use crate::trace::model::{ARG_REGS, RETURN_BIT};

use vmm::RamError;

/// A bulk access that failed: what it was, where (guest-physical), why.
pub type MemFault = (&'static str, u64, RamError);

/// One traced call, as the trampoline recorded it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    /// The guest's TSC at the call.
    pub tsc: u64,
    /// The traced function's return address (its caller).
    pub parent: u64,
    /// The site's index in the `SiteIndex`.
    pub site: u32,
    /// Function graph: the return address's stack slot, bit 0 set for a
    /// return; 0 for an unhooked entry (and always without the graph).
    pub slot: u64,
    /// The current task's `task_struct` address and pid at the call; 0
    /// and 0 when tasks are not recorded.
    pub task: u64,
    pub pid: u32,
    /// A return's RAX (function graph with `--retval`; else 0).
    pub ret: u64,
    /// An entry's argument registers (records with arguments; else None).
    pub args: Option<[u64; ARG_REGS]>,
    /// An entry's copied strings (records with strings, `strcopy`; else
    /// None).
    pub strings: Option<[u8; STRINGS_LEN]>,
}

/// Records one bulk read takes at most where it is a few system calls
/// (`/proc/PID/mem`): 512 KiB with arguments.
pub const SPAN_RECORDS: u64 = 4096;
/// Records one read takes at most where the memory is mapped here and
/// read in order (`reads_in_order`): 32 KiB (64 KiB with arguments),
/// decoded while the copy is still in the CPU's nearest cache. With
/// spans of 4,096 records read twice, the drain waited on memory in
/// `Span::record` (`perf annotate`).
pub const SPAN_RECORDS_MAPPED: u64 = 512;

/// The buffers of one ring's span, kept between drains.
#[derive(Clone, Debug, Default)]
pub struct Span {
    /// Index of the first record read.
    first: u64,
    /// Records read.
    len: u64,
    /// Bytes per record.
    rec: usize,
    /// The first read: whose commit is set.
    seen: Vec<u8>,
    /// The second read: the fields of the records committed in `seen`.
    data: Vec<u8>,
    /// The first read was in order: the fields are read from `seen`.
    ordered: bool,
}

impl Span {
    /// Reads records `[from, to)` of `cpu`'s ring (at most `SPAN_RECORDS`,
    /// or `SPAN_RECORDS_MAPPED`; `to - from` at most the ring's `cap`):
    /// twice, or once, as the module says.
    pub fn read(
        &mut self,
        mem: &dyn GuestRam,
        layout: &RingLayout,
        cpu: usize,
        from: u64,
        to: u64,
    ) -> Result<(), MemFault> {
        let records = layout.ring_gpa(cpu) + layout.records_off;
        let ring_len = (layout.cap * layout.record_len()) as usize;
        self.ordered = mem.reads_in_order(GuestAddress(records), ring_len);
        let most = match self.ordered {
            true => SPAN_RECORDS_MAPPED,
            false => SPAN_RECORDS,
        };
        let to = to.min(from + most);
        self.first = from;
        self.len = to.saturating_sub(from);
        self.rec = layout.record_len() as usize;
        let bytes = self.len as usize * self.rec;
        self.seen.resize(bytes, 0);
        read_records(mem, layout, cpu, from, &mut self.seen)?;
        if self.ordered {
            return Ok(());
        }
        self.data.resize(bytes, 0);
        // The records the first read found committed, up to the last one:
        // only those are read again.
        let Some(last) = (0..self.len).rev().find(|&i| self.commit_seen(i) != 0) else {
            return Ok(());
        };
        // Every load of the second read after every load of the first.
        fence(Ordering::Acquire);
        let end = (last as usize + 1) * self.rec;
        read_records(mem, layout, cpu, from, &mut self.data[..end])
    }

    /// Records read (`read`'s span, as shortened).
    pub fn end(&self) -> u64 {
        self.first + self.len
    }

    fn commit_seen(&self, i: u64) -> u32 {
        word32(&self.seen, i as usize * self.rec + REC_COMMIT as usize)
    }

    /// Record `index` if the first read found it committed, its fields
    /// from the second (its arguments and strings as `layout` has them).
    pub fn record(&self, index: u64, layout: &RingLayout) -> Option<Record> {
        let i = index.checked_sub(self.first).filter(|&i| i < self.len)?;
        if self.commit_seen(i) == 0 {
            return None;
        }
        let at = i as usize * self.rec;
        let read = match self.ordered {
            true => &self.seen,
            false => &self.data,
        };
        let d = &read[at..at + self.rec];
        let word = |off: u64| word64(d, off as usize);
        let slot = word(REC_SLOT);
        let is_return = slot & RETURN_BIT != 0;
        Some(Record {
            tsc: word(REC_TSC),
            parent: word(REC_PARENT),
            // The commit is the site's index plus one (0: not committed).
            site: word32(d, REC_COMMIT as usize).wrapping_sub(1),
            slot,
            task: word(REC_TASK),
            pid: word32(d, REC_PID as usize),
            ret: if is_return { word(REC_RET) } else { 0 },
            args: (layout.args && !is_return)
                .then(|| std::array::from_fn(|r| word(REC_ARGS + 8 * r as u64))),
            strings: (layout.strings && !is_return).then(|| {
                let at = REC_STRINGS as usize;
                d[at..at + STRINGS_LEN]
                    .try_into()
                    .expect("the record's strings")
            }),
        })
    }
}

/// Zeroes records `[from, from + n)` of `cpu`'s ring (commit words with
/// them) once read: in one write per contiguous piece. The guest leaves a
/// slot alone until the limit frees it, which comes after.
pub fn clear_records(
    mem: &dyn GuestRam,
    layout: &RingLayout,
    cpu: usize,
    from: u64,
    n: u64,
    zeros: &mut Vec<u8>,
) -> Result<(), MemFault> {
    zeros.resize(n as usize * layout.record_len() as usize, 0);
    for_pieces(layout, cpu, from, zeros.len(), |gpa, range| {
        mem.write_slice(&zeros[range], GuestAddress(gpa))
            .map_err(|e| ("clearing read records", gpa, e))
    })
}

/// Reads `buf.len()` bytes of records from index `from` of `cpu`'s ring.
fn read_records(
    mem: &dyn GuestRam,
    layout: &RingLayout,
    cpu: usize,
    from: u64,
    buf: &mut [u8],
) -> Result<(), MemFault> {
    for_pieces(layout, cpu, from, buf.len(), |gpa, range| {
        mem.read_slice(&mut buf[range], GuestAddress(gpa))
            .map_err(|e| ("reading records", gpa, e))
    })
}

/// `f(gpa, byte range)` for each contiguous piece of `len` bytes of
/// records from index `from` of `cpu`'s ring: two where the span wraps.
fn for_pieces(
    layout: &RingLayout,
    cpu: usize,
    from: u64,
    len: usize,
    mut f: impl FnMut(u64, std::ops::Range<usize>) -> Result<(), MemFault>,
) -> Result<(), MemFault> {
    let rec = layout.record_len();
    let records = layout.ring_gpa(cpu) + layout.records_off;
    let ring_len = (layout.cap * rec) as usize;
    let mut done = 0;
    let mut at = ((from & (layout.cap - 1)) * rec) as usize;
    while done < len {
        let n = (len - done).min(ring_len - at);
        f(records + at as u64, done..done + n)?;
        done += n;
        at = 0;
    }
    Ok(())
}

fn word32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn word64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
