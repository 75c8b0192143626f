//! `vmtrace attach -e`: the kernel's tracepoints traced from the host in
//! Debian's 6.12 cloud kernel (jump labels, KASLR, static calls) under
//! QEMU/TCG with the workload: while attached, each selected event's call
//! site holds vmtrace's jump (the kernel's own JMP, over its NOP) and trap
//! mode passes its `tp->funcs` test; exactly one `sched_process_fork` per
//! fork and one `task_rename` per rename; after the detach the kernel's
//! text is as found, the guest runs on, and its console has no BUG or
//! WARNING (jump_label's checks); a killed attach's guardian restores them
//! from the journal; the guest enabling and disabling a traced event itself
//! meanwhile keeps working. Trap mode (auto mode's choice for such events), whose
//! only writes to the guest are those jumps.

mod common;

use std::time::Duration;

use common::attach::*;
use common::guard::*;
use common::qemu::*;
use common::s;

/// The first byte of the kernel's NOPs and of the JMP of the same length
/// (arch/x86/kernel/jump_label.c: `0f 1f 44 00 00` / `e9 rel32`,
/// `66 90` / `eb rel8`).
const NOP_TO_JMP: [(u8, u8); 2] = [(0x0f, 0xe9), (0x66, 0xeb)];

#[test]
fn event_sites_are_jumps_while_attached_and_nops_after() {
    let bz = debian_612();
    let kernel = Kernel::from_bzimage(&bz);
    let guest = QemuGuest::boot(QemuOpts {
        kernel: bz.clone(),
        ..QemuOpts::linux()
    });
    let w = guest.wait_ready().unwrap();
    let qmp = guest.qmp_socket();
    let watch = kernel.watch(qmp);
    let before = watch.read();
    let args = [
        "--kernel",
        s(&bz),
        "--format",
        "json",
        "-e",
        "sched:sched_process_fork,task:task_rename",
        // The workload's tasks only: the guest's kernel threads fork too.
        "--comm",
        "wl-*",
    ];
    let mut a = Attach::start(qmp, &args);
    // Auto mode: breakpoints pass the events' `tp->funcs` tests.
    let line = a.wait_line("vmtrace: attached to QEMU");
    assert!(line.contains("trap mode"), "{line}");
    a.wait_line("kernel with static calls are recorded at breakpoint stops");
    let line = a.wait_line("call sites of the events enabled");
    assert!(line.starts_with("vmtrace: 2 call sites"), "{line}");
    let during = watch.read();
    // The events' code runs with the sites enabled: forks and renames.
    guest.send_line("spawn 1 3");
    guest
        .wait_for("workload: spawned 1", Duration::from_secs(60))
        .unwrap();
    guest.send_line("rename 2");
    guest
        .wait_for("workload: renamed 2", Duration::from_secs(60))
        .unwrap();
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    // One call site each (kernel_clone, __set_task_comm): a NOP made a JMP.
    let changed = diffs(&before, &during);
    let opcodes = changed.iter().filter(|d| NOP_TO_JMP.contains(&(d.1, d.2)));
    assert_eq!(opcodes.count(), 2, "{changed:x?}");
    assert!(changed.len() <= 2 * 5, "{changed:x?}");
    assert!(!e.stderr.contains("not recorded yet"), "{}", e.stderr);
    // One fork per child; a rename per child (wl-child) and per `rename`
    // step of the worker's, and its rename back.
    let counts = e.counts();
    let fork = count_of(&counts, &["__traceiter_sched_process_fork"]);
    let rename = count_of(&counts, &["__traceiter_task_rename"]);
    assert_eq!((fork, rename), (3, 3 + 2 + 1), "{}", e.stdout);
    assert_same(&before, &watch.read(), "by a trace of events");
    assert_no_gdbstub(qmp);
    assert_runs_on(&guest, w.worker);
    // Killed while attached: its guardian gives the sites back their NOPs
    // from the journal, and takes the breakpoints out.
    let mut a = Attach::start(qmp, &args);
    a.wait_line("call sites of the events enabled");
    a.signal(libc::SIGKILL);
    let e = a.end();
    for n in [
        "2 event call sites given back their NOP",
        "vmtrace: repaired; the VM is as vmtrace would leave it",
    ] {
        assert!(e.stderr.contains(n), "{n:?} in {}", e.stderr);
    }
    assert_same(
        &before,
        &watch.read(),
        "after a killed attach, by its guardian",
    );
    assert_no_gdbstub(qmp);
    assert_runs_on(&guest, w.worker);
    // The guest enables a traced event itself, and disables it: its
    // jump_label finds its own NOP each time (vmtrace gives the site back
    // at the kernel's patching), and the detach leaves what it did.
    let mut a = Attach::start(qmp, &args);
    let line = a.wait_line("call sites of the events enabled");
    assert!(line.contains("the guest may enable these events"), "{line}");
    for on in ["1", "0"] {
        guest.send_line(&format!("ftrace event sched:sched_process_fork {on}"));
        guest
            .wait_for(
                "workload: ftrace event sched:sched_process_fork=0",
                Duration::from_secs(60),
            )
            .unwrap();
        guest.send_line("spawn 1 1");
        guest
            .wait_for("workload: spawned 1", Duration::from_secs(60))
            .unwrap();
    }
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    assert_same(
        &before,
        &watch.read(),
        "after the guest enabled an event itself",
    );
    assert_runs_on(&guest, w.worker);
    let console = guest.console();
    assert!(
        !console.contains("BUG") && !console.contains("WARNING"),
        "{console}"
    );
}
