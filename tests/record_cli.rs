//! The perf/trace-cmd shape of the command line, end to end with the mini
//! guest: `vmtrace record` writes vmtrace.data (the previous one kept as
//! vmtrace.data.old) and prints no report; `report`, `script` read it
//! (positional FILE, `-i FILE`, or vmtrace.data here); `list` shows what
//! can be traced; one run gives the data file and any `--export`; stdout is
//! vmtrace's own (the guest console goes to stderr); a closed stdout ends
//! quietly with the data file complete. Counts are checked exactly against
//! what the mini guest's workload calls (`mini_expected`).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;

use common::*;

/// A fresh directory for one test: the cwd of its runs.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vmtrace-record-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn ok(o: &Output, what: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(0), "{what}: {err}");
    assert!(!err.contains("panicked"), "{what}: {err}");
}

/// The functions traced by [`TRACE`], with the mini guest's workload.
const TRACE: &str = "hrtimer_*,__hrtimer_run_queues";
const TRACED: [&str; 5] = [
    "__hrtimer_run_queues",
    "hrtimer_interrupt",
    "hrtimer_start_range_ns",
    "hrtimer_try_to_cancel",
    "hrtimer_wakeup",
];

/// `record` on the mini guest in `dir` with `extra` options.
fn record(dir: &Path, cpus: u32, iters: u64, extra: &[&str]) -> Output {
    let kernel = mini_elf();
    let cpus = cpus.to_string();
    let cmdline = format!("iters={iters}");
    let mut args = vec![
        "record",
        "--kernel",
        kernel.to_str().unwrap(),
        "--cpus",
        &cpus,
        "--cmdline",
        &cmdline,
        "--trace",
        TRACE,
        "--console",
        "none",
    ];
    args.extend_from_slice(extra);
    let o = vmtrace_in(dir, &args);
    ok(&o, "record");
    o
}

/// function -> per-vCPU counts of a JSON report.
fn per_cpu(v: &serde_json::Value) -> BTreeMap<String, BTreeMap<String, u64>> {
    v["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let name = f["name"].as_str().unwrap().to_string();
            (name, serde_json::from_value(f["per_cpu"].clone()).unwrap())
        })
        .collect()
}

/// Every traced function's count on each of `cpus` vCPUs is what the
/// workload calls in `iters` iterations; the total is their sum.
fn assert_exact(v: &serde_json::Value, cpus: u32, iters: u64) {
    let counts = per_cpu(v);
    assert_eq!(counts.keys().collect::<Vec<_>>(), TRACED, "{v}");
    let mut total = 0;
    for (name, per) in &counts {
        for cpu in 0..cpus {
            let want = mini_expected(name, iters);
            assert_eq!(per[&cpu.to_string()], want, "{name} on vCPU {cpu}");
            total += want;
        }
    }
    assert_eq!(v["events"].as_u64(), Some(total));
    assert_eq!(v["dropped"].as_u64(), Some(0));
}

/// Calls of [`TRACED`] per vCPU in `iters` iterations.
fn calls(iters: u64) -> u64 {
    TRACED.iter().map(|f| mini_expected(f, iters)).sum()
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_str(&stdout(o)).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

#[test]
fn record_then_report_script_and_list() {
    let dir = scratch("default");
    let o = record(&dir, 2, 300, &[]);
    // No report: stdout is empty; the console went nowhere (--console none).
    assert_eq!(stdout(&o), "");
    let err = stderr(&o);
    assert!(!err.contains("mini:"), "{err}");
    let last = err.trim_end().lines().last().unwrap();
    let events = 2 * calls(300);
    assert!(
        last.starts_with(&format!(
            "vmtrace: wrote vmtrace.data ({} events, ",
            thousands(events)
        )) && last.ends_with("B); read it with: vmtrace report"),
        "{err}"
    );
    assert!(dir.join("vmtrace.data").is_file());
    assert!(!dir.join("vmtrace.data.old").exists(), "nothing to keep");

    // report: vmtrace.data here, FILE or -i FILE: the same.
    let text = vmtrace_in(&dir, &["report"]);
    ok(&text, "report");
    assert!(stdout(&text).starts_with("# vmtrace report"));
    assert_eq!(stderr(&text), "");
    for args in [
        &["report", "vmtrace.data"][..],
        &["report", "-i", "vmtrace.data"],
    ] {
        let o = vmtrace_in(&dir, args);
        ok(&o, "report FILE");
        assert_eq!(stdout(&o), stdout(&text), "{args:?}");
    }
    let o = vmtrace_in(&dir, &["report", "--format", "json"]);
    ok(&o, "report --format json");
    assert_exact(&json(&o), 2, 300);

    // --cpu cuts every format to those vCPUs.
    let o = vmtrace_in(&dir, &["report", "--format", "json", "--cpu", "1"]);
    ok(&o, "report --cpu 1");
    let v = json(&o);
    for (name, per) in per_cpu(&v) {
        assert_eq!(per["0"], 0, "{name}");
        assert_eq!(per["1"], mini_expected(&name, 300), "{name}");
    }
    assert_eq!(v["events"].as_u64(), Some(calls(300)));

    // script: one line per event, ftrace's `function <-caller`.
    let o = vmtrace_in(&dir, &["script"]);
    ok(&o, "script");
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(lines.len() as u64, events, "{out}");
    assert!(lines
        .iter()
        .any(|l| l.ends_with("hrtimer_wakeup <-__hrtimer_run_queues")));
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.contains(" hrtimer_try_to_cancel <-do_idle"))
            .count() as u64,
        2 * mini_expected("hrtimer_try_to_cancel", 300)
    );
    let o = vmtrace_in(&dir, &["script", "-i", "vmtrace.data", "--cpu", "0"]);
    ok(&o, "script --cpu 0");
    let lines: Vec<String> = stdout(&o)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(str::to_string)
        .collect();
    assert_eq!(lines.len() as u64, calls(300));
    assert!(lines.iter().all(|l| l.contains("[000]")), "{lines:?}");

    // list: what --trace would select, without booting.
    let kernel = mini_elf();
    let o = vmtrace(&["list", "--kernel", kernel.to_str().unwrap(), "hrtimer_*"]);
    ok(&o, "list");
    assert_eq!(
        stdout(&o),
        "hrtimer_interrupt\nhrtimer_start_range_ns\nhrtimer_try_to_cancel\nhrtimer_wakeup\n"
    );
    assert_eq!(
        stderr(&o),
        format!(
            "vmtrace: 4 functions: 4 traceable, 0 init-only, 0 without an ftrace site \
             (symbols: {} (the kernel itself))\n",
            kernel.display()
        )
    );
    let o = vmtrace(&["list", "--vmlinux", kernel.to_str().unwrap()]);
    ok(&o, "list --vmlinux");
    let all = stdout(&o);
    for f in MINI_FUNCS {
        assert!(all.lines().any(|l| l == f), "{f} in {all}");
    }
    let o = vmtrace(&[
        "list",
        "--kernel",
        kernel.to_str().unwrap(),
        "hrtimer_nope*",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
    assert!(stderr(&o).contains("matches no function"), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_second_record_keeps_the_first_as_old() {
    let dir = scratch("old");
    record(&dir, 1, 100, &[]);
    let o = record(&dir, 1, 200, &[]);
    assert!(
        stderr(&o)
            .contains("; the previous one is vmtrace.data.old); read it with: vmtrace report\n"),
        "{}",
        stderr(&o)
    );
    let first = vmtrace_in(&dir, &["report", "vmtrace.data.old", "--format", "json"]);
    ok(&first, "report .old");
    assert_exact(&json(&first), 1, 100);
    let second = vmtrace_in(&dir, &["report", "--format", "json"]);
    ok(&second, "report");
    assert_exact(&json(&second), 1, 200);
    // A third: the .old is the second now; -o names the file, .old beside it.
    record(&dir, 1, 300, &[]);
    let old = vmtrace_in(&dir, &["report", "vmtrace.data.old", "--format", "json"]);
    assert_exact(&json(&old), 1, 200);
    record(&dir, 1, 10, &["-o", "mine.data"]);
    let o = record(&dir, 1, 20, &["-o", "mine.data"]);
    assert!(
        stderr(&o)
            .trim_end()
            .ends_with("read it with: vmtrace report mine.data"),
        "{}",
        stderr(&o)
    );
    let old = vmtrace_in(&dir, &["report", "mine.data.old", "--format", "json"]);
    assert_exact(&json(&old), 1, 10);
    // Never a rename of what is not a regular file: a symlink's target is
    // written, the link stays, no .old.
    std::fs::rename(dir.join("mine.data"), dir.join("target.data")).unwrap();
    std::fs::remove_file(dir.join("mine.data.old")).unwrap();
    std::os::unix::fs::symlink("target.data", dir.join("mine.data")).unwrap();
    record(&dir, 1, 30, &["-o", "mine.data"]);
    assert!(std::fs::symlink_metadata(dir.join("mine.data"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(!dir.join("mine.data.old").exists());
    let o = vmtrace_in(&dir, &["report", "target.data", "--format", "json"]);
    assert_exact(&json(&o), 1, 30);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn one_run_gives_the_data_file_and_every_export() {
    let dir = scratch("exports");
    let kernel = mini_elf();
    let args = [
        "--kernel",
        kernel.to_str().unwrap(),
        "--cpus",
        "2",
        "--cmdline",
        "iters=200",
        "--trace",
        TRACE,
        "-o",
        "t.data",
        "--export",
        "json=t.json",
        "--export",
        "csv=it's a.csv",
        "--export",
        "chrome=chrome.json",
        "--export",
        "trace.dat=trace.dat",
    ];
    let o = vmtrace_in(&dir, &args);
    ok(&o, "one-shot with exports");
    // The one-shot form still prints the report; the console is on stderr.
    assert!(stdout(&o).starts_with("# vmtrace report"), "{}", stdout(&o));
    assert!(stderr(&o).contains("mini: cpu 1 done"), "{}", stderr(&o));
    assert!(
        stderr(&o)
            .trim_end()
            .ends_with("; read it with: vmtrace report t.data"),
        "{}",
        stderr(&o)
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("t.json")).unwrap()).unwrap();
    assert_exact(&v, 2, 200);
    let events = 2 * calls(200);
    let csv = std::fs::read_to_string(dir.join("it's a.csv")).unwrap();
    assert_eq!(csv.lines().count() as u64, events + 1);
    let chrome: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("chrome.json")).unwrap()).unwrap();
    let instants = chrome["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "i")
        .count() as u64;
    assert_eq!(instants, events);
    let dat = std::fs::read(dir.join("trace.dat")).unwrap();
    assert_eq!(&dat[..10], b"\x17\x08\x44tracing");
    // The data file holds what the run saw: its JSON is the live export,
    // but for KVM's count of the instructions its emulator ran (the run's:
    // data files do not keep it).
    let offline = vmtrace_in(&dir, &["report", "t.data", "--format", "json"]);
    ok(&offline, "report t.data");
    let mut live = v.clone();
    live.as_object_mut()
        .unwrap()
        .remove("guest_instructions_emulated");
    assert_eq!(json(&offline), live);
    let argv: Vec<&str> = [env!("CARGO_BIN_EXE_vmtrace")]
        .into_iter()
        .chain(args)
        .collect();
    the_command_line_is_kept(&dir, "t.data", &argv);
    assert_eq!(v["cmdline"], serde_json::json!(argv));

    // `record` takes exports too; `report` exports what --cpu selects.
    record(&dir, 2, 50, &["--export", "json=r.json"]);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("r.json")).unwrap()).unwrap();
    assert_exact(&v, 2, 50);
    let argv = &v["cmdline"].as_array().unwrap()[1..];
    assert_eq!(argv[0], "record");
    assert_eq!(argv[argv.len() - 2..], ["--export", "json=r.json"]);
    let o = vmtrace_in(
        &dir,
        &["report", "--cpu", "0", "--export", "json=cpu0.json"],
    );
    ok(&o, "report --export");
    assert!(stdout(&o).starts_with("# vmtrace report"));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("cpu0.json")).unwrap()).unwrap();
    assert_eq!(v["events"].as_u64(), Some(calls(50)));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The data file `file` in `dir` keeps `argv`, the command line that
/// recorded it (issue 39): exactly in the JSON report; in the report's and
/// script's headers and in trace.dat's VERSION option (which `trace-cmd
/// report --version` prints) as one line that a shell reads back into
/// the same arguments.
fn the_command_line_is_kept(dir: &Path, file: &str, argv: &[&str]) {
    let o = vmtrace_in(dir, &["report", file, "--format", "json"]);
    ok(&o, "report --format json");
    assert_eq!(json(&o)["cmdline"], serde_json::json!(argv));
    let o = vmtrace_in(dir, &["report", file]);
    ok(&o, "report");
    let report = stdout(&o);
    let line = report
        .lines()
        .find_map(|l| l.strip_prefix("# cmdline:"))
        .unwrap_or_else(|| panic!("no cmdline in the header: {report}"))
        .trim_start();
    assert!(report.lines().nth(2).unwrap().starts_with("# cmdline:"));
    let sh = std::process::Command::new("sh")
        .args(["-c", &format!("printf '%s\\n' {line}")])
        .output()
        .unwrap();
    assert_eq!(stdout(&sh).lines().collect::<Vec<_>>(), argv, "{line}");
    let o = vmtrace_in(dir, &["script", file]);
    ok(&o, "script");
    let want = format!("# cmdline: {line}");
    assert!(stdout(&o).lines().any(|l| l == want), "{}", stdout(&o));
    let o = vmtrace_in(dir, &["report", file, "--export", "trace.dat=cmdline.dat"]);
    ok(&o, "report --export trace.dat");
    let tc = std::process::Command::new("trace-cmd")
        .args(["report", "--version", "-i"])
        .arg(dir.join("cmdline.dat"))
        .output()
        .expect("trace-cmd is not installed: apt-get install trace-cmd (CI's .ci/run does)");
    let version = format!("vmtrace {} (cmdline: {line})", env!("CARGO_PKG_VERSION"));
    assert!(stdout(&tc).lines().any(|l| l == version), "{}", stdout(&tc));
}

#[test]
fn stdout_is_vmtraces_own_the_console_goes_to_stderr() {
    let kernel = mini_elf();
    let base = [
        "--kernel",
        kernel.to_str().unwrap(),
        "--cpus",
        "2",
        "--cmdline",
        "iters=100",
        "--trace",
        TRACE,
    ];
    let run = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        let o = vmtrace(&args);
        ok(&o, &format!("{extra:?}"));
        o
    };
    // `vmtrace --format json ... | jq`: pure JSON.
    let o = run(&["--format", "json"]);
    assert_exact(&json(&o), 2, 100);
    let (printed, done) = parse_mini_console(&stderr(&o));
    assert_eq!(done, vec![0, 1]);
    assert_eq!(printed[&(1, "hrtimer_wakeup".to_string())], 100);
    // --console none: nowhere.
    let o = run(&["--format", "json", "--console", "none"]);
    assert_exact(&json(&o), 2, 100);
    assert!(!stderr(&o).contains("mini:"), "{}", stderr(&o));
    // --console -: on stdout, before the report (the old default).
    let o = run(&["--console", "-"]);
    let out = stdout(&o);
    let (_, done) = parse_mini_console(&out);
    assert_eq!(done, vec![0, 1], "{out}");
    let report = out.find("# vmtrace report").expect("a report");
    assert!(out[..report].contains("mini: cpu 0 done"), "{out}");
    assert!(!stderr(&o).contains("mini:"), "{}", stderr(&o));
}

#[test]
fn a_closed_stdout_ends_quietly_and_the_data_file_is_complete() {
    let dir = scratch("pipe");
    let kernel = mini_elf();
    for format in ["json", "text"] {
        let data = dir.join(format!("{format}.data"));
        let cmd = format!(
            "'{}' --kernel '{}' --cpus 2 --cmdline iters=500 --trace '{TRACE}' --format {format} \
             -o '{}' --console none | head -1 >/dev/null; echo ${{PIPESTATUS[0]}}",
            env!("CARGO_BIN_EXE_vmtrace"),
            kernel.display(),
            data.display()
        );
        let o = std::process::Command::new("bash")
            .args(["-c", &cmd])
            .output()
            .unwrap();
        let status = stdout(&o).trim().to_string();
        let err = stderr(&o);
        assert!(
            status == "0" || status == "141",
            "{format}: status {status}: {err}"
        );
        assert!(
            !err.contains("panicked")
                && !err.contains("RUST_BACKTRACE")
                && !err.contains("Broken pipe"),
            "{format}: {err}"
        );
        assert!(err.contains("vmtrace: wrote "), "{format}: {err}");
        let r = vmtrace(&["report", data.to_str().unwrap(), "--format", "json"]);
        ok(&r, "report of the piped run");
        assert_exact(&json(&r), 2, 500);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn report_and_script_without_a_file_say_how_to_get_one() {
    let dir = scratch("empty");
    for cmd in ["report", "script"] {
        let o = vmtrace_in(&dir, &[cmd]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert_eq!(
            err,
            "vmtrace: no vmtrace.data here; record one with `vmtrace record ...` or name a file\n"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `12,345`.
fn thousands(n: u64) -> String {
    tracer::trace::report::thousands(n)
}

/// Per vCPU, the function of each event line, in order: `[CPU]` then, in
/// `vmtrace script`'s lines `TS: func <-caller`, in `trace-cmd report`'s
/// `TS: function: func <-- caller`.
fn funcs_per_cpu(text: &str, after: &str) -> BTreeMap<u32, Vec<String>> {
    let mut m: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        let (Some(open), Some(close)) = (l.find('['), l.find(']')) else {
            continue;
        };
        let Ok(cpu) = l[open + 1..close].trim().parse::<u32>() else {
            continue;
        };
        let Some((_, rest)) = l.split_once(after) else {
            continue;
        };
        let name = rest.split_whitespace().next().unwrap().to_string();
        m.entry(cpu).or_default().push(name);
    }
    m
}

#[test]
fn trace_cmd_reads_the_trace_dat_with_the_events_script_prints() {
    let dir = scratch("tracecmd");
    record(&dir, 2, 300, &[]);
    let o = vmtrace_in(&dir, &["report", "--export", "trace.dat=t.dat"]);
    ok(&o, "report --export trace.dat");
    let script = vmtrace_in(&dir, &["script"]);
    ok(&script, "script");
    let tc = std::process::Command::new("trace-cmd")
        .args(["report", "-O", "parent=1", "-i"])
        .arg(dir.join("t.dat"))
        .output()
        .expect("trace-cmd is not installed: apt-get install trace-cmd (CI's .ci/run does)");
    assert!(
        tc.status.success(),
        "{}",
        String::from_utf8_lossy(&tc.stderr)
    );
    let tc_text = String::from_utf8_lossy(&tc.stdout).into_owned();
    let ours = funcs_per_cpu(&stdout(&script), ": ");
    let theirs = funcs_per_cpu(&tc_text, "function: ");
    // Two vCPUs, every event on each, the same functions in the same order.
    assert_eq!(ours.len(), 2, "{}", stdout(&script));
    for cpu in 0..2u32 {
        assert_eq!(ours[&cpu].len() as u64, calls(300), "vCPU {cpu}");
    }
    assert_eq!(theirs, ours, "trace-cmd report:\n{tc_text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The long flags of the `Tracing:` section of `vmtrace ARGS --help`.
fn tracing_flags(args: &[&str]) -> Vec<String> {
    let out = vmtrace(args);
    ok(&out, "--help");
    let help = String::from_utf8(out.stdout).unwrap();
    let section = help
        .split("\nTracing:\n")
        .nth(1)
        .expect("a Tracing section");
    // Up to the next heading (flags are indented, long help has blank lines).
    section
        .lines()
        .take_while(|l| l.is_empty() || l.starts_with(' '))
        .filter_map(|l| l.trim_start().strip_prefix("--"))
        .map(|l| l.split([' ', '[']).next().unwrap().to_string())
        .collect()
}

/// A run, `record` and `attach` take the same tracing flags (issue 33),
/// attach all but the two that only a guest vmtrace boots has: patching
/// from the first instruction, and the flight recorder.
#[test]
fn run_record_and_attach_list_the_same_tracing_flags() {
    let run = tracing_flags(&["--help"]);
    assert_eq!(tracing_flags(&["record", "--help"]), run);
    let attach = tracing_flags(&["attach", "--help"]);
    let only_run: Vec<&String> = run.iter().filter(|f| !attach.contains(f)).collect();
    assert_eq!(only_run, ["from-boot", "overwrite"], "{run:?} {attach:?}");
    for flag in [
        "trace",
        "entry",
        "ring-events",
        "mode",
        "args",
        "stack",
        "duration",
    ] {
        assert!(attach.iter().any(|f| f == flag), "--{flag}: {attach:?}");
    }
    assert!(attach.iter().all(|f| run.contains(f)), "{attach:?}");
}
