//! A QMP client: QEMU's JSON monitor over its unix socket, with the HMP
//! commands QMP lacks (the flat memory map, `gpa2hva`, `gdbserver`) sent
//! through `human-monitor-command`.
//!
//! QEMU's monitor serves one client at a time: a second client's connection
//! is accepted by the kernel but QEMU sends it no greeting, so a greeting
//! that does not come within the timeout means "busy" (or a silent peer).

use std::io::{ErrorKind, Write};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::lines::{LineError, LineReader};
use super::unix_connect::connect_within;

pub use super::layout::RamRange;

/// A QMP error, each naming the socket.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    #[error("QMP socket {path}: no such file")]
    NoSocket { path: PathBuf },
    #[error("QMP socket {path}: not a unix socket")]
    NotSocket { path: PathBuf },
    #[error("QMP socket {path}: connection refused (no QEMU listens on it)")]
    Refused { path: PathBuf },
    #[error("QMP socket {path}: cannot connect: {source}")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("QMP socket {path}: the peer is not QEMU (no QMP greeting, got {got:?})")]
    NotQemu { path: PathBuf, got: String },
    #[error(
        "QMP socket {path}: no QMP greeting within {secs:.1} s: another client holds the QMP \
         socket (QEMU serves one at a time), or the peer is not QEMU"
    )]
    Busy { path: PathBuf, secs: f64 },
    #[error("QMP socket {path}: QEMU closed its QMP socket")]
    Closed { path: PathBuf },
    #[error("QMP socket {path}: no reply to {cmd} within {secs:.1} s")]
    Timeout {
        path: PathBuf,
        cmd: String,
        secs: f64,
    },
    #[error("QMP socket {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("QMP socket {path}: {cmd} failed: {class}: {desc}")]
    Command {
        path: PathBuf,
        cmd: String,
        class: String,
        desc: String,
    },
    #[error("QMP socket {path}: unexpected reply to {cmd}: {what}")]
    Reply {
        path: PathBuf,
        cmd: String,
        what: String,
    },
    #[error("QMP socket {path}: HMP command {cmd:?} failed: {msg}")]
    Hmp {
        path: PathBuf,
        cmd: String,
        msg: String,
    },
    #[error(
        "QMP socket {path}: the peer sent a line longer than {limit} bytes (QEMU's replies are \
         far shorter): it is not QEMU's QMP, or QEMU misbehaves"
    )]
    TooLong { path: PathBuf, limit: usize },
    #[error(
        "QMP socket {path}: {count} replies to other commands came instead of the reply to {cmd}: \
         the peer is not QEMU's QMP, or another client shares the connection"
    )]
    Stray {
        path: PathBuf,
        cmd: String,
        count: usize,
    },
    #[error(
        "QMP socket {path}: another QEMU answers it now (pid {now}; the traced QEMU is pid {was}, \
         or was until it exited): a QEMU restarted behind the same socket is another VM"
    )]
    Replaced { path: PathBuf, was: u32, now: u32 },
    #[error(
        "QMP socket {path}: the connection is out of step since an earlier error ({why}); \
         connect again"
    )]
    Broken { path: PathBuf, why: String },
    /// A libvirt domain's monitor (`super::libvirt_monitor`): libvirt's
    /// error, naming the domain.
    #[error(transparent)]
    Libvirt(Box<super::libvirt::LibvirtError>),
}

/// Events read past before a greeting (`Qmp::greeting`).
const MAX_EARLY_EVENTS: usize = 16;

/// QEMU's version, from the greeting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QemuVersion {
    pub major: u32,
    pub minor: u32,
    pub micro: u32,
    /// The distribution's package string, e.g. "Debian 1:7.2+dfsg-7".
    pub package: String,
}

impl std::fmt::Display for QemuVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.micro)?;
        if !self.package.is_empty() {
            write!(f, " ({})", self.package)?;
        }
        Ok(())
    }
}

/// The asynchronous events seen between replies that say the VM changed state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QmpEvents {
    pub stop: bool,
    pub resume: bool,
    /// `SHUTDOWN`, with its reason (`guest-shutdown`, `guest-reset`,
    /// `host-qmp-quit`, ...): a guest's reboot is a `guest-reset`
    /// shutdown and then a `RESET` (QEMU's -no-reboot off).
    pub shutdown: Option<String>,
    /// `RESET`: the machine was reset (a reboot, `system_reset`, a triple
    /// fault): the guest's memory is no longer the traced kernel's.
    pub reset: Option<String>,
    /// `SUSPEND`: the guest entered S3; its firmware runs at the wake-up.
    pub suspend: bool,
    /// `GUEST_PANICKED` (a pvpanic device).
    pub panicked: bool,
}

impl QmpEvents {
    /// Adds the events of `later` (a later burst's).
    pub fn merge(&mut self, later: QmpEvents) {
        self.stop |= later.stop;
        self.resume |= later.resume;
        self.shutdown = later.shutdown.or(self.shutdown.take());
        self.reset = later.reset.or(self.reset.take());
        self.suspend |= later.suspend;
        self.panicked |= later.panicked;
    }
}

/// The longest line taken from QMP: far above any real reply (`info mtree
/// -f` of a big VM is tens of KiB), so that a peer's endless line ends in
/// an error, not in all of vmtrace's memory.
pub const MAX_LINE: usize = 1 << 20;
/// Replies to other commands skipped while one command's reply is awaited
/// (late replies to commands that timed out: one each at most).
const MAX_STRAY: usize = 16;

/// A connected QMP client in command mode.
pub struct Qmp {
    path: PathBuf,
    reader: LineReader,
    writer: UnixStream,
    timeout: Duration,
    version: QemuVersion,
    events: QmpEvents,
    /// The `id` the next command carries: its reply echoes it (QMP's `id`
    /// member), so a late reply is never taken for another command's.
    next_id: u64,
    /// Why the stream is out of step (a line cut off), if it is.
    broken: Option<String>,
}

impl Qmp {
    /// Connects to QEMU's QMP socket at `path`, reads the greeting and enters
    /// command mode; `timeout` bounds the connect and the greeting (a
    /// socket another client holds: `Busy`) and every reply.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Qmp, QmpError> {
        Qmp::connect_waiting(path, timeout, timeout)
    }

    /// `connect`, waiting `wait` for a socket another client holds (its
    /// connect and greeting), `timeout` for every reply.
    pub fn connect_waiting(
        path: &Path,
        wait: Duration,
        timeout: Duration,
    ) -> Result<Qmp, QmpError> {
        let p = || path.to_path_buf();
        let stream = connect_within(path, wait).map_err(|e| match e.kind() {
            ErrorKind::NotFound => QmpError::NoSocket { path: p() },
            ErrorKind::ConnectionRefused => match std::fs::metadata(path) {
                Ok(m) if !m.file_type().is_socket() => QmpError::NotSocket { path: p() },
                _ => QmpError::Refused { path: p() },
            },
            // Its listen queue full: QEMU serves other clients.
            ErrorKind::WouldBlock => QmpError::Busy {
                path: p(),
                secs: wait.as_secs_f64(),
            },
            _ => QmpError::Connect {
                path: p(),
                source: e,
            },
        })?;
        let io = |source| QmpError::Io { path: p(), source };
        // A peer that reads nothing cannot hold a command's write either.
        stream.set_write_timeout(Some(timeout)).map_err(io)?;
        let writer = stream.try_clone().map_err(io)?;
        let mut qmp = Qmp {
            path: p(),
            reader: LineReader::new(stream, MAX_LINE),
            writer,
            timeout,
            version: QemuVersion {
                major: 0,
                minor: 0,
                micro: 0,
                package: String::new(),
            },
            events: QmpEvents::default(),
            next_id: 1,
            broken: None,
        };
        qmp.version = qmp.greeting(wait)?;
        qmp.execute("qmp_capabilities", None)?;
        Ok(qmp)
    }

    /// Reads the `{"QMP": {"version": ...}}` greeting.
    fn greeting(&mut self, wait: Duration) -> Result<QemuVersion, QmpError> {
        let deadline = Instant::now() + wait;
        let mut events = 0;
        let line = loop {
            let line = self.greeting_line(deadline, wait)?;
            // An event QEMU emitted as this client connected, before its
            // greeting: QEMU 7.2 sends events to a monitor left in command
            // mode by the client before, until the new connection's open
            // is handled (monitor/qmp.c). Seen after a trap-mode detach's
            // debug stops. A few are skipped; a peer that only sends
            // events is no QEMU.
            match serde_json::from_str::<Value>(&line) {
                Ok(v) if v.get("event").is_some() && events < MAX_EARLY_EVENTS => events += 1,
                _ => break line,
            }
        };
        let v: Value = serde_json::from_str(&line).map_err(|_| self.not_qemu(short(&line)))?;
        let version = v
            .pointer("/QMP/version")
            .ok_or_else(|| self.not_qemu(short(&line)))?;
        let num = |k: &str| {
            version
                .pointer(&format!("/qemu/{k}"))
                .and_then(Value::as_u64)
                .unwrap_or(0) as u32
        };
        Ok(QemuVersion {
            major: num("major"),
            minor: num("minor"),
            micro: num("micro"),
            package: version["package"].as_str().unwrap_or("").trim().to_string(),
        })
    }

    /// One line while waiting for the greeting.
    fn greeting_line(&mut self, deadline: Instant, wait: Duration) -> Result<String, QmpError> {
        match self.read_line(deadline, "the greeting") {
            Ok(l) => Ok(l),
            // Nothing at all: QEMU serves another client. Part of a line
            // is a peer that talks, slowly or endlessly: not busy.
            Err(QmpError::Timeout { .. }) if !self.reader.partial() => Err(QmpError::Busy {
                path: self.path.clone(),
                secs: wait.as_secs_f64(),
            }),
            Err(QmpError::Closed { .. }) => Err(self.not_qemu("nothing".into())),
            Err(e) => Err(e),
        }
    }

    fn not_qemu(&self, got: String) -> QmpError {
        QmpError::NotQemu {
            path: self.path.clone(),
            got,
        }
    }

    /// One line from QEMU, whole by `deadline` (`cmd` awaits it); EOF is
    /// QEMU gone. A line past `MAX_LINE` leaves the stream out of step.
    fn read_line(&mut self, deadline: Instant, cmd: &str) -> Result<String, QmpError> {
        let path = || self.path.clone();
        if let Some(why) = &self.broken {
            return Err(QmpError::Broken {
                path: path(),
                why: why.clone(),
            });
        }
        match self.reader.line(deadline) {
            Ok(l) => Ok(String::from_utf8_lossy(&l).into_owned()),
            Err(LineError::Timeout) => Err(QmpError::Timeout {
                path: path(),
                cmd: cmd.into(),
                secs: self.timeout.as_secs_f64(),
            }),
            Err(LineError::Closed) => Err(QmpError::Closed { path: path() }),
            Err(LineError::TooLong) => {
                self.broken = Some(format!("a line longer than {MAX_LINE} bytes"));
                Err(QmpError::TooLong {
                    path: path(),
                    limit: MAX_LINE,
                })
            }
            Err(LineError::Io(source)) => Err(QmpError::Io {
                path: path(),
                source,
            }),
        }
    }

    /// Runs a QMP command and returns its `return` value, waiting for it
    /// `timeout` in all. Its reply is the one that echoes the command's
    /// fresh `id`: a late reply to an earlier command that timed out is
    /// skipped (`MAX_STRAY` at most). Events that arrive before the reply
    /// are noted (`events`) and skipped.
    pub fn execute(&mut self, cmd: &str, args: Option<Value>) -> Result<Value, QmpError> {
        let id = self.next_id;
        self.next_id += 1;
        let mut msg = json!({ "execute": cmd, "id": id });
        if let Some(a) = args {
            msg["arguments"] = a;
        }
        let mut text = msg.to_string();
        text.push('\n');
        let path = self.path.clone();
        if let Some(why) = &self.broken {
            return Err(QmpError::Broken {
                path,
                why: why.clone(),
            });
        }
        self.writer
            .write_all(text.as_bytes())
            .map_err(|source| match source.kind() {
                ErrorKind::BrokenPipe | ErrorKind::ConnectionReset => QmpError::Closed { path },
                ErrorKind::WouldBlock | ErrorKind::TimedOut => QmpError::Timeout {
                    path,
                    cmd: cmd.into(),
                    secs: self.timeout.as_secs_f64(),
                },
                _ => QmpError::Io { path, source },
            })?;
        let deadline = Instant::now() + self.timeout;
        let mut stray = 0;
        loop {
            let line = self.read_line(deadline, cmd)?;
            let v: Value = serde_json::from_str(&line).map_err(|_| self.reply(cmd, &line))?;
            if let Some(ev) = v.get("event").and_then(Value::as_str) {
                self.note_event(ev, &v["data"]);
                continue;
            }
            if v.get("id") != Some(&json!(id)) {
                // A reply to another command (one that timed out), or one
                // without an id (QEMU echoes every id it is given).
                stray += 1;
                if stray > MAX_STRAY {
                    return Err(QmpError::Stray {
                        path: self.path.clone(),
                        cmd: cmd.into(),
                        count: stray,
                    });
                }
                continue;
            }
            if let Some(r) = v.get("return") {
                return Ok(r.clone());
            } else if let Some(e) = v.get("error") {
                return Err(QmpError::Command {
                    path: self.path.clone(),
                    cmd: cmd.into(),
                    class: e["class"].as_str().unwrap_or("?").into(),
                    desc: e["desc"].as_str().unwrap_or("?").into(),
                });
            } else {
                return Err(self.reply(cmd, &line));
            }
        }
    }

    fn note_event(&mut self, ev: &str, data: &Value) {
        let reason = || data["reason"].as_str().unwrap_or("unknown").to_string();
        match ev {
            "STOP" => self.events.stop = true,
            "RESUME" => self.events.resume = true,
            "SHUTDOWN" => self.events.shutdown = Some(reason()),
            "RESET" => self.events.reset = Some(reason()),
            "SUSPEND" | "SUSPEND_DISK" => self.events.suspend = true,
            "GUEST_PANICKED" => self.events.panicked = true,
            _ => {}
        }
    }

    fn reply(&self, cmd: &str, what: &str) -> QmpError {
        QmpError::Reply {
            path: self.path.clone(),
            cmd: cmd.into(),
            what: short(what),
        }
    }

    /// The events seen since the last call, then cleared.
    pub fn take_events(&mut self) -> QmpEvents {
        std::mem::take(&mut self.events)
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// QEMU's process id, from the socket's peer credentials.
    pub fn pid(&self) -> Result<u32, QmpError> {
        Ok(self.peer()?.pid as u32)
    }

    /// The user QEMU runs as, from the socket's peer credentials.
    pub fn uid(&self) -> Result<u32, QmpError> {
        Ok(self.peer()?.uid)
    }

    fn peer(&self) -> Result<libc::ucred, QmpError> {
        let mut cred = libc::ucred {
            pid: 0,
            uid: 0,
            gid: 0,
        };
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        // SAFETY: SO_PEERCRED fills a ucred of the length given; both point
        // at live locals and the fd is the open stream's.
        let rc = unsafe {
            libc::getsockopt(
                self.writer.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&mut cred as *mut libc::ucred).cast(),
                &mut len,
            )
        };
        if rc != 0 || cred.pid <= 0 {
            return Err(QmpError::Io {
                path: self.path.clone(),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(cred)
    }

    /// QEMU's version, as its greeting gave it.
    pub fn version(&self) -> &QemuVersion {
        &self.version
    }
}

/// A peer's text, shortened for a one-line error.
pub(super) fn short(s: &str) -> String {
    let s = s.trim();
    let mut out: String = s.chars().take(60).collect();
    if out.len() < s.len() {
        out.push_str("...");
    }
    out
}
