//! `vmtrace attach --graph` on a kernel that preempts tasks in kernel
//! mode: Debian's 6.12 cloud kernel (guest/build.sh debian-6.12) booted
//! with `preempt=full` on one vCPU, two tasks calling getpid(2) in a loop
//! so that the scheduler switches between them at its ticks, anywhere,
//! vmtrace's trampoline and return hook included. Twenty attach/detach
//! cycles: each detach takes vmtrace's code out only once no task is
//! inside it (a preempted task's stack is walked), and the guest never
//! returns into a page that is gone: its tasks' calls keep coming, no
//! Oops, every byte as found.

mod common;

use std::thread;
use std::time::Duration;

use common::attach::*;
use common::guard::*;
use common::qemu::*;
use common::s;

/// getpid's function: `__x64_sys_getpid` and `__do_sys_getpid` share an
/// address, and the report names it by one of them.
const GETPID: [&str; 2] = ["__do_sys_getpid", "__x64_sys_getpid"];

/// getpid calls each of the two tasks makes: more than the test lasts.
const CALLS: u64 = 1_000_000_000;

#[test]
fn a_preempted_task_never_returns_into_removed_code() {
    let bz = debian_612();
    let kernel = Kernel::from_bzimage(&bz);
    let guest = QemuGuest::boot(QemuOpts {
        kernel: bz.clone(),
        cpus: 1,
        append: "preempt=full".into(),
        ..QemuOpts::linux()
    });
    guest.wait_ready().unwrap();
    let qmp = guest.qmp_socket();
    let (before, _) = kernel.read(qmp);
    let args = [
        "--kernel",
        s(&bz),
        "--graph",
        "--trace",
        "__x64_sys_getpid",
        "--format",
        "json",
    ];
    guest.send_line(&format!("spawn {CALLS} 2"));
    for cycle in 0..20 {
        let mut a = Attach::start(qmp, &args);
        a.wait_line("vmtrace: attached to QEMU");
        thread::sleep(Duration::from_millis(200 + 37 * cycle));
        a.signal(libc::SIGINT);
        let e = a.end();
        assert!(
            e.status.success(),
            "cycle {cycle}: {}: {}",
            e.status,
            e.stderr
        );
        assert!(
            e.stderr
                .contains("vmtrace's code and page-table entries taken out"),
            "cycle {cycle}: {}",
            e.stderr
        );
        // The two tasks ran on through the cycle: the guest lives.
        assert!(
            count_of(&e.counts(), &GETPID) > 0,
            "cycle {cycle}: no call traced: {}",
            e.stdout
        );
        let console = guest.console();
        for bad in BAD {
            assert!(!console.contains(bad), "cycle {cycle}: {bad:?}:\n{console}");
        }
    }
    let (after, _) = kernel.read(qmp);
    assert_same(&before, &after, "by twenty --graph cycles");
    assert_no_gdbstub(qmp);
}
