//! Fields of Debian 6.12's events (its bzImage's BTF), and their values
//! read from a task laid out as its BTF says.

use std::collections::HashMap;

use super::super::field_values::{
    read_fields, read_fields_where, render, state_letters, switch_state,
};
use super::*;
use crate::kernel::events::EventTable;

/// Debian 6.12's events and offsets, loaded once for the tests here (a
/// bzImage's payload and BTF take seconds to read).
fn debian_612() -> Option<&'static (EventTable, FieldOffsets)> {
    static LOADED: std::sync::OnceLock<Option<(EventTable, FieldOffsets)>> =
        std::sync::OnceLock::new();
    let load = || {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../guest/out/debian-6.12/vmlinuz");
        if !p.is_file() {
            eprintln!("SKIPPED: {} is not built", p.display());
            return None;
        }
        let image = crate::kernel::bzimage::load(&p).unwrap().0;
        let btf = KernelBtf::from_image(&image).unwrap();
        let off = FieldOffsets::find(&btf).unwrap();
        Some((EventTable::read(&image, &btf).unwrap(), off))
    };
    LOADED.get_or_init(load).as_ref()
}

fn format(t: &EventTable, full: &str) -> EventFormat {
    let e = t.events.iter().find(|e| e.full_name() == full).unwrap();
    EventFormat::of(e).unwrap()
}

fn names(f: &EventFormat) -> Vec<&str> {
    f.fields.iter().map(|f| f.name.as_str()).collect()
}

/// Guest memory as a map of byte runs.
struct Mem(HashMap<u64, Vec<u8>>);

impl Mem {
    fn put(&mut self, va: u64, b: &[u8]) {
        self.0.insert(va, b.to_vec());
    }
    fn read(&self, va: u64, buf: &mut [u8]) -> bool {
        for (&at, b) in &self.0 {
            if va >= at && va + buf.len() as u64 <= at + b.len() as u64 {
                let s = (va - at) as usize;
                buf.copy_from_slice(&b[s..s + buf.len()]);
                return true;
            }
        }
        false
    }
    fn task(&mut self, off: &FieldOffsets, at: u64, comm: &str, pid: i32, prio: i32) {
        let mut c = [0u8; 16];
        c[..comm.len()].copy_from_slice(comm.as_bytes());
        self.put(at + u64::from(off.comm), &c);
        self.put(at + u64::from(off.pid), &pid.to_le_bytes());
        self.put(at + u64::from(off.prio), &prio.to_le_bytes());
        self.put(at + u64::from(off.exit_state), &0i32.to_le_bytes());
    }
}

#[test]
fn covered_events_have_ftraces_fields_and_others_their_arguments() {
    let Some((t, off)) = debian_612() else {
        return;
    };
    // Not at the start, and apart.
    assert!(off.comm > 0 && off.pid > 0 && off.comm != off.pid && off.cpu.is_some());
    let s = format(t, "sched:sched_switch");
    assert!(s.covered);
    assert_eq!(
        names(&s),
        [
            "prev_comm",
            "prev_pid",
            "prev_prio",
            "prev_state",
            "next_comm",
            "next_pid",
            "next_prio"
        ]
    );
    let fork = format(t, "sched:sched_process_fork");
    assert_eq!(
        names(&fork),
        ["parent_comm", "parent_pid", "child_comm", "child_pid"]
    );
    // As ftrace prints it (sched.h's TP_printk).
    let values = [
        FieldValue::Str("wl-worker".into()),
        FieldValue::Int(73),
        FieldValue::Str("wl-worker".into()),
        FieldValue::Int(80),
    ];
    assert_eq!(
        render(&fork, &values),
        "comm=wl-worker pid=73 child_comm=wl-worker child_pid=80"
    );
    let newtask = format(t, "task:task_newtask");
    let values = [
        FieldValue::Int(80),
        FieldValue::Str("wl-worker".into()),
        FieldValue::Int(0x1200011),
        FieldValue::Int(0),
    ];
    // task.h: `clone_flags=%lx`.
    assert_eq!(
        render(&newtask, &values),
        "pid=80 comm=wl-worker clone_flags=1200011 oom_score_adj=0"
    );
    let rename = format(t, "task:task_rename");
    assert_eq!(
        names(&rename),
        ["pid", "oldcomm", "newcomm", "oom_score_adj"]
    );
    for e in [
        "sched:sched_wakeup",
        "sched:sched_waking",
        "sched:sched_process_exec",
        "sched:sched_process_exit",
        "task:task_newtask",
    ] {
        assert!(format(t, e).covered, "{e}");
    }
    // Not covered: its arguments, by name and type.
    let irq = format(t, "irq:irq_handler_entry");
    assert!(!irq.covered);
    assert_eq!(names(&irq), ["irq", "action"]);
    assert_eq!(
        (irq.fields[0].print, irq.fields[1].print),
        (Print::Int, Print::Hex)
    );
}

#[test]
fn sched_switch_reads_both_tasks_as_ftrace_prints_them() {
    let Some((t, off)) = debian_612() else {
        return;
    };
    let (prev, next) = (0xffff_8880_0100_0000u64, 0xffff_8880_0200_0000u64);
    let mut m = Mem(HashMap::new());
    m.task(off, prev, "wl-worker", 73, 120);
    m.task(off, next, "swapper/1", 0, 120);
    let f = format(t, "sched:sched_switch");
    // preempt, prev, next, prev_state (TASK_INTERRUPTIBLE).
    let v = read_fields(&f, &[0, prev, next, 1], off, &mut |va, b| m.read(va, b));
    assert_eq!(
        render(&f, &v),
        "prev_comm=wl-worker prev_pid=73 prev_prio=120 prev_state=S ==> \
         next_comm=swapper/1 next_pid=0 next_prio=120"
    );
    // A task not mapped: its fields say so, the others are read.
    let v = read_fields(&f, &[1, prev, 0x1000, 0], off, &mut |va, b| m.read(va, b));
    assert_eq!(
        render(&f, &v),
        "prev_comm=wl-worker prev_pid=73 prev_prio=120 prev_state=R+ ==> \
         next_comm=? next_pid=? next_prio=?"
    );
}

#[test]
fn switch_states_are_ftraces() {
    for (preempt, state, exit, want) in [
        (false, 0, 0, "R"),
        (true, 1, 0, "R+"),
        (false, 1, 0, "S"),
        (false, 2, 0, "D"),
        (false, 0x402, 0, "I"),
        // TASK_DEAD, exiting: EXIT_ZOMBIE.
        (false, 0x80, 0x20, "Z"),
        (false, 0x1000, 0, "D"),
    ] {
        let s = switch_state(preempt, state, exit);
        assert_eq!(state_letters(s), want, "{preempt} {state:#x} {exit:#x}");
    }
}

#[test]
fn a_later_read_leaves_what_does_not_last_unread_and_untouched() {
    let Some((t, off)) = debian_612() else {
        return;
    };
    let (task, name) = (0xffff_8880_0100_0000u64, 0xffff_8880_0300_0000u64);
    let mut m = Mem(HashMap::new());
    m.task(off, task, "wl-worker", 73, 120);
    let rename = format(t, "task:task_rename");
    let mut touched = Vec::new();
    let v = read_fields_where(
        &rename,
        &[task, name],
        off,
        &mut |va, b| {
            touched.push(va);
            m.read(va, b)
        },
        |i| rename.lasts(i),
    );
    // pid and oom_score_adj read; oldcomm (the task's comm, overwritten
    // right after the event) and newcomm (the caller's buffer) not read.
    assert_eq!(v[1], FieldValue::Unread);
    assert_eq!(v[2], FieldValue::Unread);
    assert_eq!(v[0], FieldValue::Int(73));
    let comm = task + u64::from(off.comm);
    assert!(
        touched.iter().all(|&va| va != comm && va != name),
        "read {touched:x?}"
    );
}
