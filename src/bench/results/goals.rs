//! The goals each bench is judged against, and their verdicts.

use tracer::trace::report;

use super::super::measure::E_REPS;
use super::super::suite::BenchId;
use super::exitless::{num, num_us};
use super::{
    attach_modes, direct, drain, exitless, ftrace, max, qemu, record, Goal, Results, COUNTS_ONLY,
};
use crate::bench::median;
use crate::config::BenchConfig;

/// Goals.
const GOAL_RATIO: f64 = 1.2;
const GOAL_WINDOW_100_US: f64 = 1_000.0;
const GOAL_WINDOW_ALL_US: f64 = 10_000.0;
const GOAL_LOAD_MS: f64 = 100.0;
const GOAL_REPORT_S: f64 = 1.0;
pub const GOAL_REPORT_EVENTS: u64 = 10_000_000;

/// The order the goals have always been printed in (call/graph,
/// call/stack and attach/pause have none).
const GOAL_ORDER: [BenchId; 11] = [
    BenchId::CallTrap,
    BenchId::AttachScaling,
    BenchId::ReportRender,
    BenchId::CallExitless,
    BenchId::RecordThroughput,
    BenchId::BootFtrace,
    BenchId::AttachModes,
    BenchId::QemuAttach,
    BenchId::QemuDrain,
    BenchId::CallDirect,
    BenchId::AttachDirect,
];

/// The goals of every bench shown: run, or (the default set) said not run.
pub fn goals(r: &Results, cfg: &BenchConfig) -> Vec<Goal> {
    GOAL_ORDER
        .into_iter()
        .filter(|&id| cfg.benches.shows(id))
        .flat_map(|id| goals_of(id, r, cfg))
        .collect()
}

/// One bench's goals: judged if it was measured, else not judged, and why.
pub fn goals_of(id: BenchId, r: &Results, cfg: &BenchConfig) -> Vec<Goal> {
    let skip = |name: String| Goal {
        name,
        measured: "-".into(),
        pass: Err(COUNTS_ONLY.into()),
    };
    match id {
        BenchId::CallTrap => vec![ratio_goal(r)],
        BenchId::AttachScaling => scaling_goals(r, cfg),
        BenchId::ReportRender => vec![report_goal(r, cfg)],
        BenchId::CallExitless => r
            .exitless
            .as_ref()
            .map_or_else(Vec::new, |c| exitless::goals(c).into()),
        BenchId::RecordThroughput => match &r.record {
            Some(rec) => record::goals(rec).into(),
            None => record::goal_names().map(skip).into(),
        },
        BenchId::BootFtrace => vec![ftrace::goal(&r.ftrace)],
        BenchId::AttachModes => vec![match &r.attach_modes {
            Some(am) => attach_modes::goal(am),
            None => skip(attach_modes::goal_name()),
        }],
        // Asked for by name only (it runs QEMU): judged when measured.
        BenchId::QemuAttach => r.qemu.as_ref().map(qemu::goal).into_iter().collect(),
        BenchId::QemuDrain => r.drain.as_ref().map_or_else(Vec::new, drain::goals),
        // Asked for by name only: judged when measured.
        BenchId::CallDirect => r
            .direct
            .as_ref()
            .map(|d| direct::goal(d, r.exitless.as_ref()))
            .into_iter()
            .collect(),
        BenchId::AttachDirect => r
            .direct_attach
            .as_ref()
            .map_or_else(Vec::new, direct::attach_goals),
        BenchId::CallGraph
        | BenchId::CallStack
        | BenchId::AttachPause
        | BenchId::SitesDirect
        | BenchId::EventsCost => Vec::new(),
    }
}

/// call/trap: b/a.
fn ratio_goal(r: &Results) -> Goal {
    Goal {
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
    }
}

/// attach/scaling: the pause windows for 100 and all sites, and loading.
fn scaling_goals(r: &Results, cfg: &BenchConfig) -> Vec<Goal> {
    let unmeasured = || -> String {
        if cfg.counts_only {
            COUNTS_ONLY
        } else {
            "no vmlinux"
        }
        .into()
    };
    let mut goals = Vec::new();
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
                pass: Err(unmeasured()),
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
            pass: Err(unmeasured()),
        },
    });
    goals
}

/// report/render: the text report of 10 M events.
fn report_goal(r: &Results, cfg: &BenchConfig) -> Goal {
    Goal {
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
    }
}
