//! Breakpoints through QEMU's gdbstub, and waiting for the stop they make:
//! what trap mode needs where no exitless page can be placed.
//!
//! QEMU's breakpoints (`Z0`) live in QEMU, not in guest memory: the guest's
//! text is untouched, and under TCG the translation of the address checks
//! for them. A vCPU continuing from a breakpoint's address hits it again,
//! so a handler moves rip past the instruction (or clears the breakpoint)
//! before resuming.

use std::time::Duration;

use super::gdb::{Gdb, GdbError};
use super::rsp::ThreadId;

/// A stop reply, parsed: `T05thread:p01.02;swbreak:;` or `S05`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StopReply {
    /// The signal: 5 (SIGTRAP) for a breakpoint, 2 for an interrupt.
    pub signal: u8,
    /// The vCPU that stopped, when the stub says.
    pub thread: Option<ThreadId>,
    /// The reply as sent.
    pub text: String,
}

impl StopReply {
    pub fn parse(text: &str) -> Option<StopReply> {
        let kind = text.chars().next()?;
        if kind != 'T' && kind != 'S' {
            return None;
        }
        let signal = u8::from_str_radix(text.get(1..3)?, 16).ok()?;
        let thread = text
            .get(3..)
            .unwrap_or("")
            .split(';')
            .find_map(|kv| kv.strip_prefix("thread:"))
            .and_then(ThreadId::parse);
        Some(StopReply {
            signal,
            thread,
            text: text.to_string(),
        })
    }
}

impl Gdb {
    /// A breakpoint at guest-virtual `addr` (`Z0`; x86 kind 1).
    pub fn set_breakpoint(&mut self, addr: u64) -> Result<(), GdbError> {
        self.expect_ok(&format!("Z0,{addr:x},1"))
    }

    /// Removes the breakpoint at `addr` (`z0`).
    pub fn clear_breakpoint(&mut self, addr: u64) -> Result<(), GdbError> {
        self.expect_ok(&format!("z0,{addr:x},1"))
    }

    /// Resumes every vCPU, the one of the last breakpoint stop at `pc`
    /// (`c ADDR`: QEMU sets the PC of the vCPU it last stopped for, the
    /// one the stop reply named, as no `Hc` is ever sent), in one packet
    /// with no reply.
    pub fn resume_at(&mut self, pc: u64) -> Result<(), GdbError> {
        self.send(format!("c{pc:x}").as_bytes(), "c")?;
        self.running = true;
        self.selected = None;
        Ok(())
    }

    /// Interrupt the VM (`^C`, then `qC` to know where the answer ends)
    /// and wait for the answer as long as `wait_on` says after each
    /// timeout: a stalled QEMU answers late, and a second interrupt would
    /// leave a second answer to be taken for the next command's.
    pub fn stop_waiting(&mut self, wait_on: &mut dyn FnMut() -> bool) -> Result<(), GdbError> {
        self.arm();
        // `+` first: QEMU 7.2 keeps the last packet it sent for an ack even
        // in no-ack mode, and drops the next byte other than `+` or `$`
        // (gdb_read_byte, last_packet): after a stop reply and someone's
        // QMP `cont`, a bare interrupt would be dropped, and the `$` of
        // `qC` stop the VM instead and the rest go unanswered. The `+`
        // clears that packet, or if none is held stops the VM itself;
        // stopped, QEMU ignores both bytes.
        self.write_raw(b"+\x03", "interrupt")?;
        self.running = false;
        self.send(b"qC", "qC")?;
        loop {
            // qC's answer itself (`QC...`), once the stop replies and any
            // late replies before it are passed.
            match self.qc_reply("interrupt") {
                // Every reply to what was sent before `qC` came before it.
                Ok(_) => {
                    self.owed = 0;
                    return Ok(());
                }
                Err(GdbError::Timeout { .. }) if wait_on() => self.arm(),
                Err(e) => {
                    // qC's answer, skipped by its shape when it comes.
                    if let GdbError::Timeout { .. } = e {
                        self.qc_owed += 1;
                    }
                    return Err(e);
                }
            }
        }
    }

    /// The VM runs again by someone else's hand (a QMP `cont` after a
    /// stop vmtrace left alone).
    pub fn runs_again(&mut self) {
        self.running = true;
        self.selected = None;
    }

    /// After `resume`, waits up to `timeout` for the VM to stop (a
    /// breakpoint, a QMP `stop`): its stop reply, or None when it still runs.
    pub fn wait_stop(&mut self, timeout: Duration) -> Result<Option<StopReply>, GdbError> {
        if !self.running {
            return Err(GdbError::Target {
                addr: self.addr().to_string(),
                what: "waiting for a stop while the VM is stopped".into(),
            });
        }
        // One deadline for the wait, however the peer drips its bytes.
        self.arm_for(timeout);
        let got = loop {
            match self.recv("a stop") {
                Ok(p) if Self::is_stop(&p) => break Ok(Some(p)),
                // A late reply, owed to a command that timed out before
                // the resume: dropped.
                Ok(p) => {
                    self.drop_late(&p);
                    continue;
                }
                Err(GdbError::Timeout { .. }) => break Ok(None),
                // A signal (Ctrl-C) cut the wait short: the caller looks.
                Err(GdbError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::Interrupted =>
                {
                    break Ok(None)
                }
                Err(e) => break Err(e),
            }
        };
        let Some(p) = got? else { return Ok(None) };
        let text = String::from_utf8_lossy(&p).into_owned();
        self.running = false;
        self.last_stop = Some(text.clone());
        let reply = StopReply::parse(&text).unwrap_or(StopReply {
            signal: 0,
            thread: None,
            text,
        });
        // A breakpoint's stop selects the vCPU that hit it for `g` and `P`
        // (QEMU's gdb_set_stop_cpu, before every vCPU is paused and the
        // reply sent); any other stop leaves the selection unknown.
        self.selected = match reply.signal {
            5 => reply.thread,
            _ => None,
        };
        Ok(Some(reply))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_replies_parse() {
        let r = StopReply::parse("T05thread:p01.02;swbreak:;").unwrap();
        assert_eq!(r.signal, 5);
        assert_eq!(
            r.thread,
            Some(ThreadId {
                pid: Some(1),
                tid: 2
            })
        );
        let r = StopReply::parse("S02").unwrap();
        assert_eq!((r.signal, r.thread), (2, None));
        assert_eq!(StopReply::parse("OK"), None);
    }
}
