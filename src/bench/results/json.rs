//! The `--json FILE` document: the run's settings, every figure by name,
//! the goals' verdicts, the methods, and per bench its entry (`benches`).

use serde::{Serialize, Serializer};

use super::super::suite::BenchId;
use super::benches::{self, BenchEntry};
use super::exitless::{ExitlessFigures, GraphFigures};
use super::ftrace::FtraceJson;
use super::methods::{methods_shown, GoalJson};
use super::{figures, not_measured, Goal, Results, Run};

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
    drain_events: u64,
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
        emulator_host: vmm::host::emulates_ring0(),
        iters: cfg.iters,
        cpus: cfg.cpus,
        rounds: cfg.rounds,
        cycles: cfg.cycles,
        report_events: cfg.report_events,
        record_events: cfg.record_events,
        drain_events: cfg.drain_events,
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
