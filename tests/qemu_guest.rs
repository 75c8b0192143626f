//! The QEMU guest the attach tests trace (tests/common/qemu.rs): the
//! default Linux guest and its ACPI variant boot in QEMU/TCG with 2 vCPUs
//! and the workload initramfs, the worker runs its commands, the kernel
//! says nothing bad, and `quit` ends QEMU with exit status 0. No vmtrace
//! here: this checks the guest and the harness the attach tests stand on.

mod common;

use std::time::Instant;

use common::console::assert_no_complaint;
use common::guard::BAD;
use common::qemu::*;

fn run(opts: QemuOpts, name: &str) {
    let mut guest = QemuGuest::boot(opts);
    let started = Instant::now();
    let ready = guest.wait_ready().unwrap_or_else(|e| panic!("{name}: {e}"));
    // Informational only (no test asserts a time): CI's log shows what a
    // TCG boot costs.
    eprintln!("{name}: ready after {:.1?}: {ready:?}", started.elapsed());
    assert_eq!(ready.init_pid, 1, "{name}");
    assert_eq!(ready.comm, WORKER_COMM, "{name}");
    assert!(ready.worker > 1, "{name}: {ready:?}");

    let pid = format!("pid={}", ready.worker);
    for (syscall, n) in [("getpid", 1000), ("openat", 500)] {
        let done = guest
            .go(syscall, n)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(done.ends_with(&pid), "{name}: {done:?} is not from {pid}");
    }
    // Two commands sent at once run in order.
    guest.send_line("go getppid 3");
    guest.send_line("ping");
    guest
        .wait_for("workload: done getppid 3 ", COMMAND_TIMEOUT)
        .unwrap();
    guest
        .wait_for(&format!("workload: pong {pid}"), COMMAND_TIMEOUT)
        .unwrap();
    guest.send_line("go nothing 1");
    guest
        .wait_for("workload: error unknown command", COMMAND_TIMEOUT)
        .unwrap();

    let console = guest.console();
    assert_no_complaint(&console, &BAD, name);
    assert!(
        console.contains("smp: Brought up 1 node, 2 CPUs"),
        "{name}: not both vCPUs came up:\n{console}"
    );
    assert!(guest.is_alive(), "{name}");

    guest.send_line("quit");
    guest.wait_for("workload: quit ", COMMAND_TIMEOUT).unwrap();
    let status = guest.wait_exit(COMMAND_TIMEOUT).unwrap();
    assert_eq!(
        status.code(),
        Some(0),
        "{name}: QEMU {status}: {}",
        guest.stderr()
    );
    eprintln!("{name}: done after {:.1?}", started.elapsed());
}

#[test]
fn default_guest_runs_the_workload_and_quits() {
    run(QemuOpts::linux(), "linux");
}

#[test]
fn acpi_guest_runs_the_workload_and_powers_off() {
    run(QemuOpts::linux_acpi(), "linux-acpi");
}

#[test]
fn ready_line_parses() {
    let w = Workload::parse("[  1.0] x workload: ready pid=1 worker=57 comm=wl-worker").unwrap();
    assert_eq!(
        (w.init_pid, w.worker, w.comm.as_str()),
        (1, 57, "wl-worker")
    );
    assert_eq!(Workload::parse("workload: done getpid 3 pid=57"), None);
}

#[test]
fn qmp_answers_and_a_killed_guest_ends_the_waits() {
    let mut guest = QemuGuest::boot(QemuOpts::linux());
    guest.wait_ready().unwrap();
    // The QMP socket is QEMU's: its greeting names the version.
    let mut qmp = std::io::BufReader::new(
        std::os::unix::net::UnixStream::connect(guest.qmp_socket()).unwrap(),
    );
    let mut greeting = String::new();
    std::io::BufRead::read_line(&mut qmp, &mut greeting).unwrap();
    assert!(
        greeting.starts_with(r#"{"QMP": {"version": {"qemu":"#),
        "{greeting}"
    );
    drop(qmp);

    assert!(guest.is_alive());
    guest.kill();
    assert!(!guest.is_alive());
    let err = guest
        .wait_for("workload: done", COMMAND_TIMEOUT)
        .unwrap_err();
    assert!(err.starts_with("QEMU exited waiting for"), "{err}");
}
