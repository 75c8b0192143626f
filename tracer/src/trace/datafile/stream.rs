//! Writing the data file while the guest runs (format `DATA_VERSION`, see the
//! parent module): a `HEAD` block before the run, `EVTS` blocks as events
//! arrive, each after a `TASK` block with the guest tasks seen since the
//! last one (the caller's `write_tasks`), an `ARGS` block with the
//! arguments recorded since (`write_args`) and a `STAK` block with the
//! kernel stacks unwound since (`write_stacks`), `FOOT` and `END` when it
//! stops. Every block goes out in one
//! `write`, with its checksum, straight to the file (no user-space buffer
//! in between): whatever kills vmtrace, the file holds every block written
//! before, and a reader stops at the last complete one.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::encode::{encode, put_str};
use super::header::put_body;
use super::{TraceFileError, DATA_VERSION, EVENT_SIZE_V9, MAGIC};
use crate::kernel::symbols::Symbol;
use crate::trace::fields::FieldValue;
use crate::trace::model::{Event, Stack, Task, Trace, ARG_REGS};
use crate::trace::output_path::{self, Target};

/// Block tags (4 ASCII bytes read as a little-endian `u32`).
pub const TAG_HEAD: [u8; 4] = *b"HEAD";
pub const TAG_EVENTS: [u8; 4] = *b"EVTS";
pub const TAG_FOOT: [u8; 4] = *b"FOOT";
pub const TAG_END: [u8; 4] = *b"END\0";
/// Guest tasks (version 8).
pub const TAG_TASKS: [u8; 4] = *b"TASK";
/// Entries' arguments (version 8).
pub const TAG_ARGS: [u8; 4] = *b"ARGS";
/// Kernel stacks (version 9).
pub const TAG_STACKS: [u8; 4] = *b"STAK";
/// The largest block payload: bounds what a corrupt length makes a reader
/// allocate. A `HEAD` lists every kernel function (Linux 6.12 defconfig:
/// ~60,000, about 3 MiB); `EVTS` blocks are a recorder's batch.
pub const MAX_BLOCK: u32 = 64 << 20;
/// Tag and length before the payload, checksum after it.
pub const BLOCK_OVERHEAD: usize = 4 + 4 + 4;
/// The most events one `EVTS` block holds (its `u32` count first).
pub const MAX_BLOCK_EVENTS: usize = (MAX_BLOCK as usize - 4) / EVENT_SIZE_V9;
/// Bytes of a `TASK` block's entry besides its comm: pid, tgid, the
/// comm's length.
pub const TASK_FIXED: usize = 4 + 4 + 4;
/// Bytes of one call's arguments in an `ARGS` block: six `u64`.
pub const ARGS_SIZE: usize = ARG_REGS * 8;
/// An `ARGS` block's header: `u64` first, `u32` n.
pub const ARGS_HEADER: usize = 8 + 4;
/// The most calls' arguments one `ARGS` block holds.
pub const MAX_BLOCK_ARGS: usize = (MAX_BLOCK as usize - ARGS_HEADER) / ARGS_SIZE;

/// A data file being written.
#[derive(Debug)]
pub struct DataFile {
    out: File,
    path: PathBuf,
    /// Bytes written so far.
    bytes: u64,
    /// `EVTS` blocks and events written.
    blocks: u64,
    events: u64,
    /// Tasks written (in `TASK` blocks).
    tasks: usize,
    /// Calls' arguments written (in `ARGS` blocks).
    args: usize,
    /// Kernel stacks written (in `STAK` blocks).
    stacks: usize,
    /// Functions named (in `HEAD`, then `FUNC` blocks).
    funcs: usize,
    /// An `EVTS` block being assembled and framed (kept to avoid an
    /// allocation per block).
    buf: Vec<u8>,
}

/// The path checked by `output_path::target` may have been replaced before the
/// open (by a FIFO, whose open would have blocked forever without
/// O_NONBLOCK): what was opened must still be a regular file or a
/// character device; then its writes block again, as a file's do.
fn blocking_file_or_device(f: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileTypeExt;
    let t = f.metadata()?.file_type();
    if !t.is_file() && !t.is_char_device() {
        return Err(io::Error::other(
            "it was replaced by neither a regular file nor a character device while vmtrace opened it",
        ));
    }
    let fd = f.as_raw_fd();
    // SAFETY: fcntl(2) F_GETFL/F_SETFL on a descriptor `f` owns.
    let ok = unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) == 0
    };
    if !ok {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl DataFile {
    /// Creates (or truncates) `path` and writes the preamble. By the output
    /// rules of [`crate::trace::output_path`]: a regular file (a symlink to one
    /// followed) is written in place, since the file must be readable while
    /// the run is cut short (the caller keeps an older file first, as
    /// `FILE.old`); a character device is written into; anything else is
    /// refused.
    pub fn create(path: &Path) -> Result<DataFile, TraceFileError> {
        let err = |source| TraceFileError::Write {
            path: path.to_path_buf(),
            source,
        };
        let out = match output_path::target(path).map_err(err)? {
            Target::File { path: real, .. } => OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(real),
            Target::Device(dev) => OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(dev),
        }
        .map_err(err)?;
        blocking_file_or_device(&out).map_err(err)?;
        let mut f = DataFile {
            out,
            path: path.to_path_buf(),
            bytes: 0,
            blocks: 0,
            events: 0,
            tasks: 0,
            args: 0,
            stacks: 0,
            funcs: 0,
            buf: Vec::new(),
        };
        let mut pre = Vec::with_capacity(20);
        pre.extend_from_slice(MAGIC);
        pre.extend_from_slice(&DATA_VERSION.to_le_bytes());
        // file_len: unknown while the file grows.
        pre.extend_from_slice(&0u64.to_le_bytes());
        f.out.write_all(&pre).map_err(err)?;
        f.bytes = pre.len() as u64;
        Ok(f)
    }

    /// The path it was created with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes written so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Events written so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// Guest tasks written so far: the next task written gets id
    /// `tasks_saved() + 1`.
    pub fn tasks_saved(&self) -> usize {
        self.tasks
    }

    /// The `HEAD` block: `trace` as known before the run (no events), and
    /// its tasks, if it has any yet.
    pub fn head(&mut self, trace: &Trace) -> io::Result<()> {
        self.body(TAG_HEAD, trace)?;
        self.funcs = trace.functions.len();
        self.write_tasks(&trace.tasks)
    }

    /// Functions named so far (`HEAD`'s and those added): the next added
    /// is function `funcs_saved()`.
    pub fn funcs_saved(&self) -> usize {
        self.funcs
    }

    /// A `FUNC` block adding `funcs` (traced functions that came during
    /// the trace: a module first loaded) after those named so far. Call it
    /// before writing events that name them: a reader refuses an event
    /// whose function was not named before it.
    pub fn write_functions(&mut self, funcs: &[Symbol]) -> io::Result<()> {
        if funcs.is_empty() {
            return Ok(());
        }
        let payload = super::added::funcs_payload(self.funcs, funcs)?;
        self.block(super::added::TAG_FUNCS, &payload)?;
        self.funcs += funcs.len();
        Ok(())
    }

    /// `TASK` blocks holding `tasks`, the next ones (ids `tasks_saved() +
    /// 1`...; `session::tasks::TaskTable::since` gives them). Call it
    /// before writing events that name them: a reader refuses an event
    /// whose task was not saved before it.
    pub fn write_tasks(&mut self, tasks: &[Task]) -> io::Result<()> {
        for (n, payload) in task_payloads(self.tasks, tasks)? {
            self.block(TAG_TASKS, &payload)?;
            self.tasks += n;
        }
        Ok(())
    }

    /// Calls' arguments written so far: the next written get ids
    /// `args_saved() + 1`...
    pub fn args_saved(&self) -> usize {
        self.args
    }

    /// `ARGS` blocks holding `args`, the next ones (ids `args_saved() +
    /// 1`...; `session::args::ArgTable::since` gives them). Call it before
    /// writing the entries that name them: a reader refuses an entry whose
    /// arguments were not saved before it.
    pub fn write_args(&mut self, args: &[[u64; ARG_REGS]]) -> io::Result<()> {
        for (n, payload) in args_payloads(self.args, args) {
            self.block(TAG_ARGS, &payload)?;
            self.args += n;
        }
        Ok(())
    }

    /// `FLDS` blocks holding event entries' fields by their arguments id,
    /// after the `ARGS` blocks of those ids: a reader refuses fields of
    /// arguments not saved before them.
    pub fn write_fields(&mut self, fields: &[(u64, Vec<FieldValue>)]) -> io::Result<()> {
        let entries = fields.iter().map(|(id, v)| (*id, v.as_slice()));
        for payload in super::fields::fields_payloads(entries)? {
            self.block(super::fields::TAG_FIELDS, &payload)?;
        }
        Ok(())
    }

    /// Kernel stacks written so far: the next written get ids
    /// `stacks_saved() + 1`...
    pub fn stacks_saved(&self) -> usize {
        self.stacks
    }

    /// `STAK` blocks holding `stacks`, the next ones (ids from
    /// `stacks_saved() + 1`; `session::stacks::StackTable::since` gives
    /// them). Call it before writing the entries that name them: a reader
    /// refuses an entry whose stack was not saved before it.
    pub fn write_stacks(&mut self, stacks: &[Stack]) -> io::Result<()> {
        for (n, payload) in stack_payloads(self.stacks, stacks)? {
            self.block(TAG_STACKS, &payload)?;
            self.stacks += n;
        }
        Ok(())
    }

    /// `EVTS` blocks holding `events` (as many as the block size needs).
    pub fn write_events(&mut self, events: &[Event]) -> io::Result<()> {
        // (No check of the functions: a crafted file (tests/fuzz.rs) names
        // functions out of range through this writer, and the reader must
        // refuse them, as it does.)
        debug_assert!(events.iter().all(|e| e.task as usize <= self.tasks));
        debug_assert!(events.iter().all(|e| e.stack as usize <= self.stacks));
        debug_assert!(events
            .iter()
            .all(|e| e.is_return() || e.data <= self.args as u64));
        debug_assert!(4 + MAX_BLOCK_EVENTS * EVENT_SIZE_V9 <= MAX_BLOCK as usize);
        for chunk in events.chunks(MAX_BLOCK_EVENTS) {
            // The block assembled in place, framed there, and written from
            // there: no copy of the payload into a frame of its own.
            events_block(chunk, &mut self.buf);
            self.out.write_all(&self.buf)?;
            self.bytes += self.buf.len() as u64;
            self.blocks += 1;
            self.events += chunk.len() as u64;
        }
        Ok(())
    }

    /// The `FOOT` block (`trace` as known at the end; its events are not
    /// written again), after the functions added, tasks and stacks of
    /// `trace` not written yet (seen, in no written event), and `END`: the file is complete.
    pub fn finish(&mut self, trace: &Trace) -> io::Result<()> {
        if let Some(rest) = trace.functions.get(self.funcs..) {
            self.write_functions(rest)?;
        }
        if let Some(rest) = trace.tasks.get(self.tasks..) {
            self.write_tasks(rest)?;
        }
        if let Some(rest) = trace.stacks.get(self.stacks..) {
            self.write_stacks(rest)?;
        }
        self.body(TAG_FOOT, trace)?;
        self.block(TAG_END, &[])?;
        self.out.flush()
    }

    fn body(&mut self, tag: [u8; 4], trace: &Trace) -> io::Result<()> {
        let mut payload = Vec::new();
        let bare = Trace {
            events: Vec::new(),
            ..trace.clone()
        };
        put_body(&bare, DATA_VERSION, &mut payload)?;
        self.block(tag, &payload)
    }

    /// One block in one write: tag, length, payload, CRC-32 of all three.
    fn block(&mut self, tag: [u8; 4], payload: &[u8]) -> io::Result<()> {
        let frame = frame(tag, payload)?;
        self.out.write_all(&frame)?;
        self.bytes += frame.len() as u64;
        Ok(())
    }
}

/// A block: tag, length, payload, CRC-32 of all three.
pub(super) fn frame(tag: [u8; 4], payload: &[u8]) -> io::Result<Vec<u8>> {
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|&n| n <= MAX_BLOCK)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a block of {} bytes (at most {MAX_BLOCK})", payload.len()),
            )
        })?;
    let mut frame = Vec::with_capacity(payload.len() + BLOCK_OVERHEAD);
    frame.extend_from_slice(&tag);
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(payload);
    let crc = crc32fast::hash(&frame);
    frame.extend_from_slice(&crc.to_le_bytes());
    Ok(frame)
}

/// A whole `EVTS` block of `events` (at most `MAX_BLOCK_EVENTS`) into
/// `buf`, as `frame` makes one: tag, length, payload, CRC-32 of all three.
fn events_block(events: &[Event], buf: &mut Vec<u8>) {
    const HEAD: usize = 8;
    buf.clear();
    buf.extend_from_slice(&TAG_EVENTS);
    let len = 4 + events.len() * EVENT_SIZE_V9;
    // At most MAX_BLOCK (the chunks' size): it fits a u32.
    buf.extend_from_slice(&(len as u32).to_le_bytes());
    buf.extend_from_slice(&(events.len() as u32).to_le_bytes());
    buf.resize(HEAD + len, 0);
    for (b, e) in buf[HEAD + 4..].chunks_exact_mut(EVENT_SIZE_V9).zip(events) {
        encode(e, b);
    }
    let crc = crc32fast::hash(buf);
    buf.extend_from_slice(&crc.to_le_bytes());
}

/// An `EVTS` block's payload (at most `MAX_BLOCK_EVENTS` events) into
/// `buf`: `u32` n, then n records.
pub(super) fn events_payload(events: &[Event], buf: &mut Vec<u8>) {
    buf.clear();
    buf.extend_from_slice(&(events.len() as u32).to_le_bytes());
    let at = buf.len();
    buf.resize(at + events.len() * EVENT_SIZE_V9, 0);
    for (b, e) in buf[at..].chunks_exact_mut(EVENT_SIZE_V9).zip(events) {
        encode(e, b);
    }
}

/// The `ARGS` blocks holding `args`, the first of which follows `first`
/// saved ones: (calls in it, payload `u64` first, `u32` n, n x six `u64`).
pub(super) fn args_payloads(
    first: usize,
    args: &[[u64; ARG_REGS]],
) -> impl Iterator<Item = (usize, Vec<u8>)> + '_ {
    let mut at = first;
    args.chunks(MAX_BLOCK_ARGS).map(move |chunk| {
        let mut p = Vec::with_capacity(ARGS_HEADER + chunk.len() * ARGS_SIZE);
        p.extend_from_slice(&(at as u64).to_le_bytes());
        p.extend_from_slice(&(chunk.len() as u32).to_le_bytes());
        for a in chunk.iter().flatten() {
            p.extend_from_slice(&a.to_le_bytes());
        }
        at += chunk.len();
        (chunk.len(), p)
    })
}

/// Bytes of a `STAK` block's stack besides its frames: end code, count, exact mask.
pub const STACK_FIXED: usize = 1 + 4 + 8;

/// The `STAK` blocks holding `stacks`, the first of which follows `first`
/// saved ones: (stacks in it, payload `u32` first, `u32` n, n x (`u8` end,
/// `u32` frame count, `u64` exact mask, frames `u64`)). A stack has at
/// most `MAX_FRAMES` frames, so a block always fits one.
pub(super) fn stack_payloads(first: usize, stacks: &[Stack]) -> io::Result<Vec<(usize, Vec<u8>)>> {
    let size = |s: &Stack| STACK_FIXED + 8 * s.frames.len();
    table_payloads(first, stacks, "kernel stacks", size, |p, s| {
        p.push(s.end as u8);
        p.extend_from_slice(&(s.frames.len() as u32).to_le_bytes());
        p.extend_from_slice(&s.exact.to_le_bytes());
        for f in &s.frames {
            p.extend_from_slice(&f.to_le_bytes());
        }
        Ok(())
    })
}

/// The `TASK` blocks holding `tasks`, the first of which follows `first`
/// saved ones, each at most `MAX_BLOCK` bytes: (tasks in it, payload).
pub(super) fn task_payloads(first: usize, tasks: &[Task]) -> io::Result<Vec<(usize, Vec<u8>)>> {
    let size = |t: &Task| TASK_FIXED + t.comm.len();
    table_payloads(first, tasks, "guest tasks", size, |p, t| {
        p.extend_from_slice(&t.pid.to_le_bytes());
        p.extend_from_slice(&t.tgid.to_le_bytes());
        put_str(p, &t.comm)
    })
}

/// The blocks of a table (`TASK`, `STAK`) holding `items`, the first of
/// which follows `first` saved ones: as many items a block as fit in
/// `MAX_BLOCK` (always one: a single item too large is refused by
/// `frame`), each payload `u32` first, `u32` n, then the items as `put`
/// writes them (`size` bytes each).
fn table_payloads<T>(
    first: usize,
    items: &[T],
    what: &str,
    size: impl Fn(&T) -> usize,
    put: impl Fn(&mut Vec<u8>, &T) -> io::Result<()>,
) -> io::Result<Vec<(usize, Vec<u8>)>> {
    let too_many = || io::Error::new(io::ErrorKind::InvalidInput, format!("over 2^32 {what}"));
    let mut blocks = Vec::new();
    let mut at = first;
    let mut rest = items;
    while !rest.is_empty() {
        let mut bytes = 8;
        let n = rest
            .iter()
            .position(|t| {
                bytes += size(t);
                bytes > MAX_BLOCK as usize
            })
            .unwrap_or(rest.len())
            .max(1);
        let (now, later) = rest.split_at(n);
        let mut p = Vec::with_capacity(bytes.min(MAX_BLOCK as usize));
        p.extend_from_slice(&u32::try_from(at).map_err(|_| too_many())?.to_le_bytes());
        p.extend_from_slice(&(n as u32).to_le_bytes());
        for t in now {
            put(&mut p, t)?;
        }
        blocks.push((n, p));
        at += n;
        rest = later;
    }
    u32::try_from(at).map_err(|_| too_many())?;
    Ok(blocks)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The block framed in place is the block `frame` makes of the payload.
    #[test]
    fn an_events_block_framed_in_place_is_the_framed_payload() {
        let events: Vec<Event> = (0..5u64)
            .map(|i| Event {
                ts_ns: i * 10,
                parent: 0xffff_ffff_8100_0000 + i,
                func: i as u32,
                cpu: (i % 2) as u32,
                data: i,
                ..Event::default()
            })
            .collect();
        let mut payload = Vec::new();
        events_payload(&events, &mut payload);
        let mut block = vec![1, 2, 3];
        events_block(&events, &mut block);
        assert_eq!(block, frame(TAG_EVENTS, &payload).unwrap());
    }

    /// What was opened is checked, not what the path was before: a FIFO
    /// (opened without blocking) is refused; a regular file is kept, its
    /// writes blocking again.
    #[test]
    fn an_opened_fifo_is_refused_and_a_file_blocks_again() {
        let dir = std::env::temp_dir().join(format!("vmtrace-stream-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: `c` is a NUL-terminated path that outlives the call;
        // mkfifo only reads it.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap();
        let e = blocking_file_or_device(&f).unwrap_err().to_string();
        assert!(
            e.contains("neither a regular file nor a character device"),
            "{e}"
        );
        let plain = dir.join("plain");
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&plain)
            .unwrap();
        blocking_file_or_device(&f).unwrap();
        use std::os::fd::AsRawFd;
        // SAFETY: fcntl(2) F_GETFL on a descriptor `f` owns.
        let flags = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFL) };
        assert_eq!(flags & libc::O_NONBLOCK, 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
