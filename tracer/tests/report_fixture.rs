//! A synthetic trace shared by the report, trace-file and export tests
//! (included with `#[path]`; on its own it is an empty test crate).
#![allow(dead_code)]

use tracer::kernel::symbols::Symbol;
use tracer::trace::model::{Event, Param, Prototype, Trace, TraceMeta, ValueKind};

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
            task: 0,
            stack: 0,
            data: 0,
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
        tasks: Vec::new(),
        args: Vec::new(),
        prototypes: Vec::new(),
        stacks: Vec::new(),
        fields: Default::default(),
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
            task: 0,
            stack: 0,
            data: 0,
        })
        .collect();
    t.meta.events_dropped = t.meta.events_total.saturating_sub(n as u64);
    t
}

/// Function indices in `graph_trace().functions`.
pub const G_IRQ: u32 = 0; // hrtimer_interrupt
pub const G_RUN: u32 = 1; // __hrtimer_run_queues
pub const G_TICK: u32 = 2; // tick_sched_timer
pub const G_JIFFIES: u32 = 3; // tick_do_update_jiffies64, tail-called
pub const G_SCHEDULE: u32 = 4; // migrates: enters on vCPU 1, returns on vCPU 0
pub const G_EXIT: u32 = 5; // abandoned
pub const G_IDLE: u32 = 6; // still running at detach
pub const G_UNCALLED: u32 = 7;

/// Guest stacks of `graph_trace()` (16 KiB regions).
pub const STACK_A: u64 = 0xffff_c900_0001_0000;
pub const STACK_B: u64 = 0xffff_c900_0002_0000;
pub const STACK_C: u64 = 0xffff_c900_0003_0000;
pub const STACK_D: u64 = 0xffff_c900_0004_0000;
pub const SYSVEC: u64 = 0xffff_ffff_8200_2000;

/// The return-address slot `depth` levels into `stack` (0: unhooked).
pub fn slot(stack: u64, depth: u64) -> u64 {
    if stack == 0 {
        0
    } else {
        stack + 0x4000 - 8 - depth * 64
    }
}

/// A function-graph trace on 2 vCPUs, by hand, times in ns after the attach:
///
/// ```text
/// vCPU 0, stack A (an interrupt):
///   1000 hrtimer_interrupt {                      149 us
///   1200   __hrtimer_run_queues {                 15.8 us
///   1300     tick_sched_timer {                   15.101 us
///   1400       tick_do_update_jiffies64 (tail call, same slot)   15 us
///  16500     tick_sched_timer                     300 ns
///  200000 tick_sched_timer, unhooked
///  250000 a return of hrtimer_interrupt on stack D: unmatched
/// vCPU 1, stack B:
///   2000 cpu_idle_loop {                          (running at detach)
///   3000   hrtimer_interrupt                      2.5 us
///   6000   do_exit_thing (slot two levels in: abandoned by the next entry)
///   7000   __hrtimer_run_queues                   500 ns
/// vCPU 1, stack C (a task that moves to vCPU 0):
///   8000 schedule {                               32 us, returns on vCPU 0
///   9000   tick_sched_timer                       400 ns
/// ```
///
/// Counts and returns are exact (nothing dropped); one entry is unhooked.
pub fn graph_trace() -> Trace {
    let functions = vec![
        sym("hrtimer_interrupt", 0xffff_ffff_8100_1000, 0x200),
        sym("__hrtimer_run_queues", 0xffff_ffff_8100_1200, 0x200),
        sym("tick_sched_timer", 0xffff_ffff_8100_1400, 0x100),
        sym("tick_do_update_jiffies64", 0xffff_ffff_8100_1500, 0x100),
        sym("schedule", 0xffff_ffff_8100_1600, 0x100),
        sym("do_exit_thing", 0xffff_ffff_8100_1700, 0x100),
        sym("cpu_idle_loop", 0xffff_ffff_8100_1800, 0x100),
        sym("uncalled_graph", 0xffff_ffff_8100_1900, 0x100),
    ];
    let callers = vec![
        sym("hrtimer_interrupt", 0xffff_ffff_8100_1000, 0x200),
        sym("__hrtimer_run_queues", 0xffff_ffff_8100_1200, 0x200),
        sym("cpu_idle_loop", 0xffff_ffff_8100_1800, 0x100),
        sym("schedule", 0xffff_ffff_8100_1600, 0x100),
        sym("worker_thread", WORKER_THREAD, 0x200),
        sym("sysvec_apic_timer_interrupt", SYSVEC, 0x100),
    ];
    let mut callers = callers;
    callers.sort_by_key(|s| s.addr);
    let irq_ret = 0xffff_ffff_8100_1020;
    let run_ret = 0xffff_ffff_8100_1230;
    let idle_ret = 0xffff_ffff_8100_1840;
    let sched_ret = 0xffff_ffff_8100_1650;
    // (ts after attach, func, cpu, stack, slot depth, return?, parent)
    let list: &[(u64, u32, u32, u64, u64, bool, u64)] = &[
        (1_000, G_IRQ, 0, STACK_A, 0, false, SYSVEC + 0x10),
        (1_200, G_RUN, 0, STACK_A, 1, false, irq_ret),
        (1_300, G_TICK, 0, STACK_A, 2, false, run_ret),
        (1_400, G_JIFFIES, 0, STACK_A, 2, false, run_ret),
        (2_000, G_IDLE, 1, STACK_B, 0, false, WORKER_THREAD + 0x10),
        (3_000, G_IRQ, 1, STACK_B, 1, false, idle_ret),
        (5_500, G_IRQ, 1, STACK_B, 1, true, idle_ret),
        (6_000, G_EXIT, 1, STACK_B, 2, false, idle_ret + 8),
        (7_000, G_RUN, 1, STACK_B, 1, false, idle_ret + 16),
        (7_500, G_RUN, 1, STACK_B, 1, true, idle_ret + 16),
        (
            8_000,
            G_SCHEDULE,
            1,
            STACK_C,
            0,
            false,
            WORKER_THREAD + 0x20,
        ),
        (9_000, G_TICK, 1, STACK_C, 1, false, sched_ret),
        (9_400, G_TICK, 1, STACK_C, 1, true, sched_ret),
        (16_400, G_JIFFIES, 0, STACK_A, 2, true, run_ret),
        (16_401, G_TICK, 0, STACK_A, 2, true, run_ret),
        (16_500, G_TICK, 0, STACK_A, 2, false, run_ret + 8),
        (16_800, G_TICK, 0, STACK_A, 2, true, run_ret + 8),
        (17_000, G_RUN, 0, STACK_A, 1, true, irq_ret),
        (
            40_000,
            G_SCHEDULE,
            0,
            STACK_C,
            0,
            true,
            WORKER_THREAD + 0x20,
        ),
        (150_000, G_IRQ, 0, STACK_A, 0, true, SYSVEC + 0x10),
        (200_000, G_TICK, 0, 0, 0, false, run_ret + 8),
        (250_000, G_IRQ, 0, STACK_D, 0, true, SYSVEC + 0x10),
    ];
    let nfunc = functions.len();
    let mut counts = vec![vec![0u64; 2]; nfunc];
    let mut returns = vec![vec![0u64; 2]; nfunc];
    let events: Vec<Event> = list
        .iter()
        .map(|&(ts, func, cpu, stack, depth, ret, parent)| {
            let m = if ret { &mut returns } else { &mut counts };
            m[func as usize][cpu as usize] += 1;
            Event {
                ts_ns: ATTACH_NS + ts,
                parent,
                slot: slot(stack, depth) | u64::from(ret),
                func,
                cpu,
                task: 0,
                stack: 0,
                data: 0,
            }
        })
        .collect();
    let total: u64 = counts.iter().flatten().sum();
    let meta = TraceMeta {
        kernel: "guest/out/bzImage".to_string(),
        build_id: Some("fedcba9876543210fedcba9876543210fedcba98".to_string()),
        cpus: 2,
        attach_ns: ATTACH_NS,
        detach_ns: ATTACH_NS + 300_000,
        sites_patched: 8,
        attach_window_ns: 50_000,
        attach_latency_ns: 120_000,
        events_total: total,
        stop_reason: "duration elapsed".to_string(),
        mode: "exitless".to_string(),
        graph: true,
        unhooked: 1,
        tsc_khz: 2_000_000,
        ..TraceMeta::default()
    };
    Trace {
        meta,
        functions,
        counts,
        returns,
        callers,
        events,
        tasks: Vec::new(),
        args: Vec::new(),
        prototypes: Vec::new(),
        stacks: Vec::new(),
        fields: Default::default(),
    }
}

/// The guest tasks of `tasks_trace()`: the idle tasks of vCPUs 0 and 1
/// (pid 0), a shell (pid 57) that execs `ls` (a new entry, same pid), a
/// thread of its (pid 60, tgid 57), and a task whose comm needs escaping
/// everywhere.
pub fn tasks() -> Vec<tracer::trace::model::Task> {
    let task = |pid, tgid, comm: &str| tracer::trace::model::Task {
        pid,
        tgid,
        comm: comm.to_string(),
    };
    vec![
        task(0, 0, "swapper/0"),
        task(0, 0, "swapper/1"),
        task(57, 57, "sh"),
        task(57, 57, "ls"),
        task(60, 57, "gdbus"),
        task(4242, 4242, "odd,;na me\n"),
    ]
}

/// Where `tasks_trace()` got its tasks (`TraceMeta::tasks`).
pub const TASKS_SOURCE: &str = "BTF in guest/out/vmlinux";

/// `graph_trace()` with guest tasks (ids into `tasks()`, 0: unknown):
/// vCPU 0's interrupt runs in swapper/0 (one of its calls, at 16,500 ns,
/// has no known task), vCPU 1's idle loop in swapper/1, then sh (the
/// abandoned call) and, after its exec, ls; `schedule` in gdbus, a thread
/// of sh's process, which returns on vCPU 0; the unhooked call and the
/// unmatched return in the escaped task.
pub fn tasks_trace() -> Trace {
    let mut t = graph_trace();
    // Per event of graph_trace(), in order.
    let ids = [
        1, 1, 1, 1, 2, 2, 2, 3, 4, 4, 5, 5, 5, 1, 1, 0, 0, 1, 5, 1, 6, 6,
    ];
    assert_eq!(ids.len(), t.events.len());
    for (e, id) in t.events.iter_mut().zip(ids) {
        e.task = id;
    }
    t.tasks = tasks();
    t.meta.tasks = TASKS_SOURCE.to_string();
    t
}

/// `tasks_trace()` as an entry-only trace: no returns, no slots.
pub fn tasks_entry_trace() -> Trace {
    let mut t = tasks_trace();
    t.events.retain(|e| !e.is_return());
    for e in &mut t.events {
        e.slot = 0;
    }
    t.returns.clear();
    t.meta.graph = false;
    t.meta.unhooked = 0;
    t.meta.tsc_khz = 0;
    t
}

fn param(name: &str, kind: ValueKind, reg: u8) -> Param {
    Param {
        name: name.to_string(),
        kind,
        reg,
    }
}

/// `graph_trace()`'s prototypes with `--args --retval` (made up for the
/// tests, one of each kind and of what cannot be shown):
///
/// ```text
/// void *hrtimer_interrupt(struct clock_event_device *dev)   (returns ERR_PTR)
/// int __hrtimer_run_queues(struct hrtimer_cpu_base *cpu_base, ktime_t now,
///                          unsigned long flags, unsigned int active_mask)
/// enum hrtimer_restart tick_sched_timer(struct hrtimer *timer)
/// void tick_do_update_jiffies64(ktime_t now, bool update, char c)
/// void schedule(void)
/// long do_exit_thing(long code, struct pair p, ..., a7 on the stack)
/// cpu_idle_loop: no BTF
/// u8 uncalled_graph(s16 x)
/// ```
pub fn values_prototypes() -> Vec<Option<Prototype>> {
    let restart = ValueKind::Enum {
        size: 4,
        signed: false,
        names: vec![
            (0, "HRTIMER_NORESTART".into()),
            (1, "HRTIMER_RESTART".into()),
        ],
    };
    let proto = |params, ret, unshown: &[&str]| {
        Some(Prototype {
            params,
            ret,
            unshown: unshown.iter().map(|s| s.to_string()).collect(),
        })
    };
    vec![
        proto(
            vec![param("dev", ValueKind::Pointer, 0)],
            ValueKind::Pointer,
            &[],
        ),
        proto(
            vec![
                param("cpu_base", ValueKind::Pointer, 0),
                param("now", ValueKind::Signed(8), 1),
                param("flags", ValueKind::Unsigned(8), 2),
                param("active_mask", ValueKind::Unsigned(4), 3),
            ],
            ValueKind::Signed(4),
            &[],
        ),
        proto(vec![param("timer", ValueKind::Pointer, 0)], restart, &[]),
        proto(
            vec![
                param("now", ValueKind::Signed(8), 0),
                param("update", ValueKind::Bool, 1),
                param("c", ValueKind::Char, 2),
            ],
            ValueKind::Void,
            &[],
        ),
        proto(Vec::new(), ValueKind::Void, &[]),
        proto(
            vec![
                param("code", ValueKind::Signed(8), 0),
                param("a3", ValueKind::Signed(4), 3),
                param("a4", ValueKind::Signed(2), 4),
                param("a5", ValueKind::Signed(1), 5),
            ],
            ValueKind::Signed(8),
            &[
                "p: a struct passed by value (RSI, RDX)",
                "a7: not in a register (on the stack)",
            ],
        ),
        None,
        proto(
            vec![param("x", ValueKind::Signed(2), 0)],
            ValueKind::Unsigned(1),
            &[],
        ),
    ]
}

/// `graph_trace()` with arguments and return values (`--args
/// --retval`, `values_prototypes()`): every entry's registers but the
/// unhooked call's (not recorded: printed without them), each return's
/// RAX: ERR_PTR(-ENOMEM) and a pointer from hrtimer_interrupt, -EAGAIN in
/// an int's low half and 0 from __hrtimer_run_queues, HRTIMER_RESTART,
/// HRTIMER_NORESTART and an unnamed 7 from tick_sched_timer, whatever
/// RAX held after the void functions.
pub fn values_trace() -> Trace {
    let mut t = graph_trace();
    t.meta.args = true;
    t.meta.retval = true;
    t.prototypes = values_prototypes();
    // RAX at each return, in event order.
    let mut rets = [
        0xffff_ffff_ffff_fff4, // hrtimer_interrupt on vCPU 1: ERR_PTR(-ENOMEM)
        0x1_ffff_fff5,         // __hrtimer_run_queues: -11 in EAX
        1,                     // tick_sched_timer: HRTIMER_RESTART
        0xdead,                // tick_do_update_jiffies64: void
        0,                     // tick_sched_timer: HRTIMER_NORESTART
        7,                     // tick_sched_timer: no name
        0,                     // __hrtimer_run_queues: 0
        0x5555,                // schedule: void
        0xffff_8880_0abc_d000, // hrtimer_interrupt: a pointer
        0xffff_ffff_ffff_fff4, // the unmatched return
    ]
    .into_iter();
    let mut n = 0u64;
    for e in &mut t.events {
        if e.is_return() {
            e.data = rets.next().expect("a value per return");
            continue;
        }
        if e.slot == 0 {
            // The unhooked call: its arguments not recorded.
            continue;
        }
        n += 1;
        t.args.push([
            0xffff_8880_0000_1000 + n * 0x40,
            (-(n as i64) * 1_000_000) as u64,
            0xffff_ffff_0000_0000 | n,
            0x1_0000_0000 | (n * 3),
            0xff00 | n,
            (-(n as i64)) as u64,
        ]);
        e.data = t.args.len() as u64;
    }
    assert!(rets.next().is_none());
    t
}

/// `values_trace()` as an entry-only trace with `--args` alone.
pub fn values_entry_trace() -> Trace {
    let mut t = values_trace();
    t.events.retain(|e| !e.is_return());
    for e in &mut t.events {
        e.slot = 0;
    }
    t.returns.clear();
    t.meta.graph = false;
    t.meta.retval = false;
    t.meta.unhooked = 0;
    t.meta.tsc_khz = 0;
    t
}

/// How `stacks_trace()`'s stacks were unwound (`TraceMeta::stacks`).
pub const STACKS_NOTE: &str = "ORC (41234 entries, 6.1 layout)";
/// A return address in no caller function, in a stack.
pub const STACK_UNKNOWN: u64 = 0xffff_ffff_8300_0100;

/// The kernel stacks of `stacks_trace()`, by id (1-based) order:
///
/// 1. tick_sched_timer in vCPU 0's interrupt: __hrtimer_run_queues+0x30,
///    hrtimer_interrupt+0x20, sysvec_apic_timer_interrupt+0x10,
///    cpu_idle_loop+0x40; complete.
/// 2. schedule from worker_thread+0x20; entered from user mode.
/// 3. tick_sched_timer under schedule: schedule+0x50, worker_thread+0x20,
///    then an address in no known function; cut short (too deep).
/// 4. tick_sched_timer again: __hrtimer_run_queues+0x38, then a return
///    address at the very end of hrtimer_interrupt (its call was its last
///    instruction: the address is __hrtimer_run_queues' first byte);
///    complete.
pub fn stacks() -> Vec<tracer::kernel::unwind::Stack> {
    use tracer::kernel::unwind::{Stack, StackEnd};
    let stack = |frames: &[u64], end| Stack {
        frames: frames.to_vec(),
        end,
        exact: 0,
    };
    vec![
        stack(
            &[
                0xffff_ffff_8100_1230,
                0xffff_ffff_8100_1020,
                SYSVEC + 0x10,
                0xffff_ffff_8100_1840,
            ],
            StackEnd::Bottom,
        ),
        stack(&[WORKER_THREAD + 0x20], StackEnd::User),
        stack(
            &[0xffff_ffff_8100_1650, WORKER_THREAD + 0x20, STACK_UNKNOWN],
            StackEnd::TooDeep,
        ),
        stack(
            &[0xffff_ffff_8100_1238, 0xffff_ffff_8100_1200],
            StackEnd::Bottom,
        ),
    ]
}

/// `tasks_trace()` with `--stack 'tick_sched_timer,schedule'`: every entry
/// of those two carries its kernel stack (`stacks()`): tick_sched_timer's
/// at 1,300 and 200,000 ns stack 1, at 9,000 ns stack 3, at 16,500 ns
/// stack 4; schedule's (8,000 ns) stack 2.
pub fn stacks_trace() -> Trace {
    let mut t = tasks_trace();
    for e in t.events.iter_mut().filter(|e| !e.is_return()) {
        e.stack = match (e.func, e.ts_ns - ATTACH_NS) {
            (G_TICK, 1_300 | 200_000) => 1,
            (G_SCHEDULE, _) => 2,
            (G_TICK, 9_000) => 3,
            (G_TICK, 16_500) => 4,
            _ => 0,
        };
    }
    t.stacks = stacks();
    t.meta.stacks = STACKS_NOTE.to_string();
    t.meta.stack_funcs = vec![G_TICK, G_SCHEDULE];
    t
}
