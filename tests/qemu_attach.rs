//! `vmtrace attach` end to end against real QEMU/TCG guests
//! (tests/common/qemu.rs): the workload calls a system call exactly N times
//! once vmtrace says it attached, and vmtrace counts exactly N; after the
//! detach the guest runs on, says nothing bad, and the memory vmtrace used
//! (the low MiB) and patched (the kernel's text) is byte for byte as before;
//! vmtrace's gdbstub (socket file and chardev) is gone. Bad attaches fail in
//! one line with exit status 2 and leave the guest as found; a QEMU killed
//! mid-trace ends vmtrace cleanly with what it had. One QEMU at a time (the
//! harness enforces it); no test asserts a time.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::thread;
use std::time::Duration;

use common::attach::*;
use common::guard::*;
use common::qemu::*;
use common::{s, scratch_in};
use tracer::qemu::qmp::Qmp;
use tracer::qemu::queries::Queries;

/// getpid's function: `__x64_sys_getpid` and `__do_sys_getpid` share an
/// address, and the report names it by one of them.
const GETPID: [&str; 2] = ["__do_sys_getpid", "__x64_sys_getpid"];
const GETPPID: [&str; 2] = ["__do_sys_getppid", "__x64_sys_getppid"];
const OPENAT: [&str; 1] = ["__x64_sys_openat"];

/// A clean detach: exit 0, the sites restored and vmtrace's code taken out.
fn assert_detached(e: &Ended, why: &str) {
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    let want = format!("vmtrace: detached ({why}): ");
    assert!(e.stderr.contains(&want), "{want:?} in {}", e.stderr);
    assert!(
        e.stderr
            .contains("vmtrace's code and page-table entries taken out; the guest runs on"),
        "{}",
        e.stderr
    );
    assert_eq!(e.json()["dropped"], 0, "{}", e.stdout);
}

/// Attach with `args` (`--trace` ...), run `calls` once attached, read
/// `watch` then, Ctrl-C, check the detach and the exact counts (`calls`:
/// syscall, N, the function's names). Without `--gdb`, vmtrace opens a
/// gdbstub of its own and takes it out.
fn trace_calls(
    guest: &QemuGuest,
    kernel: &Path,
    args: &[&str],
    calls: &[(&str, u64, &[&str])],
    watch: Option<&Watch>,
) -> (Ended, Option<Memory>) {
    let base = ["--kernel", s(kernel), "--format", "json"];
    let a = Attach::start(guest.qmp_socket(), &[&base[..], args].concat()).attached();
    let gdb = gdb_socket(&a);
    assert_eq!(gdb.exists(), !args.contains(&"--gdb"), "{}", gdb.display());
    for (syscall, n, _) in calls {
        guest.go(syscall, *n).unwrap();
    }
    let during = watch.map(Watch::read);
    a.signal(libc::SIGINT);
    let e = a.end();
    assert_detached(&e, "signal 2");
    assert!(!gdb.exists(), "{} left behind", gdb.display());
    let counts = e.counts();
    for (syscall, n, names) in calls {
        assert_eq!(count_of(&counts, names), *n, "{syscall}: {counts:?}");
    }
    assert_eq!(counts.len(), calls.len(), "{counts:?}");
    (e, during)
}

#[test]
fn attach_counts_exactly_restores_memory_and_attaches_again() {
    let (bz, vmlinux) = common::linux_61();
    let kernel = Kernel::new(&vmlinux);
    let guest = QemuGuest::boot(QemuOpts::linux());
    let w = guest.wait_ready().unwrap();
    let qmp = guest.qmp_socket();
    assert_no_gdbstub(qmp);
    let watch = kernel.watch(qmp);
    let (before, phys) = (watch.read(), watch.phys);

    let calls: [(&str, u64, &[&str]); 2] = [("getpid", 1000, &GETPID), ("openat", 500, &OPENAT)];
    let trace = ["--trace", "__x64_sys_getpid,__x64_sys_openat"];
    let (e, during) = trace_calls(&guest, &bz, &trace, &calls, Some(&watch));
    // A guest without cmpxchg16b (the test guests' CPU): no word of QEMU
    // 7.2's flags bug.
    assert!(!e.stderr.contains(CMPXCHG16B), "{}", e.stderr);
    // The comparison sees vmtrace: while attached, its pages (low MiB) and
    // its two sites (text: 5 bytes each at most) differ.
    let d = diffs(&before, &during.unwrap());
    let text = d.iter().filter(|x| x.0 >= LOW).count();
    assert!(d.iter().any(|x| x.0 < LOW), "vmtrace's pages unseen");
    assert!(
        (2..=10).contains(&text),
        "{text} text bytes differed: {d:x?}"
    );
    assert_eq!(e.json()["kernel_offset"]["phys"], phys, "{}", e.stdout);
    assert_eq!(e.json()["sites_patched"], 2, "{}", e.stdout);
    let (after, _) = kernel.read(qmp);
    assert_same(&before, &after, "by an attach and its detach");
    assert_no_gdbstub(qmp);
    assert_runs_on(&guest, w.worker);

    // Again, ended by --duration; the text report on stdout, the JSON to a
    // file. The duration is only a bound: the calls are made, and their
    // `done` line read, long before it ends.
    let dir = scratch_in("qemu-attach", "again");
    let json = dir.join("again.json");
    let export = format!("json={}", s(&json));
    let a = Attach::start(
        qmp,
        &[
            "--kernel",
            s(&bz),
            "--trace",
            "__x64_sys_getpid",
            "--duration",
            "10",
            "--export",
            &export,
        ],
    )
    .attached();
    guest.go("getpid", 200).unwrap();
    let mut a = a;
    assert!(
        a.child.try_wait().unwrap().is_none(),
        "--duration 10 ended before `go getpid 200` was done: a host this slow needs a longer one"
    );
    let e = a.end();
    assert!(e.status.success(), "{}", e.stderr);
    assert!(
        e.stderr
            .contains("vmtrace: detached (duration elapsed): 1 sites restored"),
        "{}",
        e.stderr
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let name = v["functions"][0]["name"].as_str().unwrap();
    assert!(GETPID.contains(&name), "{v}");
    assert_eq!(v["functions"][0]["count"], 200, "{v}");
    assert_eq!(v["functions"].as_array().unwrap().len(), 1, "{v}");
    assert!(e.stdout.contains(name), "the text report: {}", e.stdout);

    let (again, _) = kernel.read(qmp);
    assert_same(&before, &again, "by two attaches");
    assert_no_gdbstub(qmp);
    assert_runs_on(&guest, w.worker);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Trap mode through the gdbstub (`--mode trap`): a breakpoint of QEMU's
/// own at each site, each hit a stop; guest memory is never written (not
/// even while attached), counts are exact, the guest runs on. (The
/// function graph in trap mode: tests/qemu_graph.rs.)
#[test]
fn trap_mode_counts_exactly_through_gdbstub_breakpoints() {
    let (bz, vmlinux) = common::linux_61();
    let kernel = Kernel::new(&vmlinux);
    let guest = QemuGuest::boot(QemuOpts::linux());
    let w = guest.wait_ready().unwrap();
    let qmp = guest.qmp_socket();
    let watch = kernel.watch(qmp);
    let before = watch.read();
    let trace = "__x64_sys_getpid,__x64_sys_openat";
    let args = ["--kernel", s(&bz), "--format", "json", "--mode", "trap"];
    let mut a = Attach::start(qmp, &[&args[..], &["--trace", trace]].concat());
    let line = a.wait_line("vmtrace: attached to QEMU");
    assert!(
        line.contains("a gdbstub breakpoint at each of 2 sites, trap mode"),
        "{line}"
    );
    guest.go("getpid", 200).unwrap();
    guest.go("openat", 30).unwrap();
    assert_same(&before, &watch.read(), "while traced through breakpoints");
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    let want = "vmtrace: detached (signal 2): 2 breakpoints removed; the guest runs on";
    assert!(e.stderr.contains(want), "{want:?} in {}", e.stderr);
    let counts = e.counts();
    assert_eq!(count_of(&counts, &GETPID), 200, "{counts:?}");
    assert_eq!(count_of(&counts, &OPENAT), 30, "{counts:?}");
    assert_eq!(counts.len(), 2, "{counts:?}");
    let v = e.json();
    assert_eq!(
        (&v["mode"], &v["dropped"]),
        (&"trap".into(), &0.into()),
        "{v}"
    );
    // The header names the file given, not the vmlinux beside it.
    assert_eq!(v["kernel"], s(&bz), "{v}");
    assert_same(&before, &watch.read(), "by a trap-mode attach");
    assert_no_gdbstub(qmp);
    assert_runs_on(&guest, w.worker);
}

/// The ACPI guest, through a gdbstub its user opened (`--gdb`): vmtrace
/// leaves that one open, and it serves a second attach.
#[test]
fn attach_to_the_acpi_guest_through_a_given_gdbstub() {
    let guest = QemuGuest::boot(QemuOpts::linux_acpi());
    let w = guest.wait_ready().unwrap();
    let bz = linux_acpi_bzimage();
    let kernel = Kernel::new(&bz.with_file_name("vmlinux"));
    let qmp = guest.qmp_socket();
    let (before, _) = kernel.read(qmp);
    let stub = guest.dir().join("gdb.sock");
    let hmp = |cmd: &str| {
        let mut q = Qmp::connect(qmp, Duration::from_secs(10)).unwrap();
        q.hmp(cmd).unwrap()
    };
    let opened = hmp(&format!("gdbserver unix:{},server=on,wait=off", s(&stub)));
    assert!(opened.contains("Waiting for gdb connection"), "{opened}");
    let args = ["--trace", "__x64_sys_getppid", "--gdb", s(&stub)];
    for n in [300, 7] {
        let calls: [(&str, u64, &[&str]); 1] = [("getppid", n, &GETPPID)];
        trace_calls(&guest, &bz, &args, &calls, None);
        let chardevs = hmp("info chardev");
        assert!(
            chardevs.contains(s(&stub)),
            "the given stub closed: {chardevs}"
        );
    }
    assert!(hmp("gdbserver none").contains("Disabled gdbserver"));
    let (after, _) = kernel.read(qmp);
    assert_same(&before, &after, "by two attaches and their detaches");
    assert_no_gdbstub(qmp);
    assert_runs_on(&guest, w.worker);
}

/// One line on stderr, `vmtrace: ...` with `needle`, exit status 2, no panic.
fn assert_refused(e: &Ended, needle: &str) {
    let err = &e.stderr;
    assert_eq!(e.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("vmtrace: "), "{err}");
    assert!(err.contains(needle), "{needle:?} in {err}");
    assert!(
        !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
        "{err}"
    );
    assert!(e.stdout.is_empty(), "{}", e.stdout);
}

/// `vmtrace attach` with `args` that must be refused.
fn refused(qmp: &Path, args: &[&str], needle: &str) {
    let base = ["--trace", "__x64_sys_getpid", "--duration", "5"];
    let e = Attach::start(qmp, &[&base[..], args].concat()).end();
    assert_refused(&e, needle);
}

#[test]
fn bad_sockets_are_refused_in_one_line() {
    let (bz, _) = common::linux_61();
    let bz = s(&bz);
    let dir = scratch_in("qemu-attach", "sockets");
    refused(&dir.join("no-such.sock"), &["--kernel", bz], "no such file");
    let file = dir.join("plain-file");
    std::fs::write(&file, b"not a socket").unwrap();
    refused(&file, &["--kernel", bz], "plain-file");

    // A peer that is not QEMU: one that says something else, one that
    // hangs up at once.
    let path = dir.join("not-qemu.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let server = thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        conn.write_all(b"hello there\r\n").unwrap();
        // Held until vmtrace hangs up.
        let _ = conn.read(&mut [0u8; 256]);
        drop(listener.accept().unwrap());
    });
    refused(
        &path,
        &["--kernel", bz],
        "not QEMU (no QMP greeting, got \"hello there\")",
    );
    refused(&path, &["--kernel", bz], "not-qemu.sock");
    server.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// What an attach says of QEMU 7.2's TCG flags bug (tracer::qemu::tcg_flags).
const CMPXCHG16B: &str = "sometimes computes the flags of the guest's cmpxchg16b wrongly (fixed in QEMU 8.0), which can crash this guest (its CPU has cx16)";

/// Its guest runs QEMU's default CPU as is (with cx16): refused attaches
/// say nothing of QEMU's flags bug (one line each), the attach that goes
/// ahead says it.
#[test]
fn bad_attaches_leave_the_guest_untouched() {
    let (bz, kernel, guest, w, before) = boot_linux(QemuOpts {
        qemu_args: vec!["-cpu".into(), "qemu64".into()],
        ..QemuOpts::linux()
    });
    let qmp = guest.qmp_socket();

    // Another kernel's symbols: refused before anything is written.
    let acpi = linux_acpi_bzimage().with_file_name("vmlinux");
    let mut others = vec![("--vmlinux", acpi)];
    if let Some((bz612, _)) = common::linux_612() {
        others.push(("--kernel", bz612));
    }
    for (flag, other) in &others {
        let needle = format!(
            "the guest runs another kernel than {}",
            other.with_file_name("vmlinux").display()
        );
        refused(qmp, &[flag, s(other)], &needle);
        assert_runs_on(&guest, w.worker);
    }

    // QMP busy: QEMU serves one client; vmtrace waits for its greeting
    // (10 s, session::REPLY_TIMEOUT) and gives up.
    {
        let _held = Qmp::connect(qmp, Duration::from_secs(10)).unwrap();
        refused(
            qmp,
            &["--kernel", s(&bz)],
            "another client holds the QMP socket",
        );
    }
    assert_runs_on(&guest, w.worker);
    let (after, _) = kernel.read(qmp);
    assert_same(&before, &after, "by refused attaches");
    assert_no_gdbstub(qmp);

    // And an attach still works, and says what QEMU 7.2 may do to a
    // guest with cx16 (under QEMU 8.0 or later: nothing).
    let calls: [(&str, u64, &[&str]); 1] = [("getpid", 10, &GETPID)];
    let (e, _) = trace_calls(&guest, &bz, &["--trace", "__x64_sys_getpid"], &calls, None);
    let old_qemu =
        e.stderr.contains("attached to QEMU 7.") || e.stderr.contains("attached to QEMU 6.");
    assert_eq!(e.stderr.contains(CMPXCHG16B), old_qemu, "{}", e.stderr);
    // The bug itself, in the guest with no vmtrace attached: the flags
    // after a cmpxchg16b that follows an add at the start of a block
    // (guest/linux/workload.c `cx16flags`): the add's operand (0x801:
    // CF and OF) under QEMU 7.2's TCG, ZF and the add's flags elsewhere.
    guest.send_line("cx16flags");
    let line = guest
        .wait_for("workload: cx16flags flags=", COMMAND_TIMEOUT)
        .unwrap();
    let want = if old_qemu { 0xa43 } else { 0x242 };
    assert!(
        line.contains(&format!("flags={want} pid={}", w.worker)),
        "{line}"
    );
    assert_runs_on(&guest, w.worker);
}

#[test]
fn qemu_killed_mid_trace_keeps_what_was_traced() {
    let (bz, _) = common::linux_61();
    let mut guest = QemuGuest::boot(QemuOpts::linux());
    let w = guest.wait_ready().unwrap();
    let a = Attach::start(
        guest.qmp_socket(),
        &[
            "--kernel",
            s(&bz),
            "--trace",
            "__x64_sys_getpid",
            "--format",
            "json",
        ],
    )
    .attached();
    let gdb = gdb_socket(&a);
    guest.go("getpid", 100).unwrap();
    guest.send_line("ping");
    guest
        .wait_for(&format!("workload: pong pid={}", w.worker), COMMAND_TIMEOUT)
        .unwrap();
    // The drainer empties the rings every millisecond while events come:
    // this leaves it ample time to have taken all 100 before QEMU dies.
    thread::sleep(Duration::from_secs(1));
    guest.kill();
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    assert!(
        e.stderr.contains("vmtrace: QEMU went away: "),
        "{}",
        e.stderr
    );
    assert!(
        e.stderr.contains("kept what was traced until then"),
        "{}",
        e.stderr
    );
    assert!(!gdb.exists(), "{} left behind", gdb.display());
    assert_eq!(count_of(&e.counts(), &GETPID), 100, "{}", e.stdout);
    let why = e.json()["stop_reason"].as_str().unwrap().to_string();
    assert!(why.starts_with("QEMU went away"), "{}", e.stdout);
    // Its rings went with it: the drop counts are the last ones read, and
    // the trace says so (they used to read as 0, silently).
    assert!(
        why.contains("the dropped counts are the last ones read"),
        "{}",
        e.stdout
    );
}

#[test]
fn paused_guests_are_refused_and_stay_paused() {
    let (bz, _) = common::linux_61();
    let guest = QemuGuest::boot(QemuOpts {
        qemu_args: vec!["-S".into()],
        ..QemuOpts::linux()
    });
    let qmp = guest.qmp_socket();
    let q = || Qmp::connect(qmp, Duration::from_secs(10)).unwrap();
    // Started with -S: in its firmware's reset state, before its first
    // instruction; then paused by its user, a booted guest.
    let mut worker = 0;
    for status in ["prelaunch", "paused"] {
        if status == "paused" {
            q().execute("cont", None).unwrap();
            worker = guest.wait_ready().unwrap().worker;
            q().execute("stop", None).unwrap();
        }
        assert_eq!(q().status().unwrap(), status);
        let needle = format!("is not running (its status is {status})");
        refused(qmp, &["--kernel", s(&bz)], &needle);
        assert_eq!(q().status().unwrap(), status);
        assert_no_gdbstub(qmp);
    }
    q().execute("cont", None).unwrap();
    assert_runs_on(&guest, worker);
}
