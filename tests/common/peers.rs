//! Fake QMP and gdbstub peers over unix sockets, each served by a thread
//! from a script: what a hostile or broken peer sends, generated as it
//! goes (never buffered whole), until the client hangs up.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// QEMU 7.2's greeting, as Debian's sends it.
pub const GREETING: &str = r#"{"QMP": {"version": {"qemu": {"micro": 0, "minor": 2, "major": 7}, "package": "Debian 1:7.2+dfsg-7"}, "capabilities": ["oob"]}}"#;

/// A peer listening at `path`, serving one connection with `serve`.
pub struct Peer {
    pub path: PathBuf,
    thread: Option<JoinHandle<()>>,
}

impl Peer {
    pub fn listen(path: &Path, serve: impl FnOnce(UnixStream) + Send + 'static) -> Peer {
        let _ = std::fs::remove_file(path);
        let l = UnixListener::bind(path).unwrap();
        let thread = thread::spawn(move || {
            if let Ok((s, _)) = l.accept() {
                serve(s);
            }
        });
        Peer {
            path: path.to_owned(),
            thread: Some(thread),
        }
    }

    /// Waits for the peer's thread (it ends when the client hangs up).
    pub fn join(mut self) {
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

/// Writes `chunk` again and again until `total` bytes are out or the
/// client hangs up (a write error): an endless stream from a fixed buffer.
pub fn flood(s: &mut UnixStream, chunk: &[u8], total: u64) {
    let mut sent = 0u64;
    while sent < total {
        if s.write_all(chunk).is_err() {
            return;
        }
        sent += chunk.len() as u64;
    }
}

/// Writes `text` a byte every `gap`, again and again until the client
/// hangs up (`gap` zero: once, at once).
pub fn drip(s: &mut UnixStream, text: &[u8], gap: Duration) {
    if gap.is_zero() {
        let _ = s.write_all(text);
        return;
    }
    for b in text.iter().cycle() {
        if s.write_all(&[*b]).is_err() {
            return;
        }
        thread::sleep(gap);
    }
}

/// A QMP peer's side: commands in, replies out.
pub struct QmpPeer {
    reader: BufReader<UnixStream>,
    pub out: UnixStream,
}

impl QmpPeer {
    /// Sends the greeting.
    pub fn greet(s: UnixStream) -> QmpPeer {
        let mut out = s.try_clone().unwrap();
        writeln!(out, "{GREETING}").unwrap();
        QmpPeer {
            reader: BufReader::new(s),
            out,
        }
    }

    /// The next command (None when the client hung up).
    pub fn command(&mut self) -> Option<serde_json::Value> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(serde_json::from_str(&line).unwrap()),
        }
    }

    /// Replies `ret` to `cmd`, with its id as QEMU echoes it.
    pub fn reply(&mut self, cmd: &serde_json::Value, ret: serde_json::Value) {
        let mut r = serde_json::json!({ "return": ret });
        if let Some(id) = cmd.get("id") {
            r["id"] = id.clone();
        }
        let _ = writeln!(self.out, "{r}");
    }
}

/// A gdbstub peer's side: packets in (acked), raw bytes out.
pub struct GdbPeer {
    s: UnixStream,
    buf: Vec<u8>,
}

impl GdbPeer {
    pub fn new(s: UnixStream) -> GdbPeer {
        GdbPeer { s, buf: Vec::new() }
    }

    /// The next packet's payload, acked (None when the client hung up).
    pub fn packet(&mut self) -> Option<String> {
        loop {
            if let Some(start) = self.buf.iter().position(|&b| b == b'$') {
                if let Some(h) = self.buf[start..].iter().position(|&b| b == b'#') {
                    let end = start + h + 3;
                    if self.buf.len() >= end {
                        let p = String::from_utf8_lossy(&self.buf[start + 1..start + h]).into();
                        self.buf.drain(..end);
                        self.s.write_all(b"+").ok()?;
                        return Some(p);
                    }
                }
            }
            let mut chunk = [0u8; 4096];
            match self.s.read(&mut chunk) {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return None,
            }
        }
    }

    /// Sends `data` framed as a packet.
    pub fn send(&mut self, data: &str) -> bool {
        self.s.write_all(&frame(data.as_bytes())).is_ok()
    }

    pub fn stream(&mut self) -> &mut UnixStream {
        &mut self.s
    }

    /// Answers `qSupported` as QEMU 7.2 does (features, no no-ack mode).
    pub fn negotiate(&mut self) -> Option<()> {
        let p = self.packet()?;
        assert!(p.starts_with("qSupported"), "{p}");
        self.send("PacketSize=1000;qXfer:features:read+;multiprocess+")
            .then_some(())
    }
}

/// `$data#cs`.
pub fn frame(data: &[u8]) -> Vec<u8> {
    let cs = data.iter().fold(0u8, |a, &b| a.wrapping_add(b));
    let mut out = vec![b'$'];
    out.extend_from_slice(data);
    out.extend_from_slice(format!("#{cs:02x}").as_bytes());
    out
}
