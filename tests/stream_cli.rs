//! The data file is written while the guest runs: it grows during the run
//! while vmtrace's memory does not, counts stay exact; `--overwrite` keeps
//! exactly the newest events; a run killed with SIGKILL leaves a file that
//! `report` reads up to its last complete block, and SIGTERM a complete one.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vmtrace-stream-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `vmtrace record` on the mini guest, started, not waited for.
fn spawn_record(dir: &Path, args: &[&str]) -> Child {
    let kernel = mini_elf();
    Command::new(env!("CARGO_BIN_EXE_vmtrace"))
        .args(["record", "--kernel", kernel.to_str().unwrap()])
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run vmtrace")
}

/// A process's resident set, bytes (None once it is gone).
fn rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kb * 1024)
}

fn size(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

fn report_json(file: &Path) -> serde_json::Value {
    let o = vmtrace(&["report", file.to_str().unwrap(), "--format", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_str(&stdout(&o)).unwrap()
}

/// The functions of `script` lines, in order, of one vCPU.
fn script_funcs(file: &Path, cpu: u32) -> Vec<String> {
    let o = vmtrace(&["script", file.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let tag = format!("[{cpu:03}]");
    stdout(&o)
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains(&tag))
        .map(|l| {
            // "  vcpu0-1     [000]  1.234567: func <-caller"
            let after = l.split_once(": ").expect("a script line").1;
            after.split(" <-").next().unwrap().to_string()
        })
        .collect()
}

#[test]
fn a_trace_larger_than_the_buffer_streams_to_disk_with_memory_bounded() {
    let dir = scratch("bounded");
    let data = dir.join("big.data");
    let console = dir.join("console.log");
    // About a million events (~32 MB of records) through a 256 KiB buffer.
    let iters = 60_000u64;
    let cmdline = format!("iters={iters}");
    let mut child = spawn_record(
        &dir,
        &[
            "--cpus",
            "2",
            "--cmdline",
            &cmdline,
            "--trace",
            "*",
            "--buffer",
            "256K",
            "--console",
            console.to_str().unwrap(),
            "-o",
            data.to_str().unwrap(),
        ],
    );
    let pid = child.id();
    // Sample the file and the process while it runs.
    let mut sizes = Vec::new();
    let mut rss_from: Option<u64> = None;
    let mut rss_max = 0u64;
    let mut size_at_baseline = 0;
    let deadline = Instant::now() + Duration::from_secs(600);
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        let s = size(&data);
        if let Some(r) = rss(pid) {
            // Baseline once events flow (the guest's memory is touched and
            // every buffer allocated by then).
            if s > 2 << 20 && rss_from.is_none() {
                rss_from = Some(r);
                size_at_baseline = s;
            }
            if rss_from.is_some() {
                rss_max = rss_max.max(r);
            }
        }
        if sizes.last() != Some(&s) {
            sizes.push(s);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    let final_size = size(&data);
    // Written as it ran: the file grew in many steps before the end.
    assert!(
        sizes.len() >= 5,
        "the file grew only at the end: sizes {sizes:?}"
    );
    let grown = final_size - size_at_baseline;
    let rss_grown = rss_max - rss_from.expect("events flowed while the run was watched");
    assert!(
        grown > 16 << 20,
        "only {grown} bytes written after the baseline"
    );
    // Memory follows the buffer, not the trace: far less than what was written.
    assert!(
        rss_grown < 8 << 20,
        "RSS grew {rss_grown} bytes while {grown} bytes went to the file"
    );
    // Counts exact, and every call stored or counted as lost.
    let v = report_json(&data);
    let text = std::fs::read_to_string(&console).unwrap();
    let (counts, done) = parse_mini_console(&text);
    assert_eq!(done.len(), 2, "{text}");
    // The workload's functions, as the guest counted them itself.
    for ((cpu, func), n) in &counts {
        let f = v["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == func.as_str())
            .unwrap_or_else(|| panic!("{func} not traced"));
        assert_eq!(f["per_cpu"][cpu.to_string().as_str()].as_u64(), Some(*n));
    }
    let total = v["events"].as_u64().unwrap();
    let guest_total: u64 = counts.values().sum();
    assert!(total >= guest_total && guest_total > 800_000, "{total}");
    let stored = v["events_stored"].as_u64().unwrap();
    let dropped = v["dropped"].as_u64().unwrap();
    assert_eq!(stored + dropped, total);
    let lost: u64 = v["lost"]
        .as_array()
        .map_or(0, |a| a.iter().map(|x| x.as_u64().unwrap()).sum());
    assert_eq!(lost, dropped, "only the writer loses events here");
    if dropped > 0 {
        // Never silently: the run said so.
        assert!(err.contains("counted only"), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn overwrite_keeps_exactly_the_newest_events() {
    let dir = scratch("overwrite");
    let full = dir.join("full.data");
    let ring = dir.join("ring.data");
    let args = |out: &Path, extra: &[&str]| {
        let mut a = vec![
            "--cmdline".to_string(),
            "iters=3000".into(),
            "--trace".into(),
            "*".into(),
            "--console".into(),
            "none".into(),
            "-o".into(),
            out.to_str().unwrap().into(),
        ];
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    for (out, extra) in [(&full, vec![]), (&ring, vec!["--overwrite", "32K"])] {
        let a = args(out, &extra);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let o = spawn_record(&dir, &a).wait_with_output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let all = script_funcs(&full, 0);
    let kept = script_funcs(&ring, 0);
    // 32 KiB of 32-byte records: the newest 1,024 calls, in order.
    assert_eq!(kept.len(), 1024);
    assert!(all.len() > 10_000, "{}", all.len());
    assert_eq!(kept[..], all[all.len() - 1024..]);
    // Counts exact all the same; the rest said as overwritten.
    let (vf, vr) = (report_json(&full), report_json(&ring));
    assert_eq!(vr["events"], vf["events"]);
    assert_eq!(vr["events_stored"].as_u64(), Some(1024));
    assert_eq!(
        vr["dropped"].as_u64().unwrap(),
        vf["events"].as_u64().unwrap() - 1024
    );
    assert_eq!(vr["overwrite"].as_bool(), Some(true));
    // Their cause, counted as each was pushed out; the full run's none.
    assert_eq!(vr["drops"]["overwritten"], vr["dropped"], "{}", vr["drops"]);
    assert_eq!(vr["drops"]["over_budget"], 0);
    assert!(vf.get("drops").is_none(), "{}", vf["drops"]);
    let o = vmtrace(&["report", ring.to_str().unwrap()]);
    assert!(
        stdout(&o).contains("the oldest, overwritten"),
        "{}",
        stdout(&o)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `record` of the endless workload, until the file holds `bytes`.
fn record_until(dir: &Path, data: &Path, bytes: u64) -> Child {
    let child = spawn_record(
        dir,
        &[
            "--cmdline",
            "mode=loop",
            "--trace",
            "*",
            "--console",
            "none",
            "--timeout",
            "300",
            "-o",
            data.to_str().unwrap(),
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(240);
    while size(data) < bytes {
        assert!(Instant::now() < deadline, "the data file did not grow");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

#[test]
fn sigkill_leaves_a_file_read_up_to_its_last_complete_block() {
    let dir = scratch("kill");
    let data = dir.join("killed.data");
    let mut child = record_until(&dir, &data, 1 << 20);
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let v = report_json(&data);
    assert_eq!(v["incomplete"].as_bool(), Some(true), "{v}");
    let events = v["events"].as_u64().unwrap();
    assert!(events > 1000, "{v}");
    // Counts are those of the stored events: whole blocks only.
    assert_eq!(v["events_stored"].as_u64(), Some(events));
    assert!(v["stop_reason"].as_str().unwrap().contains("cut short"));
    let o = vmtrace(&["report", data.to_str().unwrap()]);
    assert!(stdout(&o).contains("# incomplete:"), "{}", stdout(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigterm_leaves_a_complete_file() {
    let dir = scratch("term");
    let data = dir.join("term.data");
    let child = record_until(&dir, &data, 1 << 20);
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("vmtrace: wrote"), "{err}");
    let v = report_json(&data);
    assert_eq!(v["incomplete"], serde_json::Value::Null, "{v}");
    let events = v["events"].as_u64().unwrap();
    assert!(events > 1000);
    assert_eq!(
        v["events_stored"].as_u64().unwrap() + v["dropped"].as_u64().unwrap(),
        events
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_sizes_are_one_line_errors() {
    let kernel = mini_elf();
    let k = kernel.to_str().unwrap();
    let base = ["--kernel", k, "--trace", "hrtimer_*"];
    for (flag, value, needle) in [
        ("--buffer", "lots", "--buffer \"lots\": not a size"),
        ("--buffer", "1K", "less than"),
        ("--overwrite", "3000G", "more than 1 TiB"),
        ("--overwrite", "8", "less than 32 bytes"),
    ] {
        let mut args = base.to_vec();
        args.extend([flag, value]);
        assert_bad_input(&args, needle);
    }
    // Tracing options without --trace.
    assert_bad_input(&["--kernel", k, "--overwrite", "1M"], "--overwrite");
}
