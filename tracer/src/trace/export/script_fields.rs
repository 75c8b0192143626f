//! `script` with chosen fields, as `perf script -F`: each stored event a
//! line of the fields asked for, in the order asked, separated by one
//! space, after the same `#` header as the whole line's
//! (`crate::trace::export::script`), without its column titles.
//!
//! The fields, as the whole line shows them:
//!
//! - `Comm`: the task's comm, 16 columns wide (`<idle>` for the idle
//!   tasks, as ftrace prints them; `vcpuN` for a call of no known task);
//! - `Pid`: its thread group (process) id, 7 wide (`0` for the idle
//!   tasks, `-` for no known task); `Tid`: its thread id, the kernel's
//!   pid (a call of no known task: its vCPU's pseudo id, N + 1);
//! - `Cpu`: `[001]`; `Time`: `1234.567890:`, the host's CLOCK_MONOTONIC;
//! - `Func`: the function; a return's reads `FUNCTION returned`;
//! - `Args`: an entry's arguments, `(name=value, ...)` (nothing for a
//!   return, or a function BTF does not describe);
//! - `Caller`: an entry's `<-CALLER`, a return's `to CALLER` (so that
//!   `Func` then `Caller` read as the whole line does);
//! - `Retval`: a return's `ret=VALUE` (nothing for an entry);
//! - `Stack`: an entry's kernel stack, below its line, a ` => FRAME` line
//!   per frame, wherever it is among the fields.
//!
//! A field with nothing to show for an event is left out of its line. A
//! field the trace did not record at all (`FieldMissing`) is refused
//! before anything is written, as perf script refuses a field its file
//! lacks.

use std::borrow::Cow;
use std::io::{self, BufWriter, Write};

use super::script::{header, seconds, task_columns};
use crate::trace::model::{Event, Trace};
use crate::trace::report::{escape, Caller};
use crate::trace::stacks::StackFrame;
use crate::trace::values;

/// A field of a script line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScriptField {
    Comm,
    Pid,
    Tid,
    Cpu,
    Time,
    Func,
    Caller,
    Args,
    Retval,
    Stack,
}

/// What a trace lacks for a field: it was recorded without it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FieldMissing {
    #[error("the trace names no guest task")]
    Tasks,
    #[error("the trace has no arguments")]
    Args,
    #[error("the trace has no return values")]
    Retval,
    #[error("the trace has no kernel stacks")]
    Stacks,
}

impl ScriptField {
    /// Whether `trace` recorded what this field shows.
    pub fn check(self, trace: &Trace) -> Result<(), FieldMissing> {
        let m = &trace.meta;
        let missing = match self {
            ScriptField::Comm | ScriptField::Pid | ScriptField::Tid => {
                (trace.tasks.is_empty()).then_some(FieldMissing::Tasks)
            }
            ScriptField::Args => (!m.args).then_some(FieldMissing::Args),
            ScriptField::Retval => (!m.retval).then_some(FieldMissing::Retval),
            ScriptField::Stack => (m.stack_funcs.is_empty() && trace.stacks.is_empty())
                .then_some(FieldMissing::Stacks),
            _ => None,
        };
        missing.map_or(Ok(()), Err)
    }
}

/// Writes every stored event of `trace` as a line of `fields`, after the
/// header. Every field must pass `ScriptField::check` first.
pub fn write_script_fields(
    trace: &Trace,
    fields: &[ScriptField],
    w: &mut dyn Write,
) -> io::Result<()> {
    let mut w = BufWriter::with_capacity(1 << 20, w);
    header(&mut w, trace)?;
    let names: Vec<Cow<str>> = trace.functions.iter().map(|f| escape(&f.name)).collect();
    let mut parts: Vec<String> = Vec::with_capacity(fields.len());
    for e in &trace.events {
        // A corrupt index: the whole line's writer skips it too.
        let Some(name) = names.get(e.func as usize) else {
            continue;
        };
        parts.clear();
        parts.extend(fields.iter().filter_map(|&f| field(trace, e, name, f)));
        w.write_all(parts.join(" ").as_bytes())?;
        w.write_all(b"\n")?;
        if fields.contains(&ScriptField::Stack) {
            stack_lines(&mut w, trace, e)?;
        }
    }
    w.flush()
}

/// One field of `e`'s line; None: nothing to show (the module's list).
fn field(trace: &Trace, e: &Event, name: &str, f: ScriptField) -> Option<String> {
    let ret = e.is_return();
    Some(match f {
        ScriptField::Comm => format!("{:>16}", task_columns(trace, e).0),
        ScriptField::Pid => match trace.task_of(e) {
            Some(t) => format!("{:>7}", t.tgid),
            None => format!("{:>7}", "-"),
        },
        ScriptField::Tid => format!("{:>7}", task_columns(trace, e).1),
        ScriptField::Cpu => format!("[{:03}]", e.cpu),
        ScriptField::Time => format!("{:>12}:", seconds(e.ts_ns)),
        ScriptField::Func if ret => format!("{name} returned"),
        ScriptField::Func => name.to_string(),
        ScriptField::Args => values::entry_args(trace, e)?,
        ScriptField::Caller => {
            let caller = match Caller::of(trace, e.parent) {
                Caller::Known(s) => escape(&s.name).into_owned(),
                Caller::Unknown(ip) => format!("{ip:#x}"),
            };
            match ret {
                true => format!("to {caller}"),
                false => format!("<-{caller}"),
            }
        }
        ScriptField::Retval if ret => {
            format!("ret={}", values::return_value(trace, e.func, e.data)?)
        }
        ScriptField::Retval | ScriptField::Stack => return None,
    })
}

/// The kernel stack of entry `e`, if it has one: a ` => FRAME` line per
/// frame, as the whole line's `<stack trace>` lists them.
fn stack_lines(w: &mut impl Write, trace: &Trace, e: &Event) -> io::Result<()> {
    let Some(stack) = trace.stack_of(e) else {
        return Ok(());
    };
    for i in 0..stack.frames.len() {
        writeln!(w, " => {}", StackFrame::of(trace, stack, i).label())?;
    }
    if !stack.end.is_complete() {
        writeln!(w, " => ... (cut: {})", stack.end.describe())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::symbols::Symbol;
    use crate::trace::model::{Task, TraceMeta, RETURN_BIT};

    fn sym(name: &str, addr: u64) -> Symbol {
        Symbol {
            name: name.into(),
            addr,
            size: 0x100,
        }
    }

    /// An entry of sh (57) on vCPU 1 and its return, and an entry of no
    /// known task on vCPU 0.
    fn trace() -> Trace {
        let ev = |ts_ns, cpu, task, slot| Event {
            ts_ns,
            parent: 0x9010,
            slot,
            func: 0,
            cpu,
            task,
            stack: 0,
            data: 0,
        };
        Trace {
            meta: TraceMeta {
                cpus: 2,
                events_total: 2,
                graph: true,
                ..TraceMeta::default()
            },
            functions: vec![sym("schedule", 0x1000)],
            counts: vec![vec![1, 1]],
            returns: vec![vec![0, 1]],
            callers: vec![sym("do_idle", 0x9000)],
            events: vec![
                ev(1_234_567_890_123, 1, 1, 0x100),
                ev(1_234_567_899_999, 1, 1, 0x100 | RETURN_BIT),
                ev(1_235_000_000_000, 0, 0, 0x200),
            ],
            tasks: vec![Task {
                pid: 58,
                tgid: 57,
                comm: "sh".into(),
            }],
            ..Trace::default()
        }
    }

    fn lines(t: &Trace, fields: &[ScriptField]) -> Vec<String> {
        let mut out = Vec::new();
        write_script_fields(t, fields, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn fields_in_the_order_asked() {
        use ScriptField::*;
        let t = trace();
        assert_eq!(
            lines(&t, &[Comm, Pid, Tid, Cpu, Time, Func, Caller]),
            [
                "              sh      57      58 [001]  1234.567890: schedule <-do_idle",
                "              sh      57      58 [001]  1234.567899: schedule returned to do_idle",
                "           vcpu0       -       1 [000]  1235.000000: schedule <-do_idle",
            ]
        );
        assert_eq!(
            lines(&t, &[Caller, Tid]),
            [
                "<-do_idle      58",
                "to do_idle      58",
                "<-do_idle       1"
            ]
        );
        // Nothing to show for any event: empty lines, one per event.
        assert_eq!(lines(&t, &[Retval]), ["", "", ""]);
    }

    #[test]
    fn what_the_trace_did_not_record_is_missing() {
        use ScriptField::*;
        let mut t = trace();
        for f in [Comm, Pid, Tid, Cpu, Time, Func, Caller] {
            assert_eq!(f.check(&t), Ok(()), "{f:?}");
        }
        assert_eq!(Args.check(&t), Err(FieldMissing::Args));
        assert_eq!(Retval.check(&t), Err(FieldMissing::Retval));
        assert_eq!(Stack.check(&t), Err(FieldMissing::Stacks));
        t.meta.args = true;
        t.meta.retval = true;
        assert_eq!((Args.check(&t), Retval.check(&t)), (Ok(()), Ok(())));
        t.tasks.clear();
        assert_eq!(Tid.check(&t), Err(FieldMissing::Tasks));
    }
}
