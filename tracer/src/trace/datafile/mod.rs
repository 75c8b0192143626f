//! Saved traces: `vmtrace ... -o FILE` writes one, `vmtrace report -i FILE`
//! reads it back. The file is self-contained (no vmlinux needed to read it).
//!
//! # Format, version 4
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
//! |           | version              | `u32`       | `4` (older versions: see below)                         |
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
//! |           | mode                 | `str`       | `trap` or `exitless` (version 1: `trap`)                |
//! |           | trap_exits           | `u64`       | exits at the trace port (version 1: `events_total`)     |
//! |           | graph                | `u8`        | `1`: returns hooked and recorded (function graph), else `0` |
//! |           | returns_dropped      | `u64`       | returns counted but not stored                          |
//! |           | unhooked             | `u64`       | entries whose return could not be hooked                |
//! |           | tsc_khz              | `u64`       | the guest TSC's rate, kHz (`0`: unknown)                |
//! |           | symbols              | `str`       | where the symbols came from (empty: unknown)            |
//! | functions | nfunc                | `u32`       | the traced functions                                    |
//! |           | functions            | `sym` × nfunc | an event's `func` indexes this list                   |
//! | counts    | rows                 | `u32`       | must equal `nfunc`                                      |
//! |           | cols                 | `u32`       | must equal `cpus`                                       |
//! |           | counts               | `u64` × rows × cols | row-major: calls of function `f` on vCPU `c` at index `f * cols + c` |
//! | returns   | rows                 | `u32`       | `nfunc` if `graph == 1`, else `0`                       |
//! |           | cols                 | `u32`       | `cpus` if `graph == 1`, else `0`                        |
//! |           | returns              | `u64` × rows × cols | exact returns of function `f` on vCPU `c`       |
//! | callers   | ncallers             | `u32`       | functions the events' return addresses fall in          |
//! |           | callers              | `sym` × ncallers | sorted by address, ascending                       |
//! | events    | nevents              | `u64`       | stored events                                           |
//! |           | events               | 32 bytes × nevents | records, sorted by time (see below)              |
//!
//! An event record is 32 bytes: `u64 ts_ns` (host `CLOCK_MONOTONIC`, ns),
//! `u64 parent` (the return address at `[RSP]` on entry, `0` if unreadable;
//! for a return, the address returned to), `u64 slot` (function graph: the
//! guest address of the return-address slot, bit 0 set for a return; `0`
//! for an entry whose return is not hooked and in traces without `graph`),
//! `u32 func` (index into the functions), `u32 cpu` (vCPU number).
//!
//! Version 3 is still read: it is version 4 without `symbols`. Versions 1
//! and 2 are still read too: they have no `graph`, `returns_dropped`,
//! `unhooked`, `tsc_khz` or returns section, and 24-byte event records
//! without `slot`. Version 1 also lacks `mode` and `trap_exits` (trap mode,
//! every call an exit).
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
//! `save` writes a temporary file in the destination's directory and renames
//! it over the destination, so an interrupted save never leaves a partial
//! trace under the final name.
//!
//! # Version 6: the data file
//!
//! `vmtrace record` writes its data file while the guest runs ([`stream`]),
//! so the file must be readable however the run ends, SIGKILL included. It
//! is a preamble (as above, `version` 6 and `file_len` 0: the length is not
//! known when the file starts) and then blocks, each
//!
//! | Field    | Type    | Notes                                                   |
//! |----------|---------|---------------------------------------------------------|
//! | tag      | 4 bytes | `HEAD`, `EVTS`, `FOOT` or `END\0`                       |
//! | len      | `u32`   | payload bytes, at most `stream::MAX_BLOCK`              |
//! | payload  | len bytes |                                                       |
//! | crc      | `u32`   | CRC-32 (IEEE) of tag, len and payload                   |
//!
//! in this order: one `HEAD` (the body of a version-4 file, from `kernel`
//! to the callers, as known at attach: counts zero, the callers every
//! function of the kernel), any number of `EVTS` (`u32` n, then n event
//! records in the order they were recorded: time-sorted per vCPU, not
//! across vCPUs), one `FOOT` (the body as known at the end: exact counts,
//! the callers the events use) and an empty `END`. The body of version 6
//! has, after `symbols`: `u32` n then n `u64` (events lost per vCPU: the
//! writer fell behind; n is 0 or `cpus`), `u8` overwrite (flight
//! recorder), `str` rejected sites, `u8` has_offset then, if 1, `u64`
//! virtual and `u64` physical KASLR offsets (two's complement), then
//! `u64` unfinished (exitless calls whose ring record was reserved and
//! never committed: in no count; `0` in `HEAD`).
//!
//! Version 7 adds, after `unfinished`, `str` vmm: who ran the guest when
//! it was not vmtrace's own VMM (`vmtrace attach`: the QEMU); empty
//! otherwise. Version 6 is still read: it is version 7 without `vmm`.
//!
//! # Version 8: guest tasks
//!
//! Version 8 names the guest task (thread) that ran each event. Its body
//! adds, after `vmm`, `str` tasks: where the tasks came from (e.g. "from
//! the BTF of PATH"), or why events have none, empty if not asked; then
//! `u64` filtered: the calls `--pid`/`--comm` rejected. An event record is
//! 44 bytes: version 7's 32, then `u32 task`, the task's id (1-based: the
//! n-th task of the file), `0` when not known, then `u64 data` (see
//! "Arguments and return values" below). The tasks are in `TASK`
//! blocks, each
//!
//! | Field    | Type          | Notes                                                  |
//! |----------|---------------|--------------------------------------------------------|
//! | first    | `u32`         | tasks saved before this block: its first task has id `first + 1` |
//! | n        | `u32`         | tasks in this block                                    |
//! | tasks    | n × (`u32` pid, `u32` tgid, `str` comm) | `task_struct`'s pid, tgid and comm |
//!
//! between `HEAD` and `FOOT`, each before the first `EVTS` block whose
//! events name its tasks (the writer saves the tasks seen since its last
//! `TASK` block before each `EVTS`), so that a file cut short still holds
//! the task of every event it kept. One pid can be several tasks: a task
//! that changed its name (exec) is a new entry, and each CPU's idle task
//! is pid 0 (`swapper/N`). A reader must reject a `TASK` block whose
//! `first` is not the number of tasks before it, and an event whose task
//! is past the tasks saved before its block. Versions 1 to 7 are still
//! read: their events have task 0.
//!
//! ## Arguments and return values
//!
//! Version 8 also keeps the values of traced calls (`--args`, `--retval`).
//! An event record's `u64 data` is, for a
//! return, its return value (RAX) when return values were recorded, else
//! 0; for an entry, its arguments' id (1-based: the n-th call of the
//! `ARGS` blocks), `0` when none were recorded. The body adds, after
//! `filtered`, `u8` values: bit 0 set when arguments were recorded, bit 1
//! when return values were (other bits: corrupt). The arguments are in
//! `ARGS` blocks, each
//!
//! | Field    | Type          | Notes                                                  |
//! |----------|---------------|--------------------------------------------------------|
//! | first    | `u64`         | calls' arguments saved before this block               |
//! | n        | `u32`         | calls in this block                                    |
//! | args     | n × 6 × `u64` | RDI, RSI, RDX, RCX, R8, R9 at each call                |
//!
//! between `HEAD` and `FOOT`, each before the first `EVTS` block whose
//! entries name its arguments (the writer saves those recorded since its
//! last `ARGS` block before each `EVTS`). A reader must reject an `ARGS`
//! block whose `first` is not the number of calls' arguments before it or
//! whose length is not `12 + n × 48`, and an entry whose arguments id is
//! past the arguments saved before its block.
//!
//! The body ends, after the callers, with the traced functions'
//! prototypes (how to show the values, from the kernel's BTF):
//!
//! | Field    | Type          | Notes                                                  |
//! |----------|---------------|--------------------------------------------------------|
//! | n        | `u32`         | `0` (no values recorded) or `nfunc`                    |
//! | nenums   | `u32`         | the enums the kinds below name, each once              |
//! | enums    | nenums × enum | `u8` size (1, 2, 4, 8), `u8` signed (0, 1), `u32` m, m × (`u64` value (two's complement), `str` name) |
//! | protos   | n × proto     | one per function, in the functions' order              |
//!
//! A proto is `u8` has (`0`: BTF does not describe the function, nothing
//! follows; `1`:) then `kind` ret, `u8` nparams (at most 6), nparams ×
//! (`str` name, `u8` register (0 = RDI ... 5 = R9), `kind`), `u32`
//! nunshown, nunshown × `str` (what cannot be shown, e.g. "p: a struct
//! passed by value (RDI, RSI)"; notes on the return value start with
//! "return value:"). A `kind` is a `u8` tag: `0` void (a return only), `1`
//! signed integer or `2` unsigned integer (then `u8` size: 1, 2, 4 or 8),
//! `3` bool, `4` char, `5` pointer, `6` enum (then `u32` index into the
//! enums). Anything else is corrupt.
//!
//! # Version 9: kernel stacks
//!
//! Version 9 keeps the kernel stack of `--stack` entries. Its body adds,
//! after `values`, `str` stacks (how they were unwound; empty without
//! `--stack`), `u32` n and n `u32` stack functions (indices into the
//! functions; any not below `nfunc` is corrupt). An event record is 48
//! bytes: version 8's with `u32 stack` after `task` (`u64 data` then at
//! 40): the entry's stack, 1-based (the n-th stack of the `STAK` blocks),
//! `0` for none; a return naming a stack is corrupt. The stacks are in
//! `STAK` blocks, each
//!
//! | Field    | Type          | Notes                                                  |
//! |----------|---------------|--------------------------------------------------------|
//! | first    | `u32`         | stacks saved before this block                         |
//! | n        | `u32`         | stacks in this block                                   |
//! | stacks   | n × (`u8` end, `u32` m, `u64` exact, m × `u64` frame) | `StackEnd` code (0 to 6); bit i of exact: frame i is an interrupted instruction's address, not a return address; frames innermost first, link addresses, m at most `MAX_FRAMES` |
//!
//! between `HEAD` and `FOOT`, each before the first `EVTS` block whose
//! entries name its stacks, as `TASK` blocks are; a reader must reject a
//! `STAK` block whose `first` is not the number of stacks before it, an
//! unknown end code, more than `MAX_FRAMES` frames, and an entry whose
//! stack is past the stacks saved before its block. Versions 1 to 8 are
//! still read: their events have stack 0.
//!
//! # Version 10: why events were dropped
//!
//! Version 10's body adds, after the stack functions, why the events
//! counted were not stored (`DropCauses`): `u32` n then n `u64` (per vCPU,
//! the calls and returns vmtrace's code in the guest found no free ring
//! slot for; n is 0 or `cpus`), then `u64` held (of those, while the drain
//! was held at a record reserved and not committed), `u64` ring_asked and
//! `u64` ring_given (records per ring; given below asked: the rings were
//! sized down to fit the guest's free low memory; both 0 when not
//! exitless), `u64` over_budget (over `--max-events`) and `u64`
//! overwritten (`--overwrite`). Versions 1 to 9 are still read: they say
//! no cause.
//!
//! # Version 11: the command line
//!
//! Version 11's body adds, after the drop causes, the command line that
//! recorded the trace (`TraceMeta::cmdline`): `u32` n then n `str`, argv
//! as given (an argument that was not UTF-8 has U+FFFD in place of its
//! bad bytes), `vmtrace` first. At most `cmdline::MAX_ARGS` arguments of
//! at most `cmdline::MAX_ARG_BYTES` bytes each (the writer cuts a longer
//! one, ending it in `[...]`, and replaces the arguments past the last
//! kept by `[N more arguments]`); more is corrupt. n is 0 when not known.
//! Versions 1 to 10 are still read: their command line is not known.
//!
//! # Version 12: the traced events' fields
//!
//! Version 12 keeps the fields of the traced events (`-e`): an event is
//! recorded as its `__traceiter_NAME` function, with its arguments (an
//! `ARGS` entry), and its fields as ftrace's format names them. The body
//! adds, after the prototypes, the events' formats: `u32` n (0: no event
//! traced), then n × (`u32` function (index into the functions, each
//! once), `str` event (`sched:sched_switch`), `u8` covered (1: the fields
//! are ftrace's; 0: the event's arguments, raw), `u32` m (at most 64),
//! m × (`str` name, `str` label (what ftrace prints before `=`), `str` C
//! type, `u8` print: 0 int, 1 long, 2 unsigned, 3 hex with `0x`, 4 bool,
//! 5 CPU (`%03d`), 6 string, 7 task state letters, 8 hex without `0x`)). The
//! values are in `FLDS` blocks, each `u32` n, then n × (`u64` arguments
//! id, `u32` m (at most 64), m values, each a `u8` tag: `0` then `u64`
//! (an integer, two's complement), `1` then `str`, `2` (not readable in
//! the guest at the event: printed `?`)), after the `ARGS` block of those
//! ids; an id of 0, past the arguments saved before the block, or given
//! twice is corrupt. Versions 1 to 11 are still read: they have no
//! fields. Version 13 adds, after each event format's fields, its ftrace
//! record layout (trace.dat's): `u8` 0, or 1, `u16` id, `str` print
//! format, `u32` k (at most 64), k × (`str` type, `str` name, `u32`
//! offset, `u32` size, `u8` signed). Version 12 is still read, with none.
//! Version 14 adds `FUNC` blocks: functions added during the trace
//! ([`added`], a module first loaded then).
//!
//! Version 15 adds print code 9 (`0x%08lx`, a syscall's argument), after
//! each field's print code its source, `u8`: 0 the event's stored values,
//! 1 then `i64` a constant (a syscall event's `__syscall_nr`), 2 the
//! function's return value; and, after the events' formats, the formats of
//! the events recorded at returns (`syscalls:sys_exit_*`), encoded alike.
//!
//! `save` writes version 4 when the trace has no tasks (and no
//! `TraceMeta::tasks`), no values, no stacks and no command line, else a
//! data file of `DATA_VERSION` in one go: `HEAD`, `TASK`, `ARGS`, `STAK`,
//! `EVTS`, `FOOT`, `END` (version 4 has no room for them).
//!
//! Version 5 is still read: it is version 6 without `unfinished`. (A new
//! version rather than an optional field after the callers: every byte of
//! a block stays accounted for, so trailing bytes are still corruption,
//! and a vmtrace that reads only version 5 says "unsupported version 6"
//! instead of calling a newer file corrupt.)
//!
//! A reader sorts the events by time. A file without `FOOT` and `END` (the
//! writer was killed) is read up to its last complete block, with counts
//! taken from the stored events and `incomplete` set; a block whose
//! checksum fails is corruption, unless it is the file's last and runs to
//! its end (a write cut short).

mod added;
mod body;
mod cmdline;
mod encode;
mod fields;
mod header;
mod protos;
mod read;
mod read_v5;
mod reader;
pub mod stream;
mod write;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use crate::kernel::symbols::Symbol;
use crate::kernel::unwind::MAX_FRAMES;
use crate::trace::model::{Event, Trace};

pub use read::load;
pub use reader::MAX_STRING;
pub use stream::DataFile;
pub use write::save;

/// The first 8 bytes of every trace file.
pub const MAGIC: &[u8; 8] = b"VMTRACE\0";
/// The format version this module writes and reads.
pub const VERSION: u32 = 4;
/// The first format (trap mode only), still read.
pub const VERSION_1: u32 = 1;
/// The second format (no function graph), still read.
pub const VERSION_2: u32 = 2;
/// The third format (no `symbols`), still read.
pub const VERSION_3: u32 = 3;
/// The first data file (version 6 without `unfinished`), still read.
pub const VERSION_5: u32 = 5;
/// The data file of vmtrace's own VMM (version 7 without `vmm`), still read.
pub const VERSION_6: u32 = 6;
/// The data file with the QEMU named (version 8 without tasks), still read.
pub const VERSION_7: u32 = 7;
/// The data file written while the guest runs (`stream`): blocks, guest
/// tasks in `TASK` blocks, 36-byte events naming their task.
pub const VERSION_8: u32 = 8;
/// The data file with kernel stacks (`STAK` blocks, 48-byte events).
pub const VERSION_9: u32 = 9;
/// The data file that says why events were dropped (`DropCauses`).
pub const VERSION_10: u32 = 10;
/// The data file that keeps the command line that recorded it.
pub const VERSION_11: u32 = 11;
/// The data file that keeps the traced events' fields (`FLDS` blocks).
pub const VERSION_12: u32 = 12;
/// The data file with the events' ftrace formats (for trace.dat).
pub const VERSION_13: u32 = 13;
/// The data file with functions added during the trace (`added`).
pub const VERSION_14: u32 = 14;
/// The data file with the returns' event formats (syscall exits).
pub const VERSION_15: u32 = 15;
/// The version `stream` and `save` write: the newest.
pub const DATA_VERSION: u32 = VERSION_15;
/// Size of one event record in versions 3 to 7.
pub const EVENT_SIZE: usize = 32;
/// Size of one event record in version 8: `EVENT_SIZE`, `u32 task` and
/// `u64 data`.
pub const EVENT_SIZE_V8: usize = 44;
/// Size of one event record in version 9: version 8's with `u32 stack`
/// after the task.
pub const EVENT_SIZE_V9: usize = 48;
/// Size of one event record in versions 1 and 2.
pub const EVENT_SIZE_V2: usize = 24;
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
    Returns,
    Callers,
    Events,
    /// A version-5 block's framing (tag, length, checksum).
    Block,
    /// A version-8 `TASK` block.
    Tasks,
    /// A version-8 `ARGS` block.
    Args,
    /// The prototypes of a version-8 body.
    Prototypes,
    /// A version-9 `STAK` block.
    Stacks,
    /// Version 12's event formats, or a `FLDS` block.
    Fields,
}

impl fmt::Display for Section {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Section::Preamble => "preamble",
            Section::Header => "header",
            Section::Functions => "functions",
            Section::Counts => "counts",
            Section::Returns => "returns",
            Section::Callers => "callers",
            Section::Events => "events",
            Section::Block => "block",
            Section::Tasks => "tasks",
            Section::Args => "arguments",
            Section::Prototypes => "prototypes",
            Section::Stacks => "stacks",
            Section::Fields => "event fields",
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
    #[error("{}: unsupported trace format version {version} (this vmtrace reads versions {VERSION_1} to {DATA_VERSION})", path.display())]
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
    let want = if trace.meta.graph { nfunc } else { 0 };
    if trace.returns.len() != want || trace.returns.iter().any(|r| r.len() != cpus) {
        return Err((
            Section::Returns,
            format!(
                "{} rows of returns for {want} graph-traced functions x {cpus} vCPUs",
                trace.returns.len()
            ),
        ));
    }
    check_callers(&trace.callers).map_err(|d| (Section::Callers, d))?;
    if u32::try_from(trace.tasks.len()).is_err() {
        let n = trace.tasks.len();
        return Err((Section::Tasks, format!("{n} tasks (max {})", u32::MAX)));
    }
    if !trace.prototypes.is_empty() && trace.prototypes.len() != nfunc {
        return Err((
            Section::Prototypes,
            format!(
                "{} prototypes for {nfunc} functions",
                trace.prototypes.len()
            ),
        ));
    }
    for (f, p) in trace.prototypes.iter().enumerate() {
        if let Some(p) = p {
            protos::check_prototype(p)
                .map_err(|d| (Section::Prototypes, format!("function {f}: {d}")))?;
        }
    }
    check_stacks(trace).and_then(|()| fields::check_fields(trace))?;
    let counts = Counted {
        nfunc,
        cpus,
        tasks: trace.tasks.len(),
        args: trace.args.len(),
        stacks: trace.stacks.len(),
    };
    check_events(&trace.events, 0, &counts).map_err(|d| (Section::Events, d))
}

/// The stacks' rules: how many, their frames, the stack functions.
fn check_stacks(trace: &Trace) -> Result<(), (Section, String)> {
    let nfunc = trace.functions.len();
    if u32::try_from(trace.stacks.len()).is_err() {
        return Err((
            Section::Stacks,
            format!("{} stacks (max {})", trace.stacks.len(), u32::MAX),
        ));
    }
    if let Some(s) = trace
        .stacks
        .iter()
        .position(|s| s.frames.len() > MAX_FRAMES)
    {
        return Err((
            Section::Stacks,
            format!(
                "stack {} has {} frames (at most {MAX_FRAMES})",
                s + 1,
                trace.stacks[s].frames.len()
            ),
        ));
    }
    if let Some(&f) = trace
        .meta
        .stack_funcs
        .iter()
        .find(|&&f| f as usize >= nfunc)
    {
        return Err((
            Section::Header,
            format!("stack function {f} but there are {nfunc} functions"),
        ));
    }
    Ok(())
}

/// What events may index: functions, vCPUs, and the tasks, arguments and
/// stacks saved before them (task, arguments and stack 0: none).
struct Counted {
    nfunc: usize,
    cpus: usize,
    tasks: usize,
    args: usize,
    stacks: usize,
}

/// Checks that callers are in address order (lookups bisect them).
fn check_callers(callers: &[Symbol]) -> Result<(), String> {
    match callers.windows(2).position(|w| w[0].addr > w[1].addr) {
        Some(i) => Err(format!(
            "callers {i} and {} are out of address order",
            i + 1
        )),
        None => Ok(()),
    }
}

/// Checks that events (the first being number `first`) index existing
/// functions, vCPUs, tasks and arguments (`n`).
fn check_events(events: &[Event], first: usize, n: &Counted) -> Result<(), String> {
    let (nfunc, cpus, ntasks) = (n.nfunc, n.cpus, n.tasks);
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
        if e.task as usize > ntasks {
            return Err(format!(
                "event {} names task {} but {ntasks} tasks are saved before it",
                first + i,
                e.task
            ));
        }
        if e.is_return() && e.stack != 0 {
            return Err(format!(
                "event {} is a return but names stack {}",
                first + i,
                e.stack
            ));
        }
        if e.stack as usize > n.stacks {
            return Err(format!(
                "event {} names stack {} but {} are saved before it",
                first + i,
                e.stack,
                n.stacks
            ));
        }
        if !e.is_return() && e.data > n.args as u64 {
            return Err(format!(
                "event {} names arguments {} but {} are saved before it",
                first + i,
                e.data,
                n.args
            ));
        }
    }
    Ok(())
}
