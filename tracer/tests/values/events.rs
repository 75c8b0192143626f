//! The traced events' fields (`-e`) through every output, from a trace
//! whose entries of `__traceiter_sched_switch` and
//! `__traceiter_sched_process_fork` carry their fields: script lines as
//! ftrace prints the events, CSV and JSON fields by name, and the data
//! file (version 15: `FLDS` blocks, ftrace formats), byte for byte against golden files
//! (`VMTRACE_BLESS=1` writes them) and read back; its golden file read as
//! a reader of a later version will.

use tracer::kernel::events::fields::{EventFormat, FieldValue};
use tracer::kernel::events::ftrace_format::{FtraceField, FtraceFormat};
use tracer::kernel::events::KernelEvent;
use tracer::kernel::symbols::Symbol;
use tracer::trace::datafile::{load, save, DATA_VERSION};
use tracer::trace::export::script::write_script;
use tracer::trace::export::{to_json, write_chrome, write_csv};
use tracer::trace::model::{Event, Task, Trace, TraceMeta};
use tracer::trace::report::{render, ReportOptions};

use super::{check, golden_dir, text, tmp};

fn format(name: &str, args: &[(&str, &str)]) -> EventFormat {
    EventFormat::of(&KernelEvent::declared("sched", name, args, None)).unwrap()
}

/// Two vCPUs; `wl-worker` (pid 73) forks pid 80 and switches to it, the
/// idle task switches to the worker; a `schedule` call between them; one
/// fork whose child could not be read.
pub fn events_trace() -> Trace {
    let task = "struct task_struct *";
    let switch = format(
        "sched_switch",
        &[
            ("bool", "preempt"),
            (task, "prev"),
            (task, "next"),
            ("unsigned int", "prev_state"),
        ],
    );
    let mut fork = format("sched_process_fork", &[(task, "parent"), (task, "child")]);
    // Its record as Linux 6.12's tracefs lays it out (for trace.dat).
    let field = |ty: &str, name: &str, offset, size, signed| FtraceField {
        ty: ty.into(),
        name: name.into(),
        offset,
        size,
        signed,
    };
    fork.ftrace = Some(FtraceFormat {
        id: 0,
        fields: vec![
            field("char[16]", "parent_comm", 8, 16, false),
            field("pid_t", "parent_pid", 24, 4, true),
            field("char[16]", "child_comm", 28, 16, false),
            field("pid_t", "child_pid", 44, 4, true),
        ],
        print_fmt: "\"comm=%s pid=%d child_comm=%s child_pid=%d\", REC->parent_comm, \
                    REC->parent_pid, REC->child_comm, REC->child_pid"
            .into(),
    });
    let sym = |name: &str, addr: u64| Symbol {
        name: name.into(),
        addr,
        size: 0x40,
    };
    let functions = vec![
        sym("__traceiter_sched_switch", 0xffff_ffff_8110_0000),
        sym("__traceiter_sched_process_fork", 0xffff_ffff_8110_0100),
        sym("schedule", 0xffff_ffff_8110_0200),
    ];
    let s = |v: &str| FieldValue::Str(v.into());
    let i = FieldValue::Int;
    let values = [
        vec![s("wl-worker"), i(73), s("wl-worker"), i(80)],
        vec![
            s("wl-worker"),
            i(73),
            i(120),
            i(1),
            s("wl-worker"),
            i(80),
            i(120),
        ],
        vec![
            s("swapper/1"),
            i(0),
            i(120),
            i(0x100),
            s("wl-worker"),
            i(73),
            i(120),
        ],
        vec![
            s("wl-worker"),
            i(73),
            FieldValue::Unread,
            FieldValue::Unread,
        ],
    ];
    // (function, vCPU, task)
    let stored = [(1, 0, 1), (0, 0, 1), (2, 0, 2), (0, 1, 3), (1, 1, 1)];
    let mut data = 0;
    let events: Vec<Event> = stored
        .iter()
        .enumerate()
        .map(|(n, &(func, cpu, task))| Event {
            ts_ns: 5_000_000_000 + n as u64 * 1_000_250,
            parent: 0xffff_ffff_8120_0010,
            slot: 0,
            func,
            cpu,
            task,
            stack: 0,
            data: match func {
                2 => 0,
                _ => {
                    data += 1;
                    data
                }
            },
        })
        .collect();
    let mut t = Trace {
        meta: TraceMeta {
            kernel: "vmlinuz-6.12".into(),
            cpus: 2,
            attach_ns: 4_000_000_000,
            detach_ns: 6_000_000_000,
            events_total: 5,
            stop_reason: "interrupted".into(),
            mode: "trap".into(),
            args: true,
            tasks: "from the BTF of vmlinuz-6.12".into(),
            ..TraceMeta::default()
        },
        functions,
        counts: vec![vec![1, 1], vec![1, 1], vec![1, 0]],
        returns: Vec::new(),
        callers: vec![sym("kernel_clone", 0xffff_ffff_8120_0000)],
        events,
        tasks: vec![
            Task {
                pid: 73,
                tgid: 73,
                comm: "wl-worker".into(),
            },
            Task {
                pid: 80,
                tgid: 80,
                comm: "wl-worker".into(),
            },
            Task {
                pid: 0,
                tgid: 0,
                comm: "swapper/1".into(),
            },
        ],
        args: vec![[0; 6]; 4],
        prototypes: Vec::new(),
        stacks: Vec::new(),
        fields: Default::default(),
    };
    t.fields.formats = vec![Some(switch), Some(fork), None];
    t.fields.values = (1..=4).zip(values).collect();
    t
}

#[test]
fn script_lines_are_ftraces_events() {
    let out = text(|w| write_script(&events_trace(), w));
    check("events.script.txt", out.as_bytes());
    let lines: Vec<&str> = out.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(
        lines,
        [
            "       wl-worker-73      (     73) [000]     5.000000: sched_process_fork: comm=wl-worker pid=73 child_comm=wl-worker child_pid=80",
            "       wl-worker-73      (     73) [000]     5.001000: sched_switch: prev_comm=wl-worker prev_pid=73 prev_prio=120 prev_state=S ==> next_comm=wl-worker next_pid=80 next_prio=120",
            "       wl-worker-80      (     80) [000]     5.002000: schedule <-kernel_clone",
            "          <idle>-0       (-------) [001]     5.003000: sched_switch: prev_comm=swapper/1 prev_pid=0 prev_prio=120 prev_state=R+ ==> next_comm=wl-worker next_pid=73 next_prio=120",
            "       wl-worker-73      (     73) [001]     5.004001: sched_process_fork: comm=wl-worker pid=73 child_comm=? child_pid=?",
        ]
    );
}

/// The text report counts each event, and its stored records by task.
#[test]
fn the_report_counts_events_by_task() {
    let out = render(&events_trace(), &ReportOptions::default());
    let at = out.find("# events (-e)").expect(&out);
    let lines: Vec<&str> = out[at..].lines().skip(2).collect();
    assert_eq!(
        lines,
        [
            "sched:sched_switch  2 (2 stored)",
            "             1  wl-worker-73",
            "             1  <idle>-0",
            "sched:sched_process_fork  2 (2 stored)",
            "             2  wl-worker-73",
        ]
    );
}

#[test]
fn csv_and_json_have_the_fields_by_name() {
    let t = events_trace();
    let csv = text(|w| write_csv(&t, w));
    check("events.csv", csv.as_bytes());
    let rows: Vec<&str> = csv.lines().collect();
    assert!(rows[0].ends_with(",event,fields"), "{}", rows[0]);
    assert!(rows[1].ends_with(
        ",sched:sched_process_fork,parent_comm=wl-worker parent_pid=73 child_comm=wl-worker child_pid=80"
    ), "{}", rows[1]);
    assert!(rows[3].ends_with(",,"), "{}", rows[3]);
    let json = serde_json::to_string_pretty(&to_json(&t)).unwrap() + "\n";
    check("events.json", json.as_bytes());
    let doc = to_json(&t);
    let ev = doc["trace_events"].as_array().unwrap();
    assert_eq!(ev.len(), 2);
    assert_eq!(ev[0]["event"], "sched:sched_switch");
    assert_eq!(ev[0]["count"], 2);
    let r = &ev[0]["records"][1];
    assert_eq!(r["pid"], 0);
    assert_eq!(r["fields"]["prev_state"], "R+");
    assert_eq!(r["fields"]["next_pid"], 73);
    let fork = &ev[1]["records"][1]["fields"];
    assert!(fork["child_pid"].is_null(), "{fork}");
    assert_eq!(ev[1]["tasks"][0]["count"], 2);
    // Chrome: each event's instant carries its line.
    let chrome = text(|w| write_chrome(&t, w));
    let doc: serde_json::Value = serde_json::from_str(&chrome).unwrap();
    let lines: Vec<&str> = doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["args"]["event"].as_str())
        .collect();
    assert_eq!(lines.len(), 4, "{chrome}");
    assert!(
        lines[1].starts_with("sched_switch: prev_comm=wl-worker prev_pid=73"),
        "{}",
        lines[1]
    );
}

/// Saved as version 15, byte for byte, and read back whole (the fork's
/// ftrace format too); the golden file reads back as the trace.
#[test]
fn the_data_file_keeps_the_fields() {
    let t = events_trace();
    let path = tmp("events.vmtrace");
    save(&t, &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(
        u32::from_le_bytes(bytes[8..12].try_into().unwrap()),
        DATA_VERSION
    );
    check("events.v15.data", &bytes);
    let back = load(&golden_dir().join("events.v15.data")).unwrap();
    assert_eq!(back.fields.values, t.fields.values);
    assert_eq!(
        back.fields.formats[1].as_ref().unwrap().ftrace,
        t.fields.formats[1].as_ref().unwrap().ftrace
    );
    let lines =
        |t: &Trace| -> Vec<Option<String>> { t.events.iter().map(|e| t.event_line(e)).collect() };
    assert_eq!(lines(&back), lines(&t));
    assert_eq!(back.event_name(1, false), Some("sched:sched_process_fork"));
    assert_eq!(load(&path).unwrap().fields.values, t.fields.values);
}

/// `golden/events.v13.data` was saved by the version-13 writer (before
/// functions could be added during the trace) from `events_trace`: it
/// still reads as what version 15 saves of it, and is byte for byte the
/// version-14 file but the version; and that file (before the fields'
/// sources and the returns' formats) reads as it too.
#[test]
fn a_version_13_data_file_still_reads() {
    let path = golden_dir().join("events.v13.data");
    let mut bytes = std::fs::read(&path).unwrap();
    assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 13);
    let now = tmp("events.now.vmtrace");
    save(&events_trace(), &now).unwrap();
    assert_eq!(load(&path).unwrap(), load(&now).unwrap());
    let v14 = golden_dir().join("events.v14.data");
    assert_eq!(load(&v14).unwrap(), load(&now).unwrap());
    bytes[8..12].copy_from_slice(&14u32.to_le_bytes());
    assert_eq!(std::fs::read(&v14).unwrap(), bytes);
}

/// `golden/events.v12.data` was saved by the version-12 writer (before
/// the events' ftrace formats) from `events_trace`: it still reads, its
/// values and lines as that trace's, with no ftrace format.
#[test]
fn a_version_12_data_file_still_reads() {
    let path = golden_dir().join("events.v12.data");
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 12);
    let (back, t) = (load(&path).unwrap(), events_trace());
    assert_eq!(back.fields.values, t.fields.values);
    let lines =
        |t: &Trace| -> Vec<Option<String>> { t.events.iter().map(|e| t.event_line(e)).collect() };
    assert_eq!(lines(&back), lines(&t));
    assert!(back
        .fields
        .formats
        .iter()
        .flatten()
        .all(|f| f.ftrace.is_none()));
}

/// `golden/values.v11.data` was saved by the version-11 writer (vmtrace
/// before this format kept events' fields) from `values_trace`: it still
/// reads as that trace, with no fields.
#[test]
fn a_version_11_data_file_still_reads() {
    let path = golden_dir().join("values.v11.data");
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 11);
    let back = load(&path).unwrap();
    assert!(back.fields.is_empty());
    assert_eq!(back, super::fixture::values_trace());
}
