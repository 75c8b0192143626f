//! docs/attach.md's recipe, run as the page writes it: its QEMU command
//! line boots the default guest with the workload initramfs, its `vmtrace
//! attach` line attaches, and `go getpid N` typed into the console is
//! counted exactly. Both lines are read from the page (only the QMP
//! socket's directory is a fresh one, and `--format json` is added to read
//! the counts), so the page cannot drift from what works.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::attach::{count_of, Attach};
use common::qemu::{BOOT_TIMEOUT, COMMAND_TIMEOUT};
use common::root;

/// The page's QMP socket, replaced by one in a fresh directory.
const DOC_QMP: &str = "/tmp/vm/qmp.sock";

/// The page's recipe: QEMU's arguments, vmtrace attach's arguments (after
/// `attach`), and the N of the `go getpid N` it tells to type.
fn recipe() -> (Vec<String>, Vec<String>, u64) {
    let text = std::fs::read_to_string(root().join("docs/attach.md")).unwrap();
    // The code before the page's second section: the recipe comes first.
    let (head, _) = text.split_once("\n## Attaching").expect("a recipe section");
    let mut joined = Vec::new();
    let mut cur = String::new();
    for line in head.lines().filter(|l| l.starts_with("    ")) {
        let line = line.trim();
        match line.strip_suffix('\\') {
            Some(part) => cur.push_str(part),
            None => {
                cur.push_str(line);
                joined.push(std::mem::take(&mut cur));
            }
        }
    }
    let words = |l: &str| -> Vec<String> {
        // The recipe's only quoting: single quotes around one word each.
        let mut out: Vec<String> = Vec::new();
        let mut quoted: Option<String> = None;
        for w in l.split_whitespace() {
            match (&mut quoted, w.strip_prefix('\'')) {
                (Some(q), _) => {
                    q.push(' ');
                    q.push_str(w.trim_end_matches('\''));
                    if w.ends_with('\'') {
                        out.push(quoted.take().unwrap());
                    }
                }
                (None, Some(rest)) if rest.ends_with('\'') => {
                    out.push(rest.trim_end_matches('\'').into())
                }
                (None, Some(rest)) => quoted = Some(rest.into()),
                (None, None) => out.push(w.into()),
            }
        }
        out
    };
    let qemu = joined
        .iter()
        .find(|l| l.starts_with("qemu-system-x86_64 "))
        .map(|l| words(l)[1..].to_vec())
        .expect("a QEMU command line in the recipe");
    let attach = joined
        .iter()
        .find_map(|l| l.strip_prefix("sudo vmtrace attach "))
        .map(words)
        .expect("a vmtrace attach line in the recipe");
    let n = head
        .split("`go getpid ")
        .nth(1)
        .and_then(|r| r.split('`').next())
        .and_then(|n| n.parse().ok())
        .expect("`go getpid N` in the recipe");
    (qemu, attach, n)
}

/// QEMU started with the page's arguments: its console on stdin/stdout.
struct Qemu {
    child: Child,
    stdin: ChildStdin,
    console: Arc<(Mutex<String>, Condvar)>,
}

impl Qemu {
    fn start(args: &[String]) -> Qemu {
        let mut child = Command::new("qemu-system-x86_64")
            .args(args)
            .current_dir(root())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("qemu-system-x86_64 (apt-get install qemu-system-x86)");
        let stdin = child.stdin.take().unwrap();
        let console: Arc<(Mutex<String>, Condvar)> = Arc::default();
        let shared = Arc::clone(&console);
        let stdout = child.stdout.take().unwrap();
        thread::spawn(move || {
            for line in BufReader::new(stdout).split(b'\n') {
                let Ok(line) = line else { break };
                let mut text = shared.0.lock().unwrap();
                text.push_str(&String::from_utf8_lossy(&line));
                text.push('\n');
                shared.1.notify_all();
            }
        });
        Qemu {
            child,
            stdin,
            console,
        }
    }

    /// The console line with `pattern` (after `from` bytes of it).
    fn wait_for(&self, pattern: &str, from: usize, timeout: Duration) -> (String, usize) {
        let deadline = Instant::now() + timeout;
        let mut text = self.console.0.lock().unwrap();
        loop {
            if let Some(at) = text[from..].find(pattern) {
                let start = text[..from + at].rfind('\n').map_or(0, |i| i + 1);
                let end = text[from + at..]
                    .find('\n')
                    .map_or(text.len(), |i| from + at + i);
                return (text[start..end].to_string(), end);
            }
            assert!(
                Instant::now() < deadline,
                "no {pattern:?} on the console:\n{}",
                common::console::tail(&text, 30)
            );
            text = self
                .console
                .1
                .wait_timeout(text, Duration::from_millis(200))
                .unwrap()
                .0;
        }
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_pages_qemu_recipe_boots_and_its_attach_counts_exactly() {
    common::qemu::workload_initramfs();
    let (qemu_args, attach_args, n) = recipe();
    assert!(n > 0);
    let dir = tempdir();
    let qmp = dir.join("qmp.sock");
    let qemu_args: Vec<String> = qemu_args
        .iter()
        .map(|a| a.replace(DOC_QMP, qmp.to_str().unwrap()))
        .collect();
    assert!(
        qemu_args.iter().any(|a| a.contains(qmp.to_str().unwrap())),
        "the recipe's QMP socket is {DOC_QMP}: {qemu_args:?}"
    );
    let mut qemu = Qemu::start(&qemu_args);
    let (ready, at) = qemu.wait_for("workload: ready", 0, BOOT_TIMEOUT);
    assert!(ready.contains("pid=1"), "{ready}");
    // `-smp N,sockets=N`: the guest, without ACPI, runs on all N (with a
    // plain `-smp N`, on one).
    let smp = qemu_args.iter().position(|a| a == "-smp").expect("-smp");
    let cpus = qemu_args[smp + 1].split(',').next().unwrap();
    let (up, _) = qemu.wait_for("smp: Brought up", 0, COMMAND_TIMEOUT);
    assert!(up.trim_end().ends_with(&format!(" {cpus} CPUs")), "{up}");
    // The page's attach, with the fresh socket and a JSON report.
    let at_qmp = attach_args.iter().position(|a| a == "--qmp").unwrap();
    assert_eq!(attach_args[at_qmp + 1], DOC_QMP);
    let mut rest = attach_args.clone();
    rest.drain(at_qmp..at_qmp + 2);
    rest.extend(["--format".into(), "json".into()]);
    let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
    let mut a = Attach::start(&qmp, &rest);
    a.wait_line("vmtrace: attached");
    writeln!(qemu.stdin, "go getpid {n}").unwrap();
    qemu.stdin.flush().unwrap();
    let (done, _) = qemu.wait_for(&format!("workload: done getpid {n}"), at, COMMAND_TIMEOUT);
    assert!(done.contains("pid="), "{done}");
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}", e.stderr);
    assert_eq!(
        count_of(&e.counts(), &["__do_sys_getpid", "__x64_sys_getpid"]),
        n,
        "{}",
        e.stdout
    );
    // The guest runs on as found: it still answers.
    assert!(qemu.child.try_wait().unwrap().is_none(), "QEMU exited");
    writeln!(qemu.stdin, "ping").unwrap();
    qemu.stdin.flush().unwrap();
    qemu.wait_for("workload: pong", at, COMMAND_TIMEOUT);
    drop(qemu);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fresh private directory for the QMP socket.
fn tempdir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("vmtrace-recipe-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    assert!(Path::new(&dir).is_dir());
    dir
}
