//! Writing a trace file (see the format in the parent module).

use std::io::{self, BufWriter, Write};
use std::path::Path;

use super::body::{VALUES_ARGS, VALUES_RETVAL};
use super::protos::put_prototypes;
use super::stream::{self, TAG_END, TAG_FOOT, TAG_HEAD};
use super::{
    check, TraceFileError, EVENT_CHUNK, EVENT_SIZE, EVENT_SIZE_V8, IO_BUFFER, MAGIC, PREAMBLE_SIZE,
    VERSION, VERSION_5, VERSION_6, VERSION_7, VERSION_8,
};
use crate::kernel::symbols::Symbol;
use crate::trace::model::{Event, Trace};
use crate::trace::output_path;

/// Writes `trace` to `path` by the rules of [`crate::trace::output_path`]:
/// atomically over a regular file or a new path (a temporary file in the
/// same directory, renamed over it), into a character device, never over
/// anything else. Version 4, or a version-8 data file when the trace has
/// guest tasks, arguments, return values or prototypes to keep (see the
/// parent module).
pub fn save(trace: &Trace, path: &Path) -> Result<(), TraceFileError> {
    check(trace).map_err(|(section, detail)| TraceFileError::Invalid {
        path: path.to_path_buf(),
        detail: format!("{section}: {detail}"),
    })?;
    output_path::write(path, |w| match needs_v8(trace) {
        false => write_to(trace, w),
        true => write_blocks(trace, w),
    })
    .map(|_| ())
    .map_err(|source| TraceFileError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// Whether `trace` has what only version 8 keeps: guest tasks, values.
fn needs_v8(trace: &Trace) -> bool {
    let m = &trace.meta;
    !trace.tasks.is_empty()
        || !m.tasks.is_empty()
        || !trace.args.is_empty()
        || !trace.prototypes.is_empty()
        || m.args
        || m.retval
        || trace.events.iter().any(|e| e.data != 0)
}

/// Writes the whole file to `out`, front to back (no seeking, so a device
/// can take it too). Like perf and trace-cmd, it does not fsync: the rename
/// protects against interrupted saves, not power loss.
fn write_to(trace: &Trace, out: &mut dyn Write) -> io::Result<()> {
    // Everything between the preamble and the events, so that the preamble's
    // file_len is known before anything is written.
    let mut body = Vec::new();
    put_body(trace, VERSION, &mut body)?;
    body.extend_from_slice(&(trace.events.len() as u64).to_le_bytes());

    let file_len = PREAMBLE_SIZE + body.len() as u64 + (trace.events.len() * EVENT_SIZE) as u64;
    let mut w = BufWriter::with_capacity(IO_BUFFER, out);
    w.write_all(MAGIC)?;
    w.write_all(&VERSION.to_le_bytes())?;
    w.write_all(&file_len.to_le_bytes())?;
    w.write_all(&body)?;
    let mut buf = vec![0u8; EVENT_CHUNK.min(trace.events.len()) * EVENT_SIZE];
    for chunk in trace.events.chunks(EVENT_CHUNK) {
        let bytes = &mut buf[..chunk.len() * EVENT_SIZE];
        for (b, e) in bytes.chunks_exact_mut(EVENT_SIZE).zip(chunk) {
            encode(e, b);
        }
        w.write_all(bytes)?;
    }
    w.flush()
}

/// A version-8 data file in one go: `HEAD` and `FOOT` both the whole
/// trace's body, its tasks, its arguments, its events.
fn write_blocks(trace: &Trace, out: &mut dyn Write) -> io::Result<()> {
    let mut w = BufWriter::with_capacity(IO_BUFFER, out);
    w.write_all(MAGIC)?;
    w.write_all(&VERSION_8.to_le_bytes())?;
    w.write_all(&0u64.to_le_bytes())?;
    let mut body = Vec::new();
    put_body(trace, VERSION_8, &mut body)?;
    w.write_all(&stream::frame(TAG_HEAD, &body)?)?;
    for (_, payload) in stream::task_payloads(0, &trace.tasks)? {
        w.write_all(&stream::frame(stream::TAG_TASKS, &payload)?)?;
    }
    for (_, payload) in stream::args_payloads(0, &trace.args) {
        w.write_all(&stream::frame(stream::TAG_ARGS, &payload)?)?;
    }
    let mut payload = Vec::new();
    for chunk in trace.events.chunks(stream::MAX_BLOCK_EVENTS) {
        stream::events_payload(chunk, &mut payload);
        w.write_all(&stream::frame(stream::TAG_EVENTS, &payload)?)?;
    }
    w.write_all(&stream::frame(TAG_FOOT, &body)?)?;
    w.write_all(&stream::frame(TAG_END, &[])?)?;
    w.flush()
}

/// The body of a file of `version` (4, or 5 to 8 for a data file's `HEAD`
/// and `FOOT` blocks): the header, functions, counts, returns and callers.
pub(super) fn put_body(trace: &Trace, version: u32, w: &mut Vec<u8>) -> io::Result<()> {
    let m = &trace.meta;
    put_str(w, &m.kernel)?;
    match &m.build_id {
        Some(b) => {
            w.write_all(&[1])?;
            put_str(w, b)?;
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
    put_str(w, &m.stop_reason)?;
    put_str(w, &m.mode)?;
    w.write_all(&m.trap_exits.to_le_bytes())?;
    w.write_all(&[u8::from(m.graph)])?;
    for v in [m.returns_dropped, m.unhooked, m.tsc_khz] {
        w.write_all(&v.to_le_bytes())?;
    }
    put_str(w, &m.symbols)?;
    if version >= VERSION_5 {
        w.write_all(&(m.lost.len() as u32).to_le_bytes())?;
        for v in &m.lost {
            w.write_all(&v.to_le_bytes())?;
        }
        w.write_all(&[u8::from(m.overwrite)])?;
        put_str(w, &m.rejected_sites)?;
        match m.kernel_offset {
            Some((virt, phys)) => {
                w.write_all(&[1])?;
                w.write_all(&virt.to_le_bytes())?;
                w.write_all(&phys.to_le_bytes())?;
            }
            None => w.write_all(&[0])?,
        }
    }
    if version >= VERSION_6 {
        w.write_all(&m.unfinished.to_le_bytes())?;
    }
    if version >= VERSION_7 {
        put_str(w, &m.vmm)?;
    }
    if version >= VERSION_8 {
        put_str(w, &m.tasks)?;
        w.write_all(&m.filtered.to_le_bytes())?;
        let values =
            if m.args { VALUES_ARGS } else { 0 } | if m.retval { VALUES_RETVAL } else { 0 };
        w.write_all(&[values])?;
    }

    put_syms(w, &trace.functions)?;

    w.write_all(&(trace.counts.len() as u32).to_le_bytes())?;
    w.write_all(&m.cpus.to_le_bytes())?;
    for row in &trace.counts {
        for c in row {
            w.write_all(&c.to_le_bytes())?;
        }
    }

    let cols = if m.graph { m.cpus } else { 0 };
    w.write_all(&(trace.returns.len() as u32).to_le_bytes())?;
    w.write_all(&cols.to_le_bytes())?;
    for row in &trace.returns {
        for c in row {
            w.write_all(&c.to_le_bytes())?;
        }
    }

    put_syms(w, &trace.callers)?;
    if version >= VERSION_8 {
        put_prototypes(w, &trace.prototypes)?;
    }
    Ok(())
}

/// One event record into `b`: `EVENT_SIZE` bytes, or `EVENT_SIZE_V8`
/// with its task and data.
pub(super) fn encode(e: &Event, b: &mut [u8]) {
    b[0..8].copy_from_slice(&e.ts_ns.to_le_bytes());
    b[8..16].copy_from_slice(&e.parent.to_le_bytes());
    b[16..24].copy_from_slice(&e.slot.to_le_bytes());
    b[24..28].copy_from_slice(&e.func.to_le_bytes());
    b[28..32].copy_from_slice(&e.cpu.to_le_bytes());
    if b.len() == EVENT_SIZE_V8 {
        b[32..36].copy_from_slice(&e.task.to_le_bytes());
        b[36..44].copy_from_slice(&e.data.to_le_bytes());
    }
}

pub(super) fn put_str(w: &mut impl Write, s: &str) -> io::Result<()> {
    let len = u32::try_from(s.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "string longer than 4 GiB"))?;
    w.write_all(&len.to_le_bytes())?;
    w.write_all(s.as_bytes())
}

fn put_syms(w: &mut impl Write, syms: &[Symbol]) -> io::Result<()> {
    w.write_all(&(syms.len() as u32).to_le_bytes())?;
    for s in syms {
        put_str(w, &s.name)?;
        w.write_all(&s.addr.to_le_bytes())?;
        w.write_all(&s.size.to_le_bytes())?;
    }
    Ok(())
}
