//! The options section of a version-6 `trace.dat`: `u16` id, `u32` size,
//! then size bytes, until the id 0 (trace-cmd's `trace-cmd.dat.v6.5.txt`;
//! ids: `enum tracecmd_option_id` in trace-cmd-private.h).
//!
//! trace-cmd has no option for the command line that recorded a trace:
//! its `UNAME` holds the recording host's uname(2) (`sysname nodename
//! release machine`), and its `VERSION` the version of the program that
//! wrote the file (trace-record.c, add_version: trace-cmd's own, with its
//! git id in parentheses). So `VERSION` says vmtrace's version and, in
//! the parentheses, the command line that recorded the trace when it is
//! known: `trace-cmd report --version` and `trace-cmd dump --options`
//! print it as it is (trace-input.c keeps it as a string, nothing parses
//! it). A trace without a command line has no `VERSION` option, as
//! before.

use super::TRACE_CLOCK;
use crate::trace::cmdline::shell_line;
use crate::trace::model::Trace;

const OPTION_DONE: u16 = 0;
const OPTION_TRACECLOCK: u16 = 4;
const OPTION_VERSION: u16 = 9;

/// The options, their end marker included.
pub(super) fn put_options(h: &mut Vec<u8>, trace: &Trace) {
    // The trace_clock file's text, the current clock in brackets.
    put_string(h, OPTION_TRACECLOCK, TRACE_CLOCK);
    if let Some(v) = version(trace) {
        put_string(h, OPTION_VERSION, &v);
    }
    h.extend_from_slice(&OPTION_DONE.to_le_bytes());
}

/// The `VERSION` option's text: `vmtrace 0.1.0 (cmdline: vmtrace record
/// ...)`; None when the trace does not know its command line.
fn version(trace: &Trace) -> Option<String> {
    let m = &trace.meta;
    (!m.cmdline.is_empty()).then(|| {
        format!(
            "vmtrace {} (cmdline: {})",
            env!("CARGO_PKG_VERSION"),
            shell_line(&m.cmdline)
        )
    })
}

/// A string option, NUL-terminated as trace-cmd record writes them.
fn put_string(h: &mut Vec<u8>, id: u16, text: &str) {
    h.extend_from_slice(&id.to_le_bytes());
    // The line is bounded (`cmdline::bounded` in a data file), far
    // below 4 GiB.
    h.extend_from_slice(&(text.len() as u32 + 1).to_le_bytes());
    h.extend_from_slice(text.as_bytes());
    h.push(0);
}
