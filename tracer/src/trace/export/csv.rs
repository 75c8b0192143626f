//! `--format csv`: one row per stored event (see [`write_csv`]).

use std::borrow::Cow;
use std::io::{self, BufWriter, Write};

use crate::trace::model::Trace;
use crate::trace::report::{escape, Caller};
use crate::trace::values;

/// A name as a CSV field: control characters escaped (`report::escape`:
/// a CSV is read in terminals too, and a crafted name must not forge a
/// row), then quoted if it holds a comma or a double quote (RFC 4180).
fn csv_field(s: &str) -> Cow<'_, str> {
    let s = escape(s);
    if s.contains([',', '"']) {
        Cow::Owned(format!("\"{}\"", s.replace('"', "\"\"")))
    } else {
        s
    }
}

/// The header line; which optional columns follow the first ones:
/// arguments, return values, stacks, events' fields.
fn header(w: &mut impl Write, trace: &Trace) -> io::Result<(bool, bool, bool, bool)> {
    let graph = trace.meta.graph;
    let tasks = !trace.tasks.is_empty();
    w.write_all(if graph {
        b"ts_ns,cpu,function,addr,parent,caller,kind,slot".as_slice()
    } else {
        b"ts_ns,cpu,function,addr,parent,caller".as_slice()
    })?;
    let (args, ret) = (trace.meta.args, trace.meta.retval);
    w.write_all(if tasks {
        b",pid,tgid,comm".as_slice()
    } else {
        b"".as_slice()
    })?;
    w.write_all(if args {
        b",args".as_slice()
    } else {
        b"".as_slice()
    })?;
    let stacks = !trace.stacks.is_empty() || !trace.meta.stacks.is_empty();
    w.write_all(if ret {
        b",ret".as_slice()
    } else {
        b"".as_slice()
    })?;
    w.write_all(if stacks {
        b",stack".as_slice()
    } else {
        b"".as_slice()
    })?;
    let fields = !trace.fields.formats.is_empty() || !trace.fields.return_formats.is_empty();
    w.write_all(if fields {
        b",event,fields\n".as_slice()
    } else {
        b"\n".as_slice()
    })?;
    Ok((args, ret, stacks, fields))
}

/// An event entry's `event` and `fields` columns (empty for other rows).
fn event_columns(
    w: &mut impl Write,
    trace: &Trace,
    e: &crate::trace::model::Event,
) -> io::Result<()> {
    let (Some(name), Some(fields)) = (
        trace.event_name(e.func, e.is_return()),
        trace.named_fields(e),
    ) else {
        return w.write_all(b",,");
    };
    let pairs: Vec<String> = fields.iter().map(|(n, v)| format!("{n}={v}")).collect();
    write!(w, ",{},{}", csv_field(name), csv_field(&pairs.join(" ")))
}

/// Writes one row per stored event, in time order, after the header
/// `ts_ns,cpu,function,addr,parent,caller`:
///
/// - `ts_ns`: host `CLOCK_MONOTONIC`, nanoseconds (absolute; the JSON
///   report's `attach_ns` is the attach time on the same clock);
/// - `cpu`: vCPU number;
/// - `function`: the traced function; `addr`: its start address (hex);
/// - `parent`: the return address in the caller (hex; `0x0` if unreadable);
/// - `caller`: the function `parent` falls in, empty if unknown.
///
/// Function-graph traces hold returns too, and two more columns, last so
/// that readers of the first six keep working: `kind` (`entry` or
/// `return`; a return's `parent` is where it returned to) and `slot` (the
/// guest address of the return-address slot, hex, which matches a return
/// with its entry on the same guest stack; `0x0`: the return was not
/// hooked). Entry-only traces keep the six columns.
///
/// A trace that knows its guest tasks (`Trace::tasks`) adds three more,
/// last: `pid`, `tgid` and `comm` of the task that ran the event, empty
/// when it is not known.
///
/// A trace with arguments (`--args`) then adds `args`: an entry's
/// arguments as ftrace prints them, `(name=value, ...)` (`trace::values`;
/// empty when not recorded or its function has no prototype); one with
/// return values (`--retval`) `ret`: a return's value (`-2 (-ENOENT)`;
/// empty for entries and `void` functions).
///
/// A trace with kernel stacks (`--stack`) then adds `stack`: an entry's
/// stack, its frames as `function+0xoffset` (hex where no known function
/// holds the return address; `trace::stacks`) joined by `;`, innermost
/// (the caller) first and outermost last, as recorded; empty when it has
/// none.
///
/// A trace with events' fields (`-e`) then adds `event` and `fields`:
/// an event entry's name (`sched:sched_switch`) and its fields by name,
/// `name=value` each as ftrace prints the value, space-separated
/// (`prev_comm=sh prev_pid=57 ...`); both empty for other rows.
///
/// Lines end with `\n`; names have their control characters escaped
/// (`\x0a`, see `report::escape`) and are quoted per RFC 4180 when needed.
pub fn write_csv(trace: &Trace, w: impl Write) -> io::Result<()> {
    let mut w = BufWriter::with_capacity(1 << 20, w);
    let graph = trace.meta.graph;
    let tasks = !trace.tasks.is_empty();
    let (args, ret, stacks, fields) = header(&mut w, trace)?;
    let names: Vec<Cow<str>> = trace.functions.iter().map(|f| csv_field(&f.name)).collect();
    let comms: Vec<Cow<str>> = trace.tasks.iter().map(|t| csv_field(&t.comm)).collect();
    // Not through `Report`: it would build the function graph, and this streams.
    for e in &trace.events {
        let Some(func) = trace.functions.get(e.func as usize) else {
            continue;
        };
        let caller = match Caller::of(trace, e.parent) {
            Caller::Known(s) => csv_field(&s.name),
            Caller::Unknown(_) => Cow::Borrowed(""),
        };
        write!(
            w,
            "{},{},{},{:#x},{:#x},{}",
            e.ts_ns, e.cpu, names[e.func as usize], func.addr, e.parent, caller
        )?;
        if graph {
            let kind = if e.is_return() { "return" } else { "entry" };
            write!(w, ",{kind},{:#x}", e.stack_slot())?;
        }
        if tasks {
            match trace.task_of(e) {
                Some(t) => write!(w, ",{},{},{}", t.pid, t.tgid, comms[e.task as usize - 1])?,
                None => w.write_all(b",,,")?,
            }
        }
        if args {
            let a = values::entry_args(trace, e).unwrap_or_default();
            write!(w, ",{}", csv_field(&a))?;
        }
        if ret {
            let r = e
                .is_return()
                .then(|| values::return_value(trace, e.func, e.data));
            write!(w, ",{}", csv_field(&r.flatten().unwrap_or_default()))?;
        }
        if stacks {
            w.write_all(b",")?;
            if let Some(s) = trace.stack_of(e) {
                let frames = crate::trace::stacks::frames(trace, s);
                let labels: Vec<String> = frames.iter().map(|f| f.label()).collect();
                w.write_all(csv_field(&labels.join(";")).as_bytes())?;
            }
        }
        if fields {
            event_columns(&mut w, trace, e)?;
        }
        w.write_all(b"\n")?;
    }
    w.flush()
}
