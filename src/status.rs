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

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
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

/// The guest console on stderr, under a status line.
pub struct ConsoleOnStderr;

impl Write for ConsoleOnStderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        clear();
        io::stderr().write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
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
