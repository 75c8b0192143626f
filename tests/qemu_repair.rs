//! A VM a vmtrace left behind can always be repaired (issue 34): a
//! `vmtrace attach` killed with SIGKILL mid-trace, in trap mode, exitless
//! and exitless with `--graph`, then `vmtrace detach --qmp`: the guest is
//! alive, every byte vmtrace may have written is as before the attach, no
//! gdbstub is left, and the exit status and lines are right. Until the
//! repair the next attach refuses and names it; after it an attach works
//! again. The attach's guardian repairs the VM itself when only the attach
//! is killed. An attach refused after it staged its pages gives them back.
//! One QEMU/TCG guest per test function, reused across its cases; no test
//! asserts a time.

mod common;

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use common::attach::*;
use common::guard::*;
use common::qemu::*;
use common::s;
use tracer::qemu::journal;
use tracer::qemu::qmp::Qmp;
use tracer::qemu::queries::Queries;

/// A hang guard for a frozen guest to show as frozen (far above the time a
/// TCG guest takes to reach its next traced call).
const FREEZE: Duration = Duration::from_secs(120);

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The repair found and undid something, and says the VM is as vmtrace
/// would leave it.
fn assert_repaired(o: &Output, needles: &[&str]) {
    let err = text(o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("vmtrace: repaired; the VM is as vmtrace would leave it"),
        "{err}"
    );
    for n in needles {
        assert!(err.contains(n), "{n:?} in {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

/// Nothing left: the repair says so and exits 0.
fn assert_nothing_left(qmp: &Path) {
    let o = detach(qmp);
    let err = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert_eq!(
        err.trim_end(),
        "vmtrace: nothing of vmtrace's found; the VM is as vmtrace would leave it"
    );
}

/// An attach on a VM with leftovers: refused in one line naming them and
/// the repair (exit 2).
fn assert_attach_refused(qmp: &Path, bz: &Path, needles: &[&str]) {
    let e = Attach::start(
        qmp,
        &[
            "--kernel",
            s(bz),
            "--trace",
            "__x64_sys_getpid",
            "--duration",
            "1",
        ],
    )
    .end();
    assert_eq!(e.status.code(), Some(2), "{}", e.stderr);
    assert_eq!(e.stderr.trim_end().lines().count(), 1, "{}", e.stderr);
    let repair = format!("vmtrace detach --qmp {}", qmp.display());
    assert!(e.stderr.contains(&repair), "{repair:?} in {}", e.stderr);
    for n in needles {
        assert!(e.stderr.contains(n), "{n:?} in {}", e.stderr);
    }
}

/// Start `vmtrace attach ARGS` and wait for its `attached` line.
fn attached(qmp: &Path, bz: &Path, args: &[&str]) -> Attach {
    let base = ["--kernel", s(bz), "--format", "json"];
    let mut a = Attach::start(qmp, &[&base[..], args].concat());
    a.wait_line("vmtrace: attached to QEMU");
    a
}

/// A traced attach that detaches cleanly: the repair left nothing in its way.
fn attach_works(guest: &QemuGuest, bz: &Path, args: &[&str]) {
    let a = attached(
        guest.qmp_socket(),
        bz,
        &[&["--trace", "__x64_sys_getpid"][..], args].concat(),
    );
    guest.go("getpid", 5).unwrap();
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    assert!(
        e.stderr.contains("vmtrace: detached (signal 2)"),
        "{}",
        e.stderr
    );
}

/// The journal `vmtrace attach` keeps for this guest's QEMU.
fn journal_of(guest: &QemuGuest) -> std::path::PathBuf {
    let start = journal::start_time(guest.pid()).unwrap();
    let path = journal::path_for(guest.pid(), start);
    assert!(path.is_file(), "{}", path.display());
    path
}

/// Every byte vmtrace may write is as `before`, no gdbstub is left and
/// nothing of vmtrace's is found: the VM as found.
fn assert_as_found(kernel: &Kernel, qmp: &Path, before: &Memory, when: &str) {
    let (after, _) = kernel.read(qmp);
    assert_same(before, &after, when);
    assert_no_gdbstub(qmp);
    assert_nothing_left(qmp);
}

fn status(qmp: &Path) -> String {
    Qmp::connect(qmp, Duration::from_secs(10))
        .unwrap()
        .status()
        .unwrap()
}

#[test]
fn a_killed_trap_mode_attach_freezes_the_guest_until_the_repair() {
    let (bz, kernel, guest, w, before) = boot_linux(QemuOpts::linux());
    let qmp = guest.qmp_socket();
    assert_nothing_left(qmp);

    // Its guardian repairs the VM as soon as the attach is gone: the
    // guest never freezes.
    let trap = ["--mode", "trap", "--trace", "__x64_sys_getppid"];
    let a = attached(qmp, &bz, &trap);
    let private = gdb_socket(&a).parent().unwrap().to_path_buf();
    assert!(
        private.is_dir(),
        "{} is the attach's stub directory",
        private.display()
    );
    guest.go("getppid", 3).unwrap();
    a.signal(libc::SIGKILL);
    let e = a.end();
    assert!(
        !private.exists(),
        "the guardian removed {}",
        private.display()
    );
    for n in [
        "its guardian repairs the VM",
        "removed vmtrace's breakpoints",
        "vmtrace: repaired; the VM is as vmtrace would leave it",
    ] {
        assert!(e.stderr.contains(n), "{n:?} in {}", e.stderr);
    }
    guest.go("getppid", 1).unwrap();
    assert_runs_on(&guest, w.worker);
    assert_as_found(
        &kernel,
        qmp,
        &before,
        "after a killed trap-mode attach, by its guardian",
    );

    let a = attached(qmp, &bz, &trap);
    let private = gdb_socket(&a).parent().unwrap().to_path_buf();
    guest.go("getppid", 3).unwrap();
    kill_with_guardian(a);
    assert!(
        private.is_dir(),
        "a killed attach leaves {}",
        private.display()
    );
    // The breakpoints stay with QEMU: the next traced call freezes the
    // guest, paused (debug), with nobody to resume it.
    guest.send_line("go getppid 1");
    let deadline = Instant::now() + FREEZE;
    while status(qmp) != "debug" {
        assert!(Instant::now() < deadline, "the guest never froze");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_attach_refused(
        qmp,
        &bz,
        &[
            "trap mode: ",
            "frozen at one of its breakpoints (status paused (debug))",
        ],
    );
    assert_eq!(status(qmp), "debug", "the refusal resumed nothing");

    let o = detach(qmp);
    assert_repaired(
        &o,
        &[
            "vmtrace: closed vmtrace's gdbstub",
            "removed vmtrace's breakpoints",
            "runs again",
            "removed vmtrace's journal",
        ],
    );
    assert!(
        !private.exists(),
        "the repair removed {}",
        private.display()
    );
    guest
        .wait_for("workload: done getppid 1 ", COMMAND_TIMEOUT)
        .unwrap();
    assert_runs_on(&guest, w.worker);
    assert_as_found(
        &kernel,
        qmp,
        &before,
        "after a killed trap-mode attach and the repair",
    );
    attach_works(&guest, &bz, &["--mode", "trap"]);
    assert_runs_on(&guest, w.worker);
}

#[test]
fn a_killed_exitless_attach_leaves_the_guest_running_until_the_repair() {
    let (bz, kernel, guest, w, before) = boot_linux(QemuOpts::linux());
    let qmp = guest.qmp_socket();

    for graph in [false, true] {
        let mut args = vec!["--mode", "exitless", "--trace", "__x64_sys_getppid"];
        if graph {
            args.push("--graph");
        }
        let a = attached(qmp, &bz, &args);
        guest.go("getppid", 3).unwrap();
        kill_with_guardian(a);
        // vmtrace's code stays in place, its rings fill, the calls beyond
        // are counted: the guest runs on without it.
        guest.go("getppid", 20_000).unwrap();
        assert_runs_on(&guest, w.worker);
        assert_attach_refused(qmp, &bz, &["exitless: "]);
        if !graph {
            // Without its journal the repair goes by vmtrace's marker in
            // the guest: the sites and the entries go back, the pages'
            // bytes cannot (exit 1, said).
            let journal = journal_of(&guest);
            let aside = journal.with_extension("aside");
            std::fs::rename(&journal, &aside).unwrap();
            assert_attach_refused(
                qmp,
                &bz,
                &["its code and rings (its marker at guest-physical"],
            );
            let o = detach(qmp);
            assert_eq!(o.status.code(), Some(1), "{}", text(&o));
            for n in [
                "1 sites restored",
                "3 page-directory entries cleared",
                "may hold what vmtrace wrote: what they held before is in its journal only",
            ] {
                assert!(text(&o).contains(n), "{n:?} in {}", text(&o));
            }
            assert_runs_on(&guest, w.worker);
            // The marker is cleared: nothing is left to find but the pages.
            assert_nothing_left(qmp);
            std::fs::rename(&aside, &journal).unwrap();
        }

        let o = detach(qmp);
        // (The journal-less try above closed the stub already.)
        let stub = match graph {
            true => "vmtrace: closed vmtrace's gdbstub",
            false => "the guest runs on",
        };
        assert_repaired(
            &o,
            &[
                stub,
                " sites restored",
                "page-directory entries cleared",
                "unused low pages given their bytes back",
                "the guest runs on",
            ],
        );
        assert_runs_on(&guest, w.worker);
        let when = format!("after a killed exitless attach (graph {graph}) and the repair");
        assert_as_found(&kernel, qmp, &before, &when);
    }
    attach_works(&guest, &bz, &["--mode", "exitless"]);
    assert_runs_on(&guest, w.worker);

    // The attach alone killed: its guardian takes its code out.
    let graph = [
        "--mode",
        "exitless",
        "--graph",
        "--trace",
        "__x64_sys_getppid",
    ];
    let a = attached(qmp, &bz, &graph);
    guest.go("getppid", 3).unwrap();
    a.signal(libc::SIGKILL);
    let e = a.end();
    for n in [
        "its guardian repairs the VM",
        "page-directory entries cleared",
        "vmtrace: repaired; the VM is as vmtrace would leave it",
    ] {
        assert!(e.stderr.contains(n), "{n:?} in {}", e.stderr);
    }
    assert_runs_on(&guest, w.worker);
    assert_as_found(
        &kernel,
        qmp,
        &before,
        "after a killed --graph attach, by its guardian",
    );
}

/// A hooked call that has not returned keeps vmtrace's code in place: a
/// detach leaves it (and its journal), and so does a repair while the call
/// sleeps (exit 1, saying why); once it returned, the repair takes it out.
#[test]
fn a_region_a_hooked_call_returns_through_goes_once_the_call_returned() {
    let (bz, kernel, guest, w, before) = boot_linux(QemuOpts::linux());
    let qmp = guest.qmp_socket();
    let a = attached(qmp, &bz, &["--trace", "__x64_sys_read", "--graph"]);
    // The worker leaves the read it slept in (begun before the attach),
    // answers, and sleeps in a hooked one.
    guest.send_line("ping");
    guest
        .wait_for(&format!("workload: pong pid={}", w.worker), COMMAND_TIMEOUT)
        .unwrap();
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(
        e.stderr.contains("1 hooked calls had not returned"),
        "{}",
        e.stderr
    );
    assert_attach_refused(qmp, &bz, &["exitless: "]);

    let o = detach(qmp);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    for n in [
        "vmtrace's code and rings left mapped: 1 hooked calls have not returned",
        "kept vmtrace's journal",
    ] {
        assert!(text(&o).contains(n), "{n:?} in {}", text(&o));
    }
    // The read returns (through vmtrace's code), the worker answers.
    guest.send_line("ping");
    guest.wait_for("workload: pong", COMMAND_TIMEOUT).unwrap();
    assert_repaired(&detach(qmp), &["page-directory entries cleared"]);
    assert_runs_on(&guest, w.worker);
    assert_as_found(
        &kernel,
        qmp,
        &before,
        "after a region left for a hooked call, and the repair",
    );
}

/// Bad input: one line, exit status 2, no panic.
#[test]
fn detach_of_a_bad_socket_is_refused_in_one_line() {
    let dir = common::scratch_in("repair", "bad");
    let missing = dir.join("no.sock");
    let o = detach(&missing);
    let err = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.starts_with("vmtrace: ") && err.contains("no.sock"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// Issue 34, item 7: a guest whose ftrace is switched off is never ready
/// (`ftrace_enabled` stays 0), and the attach gives up after it staged its
/// code and rings in the guest's free pages: they get their bytes back.
#[test]
fn an_attach_refused_after_staging_gives_every_byte_back() {
    let (bz, kernel, guest, w, before) = boot_linux(QemuOpts {
        append: "sysctl.kernel.ftrace_enabled=0".into(),
        ..QemuOpts::linux()
    });
    let qmp = guest.qmp_socket();
    let e = Attach::start(
        qmp,
        &[
            "--kernel",
            s(&bz),
            "--mode",
            "exitless",
            "--trace",
            "__x64_sys_getpid",
        ],
    )
    .end();
    assert_eq!(e.status.code(), Some(2), "{}", e.stderr);
    assert!(
        e.stderr.contains("the guest was never ready to attach"),
        "{}",
        e.stderr
    );
    assert_runs_on(&guest, w.worker);
    assert_as_found(&kernel, qmp, &before, "by an attach refused after staging");

    // Killed while it waits for that guest (staged, between attempts):
    // the repair gives the pages back.
    let a = Attach::start(
        qmp,
        &[
            "--kernel",
            s(&bz),
            "--mode",
            "exitless",
            "--trace",
            "__x64_sys_getpid",
        ],
    );
    std::thread::sleep(Duration::from_secs(3));
    kill_with_guardian(a);
    assert_repaired(&detach(qmp), &["the guest runs on"]);
    assert_runs_on(&guest, w.worker);
    assert_as_found(
        &kernel,
        qmp,
        &before,
        "by an attach killed after staging, and the repair",
    );
}

/// Wait until `journal` exists and `pred` holds of its text (a hang guard
/// only: vmtrace writes it within its attach).
fn journal_says(journal: &Path, pred: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + FREEZE;
    loop {
        if std::fs::read_to_string(journal).is_ok_and(|t| pred(&t)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} never said it",
            journal.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// SIGKILL at the attach (as soon as the journal exists, or names the
/// mode: the stub opening, the pages staged, the breakpoints set) and at
/// the detach (around the end of a one-second trace), each followed by the
/// repair. Whatever the moment, the VM ends as found.
#[test]
fn a_kill_at_the_attach_or_at_the_detach_is_repaired() {
    let (bz, kernel, guest, w, before) = boot_linux(QemuOpts::linux());
    let qmp = guest.qmp_socket();
    let journal = journal::path_for(guest.pid(), journal::start_time(guest.pid()).unwrap());

    let cases: [(&str, &str); 4] = [
        ("exitless", "\"armed\":\"connecting\""),
        ("exitless", "\"armed\":\"exitless\""),
        ("trap", "\"armed\":\"connecting\""),
        ("trap", "\"armed\":\"trap\""),
    ];
    for (mode, moment) in cases {
        let a = Attach::start(
            qmp,
            &[
                "--kernel",
                s(&bz),
                "--mode",
                mode,
                "--trace",
                "__x64_sys_getppid",
            ],
        );
        journal_says(&journal, |t| t.contains(moment));
        kill_with_guardian(a);
        let o = detach(qmp);
        let when = format!("killed at the attach ({mode}, journal {moment})");
        assert_eq!(o.status.code(), Some(0), "{when}: {}", text(&o));
        assert_runs_on(&guest, w.worker);
        assert_as_found(&kernel, qmp, &before, &when);
    }

    for late in [0u64, 40, 80] {
        let a = attached(
            qmp,
            &bz,
            &[
                "--mode",
                "exitless",
                "--trace",
                "__x64_sys_getppid",
                "--duration",
                "1",
            ],
        );
        std::thread::sleep(Duration::from_millis(1000 + late));
        kill_with_guardian(a);
        let o = detach(qmp);
        let when = format!("killed at the detach (+{late} ms)");
        assert_eq!(o.status.code(), Some(0), "{when}: {}", text(&o));
        assert_runs_on(&guest, w.worker);
        assert_as_found(&kernel, qmp, &before, &when);
    }
}

/// A VM its user paused (QMP `stop`) after vmtrace and its guardian were
/// killed, trap mode and exitless: `vmtrace detach` repairs it inside that
/// pause and leaves it paused (a gdbstub detach would resume it). Once the
/// user continues it, it runs as found: no breakpoint left to freeze at,
/// every byte as before.
#[test]
fn a_repair_leaves_a_vm_its_user_paused_paused() {
    let (bz, kernel, guest, w, before) = boot_linux(QemuOpts::linux());
    let qmp = guest.qmp_socket();
    let user = |cmd: &str| {
        Qmp::connect(qmp, Duration::from_secs(10))
            .unwrap()
            .execute(cmd, None)
            .unwrap();
    };
    for mode in ["trap", "exitless"] {
        let a = attached(qmp, &bz, &["--mode", mode, "--trace", "__x64_sys_getppid"]);
        guest.go("getppid", 3).unwrap();
        kill_with_guardian(a);
        user("stop");
        assert_eq!(status(qmp), "paused", "{mode}");
        let o = detach(qmp);
        assert_repaired(
            &o,
            &[
                "the VM stays paused, as someone left it",
                "removed vmtrace's journal",
            ],
        );
        assert_eq!(status(qmp), "paused", "{mode}: the repair resumed the VM");
        user("cont");
        // Trap mode: a breakpoint left would freeze this call.
        guest.go("getppid", 1).unwrap();
        assert_eq!(status(qmp), "running", "{mode}");
        assert_runs_on(&guest, w.worker);
        assert_as_found(
            &kernel,
            qmp,
            &before,
            &format!("after a {mode} repair in a paused VM"),
        );
    }
}

/// A killed attach of direct entries (issue 35): getppid's displaces its
/// ftrace NOP, `sched_clock_cpu`'s (notrace) its first instructions; each
/// holds a `jmp` to its stub. Without the journal the repair gives back
/// only the one whose bytes it can tell (its stub ran nothing in their
/// place: the NOP) and leaves the other with vmtrace's code (exit 1); with
/// the journal everything goes back, every byte as found.
#[test]
fn a_killed_direct_attach_is_repaired_from_its_journal() {
    let (bz, kernel, guest, w, before) = boot_linux(QemuOpts::linux());
    let qmp = guest.qmp_socket();
    let args = [
        "--mode",
        "exitless",
        "--entry",
        "direct",
        "--trace",
        "__x64_sys_getppid,sched_clock_cpu",
    ];
    let a = attached(qmp, &bz, &args);
    guest.go("getppid", 3).unwrap();
    kill_with_guardian(a);
    guest.go("getppid", 2_000).unwrap();
    assert_runs_on(&guest, w.worker);

    let journal = journal_of(&guest);
    let aside = journal.with_extension("aside");
    std::fs::rename(&journal, &aside).unwrap();
    let o = detach(qmp);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    for n in [
        "1 sites restored (0 of 2 were as found)",
        "1 direct entries jump into vmtrace's code and no journal holds their first bytes",
    ] {
        assert!(text(&o).contains(n), "{n:?} in {}", text(&o));
    }
    assert_runs_on(&guest, w.worker);
    std::fs::rename(&aside, &journal).unwrap();

    let o = detach(qmp);
    assert_repaired(
        &o,
        &[
            "1 sites restored (1 of 2 were as found)",
            "page-directory entries cleared",
            "unused low pages given their bytes back",
        ],
    );
    assert_runs_on(&guest, w.worker);
    assert_as_found(
        &kernel,
        qmp,
        &before,
        "after a killed direct attach and the repair",
    );
}
