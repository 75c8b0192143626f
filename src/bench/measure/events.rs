//! events/cost: what an exitless event costs the guest, in instructions
//! counted in a kernel's text and vmtrace's code, no guest run: a traced
//! function entry's (vmtrace's trampoline on a recorded call, as
//! call/exitless counts it, built for this kernel) and each event's path
//! beyond it (`tracer::kernel::events::path_cost`).

use std::path::Path;

use tracer::kernel::events::path_cost::{event_path_cost, EventPathCost};
use tracer::plan::events::EventPlan;
use tracer::plan::Plan;
use tracer::session::Tracer;

use super::TRACE_GLOB;
use crate::error::{Error, RuntimeError};

/// The events costed, as `-e` names them.
pub const COSTED_EVENTS: &str = "sched:sched_switch,sched:sched_wakeup";

/// One kernel's figures.
#[derive(Clone, Debug)]
pub struct EventCosts {
    /// A traced function entry's instructions: the exitless trampoline's
    /// on a recorded call (`TRACE_GLOB`'s sites of this kernel).
    pub entry: usize,
    /// Each event (its name without the subsystem) and its path's
    /// instructions beyond an entry, the longest of its call sites.
    pub events: Vec<(String, EventPathCost)>,
}

fn measure_err(e: impl std::fmt::Display) -> Error {
    RuntimeError::Measure(format!("events/cost: {e}")).into()
}

/// events/cost on the vmlinux at `vmlinux`.
pub fn event_costs(vmlinux: &Path) -> Result<EventCosts, Error> {
    let plan = Plan::new(vmlinux, &[TRACE_GLOB.to_string()], &[])?;
    let events =
        EventPlan::build(&plan.image, &[COSTED_EVENTS.to_string()]).map_err(measure_err)?;
    let mut costs = Vec::new();
    for e in &events.events {
        let longest = e
            .tests
            .iter()
            .map(|t| event_path_cost(&plan.image, t, e.funcs, e.iterator))
            .collect::<Option<Vec<_>>>()
            .and_then(|v| v.into_iter().max_by_key(EventPathCost::total))
            .ok_or_else(|| measure_err(format!("{}'s path does not decode", e.full_name())))?;
        costs.push((e.name.clone(), longest));
    }
    let (exitless, unused) = Tracer::exitless(plan, 1, u64::MAX, None)?;
    drop(unused);
    // As call/exitless counts it (`exitless_costs`).
    let entry = exitless
        .trampoline()
        .map(|t| t.common_path_instructions() + t.return_path.len())
        .ok_or_else(|| measure_err("the exitless tracer has no trampoline"))?;
    Ok(EventCosts {
        entry,
        events: costs,
    })
}
