//! Functions added during the trace (format version 14): a kernel module
//! the guest first loads while `vmtrace attach` traces it brings traced
//! functions `HEAD` (written before the guest runs) could not name. Each
//! goes in a `FUNC` block before the first `EVTS` block whose events name
//! it, as guest tasks go in `TASK` blocks, so a file cut short still names
//! the function of every event it kept:
//!
//! | Field    | Type          | Notes                                                   |
//! |----------|---------------|---------------------------------------------------------|
//! | first    | `u32`         | functions before this block (`HEAD`'s and those added)  |
//! | n        | `u32`         | functions added in this block (at least 1)              |
//! | funcs    | n × `sym`     | each `function [module]`, its running address and size  |
//!
//! The added functions follow `HEAD`'s in the function list: an event's
//! `func` indexes them all. A reader must reject a `FUNC` block whose
//! `first` is not the number of functions before it, an empty one, and an
//! event whose `func` is past the functions named before its block; a
//! complete file's `FOOT` names `HEAD`'s functions and the added ones, in
//! that order. A file cut short keeps the prototypes `HEAD` had (an added
//! function has none: its values are shown raw). Versions 1 to 13 are
//! still read: they add no function.

use super::reader::Reader;
use super::{Section, TraceFileError};
use crate::kernel::symbols::Symbol;

/// Traced functions added during the trace (version 14).
pub const TAG_FUNCS: [u8; 4] = *b"FUNC";

/// A `FUNC` block's payload: `funcs`, added after the first `first`
/// functions.
pub(super) fn funcs_payload(first: usize, funcs: &[Symbol]) -> std::io::Result<Vec<u8>> {
    let too_many = || std::io::Error::new(std::io::ErrorKind::InvalidInput, "over 2^32 functions");
    let first = u32::try_from(first).map_err(|_| too_many())?;
    let mut b = Vec::with_capacity(8 + funcs.len() * 64);
    b.extend_from_slice(&first.to_le_bytes());
    super::encode::put_syms(&mut b, funcs)?;
    Ok(b)
}

/// A `FUNC` block's functions, appended to `functions` (those before it).
pub(super) fn read_funcs_block(
    r: &Reader<'_, impl std::io::Read>,
    payload: &[u8],
    functions: &mut Vec<Symbol>,
) -> Result<(), TraceFileError> {
    let mut sub = Reader::block(r, payload, Section::Functions);
    let first = sub.u32()? as usize;
    if first != functions.len() {
        return Err(sub.corrupt(format!(
            "a function block starts at function {first} but {} came before it",
            functions.len()
        )));
    }
    let added = sub.syms("added functions")?;
    if added.is_empty() {
        return Err(sub.corrupt("a function block adds no function".into()));
    }
    if sub.pos != sub.actual {
        return Err(sub.corrupt(format!(
            "{} bytes after the added functions",
            sub.actual - sub.pos
        )));
    }
    if u32::try_from(functions.len() + added.len()).is_err() {
        return Err(sub.corrupt("over 2^32 functions".into()));
    }
    functions.extend(added);
    Ok(())
}
