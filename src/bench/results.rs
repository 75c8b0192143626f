//! Judging and presenting the figures: the goals (`goals`), the printed
//! table (`table`), and the `--json FILE` document (`json`, with each
//! bench's entry in `benches`), and the `--markdown FILE` figures table
//! made from that document (`markdown`); (f)'s and (g)'s part of each is in
//! `exitless`, (h)'s in `record`, (i)'s in `ftrace`, (j)'s in
//! `attach_modes`, call/stack's in `stack`.

mod attach_modes;
mod benches;
mod direct;
mod drain;
mod events;
mod exitless;
pub mod ftrace;
mod goals;
mod json;
pub mod markdown;
mod methods;
mod qemu;
mod record;
mod stack;
mod table;

use std::time::Instant;

use super::measure::{
    AttachModes, CallCosts, DirectAttach, DirectSiteCounts, DrainFigures, EventCosts,
    ExitlessCosts, HandlerAlone, PauseFigures, QemuFigures, RecordFigures, Scaling, StackCosts,
};
use super::suite::BenchId;
use super::{median, pct};
use crate::config::BenchConfig;
pub use goals::goals;
pub use json::json;
pub use table::table;
use table::write_rows;

/// Why a figure set was not measured with `--counts-only`.
const COUNTS_ONLY: &str = "not asked for (--counts-only)";

/// Everything measured; what a run did not measure (a bench not selected,
/// or left out by `--counts-only`) is None, or empty.
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
    pub exitless: Option<ExitlessCosts>,
    /// (g): the same with return hooks (`--graph`).
    pub graph: Option<ExitlessCosts>,
    /// call/stack: a trapped call with its kernel stack, and without.
    pub stack: Option<StackCosts>,
    pub pauses: Vec<PauseFigures>,
    /// (e) and loading, if there was a vmlinux.
    pub scaling: Option<Scaling>,
    /// Seconds to render the report, and to export JSON.
    pub report: Option<(f64, f64)>,
    /// (h): recording to disk.
    pub record: Option<RecordFigures>,
    /// (j): the attach's pause, exitless against trap.
    pub attach_modes: Option<AttachModes>,
    /// (k): `vmtrace attach` on a QEMU guest.
    pub qemu: Option<QemuFigures>,
    /// qemu/drain: the exitless drainer's own ceiling, in each VMM's memory.
    pub drain: Option<DrainFigures>,
    /// call/direct: (f) with direct entries on the mini guest without ftrace.
    pub direct: Option<ExitlessCosts>,
    /// attach/direct: attach windows of direct sites.
    pub direct_attach: Option<DirectAttach>,
    /// sites/direct: by kernel (the vmlinux, then the distro kernel).
    pub direct_sites: Vec<DirectSiteCounts>,
    /// events/cost, if there was a vmlinux.
    pub events: Option<EventCosts>,
    /// (i): vmtrace against the guest's own ftrace on the Linux guest's
    /// boot; None: not asked for.
    pub ftrace: ftrace::Measured,
}

impl Default for Results {
    /// Nothing measured.
    fn default() -> Self {
        Results {
            costs: None,
            a: f64::NAN,
            b: f64::NAN,
            c: f64::NAN,
            calls_not_measured: None,
            handlers: None,
            exitless: None,
            graph: None,
            stack: None,
            pauses: Vec::new(),
            scaling: None,
            report: None,
            record: None,
            attach_modes: None,
            qemu: None,
            drain: None,
            direct: None,
            direct_attach: None,
            direct_sites: Vec::new(),
            events: None,
            ftrace: None,
        }
    }
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

/// What the bench was run on and with, for the table and the JSON.
pub struct Run<'a> {
    /// The benches, the mini guest, the Linux vmlinux of (e) if any, the
    /// counts.
    pub cfg: &'a BenchConfig,
    pub started: Instant,
}

/// The figures by name, as saved in the JSON. Those named `a_`..`e_`,
/// `h_` and `j_` are the figures (a) to (e), (h) and (j), `stack_`
/// call/stack's; (f) and (g) have their own objects (`ExitlessFigures`,
/// `GraphFigures`).
pub fn figures(r: &Results) -> Vec<(String, f64)> {
    [
        BenchId::CallTrap,
        BenchId::CallStack,
        BenchId::AttachPause,
        BenchId::AttachScaling,
        BenchId::ReportRender,
        BenchId::RecordThroughput,
        BenchId::AttachModes,
        BenchId::QemuAttach,
        BenchId::QemuDrain,
        BenchId::CallDirect,
        BenchId::AttachDirect,
        BenchId::SitesDirect,
        BenchId::EventsCost,
    ]
    .into_iter()
    .flat_map(|id| figures_of(id, r))
    .collect()
}

/// One bench's figures in `figures`, in the order printed; none for
/// call/exitless, call/graph and boot/ftrace (their own objects).
fn figures_of(id: BenchId, r: &Results) -> Vec<(String, f64)> {
    match id {
        BenchId::CallTrap => call_figures(r),
        BenchId::CallStack => r.stack.as_ref().map_or_else(Vec::new, stack::figures),
        BenchId::AttachPause => pause_figures(&r.pauses),
        BenchId::AttachScaling => r.scaling.as_ref().map_or_else(Vec::new, scaling_figures),
        BenchId::ReportRender => match r.report {
            Some((render, json)) => vec![
                ("report_render_s".into(), render),
                ("report_json_s".into(), json),
            ],
            None => Vec::new(),
        },
        BenchId::RecordThroughput => r.record.as_ref().map_or_else(Vec::new, record::figures),
        BenchId::AttachModes => r
            .attach_modes
            .as_ref()
            .map_or_else(Vec::new, attach_modes::figures),
        BenchId::QemuAttach => r.qemu.as_ref().map_or_else(Vec::new, qemu::figures),
        BenchId::QemuDrain => r.drain.as_ref().map_or_else(Vec::new, drain::figures),
        BenchId::CallDirect => r
            .direct
            .as_ref()
            .map_or_else(Vec::new, |d| direct::call_figures(d, r.exitless.as_ref())),
        BenchId::AttachDirect => r
            .direct_attach
            .as_ref()
            .map_or_else(Vec::new, direct::attach_figures),
        BenchId::SitesDirect => direct::sites_figures(&r.direct_sites),
        BenchId::EventsCost => r.events.as_ref().map_or_else(Vec::new, events::figures),
        BenchId::CallExitless | BenchId::CallGraph | BenchId::BootFtrace => Vec::new(),
    }
}

/// (a)-(c), and the handlers alone.
fn call_figures(r: &Results) -> Vec<(String, f64)> {
    let (Some(costs), Some(handlers)) = (&r.costs, &r.handlers) else {
        return Vec::new();
    };
    let extra = if r.a.is_nan() || r.b.is_nan() {
        f64::NAN
    } else {
        median(&costs.b_minus_a)
    };
    [
        ("a_exit_round_trip_us", r.a),
        ("b_traced_call_us", r.b),
        ("c_ratio", r.c),
        ("recorder_extra_per_call_us", extra),
        ("iter_untraced_us", costs.iter_us[0]),
        ("iter_resume_only_us", costs.iter_us[1]),
        ("iter_recorder_us", costs.iter_us[2]),
        ("exits_per_iter", costs.exits_per_iter),
        ("handler_resume_only_ns", handlers.resume_only_ns),
        ("handler_recorder_ns", handlers.recorder_ns),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// (d), by vCPU count.
fn pause_figures(pauses: &[PauseFigures]) -> Vec<(String, f64)> {
    let mut f = Vec::new();
    for p in pauses {
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
    f
}

/// (e) by site count, and loading.
fn scaling_figures(s: &Scaling) -> Vec<(String, f64)> {
    let mut f = Vec::new();
    for a in &s.attach {
        let l = &a.label;
        f.push((format!("e_{l}_sites_attach_first_us"), a.attach[0]));
        f.push((format!("e_{l}_sites_attach_p50_us"), median(&a.attach)));
        f.push((format!("e_{l}_sites_attach_max_us"), max(&a.attach)));
        f.push((format!("e_{l}_sites_detach_p50_us"), median(&a.detach)));
        f.push((format!("e_{l}_sites"), a.sites as f64));
    }
    f.push(("load_ms".into(), median(&s.loads_ms)));
    f.push(("load_sites".into(), s.total_sites as f64));
    f
}

/// The figures not measured (NaN: the host's noise swamped them), by
/// name, with why.
fn not_measured(r: &Results) -> Vec<(String, String)> {
    let mut stack = r.stack.as_ref().map_or_else(Vec::new, stack::not_measured);
    stack.extend(direct::not_measured(r));
    let Some(why) = &r.calls_not_measured else {
        return stack;
    };
    let calls = figures(r)
        .into_iter()
        .filter(|(k, v)| {
            v.is_nan()
                && ["a_", "b_", "c_", "recorder_"]
                    .iter()
                    .any(|p| k.starts_with(p))
        })
        .map(|(k, _)| (k, why.clone()));
    calls.chain(stack).collect()
}

#[cfg(test)]
mod tests {
    use super::super::measure::AttachFigures;
    use super::super::suite::Selection;
    use super::goals::GOAL_REPORT_EVENTS;
    use super::json::JSON_SCHEMA;
    use super::methods::methods;
    use super::*;

    /// The mini guest "mini.elf" and, with `scaling`, the Linux "vmlinux".
    pub(super) fn cfg(report_events: u64, scaling: bool) -> BenchConfig {
        BenchConfig {
            benches: Selection::default_set(false, 0),
            kernel: Some("mini.elf".into()),
            vmlinux: scaling.then(|| "vmlinux".into()),
            mini_noftrace: None,
            direct_vmlinux: None,
            distro_kernel: None,
            json: None,
            markdown: None,
            iters: 200,
            cpus: 1,
            rounds: 3,
            cycles: 2,
            report_events,
            record_events: 100_000_000,
            drain_events: 20_000_000,
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
            exitless: Some(ExitlessCosts {
                rounds: vec![[10.0, 410.0, 45.0, 108.0], [11.0, 411.0, 46.0, 109.0]],
                calls_per_iter: 3.5,
                exitless_calls: 7000,
                exitless_traps: 0,
                static_instructions: 28,
                task_variants: Some((24, 12)),
                trap_exits_per_call: 1.0,
                // Counted by KVM: 60 instructions per untraced iteration,
                // the spin's 400 more, 3.5 x 28 more exitless.
                counted: Some(vec![[60.0, 460.0, 60.0, 158.0]; 2]),
                stubs: None,
            }),
            // Per call: trap 20 µs (two exits), exitless 80 instructions.
            graph: Some(ExitlessCosts {
                rounds: vec![[10.0, 410.0, 80.0, 290.0]],
                calls_per_iter: 3.5,
                exitless_calls: 7000,
                exitless_traps: 0,
                static_instructions: 80,
                task_variants: None,
                trap_exits_per_call: 2.0,
                counted: Some(vec![[60.0, 460.0, 60.0, 340.0]]),
                stubs: None,
            }),
            // Per call 10 µs without its stack, 12 µs with (4.75 calls and
            // 1.875 stacks per iteration, 2 µs each).
            stack: Some(StackCosts {
                rounds: vec![[10.0, 57.5, 61.25], [10.0, 57.5, 61.25]],
                calls_per_iter: 4.75,
                stacks_per_iter: 1.875,
                stacks: 1875,
                frames: 6625,
                distinct: 4,
                stack_exits: 4750,
                stack_calls: 4750,
                alone: Some(super::super::measure::StackAlone {
                    recorder_ns: 60.0,
                    recorder_stack_ns: 260.0,
                    frames: 4,
                }),
            }),
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
            qemu: None,
            drain: None,
            direct: None,
            direct_attach: None,
            direct_sites: Vec::new(),
            events: None,
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
        assert_eq!(ex["guest_instructions_per_call_static_without_task"], 24);
        assert_eq!(ex["guest_instructions_per_rejected_call_static"], 12);
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
        r.exitless.as_mut().unwrap().exitless_traps = 71;
        r.exitless.as_mut().unwrap().rounds = vec![[10.0, 1610.0, 45.0, 500.0]];
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
        r.exitless.as_mut().unwrap().counted = Some(vec![[0.0, 0.0, 0.0, 1.0]; 2]);
        r.graph.as_mut().unwrap().counted = None;
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
        r.exitless.as_mut().unwrap().rounds = vec![[10.0, 410.0, 45.0, 9.0]];
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
        (r.attach_modes, r.stack) = (None, None);
        (r.a, r.b, r.c) = (f64::NAN, f64::NAN, f64::NAN);
        r.pauses.clear();
        let mut c = cfg(1000, false);
        c.counts_only = true;
        c.benches = Selection::default_set(true, 0);
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
            "call/stack",
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

    /// call/stack: its `stack_` figures in order, its entry's values, its
    /// rows; a stack cost lost in the host's noise is not measured, and why.
    #[test]
    fn stack_figures_in_json_and_table() {
        let mut r = results(false);
        let (t, text) = render(&r, GOAL_REPORT_EVENTS);
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        let f = &doc["figures"];
        assert_eq!(f["stack_with_over_without"], 1.2);
        assert_eq!(f["stack_with_us_per_call"], 12.0);
        assert_eq!(f["stack_without_us_per_call"], 10.0);
        assert_eq!(f["stack_extra_us_per_stack"], 2.0);
        assert_eq!(f["stack_exits_per_call"], 1.0);
        assert_eq!(f["stack_distinct"], 4.0);
        assert_eq!(f["stack_iter_stack_us"], 61.25);
        assert_eq!(f["stack_handler_stack_ns"], 200.0);
        assert_eq!(f["stack_handler_frames"], 4.0);
        let frames = f["stack_frames_mean"].as_f64().unwrap();
        assert!((frames - 53.0 / 15.0).abs() < 1e-12, "{frames}");
        let at = |k: &str| text.find(&format!("\"{k}\"")).unwrap();
        assert!(at("c_ratio") < at("stack_with_over_without"));
        assert!(at("stack_with_over_without") < at("d_1cpu_latency_p50_us"));
        assert!(at("stack_iter_stack_us") < at("stack_handler_recorder_ns"));
        assert!(doc["methods"]["stack"].is_string());
        let b = doc["benches"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["name"] == "call/stack")
            .unwrap();
        assert_eq!(b["measured"], true);
        assert!(b["goals"].as_array().unwrap().is_empty());
        assert_eq!(b["values"][0]["key"], "stack_with_over_without");
        assert_eq!(b["values"][0]["samples"], 2);
        assert_eq!(b["figures"]["stack_stacks"], 1875.0);
        let row = |start: &str| {
            t.lines()
                .find(|l| l.trim_start().starts_with(start))
                .unwrap_or_else(|| panic!("no {start:?} in\n{t}"))
                .to_string()
        };
        assert_eq!(
            row("stack_leaf call with its stack"),
            format!(
                "  {:<44} {:>10}   1.20 .. 1.20",
                "stack_leaf call with its stack / without", "1.200"
            )
        );
        assert!(
            row("frames per stack: mean 3.533 over 1875 stacks (4 distinct)")
                .ends_with("1.0000 (4750 exits in 4750 calls)")
        );
        assert_eq!(
            row("recorder alone in process"),
            "  recorder alone in process: 260 ns with a 4-frame stack, 60 ns without (the \
             stack: 200 ns)"
        );

        // The stack phase no slower than the trap phase: the stack's
        // cost, and the ratio, not measured; the rest still given.
        r.stack.as_mut().unwrap().rounds = vec![[10.0, 57.5, 57.0]];
        let (t, text) = render(&r, GOAL_REPORT_EVENTS);
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        let why = "the stack phases were not slower than the trap phases (per iteration: -0.50 \
                   µs): this host's noise swamped the difference; raise --iters or --rounds";
        for k in [
            "stack_with_over_without",
            "stack_with_us_per_call",
            "stack_extra_us_per_stack",
        ] {
            assert!(doc["figures"][k].is_null(), "{k}: {text}");
            assert_eq!(doc["not_measured"][k], why, "{k}: {text}");
        }
        assert_eq!(doc["figures"]["stack_without_us_per_call"], 10.0);
        assert!(t.contains(&format!("  times not measured: {why}")), "{t}");
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

    /// `--markdown`: the JSON's headline values and the figures the docs
    /// cite, the goals, what was not measured; parsed back, rendered the
    /// same; spliced into a file's block, the rest kept.
    #[test]
    fn markdown_table_of_the_json() {
        let (_, text) = render(&results(false), GOAL_REPORT_EVENTS);
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        let t = markdown::from_json(&doc, "vmtrace bench --markdown F", "a host", "2026-11-29")
            .unwrap();
        let block = markdown::render(&t);
        let row = |start: &str| {
            block
                .lines()
                .find(|l| l.starts_with(start))
                .unwrap_or_else(|| panic!("no {start:?} in\n{block}"))
        };
        assert_eq!(
            row("| `call/trap` | `a_exit"),
            "| `call/trap` | `a_exit_round_trip_us` | 10.0 | µs | 3: 9.00 .. 11.0 |"
        );
        assert_eq!(
            row("| `call/trap` | `handler_recorder_ns`"),
            "| `call/trap` | `handler_recorder_ns` | 60.0 | ns |  |"
        );
        assert_eq!(
            row("| `record/throughput` | `h_record_events_per_s`"),
            "| `record/throughput` | `h_record_events_per_s` | 12,500,000 | events/s |  |"
        );
        assert_eq!(
            row("| `call/exitless` | `us_per_guest_instruction`"),
            "| `call/exitless` | `us_per_guest_instruction` | 1.00 | µs |  |"
        );
        assert!(
            row("| `call/trap` | cost per").ends_with(" | PASS |"),
            "{block}"
        );
        assert_eq!(row("- `attach/scaling`"), "- `attach/scaling`: no vmlinux");
        assert!(block.starts_with(&format!(
            "{}\n- command: `vmtrace bench --markdown F`\n- host: a host\n- date: 2026-11-29\n",
            markdown::BEGIN
        )));
        assert!(block.ends_with(&format!("{}\n", markdown::END)));
        let parsed = markdown::parse(&block).unwrap();
        assert_eq!(markdown::render(&parsed), block);

        let file = format!(
            "# Doc\n\nbefore\n{}\nold\n{}\nafter\n",
            markdown::BEGIN,
            markdown::END
        );
        let spliced = markdown::splice(&file, &block).unwrap();
        assert_eq!(spliced, format!("# Doc\n\nbefore\n{block}after\n"));
        assert_eq!(markdown::splice("no block\n", &block), None);
    }

    #[test]
    fn markdown_numbers() {
        for (v, s) in [
            (0.0, "0"),
            (0.575, "0.575"),
            (0.012_34, "0.0123"),
            (1.1, "1.10"),
            (9.999, "10.0"),
            (28.94, "28.9"),
            (99.96, "100"),
            (148.4, "148"),
            (24_600_000.0, "24,600,000"),
            (-79.8, "-79.8"),
            (-1234.0, "-1,234"),
        ] {
            assert_eq!(markdown::number(v), s, "{v}");
        }
    }
}
