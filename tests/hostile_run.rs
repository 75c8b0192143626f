//! What users do to a running `vmtrace record` by accident (issue 22, item
//! 14), in trap, exitless and function-graph modes: SIGINT, SIGTERM,
//! SIGHUP, a second Ctrl-C, stdout closed mid-run (`| head -1`), the
//! terminal closed under the status line; a disk that fills; two records
//! of one file at once. Each ends with its documented exit status (docs/usage.md,
//! *Stopping a run*) and a data file that `report` and `script` read with
//! consistent counts; none panics or hangs.

mod common;

use std::io::{BufRead, BufReader};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn scratch(name: &str) -> PathBuf {
    scratch_in("hostile", name)
}

fn size(p: &Path) -> u64 {
    std::fs::metadata(p).map_or(0, |m| m.len())
}

/// The modes: (name, options). The mini guest's endless workload
/// (`mode=loop`) with every function traced.
const MODES: [(&str, &[&str]); 4] = [
    ("trap", &["--mode", "trap"]),
    ("exitless", &["--mode", "exitless"]),
    ("graph", &["--mode", "trap", "--graph"]),
    ("exitless-graph", &["--mode", "exitless", "--graph"]),
];

/// `record` of the endless workload in `mode`, stdout and stderr as given.
fn spawn(dir: &Path, data: &Path, mode: &[&str], extra: &[&str], out: Stdio, err: Stdio) -> Child {
    let k = mini_elf();
    Command::new(env!("CARGO_BIN_EXE_vmtrace"))
        .args(["record", "--kernel", s(&k), "--cpus", "2"])
        .args(["--cmdline", "mode=loop", "--trace", "*", "--timeout", "300"])
        .args(mode)
        .args(extra)
        .args(["-o", s(data)])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("run vmtrace")
}

/// Wait until `data` holds `bytes`: events are being recorded.
fn wait_for_growth(child: &mut Child, data: &Path, bytes: u64) {
    let deadline = Instant::now() + Duration::from_secs(240);
    while size(data) < bytes {
        if let Some(st) = child.try_wait().unwrap() {
            panic!(
                "vmtrace ended ({st}) before {} held {bytes} bytes",
                data.display()
            );
        }
        assert!(Instant::now() < deadline, "the data file did not grow");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `report` and `script` read `data` whole (not cut short), and agree:
/// every call and return counted is stored or dropped, and `script` prints
/// one line per stored event. Returns the calls counted.
fn check_complete(data: &Path, graph: bool) -> u64 {
    let o = vmtrace(&["report", s(data), "--format", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["incomplete"], serde_json::Value::Null, "{v}");
    let events = v["events"].as_u64().unwrap();
    let stored = v["events_stored"].as_u64().unwrap();
    assert!(events > 1000, "{v}");
    assert_eq!(stored + v["dropped"].as_u64().unwrap(), events, "{v}");
    let mut lines = stored;
    if graph {
        let g = &v["graph"];
        let (r, rs) = (
            g["returns"].as_u64().unwrap(),
            g["returns_stored"].as_u64().unwrap(),
        );
        assert!(r > 1000, "{v}");
        assert_eq!(rs + g["returns_dropped"].as_u64().unwrap(), r, "{v}");
        lines += rs;
    } else {
        assert_eq!(v["graph"], serde_json::Value::Null, "{v}");
    }
    let o = vmtrace(&["script", s(data)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let n = stdout(&o).lines().filter(|l| !l.starts_with('#')).count() as u64;
    assert_eq!(n, lines, "script lines");
    events
}

/// Wait until `sig`, sent to the process, is no longer pending (a thread
/// took it and ran its handler).
fn wait_delivered(child: &Child, sig: libc::c_int) {
    let bit = 1u64 << (sig - 1);
    let status = format!("/proc/{}/status", child.id());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(&status).unwrap_or_default();
        let pending = text
            .lines()
            .filter_map(|l| {
                l.strip_prefix("ShdPnd:")
                    .or_else(|| l.strip_prefix("SigPnd:"))
            })
            .any(|m| u64::from_str_radix(m.trim(), 16).unwrap_or(0) & bit != 0);
        if !pending {
            return;
        }
        assert!(Instant::now() < deadline, "signal {sig} still pending");
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn no_panic(err: &str) {
    assert!(
        !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
        "{err}"
    );
}

/// One signal (or two SIGINTs: the second arrives while the first is
/// being acted on) while events are recorded: exit status 0, the
/// stop said, the file complete.
fn signal_case(mode: &str, opts: &[&str], sigs: &[libc::c_int], says: &str) {
    // Two signals: the second must reach vmtrace while it stops. It may
    // have finished stopping first (a descheduled test thread): then the
    // case is run again, a bounded number of times.
    for attempt in 0..10 {
        let dir = scratch(&format!("{mode}-{}-{}-{attempt}", sigs[0], sigs.len()));
        let data = dir.join("t.data");
        if let Some(err) = signal_attempt(&dir, &data, opts, sigs) {
            no_panic(&err);
            assert!(
                err.contains(&format!("vmtrace: stopped by {says} after ")),
                "{err}"
            );
            assert!(err.contains("sites restored"), "{err}");
            assert!(
                err.contains(&format!("vmtrace: wrote {}", data.display())),
                "{err}"
            );
            if sigs.len() > 1 {
                assert!(
                    err.contains("vmtrace: already stopping: restoring the guest's text and completing the data file"),
                    "{err}"
                );
            }
            check_complete(&data, opts.contains(&"--graph"));
            let _ = std::fs::remove_dir_all(&dir);
            return;
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    panic!("{mode} {sigs:?}: vmtrace had stopped before every second signal");
}

/// One try of `signal_case`: stderr of a run that exited with status 0, or
/// None when vmtrace had finished stopping before the second signal.
fn signal_attempt(dir: &Path, data: &Path, opts: &[&str], sigs: &[libc::c_int]) -> Option<String> {
    let mut child = spawn(
        dir,
        data,
        opts,
        &["--console", "none"],
        Stdio::piped(),
        Stdio::piped(),
    );
    wait_for_growth(&mut child, data, 256 << 10);
    for (i, &sig) in sigs.iter().enumerate() {
        if i > 0 {
            // Two of one signal pending at once are one: send the second
            // once the first was taken, while vmtrace is held stopped
            // (SIGSTOP) so that it cannot end between the check that it
            // runs and the signal.
            wait_delivered(&child, sigs[i - 1]);
            kill(&child, libc::SIGSTOP);
            if !stopped_not_exited(&child) {
                let _ = wait_bounded(child);
                return None;
            }
            kill(&child, sig);
            kill(&child, libc::SIGCONT);
            continue;
        }
        kill(&child, sig);
    }
    let o = wait_bounded(child);
    let err = stderr(&o);
    // vmtrace had finished stopping (its text restored, the data file
    // complete) when the second signal came: that signal ends it at once,
    // as it should (see one_shot_ctrl_c_in_the_report_phase_ends_it).
    if sigs.len() > 1 && o.status.signal() == Some(sigs[1]) && err.contains("sites restored") {
        return None;
    }
    assert_eq!(o.status.code(), Some(0), "{sigs:?}: {err}");
    Some(err)
}

/// Wait until `child`, sent SIGSTOP, is stopped (true) or has exited
/// (false); it is not reaped.
fn stopped_not_exited(child: &Child) -> bool {
    // SAFETY: an all-zero siginfo_t is valid; waitid(2) fills it.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid(2) on our own child, not yet reaped (WNOWAIT keeps it
    // so), into a siginfo_t this function owns.
    let r = unsafe {
        libc::waitid(
            libc::P_PID,
            child.id(),
            &mut info,
            libc::WSTOPPED | libc::WEXITED | libc::WNOWAIT,
        )
    };
    assert_eq!(r, 0, "waitid: {}", std::io::Error::last_os_error());
    info.si_code == libc::CLD_STOPPED
}

/// Every stopping signal in `mode`.
fn every_signal(mode: &str) {
    let opts = MODES.iter().find(|m| m.0 == mode).unwrap().1;
    for (sigs, says) in [
        (&[libc::SIGINT][..], "Ctrl-C (SIGINT)"),
        (&[libc::SIGTERM][..], "SIGTERM"),
        (&[libc::SIGHUP][..], "SIGHUP (the terminal went away)"),
        (&[libc::SIGINT, libc::SIGINT][..], "Ctrl-C (SIGINT)"),
    ] {
        signal_case(mode, opts, sigs, says);
    }
    closed_stdout_case(mode, opts);
}

/// `vmtrace record --console - ... | head -1`: stdout closes after the
/// first console line, the run goes on, Ctrl-C ends it as usual.
fn closed_stdout_case(mode: &str, opts: &[&str]) {
    let dir = scratch(&format!("{mode}-pipe"));
    let data = dir.join("t.data");
    let mut child = spawn(
        &dir,
        &data,
        opts,
        &["--console", "-"],
        Stdio::piped(),
        Stdio::piped(),
    );
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    // (The reader is dropped: the pipe's read end is closed.)
    assert!(first.starts_with("mini:"), "{first}");
    wait_for_growth(&mut child, &data, 256 << 10);
    kill(&child, libc::SIGINT);
    let o = wait_bounded(child);
    let err = stderr(&o);
    no_panic(&err);
    assert_eq!(o.status.code(), Some(0), "{mode}: {err}");
    assert!(!err.contains("Broken pipe"), "{err}");
    check_complete(&data, opts.contains(&"--graph"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn signals_and_a_closed_stdout_in_trap_mode() {
    every_signal("trap");
}

#[test]
fn signals_and_a_closed_stdout_in_exitless_mode() {
    every_signal("exitless");
}

#[test]
fn signals_and_a_closed_stdout_in_graph_mode() {
    every_signal("graph");
}

#[test]
fn signals_and_a_closed_stdout_in_exitless_graph_mode() {
    every_signal("exitless-graph");
}

/// A pseudo-terminal: (master, slave path).
fn pty() -> (OwnedFd, PathBuf) {
    // SAFETY: posix_openpt/grantpt/unlockpt on the fd it returns; ptsname_r
    // fills a buffer of the length passed. The fd is owned from here on.
    unsafe {
        let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
        assert!(m >= 0, "posix_openpt: {}", std::io::Error::last_os_error());
        assert_eq!(libc::grantpt(m), 0);
        assert_eq!(libc::unlockpt(m), 0);
        let mut name = [0 as libc::c_char; 128];
        assert_eq!(libc::ptsname_r(m, name.as_mut_ptr(), name.len()), 0);
        let path = std::ffi::CStr::from_ptr(name.as_ptr())
            .to_str()
            .unwrap()
            .to_owned();
        (OwnedFd::from_raw_fd(m), PathBuf::from(path))
    }
}

/// The terminal goes away under the live status line and the console
/// (its writes fail with EIO), then SIGHUP: the run ends as for SIGTERM,
/// status 0 (not a panic's 101), the file complete. Every mode.
#[test]
fn sighup_after_the_terminal_went_away_leaves_a_complete_file() {
    for (mode, opts) in MODES {
        let dir = scratch(&format!("{mode}-hup"));
        let data = dir.join("t.data");
        let (master, slave) = pty();
        let tty = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags_noctty()
            .open(&slave)
            .unwrap();
        let mut child = spawn(&dir, &data, opts, &[], Stdio::null(), Stdio::from(tty));
        wait_for_growth(&mut child, &data, 256 << 10);
        // Let the status line be drawn at least once, then hang up.
        std::thread::sleep(Duration::from_millis(1200));
        drop(master);
        std::thread::sleep(Duration::from_millis(1200));
        kill(&child, libc::SIGHUP);
        let o = wait_bounded(child);
        assert_eq!(o.status.code(), Some(0), "{mode}: {:?}", o.status);
        check_complete(&data, opts.contains(&"--graph"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// `OpenOptions` with O_NOCTTY (the test process must not take the pty as
/// its controlling terminal).
trait NoCtty {
    fn custom_flags_noctty(&mut self) -> &mut Self;
}

impl NoCtty for std::fs::OpenOptions {
    fn custom_flags_noctty(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_NOCTTY)
    }
}

/// Two `record`s of one file at once: the second is refused at once (one
/// line, exit 2) and touches nothing; the first is unharmed. Before: the
/// second renamed the first's file to .old while it was being written and
/// wrote its own.
#[test]
fn a_second_record_of_the_same_file_is_refused() {
    let dir = scratch("twice");
    let data = dir.join("vmtrace.data");
    let mut first = spawn(
        &dir,
        &data,
        &["--mode", "trap"],
        &["--console", "none"],
        Stdio::null(),
        Stdio::piped(),
    );
    wait_for_growth(&mut first, &data, 256 << 10);
    let k = mini_elf();
    for args in [
        // As the first: the default file, in the same directory.
        &["record", "--kernel", s(&k), "--trace", "*"][..],
        // The same file named, with the one-shot form's -o.
        &["--kernel", s(&k), "--trace", "*", "-o", s(&data)][..],
    ] {
        let started = Instant::now();
        let o = vmtrace_in(&dir, args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(started.elapsed() < REFUSED_WITHIN, "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(
            err.contains("is being written by another vmtrace run; wait for it to end or pass -o ANOTHER_FILE"),
            "{err}"
        );
    }
    assert!(
        !dir.join("vmtrace.data.old").exists(),
        "the second moved the first's file"
    );
    kill(&first, libc::SIGINT);
    let o = wait_bounded(first);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    check_complete(&data, false);
    // Once the first has ended, a record of that file goes ahead (and keeps
    // the first's as .old).
    let o = vmtrace_in(
        &dir,
        &[
            "record",
            "--kernel",
            s(&k),
            "--trace",
            "hrtimer_*",
            "--console",
            "none",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(dir.join("vmtrace.data.old").is_file());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two `record`s of one new file started together: exactly one writes it,
/// the other is refused (one line, exit 2), and the file is complete; no
/// `.old` and no lock file are left. Before: the lock was taken on the
/// data file itself, which neither had made yet: both found nothing locked
/// and both wrote (or the second renamed the first's new file to .old).
#[test]
fn two_records_of_a_new_file_started_together_one_is_refused() {
    let dir = scratch("together");
    // Deterministically, what the race left to chance: a run that has
    // taken the lock and not yet made its file (held here as that run
    // holds it). The second is refused and makes nothing.
    {
        use std::os::fd::AsRawFd;
        let data = dir.join("new.data");
        let held = std::fs::File::create(dir.join("new.data.lock")).unwrap();
        // SAFETY: flock(2) on a descriptor this test owns.
        assert_eq!(
            unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
            0
        );
        let k = mini_elf();
        let o = vmtrace_in(
            &dir,
            &["record", "--kernel", s(&k), "--trace", "*", "-o", s(&data)],
        );
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(
            err.contains("is being written by another vmtrace run"),
            "{err}"
        );
        assert!(!data.exists());
        drop(held);
        std::fs::remove_file(dir.join("new.data.lock")).unwrap();
    }
    for round in 0..4 {
        let data = dir.join(format!("t{round}.data"));
        let start = || {
            spawn(
                &dir,
                &data,
                &["--mode", "trap"],
                &["--console", "none"],
                Stdio::null(),
                Stdio::piped(),
            )
        };
        let mut runs = [start(), start()];
        // The refused one ends on its own; the other records until stopped.
        let deadline = Instant::now() + Duration::from_secs(120);
        let refused = loop {
            if let Some(i) = (0..2).find(|&i| runs[i].try_wait().unwrap().is_some()) {
                break i;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: neither was refused"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let [a, b] = runs;
        let (refused, mut writer) = if refused == 0 { (a, b) } else { (b, a) };
        let o = wait_bounded(refused);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "round {round}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(
            err.contains("is being written by another vmtrace run; wait for it to end or pass -o ANOTHER_FILE"),
            "{err}"
        );
        wait_for_growth(&mut writer, &data, 128 << 10);
        kill(&writer, libc::SIGINT);
        let o = wait_bounded(writer);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        check_complete(&data, false);
    }
    let mut left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(left, ["t0.data", "t1.data", "t2.data", "t3.data"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A small tmpfs, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounted, or None with the reason printed (only when not root: CI
    /// runs as root and runs the test).
    fn mount(dir: &Path, size: &str) -> Option<Tmpfs> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            println!("SKIPPED: mounting a tmpfs needs root");
            return None;
        }
        let st = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size}"),
                "tmpfs",
                s(dir),
            ])
            .status()
            .expect("run mount");
        assert!(
            st.success(),
            "mount -t tmpfs on {} failed as root",
            dir.display()
        );
        Some(Tmpfs(dir.to_owned()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// `-o` on a disk that fills while the guest runs (a 2 MiB tmpfs): one
/// line at the end names the file and the error, exit status 1, and the
/// file holds what fitted, read as incomplete with consistent counts.
#[test]
fn record_onto_a_disk_that_fills_says_so_and_keeps_what_fitted() {
    let dir = scratch("full");
    let mnt = dir.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let Some(_tmpfs) = Tmpfs::mount(&mnt, "2m") else {
        return;
    };
    let data = mnt.join("t.data");
    let mut child = spawn(
        &dir,
        &data,
        &["--mode", "trap"],
        &["--console", "none"],
        Stdio::null(),
        Stdio::piped(),
    );
    // Full: the file stops growing at the tmpfs's size.
    let deadline = Instant::now() + Duration::from_secs(240);
    while size(&data) < (2 << 20) - (64 << 10) {
        assert!(child.try_wait().unwrap().is_none(), "ended early");
        assert!(Instant::now() < deadline, "the data file did not grow");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    kill(&child, libc::SIGINT);
    let o = wait_bounded(child);
    let err = stderr(&o);
    no_panic(&err);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let last = err.trim_end().lines().last().unwrap();
    assert_eq!(
        last,
        format!(
            "vmtrace: cannot save the trace: cannot write trace file {}: No space left on device (os error 28)",
            data.display()
        )
    );
    let o = vmtrace(&["report", s(&data), "--format", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["incomplete"].as_bool(), Some(true), "{v}");
    let stored = v["events_stored"].as_u64().unwrap();
    assert!(stored > 10_000, "{v}");
    assert_eq!(
        v["events"].as_u64(),
        Some(stored),
        "counts of the stored events"
    );
    let o = vmtrace(&["script", s(&data)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let n = stdout(&o).lines().filter(|l| !l.starts_with('#')).count() as u64;
    assert_eq!(n, stored);
    drop(_tmpfs);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `record --trace '*' --graph` on the default Linux guest (every one of its
/// ~8,800 traceable functions, calls and returns), bounded by
/// `--max-events` and `--duration`: every site patched and restored, the
/// summary line's counts are the report's, and report and script agree.
#[test]
fn linux_record_everything_with_the_graph_bounded() {
    let (bz, _) = linux_61();
    let initrd = root().join("guest/out/initramfs.cpio.gz");
    let dir = scratch("linux-all");
    let data = dir.join("all.data");
    let console = dir.join("console.log");
    let o = vmtrace_in(
        &dir,
        &[
            "record",
            "--kernel",
            s(&bz),
            "--initrd",
            s(&initrd),
            "--cpus",
            "2",
            "--mem",
            "96",
            "--timeout",
            "600",
            "--console",
            s(&console),
            "--trace",
            "*",
            "--graph",
            "--max-events",
            "3000",
            "--duration",
            "10",
            "-o",
            s(&data),
        ],
    );
    let err = stderr(&o);
    no_panic(&err);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let patched: u64 = err
        .split("attached: ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{err}"));
    assert!(patched > 5000, "{err}");
    assert!(
        err.contains(&format!("detached: {patched} sites restored")),
        "{err}"
    );
    let o = vmtrace(&["report", s(&data), "--format", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let stored = v["events_stored"].as_u64().unwrap();
    let returns = v["graph"]["returns_stored"].as_u64().unwrap();
    assert!(stored + returns <= 3000 && stored > 100, "{v}");
    let said = format!(
        "wrote {} ({} events and {} returns",
        data.display(),
        tracer::trace::report::thousands(stored),
        tracer::trace::report::thousands(returns)
    );
    assert!(err.contains(&said), "expected {said:?} in {err}");
    check_complete(&data, true);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `vmtrace ... --format csv | head -1` of a long trace: the reader goes
/// away while the report is being written (it fills the pipe first): the
/// run ends quietly, status 0, and the data file asked for is complete.
#[test]
fn a_reader_leaving_mid_report_ends_the_run_quietly() {
    let k = mini_elf();
    let dir = scratch("mid-report");
    let data = dir.join("t.data");
    let mut child = Command::new(env!("CARGO_BIN_EXE_vmtrace"))
        .args(["--kernel", s(&k), "--cpus", "2", "--cmdline", "iters=3000"])
        .args(["--trace", "*", "--console", "none", "--format", "csv"])
        .args(["-o", s(&data)])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(
        first.starts_with("time_ns,") || first.contains(','),
        "{first}"
    );
    let o = wait_bounded(child);
    let err = stderr(&o);
    no_panic(&err);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(!err.contains("Broken pipe"), "{err}");
    assert!(err.contains("vmtrace: wrote"), "{err}");
    // Far more than a pipe holds: the reader did leave mid-report.
    assert!(check_complete(&data, false) > 20_000);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Ctrl-C after the run, while a long report is written (stdout a pipe
/// not read: vmtrace is provably still writing it): vmtrace ends at once,
/// by SIGINT, the data file asked for complete, and a one-shot run's
/// temporary data file removed. (Before, Ctrl-C was still caught to stop a
/// run already stopped: ignored, and a second one said "restoring the
/// guest's text".)
#[test]
fn one_shot_ctrl_c_in_the_report_phase_ends_it() {
    let k = mini_elf();
    for asked in [true, false] {
        let dir = scratch(&format!("ctrl-c-report-{asked}"));
        let data = dir.join("t.data");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vmtrace"));
        cmd.args(["--kernel", s(&k), "--cpus", "2", "--cmdline", "iters=3000"])
            .args(["--trace", "*", "--console", "none", "--format", "csv", "-q"])
            .env("TMPDIR", &dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if asked {
            cmd.args(["-o", s(&data)]);
        }
        let mut child = cmd.spawn().unwrap();
        // The run's end: the guest stopped, its text restored, the data
        // file complete. The report (far more than a pipe holds) follows.
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut said = String::new();
        while !said.contains("vmtrace: detached: ") {
            let mut line = String::new();
            assert!(err.read_line(&mut line).unwrap() > 0, "{said}");
            said += &line;
        }
        kill(&child, libc::SIGINT);
        let o = wait_bounded(child);
        std::io::Read::read_to_string(&mut err, &mut said).unwrap();
        no_panic(&said);
        assert_eq!(
            o.status.signal(),
            Some(libc::SIGINT),
            "{:?}: {said}",
            o.status
        );
        assert!(!said.contains("already stopping"), "{said}");
        // Cut short: not the whole report.
        assert!(o.stdout.len() < 20_000 * 10, "{} bytes", o.stdout.len());
        let mut left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        if asked {
            assert_eq!(left, ["t.data"]);
            assert!(check_complete(&data, false) > 20_000);
        } else {
            assert!(left.is_empty(), "{left:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// `record` started with `sig` ignored, as a shell does (`nohup`: SIGHUP;
/// a script's `cmd &`: SIGINT).
fn spawn_ignoring(dir: &Path, data: &Path, sig: libc::c_int) -> Child {
    use std::os::unix::process::CommandExt;
    let k = mini_elf();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vmtrace"));
    cmd.args(["record", "--kernel", s(&k), "--cmdline", "mode=loop"])
        .args(["--trace", "*", "--console", "none", "--timeout", "300"])
        .args(["-o", s(data)])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: signal(2) is async-signal-safe, as pre_exec requires.
    unsafe {
        cmd.pre_exec(move || {
            libc::signal(sig, libc::SIG_IGN);
            Ok(())
        });
    }
    cmd.spawn().expect("run vmtrace")
}

/// Under `nohup` SIGHUP stays ignored (the run goes on); a script's
/// background run, whose SIGINT the shell ignores, still stops on
/// `kill -INT` (found by hand: an early version kept SIGINT ignored too).
#[test]
fn nohup_keeps_sighup_ignored_and_a_background_run_still_stops_on_sigint() {
    let dir = scratch("nohup");
    let data = dir.join("t.data");
    let mut child = spawn_ignoring(&dir, &data, libc::SIGHUP);
    wait_for_growth(&mut child, &data, 128 << 10);
    kill(&child, libc::SIGHUP);
    let grown = size(&data);
    wait_for_growth(&mut child, &data, grown + (128 << 10));
    assert!(
        child.try_wait().unwrap().is_none(),
        "SIGHUP stopped a nohup run"
    );
    kill(&child, libc::SIGTERM);
    let o = wait_bounded(child);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("stopped by SIGTERM"), "{}", stderr(&o));
    check_complete(&data, false);

    let data = dir.join("bg.data");
    let mut child = spawn_ignoring(&dir, &data, libc::SIGINT);
    wait_for_growth(&mut child, &data, 128 << 10);
    kill(&child, libc::SIGINT);
    let o = wait_bounded(child);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("stopped by Ctrl-C (SIGINT)"),
        "{}",
        stderr(&o)
    );
    check_complete(&data, false);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Ctrl-C while Linux boots, before vmtrace could attach: the run says
/// nothing was traced, exit status 1 (no trace is not a success), and the
/// data file asked for is left readable, with no events.
#[test]
fn linux_ctrl_c_before_the_attach_says_nothing_was_traced() {
    let (bz, _) = linux_61();
    let initrd = root().join("guest/out/initramfs.cpio.gz");
    let dir = scratch("linux-early");
    let data = dir.join("early.data");
    // The console on stderr (the default): the signal is sent at the
    // guest's first line, printed by the early console (`earlyprintk`,
    // registered in setup_arch) before ftrace_init (hence the attach)
    // whatever the host's speed. (ttyS0's own console starts after
    // ftrace_init: its first line comes after the attach.)
    let mut child = Command::new(env!("CARGO_BIN_EXE_vmtrace"))
        .args(["record", "--kernel", s(&bz), "--initrd", s(&initrd)])
        .args([
            "--cpus",
            "2",
            "--mem",
            "96",
            "--cmdline",
            "earlyprintk=serial",
        ])
        .args(["--trace", "hrtimer_*", "-o", s(&data)])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap());
    let mut err = String::new();
    while !err.contains("Linux version") {
        let mut line = String::new();
        assert!(lines.read_line(&mut line).unwrap() > 0, "{err}");
        err += &line;
    }
    kill(&child, libc::SIGINT);
    // The rest read while vmtrace ends (a full pipe would hold it up).
    let rest = std::thread::spawn(move || {
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut lines, &mut rest).map(|_| rest)
    });
    let o = wait_bounded(child);
    err += &rest.join().unwrap().unwrap();
    no_panic(&err);
    // Never skipped: the signal came before the attach could.
    assert!(!err.contains("vmtrace: attached:"), "{err}");
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("vmtrace: stopped by Ctrl-C (SIGINT) after "),
        "{err}"
    );
    assert!(
        err.trim_end().ends_with(
            "vmtrace: the guest stopped (stopped by Ctrl-C (SIGINT)) before vmtrace could attach; nothing was traced"
        ),
        "{err}"
    );
    let o = vmtrace(&["report", s(&data), "--format", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["events"].as_u64(), Some(0), "{v}");
    let _ = std::fs::remove_dir_all(&dir);
}
