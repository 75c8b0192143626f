//! The `--json FILE` document: the run's settings, every figure by name,
//! the goals' verdicts, the methods, and per bench its entry (`benches`).

use serde::{Serialize, Serializer};
use tracer::trace::model::{SYNTH_CALLERS, SYNTH_CPUS, SYNTH_FUNCS};

use super::super::measure::TRACE_GLOB;
use super::super::suite::BenchId;
use super::benches::{self, BenchEntry};
use super::exitless::{ExitlessFigures, GraphFigures};
use super::ftrace::FtraceJson;
use super::{attach_modes, exitless, figures, ftrace, not_measured, record, Goal, Results, Run};
use crate::config::{emulator_host, BenchConfig};

/// `schema` of the JSON document.
pub const JSON_SCHEMA: &str = "vmtrace-bench/1";

/// The `--json FILE` document. Figures and methods are objects whose keys
/// keep the order they are printed in.
#[derive(Serialize)]
struct BenchJson<'a> {
    schema: &'static str,
    /// The mini guest; null when no bench run needs it.
    kernel: Option<String>,
    vmlinux: Option<String>,
    emulator_host: bool,
    iters: u64,
    cpus: u64,
    rounds: usize,
    cycles: usize,
    report_events: u64,
    record_events: u64,
    /// `--counts-only`: (a)-(e), (h) and the report figure not measured.
    counts_only: bool,
    /// A non-finite figure is written as null: one not measured (in
    /// `not_measured`, with why), or one with no samples.
    #[serde(serialize_with = "ordered_map")]
    figures: &'a [(String, f64)],
    /// The figures the host's noise swamped, each with why.
    #[serde(serialize_with = "ordered_map")]
    not_measured: &'a [(String, String)],
    /// (f), and (i); null when neither was run.
    exitless: Option<ExitlessJson>,
    /// (g); null when not run.
    graph: Option<GraphFigures>,
    goals: Vec<GoalJson>,
    #[serde(serialize_with = "ordered_map")]
    methods: &'a [(&'static str, String)],
    /// Each bench shown, by name, with its goal, figure, values and verdicts.
    benches: Vec<BenchEntry>,
}

/// The `exitless` object: (f)'s figures, then (i)'s.
#[derive(Serialize)]
struct ExitlessJson {
    #[serde(flatten)]
    figures: Option<ExitlessFigures>,
    #[serde(flatten)]
    boot: Option<FtraceJson>,
}

#[derive(Serialize)]
pub struct GoalJson {
    goal: String,
    status: &'static str,
    measured: String,
    /// Why the goal was not judged (status SKIP).
    not_judged: Option<String>,
}

impl GoalJson {
    pub fn new(g: &Goal) -> Self {
        GoalJson {
            goal: g.name.clone(),
            status: g.status(),
            measured: g.measured.clone(),
            not_judged: g.pass.as_ref().err().cloned(),
        }
    }
}

/// `(key, value)` pairs as a JSON object, in their order.
pub fn ordered_map<K: Serialize, V: Serialize, S: Serializer>(
    pairs: &&[(K, V)],
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_map(pairs.iter().map(|(k, v)| (k, v)))
}

/// The JSON document of `--json FILE`.
pub fn json(r: &Results, goals: &[Goal], run: &Run<'_>) -> serde_json::Result<String> {
    let cfg = run.cfg;
    let shows = |id| cfg.benches.shows(id);
    let exitless = ExitlessJson {
        figures: r.exitless.as_ref().map(ExitlessFigures::new),
        boot: shows(BenchId::BootFtrace).then(|| FtraceJson::new(&r.ftrace, cfg.linux_boots)),
    };
    let doc = BenchJson {
        schema: JSON_SCHEMA,
        kernel: cfg.kernel.as_ref().map(|k| k.display().to_string()),
        vmlinux: cfg.vmlinux.as_ref().map(|v| v.display().to_string()),
        emulator_host: emulator_host(),
        iters: cfg.iters,
        cpus: cfg.cpus,
        rounds: cfg.rounds,
        cycles: cfg.cycles,
        report_events: cfg.report_events,
        record_events: cfg.record_events,
        counts_only: cfg.counts_only,
        figures: &figures(r),
        not_measured: &not_measured(r),
        exitless: (exitless.figures.is_some() || exitless.boot.is_some()).then_some(exitless),
        graph: r
            .graph
            .as_ref()
            .map(|g| GraphFigures::new(g, r.exitless.as_ref())),
        goals: goals.iter().map(GoalJson::new).collect(),
        methods: &methods_shown(cfg),
        benches: benches::entries(r, cfg),
    };
    let mut j = serde_json::to_string_pretty(&doc)?;
    j.push('\n');
    Ok(j)
}

/// The bench a method (by its key in `methods`) belongs to.
pub fn method_bench(key: &str) -> BenchId {
    match key {
        "(a)" | "(b)" | "(c)" => BenchId::CallTrap,
        "(d)" => BenchId::AttachPause,
        "(e)" | "loading" => BenchId::AttachScaling,
        "(f)" => BenchId::CallExitless,
        "(g)" => BenchId::CallGraph,
        "report" => BenchId::ReportRender,
        "(h)" => BenchId::RecordThroughput,
        "(i)" => BenchId::BootFtrace,
        _ => BenchId::AttachModes,
    }
}

/// The methods of the benches shown.
pub fn methods_shown(cfg: &BenchConfig) -> Vec<(&'static str, String)> {
    methods()
        .into_iter()
        .filter(|(k, _)| cfg.benches.shows(method_bench(k)))
        .collect()
}

/// How each figure is measured (printed, and saved in the JSON).
pub fn methods() -> Vec<(&'static str, String)> {
    vec![
        (
            "(a)",
            format!(
                "one `out` exit through KVM and vmtrace's vCPU loop and back, with the cheapest \
                 correct handler (find the site, resume after it): (t_resume-only - t_untraced) / \
                 exits per iteration, t = µs per guest iteration per vCPU in phases of --iters \
                 iterations of the mini guest (mode=loop) with the {TRACE_GLOB} sites patched \
                 (or not)"
            ),
        ),
        (
            "(b)",
            "(t_recorder - t_untraced) / exits per iteration, the same with vmtrace's real \
             per-vCPU Recorder; the three phases run in rotating order in one guest, --rounds \
             times, and a and b are medians over the rounds"
                .into(),
        ),
        (
            "(c)",
            "b / a per round, median over the rounds; the handlers timed alone in process \
             (no exit) cross-check b - a"
                .into(),
        ),
        (
            "(d)",
            "the mini guest in mode=loop with 1, 2 and 4 vCPUs running: latency = pause \
             request to all vCPUs parked; window = all parked to release, for empty pauses and \
             for pauses that attach (or detach) all its patchable sites"
                .into(),
        ),
        (
            "(e)",
            "the Linux vmlinux loaded into a VM at its physical addresses with the boot page \
             tables, started paused and never booted (booting takes minutes here): \
             Tracer::attach, i.e. the vmlinux check and the patching a live attach does while \
             the vCPUs are parked, timed for 10, 100, 1,000 and all the sites --trace '*' \
             selects, spread evenly over the text; goals judged on the worst attach"
                .into(),
        ),
        ("(f)", exitless::method()),
        ("(g)", exitless::graph_method()),
        (
            "loading",
            "KernelImage::load + SiteTable::build of that vmlinux, median of the loads made for (e)"
                .into(),
        ),
        (
            "report",
            format!(
                "report::render with callers, and export::write_json to a sink, of a synthetic \
                 trace: {SYNTH_FUNCS} functions, {SYNTH_CALLERS} callers, {SYNTH_CPUS} vCPUs"
            ),
        ),
        ("(h)", record::method()),
        ("(i)", ftrace::method()),
        ("(j)", attach_modes::method()),
    ]
}
