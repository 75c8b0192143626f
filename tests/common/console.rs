//! A guest's serial console on a unix socket the test holds (QEMU's, or a
//! libvirt domain's): every byte kept for [`SerialConsole::text`] and
//! [`SerialConsole::wait_for`], and [`SerialConsole::send_line`] types
//! into it; the workload's commands on top (guest/linux/workload.c).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::qemu::{Workload, BOOT_TIMEOUT, COMMAND_TIMEOUT};

/// The console so far and how far [`SerialConsole::wait_for`] has read.
#[derive(Default)]
struct Console {
    bytes: Vec<u8>,
    /// Byte offset after the last line a `wait_for` matched.
    cursor: usize,
    /// The serial socket closed (QEMU exited).
    closed: bool,
}

type Shared = Arc<(Mutex<Console>, Condvar)>;

/// The serial socket and the thread that keeps what it sends.
pub struct SerialConsole {
    serial: UnixStream,
    console: Shared,
    reader: Option<JoinHandle<()>>,
    /// What a closed socket means, for the errors ("QEMU exited").
    gone: &'static str,
}

impl SerialConsole {
    /// Keep everything `serial` sends from now on.
    pub fn new(serial: UnixStream, gone: &'static str) -> SerialConsole {
        let console: Shared = Arc::default();
        let reader = spawn_reader(serial.try_clone().expect("clone serial socket"), &console);
        SerialConsole {
            serial,
            console,
            reader: Some(reader),
            gone,
        }
    }

    /// The first whole console line containing `pattern` after the line the
    /// previous `wait_for` matched (expect-style: wait in the order the
    /// lines come), without its line end. Err (with the console's tail) if
    /// the socket closes or `timeout` passes first.
    pub fn wait_for(&self, pattern: &str, timeout: Duration) -> Result<String, String> {
        let deadline = Instant::now() + timeout;
        let (lock, cond) = &*self.console;
        let mut c = lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            while let Some(nl) = c.bytes[c.cursor..].iter().position(|&b| b == b'\n') {
                let line = String::from_utf8_lossy(&c.bytes[c.cursor..c.cursor + nl]);
                let line = line.trim_end_matches('\r').to_string();
                c.cursor += nl + 1;
                if line.contains(pattern) {
                    return Ok(line);
                }
            }
            let now = Instant::now();
            if c.closed || now >= deadline {
                let why = if c.closed { self.gone } else { "timed out" };
                let text = String::from_utf8_lossy(&c.bytes).into_owned();
                return Err(format!(
                    "{why} waiting for {pattern:?} on the console{}",
                    excerpt(&text)
                ));
            }
            c = cond
                .wait_timeout(c, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Wait for the workload's ready line ([`BOOT_TIMEOUT`]).
    pub fn wait_ready(&self) -> Result<Workload, String> {
        let line = self.wait_for("workload: ready ", BOOT_TIMEOUT)?;
        Workload::parse(&line).ok_or_else(|| format!("not a ready line: {line:?}"))
    }

    /// Type `line` and a newline into the guest's console.
    pub fn send_line(&self, line: &str) {
        let mut s = &self.serial;
        s.write_all(format!("{line}\n").as_bytes())
            .unwrap_or_else(|e| panic!("write {line:?} to the guest's serial port: {e}"));
    }

    /// Make the worker call `syscall` (getpid, getppid, openat) `n` times
    /// and wait for its `done` line, which is returned.
    pub fn go(&self, syscall: &str, n: u64) -> Result<String, String> {
        self.send_line(&format!("go {syscall} {n}"));
        let line = self.wait_for(&format!("workload: done {syscall} {n} "), COMMAND_TIMEOUT)?;
        if line.contains("unexpected=") {
            return Err(format!("the workload saw unexpected results: {line}"));
        }
        Ok(line)
    }

    /// All console output so far (`\r\n` as the guest's tty wrote it).
    pub fn text(&self) -> String {
        let c = self.console.0.lock().unwrap_or_else(|e| e.into_inner());
        String::from_utf8_lossy(&c.bytes).into_owned()
    }

    /// Close the socket and wait for the reader.
    pub fn close(&mut self) {
        let _ = self.serial.shutdown(std::net::Shutdown::Both);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

impl Drop for SerialConsole {
    fn drop(&mut self) {
        self.close();
    }
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// What a kernel prints when something went wrong (`guard::BAD` too).
const COMPLAINTS: [&str; 5] = ["WARNING:", "BUG:", "ftrace bug", "Oops", "Kernel panic"];

/// A console's part worth showing in a failure: from a little before the
/// kernel's first complaint, if it made one, else its end; and where the
/// whole console was saved (a file in the temporary directory).
fn excerpt(console: &str) -> String {
    static SAVED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = SAVED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("vmtrace-console-{}-{n}.txt", std::process::id()));
    let saved = match std::fs::write(&path, console) {
        Ok(()) => format!("whole console in {}", path.display()),
        Err(e) => format!("not saved to {}: {e}", path.display()),
    };
    let lines: Vec<&str> = console.lines().collect();
    match lines
        .iter()
        .position(|l| COMPLAINTS.iter().any(|b| l.contains(b)))
    {
        Some(at) => {
            let from = at.saturating_sub(COMPLAINT_BEFORE);
            let to = (at + COMPLAINT_AFTER).min(lines.len());
            format!(
                " ({saved}); its first complaint, at line {}:\n{}",
                at + 1,
                lines[from..to].join("\n")
            )
        }
        None => format!(" ({saved}); its end:\n{}", tail(console, 40)),
    }
}

/// Panic if `console` has a line with one of `bad` (a kernel's complaint),
/// showing the console from a few lines before the first such line on (a
/// CI log keeps the end of a long message only: the whole console would
/// hide the complaint), and `what` (which step, what vmtrace said).
pub fn assert_no_complaint(console: &str, bad: &[&str], what: &str) {
    let lines: Vec<&str> = console.lines().collect();
    let Some(at) = lines.iter().position(|l| bad.iter().any(|b| l.contains(b))) else {
        return;
    };
    let from = at.saturating_sub(COMPLAINT_BEFORE);
    let to = (at + COMPLAINT_AFTER).min(lines.len());
    panic!(
        "the guest complained (console line {}): {}\n{}\n{what}",
        at + 1,
        lines[at],
        lines[from..to].join("\n")
    );
}

/// Console lines shown before a complaint's line (what led to it) ...
const COMPLAINT_BEFORE: usize = 8;
/// ... and from it on (a WARNING's registers and call trace).
const COMPLAINT_AFTER: usize = 60;

/// A thread that keeps everything the serial port sends.
fn spawn_reader(mut serial: UnixStream, console: &Shared) -> JoinHandle<()> {
    let console = Arc::clone(console);
    thread::spawn(move || {
        let mut buf = [0u8; 4096];
        let (lock, cond) = &*console;
        loop {
            let n = match serial.read(&mut buf) {
                Ok(0) | Err(_) => 0,
                Ok(n) => n,
            };
            let mut c = lock.lock().unwrap_or_else(|e| e.into_inner());
            if n == 0 {
                c.closed = true;
                cond.notify_all();
                return;
            }
            c.bytes.extend_from_slice(&buf[..n]);
            cond.notify_all();
        }
    })
}
