//! Function graph with returns that could not be stored (issue 22): a tiny
//! exitless ring and `--max-events` make the mini guest's `graph=1`
//! workload drop returns. Those calls returned (the exact return counts
//! say so): the trace reports them as lost (or, after `--max-events`
//! stopped storing, as running), never as abandoned, which stays for the
//! calls unwound without a return (graph_abandoned) alone.

mod common;

use std::collections::BTreeMap;

use common::*;
use tracer::trace::graph::{End, Graph};
use tracer::trace::model::Trace;

/// Functions of the workload that never return: graph_abandoned (its stack
/// is unwound past it) and mini_main (it powers the guest off).
fn never_returns(f: &str) -> bool {
    matches!(f, "graph_abandoned" | "mini_main")
}

/// A traced `graph=1` run on 2 vCPUs through the CLI; the console and the
/// saved trace.
fn run(tag: &str, extra: &[&str]) -> (String, Trace) {
    let out = std::env::temp_dir().join(format!(
        "vmtrace-graph-lost-{tag}-{}.vmtrace",
        std::process::id()
    ));
    let kernel = mini_elf();
    let mut args = vec![
        "--kernel",
        kernel.to_str().unwrap(),
        "--cpus",
        "2",
        "--cmdline",
        "iters=40 graph=1",
        "--trace",
        "*",
        "--graph",
        "--timeout",
        "240",
        "-o",
        out.to_str().unwrap(),
        "--console",
        "-",
    ];
    args.extend_from_slice(extra);
    let o = vmtrace(&args);
    let err = stderr(&o);
    assert!(o.status.success(), "exit {:?}: {err}", o.status);
    assert!(err.contains("guest powered off (status 0)"), "{err}");
    let t = tracer::trace::datafile::load(&out).unwrap();
    std::fs::remove_file(&out).unwrap();
    (stdout(&o), t)
}

/// `lost`: some stored calls lost their return (a full ring drops a
/// return and stores later events); else none (`--max-events` stops
/// storing for good: calls in flight then stay running).
fn check_lost(tag: &str, extra: &[&str], lost: bool) {
    let (console, t) = run(tag, extra);
    let (printed, _) = parse_mini_console(&console);
    let name = |f: u32| t.functions[f as usize].name.as_str();
    assert!(t.meta.returns_dropped > 0, "{tag}: returns were dropped");
    let g = Graph::build(&t);
    // Calls and returns stay exact. Trap mode hooks every call, stored or
    // not: each call of a returning function returned. Exitless mode hooks
    // only the calls it could record (a full ring leaves a call unhooked):
    // each stored call of a returning function returned.
    for ((cpu, f), &n) in &printed {
        let i = t.functions.iter().position(|s| &s.name == f).unwrap();
        assert_eq!(t.counts[i][*cpu as usize], n, "{tag}: calls of {f}");
        let rets: u64 = t.returns[i].iter().sum();
        let hooked = if t.meta.mode == "trap" {
            t.counts[i].iter().sum()
        } else {
            g.frames.iter().filter(|fr| fr.func as usize == i).count() as u64
        };
        let want = if never_returns(f) { 0 } else { hooked };
        assert_eq!(rets, want, "{tag}: returns of {f}");
    }
    // Per function: stored calls without a stored return, by how they ended.
    let mut ends: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    for f in &g.frames {
        let how = match f.end {
            End::Returned { .. } => continue,
            End::Abandoned => "abandoned",
            End::Lost => "lost",
            End::Running => "running",
            End::Unhooked => "unhooked",
        };
        *ends.entry((name(f.func), how)).or_insert(0) += 1;
    }
    let count = |pred: &dyn Fn(&str, &str) -> bool| -> u64 {
        ends.iter()
            .filter(|((f, how), _)| pred(f, how))
            .map(|(_, n)| n)
            .sum()
    };
    // Lost: calls of returning functions only, and some.
    assert_eq!(
        count(&|f, how| how == "lost" && never_returns(f)),
        0,
        "{ends:?}"
    );
    assert_eq!(g.lost, count(&|_, how| how == "lost"), "{ends:?}");
    assert_eq!(g.lost > 0, lost, "{tag}: {ends:?}");
    // Abandoned: graph_abandoned only, never a call that returned.
    assert_eq!(
        g.abandoned,
        count(&|f, how| how == "abandoned" && f == "graph_abandoned"),
        "{tag}: {ends:?}"
    );
    assert_eq!(count(&|_, how| how == "unhooked"), 0, "{ends:?}");
    // Every stored call of a returning function without its return stored
    // is lost, or running (its return came after the last stored event on
    // its stack): as many as the stored entries less the stored returns
    // that matched them.
    let returned_stored = g
        .frames
        .iter()
        .filter(|f| matches!(f.end, End::Returned { .. }))
        .count() as u64;
    let stored_calls = g
        .frames
        .iter()
        .filter(|f| !never_returns(name(f.func)))
        .count() as u64;
    assert_eq!(
        g.lost + count(&|f, how| how == "running" && !never_returns(f)),
        stored_calls - returned_stored,
        "{tag}: {ends:?}"
    );
    if !lost {
        return;
    }
    // The report says it, apart from the abandoned calls.
    let report =
        tracer::trace::report::render(&t, &tracer::trace::report::ReportOptions::default());
    let line = report
        .lines()
        .find(|l| l.starts_with("# not returned:"))
        .unwrap_or_else(|| panic!("{report}"));
    assert!(
        line.contains(&format!(
            "{} lost (returned; the return counted, not stored",
            g.lost
        )),
        "{line}"
    );
    // The call tree marks each lost call (`/* return lost */`, or on its
    // closing line `} /* NAME, return lost */`).
    let tree =
        tracer::trace::report::render_tree(&t, &tracer::trace::report::TreeOptions::default());
    assert_eq!(
        tree.matches("return lost */").count() as u64,
        g.lost,
        "{tree}"
    );
    let mut json = Vec::new();
    tracer::trace::export::write_json(&t, &mut json).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
    assert_eq!(v["graph"]["lost_returns"].as_u64(), Some(g.lost));
    assert_eq!(v["graph"]["abandoned"].as_u64(), Some(g.abandoned));
}

#[test]
fn graph_exitless_tiny_ring_returns_lost_not_abandoned() {
    check_lost(
        "exitless",
        &["--mode", "exitless", "--ring-events", "16"],
        true,
    );
}

#[test]
fn graph_trap_max_events_returns_lost_not_abandoned() {
    check_lost("trap", &["--mode", "trap", "--max-events", "600"], false);
}
