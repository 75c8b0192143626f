//! End-to-end through the command line with the mini guest: exact counts in
//! the JSON export, the saved trace's report equal to the live one, exports
//! well-formed, and Ctrl-C restoring guest text.
//! (`record`, `report`, `script`, `list` and the output options: record_cli.rs.)

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;

fn tmp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("vmtrace-cli-{}-{name}", std::process::id()))
}

#[test]
fn json_counts_equal_what_the_guest_counted() {
    let kernel = mini_elf();
    let iters = 777u64;
    let (out, v) = run_json(&[
        "--kernel",
        kernel.to_str().unwrap(),
        "--cpus",
        "4",
        "--cmdline",
        &format!("iters={iters}"),
        "--trace",
        "hrtimer_*",
    ]);
    // The guest console is on stderr by default, the report alone on stdout.
    let (printed, done) = parse_mini_console(&stderr(&out));
    assert_eq!(done, vec![0, 1, 2, 3]);
    assert!(!stdout(&out).contains("mini:"), "{}", stdout(&out));
    assert!(stdout(&out).starts_with("# vmtrace report"));
    let funcs = v["functions"].as_array().unwrap();
    let names: Vec<&str> = funcs.iter().map(|f| f["name"].as_str().unwrap()).collect();
    // Exactly the matched functions, nothing else.
    let mut sorted = names.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        [
            "__hrtimer_run_queues",
            "hrtimer_interrupt",
            "hrtimer_start_range_ns",
            "hrtimer_try_to_cancel",
            "hrtimer_wakeup"
        ]
        .iter()
        .filter(|n| n.starts_with("hrtimer_"))
        .copied()
        .collect::<Vec<_>>()
    );
    let mut total = 0;
    for f in funcs {
        let name = f["name"].as_str().unwrap();
        let per_cpu: BTreeMap<String, u64> = serde_json::from_value(f["per_cpu"].clone()).unwrap();
        for cpu in 0..4u32 {
            assert_eq!(
                per_cpu[&cpu.to_string()],
                printed[&(cpu, name.to_string())],
                "{name} on cpu {cpu}"
            );
            total += printed[&(cpu, name.to_string())];
        }
        let callers = f["callers"].as_array().unwrap();
        if name == "hrtimer_wakeup" {
            assert_eq!(callers.len(), 1);
            assert_eq!(callers[0]["name"], "__hrtimer_run_queues");
            assert_eq!(callers[0]["count"].as_u64(), f["count"].as_u64());
        }
    }
    assert_eq!(v["events"].as_u64(), Some(total));
    assert_eq!(v["dropped"].as_u64(), Some(0));
    assert_eq!(v["sites_patched"].as_u64(), Some(4));
    assert!(
        stderr(&out).contains("4 sites restored"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn saved_trace_report_equals_live_report_and_exports_parse() {
    let kernel = mini_elf();
    let saved = tmp("saved.vmt");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "--kernel",
            kernel.to_str().unwrap(),
            "--cpus",
            "2",
            "--cmdline",
            "iters=400",
            "--trace",
            "*",
            "-g",
        ];
        args.extend_from_slice(extra);
        vmtrace(&args)
    };
    let live = run(&["-o", saved.to_str().unwrap(), "--sort", "name"]);
    assert!(live.status.success(), "{}", stderr(&live));
    // stdout is the report alone: the guest console is on stderr.
    let live_report = stdout(&live);
    assert!(live_report.starts_with("# vmtrace report"), "{live_report}");
    assert!(
        stderr(&live).contains("mini: cpu 1 done"),
        "{}",
        stderr(&live)
    );
    let offline = vmtrace(&[
        "report",
        "-i",
        saved.to_str().unwrap(),
        "-g",
        "--sort",
        "name",
    ]);
    assert!(offline.status.success(), "{}", stderr(&offline));
    assert_eq!(stdout(&offline), live_report);

    // The same trace as CSV (one row per event) and Chrome JSON (one instant per event).
    let events: u64 = live_report
        .lines()
        .find(|l| l.starts_with("# events:"))
        .and_then(|l| l.split_whitespace().nth(2))
        .map(|n| n.replace(',', "").parse().unwrap())
        .unwrap();
    // Convert the saved trace to `format`; the file's text.
    let convert = |format: &str, path: &std::path::Path| {
        let o = vmtrace(&[
            "report",
            "-i",
            saved.to_str().unwrap(),
            "--export",
            &format!("{format}={}", path.display()),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        // The report still goes to stdout.
        assert_eq!(
            stdout(&o),
            stdout(&vmtrace(&["report", saved.to_str().unwrap()]))
        );
        std::fs::read_to_string(path).unwrap()
    };
    let csv = tmp("t.csv");
    let text = convert("csv", &csv);
    assert_eq!(text.lines().count() as u64, events + 1);
    // The mini guest has BTF: each event's task, last.
    assert!(text.starts_with("ts_ns,cpu,function,addr,parent,caller,pid,tgid,comm\n"));
    let chrome = tmp("t.json");
    let text = convert("chrome", &chrome);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let instants = v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "i")
        .count() as u64;
    assert_eq!(instants, events);
    for p in [&saved, &csv, &chrome] {
        let _ = std::fs::remove_file(p);
    }
}

#[test]
fn bad_trace_files_are_one_line_errors() {
    let junk = tmp("junk.vmt");
    std::fs::write(&junk, b"not a trace at all").unwrap();
    let o = vmtrace(&["report", "-i", junk.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(stderr(&o).trim_end().lines().count(), 1);
    let o = vmtrace(&["report", "-i", "/nonexistent.vmt"]);
    assert_eq!(o.status.code(), Some(2));
    let _ = std::fs::remove_file(junk);
}

#[test]
fn ctrl_c_stops_the_guest_and_restores_every_site() {
    let kernel = mini_elf();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_vmtrace"))
        .args([
            "--kernel",
            kernel.to_str().unwrap(),
            "--cpus",
            "2",
            "--cmdline",
            "mode=loop",
            "--trace",
            "hrtimer_*",
            "-q",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: kill with a valid pid and signal number.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("stopped by Ctrl-C (SIGINT)"), "{err}");
    assert!(err.contains("4 sites restored"), "{err}");
    assert!(
        stdout(&out).contains("hrtimer_interrupt"),
        "a report was printed"
    );
}

#[test]
fn duration_detaches_under_a_pause_and_stops() {
    let kernel = mini_elf();
    let out = vmtrace(&[
        "--kernel",
        kernel.to_str().unwrap(),
        "--cpus",
        "2",
        "--cmdline",
        "mode=loop",
        "--trace",
        "hrtimer_*",
        "--duration",
        "0.5",
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("vmtrace: stopped: --duration reached ("),
        "{err}"
    );
    assert!(err.contains("4 sites restored"), "{err}");
}

/// Run vmtrace with stdout and stderr on a pseudo-terminal (util-linux `script`).
fn on_a_terminal(args: &str) -> String {
    let cmd = format!("{} {args}", env!("CARGO_BIN_EXE_vmtrace"));
    let out = std::process::Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .output()
        .expect("script runs");
    String::from_utf8_lossy(&out.stdout).replace('\r', "\n")
}

#[test]
fn status_line_on_a_terminal_unless_quiet() {
    let k = mini_elf();
    let args = format!(
        "--kernel {} --cmdline mode=loop --trace 'hrtimer_*' --duration 2.5 --console /dev/null",
        k.display()
    );
    let shown = on_a_terminal(&args);
    let status: Vec<&str> = shown
        .lines()
        .filter(|l| l.contains("vmtrace:") && l.contains(" stored ") && l.contains(" dropped "))
        .collect();
    assert!(!status.is_empty(), "a live status line:\n{shown}");
    // Thousands separators, and the time --duration leaves.
    assert!(
        status
            .iter()
            .any(|l| l.contains(',') && l.ends_with(" s left")),
        "{status:?}"
    );
    let quiet = on_a_terminal(&format!("{args} -q"));
    assert!(
        !quiet
            .lines()
            .any(|l| l.contains("vmtrace:") && l.contains(" stored ")),
        "-q hides it:\n{quiet}"
    );
}

/// KVM's count of the instructions its emulator ran: in `--stats` (per
/// vCPU and total, labelled as such) and, the same numbers, in the JSON
/// report's `guest_instructions_emulated`; absent where KVM does not count.
#[test]
fn instructions_kvm_emulated_in_stats_and_json() {
    let kernel = mini_elf();
    let (out, v) = run_json(&[
        "--kernel",
        kernel.to_str().unwrap(),
        "--cpus",
        "2",
        "--cmdline",
        "iters=300",
        "--console",
        "none",
        "--trace",
        "hrtimer_*",
        "--stats",
    ]);
    let err = stderr(&out);
    let row = err
        .lines()
        .find(|l| l.trim_start().starts_with("instructions emulated "));
    let Some(row) = row else {
        assert!(err.contains("KVM's own counts: not available"), "{err}");
        assert!(v.get("guest_instructions_emulated").is_none(), "{v}");
        println!("skipped: this KVM keeps no binary statistics");
        return;
    };
    assert!(
        err.contains("counted by KVM's instruction emulator"),
        "labelled: {err}"
    );
    assert!(err.contains("\nrun: "), "{err}");
    let printed: Vec<u64> = row
        .split_whitespace()
        .skip(2)
        .map(|n| n.parse().unwrap())
        .collect();
    let g = &v["guest_instructions_emulated"];
    let per_cpu = [
        g["per_cpu"]["0"].as_u64().unwrap(),
        g["per_cpu"]["1"].as_u64().unwrap(),
    ];
    assert_eq!(g["per_cpu"].as_object().unwrap().len(), 2, "{g}");
    assert_eq!(g["total"].as_u64(), Some(per_cpu[0] + per_cpu[1]), "{g}");
    assert_eq!(
        printed,
        [per_cpu[0], per_cpu[1], per_cpu[0] + per_cpu[1]],
        "{err}"
    );
    if std::path::Path::new("/sys/module/kvm_pvm").exists() {
        // Every guest instruction: 300 iterations of the workload at least.
        assert!(per_cpu.iter().all(|&n| n > 300 * 20), "{g}");
    }
}
