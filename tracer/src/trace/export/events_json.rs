//! The JSON report's traced events (`-e`): `trace_events`, one object per
//! event traced with its fields, its exact count, its stored records per
//! task, and each stored record's fields by name.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use crate::kernel::events::field_values::print_value;
use crate::trace::fields::{EventFormat, FieldValue, Print};
use crate::trace::model::{Event, Trace};

/// A field's value in JSON: a number where ftrace prints one in decimal,
/// `true`/`false` for a bool, else the string ftrace prints (hex, task
/// state letters, names); null when it could not be read.
fn value(print: Print, v: &FieldValue) -> Value {
    match (print, v) {
        (_, FieldValue::Unread) => Value::Null,
        (_, FieldValue::Str(s)) => json!(s),
        (Print::Int, FieldValue::Int(n)) => json!(*n as i32),
        (Print::Long, FieldValue::Int(n)) => json!(n),
        (Print::Unsigned, FieldValue::Int(n)) => json!(*n as u64),
        (Print::Cpu, FieldValue::Int(n)) => json!(*n as i32),
        (Print::Bool, FieldValue::Int(n)) => json!(n & 1 != 0),
        (p, v) => json!(print_value(p, v)),
    }
}

/// One record's fields by name.
fn fields(format: &EventFormat, values: &[FieldValue]) -> Map<String, Value> {
    let each = format.fields.iter().zip(values);
    each.map(|(f, v)| (f.name.clone(), value(f.print, v)))
        .collect()
}

/// One stored record: time, vCPU, task, fields.
fn record(trace: &Trace, e: &Event, format: &EventFormat, values: &[FieldValue]) -> Value {
    let mut r = json!({ "ts_ns": e.ts_ns, "cpu": e.cpu });
    if let Some(t) = trace.task_of(e) {
        r["pid"] = json!(t.pid);
        r["comm"] = json!(t.comm);
    }
    r["fields"] = Value::Object(fields(format, values));
    r
}

/// `trace_events` into `doc`, when the trace has events' formats.
pub(super) fn events_json(doc: &mut Value, trace: &Trace) {
    if trace.fields.formats.is_empty() && trace.fields.return_formats.is_empty() {
        return;
    }
    let mut out = Vec::new();
    for (func, ret, format) in trace.fields.all_formats() {
        let mut records = Vec::new();
        // Stored records per task (pid, comm), by the task that ran them.
        let mut tasks: BTreeMap<(u32, String), u64> = BTreeMap::new();
        let stored = trace
            .events
            .iter()
            .filter(|e| e.func as usize == func && e.is_return() == ret);
        for e in stored {
            let task = trace.task_of(e).map(|t| (t.pid, t.comm.clone()));
            *tasks.entry(task.unwrap_or_default()).or_default() += 1;
            if let Some((f, v)) = trace.fields_of(e) {
                records.push(record(trace, e, f, &v));
            }
        }
        let tasks: Vec<Value> = tasks
            .into_iter()
            .map(|((pid, comm), n)| json!({ "pid": pid, "comm": comm, "count": n }))
            .collect();
        let counts = match ret {
            true => &trace.returns,
            false => &trace.counts,
        };
        let count: u64 = counts.get(func).map_or(0, |c| c.iter().sum());
        let names: Vec<&str> = format.fields.iter().map(|f| f.name.as_str()).collect();
        out.push(json!({
            "event": format.event,
            "function": trace.functions[func].name,
            "count": count,
            "fields": names,
            "ftrace_fields": format.covered,
            "tasks": tasks,
            "records": records,
        }));
    }
    doc["trace_events"] = Value::Array(out);
}
