//! `-e syscalls:...` on the tracepoints' guest (Debian 6.12 under
//! QEMU/TCG with the workload): each syscall event recorded at its
//! syscall's function, `__x64_sys_NAME`, its entry (`sys_enter_*`) and its
//! return (`sys_exit_*`), in trap and exitless modes.

use super::common::attach::*;
use super::common::guard::*;
use super::common::qemu::*;
use super::common::{self, s};
use super::{check_guest_ids, check_trace_cmd_report, records, GUEST_STEP};

/// The syscall events the checks below trace.
const SYSCALL_EVENTS: &str =
    "syscalls:sys_enter_getpid,syscalls:sys_exit_getpid,syscalls:sys_enter_openat,syscalls:sys_exit_openat";
/// How many calls of each the workload makes.
const GETPIDS: usize = 5;
const OPENATS: usize = 3;
/// What the workload passes openat(2) (`AT_FDCWD` as a `long`, `O_RDONLY`)
/// and gets back (-ENOENT), as ftrace prints them.
const AT_FDCWD: &str = "0xffffffffffffff9c";
const O_RDONLY: &str = "0x00000000";
const ENOENT: &str = "0xfffffffffffffffe";
/// fork(2)'s exit too: the parent's and each child's (recorded at the
/// child's `ret_from_fork`), for `forks FORKS`.
const FORK_EXIT: &str = "syscalls:sys_exit_fork";
const FORKS: usize = 3;

/// `-e syscalls:...` in `mode` (trap or exitless), the worker's only
/// (`--comm`): exactly one `sys_enter_getpid` and one `sys_exit_getpid`
/// per getpid(2) of `go getpid`, each exit's `ret` the worker's pid as
/// the guest prints it; one of each per openat(2), their arguments and
/// return as the workload passes and gets them (the arguments, the
/// user's registers in the task's `pt_regs`, which exitless mode's code
/// copies into the record at the event); the kernel's text as found after
/// the detach. `sys_exit_fork` too, through `forks FORKS`: exactly one
/// per fork(2) in the worker, its `ret` each child's pid as the guest
/// prints them, and one in each child (its task that pid, named as it was
/// at its start, as trap mode names it: in exitless mode from the words
/// `ret_from_fork`'s code copies, whatever name the child took
/// before the drain), `ret` 0. Returns the data file.
fn syscall_events(
    guest: &QemuGuest,
    kernel: &Kernel,
    bz: &std::path::Path,
    dir: &std::path::Path,
    mode: &str,
) -> std::path::PathBuf {
    let qmp = guest.qmp_socket();
    let watch = kernel.watch(qmp);
    let before = watch.read();
    let data = dir.join(format!("syscalls-{mode}.vmtrace"));
    let events = format!("{SYSCALL_EVENTS},{FORK_EXIT}");
    let args = [
        "--kernel",
        s(bz),
        "--mode",
        mode,
        "-e",
        &events,
        "--comm",
        "wl-worker",
        "-o",
        s(&data),
    ];
    let mut a = Attach::start(qmp, &args);
    let line = a.wait_line("vmtrace: attached to QEMU");
    assert!(line.contains(mode), "{line}");
    let line = a.wait_line("syscall events recorded at");
    let said = "5 syscall events recorded at 3 syscall functions";
    assert!(line.contains(said), "{line}");
    a.wait_line("a new task's sys_exit_fork recorded at its ret_from_fork");
    guest.send_line(&format!("go getpid {GETPIDS}"));
    let line = guest
        .wait_for(&format!("workload: done getpid {GETPIDS} pid="), GUEST_STEP)
        .unwrap();
    let pid: u64 = line.rsplit('=').next().unwrap().trim().parse().unwrap();
    guest.send_line(&format!("go openat {OPENATS}"));
    guest
        .wait_for(&format!("workload: done openat {OPENATS}"), GUEST_STEP)
        .unwrap();
    guest.send_line(&format!("forks {FORKS}"));
    let line = guest
        .wait_for(&format!("workload: forked {FORKS} pids="), GUEST_STEP)
        .unwrap();
    let children = super::forked_pids(&line);
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    assert_same(&before, &watch.read(), "after a trace of syscall events");
    let report = common::vmtrace(&["report", s(&data), "--format", "json"]);
    let doc: serde_json::Value = serde_json::from_str(&common::stdout(&report)).unwrap();
    assert_eq!(doc["dropped"], 0, "{doc}");
    for (name, n) in [("getpid", GETPIDS), ("openat", OPENATS)] {
        let enter = records(&doc, &format!("syscalls:sys_enter_{name}"));
        let exit = records(&doc, &format!("syscalls:sys_exit_{name}"));
        assert_eq!((enter.len(), exit.len()), (n, n), "{name}: {doc}");
        for r in enter.iter().chain(exit) {
            assert_eq!(r["pid"], pid, "{r}");
        }
        for r in exit {
            let ret = match name {
                "getpid" => format!("{pid:#x}"),
                _ => ENOENT.to_string(),
            };
            assert_eq!(r["fields"]["ret"], ret.as_str(), "{r}");
        }
        for r in enter.iter().filter(|_| name == "openat") {
            let f = &r["fields"];
            assert!(f["dfd"] == AT_FDCWD && f["flags"] == O_RDONLY, "{r}");
            // A user pointer, shown as ftrace shows it: its value.
            let filename = f["filename"].as_str().unwrap_or_default();
            assert!(
                filename.starts_with("0x") && filename != "0x00000000",
                "{r}"
            );
            assert_eq!(f["__syscall_nr"], 257, "{r}");
        }
    }
    check_fork_exits(&doc, pid, &children);
    if mode == "exitless" {
        // Killed while attached (its sites, code, rings, return hooks):
        // its guardian repairs the VM from the journal.
        let killed = dir.join("syscalls-killed.vmtrace");
        let mut args = args;
        args[args.len() - 1] = s(&killed);
        let mut a = Attach::start(qmp, &args);
        a.wait_line("vmtrace: attached to QEMU");
        a.signal(libc::SIGKILL);
        let e = a.end();
        let repaired = "vmtrace: repaired; the VM is as vmtrace would leave it";
        assert!(e.stderr.contains(repaired), "{}", e.stderr);
        assert_same(&before, &watch.read(), "after a killed syscall trace");
        assert_no_gdbstub(qmp);
    }
    data
}

/// `sys_exit_fork` of `forks FORKS` (`--comm wl-worker`: a child at its
/// start still has the worker's name): exactly one in the worker (pid
/// `worker`) per child, its `ret` the child's pid, in fork order; exactly
/// one in each child, `ret` 0.
fn check_fork_exits(doc: &serde_json::Value, worker: u64, children: &[u64]) {
    let exits = records(doc, FORK_EXIT);
    let (parent, child): (Vec<_>, Vec<_>) = exits.iter().partition(|r| r["pid"] == worker);
    let rets: Vec<&str> = parent
        .iter()
        .map(|r| r["fields"]["ret"].as_str().unwrap_or_default())
        .collect();
    let want: Vec<String> = children.iter().map(|p| format!("{p:#x}")).collect();
    assert_eq!(rets, want, "{exits:?}");
    let mut pids: Vec<u64> = child.iter().filter_map(|r| r["pid"].as_u64()).collect();
    pids.sort_unstable();
    let mut printed = children.to_vec();
    printed.sort_unstable();
    assert_eq!(pids, printed, "{exits:?}");
    for r in &child {
        assert_eq!(r["fields"]["ret"], "0x0", "{r}");
        assert_eq!(r["fields"]["__syscall_nr"], 57, "{r}");
    }
}

/// The syscall events' checks (`syscall_events`) in both modes, their
/// trace.dat read by trace-cmd, and bad input.
pub(super) fn checks(
    guest: &QemuGuest,
    kernel: &Kernel,
    bz: &std::path::Path,
    dir: &std::path::Path,
) {
    let data = syscall_events(guest, kernel, bz, dir, "trap");
    let names = [
        "sys_enter_getpid",
        "sys_exit_getpid",
        "sys_enter_openat",
        "sys_exit_openat",
        "sys_exit_fork",
    ];
    check_trace_cmd_report(&data, &names, &names);
    let ids = ["syscalls:sys_enter_getpid", "syscalls:sys_exit_openat"];
    check_guest_ids(guest, &data.with_extension("dat"), &ids);
    let data = syscall_events(guest, kernel, bz, dir, "exitless");
    check_trace_cmd_report(&data, &names, &names);
    let qmp = guest.qmp_socket();
    for (event, says) in [
        ("syscalls:sys_enter_nosuch", "closest: syscalls:sys_enter_"),
        ("raw_syscalls:sys_enter", "trace 'syscalls:sys_enter_*'"),
    ] {
        let o = common::vmtrace(&["attach", "--qmp", s(qmp), "--kernel", s(bz), "-e", event]);
        let err = String::from_utf8_lossy(&o.stderr);
        let last = err.trim_end().lines().last().unwrap_or_default();
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(last.contains(says) && last.contains(event), "{err}");
    }
}
