//! What the trap recorders record besides the call itself, handed to
//! them when a session is created: the guest task (`--pid`, `--comm`, or
//! just naming it), the values (`--args`, `--retval`), the kernel stack
//! (`--stack`).

use std::sync::Arc;

use vmm::TrapHandler;

use super::args::{ArgSource, ArgTable};
use super::module_traps::ModuleTraps;
use super::record::event_fields::FieldSource;
use super::record::Recorder;
use super::stacks::StackSource;
use super::store::Store;
use super::tasks::{TaskSource, TaskTable};
use crate::plan::Plan;

/// How a session's events get their task, when the plan knows the
/// kernel's task layout.
pub(super) fn task_source(plan: &Plan, table: &Arc<TaskTable>) -> Option<Arc<TaskSource>> {
    let layout = plan.tasks.layout?;
    Some(Arc::new(TaskSource::new(
        layout,
        Arc::clone(table),
        plan.tasks.filter.clone(),
    )))
}

/// The plan's events' formats by site (`session::record::event_fields`);
/// None when it traces no event or BTF lacks the offsets.
pub(super) fn field_source(plan: &Plan) -> Option<FieldSource> {
    let offsets = plan.events.offsets?;
    FieldSource::of(plan.event_formats(), offsets)
}

/// How a session's `--stack` calls unwind (None: no stacks recorded).
pub(super) fn stack_source(plan: &Plan, store: &Store) -> Option<Arc<StackSource>> {
    let sp = plan.stacks.as_ref()?;
    Some(Arc::new(StackSource::with_globs(
        sp.unwinder.clone(),
        &plan.image,
        sp.sites(&plan.index),
        store.stacks(),
        Some(sp.globs.clone()),
    )))
}

/// Give the recorders what they record besides the call: its task, its
/// values, its stack; and the own VMM's module traps, returned for the
/// tracer.
pub(super) fn equip(
    recs: &mut [Recorder],
    plan: &Plan,
    tasks: &Option<Arc<TaskSource>>,
    stacks: &Option<Arc<StackSource>>,
    args: Arc<ArgTable>,
) -> Option<Arc<ModuleTraps>> {
    let retval = plan.graph && plan.values.retval;
    let event_tests = super::event_keys::TestTraps::of(&plan.events);
    let modules = ModuleTraps::of(plan);
    let child_exits = plan.child_exit_sites().map(Arc::new);
    for r in recs.iter_mut() {
        if let Some(t) = &event_tests {
            r.pass_event_tests(Arc::clone(t));
        }
        if let Some(m) = &modules {
            r.follow_modules(Arc::clone(m));
        }
        if let Some(src) = tasks {
            r.record_tasks(Arc::clone(src));
        }
        if let Some(src) = stacks {
            r.record_stacks(Arc::clone(src));
        }
        // (Trap mode: the sites added during the trace record them too.)
        let source = ArgSource::new(&args, plan.arg_sites());
        let source = source.map(|a| a.with_added(&plan.index));
        r.record_values(source, retval);
        r.record_fields(field_source(plan));
        r.record_child_exits(child_exits.clone());
    }
    modules
}

/// The recorders as the vCPU threads take them.
pub(super) fn boxed(recs: Vec<Recorder>) -> Vec<Box<dyn TrapHandler>> {
    recs.into_iter()
        .map(|r| Box::new(r) as Box<dyn TrapHandler>)
        .collect()
}
