//! Arguments and return values (`--args`, `--retval`) through every
//! output: a function-graph trace whose entries carry their arguments and
//! whose returns carry their value (`report_fixture::values_trace`: every
//! kind of value, error codes named, an ERR_PTR, an unnamed enum value,
//! void functions, a function without BTF, arguments not shown), byte for
//! byte against golden files (`VMTRACE_BLESS=1` writes them), with the
//! lines that matter spelled out here too; the data file saved and
//! streamed, whole and cut short.

#[path = "values/events.rs"]
mod events;
#[path = "report_fixture.rs"]
mod fixture;
#[path = "values/syscalls.rs"]
mod syscalls;

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;
use tracer::session::args::ArgTable;
use tracer::trace::datafile::{load, save, DataFile, Section, TraceFileError, DATA_VERSION};
use tracer::trace::export::script::write_script;
use tracer::trace::export::{to_json, write_chrome, write_csv};
use tracer::trace::model::{Trace, ARG_REGS};
use tracer::trace::report::{render, render_tree, ReportOptions, TreeOptions};

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// Compares `got` with the golden file `name`, or writes it when blessing.
fn check(name: &str, got: &[u8]) {
    let path = golden_dir().join(name);
    if std::env::var_os("VMTRACE_BLESS").is_some() {
        fs::write(&path, got).unwrap();
        return;
    }
    let want = fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (VMTRACE_BLESS=1 writes it)", path.display()));
    if want != got {
        let at = want.iter().zip(got).take_while(|(a, b)| a == b).count();
        panic!(
            "{name} differs from {} at byte {at}:\n{}",
            path.display(),
            String::from_utf8_lossy(&got[at.saturating_sub(200)..got.len().min(at + 200)])
        );
    }
}

fn text(f: impl FnOnce(&mut Vec<u8>) -> std::io::Result<()>) -> String {
    let mut out = Vec::new();
    f(&mut out).unwrap();
    String::from_utf8(out).unwrap()
}

fn tmp(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("values-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// The lines of `out` that are not `#` comments.
fn body(out: &str) -> Vec<&str> {
    out.lines().filter(|l| !l.starts_with('#')).collect()
}

#[test]
fn script_prints_func_args_and_retval() {
    let out = text(|w| write_script(&fixture::values_trace(), w));
    check("values.script.txt", out.as_bytes());
    let header: Vec<&str> = out.lines().filter(|l| l.starts_with('#')).collect();
    assert!(header.contains(
        &"# values: arguments and return values (FUNCTION(name=value, ...), ret=VALUE), by the kernel's BTF"
    ));
    assert!(header.contains(
        &"# not shown: do_exit_thing: p: a struct passed by value (RSI, RDX); a7: not in a register (on the stack)"
    ));
    assert!(header.contains(
        &"# not shown: cpu_idle_loop: no prototype in the kernel's BTF: arguments not shown, return value in hex"
    ));
    let lines = body(&out);
    assert_eq!(lines.len(), 22);
    assert_eq!(
        lines[1],
        "           vcpu0-1       [000]  1000.000001: __hrtimer_run_queues(cpu_base=0xffff888000001080, \
         now=-2000000, flags=18446744069414584322, active_mask=6) <-hrtimer_interrupt"
    );
    assert_eq!(
        lines[3],
        "           vcpu0-1       [000]  1000.000001: tick_do_update_jiffies64(now=-131391639514880, \
         update=false, c='\\x04') <-__hrtimer_run_queues"
    );
    // No prototype: the entry as before.
    assert_eq!(
        lines[4],
        "           vcpu1-2       [001]  1000.000002: cpu_idle_loop <-worker_thread"
    );
    // ERR_PTR(-ENOMEM); -EAGAIN in an int, the upper half of RAX not its sign.
    assert_eq!(
        lines[6],
        "           vcpu1-2       [001]  1000.000005: hrtimer_interrupt returned to cpu_idle_loop ret=-12 (-ENOMEM)"
    );
    assert_eq!(
        lines[9],
        "           vcpu1-2       [001]  1000.000007: __hrtimer_run_queues returned to cpu_idle_loop ret=-11 (-EAGAIN)"
    );
    assert_eq!(
        lines[10],
        "           vcpu1-2       [001]  1000.000008: schedule() <-worker_thread"
    );
    assert_eq!(
        lines[12],
        "           vcpu1-2       [001]  1000.000009: tick_sched_timer returned to schedule ret=HRTIMER_RESTART"
    );
    // void: no value.
    assert_eq!(
        lines[13],
        "           vcpu0-1       [000]  1000.000016: tick_do_update_jiffies64 returned to __hrtimer_run_queues"
    );
    assert!(lines[16].ends_with("tick_sched_timer returned to __hrtimer_run_queues ret=7"));
    assert!(lines[19].ends_with("ret=0xffff88800abcd000"));
    // The unhooked call's arguments were not recorded.
    assert!(lines[20].ends_with(": tick_sched_timer <-__hrtimer_run_queues"));
}

#[test]
fn script_of_arguments_alone() {
    let out = text(|w| write_script(&fixture::values_entry_trace(), w));
    check("values_entry.script.txt", out.as_bytes());
    assert!(
        out.contains("\n# values: arguments (FUNCTION(name=value, ...)), by the kernel's BTF\n")
    );
    assert!(out.contains(
        "\n# not shown: cpu_idle_loop: no prototype in the kernel's BTF: arguments not shown\n"
    ));
    let lines = body(&out);
    assert_eq!(lines.len(), 12);
    assert!(lines
        .iter()
        .all(|l| l.contains(" <-") && !l.contains("ret=")));
    assert!(lines[6].ends_with(
        ": do_exit_thing(code=-131391639514688, a3=21, a4=-249, a5=-7) <-cpu_idle_loop"
    ));
}

/// A trace without values prints as before: no values line, no parentheses.
#[test]
fn a_trace_without_values_scripts_as_before() {
    let mut t = fixture::values_trace();
    t.meta.args = false;
    t.meta.retval = false;
    t.args.clear();
    t.prototypes.clear();
    for e in &mut t.events {
        e.data = 0;
    }
    assert_eq!(
        text(|w| write_script(&t, w)),
        text(|w| write_script(&fixture::graph_trace(), w))
    );
    assert_eq!(
        render_tree(&t, &TreeOptions::default()),
        render_tree(&fixture::graph_trace(), &TreeOptions::default())
    );
}

#[test]
fn the_tree_shows_arguments_and_return_values() {
    let out = render_tree(&fixture::values_trace(), &TreeOptions::default());
    check("values.tree.txt", out.as_bytes());
    let lines = body(&out);
    assert_eq!(
        lines[0],
        " 0)               |  hrtimer_interrupt(dev=0xffff888000001040) {"
    );
    assert_eq!(
        lines[4],
        " 0) + 15.101 us   |      } /* tick_sched_timer ret=HRTIMER_NORESTART */"
    );
    assert_eq!(
        lines[5],
        " 0)   0.300 us    |      tick_sched_timer(timer=0xffff8880000012c0); /* ret=7 */"
    );
    assert_eq!(
        lines[7],
        " 0) ! 149.000 us  |  } /* hrtimer_interrupt ret=0xffff88800abcd000 */"
    );
    assert_eq!(
        lines[8],
        " 0)               |  tick_sched_timer(); /* unhooked */"
    );
    assert_eq!(lines[9], " 1)               |  cpu_idle_loop() {");
    assert_eq!(
        lines[10],
        " 1)   2.500 us    |    hrtimer_interrupt(dev=0xffff888000001180); /* ret=-12 (-ENOMEM) */"
    );
    assert_eq!(
        lines[11],
        " 1)               |    do_exit_thing(code=-131391639514688, a3=21, a4=-249, a5=-7); /* abandoned */"
    );
    assert_eq!(
        lines[13],
        " 1)               |  } /* cpu_idle_loop, running at detach */"
    );
    // void: nothing said of its return.
    assert_eq!(
        lines[16],
        " 1) + 32.000 us   |  } /* schedule, returned on vCPU 0 */"
    );
}

#[test]
fn the_report_says_what_cannot_be_shown() {
    let out = render(&fixture::values_trace(), &ReportOptions::default());
    check("values.txt", out.as_bytes());
    assert!(out.contains(
        "\n# values:       arguments and return values recorded; 7 of 8 traced functions described by the kernel's BTF\n"
    ));
    assert!(out.ends_with(
        "#\n# not shown: do_exit_thing: p: a struct passed by value (RSI, RDX); a7: not in a register (on the stack)\n\
         # not shown: cpu_idle_loop: no prototype in the kernel's BTF: arguments not shown, return value in hex\n"
    ));
    // Only of the functions shown.
    let opts = ReportOptions {
        percent_limit: Some(10.0),
        ..ReportOptions::default()
    };
    let out = render(&fixture::values_trace(), &opts);
    assert!(!out.contains("# not shown:"), "{out}");
}

#[test]
fn csv_ends_with_args_and_ret() {
    let out = text(|w| write_csv(&fixture::values_trace(), w));
    check("values.csv", out.as_bytes());
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        "ts_ns,cpu,function,addr,parent,caller,kind,slot,args,ret"
    );
    assert_eq!(
        lines[2],
        "1000000001200,0,__hrtimer_run_queues,0xffffffff81001200,0xffffffff81001020,hrtimer_interrupt,\
         entry,0xffffc90000013fb8,\"(cpu_base=0xffff888000001080, now=-2000000, \
         flags=18446744069414584322, active_mask=6)\","
    );
    assert_eq!(
        lines[7],
        "1000000005500,1,hrtimer_interrupt,0xffffffff81001000,0xffffffff81001840,cpu_idle_loop,\
         return,0xffffc90000023fb8,,-12 (-ENOMEM)"
    );
    assert!(
        lines[14].ends_with(",return,0xffffc90000013f78,,"),
        "{}",
        lines[14]
    );
    let out = text(|w| write_csv(&fixture::values_entry_trace(), w));
    check("values_entry.csv", out.as_bytes());
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "ts_ns,cpu,function,addr,parent,caller,args");
    assert!(lines[5].ends_with(",worker_thread,"), "{}", lines[5]);
    assert!(lines[9].ends_with(",worker_thread,()"), "{}", lines[9]);
}

#[test]
fn json_has_return_values_and_what_is_not_shown() {
    let t = fixture::values_trace();
    let v = to_json(&t);
    let out = serde_json::to_string_pretty(&v).unwrap() + "\n";
    check("values.json", out.as_bytes());
    assert_eq!(
        v["values"],
        serde_json::json!({"args": true, "retval": true})
    );
    let f = |name: &str| -> Value {
        v["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(
        f("hrtimer_interrupt")["return_values"],
        serde_json::json!([
            {"value": "-12 (-ENOMEM)", "count": 2},
            {"value": "0xffff88800abcd000", "count": 1}
        ])
    );
    assert_eq!(
        f("tick_sched_timer")["return_values"],
        serde_json::json!([
            {"value": "7", "count": 1},
            {"value": "HRTIMER_NORESTART", "count": 1},
            {"value": "HRTIMER_RESTART", "count": 1}
        ])
    );
    // void, and not called: no return values.
    assert!(f("schedule").get("return_values").is_none());
    assert!(f("uncalled_graph").get("return_values").is_none());
    assert_eq!(
        f("do_exit_thing")["unshown"],
        serde_json::json!([
            "p: a struct passed by value (RSI, RDX)",
            "a7: not in a register (on the stack)"
        ])
    );
    assert!(f("schedule").get("unshown").is_none());
    // Valid by the published schema's types.
    let schema: Value = serde_json::from_str(tracer::trace::export::JSON_SCHEMA).unwrap();
    let fp = &schema["properties"]["functions"]["items"]["properties"];
    assert_eq!(fp["return_values"]["type"], "array");
    assert_eq!(fp["unshown"]["type"], "array");
    assert_eq!(schema["properties"]["values"]["type"], "object");

    // Only the most frequent 8.
    let mut t = t;
    let first = t
        .events
        .iter()
        .position(|e| e.is_return() && e.func == 2)
        .unwrap();
    for k in 0..20u64 {
        let mut e = t.events[first];
        e.data = 100 + k % 10;
        t.events.push(e);
    }
    t.returns[2][1] += 20;
    let v = to_json(&t);
    let r = v["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "tick_sched_timer")
        .unwrap()["return_values"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(r.len(), 8);
    assert_eq!(r[0], serde_json::json!({"value": "100", "count": 2}));
}

#[test]
fn chrome_events_carry_args_and_ret() {
    let out = text(|w| write_chrome(&fixture::values_trace(), w));
    check("values.chrome.json", out.as_bytes());
    let doc: Value = serde_json::from_str(&out).unwrap();
    let events = doc["traceEvents"].as_array().unwrap();
    let args: Vec<&Value> = events
        .iter()
        .filter(|e| e["name"] == "hrtimer_interrupt")
        .map(|e| &e["args"])
        .collect();
    assert_eq!(
        *args[0],
        serde_json::json!({"caller": "sysvec_apic_timer_interrupt",
            "args": "(dev=0xffff888000001040)", "ret": "0xffff88800abcd000"})
    );
    assert_eq!(args[1]["ret"], "-12 (-ENOMEM)");
    let exit = events
        .iter()
        .find(|e| e["name"] == "do_exit_thing")
        .unwrap();
    assert_eq!(exit["args"]["end"], "abandoned");
    assert_eq!(
        exit["args"]["args"],
        "(code=-131391639514688, a3=21, a4=-249, a5=-7)"
    );
    assert!(exit["args"].get("ret").is_none());
    let sched = events.iter().find(|e| e["name"] == "schedule").unwrap();
    assert!(sched["args"].get("ret").is_none());
    let out = text(|w| write_chrome(&fixture::values_entry_trace(), w));
    check("values_entry.chrome.json", out.as_bytes());
    let doc: Value = serde_json::from_str(&out).unwrap();
    let tick: Vec<&Value> = doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "tick_sched_timer")
        .collect();
    assert_eq!(tick[0]["args"]["args"], "(timer=0xffff8880000010c0)");
    // The unhooked call: no arguments recorded.
    assert!(tick[3]["args"].get("args").is_none());
}

/// The saved trace (a data file, written in one go) reads back
/// as itself; without values it still saves as version 4.
#[test]
fn the_saved_trace_is_byte_identical_and_reads_back() {
    for (t, golden) in [
        (fixture::values_trace(), "values.vmtrace"),
        (fixture::values_entry_trace(), "values_entry.vmtrace"),
    ] {
        let p = tmp(golden);
        save(&t, &p).unwrap();
        let bytes = fs::read(&p).unwrap();
        check(golden, &bytes);
        assert_eq!(
            u32::from_le_bytes(bytes[8..12].try_into().unwrap()),
            DATA_VERSION
        );
        assert_eq!(load(&p).unwrap(), t);
    }
    let p = tmp("plain.vmtrace");
    save(&fixture::graph_trace(), &p).unwrap();
    let bytes = fs::read(&p).unwrap();
    assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 4);
}

/// What the session writes as `HEAD`: no counts yet.
fn head_of(t: &Trace) -> Trace {
    let mut h = t.clone();
    h.events.clear();
    h.args.clear();
    for row in h.counts.iter_mut().chain(h.returns.iter_mut()) {
        row.iter_mut().for_each(|c| *c = 0);
    }
    h.meta.events_total = 0;
    h.meta.unhooked = 0;
    h
}

/// Streams `t` as the store does: each vCPU's events in batches of
/// `batch`, each entry's arguments pushed to the table first, the
/// arguments new since the last batch written before it and then
/// forgotten. Returns the trace as recorded (arguments renumbered in push
/// order) and the table.
fn stream(t: &Trace, path: &Path, batch: usize, complete: bool) -> (Trace, ArgTable) {
    let table = ArgTable::new();
    let mut f = DataFile::create(path).unwrap();
    f.head(&head_of(t)).unwrap();
    let mut want = t.clone();
    want.args.clear();
    for cpu in 0..t.meta.cpus {
        let idx: Vec<usize> = (0..t.events.len())
            .filter(|&i| t.events[i].cpu == cpu)
            .collect();
        for b in idx.chunks(batch) {
            let mut events = Vec::new();
            for &i in b {
                let mut e = t.events[i];
                if let Some(a) = t.args_of(&e) {
                    e.data = table.push(*a);
                    want.args.push(*a);
                }
                want.events[i] = e;
                events.push(e);
            }
            f.write_args(&table.since(f.args_saved())).unwrap();
            table.forget(f.args_saved());
            f.write_events(&events).unwrap();
        }
    }
    if complete {
        f.finish(&want).unwrap();
    }
    want.events.sort_by_key(|e| (e.ts_ns, e.cpu));
    (want, table)
}

#[test]
fn a_streamed_file_reads_back_with_its_values() {
    let t = fixture::values_trace();
    let path = tmp("values.data");
    let (want, table) = stream(&t, &path, 3, true);
    assert_eq!(table.len(), t.args.len());
    // Written and forgotten: nothing kept.
    assert!(table.since(0).is_empty());
    let back = load(&path).unwrap();
    assert!(!back.meta.incomplete);
    assert_eq!(back, want);
    // Every entry has its own arguments, whatever their new ids.
    for (a, b) in back.events.iter().zip(&t.events) {
        assert_eq!(back.args_of(a), t.args_of(b));
    }
}

/// Killed at any byte: every entry kept still has its arguments, every
/// return its value, and the prototypes are those of `HEAD`.
#[test]
fn a_streamed_file_cut_anywhere_keeps_each_entrys_arguments() {
    let t = fixture::values_trace();
    let path = tmp("values-whole.data");
    let (want, _) = stream(&t, &path, 2, false);
    let whole = fs::read(&path).unwrap();
    // Event times are distinct in the fixture.
    let at_time: std::collections::HashMap<u64, (Option<[u64; ARG_REGS]>, u64)> = want
        .events
        .iter()
        .map(|e| (e.ts_ns, (want.args_of(e).copied(), e.data)))
        .collect();
    let cut = tmp("values-cut.data");
    let head_len = u32::from_le_bytes(whole[24..28].try_into().unwrap()) as usize;
    let head_end = 20 + 12 + head_len;
    let mut at = whole.len();
    let mut checked = 0;
    while at >= head_end {
        fs::write(&cut, &whole[..at]).unwrap();
        let back = load(&cut).unwrap_or_else(|e| panic!("cut at {at}: {e}"));
        assert!(back.meta.incomplete);
        assert!(back.meta.args && back.meta.retval);
        assert_eq!(back.prototypes, t.prototypes);
        for e in &back.events {
            let (args, data) = at_time[&e.ts_ns];
            match e.is_return() {
                true => assert_eq!(e.data, data, "cut at {at}"),
                false => assert_eq!(back.args_of(e).copied(), args, "cut at {at}"),
            }
            checked += 1;
        }
        at -= 1;
    }
    assert!(checked > 100, "{checked}");
}

/// The blocks of a data file: (offset of the tag, tag, payload range).
fn blocks(b: &[u8]) -> Vec<(usize, [u8; 4], std::ops::Range<usize>)> {
    let mut out = Vec::new();
    let mut at = 20;
    while at < b.len() {
        let tag: [u8; 4] = b[at..at + 4].try_into().unwrap();
        let len = u32::from_le_bytes(b[at + 4..at + 8].try_into().unwrap()) as usize;
        out.push((at, tag, at + 8..at + 8 + len));
        at += 12 + len;
    }
    out
}

/// Writes `v` at `pos` inside the block at `block` and fixes its checksum.
fn patch(b: &mut [u8], block: usize, payload: std::ops::Range<usize>, pos: usize, v: &[u8]) {
    b[pos..pos + v.len()].copy_from_slice(v);
    let crc = crc32fast::hash(&b[block..payload.end]);
    b[payload.end..payload.end + 4].copy_from_slice(&crc.to_le_bytes());
}

fn corrupt(path: &Path) -> (Section, String) {
    match load(path).unwrap_err() {
        TraceFileError::Corrupt {
            section, detail, ..
        } => (section, detail),
        e => panic!("{e}"),
    }
}

#[test]
fn arguments_past_the_saved_ones_are_corruption() {
    let t = fixture::values_entry_trace();
    let path = tmp("values-ok.data");
    save(&t, &path).unwrap();
    let good = fs::read(&path).unwrap();
    let bl = blocks(&good);
    let tags: Vec<&[u8; 4]> = bl.iter().map(|(_, tag, _)| tag).collect();
    assert_eq!(tags, [b"HEAD", b"ARGS", b"EVTS", b"FOOT", b"END\0"]);

    // The first event (48-byte records after the count: its data at 40)
    // names arguments 12 of 11.
    let (start, _, payload) = bl[2].clone();
    let mut b = good.clone();
    patch(
        &mut b,
        start,
        payload.clone(),
        payload.start + 4 + 40,
        &12u64.to_le_bytes(),
    );
    fs::write(&path, &b).unwrap();
    assert_eq!(
        corrupt(&path),
        (
            Section::Events,
            "event 0 names arguments 12 but 11 are saved before it".into()
        )
    );
    let msg = load(&path).unwrap_err().to_string();
    assert!(msg.contains("corrupt trace file (events section)"), "{msg}");

    // An argument block that does not follow the arguments before it.
    let (start, _, payload) = bl[1].clone();
    let mut b = good.clone();
    patch(
        &mut b,
        start,
        payload.clone(),
        payload.start,
        &1u64.to_le_bytes(),
    );
    fs::write(&path, &b).unwrap();
    assert_eq!(
        corrupt(&path),
        (
            Section::Args,
            "an argument block starts at call 2 but 0 calls' arguments came before it".into()
        )
    );

    // More arguments claimed than the block holds.
    let mut b = good.clone();
    patch(
        &mut b,
        start,
        payload.clone(),
        payload.start + 8,
        &12u32.to_le_bytes(),
    );
    fs::write(&path, &b).unwrap();
    let (section, detail) = corrupt(&path);
    assert_eq!(section, Section::Args);
    assert!(
        detail.ends_with("does not hold 12 calls' arguments"),
        "{detail}"
    );
}

#[test]
fn a_bad_prototype_is_corruption() {
    let t = fixture::values_entry_trace();
    let path = tmp("values-proto.data");
    save(&t, &path).unwrap();
    let good = fs::read(&path).unwrap();
    // The prototypes end the HEAD body before the events' formats and the
    // returns' (`u32` 0 each); the last is uncalled_graph's: has 1, ret u8
    // (kind 2, size 1), 1 parameter: "x", register 0, s16 (kind 1, size
    // 2), 0 notes.
    let (start, _, payload) = blocks(&good)[0].clone();
    assert_eq!(good[payload.end - 8..payload.end], [0; 8]);
    let last = payload.end - 8 - 16;
    assert_eq!(
        good[last..payload.end - 8],
        [1, 2, 1, 1, 1, 0, 0, 0, b'x', 0, 1, 2, 0, 0, 0, 0]
    );
    let mut b = good.clone();
    patch(&mut b, start, payload.clone(), last + 9, &[6]);
    fs::write(&path, &b).unwrap();
    assert_eq!(
        corrupt(&path),
        (
            Section::Prototypes,
            "function 7's prototype: parameter \"x\" in register 6 (max 5)".into()
        )
    );
    let mut b = good.clone();
    patch(&mut b, start, payload.clone(), last + 10, &[9]);
    fs::write(&path, &b).unwrap();
    assert_eq!(
        corrupt(&path),
        (
            Section::Prototypes,
            "function 7's prototype: a value of kind 9 (0 to 6)".into()
        )
    );
    let mut b = good.clone();
    patch(&mut b, start, payload.clone(), last + 11, &[3]);
    fs::write(&path, &b).unwrap();
    assert_eq!(
        corrupt(&path),
        (
            Section::Prototypes,
            "function 7's prototype: a value of 3 bytes (1, 2, 4 or 8)".into()
        )
    );
}
