//! Writing a trace file (see the format in the parent module).

use std::io::{self, BufWriter, Write};
use std::path::Path;

use super::encode::encode;
use super::header::put_body;
use super::stream::{self, TAG_END, TAG_FOOT, TAG_HEAD};
use super::{
    check, TraceFileError, DATA_VERSION, EVENT_CHUNK, EVENT_SIZE, IO_BUFFER, MAGIC, PREAMBLE_SIZE,
    VERSION,
};
use crate::trace::model::Trace;
use crate::trace::output_path;

/// Writes `trace` to `path` by the rules of [`crate::trace::output_path`]:
/// atomically over a regular file or a new path (a temporary file in the
/// same directory, renamed over it), into a character device, never over
/// anything else. Version 4, or a data file (`DATA_VERSION`) when the
/// trace has guest tasks, arguments, return values, prototypes, kernel
/// stacks or its command line to keep (see the parent module).
pub fn save(trace: &Trace, path: &Path) -> Result<(), TraceFileError> {
    check(trace).map_err(|(section, detail)| TraceFileError::Invalid {
        path: path.to_path_buf(),
        detail: format!("{section}: {detail}"),
    })?;
    output_path::write(path, |w| match needs_blocks(trace) {
        false => write_to(trace, w),
        true => write_blocks(trace, w),
    })
    .map(|_| ())
    .map_err(|source| TraceFileError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// Whether `trace` has what only data files (version 8 on) keep: guest
/// tasks, values, stacks, the command line.
fn needs_blocks(trace: &Trace) -> bool {
    let m = &trace.meta;
    !trace.stacks.is_empty()
        || !m.stacks.is_empty()
        || !m.stack_funcs.is_empty()
        || !trace.tasks.is_empty()
        || !m.tasks.is_empty()
        || !trace.args.is_empty()
        || !trace.prototypes.is_empty()
        || m.args
        || m.retval
        || trace.events.iter().any(|e| e.data != 0)
        || !m.cmdline.is_empty()
        || !trace.fields.is_empty()
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

/// A data file (`DATA_VERSION`) in one go: `HEAD` and `FOOT` both the whole
/// trace's body, its tasks, its arguments, its stacks, its events.
fn write_blocks(trace: &Trace, out: &mut dyn Write) -> io::Result<()> {
    let mut w = BufWriter::with_capacity(IO_BUFFER, out);
    w.write_all(MAGIC)?;
    w.write_all(&DATA_VERSION.to_le_bytes())?;
    w.write_all(&0u64.to_le_bytes())?;
    let mut body = Vec::new();
    put_body(trace, DATA_VERSION, &mut body)?;
    w.write_all(&stream::frame(TAG_HEAD, &body)?)?;
    for (_, payload) in stream::task_payloads(0, &trace.tasks)? {
        w.write_all(&stream::frame(stream::TAG_TASKS, &payload)?)?;
    }
    for (_, payload) in stream::args_payloads(0, &trace.args) {
        w.write_all(&stream::frame(stream::TAG_ARGS, &payload)?)?;
    }
    let values = trace.fields.values.iter();
    let values = values.map(|(id, v)| (*id, v.as_slice()));
    for payload in super::fields::fields_payloads(values)? {
        w.write_all(&stream::frame(super::fields::TAG_FIELDS, &payload)?)?;
    }
    for (_, payload) in stream::stack_payloads(0, &trace.stacks)? {
        w.write_all(&stream::frame(stream::TAG_STACKS, &payload)?)?;
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
