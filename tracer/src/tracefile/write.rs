//! Writing a trace file (see the format in the parent module).

use std::fs::{self, File};
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::path::Path;

use super::{check, TraceFileError, EVENT_CHUNK, EVENT_SIZE, IO_BUFFER, MAGIC, VERSION};
use crate::model::Trace;
use crate::symbols::Symbol;

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
    put_str(&mut w, &m.mode)?;
    w.write_all(&m.trap_exits.to_le_bytes())?;

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

fn put_syms(w: &mut impl Write, syms: &[Symbol]) -> io::Result<()> {
    w.write_all(&(syms.len() as u32).to_le_bytes())?;
    for s in syms {
        put_str(w, &s.name)?;
        w.write_all(&s.addr.to_le_bytes())?;
        w.write_all(&s.size.to_le_bytes())?;
    }
    Ok(())
}
