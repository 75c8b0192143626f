//! Machine-readable outputs: `--format json`, `--format csv` and
//! `--format chrome`.
//!
//! - **json**: the report as one JSON document, schema `vmtrace-report/1`
//!   (described by [`JSON_SCHEMA`]). Counts are exact; callers come from the
//!   stored events.
//! - **csv**: one row per stored event (see [`write_csv`]).
//! - **chrome**: Chrome trace-event JSON, for Perfetto UI (ui.perfetto.dev)
//!   and `chrome://tracing`: one track per vCPU, one instant event per stored
//!   function entry (see [`write_chrome`]).
//!
//! All three render a `report::Report` of the whole trace (every vCPU;
//! `--sort`, `--cpu` and `-g` shape the text report only). The csv and
//! chrome writers stream: memory does not grow with the number of events.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::{self, BufWriter, Write};

use serde_json::{json, Map, Value};

use crate::model::Trace;
use crate::report::{Caller, EventRow, Report, ReportOptions};
use crate::symbols::Symbol;

/// The `schema` field of the JSON report.
pub const SCHEMA_ID: &str = "vmtrace-report/1";

/// JSON Schema (draft 2020-12) of the JSON report. Fields may be added in
/// later versions of `vmtrace-report/1`; none will be removed or change type.
pub const JSON_SCHEMA: &str = r##"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "title": "vmtrace report",
  "description": "Function-entry counts of a Linux guest kernel traced by vmtrace (vmtrace --format json).",
  "type": "object",
  "required": [
    "schema", "kernel", "build_id", "cpus", "duration_s", "functions",
    "events", "events_stored", "dropped", "sites_patched", "sites_skipped",
    "sites_skipped_init", "sites_skipped_other", "pause", "stop_reason"
  ],
  "properties": {
    "schema": { "const": "vmtrace-report/1", "description": "Name and version of this schema." },
    "kernel": { "type": "string", "description": "The kernel file the guest booted." },
    "build_id": { "type": ["string", "null"], "description": "GNU build id (hex) of the vmlinux the symbols came from, or null." },
    "cpus": { "type": "integer", "minimum": 0, "description": "Number of vCPUs." },
    "duration_s": { "type": "number", "minimum": 0, "description": "Seconds from attach to detach." },
    "attach_ns": { "type": "integer", "minimum": 0, "description": "Host CLOCK_MONOTONIC at attach, ns (the time base of the CSV's ts_ns)." },
    "detach_ns": { "type": "integer", "minimum": 0, "description": "Host CLOCK_MONOTONIC at detach, ns." },
    "events": { "type": "integer", "minimum": 0, "description": "Function entries counted (exact), stored or not." },
    "events_stored": { "type": "integer", "minimum": 0, "description": "Function entries stored with time, vCPU and caller." },
    "dropped": { "type": "integer", "minimum": 0, "description": "Function entries counted but not stored (over --max-events, or their exitless ring was full)." },
    "parent_unreadable": { "type": "integer", "minimum": 0, "description": "Stored entries whose return address could not be read (caller [unknown], addr 0x0)." },
    "sites_patched": { "type": "integer", "minimum": 0, "description": "ftrace call sites patched." },
    "sites_skipped": { "type": "integer", "minimum": 0, "description": "Selected sites left alone: sites_skipped_init + sites_skipped_other." },
    "sites_skipped_init": { "type": "integer", "minimum": 0, "description": "Sites skipped because they are in init text." },
    "sites_skipped_other": { "type": "integer", "minimum": 0, "description": "Sites skipped because they held neither a NOP nor a call to __fentry__." },
    "pause": {
      "type": "object",
      "required": ["attach_window_us", "attach_latency_us"],
      "properties": {
        "attach_window_us": { "type": "number", "minimum": 0, "description": "The attach's stop-the-world window, microseconds." },
        "attach_latency_us": { "type": "number", "minimum": 0, "description": "Attach latency, microseconds." }
      }
    },
    "stop_reason": { "type": "string", "description": "Why the guest stopped." },
    "mode": { "enum": ["trap", "exitless", null], "description": "How traced calls reached vmtrace: an exit each (trap), or vmtrace's trampoline and rings in the guest (exitless); null if unknown." },
    "trap_exits": { "type": "integer", "minimum": 0, "description": "Exits at vmtrace's trace port while attached (0 in exitless mode)." },
    "functions": {
      "type": "array",
      "description": "Every traced function, most calls first, ties by name.",
      "items": {
        "type": "object",
        "required": ["name", "addr", "count", "per_cpu", "callers"],
        "properties": {
          "name": { "type": "string" },
          "addr": { "type": "string", "pattern": "^0x[0-9a-f]+$", "description": "Start address, hex." },
          "size": { "type": "integer", "minimum": 0, "description": "Size in bytes." },
          "count": { "type": "integer", "minimum": 0, "description": "Calls on all vCPUs (exact)." },
          "per_cpu": {
            "type": "object",
            "description": "Calls per vCPU, keyed by vCPU number; every vCPU is present.",
            "propertyNames": { "pattern": "^(0|[1-9][0-9]*)$" },
            "additionalProperties": { "type": "integer", "minimum": 0 }
          },
          "callers": {
            "type": "array",
            "description": "Callers among the stored calls, most first; the counts add up to the function's stored calls.",
            "items": {
              "type": "object",
              "required": ["name", "count"],
              "properties": {
                "name": { "type": "string", "description": "The caller function, or \"[unknown]\" when the return address is in no known function." },
                "addr": { "type": "string", "pattern": "^0x[0-9a-f]+$", "description": "Only for [unknown]: the return address (0x0: unreadable)." },
                "count": { "type": "integer", "minimum": 0 }
              }
            }
          }
        }
      }
    }
  }
}
"##;

/// The JSON report (schema [`SCHEMA_ID`], described by [`JSON_SCHEMA`]).
pub fn to_json(trace: &Trace) -> Value {
    let m = &trace.meta;
    let report = Report::new(trace, &ReportOptions::whole_trace());
    let functions: Vec<Value> = report
        .functions()
        .map(|row| {
            let f = row.func;
            let per_cpu: Map<String, Value> = report
                .cpus
                .iter()
                .zip(&row.per_cpu)
                .map(|(c, &n)| (c.to_string(), Value::from(n)))
                .collect();
            let callers: Vec<Value> = row
                .callers
                .iter()
                .map(|c| match c.caller {
                    Caller::Known(s) => json!({ "name": s.name, "count": c.count }),
                    Caller::Unknown(ip) => {
                        json!({ "name": "[unknown]", "addr": format!("{ip:#x}"), "count": c.count })
                    }
                })
                .collect();
            json!({
                "name": f.name,
                "addr": format!("{:#x}", f.addr),
                "size": f.size,
                "count": row.total,
                "per_cpu": per_cpu,
                "callers": callers,
            })
        })
        .collect();
    json!({
        "schema": SCHEMA_ID,
        "kernel": m.kernel,
        "build_id": m.build_id,
        "cpus": m.cpus,
        "duration_s": trace.duration_s(),
        "attach_ns": m.attach_ns,
        "detach_ns": m.detach_ns,
        "functions": functions,
        "events": m.events_total,
        "events_stored": trace.events.len() as u64,
        "dropped": m.events_dropped,
        "parent_unreadable": m.parent_unreadable,
        "sites_patched": m.sites_patched,
        "sites_skipped": m.sites_skipped_init + m.sites_skipped_other,
        "sites_skipped_init": m.sites_skipped_init,
        "sites_skipped_other": m.sites_skipped_other,
        "pause": {
            "attach_window_us": m.attach_window_ns as f64 / 1e3,
            "attach_latency_us": m.attach_latency_ns as f64 / 1e3,
        },
        "stop_reason": m.stop_reason,
        // Unknown (a trace built without a run): null, like build_id.
        "mode": (!m.mode.is_empty()).then_some(&m.mode),
        "trap_exits": m.trap_exits,
    })
}

/// Writes [`to_json`], pretty-printed, with a final newline.
pub fn write_json(trace: &Trace, w: impl Write) -> io::Result<()> {
    let mut w = BufWriter::new(w);
    serde_json::to_writer_pretty(&mut w, &to_json(trace))?;
    w.write_all(b"\n")?;
    w.flush()
}

/// Quotes a CSV field if it holds a comma, a double quote, CR or LF (RFC 4180).
fn csv_field(s: &str) -> Cow<'_, str> {
    if s.contains([',', '"', '\r', '\n']) {
        Cow::Owned(format!("\"{}\"", s.replace('"', "\"\"")))
    } else {
        Cow::Borrowed(s)
    }
}

/// Writes one row per stored event, in time order, after the header
/// `ts_ns,cpu,function,addr,parent,caller`:
///
/// - `ts_ns`: host `CLOCK_MONOTONIC`, nanoseconds (absolute; the JSON
///   report's `attach_ns` is the attach time on the same clock);
/// - `cpu`: vCPU number;
/// - `function`: the traced function; `addr`: its start address (hex);
/// - `parent`: the return address in the caller (hex; `0x0` if unreadable);
/// - `caller`: the function `parent` falls in, empty if unknown.
///
/// Lines end with `\n`; fields are quoted per RFC 4180 when needed.
pub fn write_csv(trace: &Trace, w: impl Write) -> io::Result<()> {
    let mut w = BufWriter::with_capacity(1 << 20, w);
    w.write_all(b"ts_ns,cpu,function,addr,parent,caller\n")?;
    let names: Vec<Cow<str>> = trace.functions.iter().map(|f| csv_field(&f.name)).collect();
    let report = Report::new(trace, &ReportOptions::default());
    for EventRow {
        event: e,
        func,
        caller,
    } in report.events()
    {
        let caller = match caller {
            Caller::Known(s) => csv_field(&s.name),
            Caller::Unknown(_) => Cow::Borrowed(""),
        };
        writeln!(
            w,
            "{},{},{},{:#x},{:#x},{}",
            e.ts_ns, e.cpu, names[e.func as usize], func.addr, e.parent, caller
        )?;
    }
    w.flush()
}

/// A JSON string literal, quotes included.
fn json_str(s: &str) -> String {
    Value::from(s).to_string()
}

/// Writes a Chrome trace-event JSON document:
///
/// ```json
/// {"traceEvents":[
/// {"name":"process_name","ph":"M","pid":1,"tid":0,"args":{"name":"vmtrace: KERNEL"}},
/// {"name":"thread_name","ph":"M","pid":1,"tid":0,"args":{"name":"vCPU 0"}},
/// {"name":"thread_sort_index","ph":"M","pid":1,"tid":0,"args":{"sort_index":0}},
/// {"name":"schedule","ph":"i","s":"t","ts":12.345,"pid":1,"tid":0,"args":{"caller":"worker_thread"}},
/// ...
/// ],"displayTimeUnit":"ns"}
/// ```
///
/// One thread (track) per vCPU (`tid` = vCPU number), one thread-scoped
/// instant event per stored function entry; `ts` is in microseconds since
/// the attach, with nanosecond precision. The caller is `[unknown] 0x…`
/// when the return address is in no known function.
pub fn write_chrome(trace: &Trace, w: impl Write) -> io::Result<()> {
    let mut w = BufWriter::with_capacity(1 << 20, w);
    let m = &trace.meta;
    w.write_all(b"{\"traceEvents\":[\n")?;
    write!(
        w,
        "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,\"args\":{{\"name\":{}}}}}",
        json_str(&format!("vmtrace: {}", m.kernel))
    )?;
    for cpu in 0..m.cpus {
        write!(
            w,
            ",\n{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":{cpu},\"args\":{{\"name\":\"vCPU {cpu}\"}}}}\
             ,\n{{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":1,\"tid\":{cpu},\"args\":{{\"sort_index\":{cpu}}}}}"
        )?;
    }
    let names: Vec<String> = trace.functions.iter().map(|f| json_str(&f.name)).collect();
    let mut caller_names: HashMap<*const Symbol, String> = HashMap::new();
    let report = Report::new(trace, &ReportOptions::default());
    for EventRow {
        event: e, caller, ..
    } in report.events()
    {
        let name = &names[e.func as usize];
        let rel = e.ts_ns as i128 - m.attach_ns as i128;
        let sign = if rel < 0 { "-" } else { "" };
        let rel = rel.unsigned_abs();
        write!(
            w,
            ",\n{{\"name\":{name},\"ph\":\"i\",\"s\":\"t\",\"ts\":{sign}{}.{:03},\"pid\":1,\"tid\":{},\"args\":{{\"caller\":",
            rel / 1000,
            rel % 1000,
            e.cpu
        )?;
        match caller {
            Caller::Known(s) => {
                let c = caller_names
                    .entry(s as *const Symbol)
                    .or_insert_with(|| json_str(&s.name));
                w.write_all(c.as_bytes())?;
            }
            Caller::Unknown(ip) => write!(w, "\"[unknown] {ip:#x}\"")?,
        }
        w.write_all(b"}}")?;
    }
    w.write_all(b"\n],\"displayTimeUnit\":\"ns\"}\n")?;
    w.flush()
}
