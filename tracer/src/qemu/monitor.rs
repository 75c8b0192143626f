//! The QEMU monitor a session holds: transport-agnostic. Every query
//! (`Queries`) is built on one `execute(cmd, args)`, which a [`Transport`]
//! carries to QEMU. vmtrace never holds QEMU's monitor for a whole trace:
//! QEMU serves one QMP client at a time, and other tools (Proxmox's `qm`,
//! a user's `socat`) need it too. A transport connects per burst: for one
//! command, or for the commands run inside [`Monitor::burst`], then lets go.
//!
//! # Adding a transport
//!
//! Implement [`Transport`] for a type that reaches QEMU's monitor some
//! other way (e.g. libvirt's `virDomainQemuMonitorCommand`, which sends
//! one QMP command through libvirtd's own monitor connection):
//! - `execute` runs one QMP command and returns its `return` member (an
//!   HMP command goes as QMP's `human-monitor-command`); a QMP error reply
//!   is `QmpError::Command`;
//! - `end_burst` lets go of whatever the burst held (nothing, for a
//!   transport without a connection of its own);
//! - `identity` is the QEMU found when the transport was made; `execute`
//!   refuses another QEMU answering later (`QmpError::Replaced`), so that a
//!   trace never drives a VM it did not attach to;
//! - `take_events` returns the QMP events seen since the last call (a
//!   transport that sees none returns none: the session does not need
//!   them, `super::reset` says why);
//! - `place` names it in errors;
//! - `open_within` (optional) opens the burst's connection with a short
//!   wait, for the trace loop's looks.
//!
//! Errors are `QmpError`s; a transport whose failures none of its
//! variants says adds one there (naming what it talks to).
//!
//! Then build `Monitor::new(Box::new(your_transport))` (as
//! `super::burst::connect` does for a QMP socket) and hand it to
//! `session::connect_monitor`.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use super::qmp::{QemuVersion, QmpError, QmpEvents};
use super::queries::Queries;

/// Which QEMU a monitor reaches. A QEMU restarted behind the same socket
/// is another VM: its process differs (another pid, or the same pid
/// started at another time).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QemuIdentity {
    pub pid: u32,
    /// The user QEMU runs as.
    pub uid: u32,
    /// When the process started (`/proc/PID/stat`'s starttime, in clock
    /// ticks since the host booted).
    pub started: u64,
    pub version: QemuVersion,
}

impl QemuIdentity {
    /// Is `pid` this QEMU's process (the same pid, started at the same time)?
    pub fn same_process(&self, pid: u32) -> bool {
        self.pid == pid && process_start(pid) == Some(self.started)
    }
}

/// When process `pid` started (`/proc/PID/stat`'s 22nd field), if it runs.
pub fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: the
    // fields that follow start after its last ')'; starttime is field 22.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(22 - 3)?.parse().ok()
}

/// How QMP commands reach one QEMU (see the module's doc to add one).
pub trait Transport: Send {
    /// Runs one QMP command, opening the burst's connection first if it
    /// has none; returns the reply's `return` member.
    fn execute(&mut self, cmd: &str, args: Option<Value>) -> Result<Value, QmpError>;
    /// The burst is over: let go of what it holds.
    fn end_burst(&mut self);
    /// Opens the burst's connection now, if it has none, waiting at most
    /// `wait` for a monitor another client holds (`QmpError::Busy`). A
    /// transport without a connection of its own has nothing to do.
    fn open_within(&mut self, wait: Duration) -> Result<(), QmpError> {
        let _ = wait;
        Ok(())
    }
    /// The QMP events seen since the last call.
    fn take_events(&mut self) -> QmpEvents;
    /// The QEMU found when the transport was made.
    fn identity(&self) -> &QemuIdentity;
    /// Where the monitor is, for errors (a QMP socket's path).
    fn place(&self) -> &Path;
}

/// A QEMU's monitor, reached per burst through a transport.
pub struct Monitor {
    transport: Box<dyn Transport>,
    /// Bursts open (`burst` nests): the connection is let go at zero.
    depth: u32,
}

impl Monitor {
    pub fn new(transport: Box<dyn Transport>) -> Monitor {
        Monitor {
            transport,
            depth: 0,
        }
    }

    /// Runs `f` as one burst: its commands share one connection, let go
    /// when `f` returns (the outermost burst's end).
    pub fn burst<T>(&mut self, f: impl FnOnce(&mut Monitor) -> T) -> T {
        self.depth += 1;
        let out = f(self);
        self.depth -= 1;
        if self.depth == 0 {
            self.transport.end_burst();
        }
        out
    }

    /// `burst`, its connection opened first, waiting at most `wait` for a
    /// monitor another client holds: a look that must not hold up the
    /// trace loop (`QmpError::Busy` then).
    pub fn burst_within<T>(
        &mut self,
        wait: Duration,
        f: impl FnOnce(&mut Monitor) -> Result<T, QmpError>,
    ) -> Result<T, QmpError> {
        self.burst(|m| {
            m.transport.open_within(wait)?;
            f(m)
        })
    }

    /// The QMP events seen since the last call (only those that came
    /// during a burst: between bursts nobody listens).
    pub fn take_events(&mut self) -> QmpEvents {
        self.transport.take_events()
    }

    /// QEMU's process id.
    pub fn pid(&self) -> u32 {
        self.transport.identity().pid
    }

    /// The user QEMU runs as.
    pub fn uid(&self) -> u32 {
        self.transport.identity().uid
    }

    /// QEMU's version.
    pub fn version(&self) -> &QemuVersion {
        &self.transport.identity().version
    }

    /// Where the monitor is.
    pub fn path(&self) -> &Path {
        self.transport.place()
    }
}

impl Queries for Monitor {
    /// One command: a burst of its own unless inside `burst`.
    fn execute(&mut self, cmd: &str, args: Option<Value>) -> Result<Value, QmpError> {
        let out = self.transport.execute(cmd, args);
        if self.depth == 0 {
            self.transport.end_burst();
        }
        out
    }

    fn place(&self) -> &Path {
        self.transport.place()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_start_is_read_past_a_command_name_with_spaces() {
        let me = std::process::id();
        let t = process_start(me).expect("this process runs");
        assert!(t > 0);
        assert_eq!(process_start(me), Some(t));
        let id = QemuIdentity {
            pid: me,
            uid: 0,
            started: t,
            version: QemuVersion {
                major: 0,
                minor: 0,
                micro: 0,
                package: String::new(),
            },
        };
        assert!(id.same_process(me));
        assert!(!QemuIdentity {
            started: t + 1,
            ..id.clone()
        }
        .same_process(me));
        assert!(!QemuIdentity {
            pid: u32::MAX,
            ..id
        }
        .same_process(u32::MAX));
    }
}
