//! The report by guest task: each task's stored calls and the functions it
//! called (`--by task`, perf's `--sort comm,pid`; the JSON report's
//! `tasks`).
//!
//! A task is one entry of `Trace::tasks` (`comm-pid`): a task that changed
//! its name (exec) is a row per name, and each CPU's idle task (pid 0,
//! `swapper/N`) a row of its own. Calls whose task is not known are one
//! row without a task. Only stored calls (entries) count: a call counted
//! but not stored has no task.
//!
//! ```text
//! #  Share%  Calls  TGID  Task         Functions (most called first)
//! # .......  .....  ....  ...........  ..............................
//! #
//!    50.00%      4    57  sh-57        do_sys_open (3), schedule (1)
//!    25.00%      2     -  swapper/0-0  do_idle (2)
//! ```

use std::collections::HashMap;
use std::fmt::Write as _;

use super::header::header;
use super::numbers::thousands;
use super::{cpu_mask, escape, Report, ReportOptions, Sort};
use crate::kernel::symbols::Symbol;
use crate::trace::model::{Task, Trace};

/// Task labels are never cut below this many characters.
const MIN_TASK_WIDTH: usize = 4;
/// The functions column is never squeezed below this many characters.
const MIN_FUNCTIONS_WIDTH: usize = 20;

/// One task of the report by task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskRow<'t> {
    /// None: the calls whose task is not known.
    pub task: Option<&'t Task>,
    /// Its id (`Event::task`; 0 for the unknown).
    pub id: u32,
    /// Its stored calls (entries) on the counted vCPUs.
    pub count: u64,
    /// The functions it called, most stored calls first (ties by name,
    /// then address, then index): `(Trace::functions` index, calls`)`.
    pub functions: Vec<(u32, u64)>,
}

impl TaskRow<'_> {
    /// `comm-pid` (through `escape`), or `[unknown]`.
    pub fn label(&self) -> String {
        match self.task {
            Some(t) => format!("{}-{}", escape(&t.comm), t.pid),
            None => "[unknown]".to_string(),
        }
    }
}

/// Every task with stored calls made on `cpus` (None: all vCPUs), most
/// calls first (`Sort::Name`: by comm, then pid), the unknown task among
/// them; ties by pid, comm, id.
pub fn task_rows<'t>(trace: &'t Trace, cpus: Option<&[u32]>, sort: Sort) -> Vec<TaskRow<'t>> {
    let counted = cpu_mask(cpus);
    let mut per_task: HashMap<u32, HashMap<u32, u64>> = HashMap::new();
    for e in &trace.events {
        if e.is_return() || !counted(e.cpu) || e.func as usize >= trace.functions.len() {
            continue;
        }
        // An id past the table (a corrupt trace) counts as unknown.
        let id = if trace.task_of(e).is_some() {
            e.task
        } else {
            0
        };
        *per_task.entry(id).or_default().entry(e.func).or_default() += 1;
    }
    let mut rows: Vec<TaskRow> = per_task
        .into_iter()
        .map(|(id, funcs)| {
            let mut functions: Vec<(u32, u64)> = funcs.into_iter().collect();
            functions.sort_by(|a, b| {
                b.1.cmp(&a.1).then_with(|| {
                    let key = |f: u32| {
                        let s: &Symbol = &trace.functions[f as usize];
                        (&s.name, s.addr, f)
                    };
                    key(a.0).cmp(&key(b.0))
                })
            });
            TaskRow {
                task: (id as usize)
                    .checked_sub(1)
                    .and_then(|i| trace.tasks.get(i)),
                id,
                count: functions.iter().map(|f| f.1).sum(),
                functions,
            }
        })
        .collect();
    // Known tasks before the unknown one on ties, then by pid, comm, id.
    let tie = |a: &TaskRow, b: &TaskRow| tie_key(a).cmp(&tie_key(b));
    match sort {
        Sort::Name => rows.sort_by(|a, b| name_key(a).cmp(&name_key(b)).then_with(|| tie(a, b))),
        _ => rows.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| tie(a, b))),
    }
    rows
}

fn tie_key<'a>(r: &'a TaskRow) -> (bool, Option<(u32, &'a str)>, u32) {
    (
        r.task.is_none(),
        r.task.map(|t| (t.pid, t.comm.as_str())),
        r.id,
    )
}

fn name_key<'a>(r: &'a TaskRow) -> (bool, Option<(&'a str, u32)>) {
    (r.task.is_none(), r.task.map(|t| (t.comm.as_str(), t.pid)))
}

/// The report by task (`--by task`), as printed: the header, then one row
/// per task (see the module's documentation).
pub fn render_tasks(trace: &Trace, opts: &ReportOptions) -> String {
    let report = Report::new(trace, opts);
    let mut out = String::new();
    header(&mut out, &report);
    let on = if report.filtered {
        " on the selected vCPUs"
    } else {
        ""
    };
    if trace.tasks.is_empty() {
        let why = match trace.meta.tasks.is_empty() {
            true => "the trace has none (a kernel without BTF, or a trace of an older vmtrace)"
                .to_string(),
            false => escape(&trace.meta.tasks).into_owned(),
        };
        writeln!(out, "# no call names its guest task: {why}").unwrap();
        return out;
    }
    let rows = task_rows(
        trace,
        report.filtered.then_some(&report.cpus[..]),
        opts.sort,
    );
    if rows.is_empty() {
        writeln!(out, "# no traced function was called{on}").unwrap();
        return out;
    }
    let total: u64 = rows.iter().map(|r| r.count).sum();
    let share = |r: &TaskRow| 100.0 * r.count as f64 / total as f64;
    let shown: Vec<&TaskRow> = rows
        .iter()
        .filter(|r| opts.percent_limit.is_none_or(|p| share(r) >= p))
        .collect();
    let dropped = trace.meta.events_dropped;
    writeln!(
        out,
        "# by task: {} stored calls{on}{}",
        thousands(total),
        if dropped > 0 {
            format!(" ({} calls not stored have no task)", thousands(dropped))
        } else {
            String::new()
        }
    )
    .unwrap();
    writeln!(out, "#").unwrap();
    task_table(&mut out, trace, &shown, total, opts);
    let hidden = rows.len() - shown.len();
    if hidden > 0 {
        let n = if hidden == 1 {
            "task was"
        } else {
            "tasks were"
        };
        writeln!(
            out,
            "#\n# {hidden} {n} hidden: under {}% of the calls (--percent-limit)",
            opts.percent_limit.unwrap_or(0.0)
        )
        .unwrap();
    }
    out
}

/// The report by task's column titles and one row per task of `shown`,
/// their share of `total` calls, columns sized to fit.
fn task_table(
    out: &mut String,
    trace: &Trace,
    shown: &[&TaskRow],
    total: u64,
    opts: &ReportOptions,
) {
    let share = |r: &TaskRow| 100.0 * r.count as f64 / total as f64;
    let labels: Vec<String> = shown.iter().map(|r| r.label()).collect();
    let counts: Vec<String> = shown.iter().map(|r| thousands(r.count)).collect();
    let tgids: Vec<String> = shown
        .iter()
        .map(|r| match r.task {
            Some(t) if t.tgid != 0 => t.tgid.to_string(),
            _ => "-".to_string(),
        })
        .collect();
    let width = |cells: &[String], title: &str| {
        cells
            .iter()
            .map(|c| c.chars().count())
            .max()
            .unwrap_or(0)
            .max(title.len())
    };
    let share_w = "100.00%".len();
    let count_w = width(&counts, "Calls");
    let tgid_w = width(&tgids, "TGID");
    let task_w = width(&labels, "Task").max(MIN_TASK_WIDTH);
    let prefix = 2 + share_w + 2 + count_w + 2 + tgid_w + 2 + task_w + 2;
    let funcs_w = opts.width.saturating_sub(prefix).max(MIN_FUNCTIONS_WIDTH);
    let dots = |w: usize| ".".repeat(w);
    writeln!(
        out,
        "# {:>share_w$}  {:>count_w$}  {:>tgid_w$}  {:<task_w$}  Functions (most called first)",
        "Share%", "Calls", "TGID", "Task"
    )
    .unwrap();
    writeln!(
        out,
        "# {}  {}  {}  {}  {}",
        dots(share_w),
        dots(count_w),
        dots(tgid_w),
        dots(task_w),
        dots(funcs_w.min(30))
    )
    .unwrap();
    writeln!(out, "#").unwrap();
    for (i, r) in shown.iter().enumerate() {
        writeln!(
            out,
            "  {:>share_w$}  {:>count_w$}  {:>tgid_w$}  {:<task_w$}  {}",
            format!("{:.2}%", share(r)),
            counts[i],
            tgids[i],
            labels[i],
            functions_cell(trace, r, funcs_w)
        )
        .unwrap();
    }
}

/// `f (3), g (1)`: as many of the row's functions as fit in `width`
/// characters, then `, …` if some do not (the first one always, cut with
/// `…` if it must be).
fn functions_cell(trace: &Trace, row: &TaskRow, width: usize) -> String {
    let mut s = String::new();
    let mut used = 0;
    for (i, &(f, n)) in row.functions.iter().enumerate() {
        let item = format!(
            "{} ({})",
            escape(&trace.functions[f as usize].name),
            thousands(n)
        );
        let sep = if i == 0 { "" } else { ", " };
        // Room for ", …" after it, unless it is the last.
        let reserve = if i + 1 < row.functions.len() { 3 } else { 0 };
        let len = used + sep.len() + item.chars().count();
        if len + reserve <= width {
            s.push_str(sep);
            s.push_str(&item);
            used = len;
            continue;
        }
        if i == 0 {
            let keep = width.saturating_sub(reserve + 1);
            s = item.chars().take(keep).collect();
            s.push('…');
        }
        if reserve > 0 || i > 0 {
            s.push_str(", …");
        }
        break;
    }
    s
}
