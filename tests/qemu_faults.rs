//! What QEMU or its user does to a VM while vmtrace traces it, against
//! real QEMU/TCG guests (tests/common/qemu.rs): a QEMU stalled (SIGSTOP)
//! is waited out, never taken for gone; a stop someone else makes (a QMP
//! `stop` from a second monitor) is never undone, and a detach inside it
//! leaves the VM stopped; a machine reset ends the trace, which keeps the
//! calls before it, and the guest boots again cleanly. Each case checks
//! that the guest lives, that the bytes vmtrace may write are as before
//! (where the kernel still runs), that the console has no complaint, and
//! vmtrace's exit status and message.

mod common;

use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use common::attach::*;
use common::guard::*;
use common::qemu::*;
use tracer::qemu::qmp::Qmp;
use tracer::qemu::queries::Queries;

/// getpid's function: `__x64_sys_getpid` and `__do_sys_getpid` share an
/// address, and the report names it by one of them.
const GETPID: [&str; 2] = ["__do_sys_getpid", "__x64_sys_getpid"];

/// Longer than vmtrace waits for one QMP reply (10 s): the stall the
/// issue measured.
const STALL: Duration = Duration::from_secs(15);

/// A second QMP monitor, the VM's user's (QEMU serves one client per
/// monitor; vmtrace holds the first).
struct UserMonitor {
    path: PathBuf,
}

impl UserMonitor {
    fn new() -> UserMonitor {
        // One per test: the tests of this file run on threads of one
        // process (their guests one at a time). Short: unix socket paths
        // are limited to 107 bytes.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("vmtrace-user-{}-{n}.sock", std::process::id());
        let path = std::env::temp_dir().join(name);
        let _ = std::fs::remove_file(&path);
        UserMonitor { path }
    }

    /// QEMU's arguments for it.
    fn args(&self) -> Vec<String> {
        vec![
            "-qmp".into(),
            format!("unix:{},server=on,wait=off", self.path.display()),
        ]
    }

    fn qmp(&self) -> Qmp {
        Qmp::connect(&self.path, Duration::from_secs(60)).unwrap()
    }

    fn run(&self, cmd: &str) {
        self.qmp().execute(cmd, None).unwrap();
    }

    fn run_with(&self, cmd: &str, args: serde_json::Value) {
        self.qmp().execute(cmd, Some(args)).unwrap();
    }

    /// `device_add` of the first vCPU slot QEMU has free
    /// (`query-hotpluggable-cpus`: the slots without a `qom-path`).
    fn add_vcpu(&self, id: &str) {
        let slots = self.qmp().execute("query-hotpluggable-cpus", None).unwrap();
        let free = slots
            .as_array()
            .and_then(|a| a.iter().find(|s| s.get("qom-path").is_none()))
            .unwrap_or_else(|| panic!("no free vCPU slot: {slots}"));
        let mut args = free["props"].clone();
        args["driver"] = free["type"].clone();
        args["id"] = id.into();
        self.run_with("device_add", args);
    }

    fn status(&self) -> String {
        self.qmp().status().unwrap()
    }
}

impl Drop for UserMonitor {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn boot_with(user: &UserMonitor, more: &[&str]) -> (QemuGuest, Workload) {
    let mut qemu_args = user.args();
    qemu_args.extend(more.iter().map(|a| a.to_string()));
    let guest = QemuGuest::boot(QemuOpts {
        qemu_args,
        ..QemuOpts::linux()
    });
    let w = guest.wait_ready().unwrap();
    (guest, w)
}

/// `vmtrace attach` tracing getpid in `mode`, attached.
fn attach(qmp: &Path, bz: &Path, mode: &str) -> Attach {
    attach_json(qmp, bz, "__x64_sys_getpid", &["--mode", mode])
}

/// A clean detach with `calls` getpid calls counted.
fn assert_counted(e: &Ended, calls: u64) {
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    assert!(e.stderr.contains("vmtrace: detached ("), "{}", e.stderr);
    assert_eq!(count_of(&e.counts(), &GETPID), calls, "{}", e.stdout);
    assert_eq!(e.json()["dropped"], 0, "{}", e.stdout);
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on the test's own QEMU child.
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0);
}

/// QEMU stopped (SIGSTOP) longer than a QMP reply may take, mid-trace, in
/// both modes: vmtrace says it waits, traces on once QEMU runs again, and
/// detaches as usual; the calls made after are all counted.
#[test]
fn a_stalled_qemu_is_waited_out_then_detached() {
    let (bz, kernel, guest, w, before) = boot_linux(QemuOpts::linux());
    let qmp = guest.qmp_socket();
    for mode in ["exitless", "trap"] {
        let mut a = attach(qmp, &bz, mode);
        signal(guest.pid(), libc::SIGSTOP);
        a.wait_line("vmtrace: QEMU has not answered for");
        let stalled = Instant::now();
        while stalled.elapsed() < STALL {
            thread::sleep(Duration::from_millis(200));
        }
        signal(guest.pid(), libc::SIGCONT);
        a.wait_line("vmtrace: QEMU answers again");
        guest.go("getpid", 100).unwrap();
        a.signal(libc::SIGINT);
        let e = a.end();
        assert_counted(&e, 100);
        assert!(!e.stderr.contains("went away"), "{mode}: {}", e.stderr);
        let (after, _) = kernel.read(qmp);
        assert_same(&before, &after, &format!("by a {mode} trace over a stall"));
        assert_no_gdbstub(qmp);
        assert_runs_on(&guest, w.worker);
    }
}

/// A user's `stop` from a second monitor while vmtrace traces: vmtrace
/// never resumes it, says so, and traces on after the user's `cont`; a
/// detach inside a user's stop leaves the VM stopped, its memory as found.
#[test]
fn someone_elses_stop_is_never_undone() {
    let (bz, vmlinux) = common::linux_61();
    let kernel = Kernel::new(&vmlinux);
    let user = UserMonitor::new();
    let (guest, w) = boot_with(&user, &[]);
    let qmp = guest.qmp_socket();
    let (before, _) = kernel.read(qmp);
    for mode in ["trap", "exitless"] {
        let mut a = attach(qmp, &bz, mode);
        user.run("stop");
        a.wait_line("vmtrace: the VM was stopped by someone else");
        thread::sleep(Duration::from_secs(2));
        assert_eq!(
            user.status(),
            "paused",
            "{mode}: vmtrace resumed the user's stop"
        );
        user.run("cont");
        a.wait_line("vmtrace: the VM runs again");
        guest.go("getpid", 50).unwrap();

        // The detach inside the user's next stop.
        // (Whether or not vmtrace saw it before the signal: the detach asks.)
        user.run("stop");
        a.signal(libc::SIGINT);
        let e = a.end();
        assert_counted(&e, 50);
        assert!(
            e.stderr
                .contains("the VM stays stopped (paused (QMP stop))"),
            "{mode}: {}",
            e.stderr
        );
        assert_eq!(user.status(), "paused", "{mode}: resumed at the detach");
        let (after, _) = kernel.read(qmp);
        assert_same(
            &before,
            &after,
            &format!("by a {mode} detach in a user's stop"),
        );
        assert_no_gdbstub(qmp);
        user.run("cont");
        assert_runs_on(&guest, w.worker);
    }
}

/// `system_reset` mid-trace: the trace ends at the reset and says so,
/// with the calls before it; vmtrace writes nothing after, and the guest
/// boots again cleanly.
#[test]
fn a_reset_ends_the_trace_and_the_guest_boots_again() {
    let (bz, _) = common::linux_61();
    let user = UserMonitor::new();
    // (The harness's -no-reboot would make a reset a power-off.)
    let (guest, _) = boot_with(&user, &["-action", "reboot=reset"]);
    let a = attach(guest.qmp_socket(), &bz, "exitless");
    guest.go("getpid", 30).unwrap();
    user.run("system_reset");
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    assert!(
        e.stderr.contains("vmtrace: the guest was reset (")
            && e.stderr.contains("the trace ends there"),
        "{}",
        e.stderr
    );
    assert_eq!(count_of(&e.counts(), &GETPID), 30, "{}", e.stdout);
    assert!(
        e.json()["stop_reason"]
            .as_str()
            .is_some_and(|r| r.contains("reset")),
        "{}",
        e.stdout
    );
    // It boots again, to its workload, without a complaint.
    let w = guest.wait_ready().unwrap();
    assert_runs_on(&guest, w.worker);
    // The stub vmtrace opened is closed even so.
    assert_no_gdbstub(guest.qmp_socket());
}

/// The guest suspends to RAM mid-trace (Debian's kernel has ACPI S3; the
/// test guests do not): the trace ends there, vmtrace detaches inside the
/// suspended state without waking the machine, its memory is as found, and
/// the guest wakes (QMP `system_wakeup`) and runs on.
#[test]
fn a_suspend_ends_the_trace_with_a_detach_inside_it() {
    let bz = debian_612();
    let kernel = Kernel::from_bzimage(&bz);
    let user = UserMonitor::new();
    let guest = QemuGuest::boot(QemuOpts {
        kernel: bz.clone(),
        qemu_args: user.args(),
        ..QemuOpts::linux()
    });
    let w = guest.wait_ready().unwrap();
    let qmp = guest.qmp_socket();
    let watch = kernel.watch(qmp);
    let before = watch.read();
    let a = attach(qmp, &bz, "exitless");
    guest.go("getpid", 20).unwrap();
    let during = watch.read();
    guest.send_line("suspend");
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    assert!(
        e.stderr
            .contains("vmtrace: detached (the guest suspended to RAM (S3)): 1 sites restored"),
        "{}",
        e.stderr
    );
    assert!(
        e.stderr
            .contains("the VM stays stopped (stopped by QEMU (suspended))"),
        "{}",
        e.stderr
    );
    assert_eq!(count_of(&e.counts(), &GETPID), 20, "{}", e.stdout);
    assert_eq!(user.status(), "suspended", "vmtrace woke the guest");
    // Its ring device stays (said, with the remedy): the guardian, told
    // the attach detached, does not take that for a kill to repair.
    assert!(
        e.stderr.contains(
            "its ring device stays in the VM (the VM is stopped: its guest cannot eject it)"
        ),
        "{}",
        e.stderr
    );
    assert!(
        !e.stderr.contains("ended without detaching"),
        "{}",
        e.stderr
    );
    // The guest's own suspend changed its text (jump labels) and its
    // wake-up data: only vmtrace's bytes are compared.
    assert_restored(&before, &during, &watch.read(), "by a detach in S3");
    assert_no_gdbstub(qmp);
    wake(&guest, &user, w.worker);
    assert_runs_on(&guest, w.worker);
}

/// How long a woken guest may take to say it resumed before its state is
/// looked at (a few seconds on this host's TCG, loaded).
const RESUME_WAIT: Duration = Duration::from_secs(90);

/// Wake the suspended guest (QMP `system_wakeup`, its user's) and wait
/// for its workload to say it resumed. A VM still `suspended` after
/// [`RESUME_WAIT`] did not take the request (QEMU answered it, but the
/// machine never left the state): it is asked once more. Anything else is
/// the failure, said with QEMU's state and the console's end.
fn wake(guest: &QemuGuest, user: &UserMonitor, worker: u32) {
    let resumed = format!("workload: resumed 0 pid={worker}");
    user.run("system_wakeup");
    let Err(first) = guest.wait_for(&resumed, RESUME_WAIT) else {
        return;
    };
    let status = user.status();
    assert_eq!(status, "suspended", "woken, not resumed: {first}");
    eprintln!("the VM stayed suspended after a system_wakeup: woken again");
    user.run("system_wakeup");
    guest.wait_for(&resumed, COMMAND_TIMEOUT).unwrap();
}

/// A vCPU hot-added mid-trace (`-smp 1,maxcpus=2`, QMP `device_add`;
/// bookworm's 6.1 kernel has ACPI CPU hotplug and, unlike 6.12, takes
/// QEMU's disabled MADT entries for hot-pluggable CPUs under TCG; the
/// project's guests have no ACPI CPU hotplug), brought online and
/// the worker pinned to it: its calls are traced on a ring of its own
/// (rings for every possible CPU), exactly, and vmtrace's bytes restored.
#[test]
fn a_vcpu_hot_added_mid_trace_is_traced_on_its_own_ring() {
    let bz = debian_61();
    let kernel = Kernel::from_bzimage(&bz);
    let user = UserMonitor::new();
    let mut qemu_args = user.args();
    qemu_args.extend(["-smp".to_string(), "1,maxcpus=2".to_string()]);
    let guest = QemuGuest::boot(QemuOpts {
        kernel: bz.clone(),
        cpus: 1,
        qemu_args,
        ..QemuOpts::linux()
    });
    let w = guest.wait_ready().unwrap();
    let qmp = guest.qmp_socket();
    let watch = kernel.watch(qmp);
    let before = watch.read();
    let a = attach(qmp, &bz, "exitless");
    guest.go("getpid", 100).unwrap();
    let during = watch.read();
    user.add_vcpu("cpu1");
    // The kernel's ACPI handler registers the CPU (its sysfs node), then
    // says so (drivers/acpi/acpi_processor.c: acpi_processor_hotadd_init).
    guest
        .wait_for("CPU1 has been hot-added", COMMAND_TIMEOUT)
        .unwrap();
    for (cmd, answer) in [("online 1", "online 1 "), ("pin 1", "pinned 1 ")] {
        guest.send_line(cmd);
        let line = guest
            .wait_for(&format!("workload: {answer}"), COMMAND_TIMEOUT)
            .unwrap();
        assert!(!line.contains("error"), "{cmd}: {line}");
    }
    guest.go("getpid", 50).unwrap();
    a.signal(libc::SIGINT);
    let e = a.end();
    assert_counted(&e, 150);
    let per_cpu = &e.json()["functions"][0]["per_cpu"];
    assert_eq!(
        (per_cpu["0"].as_u64(), per_cpu["1"].as_u64()),
        (Some(100), Some(50)),
        "{per_cpu}"
    );
    // The kernel rewrote its own text for a second CPU (SMP alternatives):
    // only vmtrace's bytes are compared.
    assert_restored(&before, &during, &watch.read(), "by a trace over a hot-add");
    assert_no_gdbstub(qmp);
    assert_runs_on(&guest, w.worker);
}
