//! QEMU's QMP socket as a [`Transport`]: one connection per burst
//! (connect, greeting, `qmp_capabilities`, the commands, close), so that
//! QEMU's monitor, which serves one client at a time, is free between
//! bursts for Proxmox's `qm`, a user's `socat` or any other client. Each
//! connection checks that the same QEMU answers (the socket's peer
//! credentials and its process's start time): a QEMU restarted behind the
//! same path is another VM.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use super::monitor::{process_start, Monitor, QemuIdentity, Transport};
use super::qmp::{Qmp, QmpError, QmpEvents};

/// The monitor behind QEMU's QMP socket at `path`: it connects once to
/// learn which QEMU it is, then per burst; `timeout` bounds the greeting
/// (a socket another client holds is waited for that long) and every
/// reply.
pub fn connect(path: &Path, timeout: Duration) -> Result<Monitor, QmpError> {
    Ok(Monitor::new(Box::new(QmpSocket::open(path, timeout)?)))
}

/// A QMP socket reached per burst.
pub struct QmpSocket {
    path: PathBuf,
    /// Bounds the greeting (a socket another client holds: `QmpError::Busy`
    /// once it passes) and every reply.
    timeout: Duration,
    identity: QemuIdentity,
    /// The burst's connection, if one is open.
    conn: Option<Qmp>,
    /// Events of bursts since `take_events`.
    events: QmpEvents,
}

impl QmpSocket {
    /// Connects once to learn which QEMU serves `path` (that first burst
    /// stays open until the first `end_burst`).
    pub fn open(path: &Path, timeout: Duration) -> Result<QmpSocket, QmpError> {
        let qmp = Qmp::connect(path, timeout)?;
        let pid = qmp.pid()?;
        let identity = QemuIdentity {
            pid,
            uid: qmp.uid()?,
            started: process_start(pid).ok_or_else(|| QmpError::Io {
                path: path.to_owned(),
                source: std::io::Error::other(format!("QEMU's process {pid} has no /proc entry")),
            })?,
            version: qmp.version().clone(),
        };
        Ok(QmpSocket {
            path: path.to_owned(),
            timeout,
            identity,
            conn: Some(qmp),
            events: QmpEvents::default(),
        })
    }

    /// The burst's connection: a new one (waiting `wait` for a socket
    /// another client holds) checked to reach the same QEMU.
    fn conn(&mut self, wait: Duration) -> Result<&mut Qmp, QmpError> {
        if self.conn.is_none() {
            let qmp = Qmp::connect_waiting(&self.path, wait, self.timeout)?;
            let pid = qmp.pid()?;
            if !self.identity.same_process(pid) {
                return Err(QmpError::Replaced {
                    path: self.path.clone(),
                    was: self.identity.pid,
                    now: pid,
                });
            }
            self.conn = Some(qmp);
        }
        Ok(self.conn.as_mut().expect("connected above"))
    }
}

impl Transport for QmpSocket {
    fn execute(&mut self, cmd: &str, args: Option<Value>) -> Result<Value, QmpError> {
        let out = self.conn(self.timeout)?.execute(cmd, args);
        if let Err(QmpError::Closed { .. } | QmpError::Broken { .. }) = &out {
            // A connection out of step is not used again: the next
            // command opens another.
            self.end_burst();
        }
        out
    }

    fn end_burst(&mut self) {
        if let Some(mut qmp) = self.conn.take() {
            self.events.merge(qmp.take_events());
        }
    }

    fn open_within(&mut self, wait: Duration) -> Result<(), QmpError> {
        self.conn(wait).map(|_| ())
    }

    fn take_events(&mut self) -> QmpEvents {
        if let Some(qmp) = &mut self.conn {
            self.events.merge(qmp.take_events());
        }
        std::mem::take(&mut self.events)
    }

    fn identity(&self) -> &QemuIdentity {
        &self.identity
    }

    fn place(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qemu::queries::Queries;
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixListener;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A fake QEMU that greets its first `greeted` connections, one at a
    /// time as QEMU does, answering every command `running`; it counts
    /// them.
    fn fake(path: &Path, greeted: usize) -> Arc<AtomicUsize> {
        let _ = std::fs::remove_file(path);
        let l = UnixListener::bind(path).unwrap();
        let seen = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&seen);
        std::thread::spawn(move || {
            for s in l.incoming().take(greeted) {
                let s = s.unwrap();
                count.fetch_add(1, Ordering::SeqCst);
                let mut out = s.try_clone().unwrap();
                writeln!(out, r#"{{"QMP": {{"version": {{"qemu": {{"major": 7, "minor": 2, "micro": 0}}, "package": ""}}}}}}"#).unwrap();
                for line in BufReader::new(s).lines() {
                    let Ok(line) = line else { break };
                    let cmd: Value = serde_json::from_str(&line).unwrap();
                    let reply =
                        serde_json::json!({"return": {"status": "running"}, "id": cmd["id"]});
                    if writeln!(out, "{reply}").is_err() {
                        break;
                    }
                }
            }
            // Then it greets no one: the socket looks held.
            std::thread::sleep(Duration::from_secs(30));
            drop(l);
        });
        seen
    }

    #[test]
    fn each_burst_is_a_connection_of_its_own_and_a_held_socket_is_busy() {
        let dir = std::env::temp_dir().join(format!("vmtrace-burst-{}", std::process::id()));
        let _ = std::fs::create_dir(&dir);
        let path = dir.join("qmp.sock");
        let seen = fake(&path, 3);
        let mut m = connect(&path, Duration::from_secs(10)).unwrap();
        assert_eq!(m.pid(), std::process::id());
        // The first command still uses the connection that learned the
        // pid; each later one, or each burst, connects anew.
        assert_eq!(m.status().unwrap(), "running");
        assert_eq!(m.status().unwrap(), "running");
        let two = m.burst(|m| (m.status().unwrap(), m.status().unwrap()));
        assert_eq!(two.0, two.1);
        assert_eq!(seen.load(Ordering::SeqCst), 3);
        // The fourth is never greeted: Busy, after the wait.
        let e = m
            .burst_within(Duration::from_millis(200), |m| m.status())
            .unwrap_err();
        assert!(matches!(e, QmpError::Busy { .. }), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
