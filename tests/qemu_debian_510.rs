//! vmtrace on a kernel before 5.13 (issue 40): Debian bullseye's own 5.10
//! cloud kernel (guest/build.sh debian-5.10; the vmlinuz alone, symbols
//! from its kallsyms). Its `__mcount_loc` table is not sorted at build
//! time, as 6.1's and 6.12's are: vmtrace must still find all of it.
//! `list` needs no guest; the attaches share one boot: trap mode with
//! exact counts, then exitless, each leaving the low MiB and the text as
//! found; then a module of the kernel's own package (binfmt_misc), read
//! with 5.10's `struct module` and traced by name.

mod common;

use std::time::Duration;

use common::attach::*;
use common::guard::*;
use common::qemu::*;
use common::{s, stderr, stdout, vmtrace};
use tracer::qemu::qmp::Qmp;

/// getpid's function, by either of the names sharing its address.
const GETPID: [&str; 2] = ["__do_sys_getpid", "__x64_sys_getpid"];
/// How the attach names its ring device.
const DEVICE: &str = "vmtrace-ivshmem-";

/// Every function with an ftrace site is listed traceable: the sites are
/// the whole table (33,982 in 5.10.0-32; 534 when only its first sorted
/// run was taken), and getpid's is among them.
#[test]
fn list_names_the_functions_of_a_510_vmlinuz() {
    let bz = debian_510();
    let o = vmtrace(&["list", "--kernel", s(&bz)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    let sites: usize = err
        .split(" sites)")
        .next()
        .and_then(|h| h.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no site count in: {err}"));
    let out = stdout(&o);
    let all: Vec<&str> = out.lines().collect();
    let traceable = all.iter().filter(|l| !l.contains('[')).count();
    // kallsyms' own count of functions bounds the listed ones; a 5.10
    // kernel has ftrace sites in most of its functions.
    assert!(sites > 30_000, "{err}");
    assert!(traceable > 30_000 && traceable < all.len(), "{err}");
    for f in GETPID {
        assert!(all.contains(&f), "{f} not listed traceable: {err}");
    }
}

#[test]
fn a_510_guest_is_traced_in_trap_mode_and_exitless() {
    let bz = debian_510();
    let guest = QemuGuest::boot(QemuOpts {
        kernel: bz.clone(),
        // The workload with the kernel's own binfmt_misc.ko (guest/build.sh
        // debian-5.10), for the module check at the end.
        initrd: Some(common::root().join("guest/out/debian-5.10/workload-mod.cpio.gz")),
        ..QemuOpts::linux()
    });
    let w = guest.wait_ready().unwrap();
    let qmp = guest.qmp_socket();
    let kernel = Kernel::from_bzimage(&bz);
    let (memory, _) = kernel.read(qmp);
    let pci = info_pci(qmp);

    let base = ["--kernel", s(&bz), "--format", "json", "--trace"];
    let mut a = Attach::start(
        qmp,
        &[&base[..], &["__x64_sys_getpid", "--mode", "trap"]].concat(),
    );
    a.wait_line("vmtrace: attached to QEMU");
    guest.go("getpid", 300).unwrap();
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    assert_eq!(count_of(&e.counts(), &GETPID), 300, "{}", e.stderr);
    let (after, _) = kernel.read(qmp);
    assert_same(&memory, &after, "after a trap-mode trace");
    assert_no_gdbstub(qmp);

    // Exitless: the low MiB is not known unused before 5.13, so the code
    // and the rings live in the ring device.
    let mut a = Attach::start(
        qmp,
        &[&base[..], &["__x64_sys_getpid", "--mode", "exitless"]].concat(),
    );
    let line = a.wait_line("vmtrace: attached to QEMU");
    assert!(
        line.contains("code and rings in a hot-plugged ivshmem device")
            && line.contains("no guest page used"),
        "{line}"
    );
    assert!(info_pci(qmp).contains(DEVICE));
    guest.go("getpid", 500).unwrap();
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    assert_eq!(count_of(&e.counts(), &GETPID), 500, "{}", e.stderr);
    let (after, _) = kernel.read(qmp);
    assert_same(&memory, &after, "after an exitless trace");
    assert_eq!(info_pci(qmp), pci, "the ring device is gone");
    assert_no_gdbstub(qmp);

    // The function graph: its return stubs in the device too, every
    // return of a 500-call burst kept.
    let exitless = ["--mode", "exitless", "--graph"];
    let mut a = Attach::start(
        qmp,
        &[&base[..], &["__x64_sys_getpid"], &exitless[..]].concat(),
    );
    a.wait_line("vmtrace: attached to QEMU");
    guest.go("getpid", 500).unwrap();
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    let j = e.json();
    assert_eq!(j["events_stored"], 500, "{j}");
    assert_eq!(j["graph"]["returns_stored"], 500, "{j}");
    let (after, _) = kernel.read(qmp);
    assert_same(&memory, &after, "after an exitless graph trace");
    assert_eq!(info_pci(qmp), pci);

    // Killed with its guardian: `vmtrace detach` takes the region out of
    // the page tables (its tables in the device) and the device away.
    let pid = Qmp::connect(qmp, Duration::from_secs(10))
        .unwrap()
        .pid()
        .unwrap();
    let mut a = Attach::start(
        qmp,
        &[&base[..], &["__x64_sys_getpid", "--mode", "exitless"]].concat(),
    );
    a.wait_line("vmtrace: attached to QEMU");
    kill_with_guardian(a);
    assert_eq!(ring_files(pid).len(), 1);
    detach_removes_ring_device(qmp);
    let (after, _) = kernel.read(qmp);
    assert_same(&memory, &after, "after a killed attach and vmtrace detach");
    assert_eq!(info_pci(qmp), pci);
    assert_eq!(ring_files(pid), Vec::<String>::new());
    assert_no_gdbstub(qmp);
    guest.go("getpid", 10).unwrap();

    a_510_module_is_traced_by_name(&guest, &bz, w.worker);
}

/// A module of Debian's own 5.10 package, binfmt_misc, loaded: read from
/// the guest's memory with 5.10's `struct module` (its text in
/// `core_layout`, before 6.4's `mem[]`) and traced by name in trap mode:
/// its `load_misc_binary`, the first binary format execve tries, exactly
/// once per `execve` of a file no format takes (the .ko itself).
fn a_510_module_is_traced_by_name(guest: &QemuGuest, bz: &std::path::Path, worker: u32) {
    const N: u64 = 5;
    let ask = |line: &str, reply: &str| {
        guest.send_line(line);
        let got = guest.wait_for(reply, COMMAND_TIMEOUT).unwrap();
        let want = format!("workload: {reply} pid={worker}");
        assert!(got.contains(&want), "{line}: {got}");
    };
    ask("insmod /binfmt_misc.ko", "insmod 0");
    let a = attach_json(
        guest.qmp_socket(),
        bz,
        "load_misc_binary",
        &["--mode", "trap"],
    );
    ask(&format!("exec {N} /binfmt_misc.ko"), &format!("exec {N}"));
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    assert!(
        e.stderr.contains("1 loaded module in the guest"),
        "{}",
        e.stderr
    );
    assert_eq!(
        e.counts().get("load_misc_binary [binfmt_misc]"),
        Some(&N),
        "{}",
        e.stdout
    );
    assert_no_gdbstub(guest.qmp_socket());
}
