//! Hostile QMP and gdbstub peers (issue 34, item 14): a peer that sends an
//! endless line or packet, drips its bytes, floods console or thread
//! packets, or answers late, ends in a one-line error within 15 s, with
//! vmtrace's memory bounded; a late QMP reply is never taken for the next
//! command's. Fakes over unix sockets (tests/common/peers.rs): no QEMU.

mod common;
#[path = "common/peers.rs"]
mod peers;

use std::fs::File;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{s, scratch_in};
use peers::{drip, flood, GdbPeer, Peer, QmpPeer};
use serde_json::json;
use tracer::qemu::gdb::{Gdb, GdbAddr, GdbError, ThreadId};
use tracer::qemu::qmp::{Qmp, QmpError};
use tracer::qemu::queries::Queries;

/// What the issue allows for an error from a hostile peer.
const ERROR_WITHIN: Duration = Duration::from_secs(15);
/// vmtrace's peak memory against a hostile peer: its kernel image loaded
/// is ~125 MB; an endless line buffered would be GBs.
const MAX_RSS_KB: i64 = 200 * 1024;
/// A hang guard for a vmtrace run.
const HANG: Duration = Duration::from_secs(120);
/// An endless stream: 1 GB, generated chunk by chunk.
const ENDLESS: u64 = 1 << 30;

/// How `vmtrace attach` ended against a fake.
struct Run {
    code: i32,
    stderr: String,
    took: Duration,
    max_rss_kb: i64,
}

/// Runs `vmtrace attach --qmp QMP --kernel bzImage ARGS` and waits for it
/// with wait4, for its peak RSS.
fn attach(dir: &Path, qmp: &Path, args: &[&str]) -> Run {
    let (bz, _) = common::linux_61();
    let err = dir.join("stderr");
    let start = Instant::now();
    // Reaped by wait4 below, which gives its peak RSS (Child's wait does not).
    #[allow(clippy::zombie_processes)]
    let child = Command::new(env!("CARGO_BIN_EXE_vmtrace"))
        .args(["attach", "--qmp", s(qmp), "--kernel", s(&bz)])
        .args(["--trace", "__x64_sys_getpid", "-o", s(&dir.join("out"))])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid value for wait4 to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: wait4 on our own child, with live locals to fill.
        let rc = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        assert!(rc >= 0, "wait4: {}", std::io::Error::last_os_error());
        if rc == pid {
            break;
        }
        if start.elapsed() > HANG {
            // SAFETY: kill(2) on our own child's pid, not yet waited for.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("vmtrace hung: {}", std::fs::read_to_string(&err).unwrap());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = start.elapsed();
    assert!(libc::WIFEXITED(status), "vmtrace died: status {status:#x}");
    Run {
        code: libc::WEXITSTATUS(status),
        stderr: std::fs::read_to_string(&err).unwrap(),
        took,
        max_rss_kb: usage.ru_maxrss,
    }
}

/// Exit 2 with one `vmtrace: ` line holding `needle`, within 15 s, in
/// bounded memory.
fn assert_refused(run: &Run, needle: &str) {
    eprintln!(
        "vmtrace: exit {} after {:.1?}, peak RSS {} KiB: {}",
        run.code,
        run.took,
        run.max_rss_kb,
        run.stderr.trim_end()
    );
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert_eq!(lines.len(), 1, "one line: {}", run.stderr);
    assert!(lines[0].starts_with("vmtrace: "), "{}", run.stderr);
    assert!(lines[0].contains(needle), "{needle:?} in {}", run.stderr);
    assert!(
        run.took < ERROR_WITHIN,
        "an error after {:?}: {}",
        run.took,
        run.stderr
    );
    assert!(
        run.max_rss_kb < MAX_RSS_KB,
        "vmtrace's peak RSS {} KiB",
        run.max_rss_kb
    );
}

/// (a) A greeting, then an endless line in reply to qmp_capabilities.
#[test]
fn an_endless_qmp_line_is_refused_in_bounded_memory() {
    let dir = scratch_in("hostile", "qmp-endless");
    let peer = Peer::listen(&dir.join("qmp.sock"), |s| {
        let mut q = QmpPeer::greet(s);
        if q.command().is_some() {
            flood(&mut q.out, &[b'x'; 64 * 1024], ENDLESS);
        }
    });
    let run = attach(&dir, &peer.path, &[]);
    assert_refused(&run, "the peer sent a line longer than 1048576 bytes");
    peer.join();
}

/// (a) The greeting itself endless.
#[test]
fn an_endless_greeting_is_refused_in_bounded_memory() {
    let dir = scratch_in("hostile", "qmp-endless-greeting");
    let peer = Peer::listen(&dir.join("qmp.sock"), |mut s| {
        flood(&mut s, &[b'{'; 64 * 1024], ENDLESS);
    });
    let run = attach(&dir, &peer.path, &[]);
    assert_refused(&run, "the peer sent a line longer than");
    peer.join();
}

/// (b) A reply dripped a byte every 0.5 s: the reply's timeout is for the
/// whole reply, not for each read.
#[test]
fn a_dripped_qmp_reply_times_out() {
    let dir = scratch_in("hostile", "qmp-drip");
    let peer = Peer::listen(&dir.join("qmp.sock"), |s| {
        let mut q = QmpPeer::greet(s);
        if q.command().is_some() {
            drip(
                &mut q.out,
                br#"{"return": {}, "id": 1} "#,
                Duration::from_millis(500),
            );
        }
    });
    let run = attach(&dir, &peer.path, &[]);
    assert_refused(&run, "no reply to qmp_capabilities within 10.0 s");
    peer.join();
}

/// (b) The greeting dripped: a talking peer, not a busy QEMU.
#[test]
fn a_dripped_greeting_times_out() {
    let dir = scratch_in("hostile", "qmp-drip-greeting");
    let peer = Peer::listen(&dir.join("qmp.sock"), |mut s| {
        drip(
            &mut s,
            peers::GREETING.as_bytes(),
            Duration::from_millis(500),
        );
    });
    let run = attach(&dir, &peer.path, &[]);
    assert_refused(&run, "no reply to the greeting within 10.0 s");
    peer.join();
}

/// (d) A reply that comes after its command timed out is skipped: the next
/// command gets its own reply.
#[test]
fn a_late_qmp_reply_is_not_taken_for_the_next_command() {
    let dir = scratch_in("hostile", "qmp-late");
    let peer = Peer::listen(&dir.join("qmp.sock"), |s| {
        let mut q = QmpPeer::greet(s);
        let caps = q.command().unwrap();
        q.reply(&caps, json!({}));
        // The first query-status: answered after the client gave up.
        let first = q.command().unwrap();
        std::thread::sleep(Duration::from_millis(800));
        q.reply(&first, json!({"status": "late", "running": false}));
        let second = q.command().unwrap();
        q.reply(&second, json!({"status": "running", "running": true}));
        // The client hangs up.
        assert!(q.command().is_none());
    });
    let mut qmp = Qmp::connect(&peer.path, Duration::from_millis(400)).unwrap();
    match qmp.status() {
        Err(QmpError::Timeout { cmd, .. }) => assert_eq!(cmd, "query-status"),
        other => panic!("the first query-status: {other:?}"),
    }
    // Its late reply is on the wire now, before the next one's.
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(qmp.status().unwrap(), "running");
    drop(qmp);
    peer.join();
}

/// Replies with ids of no command sent: a bounded number are skipped.
#[test]
fn endless_replies_to_other_commands_end_in_an_error() {
    let dir = scratch_in("hostile", "qmp-stray");
    let peer = Peer::listen(&dir.join("qmp.sock"), |s| {
        let mut q = QmpPeer::greet(s);
        let caps = q.command().unwrap();
        q.reply(&caps, json!({}));
        if q.command().is_some() {
            let line = format!("{}\n", json!({"return": {}, "id": 999_999}));
            flood(&mut q.out, line.as_bytes(), ENDLESS);
        }
    });
    let start = Instant::now();
    let mut qmp = Qmp::connect(&peer.path, Duration::from_secs(10)).unwrap();
    let e = qmp.status().unwrap_err();
    assert!(matches!(e, QmpError::Stray { .. }), "{e}");
    assert!(start.elapsed() < ERROR_WITHIN);
    drop(qmp);
    peer.join();
}

/// This process's peak RSS: the gdb fakes run in it, against the library.
fn own_max_rss_kb() -> i64 {
    // SAFETY: a zeroed rusage is valid; getrusage fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF into a live local.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) }, 0);
    usage.ru_maxrss
}

/// Connects the library's client to a fake stub serving with `serve`,
/// runs `op` and returns its error, within 15 s and bounded memory.
fn gdb_error<T: std::fmt::Debug>(
    name: &str,
    serve: impl FnOnce(GdbPeer) + Send + 'static,
    op: impl FnOnce(&mut Gdb) -> Result<T, GdbError> + Send + 'static,
) -> GdbError {
    let dir = scratch_in("hostile", name);
    let peer = Peer::listen(&dir.join("gdb.sock"), |s: UnixStream| {
        serve(GdbPeer::new(s))
    });
    let start = Instant::now();
    let addr = GdbAddr::Unix(peer.path.clone());
    let (tx, rx) = std::sync::mpsc::channel();
    // On a thread of its own: a client that hangs fails the test.
    std::thread::spawn(move || {
        let e = match Gdb::connect(&addr, Duration::from_secs(10)) {
            Ok(mut g) => op(&mut g).unwrap_err(),
            Err(e) => e,
        };
        let _ = tx.send(e);
    });
    let e = rx
        .recv_timeout(HANG)
        .unwrap_or_else(|_| panic!("{name}: the client hung"));
    eprintln!("{name}: after {:.1?}: {e}", start.elapsed());
    assert!(
        start.elapsed() < ERROR_WITHIN,
        "{name}: {e} after {:?}",
        start.elapsed()
    );
    assert!(
        own_max_rss_kb() < MAX_RSS_KB,
        "peak RSS {} KiB",
        own_max_rss_kb()
    );
    // One line, naming the stub.
    let text = e.to_string();
    assert!(
        !text.contains('\n') && text.starts_with("gdbstub "),
        "{text}"
    );
    peer.join();
    e
}

/// (c) A packet that never ends (no `#`).
#[test]
fn an_endless_gdb_packet_is_refused() {
    let e = gdb_error(
        "gdb-endless",
        |mut p| {
            if p.packet().is_some() {
                let s = p.stream();
                if std::io::Write::write_all(s, b"$").is_ok() {
                    flood(s, &[b'a'; 64 * 1024], ENDLESS);
                }
            }
        },
        |_| Ok(()),
    );
    assert!(matches!(e, GdbError::TooLong { .. }), "{e}");
}

/// (c) Console output (`O` packets) without end instead of a reply.
#[test]
fn endless_gdb_console_packets_end_in_an_error() {
    let e = gdb_error(
        "gdb-console",
        |mut p| {
            if p.negotiate().is_some() && p.packet().is_some() {
                let one = peers::frame(b"O68656c6c6f0a");
                flood(p.stream(), &one, ENDLESS);
            }
        },
        |g| g.command("qC"),
    );
    assert!(matches!(e, GdbError::Flood { .. }), "{e}");
}

/// (c) A thread list that never ends (`m` to every `qsThreadInfo`).
#[test]
fn an_endless_gdb_thread_list_ends_in_an_error() {
    let e = gdb_error(
        "gdb-threads",
        |mut p| {
            p.negotiate();
            while p.packet().is_some() {
                if !p.send("mp01.01,p01.02") {
                    return;
                }
            }
        },
        |g| g.threads(),
    );
    assert!(
        matches!(
            e,
            GdbError::Flood {
                what: "threads",
                ..
            }
        ),
        "{e}"
    );
}

/// (c) A target description that never ends (`m` to every `qXfer` read).
#[test]
fn an_endless_gdb_target_description_ends_in_an_error() {
    let e = gdb_error(
        "gdb-xfer",
        |mut p| {
            p.negotiate();
            let chunk = format!("m{}", "<!-- x -->".repeat(300));
            while p.packet().is_some() {
                if !p.send(&chunk) {
                    return;
                }
            }
        },
        |g| g.regs(ThreadId { pid: None, tid: 1 }),
    );
    assert!(matches!(e, GdbError::Flood { .. }), "{e}");
}

/// (c) Stop replies without end instead of `m`'s reply.
#[test]
fn endless_gdb_stop_replies_end_in_an_error() {
    let e = gdb_error(
        "gdb-stops",
        |mut p| {
            if p.negotiate().is_some() && p.packet().is_some() {
                let one = peers::frame(b"T05thread:p01.01;");
                flood(p.stream(), &one, ENDLESS);
            }
        },
        |g| {
            let mut buf = [0u8; 8];
            g.read(0x1000, &mut buf)
        },
    );
    assert!(matches!(e, GdbError::Flood { .. }), "{e}");
}

/// (c) A reply dripped a byte every 0.5 s: one deadline for the reply.
#[test]
fn a_dripped_gdb_reply_times_out() {
    let e = gdb_error(
        "gdb-drip",
        |mut p| {
            if p.negotiate().is_some() && p.packet().is_some() {
                // A packet begun, and never ended.
                drip(p.stream(), b"$", Duration::ZERO);
                drip(p.stream(), b"0", Duration::from_millis(500));
            }
        },
        |g| g.command("qC"),
    );
    assert!(matches!(e, GdbError::Timeout { .. }), "{e}");
}

/// Replies that come after their command timed out (a stalled QEMU
/// answers every packet it takes, in order, however late) are skipped:
/// each later command gets its own reply, a memory read its own bytes. A
/// stop's `qC` answered late once left the next `Hg` reading `QCp01.01`:
/// a late `QC` is known by its shape, and the command after a timeout
/// resyncs (`qC`, every reply up to its answer dropped).
#[test]
fn late_gdb_replies_are_not_taken_for_the_next_commands() {
    /// Answers the next packet, an `m`, with `len` bytes of `byte`.
    fn answer_m(p: &mut GdbPeer, byte: u8) -> Option<String> {
        let m = p.packet()?;
        let len = usize::from_str_radix(m.rsplit(',').next()?, 16).ok()?;
        p.send(&format!("{byte:02x}").repeat(len)).then_some(m)
    }
    const LATE: Duration = Duration::from_millis(1000);
    let dir = scratch_in("hostile", "gdb-late");
    let peer = Peer::listen(&dir.join("gdb.sock"), |s: UnixStream| {
        let mut p = GdbPeer::new(s);
        p.negotiate().unwrap();
        assert_eq!(p.packet().unwrap(), "qC");
        std::thread::sleep(LATE);
        p.send("QCp01.01");
        // A read of two packets: both answered late, with stale bytes.
        let (first, second) = (p.packet().unwrap(), p.packet().unwrap());
        assert!(first.starts_with("m1000,") && second.starts_with('m'));
        std::thread::sleep(LATE);
        for m in [first, second] {
            let len = usize::from_str_radix(m.rsplit(',').next().unwrap(), 16).unwrap();
            p.send(&"aa".repeat(len));
        }
        // The next command first resyncs: an interrupt and `qC`, every
        // reply before its answer dropped.
        assert_eq!(p.packet().unwrap(), "qC");
        p.send("QCp01.01");
        assert_eq!(p.packet().unwrap(), "Hgp1.1");
        p.send("OK");
        assert!(answer_m(&mut p, 0x55).unwrap().starts_with("m2000,"));
        // The client hangs up (its drop detaches).
        while p.packet().is_some_and(|d| !d.starts_with('D')) {}
        p.send("OK");
    });
    let addr = GdbAddr::Unix(peer.path.clone());
    let mut g = Gdb::connect(&addr, Duration::from_millis(300)).unwrap();
    assert!(matches!(g.command("qC"), Err(GdbError::Timeout { .. })));
    let mut big = vec![0u8; 4096];
    let e = g.read(0x1000, &mut big).unwrap_err();
    assert!(matches!(e, GdbError::Timeout { .. }), "{e}");
    // The late replies are on the wire now, before the next ones.
    std::thread::sleep(3 * LATE);
    assert_eq!(g.command("Hgp1.1").unwrap(), "OK");
    let mut b = [0u8; 8];
    g.read(0x2000, &mut b).unwrap();
    assert_eq!(b, [0x55; 8]);
    drop(g);
    peer.join();
}

/// An event before the greeting, as QEMU 7.2 sends one emitted while the
/// connection opens (its monitor still in the last client's command mode):
/// read past, and the connection made. A peer sending only events is no
/// QEMU.
#[test]
fn events_before_the_greeting_are_read_past_a_few_only() {
    const EVENT: &str =
        r#"{"timestamp": {"seconds": 1795990551, "microseconds": 427981}, "event": "RESUME"}"#;
    let dir = scratch_in("hostile", "qmp-early-event");
    let peer = Peer::listen(&dir.join("qmp.sock"), |mut s| {
        use std::io::Write;
        writeln!(s, "{EVENT}").unwrap();
        let mut q = QmpPeer::greet(s);
        while let Some(cmd) = q.command() {
            q.reply(&cmd, json!({}));
        }
    });
    let qmp = Qmp::connect(&peer.path, Duration::from_secs(5));
    assert!(qmp.is_ok(), "{:?}", qmp.err());
    drop(qmp);
    peer.join();
    let peer = Peer::listen(&dir.join("events.sock"), |mut s| {
        use std::io::Write;
        for _ in 0..64 {
            if writeln!(s, "{EVENT}").is_err() {
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(300));
    });
    match Qmp::connect(&peer.path, Duration::from_secs(5)) {
        Err(e @ QmpError::NotQemu { .. }) => assert!(e.to_string().contains("timestamp"), "{e}"),
        other => panic!("a peer of events alone: {:?}", other.err()),
    }
    peer.join();
}
