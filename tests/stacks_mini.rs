//! Kernel stacks (`--stack`) on real KVM with the mini guest: with
//! `stack=1` it calls `stack_leaf` through four known chains a known number
//! of times per vCPU, checks each chain itself by walking its frame pointers,
//! and prints them (guest/mini/README.md "stack=1"). Every stack vmtrace
//! unwinds at `stack_leaf` must be one of those chains, exactly, down to the
//! end of the stack, and the calls per (vCPU, chain) must equal the guest's
//! counts: in trap mode, with the function graph (whose hooked returns the
//! unwinder must read as the real ones), and in exitless mode (where only
//! `stack_leaf`'s site traps).

mod common;

use std::collections::BTreeMap;

use common::*;
use tracer::kernel::find::{kernel_image, Given};
use tracer::plan::{ModeChoice, PlanError, Request, TracePlan};
use tracer::session::{Recording, Session};
use tracer::trace::model::{StackEnd, Trace};

const CPUS: u32 = 2;
const ITERS: u64 = 40;

struct Quiet;
impl tracer::session::Observer for Quiet {}

fn request(mode: ModeChoice, graph: bool) -> Request {
    Request {
        trace: vec!["stack_*".to_string()],
        notrace: Vec::new(),
        graph,
        mode,
        ring_events: None,
        cpus: CPUS as usize,
        emulator_host: false,
        linux: false,
        pids: Vec::new(),
        comm: None,
        args: Vec::new(),
        retval: false,
        stack: vec!["stack_leaf".to_string()],
        entry: Default::default(),
        events: Vec::new(),
        module_events: Vec::new(),
    }
}

/// Trace `stack_*` recording `stack_leaf`'s stacks: the trace, the guest's
/// own chains and counts, and the run's trap exits.
fn run(mode: ModeChoice, graph: bool) -> (Trace, BTreeMap<(u32, String), MiniStack>, u64) {
    run_on(&mini_elf(), mode, graph)
}

/// `run` on the mini guest built as `elf`.
fn run_on(
    elf: &std::path::Path,
    mode: ModeChoice,
    graph: bool,
) -> (Trace, BTreeMap<(u32, String), MiniStack>, u64) {
    let elf = elf.to_path_buf();
    let kernel = vmm::boot::KernelFile::open(&elf).unwrap();
    let image = kernel_image(&kernel, Given::Nothing).unwrap().image;
    let plan = TracePlan::build(image, &request(mode, graph)).unwrap();
    let want = match mode {
        ModeChoice::Exitless => "exitless",
        _ => "trap",
    };
    assert_eq!(plan.mode.name(), want);
    let capture = Capture::default();
    let cmdline = format!("iters={ITERS} stack=1");
    let mut cfg = mini_config(&elf, u64::from(CPUS), &cmdline, &capture);
    cfg.kernel = kernel;
    let vm = vmm::Vm::create(cfg).unwrap();
    let mut session = Session::start(vm, plan, Recording::memory(1_000_000)).unwrap();
    session.trace(None, &mut Quiet).unwrap().expect("attached");
    let ended = session.end(&vmm::advice::Plain);
    assert_eq!(
        ended.report.reason,
        vmm::StopReason::PowerOff(0),
        "{}",
        capture.text()
    );
    ended.drained.unwrap();
    let guest = parse_mini_stack(&capture.text());
    assert_eq!(guest.len(), CPUS as usize * MINI_STACK_PATHS.len());
    let exits = ended.summary.meta.trap_exits;
    (ended.summary, guest, exits)
}

/// Each stack_leaf entry's chain as the guest prints it (the function,
/// then its frames' functions), counted per (vCPU, path); every other
/// entry must have no stack.
fn chains(t: &Trace, guest: &BTreeMap<(u32, String), MiniStack>) -> BTreeMap<(u32, String), u64> {
    assert!(
        t.meta.stacks.starts_with("frame pointers"),
        "{}",
        t.meta.stacks
    );
    let mut got = BTreeMap::new();
    for e in t.events.iter().filter(|e| !e.is_return()) {
        let name = t.functions[e.func as usize].name.as_str();
        let Some(stack) = t.stack_of(e) else {
            assert_ne!(name, "stack_leaf", "a stack_leaf call without a stack");
            continue;
        };
        assert_eq!(name, "stack_leaf");
        assert_eq!(stack.end, StackEnd::Bottom, "{stack:?}");
        let mut chain = vec![name.to_string()];
        for &ip in &stack.frames {
            let f = t
                .caller_of(ip - 1)
                .unwrap_or_else(|| panic!("{ip:#x} unnamed"));
            chain.push(f.name.clone());
        }
        let path = MINI_STACK_PATHS
            .iter()
            .find(|p| guest[&(e.cpu, p.to_string())].chain == chain)
            .unwrap_or_else(|| panic!("cpu {}: no guest chain is {chain:?}", e.cpu));
        *got.entry((e.cpu, path.to_string())).or_insert(0) += 1;
    }
    got
}

fn guest_counts(guest: &BTreeMap<(u32, String), MiniStack>) -> BTreeMap<(u32, String), u64> {
    for ((_, path), s) in guest {
        assert_eq!(s.calls, mini_stack_expected(path, ITERS), "{path}");
    }
    guest.iter().map(|(k, s)| (k.clone(), s.calls)).collect()
}

#[test]
fn trap_mode_unwinds_every_stack_exactly() {
    let (t, guest, _) = run(ModeChoice::Trap, false);
    assert_eq!(t.meta.events_dropped, 0);
    assert_eq!(chains(&t, &guest), guest_counts(&guest));
    // Equal stacks are one entry: four chains a vCPU, and the same code
    // on both vCPUs gives the same return addresses.
    assert_eq!(t.stacks.len(), MINI_STACK_PATHS.len());
    let leaf = t
        .functions
        .iter()
        .position(|f| f.name == "stack_leaf")
        .unwrap();
    assert_eq!(t.meta.stack_funcs, [leaf as u32]);
}

/// Without ftrace (mini-noftrace), direct entries: `stack_outer_a`'s
/// displaced bytes end in `call stack_mid`, which its stub runs as a push
/// of the return address in place (stack_outer_a + 9) and a jump, so the
/// frames below it unwind as without vmtrace: a return address in
/// vmtrace's page would be unnamed, and the guest's own walk would not
/// find its chain.
#[test]
fn a_displaced_call_returns_into_its_function() {
    let (t, guest, _) = run_on(&mini_variant_elf("mini-noftrace"), ModeChoice::Trap, false);
    assert_eq!(t.meta.events_dropped, 0);
    assert_eq!(chains(&t, &guest), guest_counts(&guest));
}

/// With the function graph every traced caller on the chain (stack_mid,
/// stack_outer_*, stack_recurse) has its return hooked when stack_leaf
/// runs: the unwinder must read the real return addresses.
#[test]
fn graph_hooked_callers_unwind_as_their_real_returns() {
    let (t, guest, _) = run(ModeChoice::Trap, true);
    assert_eq!(t.meta.events_dropped, 0);
    assert_eq!(chains(&t, &guest), guest_counts(&guest));
    assert_eq!(t.stacks.len(), MINI_STACK_PATHS.len());
}

/// In exitless mode only stack_leaf's site traps: one exit per stack_leaf
/// call, the other functions' calls recorded through the rings, all exact.
#[test]
fn exitless_mode_traps_only_the_stack_sites() {
    let (t, guest, exits) = run(ModeChoice::Exitless, false);
    assert_eq!(t.meta.mode, "exitless");
    assert_eq!(t.meta.events_dropped, 0);
    let want = guest_counts(&guest);
    assert_eq!(chains(&t, &guest), want);
    let leaf_calls: u64 = want.values().sum();
    assert_eq!(exits, leaf_calls);
    let count = |name: &str| -> u64 {
        let f = t.functions.iter().position(|f| f.name == name).unwrap();
        t.counts[f].iter().sum()
    };
    assert_eq!(count("stack_leaf"), leaf_calls);
    let per_cpu = u64::from(CPUS);
    assert_eq!(count("stack_mid"), ITERS * per_cpu);
    assert_eq!(count("stack_outer_a"), ITERS * per_cpu);
    assert_eq!(count("stack_outer_b"), ITERS.div_ceil(2) * per_cpu);
    assert_eq!(count("stack_recurse"), 3 * ITERS.div_ceil(8) * per_cpu);
}

/// Exitless return hooks would hide the callers: refused before the guest
/// runs, from the library and from the CLI (one line, exit status 2).
#[test]
fn exitless_graph_stacks_are_refused() {
    let image = kernel_image(
        &vmm::boot::KernelFile::open(&mini_elf()).unwrap(),
        Given::Nothing,
    )
    .unwrap()
    .image;
    let r = TracePlan::build(image, &request(ModeChoice::Exitless, true));
    assert!(matches!(r, Err(PlanError::StackGraphExitless)));
    let elf = mini_elf();
    assert_bad_input(
        &[
            "--kernel",
            elf.to_str().unwrap(),
            "--trace",
            "stack_*",
            "--stack",
            "stack_leaf",
            "--graph",
            "--mode",
            "exitless",
        ],
        "--stack with --graph records stacks in trap mode only",
    );
    assert_bad_input(
        &[
            "--kernel",
            elf.to_str().unwrap(),
            "--trace",
            "stack_*",
            "--stack",
            "hrtimer_*",
        ],
        "--stack hrtimer_* matches none of the traced functions",
    );
    assert_bad_input(
        &[
            "--kernel",
            elf.to_str().unwrap(),
            "--trace",
            "stack_*",
            "--stack",
            "!stack_leaf",
        ],
        "--stack '!stack_leaf' only removes functions",
    );
    assert_bad_input(
        &["--kernel", elf.to_str().unwrap(), "--stack", "stack_leaf"],
        "--stack needs --trace GLOB",
    );
}
