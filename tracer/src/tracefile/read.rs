//! Reading a trace file back, checking every rule of the format (see the
//! parent module).

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;

use super::{
    check_callers, check_events, Section, TraceFileError, EVENT_CHUNK, EVENT_SIZE, EVENT_SIZE_V2,
    IO_BUFFER, MAGIC, MIN_SYM_SIZE, PREAMBLE_SIZE, VERSION, VERSION_1, VERSION_2, VERSION_3,
};
use crate::model::{Event, Trace, TraceMeta};
use crate::symbols::Symbol;

/// The longest string field read (a path, a stop reason, a symbol name):
/// bounds what a corrupt length field makes the reader allocate.
pub const MAX_STRING: u32 = 1 << 20;

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
    if ![VERSION_1, VERSION_2, VERSION_3, VERSION].contains(&version) {
        return Err(TraceFileError::UnsupportedVersion {
            path: path.to_path_buf(),
            version,
        });
    }
    let declared = r.u64()?;
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
    // Entries plus returns: checked against the counts once read.
    if n.checked_add(meta.events_dropped)
        .and_then(|v| v.checked_add(meta.returns_dropped))
        .is_none_or(|v| v > meta.events_total.saturating_add(returns_total))
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
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let u32_at = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    while events.len() < n {
        let k = EVENT_CHUNK.min(n - events.len());
        let chunk = &mut buf[..k * event_size];
        r.bytes(chunk)?;
        let first = events.len();
        events.extend(chunk.chunks_exact(event_size).map(|b| {
            if event_size == EVENT_SIZE {
                Event {
                    ts_ns: u64_at(b, 0),
                    parent: u64_at(b, 8),
                    slot: u64_at(b, 16),
                    func: u32_at(b, 24),
                    cpu: u32_at(b, 28),
                }
            } else {
                Event {
                    ts_ns: u64_at(b, 0),
                    parent: u64_at(b, 8),
                    slot: 0,
                    func: u32_at(b, 16),
                    cpu: u32_at(b, 20),
                }
            }
        }));
        check_events(&events[first..], first, functions.len(), cpus as usize)
            .map_err(|d| r.corrupt(d))?;
        if !meta.graph {
            if let Some(i) = events[first..].iter().position(|e| e.slot != 0) {
                return Err(r.corrupt(format!(
                    "event {} has a stack slot but the trace has no function graph",
                    first + i
                )));
            }
        }
    }
    if r.pos != declared {
        return Err(r.corrupt(format!(
            "{} bytes after the last event (file length {declared})",
            declared - r.pos
        )));
    }

    let entries: Vec<Event> = events.iter().filter(|e| !e.is_return()).copied().collect();
    if entries.len() as u64 + meta.events_dropped != meta.events_total {
        return Err(r.corrupt(format!(
            "{} entries stored and {} dropped, but {} in all",
            entries.len(),
            meta.events_dropped,
            meta.events_total
        )));
    }
    check_against_counts(&entries, &counts, meta.events_dropped == 0).map_err(|d| r.corrupt(d))?;
    if meta.graph {
        let rets: Vec<Event> = events.iter().filter(|e| e.is_return()).copied().collect();
        if rets.len() as u64 + meta.returns_dropped != returns_total {
            return Err(r.corrupt(format!(
                "{} returns stored and {} dropped, but {returns_total} in all",
                rets.len(),
                meta.returns_dropped
            )));
        }
        check_against_counts(&rets, &returns, meta.returns_dropped == 0)
            .map_err(|d| r.corrupt(format!("returns: {d}")))?;
    }

    Ok(Trace {
        meta,
        functions,
        counts,
        returns,
        callers,
        events,
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

/// Reads the file, tracking the position and the current section for errors.
struct Reader<'p, R> {
    r: R,
    path: &'p Path,
    pos: u64,
    /// The file's size on disk.
    actual: u64,
    /// The size the preamble claims (unbounded until it is read).
    declared: u64,
    section: Section,
}

impl<R: Read> Reader<'_, R> {
    fn truncated(&self) -> TraceFileError {
        TraceFileError::Truncated {
            path: self.path.to_path_buf(),
            section: self.section,
        }
    }

    fn corrupt(&self, detail: String) -> TraceFileError {
        TraceFileError::Corrupt {
            path: self.path.to_path_buf(),
            section: self.section,
            detail,
        }
    }

    /// Checks that `n` more bytes, claimed by a length field for `what`,
    /// exist: past the declared length it is corruption, past the actual end
    /// of the file truncation. Called before allocating for them.
    fn need(&self, n: u64, what: &str) -> Result<(), TraceFileError> {
        let left = self.declared - self.pos;
        if n > left {
            return Err(self.corrupt(format!(
                "{what} would take {n} bytes but only {left} remain"
            )));
        }
        if self.pos + n > self.actual {
            return Err(self.truncated());
        }
        Ok(())
    }

    fn bytes(&mut self, buf: &mut [u8]) -> Result<(), TraceFileError> {
        self.need(buf.len() as u64, "a field")?;
        self.r.read_exact(buf).map_err(|source| {
            if source.kind() == io::ErrorKind::UnexpectedEof {
                self.truncated()
            } else {
                TraceFileError::Read {
                    path: self.path.to_path_buf(),
                    source,
                }
            }
        })?;
        self.pos += buf.len() as u64;
        Ok(())
    }

    fn u8(&mut self) -> Result<u8, TraceFileError> {
        let mut b = [0u8; 1];
        self.bytes(&mut b)?;
        Ok(b[0])
    }

    fn u32(&mut self) -> Result<u32, TraceFileError> {
        let mut b = [0u8; 4];
        self.bytes(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    fn u64(&mut self) -> Result<u64, TraceFileError> {
        let mut b = [0u8; 8];
        self.bytes(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    fn string(&mut self, what: &str) -> Result<String, TraceFileError> {
        let len = self.u32()?;
        self.need(len as u64, what)?;
        // Within the file, but a sparse file's zeros must not cost GiBs.
        if len > MAX_STRING {
            return Err(self.corrupt(format!("{what} is {len} bytes long (at most {MAX_STRING})")));
        }
        let mut b = vec![0u8; len as usize];
        self.bytes(&mut b)?;
        String::from_utf8(b).map_err(|_| self.corrupt(format!("{what} is not valid UTF-8")))
    }

    /// A `rows` x `cols` matrix of u64 (row and column counts read first
    /// and checked against the expected ones).
    fn matrix(
        &mut self,
        want_rows: usize,
        want_cols: usize,
        what: &str,
    ) -> Result<Vec<Vec<u64>>, TraceFileError> {
        let rows = self.u32()?;
        let cols = self.u32()?;
        if rows as usize != want_rows || cols as usize != want_cols {
            return Err(self.corrupt(format!(
                "{what} are {rows} x {cols} but the trace has {want_rows} functions x {want_cols} vCPUs"
            )));
        }
        let size = (rows as u64).saturating_mul(cols as u64).saturating_mul(8);
        self.need(size, &format!("the {what}"))?;
        // Sized only once a row is known to fit in the file.
        let mut row_bytes = if rows > 0 {
            vec![0u8; cols as usize * 8]
        } else {
            Vec::new()
        };
        let mut m = Vec::with_capacity(rows as usize);
        for _ in 0..rows {
            self.bytes(&mut row_bytes)?;
            m.push(
                row_bytes
                    .chunks_exact(8)
                    .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
                    .collect(),
            );
        }
        Ok(m)
    }

    fn syms(&mut self, what: &str) -> Result<Vec<Symbol>, TraceFileError> {
        let n = self.u32()?;
        self.need(n as u64 * MIN_SYM_SIZE, &format!("{n} {what}"))?;
        // Grown as read, like the events.
        let mut syms = Vec::with_capacity((n as usize).min(EVENT_CHUNK));
        for i in 0..n {
            let name = self.string("a symbol name")?;
            if name.is_empty() {
                return Err(self.corrupt(format!("{what} {i} has an empty name")));
            }
            let addr = self.u64()?;
            let size = self.u64()?;
            syms.push(Symbol { name, addr, size });
        }
        Ok(syms)
    }
}
