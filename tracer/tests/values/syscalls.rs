//! A syscall's two events (`syscalls:sys_enter_openat` at its function's
//! entry, `sys_exit_openat` at its return) through the outputs: script
//! lines as the events' print formats make them, CSV's and the JSON
//! report's records, and the data file (version 15: the fields' sources, the
//! returns' formats) read back alike.

use tracer::kernel::events::fields::FieldValue;
use tracer::kernel::events::syscall_format::{self, PtRegs};
use tracer::kernel::events::{KernelEvent, TableEntry};
use tracer::kernel::symbols::Symbol;
use tracer::trace::datafile::{load, save};
use tracer::trace::export::script::write_script;
use tracer::trace::export::{to_json, write_csv};
use tracer::trace::model::{Event, Task, Trace, TraceMeta, RETURN_BIT};

use super::{text, tmp};

/// `struct pt_regs`' di, si, dx, r10, r8, r9 (Linux 6.12), and the
/// records' `struct trace_entry`.
const REGS: PtRegs = PtRegs {
    args: [112, 104, 96, 56, 72, 64],
    entry: 8,
};
/// The stack slot of the call's return address.
const SLOT: u64 = 0xffff_c900_0040_3f48;

fn event(name: &str, args: &[(&str, &str)]) -> KernelEvent {
    let table = TableEntry {
        nr: 257,
        func: "__x64_sys_openat".into(),
    };
    KernelEvent::declared("syscalls", name, args, Some(table))
}

/// One openat(2) of pid 73, entry and return (-ENOENT).
fn syscall_trace() -> Trace {
    let args = [
        ("int", "dfd"),
        ("const char *", "filename"),
        ("int", "flags"),
        ("umode_t", "mode"),
    ];
    let enter = syscall_format::format(&event("sys_enter_openat", &args), &REGS);
    let exit = syscall_format::format(&event("sys_exit_openat", &[("long", "ret")]), &REGS);
    let call = |ts_ns, slot, data| Event {
        ts_ns,
        parent: 0xffff_ffff_8120_0010,
        slot,
        func: 0,
        cpu: 0,
        task: 1,
        stack: 0,
        data,
    };
    let mut t = Trace {
        meta: TraceMeta {
            kernel: "vmlinuz-6.12".into(),
            cpus: 1,
            attach_ns: 4_000_000_000,
            detach_ns: 6_000_000_000,
            events_total: 1,
            stop_reason: "interrupted".into(),
            mode: "trap".into(),
            graph: true,
            args: true,
            retval: true,
            tasks: "from the BTF of vmlinuz-6.12".into(),
            ..TraceMeta::default()
        },
        functions: vec![Symbol {
            name: "__x64_sys_openat".into(),
            addr: 0xffff_ffff_8130_0000,
            size: 0x40,
        }],
        counts: vec![vec![1]],
        returns: vec![vec![1]],
        callers: Vec::new(),
        events: vec![
            call(5_000_000_000, SLOT, 1),
            call(5_000_100_000, SLOT | RETURN_BIT, -2i64 as u64),
        ],
        tasks: vec![Task {
            pid: 73,
            tgid: 73,
            comm: "wl-worker".into(),
        }],
        args: vec![[0; 6]],
        prototypes: Vec::new(),
        stacks: Vec::new(),
        fields: Default::default(),
    };
    t.fields.formats = vec![enter];
    t.fields.return_formats = vec![exit];
    let i = FieldValue::Int;
    t.fields.values = [(1, vec![i(257), i(-100), i(0x4033cb), i(0), i(0)])].into();
    t
}

fn event_lines(t: &Trace) -> Vec<String> {
    t.events.iter().filter_map(|e| t.event_line(e)).collect()
}

#[test]
fn a_syscalls_entry_and_return_are_its_two_events() {
    let t = syscall_trace();
    let want = [
        "sys_enter_openat: dfd: 0xffffffffffffff9c, filename: 0x004033cb, flags: 0x00000000, \
         mode: 0x00000000",
        "sys_exit_openat: 0xfffffffffffffffe",
    ];
    assert_eq!(event_lines(&t), want);
    let script = text(|w| write_script(&t, w));
    assert!(script.contains(want[1]), "{script}");
    let csv = text(|w| write_csv(&t, w));
    let exit = "syscalls:sys_exit_openat,__syscall_nr=257 ret=0xfffffffffffffffe";
    assert!(csv.contains(exit), "{csv}");
    let doc = to_json(&t);
    let ev = doc["trace_events"].as_array().unwrap();
    let names: Vec<&str> = ev.iter().map(|e| e["event"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["syscalls:sys_enter_openat", "syscalls:sys_exit_openat"]
    );
    assert_eq!(ev[0]["records"][0]["fields"]["__syscall_nr"], 257);
    assert_eq!(ev[1]["records"][0]["fields"]["ret"], "0xfffffffffffffffe");
    assert_eq!(ev[1]["count"], 1);
    // Saved and read back: the exit's number and `ret` from their sources.
    let path = tmp("syscalls.vmtrace");
    save(&t, &path).unwrap();
    let back = load(&path).unwrap();
    assert_eq!(event_lines(&back), want);
    // (The arguments' sources, the guest's registers, read as stored.)
    assert_eq!(back.fields.return_formats, t.fields.return_formats);
    assert_eq!(back.fields.values, t.fields.values);
    assert_eq!(back.event_name(0, true), Some("syscalls:sys_exit_openat"));
}
