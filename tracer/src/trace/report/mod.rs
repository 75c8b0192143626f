//! The report of a trace, as a model apart from its renderings (like
//! uftrace's report nodes, sorted apart from the fields that print them).
//!
//! `Report::new` applies the options once: which vCPUs count (`--cpu`), the
//! rows and their order (`--sort`), each function's callers (`-g`). The text
//! report (`text`, `render`) and the exports (`crate::trace::export`: JSON, CSV,
//! Chrome, folded stacks) only render a `Report`. The call tree (`tree`)
//! renders the `crate::trace::graph::Graph` of a function-graph trace.
//!
//! Function-graph traces hold returns among their events: only entries are
//! calls (counts, callers, shares); returns give the durations, which come
//! from the trace's `Graph`.
//!
//! The model is deterministic: every ordering ends with the name, then the
//! address, then the function's index in the trace.
//!
//! Names come from a vmlinux or a saved trace, either of which can be
//! crafted: every text rendering prints them through [`escape`], so that a
//! name cannot end a line, forge one, or drive the terminal.

mod drops;
pub mod duration;
mod events;
pub use drops::drops_line;
mod header;
mod numbers;
pub mod stacks;
pub mod tasks;
mod text;
pub mod tree;

use std::cmp::Ordering;
use std::collections::HashMap;

use crate::kernel::symbols::Symbol;
use crate::trace::graph::{Durations, End, Graph};
use crate::trace::model::{Event, Trace};

pub use crate::kernel::names::escape;
pub use numbers::{format_cpu_list, thousands};
pub use tasks::{render_tasks, task_rows, TaskRow};
pub use text::render;
pub use tree::{render_tree, write_tree, TreeOptions};

/// Terminal width assumed when none is known.
pub const DEFAULT_WIDTH: usize = 100;
/// Highest vCPU number `parse_cpu_list` accepts (KVM's own limit is lower).
pub const MAX_CPU: u32 = 4095;

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
    /// Function-graph traces: most inclusive time (over the returned
    /// calls) first, then most calls. Other traces: as `Count`.
    Total,
    /// Most self time (inclusive minus the traced callees') first.
    SelfTime,
    /// Longest average inclusive time first.
    Avg,
    /// Longest single call first.
    Max,
}

/// What the text report's rows are (`--by`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum By {
    /// One row per traced function (perf's `--sort sym`).
    #[default]
    Function,
    /// One row per guest task, `comm-pid` (perf's `--sort comm,pid`):
    /// `tasks::render_tasks`. Its orders: `Sort::Count` and `Sort::Name`.
    Task,
}

/// What the report shows.
#[derive(Clone, Debug, PartialEq)]
pub struct ReportOptions {
    /// `--by`: rows by function (the default) or by guest task.
    pub by: By,
    pub sort: Sort,
    /// `--cpu`: only these vCPUs (counts are summed over them). `None`: all.
    pub cpus: Option<Vec<u32>>,
    /// `-g`: each function's callers, from the stored events.
    pub callers: bool,
    /// Terminal width: long symbol names are cut (with `…`) to fit it.
    pub width: usize,
    /// `--percent-limit`: the text report hides the functions whose share
    /// of the shown calls is below this many percent (perf report's
    /// option), and says how many it hid. `None`: all are shown.
    pub percent_limit: Option<f64>,
}

impl Default for ReportOptions {
    fn default() -> Self {
        ReportOptions {
            by: By::Function,
            sort: Sort::Count,
            cpus: None,
            callers: false,
            width: DEFAULT_WIDTH,
            percent_limit: None,
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

impl ReportOptions {
    /// The whole trace with callers, most calls first: what JSON shows,
    /// whatever `--sort`, `--cpu` and `-g` say.
    pub fn whole_trace() -> Self {
        ReportOptions {
            callers: true,
            ..ReportOptions::default()
        }
    }
}

/// Who made a call: a caller function, or a return address in none of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller<'a> {
    Known(&'a Symbol),
    /// The return address (0 if it could not be read from the guest stack).
    Unknown(u64),
}

impl<'t> Caller<'t> {
    /// The caller function containing return address `ip`, if any.
    pub fn of(trace: &'t Trace, ip: u64) -> Self {
        match trace.caller_of(ip) {
            Some(s) => Caller::Known(s),
            None => Caller::Unknown(ip),
        }
    }

    /// `schedule`, or `[unknown] 0xffffffff81000123`, as printed (the name
    /// through [`escape`]).
    pub fn label(&self) -> String {
        match self {
            Caller::Known(s) => escape(&s.name).into_owned(),
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

/// One traced function in the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row<'t> {
    pub func: &'t Symbol,
    /// Its index in `Trace::functions` (and `Event::func`).
    pub index: usize,
    /// Calls on each counted vCPU, in `Report::cpus` order.
    pub per_cpu: Vec<u64>,
    /// Calls on the counted vCPUs.
    pub total: u64,
    /// Index in `per_cpu` of the busiest vCPU (the lowest on ties).
    pub busiest: usize,
    /// With `ReportOptions::callers`: its callers among the stored events on
    /// the counted vCPUs, most calls first, ties by name then address; the
    /// counts add up to those stored events. Empty otherwise.
    pub callers: Vec<CallerCount<'t>>,
    /// Function-graph traces: returns on the counted vCPUs (exact, by the
    /// vCPU the return ran on). 0 otherwise.
    pub returns: u64,
    /// Function-graph traces: durations of the stored calls made on the
    /// counted vCPUs (by the vCPU of the entry) that returned. None
    /// otherwise.
    pub durations: Option<Durations>,
    /// Function-graph traces: stored calls made on the counted vCPUs that
    /// have no stored return (abandoned, lost, running at detach, unhooked).
    pub not_returned: u64,
}

impl Row<'_> {
    /// Compares the busiest vCPU's share of the calls, as exact fractions.
    /// Both rows must have calls.
    fn concentration_cmp(&self, other: &Row) -> Ordering {
        // a/b vs c/d  <=>  a*d vs c*b (u128: no overflow).
        let lhs = self.per_cpu[self.busiest] as u128 * other.total as u128;
        let rhs = other.per_cpu[other.busiest] as u128 * self.total as u128;
        lhs.cmp(&rhs)
    }

    /// Name, then address, then index: the tie-break of every order.
    fn name_cmp(&self, other: &Row) -> Ordering {
        self.func
            .name
            .cmp(&other.func.name)
            .then(self.func.addr.cmp(&other.func.addr))
            .then(self.index.cmp(&other.index))
    }
}

/// One stored event with its function and caller resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventRow<'t> {
    pub event: &'t Event,
    pub func: &'t Symbol,
    pub caller: Caller<'t>,
}

/// What the function graph of a whole trace adds to its report header, JSON
/// and Chrome export (every vCPU, whatever `--cpu` says).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphSummary {
    /// Returns counted (exact), stored and dropped.
    pub returns: u64,
    pub returns_stored: u64,
    pub returns_dropped: u64,
    /// Stored calls: returned, abandoned (unwound without a return), lost
    /// (returned, the return counted but not stored), still running at
    /// detach (or their return not stored after the last stored event on
    /// their stack), unhooked (stored entries whose return could not be
    /// hooked).
    pub frames: u64,
    pub returned: u64,
    pub abandoned: u64,
    pub lost: u64,
    pub running: u64,
    pub unhooked_stored: u64,
    /// Entries whose return could not be hooked, stored or not (exact).
    pub unhooked: u64,
    /// Returns without a live frame at their slot, and returns whose
    /// function differs from their frame's.
    pub unmatched_returns: u64,
    pub mismatched_returns: u64,
}

impl GraphSummary {
    fn new(trace: &Trace, g: &Graph, returns_stored: u64) -> Self {
        let mut s = GraphSummary {
            returns: trace.returns.iter().flatten().sum(),
            returns_stored,
            returns_dropped: trace.meta.returns_dropped,
            frames: g.frames.len() as u64,
            unhooked: trace.meta.unhooked,
            unmatched_returns: g.unmatched_returns,
            mismatched_returns: g.mismatched_returns,
            ..GraphSummary::default()
        };
        for f in &g.frames {
            match f.end {
                End::Returned { .. } => s.returned += 1,
                End::Abandoned => s.abandoned += 1,
                End::Lost => s.lost += 1,
                End::Running => s.running += 1,
                End::Unhooked => s.unhooked_stored += 1,
            }
        }
        s
    }

    /// Stored calls without a stored return.
    pub fn not_returned(&self) -> u64 {
        self.abandoned + self.lost + self.running + self.unhooked_stored
    }
}

/// A trace with the report options applied.
#[derive(Clone, Debug)]
pub struct Report<'t> {
    pub trace: &'t Trace,
    /// The counted vCPUs, ascending: those requested by `--cpu` that the
    /// trace has, else all of them.
    pub cpus: Vec<u32>,
    /// vCPUs requested by `--cpu` that the trace does not have.
    pub missing: Vec<u32>,
    /// Whether `--cpu` restricted the vCPUs.
    pub filtered: bool,
    /// Whether rows carry their callers (`ReportOptions::callers`).
    pub with_callers: bool,
    /// The functions called on the counted vCPUs, in report order.
    pub rows: Vec<Row<'t>>,
    /// The traced functions not called on the counted vCPUs, by name.
    pub uncalled: Vec<Row<'t>>,
    /// Stored entries (calls) in the whole trace; `trace.events` holds
    /// returns too in function-graph traces.
    pub entries_stored: u64,
    /// Function-graph traces: the replayed graph and its summary.
    pub graph: Option<Graph>,
    pub graph_summary: Option<GraphSummary>,
}

/// Sorts the rows by `sort`.
fn sort_rows(rows: &mut [Row], sort: Sort) {
    // Duration orders: longest first, then most calls, then by name.
    let by_duration = |key: fn(&Durations) -> u64| {
        move |a: &Row, b: &Row| {
            let k = |r: &Row| r.durations.as_ref().map_or(0, key);
            k(b).cmp(&k(a))
                .then(b.total.cmp(&a.total))
                .then_with(|| a.name_cmp(b))
        }
    };
    match sort {
        Sort::Count => rows.sort_by(|a, b| b.total.cmp(&a.total).then_with(|| a.name_cmp(b))),
        Sort::Name => rows.sort_by(Row::name_cmp),
        Sort::Cpu => rows.sort_by(|a, b| {
            b.concentration_cmp(a)
                .then(b.total.cmp(&a.total))
                .then_with(|| a.name_cmp(b))
        }),
        Sort::Total => rows.sort_by(by_duration(|d| d.total_ns)),
        Sort::SelfTime => rows.sort_by(by_duration(|d| d.self_ns)),
        Sort::Avg => rows.sort_by(by_duration(Durations::avg_ns)),
        Sort::Max => rows.sort_by(by_duration(|d| d.max_ns)),
    }
}

/// The vCPUs requested (all when None) that the trace has, and those it
/// has not; each ascending, without repeats.
fn selected_cpus(requested: Option<&[u32]>, ncpus: u32) -> (Vec<u32>, Vec<u32>) {
    match requested {
        None => ((0..ncpus).collect(), Vec::new()),
        Some(c) => {
            let mut c = c.to_vec();
            c.sort_unstable();
            c.dedup();
            c.into_iter().partition(|&cpu| cpu < ncpus)
        }
    }
}

impl<'t> Report<'t> {
    pub fn new(trace: &'t Trace, opts: &ReportOptions) -> Self {
        let ncpus = trace.meta.cpus;
        let (cpus, missing) = selected_cpus(opts.cpus.as_deref(), ncpus);
        let filtered = opts.cpus.is_some();
        let returns_stored = trace.events.iter().filter(|e| e.is_return()).count() as u64;
        let entries_stored = trace.events.len() as u64 - returns_stored;
        let graph = trace.meta.graph.then(|| Graph::build(trace));
        let graph_summary = graph
            .as_ref()
            .map(|g| GraphSummary::new(trace, g, returns_stored));
        let (durations, not_returned) = match &graph {
            Some(g) => graph_columns(g, trace.functions.len(), &cpus),
            None => (Vec::new(), Vec::new()),
        };
        let mut callers = if opts.callers {
            callers(trace, filtered.then_some(&cpus[..]))
        } else {
            Vec::new()
        };
        let (mut rows, mut uncalled): (Vec<Row>, Vec<Row>) = trace
            .functions
            .iter()
            .enumerate()
            .map(|(index, func)| {
                let counts = trace.counts.get(index);
                let per_cpu: Vec<u64> = cpus
                    .iter()
                    .map(|&c| counts.and_then(|r| r.get(c as usize)).copied().unwrap_or(0))
                    .collect();
                let mut busiest = 0;
                for (i, &n) in per_cpu.iter().enumerate() {
                    if n > per_cpu[busiest] {
                        busiest = i;
                    }
                }
                let returns = match trace.returns.get(index) {
                    Some(r) => cpus
                        .iter()
                        .map(|&c| r.get(c as usize).copied().unwrap_or(0))
                        .sum(),
                    None => 0,
                };
                Row {
                    func,
                    index,
                    total: per_cpu.iter().sum(),
                    per_cpu,
                    busiest,
                    callers: callers
                        .get_mut(index)
                        .map(std::mem::take)
                        .unwrap_or_default(),
                    returns,
                    durations: durations.get(index).copied(),
                    not_returned: not_returned.get(index).copied().unwrap_or(0),
                }
            })
            .partition(|r| r.total > 0);
        sort_rows(&mut rows, opts.sort);
        uncalled.sort_by(Row::name_cmp);
        Report {
            trace,
            cpus,
            missing,
            filtered,
            with_callers: opts.callers,
            rows,
            uncalled,
            entries_stored,
            graph,
            graph_summary,
        }
    }

    /// Calls of the shown rows: what shares are of.
    pub fn total(&self) -> u64 {
        self.rows.iter().map(|r| r.total).sum()
    }

    /// Every traced function: the called ones in report order, then the
    /// uncalled ones by name.
    pub fn functions(&self) -> impl Iterator<Item = &Row<'t>> {
        self.rows.iter().chain(&self.uncalled)
    }

    /// The stored events on the counted vCPUs, in time order, each with its
    /// function and caller: entries, and in function-graph traces returns
    /// (`Event::is_return`; a return's caller is where it returned to).
    pub fn events(&self) -> impl Iterator<Item = EventRow<'t>> + '_ {
        let trace = self.trace;
        let counted = cpu_mask(self.filtered.then_some(&self.cpus[..]));
        trace.events.iter().filter_map(move |event| {
            let func = trace.functions.get(event.func as usize)?;
            counted(event.cpu).then(|| EventRow {
                event,
                func,
                caller: Caller::of(trace, event.parent),
            })
        })
    }
}

/// For each traced function (indexed like `trace.functions`), its callers
/// among the stored events made on `cpus` (`None`: all vCPUs), most calls
/// first, ties by name then address.
fn callers<'t>(trace: &'t Trace, cpus: Option<&[u32]>) -> Vec<Vec<CallerCount<'t>>> {
    let counted = cpu_mask(cpus);
    // Key: (resolved, caller function address or raw return address).
    let mut maps: Vec<HashMap<(bool, u64), u64>> = vec![HashMap::new(); trace.functions.len()];
    for e in &trace.events {
        // A return's address is its caller's too: counting it would count the call twice.
        if e.is_return() || !counted(e.cpu) {
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

/// Per function (`nfunc`): the durations of its returned calls entered on
/// `cpus`, and how many of its calls entered there did not return.
fn graph_columns(g: &Graph, nfunc: usize, cpus: &[u32]) -> (Vec<Durations>, Vec<u64>) {
    let (_, per_cpu) = g.durations(nfunc, cpus.iter().max().map_or(0, |&c| c as usize + 1));
    let durations = per_cpu
        .iter()
        .map(|row| {
            let mut d = Durations::default();
            for &c in cpus {
                merge(&mut d, &row[c as usize]);
            }
            d
        })
        .collect();
    let mut not_returned = vec![0; nfunc];
    for f in &g.frames {
        if f.total_ns().is_none() && cpus.binary_search(&f.cpu).is_ok() {
            if let Some(n) = not_returned.get_mut(f.func as usize) {
                *n += 1;
            }
        }
    }
    (durations, not_returned)
}

/// Adds the calls of `b` to `a`.
fn merge(a: &mut Durations, b: &Durations) {
    if b.returned == 0 {
        return;
    }
    if a.returned == 0 || b.min_ns < a.min_ns {
        a.min_ns = b.min_ns;
    }
    a.max_ns = a.max_ns.max(b.max_ns);
    a.returned += b.returned;
    a.total_ns = a.total_ns.saturating_add(b.total_ns);
    a.self_ns = a.self_ns.saturating_add(b.self_ns);
}

/// A membership test for a vCPU selection (`None`: every vCPU).
fn cpu_mask(cpus: Option<&[u32]>) -> impl Fn(u32) -> bool + '_ {
    move |cpu| cpus.is_none_or(|c| c.binary_search(&cpu).is_ok())
}
