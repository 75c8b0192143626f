//! The JSON's `benches`: per bench its name, the question it answers, what
//! it needs, its figure and unit, its headline values (median, samples and
//! their spread), all its figures, its goals' verdicts and its methods.

use serde::{Serialize, Serializer};

use super::super::measure::{BootConfig, QemuFigures};
use super::super::suite::{bench, BenchId, BENCHES};
use super::exitless::{ExitlessFigures, GraphFigures};
use super::ftrace::{FtraceJson, HOW};
use super::goals::goals_of;
use super::methods::{method_bench, methods, GoalJson};
use super::stack::StackFigures;
use super::{figures_of, max, min, Results, COUNTS_ONLY};
use crate::bench::{fig, median};
use crate::config::BenchConfig;

/// One bench's entry.
#[derive(Serialize)]
pub struct BenchEntry {
    name: &'static str,
    /// The letters it was known by; still accepted as names.
    aliases: &'static [&'static str],
    /// The question it answers.
    goal: &'static str,
    needs: &'static str,
    /// The figure it reports, and its unit.
    figure: &'static str,
    unit: &'static str,
    /// Whether it was measured (false: shown in the default set, or
    /// `--counts-only`, but not run, or failed; `not_measured` says why).
    measured: bool,
    /// Why it, or some of its figures, was not measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    not_measured: Option<String>,
    /// Its headline figures.
    values: Vec<Value>,
    /// All its figures, as in the document's `figures` (or its `exitless`
    /// and `graph` objects); null when not measured.
    figures: Option<Figures>,
    goals: Vec<GoalJson>,
    methods: Ordered<&'static str, String>,
}

/// `(key, value)` pairs as a JSON object, in their order.
pub struct Ordered<K, V>(Vec<(K, V)>);

impl<K: Serialize, V: Serialize> Serialize for Ordered<K, V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

/// A headline figure: the median over `samples` values (rounds, pauses,
/// attaches, boots), and their range; without samples, one measurement.
#[derive(Serialize)]
pub struct Value {
    key: String,
    /// Null where not measured.
    value: f64,
    unit: &'static str,
    samples: Option<usize>,
    min: Option<f64>,
    max: Option<f64>,
}

fn value(key: impl Into<String>, value: f64, unit: &'static str, samples: Option<&[f64]>) -> Value {
    let spread = samples.filter(|v| !v.is_empty() && !value.is_nan());
    Value {
        key: key.into(),
        value,
        unit,
        samples: samples.map(<[f64]>::len),
        min: spread.map(min),
        max: spread.map(max),
    }
}

/// A bench's figures: named numbers, or (f), (g) and (i)'s objects.
#[derive(Serialize)]
#[serde(untagged)]
pub enum Figures {
    Named(Ordered<String, f64>),
    Exitless(Box<ExitlessFigures>),
    Graph(Box<GraphFigures>),
    Boot(Box<FtraceJson>),
}

/// Every bench shown, in the order `vmtrace bench list` gives.
pub fn entries(r: &Results, cfg: &BenchConfig) -> Vec<BenchEntry> {
    BENCHES
        .iter()
        .filter(|b| cfg.benches.shows(b.id))
        .map(|b| entry(b.id, r, cfg))
        .collect()
}

fn entry(id: BenchId, r: &Results, cfg: &BenchConfig) -> BenchEntry {
    let b = bench(id);
    let (values, figures) = measured(id, r, cfg);
    let not_measured = match (&figures, id) {
        (Some(_), BenchId::CallTrap) => r.calls_not_measured.clone(),
        (Some(_), BenchId::CallStack) => r
            .stack
            .as_ref()
            .and_then(|c| StackFigures::new(c).not_measured),
        (Some(_), BenchId::BootFtrace) => match &r.ftrace {
            Some(Ok(f)) => super::ftrace::swamped(f),
            _ => None,
        },
        (Some(_), _) => None,
        (None, _) => Some(why_not(id, r, cfg)),
    };
    let methods = methods()
        .into_iter()
        .filter(|(k, _)| method_bench(k) == id)
        .collect();
    BenchEntry {
        name: b.name,
        aliases: b.aliases,
        goal: b.goal,
        needs: b.needs.describe(),
        figure: b.figure,
        unit: b.unit,
        measured: figures.is_some(),
        not_measured,
        values,
        figures,
        goals: goals_of(id, r, cfg).iter().map(GoalJson::new).collect(),
        methods: Ordered(methods),
    }
}

/// Why a bench shown was not measured.
fn why_not(id: BenchId, r: &Results, cfg: &BenchConfig) -> String {
    match (id, &r.ftrace) {
        (BenchId::BootFtrace, Some(Err(e))) => format!("failed: {e}"),
        (BenchId::BootFtrace, _) => format!("not asked for: {HOW}"),
        (BenchId::AttachScaling, _) if !cfg.counts_only => "no vmlinux".into(),
        (
            BenchId::CallDirect
            | BenchId::AttachDirect
            | BenchId::SitesDirect
            | BenchId::EventsCost,
            _,
        ) => super::table::direct_not_run(id, cfg),
        _ if cfg.counts_only => COUNTS_ONLY.into(),
        _ => "not run".into(),
    }
}

/// A bench's headline values and figures; None for its figures: not measured.
fn measured(id: BenchId, r: &Results, cfg: &BenchConfig) -> (Vec<Value>, Option<Figures>) {
    let named = |r| Some(Figures::Named(Ordered(figures_of(id, r))));
    match id {
        BenchId::CallTrap => match &r.costs {
            Some(c) => (
                vec![
                    value("c_ratio", r.c, "ratio", Some(&c.ratios())),
                    value("a_exit_round_trip_us", r.a, "µs", Some(&c.a)),
                    value("b_traced_call_us", r.b, "µs", Some(&c.b)),
                ],
                named(r),
            ),
            None => (Vec::new(), None),
        },
        BenchId::CallExitless => match &r.exitless {
            Some(c) => {
                let f = ExitlessFigures::new(c);
                let counted = c.counted_instructions().ok();
                let values = vec![
                    value(
                        "guest_instructions_per_call",
                        f.guest_instructions_per_call,
                        "guest instructions",
                        Some(&c.instructions()),
                    ),
                    value(
                        "guest_instructions_per_call_counted",
                        f.guest_instructions_per_call_counted.unwrap_or(f64::NAN),
                        "guest instructions",
                        counted.as_deref(),
                    ),
                    value("exits_per_call", f.exits_per_call, "exits", None),
                    value(
                        "exitless_vs_trap",
                        f.exitless_vs_trap,
                        "ratio",
                        Some(&c.ratios()),
                    ),
                ];
                (values, Some(Figures::Exitless(Box::new(f))))
            }
            None => (Vec::new(), None),
        },
        BenchId::CallGraph => match &r.graph {
            Some(g) => {
                let f = GraphFigures::new(g, r.exitless.as_ref());
                let counted = g.counted_instructions().ok();
                let values = vec![
                    value("trap_exits_per_call", f.trap_exits_per_call, "exits", None),
                    value(
                        "guest_instructions_per_call",
                        f.guest_instructions_per_call,
                        "guest instructions",
                        Some(&g.instructions()),
                    ),
                    value(
                        "guest_instructions_per_call_counted",
                        f.guest_instructions_per_call_counted.unwrap_or(f64::NAN),
                        "guest instructions",
                        counted.as_deref(),
                    ),
                ];
                (values, Some(Figures::Graph(Box::new(f))))
            }
            None => (Vec::new(), None),
        },
        BenchId::CallStack => stack_values(r),
        BenchId::BootFtrace => boot_values(r, cfg),
        _ => {
            let values = other_values(id, r);
            match values.is_empty() {
                true => (values, None),
                false => (values, named(r)),
            }
        }
    }
}

/// call/stack's headline: with over without, both, frames, exits.
fn stack_values(r: &Results) -> (Vec<Value>, Option<Figures>) {
    let Some(c) = &r.stack else {
        return (Vec::new(), None);
    };
    let f = StackFigures::new(c);
    let values = vec![
        value(
            "stack_with_over_without",
            f.ratio,
            "ratio",
            Some(&c.ratios()),
        ),
        value(
            "stack_with_us_per_call",
            f.with_us,
            "µs",
            Some(&c.with_us()),
        ),
        value(
            "stack_without_us_per_call",
            f.without_us,
            "µs",
            Some(&c.without_us()),
        ),
        value("stack_frames_mean", c.frames_mean(), "frames", None),
        value("stack_exits_per_call", c.exits_per_call(), "exits", None),
    ];
    let figures = Figures::Named(Ordered(figures_of(BenchId::CallStack, r)));
    (values, Some(figures))
}

/// boot/ftrace's headline: what each tracer added per call to the boot.
fn boot_values(r: &Results, cfg: &BenchConfig) -> (Vec<Value>, Option<Figures>) {
    let Some(Ok(f)) = &r.ftrace else {
        return (Vec::new(), None);
    };
    let unit = "guest instructions per call";
    // Not measured (NaN) where the boots' variation swamped it
    // (`ftrace::swamped`).
    let added = |key: &str, v: Vec<f64>| value(key, fig(median(&v)), unit, Some(&v));
    let values = vec![
        added(
            "exitless_guest_instructions_per_call_boot",
            f.added_instructions(BootConfig::Exitless),
        ),
        added(
            "trap_guest_instructions_per_call_boot",
            f.added_instructions(BootConfig::Trap),
        ),
        added(
            "ftrace_guest_instructions_per_call_less_setup",
            f.ftrace_less_setup(),
        ),
    ];
    let boot = FtraceJson::new(&r.ftrace, cfg.linux_boots);
    (values, Some(Figures::Boot(Box::new(boot))))
}

/// The headline of the benches whose figures are in the document's
/// `figures`; none: not measured.
fn other_values(id: BenchId, r: &Results) -> Vec<Value> {
    let mut v = Vec::new();
    match id {
        BenchId::AttachPause => {
            for p in &r.pauses {
                let n = p.vcpus;
                let key = |what| format!("d_{n}cpu_{what}_p50_us");
                v.push(value(
                    key("latency"),
                    median(&p.latency),
                    "µs",
                    Some(&p.latency),
                ));
                v.push(value(
                    key("attach_window"),
                    median(&p.attach),
                    "µs",
                    Some(&p.attach),
                ));
            }
        }
        BenchId::AttachScaling => {
            if let Some(s) = &r.scaling {
                for f in &s.attach {
                    let key = format!("e_{}_sites_attach_max_us", f.label);
                    v.push(value(key, max(&f.attach), "µs", Some(&f.attach)));
                }
                v.push(value(
                    "load_ms",
                    median(&s.loads_ms),
                    "ms",
                    Some(&s.loads_ms),
                ));
            }
        }
        BenchId::AttachModes => {
            if let Some(am) = &r.attach_modes {
                let ratios = am.ratios();
                let ratio = median(&ratios);
                v.push(value(
                    "j_attach_exitless_over_trap",
                    ratio,
                    "ratio",
                    Some(&ratios),
                ));
            }
        }
        BenchId::RecordThroughput => {
            if let Some(rec) = &r.record {
                v.push(value(
                    "h_record_events_per_s",
                    rec.stored_per_s(),
                    "events/s",
                    None,
                ));
                v.push(value("h_record_peak_mib", rec.peak_mib(), "MiB", None));
            }
        }
        BenchId::ReportRender => {
            if let Some((render, json)) = r.report {
                v.push(value("report_render_s", render, "s", None));
                v.push(value("report_json_s", json, "s", None));
            }
        }
        BenchId::QemuAttach => v.extend(r.qemu.as_ref().map_or_else(Vec::new, qemu_values)),
        BenchId::QemuDrain => v.extend(drain_values(r)),
        BenchId::CallDirect | BenchId::AttachDirect | BenchId::SitesDirect => {
            v.extend(direct_values(id, r));
        }
        // Each event's instructions, and the entry's beside.
        BenchId::EventsCost => v.extend(
            figures_of(id, r)
                .into_iter()
                .filter(|(k, _)| k.ends_with("_guest_insns"))
                .map(|(k, x)| value(k, x, "guest instructions", None)),
        ),
        _ => {}
    }
    v
}

/// qemu/drain's values: each memory's events drained per second.
fn drain_values(r: &Results) -> Vec<Value> {
    let figures = r
        .drain
        .as_ref()
        .map_or_else(Vec::new, super::drain::figures);
    (figures
        .into_iter()
        .filter(|(k, _)| k.ends_with("_events_per_s")))
    .map(|(k, x)| value(k, x, "events/s", None))
    .collect()
}

/// (k)'s values: the attach pauses, the costs per call, the events stored.
fn qemu_values(q: &QemuFigures) -> Vec<Value> {
    let mut v = Vec::new();
    for (i, p) in q.pause_us.iter().enumerate() {
        let sites = q.sites.get(i).copied().unwrap_or(0);
        let key = format!("k_attach_{sites}_sites_p50_us");
        v.push(value(key, median(p), "µs", Some(p)));
    }
    v.push(value(
        "k_burst_attach_p50_us",
        median(&q.burst_pause_us),
        "µs",
        Some(&q.burst_pause_us),
    ));
    let per_call = |k: &str, x: &Vec<f64>| value(k, median(x), "ns", Some(x));
    v.push(per_call("k_untraced_ns_per_call", &q.untraced_ns));
    v.push(per_call("k_exitless_ns_per_call", &q.exitless_ns));
    v.push(value(
        "k_stored_events_per_s",
        median(&q.stored_per_s),
        "events/s",
        Some(&q.stored_per_s),
    ));
    v
}

/// The headline of the direct entries' benches: call/direct's instructions
/// more than an ftrace site's and per call, attach/direct's worst windows,
/// sites/direct's safe and refused functions.
fn direct_values(id: BenchId, r: &Results) -> Vec<Value> {
    let wanted: &[&str] = match id {
        BenchId::CallDirect => &[
            "direct_call_more_than_ftrace",
            "direct_call_instructions_static",
            "direct_call_instructions_counted",
            "direct_call_exits_per_call",
        ],
        BenchId::AttachDirect => &["direct_attach_100_max_us", "direct_attach_1000_max_us"],
        _ => &[],
    };
    let unit = |k: &str| match k {
        _ if k.ends_with("_us") => "µs",
        _ if k.ends_with("exits_per_call") => "exits",
        _ if k.starts_with("direct_sites_") => "functions",
        _ => "guest instructions",
    };
    figures_of(id, r)
        .into_iter()
        .filter(|(k, _)| {
            wanted.contains(&k.as_str())
                || (id == BenchId::SitesDirect && (k.ends_with("_safe") || k.ends_with("_refused")))
        })
        .map(|(k, x)| {
            let u = unit(&k);
            value(k, x, u, None)
        })
        .collect()
}
