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
//! # 2 traced functions were not called
//! ```
//!
//! Shares are of the shown rows (after `--cpu`). With more than four vCPUs
//! the spread column shows min / avg / max and the busiest vCPU instead.
//!
//! Only rendering lives here: rows, order, callers and the vCPU filter come
//! from the `Report` model.

use std::fmt::Write as _;

use super::{Report, ReportOptions, Row};
use crate::model::Trace;

/// Up to this many counted vCPUs, the table shows every vCPU's count;
/// beyond it, min / avg / max and the busiest vCPU.
const MAX_CPU_COLUMNS: usize = 4;
/// Symbol names are never squeezed below this many characters, whatever the width.
const MIN_SYMBOL_WIDTH: usize = 20;
/// Indentation of the call-graph (`-g`) lines.
const CALLER_INDENT: usize = 15;

/// Formats sorted vCPU numbers compactly: `[0, 2, 3]` → `0,2-3`.
pub fn format_cpu_list(cpus: &[u32]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        if !out.is_empty() {
            out.push(',');
        }
        if i == j {
            write!(out, "{}", cpus[i]).unwrap();
        } else {
            write!(out, "{}-{}", cpus[i], cpus[j]).unwrap();
        }
        i = j + 1;
    }
    out
}

/// `1234567` → `1,234,567`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The report, as printed (ends with a newline).
pub fn render(trace: &Trace, opts: &ReportOptions) -> String {
    write_report(&Report::new(trace, opts), opts.width)
}

/// Renders `report` for a terminal `width` characters wide.
fn write_report(report: &Report, width: usize) -> String {
    let rows = &report.rows;
    let shown_total = report.total();

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
    let prefix_w =
        2 + share_w + 2 + count_w + 2 + spread.width + if spread.width > 0 { 2 } else { 0 };
    let sym_w = width.saturating_sub(prefix_w).max(MIN_SYMBOL_WIDTH);
    let gap = if spread.width > 0 { "  " } else { "" };
    let dots = |w: usize| ".".repeat(w);

    writeln!(
        out,
        "# {:>share_w$}  {:>count_w$}  {}{gap}Symbol",
        "Share%", "Count", spread.title
    )
    .unwrap();
    writeln!(
        out,
        "# {}  {}  {}{gap}{}",
        dots(share_w),
        dots(count_w),
        dots(spread.width),
        dots(sym_w.min(30))
    )
    .unwrap();
    writeln!(out, "#").unwrap();

    for (row, count) in rows.iter().zip(&counts) {
        let share = 100.0 * row.total as f64 / shown_total as f64;
        writeln!(
            out,
            "  {:>share_w$}  {count:>count_w$}  {}{gap}{}",
            format!("{share:.2}%"),
            spread.cell(row),
            truncate(&row.func.name, sym_w)
        )
        .unwrap();
        if report.with_callers {
            call_graph(&mut out, row, width);
        }
    }
    let on = if report.filtered {
        " on the selected vCPUs"
    } else {
        ""
    };
    if rows.is_empty() {
        writeln!(out, "# no traced function was called{on}").unwrap();
    }
    let uncalled = report.uncalled.len();
    if uncalled > 0 {
        let n = if uncalled == 1 {
            "function was"
        } else {
            "functions were"
        };
        writeln!(out, "#\n# {uncalled} traced {n} not called{on}").unwrap();
    }
    out
}

/// The `#` header: the facts of the run.
fn header(out: &mut String, report: &Report) {
    let (trace, sel, missing) = (report.trace, &report.cpus, &report.missing);
    let m = &trace.meta;
    let us = |ns: u64| format!("{:.1} µs", ns as f64 / 1e3);
    let duration = trace.duration_s();
    let rate = if duration > 0.0 {
        format!(
            "{} events/s",
            thousands((m.events_total as f64 / duration).round() as u64)
        )
    } else {
        "n/a (zero duration)".to_string()
    };
    let stored = trace.events.len() as u64;
    let mut lines: Vec<(&str, String)> = vec![
        ("kernel", m.kernel.clone()),
        (
            "build id",
            m.build_id.clone().unwrap_or_else(|| "none".into()),
        ),
        ("vCPUs", m.cpus.to_string()),
        ("duration", format!("{duration:.3} s (attach to detach)")),
        (
            "sites",
            format!(
                "{} patched, {} skipped ({} in init text, {} other)",
                thousands(m.sites_patched),
                thousands(m.sites_skipped_init + m.sites_skipped_other),
                thousands(m.sites_skipped_init),
                thousands(m.sites_skipped_other)
            ),
        ),
        (
            "events",
            format!(
                "{} total, {} stored, {} dropped{}",
                thousands(m.events_total),
                thousands(stored),
                thousands(m.events_dropped),
                if m.events_dropped > 0 {
                    " (over --max-events or a full ring; counts stay exact)"
                } else {
                    ""
                }
            ),
        ),
        ("rate", rate),
        (
            "mode",
            format!(
                "{} ({} trap exits)",
                if m.mode.is_empty() {
                    "unknown"
                } else {
                    &m.mode
                },
                thousands(m.trap_exits)
            ),
        ),
        (
            "attach",
            format!(
                "pause window {}, latency {}",
                us(m.attach_window_ns),
                us(m.attach_latency_ns)
            ),
        ),
        (
            "stopped",
            if m.stop_reason.is_empty() {
                "unknown".to_string()
            } else {
                m.stop_reason.clone()
            },
        ),
    ];
    if m.parent_unreadable > 0 {
        let (n, were) = match m.parent_unreadable {
            1 => ("call's return address", "was"),
            _ => ("calls' return addresses", "were"),
        };
        lines.push((
            "callers",
            format!(
                "{} {n} {were} unreadable (shown as [unknown] 0x0)",
                thousands(m.parent_unreadable)
            ),
        ));
    }
    if report.filtered {
        let mut s = if sel.is_empty() {
            "none of the requested vCPUs exist".to_string()
        } else {
            format!(
                "{} (counts and shares are over these vCPUs)",
                format_cpu_list(sel)
            )
        };
        if !missing.is_empty() {
            write!(
                s,
                "; ignored {}: not in this trace (vCPUs 0-{})",
                format_cpu_list(missing),
                m.cpus.saturating_sub(1)
            )
            .unwrap();
        }
        lines.push(("--cpu", s));
    }
    let key_w = lines.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 1;
    out.push_str("# vmtrace report\n#\n");
    for (k, v) in lines {
        writeln!(out, "# {:<key_w$} {v}", format!("{k}:")).unwrap();
    }
    out.push_str("#\n");
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
