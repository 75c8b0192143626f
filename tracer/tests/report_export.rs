//! `--format json|csv|chrome` on synthetic traces (no KVM needed).

#[path = "report_fixture.rs"]
mod fixture;

use std::collections::BTreeMap;

use serde_json::Value;
use tracer::trace::export::{to_json, write_chrome, write_csv, write_json, JSON_SCHEMA, SCHEMA_ID};
use tracer::trace::model::Trace;
use tracer::trace::report::escape;

/// Checks `v` against the parts of JSON Schema that `JSON_SCHEMA` uses:
/// `type`, `const`, `minimum`, `required`, `properties`,
/// `additionalProperties`, `propertyNames` / `pattern` (only `^0x[0-9a-f]+$`
/// and `^(0|[1-9][0-9]*)$`), `items`. Returns the first violation.
fn validate(schema: &Value, v: &Value, at: &str) -> Result<(), String> {
    let err = |what: String| Err(format!("{at}: {what}"));
    if let Some(t) = schema.get("type") {
        let types: Vec<&str> = match t {
            Value::String(s) => vec![s.as_str()],
            Value::Array(a) => a.iter().map(|x| x.as_str().unwrap()).collect(),
            _ => panic!("bad type in schema at {at}"),
        };
        let ok = types.iter().any(|t| match *t {
            "object" => v.is_object(),
            "array" => v.is_array(),
            "string" => v.is_string(),
            "integer" => v.is_u64() || v.is_i64(),
            "number" => v.is_number(),
            "boolean" => v.is_boolean(),
            "null" => v.is_null(),
            other => panic!("unknown type {other}"),
        });
        if !ok {
            return err(format!("{v} is not of type {t}"));
        }
    }
    if let Some(c) = schema.get("const") {
        if v != c {
            return err(format!("{v} is not {c}"));
        }
    }
    if let (Some(min), Some(n)) = (schema.get("minimum").and_then(Value::as_f64), v.as_f64()) {
        if n < min {
            return err(format!("{n} < {min}"));
        }
    }
    if let (Some(p), Some(s)) = (schema.get("pattern").and_then(Value::as_str), v.as_str()) {
        if !matches_pattern(p, s) {
            return err(format!("{s:?} does not match {p}"));
        }
    }
    if let Some(obj) = v.as_object() {
        for r in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let r = r.as_str().unwrap();
            if !obj.contains_key(r) {
                return err(format!("missing required {r:?}"));
            }
        }
        let props = schema.get("properties").and_then(Value::as_object);
        for (k, x) in obj {
            if let Some(names) = schema.get("propertyNames") {
                validate(names, &Value::from(k.as_str()), &format!("{at}.{k} (name)"))?;
            }
            match props.and_then(|p| p.get(k)) {
                Some(s) => validate(s, x, &format!("{at}.{k}"))?,
                None => {
                    if let Some(extra) = schema.get("additionalProperties") {
                        if extra == &Value::Bool(false) {
                            return err(format!("unexpected property {k:?}"));
                        }
                        if extra.is_object() {
                            validate(extra, x, &format!("{at}.{k}"))?;
                        }
                    }
                }
            }
        }
    }
    if let (Some(items), Some(a)) = (schema.get("items"), v.as_array()) {
        for (i, x) in a.iter().enumerate() {
            validate(items, x, &format!("{at}[{i}]"))?;
        }
    }
    Ok(())
}

fn matches_pattern(p: &str, s: &str) -> bool {
    match p {
        "^0x[0-9a-f]+$" => s.strip_prefix("0x").is_some_and(|h| {
            !h.is_empty()
                && h.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        }),
        "^(0|[1-9][0-9]*)$" => {
            s == "0"
                || (!s.starts_with('0') && !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        }
        other => panic!("the test's checker does not know pattern {other}"),
    }
}

fn schema() -> Value {
    serde_json::from_str(JSON_SCHEMA).expect("JSON_SCHEMA is not valid JSON")
}

/// Every trace the export tests run on.
fn traces() -> Vec<(&'static str, Trace)> {
    let mut weird = fixture::trace();
    weird.functions[fixture::DO_IDLE as usize].name = "odd,\"name\"\nwith newline".into();
    weird.callers[1].name = "caller, \"quoted\"".into();
    weird.meta.kernel = "C:\\kernel \"quoted\"".into();
    weird.meta.build_id = None;
    // What a streamed run can add: losses, the flight recorder, a file
    // cut short, rejected sites, KASLR offsets, the command line.
    let mut streamed = fixture::trace();
    streamed.meta.cmdline = [
        "vmtrace",
        "record",
        "--trace",
        "hrtimer_*",
        "-o",
        "a b.data",
    ]
    .map(String::from)
    .to_vec();
    streamed.meta.lost = vec![3, 0, 1, 0];
    streamed.meta.overwrite = true;
    streamed.meta.incomplete = true;
    streamed.meta.rejected_sites = "2 __mcount_loc entries not at a function entry".into();
    streamed.meta.kernel_offset = Some((0x3b80_0000, -0x20_0000));
    // Filtered after recording: the tasks and stacks of its events, `shown`.
    let filtered = tracer::trace::filter::TraceFilter::new(&["sh*".into()], &[], &[], &[])
        .and_then(|f| f.apply(&fixture::tasks_trace(), "comm sh*"))
        .unwrap();
    assert!(!filtered.meta.shown.is_empty());
    vec![
        ("fixture", fixture::trace()),
        ("empty", Trace::default()),
        ("weird", weird),
        ("big", fixture::big_trace(10_000)),
        ("graph", fixture::graph_trace()),
        ("streamed", streamed),
        ("filtered", filtered),
    ]
}

#[test]
fn report_json_schema_is_a_2020_12_schema() {
    let s = schema();
    assert_eq!(s["$schema"], "https://json-schema.org/draft/2020-12/schema");
    assert_eq!(s["properties"]["schema"]["const"], SCHEMA_ID);
    // Every required field is described.
    for r in s["required"].as_array().unwrap() {
        assert!(s["properties"].get(r.as_str().unwrap()).is_some(), "{r}");
    }
    for r in s["properties"]["functions"]["items"]["required"]
        .as_array()
        .unwrap()
    {
        assert!(s["properties"]["functions"]["items"]["properties"]
            .get(r.as_str().unwrap())
            .is_some());
    }
    // The checker catches violations.
    let mut v = to_json(&fixture::trace());
    v["functions"][0]["per_cpu"]["x"] = Value::from(1);
    assert!(validate(&s, &v, "$").is_err());
    let mut v = to_json(&fixture::trace());
    v["pause"]
        .as_object_mut()
        .unwrap()
        .remove("attach_latency_us");
    assert!(validate(&s, &v, "$").is_err());
    let mut v = to_json(&fixture::trace());
    v["functions"][1]["addr"] = Value::from("ffff");
    assert!(validate(&s, &v, "$").is_err());
}

#[test]
fn report_json_matches_schema_and_counts() {
    let s = schema();
    // Traces with guest tasks too (their other outputs: tests/tasks.rs),
    // with arguments and return values (tests/values.rs), and with kernel
    // stacks (tests/stacks.rs).
    let with_tasks = [
        ("stacks", fixture::stacks_trace()),
        ("tasks", fixture::tasks_trace()),
        ("tasks_entry", fixture::tasks_entry_trace()),
        ("values", fixture::values_trace()),
        ("values_entry", fixture::values_entry_trace()),
    ];
    for (name, t) in traces().into_iter().chain(with_tasks) {
        let v = to_json(&t);
        validate(&s, &v, "$").unwrap_or_else(|e| panic!("{name}: {e}"));
        // The writer writes the same document.
        let mut out = Vec::new();
        write_json(&t, &mut out).unwrap();
        assert!(out.ends_with(b"}\n"));
        assert_eq!(serde_json::from_slice::<Value>(&out).unwrap(), v, "{name}");

        let m = &t.meta;
        assert_eq!(v["schema"], "vmtrace-report/1");
        assert_eq!(v["kernel"], m.kernel.as_str());
        assert_eq!(v["build_id"].as_str(), m.build_id.as_deref());
        assert_eq!(v["cpus"], m.cpus);
        assert!((v["duration_s"].as_f64().unwrap() - t.duration_s()).abs() < 1e-9);
        assert_eq!(v["events"], m.events_total);
        // Entries: a function-graph trace's returns are not calls.
        let entries = t.events.iter().filter(|e| !e.is_return()).count() as u64;
        assert_eq!(v["events_stored"], entries);
        assert_eq!(v["dropped"], m.events_dropped);
        assert_eq!(v["sites_patched"], m.sites_patched);
        assert_eq!(
            v["sites_skipped"],
            m.sites_skipped_init + m.sites_skipped_other
        );
        assert_eq!(v["sites_skipped_init"], m.sites_skipped_init);
        assert_eq!(v["sites_skipped_other"], m.sites_skipped_other);
        assert_eq!(
            v["pause"]["attach_window_us"],
            m.attach_window_ns as f64 / 1e3
        );
        assert_eq!(
            v["pause"]["attach_latency_us"],
            m.attach_latency_ns as f64 / 1e3
        );
        assert_eq!(v["stop_reason"], m.stop_reason.as_str());
        // Every stored call is in one task's count, or unknown.
        if let Some(tasks) = v["tasks"].as_array() {
            let known: u64 = tasks.iter().map(|t| t["count"].as_u64().unwrap()).sum();
            assert_eq!(
                known + v["tasks_unknown"].as_u64().unwrap(),
                entries,
                "{name}"
            );
            for t in tasks {
                let f: u64 = t["functions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|f| f["count"].as_u64().unwrap())
                    .sum();
                assert_eq!(f, t["count"].as_u64().unwrap(), "{name}");
            }
        } else {
            assert!(t.tasks.is_empty(), "{name}");
        }

        let funcs = v["functions"].as_array().unwrap();
        assert_eq!(
            funcs.len(),
            t.functions.len(),
            "{name}: every traced function"
        );
        // Sorted by count desc, then name.
        for w in funcs.windows(2) {
            let key = |f: &Value| {
                (
                    std::cmp::Reverse(f["count"].as_u64().unwrap()),
                    f["name"].as_str().unwrap().to_string(),
                )
            };
            assert!(
                key(&w[0]) <= key(&w[1]),
                "{name}: {} before {}",
                w[0]["name"],
                w[1]["name"]
            );
        }
        for f in funcs {
            let i = t
                .functions
                .iter()
                .position(|s| s.name == f["name"].as_str().unwrap())
                .unwrap();
            assert_eq!(f["addr"], format!("{:#x}", t.functions[i].addr));
            assert_eq!(f["count"], t.counts[i].iter().sum::<u64>());
            let per_cpu = f["per_cpu"].as_object().unwrap();
            assert_eq!(per_cpu.len(), m.cpus as usize);
            for c in 0..m.cpus as usize {
                assert_eq!(per_cpu[&c.to_string()], t.counts[i][c]);
            }
            // Callers add up to the stored events of the function.
            let callers = f["callers"].as_array().unwrap();
            let sum: u64 = callers.iter().map(|c| c["count"].as_u64().unwrap()).sum();
            let stored = t
                .events
                .iter()
                .filter(|e| e.func as usize == i && !e.is_return())
                .count() as u64;
            assert_eq!(sum, stored, "{name}: {}", f["name"]);
            for c in callers {
                assert_eq!(c["name"] == "[unknown]", c.get("addr").is_some(), "{c}");
            }
        }
    }
}

#[test]
fn report_json_says_losses_and_offsets_only_when_there_are_some() {
    let all = traces();
    let t = &all.iter().find(|(n, _)| *n == "streamed").unwrap().1;
    let v = to_json(t);
    assert_eq!(v["lost"], serde_json::json!([3, 0, 1, 0]));
    assert_eq!(v["overwrite"], true);
    assert_eq!(v["incomplete"], true);
    assert_eq!(v["kernel_offset"]["virt"], 0x3b80_0000);
    assert_eq!(v["kernel_offset"]["phys"], -0x20_0000);
    assert!(v["rejected_sites"].as_str().unwrap().starts_with("2 "));
    // argv as recorded, each argument whole (not the shell line).
    assert_eq!(v["cmdline"], serde_json::json!(t.meta.cmdline));
    let plain = to_json(&fixture::trace());
    for k in [
        "lost",
        "overwrite",
        "incomplete",
        "kernel_offset",
        "rejected_sites",
        "cmdline",
    ] {
        assert!(plain.get(k).is_none(), "{k}");
    }
}

#[test]
fn report_json_fixture_values() {
    let v = to_json(&fixture::trace());
    let f = &v["functions"];
    assert_eq!(f[0]["count"], 1_234_567);
    assert_eq!(f[1]["name"], "schedule");
    assert_eq!(f[1]["count"], 4012);
    assert_eq!(f[1]["per_cpu"]["1"], 998);
    assert_eq!(
        f[1]["callers"],
        serde_json::json!([
            {"name": "worker_thread", "count": 5},
            {"name": "kthread", "count": 2},
            {"name": "[unknown]", "addr": format!("{:#x}", fixture::UNKNOWN_IP), "count": 1},
        ])
    );
    // Uncalled functions are listed last (count 0, by name).
    let n = f.as_array().unwrap().len();
    assert_eq!(f[n - 2]["name"], "uncalled_a");
    assert_eq!(f[n - 1]["name"], "uncalled_b");
    assert_eq!(f[n - 1]["count"], 0);
    assert_eq!(f[n - 1]["callers"], serde_json::json!([]));
    assert_eq!(v["sites_skipped"], 687);
    assert_eq!(v["duration_s"], 2.5);
}

/// Splits CSV text into records per RFC 4180 (quoted fields may hold , " CR LF).
fn parse_csv(text: &str) -> Vec<Vec<String>> {
    let mut records = Vec::new();
    let mut record = Vec::new();
    let mut field = String::new();
    let mut chars = text.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') if field.is_empty() => quoted = true,
            (false, '"') => panic!("stray quote in unquoted field"),
            (false, ',') => record.push(std::mem::take(&mut field)),
            (false, '\n') => {
                record.push(std::mem::take(&mut field));
                records.push(std::mem::take(&mut record));
            }
            (false, c) => field.push(c),
        }
    }
    assert!(!quoted, "unterminated quoted field");
    assert!(
        field.is_empty() && record.is_empty(),
        "last line lacks a newline"
    );
    records
}

#[test]
fn report_csv_one_row_per_event_and_parses_back() {
    // Entry-only traces (function-graph CSV and Chrome: report_graph.rs).
    for (name, t) in traces().into_iter().filter(|(_, t)| !t.meta.graph) {
        let mut out = Vec::new();
        write_csv(&t, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let records = parse_csv(&text);
        assert_eq!(
            records[0],
            ["ts_ns", "cpu", "function", "addr", "parent", "caller"]
        );
        assert_eq!(records.len(), t.events.len() + 1, "{name}");
        for (r, e) in records[1..].iter().zip(&t.events) {
            let f = &t.functions[e.func as usize];
            assert_eq!(r.len(), 6, "{name}: {r:?}");
            assert_eq!(r[0].parse::<u64>().unwrap(), e.ts_ns);
            assert_eq!(r[1].parse::<u32>().unwrap(), e.cpu);
            // Names are printed with their control characters escaped.
            assert_eq!(r[2], escape(&f.name));
            assert_eq!(r[3], format!("{:#x}", f.addr));
            assert_eq!(
                u64::from_str_radix(r[4].strip_prefix("0x").unwrap(), 16).unwrap(),
                e.parent
            );
            assert_eq!(
                r[5],
                escape(t.caller_of(e.parent).map(|s| s.name.as_str()).unwrap_or(""))
            );
        }
    }
    // Quoting only where needed.
    let (_, weird) = traces().remove(2);
    let mut out = Vec::new();
    write_csv(&weird, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    // A newline in a name is escaped: it cannot start a row.
    assert!(
        text.contains(",\"odd,\"\"name\"\"\\x0awith newline\","),
        "{text}"
    );
    assert!(text.contains(",\"caller, \"\"quoted\"\"\"\n"), "{text}");
    assert!(text.contains(",schedule,0xffffffff81000000,"), "{text}");
}

#[test]
fn report_chrome_trace_events() {
    // Entry-only traces (function-graph CSV and Chrome: report_graph.rs).
    for (name, t) in traces().into_iter().filter(|(_, t)| !t.meta.graph) {
        let mut out = Vec::new();
        write_chrome(&t, &mut out).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(v["displayTimeUnit"], "ns");
        let events = v["traceEvents"].as_array().unwrap();

        let meta: Vec<&Value> = events.iter().filter(|e| e["ph"] == "M").collect();
        let process: Vec<_> = meta
            .iter()
            .filter(|e| e["name"] == "process_name")
            .collect();
        assert_eq!(process.len(), 1);
        assert_eq!(
            process[0]["args"]["name"],
            format!("vmtrace: {}", t.meta.kernel)
        );
        let threads: BTreeMap<u64, &str> = meta
            .iter()
            .filter(|e| e["name"] == "thread_name")
            .map(|e| {
                (
                    e["tid"].as_u64().unwrap(),
                    e["args"]["name"].as_str().unwrap(),
                )
            })
            .collect();
        // tid = vCPU + 1: Perfetto takes tid 0 for the idle task.
        let want: BTreeMap<u64, String> = (0..t.meta.cpus as u64)
            .map(|c| (c + 1, format!("vCPU {c}")))
            .collect();
        assert_eq!(
            threads.len(),
            t.meta.cpus as usize,
            "{name}: one thread_name per vCPU"
        );
        for (c, n) in &want {
            assert_eq!(threads[c], n);
        }

        let instants: Vec<&Value> = events.iter().filter(|e| e["ph"] == "i").collect();
        assert_eq!(
            instants.len(),
            t.events.len(),
            "{name}: one instant per stored event"
        );
        assert_eq!(events.len(), instants.len() + meta.len());
        for (i, e) in instants.iter().zip(&t.events) {
            assert_eq!(i["name"], t.functions[e.func as usize].name.as_str());
            assert_eq!(i["s"], "t");
            assert_eq!(i["pid"], 1);
            assert_eq!(i["tid"], e.cpu + 1);
            let us = (e.ts_ns - t.meta.attach_ns) as f64 / 1e3;
            assert!(
                (i["ts"].as_f64().unwrap() - us).abs() < 1e-6,
                "{} vs {us}",
                i["ts"]
            );
            let caller = match t.caller_of(e.parent) {
                Some(s) => s.name.clone(),
                None => format!("[unknown] {:#x}", e.parent),
            };
            assert_eq!(i["args"]["caller"], caller.as_str());
        }
    }
    // Sub-microsecond precision, and events before the attach.
    let mut t = fixture::trace();
    t.events.truncate(2);
    t.events[0].ts_ns = t.meta.attach_ns + 1_234_567;
    t.events[1].ts_ns = t.meta.attach_ns - 1_500;
    let mut out = Vec::new();
    write_chrome(&t, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("\"ts\":1234.567,"), "{text}");
    assert!(text.contains("\"ts\":-1.500,"), "{text}");
}

/// The csv and chrome writers stream 10 M events:
/// `cargo test --release -p tracer --test report_export -- --ignored --nocapture`.
#[test]
#[ignore = "timing; run in release"]
fn report_export_10m_events_speed() {
    let t = fixture::big_trace(10_000_000);
    let start = std::time::Instant::now();
    write_csv(&t, std::io::sink()).unwrap();
    println!("csv: 10M events in {:?}", start.elapsed());
    let start = std::time::Instant::now();
    write_chrome(&t, std::io::sink()).unwrap();
    println!("chrome: 10M events in {:?}", start.elapsed());
}
