//! Machine-readable outputs: `--format json`, `--format csv`,
//! `--format chrome` and `--format folded`.
//!
//! - **json**: the report as one JSON document, schema `vmtrace-report/1`
//!   (described by [`JSON_SCHEMA`]). Counts are exact; callers come from the
//!   stored events; function-graph traces add durations, traces with guest
//!   tasks each task's stored calls (`tasks`), traces with values each
//!   function's most frequent return values and what cannot be shown,
//!   traces with kernel stacks (`--stack`) every distinct stack (`stacks`)
//!   and each stack function's stacks with their calls, traces of events
//!   (`-e`) each event's count, stored records per task and each record's
//!   fields by name (`trace_events`).
//! - **csv**: one row per stored event (see [`write_csv`]), with its guest
//!   task when the trace has them, and its arguments or return value.
//! - **chrome**: Chrome trace-event JSON, for Perfetto UI (ui.perfetto.dev)
//!   and `chrome://tracing`: one track per vCPU (with guest tasks, the
//!   guest's processes and threads: `tracks`), one instant event per stored
//!   function entry, or in function-graph traces one complete event per
//!   call (see [`write_chrome`]).
//! - **folded**: folded stacks of a function-graph trace, for
//!   flamegraph.pl, inferno and speedscope (see [`write_folded`]).
//!
//! All of them render a `report::Report` of the whole trace (every vCPU;
//! `--sort`, `--cpu` and `-g` shape the text report only). The csv writer,
//! and the chrome writer of entry-only traces, stream: memory does not grow
//! with the number of events (a function graph is built in memory).
//!
//! Events counted but not stored (`dropped`) are in the JSON report and in
//! the Chrome trace's `otherData` (plus a `process_labels` metadata event
//! when there are any); the CSV holds events only, so whoever writes it must
//! say so elsewhere (vmtrace prints a line on stderr).
//!
//! [`file`] is how every output file is written: checked before a run,
//! replaced atomically, never clobbering what is not a regular file.

use std::collections::HashMap;
use std::io::{self, BufWriter, Write};

use serde_json::{json, Map, Value};

use crate::kernel::symbols::Symbol;
use crate::trace::graph::{End, Frame};
use crate::trace::model::Trace;
use crate::trace::report::{task_rows, Caller, Report, ReportOptions, Row, Sort};
use crate::trace::values;

/// Return values the JSON report keeps per function: the most frequent.
pub const RETURN_VALUES_TOP: usize = 8;

/// The `schema` field of the JSON report.
pub const SCHEMA_ID: &str = "vmtrace-report/1";

/// JSON Schema (draft 2020-12) of the JSON report. Fields may be added in
/// later versions of `vmtrace-report/1`; none will be removed or change type.
pub const JSON_SCHEMA: &str = include_str!("../../../docs/vmtrace-report.schema.json");

/// The JSON report (schema [`SCHEMA_ID`], described by [`JSON_SCHEMA`]).
pub fn to_json(trace: &Trace) -> Value {
    let m = &trace.meta;
    let report = Report::new(trace, &ReportOptions::whole_trace());
    let returned = values::return_counts(trace, RETURN_VALUES_TOP);
    let stack_funcs = crate::trace::report::stacks::func_stacks(trace, None);
    let functions: Vec<Value> = report
        .functions()
        .map(|row| {
            let mut v = function_json(&report, row);
            values_json(&mut v, trace, row.index, &returned);
            stacks_json::function_stacks(&mut v, &stack_funcs, row.index);
            v
        })
        .collect();
    let mut doc = json!({
        "schema": SCHEMA_ID,
        "kernel": m.kernel,
        "build_id": m.build_id,
        "cpus": m.cpus,
        "duration_s": trace.duration_s(),
        "attach_ns": m.attach_ns,
        "detach_ns": m.detach_ns,
        "functions": functions,
        "events": m.events_total,
        "events_stored": report.entries_stored,
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
    });
    optional_json(&mut doc, trace, &report);
    doc
}

/// One function of the JSON report: its counts, callers and (function
/// graph) durations.
fn function_json(report: &Report, row: &Row) -> Value {
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
    let mut v = json!({
        "name": f.name,
        "addr": format!("{:#x}", f.addr),
        "size": f.size,
        "count": row.total,
        "per_cpu": per_cpu,
        "callers": callers,
    });
    if let Some(d) = row.durations {
        for (k, n) in [
            ("returns", row.returns),
            ("returned", d.returned),
            ("not_returned", row.not_returned),
            ("total_ns", d.total_ns),
            ("self_ns", d.self_ns),
            ("min_ns", d.min_ns),
            ("max_ns", d.max_ns),
            ("avg_ns", d.avg_ns()),
        ] {
            v[k] = n.into();
        }
    }
    v
}

/// A function's values (`--args`, `--retval`), when there is something to
/// say: `return_values`, its most frequent return values as printed
/// (`{"value": "-2 (-ENOENT)", "count": N}`, most first), and `unshown`,
/// what of its arguments and return value cannot be shown.
fn values_json(v: &mut Value, trace: &Trace, func: usize, returned: &[Vec<values::ReturnCount>]) {
    if let Some(r) = returned.get(func).filter(|r| !r.is_empty()) {
        let list: Vec<Value> = r
            .iter()
            .map(|c| json!({ "value": c.value, "count": c.count }))
            .collect();
        v["return_values"] = Value::Array(list);
    }
    let unshown = values::unshown(trace, func as u32);
    if !unshown.is_empty() {
        v["unshown"] = json!(unshown);
    }
}

/// The JSON report's fields present only when there is something to say:
/// older readers (and the golden files) see the same document as before.
fn optional_json(doc: &mut Value, trace: &Trace, report: &Report) {
    let m = &trace.meta;
    if !m.lost.is_empty() {
        doc["lost"] = json!(m.lost);
    }
    if !m.drops.is_empty() {
        let d = &m.drops;
        doc["drops"] = json!({
            "ring_full": d.ring_full,
            "held": d.held,
            "ring_asked": d.ring_asked,
            "ring_given": d.ring_given,
            "over_budget": d.over_budget,
            "overwritten": d.overwritten,
        });
    }
    if m.overwrite {
        doc["overwrite"] = json!(true);
    }
    if m.incomplete {
        doc["incomplete"] = json!(true);
    }
    if !m.vmm.is_empty() {
        doc["vmm"] = json!(m.vmm);
    }
    if !m.symbols.is_empty() {
        doc["symbols"] = json!(m.symbols);
    }
    if !m.cmdline.is_empty() {
        doc["cmdline"] = json!(m.cmdline);
    }
    if m.unfinished > 0 {
        // Calls not in `events`: their function is unknown.
        doc["unfinished"] = json!(m.unfinished);
    }
    if !m.rejected_sites.is_empty() {
        doc["rejected_sites"] = json!(m.rejected_sites);
    }
    if !m.shown.is_empty() {
        doc["shown"] = json!(m.shown);
    }
    if let Some(per_cpu) = &m.guest_instructions_emulated {
        let by_cpu: Map<String, Value> = per_cpu
            .iter()
            .enumerate()
            .map(|(c, &n)| (c.to_string(), Value::from(n)))
            .collect();
        doc["guest_instructions_emulated"] = json!({
            "total": per_cpu.iter().sum::<u64>(),
            "per_cpu": by_cpu,
        });
    }
    if let Some((virt, phys)) = m.kernel_offset {
        doc["kernel_offset"] = json!({ "virt": virt, "phys": phys });
    }
    tasks_json(doc, trace);
    stacks_json::stacks_json(doc, trace);
    events_json::events_json(doc, trace);
    if m.args || m.retval {
        doc["values"] = json!({ "args": m.args, "retval": m.retval });
    }
    if let Some(g) = &report.graph_summary {
        doc["graph"] = json!({
            "returns": g.returns,
            "returns_stored": g.returns_stored,
            "returns_dropped": g.returns_dropped,
            "frames": g.frames,
            "returned": g.returned,
            "abandoned": g.abandoned,
            "lost_returns": g.lost,
            "running": g.running,
            "unhooked_stored": g.unhooked_stored,
            "unhooked": g.unhooked,
            "unmatched_returns": g.unmatched_returns,
            "mismatched_returns": g.mismatched_returns,
            "tsc_khz": m.tsc_khz,
        });
    }
}

/// The guest tasks, when the trace knows them: `tasks` (each task's stored
/// calls and the functions it called), `tasks_unknown` (stored calls whose
/// task is not known) and `tasks_source` (where they came from, or why
/// there are none).
fn tasks_json(doc: &mut Value, trace: &Trace) {
    if !trace.meta.tasks.is_empty() {
        doc["tasks_source"] = json!(trace.meta.tasks);
        doc["filtered"] = json!(trace.meta.filtered);
    }
    if trace.tasks.is_empty() {
        return;
    }
    let rows = task_rows(trace, None, Sort::Count);
    let mut unknown = 0;
    let mut tasks = Vec::new();
    for r in &rows {
        let Some(t) = r.task else {
            unknown = r.count;
            continue;
        };
        let functions: Vec<Value> = r
            .functions
            .iter()
            .map(|&(f, n)| json!({ "name": trace.functions[f as usize].name, "count": n }))
            .collect();
        tasks.push(json!({
            "pid": t.pid,
            "tgid": t.tgid,
            "comm": t.comm,
            "count": r.count,
            "functions": functions,
        }));
    }
    doc["tasks"] = Value::Array(tasks);
    doc["tasks_unknown"] = json!(unknown);
}

/// Writes [`to_json`], pretty-printed, with a final newline.
pub fn write_json(trace: &Trace, w: impl Write) -> io::Result<()> {
    let mut w = BufWriter::new(w);
    serde_json::to_writer_pretty(&mut w, &to_json(trace))?;
    w.write_all(b"\n")?;
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
/// {"name":"thread_name","ph":"M","pid":1,"tid":1,"args":{"name":"vCPU 0"}},
/// {"name":"thread_sort_index","ph":"M","pid":1,"tid":1,"args":{"sort_index":0}},
/// {"name":"schedule","ph":"i","s":"t","ts":12.345,"pid":1,"tid":1,"args":{"caller":"worker_thread"}},
/// ...
/// ],"displayTimeUnit":"ns","otherData":{"events":N,"events_stored":N,"dropped":N}}
/// ```
///
/// One thread (track) per vCPU, `tid` = vCPU number + 1 (Perfetto takes
/// tid 0 for the idle task), named `vCPU N`; a trace with guest tasks has
/// a process per tgid and a thread per pid instead (see `tracks`). `ts` is
/// in microseconds since the attach, with nanosecond precision. The caller is `[unknown] 0x…`
/// when the return address is in no known function.
///
/// Entry-only traces: one thread-scoped instant event (`"ph":"i"`) per
/// stored function entry.
///
/// Function-graph traces: one complete event (`"ph":"X"`, `dur` in µs
/// with ns precision) per stored call that returned, in entry order, on the
/// track of the vCPU it was entered on; a call that returned on another
/// vCPU stays there (Perfetto draws a slice on one track) and has
/// `"return_cpu"` in its args. A call that did not return is an instant
/// event at its entry with `"end"`: `abandoned`, `lost` (it returned, its
/// return was not stored), `running` (at detach, or its return was not
/// stored after the last stored event on its stack) or `unhooked` (rather than a `B` without an
/// `E`, which would swallow every later slice on its track).
///
/// With arguments (`--args`) an event's args hold `"args"`, the call's
/// arguments as `vmtrace script` prints them (`"(a=1, b=-2)"`); with
/// return values (`--retval`) a returned call's hold `"ret"`
/// (`"-2 (-ENOENT)"`; none for `void`).
///
/// `otherData` holds the exact number of entries counted, stored and
/// dropped (not stored: over `--max-events` or a full exitless ring), and
/// in function-graph traces `returns`, `returns_stored`, `returns_dropped`,
/// `abandoned`, `lost_returns`, `running`, `unhooked` and `unmatched_returns` (as in the
/// JSON report's `graph`); when some entries were dropped, a
/// `process_labels` metadata event says so on the process's track too.
pub fn write_chrome(trace: &Trace, w: impl Write) -> io::Result<()> {
    let mut w = BufWriter::with_capacity(1 << 20, w);
    let m = &trace.meta;
    let tracks = Tracks::new(trace);
    tracks.metadata(&mut w)?;
    let names: Vec<String> = trace.functions.iter().map(|f| json_str(&f.name)).collect();
    let mut callers = CallerNames::default();
    let mut entries_stored = 0u64;
    let mut graph_data = String::new();
    if m.graph {
        (entries_stored, graph_data) = chrome_frames(&mut w, trace, &tracks, &names, &mut callers)?;
    } else {
        for e in trace.events.iter().filter(|e| !e.is_return()) {
            let Some(name) = names.get(e.func as usize) else {
                continue;
            };
            entries_stored += 1;
            let (pid, tid) = tracks.of(e.task, e.cpu);
            write!(
                w,
                ",\n{{\"name\":{name},\"ph\":\"i\",\"s\":\"t\",\"ts\":{},\"pid\":{pid},\"tid\":{tid},\"args\":{{\"caller\":",
                since_attach(e.ts_ns, m.attach_ns),
            )?;
            callers.write(&mut w, trace, e.parent)?;
            if let Some(a) = values::entry_args(trace, e) {
                write!(w, ",\"args\":{}", json_str(&a))?;
            }
            if let Some(line) = trace.event_line(e) {
                // An event (`-e`): its fields as ftrace prints them.
                write!(w, ",\"event\":{}", json_str(&line))?;
            }
            w.write_all(b"}}")?;
        }
    }
    write!(
        w,
        "\n],\"displayTimeUnit\":\"ns\",\"otherData\":{{\"events\":{},\"events_stored\":{entries_stored},\"dropped\":{}{graph_data}}}}}\n",
        m.events_total, m.events_dropped
    )?;
    w.flush()
}

/// µs from the attach to `ts` (ns), with ns precision.
fn since_attach(ts: u64, attach_ns: u64) -> String {
    let rel = ts as i128 - attach_ns as i128;
    let sign = if rel < 0 { "-" } else { "" };
    let rel = rel.unsigned_abs();
    format!("{sign}{}.{:03}", rel / 1000, rel % 1000)
}

/// A function-graph trace's calls as Chrome events, each on the track of
/// its entry's task (or vCPU): complete events for those that returned,
/// instant ones for the others. Returns the stored
/// entries and the graph's summary for `otherData`.
fn chrome_frames(
    w: &mut impl Write,
    trace: &Trace,
    tracks: &Tracks,
    names: &[String],
    callers: &mut CallerNames,
) -> io::Result<(u64, String)> {
    let report = Report::new(trace, &ReportOptions::default());
    let g = report.graph.as_ref().expect("a graph trace has a graph");
    for f in &g.frames {
        let name = names.get(f.func as usize).map_or("\"?\"", String::as_str);
        let ts = since_attach(f.entry_ns, trace.meta.attach_ns);
        let (pid, tid) = tracks.of(f.task, f.cpu);
        match f.end {
            End::Returned { ts_ns, cpu } => {
                let dur = ts_ns.saturating_sub(f.entry_ns);
                write!(
                    w,
                    ",\n{{\"name\":{name},\"ph\":\"X\",\"ts\":{ts},\"dur\":{}.{:03},\"pid\":{pid},\"tid\":{tid},\"args\":{{\"caller\":",
                    dur / 1000,
                    dur % 1000
                )?;
                callers.write(w, trace, f.caller)?;
                if cpu != f.cpu {
                    write!(w, ",\"return_cpu\":{cpu}")?;
                }
                frame_values(w, trace, f, true)?;
            }
            end => {
                write!(
                    w,
                    ",\n{{\"name\":{name},\"ph\":\"i\",\"s\":\"t\",\"ts\":{ts},\"pid\":{pid},\"tid\":{tid},\"args\":{{\"caller\":"
                )?;
                callers.write(w, trace, f.caller)?;
                let end = match end {
                    End::Abandoned => "abandoned",
                    End::Lost => "lost",
                    End::Unhooked => "unhooked",
                    _ => "running",
                };
                write!(w, ",\"end\":\"{end}\"")?;
                frame_values(w, trace, f, false)?;
            }
        }
        w.write_all(b"}}")?;
    }
    let mut graph_data = String::new();
    if let Some(s) = &report.graph_summary {
        graph_data = format!(
            ",\"returns\":{},\"returns_stored\":{},\"returns_dropped\":{},\"abandoned\":{},\"lost_returns\":{},\"running\":{},\"unhooked\":{},\"unmatched_returns\":{}",
            s.returns,
            s.returns_stored,
            s.returns_dropped,
            s.abandoned,
            s.lost,
            s.running,
            s.unhooked,
            s.unmatched_returns
        );
    }
    Ok((report.entries_stored, graph_data))
}

/// A call's arguments (`"args":"(a=1, ...)"`) and, if it `returned`,
/// its return value (`"ret":"-2 (-ENOENT)"`), into a Chrome event's args.
fn frame_values(w: &mut impl Write, trace: &Trace, f: &Frame, returned: bool) -> io::Result<()> {
    if let Some(a) = values::args_by_id(trace, f.func, f.args) {
        write!(w, ",\"args\":{}", json_str(&a))?;
    }
    if let Some(r) = returned
        .then(|| values::return_value(trace, f.func, f.ret))
        .flatten()
    {
        write!(w, ",\"ret\":{}", json_str(&r))?;
    }
    Ok(())
}

/// Callers' names as JSON strings, each quoted once.
#[derive(Default)]
struct CallerNames(HashMap<*const Symbol, String>);

impl CallerNames {
    /// Writes the caller of return address `ip` as a JSON string.
    fn write(&mut self, w: &mut impl Write, trace: &Trace, ip: u64) -> io::Result<()> {
        match Caller::of(trace, ip) {
            Caller::Known(s) => {
                let c = self
                    .0
                    .entry(s as *const Symbol)
                    .or_insert_with(|| json_str(&s.name));
                w.write_all(c.as_bytes())
            }
            Caller::Unknown(ip) => write!(w, "\"[unknown] {ip:#x}\""),
        }
    }
}

mod csv;
mod events_json;
mod folded;
pub mod script;
pub mod script_fields;
mod stacks_json;
pub mod tracedat;
mod tracks;
pub use csv::write_csv;
pub use folded::write_folded;
pub use tracedat::write_tracedat;
use tracks::Tracks;
pub use tracks::{IDLE_TID, PID_LIMIT, UNKNOWN_PID};

#[cfg(test)]
mod tests {
    use super::*;

    /// `guest_instructions_emulated`: absent unless KVM counted; then the
    /// total and every vCPU's, as the schema describes them (the full
    /// schema check is in tests/report_export.rs).
    #[test]
    fn guest_instructions_emulated_as_the_schema_says() {
        let mut t = Trace::synthetic(10);
        assert!(to_json(&t).get("guest_instructions_emulated").is_none());
        t.meta.guest_instructions_emulated = Some(vec![1000, 0, 5, 7]);
        let v = to_json(&t);
        let g = &v["guest_instructions_emulated"];
        assert_eq!(g["total"], 1012);
        let per_cpu = g["per_cpu"].as_object().unwrap();
        let keys: Vec<&str> = per_cpu.keys().map(String::as_str).collect();
        assert_eq!(keys.len(), 4);
        for (cpu, n) in ["0", "1", "2", "3"].iter().zip([1000, 0, 5, 7]) {
            assert_eq!(per_cpu[*cpu], n);
        }

        let schema: Value = serde_json::from_str(JSON_SCHEMA).unwrap();
        let optional = !schema["required"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r == "guest_instructions_emulated");
        assert!(optional);
        let s = &schema["properties"]["guest_instructions_emulated"];
        assert_eq!(s["type"], "object");
        for r in s["required"].as_array().unwrap() {
            assert!(g.get(r.as_str().unwrap()).is_some(), "{r}");
        }
        assert_eq!(s["properties"]["total"]["type"], "integer");
        let p = &s["properties"]["per_cpu"];
        assert_eq!(p["type"], "object");
        assert_eq!(p["propertyNames"]["pattern"], "^(0|[1-9][0-9]*)$");
        assert_eq!(p["additionalProperties"]["type"], "integer");
        assert!(per_cpu.values().all(Value::is_u64));
        assert!(g
            .as_object()
            .unwrap()
            .keys()
            .all(|k| s["properties"].get(k).is_some()));
    }
}
