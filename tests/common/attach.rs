//! A `vmtrace attach` the QEMU tests run (tests/qemu_attach.rs): its
//! stderr line by line as it comes (to wait for `attached`), its stdout and
//! exit status at the end, its `--format json` report's counts.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::s;
use tracer::qemu::stub;

/// A hang guard for a vmtrace run (far above any run's time).
const HANG: Duration = Duration::from_secs(300);

/// A `vmtrace attach` running: its stderr lines as they come, its stdout
/// at the end. Dropping it kills it.
pub struct Attach {
    pub child: Child,
    /// When it was started: a private directory older than this is another
    /// process's that had the same pid (pids wrap; a killed vmtrace leaves
    /// its directory).
    started: std::time::SystemTime,
    lines: Arc<(Mutex<Vec<String>>, Condvar)>,
    err: Option<JoinHandle<()>>,
    out: Option<JoinHandle<String>>,
}

/// How a `vmtrace attach` ended.
pub struct Ended {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Ended {
    /// The `--format json` report's count per function name.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        let v = self.json();
        v["functions"]
            .as_array()
            .unwrap_or_else(|| panic!("no functions in {v}"))
            .iter()
            .map(|f| {
                (
                    f["name"].as_str().unwrap().to_string(),
                    f["count"].as_u64().unwrap(),
                )
            })
            .collect()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}): {}\nstderr: {}",
                self.stdout, self.stderr
            )
        })
    }
}

/// The count of the one function of `names` the report lists (aliases
/// share an address: the report names it once).
pub fn count_of(counts: &BTreeMap<String, u64>, names: &[&str]) -> u64 {
    let found: Vec<u64> = names
        .iter()
        .filter_map(|n| counts.get(*n).copied())
        .collect();
    assert_eq!(found.len(), 1, "one of {names:?} in {counts:?}");
    found[0]
}

/// `vmtrace attach` of `bz`'s kernel with the JSON report, tracing
/// `trace`, `more` flags after, once it said it attached.
pub fn attach_json(qmp: &Path, bz: &Path, trace: &str, more: &[&str]) -> Attach {
    let mut args = vec!["--kernel", s(bz), "--format", "json", "--trace", trace];
    args.extend_from_slice(more);
    let mut a = Attach::start(qmp, &args);
    a.wait_line("vmtrace: attached to QEMU");
    a
}

impl Attach {
    /// Start `vmtrace attach --qmp QMP ARGS... -q`.
    pub fn start(qmp: &Path, args: &[&str]) -> Attach {
        Attach::spawn(&["--qmp", s(qmp)], args)
    }

    /// Start `vmtrace attach --domain NAME ARGS... -q` (libvirt's default
    /// URI).
    pub fn start_domain(name: &str, args: &[&str]) -> Attach {
        Attach::spawn(&["--domain", name], args)
    }

    fn spawn(target: &[&str], args: &[&str]) -> Attach {
        let started = std::time::SystemTime::now();
        let mut child = Command::new(env!("CARGO_BIN_EXE_vmtrace"))
            .arg("attach")
            .args(target)
            .arg("-q")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run vmtrace");
        let lines: Arc<(Mutex<Vec<String>>, Condvar)> = Arc::default();
        let shared = Arc::clone(&lines);
        let stderr = child.stderr.take().unwrap();
        let err = thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                eprintln!("  [vmtrace] {line}");
                shared.0.lock().unwrap().push(line);
                shared.1.notify_all();
            }
        });
        let mut stdout = child.stdout.take().unwrap();
        let out = thread::spawn(move || {
            let mut text = String::new();
            let _ = stdout.read_to_string(&mut text);
            text
        });
        Attach {
            child,
            started,
            lines,
            err: Some(err),
            out: Some(out),
        }
    }

    /// The first stderr line containing `pattern`; panics (with stderr) if
    /// vmtrace exits first.
    pub fn wait_line(&mut self, pattern: &str) -> String {
        let deadline = Instant::now() + HANG;
        let mut lines = self.lines.0.lock().unwrap();
        loop {
            if let Some(l) = lines.iter().find(|l| l.contains(pattern)) {
                return l.clone();
            }
            let exited = self.child.try_wait().unwrap().is_some();
            if exited || Instant::now() >= deadline {
                let why = if exited {
                    "vmtrace exited"
                } else {
                    "timed out"
                };
                panic!(
                    "{why} before saying {pattern:?}; stderr:\n{}",
                    lines.join("\n")
                );
            }
            lines = self
                .lines
                .1
                .wait_timeout(lines, Duration::from_millis(100))
                .unwrap()
                .0;
        }
    }

    pub fn attached(mut self) -> Attach {
        // "to QEMU ...", or "to libvirt domain NAME (URI): QEMU ...".
        let line = self.wait_line("vmtrace: attached to ");
        assert!(line.contains("exitless"), "{line}");
        self
    }

    pub fn signal(&self, sig: libc::c_int) {
        super::kill(&self.child, sig);
    }

    /// Wait for vmtrace to exit by itself (killed after [`HANG`]).
    pub fn end(mut self) -> Ended {
        let deadline = Instant::now() + HANG;
        let status = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                panic!("vmtrace hung: {}", self.lines.0.lock().unwrap().join("\n"));
            }
            thread::sleep(Duration::from_millis(20));
        };
        self.err.take().unwrap().join().unwrap();
        let stdout = self.out.take().unwrap().join().unwrap();
        let stderr = self.lines.0.lock().unwrap().join("\n");
        super::read_back(&stderr);
        Ended {
            status,
            stdout,
            stderr,
        }
    }
}

impl Drop for Attach {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The gdbstub socket vmtrace opened for `attach`: `gdb.sock` in its
/// private directory, `vmtrace-gdb-PID-XXXXXX` (tracer::qemu::stub) in
/// $XDG_RUNTIME_DIR or the temporary directory; a path that does not
/// exist when it opened none (`--gdb`).
pub fn gdb_socket(vmtrace: &Attach) -> PathBuf {
    let prefix = format!("{}{}-", stub::DIR_PREFIX, vmtrace.child.id());
    let bases = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .into_iter()
        .chain([std::env::temp_dir()]);
    let mut found = Vec::new();
    for base in bases {
        let Ok(entries) = std::fs::read_dir(&base) else {
            continue;
        };
        for e in entries.flatten() {
            let made = e
                .metadata()
                .ok()
                .filter(|m| m.is_dir())
                .and_then(|m| m.modified().ok());
            // (A second of slack for the file system's coarse clock.)
            let since = vmtrace.started - std::time::Duration::from_secs(1);
            if e.file_name().to_string_lossy().starts_with(&prefix)
                && made.is_some_and(|t| t >= since)
            {
                found.push(e.path());
            }
        }
    }
    assert!(found.len() <= 1, "one private directory: {found:?}");
    match found.pop() {
        Some(dir) => dir.join(stub::SOCKET),
        None => std::env::temp_dir()
            .join(format!("{prefix}none"))
            .join(stub::SOCKET),
    }
}

/// `vmtrace detach --qmp QMP`, bounded; its stderr echoed for the log.
pub fn detach(qmp: &Path) -> std::process::Output {
    let child = Command::new(env!("CARGO_BIN_EXE_vmtrace"))
        .args(["detach", "--qmp", s(qmp)])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run vmtrace detach");
    let out = super::wait_bounded(child);
    eprintln!("  [detach] {}", String::from_utf8_lossy(&out.stderr));
    out
}

/// `vmtrace detach` after a killed attach that had plugged the ring
/// device: it succeeds and says it removed the device. Its stderr.
pub fn detach_removes_ring_device(qmp: &Path) -> String {
    let o = detach(qmp);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("removed vmtrace's ring device"), "{err}");
    err
}

/// SIGKILL `vmtrace attach` and its one guardian (as when the OOM killer
/// or a cgroup kill takes both): the VM waits for `vmtrace detach`.
pub fn kill_with_guardian(a: Attach) {
    let pid = a.child.id();
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
    let guardians: Vec<i32> = children
        .split_whitespace()
        .map(|c| c.parse().unwrap())
        .collect();
    assert_eq!(guardians.len(), 1, "one guardian: {children:?}");
    for g in guardians {
        // SAFETY: kill(2) of the attach's own child, before the attach
        // (its parent) is killed: it cannot have been reaped and reused.
        assert_eq!(unsafe { libc::kill(g, libc::SIGKILL) }, 0);
    }
    a.signal(libc::SIGKILL);
    let _ = a.end();
}
