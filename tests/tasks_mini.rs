//! Who made each call, on real KVM with the mini guest: its tasks are laid
//! out as Linux's (a per-CPU current task, `task_struct` pid, tgid and comm,
//! all found through its BTF), switched in a known pattern, and it counts
//! its calls per task itself (guest/mini/README.md "Tasks"). vmtrace's
//! events, grouped by task, must equal those counts exactly, in trap and
//! exitless modes, with the function graph, and under `--pid` and `--comm`
//! filters (the calls they reject counted, exactly, as rejected).

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::*;
use tracer::kernel::find::{kernel_image, Given};
use tracer::plan::{ModeChoice, Request, TracePlan};
use tracer::session::{Recording, Session};
use tracer::trace::model::Trace;

/// The workload's functions every task calls (README "Tasks", "args=1").
const TRACE: &str = "hrtimer_*,schedule,do_idle,tick_sched_timer,__hrtimer_run_queues,args_*";
const CPUS: u32 = 2;
const CMDLINE: &str = "iters=240 args=1";

struct Quiet;
impl tracer::session::Observer for Quiet {}

struct Run {
    trace: Trace,
    /// The guest's own (cpu, pid, tgid, comm, function) -> calls, traced
    /// functions only.
    guest: MiniTaskCounts,
}

fn run(elf: &Path, mode: ModeChoice, graph: bool, pids: &[u32], comm: Option<&str>) -> Run {
    let kernel = vmm::boot::KernelFile::open(elf).unwrap();
    let image = kernel_image(&kernel, Given::Nothing).unwrap().image;
    let request = Request {
        trace: vec![TRACE.to_string()],
        notrace: Vec::new(),
        graph,
        mode,
        ring_events: None,
        cpus: CPUS as usize,
        emulator_host: false,
        linux: false,
        pids: pids.to_vec(),
        comm: comm.map(str::to_string),
        args: Vec::new(),
        retval: false,
        stack: Vec::new(),
        entry: Default::default(),
        events: Vec::new(),
        module_events: Vec::new(),
    };
    let plan = TracePlan::build(image, &request).unwrap();
    let want = match mode {
        ModeChoice::Exitless => "exitless",
        _ => "trap",
    };
    assert_eq!(plan.mode.name(), want);
    assert!(plan.plan.tasks.layout.is_some(), "{}", plan.plan.tasks.note);
    let capture = Capture::default();
    let mut cfg = mini_config(elf, u64::from(CPUS), CMDLINE, &capture);
    cfg.kernel = kernel;
    let vm = vmm::Vm::create(cfg).unwrap();
    let mut session = Session::start(vm, plan, Recording::memory(10_000_000)).unwrap();
    session.trace(None, &mut Quiet).unwrap().expect("attached");
    let ended = session.end(&vmm::advice::Plain);
    assert_eq!(
        ended.report.reason,
        vmm::StopReason::PowerOff(0),
        "{}",
        capture.text()
    );
    ended.drained.unwrap();
    let trace = ended.summary;
    let traced: Vec<&str> = trace.functions.iter().map(|f| f.name.as_str()).collect();
    let (all, _) = parse_mini_task_counts(&capture.text());
    let guest = all
        .into_iter()
        .filter(|((.., f), _)| traced.contains(&f.as_str()))
        .collect();
    Run { trace, guest }
}

/// vmtrace's entries grouped as the guest counts them.
fn by_task(trace: &Trace) -> MiniTaskCounts {
    let mut m = BTreeMap::new();
    for e in trace.events.iter().filter(|e| !e.is_return()) {
        let t = trace.task_of(e).expect("every event has a task");
        let f = trace.functions[e.func as usize].name.clone();
        *m.entry((e.cpu, t.pid as i32, t.tgid as i32, t.comm.clone(), f))
            .or_insert(0) += 1;
    }
    m
}

/// The same without comm: what exitless mode names exactly (it reads comm
/// when it drains, after a rename possibly).
fn by_pid(m: &MiniTaskCounts) -> BTreeMap<(u32, i32, i32, String), u64> {
    let mut out = BTreeMap::new();
    for ((cpu, pid, tgid, _, f), n) in m {
        *out.entry((*cpu, *pid, *tgid, f.clone())).or_insert(0) += n;
    }
    out
}

fn check_all_stored(r: &Run) {
    assert_eq!(r.trace.meta.events_dropped, 0);
    let calls: u64 = r.trace.counts.iter().flatten().sum();
    let entries = r.trace.events.iter().filter(|e| !e.is_return()).count() as u64;
    assert_eq!(entries, calls);
}

#[test]
fn trap_mode_names_every_calls_task_exactly() {
    let r = run(&mini_elf(), ModeChoice::Trap, false, &[], None);
    check_all_stored(&r);
    assert_eq!(by_task(&r.trace), r.guest);
    // The idle tasks are pid 0 on each vCPU, by their own names; the
    // renamed task is a task entry of its own.
    let comms: Vec<&str> = r.trace.tasks.iter().map(|t| t.comm.as_str()).collect();
    for c in [
        "swapper/0",
        "swapper/1",
        "mini-a/1",
        "mini-b/0",
        "mini-b2/1",
    ] {
        assert!(comms.contains(&c), "{c} in {comms:?}");
    }
    assert!(
        r.trace.meta.tasks.starts_with("from the BTF of "),
        "{}",
        r.trace.meta.tasks
    );
    assert_eq!(r.trace.meta.filtered, 0);
}

#[test]
fn exitless_mode_names_every_calls_task_exactly() {
    for variant in ["mini", "mini-percpu-addr"] {
        let elf = if variant == "mini" {
            mini_elf()
        } else {
            mini_variant_elf(variant)
        };
        let r = run(&elf, ModeChoice::Exitless, false, &[], None);
        check_all_stored(&r);
        let got = by_task(&r.trace);
        assert_eq!(by_pid(&got), by_pid(&r.guest), "{variant}");
        // Each comm is one the guest gave that pid.
        for (cpu, pid, _, comm, _) in got.keys() {
            assert!(
                r.guest
                    .keys()
                    .any(|(c, p, _, n, _)| c == cpu && p == pid && n == comm),
                "{variant}: {comm} is not a name of pid {pid} on cpu {cpu}"
            );
        }
    }
}

#[test]
fn graph_returns_carry_the_task_of_their_call() {
    for mode in [ModeChoice::Trap, ModeChoice::Exitless] {
        let r = run(&mini_elf(), mode, true, &[], None);
        assert_eq!(by_pid(&by_task(&r.trace)), by_pid(&r.guest), "{mode:?}");
        let returns = r.trace.events.iter().filter(|e| e.is_return()).count();
        let calls = r.trace.events.len() - returns;
        assert_eq!(returns, calls, "{mode:?}");
        // Per (cpu, pid): as many returns as calls.
        let mut balance: BTreeMap<(u32, u32), i64> = BTreeMap::new();
        for e in &r.trace.events {
            let pid = r.trace.task_of(e).expect("a task").pid;
            *balance.entry((e.cpu, pid)).or_insert(0) += if e.is_return() { -1 } else { 1 };
        }
        assert!(balance.values().all(|&b| b == 0), "{mode:?}: {balance:?}");
    }
}

/// Calls of the guest's (cpu, pid, tgid, comm, function) counts that `keep`
/// keeps, and the rest.
fn split(guest: &MiniTaskCounts, keep: impl Fn(i32, &str) -> bool) -> (MiniTaskCounts, u64) {
    let kept: MiniTaskCounts = guest
        .iter()
        .filter(|((_, pid, _, comm, _), _)| keep(*pid, comm))
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    let rejected = guest.values().sum::<u64>() - kept.values().sum::<u64>();
    (kept, rejected)
}

#[test]
fn pid_filter_keeps_exactly_those_tasks_in_both_modes() {
    // mini-a/1 and mini-b/0 (the latter renamed half way).
    let pids = [1011u32, 1002];
    for mode in [ModeChoice::Trap, ModeChoice::Exitless] {
        let r = run(&mini_elf(), mode, false, &pids, None);
        check_all_stored(&r);
        let (kept, rejected) = split(&r.guest, |pid, _| pids.contains(&(pid as u32)));
        assert!(rejected > 0);
        assert_eq!(by_pid(&by_task(&r.trace)), by_pid(&kept), "{mode:?}");
        assert_eq!(r.trace.meta.filtered, rejected, "{mode:?}");
        let calls: u64 = r.trace.counts.iter().flatten().sum();
        assert_eq!(calls, kept.values().sum::<u64>(), "{mode:?}");
        assert!(
            r.trace.meta.tasks.ends_with("kept only pid 1011, 1002"),
            "{}",
            r.trace.meta.tasks
        );
    }
}

#[test]
fn comm_filter_keeps_exactly_the_matching_tasks_in_both_modes() {
    for mode in [ModeChoice::Trap, ModeChoice::Exitless] {
        let r = run(&mini_elf(), mode, false, &[], Some("mini-b*"));
        check_all_stored(&r);
        let (kept, rejected) = split(&r.guest, |_, comm| comm.starts_with("mini-b"));
        assert_eq!(by_pid(&by_task(&r.trace)), by_pid(&kept), "{mode:?}");
        assert_eq!(r.trace.meta.filtered, rejected, "{mode:?}");
    }
}
