//! The live status line on a terminal's stderr: during the boot, what
//! vmtrace waits for; while tracing, calls, stored and dropped events, the
//! rate and the time left of `--duration`. Redrawn once a second in place
//! (`\r` + erase line).
//!
//! Written here rather than with a progress-bar crate: the guest console
//! shares stderr by default and is written by the VMM's serial device, not
//! by vmtrace's controller, so whatever draws the line must also be told
//! when console text goes out. [`ConsoleOnStderr`] erases the status line
//! before console text; the next redraw puts it back under it.
//!
//! The console goes out a whole line at a time: the serial device writes
//! and flushes each byte as the guest sends it, and vmtrace's own lines
//! (the attach, notes, the end) would otherwise land inside a console line
//! the guest was still sending. The unfinished line waits for its newline
//! (or the run's end: [`end_console`]); so does the console on stdout
//! (`--console -`), where the report follows it.

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tracer::session::Progress;
use tracer::trace::report::thousands;

/// A status line is on the terminal (erase it before other output).
static SHOWN: AtomicBool = AtomicBool::new(false);

/// Erases the status line, if one is shown.
pub fn clear() {
    if SHOWN.swap(false, Ordering::Relaxed) {
        let mut err = io::stderr().lock();
        let _ = err.write_all(b"\r\x1b[K");
        let _ = err.flush();
    }
}

/// Draws `line` as the status line.
pub fn draw(line: &str) {
    let mut err = io::stderr().lock();
    let _ = write!(err, "\r\x1b[K{line}");
    let _ = err.flush();
    SHOWN.store(true, Ordering::Relaxed);
}

/// A console line longer than this goes out in pieces (a guest that never
/// ends its line must not grow vmtrace's memory).
const HELD_MAX: usize = 4096;

/// The console's bytes not yet written: its unfinished line.
#[derive(Default)]
struct Held(Vec<u8>);

impl Held {
    /// Add `buf`; the whole lines it completes, to write now.
    fn lines(&mut self, buf: &[u8]) -> Option<Vec<u8>> {
        self.0.extend_from_slice(buf);
        match self.0.iter().rposition(|&b| b == b'\n') {
            Some(end) => Some(self.0.drain(..=end).collect()),
            None if self.0.len() >= HELD_MAX => self.rest(),
            None => None,
        }
    }

    /// The unfinished line, ended with a newline (the run's end).
    fn rest(&mut self) -> Option<Vec<u8>> {
        if self.0.is_empty() {
            return None;
        }
        let mut rest = std::mem::take(&mut self.0);
        rest.push(b'\n');
        Some(rest)
    }
}

/// The guest console's unfinished line on stderr.
static HELD: Mutex<Held> = Mutex::new(Held(Vec::new()));

/// The guest console's unfinished line on stdout (`--console -`, where
/// the report follows it).
static HELD_OUT: Mutex<Held> = Mutex::new(Held(Vec::new()));

fn held() -> std::sync::MutexGuard<'static, Held> {
    HELD.lock().unwrap_or_else(|p| p.into_inner())
}

fn held_out() -> std::sync::MutexGuard<'static, Held> {
    HELD_OUT.lock().unwrap_or_else(|p| p.into_inner())
}

/// Writes out `lines` on stdout.
fn console_stdout(lines: Option<Vec<u8>>) -> io::Result<()> {
    let Some(lines) = lines else { return Ok(()) };
    let mut out = io::stdout().lock();
    out.write_all(&lines)?;
    out.flush()
}

/// The guest console on stdout (`--console -`), a whole line at a time:
/// the report that follows starts a line of its own.
pub struct ConsoleOnStdout;

impl Write for ConsoleOnStdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let lines = held_out().lines(buf);
        console_stdout(lines)?;
        Ok(buf.len())
    }

    /// As for stderr: the unfinished line stays held.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Writes out `lines` under a status line.
fn console_out(lines: Option<Vec<u8>>) -> io::Result<()> {
    let Some(lines) = lines else { return Ok(()) };
    clear();
    io::stderr().lock().write_all(&lines)
}

/// The guest console on stderr, under a status line, a whole line at a
/// time.
pub struct ConsoleOnStderr;

impl Write for ConsoleOnStderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let lines = held().lines(buf);
        console_out(lines)?;
        Ok(buf.len())
    }

    /// The unfinished line stays held: a flush comes after every byte.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// At the run's end: the console's unfinished line, on a line of its own.
pub fn end_console() {
    let rest = held().rest();
    let _ = console_out(rest);
    let rest = held_out().rest();
    let _ = console_stdout(rest);
}

/// While the guest boots: what vmtrace waits for.
pub fn waiting(elapsed: Duration) -> String {
    format!(
        "vmtrace: {:.0} s: booting; waiting for the guest's ftrace_init to attach",
        elapsed.as_secs_f64()
    )
}

/// While tracing: `p` after `elapsed`, with `left` of `--duration`.
pub fn tracing(p: &Progress, elapsed: Duration, left: Option<Duration>) -> String {
    let secs = elapsed.as_secs_f64().max(1e-3);
    let calls = p.calls + p.returns;
    let mut s = format!(
        "vmtrace: {secs:.1} s  {} events  {} stored  {} dropped  {}/s",
        thousands(calls),
        thousands(p.stored()),
        thousands(p.dropped),
        thousands((calls as f64 / secs) as u64)
    );
    if p.lost > 0 {
        s.push_str(&format!("  ({} lost: disk behind)", thousands(p.lost)));
    }
    if let Some(left) = left {
        s.push_str(&format!("  {:.0} s left", left.as_secs_f64().ceil()));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A console line goes out whole, however the guest's bytes come: never
    /// cut by vmtrace's lines.
    #[test]
    fn console_lines_go_out_whole() {
        let mut h = Held::default();
        assert_eq!(h.lines(b"[    1.0] he"), None);
        assert_eq!(h.lines(b"l"), None);
        assert_eq!(
            h.lines(b"lo\n[    2.0] two\n[    3"),
            Some(b"[    1.0] hello\n[    2.0] two\n".to_vec())
        );
        assert_eq!(h.rest(), Some(b"[    3\n".to_vec()));
        assert_eq!(h.rest(), None);
        let long = vec![b'x'; HELD_MAX];
        assert_eq!(h.lines(&long[..HELD_MAX - 1]), None);
        assert_eq!(h.lines(b"y").map(|l| l.len()), Some(HELD_MAX + 1));
    }

    #[test]
    fn lines_have_separators_stored_dropped_and_time_left() {
        let p = Progress {
            calls: 1_234_567,
            returns: 0,
            dropped: 4_567,
            lost: 0,
        };
        assert_eq!(
            tracing(&p, Duration::from_secs(2), Some(Duration::from_millis(7_500))),
            "vmtrace: 2.0 s  1,234,567 events  1,230,000 stored  4,567 dropped  617,283/s  8 s left"
        );
        let p = Progress { lost: 10, ..p };
        assert!(tracing(&p, Duration::from_secs(1), None).ends_with("(10 lost: disk behind)"));
        assert_eq!(
            waiting(Duration::from_secs(12)),
            "vmtrace: 12 s: booting; waiting for the guest's ftrace_init to attach"
        );
    }
}
