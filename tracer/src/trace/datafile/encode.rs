//! The smallest pieces of a trace file: an event record, a string, a
//! symbol list (see the format in the parent module).

use std::io::{self, Write};

use super::{EVENT_SIZE_V8, EVENT_SIZE_V9};
use crate::kernel::symbols::Symbol;
use crate::trace::model::Event;

/// One event record into `b`: `EVENT_SIZE` bytes, `EVENT_SIZE_V8` with
/// its task and data, or `EVENT_SIZE_V9` with its stack too.
pub(super) fn encode(e: &Event, b: &mut [u8]) {
    b[0..8].copy_from_slice(&e.ts_ns.to_le_bytes());
    b[8..16].copy_from_slice(&e.parent.to_le_bytes());
    b[16..24].copy_from_slice(&e.slot.to_le_bytes());
    b[24..28].copy_from_slice(&e.func.to_le_bytes());
    b[28..32].copy_from_slice(&e.cpu.to_le_bytes());
    if b.len() == EVENT_SIZE_V8 {
        b[32..36].copy_from_slice(&e.task.to_le_bytes());
        b[36..44].copy_from_slice(&e.data.to_le_bytes());
    } else if b.len() == EVENT_SIZE_V9 {
        b[32..36].copy_from_slice(&e.task.to_le_bytes());
        b[36..40].copy_from_slice(&e.stack.to_le_bytes());
        b[40..48].copy_from_slice(&e.data.to_le_bytes());
    }
}

pub(super) fn put_str(w: &mut impl Write, s: &str) -> io::Result<()> {
    let len = u32::try_from(s.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "string longer than 4 GiB"))?;
    w.write_all(&len.to_le_bytes())?;
    w.write_all(s.as_bytes())
}

pub(super) fn put_syms(w: &mut impl Write, syms: &[Symbol]) -> io::Result<()> {
    w.write_all(&(syms.len() as u32).to_le_bytes())?;
    for s in syms {
        put_str(w, &s.name)?;
        w.write_all(&s.addr.to_le_bytes())?;
        w.write_all(&s.size.to_le_bytes())?;
    }
    Ok(())
}
