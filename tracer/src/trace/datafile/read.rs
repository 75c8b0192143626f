//! Reading a trace file back, checking every rule of the format (see the
//! parent module).

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;

use super::reader::Reader;
use super::{
    check_callers, check_events, Section, TraceFileError, EVENT_CHUNK, EVENT_SIZE, EVENT_SIZE_V2,
    IO_BUFFER, MAGIC, PREAMBLE_SIZE, VERSION, VERSION_1, VERSION_2, VERSION_3, VERSION_5,
    VERSION_6,
};
use crate::kernel::symbols::Symbol;
use crate::trace::model::{Event, Trace, TraceMeta};

/// Opens a trace file without blocking (a FIFO would wait for a writer) and
/// refuses anything but a regular file; returns it and its size.
fn open(path: &Path) -> Result<(File, u64), TraceFileError> {
    let open_err = |source| TraceFileError::Open {
        path: path.to_path_buf(),
        source,
    };
    let (file, size) =
        vmm::boot::open_input(path, "trace file", u64::MAX, "").map_err(|e| match e {
            vmm::boot::FileError::Open { source, .. } => open_err(source),
            vmm::boot::FileError::NotRegular { kind, .. } => open_err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("it is {kind}, not a regular file"),
            )),
            e @ vmm::boot::FileError::TooLarge { .. } => {
                open_err(io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))
            }
        })?;
    Ok((file, size))
}

/// Reads a trace saved by `save`.
pub fn load(path: &Path) -> Result<Trace, TraceFileError> {
    let (file, actual) = open(path)?;
    let mut r = Reader {
        r: BufReader::with_capacity(IO_BUFFER, file),
        path,
        pos: 0,
        actual,
        declared: u64::MAX,
        section: Section::Preamble,
    };

    // Preamble.
    let mut magic = [0u8; 8];
    let have = actual.min(8) as usize;
    r.bytes(&mut magic[..have])?;
    if magic[..have] != MAGIC[..have] {
        return Err(TraceFileError::BadMagic {
            path: path.to_path_buf(),
        });
    }
    if have < 8 {
        return Err(r.truncated());
    }
    let version = r.u32()?;
    if ![
        VERSION_1, VERSION_2, VERSION_3, VERSION, VERSION_5, VERSION_6,
    ]
    .contains(&version)
    {
        return Err(TraceFileError::UnsupportedVersion {
            path: path.to_path_buf(),
            version,
        });
    }
    let declared = r.u64()?;
    if version >= VERSION_5 {
        // A data file written while the guest ran: blocks, no length.
        return super::read_v5::load(r, declared, version);
    }
    if declared < PREAMBLE_SIZE {
        return Err(r.corrupt(format!(
            "file length {declared} is shorter than the preamble"
        )));
    }
    if declared < actual {
        return Err(r.corrupt(format!(
            "the file is {actual} bytes but its preamble says {declared}: {} trailing bytes",
            actual - declared
        )));
    }
    r.declared = declared;
    let body = read_body(&mut r, version)?;

    r.section = Section::Events;
    let n = r.u64()?;
    let event_size = if version >= VERSION_3 {
        EVENT_SIZE
    } else {
        EVENT_SIZE_V2
    };
    let bytes = n
        .checked_mul(event_size as u64)
        .ok_or_else(|| r.corrupt(format!("absurd event count {n}")))?;
    r.need(bytes, &format!("{n} events"))?;
    // The events run to the end of the file: their count must say exactly
    // the bytes left, checked before anything is allocated for them.
    let left = declared - r.pos;
    if bytes != left {
        return Err(r.corrupt(format!(
            "{n} events take {bytes} bytes but {left} bytes are left in the file"
        )));
    }
    let meta = &body.meta;
    // Entries plus returns: checked against the counts once read.
    if n.checked_add(meta.events_dropped)
        .and_then(|v| v.checked_add(meta.returns_dropped))
        .is_none_or(|v| v > meta.events_total.saturating_add(body.returns_total))
    {
        return Err(r.corrupt(format!(
            "{n} events stored and {} dropped, but {} in all",
            meta.events_dropped, meta.events_total
        )));
    }
    let n = n as usize; // fits: n records fit in the file
                        // Grown as the events are read: a file that claims more than it has
                        // (a sparse one) costs only what is actually read.
    let mut events = Vec::with_capacity(n.min(EVENT_CHUNK));
    let mut buf = vec![0u8; EVENT_CHUNK.min(n) * event_size];
    while events.len() < n {
        let k = EVENT_CHUNK.min(n - events.len());
        let chunk = &mut buf[..k * event_size];
        r.bytes(chunk)?;
        let first = events.len();
        events.extend(
            chunk
                .chunks_exact(event_size)
                .map(|b| decode(b, event_size)),
        );
        check_new_events(&events, first, &body).map_err(|d| r.corrupt(d))?;
    }
    if r.pos != declared {
        return Err(r.corrupt(format!(
            "{} bytes after the last event (file length {declared})",
            declared - r.pos
        )));
    }
    body.with_events(events).map_err(|d| r.corrupt(d))
}

/// One event record of `size` bytes (`EVENT_SIZE`, or `EVENT_SIZE_V2`
/// without the slot).
pub(super) fn decode(b: &[u8], size: usize) -> Event {
    let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    if size == EVENT_SIZE {
        Event {
            ts_ns: u64_at(0),
            parent: u64_at(8),
            slot: u64_at(16),
            func: u32_at(24),
            cpu: u32_at(28),
        }
    } else {
        Event {
            ts_ns: u64_at(0),
            parent: u64_at(8),
            slot: 0,
            func: u32_at(16),
            cpu: u32_at(20),
        }
    }
}

/// The events from `first` on index the body's functions and vCPUs, and
/// carry a slot only in a function-graph trace.
pub(super) fn check_new_events(events: &[Event], first: usize, body: &Body) -> Result<(), String> {
    let meta = &body.meta;
    check_events(
        &events[first..],
        first,
        body.functions.len(),
        meta.cpus as usize,
    )?;
    if !meta.graph {
        if let Some(i) = events[first..].iter().position(|e| e.slot != 0) {
            return Err(format!(
                "event {} has a stack slot but the trace has no function graph",
                first + i
            ));
        }
    }
    Ok(())
}

/// Everything of a trace but its events: the header (the run's facts), the
/// functions, the exact counts, the callers. In versions 1 to 4 it comes
/// between the preamble and the events; in versions 5 and 6 a data file holds it
/// twice, as known at attach (`HEAD`) and at the end (`FOOT`).
pub(super) struct Body {
    pub meta: TraceMeta,
    pub functions: Vec<Symbol>,
    pub counts: Vec<Vec<u64>>,
    pub returns: Vec<Vec<u64>>,
    /// The sum of `returns` (checked not to overflow).
    pub returns_total: u64,
    pub callers: Vec<Symbol>,
}

impl Body {
    /// The trace, once its stored events are checked against the counts.
    pub(super) fn with_events(self, events: Vec<Event>) -> Result<Trace, String> {
        let meta = &self.meta;
        let entries: Vec<Event> = events.iter().filter(|e| !e.is_return()).copied().collect();
        if entries.len() as u64 + meta.events_dropped != meta.events_total {
            return Err(format!(
                "{} entries stored and {} dropped, but {} in all",
                entries.len(),
                meta.events_dropped,
                meta.events_total
            ));
        }
        check_against_counts(&entries, &self.counts, meta.events_dropped == 0)?;
        if meta.graph {
            let rets: Vec<Event> = events.iter().filter(|e| e.is_return()).copied().collect();
            if rets.len() as u64 + meta.returns_dropped != self.returns_total {
                return Err(format!(
                    "{} returns stored and {} dropped, but {} in all",
                    rets.len(),
                    meta.returns_dropped,
                    self.returns_total
                ));
            }
            check_against_counts(&rets, &self.returns, meta.returns_dropped == 0)
                .map_err(|d| format!("returns: {d}"))?;
        }
        Ok(Trace {
            meta: self.meta,
            functions: self.functions,
            counts: self.counts,
            returns: self.returns,
            callers: self.callers,
            events,
        })
    }
}

/// The body (see [`Body`]) of a file of `version`.
pub(super) fn read_body<R: Read>(
    r: &mut Reader<'_, R>,
    version: u32,
) -> Result<Body, TraceFileError> {
    r.section = Section::Header;
    let kernel = r.string("kernel")?;
    let build_id = match r.u8()? {
        0 => None,
        1 => Some(r.string("build id")?),
        b => return Err(r.corrupt(format!("has_build_id is {b}, not 0 or 1"))),
    };
    let cpus = r.u32()?;
    let mut v = [0u64; 10];
    for x in &mut v {
        *x = r.u64()?;
    }
    let stop_reason = r.string("stop reason")?;
    // Version 1 traces came from trap mode only: every call was an exit.
    let (mode, trap_exits) = if version == VERSION_1 {
        ("trap".to_string(), v[7])
    } else {
        (r.string("mode")?, r.u64()?)
    };
    // Versions 1 and 2 had no function graph.
    let (graph, returns_dropped, unhooked, tsc_khz) = if version >= VERSION_3 {
        let graph = match r.u8()? {
            0 => false,
            1 => true,
            b => return Err(r.corrupt(format!("graph is {b}, not 0 or 1"))),
        };
        (graph, r.u64()?, r.u64()?, r.u64()?)
    } else {
        (false, 0, 0, 0)
    };
    // Version 3 and older did not say where the symbols came from.
    let symbols = if version >= VERSION {
        r.string("symbols")?
    } else {
        String::new()
    };
    // Version 5 added what the recording lost, the flight recorder, the
    // rejected sites and the kernel's offsets.
    let (lost, overwrite, rejected_sites, kernel_offset) = if version >= VERSION_5 {
        let n = r.u32()?;
        if n != 0 && n != cpus {
            return Err(r.corrupt(format!("losses for {n} vCPUs but the trace has {cpus}")));
        }
        r.need(u64::from(n) * 8, "the losses per vCPU")?;
        let mut lost = Vec::with_capacity(n as usize);
        for _ in 0..n {
            lost.push(r.u64()?);
        }
        let overwrite = match r.u8()? {
            0 => false,
            1 => true,
            b => return Err(r.corrupt(format!("overwrite is {b}, not 0 or 1"))),
        };
        let rejected = r.string("rejected sites")?;
        let offset = match r.u8()? {
            0 => None,
            1 => Some((r.u64()? as i64, r.u64()? as i64)),
            b => return Err(r.corrupt(format!("has_offset is {b}, not 0 or 1"))),
        };
        (lost, overwrite, rejected, offset)
    } else {
        (Vec::new(), false, String::new(), None)
    };
    // Version 6 added the exitless calls whose record was never committed.
    let unfinished = if version >= VERSION_6 { r.u64()? } else { 0 };
    if v[0] > v[1] {
        return Err(r.corrupt(format!(
            "detach ({} ns) is before attach ({} ns)",
            v[1], v[0]
        )));
    }
    if v[8] > v[7] {
        return Err(r.corrupt(format!("{} events dropped of {} in all", v[8], v[7])));
    }
    if v[9] > v[7] {
        return Err(r.corrupt(format!(
            "{} events with an unreadable caller of {} in all",
            v[9], v[7]
        )));
    }
    let meta = TraceMeta {
        kernel,
        build_id,
        cpus,
        attach_ns: v[0],
        detach_ns: v[1],
        sites_patched: v[2],
        sites_skipped_init: v[3],
        sites_skipped_other: v[4],
        attach_window_ns: v[5],
        attach_latency_ns: v[6],
        events_total: v[7],
        events_dropped: v[8],
        parent_unreadable: v[9],
        stop_reason,
        mode,
        trap_exits,
        graph,
        returns_dropped,
        unhooked,
        tsc_khz,
        symbols,
        lost,
        overwrite,
        rejected_sites,
        kernel_offset,
        incomplete: false,
        // Not in the file: the run's alone.
        guest_instructions_emulated: None,
        unfinished,
    };

    r.section = Section::Functions;
    let functions = r.syms("functions")?;

    r.section = Section::Counts;
    let counts = r.matrix(functions.len(), cpus as usize, "counts")?;
    let mut total = 0u64;
    for row in &counts {
        for &c in row {
            total = total
                .checked_add(c)
                .ok_or_else(|| r.corrupt("the counts add up past 2^64".into()))?;
        }
    }
    if total != meta.events_total {
        return Err(r.corrupt(format!(
            "the counts add up to {total} but the header says {} events in all",
            meta.events_total
        )));
    }
    let returns = if version >= VERSION_3 {
        r.section = Section::Returns;
        let (rows, cols) = if meta.graph {
            (functions.len(), cpus as usize)
        } else {
            (0, 0)
        };
        r.matrix(rows, cols, "returns")?
    } else {
        Vec::new()
    };

    let mut returns_total = 0u64;
    for &c in returns.iter().flatten() {
        returns_total = returns_total
            .checked_add(c)
            .ok_or_else(|| r.corrupt("the returns add up past 2^64".into()))?;
    }
    if meta.returns_dropped > returns_total {
        return Err(r.corrupt(format!(
            "{} returns dropped of {returns_total} in all",
            meta.returns_dropped
        )));
    }

    r.section = Section::Callers;
    let callers = r.syms("callers")?;
    check_callers(&callers).map_err(|d| r.corrupt(d))?;

    Ok(Body {
        meta,
        functions,
        counts,
        returns,
        returns_total,
        callers,
    })
}

/// Stored events per vCPU and per function cannot exceed the counts; with
/// nothing dropped (`exact`) they equal them.
fn check_against_counts(events: &[Event], counts: &[Vec<u64>], exact: bool) -> Result<(), String> {
    let cpus = counts.first().map_or(0, Vec::len);
    let mut per_cpu = vec![0u64; cpus];
    let mut per_func = vec![0u64; counts.len()];
    for e in events {
        // Indices were checked as the events were read.
        per_cpu[e.cpu as usize] += 1;
        per_func[e.func as usize] += 1;
    }
    for (c, &stored) in per_cpu.iter().enumerate() {
        // No overflow: the total of all counts fits a u64.
        let counted: u64 = counts.iter().map(|row| row[c]).sum();
        if stored > counted || (exact && stored != counted) {
            return Err(format!(
                "{stored} events stored on vCPU {c} but the counts say {counted}"
            ));
        }
    }
    for (f, &stored) in per_func.iter().enumerate() {
        let counted: u64 = counts[f].iter().sum();
        if stored > counted || (exact && stored != counted) {
            return Err(format!(
                "{stored} events stored for function {f} but the counts say {counted}"
            ));
        }
    }
    Ok(())
}
