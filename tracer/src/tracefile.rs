//! Saved traces: `vmtrace ... -o FILE` writes one, `vmtrace report -i FILE`
//! reads it back. The file is self-contained (no vmlinux needed to read it).
//!
//! # Format, version 1
//!
//! All integers are unsigned, little-endian, with no padding or alignment
//! anywhere. Two composite types are used:
//!
//! - `str`: `u32` byte length `n`, then `n` bytes of UTF-8 (no terminator).
//! - `sym`: `str` name, `u64` address, `u64` size in bytes.
//!
//! The file is, in this order:
//!
//! | Section   | Field                | Type        | Notes                                                   |
//! |-----------|----------------------|-------------|---------------------------------------------------------|
//! | preamble  | magic                | 8 bytes     | `VMTRACE\0` (`56 4d 54 52 41 43 45 00`)                 |
//! |           | version              | `u32`       | `1`                                                     |
//! |           | file_len             | `u64`       | size of the whole file in bytes, these 20 included      |
//! | header    | kernel               | `str`       | the kernel file the guest booted                        |
//! |           | has_build_id         | `u8`        | `0` or `1`                                              |
//! |           | build_id             | `str`       | only if `has_build_id == 1`; lower-case hex             |
//! |           | cpus                 | `u32`       | number of vCPUs                                         |
//! |           | attach_ns            | `u64`       | host `CLOCK_MONOTONIC` at attach, ns                    |
//! |           | detach_ns            | `u64`       | host `CLOCK_MONOTONIC` at detach, ns                    |
//! |           | sites_patched        | `u64`       |                                                         |
//! |           | sites_skipped_init   | `u64`       |                                                         |
//! |           | sites_skipped_other  | `u64`       |                                                         |
//! |           | attach_window_ns     | `u64`       | the attach's stop-the-world window                      |
//! |           | attach_latency_ns    | `u64`       |                                                         |
//! |           | events_total         | `u64`       | all calls counted, stored or not                        |
//! |           | events_dropped       | `u64`       | calls counted but not stored (over `--max-events`)      |
//! |           | parent_unreadable    | `u64`       | calls whose return address could not be read           |
//! |           | stop_reason          | `str`       |                                                         |
//! | functions | nfunc                | `u32`       | the traced functions                                    |
//! |           | functions            | `sym` × nfunc | an event's `func` indexes this list                   |
//! | counts    | rows                 | `u32`       | must equal `nfunc`                                      |
//! |           | cols                 | `u32`       | must equal `cpus`                                       |
//! |           | counts               | `u64` × rows × cols | row-major: calls of function `f` on vCPU `c` at index `f * cols + c` |
//! | callers   | ncallers             | `u32`       | functions the events' return addresses fall in          |
//! |           | callers              | `sym` × ncallers | sorted by address, ascending                       |
//! | events    | nevents              | `u64`       | stored events                                           |
//! |           | events               | 24 bytes × nevents | records, sorted by time (see below)              |
//!
//! An event record is 24 bytes: `u64 ts_ns` (host `CLOCK_MONOTONIC`, ns),
//! `u64 parent` (the return address at `[RSP]` on entry, `0` if unreadable),
//! `u32 func` (index into the functions), `u32 cpu` (vCPU number).
//!
//! The file ends right after the last event: its size is `file_len`.
//!
//! A reader must reject a file whose magic differs, whose version it does not
//! know, that is shorter than `file_len` (truncated), or that breaks any rule
//! above (corrupt): a length running past `file_len`, trailing bytes,
//! `has_build_id` not 0 or 1, invalid UTF-8, counts dimensions other than
//! `nfunc` × `cpus`, callers out of address order, an event whose `func` is not
//! below `nfunc` or whose `cpu` is not below `cpus`. Because `file_len` is in
//! the preamble, a length claiming more bytes than `file_len` leaves is
//! corruption, while one that fits `file_len` but not the actual file is
//! truncation.
//!
//! Writers write a temporary file in the destination's directory and rename it
//! over the destination, so an interrupted save never leaves a partial trace
//! under the final name.

use std::fmt;
use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::trace::{Event, FuncSym, Trace, TraceMeta};

/// The first 8 bytes of every trace file.
pub const MAGIC: &[u8; 8] = b"VMTRACE\0";
/// The format version this module writes and reads.
pub const VERSION: u32 = 1;
/// Size of one event record in the file.
pub const EVENT_SIZE: usize = 24;
/// Size of the preamble: magic, version, file length.
const PREAMBLE_SIZE: u64 = 8 + 4 + 8;
/// Smallest encoded `sym`: an empty name, address and size.
const MIN_SYM_SIZE: u64 = 4 + 8 + 8;
/// Events converted per bulk read or write.
const EVENT_CHUNK: usize = 1 << 16;
/// Buffer size of the file reader and writer.
const IO_BUFFER: usize = 1 << 20;

/// A part of the file, named in errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Section {
    Preamble,
    Header,
    Functions,
    Counts,
    Callers,
    Events,
}

impl fmt::Display for Section {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Section::Preamble => "preamble",
            Section::Header => "header",
            Section::Functions => "functions",
            Section::Counts => "counts",
            Section::Callers => "callers",
            Section::Events => "events",
        })
    }
}

/// Why a trace could not be saved or loaded. Every message is one line and
/// names the file.
#[derive(Debug, thiserror::Error)]
pub enum TraceFileError {
    #[error("cannot open trace file {}: {source}", path.display())]
    Open { path: PathBuf, source: io::Error },
    #[error("cannot read trace file {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("cannot write trace file {}: {source}", path.display())]
    Write { path: PathBuf, source: io::Error },
    #[error("{} is not a vmtrace trace (bad magic); expected a file saved with vmtrace -o", path.display())]
    BadMagic { path: PathBuf },
    #[error("{}: unsupported trace format version {version} (this vmtrace reads version {VERSION})", path.display())]
    UnsupportedVersion { path: PathBuf, version: u32 },
    #[error("{}: truncated trace file (ends inside the {section} section); was the save interrupted?", path.display())]
    Truncated { path: PathBuf, section: Section },
    #[error("{}: corrupt trace file ({section} section): {detail}", path.display())]
    Corrupt {
        path: PathBuf,
        section: Section,
        detail: String,
    },
    #[error("cannot save trace to {}: {detail}", path.display())]
    Invalid { path: PathBuf, detail: String },
}

impl TraceFileError {
    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            TraceFileError::Open { path, .. }
            | TraceFileError::Read { path, .. }
            | TraceFileError::Write { path, .. }
            | TraceFileError::BadMagic { path }
            | TraceFileError::UnsupportedVersion { path, .. }
            | TraceFileError::Truncated { path, .. }
            | TraceFileError::Corrupt { path, .. }
            | TraceFileError::Invalid { path, .. } => path,
        }
    }
}

/// Checks the rules of the format that a `Trace` could break; `Err` names the
/// section and what is wrong.
fn check(trace: &Trace) -> Result<(), (Section, String)> {
    let nfunc = trace.functions.len();
    let cpus = trace.meta.cpus as usize;
    if u32::try_from(nfunc).is_err() {
        return Err((
            Section::Functions,
            format!("{nfunc} functions (max {})", u32::MAX),
        ));
    }
    if u32::try_from(trace.callers.len()).is_err() {
        return Err((
            Section::Callers,
            format!("{} callers (max {})", trace.callers.len(), u32::MAX),
        ));
    }
    if trace.counts.len() != nfunc {
        return Err((
            Section::Counts,
            format!(
                "{} rows of counts for {nfunc} functions",
                trace.counts.len()
            ),
        ));
    }
    if let Some((f, row)) = trace
        .counts
        .iter()
        .enumerate()
        .find(|(_, r)| r.len() != cpus)
    {
        return Err((
            Section::Counts,
            format!(
                "function {f} has counts for {} vCPUs, not {cpus}",
                row.len()
            ),
        ));
    }
    if let Some(i) = trace.callers.windows(2).position(|w| w[0].addr > w[1].addr) {
        return Err((
            Section::Callers,
            format!("callers {i} and {} are out of address order", i + 1),
        ));
    }
    check_events(&trace.events, 0, nfunc, cpus).map_err(|d| (Section::Events, d))
}

/// Checks that events (the first being number `first`) index existing functions and vCPUs.
fn check_events(events: &[Event], first: usize, nfunc: usize, cpus: usize) -> Result<(), String> {
    for (i, e) in events.iter().enumerate() {
        if e.func as usize >= nfunc {
            return Err(format!(
                "event {} has function index {} but there are {nfunc} functions",
                first + i,
                e.func
            ));
        }
        if e.cpu as usize >= cpus {
            return Err(format!(
                "event {} is on vCPU {} but the trace has {cpus} vCPUs",
                first + i,
                e.cpu
            ));
        }
    }
    Ok(())
}

/// Writes `trace` to `path` (atomically: a temporary file in the same
/// directory, renamed over `path`).
pub fn save(trace: &Trace, path: &Path) -> Result<(), TraceFileError> {
    check(trace).map_err(|(section, detail)| TraceFileError::Invalid {
        path: path.to_path_buf(),
        detail: format!("{section}: {detail}"),
    })?;
    let write_err = |source| TraceFileError::Write {
        path: path.to_path_buf(),
        source,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().ok_or_else(|| {
        write_err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a file name",
        ))
    })?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp{}", std::process::id()));
    let tmp = dir.join(tmp_name);
    let file = File::create(&tmp).map_err(write_err)?;
    let result = write_to(trace, file).and_then(|()| fs::rename(&tmp, path));
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(write_err(e));
    }
    Ok(())
}

/// Writes the whole file to `file`. Like perf and trace-cmd, it does not
/// fsync: the rename protects against interrupted saves, not power loss.
fn write_to(trace: &Trace, file: File) -> io::Result<()> {
    let mut w = BufWriter::with_capacity(IO_BUFFER, file);
    let m = &trace.meta;
    w.write_all(MAGIC)?;
    w.write_all(&VERSION.to_le_bytes())?;
    w.write_all(&0u64.to_le_bytes())?; // file_len, patched below
    put_str(&mut w, &m.kernel)?;
    match &m.build_id {
        Some(b) => {
            w.write_all(&[1])?;
            put_str(&mut w, b)?;
        }
        None => w.write_all(&[0])?,
    }
    w.write_all(&m.cpus.to_le_bytes())?;
    for v in [
        m.attach_ns,
        m.detach_ns,
        m.sites_patched,
        m.sites_skipped_init,
        m.sites_skipped_other,
        m.attach_window_ns,
        m.attach_latency_ns,
        m.events_total,
        m.events_dropped,
        m.parent_unreadable,
    ] {
        w.write_all(&v.to_le_bytes())?;
    }
    put_str(&mut w, &m.stop_reason)?;

    put_syms(&mut w, &trace.functions)?;

    w.write_all(&(trace.counts.len() as u32).to_le_bytes())?;
    w.write_all(&m.cpus.to_le_bytes())?;
    for row in &trace.counts {
        let bytes: Vec<u8> = row.iter().flat_map(|c| c.to_le_bytes()).collect();
        w.write_all(&bytes)?;
    }

    put_syms(&mut w, &trace.callers)?;

    w.write_all(&(trace.events.len() as u64).to_le_bytes())?;
    let mut buf = vec![0u8; EVENT_CHUNK.min(trace.events.len()) * EVENT_SIZE];
    for chunk in trace.events.chunks(EVENT_CHUNK) {
        let bytes = &mut buf[..chunk.len() * EVENT_SIZE];
        for (b, e) in bytes.chunks_exact_mut(EVENT_SIZE).zip(chunk) {
            b[0..8].copy_from_slice(&e.ts_ns.to_le_bytes());
            b[8..16].copy_from_slice(&e.parent.to_le_bytes());
            b[16..20].copy_from_slice(&e.func.to_le_bytes());
            b[20..24].copy_from_slice(&e.cpu.to_le_bytes());
        }
        w.write_all(bytes)?;
    }

    let mut file = w.into_inner().map_err(|e| e.into_error())?;
    let len = file.stream_position()?;
    file.seek(SeekFrom::Start(12))?;
    file.write_all(&len.to_le_bytes())
}

fn put_str(w: &mut impl Write, s: &str) -> io::Result<()> {
    let len = u32::try_from(s.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "string longer than 4 GiB"))?;
    w.write_all(&len.to_le_bytes())?;
    w.write_all(s.as_bytes())
}

fn put_syms(w: &mut impl Write, syms: &[FuncSym]) -> io::Result<()> {
    w.write_all(&(syms.len() as u32).to_le_bytes())?;
    for s in syms {
        put_str(w, &s.name)?;
        w.write_all(&s.addr.to_le_bytes())?;
        w.write_all(&s.size.to_le_bytes())?;
    }
    Ok(())
}

/// Reads a trace saved by `save`.
pub fn load(path: &Path) -> Result<Trace, TraceFileError> {
    let file = File::open(path).map_err(|source| TraceFileError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let actual = file
        .metadata()
        .map_err(|source| TraceFileError::Read {
            path: path.to_path_buf(),
            source,
        })?
        .len();
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
    if version != VERSION {
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
    };

    r.section = Section::Functions;
    let functions = r.syms("functions")?;

    r.section = Section::Counts;
    let rows = r.u32()?;
    let cols = r.u32()?;
    if rows as usize != functions.len() || cols != cpus {
        return Err(r.corrupt(format!(
            "counts are {rows} x {cols} but the trace has {} functions x {cpus} vCPUs",
            functions.len()
        )));
    }
    let size = (rows as u64).saturating_mul(cols as u64).saturating_mul(8);
    r.need(size, "the counts")?;
    let mut counts = Vec::with_capacity(rows as usize);
    // Sized only once a row is known to fit in the file.
    let mut row_bytes = if rows > 0 {
        vec![0u8; cols as usize * 8]
    } else {
        Vec::new()
    };
    for _ in 0..rows {
        r.bytes(&mut row_bytes)?;
        counts.push(
            row_bytes
                .chunks_exact(8)
                .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
                .collect(),
        );
    }

    r.section = Section::Callers;
    let callers = r.syms("callers")?;
    if let Some(i) = callers.windows(2).position(|w| w[0].addr > w[1].addr) {
        return Err(r.corrupt(format!(
            "callers {i} and {} are out of address order",
            i + 1
        )));
    }

    r.section = Section::Events;
    let n = r.u64()?;
    let bytes = n
        .checked_mul(EVENT_SIZE as u64)
        .ok_or_else(|| r.corrupt(format!("absurd event count {n}")))?;
    r.need(bytes, &format!("{n} events"))?;
    let n = n as usize; // fits: n * 24 bytes fit in the file
    let mut events = Vec::with_capacity(n);
    let mut buf = vec![0u8; EVENT_CHUNK.min(n) * EVENT_SIZE];
    while events.len() < n {
        let k = EVENT_CHUNK.min(n - events.len());
        let chunk = &mut buf[..k * EVENT_SIZE];
        r.bytes(chunk)?;
        let first = events.len();
        events.extend(chunk.chunks_exact(EVENT_SIZE).map(|b| Event {
            ts_ns: u64::from_le_bytes(b[0..8].try_into().unwrap()),
            parent: u64::from_le_bytes(b[8..16].try_into().unwrap()),
            func: u32::from_le_bytes(b[16..20].try_into().unwrap()),
            cpu: u32::from_le_bytes(b[20..24].try_into().unwrap()),
        }));
        check_events(&events[first..], first, functions.len(), cpus as usize)
            .map_err(|d| r.corrupt(d))?;
    }
    if r.pos != declared {
        return Err(r.corrupt(format!(
            "{} bytes after the last event (file length {declared})",
            declared - r.pos
        )));
    }

    Ok(Trace {
        meta,
        functions,
        counts,
        callers,
        events,
    })
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
        let mut b = vec![0u8; len as usize];
        self.bytes(&mut b)?;
        String::from_utf8(b).map_err(|_| self.corrupt(format!("{what} is not valid UTF-8")))
    }

    fn syms(&mut self, what: &str) -> Result<Vec<FuncSym>, TraceFileError> {
        let n = self.u32()?;
        self.need(n as u64 * MIN_SYM_SIZE, &format!("{n} {what}"))?;
        let mut syms = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let name = self.string("a symbol name")?;
            let addr = self.u64()?;
            let size = self.u64()?;
            syms.push(FuncSym { name, addr, size });
        }
        Ok(syms)
    }
}
