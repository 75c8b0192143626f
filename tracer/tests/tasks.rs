//! Guest tasks through every output: a trace whose events name their task
//! (`report_fixture::tasks_trace`: two idle tasks of pid 0, a renamed task,
//! a thread whose tgid is not its pid, a comm that needs escaping, calls
//! whose task is unknown), byte for byte against golden files
//! (`VMTRACE_BLESS=1` writes them), with the lines that matter spelled out
//! here too; and a trace without tasks unchanged by them.

#[path = "report_fixture.rs"]
mod fixture;

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;
use tracer::trace::datafile::{load, save};
use tracer::trace::export::script::write_script;
use tracer::trace::export::{
    to_json, write_chrome, write_csv, write_folded, IDLE_TID, UNKNOWN_PID,
};
use tracer::trace::model::Trace;
use tracer::trace::report::{render, render_tree, task_rows, By, ReportOptions, Sort, TreeOptions};

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// Compares `got` with the golden file `name`, or writes it when blessing.
fn check(name: &str, got: &[u8]) {
    let path = golden_dir().join(name);
    if std::env::var_os("VMTRACE_BLESS").is_some() {
        fs::write(&path, got).unwrap();
        return;
    }
    let want = fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (VMTRACE_BLESS=1 writes it)", path.display()));
    if want != got {
        let at = want.iter().zip(got).take_while(|(a, b)| a == b).count();
        panic!(
            "{name} differs from {} at byte {at}:\n{}",
            path.display(),
            String::from_utf8_lossy(&got[at.saturating_sub(200)..got.len().min(at + 200)])
        );
    }
}

fn script(t: &Trace) -> String {
    let mut out = Vec::new();
    write_script(t, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

fn bytes(f: impl FnOnce(&mut Vec<u8>) -> std::io::Result<()>) -> Vec<u8> {
    let mut out = Vec::new();
    f(&mut out).unwrap();
    out
}

fn by_task(sort: Sort, cpus: Option<Vec<u32>>, width: usize, limit: Option<f64>) -> ReportOptions {
    ReportOptions {
        by: By::Task,
        sort,
        cpus,
        width,
        percent_limit: limit,
        ..ReportOptions::default()
    }
}

#[test]
fn script_shows_comm_pid_and_tgid_of_each_event() {
    let out = script(&fixture::tasks_trace());
    check("tasks.script.txt", out.as_bytes());
    let lines: Vec<&str> = out.lines().collect();
    let header = &lines[..lines.iter().position(|l| !l.starts_with('#')).unwrap()];
    assert!(header.contains(&"# tasks: BTF in guest/out/vmlinux"));
    assert!(header.contains(&"#           TASK-PID       TGID    CPU#     TIMESTAMP  FUNCTION"));
    assert!(header.contains(&"#              | |           |       |         |         |"));
    let body = &lines[header.len()..];
    assert_eq!(body.len(), 22);
    // ftrace's `%16s-%-7d (%7d) [%03d]`: the idle tasks are <idle>-0 with
    // no tgid, the thread has its process's tgid, the renamed task its
    // new name, an unknown task its vCPU.
    for (i, want) in [
        (0, "          <idle>-0       (-------) [000]  1000.000001: hrtimer_interrupt <-sysvec_apic_timer_interrupt"),
        (4, "          <idle>-0       (-------) [001]  1000.000002: cpu_idle_loop <-worker_thread"),
        (7, "              sh-57      (     57) [001]  1000.000006: do_exit_thing <-cpu_idle_loop"),
        (8, "              ls-57      (     57) [001]  1000.000007: __hrtimer_run_queues <-cpu_idle_loop"),
        (10, "           gdbus-60      (     57) [001]  1000.000008: schedule <-worker_thread"),
        (15, "           vcpu0-1       (-------) [000]  1000.000016: tick_sched_timer <-__hrtimer_run_queues"),
        (16, "           vcpu0-1       (-------) [000]  1000.000016: tick_sched_timer returned to __hrtimer_run_queues"),
        (18, "           gdbus-60      (     57) [000]  1000.000040: schedule returned to worker_thread"),
        (20, "  odd,;na me\\x0a-4242    (   4242) [000]  1000.000200: tick_sched_timer <-__hrtimer_run_queues"),
    ] {
        assert_eq!(body[i], want, "line {i}");
    }
}

#[test]
fn a_trace_without_tasks_scripts_as_before() {
    let out = script(&fixture::graph_trace());
    assert!(out.contains("\n#           TASK-PID     CPU#     TIMESTAMP  FUNCTION\n"));
    assert!(out.contains(
        "\n           vcpu0-1       [000]  1000.000001: hrtimer_interrupt <-sysvec_apic_timer_interrupt\n"
    ));
    assert!(!out.contains("# tasks:"));
}

#[test]
fn report_by_task_counts_each_tasks_stored_calls() {
    let t = fixture::tasks_trace();
    let rows = task_rows(&t, None, Sort::Count);
    type Row = (String, u64, Vec<(u32, u64)>);
    let got: Vec<Row> = rows
        .iter()
        .map(|r| (r.label(), r.count, r.functions.clone()))
        .collect();
    use fixture::{G_EXIT, G_IDLE, G_IRQ, G_JIFFIES, G_RUN, G_SCHEDULE, G_TICK};
    assert_eq!(
        got,
        [
            // Four calls of swapper/0, the most; ties by name then address.
            (
                "swapper/0-0".to_string(),
                4,
                vec![(G_RUN, 1), (G_IRQ, 1), (G_JIFFIES, 1), (G_TICK, 1)]
            ),
            // Ties by pid: the idle task (0) first.
            ("swapper/1-0".to_string(), 2, vec![(G_IDLE, 1), (G_IRQ, 1)]),
            (
                "gdbus-60".to_string(),
                2,
                vec![(G_SCHEDULE, 1), (G_TICK, 1)]
            ),
            ("ls-57".to_string(), 1, vec![(G_RUN, 1)]),
            ("sh-57".to_string(), 1, vec![(G_EXIT, 1)]),
            ("odd,;na me\\x0a-4242".to_string(), 1, vec![(G_TICK, 1)]),
            ("[unknown]".to_string(), 1, vec![(G_TICK, 1)]),
        ]
    );
    let total: u64 = rows.iter().map(|r| r.count).sum();
    assert_eq!(
        total,
        t.events.iter().filter(|e| !e.is_return()).count() as u64
    );

    let mut text = String::new();
    for (label, o) in [
        ("count", by_task(Sort::Count, None, 100, None)),
        ("name", by_task(Sort::Name, None, 100, None)),
        ("cpu 1", by_task(Sort::Count, Some(vec![1]), 100, None)),
        ("width 40", by_task(Sort::Count, None, 40, None)),
        (
            "percent-limit 15",
            by_task(Sort::Count, None, 100, Some(15.0)),
        ),
        ("by function", ReportOptions::default()),
    ] {
        writeln!(text, "==== {label}").unwrap();
        text.push_str(&render(&t, &o));
    }
    check("tasks.txt", text.as_bytes());

    let r = render(&t, &by_task(Sort::Count, None, 100, None));
    assert!(
        r.contains("\n# tasks:        6 tasks (BTF in guest/out/vmlinux)\n"),
        "{r}"
    );
    let table: Vec<&str> = r
        .lines()
        .skip_while(|l| !l.starts_with("# by task"))
        .collect();
    assert_eq!(
        table,
        [
            "# by task: 12 stored calls",
            "#",
            "#  Share%  Calls  TGID  Task                 Functions (most called first)",
            "# .......  .....  ....  ...................  ..............................",
            "#",
            "   33.33%      4     -  swapper/0-0          __hrtimer_run_queues (1), hrtimer_interrupt (1), …",
            "   16.67%      2     -  swapper/1-0          cpu_idle_loop (1), hrtimer_interrupt (1)",
            "   16.67%      2    57  gdbus-60             schedule (1), tick_sched_timer (1)",
            "    8.33%      1    57  ls-57                __hrtimer_run_queues (1)",
            "    8.33%      1    57  sh-57                do_exit_thing (1)",
            "    8.33%      1  4242  odd,;na me\\x0a-4242  tick_sched_timer (1)",
            "    8.33%      1     -  [unknown]            tick_sched_timer (1)",
        ]
    );
}

#[test]
fn report_by_task_without_tasks_says_why() {
    let mut t = fixture::graph_trace();
    let r = render(&t, &by_task(Sort::Count, None, 100, None));
    assert!(r.ends_with(
        "# no call names its guest task: the trace has none (a kernel without BTF, or a trace of an older vmtrace)\n"
    ), "{r}");
    assert!(!r.contains("# tasks:"));
    t.meta.tasks = "no BTF in guest/out/vmlinux: built without CONFIG_DEBUG_INFO_BTF".into();
    let r = render(&t, &by_task(Sort::Count, None, 100, None));
    assert!(r.contains("\n# tasks:        none known (no BTF in guest/out/vmlinux: built without CONFIG_DEBUG_INFO_BTF)\n"), "{r}");
    assert!(r.ends_with("# no call names its guest task: no BTF in guest/out/vmlinux: built without CONFIG_DEBUG_INFO_BTF\n"), "{r}");
}

#[test]
fn the_call_tree_has_ftraces_task_column_and_switches() {
    let t = fixture::tasks_trace();
    let tree = render_tree(&t, &TreeOptions::default());
    check("tasks.tree.txt", tree.as_bytes());
    let lines: Vec<&str> = tree.lines().collect();
    assert!(lines.contains(&"# CPU  TASK/PID         DURATION                  FUNCTION CALLS"));
    assert!(lines.contains(&"# |     |    |         |   |                     |   |   |   |"));
    // print_graph_proc: comm-pid centred in 14 columns, the comm cut to 7.
    assert!(
        lines.contains(&" 0)    <idle>-0    | ! 149.000 us  |  } /* hrtimer_interrupt */"),
        "{tree}"
    );
    assert!(
        lines.contains(&" 1)    gdbus-60    |               |  schedule() {"),
        "{tree}"
    );
    assert!(
        lines.contains(&" 0)  odd,;na-4242  |               |  tick_sched_timer(); /* unhooked */"),
        "{tree}"
    );
    // verif_pid: a block where the task on a vCPU changes.
    let at = lines
        .iter()
        .position(|l| *l == " 1)    <idle>-0    =>     sh-57     ")
        .expect(&tree);
    assert_eq!(lines[at - 1], " ------------------------------------------");
    assert_eq!(lines[at + 1], " ------------------------------------------");
    assert_eq!(lines[at + 2], "");
    assert_eq!(
        lines[at + 3],
        " 1)     sh-57      |               |    do_exit_thing(); /* abandoned */"
    );
    // Without tasks: the tree as before.
    let plain = render_tree(&fixture::graph_trace(), &TreeOptions::default());
    assert!(plain.contains("\n# CPU  DURATION                  FUNCTION CALLS\n"));
    assert!(!plain.contains("=>"));
}

#[test]
fn json_has_each_tasks_calls_and_where_tasks_came_from() {
    let t = fixture::tasks_trace();
    let v = to_json(&t);
    check(
        "tasks.json",
        (serde_json::to_string_pretty(&v).unwrap() + "\n").as_bytes(),
    );
    assert_eq!(v["tasks_source"], "BTF in guest/out/vmlinux");
    assert_eq!(v["tasks_unknown"], 1);
    let tasks = v["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 6);
    assert_eq!(tasks[0]["comm"], "swapper/0");
    assert_eq!(
        tasks[2],
        serde_json::json!({
            "pid": 60, "tgid": 57, "comm": "gdbus", "count": 2,
            "functions": [
                { "name": "schedule", "count": 1 },
                { "name": "tick_sched_timer", "count": 1 },
            ],
        })
    );
    assert_eq!(tasks[5]["comm"], "odd,;na me\n");
    // A trace without tasks has none of these fields.
    let plain = to_json(&fixture::graph_trace());
    for k in ["tasks", "tasks_source", "tasks_unknown"] {
        assert!(plain.get(k).is_none(), "{k}");
    }
}

#[test]
fn csv_rows_end_with_the_task() {
    for (name, t) in [
        ("tasks", fixture::tasks_trace()),
        ("tasks_entry", fixture::tasks_entry_trace()),
    ] {
        let out = bytes(|w| write_csv(&t, w));
        check(&format!("{name}.csv"), &out);
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let want_header = if t.meta.graph {
            "ts_ns,cpu,function,addr,parent,caller,kind,slot,pid,tgid,comm"
        } else {
            "ts_ns,cpu,function,addr,parent,caller,pid,tgid,comm"
        };
        assert_eq!(lines[0], want_header);
        assert!(lines[1].ends_with(",0,0,swapper/0"), "{}", lines[1]);
        assert!(lines.iter().any(|l| l.ends_with(",60,57,gdbus")));
        assert!(lines.iter().any(|l| l.ends_with(",,,")), "unknown task");
        // The comm quoted and escaped: one field, one line.
        assert!(lines
            .iter()
            .any(|l| l.ends_with(",4242,4242,\"odd,;na me\\x0a\"")));
    }
}

#[test]
fn chrome_draws_a_process_per_tgid_and_a_thread_per_pid() {
    for (name, t) in [
        ("tasks", fixture::tasks_trace()),
        ("tasks_entry", fixture::tasks_entry_trace()),
    ] {
        let out = bytes(|w| write_chrome(&t, w));
        check(&format!("{name}.chrome.json"), &out);
        let v: Value = serde_json::from_slice(&out).unwrap();
        let events = v["traceEvents"].as_array().unwrap();
        let meta = |what: &str, pid: u64, tid: u64| {
            events
                .iter()
                .find(|e| e["name"] == what && e["pid"] == pid && e["tid"] == tid)
                .map(|e| e["args"]["name"].as_str().unwrap().to_string())
        };
        // sh's process (its leader's latest name: ls), its two threads.
        assert_eq!(meta("process_name", 57, 0).as_deref(), Some("ls"));
        assert_eq!(meta("thread_name", 57, 57).as_deref(), Some("ls"));
        assert_eq!(meta("thread_name", 57, 60).as_deref(), Some("gdbus"));
        // The idle tasks: one process, a thread per vCPU.
        assert_eq!(meta("process_name", 0, 0).as_deref(), Some("swapper"));
        assert_eq!(
            meta("thread_name", 0, IDLE_TID).as_deref(),
            Some("swapper/0")
        );
        assert_eq!(
            meta("thread_name", 0, IDLE_TID + 1).as_deref(),
            Some("swapper/1")
        );
        // Calls of no known task: vmtrace's process, vCPU 0's thread.
        assert_eq!(
            meta("process_name", UNKNOWN_PID, 0).as_deref(),
            Some("vmtrace: guest/out/bzImage")
        );
        assert_eq!(
            meta("thread_name", UNKNOWN_PID, UNKNOWN_PID + 1).as_deref(),
            Some("vCPU 0")
        );
        assert_eq!(meta("thread_name", UNKNOWN_PID, UNKNOWN_PID + 2), None);
        // Every call is on its task's track.
        let track = |func: &str| -> Vec<(u64, u64)> {
            events
                .iter()
                .filter(|e| e["name"] == func && e["ph"] != "M")
                .map(|e| (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap()))
                .collect()
        };
        assert_eq!(track("schedule"), [(57, 60)]);
        assert_eq!(track("do_exit_thing"), [(57, 57)]);
        assert_eq!(track("cpu_idle_loop"), [(0, IDLE_TID + 1)]);
        assert_eq!(
            track("tick_sched_timer"),
            [
                (0, IDLE_TID),
                (57, 60),
                (UNKNOWN_PID, UNKNOWN_PID + 1),
                (4242, 4242)
            ]
        );
    }
}

#[test]
fn folded_stacks_start_with_the_tasks_comm() {
    let out = bytes(|w| write_folded(&fixture::tasks_trace(), w));
    check("tasks.folded", &out);
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.contains(&"gdbus;schedule 31600"), "{text}");
    assert!(
        lines.contains(&"gdbus;schedule;tick_sched_timer 400"),
        "{text}"
    );
    // A callee takes its root's comm: the call of no known task under
    // swapper/0's interrupt (300 ns) adds to the other one's self time.
    assert!(
        lines.contains(&"swapper;hrtimer_interrupt;__hrtimer_run_queues;tick_sched_timer 401"),
        "{text}"
    );
    assert!(lines
        .iter()
        .all(|l| l.starts_with("swapper;") || l.starts_with("gdbus;")));
}

/// The saved trace (a version-8 data file, written in one go), which the
/// CLI tests read (tests/report_tasks_cli.rs).
#[test]
fn the_saved_trace_is_byte_identical_and_reads_back() {
    let t = fixture::tasks_trace();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("tasks-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let p = dir.join("tasks.vmtrace");
    save(&t, &p).unwrap();
    check("tasks.vmtrace", &fs::read(&p).unwrap());
    assert_eq!(load(&p).unwrap(), t);
    let _ = fs::remove_dir_all(&dir);
}
