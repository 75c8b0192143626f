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
//! The report is deterministic: the same trace and options give the same
//! bytes (every ordering ends with the name, then the address).

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::trace::{FuncSym, Trace};

/// Terminal width assumed when none is known.
pub const DEFAULT_WIDTH: usize = 100;
/// Highest vCPU number `parse_cpu_list` accepts (KVM's own limit is lower).
pub const MAX_CPU: u32 = 4095;
/// Up to this many selected vCPUs, the table shows every vCPU's count;
/// beyond it, min / avg / max and the busiest vCPU.
const MAX_CPU_COLUMNS: usize = 4;
/// Symbol names are never squeezed below this many characters, whatever the width.
const MIN_SYMBOL_WIDTH: usize = 20;
/// Indentation of the call-graph (`-g`) lines.
const CALLER_INDENT: usize = 15;

/// Order of the report's rows. Ties are always broken by name, then address.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Sort {
    /// Most calls first (perf's default).
    #[default]
    Count,
    /// By symbol name, ascending (byte order).
    Name,
    /// By how concentrated a function's calls are on one vCPU: the busiest
    /// (selected) vCPU's share of the function's calls, highest first, then
    /// most calls first. Functions pinned to a vCPU (per-CPU kthreads,
    /// interrupts routed to one vCPU) come first, evenly spread ones last.
    Cpu,
}

/// What the report shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReportOptions {
    pub sort: Sort,
    /// `--cpu`: only these vCPUs (counts are summed over them). `None`: all.
    pub cpus: Option<Vec<u32>>,
    /// `-g`: each function's callers, from the stored events.
    pub callers: bool,
    /// Terminal width: long symbol names are cut (with `…`) to fit it.
    pub width: usize,
}

impl Default for ReportOptions {
    fn default() -> Self {
        ReportOptions {
            sort: Sort::Count,
            cpus: None,
            callers: false,
            width: DEFAULT_WIDTH,
        }
    }
}

/// Parses a `--cpu` list such as `0,2-3` into sorted, distinct vCPU numbers.
/// The error names the offending part.
pub fn parse_cpu_list(s: &str) -> Result<Vec<u32>, String> {
    if s.trim().is_empty() {
        return Err("empty CPU list; expected e.g. 0,2-3".to_string());
    }
    let number = |part: &str| -> Result<u32, String> {
        let n: u32 = part
            .trim()
            .parse()
            .map_err(|_| format!("bad CPU number '{}' in CPU list '{s}'", part.trim()))?;
        if n > MAX_CPU {
            return Err(format!(
                "CPU {n} in CPU list '{s}' is too large (max {MAX_CPU})"
            ));
        }
        Ok(n)
    };
    let mut cpus = Vec::new();
    for part in s.split(',') {
        if part.trim().is_empty() {
            return Err(format!(
                "empty entry in CPU list '{s}'; remove the stray comma"
            ));
        }
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (number(a)?, number(b)?);
                if a > b {
                    return Err(format!(
                        "bad CPU range '{}' in CPU list '{s}': {a} is after {b}",
                        part.trim()
                    ));
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(number(part)?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

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

/// Who made a call: a caller function, or a return address in none of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller<'a> {
    Known(&'a FuncSym),
    /// The return address (0 if it could not be read from the guest stack).
    Unknown(u64),
}

impl Caller<'_> {
    /// `schedule`, or `[unknown] 0xffffffff81000123`.
    pub fn label(&self) -> String {
        match self {
            Caller::Known(s) => s.name.clone(),
            Caller::Unknown(ip) => format!("[unknown] {ip:#x}"),
        }
    }

    fn sort_key(&self) -> (&str, u64) {
        match self {
            Caller::Known(s) => (&s.name, s.addr),
            Caller::Unknown(ip) => ("[unknown]", *ip),
        }
    }
}

/// One caller of a function and how many of its stored calls it made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallerCount<'a> {
    pub caller: Caller<'a>,
    pub count: u64,
}

/// For each traced function (indexed like `trace.functions`), its callers
/// among the stored events made on `cpus` (`None`: all vCPUs), resolved with
/// `Trace::caller_of`, most calls first, ties by name then address. The
/// counts of one function add up to its stored events on those vCPUs.
pub fn callers<'a>(trace: &'a Trace, cpus: Option<&[u32]>) -> Vec<Vec<CallerCount<'a>>> {
    let selected = cpu_mask(cpus);
    // Key: (resolved, caller function address or raw return address).
    let mut maps: Vec<HashMap<(bool, u64), u64>> = vec![HashMap::new(); trace.functions.len()];
    for e in &trace.events {
        if !selected(e.cpu) {
            continue;
        }
        let Some(map) = maps.get_mut(e.func as usize) else {
            continue;
        };
        let key = match trace.caller_of(e.parent) {
            Some(s) => (true, s.addr),
            None => (false, e.parent),
        };
        *map.entry(key).or_default() += 1;
    }
    maps.into_iter()
        .map(|map| {
            let mut v: Vec<CallerCount> = map
                .into_iter()
                .map(|((known, addr), count)| CallerCount {
                    caller: match trace.caller_of(addr).filter(|_| known) {
                        Some(s) => Caller::Known(s),
                        None => Caller::Unknown(addr),
                    },
                    count,
                })
                .collect();
            v.sort_by(|a, b| {
                b.count
                    .cmp(&a.count)
                    .then_with(|| a.caller.sort_key().cmp(&b.caller.sort_key()))
            });
            v
        })
        .collect()
}

/// A membership test for a vCPU selection.
fn cpu_mask(cpus: Option<&[u32]>) -> impl Fn(u32) -> bool + '_ {
    move |cpu| cpus.is_none_or(|c| c.binary_search(&cpu).is_ok())
}

/// One row of the table.
struct Row<'a> {
    func: &'a FuncSym,
    /// Calls per selected vCPU, in `sel` order.
    per_cpu: Vec<u64>,
    total: u64,
    /// Index of the busiest selected vCPU in `per_cpu` (lowest on ties).
    busiest: usize,
    index: usize,
}

impl Row<'_> {
    /// The busiest vCPU's share of the calls, as an exact fraction for sorting.
    fn concentration_cmp(&self, other: &Row) -> std::cmp::Ordering {
        // a/b vs c/d  <=>  a*d vs c*b (u128: no overflow).
        let lhs = self.per_cpu[self.busiest] as u128 * other.total as u128;
        let rhs = other.per_cpu[other.busiest] as u128 * self.total as u128;
        lhs.cmp(&rhs)
    }
}

/// The report, as printed (ends with a newline).
pub fn render(trace: &Trace, opts: &ReportOptions) -> String {
    let m = &trace.meta;
    let all: Vec<u32> = (0..m.cpus).collect();
    let (sel, missing): (Vec<u32>, Vec<u32>) = match &opts.cpus {
        None => (all.clone(), Vec::new()),
        Some(c) => {
            let mut c = c.clone();
            c.sort_unstable();
            c.dedup();
            c.into_iter().partition(|&cpu| cpu < m.cpus)
        }
    };
    let filtered = opts.cpus.is_some();

    let mut rows: Vec<Row> = trace
        .functions
        .iter()
        .enumerate()
        .map(|(index, func)| {
            let counts = trace.counts.get(index);
            let per_cpu: Vec<u64> = sel
                .iter()
                .map(|&c| counts.and_then(|r| r.get(c as usize)).copied().unwrap_or(0))
                .collect();
            let mut busiest = 0;
            for (i, &n) in per_cpu.iter().enumerate() {
                if n > per_cpu[busiest] {
                    busiest = i;
                }
            }
            Row {
                func,
                total: per_cpu.iter().sum(),
                per_cpu,
                busiest,
                index,
            }
        })
        .collect();
    let uncalled = rows.iter().filter(|r| r.total == 0).count();
    rows.retain(|r| r.total > 0);
    let by_name = |a: &Row, b: &Row| {
        a.func
            .name
            .cmp(&b.func.name)
            .then(a.func.addr.cmp(&b.func.addr))
            .then(a.index.cmp(&b.index))
    };
    match opts.sort {
        Sort::Count => rows.sort_by(|a, b| b.total.cmp(&a.total).then_with(|| by_name(a, b))),
        Sort::Name => rows.sort_by(by_name),
        Sort::Cpu => rows.sort_by(|a, b| {
            b.concentration_cmp(a)
                .then(b.total.cmp(&a.total))
                .then_with(|| by_name(a, b))
        }),
    }
    let shown_total: u64 = rows.iter().map(|r| r.total).sum();

    let mut out = String::new();
    header(&mut out, trace, &sel, &missing, filtered);

    // Columns.
    let share_w = "100.00%".len();
    let counts: Vec<String> = rows.iter().map(|r| thousands(r.total)).collect();
    let count_w = counts
        .iter()
        .map(String::len)
        .max()
        .unwrap_or(0)
        .max("Count".len());
    let spread = Spread::new(&rows, &sel);
    let prefix_w =
        2 + share_w + 2 + count_w + 2 + spread.width + if spread.width > 0 { 2 } else { 0 };
    let sym_w = opts.width.saturating_sub(prefix_w).max(MIN_SYMBOL_WIDTH);
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

    let caller_lists = opts
        .callers
        .then(|| callers(trace, filtered.then_some(&sel[..])));
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
        if let Some(lists) = &caller_lists {
            call_graph(&mut out, row, &lists[row.index], opts.width);
        }
    }
    if rows.is_empty() {
        let on = if filtered {
            " on the selected vCPUs"
        } else {
            ""
        };
        writeln!(out, "# no traced function was called{on}").unwrap();
    }
    if uncalled > 0 {
        let on = if filtered {
            " on the selected vCPUs"
        } else {
            ""
        };
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
fn header(out: &mut String, trace: &Trace, sel: &[u32], missing: &[u32], filtered: bool) {
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
                    " (over --max-events; counts stay exact)"
                } else {
                    ""
                }
            ),
        ),
        ("rate", rate),
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
    if filtered {
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
fn call_graph(out: &mut String, row: &Row, list: &[CallerCount], width: usize) {
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
