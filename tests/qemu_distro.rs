//! `vmtrace attach` on a distribution kernel vmtrace's tests did not build:
//! Debian's 6.12 cloud kernel (guest/build.sh debian-6.12), given as its
//! vmlinuz alone (symbols from its kallsyms), booted in QEMU/TCG with the
//! workload initramfs. It has KASLR, IBT, return thunks, ITS and call-depth
//! tracking, and so rewrites its own text at boot in nearly every function:
//! the check that the file is the running kernel's must allow for that
//! (it refused this kernel). Exact counts, memory as found, in both modes.

mod common;

use common::attach::*;
use common::guard::*;
use common::qemu::*;
use common::s;

/// getpid's function: `__x64_sys_getpid` and `__do_sys_getpid` share an
/// address, and the report names it by one of them.
const GETPID: [&str; 2] = ["__do_sys_getpid", "__x64_sys_getpid"];

#[test]
fn a_distribution_kernel_is_traced_exactly_and_left_as_found() {
    let bz = debian_612();
    let kernel = Kernel::from_bzimage(&bz);
    let guest = QemuGuest::boot(QemuOpts {
        kernel: bz.clone(),
        ..QemuOpts::linux()
    });
    let w = guest.wait_ready().unwrap();
    let qmp = guest.qmp_socket();
    let (before, _) = kernel.read(qmp);
    for (mode, calls) in [("exitless", 300), ("trap", 40)] {
        let args = [
            "--kernel",
            s(&bz),
            "--format",
            "json",
            "--trace",
            "__x64_sys_getpid",
            "--mode",
            mode,
        ];
        let mut a = Attach::start(qmp, &args);
        let line = a.wait_line("vmtrace: attached to QEMU");
        assert!(line.contains(mode), "{line}");
        guest.go("getpid", calls).unwrap();
        a.signal(libc::SIGINT);
        let e = a.end();
        assert!(e.status.success(), "{mode}: {}: {}", e.status, e.stderr);
        assert_eq!(
            count_of(&e.counts(), &GETPID),
            calls,
            "{mode}: {}",
            e.stdout
        );
        assert_eq!(e.json()["dropped"], 0, "{}", e.stdout);
        let (after, _) = kernel.read(qmp);
        assert_same(
            &before,
            &after,
            &format!("by a {mode} trace of Debian's kernel"),
        );
        assert_no_gdbstub(qmp);
        assert_runs_on(&guest, w.worker);
    }
}
