//! The body of a trace file, the same in a version-4 file and in a data
//! file's `HEAD` and `FOOT` blocks: the run's facts, functions, counts,
//! returns, callers and (version 8) prototypes.

use std::io::{self, Write};

use super::body::{VALUES_ARGS, VALUES_RETVAL};
use super::cmdline::put_cmdline;
use super::encode::{put_str, put_syms};
use super::protos::put_prototypes;
use super::{
    VERSION_10, VERSION_11, VERSION_12, VERSION_5, VERSION_6, VERSION_7, VERSION_8, VERSION_9,
};
use crate::trace::model::{DropCauses, Trace, TraceMeta};

/// The body of a file of `version` (4, or 5 on for a data file's `HEAD`
/// and `FOOT` blocks): the header, functions, counts, returns and callers.
pub(super) fn put_body(trace: &Trace, version: u32, w: &mut Vec<u8>) -> io::Result<()> {
    let m = &trace.meta;
    put_meta(m, version, w)?;

    put_syms(w, &trace.functions)?;

    w.write_all(&(trace.counts.len() as u32).to_le_bytes())?;
    w.write_all(&m.cpus.to_le_bytes())?;
    for row in &trace.counts {
        for c in row {
            w.write_all(&c.to_le_bytes())?;
        }
    }

    let cols = if m.graph { m.cpus } else { 0 };
    w.write_all(&(trace.returns.len() as u32).to_le_bytes())?;
    w.write_all(&cols.to_le_bytes())?;
    for row in &trace.returns {
        for c in row {
            w.write_all(&c.to_le_bytes())?;
        }
    }

    put_syms(w, &trace.callers)?;
    if version >= VERSION_8 {
        put_prototypes(w, &trace.prototypes)?;
    }
    if version >= VERSION_12 {
        super::fields::put_formats(w, &trace.fields.formats, version)?;
    }
    if version >= super::VERSION_15 {
        super::fields::put_formats(w, &trace.fields.return_formats, version)?;
    }
    Ok(())
}

/// The header's run facts (`TraceMeta`), as `version` has them.
fn put_meta(m: &TraceMeta, version: u32, w: &mut Vec<u8>) -> io::Result<()> {
    put_str(w, &m.kernel)?;
    match &m.build_id {
        Some(b) => {
            w.write_all(&[1])?;
            put_str(w, b)?;
        }
        None => w.write_all(&[0])?,
    }
    w.write_all(&m.cpus.to_le_bytes())?;
    for v in [
        m.attach_ns,
        m.detach_ns,
        m.sites_patched,
        m.sites_skipped_init,
        m.sites_skipped_other,
        m.attach_window_ns,
        m.attach_latency_ns,
        m.events_total,
        m.events_dropped,
        m.parent_unreadable,
    ] {
        w.write_all(&v.to_le_bytes())?;
    }
    put_str(w, &m.stop_reason)?;
    put_str(w, &m.mode)?;
    w.write_all(&m.trap_exits.to_le_bytes())?;
    w.write_all(&[u8::from(m.graph)])?;
    for v in [m.returns_dropped, m.unhooked, m.tsc_khz] {
        w.write_all(&v.to_le_bytes())?;
    }
    put_str(w, &m.symbols)?;
    if version >= VERSION_5 {
        w.write_all(&(m.lost.len() as u32).to_le_bytes())?;
        for v in &m.lost {
            w.write_all(&v.to_le_bytes())?;
        }
        w.write_all(&[u8::from(m.overwrite)])?;
        put_str(w, &m.rejected_sites)?;
        match m.kernel_offset {
            Some((virt, phys)) => {
                w.write_all(&[1])?;
                w.write_all(&virt.to_le_bytes())?;
                w.write_all(&phys.to_le_bytes())?;
            }
            None => w.write_all(&[0])?,
        }
    }
    if version >= VERSION_6 {
        w.write_all(&m.unfinished.to_le_bytes())?;
    }
    if version >= VERSION_7 {
        put_str(w, &m.vmm)?;
    }
    if version >= VERSION_8 {
        put_str(w, &m.tasks)?;
        w.write_all(&m.filtered.to_le_bytes())?;
        let values =
            if m.args { VALUES_ARGS } else { 0 } | if m.retval { VALUES_RETVAL } else { 0 };
        w.write_all(&[values])?;
    }
    if version >= VERSION_9 {
        put_str(w, &m.stacks)?;
        w.write_all(&(m.stack_funcs.len() as u32).to_le_bytes())?;
        for f in &m.stack_funcs {
            w.write_all(&f.to_le_bytes())?;
        }
    }
    if version >= VERSION_10 {
        put_drops(&m.drops, w)?;
    }
    if version >= VERSION_11 {
        put_cmdline(&m.cmdline, w)?;
    }
    Ok(())
}

/// Version 10's `DropCauses`.
fn put_drops(d: &DropCauses, w: &mut Vec<u8>) -> io::Result<()> {
    w.write_all(&(d.ring_full.len() as u32).to_le_bytes())?;
    for v in d.ring_full.iter().chain([
        &d.held,
        &d.ring_asked,
        &d.ring_given,
        &d.over_budget,
        &d.overwritten,
    ]) {
        w.write_all(&v.to_le_bytes())?;
    }
    Ok(())
}
