//! `vmtrace bench`: a small run produces every figure, (a) to (h), as a
//! finite number in its JSON (positive where it is a time or a count of
//! something that happens), except a figure taken from the difference of
//! two phases' times, which may be lost in the host's noise: then it is
//! null, with why (never a failure of the run). No timing goal is asserted
//! here: the figures depend on the host, and the bench itself reports
//! PASS / MISS. Counts are asserted exactly: exits per exitless call are 0
//! (none can happen), and the bench itself fails unless each tracer counted
//! exactly the calls the guest made in its phases.

mod common;

use common::*;
use tracer::plan::exitless::trampoline::{
    COMMON_PATH_INSTRUCTIONS, GRAPH_ENTRY_INSTRUCTIONS, GRAPH_RETURN_INSTRUCTIONS,
    TASK_INSTRUCTIONS,
};

/// The mini guest has BTF, so exitless calls record their task: a recorded
/// call's path, and a hooked call's entry and return (both record it).
const ENTRY_WITH_TASK: usize = COMMON_PATH_INSTRUCTIONS + TASK_INSTRUCTIONS;
const GRAPH_WITH_TASK: usize =
    GRAPH_ENTRY_INSTRUCTIONS + GRAPH_RETURN_INSTRUCTIONS + 2 * TASK_INSTRUCTIONS;

/// Keys of the JSON's `exitless` object that are null where not measured:
/// the counts KVM did not give, and figure (i) without --linux-boots.
fn nullable(k: &str) -> bool {
    k.ends_with("_counted")
        || k.starts_with("ftrace_")
        || k.ends_with("_boot")
        || k.starts_with("linux_boot")
}

/// guest/out/vmlinux, for figure (e) (built, or copied from the cache, once).
fn linux_vmlinux() -> std::path::PathBuf {
    let st = std::process::Command::new("bash")
        .arg(root().join("guest/build.sh"))
        .arg("linux")
        .status()
        .expect("run guest/build.sh linux");
    assert!(st.success(), "guest/build.sh linux failed");
    root().join("guest/out/vmlinux")
}

/// Runs `vmtrace bench ARGS --json FILE`, which must succeed: its JSON and
/// its stdout (the table).
fn bench_json(name: &str, args: &[&str]) -> (serde_json::Value, String) {
    let json = std::env::temp_dir().join(format!("vmtrace-{name}-{}.json", std::process::id()));
    let mut all = vec!["bench"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--json", json.to_str().unwrap()]);
    let out = vmtrace(&all);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        stdout(&out),
        stderr(&out)
    );
    let text = std::fs::read_to_string(&json).expect("the JSON file");
    let _ = std::fs::remove_file(&json);
    let doc = serde_json::from_str(&text).expect("valid JSON");
    (doc, stdout(&out))
}

#[test]
fn bench_json_has_every_figure() {
    let kernel = mini_elf();
    let vmlinux = linux_vmlinux();
    let (doc, table) = bench_json(
        "bench",
        &[
            "--kernel",
            kernel.to_str().unwrap(),
            "--vmlinux",
            vmlinux.to_str().unwrap(),
            "--iters",
            "200",
            // (h) short: 64 MB of events.
            "--record-events",
            "2000000",
        ],
    );
    let text = doc.to_string();
    let figures = doc["figures"].as_object().expect("a figures object");
    let not_measured = doc["not_measured"]
        .as_object()
        .expect("a not_measured object");

    // Every figure is a number and finite (JSON has no NaN: null would
    // fail), or (a time difference lost in noise) null with why.
    for (k, v) in figures {
        if v.is_null() {
            assert!(
                not_measured[k].is_string(),
                "{k} is null without why: {text}"
            );
            continue;
        }
        let x = v
            .as_f64()
            .unwrap_or_else(|| panic!("{k} = {v} is not a number"));
        assert!(x.is_finite(), "{k} = {x}");
    }
    let positive = |k: &str| {
        let x = figures
            .get(k)
            .and_then(|v| v.as_f64())
            .unwrap_or_else(|| panic!("figure {k} missing in {text}"));
        assert!(x.is_finite() && x > 0.0, "{k} = {x}");
    };
    // (a), (b), (c): positive, unless this host's noise swamped them.
    for k in ["a_exit_round_trip_us", "b_traced_call_us", "c_ratio"] {
        if !not_measured.contains_key(k) {
            positive(k);
        }
    }
    // (d): 1, 2, 4 vCPUs.
    for n in [1, 2, 4] {
        for what in ["latency", "window", "attach_window", "detach_window"] {
            for p in ["p50", "p99"] {
                positive(&format!("d_{n}cpu_{what}_{p}_us"));
            }
        }
        positive(&format!("d_{n}cpu_sites"));
    }
    // (e): 10, 100, 1,000 and all sites.
    for n in ["10", "100", "1000", "all"] {
        for what in ["attach_first", "attach_p50", "attach_max", "detach_p50"] {
            positive(&format!("e_{n}_sites_{what}_us"));
        }
        positive(&format!("e_{n}_sites"));
    }
    assert!(
        figures["e_all_sites"].as_f64().unwrap() > 1000.0,
        "all the Linux sites"
    );
    // And every figure named for (a) to (e) is positive (or not measured).
    for (k, v) in figures {
        if ["a_", "b_", "c_", "d_", "e_"]
            .iter()
            .any(|p| k.starts_with(p))
            && !not_measured.contains_key(k)
        {
            assert!(v.as_f64().unwrap() > 0.0, "{k} = {v}");
        }
    }
    positive("load_ms");
    positive("report_render_s");
    // (h): recording to disk; every event stored or counted lost.
    for k in [
        "h_record_events_per_s",
        "h_record_mb_per_s",
        "h_record_peak_mib",
        "h_record_stored",
        "h_record_bytes",
    ] {
        positive(k);
    }
    let fig = |k: &str| figures[k].as_f64().unwrap();
    assert_eq!(fig("h_record_sent"), 2e6, "{text}");
    assert_eq!(fig("h_record_stored") + fig("h_record_lost"), 2e6, "{text}");
    assert!(
        fig("h_record_bytes") >= fig("h_record_stored") * 32.0,
        "{text}"
    );
    assert_eq!(doc["record_events"], 2_000_000);

    // (f): exitless against trap, in its own object.
    let ex = doc["exitless"].as_object().expect("an exitless object");
    let num = |k: &str| {
        ex.get(k)
            .and_then(|v| v.as_f64())
            .unwrap_or_else(|| panic!("exitless.{k} missing or not a number in {text}"))
    };
    let timing_lost = ex.contains_key("timing_not_measured");
    for (k, v) in ex {
        // Counted by KVM, or (i) measured only with --linux-boots: a
        // number where available, else null (and, for the counts, why).
        // A time lost in noise: null, and why.
        if v.is_null() && (nullable(k) || timing_lost) {
            continue;
        }
        if k == "guest_instructions_counted_not_available" || k == "timing_not_measured" {
            assert!(v.is_string(), "exitless.{k} = {v}");
            continue;
        }
        assert!(v.as_f64().is_some_and(f64::is_finite), "exitless.{k} = {v}");
    }
    // No site holds a trap in the exitless phases: not one exit.
    assert_eq!(num("exits_per_call"), 0.0, "{text}");
    assert_eq!(num("exitless_trace_port_traps"), 0.0, "{text}");
    assert_eq!(
        ex["guest_instructions_per_call_static"], ENTRY_WITH_TASK,
        "{text}"
    );
    for k in [
        "guest_instructions_per_call",
        "trap_us_per_call",
        "exitless_us_per_call",
        "exitless_vs_trap",
        "us_per_guest_instruction",
        "exitless_calls",
    ] {
        if ex[k].is_null() && timing_lost {
            continue;
        }
        assert!(num(k) > 0.0, "exitless.{k} = {} in {text}", num(k));
    }
    assert!(num("exitless_calls") > 0.0, "{text}");
    // 3.5 hrtimer_* calls per mini iteration (phase edges fall inside one).
    assert!((num("calls_per_iter") - 3.5).abs() < 0.1, "{text}");
    assert_stack_counts(figures, &text);

    // One verdict per goal, each PASS, MISS or (not judged, saying why) SKIP.
    let goals = doc["goals"].as_array().expect("a goals array");
    // The tenth and eleventh: (i) and (j); then call/direct's and
    // attach/direct's two.
    assert_eq!(goals.len(), 14, "{text}");
    for g in goals {
        let s = g["status"].as_str().unwrap();
        assert!(["PASS", "MISS", "SKIP"].contains(&s), "{g}");
        assert!(g["goal"].is_string() && g["measured"].is_string(), "{g}");
        assert_eq!(g["not_judged"].is_string(), s == "SKIP", "{g}");
    }
    // The run's settings and how each figure is measured.
    assert_eq!(doc["schema"], "vmtrace-bench/1");
    assert_eq!(doc["kernel"], kernel.to_str().unwrap());
    assert_eq!(doc["vmlinux"], vmlinux.to_str().unwrap());
    assert_eq!(doc["iters"], 200);
    let methods = doc["methods"].as_object().expect("a methods object");
    for k in [
        "(a)", "(b)", "(c)", "(d)", "(e)", "(f)", "(g)", "(h)", "(i)", "(j)", "loading", "report",
        "stack",
    ] {
        assert!(methods[k].is_string(), "method {k} in {text}");
    }
    // The printed table gives the same verdicts.
    let verdicts = table
        .lines()
        .filter(|l| {
            let l = l.trim_start();
            l.starts_with("PASS ") || l.starts_with("MISS ") || l.starts_with("SKIP ")
        })
        .count();
    // With call/direct's and attach/direct's three.
    assert_eq!(verdicts, 14, "{table}");
    // call/direct: no exit in its exitless phases; three instructions
    // around the trampoline's path, in the code.
    assert_eq!(figures["direct_call_exits_per_call"], 0.0, "{text}");
    assert_eq!(figures["direct_call_around_body_static"], 3.0, "{text}");
    assert_eq!(
        figures["direct_call_instructions_static"].as_f64().unwrap(),
        ex["guest_instructions_per_call_static"].as_f64().unwrap() + 3.0,
        "{text}"
    );
    // attach/direct and sites/direct on the vmlinux.
    for k in [
        "direct_attach_100_max_us",
        "direct_attach_1000_max_us",
        "direct_sites_vmlinux_safe",
        "direct_sites_vmlinux_refused",
    ] {
        positive(k);
    }
    assert!(
        table.contains("distro kernel: not measured: no distro kernel given"),
        "{table}"
    );
    // (j): both first attaches measured, in each fresh guest.
    assert!(table.contains("(j) first attach of 30 sites"), "{table}");
    assert_eq!(figures["j_attach_sites"], 30.0, "{text}");
    for k in [
        "j_attach_trap_p50_us",
        "j_attach_exitless_p50_us",
        "j_attach_exitless_over_trap",
    ] {
        assert!(
            figures[k].as_f64().is_some_and(|v| v > 0.0),
            "{k} in {text}"
        );
    }
    assert!(table.contains("(f) exitless vs. trap"), "{table}");
    assert!(table.contains("(h) recording to disk"), "{table}");
    // (i) boots Linux: only with --linux-boots N, said so otherwise.
    assert!(table.contains("(i) vmtrace vs. the guest's own ftrace, Linux boot: NOT MEASURED"));
    assert_eq!(ex["linux_boots"], 0, "{text}");
    assert!(ex["ftrace_guest_instructions_per_call"].is_null(), "{text}");
    // Every bench has its entry, by name: all measured but boot/ftrace
    // and the qemu benches (asked for by name or --linux-boots only).
    assert_eq!(bench_names(&doc), BENCHES, "{text}");
    for b in doc["benches"].as_array().unwrap() {
        let boot = b["name"] == "boot/ftrace" || b["name"].as_str().unwrap().starts_with("qemu/");
        assert_eq!(b["measured"], !boot, "{b}");
        assert_eq!(b["values"].as_array().unwrap().is_empty(), boot, "{b}");
        assert_eq!(b["figures"].is_null(), boot, "{b}");
    }
    let boot = &doc["benches"][11];
    assert!(
        boot["not_measured"]
            .as_str()
            .unwrap()
            .contains("--linux-boots N"),
        "{boot}"
    );
    assert_eq!(
        doc["benches"][6]["figures"]["e_all_sites"],
        figures["e_all_sites"]
    );
    // Each section of the table headed by its bench's name and question.
    for name in BENCHES {
        assert!(table.contains(&format!("\n# {name}: ")), "{name}: {table}");
    }
}

#[test]
fn bench_rejects_bad_arguments() {
    let out = vmtrace(&["bench", "--iters", "0"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--iters"), "{}", stderr(&out));
    let out = vmtrace(&["bench", "--record-events", "0"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--record-events"), "{}", stderr(&out));
    let out = vmtrace(&["bench", "--kernel", "/nonexistent/mini.elf"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("does not exist"), "{}", stderr(&out));
    // (i) needs the bzImage and initramfs beside the vmlinux: said before
    // any figure is measured.
    let dir = std::env::temp_dir().join(format!("vmtrace-bench-i-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let vmlinux = dir.join("vmlinux");
    std::fs::write(&vmlinux, b"").unwrap();
    let out = vmtrace(&[
        "bench",
        "--kernel",
        mini_elf().to_str().unwrap(),
        "--vmlinux",
        vmlinux.to_str().unwrap(),
        "--linux-boots",
        "1",
    ]);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!(
            "--linux-boots boots the Linux guest: its kernel {} does not exist",
            dir.join("bzImage").display()
        )),
        "{}",
        stderr(&out)
    );
}

/// Guest instructions per traced call counted by KVM's emulator, (f) and
/// (g): on a host whose KVM emulates guest ring 0, exactly the trampoline's
/// static count (the calibration spin, counted too, says whether it does).
/// Short phases of many iterations: the partial iterations at the phases'
/// edges are what makes the counted figure differ from a whole number.
/// Counts only (`--counts-only`: (f) and (g), nothing timed asserted), so
/// that a noisy host cannot fail it.
#[test]
fn bench_counts_the_trampolines_instructions() {
    let kernel = mini_elf();
    let (doc, table) = bench_json(
        "bench-count",
        &[
            "--kernel",
            kernel.to_str().unwrap(),
            "--iters",
            "1000",
            "--rounds",
            "3",
            "--counts-only",
        ],
    );
    let text = doc.to_string();
    assert_eq!(doc["counts_only"], true, "{text}");
    assert!(doc["figures"].as_object().unwrap().is_empty(), "{text}");
    assert!(
        table.contains("(a)-(c) per traced call: NOT MEASURED, not asked for (--counts-only)"),
        "{table}"
    );
    // Every bench has its entry; those --counts-only leaves out say so.
    assert_eq!(bench_names(&doc), BENCHES, "{text}");
    for b in doc["benches"].as_array().unwrap() {
        let counted = b["name"] == "call/exitless" || b["name"] == "call/graph";
        assert_eq!(b["measured"], counted, "{b}");
        if !counted && b["name"] != "boot/ftrace" {
            assert_eq!(b["not_measured"], "not asked for (--counts-only)", "{b}");
        }
    }
    let (ex, graph) = (&doc["exitless"], &doc["graph"]);
    if ex["guest_instructions_per_call_counted"].is_null() {
        let why = ex["guest_instructions_counted_not_available"]
            .as_str()
            .expect("a reason when not counted");
        assert!(
            table.contains(&format!(
                "instructions counted by KVM: not available: {why}"
            )),
            "{table}"
        );
        println!("skipped: this host's KVM does not count every guest instruction: {why}");
        return;
    }
    // The calibration: 2 x mini_spin instructions more per spin iteration.
    let spin = ex["spin_instructions_counted"].as_f64().unwrap();
    let want = 2.0 * ex["spin"].as_f64().unwrap();
    assert!((spin - want).abs() < 0.02 * want, "{text}");
    let counted = ex["guest_instructions_per_call_counted"].as_f64().unwrap();
    assert!(
        (counted - ENTRY_WITH_TASK as f64).abs() <= 0.5,
        "{counted} instructions counted per exitless call, the trampoline has \
         {ENTRY_WITH_TASK}: {text}"
    );
    let graph_static = GRAPH_WITH_TASK;
    let counted = graph["guest_instructions_per_call_counted"]
        .as_f64()
        .unwrap();
    assert!(
        (counted - graph_static as f64).abs() <= 0.5,
        "{counted} instructions counted per hooked exitless call, the trampoline has \
         {GRAPH_ENTRY_INSTRUCTIONS} + {GRAPH_RETURN_INSTRUCTIONS} + 2 x {TASK_INSTRUCTIONS}: {text}"
    );
    assert_eq!(graph["guest_instructions_per_call_static"], graph_static);
    assert_eq!(
        graph["guest_instructions_per_call_entry_only_counted"],
        ex["guest_instructions_per_call_counted"]
    );
    assert!(
        table.contains("guest instructions per call, counted (KVM)"),
        "{table}"
    );
}

/// A bench of very short phases (20 iterations, one round) used to fail
/// its own checks in most runs: a time difference lost in the host's noise
/// ended the run, and the calls of a phase were estimated from its
/// iterations (3.5 a one), so the partial iterations at the phases' edges,
/// and (`--graph`) the return trap of a call entered in the trap phase that
/// returned in the next, failed checks that had tolerances. Now the phases
/// switch where no vCPU is between a traced site and the guest's own count
/// of the call, the checks are exact, and a time lost in noise is reported
/// not measured: every run exits 0, the exitless tracer counted exactly the
/// calls the guest made in its phases, and no site trapped there.
#[test]
fn short_benches_pass_their_exact_checks() {
    let kernel = mini_elf();
    for run in 0..4 {
        let (doc, table) = bench_json(
            "bench-short",
            &[
                "--kernel",
                kernel.to_str().unwrap(),
                "--iters",
                "20",
                "--rounds",
                "1",
                "--cycles",
                "2",
                "--report-events",
                "1000",
                "--record-events",
                "100000",
            ],
        );
        let text = doc.to_string();
        for obj in ["exitless", "graph"] {
            let o = &doc[obj];
            // Each null time says why, in the JSON and the table.
            if let Some(why) = o.get("timing_not_measured") {
                let why = why.as_str().expect("a reason");
                assert!(
                    table.contains(&format!("times not measured: {why}")),
                    "{table}"
                );
            }
        }
        let ex = &doc["exitless"];
        assert_eq!(ex["exitless_trace_port_traps"], 0, "run {run}: {text}");
        assert_eq!(ex["exits_per_call"], 0.0, "run {run}: {text}");
        // At least 19 whole iterations of at least 3 calls each.
        let calls = ex["exitless_calls"].as_u64().unwrap();
        assert!(calls >= 3 * 19, "run {run}: {text}");
    }
}

/// call/stack's counts, exact (its times are not asserted): one exit per
/// call with `--stack`, the guest's four chains (2 to 5 frames; the bench
/// itself fails unless every stack_leaf call has its stack, unwound to the
/// bottom), 1.875 stack_leaf calls among 4.75 stack_* calls per iteration.
fn assert_stack_counts(figures: &serde_json::Map<String, serde_json::Value>, text: &str) {
    let fig = |k: &str| {
        figures
            .get(k)
            .and_then(|v| v.as_f64())
            .unwrap_or_else(|| panic!("figure {k} missing in {text}"))
    };
    assert_eq!(fig("stack_exits_per_call"), 1.0, "{text}");
    assert_eq!(fig("stack_distinct"), 4.0, "{text}");
    assert!(fig("stack_stacks") > 0.0, "{text}");
    let frames = fig("stack_frames_mean");
    assert!((2.0..=5.0).contains(&frames), "{text}");
    assert!((fig("stack_calls_per_iter") - 4.75).abs() < 0.5, "{text}");
    assert!((fig("stack_stacks_per_iter") - 1.875).abs() < 0.5, "{text}");
}

/// Every bench, by collection, as `vmtrace bench list` names them.
const BENCHES: [&str; 16] = [
    "call/trap",
    "call/exitless",
    "call/graph",
    "call/stack",
    "call/direct",
    "attach/pause",
    "attach/scaling",
    "attach/modes",
    "attach/direct",
    "record/throughput",
    "report/render",
    "boot/ftrace",
    "qemu/attach",
    "qemu/drain",
    "sites/direct",
    "events/cost",
];

/// The names of the benches in a bench JSON's `benches`, in order.
fn bench_names(doc: &serde_json::Value) -> Vec<String> {
    doc["benches"]
        .as_array()
        .expect("a benches array")
        .iter()
        .map(|b| b["name"].as_str().expect("a name").to_string())
        .collect()
}

/// `vmtrace bench list` (and `--list`): every bench, in its collection,
/// with its goal, its figure and unit, and what it needs; nothing run.
#[test]
fn bench_list_names_every_bench() {
    let out = vmtrace(&["bench", "list"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let list = stdout(&out);
    for name in BENCHES {
        let line = list
            .lines()
            .find(|l| l.starts_with(&format!("  {name}")))
            .unwrap_or_else(|| panic!("no {name} in\n{list}"));
        assert!(
            line == format!("  {name}") || line.starts_with(&format!("  {name} (also ")),
            "{line}"
        );
    }
    for (field, n) in [("goal:", 16), ("figure:", 16), ("needs:", 16)] {
        let count = list
            .lines()
            .filter(|l| l.trim_start().starts_with(field))
            .count();
        assert_eq!(count, n, "{field} in\n{list}");
    }
    // Each figure with its unit, in brackets.
    assert!(
        list.lines()
            .filter(|l| l.trim_start().starts_with("figure:"))
            .all(|l| l.ends_with(']')),
        "{list}"
    );
    for collection in ["call:", "attach:", "record:", "report:", "boot:", "events:"] {
        assert!(
            list.lines().any(|l| l.starts_with(collection)),
            "{collection} in\n{list}"
        );
    }
    assert!(list.contains("      needs:  the mini guest"), "{list}");
    assert!(list.contains("      needs:  nothing (no guest)"), "{list}");
    assert!(
        list.contains("      needs:  the Linux guest, booted (--linux-boots N)"),
        "{list}"
    );
    assert!(list.contains("  call/trap (also a, b, c)"), "{list}");
    let flag = vmtrace(&["bench", "--list"]);
    assert_eq!(flag.status.code(), Some(0), "{}", stderr(&flag));
    assert_eq!(stdout(&flag), list);
    // With names, as `perf bench sched` lists its collection: those alone.
    let some = vmtrace(&["bench", "list", "call", "j"]);
    assert_eq!(some.status.code(), Some(0), "{}", stderr(&some));
    let some = stdout(&some);
    let listed: Vec<&str> = some
        .lines()
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .map(|l| l.trim().split(' ').next().unwrap())
        .collect();
    assert_eq!(
        listed,
        [
            "call/trap",
            "call/exitless",
            "call/graph",
            "call/stack",
            "call/direct",
            "attach/modes"
        ],
        "{some}"
    );
    // Its heading counts what it lists (before: "10 benches in 6 collections").
    assert!(
        some.starts_with("vmtrace bench: 6 of 16 benches, in 2 of 8 collections."),
        "{some}"
    );
    assert!(
        list.starts_with("vmtrace bench: 16 of 16 benches, in 8 of 8 collections."),
        "{list}"
    );
}

/// events/cost on the 6.1 default guest's vmlinux, counted in the code,
/// never run: a function entry's instructions (the exitless trampoline on
/// a recorded call with its task, as call/exitless's static figure), and
/// per event its path beyond the entry, task_rename's string copies, and
/// the sum; its section of the table and its method; no goal.
#[test]
fn bench_counts_an_events_instructions() {
    let vmlinux = linux_vmlinux();
    let (doc, table) = bench_json(
        "bench-events",
        &["events/cost", "--vmlinux", vmlinux.to_str().unwrap()],
    );
    let text = doc.to_string();
    assert_eq!(bench_names(&doc), ["events/cost"], "{text}");
    let figures = doc["figures"].as_object().unwrap();
    let fig = |k: &str| figures[k].as_f64().unwrap_or_else(|| panic!("{k}: {text}"));
    assert_eq!(
        fig("event_entry_guest_insns"),
        ENTRY_WITH_TASK as f64,
        "{text}"
    );
    for e in ["sched_switch", "sched_wakeup", "task_rename"] {
        let path = fig(&format!("event_{e}_path_insns"));
        // The enabled branch's load, `test`, `je`, `__data`, `call`; the
        // iterator's load and test of `tp->funcs`, `je`, `ret`.
        assert!(path >= 9.0, "{e}: {text}");
        // task_rename's two names, copied by vmtrace's code at the event:
        // six registers saved and restored, then per name its argument,
        // the address, the bound, the call, the record again, the status
        // (the old name's one more: its offset in task_struct).
        let copies = match e {
            "task_rename" => {
                assert_eq!(fig("event_task_rename_copy_calls"), 2.0, "{text}");
                assert_eq!(fig("event_task_rename_copy_insns"), 25.0, "{text}");
                25.0
            }
            _ => 0.0,
        };
        let all = ENTRY_WITH_TASK as f64 + path + copies;
        assert_eq!(fig(&format!("event_{e}_guest_insns")), all, "{text}");
        assert!(
            table.contains(&format!("  {e}: {all} = the entry's")),
            "{table}"
        );
    }
    let b = &doc["benches"][0];
    assert_eq!(b["measured"], true, "{text}");
    let keys: Vec<&str> = b["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["key"].as_str().unwrap())
        .collect();
    assert_eq!(
        keys,
        [
            "event_entry_guest_insns",
            "event_task_rename_guest_insns",
            "event_sched_switch_guest_insns",
            "event_sched_wakeup_guest_insns"
        ],
        "{text}"
    );
    assert!(doc["goals"].as_array().unwrap().is_empty(), "{text}");
    let methods: Vec<&String> = doc["methods"].as_object().unwrap().keys().collect();
    assert_eq!(methods, ["events/cost"], "{text}");
    assert!(
        table.contains("\n# events/cost: How many guest instructions"),
        "{table}"
    );
}

/// One bench by name runs it alone: its figures, its goals, its entry;
/// nothing of the others (counts exact, no time asserted).
#[test]
fn bench_by_name_runs_only_it() {
    let kernel = mini_elf();
    let (doc, table) = bench_json(
        "bench-named",
        &[
            "call/exitless",
            "--kernel",
            kernel.to_str().unwrap(),
            "--iters",
            "20",
            "--rounds",
            "1",
        ],
    );
    let text = doc.to_string();
    assert_eq!(bench_names(&doc), ["call/exitless"], "{text}");
    // No figure of another bench, no graph, no boot figures.
    assert!(doc["figures"].as_object().unwrap().is_empty(), "{text}");
    assert!(doc["graph"].is_null(), "{text}");
    assert!(doc["exitless"].get("linux_boots").is_none(), "{text}");
    let methods: Vec<&String> = doc["methods"].as_object().unwrap().keys().collect();
    assert_eq!(methods, ["(f)"], "{text}");
    // Its two goals alone.
    let goals = doc["goals"].as_array().unwrap();
    assert_eq!(goals.len(), 2, "{text}");
    assert!(goals[0]["goal"]
        .as_str()
        .unwrap()
        .starts_with("exits per traced call, exitless"));
    // Exact counts: no exit in the exitless phases; the trampoline's code.
    let ex = &doc["exitless"];
    assert_eq!(ex["exitless_trace_port_traps"], 0, "{text}");
    assert_eq!(ex["exits_per_call"], 0.0, "{text}");
    assert_eq!(
        ex["guest_instructions_per_call_static"], ENTRY_WITH_TASK,
        "{text}"
    );
    assert!(ex["exitless_calls"].as_u64().unwrap() >= 3 * 19, "{text}");
    // Its entry: name, goal, needs, figure and unit, values, verdicts.
    let b = &doc["benches"][0];
    assert_eq!(b["aliases"], serde_json::json!(["f"]), "{text}");
    assert_eq!(b["needs"], "the mini guest", "{text}");
    assert_eq!(b["measured"], true, "{text}");
    for k in ["goal", "figure", "unit"] {
        assert!(b[k].as_str().is_some_and(|s| !s.is_empty()), "{k}: {text}");
    }
    assert_eq!(b["figures"], doc["exitless"], "{text}");
    assert_eq!(b["goals"], doc["goals"], "{text}");
    let values = b["values"].as_array().unwrap();
    let exits = values
        .iter()
        .find(|v| v["key"] == "exits_per_call")
        .expect("exits per call among its values");
    assert_eq!(exits["value"], 0.0, "{text}");
    assert_eq!(exits["unit"], "exits", "{text}");
    let measured = values
        .iter()
        .find(|v| v["key"] == "guest_instructions_per_call")
        .unwrap();
    assert_eq!(measured["samples"], 1, "{text}");
    // The table: its section, headed by its name and question, alone.
    assert!(table.contains("benches: call/exitless\n"), "{table}");
    assert!(
        table.contains("\n# call/exitless: How many exits and guest instructions"),
        "{table}"
    );
    assert_eq!(table.matches("\n# ").count(), 1, "{table}");
    assert!(table.contains("(f) exitless vs. trap"), "{table}");
    for other in [
        "(a)-(c)",
        "(d) pause",
        "(g) function graph",
        "(h)",
        "(i)",
        "(j)",
    ] {
        assert!(!table.contains(other), "{other} in {table}");
    }
}

/// A collection runs all of its benches, and an old letter its bench, in
/// `vmtrace bench list`'s order; exact counts where a bench reports them.
#[test]
fn bench_collection_and_letter_run_their_benches() {
    let kernel = mini_elf();
    let (doc, table) = bench_json(
        "bench-collection",
        &[
            "j",
            "call",
            "--kernel",
            kernel.to_str().unwrap(),
            "--iters",
            "20",
            "--rounds",
            "1",
        ],
    );
    let text = doc.to_string();
    assert_eq!(
        bench_names(&doc),
        [
            "call/trap",
            "call/exitless",
            "call/graph",
            "call/stack",
            "call/direct",
            "attach/modes"
        ],
        "{text}"
    );
    // call/trap's, call/stack's, call/direct's and attach/modes's figures,
    // nobody else's.
    let figures = doc["figures"].as_object().unwrap();
    for k in figures.keys() {
        assert!(
            [
                "a_",
                "b_",
                "c_",
                "recorder_",
                "iter_",
                "exits_per_iter",
                "handler_",
                "stack_",
                "direct_call_",
                "j_"
            ]
            .iter()
            .any(|p| k.starts_with(p)),
            "{k} in {text}"
        );
    }
    assert!(figures["exits_per_iter"].as_f64().unwrap() > 0.0, "{text}");
    assert_eq!(figures["j_attach_sites"], 30.0, "{text}");
    assert_eq!(figures["j_attach_rounds"], 1.0, "{text}");
    // call/trap's goal, call/exitless's two, attach/modes's, call/direct's.
    assert_eq!(doc["goals"].as_array().unwrap().len(), 5, "{text}");
    assert_eq!(figures["direct_call_exits_per_call"], 0.0, "{text}");
    let graph = &doc["graph"];
    assert_eq!(
        graph["guest_instructions_per_call_static"], GRAPH_WITH_TASK,
        "{text}"
    );
    assert_eq!(
        graph["guest_instructions_per_call_entry_only_static"], ENTRY_WITH_TASK,
        "{text}"
    );
    assert_eq!(doc["exitless"]["exitless_trace_port_traps"], 0, "{text}");
    let methods: Vec<&String> = doc["methods"].as_object().unwrap().keys().collect();
    assert_eq!(
        methods,
        [
            "(a)",
            "(b)",
            "(c)",
            "(f)",
            "(g)",
            "(j)",
            "call/direct",
            "stack"
        ],
        "{text}"
    );
    assert_stack_counts(figures, &text);
    assert_eq!(table.matches("\n# ").count(), 6, "{table}");
    assert!(table.contains("(j) first attach of 30 sites"), "{table}");
    assert!(!table.contains("(d) pause"), "{table}");
}

/// A name that is no bench, collection or letter: one line naming the
/// benches, exit 2, nothing run; so for benches that cannot run as asked.
#[test]
fn bench_refuses_unknown_names() {
    let kernel = mini_elf();
    let kernel = kernel.to_str().unwrap();
    let cases: [(&[&str], &str); 5] = [
        (
            &["bench", "call/nope", "--kernel", kernel],
            "no bench `call/nope`; the benches: call/trap, call/exitless, call/graph, \
             call/stack, call/direct, attach/pause, attach/scaling, attach/modes, attach/direct, \
             record/throughput, report/render, boot/ftrace, qemu/attach, qemu/drain, \
             sites/direct, events/cost; \
             collections call, attach, record, report, boot, qemu, sites, events; all (`vmtrace bench \
             list` says what each measures)",
        ),
        (
            &["bench", "boot/ftrace", "--kernel", kernel],
            "give --linux-boots N",
        ),
        (
            &["bench", "call", "--counts-only", "--kernel", kernel],
            "name benches or give --counts-only, not both",
        ),
        (
            &["bench", "list", "calls"],
            "no bench `calls`; the benches: ",
        ),
        (&["bench", "--list", "k"], "no bench `k`; the benches: "),
    ];
    for (args, want) in cases {
        let out = vmtrace(args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(stdout(&out).is_empty(), "{args:?}: {}", stdout(&out));
    }
}

/// A bench that needs no guest runs without one: `--kernel` is not even
/// looked at, the JSON has no kernel; its counts are exact.
#[test]
fn bench_without_a_guest_needs_no_kernel() {
    let (doc, table) = bench_json(
        "bench-noguest",
        &[
            "record/throughput",
            "--kernel",
            "/nonexistent/mini.elf",
            "--record-events",
            "100000",
        ],
    );
    let text = doc.to_string();
    assert_eq!(bench_names(&doc), ["record/throughput"], "{text}");
    assert!(doc["kernel"].is_null(), "{text}");
    assert!(
        doc["exitless"].is_null() && doc["graph"].is_null(),
        "{text}"
    );
    let fig = |k: &str| doc["figures"][k].as_f64().unwrap();
    assert_eq!(fig("h_record_sent"), 1e5, "{text}");
    assert_eq!(fig("h_record_stored") + fig("h_record_lost"), 1e5, "{text}");
    assert!(
        doc["figures"]
            .as_object()
            .unwrap()
            .keys()
            .all(|k| k.starts_with("h_record_")),
        "{text}"
    );
    assert_eq!(doc["goals"].as_array().unwrap().len(), 2, "{text}");
    let b = &doc["benches"][0];
    assert_eq!(b["needs"], "nothing (no guest)", "{text}");
    assert_eq!(b["aliases"], serde_json::json!(["h"]), "{text}");
    assert_eq!(b["figures"], doc["figures"], "{text}");
    assert!(
        table.starts_with("vmtrace bench: no mini guest needed\n"),
        "{table}"
    );
    assert!(table.contains("(h) recording to disk"), "{table}");
}

/// `--markdown FILE`: the figures table, into FILE's figures block (the
/// rest of FILE kept), with the command that made it; `--json` and
/// `--markdown` naming one file: refused, one line, exit 2.
#[test]
fn bench_writes_its_markdown_table_into_a_files_block() {
    let dir = std::env::temp_dir().join(format!("vmtrace-bench-md-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let md = dir.join("figures.md");
    let (begin, end) = ("<!-- bench:figures begin -->", "<!-- bench:figures end -->");
    std::fs::write(
        &md,
        format!("# Doc\n\nbefore\n{begin}\nold\n{end}\nafter\n"),
    )
    .unwrap();
    let path = md.to_str().unwrap();
    let out = vmtrace(&[
        "bench",
        "report/render",
        "--report-events",
        "1000",
        "--markdown",
        path,
    ]);
    let text = std::fs::read_to_string(&md).unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        text.starts_with(&format!("# Doc\n\nbefore\n{begin}\n")),
        "{text}"
    );
    assert!(text.ends_with(&format!("\n{end}\nafter\n")), "{text}");
    assert!(!text.contains("\nold\n"), "{text}");
    let line =
        format!("- command: `vmtrace bench report/render --report-events 1000 --markdown {path}`");
    assert!(text.contains(&line), "{text}");
    assert!(
        text.contains("\n| `report/render` | `report_render_s` | "),
        "{text}"
    );
    assert!(
        text.contains("| SKIP: measured with 1,000 events |"),
        "{text}"
    );

    let out = vmtrace(&["bench", "report/render", "--json", path, "--markdown", path]);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--json and --markdown both name"),
        "{}",
        stderr(&out)
    );
}

/// `bench qemu` on real QEMU/TCG guests, two rounds: each round attaches
/// four times to the default guest and twice to Debian's 6.12 (whose
/// attach plugs the ring device) from one process, as any program using
/// the library may (a second attach once made QEMU abort: the device's
/// memory block named as the one just removed). Every attach's pause is
/// there, `*` attached every site, and the bursts' calls were stored or
/// counted. How many were stored is the drain's pace against the guest's,
/// a figure of the bench and not of this test: on a host loaded ten times
/// over, 96% were (the rest dropped and counted: the drain fell behind
/// and the ring filled). No time asserted.
#[test]
fn bench_qemu_attaches_again_and_again_from_one_process() {
    let vmlinux = linux_vmlinux();
    // The bursts' guest (fetched, or from the cache).
    let st = std::process::Command::new("bash")
        .arg(root().join("guest/build.sh"))
        .arg("debian-6.12")
        .status()
        .expect("run guest/build.sh debian-6.12");
    assert!(st.success(), "guest/build.sh debian-6.12 failed");
    let v = vmlinux.to_str().unwrap();
    let (doc, text) = bench_json("qemu", &["qemu", "--rounds", "2", "--vmlinux", v]);
    let b = doc["benches"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == "qemu/attach")
        .expect("qemu/attach in the JSON");
    assert_eq!(b["measured"], true, "{text}");
    let f = b["figures"].as_object().unwrap();
    let pauses: Vec<(&String, f64)> = f
        .iter()
        .filter(|(k, _)| k.starts_with("k_attach_") && k.ends_with("_sites_p50_us"))
        .map(|(k, v)| (k, v.as_f64().unwrap()))
        .collect();
    assert_eq!(pauses.len(), 3, "{f:?}");
    let sites: Vec<u64> = pauses
        .iter()
        .map(|(k, _)| {
            k["k_attach_".len()..]
                .split('_')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    // `*`: every site of the vmlinux's `__mcount_loc`, far above the others.
    assert!(
        sites.contains(&1) && sites.iter().any(|&n| n > 5_000),
        "{sites:?}"
    );
    for (k, p) in &pauses {
        assert!(*p > 0.0, "{k}: {p}");
    }
    assert!(f["k_burst_attach_p50_us"].as_f64().unwrap() > 0.0, "{f:?}");
    let stored = f["k_stored_share"].as_f64().unwrap();
    assert!(stored > 0.0 && stored <= 1.0, "{text}");
    assert!(text.contains("debian-6.12/vmlinuz"), "{text}");
}

/// qemu/drain: the one exitless drainer, from rings that host threads
/// fill at memory speed to a data file, in a QEMU ring device's memory and
/// in the own VMM's, in one run: every event counted and stored (the bench
/// fails otherwise), both rates given; no time asserted.
#[test]
fn bench_drain_runs_in_both_memories() {
    let (doc, table) = bench_json("bench-drain", &["qemu/drain", "--drain-events", "200000"]);
    let text = doc.to_string();
    assert_eq!(bench_names(&doc), ["qemu/drain"], "{text}");
    assert_eq!(doc["drain_events"], 200_000, "{text}");
    let fig = |k: &str| {
        doc["figures"][k]
            .as_f64()
            .unwrap_or_else(|| panic!("{k} in {text}"))
    };
    // The attach's default device (64 MiB) gives 2 rings of 262,144
    // records; the own VMM's 4 MiB, 2 of 16,384.
    for (memory, cap) in [("ring_device", 262_144.0), ("own_vmm", 16_384.0)] {
        assert!(fig(&format!("drain_{memory}_events_per_s")) > 0.0, "{text}");
        assert_eq!(fig(&format!("drain_{memory}_events")), 200_000.0, "{text}");
        assert_eq!(fig(&format!("drain_{memory}_records_per_ring")), cap);
    }
    assert!(fig("drain_ring_device_over_own_vmm") > 0.0, "{text}");
    let goals = doc["goals"].as_array().unwrap();
    assert_eq!(goals.len(), 2, "{text}");
    assert!(goals[0]["goal"]
        .as_str()
        .unwrap()
        .starts_with("drain, QEMU's ring device: >= 10 M events/s"));
    let b = &doc["benches"][0];
    assert_eq!(b["needs"], "nothing (no guest)", "{text}");
    assert_eq!(b["values"].as_array().unwrap().len(), 2, "{text}");
    assert!(
        table.contains("qemu/drain: the exitless drainer"),
        "{table}"
    );
}
