//! The perf-style text report of a trace (`vmtrace ...`, `vmtrace report -i FILE`).
//!
//! A `#`-commented header with the facts of the run, then one row per called
//! function:
//!
//! ```text
//! # vmtrace report
//! #
//! # kernel:   /boot/vmlinuz-6.8
//! # ...
//! #
//! #  Share%  Count  vCPU0 / vCPU1 / vCPU2 / vCPU3  Symbol
//! # .......  .....  .............................  ......
//! #
//!    79.99%  4,012  1,000 /   998 / 1,003 / 1,011  schedule
//!                |  8 of 4,012 calls stored
//!                |--62.50%--worker_thread (5)
//!                |--25.00%--kthread (2)
//!                 --12.50%--[unknown] 0xffffffff8300dead (1)
//!
//!    19.94%  1,000    500 /     0 /   500 /     0  do_idle
//! ...
//! #
//! # 2 traced functions were not called: hrtimer_cancel, tick_nohz_idle_exit
//! ```
//!
//! Shares are of the shown rows (after `--cpu`). With more than four vCPUs
//! the spread column shows min / avg / max and the busiest vCPU instead.
//! `--percent-limit P` hides the rows under P% (their calls still count in
//! the shares of the others) and ends the table with how many it hid.
//!
//! Every name and string of the trace is printed through `super::escape`.
//!
//! Function-graph traces add, before the symbol, the exact returns and the
//! durations of the stored calls that returned (`uftrace report`'s
//! columns): total (inclusive) time, self time, average and longest call,
//! in ns, us, ms or s; `-` when none of the function's calls returned.
//! The header says how many calls did not return and why.
//!
//! A trace with arguments or return values (`--args`, `--retval`) says in
//! its header how many traced functions BTF describes, and after the
//! table, once per shown function, what of its values cannot be shown
//! (`# not shown: FUNCTION: ...`).
//!
//! Only rendering lives here: rows, order, callers and the vCPU filter come
//! from the `Report` model.

use std::borrow::Cow;
use std::fmt::Write as _;

use super::duration::human;
use super::header::header;
use super::numbers::thousands;
use super::{escape, By, Report, ReportOptions, Row};
use crate::trace::model::Trace;

/// Up to this many counted vCPUs, the table shows every vCPU's count;
/// beyond it, min / avg / max and the busiest vCPU.
const MAX_CPU_COLUMNS: usize = 4;
/// Symbol names are never squeezed below this many characters, whatever the width.
const MIN_SYMBOL_WIDTH: usize = 20;
/// Indentation of the call-graph (`-g`) lines.
const CALLER_INDENT: usize = 15;

/// The report, as printed (ends with a newline); by task with `By::Task`
/// (`super::tasks`).
pub fn render(trace: &Trace, opts: &ReportOptions) -> String {
    if opts.by == By::Task {
        return super::tasks::render_tasks(trace, opts);
    }
    write_report(&Report::new(trace, opts), opts)
}

/// Renders `report` for a terminal `opts.width` characters wide, without
/// the rows under `opts.percent_limit`.
fn write_report(report: &Report, opts: &ReportOptions) -> String {
    let width = opts.width;
    let shown_total = report.total();
    let share = |row: &Row| 100.0 * row.total as f64 / shown_total as f64;
    let rows = shown_rows(report, opts.percent_limit);
    let hidden = report.rows.len() - rows.len();
    let rows = &rows[..];

    let mut out = String::new();
    header(&mut out, report);

    // Columns.
    let share_w = "100.00%".len();
    let counts: Vec<String> = rows.iter().map(|r| thousands(r.total)).collect();
    let count_w = counts
        .iter()
        .map(String::len)
        .max()
        .unwrap_or(0)
        .max("Count".len());
    let spread = Spread::new(rows, &report.cpus);
    let times = report.graph.is_some().then(|| Times::new(rows));
    let times_w = times.as_ref().map_or(0, Times::width);
    let prefix_w = 2
        + share_w
        + 2
        + count_w
        + 2
        + spread.width
        + if spread.width > 0 { 2 } else { 0 }
        + times_w;
    let sym_w = width.saturating_sub(prefix_w).max(MIN_SYMBOL_WIDTH);
    let gap = if spread.width > 0 { "  " } else { "" };
    let dots = |w: usize| ".".repeat(w);

    writeln!(
        out,
        "# {:>share_w$}  {:>count_w$}  {}{gap}{}Symbol",
        "Share%",
        "Count",
        spread.title,
        times.as_ref().map_or(String::new(), Times::title)
    )
    .unwrap();
    writeln!(
        out,
        "# {}  {}  {}{gap}{}{}",
        dots(share_w),
        dots(count_w),
        dots(spread.width),
        times.as_ref().map_or(String::new(), Times::dots),
        dots(sym_w.min(30))
    )
    .unwrap();
    writeln!(out, "#").unwrap();

    for (i, (row, count)) in rows.iter().zip(&counts).enumerate() {
        writeln!(
            out,
            "  {:>share_w$}  {count:>count_w$}  {}{gap}{}{}",
            format!("{:.2}%", share(row)),
            spread.cell(row),
            times.as_ref().map_or(String::new(), |t| t.cells(i)),
            truncate(&escape(&row.func.name), sym_w)
        )
        .unwrap();
        if report.with_callers {
            call_graph(&mut out, row, width);
        }
    }
    footer(&mut out, report, hidden, opts.percent_limit);
    unshown_notes(&mut out, report, rows);
    super::stacks::write_stacks(&mut out, report);
    super::events::write_events(&mut out, report);
    out
}

/// What of the shown `rows`' values cannot be shown, a line each.
fn unshown_notes(out: &mut String, report: &Report, rows: &[Row]) {
    let shown: std::collections::HashSet<usize> = rows.iter().map(|r| r.index).collect();
    let notes = crate::trace::values::unshown_lines(report.trace, |f| shown.contains(&f));
    if !notes.is_empty() {
        out.push_str("#\n");
        for n in notes {
            writeln!(out, "# not shown: {n}").unwrap();
        }
    }
}

/// The rows with at least `percent_limit`% of the calls (all without one).
fn shown_rows<'r, 't>(report: &'r Report<'t>, percent_limit: Option<f64>) -> Cow<'r, [Row<'t>]> {
    let total = report.total();
    let share = |row: &Row| 100.0 * row.total as f64 / total as f64;
    match percent_limit {
        Some(limit) => report
            .rows
            .iter()
            .filter(|r| share(r) >= limit)
            .cloned()
            .collect(),
        None => Cow::Borrowed(&report.rows),
    }
}

/// What the table does not show: no call at all, rows under
/// `--percent-limit` (`hidden` of them), traced functions not called.
fn footer(out: &mut String, report: &Report, hidden: usize, percent_limit: Option<f64>) {
    let on = if report.filtered {
        " on the selected vCPUs"
    } else {
        ""
    };
    if report.rows.is_empty() {
        writeln!(out, "# no traced function was called{on}").unwrap();
    }
    if hidden > 0 {
        let n = if hidden == 1 {
            "function was"
        } else {
            "functions were"
        };
        writeln!(
            out,
            "#\n# {hidden} called {n} hidden: under {}% of the calls (--percent-limit)",
            percent_limit.unwrap_or(0.0)
        )
        .unwrap();
    }
    let uncalled = report.uncalled.len();
    if uncalled > 0 {
        let n = if uncalled == 1 {
            "function was"
        } else {
            "functions were"
        };
        writeln!(
            out,
            "#\n# {uncalled} traced {n} not called{on}: {}",
            uncalled_names(&report.uncalled)
        )
        .unwrap();
    }
}

/// Uncalled functions named in the footer at most.
const UNCALLED_NAMED: usize = 5;

/// The first `UNCALLED_NAMED` uncalled functions by name, and how many more.
fn uncalled_names(rows: &[Row]) -> String {
    let names: Vec<_> = rows
        .iter()
        .take(UNCALLED_NAMED)
        .map(|r| escape(&r.func.name))
        .collect();
    let more = rows.len().saturating_sub(UNCALLED_NAMED);
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    format!("{}{more}", names.join(", "))
}

/// The duration columns of a function-graph trace: returns, total, self,
/// avg, max, each right-aligned and followed by two spaces.
struct Times {
    /// Per row, the cells.
    cells: Vec<[String; 5]>,
    widths: [usize; 5],
}

impl Times {
    const TITLES: [&'static str; 5] = ["Returns", "Total", "Self", "Avg", "Max"];

    fn new(rows: &[Row]) -> Times {
        let cells: Vec<[String; 5]> = rows
            .iter()
            .map(|r| {
                let returns = thousands(r.returns);
                match r.durations.filter(|d| d.returned > 0) {
                    Some(d) => [
                        returns,
                        human(d.total_ns),
                        human(d.self_ns),
                        human(d.avg_ns()),
                        human(d.max_ns),
                    ],
                    None => [returns, "-".into(), "-".into(), "-".into(), "-".into()],
                }
            })
            .collect();
        let mut widths = Self::TITLES.map(str::len);
        for row in &cells {
            for (w, c) in widths.iter_mut().zip(row) {
                *w = (*w).max(c.chars().count());
            }
        }
        Times { cells, widths }
    }

    fn width(&self) -> usize {
        self.widths.iter().map(|w| w + 2).sum()
    }

    fn join(&self, cells: [&str; 5]) -> String {
        let mut s = String::new();
        for (c, &w) in cells.iter().zip(&self.widths) {
            write!(s, "{c:>w$}  ").unwrap();
        }
        s
    }

    fn title(&self) -> String {
        self.join(Self::TITLES)
    }

    fn dots(&self) -> String {
        let d = self.widths.map(|w| ".".repeat(w));
        self.join([&d[0], &d[1], &d[2], &d[3], &d[4]].map(String::as_str))
    }

    fn cells(&self, row: usize) -> String {
        let c = &self.cells[row];
        self.join([&c[0], &c[1], &c[2], &c[3], &c[4]].map(String::as_str))
    }
}

/// The per-CPU spread column.
struct Spread {
    title: String,
    width: usize,
    /// Width of each sub-column.
    sub: Vec<usize>,
    /// Show every vCPU (else min / avg / max / busiest).
    each: bool,
    sel: Vec<u32>,
}

impl Spread {
    fn new(rows: &[Row], sel: &[u32]) -> Spread {
        let each = sel.len() <= MAX_CPU_COLUMNS;
        let labels: Vec<String> = if sel.len() <= 1 {
            Vec::new()
        } else if each {
            sel.iter().map(|c| format!("vCPU{c}")).collect()
        } else {
            ["min", "avg", "max", "busiest"].map(String::from).to_vec()
        };
        let mut sub: Vec<usize> = labels.iter().map(String::len).collect();
        let mut s = Spread {
            title: String::new(),
            width: 0,
            sub: Vec::new(),
            each,
            sel: sel.to_vec(),
        };
        if labels.is_empty() {
            return s;
        }
        for row in rows {
            for (w, cell) in sub.iter_mut().zip(s.cells(row)) {
                *w = (*w).max(cell.chars().count());
            }
        }
        s.title = s.join(&labels, &sub);
        s.width = s.title.chars().count();
        s.sub = sub;
        s
    }

    fn cells(&self, row: &Row) -> Vec<String> {
        if self.each {
            return row.per_cpu.iter().map(|&n| thousands(n)).collect();
        }
        let min = row.per_cpu.iter().copied().min().unwrap_or(0);
        let avg = (row.total as f64 / row.per_cpu.len() as f64).round() as u64;
        vec![
            thousands(min),
            thousands(avg),
            thousands(row.per_cpu[row.busiest]),
            format!("vCPU{}", self.sel[row.busiest]),
        ]
    }

    fn join(&self, cells: &[String], sub: &[usize]) -> String {
        let mut s = String::new();
        for (i, (cell, &w)) in cells.iter().zip(sub).enumerate() {
            let sep = if i == 0 {
                ""
            } else if !self.each && i == 3 {
                "  "
            } else {
                " / "
            };
            let pad = w.saturating_sub(cell.chars().count());
            if !self.each && i == 3 {
                write!(s, "{sep}{cell}{}", " ".repeat(pad)).unwrap();
            } else {
                write!(s, "{sep}{}{cell}", " ".repeat(pad)).unwrap();
            }
        }
        s
    }

    fn cell(&self, row: &Row) -> String {
        if self.width == 0 {
            return String::new();
        }
        self.join(&self.cells(row), &self.sub)
    }
}

/// perf-style call graph of one function's callers.
fn call_graph(out: &mut String, row: &Row, width: usize) {
    let list = &row.callers;
    let pad = " ".repeat(CALLER_INDENT);
    let stored: u64 = list.iter().map(|c| c.count).sum();
    if stored == 0 {
        writeln!(out, "{pad}(no stored calls: callers unknown)\n").unwrap();
        return;
    }
    if stored < row.total {
        writeln!(
            out,
            "{pad}|  {} of {} calls stored",
            thousands(stored),
            thousands(row.total)
        )
        .unwrap();
    } else {
        writeln!(out, "{pad}|").unwrap();
    }
    for (i, c) in list.iter().enumerate() {
        let lead = if i + 1 == list.len() { " " } else { "|" };
        let pct = format!("{:.2}%", 100.0 * c.count as f64 / stored as f64);
        let count = format!(" ({})", thousands(c.count));
        let used = CALLER_INDENT + 1 + 2 + pct.len() + 2 + count.len();
        let name = truncate(
            &c.caller.label(),
            width.saturating_sub(used).max(MIN_SYMBOL_WIDTH),
        );
        writeln!(out, "{pad}{lead}--{pct}--{name}{count}").unwrap();
    }
    out.push('\n');
}

/// Cuts `s` to at most `max` characters, marking the cut with `…`.
fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
    t.push('…');
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::symbols::Symbol;

    #[test]
    fn the_footer_names_a_few_uncalled_functions_and_counts_the_rest() {
        let syms: Vec<Symbol> = (0..7)
            .map(|i| Symbol {
                name: format!("f{i}"),
                addr: 0x1000 * i,
                size: 16,
            })
            .collect();
        let rows: Vec<Row> = syms
            .iter()
            .enumerate()
            .map(|(index, func)| Row {
                func,
                index,
                per_cpu: vec![0],
                total: 0,
                busiest: 0,
                callers: Vec::new(),
                returns: 0,
                durations: None,
                not_returned: 0,
            })
            .collect();
        assert_eq!(uncalled_names(&rows[..2]), "f0, f1");
        assert_eq!(uncalled_names(&rows), "f0, f1, f2, f3, f4 and 2 more");
    }
}
