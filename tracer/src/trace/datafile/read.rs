//! Reading a trace file back, checking every rule of the format (see the
//! parent module).

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;

use super::body::{check_new_events, decode, read_body, Body, Named};
use super::reader::Reader;
use super::{
    Section, TraceFileError, EVENT_CHUNK, EVENT_SIZE, EVENT_SIZE_V2, IO_BUFFER, MAGIC,
    PREAMBLE_SIZE, VERSION, VERSION_1, VERSION_10, VERSION_11, VERSION_12, VERSION_13, VERSION_14,
    VERSION_15, VERSION_2, VERSION_3, VERSION_5, VERSION_6, VERSION_7, VERSION_8, VERSION_9,
};
use crate::trace::model::{Event, Trace};

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

    let version = read_version(&mut r)?;
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

    let events = read_events(&mut r, &body, version, declared)?;
    // Versions 1 to 4 have no tasks nor arguments.
    body.with_events(events, Named::default())
        .map_err(|d| r.corrupt(d))
}

/// The preamble's magic and version (the file is opened at its start).
fn read_version<R: Read>(r: &mut Reader<'_, R>) -> Result<u32, TraceFileError> {
    let (path, actual) = (r.path, r.actual);
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
        VERSION_1, VERSION_2, VERSION_3, VERSION, VERSION_5, VERSION_6, VERSION_7, VERSION_8,
        VERSION_9, VERSION_10, VERSION_11, VERSION_12, VERSION_13, VERSION_14, VERSION_15,
    ]
    .contains(&version)
    {
        return Err(TraceFileError::UnsupportedVersion {
            path: path.to_path_buf(),
            version,
        });
    }
    Ok(version)
}

/// The events of a file of versions 1 to 4: they run to its end
/// (`declared`).
fn read_events<R: Read>(
    r: &mut Reader<'_, R>,
    body: &Body,
    version: u32,
    declared: u64,
) -> Result<Vec<Event>, TraceFileError> {
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
        check_new_events(&events, first, body, &Named::default()).map_err(|d| r.corrupt(d))?;
    }
    if r.pos != declared {
        return Err(r.corrupt(format!(
            "{} bytes after the last event (file length {declared})",
            declared - r.pos
        )));
    }
    Ok(events)
}
