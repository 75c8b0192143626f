//! vmtrace holds QEMU's QMP socket only for short bursts, against real
//! QEMU/TCG guests (the default guest): another QMP client (a plain unix
//! socket client, as `qm` or `socat` are) is answered while vmtrace
//! traces, and the counts stay exact; a guest triple fault ends a trap-mode
//! trace, told without the QMP events no one hears between bursts; a QEMU
//! started behind the same socket path mid-trace ends the trace in one
//! line, the traced QEMU detached through its gdbstub and left as found.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::attach::*;
use common::console::assert_no_complaint;
use common::guard::*;
use common::qemu::*;
use common::s;

/// getpid's function: `__x64_sys_getpid` and `__do_sys_getpid` share an
/// address, and the report names it by one of them.
const GETPID: [&str; 2] = ["__do_sys_getpid", "__x64_sys_getpid"];
/// Far above a QEMU's answer; a socket vmtrace held would never answer.
const ANSWER: Duration = Duration::from_secs(30);

/// A QMP client's whole session, as a tool that connects per command
/// does it: greeting, `qmp_capabilities`, `cmd`, its `return`, hang up.
fn qmp_once(path: &Path, cmd: &str) -> serde_json::Value {
    let s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(ANSWER)).unwrap();
    let mut out = s.try_clone().unwrap();
    let mut lines = BufReader::new(s).lines();
    let mut next = || {
        let line = lines
            .next()
            .expect("QEMU hung up")
            .unwrap_or_else(|e| panic!("no answer within {ANSWER:?}: {e}"));
        serde_json::from_str::<serde_json::Value>(&line).unwrap()
    };
    assert!(next().get("QMP").is_some(), "no greeting");
    let mut reply = |cmd: &str| {
        writeln!(out, "{}", serde_json::json!({ "execute": cmd })).unwrap();
        loop {
            let v = next();
            if v.get("event").is_none() {
                return v["return"].clone();
            }
        }
    };
    reply("qmp_capabilities");
    reply(cmd)
}

fn attach(qmp: &Path, bz: &Path, mode: &str) -> Attach {
    attach_json(qmp, bz, "__x64_sys_getpid", &["--mode", mode])
}

/// One boot: an exitless trace during which another client's
/// `query-status` is answered five times, the counts exact; then a
/// trap-mode trace that a guest triple fault ends (an NMI makes the guest
/// panic, `reboot=t` reboots it by a triple fault, QEMU resets it), with
/// the calls before it, the guest booting again.
#[test]
fn another_client_is_answered_mid_trace_and_a_triple_fault_ends_a_trap_trace() {
    let (bz, _) = common::linux_61();
    let guest = QemuGuest::boot(QemuOpts {
        append: "unknown_nmi_panic reboot=t".into(),
        // (The harness's -no-reboot would make a reset a power-off.)
        qemu_args: vec!["-action".into(), "reboot=reset".into()],
        ..QemuOpts::linux()
    });
    guest.wait_ready().unwrap();
    let qmp = guest.qmp_socket();

    let a = attach(qmp, &bz, "exitless");
    for _ in 0..5 {
        guest.go("getpid", 100).unwrap();
        assert_eq!(qmp_once(qmp, "query-status")["status"], "running");
    }
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    assert!(
        e.stderr.contains("vmtrace: detached (signal 2)"),
        "{}",
        e.stderr
    );
    assert_eq!(count_of(&e.counts(), &GETPID), 500, "{}", e.stdout);

    let a = attach(qmp, &bz, "trap");
    guest.go("getpid", 20).unwrap();
    qmp_once(qmp, "inject-nmi");
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    // (Told by CPU 0 in firmware, or by a RESET event that came during a
    // look's burst.)
    assert!(
        e.stderr.contains("vmtrace: the guest was reset (")
            && e.stderr.contains("the trace ends there"),
        "{}",
        e.stderr
    );
    assert_eq!(count_of(&e.counts(), &GETPID), 20, "{}", e.stdout);
    // It boots again, to its workload, and its second boot has no
    // complaint (the first ended in the panic the NMI made).
    let w = guest.wait_ready().unwrap();
    guest.send_line("ping");
    let pong = format!("workload: pong pid={}", w.worker);
    guest.wait_for(&pong, COMMAND_TIMEOUT).unwrap();
    guest.go("getpid", 10).unwrap();
    let console = guest.console();
    let second = &console[console.rfind("Linux version").unwrap()..];
    assert_no_complaint(second, &BAD, "after the reset");
    assert_no_gdbstub(qmp);
}

/// A QEMU (`-machine none`) on the socket path of the QEMU traced.
struct Impostor(Child);

impl Impostor {
    /// Started, and serving `path` (QEMU removes the file it replaces).
    fn start(path: &Path) -> Impostor {
        let child = Command::new("qemu-system-x86_64")
            .args(["-machine", "none", "-accel", "tcg", "-display", "none"])
            .args(["-nodefaults", "-monitor", "none", "-qmp"])
            .arg(format!("unix:{},server=on,wait=off", path.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let me = Impostor(child);
        let since = Instant::now();
        while !me.serves(path) {
            assert!(since.elapsed() < ANSWER, "the second QEMU never served");
            std::thread::sleep(Duration::from_millis(20));
        }
        me
    }

    /// Is it this QEMU that listens at `path` (its peer credentials)?
    fn serves(&self, path: &Path) -> bool {
        let Ok(s) = UnixStream::connect(path) else {
            return false;
        };
        let mut cred = libc::ucred {
            pid: 0,
            uid: 0,
            gid: 0,
        };
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        // SAFETY: SO_PEERCRED fills a ucred of the length given, both live
        // locals; the fd is the open stream's.
        let rc = unsafe {
            libc::getsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&s),
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&mut cred as *mut libc::ucred).cast(),
                &mut len,
            )
        };
        rc == 0 && cred.pid as u32 == self.0.id()
    }
}

impl Drop for Impostor {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Another QEMU started behind the traced QEMU's socket path mid-trace is
/// another VM: the trace ends in one line naming it, the calls before it
/// counted; the traced QEMU, still running, is detached through its
/// gdbstub (vmtrace sends the other QEMU nothing), its memory as found.
/// (First, sharing the boot: `--trace '*'` exitless, issue 40.)
#[test]
fn a_qemu_started_behind_the_socket_path_ends_the_trace() {
    let (bz, kernel, guest, w, before) = boot_linux(QemuOpts::linux());
    let qmp = guest.qmp_socket();
    let watch = kernel.watch(qmp);
    every_function_exitless(qmp, &bz, &guest);
    assert_same(&before, &watch.read(), "after an exitless trace of '*'");
    let a = attach(qmp, &bz, "exitless");
    guest.go("getpid", 50).unwrap();
    let other = Impostor::start(qmp);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    let said = format!(
        "another QEMU answers it now (pid {}; the traced QEMU is pid {}",
        other.0.id(),
        guest.pid()
    );
    let line = e
        .stderr
        .lines()
        .find(|l| l.starts_with("vmtrace: detached ("))
        .unwrap_or_else(|| panic!("no detach line in {}", e.stderr));
    assert!(line.contains(&said), "{said:?} in {line}");
    assert!(line.contains(": 1 sites restored"), "{line}");
    assert_eq!(count_of(&e.counts(), &GETPID), 50, "{}", e.stdout);
    assert_same(&before, &watch.read(), "by a detach through the gdbstub");
    assert_runs_on(&guest, w.worker);
}

/// Every function exitless in the default guest's free low pages: their
/// bodies per site would take 359 of its 152 pages, the shared body fits
/// with rings beside it. getpid's count exact.
fn every_function_exitless(qmp: &Path, bz: &Path, guest: &QemuGuest) {
    let args = ["--kernel", s(bz), "--format", "json", "--trace", "*"];
    let mut a = Attach::start(qmp, &[&args[..], &["--mode", "exitless"]].concat());
    let line = a.wait_line("vmtrace: attached to QEMU");
    assert!(line.contains("exitless"), "{line}");
    guest.go("getpid", 200).unwrap();
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    assert!(
        e.json()["sites_patched"].as_u64().unwrap() > 9_000,
        "{}",
        e.stderr
    );
    assert_eq!(count_of(&e.counts(), &GETPID), 200, "{}", e.stderr);
}
