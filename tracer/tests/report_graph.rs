//! The function-graph views of a trace (`fixture::graph_trace`): report
//! columns and sorts, `--tree`, folded stacks, Chrome complete events, JSON
//! durations, CSV returns. Byte-exact outputs are in report_golden.rs.

#[path = "report_fixture.rs"]
mod fixture;

use std::collections::HashMap;

use fixture::*;
use serde_json::Value;
use tracer::trace::export::{to_json, write_chrome, write_csv, write_folded};
use tracer::trace::graph::Graph;
use tracer::trace::report::{render_tree, Report, ReportOptions, Sort, TreeOptions};

fn names(r: &Report) -> Vec<String> {
    r.rows.iter().map(|r| r.func.name.clone()).collect()
}

#[test]
fn report_graph_sorts_by_durations() {
    let t = graph_trace();
    let by = |sort| {
        names(&Report::new(
            &t,
            &ReportOptions {
                sort,
                ..ReportOptions::default()
            },
        ))
    };
    assert_eq!(
        by(Sort::Total),
        [
            "hrtimer_interrupt",        // 151.5 us
            "schedule",                 // 32 us
            "__hrtimer_run_queues",     // 16.3 us
            "tick_sched_timer",         // 15.801 us
            "tick_do_update_jiffies64", // 15 us
            "cpu_idle_loop",            // none returned: 0, then by name
            "do_exit_thing",
        ]
    );
    assert_eq!(
        by(Sort::SelfTime),
        [
            "hrtimer_interrupt",        // 135.7 us
            "schedule",                 // 31.6 us
            "tick_do_update_jiffies64", // 15 us
            "__hrtimer_run_queues",     // 899 ns
            "tick_sched_timer",         // 801 ns
            "cpu_idle_loop",
            "do_exit_thing",
        ]
    );
    assert_eq!(
        by(Sort::Avg),
        [
            "hrtimer_interrupt",        // 75.75 us
            "schedule",                 // 32 us
            "tick_do_update_jiffies64", // 15 us
            "__hrtimer_run_queues",     // 8.15 us
            "tick_sched_timer",         // 5.267 us
            "cpu_idle_loop",
            "do_exit_thing",
        ]
    );
    assert_eq!(
        by(Sort::Max),
        [
            "hrtimer_interrupt",        // 149 us
            "schedule",                 // 32 us
            "__hrtimer_run_queues",     // 15.8 us
            "tick_sched_timer",         // 15.101 us
            "tick_do_update_jiffies64", // 15 us
            "cpu_idle_loop",
            "do_exit_thing",
        ]
    );
    // An entry-only trace: duration sorts fall back to the call count.
    let plain = trace();
    let count = Report::new(&plain, &ReportOptions::default());
    for sort in [Sort::Total, Sort::SelfTime, Sort::Avg, Sort::Max] {
        let r = Report::new(
            &plain,
            &ReportOptions {
                sort,
                ..ReportOptions::default()
            },
        );
        assert_eq!(names(&r), names(&count), "{sort:?}");
        assert!(r
            .rows
            .iter()
            .all(|r| r.durations.is_none() && r.returns == 0));
    }
}

#[test]
fn report_graph_rows_per_cpu_and_calls_not_returns() {
    let t = graph_trace();
    let r = Report::new(&t, &ReportOptions::whole_trace());
    // Entries only: 12 calls, whatever the 10 returns.
    assert_eq!(r.total(), 12);
    assert_eq!(r.entries_stored, 12);
    for row in &r.rows {
        let callers: u64 = row.callers.iter().map(|c| c.count).sum();
        assert_eq!(callers, row.total, "{}", row.func.name);
    }
    let irq = r.rows.iter().find(|r| r.index == G_IRQ as usize).unwrap();
    let d = irq.durations.unwrap();
    assert_eq!(
        (
            irq.returns,
            d.returned,
            d.total_ns,
            d.self_ns,
            d.min_ns,
            d.max_ns
        ),
        (3, 2, 151_500, 135_700, 2_500, 149_000)
    );
    // --cpu 1: durations by the vCPU of the entry, returns by the vCPU of the return.
    let r1 = Report::new(
        &t,
        &ReportOptions {
            cpus: Some(vec![1]),
            ..ReportOptions::default()
        },
    );
    let sched = r1
        .rows
        .iter()
        .find(|r| r.index == G_SCHEDULE as usize)
        .unwrap();
    assert_eq!(sched.returns, 0, "schedule returned on vCPU 0");
    assert_eq!(sched.durations.unwrap().total_ns, 32_000);
    let idle = r1.rows.iter().find(|r| r.index == G_IDLE as usize).unwrap();
    assert_eq!(
        (idle.not_returned, idle.durations.unwrap().returned),
        (1, 0)
    );
    let s = r.graph_summary.unwrap();
    assert_eq!(
        (
            s.returns,
            s.returns_stored,
            s.frames,
            s.returned,
            s.abandoned,
            s.running,
            s.unhooked_stored,
            s.unmatched_returns
        ),
        (10, 10, 12, 9, 1, 1, 1, 1)
    );
}

fn tree(depth: Option<u32>, threshold_ns: u64, cpus: Option<Vec<u32>>) -> String {
    render_tree(
        &graph_trace(),
        &TreeOptions {
            cpus,
            depth,
            threshold_ns,
        },
    )
}

/// The tree's lines after its header, as (cpu, duration column, text).
fn tree_lines(s: &str) -> Vec<(String, String, String)> {
    s.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let (cpu, rest) = l.split_once(") ").unwrap();
            let (dur, text) = rest.split_once("|  ").unwrap();
            (cpu.trim().into(), dur.trim().into(), text.into())
        })
        .collect()
}

#[test]
fn report_graph_tree_nesting_depth_and_threshold() {
    let full = tree_lines(&tree(None, 0, None));
    let text: Vec<&str> = full.iter().map(|(_, _, t)| t.as_str()).collect();
    assert_eq!(
        text,
        [
            "hrtimer_interrupt() {",
            "  __hrtimer_run_queues() {",
            "    tick_sched_timer() {",
            "      tick_do_update_jiffies64();",
            "    } /* tick_sched_timer */",
            "    tick_sched_timer();",
            "  } /* __hrtimer_run_queues */",
            "} /* hrtimer_interrupt */",
            "tick_sched_timer(); /* unhooked */",
            "cpu_idle_loop() {",
            "  hrtimer_interrupt();",
            "  do_exit_thing(); /* abandoned */",
            "  __hrtimer_run_queues();",
            "} /* cpu_idle_loop, running at detach */",
            "schedule() {",
            "  tick_sched_timer();",
            "} /* schedule, returned on vCPU 0 */",
        ]
    );
    let durs: Vec<&str> = full.iter().map(|(_, d, _)| d.as_str()).collect();
    assert_eq!(
        durs,
        [
            "",
            "",
            "",
            "+ 15.000 us",
            "+ 15.101 us",
            "0.300 us",
            "+ 15.800 us",
            "! 149.000 us",
            "",
            "",
            "2.500 us",
            "",
            "0.500 us",
            "",
            "",
            "0.400 us",
            "+ 32.000 us",
        ]
    );
    let cpus: Vec<&str> = full.iter().map(|(c, _, _)| c.as_str()).collect();
    assert_eq!(cpus, [&["0"; 9][..], &["1"; 8][..]].concat());

    // --depth 1: the outermost calls, as leaves with their durations.
    let d1 = tree_lines(&tree(Some(1), 0, None));
    let d1: Vec<(&str, &str)> = d1
        .iter()
        .map(|(_, d, t)| (d.as_str(), t.as_str()))
        .collect();
    assert_eq!(
        d1,
        [
            ("! 149.000 us", "hrtimer_interrupt();"),
            ("", "tick_sched_timer(); /* unhooked */"),
            ("", "cpu_idle_loop(); /* running at detach */"),
            ("+ 32.000 us", "schedule(); /* returned on vCPU 0 */"),
        ]
    );
    // --threshold 10us: short calls go, with their callees; calls that did
    // not return stay (their duration is unknown).
    let t10 = tree_lines(&tree(None, 10_000, None));
    let t10: Vec<&str> = t10.iter().map(|(_, _, t)| t.as_str()).collect();
    assert_eq!(
        t10,
        [
            "hrtimer_interrupt() {",
            "  __hrtimer_run_queues() {",
            "    tick_sched_timer() {",
            "      tick_do_update_jiffies64();",
            "    } /* tick_sched_timer */",
            "  } /* __hrtimer_run_queues */",
            "} /* hrtimer_interrupt */",
            "tick_sched_timer(); /* unhooked */",
            "cpu_idle_loop() {",
            "  do_exit_thing(); /* abandoned */",
            "} /* cpu_idle_loop, running at detach */",
            "schedule(); /* returned on vCPU 0 */",
        ]
    );
    // --cpu 1 and a vCPU the trace lacks.
    let c1 = tree(Some(2), 1_000, Some(vec![1, 5]));
    assert!(
        c1.contains("# vCPUs: 1 (1); ignored 5: not in this trace\n"),
        "{c1}"
    );
    assert!(!c1.contains("# vCPU 0\n"), "{c1}");
    let c1 = tree_lines(&c1);
    let c1: Vec<&str> = c1.iter().map(|(_, _, t)| t.as_str()).collect();
    assert_eq!(
        c1,
        [
            "cpu_idle_loop() {",
            "  hrtimer_interrupt();",
            "  do_exit_thing(); /* abandoned */",
            "} /* cpu_idle_loop, running at detach */",
            "schedule(); /* returned on vCPU 0 */",
        ]
    );
    // A threshold above every call: only what did not return is left.
    let none = tree(None, 1_000_000_000, Some(vec![0]));
    assert!(
        none.ends_with("# vCPU 0\n 0)               |  tick_sched_timer(); /* unhooked */\n"),
        "{none}"
    );
}

#[test]
fn report_graph_folded_stacks_add_up_to_self_times() {
    let t = graph_trace();
    let mut out = Vec::new();
    write_folded(&t, &mut out).unwrap();
    let out = String::from_utf8(out).unwrap();
    let g = Graph::build(&t);
    let want: u64 = g.frames.iter().filter_map(|f| f.self_ns()).sum();
    let mut sum = 0;
    let mut paths = Vec::new();
    for line in out.lines() {
        let (path, value) = line.rsplit_once(' ').unwrap();
        let value: u64 = value.parse().unwrap();
        assert!(value > 0, "{line}");
        assert!(
            path.split(';').all(|f| !f.is_empty() && !f.contains(' ')),
            "{line}"
        );
        sum += value;
        paths.push(path);
    }
    assert_eq!(sum, want);
    assert_eq!(
        sum,
        149_000 + 2_500 + 500 + 32_000,
        "the outermost returned calls' time"
    );
    // Sorted and distinct.
    let mut sorted = paths.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(paths, sorted);
    assert_eq!(
        out,
        "cpu_idle_loop;__hrtimer_run_queues 500\n\
         cpu_idle_loop;hrtimer_interrupt 2500\n\
         hrtimer_interrupt 133200\n\
         hrtimer_interrupt;__hrtimer_run_queues 399\n\
         hrtimer_interrupt;__hrtimer_run_queues;tick_sched_timer 401\n\
         hrtimer_interrupt;__hrtimer_run_queues;tick_sched_timer;tick_do_update_jiffies64 15000\n\
         schedule 31600\n\
         schedule;tick_sched_timer 400\n"
    );
    // An entry-only trace has nothing to fold.
    let mut empty = Vec::new();
    write_folded(&trace(), &mut empty).unwrap();
    assert!(empty.is_empty());
    // Names that would break the format.
    let mut odd = graph_trace();
    odd.functions[G_IRQ as usize].name = "a;b\nc".into();
    let mut out = Vec::new();
    write_folded(&odd, &mut out).unwrap();
    let out = String::from_utf8(out).unwrap();
    assert!(out.lines().any(|l| l == "a_b\\x0ac 133200"), "{out}");
}

/// (ts, dur) in ns from a Chrome event's µs fields.
fn ns(v: &Value) -> i64 {
    (v.as_f64().unwrap() * 1000.0).round() as i64
}

#[test]
fn report_graph_chrome_complete_events_nest_per_vcpu() {
    let t = graph_trace();
    let mut out = Vec::new();
    write_chrome(&t, &mut out).unwrap();
    let doc: Value = serde_json::from_slice(&out).unwrap();
    let events = doc["traceEvents"].as_array().unwrap();
    let threads: Vec<(u64, &str)> = events
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| {
            (
                e["tid"].as_u64().unwrap(),
                e["args"]["name"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(threads, [(1, "vCPU 0"), (2, "vCPU 1")]);
    let mut per_tid: HashMap<u64, Vec<(i64, i64, String)>> = HashMap::new();
    let mut instants = Vec::new();
    for e in events {
        match e["ph"].as_str().unwrap() {
            "X" => per_tid
                .entry(e["tid"].as_u64().unwrap())
                .or_default()
                .push((
                    ns(&e["ts"]),
                    ns(&e["dur"]),
                    e["name"].as_str().unwrap().to_string(),
                )),
            "i" => instants.push((
                e["tid"].as_u64().unwrap(),
                e["name"].as_str().unwrap().to_string(),
                e["args"]["end"].as_str().unwrap().to_string(),
            )),
            "M" => {}
            ph => panic!("unexpected phase {ph}"),
        }
    }
    assert_eq!(
        per_tid.values().map(Vec::len).sum::<usize>(),
        9,
        "one per returned call"
    );
    assert_eq!(
        instants,
        [
            (2, "cpu_idle_loop".into(), "running".into()),
            (2, "do_exit_thing".into(), "abandoned".into()),
            (1, "tick_sched_timer".into(), "unhooked".into()),
        ]
    );
    // Proper nesting per track: each slice inside the one open around it.
    for (tid, xs) in &mut per_tid {
        xs.sort_by_key(|&(ts, dur, _)| (ts, -dur));
        let mut open: Vec<(i64, String)> = Vec::new();
        let mut nested = 0;
        for (ts, dur, name) in xs.iter() {
            while open.last().is_some_and(|(end, _)| *end <= *ts) {
                open.pop();
            }
            if let Some((end, parent)) = open.last() {
                assert!(
                    ts + dur <= *end,
                    "tid {tid}: {name} overlaps the end of {parent}"
                );
                nested += 1;
            }
            open.push((ts + dur, name.clone()));
        }
        assert_eq!(nested, if *tid == 1 { 4 } else { 1 }, "tid {tid}");
    }
    // The migrated call is on its entry vCPU's track and says where it returned.
    let sched = events.iter().find(|e| e["name"] == "schedule").unwrap();
    assert_eq!(
        (sched["tid"].as_u64(), sched["args"]["return_cpu"].as_u64()),
        (Some(2), Some(0))
    );
    assert_eq!((ns(&sched["ts"]), ns(&sched["dur"])), (8_000, 32_000));
    let other = &doc["otherData"];
    assert_eq!(
        (
            other["events"].as_u64(),
            other["events_stored"].as_u64(),
            other["returns"].as_u64(),
            other["abandoned"].as_u64(),
            other["unmatched_returns"].as_u64()
        ),
        (Some(12), Some(12), Some(10), Some(1), Some(1))
    );
}

#[test]
fn report_graph_json_durations_and_summary() {
    let t = graph_trace();
    let j = to_json(&t);
    let f = |name: &str| {
        j["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == name)
            .unwrap()
            .clone()
    };
    let pick = |v: &Value| -> Vec<u64> {
        [
            "count",
            "returns",
            "returned",
            "not_returned",
            "total_ns",
            "self_ns",
            "min_ns",
            "max_ns",
            "avg_ns",
        ]
        .iter()
        .map(|k| v[*k].as_u64().unwrap_or_else(|| panic!("{k} in {v}")))
        .collect()
    };
    assert_eq!(
        pick(&f("hrtimer_interrupt")),
        [2, 3, 2, 0, 151_500, 135_700, 2_500, 149_000, 75_750]
    );
    assert_eq!(
        pick(&f("tick_sched_timer")),
        [4, 3, 3, 1, 15_801, 801, 300, 15_101, 5_267]
    );
    assert_eq!(pick(&f("cpu_idle_loop")), [1, 0, 0, 1, 0, 0, 0, 0, 0]);
    assert_eq!(pick(&f("uncalled_graph")), [0, 0, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(
        j["graph"],
        serde_json::json!({
            "returns": 10, "returns_stored": 10, "returns_dropped": 0, "frames": 12,
            "returned": 9, "abandoned": 1, "lost_returns": 0, "running": 1, "unhooked_stored": 1, "unhooked": 1,
            "unmatched_returns": 1, "mismatched_returns": 0, "tsc_khz": 2_000_000
        })
    );
    assert_eq!(
        (j["events"].as_u64(), j["events_stored"].as_u64()),
        (Some(12), Some(12))
    );
    // Entry-only traces have none of it.
    let plain = to_json(&trace());
    assert!(plain.get("graph").is_none());
    assert!(plain["functions"][0].get("total_ns").is_none());
}

#[test]
fn report_graph_csv_marks_returns() {
    let t = graph_trace();
    let mut out = Vec::new();
    write_csv(&t, &mut out).unwrap();
    let out = String::from_utf8(out).unwrap();
    let mut lines = out.lines();
    assert_eq!(
        lines.next(),
        Some("ts_ns,cpu,function,addr,parent,caller,kind,slot")
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), t.events.len());
    let kinds = |k: &str| rows.iter().filter(|r| r[6] == k).count();
    assert_eq!((kinds("entry"), kinds("return")), (12, 10));
    let first_return = rows.iter().find(|r| r[6] == "return").unwrap();
    assert_eq!(
        first_return[..],
        [
            "1000000005500",
            "1",
            "hrtimer_interrupt",
            "0xffffffff81001000",
            "0xffffffff81001840",
            "cpu_idle_loop",
            "return",
            "0xffffc90000023fb8"
        ]
    );
    let unhooked = rows.iter().find(|r| r[0] == "1000000200000").unwrap();
    assert_eq!((unhooked[6], unhooked[7]), ("entry", "0x0"));
}

/// Records reserved and never committed in a graph trace may have been
/// returns: the header and `script` say records, and give no total of calls.
#[test]
fn report_graph_unfinished_records_are_not_called_calls() {
    let mut t = graph_trace();
    t.meta.unfinished = 2;
    let text = tracer::trace::report::render(&t, &ReportOptions::default());
    let line = text
        .lines()
        .find(|l| l.starts_with("# unfinished:"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("2 records (calls or returns)"), "{line}");
    assert!(!line.contains("calls in all"), "{line}");
    let mut script = Vec::new();
    tracer::trace::export::script::write_script(&t, &mut script).unwrap();
    let script = String::from_utf8(script).unwrap();
    assert!(
        script.contains("# 2 records (calls or returns) unfinished:"),
        "{script}"
    );
}
