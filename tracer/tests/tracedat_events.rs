//! The traced events (`-e`) in trace.dat, read by Debian's `trace-cmd
//! report`: each event's ftrace format as the default guest's kernel
//! (Linux 6.1, `guest/out/vmlinux`) lays it out, read from its image and
//! checked against its BTF; and a trace of sched_switch, sched_wakeup,
//! sched_process_fork, sched_process_exec (a `__data_loc` string),
//! task_rename and an event vmtrace shows raw (irq_handler_entry), whose
//! every event line `trace-cmd report` prints has the fields `vmtrace
//! script` prints. A kernel not built is skipped with a message, as
//! elsewhere.

use std::path::PathBuf;
use std::process::Command;

use tracer::kernel::btf::KernelBtf;
use tracer::kernel::events::fields::{EventFormat, FieldValue};
use tracer::kernel::events::ftrace_format::{self, FtraceFormat};
use tracer::kernel::events::{EventKind, EventTable, KernelEvent};
use tracer::kernel::symbols::{KernelImage, Symbol};
use tracer::trace::export::write_tracedat;
use tracer::trace::model::{Event, Task, Trace, TraceMeta};

/// The default guest's vmlinux, or None (skipped) when not built.
fn vmlinux() -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../guest/out/vmlinux");
    if p.is_file() {
        return Some(p);
    }
    eprintln!(
        "SKIPPED: {} is not built; run `bash guest/build.sh linux`",
        p.display()
    );
    None
}

/// `field:` lines as the kernel's `format` file prints them.
fn field_lines(f: &FtraceFormat) -> Vec<String> {
    f.fields
        .iter()
        .map(|f| {
            let (ty, name) = f.declaration();
            let signed = u8::from(f.signed);
            format!(
                "field:{ty} {name};\toffset:{};\tsize:{};\tsigned:{signed};",
                f.offset, f.size
            )
        })
        .collect()
}

/// Every tracepoint event of Linux 6.1 has its format in the image, each
/// laid out where BTF's `trace_event_raw_NAME` puts its fields; those of
/// the events vmtrace computes are tracefs's (Linux 6.1 on x86-64, whose
/// `char` is signed).
#[test]
fn every_tracepoints_format_is_read_from_the_image() {
    let Some(path) = vmlinux() else { return };
    let image = KernelImage::load(&path).unwrap();
    let btf = KernelBtf::from_image(&image).unwrap();
    let table = EventTable::read(&image, &btf).unwrap();
    let tracepoints: Vec<&KernelEvent> = table
        .listed()
        .filter(|e| e.kind == EventKind::Tracepoint)
        .collect();
    assert!(tracepoints.len() > 100, "{}", tracepoints.len());
    let unread: Vec<String> = tracepoints
        .iter()
        .filter(|e| ftrace_format::read(&image, &btf, e).is_none())
        .map(|e| e.full_name())
        .collect();
    assert!(unread.is_empty(), "{unread:?}");
    let format = |name: &str| {
        let e = tracepoints.iter().find(|e| e.name == name).unwrap();
        ftrace_format::read(&image, &btf, e).unwrap()
    };
    let switch = format("sched_switch");
    assert_eq!(
        field_lines(&switch),
        [
            "field:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:1;",
            "field:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;",
            "field:int prev_prio;\toffset:28;\tsize:4;\tsigned:1;",
            "field:long prev_state;\toffset:32;\tsize:8;\tsigned:1;",
            "field:char next_comm[16];\toffset:40;\tsize:16;\tsigned:1;",
            "field:pid_t next_pid;\toffset:56;\tsize:4;\tsigned:1;",
            "field:int next_prio;\toffset:60;\tsize:4;\tsigned:1;",
        ]
    );
    assert!(
        switch.print_fmt.starts_with(
            "\"prev_comm=%s prev_pid=%d prev_prio=%d prev_state=%s%s ==> next_comm=%s \
             next_pid=%d next_prio=%d\", REC->prev_comm, REC->prev_pid, REC->prev_prio, \
             (REC->prev_state & "
        ),
        "{}",
        switch.print_fmt
    );
    assert_eq!(
        field_lines(&format("sched_process_exec")),
        [
            "field:__data_loc char[] filename;\toffset:8;\tsize:4;\tsigned:1;",
            "field:pid_t pid;\toffset:12;\tsize:4;\tsigned:1;",
            "field:pid_t old_pid;\toffset:16;\tsize:4;\tsigned:1;",
        ]
    );
    assert_eq!(
        format("task_rename").print_fmt,
        "\"pid=%d oldcomm=%s newcomm=%s oom_score_adj=%hd\", REC->pid, REC->oldcomm, \
         REC->newcomm, REC->oom_score_adj"
    );
}

/// Debian's 6.12 cloud kernel, from its bzImage alone (the image the QEMU
/// tests attach to): every tracepoint's format read too, and
/// sched_switch's comms unsigned (Linux 6.2 and later build with
/// `-funsigned-char`), as its tracefs prints them.
#[test]
fn debian_612_formats_from_its_bzimage() {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../guest/out/debian-6.12/vmlinuz");
    if !p.is_file() {
        eprintln!(
            "SKIPPED: {} is not built; run `bash guest/build.sh debian-6.12`",
            p.display()
        );
        return;
    }
    let image = tracer::kernel::bzimage::load(&p).unwrap().0;
    let btf = KernelBtf::from_image(&image).unwrap();
    let table = EventTable::read(&image, &btf).unwrap();
    let tracepoints = table.listed().filter(|e| e.kind == EventKind::Tracepoint);
    let (mut read, mut unread) = (0, Vec::new());
    for e in tracepoints {
        match ftrace_format::read(&image, &btf, e) {
            Some(f) if e.name == "sched_switch" => {
                assert_eq!(
                    field_lines(&f)[..2],
                    [
                        "field:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;",
                        "field:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;",
                    ]
                );
                read += 1;
            }
            Some(_) => read += 1,
            None => unread.push(e.full_name()),
        }
    }
    assert!(
        read > 500 && unread.is_empty(),
        "{read} read; not: {unread:?}"
    );
}

/// A trace of events with their fields, on two vCPUs: one event of each
/// name (its arguments and values given), then the task that ran it.
struct Recorded<'a> {
    event: &'a str,
    values: Vec<FieldValue>,
    cpu: u32,
    task: u32,
}

fn trace_of(image: &KernelImage, btf: &KernelBtf, recorded: &[Recorded]) -> Trace {
    let table = EventTable::read(image, btf).unwrap();
    let mut names: Vec<&str> = recorded.iter().map(|r| r.event).collect();
    names.dedup();
    let mut formats = Vec::new();
    let mut functions = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let e = table.events.iter().find(|e| e.name == *name).unwrap();
        let f = EventFormat::of(e).unwrap();
        formats.push(Some(EventFormat {
            ftrace: ftrace_format::read(image, btf, e),
            ..f
        }));
        functions.push(Symbol {
            name: format!("__traceiter_{name}"),
            addr: 0xffff_ffff_8110_0000 + 0x100 * i as u64,
            size: 0x40,
        });
    }
    let events = recorded
        .iter()
        .enumerate()
        .map(|(n, r)| Event {
            ts_ns: 5_000_000_000 + n as u64 * 1_000_250,
            parent: 0xffff_ffff_8120_0010,
            slot: 0,
            func: names.iter().position(|&x| x == r.event).unwrap() as u32,
            cpu: r.cpu,
            task: r.task,
            stack: 0,
            data: n as u64 + 1,
        })
        .collect();
    let mut t = Trace {
        meta: TraceMeta {
            kernel: "vmlinux".into(),
            cpus: 2,
            attach_ns: 4_000_000_000,
            detach_ns: 6_000_000_000,
            events_total: recorded.len() as u64,
            stop_reason: "interrupted".into(),
            mode: "trap".into(),
            args: true,
            ..TraceMeta::default()
        },
        counts: functions.iter().map(|_| vec![1, 1]).collect(),
        functions,
        events,
        tasks: vec![
            Task {
                pid: 73,
                tgid: 73,
                comm: "wl-worker".into(),
            },
            Task {
                pid: 0,
                tgid: 0,
                comm: "swapper/1".into(),
            },
        ],
        args: vec![[0; 6]; recorded.len()],
        ..Trace::default()
    };
    t.fields.formats = formats;
    t.fields.values = (1..)
        .zip(recorded.iter().map(|r| r.values.clone()))
        .collect();
    t
}

/// `trace-cmd report -N`'s lines of `file` past its `cpus=` line: event
/// name and its fields as printed. (`-N`: no plugins; trace-cmd's own
/// for sched_switch and sched_wakeup print them their short way,
/// `wl-worker:73 [120] S ==> ...`, from the same fields.)
fn trace_cmd_report(file: &std::path::Path) -> Vec<String> {
    let out = Command::new("trace-cmd")
        .args(["report", "-N", "-i"])
        .arg(file)
        .output()
        .expect("trace-cmd is not installed: apt-get install trace-cmd (CI's .ci/run does)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.trim().is_empty(), "{stderr}");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .skip(1)
        .map(|l| {
            // "  wl-worker-73  [000]  5.000000: sched_switch:   prev_comm=..."
            let (_, rest) = l.split_once("]").unwrap_or_else(|| panic!("{l}"));
            let (_, rest) = rest.split_once(": ").unwrap_or_else(|| panic!("{l}"));
            let (event, fields) = rest.split_once(':').unwrap_or_else(|| panic!("{l}"));
            format!("{event}: {}", fields.trim())
        })
        .collect()
}

#[test]
fn trace_cmd_report_prints_each_event_as_script_does() {
    let Some(path) = vmlinux() else { return };
    let image = KernelImage::load(&path).unwrap();
    let btf = KernelBtf::from_image(&image).unwrap();
    let s = |v: &str| FieldValue::Str(v.into());
    let i = FieldValue::Int;
    let rec = |event, values, cpu, task| Recorded {
        event,
        values,
        cpu,
        task,
    };
    let worker = || s("wl-worker");
    let switch = vec![worker(), i(73), i(120), i(1), s("swapper/1"), i(0), i(120)];
    let back = vec![
        s("swapper/1"),
        i(0),
        i(120),
        i(0x100),
        worker(),
        i(73),
        i(120),
    ];
    let recorded = [
        rec("sched_switch", switch, 0, 1),
        rec("sched_wakeup", vec![worker(), i(73), i(120), i(1)], 1, 2),
        rec("sched_switch", back, 1, 2),
        rec(
            "sched_process_fork",
            vec![worker(), i(73), worker(), i(80)],
            1,
            1,
        ),
        rec(
            "task_rename",
            vec![i(73), worker(), s("wl-child"), i(-17)],
            1,
            1,
        ),
        rec(
            "sched_process_exec",
            vec![s("/usr/lib/a-long-name/bin/true"), i(73), i(73)],
            0,
            1,
        ),
        rec(
            "sched_process_fork",
            vec![worker(), i(73), FieldValue::Unread, FieldValue::Unread],
            0,
            1,
        ),
        // Shown raw: vmtrace's own format.
        rec(
            "irq_handler_entry",
            vec![i(16), i(0xffff_8880_03a1_c000u64 as i64)],
            0,
            1,
        ),
    ];
    let trace = trace_of(&image, &btf, &recorded);
    let script: Vec<String> = trace
        .events
        .iter()
        .map(|e| trace.event_line(e).unwrap())
        .collect();
    let file = std::env::temp_dir().join(format!("vmtrace-tpdat-{}.dat", std::process::id()));
    let mut bytes = Vec::new();
    write_tracedat(&trace, &mut bytes).unwrap();
    std::fs::write(&file, bytes).unwrap();
    let report = trace_cmd_report(&file);
    let _ = std::fs::remove_file(&file);
    // Unread values: script prints `?`, the record holds 0 (an empty
    // string for a comm), as the kernel's record would have something.
    let want: Vec<String> = script
        .iter()
        .map(|l| l.replace("child_comm=? child_pid=?", "child_comm= child_pid=0"))
        .collect();
    assert_eq!(report, want);
    assert!(want[0].starts_with("sched_switch: prev_comm=wl-worker prev_pid=73"));
    assert!(want[5].contains("filename=/usr/lib/a-long-name/bin/true pid=73"));
}
