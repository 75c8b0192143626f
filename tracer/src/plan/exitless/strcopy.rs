//! The strings an event's fields point to that do not last past the event
//! (`EventFormat::lasts`: task_rename's `newcomm` and `oldcomm`,
//! sched_process_exec's `filename`), copied into the event's record by its
//! site's own body, at the event, bounded and without faulting; and read
//! back from the record by the drainer.
//!
//! Which fields and from where comes from the events' field tables
//! (`EventFormat::copied_at`), not from code per event. Each copy is made
//! by the guest kernel's own `strncpy_from_kernel_nofault(dst, src, count)`
//! (mm/maccess.c): it refuses a user or non-canonical address
//! (`copy_from_kernel_nofault_allowed`), reads a byte at a time with page
//! faults disabled and the kernel's exception table behind each read, so a
//! bad pointer in a corrupted guest returns `-EFAULT` instead of an oops;
//! it stops at the NUL or at `count` bytes, NUL included, and returns how
//! many it stored. A pointer to the string (`bprm->filename`) is read
//! first by `copy_from_kernel_nofault(dst, src, 8)`, the same way. Both
//! take no lock and may sleep nowhere: what the tracepoint's own context
//! allows (`__DO_TRACE` runs the probes with preemption disabled), and what
//! BPF's `bpf_probe_read_kernel_str` calls from any tracepoint. The record
//! keeps each copy's return value (its status word) before its bytes.
//!
//! A syscall event's arguments (`sys_enter_NAME` at `__x64_sys_NAME(const
//! struct pt_regs *regs)`'s entry: `Source::Regs`) are words, not strings:
//! each is loaded from `regs` by a plain `mov` and stored in the record,
//! with one status word for all of them (`WORD_STATUS`). No call is needed
//! there: `regs` is the `struct pt_regs` the syscall entry saved at the top
//! of the current task's kernel stack (arch/x86/entry/entry_64.S,
//! `do_syscall_64(regs, nr)` calls the table's function with it), mapped
//! and in use while the task runs, and the traced function reads the same
//! members as its first instructions (`SYSCALL_DEFINE`'s
//! `__MAP(...,SC_X86_64_REGS_TO_ARGS)`): a load that faulted here would
//! fault there too. A new task's syscall and return value are words the
//! same way (`fork_words`), from `ret_from_fork(prev, regs, fn, fn_arg)`'s
//! second argument: the child's `pt_regs` at the top of its own kernel
//! stack, which `ret_from_fork` hands to `syscall_exit_to_user_mode`; and
//! its name, from the current `task_struct` (`gs:[current_task]`, which
//! the body reads for the record's task anyway), mapped while it runs.

use iced_x86::code_asm::CodeAssembler;
use iced_x86::code_asm::{
    dword_ptr, eax, edx, ptr, qword_ptr, r10, r11, r8, r9, rax, rcx, rdi, rdx, rsi, rsp,
};
use iced_x86::IcedError;

use super::layout::{RECORD_LEN_STRINGS, REC_STRINGS};
use crate::kernel::events::fields::{
    CopyAt, EventFormat, FieldOffsets, FieldValue, StrAt, WordBase,
};
use crate::kernel::events::fork_child::ForkRegs;

/// The kernel's bounded string copy that cannot fault (mm/maccess.c).
pub const STRNCPY_NOFAULT: &str = "strncpy_from_kernel_nofault";
/// The kernel's bounded memory copy that cannot fault, for a pointer.
pub const COPY_NOFAULT: &str = "copy_from_kernel_nofault";

/// Bytes of a record's copies (`REC_STRINGS` to its end).
pub const STRINGS_LEN: usize = (RECORD_LEN_STRINGS - REC_STRINGS) as usize;
/// Copies one record holds at most: their status words come first.
pub const MAX_COPIES: usize = 4;
/// A status word: the copy's return value (i32), 0 while not copied.
const STATUS_LEN: u64 = 4;
/// Where the copies' bytes start in the area.
const BYTES_OFF: u64 = MAX_COPIES as u64 * STATUS_LEN;
/// Bytes of a pointer read before its string.
const POINTER_LEN: u32 = 8;
/// Bytes of a word copied (a `struct pt_regs` member, `unsigned long`).
const WORD_LEN: u32 = 8;
/// The status word of an event's words once they are stored: their size
/// (never 0, which reads unread).
pub const WORD_STATUS: u32 = WORD_LEN;
/// What a string cut at its copy's bound ends with, where ftrace would
/// have kept it whole (a file name of the bound's length less one or
/// more: `strncpy_from_kernel_nofault` returns the bound either way).
pub const TRUNCATED: &str = "...";

/// One string (or word) of an event's record: which field, where it is at
/// the event, and where its copy goes (offsets from `REC_STRINGS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StrCopy {
    /// The field's index in its event's format.
    pub field: usize,
    pub at: CopyAt,
    /// Its status word (shared by an event's words) and its bytes in the
    /// area.
    pub status: u64,
    pub bytes: u64,
    /// Bytes copied at most, NUL included.
    pub bound: u32,
}

impl StrCopy {
    /// Calls of the kernel's nofault copies this copy makes: none for a
    /// word, one per string, and one more for a pointer read first.
    pub fn calls(&self) -> usize {
        match self.at {
            CopyAt::Word(..) => 0,
            CopyAt::Str(at) => 1 + usize::from(at.deref.is_some()),
        }
    }

    /// A word (`CopyAt::Word`: a syscall's register), copied without a
    /// call.
    pub fn is_word(&self) -> bool {
        matches!(self.at, CopyAt::Word(..))
    }
}

/// The kernel's two copy functions, at the running kernel's addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyFns {
    pub strncpy: u64,
    pub copy: u64,
}

/// The copies of `format`'s fields that do not last past the event, their
/// room allotted in the area: a comm its 16 bytes, a word 8, a string
/// ftrace keeps whole what the others leave (a file name: 111 bytes and
/// the NUL alone). Each string has a status word, the words one for all.
/// Empty for an event none of whose fields needs one.
pub fn copies(format: &EventFormat, off: &FieldOffsets) -> Vec<StrCopy> {
    let wanted: Vec<(usize, CopyAt)> = (0..format.fields.len())
        .filter_map(|i| Some((i, format.copied_at(i, off)?)))
        .collect();
    let len = |at: &CopyAt| match at {
        CopyAt::Word(..) => Some(WORD_LEN),
        CopyAt::Str(s) => s.len,
    };
    let room = STRINGS_LEN as u32 - BYTES_OFF as u32;
    let fixed: u32 = wanted.iter().filter_map(|(_, a)| len(a)).sum();
    let whole = wanted.iter().filter(|(_, a)| len(a).is_none()).count() as u32;
    let share = room.saturating_sub(fixed) / whole.max(1);
    let (mut bytes, mut slots, mut words_slot) = (BYTES_OFF, 0, None);
    let mut out = Vec::new();
    for (field, at) in wanted {
        // A pointer is read into the string's own bytes first.
        let bound = len(&at).unwrap_or(share);
        let word = matches!(at, CopyAt::Word(..));
        let slot = match (word, words_slot) {
            (true, Some(s)) => s,
            _ if slots == MAX_COPIES => continue,
            _ => slots,
        };
        if bound < POINTER_LEN || bytes + u64::from(bound) > STRINGS_LEN as u64 {
            continue;
        }
        if slot == slots {
            slots += 1;
            words_slot = words_slot.or(word.then_some(slot));
        }
        out.push(StrCopy {
            field,
            at,
            status: slot as u64 * STATUS_LEN,
            bytes,
            bound,
        });
        bytes += u64::from(bound);
    }
    out
}

/// Instructions `copies` add to a recorded call's path: per word its load
/// and store, and the words' status (and the task's load, for words of
/// the current task's); with strings, the saves and restores
/// and per string its own (the call's success path; the kernel's
/// instructions inside the calls are not counted here).
pub fn path_instructions(copies: &[StrCopy]) -> usize {
    let words = copies.iter().filter(|c| c.is_word()).count();
    let task = copies
        .iter()
        .any(|c| matches!(c.at, CopyAt::Word(WordBase::Current, _)));
    let words = match words {
        0 => 0,
        n => 2 * n + 1 + usize::from(task),
    };
    let strings: Vec<StrAt> = copies
        .iter()
        .filter_map(|c| match c.at {
            CopyAt::Str(at) => Some(at),
            CopyAt::Word(..) => None,
        })
        .collect();
    if strings.is_empty() {
        return words;
    }
    let one = |at: &StrAt| {
        6 + usize::from(at.add != 0)
            + match at.deref {
                Some(_) => 8,
                None => 0,
            }
    };
    words + 2 * SAVED + strings.iter().map(one).sum::<usize>()
}

/// Registers the copies save: the traced function's argument registers
/// the calls clobber (rdx and rax the body saved already) and r10, the
/// record.
const SAVED: usize = 6;

/// Emit an event's words (`CopyAt::Word`) into the record at r10, RDI
/// and RSI still the traced function's first two arguments (`struct
/// pt_regs *regs` of `__x64_sys_NAME(regs)`, of `ret_from_fork(prev,
/// regs, ...)`), and their status word; `rec_strings` is the area,
/// `rec_task` where the record holds the current task (None: it holds
/// none, and a word of the task's is not copied). Clobbers rax and rdx
/// (the bodies saved both; the reservation used rdx). Nothing for an
/// event without words.
pub(super) fn emit_words(
    a: &mut CodeAssembler,
    rec_strings: i64,
    rec_task: Option<i64>,
    copies: &[StrCopy],
) -> Result<(), IcedError> {
    let mut status = None;
    let mut task_loaded = false;
    for c in copies {
        let CopyAt::Word(base, off) = c.at else {
            continue;
        };
        let base = match (base, rec_task) {
            (WordBase::First, _) => rdi,
            (WordBase::Second, _) => rsi,
            (WordBase::Current, None) => continue,
            (WordBase::Current, Some(at)) => {
                if !task_loaded {
                    // rdx = current, as the record holds it.
                    a.mov(rdx, qword_ptr(r10 + at))?;
                    task_loaded = true;
                }
                rdx
            }
        };
        // rax = the structure's member (a plain load: see the module
        // comment).
        a.mov(rax, qword_ptr(base + off as i32))?;
        // The record's copy of it.
        a.mov(qword_ptr(r10 + (rec_strings + c.bytes as i64)), rax)?;
        status = Some(c.status);
    }
    if let Some(at) = status {
        // Their status word: stored, the words' size (0 reads unread).
        a.mov(dword_ptr(r10 + (rec_strings + at as i64)), WORD_STATUS)?;
    }
    Ok(())
}

/// The words a new task's `ret_from_fork(prev, regs, fn, fn_arg)` copies
/// (`kernel::events::fork_child`): `regs->orig_ax`, the syscall that made
/// it, then `regs->ax`, its return value, from the second argument; and
/// with `comm` (`task_struct.comm`'s offset) the task's name, two words
/// from the current task, which it may change before the drain (a rename,
/// an exec). One status word for them all; the drainer makes such a
/// record that syscall's exit in the child
/// (`session::exitless::child_starts`). `fn`, the third argument, is in
/// the record's arguments already.
pub fn fork_words(regs: ForkRegs, comm: Option<u32>) -> Vec<StrCopy> {
    let regs = [regs.orig_ax, regs.ax].map(|off| (WordBase::Second, off));
    let name = comm.map(|off| [off, off + WORD_LEN].map(|off| (WordBase::Current, off)));
    let at = regs.iter().chain(name.iter().flatten());
    let word = |(i, &(base, off)): (usize, &(WordBase, u32))| StrCopy {
        field: i,
        at: CopyAt::Word(base, off),
        status: 0,
        bytes: BYTES_OFF + i as u64 * u64::from(WORD_LEN),
        bound: WORD_LEN,
    };
    at.enumerate().map(word).collect()
}

/// Emit the copies of one site's body, with r10 its record less
/// `records_off` and the event's arguments stored at `rec_args` (RDI, the
/// probe's `__data`, first); `rec_strings` is the area: its words first
/// (`emit_words`, `rec_task` the record's task), then its strings
/// (`emit_strings`). Leaves every register as it found it but rax, rdx
/// and r11 (the body saved rax and rdx; r11 is scratch at a function's
/// entry).
pub(super) fn emit_copies(
    a: &mut CodeAssembler,
    [rec_args, rec_strings]: [i64; 2],
    rec_task: Option<i64>,
    copies: &[StrCopy],
    fns: CopyFns,
) -> Result<(), IcedError> {
    emit_words(a, rec_strings, rec_task, copies)?;
    emit_strings(a, rec_args, rec_strings, copies, fns, false)
}

/// Instructions `emit_strings` adds to save r11 around the calls, in an
/// entry path that still needs it after them (the shared and the graph
/// entry: r11d is the site's commit word there).
pub const R11_SAVE_INSTRUCTIONS: usize = 2;

/// Emit the strings of `copies` (the words aside), as `emit_copies` says;
/// with `keep_r11`, r11 saved around the calls too
/// (`R11_SAVE_INSTRUCTIONS`). Nothing for copies without a string.
pub(super) fn emit_strings(
    a: &mut CodeAssembler,
    rec_args: i64,
    rec_strings: i64,
    copies: &[StrCopy],
    fns: CopyFns,
    keep_r11: bool,
) -> Result<(), IcedError> {
    let strings: Vec<(&StrCopy, StrAt)> = copies
        .iter()
        .filter_map(|c| match c.at {
            CopyAt::Str(at) => Some((c, at)),
            CopyAt::Word(..) => None,
        })
        .collect();
    if strings.is_empty() {
        return Ok(());
    }
    if keep_r11 {
        // The site's commit word, which the calls may clobber.
        a.push(r11)?;
    }
    // Save what the calls may clobber and the traced function still
    // needs: its argument registers, and the record (last: at [rsp]).
    a.push(rcx)?;
    a.push(rsi)?;
    a.push(rdi)?;
    a.push(r8)?;
    a.push(r9)?;
    a.push(r10)?;
    for (c, at) in strings {
        let mut failed = a.create_label();
        let bytes = rec_strings + c.bytes as i64;
        // rsi = the event's argument, as the record holds it (after
        // __data: its register's slot is one further).
        a.mov(rsi, qword_ptr(r10 + (rec_args + 8 * (at.arg as i64 + 1))))?;
        if let Some(off) = at.deref {
            // The pointer at [rsi + off], copied into the string's bytes
            // (copy_from_kernel_nofault(dst, src, 8): 0, or -EFAULT).
            a.lea(rdi, ptr(r10 + bytes))?;
            a.add(rsi, off as i32)?;
            a.mov(edx, POINTER_LEN)?;
            a.call(fns.copy)?;
            // r10 = the record again (the call clobbered it).
            a.mov(r10, qword_ptr(rsp))?;
            // Not read: its status is the error, no string copied.
            a.test(eax, eax)?;
            a.jne(failed)?;
            // rsi = the pointer read.
            a.mov(rsi, qword_ptr(r10 + bytes))?;
        }
        if at.add != 0 {
            // rsi = the string inside the structure (task->comm).
            a.add(rsi, at.add as i32)?;
        }
        // strncpy_from_kernel_nofault(dst, src, bound): the bytes copied,
        // NUL included, or -EFAULT / -ERANGE.
        a.lea(rdi, ptr(r10 + bytes))?;
        a.mov(edx, c.bound)?;
        a.call(fns.strncpy)?;
        // r10 = the record again.
        a.mov(r10, qword_ptr(rsp))?;
        a.set_label(&mut failed)?;
        // The status word: what the call returned.
        a.mov(dword_ptr(r10 + (rec_strings + c.status as i64)), eax)?;
    }
    // Restore them, in reverse.
    a.pop(r10)?;
    a.pop(r9)?;
    a.pop(r8)?;
    a.pop(rdi)?;
    a.pop(rsi)?;
    a.pop(rcx)?;
    if keep_r11 {
        a.pop(r11)?;
    }
    Ok(())
}

/// The value of copy `c` in a record's area: a word as the integer it
/// holds; a string cut at its first NUL, marked `TRUNCATED` when it filled
/// a bound ftrace does not have; unread when the copy failed or was not
/// made (status 0: a record of a body without copies, the area zeroed by
/// the drainer).
pub fn value(c: &StrCopy, area: &[u8; STRINGS_LEN]) -> FieldValue {
    let at = c.status as usize;
    let status = i32::from_le_bytes(area[at..at + 4].try_into().expect("4 bytes"));
    let Ok(n) = u32::try_from(status) else {
        return FieldValue::Unread;
    };
    if n == 0 {
        return FieldValue::Unread;
    }
    let from = c.bytes as usize;
    let bytes = &area[from..from + n.min(c.bound) as usize];
    let at = match c.at {
        CopyAt::Word(..) => {
            let word = bytes.try_into().map(i64::from_le_bytes);
            return word.map_or(FieldValue::Unread, FieldValue::Int);
        }
        CopyAt::Str(at) => at,
    };
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    let mut s = String::from_utf8_lossy(&bytes[..end]).into_owned();
    if at.len.is_none() && n >= c.bound {
        s.push_str(TRUNCATED);
    }
    FieldValue::Str(s)
}

/// `format`'s values with the copies' from the record's area in place of
/// those read after the event (`values`, where those show unread).
pub fn fill(
    format: &EventFormat,
    off: &FieldOffsets,
    area: &[u8; STRINGS_LEN],
    values: &mut [FieldValue],
) {
    for c in copies(format, off) {
        if let Some(v) = values.get_mut(c.field) {
            *v = value(&c, area);
        }
    }
}
