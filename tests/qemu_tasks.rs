//! The guest task of each call under `vmtrace attach` (real QEMU/TCG, the
//! workload guest of tests/common/qemu.rs): the worker process, whose pid
//! the guest prints, makes a system call exactly N times; vmtrace names
//! those N calls by the worker's pid, tgid and comm (`wl-worker`), and
//! `--pid` and `--comm` keep exactly the calls they name, the others counted
//! as rejected, in exitless mode (the pid compared by vmtrace's code in the
//! guest) and in trap mode (through gdbstub breakpoints).

mod common;

use common::attach::*;
use common::qemu::*;
use common::s;

/// getpid's function, by either of its names (they share an address).
const GETPID: [&str; 2] = ["__do_sys_getpid", "__x64_sys_getpid"];
/// The workload's worker's comm (guest/linux/workload.c).
const WORKER: &str = "wl-worker";

/// Attach with `args`, run `go getpid n`, detach: the report's JSON.
fn getpids(guest: &QemuGuest, bz: &str, args: &[&str], n: u64) -> serde_json::Value {
    let base = [
        "--kernel",
        bz,
        "--format",
        "json",
        "--trace",
        "__x64_sys_getpid",
    ];
    let mut a = Attach::start(guest.qmp_socket(), &[&base[..], args].concat());
    let line = a.wait_line("vmtrace: attached to QEMU");
    let mode = if args.contains(&"trap") {
        "trap mode"
    } else {
        "exitless"
    };
    assert!(line.contains(mode), "{line}");
    guest.go("getpid", n).unwrap();
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    let v = e.json();
    assert_eq!(v["dropped"], 0, "{v}");
    v
}

/// The report's count of getpid (0 when no call was kept).
fn count(v: &serde_json::Value) -> u64 {
    v["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| GETPID.contains(&f["name"].as_str().unwrap()))
        .map_or(0, |f| f["count"].as_u64().unwrap())
}

/// The one task the report names, with its calls.
fn only_task(v: &serde_json::Value) -> (u64, u64, String, u64) {
    let tasks = v["tasks"]
        .as_array()
        .unwrap_or_else(|| panic!("no tasks: {v}"));
    assert_eq!(tasks.len(), 1, "{v}");
    let t = &tasks[0];
    (
        t["pid"].as_u64().unwrap(),
        t["tgid"].as_u64().unwrap(),
        t["comm"].as_str().unwrap().to_string(),
        t["count"].as_u64().unwrap(),
    )
}

#[test]
fn attach_names_the_worker_and_filters_by_pid_and_comm() {
    let (bz, _) = common::linux_61();
    let guest = QemuGuest::boot(QemuOpts::linux());
    let w = guest.wait_ready().unwrap();
    let worker = u64::from(w.worker);
    let pid = w.worker.to_string();

    // Exitless (auto, under QEMU): every call the worker's, by its name.
    let v = getpids(&guest, s(&bz), &[], 300);
    assert_eq!(v["mode"], "exitless", "{v}");
    assert_eq!(count(&v), 300, "{v}");
    assert_eq!(only_task(&v), (worker, worker, WORKER.into(), 300));
    assert_eq!(v["filtered"], 0, "{v}");

    // --pid of the worker keeps them all; of init (pid 1), none: the
    // trampoline rejected each, and counted it.
    let v = getpids(&guest, s(&bz), &["--pid", &pid], 120);
    assert_eq!((count(&v), &v["filtered"]), (120, &0.into()), "{v}");
    assert_eq!(only_task(&v).3, 120);
    let v = getpids(&guest, s(&bz), &["--pid", "1"], 80);
    assert_eq!((count(&v), &v["filtered"]), (0, &80.into()), "{v}");
    assert!(
        v["tasks_source"]
            .as_str()
            .unwrap()
            .ends_with("kept only pid 1"),
        "{v}"
    );

    // Trap mode, through gdbstub breakpoints: the task read at each stop.
    let trap = ["--mode", "trap"];
    let v = getpids(
        &guest,
        s(&bz),
        &[&trap[..], &["--comm", "wl-*"]].concat(),
        40,
    );
    assert_eq!(v["mode"], "trap", "{v}");
    assert_eq!(only_task(&v), (worker, worker, WORKER.into(), 40));
    let v = getpids(
        &guest,
        s(&bz),
        &[&trap[..], &["--comm", "nobody"]].concat(),
        30,
    );
    assert_eq!((count(&v), &v["filtered"]), (0, &30.into()), "{v}");
}

/// `openat` of a missing path, N times by the worker: N calls of
/// `do_sys_openat2` by the worker, each with the same user pointer as its
/// `filename` argument (named from the kernel's BTF) and each returning
/// -2, named `-ENOENT` (`--args --graph --retval`), in exitless mode (the
/// trampoline records the argument registers and RAX); `--pid` keeps only
/// the worker's.
#[test]
fn attach_records_arguments_and_errno_return_values() {
    const N: u64 = 60;
    let (bz, _) = common::linux_61();
    let guest = QemuGuest::boot(QemuOpts::linux());
    let w = guest.wait_ready().unwrap();
    let dir = common::scratch_in("qemu-tasks", "values");
    let data = dir.join("openat.data");
    let pid = w.worker.to_string();
    let args = [
        "--kernel",
        s(&bz),
        "--trace",
        "do_sys_openat2",
        "--graph",
        "--args",
        "--retval",
        "--pid",
        &pid,
        "-o",
        s(&data),
    ];
    let mut a = Attach::start(guest.qmp_socket(), &args);
    let line = a.wait_line("vmtrace: attached to QEMU");
    assert!(line.contains("exitless"), "{line}");
    guest.go("openat", N).unwrap();
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    let script = std::process::Command::new(env!("CARGO_BIN_EXE_vmtrace"))
        .args(["script", s(&data)])
        .output()
        .unwrap();
    assert!(script.status.success());
    let text = String::from_utf8_lossy(&script.stdout);
    let me = format!("{WORKER}-{pid}");
    let (mut calls, mut returns) = (Vec::new(), 0);
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        assert!(l.trim_start().starts_with(&me), "another task: {l}");
        if let Some(rest) = l.split("do_sys_openat2(").nth(1) {
            let filename = rest
                .split(", ")
                .find_map(|a| a.strip_prefix("filename=0x"))
                .unwrap_or_else(|| panic!("no filename argument: {l}"));
            assert!(rest.starts_with("dfd=-100, "), "AT_FDCWD: {l}");
            calls.push(filename.to_string());
        } else {
            assert!(l.ends_with("ret=-2 (-ENOENT)"), "{l}");
            returns += 1;
        }
    }
    assert_eq!((calls.len() as u64, returns), (N, N), "{text}");
    assert!(calls.iter().all(|f| f == &calls[0]), "one path: {calls:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
