//! Output hardening (issue 14): `-o` (the data file) and `--export FMT=FILE`
//! never clobber what is not a regular file and are checked before the
//! guest boots; a failed write after a run
//! still prints the report, says what was lost, exits 1 and leaves no
//! partial file; no output error panics (a closed pipe ends quietly); huge
//! durations are refused; dropped events are said in every format.
//!
//! Device and full-disk cases need root (mknod, mount): without it they use
//! /dev/full itself (safe: an unprivileged vmtrace cannot replace it) or are
//! skipped with a message.

mod common;

use std::fs;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// A run that takes longer is stuck (a FIFO opened for writing, say): a
/// guard against a hang, far above any run here even on a loaded host, not
/// a measured time (no test asserts one: CI hosts are noisy).
const STUCK_AFTER: Duration = Duration::from_secs(120);

/// A fresh directory for one test.
fn scratch(test: &str) -> PathBuf {
    scratch_in("outputs", test)
}

/// Run vmtrace with `stdout`, killing it if it is stuck; (output, took).
fn run(args: &[&str], stdout: Stdio) -> (Output, Duration) {
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_vmtrace"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .expect("run vmtrace");
    // Read stderr on a thread so a chatty child never blocks on it.
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let mut out = Vec::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_end(&mut out);
    }
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if started.elapsed() > STUCK_AFTER {
            let _ = child.kill();
            let st = child.wait().unwrap();
            let e = String::from_utf8_lossy(&reader.join().unwrap()).into_owned();
            panic!("vmtrace {args:?} stuck for {STUCK_AFTER:?} ({st}): {e}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = started.elapsed();
    let stderr = reader.join().unwrap();
    (
        Output {
            status,
            stdout: out,
            stderr,
        },
        took,
    )
}

fn no_panic(o: &Output) {
    let err = stderr(o);
    assert!(
        !err.contains("panicked")
            && !err.contains("RUST_BACKTRACE")
            && o.status.code() != Some(101),
        "panic: {err}"
    );
}

/// Exit status 2, one line naming `needle`, and no guest ran (the mini
/// guest prints `mini: start` on its console, stderr by default, as it
/// boots): what refusing in seconds meant, without timing the run.
fn refused(args: &[&str], needle: &str) {
    let (o, _) = run(args, Stdio::piped());
    let err = stderr(&o);
    no_panic(&o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "one line for {args:?}: {err}"
    );
    assert!(err.starts_with("vmtrace: "), "{err}");
    assert!(err.contains(needle), "expected {needle:?} in {err}");
    assert!(
        !stdout(&o).contains("mini:") && !err.contains("mini:"),
        "{args:?}: the guest ran: {}",
        stdout(&o)
    );
}

/// `-o FILE` (the data file) for the text format, else `--export FMT=FILE`:
/// every way a run writes a file.
fn write_to(fmt: &str, path: &Path) -> Vec<String> {
    if fmt == "text" {
        vec!["-o".into(), s(path).into()]
    } else {
        vec!["--export".into(), format!("{fmt}={}", s(path))]
    }
}

fn is_char_device(p: &Path) -> bool {
    fs::symlink_metadata(p)
        .map(|m| m.file_type().is_char_device())
        .unwrap_or(false)
}

fn is_root() -> bool {
    // SAFETY: no arguments, no memory.
    unsafe { libc::geteuid() == 0 }
}

/// A device node like `/dev/full` or `/dev/null` (`minor` 7 or 3 of major 1)
/// in `dir`, so that a vmtrace that wrongly replaced it harms nothing. As
/// root, mknod; without root, the real one (which an unprivileged vmtrace
/// cannot replace); None if root cannot mknod here (nodev).
fn mem_device(dir: &Path, name: &str, minor: u32) -> Option<PathBuf> {
    if !is_root() {
        return Some(PathBuf::from(format!("/dev/{name}")));
    }
    let p = dir.join(name);
    let c = std::ffi::CString::new(s(&p)).unwrap();
    // SAFETY: `c` is a NUL-terminated path that outlives the call; mknod
    // only reads it.
    let r = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, minor)) };
    if r != 0 {
        eprintln!(
            "skipped: cannot mknod {}: {}",
            p.display(),
            std::io::Error::last_os_error()
        );
        return None;
    }
    Some(p)
}

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(s(p)).unwrap();
    // SAFETY: `c` is a NUL-terminated path that outlives the call; mkfifo
    // only reads it.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
}

/// Item 1: -o or --export naming a directory, a FIFO, a path in a missing
/// directory, a path under a regular file or a symlink to nothing is
/// refused before the guest boots (exit 2, one line, < 5 s) and left as it
/// was; the same for `vmtrace report --export` and `vmtrace record -o`. Before: each booted and traced the guest first,
/// then failed (exit 1), or replaced the FIFO with a regular file (exit 0).
#[test]
fn bad_output_paths_are_refused_before_the_guest_boots() {
    let k = mini_elf();
    let k = s(&k);
    let dir = scratch("refused");
    let fifo = dir.join("fifo");
    mkfifo(&fifo);
    let plain = dir.join("plain");
    fs::write(&plain, b"keep").unwrap();
    let dangling = dir.join("dangling");
    std::os::unix::fs::symlink(dir.join("nowhere"), &dangling).unwrap();
    let missing = dir.join("no/such/dir/out.json");
    let under_file = plain.join("out.json");

    let trace = ["--kernel", k, "--trace", "hrtimer_*"];
    for (path, needle, formats) in [
        (&dir, "it is a directory", &["text", "json"][..]),
        (&fifo, "it is a FIFO", &["text", "csv", "chrome"][..]),
        (&missing, "does not exist", &["text", "json"][..]),
        (&under_file, "is not a directory", &["csv"][..]),
        (
            &dangling,
            "symlink to a file that does not exist",
            &["text"][..],
        ),
    ] {
        for fmt in formats {
            let out = write_to(fmt, path);
            let mut args = trace.to_vec();
            args.extend(out.iter().map(String::as_str));
            refused(&args, needle);
        }
        let mut record = vec!["record"];
        record.extend(trace);
        record.extend(["-o", s(path)]);
        refused(&record, needle);
    }
    // The guest console's file follows the same rules (a FIFO would block
    // the run until someone read it).
    for (path, needle) in [(&fifo, "it is a FIFO"), (&dir, "it is a directory")] {
        refused(&["--kernel", k, "--console", s(path)], needle);
    }
    assert!(fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
    assert!(fs::metadata(&dir).unwrap().is_dir());
    assert_eq!(fs::read(&plain).unwrap(), b"keep");
    assert!(fs::symlink_metadata(&dangling)
        .unwrap()
        .file_type()
        .is_symlink());

    // A block device is never written (as root: a node of our own).
    if is_root() {
        let blk = dir.join("blk");
        let c = std::ffi::CString::new(s(&blk)).unwrap();
        // SAFETY: `c` is a NUL-terminated path that outlives the call; mknod
        // only reads it (loop0's numbers; the node is never opened).
        if unsafe { libc::mknod(c.as_ptr(), libc::S_IFBLK | 0o600, libc::makedev(7, 0)) } == 0 {
            let mut args = trace.to_vec();
            args.extend(["-o", s(&blk)]);
            refused(&args, "it is a block device");
            assert!(fs::symlink_metadata(&blk)
                .unwrap()
                .file_type()
                .is_block_device());
        }
    }

    // `vmtrace report --export` follows the same rules (its input need not
    // exist: the output is checked first).
    refused(
        &[
            "report",
            "-i",
            "/nonexistent.vmtrace",
            "--export",
            &format!("json={}", s(&dir)),
        ],
        "it is a directory",
    );
    refused(
        &[
            "report",
            "/nonexistent.vmtrace",
            "--export",
            &format!("csv={}", s(&fifo)),
        ],
        "it is a FIFO",
    );
    // Nothing was left behind in the directory (no probe, no temporary file).
    let mut left: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    left.retain(|n| n != "blk");
    assert_eq!(left, ["dangling", "fifo", "plain"]);
    let _ = fs::remove_dir_all(&dir);
}

/// Items 1 and 2: a character device is written into, never replaced. A
/// write error there (/dev/full) after the run still prints the report,
/// names the device in one line, exits 1. Before: the device node was
/// replaced by a regular file and the run reported success.
#[test]
fn a_device_is_written_into_and_a_write_error_there_is_reported() {
    let k = mini_elf();
    let k = s(&k);
    let dir = scratch("device");
    let (Some(full), Some(null)) = (mem_device(&dir, "full", 7), mem_device(&dir, "null", 3))
    else {
        return;
    };
    let rdev = |p: &Path| fs::metadata(p).unwrap().rdev();
    let (full_rdev, null_rdev) = (rdev(&full), rdev(&null));
    for fmt in ["text", "json", "csv", "chrome", "trace.dat"] {
        let out = write_to(fmt, &full);
        let mut args = vec![
            "--kernel",
            k,
            "--trace",
            "hrtimer_*",
            "--console",
            "/dev/null",
        ];
        args.extend(out.iter().map(String::as_str));
        let (o, _) = run(&args, Stdio::piped());
        let err = stderr(&o);
        no_panic(&o);
        assert_eq!(o.status.code(), Some(1), "{fmt}: {err}");
        assert!(
            is_char_device(&full),
            "{fmt}: {} was replaced",
            full.display()
        );
        assert_eq!(rdev(&full), full_rdev);
        // The report still reached the user.
        assert!(
            stdout(&o).starts_with("# vmtrace report"),
            "{fmt}: {}",
            stdout(&o)
        );
        assert!(stdout(&o).contains("hrtimer_interrupt"), "{fmt}");
        // One line says where the data could not be written.
        let last = err.trim_end().lines().last().unwrap();
        assert!(
            last.starts_with("vmtrace: cannot write the ")
                && last.contains(s(&full))
                && last.contains("No space left on device")
                && last.contains("incomplete"),
            "{fmt}: {err}"
        );
        assert!(
            !err.contains(&format!("wrote {}", s(&full))),
            "{fmt}: {err}"
        );
    }
    // Into /dev/null: success, and /dev/null stays a device.
    for fmt in ["text", "csv"] {
        let out = write_to(fmt, &null);
        let mut args = vec![
            "--kernel",
            k,
            "--trace",
            "hrtimer_*",
            "--console",
            "/dev/null",
        ];
        args.extend(out.iter().map(String::as_str));
        let (o, _) = run(&args, Stdio::piped());
        no_panic(&o);
        assert_eq!(o.status.code(), Some(0), "{fmt}: {}", stderr(&o));
        assert!(
            is_char_device(&null),
            "{fmt}: {} was replaced",
            null.display()
        );
        assert_eq!(rdev(&null), null_rdev);
    }
    let _ = fs::remove_dir_all(&dir);
}

/// Item 1: a symlink is followed: the file it points to is replaced (its
/// permissions kept), the link stays. Before: the text format's rename
/// replaced the link itself with the trace.
#[test]
fn a_symlink_is_followed_and_kept() {
    let k = mini_elf();
    let k = s(&k);
    let dir = scratch("symlink");
    fs::create_dir(dir.join("real")).unwrap();
    let target = dir.join("real/trace.vmtrace");
    fs::write(&target, b"old").unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&target, fs::Permissions::from_mode(0o640)).unwrap();
    let link = dir.join("link.vmtrace");
    std::os::unix::fs::symlink("real/trace.vmtrace", &link).unwrap();
    let (o, _) = run(
        &[
            "--kernel",
            k,
            "--trace",
            "hrtimer_*",
            "--console",
            "/dev/null",
            "-o",
            s(&link),
        ],
        Stdio::piped(),
    );
    no_panic(&o);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink(),
        "the link was replaced"
    );
    assert_eq!(fs::read(&target).unwrap()[..8], *b"VMTRACE\0");
    assert_eq!(
        fs::metadata(&target).unwrap().permissions().mode() & 0o777,
        0o640
    );
    let r = vmtrace(&["report", "-i", s(&link)]);
    assert!(r.status.success(), "{}", stderr(&r));
    assert!(stdout(&r).contains("hrtimer_interrupt"));
    // Nothing else appeared beside the target or the link.
    assert_eq!(fs::read_dir(dir.join("real")).unwrap().count(), 1);
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 2);
    let _ = fs::remove_dir_all(&dir);
}

/// A small tmpfs, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Option<Tmpfs> {
        if !is_root() {
            eprintln!("skipped: mounting a tmpfs needs root");
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
            .status();
        match st {
            Ok(st) if st.success() => Some(Tmpfs(dir.to_owned())),
            _ => {
                eprintln!("skipped: cannot mount a tmpfs on {}", dir.display());
                None
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Item 2: a disk that fills during the write (a 2 MiB tmpfs, a ~6 MB CSV):
/// the report is printed on stdout, one line names the file, exit 1, and no
/// partial file is left (an existing file of that name is unchanged). A disk
/// already full is refused before the guest boots. Before: a truncated CSV
/// was left behind and no report was printed; a full disk was found after
/// the run.
#[test]
fn a_full_disk_loses_nothing_quietly() {
    let k = mini_elf();
    let k = s(&k);
    let dir = scratch("full");
    let mnt = dir.join("mnt");
    fs::create_dir(&mnt).unwrap();
    let Some(_tmpfs) = Tmpfs::mount(&mnt, "2m") else {
        return;
    };
    let csv = mnt.join("out.csv");
    fs::write(&csv, b"old\n").unwrap();
    let (o, _) = run(
        &[
            "--kernel",
            k,
            "--cpus",
            "2",
            "--cmdline",
            "iters=12000",
            "--trace",
            "hrtimer_*",
            "--console",
            "/dev/null",
            "--export",
            &format!("csv={}", s(&csv)),
        ],
        Stdio::piped(),
    );
    let err = stderr(&o);
    no_panic(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(stdout(&o).starts_with("# vmtrace report"), "{}", stdout(&o));
    let last = err.trim_end().lines().last().unwrap();
    assert!(
        last.contains(s(&csv))
            && last.contains("No space left on device")
            && last.contains("nothing was written there")
            && last.contains("the text report is on stdout"),
        "{err}"
    );
    assert_eq!(fs::read(&csv).unwrap(), b"old\n");
    assert_eq!(
        fs::read_dir(&mnt).unwrap().count(),
        1,
        "a temporary file was left"
    );

    // Already full: refused before the guest boots.
    let mut fill = fs::File::create(mnt.join("fill")).unwrap();
    let mb = vec![0u8; 1 << 16];
    while std::io::Write::write_all(&mut fill, &mb).is_ok() {}
    drop(fill);
    refused(
        &[
            "--kernel",
            k,
            "--trace",
            "hrtimer_*",
            "--export",
            &format!("json={}", s(&mnt.join("x.json"))),
        ],
        "bytes free",
    );
    drop(_tmpfs);
    let _ = fs::remove_dir_all(&dir);
}

/// Exit status of a run whose stdout reader is gone: 0, or killed by SIGPIPE.
fn quiet_pipe_end(o: &Output, what: &str) {
    no_panic(o);
    let ok = o.status.code() == Some(0) || o.status.signal() == Some(libc::SIGPIPE);
    assert!(ok, "{what}: {} {}", o.status, stderr(o));
    assert!(!stderr(o).contains("Broken pipe"), "{what}: {}", stderr(o));
}

/// Run vmtrace with stdout a pipe whose read end is closed before it writes.
fn closed_pipe(args: &[&str]) -> Output {
    let (r, w) = {
        let mut fds = [0; 2];
        // SAFETY: pipe(2) writes two ints into `fds`, an array of two.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        use std::os::fd::FromRawFd;
        // SAFETY: pipe(2) just made both fds; nothing else owns or closes them.
        unsafe { (fs::File::from_raw_fd(fds[0]), fs::File::from_raw_fd(fds[1])) }
    };
    drop(r);
    let (o, _) = run(args, Stdio::from(w));
    o
}

/// Item 3: the report, an export or the console to a closed pipe (`| head
/// -1`) ends quietly, status 0; to a full stdout a one-line error, status 1.
/// Before: "failed printing to stdout" panics, status 101.
#[test]
fn closed_or_full_stdout_never_panics() {
    let k = mini_elf();
    let k = s(&k);
    let dir = scratch("pipe");
    let saved = dir.join("t.vmtrace");
    let run_args = ["--kernel", k, "--trace", "hrtimer_*"];
    let o = closed_pipe(&run_args);
    quiet_pipe_end(&o, "report");
    let mut with_console = run_args.to_vec();
    with_console.extend(["--console", "-"]);
    let o = closed_pipe(&with_console);
    quiet_pipe_end(&o, "report and console");
    let mut with_o = run_args.to_vec();
    with_o.extend(["-o", s(&saved)]);
    let o = closed_pipe(&with_o);
    quiet_pipe_end(&o, "report with -o");
    assert!(saved.is_file(), "the trace was saved all the same");
    for fmt in ["text", "json", "csv", "chrome"] {
        let mut args = vec!["report", "-i", s(&saved), "--format", fmt];
        // (-g is the text report's: refused with another format.)
        if fmt == "text" {
            args.push("-g");
        }
        let o = closed_pipe(&args);
        quiet_pipe_end(&o, fmt);
    }
    // A real `| head -1`.
    let o = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "'{}' report -i '{}' --format csv | head -1 >/dev/null; echo ${{PIPESTATUS[0]}}",
            env!("CARGO_BIN_EXE_vmtrace"),
            s(&saved)
        ))
        .output()
        .unwrap();
    let status = stdout(&o).trim().to_string();
    assert!(
        status == "0" || status == "141",
        "status {status}: {}",
        stderr(&o)
    );
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));

    // stdout on a full device: one line, status 1.
    if let Some(full) = mem_device(&dir, "full", 7) {
        for args in [
            &["report", "-i", s(&saved)][..],
            &["report", "-i", s(&saved), "--format", "json"][..],
        ] {
            let out = fs::OpenOptions::new().write(true).open(&full).unwrap();
            let (o, _) = run(args, Stdio::from(out));
            let err = stderr(&o);
            no_panic(&o);
            assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
            assert_eq!(err.trim_end().lines().count(), 1, "{err}");
            assert!(
                err.starts_with("vmtrace: cannot write the ")
                    && err.contains("to standard output: No space left on device"),
                "{err}"
            );
        }
    }
    let _ = fs::remove_dir_all(&dir);
}

/// Item 4: durations too long for `Duration` or `Instant` arithmetic are
/// refused in one line, status 2. Before: panics (float to Duration,
/// Instant overflow), status 101.
#[test]
fn huge_durations_are_refused() {
    let k = mini_elf();
    let k = s(&k);
    for (flag, value, shown) in [
        ("--timeout", "1e300", "1e300"),
        ("--duration", "1e20", "1e20"),
        ("--timeout", "1e19", "1e19"),
        ("--duration", "31536001", "31536001"),
    ] {
        refused(
            &["--kernel", k, "--trace", "hrtimer_*", flag, value],
            &format!("{flag} {shown} is too long; use at most 31536000 seconds (365 days)"),
        );
    }
}

/// Item 5: events counted but not stored are said for CSV (a stderr line:
/// the CSV holds events only) and Chrome (otherData and a process_labels
/// metadata event, plus the stderr line). Before: neither said anything.
#[test]
fn dropped_events_are_reported_in_csv_and_chrome() {
    let k = mini_elf();
    let k = s(&k);
    let dir = scratch("dropped");
    let saved = dir.join("t.vmtrace");
    let o = vmtrace(&[
        "--kernel",
        k,
        "--trace",
        "hrtimer_*",
        "--max-events",
        "10",
        "--console",
        "/dev/null",
        "-o",
        s(&saved),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let json = vmtrace(&["report", "-i", s(&saved), "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&json)).unwrap();
    let total = v["events"].as_u64().unwrap();
    let dropped = v["dropped"].as_u64().unwrap();
    assert_eq!(v["events_stored"], 10);
    assert_eq!(dropped, total - 10);
    assert!(dropped > 0);
    // Each one's cause: over the event budget (counted by the recorders),
    // none for another cause.
    assert_eq!(v["drops"]["over_budget"], dropped, "{}", v["drops"]);
    assert_eq!(v["drops"]["ring_full"], serde_json::json!([]));
    let said = format!("holds 10 of {total} events: {dropped} were counted but not stored");

    // CSV: the data unchanged (header and 10 rows), the loss on stderr.
    let csv = vmtrace(&["report", "-i", s(&saved), "--format", "csv"]);
    assert!(csv.status.success(), "{}", stderr(&csv));
    assert_eq!(stdout(&csv).lines().count(), 11);
    assert!(stdout(&csv).starts_with("ts_ns,cpu,"));
    assert!(
        stderr(&csv).contains(&format!("the CSV output {said}")),
        "{}",
        stderr(&csv)
    );
    // To a file, live: the same line.
    let out = dir.join("live.csv");
    let o = vmtrace(&[
        "--kernel",
        k,
        "--trace",
        "hrtimer_*",
        "--max-events",
        "10",
        "--console",
        "/dev/null",
        "--export",
        &format!("csv={}", s(&out)),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("were counted but not stored"),
        "{}",
        stderr(&o)
    );
    assert_eq!(fs::read_to_string(&out).unwrap().lines().count(), 11);

    // Chrome: in the document itself.
    let chrome = vmtrace(&["report", "-i", s(&saved), "--format", "chrome"]);
    assert!(chrome.status.success(), "{}", stderr(&chrome));
    assert!(
        stderr(&chrome).contains(&format!("the Chrome trace {said}")),
        "{}",
        stderr(&chrome)
    );
    let c: serde_json::Value = serde_json::from_str(&stdout(&chrome)).unwrap();
    assert_eq!(c["otherData"]["dropped"], dropped);
    assert_eq!(c["otherData"]["events"], total);
    assert_eq!(c["otherData"]["events_stored"], 10);
    let labels: Vec<&serde_json::Value> = c["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "process_labels")
        .collect();
    assert_eq!(labels.len(), 1);
    assert_eq!(
        labels[0]["args"]["labels"],
        format!("{dropped} of {total} events dropped (not stored)")
    );

    // Nothing dropped: no line, otherData says 0, no label.
    let o = vmtrace(&[
        "--kernel",
        k,
        "--trace",
        "hrtimer_*",
        "--console",
        "/dev/null",
        "--format",
        "chrome",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("not stored"), "{}", stderr(&o));
    let c: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(c["otherData"]["dropped"], 0);
    assert!(!stdout(&o).contains("process_labels"));
    let _ = fs::remove_dir_all(&dir);
}

/// A stderr pipe whose reader has gone loses vmtrace's messages, not the
/// run: no panic (exit 101 before), the guest runs, the report is printed.
#[test]
fn a_closed_stderr_pipe_never_panics() {
    let k = mini_elf();
    let cmd = format!(
        "{} --kernel {} --cmdline iters=3 --trace 'hrtimer_*' --console /dev/null 2> >(head -c0)",
        env!("CARGO_BIN_EXE_vmtrace"),
        k.display()
    );
    let out = std::process::Command::new("bash")
        .args(["-c", &cmd])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("hrtimer_interrupt"));
}

#[test]
fn a_console_that_cannot_be_written_is_said_not_lost_silently() {
    let kernel = mini_elf();
    let out = vmtrace(&[
        "--kernel",
        kernel.to_str().unwrap(),
        "--cmdline",
        "iters=10",
        "--console",
        "/dev/full",
    ]);
    let err = stderr(&out);
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.contains(
            "vmtrace: the guest console could not be written to /dev/full: No space left on device"
        ),
        "{err}"
    );
}
