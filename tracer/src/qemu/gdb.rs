//! A GDB remote serial protocol client for QEMU's gdbstub, all-stop: one
//! stop halts every vCPU, `c` resumes them all.
//!
//! QEMU stops the VM when a client connects, and sends a stop reply for any
//! stop (a QMP `stop` too) while one is connected; stop replies that arrive
//! when another reply is awaited are noted and skipped. A client that goes
//! without detaching leaves the VM stopped (QEMU 7.2 does not resume it when
//! the connection closes): dropping a client that holds the VM stopped
//! detaches it.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use super::regs::RegMap;
pub use super::regs::X86Regs;
use super::rsp;
pub use super::rsp::{GdbAddr, ThreadId};

/// A gdbstub error, each naming the stub's address.
#[derive(Debug, thiserror::Error)]
pub enum GdbError {
    #[error("gdbstub {addr}: cannot connect: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error(
        "gdbstub {addr}: no reply within {secs:.1} s: another debugger holds the stub (QEMU \
         serves one at a time), or the peer is not a gdbstub"
    )]
    Busy { addr: String, secs: f64 },
    #[error("gdbstub {addr}: the stub closed the connection")]
    Closed { addr: String },
    #[error("gdbstub {addr}: no reply to {cmd} within {secs:.1} s")]
    Timeout {
        addr: String,
        cmd: String,
        secs: f64,
    },
    #[error("gdbstub {addr}: {source}")]
    Io {
        addr: String,
        source: std::io::Error,
    },
    #[error("gdbstub {addr}: bad checksum on a packet (no-ack mode: cannot ask again)")]
    Checksum { addr: String },
    #[error("gdbstub {addr}: {cmd} failed: {reply}")]
    Command {
        addr: String,
        cmd: String,
        reply: String,
    },
    #[error("gdbstub {addr}: {op} of {len} bytes at {addr_kind} {at:#x} failed: {reply}")]
    Memory {
        addr: String,
        op: &'static str,
        len: usize,
        addr_kind: &'static str,
        at: u64,
        reply: String,
    },
    #[error("gdbstub {addr}: unexpected reply to {cmd}: {reply:?}")]
    Reply {
        addr: String,
        cmd: String,
        reply: String,
    },
    #[error("gdbstub {addr}: {cmd} sent while the VM runs: stop it first")]
    Running { addr: String, cmd: String },
    #[error("gdbstub {addr}: {what}")]
    Target { addr: String, what: String },
    #[error(
        "gdbstub {addr}: a packet longer than {limit} bytes came in reply to {cmd} (QEMU's are \
         far shorter): the peer is not QEMU's gdbstub, or it misbehaves"
    )]
    TooLong {
        addr: String,
        cmd: String,
        limit: usize,
    },
    #[error(
        "gdbstub {addr}: more than {limit} {what} came in reply to {cmd}: the peer is not \
         QEMU's gdbstub, or it misbehaves"
    )]
    Flood {
        addr: String,
        cmd: String,
        limit: usize,
        what: &'static str,
    },
}

pub(super) trait ReadWrite: Read + Write + Send {}
/// Sets a stream's read timeout (None: wait forever).
pub(super) type SetTimeout = Box<dyn Fn(Option<Duration>) -> std::io::Result<()> + Send>;
impl<T: Read + Write + Send> ReadWrite for T {}

/// What `qSupported` said.
#[derive(Clone, Debug, Default)]
pub(super) struct Features {
    pub(super) packet_size: usize,
    multiprocess: bool,
    pub(super) xfer_features: bool,
    no_ack: bool,
}

/// A connected gdbstub client.
pub struct Gdb {
    pub(super) addr: String,
    stream: Box<dyn ReadWrite>,
    /// Sets the stream's read timeout (a second handle on it).
    set_timeout: SetTimeout,
    buf: Vec<u8>,
    /// Packets that came while an ack was awaited.
    pending: std::collections::VecDeque<Vec<u8>>,
    ack_mode: bool,
    pub(super) timeout: Duration,
    pub(super) features: Features,
    /// `X` works (None until tried).
    pub(super) binary_write: Option<bool>,
    pub(super) regmap: Option<RegMap>,
    /// The last stop reply seen.
    pub(super) last_stop: Option<String>,
    /// Whether memory addresses are guest-physical.
    pub(super) phys: bool,
    /// Resumed by this client (QEMU takes no packet while the VM runs).
    pub(super) running: bool,
    /// When the exchange under way gives up waiting (`arm`): one deadline
    /// for all its reads, however the peer drips its bytes.
    deadline: Option<Instant>,
    /// An operation of several exchanges (`within`) ends by then.
    hold: Option<Instant>,
    /// `D` was answered: QEMU resumed the VM and holds nothing for us.
    detached: bool,
    /// The process `D` names in multiprocess mode (from the thread list).
    pub(super) process: u64,
    /// The thread `g` and `P` act on when known (`Hg`, a breakpoint's stop).
    pub(super) selected: Option<ThreadId>,
    /// Replies still owed to commands whose wait timed out: the stub
    /// answers every packet it takes, in order, however late (a stalled
    /// QEMU), so the next replies are theirs, not a later command's
    /// (`reply` skips them).
    pub(super) owed: usize,
    /// `qC` answers still owed to interrupts whose wait gave up: known by
    /// their shape (`QC...`), skipped wherever they come (`pairing`).
    pub(super) qc_owed: usize,
}

/// The largest `PacketSize` taken from `qSupported` (QEMU's is 4096, its
/// MAX_PACKET_LENGTH in gdbstub/gdbstub.c): reads and writes are sized by it.
const MAX_PACKET_SIZE: usize = 0x4000;
/// The longest packet taken: well above any reply to what vmtrace asks
/// (`m` of half a packet size in hex, `g` of x86_64, a target description
/// chunk), so that a packet without `#` ends in an error.
pub const MAX_PACKET: usize = 4 * MAX_PACKET_SIZE;
/// Packets skipped while one reply is awaited: stop replies (one per stop)
/// and `O` console output (QEMU's `qRcmd` sends some).
pub(super) const MAX_SKIPPED: usize = 64;
/// Packets that may come while an ack is awaited (a stop reply at most).
const MAX_PENDING: usize = 16;
/// How long a client being dropped waits for its `D`'s reply: QEMU answers
/// at once; a hostile peer must not hold the drop.
const DROP_WAIT: Duration = Duration::from_secs(1);

pub(super) fn bytes_text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Bytes of a packet besides its data: `$`, `#cs` and a command's head.
pub(super) const PACKET_OVERHEAD: usize = 32;

impl Gdb {
    /// Connects to the stub at `addr` and negotiates features; `timeout`
    /// bounds each reply. QEMU stops the VM on connect.
    pub fn connect(addr: &GdbAddr, timeout: Duration) -> Result<Gdb, GdbError> {
        let name = addr.to_string();
        let err = |source| GdbError::Connect {
            addr: name.clone(),
            source,
        };
        let (stream, set_timeout): (Box<dyn ReadWrite>, SetTimeout) = match addr {
            GdbAddr::Unix(p) => {
                let s = UnixStream::connect(p).map_err(err)?;
                let ctl = s.try_clone().map_err(err)?;
                (Box::new(s), Box::new(move |t| ctl.set_read_timeout(t)))
            }
            GdbAddr::Tcp(a) => {
                let s = TcpStream::connect(a).map_err(err)?;
                s.set_nodelay(true).map_err(err)?;
                let ctl = s.try_clone().map_err(err)?;
                (Box::new(s), Box::new(move |t| ctl.set_read_timeout(t)))
            }
        };
        set_timeout(Some(timeout)).map_err(err)?;
        let mut gdb = Gdb::over(name, stream, set_timeout, timeout);
        match gdb.negotiate() {
            Ok(()) => Ok(gdb),
            // QEMU's stub serves one client: a second gets no reply.
            Err(GdbError::Timeout { addr, secs, .. }) => Err(GdbError::Busy { addr, secs }),
            Err(e) => Err(e),
        }
    }

    /// A client on `stream`, features not yet negotiated.
    fn over(
        addr: String,
        stream: Box<dyn ReadWrite>,
        set_timeout: SetTimeout,
        timeout: Duration,
    ) -> Gdb {
        Gdb {
            addr,
            stream,
            set_timeout,
            buf: Vec::new(),
            pending: Default::default(),
            ack_mode: true,
            timeout,
            features: Features::default(),
            binary_write: None,
            regmap: None,
            last_stop: None,
            phys: false,
            running: false,
            selected: None,
            owed: 0,
            qc_owed: 0,
            deadline: None,
            hold: None,
            detached: false,
            process: 1,
        }
    }

    /// A client on one end of a socket pair whose other end plays the
    /// stub, past the negotiation: no-ack mode, as with QEMU.
    #[cfg(test)]
    pub(super) fn on_socket(s: UnixStream, timeout: Duration) -> Gdb {
        let ctl = s.try_clone().unwrap();
        let mut gdb = Gdb::over(
            "fake".into(),
            Box::new(s),
            Box::new(move |t| ctl.set_read_timeout(t)),
            timeout,
        );
        gdb.ack_mode = false;
        gdb.features.packet_size = 4096;
        gdb
    }

    fn negotiate(&mut self) -> Result<(), GdbError> {
        self.within(Self::features)
    }

    fn features(&mut self) -> Result<(), GdbError> {
        let r = self.command("qSupported:multiprocess+;xmlRegisters=i386")?;
        let mut f = Features {
            packet_size: 400,
            ..Features::default()
        };
        for item in r.split(';') {
            if let Some(n) = item.strip_prefix("PacketSize=") {
                f.packet_size = usize::from_str_radix(n, 16)
                    .unwrap_or(400)
                    .clamp(64, MAX_PACKET_SIZE);
            }
            match item {
                "multiprocess+" => f.multiprocess = true,
                "qXfer:features:read+" => f.xfer_features = true,
                "QStartNoAckMode+" => f.no_ack = true,
                _ => {}
            }
        }
        self.features = f;
        if self.features.no_ack && self.command("QStartNoAckMode")? == "OK" {
            self.ack_mode = false;
        }
        Ok(())
    }

    /// Starts an exchange: its reads end by `timeout` from now (or by the
    /// deadline of the operation it is part of, if sooner).
    pub(super) fn arm(&mut self) {
        self.arm_for(self.timeout);
    }

    /// `arm` for `wait` instead of the reply timeout.
    pub(super) fn arm_for(&mut self, wait: Duration) {
        let d = Instant::now() + wait;
        self.deadline = Some(self.hold.map_or(d, |h| h.min(d)));
    }

    /// Runs `op`, an operation of several exchanges, within one reply
    /// timeout in all (a nested one keeps the outer deadline).
    pub(super) fn within<T>(
        &mut self,
        op: impl FnOnce(&mut Self) -> Result<T, GdbError>,
    ) -> Result<T, GdbError> {
        let outer = self.hold;
        let d = Instant::now() + self.timeout;
        self.hold = Some(outer.map_or(d, |h| h.min(d)));
        let r = op(self);
        self.hold = outer;
        r
    }

    /// Sets the stream's read timeout (None: wait forever).
    pub(super) fn read_timeout(&self, t: Option<Duration>) -> Result<(), GdbError> {
        (self.set_timeout)(t).map_err(|source| GdbError::Io {
            addr: self.addr.clone(),
            source,
        })
    }

    /// The stub's address, as given.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    fn io_error(&self, cmd: &str, e: std::io::Error) -> GdbError {
        match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => GdbError::Timeout {
                addr: self.addr.clone(),
                cmd: cmd.into(),
                secs: self.timeout.as_secs_f64(),
            },
            ErrorKind::BrokenPipe | ErrorKind::ConnectionReset | ErrorKind::UnexpectedEof => {
                GdbError::Closed {
                    addr: self.addr.clone(),
                }
            }
            _ => GdbError::Io {
                addr: self.addr.clone(),
                source: e,
            },
        }
    }

    /// Sends one packet; in ack mode, waits for its `+` (and resends on `-`).
    pub(super) fn send(&mut self, data: &[u8], cmd: &str) -> Result<(), GdbError> {
        self.arm();
        let framed = rsp::frame(data);
        'resend: for _ in 0..5 {
            self.write_raw(&framed, cmd)?;
            if !self.ack_mode {
                return Ok(());
            }
            loop {
                match self.buf.first() {
                    Some(b'+') => {
                        self.buf.remove(0);
                        return Ok(());
                    }
                    Some(b'-') => {
                        self.buf.remove(0);
                        continue 'resend;
                    }
                    // A packet sent before this one's ack (a stop on connect).
                    Some(b'$') => match rsp::take_packet(&mut self.buf, &mut 0) {
                        Some(Ok(p)) => {
                            self.write_raw(b"+", cmd)?;
                            if self.pending.len() >= MAX_PENDING {
                                return Err(self.flood(cmd, MAX_PENDING, "packets before an ack"));
                            }
                            self.pending.push_back(p);
                        }
                        Some(Err(())) => self.write_raw(b"-", cmd)?,
                        None => self.fill(cmd)?,
                    },
                    Some(_) => {
                        self.buf.remove(0);
                    }
                    None => self.fill(cmd)?,
                }
            }
        }
        Err(GdbError::Checksum {
            addr: self.addr.clone(),
        })
    }

    /// Reads more bytes from the stub into the buffer, by the exchange's
    /// deadline. Called only when the buffer holds no whole packet: what it
    /// holds is the start of one, bounded by `MAX_PACKET`.
    fn fill(&mut self, cmd: &str) -> Result<(), GdbError> {
        if self.buf.len() > MAX_PACKET {
            return Err(GdbError::TooLong {
                addr: self.addr.clone(),
                cmd: cmd.into(),
                limit: MAX_PACKET,
            });
        }
        let left = match self.deadline {
            Some(d) => d.saturating_duration_since(Instant::now()),
            None => self.timeout,
        };
        // (A socket takes no zero timeout: the time is up.)
        if left.is_zero() {
            return Err(self.io_error(cmd, ErrorKind::TimedOut.into()));
        }
        self.read_timeout(Some(left))?;
        let mut chunk = [0u8; 16384];
        let n = match self.stream.read(&mut chunk) {
            // A signal (Ctrl-C) cuts short only a wait for a stop
            // (`wait_stop`, the VM running): a command's reply is still
            // read, lest it be taken for the next command's.
            Err(e) if e.kind() == ErrorKind::Interrupted && !self.running => return Ok(()),
            r => r.map_err(|e| self.io_error(cmd, e))?,
        };
        if n == 0 {
            return Err(GdbError::Closed {
                addr: self.addr.clone(),
            });
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }

    /// Receives one packet (acking it in ack mode).
    pub(super) fn recv(&mut self, cmd: &str) -> Result<Vec<u8>, GdbError> {
        if let Some(p) = self.pending.pop_front() {
            return Ok(p);
        }
        loop {
            match rsp::take_packet(&mut self.buf, &mut 0) {
                Some(Ok(p)) => {
                    if self.ack_mode {
                        self.write_raw(b"+", cmd)?;
                    }
                    return Ok(p);
                }
                Some(Err(())) if self.ack_mode => self.write_raw(b"-", cmd)?,
                Some(Err(())) => {
                    return Err(GdbError::Checksum {
                        addr: self.addr.clone(),
                    })
                }
                None => self.fill(cmd)?,
            }
        }
    }

    pub(super) fn write_raw(&mut self, b: &[u8], cmd: &str) -> Result<(), GdbError> {
        self.stream.write_all(b).map_err(|e| self.io_error(cmd, e))
    }

    /// Whether a packet is a stop reply (`S`, `T`, or a `W`/`X` exit).
    pub(super) fn is_stop(p: &[u8]) -> bool {
        matches!(p.first(), Some(b'T' | b'S' | b'W' | b'X'))
    }

    /// Whether a packet is console output (`O` and hex; not `OK`).
    pub(super) fn is_console(p: &[u8]) -> bool {
        p.len() > 1 && p[0] == b'O' && p[1..].iter().all(u8::is_ascii_hexdigit)
    }

    pub(super) fn flood(&self, cmd: &str, limit: usize, what: &'static str) -> GdbError {
        GdbError::Flood {
            addr: self.addr.clone(),
            cmd: cmd.into(),
            limit,
            what,
        }
    }

    /// Sends `cmd` and returns its reply; stop replies that arrive first
    /// are noted and skipped.
    pub fn command(&mut self, cmd: &str) -> Result<String, GdbError> {
        self.command_bytes(cmd.as_bytes(), cmd)
            .map(|r| String::from_utf8_lossy(&r).into_owned())
    }

    /// `command` with binary data; `name` names it in errors.
    pub(super) fn command_bytes(&mut self, data: &[u8], name: &str) -> Result<Vec<u8>, GdbError> {
        if self.running {
            return Err(GdbError::Running {
                addr: self.addr.clone(),
                cmd: name.into(),
            });
        }
        self.resync()?;
        self.send(data, name)?;
        // (`qC`'s answer is known by its shape, late or not: `pairing`.)
        if data == b"qC" {
            let r = self.qc_reply(name);
            if let Err(GdbError::Timeout { .. }) = r {
                self.qc_owed += 1;
            }
            return r;
        }
        let r = self.reply(name);
        self.owe_on_timeout(&r, 1);
        r
    }

    pub(super) fn expect_ok(&mut self, cmd: &str) -> Result<(), GdbError> {
        let r = self.command(cmd)?;
        if r == "OK" {
            return Ok(());
        }
        Err(self.failed(cmd, r))
    }

    pub(super) fn failed(&self, cmd: &str, reply: String) -> GdbError {
        let reply = if reply.is_empty() {
            "not supported by this stub".into()
        } else {
            reply
        };
        GdbError::Command {
            addr: self.addr.clone(),
            cmd: cmd.into(),
            reply,
        }
    }

    /// Stops every vCPU (0x03). A stub already stopped sends nothing for
    /// 0x03, so `qC` follows it: the stop reply, if any, comes before its
    /// answer. (Not `?`: QEMU's removes every breakpoint.) QEMU handles a
    /// packet only while stopped: a byte received while running only stops
    /// it, so every other command needs a stopped VM.
    pub fn stop(&mut self) -> Result<(), GdbError> {
        self.stop_waiting(&mut || false)
    }

    /// The last stop reply seen.
    pub fn last_stop(&self) -> Option<&str> {
        self.last_stop.as_deref()
    }

    /// Resumes every vCPU (`c`); its stop reply comes only at the next stop.
    pub fn resume(&mut self) -> Result<(), GdbError> {
        self.send(b"c", "c")?;
        self.running = true;
        self.selected = None;
        Ok(())
    }

    /// Detaches (`D`), stopping first if this client resumed the VM; QEMU
    /// resumes the VM.
    pub fn detach(&mut self) -> Result<(), GdbError> {
        if self.running {
            self.stop()?;
        }
        if self.features.multiprocess {
            // QEMU's multiprocess mode wants the process: the one of a thread.
            self.process = self.threads()?.first().and_then(|t| t.pid).unwrap_or(1);
        }
        self.send_detach()
    }

    fn send_detach(&mut self) -> Result<(), GdbError> {
        // Before the features are known (a drop after a failed connect),
        // QEMU took the multiprocess mode vmtrace's qSupported asks for.
        let unknown = self.features.packet_size == 0;
        let cmd = match self.features.multiprocess || unknown {
            true => format!("D;{:x}", self.process),
            false => "D".into(),
        };
        self.expect_ok(&cmd)?;
        self.detached = true;
        Ok(())
    }

    /// Let go of a VM someone else stopped without resuming it: no `D`
    /// (QEMU's resumes the VM) now or when the client is dropped; closing
    /// the connection leaves QEMU's run state as it is.
    pub fn leave_stopped(&mut self) {
        self.detached = true;
    }

    /// Whether this client holds the VM stopped: connected (QEMU stopped
    /// it then) and neither resumed nor detached since.
    pub fn holds_stopped(&self) -> bool {
        !self.running && !self.detached
    }

    pub(super) fn reply_error(&self, cmd: &str, reply: &str) -> GdbError {
        GdbError::Reply {
            addr: self.addr.clone(),
            cmd: cmd.into(),
            reply: reply.chars().take(60).collect(),
        }
    }

    pub(super) fn target_error(&self, what: String) -> GdbError {
        GdbError::Target {
            addr: self.addr.clone(),
            what,
        }
    }
}

impl Drop for Gdb {
    /// A client that holds the VM stopped detaches, so that QEMU resumes
    /// it: an error between the connect (which stopped the VM) and the
    /// end must not leave the guest paused. Never while the VM runs: any
    /// byte QEMU's stub receives then stops it.
    fn drop(&mut self) {
        if self.holds_stopped() {
            self.timeout = DROP_WAIT;
            self.hold = None;
            let _ = self.send_detach();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_paths_or_host_ports() {
        let p = |s: &str| s.parse::<GdbAddr>().unwrap();
        assert_eq!(p("localhost:1234"), GdbAddr::Tcp("localhost:1234".into()));
        assert_eq!(p("[::1]:1234"), GdbAddr::Tcp("[::1]:1234".into()));
        assert_eq!(p("/run/gdb.sock"), GdbAddr::Unix("/run/gdb.sock".into()));
        assert_eq!(p("gdb.sock"), GdbAddr::Unix("gdb.sock".into()));
        assert_eq!(p("./a:1"), GdbAddr::Unix("./a:1".into()));
    }

    #[test]
    fn thread_ids_parse_and_print() {
        let t = ThreadId::parse("p1.a").unwrap();
        assert_eq!((t.pid, t.tid, t.vcpu()), (Some(1), 10, Some(9)));
        assert_eq!(t.to_string(), "p1.a");
        assert_eq!(ThreadId::parse("2").unwrap().to_string(), "2");
        assert_eq!(ThreadId::parse("p1"), None);
    }

    #[test]
    fn a_client_moves_between_threads() {
        fn check<T: Send>() {}
        check::<Gdb>();
    }
}
