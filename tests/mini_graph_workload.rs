//! The mini guest's `graph=1` workload (guest/mini/README.md "graph=1"), run
//! without tracing: every count it prints equals its formula, graph_long's
//! self-measured durations are at least GRAPH_LONG_TICKS, and with two or
//! more vCPUs graph_migrate is entered on vCPU 0 and returns on vCPU 1.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use vm_memory::{Bytes, GuestAddress};

/// The graph workload's functions in the order the guest prints them (after
/// MINI_FUNCS).
const GRAPH_FUNCS: [&str; 11] = [
    "graph_depth",
    "graph_depth2",
    "graph_depth3",
    "graph_leaf",
    "graph_tail_caller",
    "graph_tail_callee",
    "graph_recurse",
    "graph_abandon_outer",
    "graph_abandoned",
    "graph_long",
    "graph_migrate",
];

/// A `#define NAME VALUE` of guest/mini/mini.h, so the test follows the guest.
fn mini_h(name: &str) -> u64 {
    let text = std::fs::read_to_string(root().join("guest/mini/mini.h")).unwrap();
    text.lines()
        .find_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            match w.as_slice() {
                ["#define", n, v, ..] if *n == name => Some(v.parse().unwrap()),
                _ => None,
            }
        })
        .unwrap_or_else(|| panic!("no #define {name} in mini.h"))
}

/// What CPU `cpu` of `ncpus` calls in `n` iterations with graph=1.
fn graph_expected(func: &str, n: u64, cpu: u32, ncpus: u32) -> u64 {
    match func {
        "graph_recurse" => (mini_h("GRAPH_RECURSE_DEPTH") + 1) * n,
        "graph_abandon_outer" | "graph_abandoned" => n.div_ceil(mini_h("GRAPH_ABANDON_EVERY")),
        "graph_long" => n.div_ceil(mini_h("GRAPH_LONG_EVERY")),
        "graph_migrate" => u64::from(cpu == 0 && ncpus >= 2),
        _ => n,
    }
}

/// Checks every line of a graph=1 run of `ncpus` vCPUs; `iters` None
/// (mode=loop) takes each CPU's N from its do_idle count. Returns the
/// iterations per CPU.
fn check_graph_console(console: &str, ncpus: u32, iters: Option<u64>) -> Vec<u64> {
    let (counts, done) = parse_mini_console(console);
    let stats = parse_mini_stats(console);
    assert_eq!(done, (0..ncpus).collect::<Vec<_>>(), "{console}");
    // Nothing but the documented lines: 8 + 11 counts and 3 stats per CPU.
    assert_eq!(
        counts.len(),
        ncpus as usize * (MINI_FUNCS.len() + GRAPH_FUNCS.len())
    );
    assert_eq!(stats.len(), ncpus as usize * 3, "{console}");
    let ticks = mini_h("GRAPH_LONG_TICKS");
    let mut ns = Vec::new();
    for cpu in 0..ncpus {
        let n = iters.unwrap_or_else(|| counts[&(cpu, "do_idle".to_string())]);
        for f in MINI_FUNCS {
            assert_eq!(
                counts.get(&(cpu, f.to_string())).copied(),
                Some(mini_expected(f, n)),
                "cpu {cpu} {f}\n{console}"
            );
        }
        for f in GRAPH_FUNCS {
            assert_eq!(
                counts.get(&(cpu, f.to_string())).copied(),
                Some(graph_expected(f, n, cpu, ncpus)),
                "cpu {cpu} {f} after {n} iterations\n{console}"
            );
        }
        let calls = graph_expected("graph_long", n, cpu, ncpus);
        let sum = stats[&(cpu, "graph_long_ticks_sum".to_string())];
        let max = stats[&(cpu, "graph_long_ticks_max".to_string())];
        assert!(
            sum >= calls * ticks,
            "cpu {cpu}: {calls} x graph_long took {sum} ticks"
        );
        assert!(
            max <= sum && sum <= calls * max,
            "cpu {cpu}: sum {sum} max {max}"
        );
        let outer = stats[&(cpu, "graph_long_outer_ticks_sum".to_string())];
        assert!(outer >= sum, "cpu {cpu}: bracket {outer} < {sum}");
        if calls > 0 {
            assert!(max >= ticks, "cpu {cpu}: max {max}");
        }
        ns.push(n);
    }
    // The printed order: per CPU the 8 MINI_FUNCS, the 11 graph functions,
    // the three stats, then done (blocks of different CPUs never interleave).
    for cpu in 0..ncpus {
        let block: Vec<&str> = console
            .lines()
            .filter(|l| {
                l.starts_with(&format!("mini: cpu {cpu} "))
                    || l.starts_with(&format!("mini: stat cpu {cpu} "))
            })
            .map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                if w[w.len() - 1] == "done" {
                    "done"
                } else {
                    w[w.len() - 2]
                }
            })
            .collect();
        let want: Vec<&str> = MINI_FUNCS
            .iter()
            .chain(GRAPH_FUNCS.iter())
            .copied()
            .chain([
                "graph_long_ticks_sum",
                "graph_long_ticks_max",
                "graph_long_outer_ticks_sum",
                "done",
            ])
            .collect();
        assert_eq!(block, want, "cpu {cpu}'s lines");
    }
    let migrate: Vec<&str> = console
        .lines()
        .filter(|l| l.starts_with("mini: migrate"))
        .collect();
    if ncpus >= 2 {
        assert_eq!(
            migrate,
            ["mini: migrate entered_cpu 0 returned_cpu 1"],
            "{console}"
        );
    } else {
        assert!(migrate.is_empty(), "{console}");
    }
    ns
}

/// Run the mini guest through the CLI (no tracing); its console.
fn run(cpus: u32, cmdline: &str) -> String {
    let kernel = mini_elf();
    let out = vmtrace(&[
        "--kernel",
        kernel.to_str().unwrap(),
        "--cpus",
        &cpus.to_string(),
        "--cmdline",
        cmdline,
        "--timeout",
        "120",
        // The console alone on stdout (the default is stderr).
        "--console",
        "-",
    ]);
    let err = stderr(&out);
    assert!(out.status.success(), "exit {:?}: {err}", out.status);
    assert!(err.contains("guest powered off (status 0)"), "{err}");
    stdout(&out)
}

#[test]
fn graph_workload_counts_equal_their_formulas_on_one_two_and_four_cpus() {
    for (cpus, iters) in [(1u32, 100u64), (2, 100), (4, 123)] {
        let console = run(cpus, &format!("graph=1 iters={iters}"));
        assert!(console.contains("mini: all done"), "{console}");
        check_graph_console(&console, cpus, Some(iters));
    }
}

#[test]
fn without_graph_the_console_is_what_it_was() {
    let console = run(2, "iters=100");
    let (counts, done) = parse_mini_console(&console);
    assert_eq!(done, vec![0, 1]);
    assert_eq!(counts.len(), 2 * MINI_FUNCS.len(), "{console}");
    assert!(parse_mini_stats(&console).is_empty(), "{console}");
    assert!(
        !console.contains("graph") && !console.contains("migrate"),
        "{console}"
    );
    // graph=0 and a bad value are "off" as well.
    for cmdline in ["graph=0 iters=10", "graph=yes iters=10"] {
        let console = run(1, cmdline);
        assert!(!console.contains("graph"), "{cmdline}: {console}");
    }
}

#[test]
fn graph_workload_in_mode_loop_keeps_every_formula() {
    const CPUS: u32 = 2;
    let kernel = mini_elf();
    let capture = Capture::default();
    let cfg = mini_config(&kernel, CPUS as u64, "mode=loop graph=1", &capture);
    let vm = vmm::Vm::create(cfg).unwrap();
    let running = vm.start(no_tracers(CPUS as usize), false).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let stop_gpa = vmm::layout::kernel_virt_to_phys(elf_symbol(&kernel, "mini_stop")).unwrap();
    running
        .memory()
        .write_obj(1u32, GuestAddress(stop_gpa))
        .unwrap();
    let reason = running.wait();
    running.finish();
    let console = capture.text();
    assert_eq!(reason, vmm::StopReason::PowerOff(0), "{console}");
    let ns = check_graph_console(&console, CPUS, None);
    assert!(ns.iter().all(|&n| n > 0), "every CPU iterated: {ns:?}");
    let per_cpu: BTreeMap<u32, u64> = (0..CPUS).zip(ns).collect();
    println!("mode=loop graph=1, 300 ms: iterations per CPU {per_cpu:?}");
}
