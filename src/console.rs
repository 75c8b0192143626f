//! The guest console's writer. The VMM's serial device writes the guest's
//! output and has nowhere to report a failed write, so this writer keeps
//! the first error and the bytes lost, and the run says so when it ends
//! (`--console /dev/full`, a full disk): console output is never lost
//! silently. A closed pipe (`--console - | head`) is the reader's choice
//! and is not reported, as for the report itself.

use std::io::{self, Write};
use std::sync::Mutex;

/// What the console lost in this run: (bytes, the first error, where).
static LOST: Mutex<Option<(u64, String, String)>> = Mutex::new(None);

/// `inner`, with its write errors recorded instead of returned (the device
/// carries on; the next line may still get through).
pub struct Checked<W> {
    inner: W,
    /// Where the console goes, for the message.
    what: String,
}

impl<W: Write> Checked<W> {
    pub fn new(inner: W, what: impl Into<String>) -> Self {
        Checked {
            inner,
            what: what.into(),
        }
    }

    fn lose(&self, bytes: usize, e: io::Error) {
        if e.kind() == io::ErrorKind::BrokenPipe {
            return;
        }
        let mut lost = LOST.lock().unwrap_or_else(|p| p.into_inner());
        match lost.as_mut() {
            Some((n, _, _)) => *n += bytes as u64,
            None => *lost = Some((bytes as u64, e.to_string(), self.what.clone())),
        }
    }
}

impl<W: Write> Write for Checked<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.inner.write(buf) {
            Ok(n) => Ok(n),
            Err(e) => {
                self.lose(buf.len(), e);
                Ok(buf.len())
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        if let Err(e) = self.inner.flush() {
            self.lose(0, e);
        }
        Ok(())
    }
}

/// The line to say at the end of a run whose console lost output.
pub fn loss() -> Option<String> {
    let lost = LOST.lock().unwrap_or_else(|p| p.into_inner());
    lost.as_ref().map(|(bytes, e, what)| {
        format!(
            "the guest console could not be written to {what}: {e}; at least {bytes} bytes of it \
             were lost"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_console_is_counted_and_a_closed_pipe_is_not() {
        struct Full;
        impl Write for Full {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::Error::from_raw_os_error(libc::ENOSPC))
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        struct Closed;
        impl Write for Closed {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut c = Checked::new(Closed, "stdout");
        assert_eq!(c.write(b"abc").unwrap(), 3);
        assert_eq!(loss(), None);
        let mut f = Checked::new(Full, "/dev/full");
        assert_eq!(f.write(b"hello\n").unwrap(), 6);
        assert_eq!(f.write(b"more\n").unwrap(), 5);
        let line = loss().unwrap();
        assert!(
            line.contains("/dev/full: No space left on device"),
            "{line}"
        );
        assert!(line.contains("at least 11 bytes"), "{line}");
    }
}
