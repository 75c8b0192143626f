//! Is the QEMU still there, and what state is its VM in? A QEMU is gone
//! only when its process is (a pidfd says so, which a recycled pid cannot
//! fool) or its monitor socket closed; a monitor that does not answer in
//! time is a stalled QEMU (its main loop busy: a storage stall, `savevm`, a
//! loaded host, a SIGSTOP), waited out. A stop vmtrace did not make (the
//! user's `stop`, an I/O error with `werror=stop`, a watchdog, a
//! migration) is not vmtrace's to undo.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A QEMU process watched through a pidfd (Linux 5.3).
#[derive(Debug)]
pub struct QemuProcess {
    pid: u32,
    /// None where pidfd_open is missing: `kill(pid, 0)` then.
    fd: Option<OwnedFd>,
}

impl QemuProcess {
    /// Watch process `pid` (QEMU's, from the QMP socket's peer).
    pub fn watch(pid: u32) -> QemuProcess {
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or
        // -1; no memory is passed.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        let fd = (fd >= 0).then(|| {
            // SAFETY: the syscall returned a fresh fd that nothing else owns.
            unsafe { OwnedFd::from_raw_fd(fd as i32) }
        });
        QemuProcess { pid, fd }
    }

    /// Has the process exited (or been killed)?
    pub fn is_gone(&self) -> bool {
        match &self.fd {
            Some(fd) => {
                let mut p = libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one pollfd on the stack, zero timeout.
                let n = unsafe { libc::poll(&mut p, 1, 0) };
                // A pidfd polls readable once its process has exited.
                n == 1 && p.revents & (libc::POLLIN | libc::POLLHUP) != 0
            }
            None => {
                // SAFETY: signal 0 only checks the pid exists.
                let rc = unsafe { libc::kill(self.pid as libc::pid_t, 0) };
                rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
            }
        }
    }
}

/// A VM's run state (`query-status`'s `status`). Who stopped a stopped VM
/// QEMU does not say (the gdbstub's interrupt stops it as `paused`, as a
/// user's `stop` does; a breakpoint as `debug`): vmtrace knows its own
/// stops, and any other is not its to undo.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunState {
    Running,
    /// Stopped, for the reason QEMU gives: `paused` (a QMP `stop`, or a
    /// debugger's interrupt), `debug` (a breakpoint), `io-error`,
    /// `watchdog`, `guest-panicked`, `suspended`, `finish-migrate`, ...
    Stopped(String),
}

impl RunState {
    pub fn parse(status: &str) -> RunState {
        match status {
            "running" => RunState::Running,
            other => RunState::Stopped(other.to_string()),
        }
    }
}

impl std::fmt::Display for RunState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunState::Running => write!(f, "running"),
            RunState::Stopped(s) if s == "paused" => write!(f, "paused (QMP stop)"),
            RunState::Stopped(s) => write!(f, "stopped by QEMU ({s})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_is_alive_until_it_exits() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let p = QemuProcess::watch(child.id());
        assert!(!p.is_gone());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(p.is_gone());
    }

    #[test]
    fn any_status_but_running_is_a_stop_with_its_reason() {
        assert_eq!(RunState::parse("running"), RunState::Running);
        assert_eq!(
            RunState::parse("io-error"),
            RunState::Stopped("io-error".into())
        );
        assert_eq!(RunState::parse("paused").to_string(), "paused (QMP stop)");
    }
}
