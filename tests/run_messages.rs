//! What a run says on stderr (issue 22, item 10): the mapping line names
//! what was mapped (the trap-mode graph's return trap is not exitless
//! mode's trampoline) and, in exitless mode, which ring path the trampoline
//! takes; `record`'s summary counts events as the report does, returns
//! apart; a failing guest's stop line says its time and function before
//! the message; `--stats` after a signal says where each vCPU stopped.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vmtrace-msg-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn report_json(file: &Path) -> serde_json::Value {
    let o = vmtrace(&["report", s(file), "--format", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_str(&stdout(&o)).unwrap()
}

/// Before: `--mode trap --graph` said "exitless: trampoline and rings
/// mapped", and `record` wrote "(39,341 events" for 19,721 calls and
/// 19,620 returns, where the report says "events: 19,721".
#[test]
fn trap_graph_says_return_trap_and_record_counts_calls_as_the_report() {
    let k = mini_elf();
    let dir = scratch("trapgraph");
    let data = dir.join("g.data");
    let o = vmtrace(&[
        "record",
        "--kernel",
        s(&k),
        "--mode",
        "trap",
        "--graph",
        "--cmdline",
        "graph=1 iters=300",
        "--trace",
        "*",
        "--console",
        "none",
        "-o",
        s(&data),
    ]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains("exitless"), "{err}");
    assert!(
        err.contains("vmtrace: graph: return trap mapped at 0xffffffffff9bfff0, page-directory entries 508-510"),
        "{err}"
    );
    let v = report_json(&data);
    let events = v["events_stored"].as_u64().unwrap();
    let returns = v["graph"]["returns_stored"].as_u64().unwrap();
    assert!(events > 1000 && returns > 1000, "{v}");
    assert_eq!(v["events"].as_u64(), Some(events), "nothing dropped");
    let said = format!(
        "vmtrace: wrote {} ({} events and {} returns, ",
        data.display(),
        tracer::trace::report::thousands(events),
        tracer::trace::report::thousands(returns)
    );
    assert!(err.contains(&said), "expected {said:?} in {err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Exitless mode says which path its rings take: the mini guest has no
/// `preempt_schedule`, so the unlocked one; trap mode without the graph
/// maps nothing and says nothing of it.
#[test]
fn exitless_says_its_ring_path_and_trap_mode_maps_nothing() {
    let k = mini_elf();
    let base = [
        "--kernel",
        s(&k),
        "--trace",
        "hrtimer_*",
        "--console",
        "none",
    ];
    let mut args = base.to_vec();
    args.extend(["--mode", "exitless"]);
    let o = vmtrace(&args);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains(
            "vmtrace: exitless: trampoline and rings mapped at 0xffffffffff800000, page-directory entries 508-510"
        ) && err.contains("; ring reservations unlocked (cmpxchg: the kernel cannot preempt)"),
        "{err}"
    );
    let mut args = base.to_vec();
    args.extend(["--mode", "trap"]);
    let o = vmtrace(&args);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains("mapped at"), "{err}");
}

/// Before: "vmtrace: vCPU 0 triple-faulted (shutdown) at 0x... after 0.01 s"
/// (and an unsupported instruction's advice ran into "after"), with no
/// function named.
#[test]
fn a_triple_fault_says_its_time_and_function_first() {
    let k = mini_elf();
    let bad_end = elf_symbol(&k, "bad_end");
    let o = vmtrace(&[
        "--kernel",
        s(&k),
        "--cmdline",
        "end=triple-fault",
        "--trace",
        "hrtimer_*",
        "--console",
        "none",
    ]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let line = err
        .lines()
        .find(|l| l.contains("triple-faulted"))
        .unwrap_or_else(|| panic!("{err}"));
    let (head, rest) = line.split_once(": ").unwrap();
    assert_eq!(head, "vmtrace");
    assert!(rest.starts_with("after "), "{line}");
    let (when, reason) = rest.split_once(": ").unwrap();
    let (secs, place) = when
        .strip_prefix("after ")
        .unwrap()
        .split_once(" s, in ")
        .unwrap_or_else(|| panic!("{line}"));
    assert!(secs.parse::<f64>().is_ok(), "{line}");
    let off = place
        .strip_prefix("bad_end+0x")
        .unwrap_or_else(|| panic!("{line}"));
    let rip = bad_end + u64::from_str_radix(off, 16).unwrap();
    assert_eq!(
        reason,
        format!("vCPU 0 triple-faulted (shutdown) at {rip:#x}")
    );
}

/// Before: `--stats` said where each vCPU stopped only after `--timeout`.
#[test]
fn stats_after_sigterm_say_where_each_vcpu_stopped() {
    let k = mini_elf();
    let dir = scratch("stats");
    let data = dir.join("s.data");
    let child = Command::new(env!("CARGO_BIN_EXE_vmtrace"))
        .args(["record", "--kernel", s(&k), "--cpus", "2"])
        .args([
            "--cmdline",
            "mode=loop",
            "--trace",
            "*",
            "--console",
            "none",
        ])
        .args(["--stats", "--timeout", "300", "-o", s(&data)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(240);
    while std::fs::metadata(&data).map_or(0, |m| m.len()) < 256 << 10 {
        assert!(Instant::now() < deadline, "the data file did not grow");
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("vmtrace: stopped by SIGTERM after "), "{err}");
    for cpu in 0..2 {
        let line = err
            .lines()
            .find(|l| l.starts_with(&format!("  cpu{cpu} stopped at rip 0x")))
            .unwrap_or_else(|| panic!("cpu{cpu}: {err}"));
        // Every mini guest instruction is in one of its functions, and
        // vmtrace's exitless code (a vCPU recording a call) is named too.
        let name = line.split_once(" in ").map(|(_, n)| n);
        assert!(
            name.is_some_and(|n| n.contains("+0x") && !n.starts_with('+')),
            "{line}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The guest console on stderr (the default) and vmtrace's own lines never
/// share a line (issue 39): the serial device sends the console a byte at a
/// time, and vmtrace's attach and mapping lines come while the guest
/// prints. Every console line is whole (the mini guest's counts parse, for
/// both vCPUs), and every vmtrace line starts its own.
#[test]
fn console_lines_and_vmtrace_lines_never_share_a_line() {
    let k = mini_elf();
    let o = vmtrace(&[
        "--kernel",
        s(&k),
        "--cpus",
        "2",
        "--trace",
        "hrtimer_*",
        "--mode",
        "exitless",
    ]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("\nvmtrace: attached") || err.starts_with("vmtrace: attached"));
    for line in err.lines() {
        let theirs = line.contains("mini:");
        let ours = line.contains("vmtrace: ");
        assert!(
            !ours || (!theirs && line.starts_with("vmtrace: ")),
            "a shared line: {line:?}\n{err}"
        );
    }
    let (counts, done) = parse_mini_console(&err);
    assert_eq!(done, vec![0, 1], "{err}");
    for cpu in 0..2 {
        for f in MINI_FUNCS.iter().filter(|f| f.starts_with("hrtimer_")) {
            assert!(counts.contains_key(&(cpu, f.to_string())), "{f} {err}");
        }
    }
}

/// A run without `-o` saves nothing, as `perf trace` (issue 39, item 4):
/// where a `vmtrace.data` is beside it, the run says it was not saved and
/// that file is an earlier run's (and when it was written), so that a
/// `vmtrace report` after it is no surprise; with `-o`, or with no data
/// file there, it says nothing of the kind.
#[test]
fn a_run_that_saves_nothing_says_the_data_file_is_an_earlier_runs() {
    let k = mini_elf();
    let dir = scratch("unsaved");
    let run = [
        "--kernel",
        s(&k),
        "--trace",
        "hrtimer_*",
        "--console",
        "none",
    ];
    let o = vmtrace_in(&dir, &run);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("not saved"), "{}", stderr(&o));
    assert!(!dir.join("vmtrace.data").exists());
    let mut record = vec!["record"];
    record.extend(run);
    let o = vmtrace_in(&dir, &record);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = vmtrace_in(&dir, &run);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with(
            "vmtrace: this run's trace was not saved (-o FILE saves it, as `vmtrace record` does); \
             vmtrace.data here is an earlier run's, written 20"
        ) && (last.ends_with(" UTC, just now") || last.ends_with(" s ago")),
        "{err}"
    );
    // `report` on a terminal (script(1) gives it one) says first which file
    // it reads, of which kernel, when it was written and by which command
    // line; off a terminal, nothing (stderr stays the report's errors
    // alone).
    let on_tty = Command::new("script")
        .args([
            "-qec",
            &format!("{} report", env!("CARGO_BIN_EXE_vmtrace")),
            "/dev/null",
        ])
        .current_dir(&dir)
        .stdin(Stdio::null())
        .output()
        .expect("script(1), util-linux's");
    let text = String::from_utf8_lossy(&on_tty.stdout);
    let first = text.lines().next().unwrap_or_default();
    assert!(
        first.starts_with(&format!(
            "vmtrace: reading vmtrace.data: a trace of {}, written 20",
            s(&k)
        )),
        "{text}"
    );
    // ... and by which command line (the data file keeps it).
    let by = format!(
        "; command line: {} record --kernel {} --trace 'hrtimer_*' --console none",
        env!("CARGO_BIN_EXE_vmtrace"),
        s(&k)
    );
    assert!(first.trim_end().ends_with(&by), "{text}");
    let off_tty = vmtrace_in(&dir, &["report"]);
    assert!(off_tty.status.success());
    assert_eq!(stderr(&off_tty), "");
    let mut saved = run.to_vec();
    saved.extend(["-o", "run.data"]);
    let o = vmtrace_in(&dir, &saved);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("not saved"), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Tracing one of the module loader's notifier functions by direct entry
/// displaces the ftrace site of the own VMM's trap there (docs/attach.md,
/// modules in vmtrace's own VMM): with no `:mod:` glob waiting (one that
/// waits is refused: tests/bad_input.rs), the run goes on without
/// following the guest's modules, said in one line before the boot.
/// (`--timeout 1`: nothing of the boot is needed.)
#[test]
fn the_loaders_trap_displaced_leaves_the_modules_unfollowed_said_once() {
    let Some((bz, vmlinux)) = linux_612() else {
        return;
    };
    for name in [
        "blocking_notifier_call_chain",
        "blocking_notifier_call_chain_robust",
    ] {
        let trace = format!("hrtimer_run_queues,{name}");
        let o = vmtrace(&[
            "--kernel",
            s(&bz),
            "--vmlinux",
            s(&vmlinux),
            "--trace",
            &trace,
            "--entry",
            "direct",
            "--mode",
            "trap",
            "--mem",
            "128",
            "--timeout",
            "1",
            "--console",
            "none",
        ]);
        let err = stderr(&o);
        let line = format!(
            "vmtrace: the functions of the modules the guest loads are not traced (`{name}` is \
             traced by a direct entry, which displaces the ftrace site where vmtrace traps the \
             module loader)\n"
        );
        assert_eq!(err.matches(&line).count(), 1, "{err}");
        // Not refused: the run went on, its kernel's functions traced.
        assert!(matches!(o.status.code(), Some(0) | Some(1)), "{err}");
        assert!(!err.contains("error:"), "{err}");
    }
}
