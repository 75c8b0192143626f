//! The names a `trace.dat` gives: the kallsyms section (symbols by
//! address), the cmdlines section (pids and their comms) and the pid each
//! event carries.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::trace::model::Trace;
use crate::trace::report::escape;

/// The pid given to vCPU N's events is `PID_BASE + N`; not 0, which
/// libtraceevent always names `<idle>`.
pub const PID_BASE: u32 = 1;
/// In a trace with guest tasks, the pid given to vCPU N's events whose
/// task is unknown is `UNKNOWN_PID_BASE + N`: Linux's PID_MAX_LIMIT (64-bit),
/// which no pid reaches.
pub const UNKNOWN_PID_BASE: u32 = 4 << 20;
/// Name of the symbols that mark where no known function is.
pub const UNKNOWN_SYMBOL: &str = "[unknown]";

/// A symbol name for a kallsyms line: control characters escaped as
/// `\xNN` (as `report::escape` does: a newline would end the line, and
/// trace-cmd prints names to terminals), other blanks (which end the name)
/// as `_`, and an empty name (which libtraceevent refuses, dropping every
/// line after it) as `?`.
fn kallsyms_name(name: &str) -> String {
    if name.is_empty() {
        return "?".into();
    }
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if c.is_control() {
            let _ = write!(out, "\\x{:02x}", u32::from(c));
        } else if c.is_whitespace() {
            out.push('_');
        } else {
            out.push(c);
        }
    }
    out
}

/// The kallsyms section: the traced functions and the callers, by address,
/// one name per address (a traced function's own name first, the largest
/// size), and an [`UNKNOWN_SYMBOL`] at each symbol's end unless another
/// symbol starts before it: libtraceevent then names an address as
/// `Trace::caller_of` does (the last symbol starting at or below it, if the
/// address is inside it).
pub(super) fn kallsyms(trace: &Trace) -> String {
    let mut syms: Vec<(u64, u64, &str)> = trace
        .functions
        .iter()
        .chain(&trace.callers)
        .map(|s| (s.addr, s.size.max(1), s.name.as_str()))
        .collect();
    // Stable: at one address the traced function (listed first) stays.
    syms.sort_by_key(|s| s.0);
    syms.dedup_by(|later, kept| {
        let same = later.0 == kept.0;
        if same {
            kept.1 = kept.1.max(later.1);
        }
        same
    });
    let mut out = String::with_capacity(syms.len() * 48);
    for (i, &(addr, size, name)) in syms.iter().enumerate() {
        let _ = writeln!(out, "{addr:016x} t {}", kallsyms_name(name));
        let end = addr.saturating_add(size);
        // After the last symbol too: libtraceevent finds an address inside
        // the last symbol only if a symbol follows it.
        if syms.get(i + 1).is_none_or(|next| next.0 > end) {
            let _ = writeln!(out, "{end:016x} t {UNKNOWN_SYMBOL}");
        }
    }
    out
}

/// The `common_pid` of an event of task `id` (`Event::task`) on `cpu`.
pub(super) fn pid_of(trace: &Trace, id: u32, cpu: u32) -> u32 {
    if trace.tasks.is_empty() {
        return PID_BASE.wrapping_add(cpu);
    }
    match (id as usize)
        .checked_sub(1)
        .and_then(|i| trace.tasks.get(i))
    {
        Some(t) => t.pid,
        None => UNKNOWN_PID_BASE.wrapping_add(cpu),
    }
}

/// The cmdlines section: `pid comm` lines, by pid. Without tasks, a pseudo
/// task per vCPU; with tasks, the comm of every pid but 0 the events name
/// (the latest, for a renamed task), and a pseudo task per vCPU that has
/// events whose task is unknown.
pub(super) fn cmdlines(trace: &Trace) -> String {
    let mut out = String::new();
    if trace.tasks.is_empty() {
        for cpu in 0..trace.meta.cpus {
            let _ = writeln!(out, "{} vcpu{cpu}", PID_BASE + cpu);
        }
        return out;
    }
    // Per pid: the highest task id naming it (ids grow with time: its
    // latest comm), or the vCPU of a pseudo task.
    enum Name {
        Task(u32),
        Vcpu(u32),
    }
    let mut names: BTreeMap<u32, Name> = BTreeMap::new();
    for e in &trace.events {
        match trace.task_of(e) {
            Some(t) if t.pid == 0 => {}
            Some(t) => {
                let name = names.entry(t.pid).or_insert(Name::Task(e.task));
                if matches!(name, Name::Task(id) if *id < e.task) {
                    *name = Name::Task(e.task);
                }
            }
            // Events on a vCPU the trace does not have are not written.
            None if e.cpu < trace.meta.cpus => {
                let pid = pid_of(trace, e.task, e.cpu);
                names.entry(pid).or_insert(Name::Vcpu(e.cpu));
            }
            None => {}
        }
    }
    for (pid, name) in names {
        let _ = match name {
            Name::Task(id) => writeln!(out, "{pid} {}", escape(&trace.tasks[id as usize - 1].comm)),
            Name::Vcpu(cpu) => writeln!(out, "{pid} vcpu{cpu}"),
        };
    }
    out
}
