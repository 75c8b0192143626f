//! How each figure is measured: the methods printed under the table and
//! saved in the JSON, each belonging to one bench; and a goal's JSON form.

use serde::Serialize;
use tracer::trace::model::{SYNTH_CALLERS, SYNTH_CPUS, SYNTH_FUNCS};

use super::super::measure::TRACE_GLOB;
use super::super::suite::BenchId;
use super::{attach_modes, direct, drain, events, exitless, ftrace, qemu, record, stack, Goal};
use crate::config::BenchConfig;

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

/// The bench a method (by its key in `methods`) belongs to.
pub fn method_bench(key: &str) -> BenchId {
    match key {
        "(a)" | "(b)" | "(c)" => BenchId::CallTrap,
        "(d)" => BenchId::AttachPause,
        "(e)" | "loading" => BenchId::AttachScaling,
        "(f)" => BenchId::CallExitless,
        "(g)" => BenchId::CallGraph,
        "stack" => BenchId::CallStack,
        "report" => BenchId::ReportRender,
        "(h)" => BenchId::RecordThroughput,
        "(i)" => BenchId::BootFtrace,
        "(k)" => BenchId::QemuAttach,
        "qemu/drain" => BenchId::QemuDrain,
        "call/direct" => BenchId::CallDirect,
        "attach/direct" => BenchId::AttachDirect,
        "sites/direct" => BenchId::SitesDirect,
        "events/cost" => BenchId::EventsCost,
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
        ("stack", stack::method()),
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
        ("(k)", qemu::method()),
        ("qemu/drain", drain::method()),
        ("call/direct", direct::call_method()),
        ("attach/direct", direct::attach_method()),
        ("sites/direct", direct::sites_method()),
        ("events/cost", events::method()),
    ]
}
