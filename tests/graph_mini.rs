//! Function-graph tracing (`--graph`) of the mini guest's `graph=1` workload
//! (guest/mini/README.md), in trap and exitless mode: returns, nesting,
//! tail calls, recursion, abandoned frames, a call that returns on another
//! vCPU, a long function's duration, and a detach while frames are hooked.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::*;
use tracer::plan::Plan;
use tracer::session::Tracer;
use tracer::trace::graph::{End, Frame, Graph};
use tracer::trace::model::Trace;
use vm_memory::{Bytes, GuestAddress};
use vmm::Stopped;

fn tmp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("vmtrace-graph-mini-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// The parent function each traced function of the mini guest is called
/// from (the workload's call graph; `None`: called from untraced code, or
/// from `mini_main` when vmtrace hooked it). graph_tail_callee is reached
/// by a jmp from graph_tail_caller, so its frame nests in the caller's, as
/// ftrace's function_graph shows a tail call; graph_abandoned is called
/// through the notrace graph_abandon_run.
fn parent_of(f: &str) -> &'static [&'static str] {
    match f {
        "schedule" | "hrtimer_try_to_cancel" | "hrtimer_interrupt" => &["do_idle"],
        "hrtimer_start_range_ns" => &["schedule"],
        "__hrtimer_run_queues" => &["hrtimer_interrupt"],
        "hrtimer_wakeup" | "tick_sched_timer" => &["__hrtimer_run_queues"],
        "graph_depth2" => &["graph_depth"],
        "graph_depth3" => &["graph_depth2"],
        "graph_leaf" => &["graph_depth3"],
        "graph_tail_callee" => &["graph_tail_caller"],
        "graph_recurse" => &["graph_recurse", "mini_main", ""],
        "graph_abandoned" => &["graph_abandon_outer"],
        _ => &["mini_main", ""],
    }
}

/// One traced run through the CLI: the console and the saved trace.
fn run(mode: &str, cpus: u32, iters: u64, glob: &str) -> (String, Trace) {
    let tag: String = glob.chars().filter(char::is_ascii_alphanumeric).collect();
    let out = tmp(&format!("{mode}-{cpus}-{tag}.vmtrace"));
    let kernel = mini_elf();
    let cpus_s = cpus.to_string();
    let cmdline = format!("iters={iters} graph=1");
    let o = vmtrace(&[
        "--kernel",
        kernel.to_str().unwrap(),
        "--cpus",
        &cpus_s,
        "--cmdline",
        &cmdline,
        "--trace",
        glob,
        "--graph",
        "--mode",
        mode,
        "--timeout",
        "240",
        "-o",
        out.to_str().unwrap(),
        // The console on stdout, with the report (the default is stderr).
        "--console",
        "-",
    ]);
    let err = stderr(&o);
    assert!(o.status.success(), "exit {:?}: {err}", o.status);
    assert!(err.contains("guest powered off (status 0)"), "{err}");
    let trace = tracer::trace::datafile::load(&out).unwrap();
    std::fs::remove_file(&out).unwrap();
    (stdout(&o), trace)
}

fn func_index(t: &Trace, name: &str) -> usize {
    t.functions
        .iter()
        .position(|f| f.name == name)
        .unwrap_or_else(|| panic!("{name} not traced"))
}

fn name<'t>(t: &'t Trace, f: &Frame) -> &'t str {
    &t.functions[f.func as usize].name
}

fn check_graph_run(mode: &str, cpus: u32, iters: u64) {
    let (console, t) = run(mode, cpus, iters, "*");
    assert!(t.meta.graph);
    assert_eq!(t.meta.mode, mode);
    assert_eq!((t.meta.events_dropped, t.meta.returns_dropped), (0, 0));
    assert_eq!(t.meta.unhooked, 0);
    let (printed, done) = parse_mini_console(&console);
    assert_eq!(done, (0..cpus).collect::<Vec<_>>(), "{console}");
    let g = Graph::build(&t);
    assert_eq!((g.unmatched_returns, g.mismatched_returns), (0, 0));

    // Calls: exactly what the guest counted. Returns: as many on each vCPU,
    // except the functions that do not return (graph_abandoned, mini_main)
    // and graph_migrate, which returns on vCPU 1.
    for ((cpu, f), &n) in &printed {
        let i = func_index(&t, f);
        let c = *cpu as usize;
        assert_eq!(t.counts[i][c], n, "{mode}: calls of {f} on vCPU {cpu}");
        let want_returns = match f.as_str() {
            "graph_abandoned" => 0,
            "graph_migrate" => {
                let entered: u64 = t.counts[i].iter().sum();
                if c == 1 {
                    entered
                } else {
                    0
                }
            }
            _ => n,
        };
        assert_eq!(
            t.returns[i][c], want_returns,
            "{mode}: returns of {f} on vCPU {cpu}"
        );
    }

    // Nesting: every frame's parent is its caller in the workload's graph.
    for f in &g.frames {
        let parent = f.parent.map_or("", |p| name(&t, &g.frames[p as usize]));
        assert!(
            parent_of(name(&t, f)).contains(&parent),
            "{mode}: {} nested in {parent:?}",
            name(&t, f)
        );
        if let (Some(total), Some(own)) = (f.total_ns(), f.self_ns()) {
            assert!(total >= f.child_ns && own <= total, "{mode}: {f:?}");
        }
    }
    // Depths: graph_leaf is 3 below graph_depth; the recursion 6 deep.
    let per_cpu = |fname: &str, pred: &dyn Fn(&Frame) -> bool| -> BTreeMap<u32, u64> {
        let mut m = BTreeMap::new();
        for f in g.frames.iter().filter(|f| name(&t, f) == fname && pred(f)) {
            *m.entry(f.cpu).or_insert(0) += 1;
        }
        m
    };
    let depth_of = |f: &Frame, ancestor: &str| -> u32 {
        let mut d = 0;
        let mut at = f.parent;
        while let Some(p) = at {
            d += 1;
            let pf = &g.frames[p as usize];
            if name(&t, pf) == ancestor {
                return d;
            }
            at = pf.parent;
        }
        panic!("{mode}: {} has no {ancestor} above it", name(&t, f));
    };
    for f in g.frames.iter().filter(|f| name(&t, f) == "graph_leaf") {
        assert_eq!(depth_of(f, "graph_depth"), 3);
    }
    let outer = per_cpu("graph_recurse", &|f: &Frame| {
        f.parent
            .is_none_or(|p| name(&t, &g.frames[p as usize]) != "graph_recurse")
    });
    let inner = per_cpu("graph_recurse", &|f: &Frame| {
        f.parent
            .is_some_and(|p| name(&t, &g.frames[p as usize]) == "graph_recurse")
    });
    for cpu in 0..cpus {
        assert_eq!(outer.get(&cpu), Some(&iters), "{mode}: recursions on {cpu}");
        assert_eq!(
            inner.get(&cpu),
            Some(&(5 * iters)),
            "{mode}: nested on {cpu}"
        );
    }
    // The tail callee returns where its caller would have: the caller of
    // graph_tail_caller (vmtrace's hook mapped back, as -g shows it).
    for f in g
        .frames
        .iter()
        .filter(|f| name(&t, f) == "graph_tail_callee")
    {
        let p = &g.frames[f.parent.unwrap() as usize];
        assert_eq!(f.caller, p.caller, "{mode}: tail callee's caller");
        assert!(matches!(f.end, End::Returned { .. }));
    }
    // Abandoned: every graph_abandoned frame, and nothing else.
    let abandoned: u64 = printed
        .iter()
        .filter(|((_, f), _)| f == "graph_abandoned")
        .map(|(_, &n)| n)
        .sum();
    assert!(abandoned > 0);
    assert_eq!(g.abandoned, abandoned, "{mode}: abandoned frames");
    for f in &g.frames {
        let is_abandoned = f.end == End::Abandoned;
        assert_eq!(
            is_abandoned,
            name(&t, f) == "graph_abandoned",
            "{mode}: {f:?} of {}",
            name(&t, f)
        );
    }
    // graph_migrate: entered on vCPU 0, returned on vCPU 1.
    if cpus >= 2 {
        assert!(console.contains("mini: migrate entered_cpu 0 returned_cpu 1"));
        let m: Vec<&Frame> = g
            .frames
            .iter()
            .filter(|f| name(&t, f) == "graph_migrate")
            .collect();
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].cpu, 0);
        assert!(
            matches!(m[0].end, End::Returned { cpu: 1, .. }),
            "{:?}",
            m[0]
        );
    }
    check_durations(mode, &t, &g, &console, &printed);
}

/// Durations, by what no host noise can break (a vCPU descheduled for
/// seconds only lengthens vmtrace's spans, never shortens them, and never
/// reorders one vCPU's events):
/// - graph_long spins until the guest TSC advanced `GRAPH_LONG_TICKS`
///   between vmtrace's entry and return stamps: every call spans at least
///   that, and per vCPU the calls at least the guest's own sum of ticks;
/// - its caller's `rdtsc`s bracket each call, vmtrace's stamps within:
///   per vCPU the calls span at most the bracket's sum (the same clock in
///   exitless mode; in trap mode the host clock, whose rate differs from
///   the TSC's by NTP's slew, under 500 ppm: 1% allowed);
/// - graph_long calls nothing traced: on its vCPU its return is the very
///   next event after its entry, and its span is those two stamps (a
///   return paired with a later call, or a stamp misplaced, breaks this);
/// - every returned frame lies within its returned parent on one vCPU,
///   starts no later than it returns, and its self time is at most its
///   total.
///
/// (An upper bound by time, a tolerance per call, failed whenever the
/// host descheduled a vCPU between the hook and the function's first
/// rdtsc.)
fn check_durations(
    mode: &str,
    t: &Trace,
    g: &Graph,
    console: &str,
    printed: &BTreeMap<(u32, String), u64>,
) {
    // The guest's rate converts its ticks; stamps within 1 µs (rounding).
    const SLACK_NS: u64 = 1_000;
    let stats = parse_mini_stats(console);
    let khz = t.meta.tsc_khz;
    assert!(khz > 0, "the guest TSC rate is in the trace");
    let long = func_index(t, "graph_long");
    let min_call_ns = mini_h_define("GRAPH_LONG_TICKS") * 1_000_000 / khz;
    let cpus = t.meta.cpus;
    let (_, per) = g.durations(t.functions.len(), cpus as usize);
    for cpu in 0..cpus {
        let ticks = stats[&(cpu, "graph_long_ticks_sum".to_string())];
        let guest_ns = ticks * 1_000_000 / khz;
        let d = per[long][cpu as usize];
        let calls = printed[&(cpu, "graph_long".to_string())];
        assert_eq!(d.returned, calls);
        assert!(
            d.total_ns + SLACK_NS >= guest_ns,
            "{mode}: graph_long on vCPU {cpu}: vmtrace {} ns, guest {guest_ns} ns ({ticks} ticks at {khz} kHz)",
            d.total_ns
        );
        let outer = stats[&(cpu, "graph_long_outer_ticks_sum".to_string())];
        let outer_ns = outer * 1_000_000 / khz;
        assert!(
            d.total_ns <= outer_ns + outer_ns / 100 + calls * SLACK_NS,
            "{mode}: graph_long on vCPU {cpu}: vmtrace {} ns, its caller's bracket {outer_ns} ns",
            d.total_ns
        );
        assert!(d.self_ns <= d.total_ns, "{mode}: {d:?}");
        // Each call, against the events next to it on its vCPU.
        let mine: Vec<_> = t.events.iter().filter(|e| e.cpu == cpu).collect();
        let mut seen = 0;
        for (i, e) in mine.iter().enumerate() {
            if e.func as usize != long || e.is_return() {
                continue;
            }
            seen += 1;
            let ret = mine
                .get(i + 1)
                .unwrap_or_else(|| panic!("{mode}: graph_long's entry is vCPU {cpu}'s last event"));
            assert!(
                ret.is_return() && ret.func as usize == long,
                "{mode}: vCPU {cpu}: after graph_long's entry {e:?} comes {ret:?}"
            );
            assert!(
                ret.ts_ns - e.ts_ns + SLACK_NS >= min_call_ns,
                "{mode}: vCPU {cpu}: graph_long spanned {} ns, under the {min_call_ns} ns it spins",
                ret.ts_ns - e.ts_ns
            );
        }
        assert_eq!(seen, calls, "{mode}: graph_long entries on vCPU {cpu}");
    }
    for f in &g.frames {
        let End::Returned { ts_ns: end, cpu } = f.end else {
            continue;
        };
        assert!(f.entry_ns <= end, "{mode}: {f:?}");
        assert!(
            f.self_ns().unwrap() <= f.total_ns().unwrap(),
            "{mode}: {f:?}"
        );
        if name(t, f) == "graph_long" {
            let frame = end - f.entry_ns;
            assert!(frame + SLACK_NS >= min_call_ns, "{mode}: {f:?}");
        }
        let Some(p) = f.parent.map(|p| &g.frames[p as usize]) else {
            continue;
        };
        match p.end {
            End::Returned {
                ts_ns: p_end,
                cpu: p_cpu,
            } if cpu == f.cpu && p_cpu == p.cpu && p.cpu == f.cpu => {
                assert!(
                    p.entry_ns <= f.entry_ns && end <= p_end,
                    "{mode}: {} {f:?} outside its parent {} {p:?}",
                    name(t, f),
                    name(t, p)
                );
            }
            _ => {}
        }
    }
}

/// A `#define` of guest/mini/mini.h (a number).
fn mini_h_define(name: &str) -> u64 {
    let text = std::fs::read_to_string(root().join("guest/mini/mini.h")).unwrap();
    text.lines()
        .find_map(
            |l| match l.split_whitespace().collect::<Vec<_>>().as_slice() {
                ["#define", n, v, ..] if *n == name => v.parse().ok(),
                _ => None,
            },
        )
        .unwrap_or_else(|| panic!("no #define {name} in mini.h"))
}

/// `--graph --trace 'hrtimer_*'`: only the four hrtimer functions hooked.
/// Every call returns on its vCPU, and hrtimer_wakeup nests directly in
/// hrtimer_interrupt (the __hrtimer_run_queues between them is not traced).
fn check_hrtimer_glob(mode: &str) {
    let (cpus, iters) = (4u32, 60u64);
    let (console, t) = run(mode, cpus, iters, "hrtimer_*");
    let (printed, _) = parse_mini_console(&console);
    let names: Vec<&str> = t.functions.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names.len(),
        4,
        "{mode}: hrtimer_start_range_ns, hrtimer_try_to_cancel, hrtimer_interrupt, hrtimer_wakeup: {names:?}"
    );
    for (i, name) in names.iter().enumerate() {
        for cpu in 0..cpus {
            let n = printed[&(cpu, name.to_string())];
            assert!(n > 0);
            assert_eq!(
                t.counts[i][cpu as usize], n,
                "{mode}: {name} calls on {cpu}"
            );
            assert_eq!(
                t.returns[i][cpu as usize], n,
                "{mode}: {name} returns on {cpu}"
            );
        }
    }
    let g = Graph::build(&t);
    assert_eq!(
        (g.abandoned, g.unmatched_returns, g.mismatched_returns),
        (0, 0, 0)
    );
    for f in &g.frames {
        let parent = f.parent.map(|p| name(&t, &g.frames[p as usize]));
        let want = match name(&t, f) {
            "hrtimer_wakeup" => Some("hrtimer_interrupt"),
            _ => None,
        };
        assert_eq!(parent, want, "{mode}: {} nested in {parent:?}", name(&t, f));
        assert!(matches!(f.end, End::Returned { .. }), "{mode}: {f:?}");
    }
}

#[test]
fn graph_hrtimer_glob_trap_four_vcpus_exact() {
    check_hrtimer_glob("trap");
}

#[test]
fn graph_hrtimer_glob_exitless_four_vcpus_exact() {
    check_hrtimer_glob("exitless");
}

#[test]
fn graph_trap_mode_four_vcpus_exact() {
    check_graph_run("trap", 4, 60);
}

#[test]
fn graph_exitless_mode_four_vcpus_exact() {
    check_graph_run("exitless", 4, 60);
}

/// Detach while frames are hooked: the returns of calls in flight at the
/// detach still come back through vmtrace (its code and, in trap mode, its
/// shadow stacks stay until the guest ends), are recorded, and the guest
/// runs on to its own clean end.
fn detach_with_frames_hooked(exitless: bool) {
    let kernel = mini_elf();
    let console = Capture::default();
    let cpus = 2;
    let vm = vmm::Vm::create(mini_config(&kernel, cpus, "mode=loop graph=1", &console)).unwrap();
    let mut plan = Plan::new(&kernel, &["*".to_string()], &[]).unwrap();
    plan.graph = true;
    let (mut tracer, handlers) = if exitless {
        Tracer::exitless(plan, vm.cpus(), u64::MAX, None).unwrap()
    } else {
        Tracer::new(plan, vm.cpus(), u64::MAX)
    };
    let running = vm.start(handlers, false).unwrap();
    {
        let p = running.pause_all();
        tracer.attach(&p).unwrap().attached().unwrap();
    }
    std::thread::sleep(Duration::from_millis(500));
    // Detach and end the loop in one pause, taken when a vCPU is inside
    // the body of a hooked call (past its site): that call returns after
    // the detach, as the iteration finishes. Pauses that find none are
    // let go and tried again, so the test never depends on luck.
    let bodies = hooked_bodies(&kernel);
    let stop = vmm::layout::kernel_virt_to_phys(elf_symbol(&kernel, "mini_stop")).unwrap();
    let mut tries = 0;
    loop {
        let p = running.pause_all();
        let inside = (0..cpus as usize).any(|c| {
            p.snapshot(c)
                .is_some_and(|s| bodies.iter().any(|b| b.contains(&s.regs.rip)))
        });
        if inside {
            tracer.detach(p.memory()).unwrap();
            p.memory().write_obj(1u32, GuestAddress(stop)).unwrap();
            break;
        }
        drop(p);
        tries += 1;
        assert!(
            tries < 10_000,
            "no vCPU inside a hooked call in {tries} pauses"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let reason = running.wait();
    let report = running.finish();
    tracer.stop_draining().unwrap();
    let t = tracer.finish(Path::new("mini"), reason.to_string());
    assert!(
        report.reason.to_string().contains("powered off"),
        "{}",
        report.reason
    );
    let text = console.text();
    assert!(text.contains("mini: all done"), "{text}");
    let g = Graph::build(&t);
    assert_eq!((g.unmatched_returns, g.mismatched_returns), (0, 0));
    // Returns after the detach: the calls in flight at it.
    let after = t
        .events
        .iter()
        .filter(|e| e.is_return() && e.ts_ns > t.meta.detach_ns)
        .count();
    assert!(after > 0, "no return recorded after the detach");
    // Every hooked call returned, but the abandoned ones and mini_main.
    for f in &g.frames {
        let n = name(&t, f);
        match f.end {
            End::Returned { .. } => {}
            End::Abandoned => assert_eq!(n, "graph_abandoned"),
            End::Running => assert_eq!(n, "mini_main", "{f:?}"),
            End::Lost => panic!("{n}: return lost"),
            End::Unhooked => panic!("{n} not hooked"),
        }
    }
    // And the counts agree: returns per function = calls, but for those.
    for (i, f) in t.functions.iter().enumerate() {
        let calls: u64 = t.counts[i].iter().sum();
        let rets: u64 = t.returns[i].iter().sum();
        match f.name.as_str() {
            "graph_abandoned" => assert_eq!(rets, 0),
            "mini_main" => assert_eq!(rets, 0),
            n => assert_eq!(rets, calls, "{n}"),
        }
    }
}

/// The bodies of graph=1's hooked leaf-ish functions in the mini guest:
/// from past the `call __fentry__` (after an ENDBR64, if any) to the end.
/// A vCPU with its RIP in one has that call's return hooked.
fn hooked_bodies(kernel: &Path) -> Vec<std::ops::Range<u64>> {
    use object::{Object, ObjectSection, ObjectSymbol};
    const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];
    const CALL_LEN: u64 = 5;
    let data = std::fs::read(kernel).unwrap();
    let obj = object::File::parse(&*data).unwrap();
    let text = obj.section_by_name(".text").unwrap();
    let bytes = text.data().unwrap();
    ["graph_depth", "graph_depth2", "graph_recurse", "graph_long"]
        .iter()
        .map(|name| {
            let s = obj.symbols().find(|s| s.name() == Ok(name)).unwrap();
            let off = (s.address() - text.address()) as usize;
            let endbr = if bytes[off..].starts_with(&ENDBR64) {
                4
            } else {
                0
            };
            s.address() + endbr + CALL_LEN..s.address() + s.size()
        })
        .collect()
}

#[test]
fn graph_detach_with_frames_hooked_trap() {
    detach_with_frames_hooked(false);
}

#[test]
fn graph_detach_with_frames_hooked_exitless() {
    detach_with_frames_hooked(true);
}
