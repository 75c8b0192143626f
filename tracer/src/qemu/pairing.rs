//! Which reply answers which command. QEMU's gdbstub answers every packet
//! it takes, in order, however late (a stalled QEMU); stop replies come
//! whenever the VM stops; so the client pairs replies by count, and by
//! shape where a reply has one:
//!
//! - stop replies (`T`, `S`, `W`, `X`) and `O` console output answer no
//!   command: noted or skipped wherever they come;
//! - a reply still owed to a command whose wait timed out (`owed`) is
//!   skipped by the next wait, before any later command's;
//! - `qC`'s answer starts with `QC`, and no other command vmtrace sends
//!   is answered so (memory and registers are lowercase hex; the rest
//!   `OK`, `E..`, `m`/`l` lists or features): an interrupt's wait reads
//!   up to that answer itself, and a `QC` anywhere else is an earlier
//!   interrupt's, late (`qc_owed`), never another command's reply.

use super::gdb::{Gdb, GdbError, MAX_SKIPPED};

impl Gdb {
    /// After a wait for `n` replies ended in `r`: a timeout leaves them
    /// owed (they come later, before any other's).
    pub(super) fn owe_on_timeout<T>(&mut self, r: &Result<T, GdbError>, n: usize) {
        if let Err(GdbError::Timeout { .. }) = r {
            self.owed += n;
        }
    }

    /// Before a command, after one timed out: an interrupt and `qC`
    /// (`stop_waiting`), every reply up to `qC`'s answer dropped. The
    /// count owed may be wrong: a command sent while someone's QMP `cont`
    /// ran the VM is never answered (its `$` only stopped the VM:
    /// gdb_read_byte), while `qC`'s answer comes after every reply to what
    /// was sent before it, however many. The interrupt leaves a stopped VM
    /// as it is.
    pub(super) fn resync(&mut self) -> Result<(), GdbError> {
        match self.owed {
            0 => Ok(()),
            _ => self.stop_waiting(&mut || false),
        }
    }

    /// Whether a packet is `qC`'s answer (`QC` and a thread id).
    pub(super) fn is_qc(p: &[u8]) -> bool {
        p.starts_with(b"QC")
    }

    /// The next reply that is not a stop reply or console output
    /// (`MAX_SKIPPED` of those at most), nor one still owed to a command
    /// that timed out (`owed`), nor a late `qC` answer.
    pub(super) fn reply(&mut self, name: &str) -> Result<Vec<u8>, GdbError> {
        self.next_reply(name, false)
    }

    /// `qC`'s answer: the first `QC` packet past those still owed to
    /// earlier interrupts; any other reply before it is a late one and is
    /// skipped.
    pub(super) fn qc_reply(&mut self, name: &str) -> Result<Vec<u8>, GdbError> {
        self.next_reply(name, true)
    }

    fn next_reply(&mut self, name: &str, qc: bool) -> Result<Vec<u8>, GdbError> {
        for _ in 0..=MAX_SKIPPED + self.owed + self.qc_owed {
            let p = self.recv(name)?;
            if Self::is_stop(&p) {
                self.last_stop = Some(String::from_utf8_lossy(&p).into_owned());
                self.selected = None;
                continue;
            }
            if Self::is_console(&p) {
                continue;
            }
            if Self::is_qc(&p) {
                if qc && self.qc_owed == 0 {
                    return Ok(p);
                }
                self.qc_owed = self.qc_owed.saturating_sub(1);
                continue;
            }
            // (Before qC's answer, any other reply is a late one.)
            if qc || self.owed > 0 {
                self.owed = self.owed.saturating_sub(1);
                continue;
            }
            return Ok(p);
        }
        Err(self.flood(name, MAX_SKIPPED, "stop replies or console packets"))
    }

    /// A packet other than a stop reply that came while the VM ran: a
    /// late answer to a command that timed out before the resume, dropped
    /// and no longer owed.
    pub(super) fn drop_late(&mut self, p: &[u8]) {
        match Self::is_qc(p) {
            true => self.qc_owed = self.qc_owed.saturating_sub(1),
            false => self.owed = self.owed.saturating_sub(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qemu::rsp;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    use std::sync::mpsc;
    use std::thread;
    use std::time::Duration;

    /// A fake QEMU 7.2 gdbstub on a socket, in no-ack mode as vmtrace
    /// runs it: it answers each packet with what `answer` says, after
    /// `delay` (a stalled QEMU), and models `gdb_read_byte`: while the VM
    /// runs any byte only stops it (a stop reply `T02`), and a byte other
    /// than `$` or `+` after a packet it sent is dropped. Its log of
    /// commands taken goes back on `log`.
    struct Stub {
        running: bool,
        /// QEMU's `last_packet` is not empty.
        holds_packet: bool,
        delay: Duration,
    }

    impl Stub {
        fn put(&mut self, s: &mut UnixStream, data: &str) {
            s.write_all(&rsp::frame(data.as_bytes())).unwrap();
            self.holds_packet = true;
        }

        fn serve(mut self, mut s: UnixStream, log: mpsc::Sender<String>) {
            let mut line: Option<Vec<u8>> = None;
            let mut byte = [0u8];
            while s.read(&mut byte).unwrap_or(0) == 1 {
                let ch = byte[0];
                if let Some(l) = &mut line {
                    l.push(ch);
                    // `#` and two checksum digits end a packet.
                    let n = l.len();
                    if n >= 3 && l[n - 3] == b'#' {
                        let cmd = String::from_utf8_lossy(&l[..n - 3]).into_owned();
                        line = None;
                        thread::sleep(self.delay);
                        // (The test is over when no one reads the log.)
                        if log.send(cmd.clone()).is_err() {
                            return;
                        }
                        self.answer(&mut s, &cmd);
                    }
                    continue;
                }
                if self.holds_packet {
                    if ch == b'+' || ch == b'$' {
                        self.holds_packet = false;
                    }
                    if ch != b'$' {
                        continue;
                    }
                }
                if self.running {
                    self.running = false;
                    self.put(&mut s, "T02thread:p01.01;");
                } else if ch == b'$' {
                    line = Some(Vec::new());
                }
            }
        }

        fn answer(&mut self, s: &mut UnixStream, cmd: &str) {
            match cmd {
                "qC" => self.put(s, "QCp01.01"),
                "c" => self.running = true,
                c if c.starts_with('H') => self.put(s, "OK"),
                c if c.starts_with('m') => self.put(s, "0102"),
                _ => self.put(s, ""),
            }
        }
    }

    /// A client on a fake stub (running as `running`, with a packet held
    /// as `holds_packet`) whose replies come `delay` late; the client
    /// waits `wait` for each.
    fn fake(
        running: bool,
        holds_packet: bool,
        delay: Duration,
        wait: Duration,
    ) -> (Gdb, mpsc::Receiver<String>) {
        let (a, b) = UnixStream::pair().unwrap();
        let (tx, rx) = mpsc::channel();
        let stub = Stub {
            running,
            holds_packet,
            delay,
        };
        thread::spawn(move || stub.serve(b, tx));
        let mut gdb = Gdb::on_socket(a, wait);
        gdb.running = running;
        (gdb, rx)
    }

    #[test]
    fn a_late_qc_answer_is_never_taken_for_the_next_commands_reply() {
        // The interrupt's wait gives up before the stalled stub answers.
        let (mut gdb, _log) = fake(
            true,
            false,
            Duration::from_millis(400),
            Duration::from_millis(150),
        );
        let e = gdb.stop().unwrap_err();
        assert!(matches!(e, GdbError::Timeout { .. }), "{e}");
        // Then `Hg`: its reply is `OK`, not the `QC` still to come.
        gdb.timeout = Duration::from_secs(5);
        gdb.expect_ok("Hgp1.1").unwrap();
        assert_eq!(gdb.command("m1000,2").unwrap(), "0102");
        assert_eq!((gdb.owed, gdb.qc_owed), (0, 0));
    }

    #[test]
    fn an_interrupt_waits_for_the_qc_answer_itself_past_late_replies() {
        let (mut gdb, _log) = fake(
            false,
            true,
            Duration::from_millis(400),
            Duration::from_millis(150),
        );
        // `m` times out: its reply is owed; then a stop (the client was
        // told the VM runs again) reads past that reply to `QC`.
        assert!(gdb.command("m1000,2").is_err());
        gdb.owed = 0; // (Even were that reply not counted as owed.)
        gdb.running = true;
        gdb.timeout = Duration::from_secs(5);
        gdb.stop().unwrap();
        assert_eq!(gdb.command("m1000,2").unwrap(), "0102");
    }

    #[test]
    fn an_interrupt_stops_a_vm_resumed_behind_the_stubs_back() {
        // The stub sent a stop reply, then the VM ran again by QMP `cont`
        // (no packet from the client since): QEMU still holds its last
        // packet, and would drop a bare interrupt.
        let (mut gdb, log) = fake(true, true, Duration::ZERO, Duration::from_secs(5));
        gdb.stop().unwrap();
        assert_eq!(log.try_iter().collect::<Vec<_>>(), ["qC"]);
        assert_eq!(gdb.last_stop(), Some("T02thread:p01.01;"));
        gdb.expect_ok("Hgp1.1").unwrap();
    }

    #[test]
    fn a_command_the_stub_never_answered_is_not_owed_a_reply() {
        // Someone's QMP `cont` ran the VM inside vmtrace's stop: the `$`
        // of `m` stops it again (a stop reply) and the rest is dropped.
        let (mut gdb, log) = fake(true, true, Duration::ZERO, Duration::from_millis(300));
        gdb.running = false;
        let e = gdb.command("m1000,2").unwrap_err();
        assert!(matches!(e, GdbError::Timeout { .. }), "{e}");
        // The next command resyncs (`qC`) and gets its own reply.
        gdb.timeout = Duration::from_secs(5);
        assert_eq!(gdb.command("m1000,2").unwrap(), "0102");
        assert_eq!(log.try_iter().collect::<Vec<_>>(), ["qC", "m1000,2"]);
        assert_eq!(gdb.owed, 0);
    }

    /// Does nothing: the signal only interrupts a read, as vmtrace's
    /// SIGINT handler does (installed without SA_RESTART; a socket with a
    /// read timeout is never restarted anyway: signal(7)).
    extern "C" fn on_signal(_: libc::c_int) {}

    #[test]
    fn a_signal_during_a_wait_leaves_the_reply_to_its_command() {
        // SAFETY: a zeroed sigaction is "no flags, empty mask"; the handler
        // does nothing, so it is safe in any thread at any time.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            assert_eq!(libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut()), 0);
        }
        // SAFETY: pthread_self has no preconditions.
        let me = unsafe { libc::pthread_self() };
        let (mut gdb, _log) = fake(
            false,
            true,
            Duration::from_millis(400),
            Duration::from_secs(5),
        );
        // The signal (the user's Ctrl-C) comes while `m` waits for its
        // stalled reply: that reply is still `m`'s, then `qC`'s and
        // `Hg`'s come to them.
        let kill = thread::spawn(move || {
            thread::sleep(Duration::from_millis(100));
            // SAFETY: `me` is the test's thread, alive until it joins this.
            unsafe { libc::pthread_kill(me, libc::SIGUSR2) };
        });
        let r = gdb.command("m1000,2");
        kill.join().unwrap();
        // Then, as the attach's ending does whatever `m` gave: a stop, and
        // each vCPU's registers (`Hg` first). Before: `Hgp1.1 failed:
        // QCp01.01`, the stop having taken `m`'s reply for `qC`'s.
        gdb.running = true;
        gdb.stop().unwrap();
        gdb.expect_ok("Hgp1.1").unwrap();
        assert_eq!(r.unwrap(), "0102");
    }
}
