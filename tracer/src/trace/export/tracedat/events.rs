//! The traced events (`-e`) in a trace.dat: each event's `format` in the
//! file's event systems, and each recorded event as its record, so that
//! `trace-cmd report` prints `sched_switch: prev_comm=... ==> next_comm=...`
//! as the guest's own ftrace would have.
//!
//! An event whose ftrace format vmtrace read from the kernel image
//! (`EventFormat::ftrace`, covered events: vmtrace computes the fields
//! `TP_fast_assign` would) is written with that format, the guest's own
//! print format included, and its record holds each field at the
//! kernel's offset and size: integers little-endian, `char[N]` arrays NUL
//! padded, `__data_loc` strings after the fixed part (the `u32` holds
//! their length, NUL included, in its high 16 bits and their offset from
//! the record's start in its low 16). Any other event (its arguments, raw)
//! gets a format of vmtrace's own, one field per value, whose print format
//! prints what `vmtrace script` prints.
//!
//! Ids: the guest's (`FtraceFormat::id`) when known, else numbers past
//! those, from [`FIRST_ID`]; the file names each once.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use super::{common, format_file, Field as FileField, COMMON_SIZE};
use crate::kernel::events::ftrace_format::FtraceField;
use crate::trace::fields::{EventFormat, FieldValue, Print};
use crate::trace::model::Trace;

/// The first id given to an event whose guest id is not known: past the
/// ids of ftrace's own entries (`enum trace_type`, kernel/trace/trace.h).
const FIRST_ID: u16 = 32;
/// Largest record written (a page holds it whole).
const MAX_RECORD: usize = super::MAX_PAYLOAD;

/// How one event's records are written.
struct Layout {
    id: u16,
    fields: Vec<FtraceField>,
    /// For each field, the index of vmtrace's value of the same name.
    values: Vec<Option<usize>>,
    /// End of the fixed part.
    size: usize,
}

/// The events' formats, by system, and how to write their records.
#[derive(Default)]
pub(super) struct EventRecords {
    /// By function, and whether the event is its return's.
    by_func: HashMap<(u32, bool), Layout>,
    /// System name → its events' `format` texts.
    pub(super) systems: BTreeMap<String, Vec<String>>,
}

/// vmtrace's own format of an event: its fields in order, each by how it
/// prints, and the print format that prints them as `script` does.
fn own_format(format: &EventFormat) -> (Vec<FtraceField>, String) {
    let mut offset = COMMON_SIZE as u32;
    let (mut fields, mut text, mut args) = (Vec::new(), String::new(), String::new());
    for f in &format.fields {
        let (ty, size, signed, conv) = match f.print {
            Print::Int => ("int", 4, true, "%d"),
            Print::Cpu => ("int", 4, true, "%03d"),
            Print::Long | Print::State => ("long", 8, true, "%ld"),
            Print::Unsigned => ("unsigned long", 8, false, "%lu"),
            Print::Hex => ("unsigned long", 8, false, "0x%lx"),
            Print::Word => ("unsigned long", 8, false, "0x%08lx"),
            Print::BareHex => ("unsigned long", 8, false, "%lx"),
            Print::Bool => ("unsigned long", 8, false, "%s"),
            Print::Str => ("__data_loc char[]", 4, true, "%s"),
        };
        offset = offset.next_multiple_of(size);
        if !text.is_empty() {
            text.push(' ');
        }
        let _ = write!(text, "{}={conv}", f.label);
        let _ = match f.print {
            Print::Str => write!(args, ", __get_str({})", f.name),
            Print::Bool => write!(args, ", REC->{} ? \"true\" : \"false\"", f.name),
            _ => write!(args, ", REC->{}", f.name),
        };
        fields.push(FtraceField {
            ty: ty.into(),
            name: f.name.clone(),
            offset,
            size,
            signed,
        });
        offset += size;
    }
    (fields, format!("\"{text}\"{args}"))
}

impl EventRecords {
    /// The formats of the events `trace` recorded fields of.
    pub(super) fn new(trace: &Trace) -> EventRecords {
        let mut out = EventRecords::default();
        let events: Vec<((u32, bool), &EventFormat)> = trace
            .fields
            .all_formats()
            .map(|(i, ret, f)| ((i as u32, ret), f))
            .collect();
        let mut used: Vec<u16> = events
            .iter()
            .filter_map(|(_, f)| f.ftrace.as_ref().map(|t| t.id))
            .filter(|&id| id != 0)
            .collect();
        let mut next = FIRST_ID;
        for (func, format) in events {
            let (fields, print_fmt, known) = match &format.ftrace {
                Some(t) if format.covered => (t.fields.clone(), t.print_fmt.clone(), t.id),
                _ => {
                    let (f, p) = own_format(format);
                    (f, p, 0)
                }
            };
            let id = match known {
                0 => {
                    while used.contains(&next) || [1, 4, 10, 11].contains(&next) {
                        next += 1;
                    }
                    used.push(next);
                    next
                }
                id => id,
            };
            let values = fields
                .iter()
                .map(|f| format.fields.iter().position(|v| v.name == f.name))
                .collect();
            let size = fields
                .iter()
                .map(|f| (f.offset + f.size) as usize)
                .max()
                .unwrap_or(COMMON_SIZE);
            let (system, name) = format.event.split_once(':').unwrap_or(("", &format.event));
            let decl: Vec<((&str, String), &FtraceField)> =
                fields.iter().map(|f| (f.declaration(), f)).collect();
            let file_fields: Vec<FileField> = decl
                .iter()
                .map(|((ty, name), f)| (*ty, name.as_str(), f.offset, f.size, f.signed))
                .collect();
            let text = format_file(name, id, &file_fields, &print_fmt);
            out.systems
                .entry(system.to_string())
                .or_default()
                .push(text);
            out.by_func.insert(
                func,
                Layout {
                    id,
                    fields,
                    values,
                    size,
                },
            );
        }
        out
    }

    /// Whether function `func`'s entries (or with `ret` its returns)
    /// record an event.
    pub(super) fn is_event(&self, func: u32, ret: bool) -> bool {
        self.by_func.contains_key(&(func, ret))
    }

    /// Entry (or with `ret` return) `func`'s record with `values` by pid
    /// `pid` into `p`, if it is an event's.
    pub(super) fn record(
        &self,
        (func, ret): (u32, bool),
        values: &[FieldValue],
        pid: u32,
        p: &mut Vec<u8>,
    ) -> bool {
        let Some(l) = self.by_func.get(&(func, ret)) else {
            return false;
        };
        p.clear();
        common(p, l.id, pid);
        p.resize(l.size, 0);
        for (f, v) in l.fields.iter().zip(&l.values) {
            let v = v.and_then(|i| values.get(i)).unwrap_or(&FieldValue::Unread);
            let at = f.offset as usize;
            let size = f.size as usize;
            if f.is_data_loc() {
                let s = match v {
                    FieldValue::Str(s) => s.as_bytes(),
                    _ => b"",
                };
                let room = MAX_RECORD.saturating_sub(p.len() + 1);
                let s = &s[..s.len().min(room)];
                let loc = ((s.len() as u32 + 1) << 16) | p.len() as u32;
                p[at..at + 4].copy_from_slice(&loc.to_le_bytes());
                p.extend_from_slice(s);
                p.push(0);
                continue;
            }
            match v {
                FieldValue::Int(n) => {
                    let b = n.to_le_bytes();
                    p[at..at + size.min(8)].copy_from_slice(&b[..size.min(8)]);
                }
                // A `char[N]`: at most N - 1 bytes, NUL padded.
                FieldValue::Str(s) => {
                    let n = s.len().min(size.saturating_sub(1));
                    p[at..at + n].copy_from_slice(&s.as_bytes()[..n]);
                }
                FieldValue::Unread => {}
            }
        }
        true
    }
}
