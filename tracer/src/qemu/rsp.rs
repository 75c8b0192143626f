//! The GDB remote serial protocol's encodings: packet framing and checksum,
//! run-length decoding, binary escapes, hex, stub addresses and thread ids.
//! Pure functions; `gdb` does the talking.

use std::path::PathBuf;
use std::str::FromStr;

/// `$data#cs`.
pub fn frame(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 4);
    out.push(b'$');
    out.extend_from_slice(data);
    out.extend_from_slice(format!("#{:02x}", checksum(data)).as_bytes());
    out
}

pub fn checksum(data: &[u8]) -> u8 {
    data.iter().fold(0u8, |a, &b| a.wrapping_add(b))
}

/// Takes one packet off the front of `buf`: `Some(Ok(payload))` with its
/// run-length encoding expanded, `Some(Err(()))` for a bad checksum, `None`
/// while incomplete. Bytes before the `$` (acks, noise) are dropped, except
/// that `acks` counts the `+` among them.
pub fn take_packet(buf: &mut Vec<u8>, acks: &mut usize) -> Option<Result<Vec<u8>, ()>> {
    let start = buf.iter().position(|&b| b == b'$');
    let skipped = start.unwrap_or(buf.len());
    *acks += buf[..skipped].iter().filter(|&&b| b == b'+').count();
    let Some(start) = start else {
        buf.clear();
        return None;
    };
    buf.drain(..start);
    let hash = buf.iter().position(|&b| b == b'#')?;
    if buf.len() < hash + 3 {
        return None;
    }
    let body = buf[1..hash].to_vec();
    let want = std::str::from_utf8(&buf[hash + 1..hash + 3])
        .ok()
        .and_then(|s| u8::from_str_radix(s, 16).ok());
    buf.drain(..hash + 3);
    if want != Some(checksum(&body)) {
        return Some(Err(()));
    }
    Some(Ok(run_length_decode(&body)))
}

/// Expands `c*n`: `c` repeated `n - 29` more times. A byte after a `}`
/// escape is data, never a run marker.
pub fn run_length_decode(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len());
    let mut i = 0;
    while i < data.len() {
        let b = data[i];
        if b == b'}' && i + 1 < data.len() {
            out.extend_from_slice(&data[i..i + 2]);
            i += 2;
        } else if b == b'*' && i + 1 < data.len() && !out.is_empty() {
            let last = out[out.len() - 1];
            let n = data[i + 1].saturating_sub(29) as usize;
            out.extend(std::iter::repeat_n(last, n));
            i += 2;
        } else {
            out.push(b);
            i += 1;
        }
    }
    out
}

/// Undoes the binary escape: `}` then the byte XOR 0x20.
pub fn unescape(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len());
    let mut it = data.iter();
    while let Some(&b) = it.next() {
        if b == b'}' {
            if let Some(&n) = it.next() {
                out.push(n ^ 0x20);
            }
        } else {
            out.push(b);
        }
    }
    out
}

/// The binary escape of `#`, `$`, `}` and `*`.
pub fn escape(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + data.len() / 16);
    for &b in data {
        if matches!(b, b'#' | b'$' | b'}' | b'*') {
            out.push(b'}');
            out.push(b ^ 0x20);
        } else {
            out.push(b);
        }
    }
    out
}

const HEX: &[u8; 16] = b"0123456789abcdef";

pub fn to_hex(data: &[u8]) -> String {
    let mut s = String::with_capacity(data.len() * 2);
    for &b in data {
        s.push(HEX[usize::from(b >> 4)] as char);
        s.push(HEX[usize::from(b & 15)] as char);
    }
    s
}

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Hex to bytes; `xx` (a register the stub cannot read) becomes 0.
pub fn from_hex(text: &[u8]) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    text.chunks_exact(2)
        .map(|p| match p {
            b"xx" => Some(0),
            _ => Some(nibble(p[0])? << 4 | nibble(p[1])?),
        })
        .collect()
}

/// Where a gdbstub listens: a unix socket path, or host:port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GdbAddr {
    Unix(PathBuf),
    Tcp(String),
}

impl FromStr for GdbAddr {
    type Err = std::convert::Infallible;

    /// `host:port` (port all digits, no `/`) is TCP; anything else a path.
    fn from_str(s: &str) -> Result<GdbAddr, Self::Err> {
        let tcp = !s.contains('/')
            && s.rsplit_once(':')
                .is_some_and(|(_, p)| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        Ok(if tcp {
            GdbAddr::Tcp(s.to_string())
        } else {
            GdbAddr::Unix(PathBuf::from(s))
        })
    }
}

impl std::fmt::Display for GdbAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GdbAddr::Unix(p) => write!(f, "{}", p.display()),
            GdbAddr::Tcp(a) => write!(f, "{a}"),
        }
    }
}

/// A thread of the stub: QEMU's thread `n` is vCPU `n - 1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ThreadId {
    /// The process (multiprocess form `pP.T`), when the stub uses it.
    pub pid: Option<u64>,
    pub tid: u64,
}

impl ThreadId {
    /// `p1.2` or `2` (hex), or `-1` (all).
    pub fn parse(s: &str) -> Option<ThreadId> {
        let num = |t: &str| u64::from_str_radix(t, 16).ok();
        match s.strip_prefix('p') {
            Some(rest) => {
                let (p, t) = rest.split_once('.')?;
                Some(ThreadId {
                    pid: Some(num(p)?),
                    tid: num(t)?,
                })
            }
            None => Some(ThreadId {
                pid: None,
                tid: num(s)?,
            }),
        }
    }

    /// The vCPU index QEMU gives this thread (cpu_index + 1 = thread id).
    pub fn vcpu(&self) -> Option<u32> {
        self.tid.checked_sub(1).map(|v| v as u32)
    }
}

impl std::fmt::Display for ThreadId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.pid {
            Some(p) => write!(f, "p{p:x}.{:x}", self.tid),
            None => write!(f, "{:x}", self.tid),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_and_takes_packets() {
        assert_eq!(frame(b"g"), b"$g#67");
        let mut buf = b"+-+$OK#9a$T02thread:01;#".to_vec();
        let mut acks = 0;
        assert_eq!(take_packet(&mut buf, &mut acks), Some(Ok(b"OK".to_vec())));
        assert_eq!(acks, 2);
        assert_eq!(take_packet(&mut buf, &mut acks), None);
        buf.extend_from_slice(b"04");
        assert_eq!(
            take_packet(&mut buf, &mut acks),
            Some(Ok(b"T02thread:01;".to_vec()))
        );
        let mut bad = b"$OK#00".to_vec();
        assert_eq!(take_packet(&mut bad, &mut acks), Some(Err(())));
        assert!(bad.is_empty());
    }

    #[test]
    fn run_length_and_escapes() {
        // "0* " is '0' and 3 more: four zeros.
        assert_eq!(run_length_decode(b"0* 1"), b"00001");
        assert_eq!(run_length_decode(b"}\x0a*"), b"}\x0a*");
        let raw = [0x23, 0x24, 0x7d, 0x2a, 0x00, 0xff];
        assert_eq!(escape(&raw), b"}\x03}\x04}\x5d}\x0a\x00\xff");
        assert_eq!(unescape(&escape(&raw)), raw);
        assert_eq!(from_hex(b"00ffxx"), Some(vec![0, 0xff, 0]));
        assert_eq!(from_hex(b"0"), None);
        assert_eq!(to_hex(&[1, 0xab]), "01ab");
    }
}
