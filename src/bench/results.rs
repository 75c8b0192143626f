//! Judging and presenting the figures: the goals, the printed table, and
//! the `--json FILE` document; (f)'s and (g)'s part of each is in
//! `exitless`, (h)'s in `record`, (i)'s in `ftrace`.

mod attach_modes;
mod exitless;
mod ftrace;
mod record;

use std::fmt::{self, Write as _};
use std::path::Path;
use std::time::Instant;

use serde::{Serialize, Serializer};
use tracer::trace::model::{SYNTH_CALLERS, SYNTH_CPUS, SYNTH_FUNCS};
use tracer::trace::report;

use super::measure::{
    AttachModes, CallCosts, ExitlessCosts, HandlerAlone, PauseFigures, RecordFigures, Scaling,
    E_REPS, TRACE_GLOB,
};
use super::{median, pct};
use crate::config::{emulator_host, BenchConfig};
use exitless::{num, num_us, ExitlessFigures, GraphFigures};
use ftrace::FtraceJson;

/// Goals.
const GOAL_RATIO: f64 = 1.2;
const GOAL_WINDOW_100_US: f64 = 1_000.0;
const GOAL_WINDOW_ALL_US: f64 = 10_000.0;
const GOAL_LOAD_MS: f64 = 100.0;
const GOAL_REPORT_S: f64 = 1.0;
const GOAL_REPORT_EVENTS: u64 = 10_000_000;
/// `schema` of the JSON document.
const JSON_SCHEMA: &str = "vmtrace-bench/1";

/// Why a figure set was not measured with `--counts-only`.
const COUNTS_ONLY: &str = "not asked for (--counts-only)";

/// Everything measured; with `--counts-only`, (a)-(e), (h) and the report
/// figure are not (None, or empty).
pub struct Results {
    pub costs: Option<CallCosts>,
    /// Medians over the rounds of (a) and (b), µs, and of (c); NaN where
    /// not measured (`calls_not_measured` says why).
    pub a: f64,
    pub b: f64,
    pub c: f64,
    /// Why (a), (b) or (c) is not measured: the host's noise swamped the
    /// difference between the phases' times.
    pub calls_not_measured: Option<String>,
    pub handlers: Option<HandlerAlone>,
    /// (f): exitless against trap, per traced call.
    pub exitless: ExitlessCosts,
    /// (g): the same with return hooks (`--graph`).
    pub graph: ExitlessCosts,
    pub pauses: Vec<PauseFigures>,
    /// (e) and loading, if there was a vmlinux.
    pub scaling: Option<Scaling>,
    /// Seconds to render the report, and to export JSON.
    pub report: Option<(f64, f64)>,
    /// (h): recording to disk.
    pub record: Option<RecordFigures>,
    /// (j): the attach's pause, exitless against trap; None with --counts-only.
    pub attach_modes: Option<AttachModes>,
    /// (i): vmtrace against the guest's own ftrace on the Linux guest's
    /// boot; None: not asked for (`--linux-boots 0`).
    pub ftrace: ftrace::Measured,
}

/// One goal's verdict.
pub struct Goal {
    name: String,
    measured: String,
    /// Met or not; Err: not judged, and why.
    pass: Result<bool, String>,
}

impl Goal {
    fn status(&self) -> &'static str {
        match self.pass {
            Ok(true) => "PASS",
            Ok(false) => "MISS",
            Err(_) => "SKIP",
        }
    }
}

fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}

/// The figures by name, as saved in the JSON. Those named `a_`..`e_` and
/// `h_` are the figures (a) to (e) and (h); (f) and (g) have their own
/// objects (`ExitlessFigures`, `GraphFigures`).
pub fn figures(r: &Results) -> Vec<(String, f64)> {
    let mut f: Vec<(String, f64)> = Vec::new();
    if let (Some(costs), Some(handlers)) = (&r.costs, &r.handlers) {
        f.extend([
            ("a_exit_round_trip_us".into(), r.a),
            ("b_traced_call_us".into(), r.b),
            ("c_ratio".into(), r.c),
            (
                "recorder_extra_per_call_us".into(),
                if r.a.is_nan() || r.b.is_nan() {
                    f64::NAN
                } else {
                    median(&costs.b_minus_a)
                },
            ),
            ("iter_untraced_us".into(), costs.iter_us[0]),
            ("iter_resume_only_us".into(), costs.iter_us[1]),
            ("iter_recorder_us".into(), costs.iter_us[2]),
            ("exits_per_iter".into(), costs.exits_per_iter),
            ("handler_resume_only_ns".into(), handlers.resume_only_ns),
            ("handler_recorder_ns".into(), handlers.recorder_ns),
        ]);
    }
    for p in &r.pauses {
        let n = p.vcpus;
        for (what, v) in [
            ("latency", &p.latency),
            ("window", &p.window),
            ("attach_window", &p.attach),
            ("detach_window", &p.detach),
        ] {
            f.push((format!("d_{n}cpu_{what}_p50_us"), pct(v, 50.0)));
            f.push((format!("d_{n}cpu_{what}_p99_us"), pct(v, 99.0)));
        }
        f.push((format!("d_{n}cpu_sites"), p.sites as f64));
    }
    if let Some(Scaling {
        attach,
        loads_ms,
        total_sites,
    }) = &r.scaling
    {
        for s in attach {
            let l = &s.label;
            f.push((format!("e_{l}_sites_attach_first_us"), s.attach[0]));
            f.push((format!("e_{l}_sites_attach_p50_us"), median(&s.attach)));
            f.push((format!("e_{l}_sites_attach_max_us"), max(&s.attach)));
            f.push((format!("e_{l}_sites_detach_p50_us"), median(&s.detach)));
            f.push((format!("e_{l}_sites"), s.sites as f64));
        }
        f.push(("load_ms".into(), median(loads_ms)));
        f.push(("load_sites".into(), *total_sites as f64));
    }
    if let Some((render, json)) = r.report {
        f.push(("report_render_s".into(), render));
        f.push(("report_json_s".into(), json));
    }
    if let Some(rec) = &r.record {
        f.extend(record::figures(rec));
    }
    if let Some(am) = &r.attach_modes {
        f.extend(attach_modes::figures(am));
    }
    f
}

/// The figures not measured (NaN: the host's noise swamped them), by
/// name, with why.
fn not_measured(r: &Results) -> Vec<(String, String)> {
    let Some(why) = &r.calls_not_measured else {
        return Vec::new();
    };
    figures(r)
        .into_iter()
        .filter(|(k, v)| {
            v.is_nan()
                && ["a_", "b_", "c_", "recorder_"]
                    .iter()
                    .any(|p| k.starts_with(p))
        })
        .map(|(k, _)| (k, why.clone()))
        .collect()
}

pub fn goals(r: &Results, cfg: &BenchConfig) -> Vec<Goal> {
    let mut goals = vec![Goal {
        name: format!("cost per traced call <= {GOAL_RATIO} x exit round trip"),
        measured: format!(
            "b/a = {} (b {}, a {})",
            num(r.c, 3),
            num_us(r.b, 2),
            num_us(r.a, 2)
        ),
        pass: match &r.calls_not_measured {
            _ if r.costs.is_none() => Err(COUNTS_ONLY.into()),
            Some(why) if r.c.is_nan() => Err(format!("not measured: {why}")),
            _ => Ok(r.c <= GOAL_RATIO),
        },
    }];
    for (label, limit) in [("100", GOAL_WINDOW_100_US), ("all", GOAL_WINDOW_ALL_US)] {
        let name = format!("pause window for {label} sites <= {} ms", limit / 1e3);
        let found = r
            .scaling
            .as_ref()
            .and_then(|s| s.attach.iter().find(|f| f.label == label));
        goals.push(match (found, &r.scaling) {
            (Some(f), _) => Goal {
                name,
                measured: format!(
                    "worst {:.1} µs of {E_REPS} attaches of {} sites (first {:.1}, p50 {:.1})",
                    max(&f.attach),
                    report::thousands(f.sites as u64),
                    f.attach[0],
                    median(&f.attach)
                ),
                pass: Ok(max(&f.attach) <= limit),
            },
            (None, Some(_)) => Goal {
                name,
                measured: "-".into(),
                pass: Err("the vmlinux has fewer sites".into()),
            },
            (None, None) => Goal {
                name,
                measured: "-".into(),
                pass: Err(if cfg.counts_only {
                    COUNTS_ONLY
                } else {
                    "no vmlinux"
                }
                .into()),
            },
        });
    }
    let name = format!("symbol + site loading <= {GOAL_LOAD_MS} ms");
    goals.push(match &r.scaling {
        Some(s) => Goal {
            name,
            measured: format!(
                "median {:.1} ms of {} loads ({} sites; max {:.1} ms)",
                median(&s.loads_ms),
                s.loads_ms.len(),
                report::thousands(s.total_sites as u64),
                max(&s.loads_ms)
            ),
            pass: Ok(median(&s.loads_ms) <= GOAL_LOAD_MS),
        },
        None => Goal {
            name,
            measured: "-".into(),
            pass: Err(if cfg.counts_only {
                COUNTS_ONLY
            } else {
                "no vmlinux"
            }
            .into()),
        },
    });
    goals.push(Goal {
        name: format!(
            "report for {} events <= {GOAL_REPORT_S} s",
            report::thousands(GOAL_REPORT_EVENTS)
        ),
        measured: match r.report {
            Some((render, _)) => format!(
                "{render:.3} s for {} events",
                report::thousands(cfg.report_events)
            ),
            None => "-".into(),
        },
        pass: if let Some((render, _)) =
            r.report.filter(|_| cfg.report_events == GOAL_REPORT_EVENTS)
        {
            Ok(render <= GOAL_REPORT_S)
        } else if r.report.is_none() {
            Err(COUNTS_ONLY.into())
        } else {
            Err(format!(
                "measured with {} events",
                report::thousands(cfg.report_events)
            ))
        },
    });
    goals.extend(exitless::goals(&r.exitless));
    match &r.record {
        Some(rec) => goals.extend(record::goals(rec)),
        None => goals.extend(record::goal_names().map(|name| Goal {
            name,
            measured: "-".into(),
            pass: Err(COUNTS_ONLY.into()),
        })),
    }
    goals.push(ftrace::goal(&r.ftrace));
    goals.push(match &r.attach_modes {
        Some(am) => attach_modes::goal(am),
        None => Goal {
            name: attach_modes::goal_name(),
            measured: "-".into(),
            pass: Err(COUNTS_ONLY.into()),
        },
    });
    goals
}

/// What the bench was run on and with, for the table and the JSON.
pub struct Run<'a> {
    /// The mini guest, the Linux vmlinux of (e) if any, the counts.
    pub cfg: &'a BenchConfig,
    pub started: Instant,
}

/// The printed report.
pub fn table(r: &Results, goals: &[Goal], run: &Run<'_>) -> String {
    let mut o = String::new();
    // Writing to a String cannot fail.
    let _ = write_table(&mut o, r, goals, run);
    o
}

fn write_table(o: &mut String, r: &Results, goals: &[Goal], run: &Run<'_>) -> fmt::Result {
    let cfg = run.cfg;
    writeln!(o, "vmtrace bench: mini guest {}", cfg.kernel.display())?;
    if emulator_host() {
        writeln!(
            o,
            "host: KVM emulates guest ring 0 here (kvm_pvm): absolute times are several times \
             bare metal; compare ratios"
        )?;
    }
    writeln!(o)?;
    match &r.costs {
        Some(_) => write_calls(o, r, cfg)?,
        None => writeln!(o, "(a)-(c) per traced call: NOT MEASURED, {COUNTS_ONLY}")?,
    }
    writeln!(o)?;
    match r.pauses.is_empty() {
        false => write_pauses(o, &r.pauses, cfg)?,
        true => writeln!(o, "(d) pause: NOT MEASURED, {COUNTS_ONLY}")?,
    }
    writeln!(o)?;
    match (&r.scaling, &cfg.vmlinux) {
        (Some(s), Some(v)) => write_scaling(o, s, v)?,
        _ if cfg.counts_only => writeln!(o, "(e) and loading: NOT MEASURED, {COUNTS_ONLY}")?,
        _ => writeln!(
            o,
            "(e) and loading: NOT MEASURED, no vmlinux (build it with `bash guest/build.sh \
             linux`, or pass --vmlinux PATH)"
        )?,
    }
    writeln!(o)?;
    exitless::write(o, &r.exitless, cfg)?;
    writeln!(o)?;
    exitless::write_graph(o, &r.graph, &r.exitless, cfg)?;
    writeln!(o)?;
    match r.report {
        Some((render, json)) => writeln!(
            o,
            "report: {} events, text with callers {render:.3} s; JSON export {json:.3} s",
            report::thousands(cfg.report_events),
        )?,
        None => writeln!(o, "report: NOT MEASURED, {COUNTS_ONLY}")?,
    }
    writeln!(o)?;
    match &r.record {
        Some(rec) => record::write(o, rec)?,
        None => writeln!(o, "(h) recording to disk: NOT MEASURED, {COUNTS_ONLY}")?,
    }
    writeln!(o)?;
    match &r.attach_modes {
        Some(am) => attach_modes::write(o, am)?,
        None => writeln!(o, "(j) attach pause by mode: NOT MEASURED, {COUNTS_ONLY}")?,
    }
    writeln!(o)?;
    ftrace::write(o, &r.ftrace)?;
    writeln!(o)?;
    writeln!(o, "goals:")?;
    for g in goals {
        let why = match &g.pass {
            Err(w) => format!(" (not judged: {w})"),
            Ok(_) => String::new(),
        };
        writeln!(o, "  {}  {:<48} {}{why}", g.status(), g.name, g.measured)?;
    }
    writeln!(o)?;
    writeln!(o, "methods:")?;
    for (k, m) in methods() {
        writeln!(o, "  {k:<7} {m}")?;
    }
    writeln!(o)?;
    writeln!(
        o,
        "vmtrace bench took {:.1} s",
        run.started.elapsed().as_secs_f64()
    )
}

/// (a)-(c): one row per figure, its median and, given the per-round
/// values, their range.
fn write_calls(o: &mut String, r: &Results, cfg: &BenchConfig) -> fmt::Result {
    let (Some(c), Some(handlers)) = (&r.costs, &r.handlers) else {
        return Ok(());
    };
    writeln!(
        o,
        "(a)-(c) per traced call: {} vCPU, mode=loop, {} rounds of untraced / resume-only / recorder \
         phases of {} iterations; {:.2} exits per iteration",
        cfg.cpus, cfg.rounds, cfg.iters, c.exits_per_iter
    )?;
    writeln!(o, "  {:<44} {:>10}   rounds min .. max", "", "median")?;
    let ratios = c.ratios();
    let us = |v: f64| num_us(v, 2);
    let range = |v: f64, rounds| (!v.is_nan()).then_some(rounds);
    let extra = if r.a.is_nan() || r.b.is_nan() {
        f64::NAN
    } else {
        median(&c.b_minus_a)
    };
    let rows: [Row<'_>; 6] = [
        (
            "(a) exit round trip (resume-only handler)",
            us(r.a),
            range(r.a, &c.a[..]),
        ),
        (
            "(b) cost per traced call (recorder)",
            us(r.b),
            range(r.b, &c.b[..]),
        ),
        ("(c) b / a", num(r.c, 3), range(r.c, &ratios[..])),
        (
            "    recorder - resume-only, per call",
            us(extra),
            range(extra, &c.b_minus_a[..]),
        ),
        (
            "    handler alone in process: recorder",
            format!("{:.0} ns", handlers.recorder_ns),
            None,
        ),
        (
            "    handler alone in process: resume-only",
            format!("{:.0} ns", handlers.resume_only_ns),
            None,
        ),
    ];
    write_rows(o, &rows)?;
    if let Some(why) = &r.calls_not_measured {
        writeln!(o, "  times not measured: {why}")?;
    }
    writeln!(
        o,
        "  µs per guest iteration: untraced {:.1}, resume-only {:.1}, recorder {:.1}",
        c.iter_us[0], c.iter_us[1], c.iter_us[2]
    )
}

/// Rows of (a)-(c) and (f): label, median and, given the per-round values,
/// their range.
type Row<'a> = (&'a str, String, Option<&'a [f64]>);

fn write_rows(o: &mut String, rows: &[Row<'_>]) -> fmt::Result {
    for (label, median, rounds) in rows {
        write!(o, "  {label:<44} {median:>10}")?;
        if let Some(v) = rounds {
            write!(o, "   {:.2} .. {:.2}", min(v), max(v))?;
        }
        writeln!(o)?;
    }
    Ok(())
}

/// `v` µs with one decimal, as (d) and (e) print their times.
fn us1(v: f64) -> String {
    format!("{v:.1} µs")
}

/// (d): p50, p99 and max of each kind of pause, by vCPU count.
fn write_pauses(o: &mut String, pauses: &[PauseFigures], cfg: &BenchConfig) -> fmt::Result {
    writeln!(
        o,
        "(d) pause, mini guest mode=loop, {} pauses + {} attach/detach cycles per vCPU count",
        cfg.cycles, cfg.cycles
    )?;
    writeln!(
        o,
        "  {:<8} {:<26} {:>11} {:>11} {:>11}",
        "vCPUs", "", "p50", "p99", "max"
    )?;
    for p in pauses {
        let rows = [
            ("pause latency".to_string(), &p.latency),
            ("window, empty pause".to_string(), &p.window),
            (format!("attach window ({} sites)", p.sites), &p.attach),
            (format!("detach window ({} sites)", p.sites), &p.detach),
        ];
        for (i, (what, v)) in rows.iter().enumerate() {
            // The vCPU count heads its group of rows.
            let n = if i == 0 {
                p.vcpus.to_string()
            } else {
                String::new()
            };
            writeln!(
                o,
                "  {n:<8} {what:<26} {:>11} {:>11} {:>11}",
                us1(pct(v, 50.0)),
                us1(pct(v, 99.0)),
                us1(max(v))
            )?;
        }
    }
    Ok(())
}

/// (e) and loading, measured on `vmlinux`.
fn write_scaling(o: &mut String, s: &Scaling, vmlinux: &Path) -> fmt::Result {
    writeln!(
        o,
        "(e) attach window vs. sites: {} loaded into a paused VM, never booted; {E_REPS} \
         attaches each",
        vmlinux.display()
    )?;
    writeln!(
        o,
        "  {:<14} {:>11} {:>11} {:>11} {:>12}",
        "sites", "first", "p50", "max", "detach p50"
    )?;
    for f in &s.attach {
        let label = if f.label == "all" {
            format!("all ({})", report::thousands(f.sites as u64))
        } else {
            report::thousands(f.sites as u64)
        };
        writeln!(
            o,
            "  {label:<14} {:>11} {:>11} {:>11} {:>12}",
            us1(f.attach[0]),
            us1(median(&f.attach)),
            us1(max(&f.attach)),
            us1(median(&f.detach))
        )?;
    }
    writeln!(o)?;
    writeln!(
        o,
        "loading: KernelImage::load + SiteTable::build of {} ({} sites): median {:.1} ms \
         of {} ({:.1} .. {:.1} ms)",
        vmlinux.display(),
        report::thousands(s.total_sites as u64),
        median(&s.loads_ms),
        s.loads_ms.len(),
        min(&s.loads_ms),
        max(&s.loads_ms)
    )
}

/// The `--json FILE` document. Figures and methods are objects whose keys
/// keep the order they are printed in.
#[derive(Serialize)]
struct BenchJson<'a> {
    schema: &'static str,
    kernel: String,
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
    /// (f), and (i).
    exitless: ExitlessJson,
    /// (g).
    graph: GraphFigures,
    goals: Vec<GoalJson<'a>>,
    #[serde(serialize_with = "ordered_map")]
    methods: &'a [(&'static str, String)],
}

/// The `exitless` object: (f)'s figures, then (i)'s.
#[derive(Serialize)]
struct ExitlessJson {
    #[serde(flatten)]
    figures: ExitlessFigures,
    #[serde(flatten)]
    boot: FtraceJson,
}

#[derive(Serialize)]
struct GoalJson<'a> {
    goal: &'a str,
    status: &'static str,
    measured: &'a str,
    /// Why the goal was not judged (status SKIP).
    not_judged: Option<&'a str>,
}

/// `(key, value)` pairs as a JSON object, in their order.
fn ordered_map<K: Serialize, V: Serialize, S: Serializer>(
    pairs: &&[(K, V)],
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_map(pairs.iter().map(|(k, v)| (k, v)))
}

/// The JSON document of `--json FILE`.
pub fn json(r: &Results, goals: &[Goal], run: &Run<'_>) -> serde_json::Result<String> {
    let cfg = run.cfg;
    let doc = BenchJson {
        schema: JSON_SCHEMA,
        kernel: cfg.kernel.display().to_string(),
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
        exitless: ExitlessJson {
            figures: ExitlessFigures::new(&r.exitless),
            boot: FtraceJson::new(&r.ftrace, cfg.linux_boots),
        },
        graph: GraphFigures::new(&r.graph, &r.exitless),
        goals: goals
            .iter()
            .map(|g| GoalJson {
                goal: &g.name,
                status: g.status(),
                measured: &g.measured,
                not_judged: g.pass.as_ref().err().map(String::as_str),
            })
            .collect(),
        methods: &methods(),
    };
    let mut j = serde_json::to_string_pretty(&doc)?;
    j.push('\n');
    Ok(j)
}

/// How each figure is measured (printed, and saved in the JSON).
fn methods() -> Vec<(&'static str, String)> {
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

#[cfg(test)]
mod tests {
    use super::super::measure::{AttachFigures, ExitlessCosts};
    use super::*;

    /// The mini guest "mini.elf" and, with `scaling`, the Linux "vmlinux".
    fn cfg(report_events: u64, scaling: bool) -> BenchConfig {
        BenchConfig {
            kernel: "mini.elf".into(),
            vmlinux: scaling.then(|| "vmlinux".into()),
            json: None,
            iters: 200,
            cpus: 1,
            rounds: 3,
            cycles: 2,
            report_events,
            record_events: 100_000_000,
            linux_boots: 0,
            linux: None,
            counts_only: false,
        }
    }

    fn results(scaling: bool) -> Results {
        let attach = |label: &str, sites| AttachFigures {
            label: label.into(),
            sites,
            attach: vec![900.0, 40.0, 50.0],
            detach: vec![30.0, 20.0, 25.0],
        };
        Results {
            costs: Some(CallCosts {
                a: vec![10.0, 9.0, 11.0],
                b: vec![11.0, 10.0, 12.0],
                b_minus_a: vec![1.0, 1.0, 1.0],
                iter_us: [20.0, 55.0, 58.5],
                exits_per_iter: 3.5,
            }),
            a: 10.0,
            b: 11.0,
            c: 1.1,
            calls_not_measured: None,
            handlers: Some(HandlerAlone {
                resume_only_ns: 20.0,
                recorder_ns: 60.0,
            }),
            // 1 µs per instruction; per call: trap 10 µs, exitless 28 µs.
            exitless: ExitlessCosts {
                rounds: vec![[10.0, 410.0, 45.0, 108.0], [11.0, 411.0, 46.0, 109.0]],
                calls_per_iter: 3.5,
                exitless_calls: 7000,
                exitless_traps: 0,
                static_instructions: 28,
                trap_exits_per_call: 1.0,
                // Counted by KVM: 60 instructions per untraced iteration,
                // the spin's 400 more, 3.5 x 28 more exitless.
                counted: Some(vec![[60.0, 460.0, 60.0, 158.0]; 2]),
            },
            // Per call: trap 20 µs (two exits), exitless 80 instructions.
            graph: ExitlessCosts {
                rounds: vec![[10.0, 410.0, 80.0, 290.0]],
                calls_per_iter: 3.5,
                exitless_calls: 7000,
                exitless_traps: 0,
                static_instructions: 80,
                trap_exits_per_call: 2.0,
                counted: Some(vec![[60.0, 460.0, 60.0, 340.0]]),
            },
            pauses: vec![PauseFigures {
                vcpus: 1,
                sites: 9,
                latency: vec![30.0, 40.0],
                window: vec![5.0, 6.0],
                attach: vec![50.0, 70.0],
                detach: vec![45.0, 65.0],
            }],
            scaling: scaling.then(|| Scaling {
                attach: vec![attach("100", 100), attach("all", 8830)],
                loads_ms: vec![40.0, 38.0],
                total_sites: 9585,
            }),
            // The JSON time not finite: must come out as null.
            report: Some((0.44, f64::NAN)),
            // 12.5 M events/s stored, half lost; 70 MiB peak.
            record: Some(RecordFigures {
                sent: 100_000_000,
                stored: 50_000_000,
                lost: 50_000_000,
                bytes: 1_600_000_000,
                seconds: 4.0,
                sync_seconds: 1.0,
                buffer: 64 << 20,
                peak_growth: Ok(70 << 20),
            }),
            // 1.5 x in each guest.
            attach_modes: Some(AttachModes {
                sites: 20,
                trap: vec![20.0, 30.0],
                exitless: vec![30.0, 45.0],
            }),
            ftrace: None,
        }
    }

    /// The printed table and the JSON document of `r`, measured with
    /// `report_events`, for the mini guest "mini.elf" and, if `r` has (e),
    /// the Linux "vmlinux".
    fn render(r: &Results, report_events: u64) -> (String, String) {
        let cfg = cfg(report_events, r.scaling.is_some());
        let goals = goals(r, &cfg);
        let run = Run {
            cfg: &cfg,
            started: Instant::now(),
        };
        let table = table(r, &goals, &run);
        let json = json(r, &goals, &run).unwrap();
        (table, json)
    }

    #[test]
    fn json_keeps_figure_order_and_goal_verdicts() {
        let r = results(true);
        let (_, text) = render(&r, GOAL_REPORT_EVENTS);
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(doc["schema"], JSON_SCHEMA);
        assert_eq!(doc["kernel"], "mini.elf");
        assert_eq!(doc["vmlinux"], "vmlinux");
        assert_eq!(doc["iters"], 200);
        assert_eq!(doc["figures"]["a_exit_round_trip_us"], 10.0);
        assert_eq!(doc["figures"]["c_ratio"], 1.1);
        assert_eq!(doc["figures"]["e_all_sites"], 8830.0);
        // Nearest rank: the lower of two.
        assert_eq!(doc["figures"]["load_ms"], 38.0);
        assert!(doc["figures"]["report_json_s"].is_null());
        assert_eq!(doc["figures"].as_object().unwrap().len(), figures(&r).len());
        // In the order they are measured and printed, not sorted.
        let at = |k: &str| text.find(&format!("\"{k}\"")).unwrap();
        assert!(at("a_exit_round_trip_us") < at("c_ratio"));
        assert!(at("b_traced_call_us") < at("c_ratio"));
        assert!(at("report_render_s") < at("report_json_s"));
        assert!(at("(e)") < at("loading"));

        let goals = doc["goals"].as_array().unwrap();
        // (j), the attach pause's goal, added last.
        assert_eq!(goals.len(), 11);
        let status: Vec<&str> = goals
            .iter()
            .map(|g| g["status"].as_str().unwrap())
            .collect();
        // b/a 1.1; worst 100-site attach 900 µs; worst of all 900 µs;
        // loading 38 ms; report 0.44 s; 0 exits and 28 instructions per
        // exitless call; 12.5 M events/s stored and 70 MiB peak recording;
        // (i) not asked for.
        assert_eq!(status[..9], ["PASS"; 9]);
        assert_eq!(status[9], "SKIP");
        assert!(goals[..9].iter().all(|g| g["not_judged"].is_null()));
        // Exitless attach 1.5 x trap attach in both guests.
        assert_eq!(status[10], "PASS");
        assert_eq!(doc["figures"]["j_attach_exitless_over_trap"], 1.5);
        // (i)'s keys in the exitless object, null: not measured.
        assert_eq!(doc["exitless"]["linux_boots"], 0);
        assert!(doc["exitless"]["ftrace_guest_instructions_per_call"].is_null());
        assert!(at("exits_per_call") < at("ftrace_guest_instructions_per_call"));
        assert_eq!(doc["methods"].as_object().unwrap().len(), methods().len());
        assert!(at("(e)") < at("(f)"));
    }

    #[test]
    fn graph_figures_beside_the_entry_only_ones() {
        let r = results(false);
        let (t, text) = render(&r, GOAL_REPORT_EVENTS);
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        let g = &doc["graph"];
        assert_eq!(g["trap_exits_per_call"], 2.0);
        assert_eq!(g["trap_exits_per_call_entry_only"], 1.0);
        // (80 - 10) / 3.5 µs per call at 1 µs per instruction.
        assert_eq!(g["trap_us_per_call"], 20.0);
        assert_eq!(g["guest_instructions_per_call"], 80.0);
        assert_eq!(g["guest_instructions_per_call_static"], 80);
        assert_eq!(g["guest_instructions_per_call_entry_only"], 28.0);
        assert!(t.contains("(g) function graph"), "{t}");
        let row = t
            .lines()
            .find(|l| l.contains("trap: exits per traced call"))
            .unwrap();
        assert!(row.ends_with("2.000 (entry only 1.000)"), "{row}");
    }

    #[test]
    fn exitless_figures_in_json_and_table() {
        let mut r = results(false);
        let (t, text) = render(&r, GOAL_REPORT_EVENTS);
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        let ex = &doc["exitless"];
        assert_eq!(ex["exits_per_call"], 0.0);
        assert_eq!(ex["guest_instructions_per_call"], 28.0);
        assert_eq!(ex["guest_instructions_per_call_static"], 28);
        assert_eq!(ex["trap_us_per_call"], 10.0);
        assert_eq!(ex["exitless_us_per_call"], 28.0);
        assert_eq!(ex["exitless_vs_trap"], 2.8);
        assert_eq!(ex["us_per_guest_instruction"], 1.0);
        assert_eq!(ex["exitless_calls"], 7000);
        assert_eq!(ex["iter_spin_us"], 410.0);
        let row = |start: &str| {
            t.lines()
                .find(|l| l.trim_start().starts_with(start))
                .unwrap_or_else(|| panic!("no {start:?} in\n{t}"))
                .to_string()
        };
        assert_eq!(
            row("exitless: cost"),
            format!(
                "  {:<44} {:>10}   28.00 .. 28.00",
                "exitless: cost per traced call", "28.00 µs"
            )
        );
        assert_eq!(
            row("guest instructions per call, static"),
            format!(
                "  {:<44} {:>10}",
                "guest instructions per call, static", "28"
            )
        );
        assert!(row("exits per traced call, exitless:")
            .ends_with("0.0000 (0 trace-port traps in 7,000 calls)"));
        assert!(
            row("PASS  guest instructions").contains("28.0 measured"),
            "{t}"
        );

        // 71 traps in 7,000 calls, 4 µs per instruction: both goals missed.
        r.exitless.exitless_traps = 71;
        r.exitless.rounds = vec![[10.0, 1610.0, 45.0, 500.0]];
        let goals = goals(&r, &cfg(GOAL_REPORT_EVENTS, false));
        let status: Vec<&str> = goals.iter().map(Goal::status).collect();
        assert_eq!(status[5..7], ["MISS", "MISS"]);
        assert!(
            goals[5].measured.starts_with("0.0101 (71 "),
            "{}",
            goals[5].measured
        );
        // (500 - 10) / 3.5 = 140 µs per call, at 4 µs per instruction.
        assert!(
            goals[6].measured.starts_with("35.0 measured"),
            "{}",
            goals[6].measured
        );
    }

    #[test]
    fn instructions_counted_by_kvm_in_json_and_table() {
        let mut r = results(false);
        let (t, text) = render(&r, GOAL_REPORT_EVENTS);
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        let (ex, g) = (&doc["exitless"], &doc["graph"]);
        assert_eq!(ex["guest_instructions_per_call_counted"], 28.0);
        assert_eq!(ex["spin_instructions_counted"], 400.0);
        assert!(ex.get("guest_instructions_counted_not_available").is_none());
        assert_eq!(g["guest_instructions_per_call_counted"], 80.0);
        assert_eq!(g["guest_instructions_per_call_entry_only_counted"], 28.0);
        // The existing keys stay.
        assert_eq!(ex["guest_instructions_per_call"], 28.0);
        assert_eq!(g["guest_instructions_per_call"], 80.0);
        let row = |t: &str, start: &str| {
            t.lines()
                .find(|l| l.trim_start().starts_with(start))
                .unwrap_or_else(|| panic!("no {start:?} in\n{t}"))
                .to_string()
        };
        assert_eq!(
            row(&t, "guest instructions per call, counted"),
            format!(
                "  {:<44} {:>10}   28.00 .. 28.00",
                "guest instructions per call, counted (KVM)", "28.0"
            )
        );
        assert!(row(&t, "spin: instructions counted").ends_with("400.0   400.00 .. 400.00"));
        assert!(
            row(&t, "exitless: instructions per call, counted")
                .ends_with("80.0 (entry only 28.0)   80.00 .. 80.00"),
            "{t}"
        );
        assert!(
            row(&t, "PASS  guest instructions").contains("28.0 counted by KVM's emulator"),
            "{t}"
        );
        assert!(!t.contains("not available"), "{t}");

        // Hardware-virtualized KVM: its emulator ran none of the spin.
        r.exitless.counted = Some(vec![[0.0, 0.0, 0.0, 1.0]; 2]);
        r.graph.counted = None;
        let (t, text) = render(&r, GOAL_REPORT_EVENTS);
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        let (ex, g) = (&doc["exitless"], &doc["graph"]);
        assert!(ex["guest_instructions_per_call_counted"].is_null());
        assert_eq!(ex["spin_instructions_counted"], 0.0);
        let why = ex["guest_instructions_counted_not_available"]
            .as_str()
            .unwrap();
        assert!(
            why.contains("counted 0.0 instructions more per spin iteration"),
            "{why}"
        );
        assert!(g["guest_instructions_per_call_counted"].is_null());
        assert!(g["guest_instructions_per_call_entry_only_counted"].is_null());
        assert!(row(&t, "guest instructions per call, counted").ends_with(" n/a"));
        assert!(
            row(&t, "exitless: instructions per call, counted").ends_with("n/a (entry only n/a)")
        );
        row(
            &t,
            "instructions counted by KVM: not available: KVM's emulator counted 0.0",
        );
        assert!(
            t.contains(
                "instructions counted by KVM: not available: KVM gives no instruction count"
            ),
            "{t}"
        );
        assert!(
            !row(&t, "PASS  guest instructions").contains("counted"),
            "{t}"
        );
    }

    #[test]
    fn goals_not_judged_say_why() {
        let (table, text) = render(&results(false), 1000);
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(doc["vmlinux"].is_null());
        assert!(doc["figures"].get("load_ms").is_none());
        let not_judged: Vec<&str> = doc["goals"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|g| g["status"] == "SKIP")
            .map(|g| g["not_judged"].as_str().unwrap())
            .collect();
        assert_eq!(
            not_judged,
            [
                "no vmlinux",
                "no vmlinux",
                "no vmlinux",
                "measured with 1,000 events",
                "not measured: run `vmtrace bench --linux-boots N` (5 x N boots of the Linux \
                 guest)"
            ]
        );
        assert!(table.contains("(i) vmtrace vs. the guest's own ftrace, Linux boot: NOT MEASURED"));

        assert!(table.contains("(e) and loading: NOT MEASURED"), "{table}");
        assert_eq!(
            table.lines().filter(|l| l.starts_with("  SKIP  ")).count(),
            5,
            "{table}"
        );
    }

    /// Figures from phase differences that the host's noise swamped (not
    /// positive): null in the JSON with why, "not measured" in the table,
    /// their goals not judged; every other figure is still given.
    #[test]
    fn timing_figures_lost_in_noise_are_not_measured() {
        let mut r = results(false);
        // (a) negative (the resume-only phases ran faster than untraced).
        let why = crate::bench::swamped(&[("resume-only", -11.7), ("recorder", 38.5)]);
        (r.a, r.c, r.calls_not_measured) = (f64::NAN, f64::NAN, why);
        // (f): the exitless phase 1 µs faster per iteration than untraced.
        r.exitless.rounds = vec![[10.0, 410.0, 45.0, 9.0]];
        let (t, text) = render(&r, GOAL_REPORT_EVENTS);
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        let reason = "phases were not slower than the untraced ones (per iteration: \
                      resume-only -11.70 µs): this host's noise swamped the difference; raise \
                      --iters or --rounds";
        for k in [
            "a_exit_round_trip_us",
            "c_ratio",
            "recorder_extra_per_call_us",
        ] {
            assert!(doc["figures"][k].is_null(), "{k}: {text}");
            assert_eq!(doc["not_measured"][k], reason, "{text}");
        }
        assert_eq!(doc["figures"]["b_traced_call_us"], 11.0);
        assert!(doc["not_measured"].get("b_traced_call_us").is_none());
        let ex = &doc["exitless"];
        for k in [
            "exitless_us_per_call",
            "exitless_vs_trap",
            "guest_instructions_per_call",
        ] {
            assert!(ex[k].is_null(), "{k}: {text}");
        }
        assert_eq!(ex["trap_us_per_call"], 10.0);
        assert_eq!(ex["us_per_guest_instruction"], 1.0);
        assert_eq!(
            ex["timing_not_measured"],
            "phases were not slower than the untraced ones (per iteration: exitless -1.00 µs): \
             this host's noise swamped the difference; raise --iters or --rounds"
        );
        // Counts are not times: still there.
        assert_eq!(ex["exitless_calls"], 7000);
        assert_eq!(ex["guest_instructions_per_call_counted"], 28.0);
        let row = |label: &str| t.lines().find(|l| l.contains(label)).unwrap_or("");
        assert!(row("(a) exit round trip").ends_with("not measured"), "{t}");
        assert!(row("(c) b / a").ends_with("not measured"), "{t}");
        assert!(row("(b) cost per traced call").contains("11.00 µs"), "{t}");
        assert!(
            row("exitless: cost per traced call").ends_with("not measured"),
            "{t}"
        );
        assert!(
            t.contains(&format!("  times not measured: {reason}")),
            "{t}"
        );
        let goal = |name: &str| {
            doc["goals"]
                .as_array()
                .unwrap()
                .iter()
                .find(|g| g["goal"].as_str().unwrap().starts_with(name))
                .unwrap()
                .clone()
        };
        let g = goal("cost per traced call");
        assert_eq!(g["status"], "SKIP");
        assert_eq!(g["not_judged"], format!("not measured: {reason}"));
        assert_eq!(
            g["measured"],
            "b/a = not measured (b 11.00 µs, a not measured)"
        );
        let g = goal("guest instructions per traced call");
        assert_eq!(g["status"], "SKIP");
        assert!(
            g["measured"]
                .as_str()
                .unwrap()
                .starts_with("not measured; 28.0 counted"),
            "{g}"
        );
    }

    /// `--counts-only`: (f) and (g) alone; the rest said not measured, in
    /// the table, the goals (not judged) and the JSON (no such figures).
    #[test]
    fn counts_only_measures_f_and_g_alone() {
        let mut r = results(false);
        (r.costs, r.handlers, r.report, r.record) = (None, None, None, None);
        r.attach_modes = None;
        (r.a, r.b, r.c) = (f64::NAN, f64::NAN, f64::NAN);
        r.pauses.clear();
        let mut c = cfg(1000, false);
        c.counts_only = true;
        let goals = goals(&r, &c);
        let run = Run {
            cfg: &c,
            started: Instant::now(),
        };
        let (t, text) = (table(&r, &goals, &run), json(&r, &goals, &run).unwrap());
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(doc["counts_only"], true);
        assert!(doc["figures"].as_object().unwrap().is_empty(), "{text}");
        assert_eq!(doc["exitless"]["guest_instructions_per_call_counted"], 28.0);
        assert_eq!(doc["graph"]["guest_instructions_per_call_counted"], 80.0);
        let statuses: Vec<(&str, &str)> = doc["goals"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| {
                (
                    g["status"].as_str().unwrap(),
                    g["not_judged"].as_str().unwrap_or(""),
                )
            })
            .collect();
        let skipped = statuses
            .iter()
            .filter(|(s, why)| *s == "SKIP" && *why == COUNTS_ONLY)
            .count();
        // The ratio, two pause windows, loading, the report, (h)'s two, (j).
        assert_eq!((statuses.len(), skipped), (11, 8), "{statuses:?}");
        assert_eq!(&statuses[5..7], [("PASS", ""), ("PASS", "")]);
        for set in [
            "(a)-(c) per traced call",
            "(d) pause",
            "(e) and loading",
            "report",
            "(h) recording to disk",
            "(j) attach pause by mode",
        ] {
            assert!(
                t.contains(&format!(
                    "{set}: NOT MEASURED, not asked for (--counts-only)"
                )),
                "{set}: {t}"
            );
        }
        assert!(t.contains("(f) exitless vs. trap"), "{t}");
    }

    #[test]
    fn record_figures_goals_and_lines() {
        let mut r = results(false);
        let (t, text) = render(&r, GOAL_REPORT_EVENTS);
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        let f = &doc["figures"];
        assert_eq!(doc["record_events"], 100_000_000);
        assert_eq!(f["h_record_events_per_s"], 12.5e6);
        assert_eq!(f["h_record_mb_per_s"], 400.0);
        assert_eq!(f["h_record_peak_mib"], 70.0);
        assert_eq!(f["h_record_lost"], 50e6);
        assert_eq!(f["h_record_lost_fraction"], 0.5);
        assert_eq!(f["h_record_synced_mb_per_s"], 320.0);
        assert_eq!(f["h_record_buffer_mib"], 64.0);
        assert!(doc["methods"]["(h)"].is_string());
        let line = |start: &str| {
            t.lines()
                .find(|l| l.trim_start().starts_with(start))
                .unwrap_or_else(|| panic!("no {start:?} in\n{t}"))
                .to_string()
        };
        assert!(
            line("stored 12.50 M events/s, 400 MB/s").ends_with("320 MB/s on disk)"),
            "{t}"
        );
        assert!(
            line("sent 25.00 M").contains("lost 50,000,000 (50.0 %"),
            "{t}"
        );
        assert!(line("PASS  recording to disk").contains("50,000,000 of 100,000,000"));

        // Over the bound, and too slow: both missed; no peak: not judged.
        r.record.as_mut().unwrap().peak_growth = Ok(129 << 20);
        // 9.75 M events/s.
        r.record.as_mut().unwrap().stored = 39_000_000;
        let judged = |r: &Results| -> Vec<&'static str> {
            goals(r, &cfg(GOAL_REPORT_EVENTS, false))[7..9]
                .iter()
                .map(Goal::status)
                .collect()
        };
        assert_eq!(judged(&r), ["MISS", "MISS"]);
        r.record.as_mut().unwrap().peak_growth = Err("cannot reset the peak RSS".into());
        assert_eq!(judged(&r), ["MISS", "SKIP"]);
        let (t, text) = render(&r, GOAL_REPORT_EVENTS);
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(doc["figures"]["h_record_peak_mib"].is_null());
        assert!(
            t.contains("peak memory: NOT MEASURED, cannot reset the peak RSS"),
            "{t}"
        );
    }

    #[test]
    fn table_rows() {
        let (t, _) = render(&results(true), GOAL_REPORT_EVENTS);
        let line = |start: &str| {
            t.lines()
                .find(|l| l.trim_start().starts_with(start))
                .unwrap_or_else(|| panic!("no {start:?} in\n{t}"))
                .to_string()
        };
        assert_eq!(
            line("(a) exit"),
            format!(
                "  {:<44} {:>10}   9.00 .. 11.00",
                "(a) exit round trip (resume-only handler)", "10.00 µs"
            )
        );
        assert_eq!(
            line("handler alone in process: recorder"),
            format!(
                "  {:<44} {:>10}",
                "    handler alone in process: recorder", "60 ns"
            )
        );
        assert_eq!(
            line("1 "),
            format!(
                "  {:<8} {:<26} {:>11} {:>11} {:>11}",
                "1", "pause latency", "30.0 µs", "40.0 µs", "40.0 µs"
            )
        );
        assert_eq!(
            line("all ("),
            format!(
                "  {:<14} {:>11} {:>11} {:>11} {:>12}",
                "all (8,830)", "900.0 µs", "50.0 µs", "900.0 µs", "25.0 µs"
            )
        );
        assert!(line("loading:").ends_with("(9,585 sites): median 38.0 ms of 2 (38.0 .. 40.0 ms)"));
    }
}
