//! An event's field values read at the event (the vCPU stopped where
//! `__traceiter_NAME` was called, its arguments live), every read bounded
//! and through a reader that fails instead of faulting; and the line
//! ftrace's `TP_printk` makes of them.

use super::fields::{EventFormat, FieldOffsets, FieldValue, Print, Source, TaskField};
use super::syscall_format::NR_FIELD;

/// Reads guest-virtual memory; false when any of it is not mapped.
pub type Reader<'a> = dyn FnMut(u64, &mut [u8]) -> bool + 'a;

/// sched.h's task states (include/linux/sched.h, Linux 6.12): the bits
/// `TASK_REPORT` keeps, `TASK_NOLOAD` (with UNINTERRUPTIBLE: TASK_IDLE),
/// `TASK_RTLOCK_WAIT`, and the two states ftrace adds past them.
const TASK_REPORT: u64 = 0x7f;
const TASK_IDLE: u64 = 0x402;
const TASK_RTLOCK_WAIT: u64 = 0x1000;
const TASK_REPORT_IDLE: u64 = TASK_REPORT + 1;
const TASK_REPORT_MAX: u64 = TASK_REPORT_IDLE << 1;
/// `__print_flags` of sched_switch's `prev_state`: a letter per bit.
const STATE_LETTERS: [(u64, &str); 8] = [
    (0x01, "S"),
    (0x02, "D"),
    (0x04, "T"),
    (0x08, "t"),
    (0x10, "X"),
    (0x20, "Z"),
    (0x40, "P"),
    (0x80, "I"),
];

fn int(read: &mut Reader<'_>, va: u64, len: usize) -> FieldValue {
    let mut b = [0u8; 8];
    if !read(va, &mut b[..len]) {
        return FieldValue::Unread;
    }
    let raw = u64::from_le_bytes(b);
    // Sign-extended from its size.
    let shift = 64 - 8 * len as u32;
    FieldValue::Int(((raw << shift) as i64) >> shift)
}

/// A NUL-terminated string at `va`, at most `max` bytes, read a page at a
/// time so that an unmapped page past its end does not fail it.
fn string(read: &mut Reader<'_>, va: u64, max: usize) -> FieldValue {
    let mut out = Vec::new();
    let mut at = va;
    while out.len() < max {
        let in_page = (0x1000 - (at & 0xfff)) as usize;
        let mut b = vec![0u8; in_page.min(max - out.len())];
        if !read(at, &mut b) {
            return FieldValue::Unread;
        }
        if let Some(n) = b.iter().position(|&c| c == 0) {
            out.extend_from_slice(&b[..n]);
            break;
        }
        at += b.len() as u64;
        out.extend_from_slice(&b);
    }
    FieldValue::Str(String::from_utf8_lossy(&out).into_owned())
}

fn task(read: &mut Reader<'_>, off: &FieldOffsets, p: u64, f: TaskField) -> FieldValue {
    let at = |o: u32| p.wrapping_add(u64::from(o));
    match f {
        TaskField::Comm => string(read, at(off.comm), super::fields::COMM_LEN),
        TaskField::Pid => int(read, at(off.pid), 4),
        TaskField::Tgid => int(read, at(off.tgid), 4),
        TaskField::Prio => int(read, at(off.prio), 4),
        TaskField::Cpu => match off.cpu {
            Some(c) => int(read, at(c), 4),
            None => FieldValue::Unread,
        },
        TaskField::OomScoreAdj => {
            let mut s = [0u8; 8];
            match read(at(off.signal), &mut s) {
                true => int(
                    read,
                    u64::from_le_bytes(s).wrapping_add(u64::from(off.oom_score_adj)),
                    2,
                ),
                false => FieldValue::Unread,
            }
        }
    }
}

/// sched.h `__trace_sched_switch_state`: TASK_REPORT_MAX when preempted,
/// else the bit of `__task_state_index(prev_state, prev->exit_state)`.
pub fn switch_state(preempt: bool, prev_state: u64, exit_state: u64) -> u64 {
    if preempt {
        return TASK_REPORT_MAX;
    }
    let mut state = (prev_state | exit_state) & TASK_REPORT;
    if prev_state == TASK_IDLE {
        state = TASK_REPORT_IDLE;
    }
    if prev_state & TASK_RTLOCK_WAIT != 0 {
        state = 0x2;
    }
    // fls(): the highest bit's number, 1-based.
    let index = 64 - state.leading_zeros();
    match index {
        0 => 0,
        i => 1 << (i - 1),
    }
}

/// Each field's value at an event whose arguments (after `__data`) are
/// `args`.
pub fn read_fields(
    format: &EventFormat,
    args: &[u64],
    off: &FieldOffsets,
    read: &mut Reader<'_>,
) -> Vec<FieldValue> {
    read_fields_where(format, args, off, read, |_| true)
}

/// `read_fields`, but only the fields `wanted` names by their index; the
/// others are not read at all and show as unread.
pub fn read_fields_where(
    format: &EventFormat,
    args: &[u64],
    off: &FieldOffsets,
    read: &mut Reader<'_>,
    wanted: impl Fn(usize) -> bool,
) -> Vec<FieldValue> {
    let arg = |i: usize| args.get(i).copied().unwrap_or(0);
    let one = |s: Source, read: &mut Reader<'_>| match s {
        Source::Arg(i) => FieldValue::Int(arg(i) as i64),
        Source::Task(i, f) => task(read, off, arg(i), f),
        Source::Str(i) => string(read, arg(i), super::fields::COMM_LEN),
        Source::Filename(i) => {
            let mut p = [0u8; 8];
            match read(arg(i).wrapping_add(u64::from(off.filename)), &mut p) {
                true => string(read, u64::from_le_bytes(p), super::fields::MAX_STR),
                false => FieldValue::Unread,
            }
        }
        Source::SwitchState {
            preempt,
            state,
            prev,
        } => {
            let exit = int(read, arg(prev).wrapping_add(u64::from(off.exit_state)), 4);
            let exit = match exit {
                FieldValue::Int(v) => v as u64,
                _ => 0,
            };
            let s = switch_state(arg(preempt) & 1 != 0, arg(state), exit);
            FieldValue::Int(s as i64)
        }
        Source::Const(v) => FieldValue::Int(v),
        Source::Regs(off) => int(read, arg(0).wrapping_add(u64::from(off)), 8),
        // Known at the return only (`trace::fields`).
        Source::Ret => FieldValue::Unread,
    };
    format
        .fields
        .iter()
        .enumerate()
        .map(|(i, f)| match wanted(i) {
            true => one(f.source, read),
            false => FieldValue::Unread,
        })
        .collect()
}

/// `S`, `D|T`, `R`, `R+` (sched_switch's `TP_printk`).
pub fn state_letters(state: u64) -> String {
    let plus = if state & TASK_REPORT_MAX != 0 {
        "+"
    } else {
        ""
    };
    let bits = state & (TASK_REPORT_MAX - 1);
    let letters: Vec<&str> = STATE_LETTERS
        .iter()
        .filter(|(b, _)| bits & b != 0)
        .map(|&(_, l)| l)
        .collect();
    match letters.is_empty() {
        true => format!("R{plus}"),
        false => format!("{}{plus}", letters.join("|")),
    }
}

/// One value as the field prints.
pub fn print_value(print: Print, v: &FieldValue) -> String {
    let n = match v {
        FieldValue::Unread => return "?".into(),
        FieldValue::Str(s) => return crate::kernel::names::escape(s).into_owned(),
        FieldValue::Int(n) => *n,
    };
    match print {
        Print::Int => (n as i32).to_string(),
        Print::Long => n.to_string(),
        Print::Unsigned => (n as u64).to_string(),
        Print::Hex => format!("{:#x}", n as u64),
        Print::BareHex => format!("{:x}", n as u64),
        Print::Bool => (n & 1 != 0).to_string(),
        Print::Cpu => format!("{:03}", n as i32),
        Print::Str => n.to_string(),
        Print::State => state_letters(n as u64),
        Print::Word => format!("0x{:08x}", n as u64),
    }
}

/// The event's fields as ftrace prints them: `name=value` each, and
/// sched_switch's `==>` before the next task; a syscall's as its print
/// format does (`dfd: 0x..., flags: 0x...`; `0x3`), without its number.
pub fn render(format: &EventFormat, values: &[FieldValue]) -> String {
    if format.syscall().is_some() {
        let each = format.fields.iter().zip(values);
        let shown = each.filter(|(f, _)| f.name != NR_FIELD);
        let parts: Vec<String> = shown
            .map(|(f, v)| match f.source {
                Source::Ret => print_value(f.print, v),
                _ => format!("{}: {}", f.label, print_value(f.print, v)),
            })
            .collect();
        return parts.join(", ");
    }
    let mut out = String::new();
    for (f, v) in format.fields.iter().zip(values) {
        if !out.is_empty() {
            out.push(' ');
        }
        if format.covered && f.name == "next_comm" {
            out.push_str("==> ");
        }
        out.push_str(&f.label);
        out.push('=');
        out.push_str(&print_value(f.print, v));
    }
    out
}
