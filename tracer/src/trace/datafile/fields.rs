//! Version 12's traced events' fields (`-e`): the events' formats at the
//! end of the body, and each event entry's values in `FLDS` blocks (see
//! the parent module's "Version 12").

use std::collections::BTreeMap;
use std::io::{self, Write};

use super::encode::put_str;
use super::reader::Reader;
use super::{Section, TraceFileError, VERSION_13, VERSION_15};
use crate::kernel::events::fields::Source;
use crate::kernel::events::ftrace_format::{FtraceField, FtraceFormat};
use crate::trace::fields::{EventFormat, Field, FieldValue, Print};
use crate::trace::model::Trace;

/// Block tag of event entries' field values.
pub const TAG_FIELDS: [u8; 4] = *b"FLDS";
/// The most fields an event has, and the most entries a `FLDS` block
/// holds: bounds what a corrupt count makes a reader allocate.
const MAX_FIELDS: u32 = 64;
const MAX_BLOCK_ENTRIES: usize = 1 << 16;

/// `Print` as its code in the file.
const PRINTS: [Print; 10] = [
    Print::Int,
    Print::Long,
    Print::Unsigned,
    Print::Hex,
    Print::Bool,
    Print::Cpu,
    Print::Str,
    Print::State,
    Print::BareHex,
    Print::Word,
];

/// A value's tag: an integer (`u64`, two's complement), a string (`str`),
/// a value that could not be read (nothing follows).
const VALUE_INT: u8 = 0;
const VALUE_STR: u8 = 1;
const VALUE_UNREAD: u8 = 2;

fn too_many(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("too many {what}"))
}

/// The formats of the traced functions that are events: `u32` n, then n
/// × (`u32` function, `str` event, `u8` covered, `u32` m, m × (`str`
/// name, `str` type, `u8` print)).
pub(super) fn put_formats(
    w: &mut Vec<u8>,
    formats: &[Option<EventFormat>],
    version: u32,
) -> io::Result<()> {
    let some: Vec<(usize, &EventFormat)> = formats
        .iter()
        .enumerate()
        .filter_map(|(i, f)| Some((i, f.as_ref()?)))
        .collect();
    w.write_all(&(some.len() as u32).to_le_bytes())?;
    for (func, f) in some {
        let func = u32::try_from(func).map_err(|_| too_many("functions"))?;
        w.write_all(&func.to_le_bytes())?;
        put_str(w, &f.event)?;
        w.push(u8::from(f.covered));
        let n = u32::try_from(f.fields.len())
            .ok()
            .filter(|&n| n <= MAX_FIELDS)
            .ok_or_else(|| too_many("fields in an event"))?;
        w.write_all(&n.to_le_bytes())?;
        for field in &f.fields {
            put_str(w, &field.name)?;
            put_str(w, &field.label)?;
            put_str(w, &field.ty)?;
            let code = PRINTS.iter().position(|&p| p == field.print).unwrap_or(0);
            w.push(code as u8);
            if version >= VERSION_15 {
                put_source(w, field.source);
            }
        }
        if version >= VERSION_13 {
            put_ftrace(w, f.ftrace.as_ref())?;
        }
    }
    Ok(())
}

/// A field's source tags (version 15): where its value comes from.
const SOURCE_STORED: u8 = 0;
const SOURCE_CONST: u8 = 1;
const SOURCE_RET: u8 = 2;

/// Version 15's source of a field: stored (its event's `FLDS` values), a
/// constant, or the return value.
fn put_source(w: &mut Vec<u8>, source: Source) {
    match source {
        Source::Const(v) => {
            w.push(SOURCE_CONST);
            w.extend_from_slice(&v.to_le_bytes());
        }
        Source::Ret => w.push(SOURCE_RET),
        _ => w.push(SOURCE_STORED),
    }
}

/// What `put_source` wrote, for field `i` of event `event`.
fn read_source<R: io::Read>(
    r: &mut Reader<'_, R>,
    i: usize,
    event: &str,
) -> Result<Source, TraceFileError> {
    Ok(match r.u8()? {
        SOURCE_STORED => Source::Arg(i),
        SOURCE_CONST => Source::Const(r.u64()? as i64),
        SOURCE_RET => Source::Ret,
        b => return Err(r.corrupt(format!("field {i} of {event}: source {b}"))),
    })
}

/// Version 13's ftrace format of an event (see the parent module).
fn put_ftrace(w: &mut Vec<u8>, f: Option<&FtraceFormat>) -> io::Result<()> {
    let Some(f) = f else {
        w.push(0);
        return Ok(());
    };
    w.push(1);
    w.write_all(&f.id.to_le_bytes())?;
    put_str(w, &f.print_fmt)?;
    let k = u32::try_from(f.fields.len())
        .ok()
        .filter(|&k| k <= MAX_FIELDS)
        .ok_or_else(|| too_many("ftrace fields in an event"))?;
    w.write_all(&k.to_le_bytes())?;
    for field in &f.fields {
        put_str(w, &field.ty)?;
        put_str(w, &field.name)?;
        w.write_all(&field.offset.to_le_bytes())?;
        w.write_all(&field.size.to_le_bytes())?;
        w.push(u8::from(field.signed));
    }
    Ok(())
}

/// What `put_ftrace` wrote, for event `event`.
fn read_ftrace<R: io::Read>(
    r: &mut Reader<'_, R>,
    event: &str,
) -> Result<Option<FtraceFormat>, TraceFileError> {
    match r.u8()? {
        0 => return Ok(None),
        1 => {}
        b => return Err(r.corrupt(format!("event {event}: ftrace format flag {b}"))),
    }
    let id = r.u16()?;
    let print_fmt = r.string("an event's print format")?;
    let k = r.u32()?;
    if k > MAX_FIELDS {
        return Err(r.corrupt(format!(
            "event {event} has {k} ftrace fields (at most {MAX_FIELDS})"
        )));
    }
    let mut fields = Vec::with_capacity(k as usize);
    for _ in 0..k {
        let ty = r.string("an ftrace field's type")?;
        let name = r.string("an ftrace field's name")?;
        let (offset, size) = (r.u32()?, r.u32()?);
        let signed = match r.u8()? {
            0 => false,
            1 => true,
            b => return Err(r.corrupt(format!("field {name} of {event}: signed is {b}"))),
        };
        fields.push(FtraceField {
            ty,
            name,
            offset,
            size,
            signed,
        });
    }
    Ok(Some(FtraceFormat {
        id,
        fields,
        print_fmt,
    }))
}

/// The formats `put_formats` wrote, by function (`nfunc` of them; empty
/// when there are none). A read format's fields are sourced by their
/// position: where they came from in the guest is not kept.
pub(super) fn read_formats<R: io::Read>(
    r: &mut Reader<'_, R>,
    nfunc: usize,
    version: u32,
) -> Result<Vec<Option<EventFormat>>, TraceFileError> {
    r.section = Section::Fields;
    let n = r.u32()? as usize;
    if n == 0 {
        return Ok(Vec::new());
    }
    if n > nfunc {
        return Err(r.corrupt(format!("{n} event formats for {nfunc} functions")));
    }
    let mut formats = vec![None; nfunc];
    for _ in 0..n {
        let func = r.u32()? as usize;
        if func >= nfunc || formats[func].is_some() {
            return Err(r.corrupt(format!(
                "an event format for function {func} ({nfunc} functions, each once)"
            )));
        }
        let event = r.string("an event's name")?;
        let covered = match r.u8()? {
            0 => false,
            1 => true,
            b => return Err(r.corrupt(format!("event {event}: covered is {b}, not 0 or 1"))),
        };
        let m = r.u32()?;
        if m > MAX_FIELDS {
            return Err(r.corrupt(format!(
                "event {event} has {m} fields (at most {MAX_FIELDS})"
            )));
        }
        let mut fields = Vec::with_capacity(m as usize);
        for i in 0..m as usize {
            let name = r.string("a field's name")?;
            let label = r.string("a field's label")?;
            let ty = r.string("a field's type")?;
            let code = r.u8()?;
            let print = *PRINTS.get(code as usize).ok_or_else(|| {
                r.corrupt(format!(
                    "field {name} of event {event} prints by code {code}"
                ))
            })?;
            let source = match version >= VERSION_15 {
                true => read_source(r, i, &event)?,
                false => Source::Arg(i),
            };
            fields.push(Field {
                name,
                label,
                ty,
                source,
                print,
            });
        }
        let ftrace = match version >= VERSION_13 {
            true => read_ftrace(r, &event)?,
            false => None,
        };
        formats[func] = Some(EventFormat {
            event,
            fields,
            covered,
            ftrace,
        });
    }
    Ok(formats)
}

/// The events' fields' rules: a format per function or none, values of
/// saved arguments only.
pub(super) fn check_fields(trace: &Trace) -> Result<(), (Section, String)> {
    let (f, nfunc) = (&trace.fields, trace.functions.len());
    for (what, formats) in [("", &f.formats), ("return ", &f.return_formats)] {
        if !formats.is_empty() && formats.len() != nfunc {
            let n = formats.len();
            let why = format!("{n} {what}event formats for {nfunc} functions");
            return Err((Section::Fields, why));
        }
    }
    let args = trace.args.len() as u64;
    match f.values.keys().find(|&&id| id == 0 || id > args) {
        Some(id) => Err((
            Section::Fields,
            format!("fields of arguments {id} but {args} are saved"),
        )),
        None => Ok(()),
    }
}

/// The `FLDS` blocks of `entries` (arguments id, values): each `u32` n,
/// then n × (`u64` id, `u32` m, m values: `u8` tag then, for an integer,
/// `u64`, for a string, `str`).
pub(super) fn fields_payloads<'a>(
    entries: impl Iterator<Item = (u64, &'a [FieldValue])>,
) -> io::Result<Vec<Vec<u8>>> {
    let mut blocks = Vec::new();
    let mut p = Vec::new();
    let mut n = 0u32;
    let mut done = |p: &mut Vec<u8>, n: &mut u32| {
        if *n > 0 {
            let mut b = n.to_le_bytes().to_vec();
            b.append(p);
            blocks.push(b);
            *n = 0;
        }
    };
    for (id, values) in entries {
        p.extend_from_slice(&id.to_le_bytes());
        let m = u32::try_from(values.len())
            .ok()
            .filter(|&m| m <= MAX_FIELDS)
            .ok_or_else(|| too_many("fields in an event"))?;
        p.extend_from_slice(&m.to_le_bytes());
        for v in values {
            match v {
                FieldValue::Int(i) => {
                    p.push(VALUE_INT);
                    p.extend_from_slice(&i.to_le_bytes());
                }
                FieldValue::Str(s) => {
                    p.push(VALUE_STR);
                    put_str(&mut p, s)?;
                }
                FieldValue::Unread => p.push(VALUE_UNREAD),
            }
        }
        n += 1;
        // Well below `MAX_BLOCK`: an entry's strings are bounded when read.
        if n as usize >= MAX_BLOCK_ENTRIES || p.len() >= 16 << 20 {
            done(&mut p, &mut n);
        }
    }
    done(&mut p, &mut n);
    Ok(blocks)
}

/// A `FLDS` block's entries, into `fields`: each names arguments saved
/// before it (`args`: how many), once.
pub(super) fn read_fields_block<R: io::Read>(
    r: &Reader<'_, R>,
    payload: &[u8],
    args: usize,
    fields: &mut BTreeMap<u64, Vec<FieldValue>>,
) -> Result<(), TraceFileError> {
    let mut sub = Reader::block(r, payload, Section::Fields);
    let n = sub.u32()?;
    // Each entry is at least its id and count.
    sub.need(u64::from(n) * 12, &format!("{n} events' fields"))?;
    for _ in 0..n {
        let id = sub.u64()?;
        if id == 0 || id > args as u64 || fields.contains_key(&id) {
            return Err(sub.corrupt(format!(
                "fields of arguments {id}, but {args} are saved before them (each named once)"
            )));
        }
        let m = sub.u32()?;
        if m > MAX_FIELDS {
            return Err(sub.corrupt(format!("{m} fields (at most {MAX_FIELDS})")));
        }
        let mut values = Vec::with_capacity(m as usize);
        for _ in 0..m {
            values.push(match sub.u8()? {
                VALUE_INT => FieldValue::Int(sub.u64()? as i64),
                VALUE_STR => FieldValue::Str(sub.string("a field's value")?),
                VALUE_UNREAD => FieldValue::Unread,
                t => return Err(sub.corrupt(format!("a field value tagged {t}"))),
            });
        }
        fields.insert(id, values);
    }
    if sub.pos != sub.actual {
        return Err(sub.corrupt(format!("{} bytes after the fields", sub.actual - sub.pos)));
    }
    Ok(())
}
