//! A synthetic trace shared by the report, trace-file and export tests
//! (included with `#[path]`; on its own it is an empty test crate).
#![allow(dead_code)]

use tracer::model::{Event, Trace, TraceMeta};
use tracer::symbols::Symbol;

pub const LONG_NAME_LEN: usize = 200;
pub const ATTACH_NS: u64 = 1_000_000_000_000;
pub const WORKER_THREAD: u64 = 0xffff_ffff_8200_0000;
pub const KTHREAD: u64 = 0xffff_ffff_8200_1000;
/// A return address in no caller function.
pub const UNKNOWN_IP: u64 = 0xffff_ffff_8300_dead;

pub fn long_name() -> String {
    let mut s = String::from("very_long_");
    while s.len() < LONG_NAME_LEN {
        s.push_str("abcdefghij");
    }
    s.truncate(LONG_NAME_LEN);
    s
}

fn sym(name: &str, addr: u64, size: u64) -> Symbol {
    Symbol {
        name: name.to_string(),
        addr,
        size,
    }
}

/// Function indices in `trace().functions`.
pub const SCHEDULE: u32 = 0;
pub const DO_IDLE: u32 = 1;
pub const HRTIMER: u32 = 2;
pub const UNCALLED_A: u32 = 3;
pub const LONG: u32 = 4;
pub const ONLY_CPU2: u32 = 5;
pub const UNCALLED_B: u32 = 6;

/// 4 vCPUs, 7 functions (2 never called, one with a 200-character name, one
/// called only on vCPU 2), callers inside `worker_thread` and `kthread` plus
/// one unknown return address, and dropped events.
pub fn trace() -> Trace {
    let functions = vec![
        sym("schedule", 0xffff_ffff_8100_0000, 0x100),
        sym("do_idle", 0xffff_ffff_8100_0100, 0x80),
        sym("hrtimer_interrupt", 0xffff_ffff_8100_0200, 0x40),
        sym("uncalled_a", 0xffff_ffff_8100_0300, 0x10),
        sym(&long_name(), 0xffff_ffff_8100_0400, 0x10),
        sym("only_cpu2", 0xffff_ffff_8100_0500, 0x10),
        sym("uncalled_b", 0xffff_ffff_8100_0600, 0x10),
    ];
    let counts = vec![
        vec![1000, 998, 1003, 1011],
        vec![500, 0, 500, 0],
        vec![10, 20, 30, 40],
        vec![0, 0, 0, 0],
        vec![1_234_567, 0, 0, 0],
        vec![0, 0, 7, 0],
        vec![0, 0, 0, 0],
    ];
    let callers = vec![
        sym("worker_thread", WORKER_THREAD, 0x200),
        sym("kthread", KTHREAD, 0x100),
    ];
    // (function, vCPU, return address)
    let stored: &[(u32, u32, u64)] = &[
        (SCHEDULE, 0, WORKER_THREAD + 0x10),
        (SCHEDULE, 1, WORKER_THREAD + 0x10),
        (SCHEDULE, 2, WORKER_THREAD + 0x20),
        (SCHEDULE, 3, WORKER_THREAD + 0x1ff),
        (SCHEDULE, 2, WORKER_THREAD + 0x30),
        (SCHEDULE, 0, KTHREAD + 0x8),
        (SCHEDULE, 2, KTHREAD + 0x8),
        (SCHEDULE, 3, UNKNOWN_IP),
        (DO_IDLE, 0, KTHREAD + 0x50),
        (DO_IDLE, 2, KTHREAD + 0x50),
        (DO_IDLE, 2, KTHREAD + 0x50),
        (HRTIMER, 1, WORKER_THREAD + 0x44),
        (HRTIMER, 3, 0),
        (LONG, 0, KTHREAD),
        (ONLY_CPU2, 2, WORKER_THREAD + 0x80),
    ];
    let events: Vec<Event> = stored
        .iter()
        .enumerate()
        .map(|(i, &(func, cpu, parent))| Event {
            ts_ns: ATTACH_NS + 1_000 + i as u64 * 1_234_567,
            parent,
            slot: 0,
            func,
            cpu,
        })
        .collect();
    let total: u64 = counts.iter().flatten().sum();
    let meta = TraceMeta {
        kernel: "/boot/vmlinuz-6.8-test".to_string(),
        build_id: Some("0123456789abcdef0123456789abcdef01234567".to_string()),
        cpus: 4,
        attach_ns: ATTACH_NS,
        detach_ns: ATTACH_NS + 2_500_000_000,
        sites_patched: 12_345,
        sites_skipped_init: 678,
        sites_skipped_other: 9,
        attach_window_ns: 123_456,
        attach_latency_ns: 7_890,
        events_total: total,
        events_dropped: total - events.len() as u64,
        parent_unreadable: 1,
        stop_reason: "duration elapsed".to_string(),
        mode: "trap".to_string(),
        trap_exits: total,
        ..TraceMeta::default()
    };
    Trace {
        meta,
        functions,
        counts,
        returns: Vec::new(),
        callers,
        events,
    }
}

/// A bigger trace: `n` events spread over 4 vCPUs and 3 functions.
pub fn big_trace(n: usize) -> Trace {
    let mut t = trace();
    t.events = (0..n)
        .map(|i| Event {
            ts_ns: ATTACH_NS + i as u64 * 7,
            parent: if i % 3 == 0 {
                WORKER_THREAD + 4
            } else {
                KTHREAD + 4
            },
            slot: 0,
            func: (i % 3) as u32,
            cpu: (i % 4) as u32,
        })
        .collect();
    t.meta.events_dropped = t.meta.events_total.saturating_sub(n as u64);
    t
}
