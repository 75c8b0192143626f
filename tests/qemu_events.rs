//! `vmtrace list -e` against the kernel itself: Debian's 6.12 cloud kernel
//! (its vmlinuz alone: kallsyms and BTF from the payload), booted in
//! QEMU/TCG with the workload initramfs, prints its tracefs
//! `available_events` (the workload's `ftrace events`); the events vmtrace
//! reads from the image are exactly those, by name.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::qemu::*;
use common::{s, vmtrace};

/// Longest wait for the ~1,500 event lines on the console.
const EVENTS_TIMEOUT: Duration = Duration::from_secs(120);

#[test]
fn list_e_names_exactly_the_events_the_running_kernel_lists() {
    let bz = debian_612();
    let out = vmtrace(&["list", "-e", "--kernel", s(&bz)]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ours: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split(' ').next().unwrap().to_owned())
        .collect();

    let guest = QemuGuest::boot(QemuOpts {
        kernel: bz.clone(),
        ..QemuOpts::linux()
    });
    guest.wait_ready().unwrap();
    guest.send_line("ftrace events");
    let mut theirs = BTreeSet::new();
    let count = loop {
        let line = guest.wait_for("workload: event", EVENTS_TIMEOUT).unwrap();
        if let Some(n) = line.split("workload: events ").nth(1) {
            break n.trim().parse::<usize>().unwrap();
        }
        let name = line.split("workload: event ").nth(1).unwrap();
        theirs.insert(name.trim().to_owned());
    };
    assert_eq!(count, theirs.len(), "an event listed twice");
    let missing: Vec<_> = theirs.difference(&ours).collect();
    let extra: Vec<_> = ours.difference(&theirs).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "the kernel lists {} events, vmtrace {}; not found by vmtrace: {missing:?}; \
         not listed by the kernel: {extra:?}",
        theirs.len(),
        ours.len()
    );
    assert!(ours.contains("sched:sched_switch") && ours.contains("syscalls:sys_enter_openat"));
}
