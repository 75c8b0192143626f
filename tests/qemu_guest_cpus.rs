//! Exitless `vmtrace attach` to guests that do not run all of QEMU's vCPUs
//! (issue 34, items 11 and 5): QEMU runs two, the default guest's kernel
//! uses one (`nosmp`), or has a second one possible but offline
//! (`maxcpus=1`) and brings it online mid-trace. vmtrace plans and checks
//! its per-CPU rings for the guest's own CPUs (its `nr_cpu_ids` and
//! possible mask), not QEMU's: the attach succeeds, counts are exact (per
//! CPU too), the memory vmtrace used is as before, the guest runs on.
//! One QEMU at a time; no test asserts a time.

mod common;

use common::attach::*;
use common::guard::*;
use common::qemu::*;
use common::s;

/// getpid's function, named by one of its aliases.
const GETPID: [&str; 2] = ["__do_sys_getpid", "__x64_sys_getpid"];

/// The default guest with two vCPUs in QEMU and `append` on its command line.
fn boot(append: &str) -> QemuGuest {
    QemuGuest::boot(QemuOpts {
        append: append.into(),
        ..QemuOpts::linux()
    })
}

/// An exitless attach tracing getpid, its report in JSON.
fn attach(guest: &QemuGuest, bz: &std::path::Path) -> Attach {
    let args = [
        "--kernel",
        s(bz),
        "--mode",
        "exitless",
        "--trace",
        "__x64_sys_getpid",
        "--format",
        "json",
    ];
    Attach::start(guest.qmp_socket(), &args).attached()
}

/// Ctrl-C, a clean detach with nothing dropped, and getpid's count per CPU
/// (the JSON report's `per_cpu`).
fn detach(a: Attach) -> (u64, serde_json::Value) {
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    assert!(
        e.stderr
            .contains("vmtrace's code and page-table entries taken out; the guest runs on"),
        "{}",
        e.stderr
    );
    assert_eq!(e.json()["dropped"], 0, "{}", e.stdout);
    let count = count_of(&e.counts(), &GETPID);
    let f = e.json()["functions"][0].clone();
    (count, f["per_cpu"].clone())
}

/// A console line of the workload's answer to `command`.
fn run(guest: &QemuGuest, command: &str, answer: &str) {
    guest.send_line(command);
    let line = guest
        .wait_for(&format!("workload: {answer}"), COMMAND_TIMEOUT)
        .unwrap();
    assert!(!line.contains("error"), "{command}: {line}");
}

/// `-smp 2` and `nosmp`: the guest's one CPU number (`nr_cpu_ids` 1).
/// CPU 1's `__per_cpu_offset` entry points at the per-CPU template the
/// kernel freed after boot (0xcc bytes): it was read, as one of QEMU's two
/// vCPUs, and the attach refused ("CPU 1's per-CPU CPU number reads
/// 3435973836"). Now only the guest's possible CPUs are read.
#[test]
fn nosmp_guest_under_two_vcpus_is_traced_exactly_and_restored() {
    let (bz, vmlinux) = common::linux_61();
    let kernel = Kernel::new(&vmlinux);
    let guest = boot("nosmp");
    let w = guest.wait_ready().unwrap();
    let qmp = guest.qmp_socket();
    let (before, _) = kernel.read(qmp);

    let a = attach(&guest, &bz);
    guest.go("getpid", 400).unwrap();
    let (count, _) = detach(a);
    assert_eq!(count, 400);

    let (after, _) = kernel.read(qmp);
    assert_same(&before, &after, "by an attach to a nosmp guest");
    assert_no_gdbstub(qmp);
    assert_runs_on(&guest, w.worker);
}

/// `-smp 2` and `maxcpus=1`: CPU 1 is possible (CPU hotplug) but offline.
/// First an attach and detach with it offline (memory restored); then one
/// during which the guest brings CPU 1 online and the worker moves there:
/// CPU 1's calls go to its own ring (rings are made for every possible CPU,
/// and a CPU past them would be counted as dropped, never written past
/// them). Exact counts per CPU; the kernel's text as before but for the
/// kernel's own rewrite for SMP; the guest runs on. (Bringing a CPU up also
/// writes the kernel's real-mode trampoline in the low MiB, so only the
/// text is compared after the second attach.)
#[test]
fn a_cpu_brought_online_mid_trace_is_traced_on_its_own_ring() {
    let (bz, vmlinux) = common::linux_61();
    let kernel = Kernel::new(&vmlinux);
    let guest = boot("maxcpus=1");
    let w = guest.wait_ready().unwrap();
    let qmp = guest.qmp_socket();
    let (before, _) = kernel.read(qmp);

    let a = attach(&guest, &bz);
    guest.go("getpid", 300).unwrap();
    let (count, per_cpu) = detach(a);
    assert_eq!(count, 300);
    assert_eq!(per_cpu["0"], 300, "{per_cpu}");
    let (after, _) = kernel.read(qmp);
    assert_same(&before, &after, "by an attach with CPU 1 offline");

    let a = attach(&guest, &bz);
    guest.go("getpid", 300).unwrap();
    run(&guest, "online 1", "online 1 ");
    run(&guest, "pin 1", "pinned 1 ");
    guest.go("getpid", 200).unwrap();
    let (count, per_cpu) = detach(a);
    assert_eq!(count, 500);
    assert_eq!(
        (per_cpu["0"].as_u64(), per_cpu["1"].as_u64()),
        (Some(300), Some(200)),
        "{per_cpu}"
    );
    // The text differs where the kernel itself rewrote it: with a second
    // CPU online it turns its SMP alternatives' `ds` prefixes (0x3e, its
    // uniprocessor form) back into `lock` (0xf0; arch/x86/kernel/
    // alternative.c `alternatives_smp_lock`). Any other byte is vmtrace's.
    let (again, _) = kernel.read(qmp);
    let text: Vec<_> = diffs(&before, &again)
        .into_iter()
        .filter(|d| d.0 >= LOW)
        .collect();
    assert!(
        !text.is_empty(),
        "CPU 1 came online without SMP alternatives"
    );
    let other: Vec<_> = text.iter().filter(|d| (d.1, d.2) != (0x3e, 0xf0)).collect();
    assert!(other.is_empty(), "text changed: {other:x?}");
    assert_no_gdbstub(qmp);
    assert_runs_on(&guest, w.worker);
}
