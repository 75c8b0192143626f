//! Guest tasks read safely and within bounds under `vmtrace attach` (issue
//! 34, item 10), on the workload guest in real QEMU/TCG:
//!
//! - tasks are read through the kernel's own page tables, not those of the
//!   process some vCPU ran at the attach: that process exits mid-trace (its
//!   tables freed and, with `init_on_free=1`, zeroed at once) and `--comm`
//!   still names the worker's calls;
//! - a guest renaming a thread in a loop adds no task to vmtrace's table
//!   when `--comm` rejects every name, and no more than the events stored
//!   under `--max-events` otherwise.
//!
//! One QEMU at a time; no test asserts a time.

mod common;

use common::attach::*;
use common::qemu::*;
use common::{s, scratch_in};

/// getpid's function, named by one of its aliases.
const GETPID: [&str; 2] = ["__do_sys_getpid", "__x64_sys_getpid"];

/// Attach tracing getpid in exitless mode with `args`, JSON report.
fn attach(guest: &QemuGuest, bz: &str, args: &[&str]) -> Attach {
    let base = [
        "--kernel",
        bz,
        "--mode",
        "exitless",
        "--format",
        "json",
        "--trace",
        "__x64_sys_getpid",
    ];
    Attach::start(guest.qmp_socket(), &[&base[..], args].concat()).attached()
}

fn detach(a: Attach) -> Ended {
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    e
}

/// One vCPU, on which a child of the worker (`spawn`, named `wl-child`)
/// runs getpid in a loop while vmtrace attaches: that vCPU's CR3 is the
/// child's, and the child exits mid-trace. The worker's calls after it are
/// kept by `--pid` (in the guest) and `--comm wl-worker` (by the host, from
/// the comm it reads): through the child's freed page tables the comm read
/// fails, and every call was rejected.
#[test]
fn comm_still_matches_after_the_process_seen_at_the_attach_exits() {
    let (bz, _) = common::linux_61();
    let guest = QemuGuest::boot(QemuOpts {
        cpus: 1,
        append: "init_on_free=1".into(),
        ..QemuOpts::linux()
    });
    let w = guest.wait_ready().unwrap();
    let worker = w.worker.to_string();
    // Long enough to outlast the attach (a few seconds here).
    let spins = 3_000_000;
    guest.send_line(&format!("spawn {spins}"));
    let a = attach(&guest, s(&bz), &["--pid", &worker, "--comm", "wl-worker"]);
    // The child was still running when vmtrace attached.
    let console = guest.console();
    assert!(
        !console.contains("workload: spawned"),
        "the child exited before the attach: make it spin longer"
    );
    guest
        .wait_for(&format!("workload: spawned {spins} "), COMMAND_TIMEOUT)
        .unwrap();
    guest.go("getpid", 250).unwrap();
    let e = detach(a);
    let v = e.json();
    assert_eq!(count_of(&e.counts(), &GETPID), 250, "{v}");
    let tasks = v["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 1, "{v}");
    assert_eq!(tasks[0]["comm"], "wl-worker", "{v}");
    assert_eq!(tasks[0]["pid"].as_u64(), Some(u64::from(w.worker)), "{v}");
}

/// The worker renames itself N times, one getpid under each name. With a
/// `--comm` no name matches, vmtrace's task table (what the data file
/// saves) stays empty: a rejected task is never added. With one every name
/// matches and `--max-events 100`, it holds at most the 100 tasks of the
/// events stored. Before, each name was added (N tasks).
///
/// The host reads a task's comm when it drains the record (docs/tasks.md),
/// and the worker takes its own name back after the loop: a drain that
/// lags the loop (a loaded host) names the last calls `wl-worker`. So the
/// matching filter is `wl-*`, which every name the worker has matches.
#[test]
fn a_thread_renamed_in_a_loop_adds_no_task_it_does_not_store() {
    let (bz, _) = common::linux_61();
    let guest = QemuGuest::boot(QemuOpts::linux());
    let w = guest.wait_ready().unwrap();
    let dir = scratch_in("qemu-tasks-safety", "rename");
    let n = 3000u64;
    let rename = |args: &[&str], file: &std::path::Path| {
        let out = ["-o", s(file)];
        let a = attach(&guest, s(&bz), &[args, &out[..]].concat());
        guest.send_line(&format!("rename {n}"));
        guest
            .wait_for(&format!("workload: renamed {n} "), COMMAND_TIMEOUT)
            .unwrap();
        let e = detach(a);
        let trace = tracer::trace::datafile::load(file).unwrap();
        (e, trace)
    };

    let (e, trace) = rename(&["--comm", "nomatch"], &dir.join("none.data"));
    assert_eq!(e.json()["filtered"].as_u64(), Some(n), "{}", e.stdout);
    assert!(
        trace.tasks.is_empty(),
        "{:?}",
        &trace.tasks[..5.min(trace.tasks.len())]
    );

    let (e, trace) = rename(
        &["--comm", "wl-*", "--max-events", "100"],
        &dir.join("capped.data"),
    );
    let v = e.json();
    assert_eq!(count_of(&e.counts(), &GETPID), n, "{v}");
    assert_eq!(trace.events.len(), 100, "{v}");
    assert!(
        !trace.tasks.is_empty() && trace.tasks.len() <= 100,
        "{} tasks",
        trace.tasks.len()
    );
    assert!(
        trace.tasks.iter().all(|t| t.comm.starts_with("wl-")),
        "{:?}",
        trace.tasks
    );
    common::guard::assert_runs_on(&guest, w.worker);
    let _ = std::fs::remove_dir_all(&dir);
}
