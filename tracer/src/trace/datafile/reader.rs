//! The reading primitive of every version: a byte reader that knows its
//! position, the file's actual and declared sizes, and the section being
//! read, so that every error names the file and the section, and a length
//! field is checked against what exists before anything is allocated.

use std::io::{self, Read};
use std::path::Path;

use super::{Section, TraceFileError, EVENT_CHUNK, MIN_SYM_SIZE};
use crate::kernel::symbols::Symbol;

/// The longest string field read (a path, a stop reason, a symbol name):
/// bounds what a corrupt length field makes the reader allocate.
pub const MAX_STRING: u32 = 1 << 20;

/// Reads the file, tracking the position and the current section for errors.
pub(super) struct Reader<'p, R> {
    pub r: R,
    pub path: &'p Path,
    pub pos: u64,
    /// The file's size on disk.
    pub actual: u64,
    /// The size the preamble claims (unbounded until it is read).
    pub declared: u64,
    pub section: Section,
}

impl<'p, 'x> Reader<'p, &'x [u8]> {
    /// A reader of one block's `payload` (its checksum checked), in
    /// `section` of the file `parent` reads.
    pub(super) fn block<R>(parent: &Reader<'p, R>, payload: &'x [u8], section: Section) -> Self {
        Reader {
            r: payload,
            path: parent.path,
            pos: 0,
            actual: payload.len() as u64,
            declared: payload.len() as u64,
            section,
        }
    }
}

impl<R: Read> Reader<'_, R> {
    pub(super) fn truncated(&self) -> TraceFileError {
        TraceFileError::Truncated {
            path: self.path.to_path_buf(),
            section: self.section,
        }
    }

    pub(super) fn corrupt(&self, detail: String) -> TraceFileError {
        TraceFileError::Corrupt {
            path: self.path.to_path_buf(),
            section: self.section,
            detail,
        }
    }

    /// Checks that `n` more bytes, claimed by a length field for `what`,
    /// exist: past the declared length it is corruption, past the actual end
    /// of the file truncation. Called before allocating for them.
    pub(super) fn need(&self, n: u64, what: &str) -> Result<(), TraceFileError> {
        let left = self.declared - self.pos;
        if n > left {
            return Err(self.corrupt(format!(
                "{what} would take {n} bytes but only {left} remain"
            )));
        }
        if self.pos + n > self.actual {
            return Err(self.truncated());
        }
        Ok(())
    }

    pub(super) fn bytes(&mut self, buf: &mut [u8]) -> Result<(), TraceFileError> {
        self.need(buf.len() as u64, "a field")?;
        self.r.read_exact(buf).map_err(|source| {
            if source.kind() == io::ErrorKind::UnexpectedEof {
                self.truncated()
            } else {
                TraceFileError::Read {
                    path: self.path.to_path_buf(),
                    source,
                }
            }
        })?;
        self.pos += buf.len() as u64;
        Ok(())
    }

    pub(super) fn u8(&mut self) -> Result<u8, TraceFileError> {
        let mut b = [0u8; 1];
        self.bytes(&mut b)?;
        Ok(b[0])
    }

    pub(super) fn u16(&mut self) -> Result<u16, TraceFileError> {
        let mut b = [0u8; 2];
        self.bytes(&mut b)?;
        Ok(u16::from_le_bytes(b))
    }

    pub(super) fn u32(&mut self) -> Result<u32, TraceFileError> {
        let mut b = [0u8; 4];
        self.bytes(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    pub(super) fn u64(&mut self) -> Result<u64, TraceFileError> {
        let mut b = [0u8; 8];
        self.bytes(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    pub(super) fn string(&mut self, what: &str) -> Result<String, TraceFileError> {
        let len = self.u32()?;
        self.need(len as u64, what)?;
        // Within the file, but a sparse file's zeros must not cost GiBs.
        if len > MAX_STRING {
            return Err(self.corrupt(format!("{what} is {len} bytes long (at most {MAX_STRING})")));
        }
        let mut b = vec![0u8; len as usize];
        self.bytes(&mut b)?;
        String::from_utf8(b).map_err(|_| self.corrupt(format!("{what} is not valid UTF-8")))
    }

    /// A `rows` x `cols` matrix of u64 (row and column counts read first
    /// and checked against the expected ones).
    pub(super) fn matrix(
        &mut self,
        want_rows: usize,
        want_cols: usize,
        what: &str,
    ) -> Result<Vec<Vec<u64>>, TraceFileError> {
        let rows = self.u32()?;
        let cols = self.u32()?;
        if rows as usize != want_rows || cols as usize != want_cols {
            return Err(self.corrupt(format!(
                "{what} are {rows} x {cols} but the trace has {want_rows} functions x {want_cols} vCPUs"
            )));
        }
        let size = (rows as u64).saturating_mul(cols as u64).saturating_mul(8);
        self.need(size, &format!("the {what}"))?;
        // Sized only once a row is known to fit in the file.
        let mut row_bytes = if rows > 0 {
            vec![0u8; cols as usize * 8]
        } else {
            Vec::new()
        };
        let mut m = Vec::with_capacity(rows as usize);
        for _ in 0..rows {
            self.bytes(&mut row_bytes)?;
            m.push(
                row_bytes
                    .chunks_exact(8)
                    .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
                    .collect(),
            );
        }
        Ok(m)
    }

    pub(super) fn syms(&mut self, what: &str) -> Result<Vec<Symbol>, TraceFileError> {
        let n = self.u32()?;
        self.need(n as u64 * MIN_SYM_SIZE, &format!("{n} {what}"))?;
        // Grown as read, like the events.
        let mut syms = Vec::with_capacity((n as usize).min(EVENT_CHUNK));
        for i in 0..n {
            let name = self.string("a symbol name")?;
            if name.is_empty() {
                return Err(self.corrupt(format!("{what} {i} has an empty name")));
            }
            let addr = self.u64()?;
            let size = self.u64()?;
            syms.push(Symbol { name, addr, size });
        }
        Ok(syms)
    }
}
