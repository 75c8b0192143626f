//! Figure (j), the attach's pause in exitless against trap mode: its goal,
//! its lines of the table, its `j_` figures in the JSON, its method.

use std::fmt::{self, Write as _};

use super::super::measure::{AttachModes, ATTACH_GLOB};
use super::super::{median, pct};
use super::Goal;

/// Goal: an exitless attach stops the guest at most this many times as
/// long as a trap attach of the same sites.
pub const GOAL_ATTACH_RATIO: f64 = 2.0;

fn max(v: &[f64]) -> f64 {
    pct(v, 100.0)
}

/// The `j_` figures, in the order printed.
pub fn figures(r: &AttachModes) -> Vec<(String, f64)> {
    [
        ("j_attach_trap_p50_us", median(&r.trap)),
        ("j_attach_trap_max_us", max(&r.trap)),
        ("j_attach_exitless_p50_us", median(&r.exitless)),
        ("j_attach_exitless_max_us", max(&r.exitless)),
        ("j_attach_exitless_over_trap", median(&r.ratios())),
        ("j_attach_sites", r.sites as f64),
        ("j_attach_rounds", r.trap.len() as f64),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

pub fn goal_name() -> String {
    format!("exitless attach pause <= {GOAL_ATTACH_RATIO} x trap attach")
}

pub fn goal(r: &AttachModes) -> Goal {
    let ratio = median(&r.ratios());
    Goal {
        name: goal_name(),
        measured: format!(
            "{ratio:.2} x (median of {} guests: exitless {:.1} µs, trap {:.1} µs)",
            r.trap.len(),
            median(&r.exitless),
            median(&r.trap)
        ),
        pass: Ok(ratio <= GOAL_ATTACH_RATIO),
    }
}

/// (j): the two windows and their ratio.
pub fn write(o: &mut String, r: &AttachModes) -> fmt::Result {
    writeln!(
        o,
        "(j) first attach of {} sites (--trace '{ATTACH_GLOB}'), each mode in its own pause, {} \
         fresh mini guests (mode=loop)",
        r.sites,
        r.trap.len()
    )?;
    for (name, v) in [("trap", &r.trap), ("exitless", &r.exitless)] {
        writeln!(
            o,
            "  {name:<9} pause window  median {:>8.1} µs  max {:>8.1} µs",
            median(v),
            max(v)
        )?;
    }
    writeln!(
        o,
        "  exitless / trap, per guest: median {:.2} (min {:.2}, max {:.2})",
        median(&r.ratios()),
        pct(&r.ratios(), 0.0),
        max(&r.ratios())
    )
}

pub fn method() -> String {
    format!(
        "--rounds fresh mini guests (mode=loop, --cpus vCPUs), each with a trap and an \
         exitless tracer of '{ATTACH_GLOB}': the first attach of each (order alternating by \
         guest), in its own pause, window = all parked to release; each detached in the next \
         pause. The exitless tracer is staged (Tracer::stage: its code and rings written, its \
         drainer thread spawned) while the guest runs, as vmtrace does; goal on the median of \
         the per-guest ratios"
    )
}
