//! events/cost: what an exitless event costs the guest, in instructions
//! counted in a kernel's text and vmtrace's code, no guest run: a traced
//! function entry's (vmtrace's trampoline on a recorded call, as
//! call/exitless counts it, built for this kernel), each event's path
//! beyond it (`tracer::kernel::events::path_cost`), and the code that
//! copies an event's strings (`tracer::plan::exitless::strcopy`).

use std::path::Path;

use tracer::kernel::events::path_cost::{event_path_cost, EventPathCost};
use tracer::plan::events::EventPlan;
use tracer::plan::exitless::strcopy;
use tracer::plan::Plan;
use tracer::session::Tracer;

use super::TRACE_GLOB;
use crate::error::{Error, RuntimeError};

/// The events costed, as `-e` names them: two whose fields all last past
/// the event, and one whose names vmtrace's code copies at it.
pub const COSTED_EVENTS: &str = "sched:sched_switch,sched:sched_wakeup,task:task_rename";

/// One kernel's figures.
#[derive(Clone, Debug)]
pub struct EventCosts {
    /// A traced function entry's instructions: the exitless trampoline's
    /// on a recorded call (`TRACE_GLOB`'s sites of this kernel).
    pub entry: usize,
    /// Each event (its name without the subsystem), its path's
    /// instructions beyond an entry, the longest of its call sites, and
    /// its strings' copies.
    pub events: Vec<(String, EventPathCost, CopyCost)>,
}

/// What copying an event's strings adds (`tracer::plan::exitless::strcopy`):
/// the instructions of vmtrace's code around the copies, and the calls of
/// the kernel's nofault copies (whose own instructions, a loop per byte,
/// are not counted).
#[derive(Clone, Copy, Debug, Default)]
pub struct CopyCost {
    pub insns: usize,
    pub calls: usize,
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
        let copies = match (&e.format, &events.offsets) {
            (Some(f), Some(off)) => strcopy::copies(f, off),
            _ => Vec::new(),
        };
        let copy = CopyCost {
            insns: strcopy::path_instructions(&copies),
            calls: copies.iter().map(strcopy::StrCopy::calls).sum(),
        };
        costs.push((e.name.clone(), longest, copy));
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
