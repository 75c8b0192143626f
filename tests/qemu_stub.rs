//! The gdbstub under `vmtrace attach` against a real QEMU/TCG guest (issue
//! 34, item 9): a client dropped while it holds the guest stopped lets it
//! run, even one that found the stub busy and that QEMU lets in later; a
//! debugger already connected is never joined nor displaced (one
//! line, exit 2, the guest running, the debugger's connection intact); a
//! `--gdb` that is not QEMU's stub is never connected to; vmtrace's own
//! stub listens in a private 0700 directory, gone after (the user's stub
//! it replaced reopened); an error after
//! the stub connected (a vmlinux of another kernel) leaves the guest
//! running. One boot runs every check, in sequence.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::attach::{gdb_socket, Attach};
use common::guard::{assert_no_gdbstub, assert_runs_on};
use common::qemu::{linux_acpi_bzimage, QemuGuest, QemuOpts};
use common::{s, wait_bounded};
use tracer::qemu::gdb::{Gdb, GdbAddr, GdbError};
use tracer::qemu::qmp::Qmp;
use tracer::qemu::queries::Queries;
use tracer::qemu::stub;

const TIMEOUT: Duration = Duration::from_secs(10);
/// How long a queued stub connection is given to be let in and served.
const SETTLE: Duration = Duration::from_secs(2);

fn qmp(path: &Path) -> Qmp {
    Qmp::connect(path, TIMEOUT).unwrap()
}

fn status(path: &Path) -> String {
    qmp(path).status().unwrap()
}

/// `vmtrace attach --kernel KERNEL --trace __x64_sys_getpid ARGS` to its
/// end: exit 2 and one `vmtrace: ` line holding `needle`.
fn refused(qmp: &Path, kernel: &Path, args: &[&str], needle: &str) {
    let child = Command::new(env!("CARGO_BIN_EXE_vmtrace"))
        .args(["attach", "--qmp", s(qmp), "--kernel", s(kernel)])
        .args(["--trace", "__x64_sys_getpid", "-q"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = wait_bounded(child);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: one line: {err}");
    assert!(err.starts_with("vmtrace: "), "{err}");
    assert!(err.contains(needle), "{needle:?} in {err}");
    assert!(no_private_dir_of(pid), "vmtrace {pid} left its directory");
}

/// No `vmtrace-gdb-PID-*` directory is left.
fn no_private_dir_of(pid: u32) -> bool {
    let prefix = format!("{}{pid}-", stub::DIR_PREFIX);
    let bases = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .into_iter()
        .chain([std::env::temp_dir()]);
    !bases
        .filter_map(|b| std::fs::read_dir(b).ok())
        .flatten()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with(&prefix))
}

#[test]
fn the_gdbstub_is_private_and_never_shared() {
    let (bz, _) = common::linux_61();
    // Another build's vmlinux: its banner is not the running kernel's.
    linux_acpi_bzimage();
    let other = common::root().join("guest/out/linux-acpi/vmlinux");
    let guest = QemuGuest::boot(QemuOpts::linux());
    let w = guest.wait_ready().unwrap();
    let q = guest.qmp_socket();
    let user_sock = guest.dir().join("user-gdb.sock");
    let user = GdbAddr::Unix(user_sock.clone());

    // A client dropped while it holds the guest stopped (QEMU stopped it
    // at the connect) detaches: QEMU 7.2 would keep it paused.
    let mut m = qmp(q);
    m.open_gdbserver(&format!("unix:{},server=on,wait=off", user_sock.display()))
        .unwrap();
    let g = Gdb::connect(&user, TIMEOUT).unwrap();
    assert_eq!(m.status().unwrap(), "paused", "a debugger's connect stops");
    drop(g);
    assert_eq!(m.status().unwrap(), "running", "the dropped client let go");
    drop(m);

    // A connect that finds the stub busy waits in its accept queue; QEMU
    // lets it in once the debugger before it goes, and stops the guest
    // then. The client dropped at the busy error wrote its detach into
    // that connection: QEMU reads it and resumes the guest.
    let mut first = Gdb::connect(&user, TIMEOUT).unwrap();
    first.resume().unwrap();
    match Gdb::connect(&user, Duration::from_millis(500)) {
        Err(GdbError::Busy { .. }) => {}
        Err(e) => panic!("a second connect: {e}"),
        Ok(_) => panic!("a second connect was served"),
    }
    first.stop().unwrap();
    let mut m = qmp(q);
    let _ = m.take_events();
    first.detach().unwrap();
    drop(first);
    // The queued connection let in: its STOP, then the guest running
    // (a hang guard, not a time bound).
    let detached = Instant::now();
    let deadline = detached + Duration::from_secs(60);
    let mut stopped = false;
    loop {
        let st = m.status().unwrap();
        stopped |= m.take_events().stop;
        // (QEMU lets the queued connection in soon after: a settling
        // time, not a bound.)
        if stopped && st == "running" && detached.elapsed() > SETTLE {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "status {st}, QEMU let the queued connection in: {stopped}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(m);

    // Another debugger on the user's stub, the guest running under it.
    let mut debugger = Gdb::connect(&user, TIMEOUT).unwrap();
    debugger.resume().unwrap();
    assert_eq!(status(q), "running");
    let user_arg = user_sock.to_str().unwrap();
    for args in [&["--gdb", user_arg][..], &[]] {
        // Neither joined (--gdb) nor displaced (vmtrace's own stub would
        // replace the user's).
        refused(q, &bz, args, "already has a debugger connected");
        assert_eq!(status(q), "running", "{args:?}");
    }
    // Its connection is intact: it stops, reads and lets go.
    debugger.stop().unwrap();
    assert_eq!(debugger.threads().unwrap().len(), 2, "2 vCPUs");
    debugger.detach().unwrap();
    drop(debugger);
    assert_eq!(status(q), "running");

    // A --gdb that is not QEMU's stub is never connected to.
    let fake_sock = guest.dir().join("fake.sock");
    let fake = UnixListener::bind(&fake_sock).unwrap();
    fake.set_nonblocking(true).unwrap();
    refused(q, &bz, &["--gdb", s(&fake_sock)], "is not QEMU's");
    let e = fake.accept().expect_err("no connection");
    assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);

    // vmtrace's own stub: in a private 0700 directory while attached,
    // gone after; the user's stub it replaced is back.
    let a = Attach::start(q, &["--kernel", s(&bz), "--trace", "__x64_sys_getpid"]).attached();
    let sock = gdb_socket(&a);
    let dir = sock.parent().unwrap().to_path_buf();
    let meta = std::fs::metadata(&dir).unwrap();
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o700,
        "{}",
        dir.display()
    );
    // SAFETY: geteuid has no preconditions.
    assert_eq!(meta.uid(), unsafe { libc::geteuid() });
    assert!(sock.exists(), "{}", sock.display());
    guest.go("getpid", 10).unwrap();
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}", e.stderr);
    assert!(!dir.exists(), "{} left behind", dir.display());
    let back = qmp(q).gdbserver().unwrap().expect("the user's stub");
    assert_eq!((back.addr, back.connected), (Some(user.clone()), false));
    let g = Gdb::connect(&user, TIMEOUT).unwrap();
    drop(g);
    assert_eq!(status(q), "running");
    qmp(q).close_gdbserver().unwrap();
    assert_no_gdbstub(q);

    // An error after the stub connected and stopped the guest: another
    // kernel's vmlinux. The guest runs on, the stub is gone.
    refused(q, &other, &[], "the guest runs another kernel");
    assert_eq!(status(q), "running");
    assert_no_gdbstub(q);
    assert_runs_on(&guest, w.worker);
}
