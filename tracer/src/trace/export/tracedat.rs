//! `trace.dat`, trace-cmd's file format (version 6), so that `trace-cmd
//! report`, KernelShark and everything built on libtracecmd read a vmtrace
//! trace as if the guest's own ftrace had recorded it.
//!
//! Every stored entry becomes an ftrace `function` event (`ip`: the traced
//! function's start, `parent_ip`: the return address in its caller) on the
//! vCPU's CPU buffer. A function-graph trace (`TraceMeta::graph`) is written
//! the way the kernel's `function_graph` tracer writes one instead: a
//! `funcgraph_entry` per stored entry and a `funcgraph_exit` per call whose
//! return was stored, so that `trace-cmd report` draws the call tree with
//! durations. With return values (`--retval`) `funcgraph_exit` has the
//! layout of Linux 6.5+ built with CONFIG_FUNCTION_GRAPH_RETVAL, `unsigned
//! long retval` after `func`, holding RAX as recorded (all 64 bits, as the
//! kernel stores it); without, Linux 6.1's.
//!
//! An entry that carries its kernel stack (`--stack`) is followed, at the
//! same time on the same CPU, by a `kernel_stack` event (`TRACE_STACK`), as
//! the kernel's `func_stack_trace` option writes one: `int size` (frames),
//! then the return addresses, innermost first, at link addresses like
//! every address of the file (the kallsyms hold the functions they fall
//! in: `Trace::callers`). `trace-cmd report` prints it as `<stack trace >`
//! and a `=> function (address)` line per frame; it names an address by
//! the symbol at or below it, so a return address at the very end of its
//! function (a call as its last instruction) reads as the next one. The
//! record holds as many frames as the stack has (the kernel's does too,
//! past the 8 its format declares); one over 112 bytes is written with
//! `type_len` 0 and its length in the word after the header.
//!
//! # Layout (version 6)
//!
//! Integers are little-endian; `u64` sizes count the bytes that follow.
//! Sources: trace-cmd's `Documentation/trace-cmd/trace-cmd.dat.v6.5.txt` and
//! `lib/trace-cmd/trace-input.c` (what the reader accepts).
//!
//! | Part            | Contents                                                             |
//! |-----------------|----------------------------------------------------------------------|
//! | magic           | `17 08 44` `tracing` `6\0`                                           |
//! | machine         | `u8` 0 (little endian), `u8` 8 (long size), `u32` page size 4096     |
//! | header_page     | `header_page\0`, `u64` size, tracefs `events/header_page` text        |
//! | header_event    | `header_event\0`, `u64` size, tracefs `events/header_event` text      |
//! | ftrace formats  | `u32` count, then per event `u64` size + its `format` file text       |
//! | event systems   | `u32` count, per system its name, `u32` count, its events' `format`s (`events`) |
//! | kallsyms        | `u32` size, `/proc/kallsyms`-style lines `%016x t name`               |
//! | printk formats  | `u32` 0                                                               |
//! | cmdlines        | `u64` size, `saved_cmdlines` lines `pid comm` (below)                 |
//! | cpus            | `u32` number of vCPUs                                                 |
//! | options         | `options  \0`, option `TRACECLOCK` (`[mono]`), `VERSION` (`options`), `u16` 0 |
//! | flyrecord       | `flyrecord\0`, per CPU `u64` offset + `u64` size, `u64` size + `[mono]` |
//! | padding         | zeros up to the next page boundary                                    |
//! | CPU data        | per CPU, page-aligned: whole ring-buffer pages (below)                |
//!
//! A ring-buffer page (`struct buffer_data_page`, kernel/trace/ring_buffer.c)
//! is `u64` timestamp (of the page, ns), `u64` commit (bytes of events used;
//! `local_t`, a long) and 4080 bytes of events. Each event starts with a
//! `u32`: bits 0-4 `type_len`, bits 5-31 `time_delta` (ns since the previous
//! event, or since the page's timestamp for the first). `type_len` 1-28: the
//! payload is `type_len * 4` bytes and follows; 30 (`TIME_EXTEND`): a `u32`
//! follows holding bits 27-58 of a delta too large for 27 bits, and the
//! next event's own delta is 0 (include/linux/ring_buffer.h). The payload
//! is the event's record: the common fields (`u16` type, `u8` flags, `u8`
//! preempt count, `i32` pid), then the event's own fields.
//!
//! Timestamps are vmtrace's (host `CLOCK_MONOTONIC`, ns), which is what
//! ftrace's `mono` clock reads; the file says so.
//!
//! Tasks: an event whose guest task is known (`Trace::tasks`) carries the
//! task's pid in `common_pid`, and the cmdlines map each pid to its comm
//! (the latest one of a task that was renamed: the file maps a pid to one
//! comm, as the kernel's `saved_cmdlines` does), so that `trace-cmd report`
//! prints `comm-pid` as for the guest's own ftrace; pid 0, every CPU's idle
//! task, is `<idle>` (libtraceevent's name for it, not in the cmdlines).
//! The format has no place for tgids (trace-cmd saves none). A trace
//! without tasks gives each vCPU's events a pseudo pid, [`PID_BASE`] +
//! vCPU, named `vcpuN` in the cmdlines; in a trace with tasks, events
//! whose task is unknown get [`UNKNOWN_PID_BASE`] + vCPU instead (named
//! `vcpuN` too), which no Linux pid reaches.
//!
//! Symbols: the kallsyms section holds the traced functions and the
//! callers. libtraceevent maps an address to the symbol with the greatest
//! start at or below it, whatever that symbol's size; so at the end of each
//! symbol (unless another starts before it) a symbol named
//! [`UNKNOWN_SYMBOL`] starts, and a caller address that `Trace::caller_of`
//! finds in no function prints as `[unknown]`, like vmtrace's own reports,
//! not as the function before it. Addresses below the first symbol (an
//! unreadable caller, 0) or past the last one's end print in hex.
//! Names with blanks or control characters would break the line format:
//! blanks become `_`, control characters `\xNN`.

use std::collections::HashMap;
use std::io::{self, Write};

use crate::trace::graph::{End, Graph};
use crate::trace::model::Trace;

mod events;
mod formats;
mod names;
mod options;
use formats::*;
use names::{cmdlines, kallsyms, pid_of};
pub use names::{PID_BASE, UNKNOWN_PID_BASE, UNKNOWN_SYMBOL};

/// The trace-cmd file format version written (trace-cmd.dat.v6.5.txt).
pub const VERSION: u32 = 6;
/// The first three bytes of every trace.dat (trace-cmd-private.h, TRACECMD_MAGIC).
const MAGIC: [u8; 3] = [0x17, 0x08, 0x44];
/// Size of a ring-buffer page: PAGE_SIZE on x86-64.
pub const PAGE_SIZE: usize = 4096;
/// `struct buffer_data_page` before its data: `u64 time_stamp`, `local_t
/// commit` (8 bytes on a 64-bit kernel) (kernel/trace/ring_buffer.c).
pub const PAGE_HEADER_SIZE: usize = 16;
/// Bytes of events a page holds: BUF_PAGE_SIZE in ring_buffer.c.
pub const PAGE_DATA_SIZE: usize = PAGE_SIZE - PAGE_HEADER_SIZE;
/// The size of `long` in the traced kernel (x86-64), written in the file header.
const LONG_SIZE: u8 = 8;
/// Bits of `time_delta` in an event header (ring_buffer.c, TS_SHIFT).
pub const TS_SHIFT: u32 = 27;
/// Largest delta an event header holds.
pub const TS_MASK: u64 = (1 << TS_SHIFT) - 1;
/// A TIME_EXTEND holds 27 + 32 bits of delta; larger gaps start a new page.
const MAX_EXTEND: u64 = (1 << (TS_SHIFT + 32)) - 1;
/// `type_len` of a TIME_EXTEND event (enum ring_buffer_type, RINGBUF_TYPE_TIME_EXTEND).
pub const TYPE_TIME_EXTEND: u32 = 30;
/// Largest `type_len` of a data event (RINGBUF_TYPE_DATA_TYPE_LEN_MAX); a
/// larger payload needs `type_len` 0 and its length in `array[0]`, which
/// the events written here never do.
const TYPE_DATA_MAX: u32 = 28;
/// The largest payload written: a `kernel_stack` of `MAX_FRAMES` frames.
const MAX_PAYLOAD: usize = COMMON_SIZE + 8 + 8 * crate::kernel::unwind::MAX_FRAMES;
/// Ring-buffer events are 4-byte aligned (ring_buffer.c, RB_ALIGNMENT).
const RB_ALIGNMENT: usize = 4;
/// Event ids, `enum trace_type` in kernel/trace/trace.h: TRACE_FN,
/// TRACE_STACK, TRACE_GRAPH_RET, TRACE_GRAPH_ENT.
pub const ID_FUNCTION: u16 = 1;
pub const ID_KERNEL_STACK: u16 = 4;
pub const ID_FUNCGRAPH_EXIT: u16 = 10;
pub const ID_FUNCGRAPH_ENTRY: u16 = 11;
/// ftrace's clock that reads CLOCK_MONOTONIC (kernel/trace/trace.c, trace_clocks).
const TRACE_CLOCK: &str = "[mono]";
/// The most CPUs a file may have: Linux's largest NR_CPUS on x86-64
/// (MAXSMP). More is a corrupt trace, refused before allocating per CPU.
pub const MAX_CPUS: u32 = 8192;

/// The common fields of an event of type `id` by pid `pid` (flags and
/// preempt count 0: vmtrace does not see them).
fn common(buf: &mut Vec<u8>, id: u16, pid: u32) {
    buf.extend_from_slice(&id.to_le_bytes());
    buf.extend_from_slice(&[0, 0]);
    buf.extend_from_slice(&pid.to_le_bytes());
}

/// What [`write_tracedat_counted`] wrote and left out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TracedatCounts {
    /// `function` events: every entry, or in a function-graph trace the
    /// entries whose return was not hooked.
    pub function: u64,
    /// Function-graph traces: the other entries, and the returns of stored
    /// entries.
    pub funcgraph_entry: u64,
    pub funcgraph_exit: u64,
    /// `kernel_stack` events: one after each entry with a stack.
    pub kernel_stack: u64,
    /// Traced events' records (`-e`), one per event entry.
    pub events: u64,
    /// Stored events left out because their vCPU is not below `meta.cpus`.
    pub bad_cpu: u64,
    /// Stored events left out because their function index is out of range.
    pub bad_func: u64,
    /// Ring-buffer pages written, all CPUs.
    pub pages: u64,
}

/// One CPU's ring-buffer pages, filled in time order.
#[derive(Default)]
struct CpuPages {
    /// Whole pages.
    data: Vec<u8>,
    /// Bytes of events in the last page (0 and no page: nothing yet).
    used: usize,
    /// Time of the last event written (the reference of the next delta).
    last_ts: u64,
}

impl CpuPages {
    /// Starts a page at time `ts` (its header's timestamp).
    fn new_page(&mut self, ts: u64) {
        self.data.resize(self.data.len() + PAGE_SIZE, 0);
        let start = self.data.len() - PAGE_SIZE;
        self.data[start..start + 8].copy_from_slice(&ts.to_le_bytes());
        self.used = 0;
        self.last_ts = ts;
    }

    /// Appends an event at `ts` with `payload` (up to 112 bytes `type_len`
    /// holds its length; a longer one, at most `MAX_PAYLOAD`, has
    /// `type_len` 0 and its length, plus 4, in the word after the header:
    /// rb_update_event). Events must come in time order; one that does
    /// not starts a new page rather than store a wrong time.
    fn push(&mut self, ts: u64, payload: &[u8]) {
        let len = payload.len().max(1).next_multiple_of(RB_ALIGNMENT);
        debug_assert!(len <= MAX_PAYLOAD);
        let long = len > TYPE_DATA_MAX as usize * RB_ALIGNMENT;
        let type_len = if long { 0 } else { (len / RB_ALIGNMENT) as u32 };
        // Header, the long form's length word, the payload.
        let size = 4 + if long { 4 } else { 0 } + len;
        if self.data.is_empty() || ts < self.last_ts {
            self.new_page(ts);
        }
        let mut delta = ts - self.last_ts;
        // A TIME_EXTEND is 8 bytes before the event; a gap too large even
        // for it starts a page, whose header holds an absolute time.
        let mut need = size + if delta > TS_MASK { 8 } else { 0 };
        if delta > MAX_EXTEND || self.used + need > PAGE_DATA_SIZE {
            self.new_page(ts);
            delta = 0;
            need = size;
        }
        let page = self.data.len() - PAGE_SIZE;
        let mut at = page + PAGE_HEADER_SIZE + self.used;
        if delta > TS_MASK {
            let head = TYPE_TIME_EXTEND | (((delta & TS_MASK) as u32) << 5);
            self.data[at..at + 4].copy_from_slice(&head.to_le_bytes());
            let high = (delta >> TS_SHIFT) as u32;
            self.data[at + 4..at + 8].copy_from_slice(&high.to_le_bytes());
            at += 8;
            delta = 0;
        }
        let head = type_len | ((delta as u32) << 5);
        self.data[at..at + 4].copy_from_slice(&head.to_le_bytes());
        if long {
            at += 4;
            self.data[at..at + 4].copy_from_slice(&(len as u32 + 4).to_le_bytes());
        }
        self.data[at + 4..at + 4 + payload.len()].copy_from_slice(payload);
        self.used += need;
        self.last_ts = ts;
        // The commit field says how much of the page is events.
        self.data[page + 8..page + 16].copy_from_slice(&(self.used as u64).to_le_bytes());
    }
}

/// Writes `trace` as a trace-cmd `trace.dat` (version 6; see the module
/// comment).
pub fn write_tracedat(trace: &Trace, w: &mut dyn Write) -> io::Result<()> {
    write_tracedat_counted(trace, w).map(|_| ())
}

/// [`write_tracedat`], saying how many events it wrote and left out. Fails
/// (writing nothing) on a trace claiming more than [`MAX_CPUS`] vCPUs or
/// kallsyms of 4 GiB and over, and when `w` does.
pub fn write_tracedat_counted(trace: &Trace, w: &mut dyn Write) -> io::Result<TracedatCounts> {
    let cpus = trace.meta.cpus;
    if cpus > MAX_CPUS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("trace.dat: {cpus} vCPUs, more than any kernel has ({MAX_CPUS})"),
        ));
    }
    let mut out = Out {
        trace,
        pages: (0..cpus).map(|_| CpuPages::default()).collect(),
        written: TracedatCounts::default(),
        payload: Vec::with_capacity(COMMON_SIZE + 40),
        events: events::EventRecords::new(trace),
    };
    if trace.meta.graph {
        out.graph_events();
    } else {
        out.functions();
    }
    let Out {
        pages,
        mut written,
        events,
        ..
    } = out;
    written.pages = pages
        .iter()
        .map(|p| (p.data.len() / PAGE_SIZE) as u64)
        .sum();

    let h = file_header(trace, &pages, &events)?;
    w.write_all(&h)?;
    for p in &pages {
        w.write_all(&p.data)?;
    }
    w.flush()?;
    Ok(written)
}

/// Everything before the CPU data: the headers, event formats, kallsyms,
/// options and the offsets of each CPU's pages, padded to a page.
fn file_header(
    trace: &Trace,
    pages: &[CpuPages],
    events: &events::EventRecords,
) -> io::Result<Vec<u8>> {
    let cpus = trace.meta.cpus;
    let mut h: Vec<u8> = Vec::with_capacity(PAGE_SIZE);
    h.extend_from_slice(&MAGIC);
    h.extend_from_slice(b"tracing");
    h.extend_from_slice(format!("{VERSION}\0").as_bytes());
    h.push(0); // little endian
    h.push(LONG_SIZE);
    h.extend_from_slice(&(PAGE_SIZE as u32).to_le_bytes());
    h.extend_from_slice(b"header_page\0");
    put_text64(&mut h, HEADER_PAGE);
    h.extend_from_slice(b"header_event\0");
    put_text64(&mut h, HEADER_EVENT);
    let mut formats = if trace.meta.graph {
        vec![
            function_format(),
            funcgraph_entry_format(),
            funcgraph_exit_format(trace.meta.retval),
        ]
    } else {
        vec![function_format()]
    };
    if !trace.stacks.is_empty() {
        formats.push(kernel_stack_format());
    }
    h.extend_from_slice(&(formats.len() as u32).to_le_bytes());
    for f in &formats {
        put_text64(&mut h, f);
    }
    put_systems(&mut h, &events.systems);
    let syms = kallsyms(trace);
    let syms_len = u32::try_from(syms.len()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "trace.dat: kallsyms over 4 GiB",
        )
    })?;
    h.extend_from_slice(&syms_len.to_le_bytes());
    h.extend_from_slice(syms.as_bytes());
    h.extend_from_slice(&0u32.to_le_bytes()); // printk formats
    put_text64(&mut h, &cmdlines(trace));
    h.extend_from_slice(&cpus.to_le_bytes());
    h.extend_from_slice(b"options  \0");
    options::put_options(&mut h, trace);
    h.extend_from_slice(b"flyrecord\0");
    // The CPU data starts at the first page boundary after the header: the
    // offsets table (16 bytes a CPU) and the clock come first.
    let table_end = h.len() + 16 * cpus as usize + 8 + TRACE_CLOCK.len();
    let mut offset = table_end.next_multiple_of(PAGE_SIZE) as u64;
    for p in pages {
        let size = p.data.len() as u64;
        h.extend_from_slice(&offset.to_le_bytes());
        h.extend_from_slice(&size.to_le_bytes());
        offset += size;
    }
    // With the TRACECLOCK option a version 6 reader expects the clock here
    // (trace-input.c, init_data_v6).
    put_text64(&mut h, TRACE_CLOCK);
    h.resize(h.len().next_multiple_of(PAGE_SIZE), 0);
    Ok(h)
}

/// The event systems: `u32` count, then each system's name (NUL ended),
/// `u32` count and its events' formats (`u64` length and text each).
fn put_systems(h: &mut Vec<u8>, systems: &std::collections::BTreeMap<String, Vec<String>>) {
    h.extend_from_slice(&(systems.len() as u32).to_le_bytes());
    for (name, formats) in systems {
        h.extend_from_slice(name.as_bytes());
        h.push(0);
        h.extend_from_slice(&(formats.len() as u32).to_le_bytes());
        for f in formats {
            put_text64(h, f);
        }
    }
}

/// Appends `u64` length and `text`.
fn put_text64(h: &mut Vec<u8>, text: &str) {
    h.extend_from_slice(&(text.len() as u64).to_le_bytes());
    h.extend_from_slice(text.as_bytes());
}

/// Where the events go, and what was written and left out.
struct Out<'a> {
    trace: &'a Trace,
    pages: Vec<CpuPages>,
    written: TracedatCounts,
    /// The record being built (reused).
    payload: Vec<u8>,
    /// The traced events' formats and records.
    events: events::EventRecords,
}

impl Out<'_> {
    /// The start of function `func` and the pages of vCPU `cpu`, or None
    /// (counted) when either is out of range.
    fn target(&mut self, cpu: u32, func: u32) -> Option<(u64, &mut CpuPages)> {
        let Some(pages) = self.pages.get_mut(cpu as usize) else {
            self.written.bad_cpu += 1;
            return None;
        };
        let Some(f) = self.trace.functions.get(func as usize) else {
            self.written.bad_func += 1;
            return None;
        };
        Some((f.addr, pages))
    }

    /// A `function` event: entry `e`, its function called from return
    /// address `e.parent` by its task; or, for a traced event's entry
    /// (`-e`), the event's record.
    fn function(&mut self, e: &crate::trace::model::Event) {
        let mut p = std::mem::take(&mut self.payload);
        let (ts, func) = (e.ts_ns, e.func);
        let pid = pid_of(self.trace, e.task, e.cpu);
        let values = self.trace.fields_of(e).map(|(_, v)| v).unwrap_or_default();
        let event = self
            .events
            .record((func, e.is_return()), &values, pid, &mut p);
        if let Some((ip, pages)) = self.target(e.cpu, func) {
            if event {
                pages.push(ts, &p);
                self.written.events += 1;
            } else {
                p.clear();
                common(&mut p, ID_FUNCTION, pid);
                p.extend_from_slice(&ip.to_le_bytes());
                p.extend_from_slice(&e.parent.to_le_bytes());
                pages.push(ts, &p);
                self.written.function += 1;
            }
        }
        self.payload = p;
    }

    /// A `funcgraph_entry`, or with `ret: Some((calltime, rettime,
    /// retval))` a `funcgraph_exit`, of `func` at stack depth `depth` by
    /// task `task` (`retval` written in a trace with return values).
    fn graph(
        &mut self,
        ts: u64,
        cpu: u32,
        task: u32,
        func: u32,
        depth: u32,
        ret: Option<(u64, u64, u64)>,
    ) {
        let mut p = std::mem::take(&mut self.payload);
        let pid = pid_of(self.trace, task, cpu);
        let retval = ret.filter(|_| self.trace.meta.retval).map(|r| r.2);
        if let Some((ip, pages)) = self.target(cpu, func) {
            p.clear();
            let id = if ret.is_some() {
                ID_FUNCGRAPH_EXIT
            } else {
                ID_FUNCGRAPH_ENTRY
            };
            common(&mut p, id, pid);
            p.extend_from_slice(&ip.to_le_bytes());
            if let Some(retval) = retval {
                p.extend_from_slice(&retval.to_le_bytes());
            }
            p.extend_from_slice(&(depth.min(i32::MAX as u32) as i32).to_le_bytes());
            if let Some((calltime, rettime, _)) = ret {
                p.extend_from_slice(&0u32.to_le_bytes()); // overrun: none
                p.extend_from_slice(&calltime.to_le_bytes());
                p.extend_from_slice(&rettime.to_le_bytes());
            }
            pages.push(ts, &p);
            match ret {
                Some(_) => self.written.funcgraph_exit += 1,
                None => self.written.funcgraph_entry += 1,
            }
        }
        self.payload = p;
    }

    /// A `kernel_stack` event after entry `e`, if it carries a stack (and
    /// its vCPU is in range: its entry was written).
    fn stack(&mut self, e: &crate::trace::model::Event) {
        let Some(stack) = self.trace.stack_of(e) else {
            return;
        };
        let pid = pid_of(self.trace, e.task, e.cpu);
        let Some(pages) = self.pages.get_mut(e.cpu as usize) else {
            return;
        };
        if self.trace.functions.get(e.func as usize).is_none() {
            return;
        }
        let frames = &stack.frames[..stack.frames.len().min(crate::kernel::unwind::MAX_FRAMES)];
        let mut p = std::mem::take(&mut self.payload);
        p.clear();
        common(&mut p, ID_KERNEL_STACK, pid);
        p.extend_from_slice(&(frames.len() as i32).to_le_bytes());
        p.extend_from_slice(&[0; 4]); // padding: `caller` is 8-aligned
        for f in frames {
            p.extend_from_slice(&f.to_le_bytes());
        }
        pages.push(e.ts_ns, &p);
        self.written.kernel_stack += 1;
        self.payload = p;
    }

    /// One `function` event per stored entry.
    fn functions(&mut self) {
        let trace = self.trace;
        for e in trace.events.iter().filter(|e| !e.is_return()) {
            self.function(e);
            self.stack(e);
        }
    }

    /// A function-graph trace, event by event in recorded order: an entry
    /// is a `funcgraph_entry` (a `function` event if its return was not
    /// hooked: it will have no exit, and keeps its caller), a return that
    /// ended a stored call a `funcgraph_exit` on the vCPU that returned.
    /// Returns with no stored entry are left out (see `Graph`), but a
    /// syscall's exit, an event of its own.
    fn graph_events(&mut self) {
        let trace = self.trace;
        let g = Graph::build(trace);
        // Graph::build makes one frame per entry, in order; a return ends
        // at most one frame, at the return's time and vCPU. Frames there
        // are listed outermost first: the innermost returns first.
        let mut returned: HashMap<(u64, u32), Vec<u32>> = HashMap::new();
        for (i, f) in g.frames.iter().enumerate() {
            if let End::Returned { ts_ns, cpu } = f.end {
                returned.entry((ts_ns, cpu)).or_default().push(i as u32);
            }
        }
        let mut frames = g.frames.iter();
        for e in &trace.events {
            if e.is_return() {
                let Some(i) = returned.get_mut(&(e.ts_ns, e.cpu)).and_then(Vec::pop) else {
                    // A syscall's exit is its event's record all the same
                    // (a new task's, which never entered the function).
                    if self.events.is_event(e.func, true) {
                        self.function(e);
                    }
                    continue;
                };
                let f = &g.frames[i as usize];
                if self.events.is_event(f.func, true) {
                    self.function(e); // a syscall's exit: the event's record
                    continue;
                }
                if self.events.is_event(f.func, false) {
                    continue; // its entry was the event's record
                }
                // RAX as recorded (`Event::data`), all 64 bits, as the
                // kernel stores `ftrace_graph_ret.retval`.
                let ret = Some((f.entry_ns, e.ts_ns, e.data));
                self.graph(e.ts_ns, e.cpu, e.task, f.func, f.depth, ret);
            } else if let Some(f) = frames.next() {
                if f.end == End::Unhooked || self.events.is_event(e.func, false) {
                    self.function(e);
                } else {
                    self.graph(e.ts_ns, e.cpu, e.task, e.func, f.depth, None);
                }
                self.stack(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::symbols::Symbol;

    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
    }

    fn u64_at(b: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
    }

    /// Reads pages back as libtraceevent's kbuffer does: (time, payload)
    /// per data event, and the number of TIME_EXTENDs.
    fn decode(data: &[u8]) -> (Vec<(u64, Vec<u8>)>, usize) {
        assert_eq!(data.len() % PAGE_SIZE, 0);
        let (mut out, mut extends) = (Vec::new(), 0);
        for page in data.chunks(PAGE_SIZE) {
            let mut ts = u64_at(page, 0);
            let commit = u64_at(page, 8) as usize;
            assert!(commit <= PAGE_DATA_SIZE);
            let events = &page[PAGE_HEADER_SIZE..PAGE_HEADER_SIZE + commit];
            let mut at = 0;
            while at < events.len() {
                let head = u32_at(events, at);
                let (type_len, delta) = (head & 31, u64::from(head >> 5));
                match type_len {
                    TYPE_TIME_EXTEND => {
                        ts += (u64::from(u32_at(events, at + 4)) << TS_SHIFT) + delta;
                        extends += 1;
                        at += 8;
                    }
                    1..=TYPE_DATA_MAX => {
                        ts += delta;
                        let len = type_len as usize * 4;
                        out.push((ts, events[at + 4..at + 4 + len].to_vec()));
                        at += 4 + len;
                    }
                    other => panic!("type_len {other}"),
                }
            }
        }
        (out, extends)
    }

    #[test]
    fn event_and_page_headers() {
        let mut p = CpuPages::default();
        p.push(1_000, &[0xaa; 24]);
        p.push(1_007, &[0xbb; 21]); // padded to 24
        let b = &p.data;
        assert_eq!(b.len(), PAGE_SIZE);
        assert_eq!(u64_at(b, 0), 1_000, "page timestamp: the first event's");
        assert_eq!(u64_at(b, 8), 2 * 28, "commit: bytes of events");
        // type_len 6 (24 bytes), delta 0; then delta 7.
        assert_eq!(u32_at(b, 16), 6);
        assert_eq!(&b[20..44], &[0xaa; 24]);
        assert_eq!(u32_at(b, 44), 6 | 7 << 5);
        assert_eq!(&b[48..69], &[0xbb; 21]);
        assert_eq!(&b[69..72], &[0, 0, 0]);
    }

    #[test]
    fn time_extend_holds_what_27_bits_cannot() {
        let mut p = CpuPages::default();
        let gap = (1u64 << TS_SHIFT) + 12_345 + (77 << TS_SHIFT);
        p.push(10, &[1; 8]);
        p.push(10 + TS_MASK, &[2; 8]); // fits exactly
        p.push(10 + TS_MASK + gap, &[3; 8]);
        let b = &p.data;
        assert_eq!(u32_at(b, 16 + 12), 2 | ((TS_MASK as u32) << 5));
        let ext = 16 + 24;
        assert_eq!(u32_at(b, ext) & 31, TYPE_TIME_EXTEND);
        assert_eq!(u64::from(u32_at(b, ext) >> 5), gap & TS_MASK);
        assert_eq!(u64::from(u32_at(b, ext + 4)), gap >> TS_SHIFT);
        assert_eq!(u32_at(b, ext + 8), 2, "the event after it: delta 0");
        assert_eq!(u64_at(b, 8), 12 * 3 + 8);
        let (ev, extends) = decode(b);
        assert_eq!(extends, 1);
        let times: Vec<u64> = ev.iter().map(|e| e.0).collect();
        assert_eq!(times, [10, 10 + TS_MASK, 10 + TS_MASK + gap]);
    }

    #[test]
    fn pages_fill_and_new_pages_start_where_needed() {
        let mut p = CpuPages::default();
        // 28-byte events: 145 fit in 4080 bytes.
        for i in 0..146u64 {
            p.push(i, &[i as u8; 24]);
        }
        assert_eq!(p.data.len(), 2 * PAGE_SIZE);
        assert_eq!(u64_at(&p.data, 8), 145 * 28);
        assert_eq!(u64_at(&p.data, PAGE_SIZE), 145, "second page's time");
        // Backwards in time, and a gap no TIME_EXTEND holds: new pages.
        p.push(3, &[0; 24]);
        p.push(3 + MAX_EXTEND + 1, &[0; 24]);
        assert_eq!(p.data.len(), 4 * PAGE_SIZE);
        assert_eq!(u64_at(&p.data, 3 * PAGE_SIZE), 3 + MAX_EXTEND + 1);
    }

    #[test]
    fn random_deltas_round_trip() {
        let mut state = 0x1234_5678_9abc_def1u64;
        let mut next = || {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            state.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        let mut p = CpuPages::default();
        let mut want = Vec::new();
        let mut ts = 0u64;
        for i in 0..20_000u32 {
            let r = next();
            ts += match r % 10 {
                0 => 0,
                1 => r >> 20, // up to 2^44 ns
                2 => TS_MASK + (r >> 60),
                _ => (r >> 8) % 1000,
            };
            let payload = i.to_le_bytes().repeat(1 + (r >> 32) as usize % 28);
            p.push(ts, &payload);
            want.push((ts, payload));
        }
        let (got, extends) = decode(&p.data);
        assert!(extends > 1000);
        assert_eq!(got, want);
    }

    #[test]
    fn kallsyms_marks_where_no_symbol_is() {
        let sym = |name: &str, addr, size| Symbol {
            name: name.into(),
            addr,
            size,
        };
        let trace = Trace {
            functions: vec![sym("f\n", 0x1000, 0x10), sym("alias of g", 0x2000, 0)],
            callers: vec![
                sym("g", 0x2000, 0x100),
                sym("inner", 0x2010, 0x10),
                sym("h", 0x2100, 0x10),
            ],
            ..Trace::default()
        };
        assert_eq!(
            kallsyms(&trace),
            "0000000000001000 t f\\x0a\n\
             0000000000001010 t [unknown]\n\
             0000000000002000 t alias_of_g\n\
             0000000000002010 t inner\n\
             0000000000002020 t [unknown]\n\
             0000000000002100 t h\n\
             0000000000002110 t [unknown]\n"
        );
    }

    #[test]
    fn header_texts_are_the_kernels() {
        // What a Linux 6.1 x86-64 guest's tracefs holds.
        assert!(function_format().ends_with(
            "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\
             \tfield:unsigned long ip;\toffset:8;\tsize:8;\tsigned:0;\n\
             \tfield:unsigned long parent_ip;\toffset:16;\tsize:8;\tsigned:0;\n\n\
             print fmt: \" %ps <-- %ps\", (void *)REC->ip, (void *)REC->parent_ip\n"
        ));
        assert!(function_format().starts_with("name: function\nID: 1\nformat:\n"));
        assert_eq!(HEADER_PAGE.lines().count(), 4);
    }
}
