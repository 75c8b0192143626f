//! `vmtrace attach --domain` end to end on a libvirt domain (transient,
//! TCG, the default guest with the workload; tests/common/libvirt.rs), one
//! boot shared by every check: `vmtrace vms` lists it (and a plain QEMU
//! the test starts, by its QMP socket); its libvirt monitor socket given
//! as `--qmp` is refused in one line; attached by name, vmtrace counts the
//! workload's getpid calls exactly while `virsh` still works on the domain
//! (libvirt keeps its monitor: vmtrace's commands go through it); after
//! the detach the domain runs on, answers, and its low MiB and kernel text
//! are byte for byte as found, vmtrace's gdbstub gone. Killed attaches are
//! repaired (by the guardian, by `vmtrace detach --domain`), and a reset
//! (`virsh reset`) ends a trace.

mod common;

use common::attach::{count_of, kill_with_guardian, Attach};
use common::console::assert_no_complaint;
use std::path::Path;

use common::guard::{assert_same, diffs, Kernel, Memory, Watch, BAD, LOW};
use common::libvirt::{virsh, LibvirtGuest, URI};
use common::qemu::{QemuGuest, QemuOpts};
use common::{assert_bad_input, linux_61, s, stdout};

const GETPID: [&str; 2] = ["__do_sys_getpid", "__x64_sys_getpid"];

/// `virsh ARGS` succeeds; its stdout.
fn virsh_ok(args: &[&str]) -> String {
    let out = virsh(args);
    assert!(out.status.success(), "virsh {args:?}: {out:?}");
    stdout(&out)
}

/// The domain's chardevs name no gdbstub of vmtrace's (QEMU keeps the
/// stub's monitor chardev once made: `filename=gdb` may stay).
fn assert_no_gdbstub(guest: &LibvirtGuest) {
    let list = virsh_ok(&[
        "qemu-monitor-command",
        guest.name(),
        "--hmp",
        "info chardev",
    ]);
    assert!(
        !list
            .lines()
            .any(|l| l.starts_with("gdb:") || l.contains("vmtrace-gdb")),
        "{list}"
    );
}

/// `vmtrace vms --format json` lists `guest` as a running domain with its
/// QEMU and kernel, and `plain` by its QMP socket, not the domain's QEMU.
fn assert_listed(guest: &LibvirtGuest, plain: &QemuGuest) {
    let out = common::vmtrace(&["vms", "--format", "json"]);
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["libvirt"]["uri"], URI, "{v}");
    let domains = v["libvirt"]["domains"].as_array().expect("domains");
    let d = domains
        .iter()
        .find(|d| d["name"] == guest.name())
        .unwrap_or_else(|| panic!("{} not listed: {v}", guest.name()));
    assert_eq!(d["state"], "running", "{d}");
    assert_eq!(d["vcpus"], 2, "{d}");
    assert_eq!(d["memory_kib"], 256 * 1024, "{d}");
    assert_eq!(d["pid"], guest.pid(), "{d}");
    let kernel = d["kernel"].as_str().expect("booted directly");
    assert!(kernel.ends_with("/bzImage"), "{d}");
    assert_eq!(
        d["attach"],
        format!(
            "vmtrace attach --domain {} --kernel {kernel} --trace 'FUNCS'",
            guest.name()
        )
    );
    let qemus = v["qemus"].as_array().expect("qemus");
    assert!(
        qemus.iter().all(|q| q["pid"] != guest.pid()),
        "the domain's QEMU listed as a plain one: {v}"
    );
    let q = qemus
        .iter()
        .find(|q| q["pid"] == plain.pid())
        .unwrap_or_else(|| panic!("the plain QEMU (pid {}) not listed: {v}", plain.pid()));
    assert_eq!(q["qmp"], s(plain.qmp_socket()), "{q}");
    assert_eq!(q["accel"], "tcg", "{q}");
    assert_eq!(
        q["attach"],
        format!(
            "vmtrace attach --qmp {} --kernel KERNEL --trace 'FUNCS'",
            s(plain.qmp_socket())
        )
    );
}

/// libvirt's monitor socket is libvirtd's: `--qmp` on it is refused at
/// once, naming `--domain`.
fn monitor_sock_is_refused(guest: &LibvirtGuest, bz: &Path) {
    let id = guest.libvirt().id().expect("running");
    let dir = std::fs::read_dir("/var/lib/libvirt/qemu")
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("domain-{id}-")))
        })
        .expect("the domain's libvirt directory");
    let monitor = dir.join("monitor.sock");
    assert!(monitor.exists(), "{}", monitor.display());
    // libvirt shortens the name in the directory's to 20 characters.
    let short: String = guest.name().chars().take(20).collect();
    assert_bad_input(
        &[
            "attach",
            "--qmp",
            s(&monitor),
            "--kernel",
            s(bz),
            "--trace",
            "x",
        ],
        &format!("is libvirt's monitor of domain {short}, which libvirtd holds"),
    );
}

/// No gdbstub of vmtrace's is left, and the domain runs on, answers, and
/// its kernel said nothing bad.
fn assert_runs_on(guest: &LibvirtGuest, worker: u32) {
    assert_no_gdbstub(guest);
    assert_eq!(guest.state(), "running");
    guest.console.send_line("ping");
    guest
        .console
        .wait_for(
            &format!("workload: pong pid={}", worker),
            common::qemu::COMMAND_TIMEOUT,
        )
        .unwrap();
    assert_no_complaint(&guest.console.text(), &BAD, "");
}

#[test]
fn a_domain_is_listed_traced_by_name_exactly_and_left_as_found() {
    let (bz, vmlinux) = linux_61();
    let kernel = Kernel::new(&vmlinux);
    let (guest, w) = LibvirtGuest::boot("attach", 2);

    // Listed, beside a plain QEMU (its QMP socket is there once it starts).
    let plain = QemuGuest::boot(QemuOpts::linux());
    assert_listed(&guest, &plain);
    drop(plain);

    monitor_sock_is_refused(&guest, &bz);

    let watch = kernel.watch_ram(&guest.ram_layout(), guest.pid());
    let before = watch.read();
    let a = Attach::start_domain(
        guest.name(),
        &[
            "--kernel",
            s(&bz),
            "--format",
            "json",
            "--trace",
            "__x64_sys_getpid",
        ],
    );
    let mut a = a.attached();
    let line = a.wait_line("vmtrace: attached to ");
    assert!(
        line.starts_with(&format!(
            "vmtrace: attached to libvirt domain {} ({URI}): QEMU ",
            guest.name()
        )),
        "{line}"
    );
    guest.console.go("getpid", 1000).unwrap();
    // libvirt and its tools work on the domain during the trace.
    assert_eq!(virsh_ok(&["domstate", guest.name()]).trim(), "running");
    let status = virsh_ok(&["qemu-monitor-command", guest.name(), "--hmp", "info status"]);
    assert_eq!(status.trim(), "VM status: running");
    let during = watch.read();
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    assert!(
        e.stderr
            .contains("vmtrace's code and page-table entries taken out; the guest runs on"),
        "{}",
        e.stderr
    );
    let counts = e.counts();
    assert_eq!(count_of(&counts, &GETPID), 1000, "{counts:?}");
    assert_eq!(e.json()["dropped"], 0, "{}", e.stdout);
    let vmm = e.json()["vmm"].as_str().unwrap_or_default().to_string();
    assert!(
        vmm.ends_with(&format!("libvirt domain {} ({URI})", guest.name())),
        "{}",
        e.stdout
    );

    // vmtrace was there (its pages, its site), and is gone.
    assert!(diffs(&before, &during).iter().any(|x| x.0 < LOW));
    assert_same(
        &before,
        &watch.read(),
        "by an attach by name and its detach",
    );
    assert_runs_on(&guest, w.worker);

    killed_attaches_are_repaired(&guest, &bz, &watch, &before);
    a_reset_ends_the_trace(&guest, &bz);
}

/// `virsh reset` mid-trace (libvirt's `system_reset`; QEMU's events are
/// libvirtd's, so vmtrace tells it from CPU 0's state): the trace ends
/// there with the calls before it, and the domain boots again.
fn a_reset_ends_the_trace(guest: &LibvirtGuest, bz: &Path) {
    let a = Attach::start_domain(
        guest.name(),
        &[
            "--kernel",
            s(bz),
            "--format",
            "json",
            "--trace",
            "__x64_sys_getpid",
        ],
    );
    let a = a.attached();
    guest.console.go("getpid", 30).unwrap();
    virsh_ok(&["reset", guest.name()]);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    assert!(
        e.stderr.contains("vmtrace: the guest was reset (")
            && e.stderr.contains("the trace ends there"),
        "{}",
        e.stderr
    );
    assert_eq!(count_of(&e.counts(), &GETPID), 30, "{}", e.stdout);
    guest.console.wait_ready().unwrap();
    assert_eq!(guest.state(), "running");
}

/// `vmtrace attach --domain` killed: in trap mode its guardian repairs the
/// domain at once (it never freezes at a breakpoint); exitless, with its
/// guardian killed too, `vmtrace detach --domain` takes vmtrace's region
/// out (its stub made where libvirt's QEMU user can). Each time the
/// domain runs on with its memory as found.
fn killed_attaches_are_repaired(guest: &LibvirtGuest, bz: &Path, watch: &Watch, before: &Memory) {
    let trap = ["--mode", "trap", "--trace", "__x64_sys_getppid"];
    let mut a = Attach::start_domain(guest.name(), &[&["--kernel", s(bz)][..], &trap].concat());
    let line = a.wait_line("vmtrace: attached to ");
    assert!(line.contains("trap mode"), "{line}");
    guest.console.go("getppid", 3).unwrap();
    a.signal(libc::SIGKILL);
    let e = a.end();
    for n in [
        "its guardian repairs the VM",
        "removed vmtrace's breakpoints",
        "vmtrace: repaired; the VM is as vmtrace would leave it",
    ] {
        assert!(e.stderr.contains(n), "{n:?} in {}", e.stderr);
    }
    guest.console.go("getppid", 1).unwrap();
    assert_same(
        before,
        &watch.read(),
        "after a killed trap-mode attach, by its guardian",
    );

    let a = Attach::start_domain(
        guest.name(),
        &["--kernel", s(bz), "--trace", "__x64_sys_getpid"],
    );
    let a = a.attached();
    guest.console.go("getpid", 3).unwrap();
    kill_with_guardian(a);
    assert!(
        !diffs(before, &watch.read()).is_empty(),
        "vmtrace's region unseen"
    );
    let out = common::vmtrace(&["detach", "--domain", guest.name()]);
    let err = common::stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.trim_end()
            .ends_with("vmtrace: repaired; the VM is as vmtrace would leave it"),
        "{err}"
    );
    guest.console.go("getpid", 1).unwrap();
    assert_same(before, &watch.read(), "after vmtrace detach --domain");
    assert_no_gdbstub(guest);
    let out = common::vmtrace(&["detach", "--domain", guest.name()]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        common::stderr(&out).contains("nothing of vmtrace's found"),
        "{out:?}"
    );
}
