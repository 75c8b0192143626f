//! Lines from a peer that may be hostile: each read bounded in size and
//! waited for until one deadline, not per read, so that neither an endless
//! line nor a peer that drips a byte at a time holds vmtrace.

use std::io::{ErrorKind, Read};
use std::os::unix::net::UnixStream;
use std::time::Instant;

/// Bytes read from the socket at a time.
const CHUNK: usize = 64 * 1024;

/// Why no line came.
#[derive(Debug)]
pub enum LineError {
    /// The deadline passed (`partial` says whether part of a line came).
    Timeout,
    /// The peer closed the connection (or reset it).
    Closed,
    /// A line grew past the limit without its newline.
    TooLong,
    Io(std::io::Error),
}

/// Newline-terminated lines read from a unix socket, at most `limit` bytes
/// each (the newline included).
pub struct LineReader {
    stream: UnixStream,
    /// Bytes read but not yet returned: at most one partial line once a
    /// line is taken, never more than `limit` plus one chunk.
    buf: Vec<u8>,
    limit: usize,
}

impl LineReader {
    pub fn new(stream: UnixStream, limit: usize) -> LineReader {
        LineReader {
            stream,
            buf: Vec::new(),
            limit,
        }
    }

    /// Part of a line came and waits for the rest.
    pub fn partial(&self) -> bool {
        !self.buf.is_empty()
    }

    /// The next line (with its newline), if it comes whole by `deadline`.
    /// A partial line stays buffered for the next call.
    pub fn line(&mut self, deadline: Instant) -> Result<Vec<u8>, LineError> {
        let mut scanned = 0;
        loop {
            if let Some(i) = self.buf[scanned..].iter().position(|&b| b == b'\n') {
                let end = scanned + i + 1;
                if end > self.limit {
                    return Err(LineError::TooLong);
                }
                return Ok(self.buf.drain(..end).collect());
            }
            scanned = self.buf.len();
            if scanned > self.limit {
                return Err(LineError::TooLong);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            // (A socket takes no zero timeout: the time is up.)
            if left.is_zero() {
                return Err(LineError::Timeout);
            }
            self.stream
                .set_read_timeout(Some(left))
                .map_err(LineError::Io)?;
            let old = self.buf.len();
            self.buf.resize(old + CHUNK, 0);
            let got = self.stream.read(&mut self.buf[old..]);
            self.buf.truncate(old + *got.as_ref().unwrap_or(&0));
            match got {
                Ok(0) => return Err(LineError::Closed),
                Ok(_) => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return Err(LineError::Closed),
                Err(e) => return Err(LineError::Io(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::time::Duration;

    fn pair(limit: usize) -> (LineReader, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        (LineReader::new(a, limit), b)
    }

    #[test]
    fn lines_come_whole_and_partial_ones_wait() {
        let (mut r, mut w) = pair(16);
        w.write_all(b"one\ntw").unwrap();
        let soon = || Instant::now() + Duration::from_millis(200);
        assert_eq!(r.line(soon()).unwrap(), b"one\n");
        assert!(matches!(r.line(soon()), Err(LineError::Timeout)));
        assert!(r.partial());
        w.write_all(b"o\n").unwrap();
        assert_eq!(r.line(soon()).unwrap(), b"two\n");
        drop(w);
        assert!(matches!(r.line(soon()), Err(LineError::Closed)));
    }

    #[test]
    fn a_line_past_the_limit_is_refused() {
        let (mut r, mut w) = pair(16);
        w.write_all(&[b'x'; 40]).unwrap();
        let soon = Instant::now() + Duration::from_secs(5);
        assert!(matches!(r.line(soon), Err(LineError::TooLong)));
        // With its newline inside what was read, too.
        let (mut r, mut w) = pair(16);
        w.write_all(&[b'x'; 20]).unwrap();
        w.write_all(b"\n").unwrap();
        assert!(matches!(r.line(soon), Err(LineError::TooLong)));
    }
}
