//! `--format script`: the stored events as text in ftrace's function-tracer
//! format (what `cat /sys/kernel/tracing/trace` prints with the `function`
//! tracer, and what `perf script` / `trace-cmd report` users grep):
//!
//! ```text
//! # tracer: function
//! #
//! # entries-in-buffer/entries-written: 8/4012   #P:4
//! # 4004 entries lost: counted but not stored (over --max-events or a full ring); counts stay exact
//! #
//! #           TASK-PID     CPU#     TIMESTAMP  FUNCTION
//! #              | |         |         |         |
//!            vcpu0-1       [000]  1234.567890: hrtimer_interrupt <-__sysvec_apic_timer_interrupt
//!            vcpu2-3       [002]  1234.567899: hrtimer_interrupt returned to __sysvec_apic_timer_interrupt
//! ```
//!
//! - The task column is the guest task that made the call, `comm-pid`
//!   (`<idle>-0` for the idle tasks, as ftrace prints them), when the trace
//!   knows it (`Trace::tasks`: a Linux guest with BTF). The trace then also
//!   has ftrace's `record-tgid` column, the task's thread group (process)
//!   id, `(-------)` for the idle tasks and where the task is unknown:
//!
//!   ```text
//!   #           TASK-PID       TGID    CPU#     TIMESTAMP  FUNCTION
//!   #              | |           |       |         |         |
//!                 sh-57      (     57) [001]  1234.567890: do_sys_open <-__x64_sys_openat
//!   ```
//!
//!   A call whose task is not known (or any call of a trace without tasks)
//!   reads `vcpuN-M`, M = N + 1, the thread id the Chrome export gives
//!   vCPU N (0 is the idle task's in ftrace and perf).
//! - The timestamp is the host's `CLOCK_MONOTONIC` (the CSV's `ts_ns`) in
//!   seconds, truncated to microseconds as ftrace prints it; the header's
//!   `# attach:` line gives the attach and detach times on that clock.
//! - An entry is `FUNCTION <-CALLER`, ftrace's own form: the caller is the
//!   function holding the return address, or the address in hex when no
//!   known function holds it.
//! - In a function-graph trace a return is `FUNCTION returned to CALLER`
//!   (CALLER: where execution went back to, named the same way). It has no
//!   `<-`, so a script that counts `FUNCTION <-CALLER` lines counts calls
//!   only; the call tree (`--tree`) pairs returns with their calls.
//! - With `--args`, an entry is `FUNCTION(name=value, ...) <-CALLER`, as
//!   ftrace's `func-args` option prints it; with `--retval`, a return ends
//!   with ` ret=VALUE`, as `funcgraph-retval` does (`trace::values`). The
//!   header says, in one line per function with stored events, what of its
//!   values cannot be shown (`# not shown: FUNCTION: ...`).
//! - With `--stack`, an entry whose kernel stack was recorded is followed
//!   by that stack as ftrace's `func_stack_trace` option prints it: a line
//!   with the entry's task, CPU and time and `<stack trace>`, then one
//!   ` => function+0xoffset` line per frame, innermost (the caller) first
//!   (`trace::stacks`: a return address outside known functions in hex).
//!   A stack the unwinder could not follow to its end ends with
//!   ` => ... (cut: WHY)`. The header says how stacks were unwound
//!   (`# stacks: ...`).
//!
//! - With `-e`, an event's entry whose fields were recorded is the line
//!   ftrace prints for the event, `EVENT: FIELDS` after the task, CPU and
//!   time (`sched_switch: prev_comm=sh prev_pid=57 ... ==> next_comm=...`,
//!   `trace::fields`), instead of its `__traceiter_NAME` call.
//!
//! Every loss is in the header: entries (and returns) counted but not
//! stored, calls whose record was never committed (`unfinished`). Names are printed through `report::escape`.

use std::borrow::Cow;
use std::io::{self, BufWriter, Write};

use crate::trace::cmdline::shell_line;
use crate::trace::model::{Event, Trace};
use crate::trace::report::{escape, Caller};
use crate::trace::stacks::StackFrame;
use crate::trace::values;

/// Writes every stored event of `trace`, in time order, after a `#`
/// header (see the module's documentation).
pub fn write_script(trace: &Trace, w: &mut dyn Write) -> io::Result<()> {
    let mut w = BufWriter::with_capacity(1 << 20, w);
    header(&mut w, trace)?;
    // ftrace's record-tgid option: a TGID column.
    let tgid = !trace.tasks.is_empty();
    let (title, bars) = match tgid {
        true => ("   TGID   ", "     |    "),
        false => ("", ""),
    };
    writeln!(
        w,
        "#           TASK-PID    {title} CPU#     TIMESTAMP  FUNCTION"
    )?;
    writeln!(w, "#              | |      {bars}   |         |         |")?;

    let names: Vec<Cow<str>> = trace.functions.iter().map(|f| escape(&f.name)).collect();
    for e in &trace.events {
        // A corrupt index: the writers of the other formats skip it too.
        let Some(name) = names.get(e.func as usize) else {
            continue;
        };
        event_line(&mut w, trace, e, name, tgid)?;
    }
    w.flush()
}

/// The header's lines up to the column titles: counts, losses, the
/// command line, the kernel, the attach and detach times, the tasks' source and the values.
pub(super) fn header(w: &mut impl Write, trace: &Trace) -> io::Result<()> {
    let m = &trace.meta;
    let returns_stored = trace.events.iter().filter(|e| e.is_return()).count() as u64;
    let entries_stored = trace.events.len() as u64 - returns_stored;
    let returns_total: u64 = trace.returns.iter().flatten().sum();

    writeln!(w, "# tracer: function")?;
    writeln!(w, "#")?;
    writeln!(
        w,
        "# entries-in-buffer/entries-written: {entries_stored}/{}   #P:{}",
        m.events_total, m.cpus
    )?;
    if m.graph {
        writeln!(
            w,
            "# returns-in-buffer/returns-written: {returns_stored}/{returns_total} \
             (lines 'FUNCTION returned to CALLER')"
        )?;
    }
    lost(w, m.events_dropped, "entries")?;
    lost(w, m.returns_dropped, "returns")?;
    if let Some(why) = crate::trace::report::drops_line(m) {
        // The report's line, cause by cause.
        writeln!(w, "# drops: {why}")?;
    }
    if m.unfinished > 0 {
        let what = if m.graph {
            "records (calls or returns)"
        } else {
            "calls"
        };
        writeln!(
            w,
            "# {} {what} unfinished: their record in vmtrace's rings was reserved and never \
             committed (the run ended mid-record); function unknown, not in entries-written",
            m.unfinished
        )?;
    }
    if !m.cmdline.is_empty() {
        writeln!(w, "# cmdline: {}", shell_line(&m.cmdline))?;
    }
    writeln!(
        w,
        "# kernel: {}\n# attach: {}, detach: {} (host CLOCK_MONOTONIC, s)",
        escape(&m.kernel),
        seconds(m.attach_ns).trim_start(),
        seconds(m.detach_ns).trim_start()
    )?;
    if !m.tasks.is_empty() {
        writeln!(w, "# tasks: {}", escape(&m.tasks))?;
    }
    if !m.shown.is_empty() {
        writeln!(w, "# filter: {}", escape(&m.shown))?;
    }
    if !m.stacks.is_empty() {
        writeln!(
            w,
            "# stacks: {} ({} entries with a '<stack trace>')",
            escape(&m.stacks),
            crate::trace::stacks::entries_with_stacks(trace)
        )?;
    }
    values_header(w, trace)?;
    writeln!(w, "#")
}

/// One event's line: task (and with `tgid` its thread group), CPU, time,
/// function `name` with its arguments, caller, and a return's value.
fn event_line(
    w: &mut impl Write,
    trace: &Trace,
    e: &Event,
    name: &str,
    tgid: bool,
) -> io::Result<()> {
    prefix(w, trace, e, tgid)?;
    if let Some(line) = trace.event_line(e) {
        // An event's entry (`-e`): as ftrace prints the event.
        w.write_all(line.as_bytes())?;
        w.write_all(b"\n")?;
        return stack_lines(w, trace, e, tgid);
    }
    w.write_all(name.as_bytes())?;
    if let Some(args) = values::entry_args(trace, e) {
        w.write_all(args.as_bytes())?;
    }
    w.write_all(if e.is_return() {
        b" returned to "
    } else {
        b" <-"
    })?;
    match Caller::of(trace, e.parent) {
        Caller::Known(s) => w.write_all(escape(&s.name).as_bytes())?,
        Caller::Unknown(ip) => write!(w, "{ip:#x}")?,
    }
    if e.is_return() {
        if let Some(v) = values::return_value(trace, e.func, e.data) {
            write!(w, " ret={v}")?;
        }
    }
    w.write_all(b"\n")?;
    stack_lines(w, trace, e, tgid)
}

/// A line's task (and with `tgid` its thread group), CPU and time, up to
/// the function.
fn prefix(w: &mut impl Write, trace: &Trace, e: &Event, tgid: bool) -> io::Result<()> {
    let (comm, pid, group) = task_columns(trace, e);
    write!(w, "{comm:>16}-{pid:<7} ")?;
    if tgid {
        match group {
            Some(g) => write!(w, "({g:>7}) ")?,
            None => w.write_all(b"(-------) ")?,
        }
    }
    write!(w, "[{:03}] {:>12}: ", e.cpu, seconds(e.ts_ns))
}

/// The kernel stack of entry `e`, if it has one, as ftrace's
/// `func_stack_trace` prints it.
fn stack_lines(w: &mut impl Write, trace: &Trace, e: &Event, tgid: bool) -> io::Result<()> {
    let Some(stack) = trace.stack_of(e) else {
        return Ok(());
    };
    prefix(w, trace, e, tgid)?;
    w.write_all(b"<stack trace>\n")?;
    for i in 0..stack.frames.len() {
        writeln!(w, " => {}", StackFrame::of(trace, stack, i).label())?;
    }
    if !stack.end.is_complete() {
        writeln!(w, " => ... (cut: {})", stack.end.describe())?;
    }
    Ok(())
}

/// The values recorded, and once per function with stored events what of
/// them cannot be shown.
fn values_header(w: &mut impl Write, trace: &Trace) -> io::Result<()> {
    let Some(what) = values::recorded(trace) else {
        return Ok(());
    };
    let forms = match (trace.meta.args, trace.meta.retval) {
        (true, true) => "FUNCTION(name=value, ...), ret=VALUE",
        (true, false) => "FUNCTION(name=value, ...)",
        _ => "ret=VALUE",
    };
    writeln!(w, "# values: {what} ({forms}), by the kernel's BTF")?;
    let mut stored = vec![false; trace.functions.len()];
    for e in &trace.events {
        if let Some(s) = stored.get_mut(e.func as usize) {
            *s = true;
        }
    }
    for line in values::unshown_lines(trace, |f| stored[f]) {
        writeln!(w, "# not shown: {line}")?;
    }
    Ok(())
}

/// The task of `e` as ftrace prints it: comm, pid and (0 or unknown:
/// None) tgid; the vCPU's pseudo task when the task is unknown.
pub(super) fn task_columns<'t>(trace: &'t Trace, e: &Event) -> (Cow<'t, str>, u64, Option<u32>) {
    match trace.task_of(e) {
        // ftrace names every idle task `<idle>` (trace_find_cmdline).
        Some(t) if t.pid == 0 => (Cow::Borrowed("<idle>"), 0, None),
        Some(t) => (
            escape(&t.comm),
            u64::from(t.pid),
            Some(t.tgid).filter(|&g| g != 0),
        ),
        None => (
            Cow::Owned(format!("vcpu{}", e.cpu)),
            u64::from(e.cpu) + 1,
            None,
        ),
    }
}

/// The header line for `n` events of a kind counted but not stored.
fn lost(w: &mut impl Write, n: u64, what: &str) -> io::Result<()> {
    if n == 0 {
        return Ok(());
    }
    writeln!(
        w,
        "# {n} {what} lost: counted but not stored (over --max-events or a full ring); \
         counts stay exact"
    )
}

/// `1234.567890`: ns as seconds, truncated to microseconds (ftrace's
/// `%5lu.%06lu`).
pub(super) fn seconds(ns: u64) -> String {
    format!("{:5}.{:06}", ns / 1_000_000_000, ns % 1_000_000_000 / 1_000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::symbols::Symbol;
    use crate::trace::model::{Event, TraceMeta, RETURN_BIT};

    fn sym(name: &str, addr: u64) -> Symbol {
        Symbol {
            name: name.into(),
            addr,
            size: 0x100,
        }
    }

    fn trace() -> Trace {
        let ev = |ts_ns, func, cpu, parent, slot| Event {
            ts_ns,
            parent,
            slot,
            func,
            cpu,
            task: 0,
            stack: 0,
            data: 0,
        };
        Trace {
            meta: TraceMeta {
                kernel: "bzImage".into(),
                cpus: 4,
                attach_ns: 1_234_000_000_000,
                detach_ns: 1_236_000_000_000,
                events_total: 5,
                events_dropped: 3,
                graph: true,
                returns_dropped: 1,
                ..TraceMeta::default()
            },
            functions: vec![sym("hrtimer_interrupt", 0x1000), sym("evil\n  x", 0x2000)],
            counts: vec![vec![1, 0, 0, 0], vec![0, 0, 1, 0]],
            returns: vec![vec![1, 0, 0, 0], vec![0, 0, 1, 0]],
            callers: vec![sym("__sysvec_apic_timer_interrupt", 0x9000)],
            events: vec![
                ev(1_234_567_890_123, 0, 0, 0x9010, 0x100),
                ev(1_234_567_899_999, 0, 0, 0x9010, 0x100 | RETURN_BIT),
                ev(1_235_000_000_000, 1, 2, 0xdead, 0),
            ],
            tasks: Vec::new(),
            args: Vec::new(),
            prototypes: Vec::new(),
            stacks: Vec::new(),
            fields: Default::default(),
        }
    }

    fn script(t: &Trace) -> String {
        let mut out = Vec::new();
        write_script(t, &mut out).expect("write");
        String::from_utf8(out).expect("utf-8")
    }

    #[test]
    fn lines_are_ftraces() {
        let out = script(&trace());
        let lines: Vec<&str> = out.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            lines,
            [
                "           vcpu0-1       [000]  1234.567890: hrtimer_interrupt <-__sysvec_apic_timer_interrupt",
                "           vcpu0-1       [000]  1234.567899: hrtimer_interrupt returned to __sysvec_apic_timer_interrupt",
                "           vcpu2-3       [002]  1235.000000: evil\\x0a  x <-0xdead",
            ]
        );
    }

    #[test]
    fn header_says_counts_and_losses() {
        let out = script(&trace());
        let header: Vec<&str> = out.lines().take_while(|l| l.starts_with('#')).collect();
        assert_eq!(header[0], "# tracer: function");
        assert!(header.contains(&"# entries-in-buffer/entries-written: 2/5   #P:4"));
        assert!(header.contains(
            &"# returns-in-buffer/returns-written: 1/2 (lines 'FUNCTION returned to CALLER')"
        ));
        assert!(header.iter().any(|l| l.starts_with("# 3 entries lost:")));
        assert!(header.iter().any(|l| l.starts_with("# 1 returns lost:")));
        assert!(header
            .contains(&"# attach: 1234.000000, detach: 1236.000000 (host CLOCK_MONOTONIC, s)"));

        // Nothing lost, entry-only: no such lines.
        let mut t = trace();
        t.meta.events_dropped = 0;
        t.meta.returns_dropped = 0;
        t.meta.graph = false;
        t.returns.clear();
        t.events.retain(|e| !e.is_return());
        let out = script(&t);
        assert!(!out.contains("lost"), "{out}");
        assert!(!out.contains("returns-in-buffer"), "{out}");
    }
}
