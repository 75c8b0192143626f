//! Filters after recording, through the binary: `vmtrace report` and
//! `vmtrace script` with `--comm`, `--pid` (the tgid), `--tid` and
//! `--sym`, and `script -F`, on one trace the mini guest recorded (2
//! vCPUs, function graph, arguments, return values, a kernel stack), whose
//! calls per task the guest counts itself (guest/mini/README.md "Tasks"):
//! every filter's counts must be the guest's for the tasks and functions it
//! keeps, exactly. A second trace, of the mini guest without BTF (no
//! tasks), gives the errors of what a trace lacks.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use common::*;
use tracer::trace::report::thousands;

const TRACE: &str = "hrtimer_*,schedule,do_idle,tick_sched_timer,__hrtimer_run_queues";
const ITERS: u64 = 60;

/// The recorded traces and what the guest counted.
struct Recorded {
    /// With tasks, graph, args, retval and tick_sched_timer's stacks.
    full: PathBuf,
    /// The guest's own (cpu, pid, tgid, comm, function) -> calls, traced
    /// functions only.
    guest: MiniTaskCounts,
    /// One vCPU, `hrtimer_*`, from a kernel without BTF: no tasks.
    bare: PathBuf,
}

fn recorded() -> &'static Recorded {
    static R: OnceLock<Recorded> = OnceLock::new();
    R.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("vmtrace-filters-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (full, console) = (dir.join("full.data"), dir.join("console.txt"));
        let kernel = mini_elf();
        let cmdline = format!("iters={ITERS}");
        let o = vmtrace(&[
            "record",
            "--kernel",
            s(&kernel),
            "--cpus",
            "2",
            "--cmdline",
            &cmdline,
            "--trace",
            TRACE,
            "--graph",
            "--retval",
            "--args",
            "--stack",
            "tick_sched_timer",
            "--mode",
            "trap",
            "--console",
            s(&console),
            "-o",
            s(&full),
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let (all, _) = parse_mini_task_counts(&std::fs::read_to_string(&console).unwrap());
        let traced: Vec<&str> = TRACE.split(',').collect();
        let guest = all
            .into_iter()
            .filter(|((.., f), _)| {
                traced.iter().any(|t| match t.strip_suffix('*') {
                    Some(prefix) => f.starts_with(prefix),
                    None => f == t,
                })
            })
            .collect();
        // Without BTF nor DWARF: events without tasks.
        let bare_elf = dir.join("mini-no-btf.elf");
        let st = std::process::Command::new("objcopy")
            .args(["--remove-section", ".BTF", "--strip-debug"])
            .arg(&kernel)
            .arg(&bare_elf)
            .status()
            .unwrap();
        assert!(st.success());
        let bare = dir.join("bare.data");
        let o = vmtrace(&[
            "record",
            "--kernel",
            s(&bare_elf),
            "--cmdline",
            &cmdline,
            "--trace",
            "hrtimer_*",
            "--console",
            "none",
            "-o",
            s(&bare),
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        Recorded { full, guest, bare }
    })
}

/// vmtrace `cmd` of the full trace with `more`: its stdout, exit 0, no stderr.
fn run(cmd: &str, more: &[&str]) -> String {
    let r = recorded();
    let mut args = vec![cmd, s(&r.full)];
    args.extend_from_slice(more);
    let out = vmtrace(&args);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
    assert_eq!(stderr(&out), "", "{args:?}");
    stdout(&out)
}

type PerCpu = BTreeMap<String, BTreeMap<u32, u64>>;

/// A guest count's key: (cpu, pid, tgid, comm, function).
type Key = (u32, i32, i32, String, String);

/// Which guest counts a filter keeps.
type Keep = Box<dyn Fn(&Key) -> bool>;

/// function -> vCPU -> calls, of the guest's counts that `keep` keeps.
fn guest_counts(keep: impl Fn(&Key) -> bool) -> PerCpu {
    let mut m = PerCpu::new();
    for (k, &n) in &recorded().guest {
        if keep(k) && n > 0 {
            *m.entry(k.4.clone()).or_default().entry(k.0).or_default() += n;
        }
    }
    m
}

/// function -> vCPU -> calls of `report --format json` with `filters`.
fn report_counts(filters: &[&str]) -> (PerCpu, serde_json::Value) {
    let mut args = vec!["--format", "json"];
    args.extend_from_slice(filters);
    let v: serde_json::Value = serde_json::from_str(&run("report", &args)).unwrap();
    let mut m = PerCpu::new();
    for f in v["functions"].as_array().unwrap() {
        for (cpu, n) in f["per_cpu"].as_object().unwrap() {
            let n = n.as_u64().unwrap();
            if n > 0 {
                let name = f["name"].as_str().unwrap().to_string();
                m.entry(name).or_default().insert(cpu.parse().unwrap(), n);
            }
        }
    }
    (m, v)
}

fn total(m: &PerCpu) -> u64 {
    m.values().flat_map(|c| c.values()).sum()
}

#[test]
fn each_filter_counts_exactly_the_guests_calls_of_what_it_keeps() {
    let all = guest_counts(|_| true);
    assert_eq!(report_counts(&[]).0, all);
    assert!(total(&all) > 0);
    let cases: [(&[&str], Keep); 6] = [
        (
            &["--comm", "mini-a/*"],
            Box::new(|k| k.3.starts_with("mini-a/")),
        ),
        // Two globs: either; the renamed thread under both names.
        (
            &["--comm", "mini-b/*", "--comm", "mini-b2/1"],
            Box::new(|k| k.3.starts_with("mini-b/") || k.3 == "mini-b2/1"),
        ),
        // perf's --pid: the process, mini-a/1 and its thread mini-b/1.
        (&["--pid", "1011"], Box::new(|k| k.2 == 1011)),
        (&["--tid", "1002,0"], Box::new(|k| k.1 == 1002 || k.1 == 0)),
        (
            &["--sym", "hrtimer_*,!hrtimer_wakeup", "--sym", "do_idle"],
            Box::new(|k| {
                let f = k.4.as_str();
                (f.starts_with("hrtimer_") && f != "hrtimer_wakeup") || f == "do_idle"
            }),
        ),
        // AND: all of them.
        (
            &[
                "--comm", "mini-*", "--pid", "1001", "--tid", "1002", "--sym", "tick_*",
            ],
            Box::new(|k| {
                k.3.starts_with("mini-") && k.2 == 1001 && k.1 == 1002 && k.4 == "tick_sched_timer"
            }),
        ),
    ];
    let stored = total(&all);
    for (filters, keep) in cases {
        let want = guest_counts(keep);
        let (got, v) = report_counts(filters);
        assert_eq!(got, want, "{filters:?}");
        assert!(total(&want) > 0 && total(&want) < stored, "{filters:?}");
        // The JSON says what was shown, of how many.
        let shown = v["shown"].as_str().unwrap();
        let note = format!(
            "{} ({} of {} stored calls shown; counts are of those)",
            filters.join(" "),
            thousands(total(&want)),
            thousands(stored)
        );
        assert_eq!(shown, note, "{filters:?}");
        assert_eq!(v["events"].as_u64(), Some(total(&want)), "{filters:?}");
    }
}

#[test]
fn every_view_says_the_filter_and_shows_only_its_events() {
    let want = guest_counts(|k| k.3.starts_with("mini-b"));
    let (n, of) = (total(&want), total(&guest_counts(|_| true)));
    let note = format!(
        "--comm mini-b* ({} of {} stored calls shown; counts are of those)",
        thousands(n),
        thousands(of)
    );
    // The text report: the filter line right under the events line.
    let text = run("report", &["--comm", "mini-b*"]);
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("# events:"))
        .unwrap();
    assert_eq!(
        lines[at],
        format!("# events:   {} total, {} stored, 0 dropped", n, n)
    );
    assert_eq!(lines[at + 1], format!("# filter:   {note}"));
    // By task: the kept tasks alone, each with the guest's calls.
    let by_task = run("report", &["--comm", "mini-b*", "--by", "task"]);
    let rows: Vec<&str> = by_task.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(rows.len(), 4, "{by_task}");
    for cpu in 0..2u32 {
        for comm in [format!("mini-b/{cpu}"), format!("mini-b2/{cpu}")] {
            let calls: u64 = recorded()
                .guest
                .iter()
                .filter(|((c, _, _, name, _), _)| *c == cpu && *name == comm)
                .map(|(_, n)| n)
                .sum();
            let task = format!("{comm}-{}", 1002 + 10 * cpu);
            let row = rows.iter().find(|r| r.contains(&task)).unwrap();
            let cols: Vec<&str> = row.split_whitespace().collect();
            assert_eq!(cols[1], calls.to_string(), "{row}");
        }
    }
    // The exports: of the same events (CSV: a row per entry and return).
    let csv = recorded().full.with_extension("csv");
    let export = format!("csv={}", csv.display());
    run("report", &["--comm", "mini-b*", "--export", &export]);
    let rows = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(rows.lines().count() as u64, 1 + 2 * n);
    assert!(
        rows.lines().skip(1).all(|r| r.contains(",mini-b")),
        "{rows}"
    );
    // The call tree and the script: the line, and no other task.
    let tree = run("report", &["--comm", "mini-b*", "--tree"]);
    assert!(tree.contains(&format!("\n# filter: {note}\n")), "{tree}");
    assert!(
        !tree.contains("mini-a") && !tree.contains("<idle>"),
        "{tree}"
    );
    let script = run("script", &["--comm", "mini-b*"]);
    assert!(script.contains(&format!("\n# filter: {note}\n")));
    let entries = script
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains(" <-") && !l.contains("<stack trace>"))
        .count() as u64;
    assert_eq!(entries, n);
    assert!(!script.contains("mini-a") && !script.contains("<idle>"));
}

/// The -F lines of the full trace with `more`, header left out.
fn fields(more: &[&str]) -> Vec<String> {
    let out = run("script", more);
    out.lines()
        .filter(|l| !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

#[test]
fn script_fields_come_in_the_order_asked() {
    // Thread 1012 (mini-b/1, then mini-b2/1) of process 1011, on vCPU 1.
    let a = fields(&["--tid", "1012", "-F", "tid,pid,comm,cpu"]);
    let b = fields(&["--tid", "1012", "-F", "cpu,comm", "-F", "pid,tid"]);
    assert_eq!(a.len(), b.len());
    // A line per entry and per return.
    let calls = total(&guest_counts(|k| k.1 == 1012));
    assert_eq!(a.len() as u64, 2 * calls);
    for (x, y) in a.iter().zip(&b) {
        let comm = x.split_whitespace().nth(2).unwrap();
        assert!(comm == "mini-b/1" || comm == "mini-b2/1", "{x}");
        assert_eq!(x, &format!("   1012    1011 {comm:>16} [001]"));
        assert_eq!(y, &format!("[001] {comm:>16}    1011    1012"));
    }
    // func: entries and returns, one each per call, told apart.
    let funcs = fields(&["--pid", "1001", "-F", "func"]);
    let want = guest_counts(|k| k.2 == 1001);
    for (f, per_cpu) in &want {
        let calls: u64 = per_cpu.values().sum();
        let entries = funcs.iter().filter(|l| *l == f).count() as u64;
        let rets = funcs
            .iter()
            .filter(|l| **l == format!("{f} returned"))
            .count();
        assert_eq!((entries, rets as u64), (calls, calls), "{f}");
    }
    // func then caller read as the whole line does, arguments aside.
    let fc = fields(&["--sym", "schedule", "-F", "func,caller"]);
    assert!(fc
        .iter()
        .all(|l| l == "schedule <-do_idle" || l == "schedule returned to do_idle"));
    // args of entries, retval of returns; the stack below its entry.
    let args = fields(&["--sym", "do_idle", "--tid", "0", "-F", "args"]);
    let calls = total(&guest_counts(|k| k.1 == 0 && k.4 == "do_idle"));
    let with_args: Vec<&String> = args.iter().filter(|l| !l.is_empty()).collect();
    assert_eq!(with_args.len() as u64, calls);
    assert!(with_args
        .iter()
        .all(|l| l.starts_with("(c=0x") && l.contains(", i=")));
    let stacked = fields(&["--sym", "tick_sched_timer", "-F", "func,stack"]);
    let ticks = total(&guest_counts(|k| k.4 == "tick_sched_timer"));
    let frames = stacked.iter().filter(|l| l.starts_with(" => ")).count() as u64;
    assert!(frames >= 3 * ticks, "{stacked:?}");
    for (i, l) in stacked.iter().enumerate() {
        if l == "tick_sched_timer" {
            assert!(
                stacked[i + 1].starts_with(" => __hrtimer_run_queues+0x"),
                "{l}"
            );
        }
    }
}

/// `args` fail with exit status 2 and exactly `want` on stderr, one line.
fn refused(args: &[&str], want: &str) {
    let out = vmtrace(args);
    assert_eq!(out.status.code(), Some(2), "{args:?}");
    assert_eq!(stderr(&out), format!("vmtrace: {want}\n"), "{args:?}");
    assert_eq!(stdout(&out), "", "{args:?}");
}

#[test]
fn what_cannot_be_filtered_or_shown_is_refused_in_one_line() {
    let r = recorded();
    let (full, bare) = (s(&r.full), s(&r.bare));
    refused(
        &["script", full, "-F", "func,time,nope"],
        "invalid value 'nope' for '--fields <FIELD>' [possible values: comm, pid, tid, cpu, \
         time, func, caller, args, retval, stack] (see vmtrace --help)",
    );
    refused(
        &["script", bare, "-F", "cpu,args"],
        &format!(
            "-F args: {bare} has no arguments (recorded without --args); drop args from -F, or \
             record with --args"
        ),
    );
    refused(
        &["script", bare, "-F", "tid"],
        &format!(
            "-F tid: {bare} names no guest task (its kernel has no BTF); drop tid from -F, or \
             record from a kernel with BTF (CONFIG_DEBUG_INFO_BTF=y)"
        ),
    );
    for cmd in ["report", "script"] {
        let out = vmtrace(&[cmd, bare, "--comm", "x", "--tid", "3"]);
        assert_eq!(out.status.code(), Some(2));
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.starts_with(&format!(
                "vmtrace: --comm, --tid: {bare} names no guest task ("
            )),
            "{err}"
        );
        assert!(
            err.ends_with("; filter it with --sym, or record it again from a kernel with BTF, whose events name their tasks\n"),
            "{err}"
        );
        refused(
            &[cmd, full, "--sym", "!hrtimer_wakeup"],
            "--sym '!hrtimer_wakeup' only removes functions; add what to show, e.g. --sym \
             '*,!hrtimer_wakeup'",
        );
        let out = vmtrace(&[cmd, full, "--comm", "[a"]);
        assert_eq!(out.status.code(), Some(2));
        assert!(stderr(&out).starts_with("vmtrace: --comm: the comm glob \"[a\" is not valid"));
        assert_eq!(stderr(&out).lines().count(), 1);
    }
    // A trace without tasks still filters by function, exactly.
    let lines = {
        let out = vmtrace(&[
            "script",
            bare,
            "--sym",
            "hrtimer_interrupt",
            "-F",
            "cpu,func",
        ]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        stdout(&out)
    };
    let n = lines
        .lines()
        .filter(|l| *l == "[000] hrtimer_interrupt")
        .count() as u64;
    assert_eq!(n, mini_expected("hrtimer_interrupt", ITERS));
}
