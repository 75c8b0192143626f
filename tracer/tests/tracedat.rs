//! `export::write_tracedat` (trace-cmd's trace.dat) read back by trace-cmd
//! itself: every trace is written with `write_tracedat` and printed by
//! `trace-cmd report`, whose lines must be the trace's entries, vCPU by
//! vCPU, with their function and caller names and their times.
//!
//! trace-cmd must be installed (`apt-get install trace-cmd`; CI's `.ci/run`
//! installs it): without it these tests fail, they do not skip.

#[path = "report_fixture.rs"]
mod fixture;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use tracer::kernel::symbols::Symbol;
use tracer::trace::export::tracedat::{write_tracedat_counted, TracedatCounts, UNKNOWN_SYMBOL};
use tracer::trace::export::write_tracedat;
use tracer::trace::model::{Event, Trace, TraceMeta, RETURN_BIT};

/// One event line of `trace-cmd report`.
#[derive(Debug, PartialEq)]
struct Line {
    comm: String,
    pid: u32,
    cpu: u32,
    /// The timestamp as printed: seconds, then the fraction's digits.
    ts: String,
    event: String,
    /// What the event's handler printed, trimmed.
    text: String,
}

/// What `trace-cmd report` printed: the `cpus=N` header and the events.
#[derive(Debug, PartialEq)]
struct Report {
    cpus: u32,
    lines: Vec<Line>,
}

/// A file name no other test (or run) uses.
fn scratch(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!(
        "vmtrace-tracedat-{}-{n}-{tag}.dat",
        std::process::id()
    ))
}

/// Writes `trace` and runs `trace-cmd report ARGS -i FILE` on it: it must
/// succeed and say nothing on stderr.
fn report(trace: &Trace, tag: &str, args: &[&str]) -> Report {
    parse(&trace_cmd(trace, tag, "report", args))
}

/// Writes `trace` and runs `trace-cmd COMMAND ARGS -i FILE` on it: it must
/// succeed and say nothing on stderr. Its stdout.
fn trace_cmd(trace: &Trace, tag: &str, command: &str, args: &[&str]) -> String {
    let path = scratch(tag);
    let mut bytes = Vec::new();
    write_tracedat(trace, &mut bytes).expect("write_tracedat");
    std::fs::write(&path, &bytes).unwrap();
    let out = Command::new("trace-cmd")
        .arg(command)
        .args(args)
        .arg("-i")
        .arg(&path)
        .output();
    let out = match out {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "trace-cmd is not installed: `apt-get install trace-cmd` \
             (CI's .ci/run installs it); these tests read trace.dat with it"
        ),
        Err(e) => panic!("running trace-cmd: {e}"),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "trace-cmd {command} failed ({}) on {}: {stderr}",
        out.status,
        path.display()
    );
    assert!(
        stderr.trim().is_empty(),
        "trace-cmd {command} complained about {}: {stderr}",
        path.display()
    );
    let _ = std::fs::remove_file(&path);
    stdout.into_owned()
}

fn parse(stdout: &str) -> Report {
    let mut it = stdout.lines();
    let first = it.next().expect("no output");
    let cpus = first
        .strip_prefix("cpus=")
        .unwrap_or_else(|| panic!("first line {first:?}"))
        .parse()
        .unwrap();
    let lines = it
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let bad = || -> ! { panic!("unexpected line {l:?}") };
            // "   vcpu0-1     [000]     0.001000: function:   name <-- caller"
            let (task, rest) = l.trim_start().split_once(" [").unwrap_or_else(|| bad());
            let (comm, pid) = task.trim_end().rsplit_once('-').unwrap_or_else(|| bad());
            let (cpu, rest) = rest.split_once(']').unwrap_or_else(|| bad());
            let (ts, rest) = rest.trim_start().split_once(": ").unwrap_or_else(|| bad());
            let (event, text) = rest.split_once(':').unwrap_or_else(|| bad());
            Line {
                comm: comm.to_string(),
                pid: pid.parse().unwrap_or_else(|_| bad()),
                cpu: cpu.parse().unwrap_or_else(|_| bad()),
                ts: ts.to_string(),
                event: event.to_string(),
                text: text.trim().to_string(),
            }
        })
        .collect();
    Report { cpus, lines }
}

/// A printed timestamp in units of 10^-digits s: `S.FFFFFF` (or, for
/// small times, libtraceevent's plain count of those units).
fn units(ts: &str, digits: u32) -> u64 {
    match ts.split_once('.') {
        Some((s, f)) => {
            assert_eq!(f.len() as u32, digits, "timestamp {ts}");
            s.parse::<u64>().unwrap() * 10u64.pow(digits) + f.parse::<u64>().unwrap()
        }
        None => ts.parse().unwrap(),
    }
}

/// The name trace-cmd prints for return address `ip`: its caller's, else
/// `[unknown]` between the symbols, else hex (outside all of them).
fn parent_name(trace: &Trace, ip: u64) -> String {
    if let Some(s) = trace.caller_of(ip) {
        return s.name.clone();
    }
    let all = trace.functions.iter().chain(&trace.callers);
    let first = all.clone().map(|s| s.addr).min().unwrap_or(0);
    let end = all.map(|s| s.addr + s.size.max(1)).max().unwrap_or(0);
    if ip < first || ip > end {
        format!("0x{ip:x}")
    } else {
        UNKNOWN_SYMBOL.to_string()
    }
}

/// The entries trace-cmd must print, per vCPU, in order: (ts_ns, function, caller).
fn expected(trace: &Trace) -> BTreeMap<u32, Vec<(u64, String, String)>> {
    let mut per_cpu: BTreeMap<u32, Vec<_>> = BTreeMap::new();
    for e in trace.events.iter().filter(|e| !e.is_return()) {
        if e.cpu >= trace.meta.cpus {
            continue;
        }
        let Some(f) = trace.functions.get(e.func as usize) else {
            continue;
        };
        per_cpu.entry(e.cpu).or_default().push((
            e.ts_ns,
            f.name.clone(),
            parent_name(trace, e.parent),
        ));
    }
    per_cpu
}

/// Checks `trace-cmd report` of `trace` against its entries: per vCPU the
/// same count, names, pid, comm and times (µs as printed by default, and
/// ns with `-t`).
fn check_functions(trace: &Trace, tag: &str) {
    let want = expected(trace);
    for (args, digits) in [
        (&["-O", "parent=1"][..], 6u32),
        (&["-t", "-O", "parent=1"][..], 9),
    ] {
        let r = report(trace, tag, args);
        assert_eq!(r.cpus, trace.meta.cpus, "{tag}: cpus=");
        let total: usize = want.values().map(Vec::len).sum();
        assert_eq!(r.lines.len(), total, "{tag}: events printed");
        let mut got: BTreeMap<u32, Vec<&Line>> = BTreeMap::new();
        for l in &r.lines {
            got.entry(l.cpu).or_default().push(l);
        }
        for cpu in 0..trace.meta.cpus {
            let w = want.get(&cpu).map_or(&[][..], Vec::as_slice);
            let g = got.get(&cpu).map_or(&[][..], Vec::as_slice);
            assert_eq!(g.len(), w.len(), "{tag}: events on CPU {cpu}");
            for (i, (l, (ts, func, caller))) in g.iter().zip(w).enumerate() {
                let at = format!("{tag}: CPU {cpu} event {i} {l:?}");
                assert_eq!(l.event, "function", "{at}");
                assert_eq!(l.comm, format!("vcpu{cpu}"), "{at}");
                assert_eq!(l.pid, cpu + 1, "{at}");
                assert_eq!(l.text, format!("{func} <-- {caller}"), "{at}");
                let unit = 10u64.pow(9 - digits);
                // libtraceevent rounds to the unit it prints.
                let want_ts = (ts + unit / 2) / unit;
                assert_eq!(units(&l.ts, digits), want_ts, "{at}: ts {ts} ns");
            }
        }
    }
}

fn sym(name: &str, addr: u64, size: u64) -> Symbol {
    Symbol {
        name: name.into(),
        addr,
        size,
    }
}

const TEXT: u64 = 0xffff_ffff_8100_0000;

/// Five traced functions, four callers with gaps between them.
fn symbols() -> (Vec<Symbol>, Vec<Symbol>) {
    let functions = vec![
        sym("hrtimer_start_range_ns", TEXT, 0x200),
        sym("hrtimer_cancel", TEXT + 0x200, 0x80),
        sym("hrtimer_interrupt", TEXT + 0x1000, 0x300),
        sym("__hrtimer_run_queues", TEXT + 0x1400, 0x100),
        sym("hrtimer_wakeup", TEXT + 0x2000, 0x40),
    ];
    let callers = vec![
        sym("tick_nohz_restart", TEXT + 0x10_000, 0x100),
        sym("do_nanosleep", TEXT + 0x10_100, 0x200),
        // A gap: 0x10_300..0x11_000 is in no known function.
        sym("sysvec_apic_timer_interrupt", TEXT + 0x11_000, 0x80),
        sym("schedule_hrtimeout_range", TEXT + 0x12_000, 0x400),
    ];
    (functions, callers)
}

/// A trace over `cpus` vCPUs of `events` (ts_ns, cpu, func, parent).
fn trace_of(cpus: u32, events: &[(u64, u32, u32, u64)]) -> Trace {
    let (functions, callers) = symbols();
    let nfunc = functions.len();
    let mut counts = vec![vec![0; cpus as usize]; nfunc];
    let events: Vec<Event> = events
        .iter()
        .map(|&(ts_ns, cpu, func, parent)| {
            if let Some(c) = counts
                .get_mut(func as usize)
                .and_then(|r| r.get_mut(cpu as usize))
            {
                *c += 1;
            }
            Event {
                ts_ns,
                parent,
                slot: 0,
                func,
                cpu,
                task: 0,
                stack: 0,
                data: 0,
            }
        })
        .collect();
    Trace {
        meta: TraceMeta {
            kernel: "bzImage".into(),
            cpus,
            events_total: events.len() as u64,
            mode: "trap".into(),
            ..TraceMeta::default()
        },
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

/// A deterministic pseudo-random sequence (xorshift64*).
fn rng(mut state: u64) -> impl FnMut() -> u64 {
    move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// Parents: mostly in callers, some in the gap, some unreadable (0),
/// some above every symbol.
fn parent(r: u64) -> u64 {
    match r % 50 {
        0 => 0,
        1 => TEXT + 0x10_400 + r % 0x100,
        2 => TEXT + 0x100_000 + r % 0x1000,
        _ => {
            let c = [0x10_000, 0x10_100, 0x11_000, 0x12_000][(r >> 8) as usize % 4];
            TEXT + c + 5 + (r >> 16) % 0x70
        }
    }
}

/// `n` events per vCPU on `cpus` (leaving out `empty`), in time order, with
/// deltas from 0 to hours, so that TIME_EXTEND and page changes happen.
fn many(cpus: u32, empty: Option<u32>, n: usize, seed: u64) -> Trace {
    let mut next = rng(seed);
    let mut ts = 5_000_000_000u64;
    let mut ev = Vec::new();
    let active: Vec<u32> = (0..cpus).filter(|&c| Some(c) != empty).collect();
    for i in 0..n * active.len() {
        let r = next();
        ts += match r % 100 {
            0..=4 => 0,
            5..=9 => (1 << 27) - 1 + (r >> 8) % 3, // around the 27-bit limit
            10..=12 => (1 << 27) + (r >> 8) % 40_000_000_000, // up to 40 s
            13 => 3_600_000_000_000,               // an hour
            _ => 1 + (r >> 8) % 5_000,
        };
        let cpu = active[i % active.len()];
        ev.push((ts, cpu, ((r >> 20) % 5) as u32, parent(r >> 24)));
    }
    trace_of(cpus, &ev)
}

#[test]
fn one_cpu_names_times_and_time_extends() {
    let d27 = 1u64 << 27;
    let t0 = 1_000_000_000u64;
    let mut ts = t0;
    let mut ev = Vec::new();
    for (i, delta) in [
        0,
        1,
        999,
        d27 - 1,
        d27,
        d27 + 1,
        0,
        5_000_000_000,
        3 * 3_600_000_000_000,
        (1 << 59) - 1, // the largest TIME_EXTEND
        1 << 59,       // too large for one: a new page
        1,
    ]
    .into_iter()
    .enumerate()
    {
        ts += delta;
        let parents = [
            TEXT + 0x10_010,
            TEXT + 0x10_250,
            TEXT + 0x10_500, // in the gap
            0,               // unreadable
            TEXT + 0x12_3ff, // the last byte of the last caller
            TEXT + 0x12_400, // just past it
        ];
        ev.push((ts, 0, (i % 5) as u32, parents[i % parents.len()]));
    }
    let trace = trace_of(1, &ev);
    check_functions(&trace, "one-cpu");
}

#[test]
fn two_cpus_many_pages() {
    let trace = many(2, None, 20_000, 1);
    let mut bytes = Vec::new();
    let w = write_tracedat_counted(&trace, &mut bytes).unwrap();
    assert_eq!(w.function, 40_000);
    // 28 bytes an event, 4080 a page: at least 138 pages per vCPU.
    assert!(w.pages >= 2 * 138, "{w:?}");
    check_functions(&trace, "two-cpus");
}

#[test]
fn four_cpus_one_idle_and_bad_events_skipped() {
    let mut trace = many(4, Some(2), 20_000, 2);
    let n = trace.events.len();
    // Events that cannot be written: a vCPU past meta.cpus, a function
    // index past the functions; and a return, which is no function event.
    let last = trace.events[n - 1].ts_ns;
    for (k, (cpu, func, slot)) in [
        (4, 0, 0),
        (9, 1, 0),
        (1, 99, 0),
        (3, 2, 0x1000 | RETURN_BIT),
    ]
    .into_iter()
    .enumerate()
    {
        trace.events.push(Event {
            ts_ns: last + 1 + k as u64,
            parent: TEXT + 0x10_010,
            slot,
            func,
            cpu,
            task: 0,
            stack: 0,
            data: 0,
        });
    }
    let mut bytes = Vec::new();
    let w = write_tracedat_counted(&trace, &mut bytes).unwrap();
    assert_eq!(
        w,
        TracedatCounts {
            function: n as u64,
            funcgraph_entry: 0,
            funcgraph_exit: 0,
            kernel_stack: 0,
            events: 0,
            bad_cpu: 2,
            bad_func: 1,
            pages: w.pages,
        }
    );
    check_functions(&trace, "four-cpus");
}

#[test]
fn synthetic_trace() {
    check_functions(&Trace::synthetic(30_000), "synthetic");
}

#[test]
fn empty_traces() {
    for cpus in [0, 1, 3] {
        let trace = trace_of(cpus, &[]);
        let r = report(&trace, "empty", &[]);
        assert_eq!(r.cpus, cpus);
        assert!(r.lines.is_empty(), "{:?}", r.lines);
    }
    // No symbols at all: addresses print in hex.
    let mut trace = trace_of(1, &[(10, 0, 0, 0x1234)]);
    trace.callers.clear();
    trace.functions.truncate(1);
    trace.functions[0].name = "a name with blanks".into();
    let r = report(&trace, "nosyms", &["-O", "parent=1"]);
    assert_eq!(r.lines.len(), 1);
    assert_eq!(r.lines[0].text, "a_name_with_blanks <-- 0x1234");
}

#[test]
fn too_many_cpus_is_an_error_not_a_panic() {
    let mut trace = trace_of(1, &[(10, 0, 0, 0)]);
    trace.meta.cpus = u32::MAX;
    let mut bytes = Vec::new();
    assert!(write_tracedat(&trace, &mut bytes).is_err());
}

/// What a function-graph trace's `trace-cmd report` line says, a leaf
/// (`name();`, its exit consumed) split back into entry and exit.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Graphed {
    Entry {
        func: String,
        depth: u32,
    },
    /// Duration as printed: `usecs.nsecs`, or `usecs` alone past 7 digits.
    Exit {
        func: String,
        depth: u32,
        dur: String,
    },
    Function {
        func: String,
        caller: String,
    },
}

/// Parses the lines of `trace-cmd report -O parent=1 -O tailprint=1 -O
/// depth=1` per CPU.
fn graphed(r: &Report) -> BTreeMap<u32, Vec<Graphed>> {
    let mut per_cpu: BTreeMap<u32, Vec<Graphed>> = BTreeMap::new();
    for l in &r.lines {
        let out = per_cpu.entry(l.cpu).or_default();
        assert_eq!(l.comm, format!("vcpu{}", l.cpu), "{l:?}");
        if l.event == "function" {
            let (func, caller) = l.text.split_once(" <-- ").expect("parent");
            out.push(Graphed::Function {
                func: func.into(),
                caller: caller.into(),
            });
            continue;
        }
        let (dur, body) = l.text.split_once('|').unwrap_or_else(|| panic!("{l:?}"));
        // Overhead marks: + ! # $ for calls over 10 µs, 100 µs, 1 ms, 1 s.
        let dur = dur.trim().trim_start_matches(['+', '!', '#', '$']).trim();
        let dur = dur.strip_suffix(" us").map(str::to_string);
        let (body, depth) = body
            .trim()
            .rsplit_once(" (")
            .unwrap_or_else(|| panic!("{l:?}"));
        let depth: u32 = depth.trim_end_matches(')').parse().unwrap();
        match l.event.as_str() {
            "funcgraph_entry" => {
                if let Some(func) = body.strip_suffix("();") {
                    out.push(Graphed::Entry {
                        func: func.into(),
                        depth,
                    });
                    out.push(Graphed::Exit {
                        func: func.into(),
                        depth,
                        dur: dur.unwrap_or_else(|| panic!("leaf without duration {l:?}")),
                    });
                } else {
                    let func = body.strip_suffix("() {").unwrap_or_else(|| panic!("{l:?}"));
                    assert_eq!(dur, None, "{l:?}");
                    out.push(Graphed::Entry {
                        func: func.into(),
                        depth,
                    });
                }
            }
            "funcgraph_exit" => {
                let func = body
                    .strip_prefix("} /* ")
                    .and_then(|b| b.strip_suffix(" */"))
                    .unwrap_or_else(|| panic!("{l:?}"));
                out.push(Graphed::Exit {
                    func: func.into(),
                    depth,
                    dur: dur.unwrap_or_else(|| panic!("exit without duration {l:?}")),
                });
            }
            other => panic!("event {other} in {l:?}"),
        }
    }
    per_cpu
}

/// A duration as trace-cmd prints it.
fn dur(ns: u64) -> String {
    if ns / 1000 < 1_000_000 {
        format!("{}.{:03}", ns / 1000, ns % 1000)
    } else {
        format!("{}", ns / 1000)
    }
}

const GRAPH_ARGS: &[&str] = &["-O", "parent=1", "-O", "tailprint=1", "-O", "depth=1"];

/// A stack-slot address: guest stack `stack` (16 KiB regions), depth `depth`.
fn slot(stack: u64, depth: u64) -> u64 {
    0xffff_c900_0000_0000 + stack * 0x4000 + 0x3ff8 - depth * 0x40
}

#[test]
fn graph_nested_leaf_cross_cpu_unhooked_abandoned() {
    let caller = TEXT + 0x10_010;
    // (ts, cpu, func, slot)
    let ev = [
        (1000u64, 0u32, 2u32, slot(1, 0)),     // hrtimer_interrupt {
        (1500, 0, 3, slot(1, 1)),              //   __hrtimer_run_queues {
        (2000, 1, 0, slot(2, 0)),              // CPU 1: hrtimer_start_range_ns {
        (2500, 0, 3, slot(1, 1) | RETURN_BIT), // }
        (3000, 0, 4, slot(1, 1)),              //   hrtimer_wakeup();
        (3100, 0, 4, slot(1, 1) | RETURN_BIT),
        (4000, 1, 1, 0),                       // CPU 1: unhooked hrtimer_cancel
        (5000, 1, 1, slot(2, 1)),              // CPU 1: hrtimer_cancel {, abandoned
        (8000, 0, 0, slot(2, 0) | RETURN_BIT), // hrtimer_start_range_ns returns on CPU 0
        (9000, 0, 2, slot(1, 0) | RETURN_BIT),
    ];
    let mut trace = trace_of(
        2,
        &ev.iter()
            .map(|&(ts, cpu, func, _)| (ts, cpu, func, caller))
            .collect::<Vec<_>>(),
    );
    for (e, &(_, _, _, slot)) in trace.events.iter_mut().zip(&ev) {
        e.slot = slot;
    }
    trace.meta.graph = true;
    let mut bytes = Vec::new();
    let w = write_tracedat_counted(&trace, &mut bytes).unwrap();
    assert_eq!(
        (
            w.function,
            w.funcgraph_entry,
            w.funcgraph_exit,
            w.bad_cpu,
            w.bad_func
        ),
        (1, 5, 4, 0, 0)
    );
    let r = report(&trace, "graph-hand", GRAPH_ARGS);
    let got = graphed(&r);
    let entry = |f: &str, depth| Graphed::Entry {
        func: f.into(),
        depth,
    };
    let exit = |f: &str, depth, ns| Graphed::Exit {
        func: f.into(),
        depth,
        dur: dur(ns),
    };
    assert_eq!(
        got[&0],
        [
            entry("hrtimer_interrupt", 0),
            entry("__hrtimer_run_queues", 1),
            exit("__hrtimer_run_queues", 1, 1000),
            entry("hrtimer_wakeup", 1),
            exit("hrtimer_wakeup", 1, 100),
            exit("hrtimer_start_range_ns", 0, 6000),
            exit("hrtimer_interrupt", 0, 8000),
        ]
    );
    assert_eq!(
        got[&1],
        [
            entry("hrtimer_start_range_ns", 0),
            Graphed::Function {
                func: "hrtimer_cancel".into(),
                caller: "tick_nohz_restart".into()
            },
            entry("hrtimer_cancel", 1),
        ]
    );
}

#[test]
fn graph_many_pages() {
    let cpus = 3u32;
    let (names, _) = symbols();
    let mut next = rng(7);
    // Per vCPU: its live calls (func, entry time), on its own guest stack.
    let mut live: Vec<Vec<(u32, u64)>> = vec![Vec::new(); cpus as usize];
    let mut want: BTreeMap<u32, Vec<Graphed>> = BTreeMap::new();
    let mut ev = Vec::new();
    let mut ts = 1_000_000u64;
    for i in 0..60_000u64 {
        let r = next();
        ts += match r % 200 {
            0 => (1 << 27) + (r >> 8) % 3_000_000_000,
            1..=10 => 0,
            _ => 1 + (r >> 8) % 3_000,
        };
        let cpu = (i % u64::from(cpus)) as u32;
        let stack = &mut live[cpu as usize];
        let want = want.entry(cpu).or_default();
        let func = ((r >> 40) % 5) as u32;
        let name = names[func as usize].name.clone();
        let depth = stack.len() as u64;
        if r.is_multiple_of(97) {
            // Unhooked: a function event.
            ev.push((ts, cpu, func, 0, TEXT + 0x11_010));
            want.push(Graphed::Function {
                func: name,
                caller: "sysvec_apic_timer_interrupt".into(),
            });
        } else if stack.is_empty() || (depth < 10 && (r >> 32).is_multiple_of(2)) {
            ev.push((ts, cpu, func, slot(u64::from(cpu), depth), TEXT + 0x10_010));
            stack.push((func, ts));
            want.push(Graphed::Entry {
                func: name,
                depth: depth as u32,
            });
        } else {
            let (func, t0) = stack.pop().unwrap();
            let depth = stack.len() as u64;
            ev.push((
                ts,
                cpu,
                func,
                slot(u64::from(cpu), depth) | RETURN_BIT,
                TEXT + 0x10_010,
            ));
            want.push(Graphed::Exit {
                func: names[func as usize].name.clone(),
                depth: depth as u32,
                dur: dur(ts - t0),
            });
        }
    }
    let mut trace = trace_of(
        cpus,
        &ev.iter()
            .map(|&(ts, cpu, func, _, parent)| (ts, cpu, func, parent))
            .collect::<Vec<_>>(),
    );
    for (e, &(_, _, _, slot, _)) in trace.events.iter_mut().zip(&ev) {
        e.slot = slot;
    }
    trace.meta.graph = true;
    let r = report(&trace, "graph-many", GRAPH_ARGS);
    let got = graphed(&r);
    assert_eq!(got.len(), cpus as usize);
    for cpu in 0..cpus {
        let (g, w) = (&got[&cpu], &want[&cpu]);
        assert_eq!(g.len(), w.len(), "CPU {cpu}");
        for (i, (g, w)) in g.iter().zip(w).enumerate() {
            assert_eq!(g, w, "CPU {cpu} item {i}");
        }
    }
}

/// (comm, pid) of each line `trace-cmd report ARGS` prints for `trace`, per
/// CPU, in order.
fn tasks_printed(trace: &Trace, tag: &str, args: &[&str]) -> BTreeMap<u32, Vec<(String, u32)>> {
    let r = report(trace, tag, args);
    let mut per_cpu: BTreeMap<u32, Vec<(String, u32)>> = BTreeMap::new();
    for l in &r.lines {
        per_cpu
            .entry(l.cpu)
            .or_default()
            .push((l.comm.clone(), l.pid));
    }
    per_cpu
}

fn owned(list: &[(&str, u32)]) -> Vec<(String, u32)> {
    list.iter().map(|&(c, p)| (c.to_string(), p)).collect()
}

/// Each event's guest task reaches `trace-cmd report` as the guest's own
/// ftrace would show it: `comm-pid` from common_pid and the cmdlines, the
/// idle tasks of both vCPUs `<idle>-0`, a renamed task (sh, then ls, pid
/// 57) by its latest name, a thread by its own pid; events of no known
/// task by a pseudo pid per vCPU past every Linux pid.
#[test]
fn tasks_are_comm_pid_in_trace_cmd_report() {
    let t = fixture::tasks_entry_trace();
    let got = tasks_printed(&t, "tasks", &["-O", "parent=1"]);
    let unknown = tracer::trace::export::tracedat::UNKNOWN_PID_BASE;
    assert_eq!(
        got[&0],
        owned(&[
            ("<idle>", 0),
            ("<idle>", 0),
            ("<idle>", 0),
            ("<idle>", 0),
            ("vcpu0", unknown),
            ("odd,;na me\\x0a", 4242),
        ])
    );
    assert_eq!(
        got[&1],
        owned(&[
            ("<idle>", 0),
            ("<idle>", 0),
            ("ls", 57),
            ("ls", 57),
            ("gdbus", 60),
            ("gdbus", 60),
        ])
    );
    // Function graph: entries and exits alike, an exit on the vCPU it ran
    // (schedule's, gdbus-60, on vCPU 0).
    let t = fixture::tasks_trace();
    let got = tasks_printed(&t, "tasks-graph", GRAPH_ARGS);
    assert_eq!(
        got[&0],
        owned(&[
            ("<idle>", 0),
            ("<idle>", 0),
            ("<idle>", 0),
            ("<idle>", 0),
            ("<idle>", 0),
            ("<idle>", 0),
            ("vcpu0", unknown),
            ("<idle>", 0),
            ("gdbus", 60),
            ("<idle>", 0),
            ("odd,;na me\\x0a", 4242),
        ])
    );
    assert_eq!(
        got[&1],
        owned(&[
            ("<idle>", 0),
            ("<idle>", 0),
            ("ls", 57),
            ("ls", 57),
            ("gdbus", 60),
            ("gdbus", 60),
        ])
    );
}

/// The `funcgraph_exit` lines of `trace-cmd report -R ARGS` (raw fields),
/// as (CPU, fields).
fn raw_exits(trace: &Trace, tag: &str, args: &[&str]) -> Vec<(u32, String)> {
    let args = [&["-R"], args].concat();
    let r = report(trace, tag, &args);
    r.lines
        .iter()
        .filter(|l| l.event == "funcgraph_exit")
        .map(|l| (l.cpu, l.text.clone()))
        .collect()
}

/// A raw `funcgraph_exit` as libtraceevent prints it: `retval` by the
/// kernel's print fmt (`%lx`: hex, no `0x`), the times in hex, ns.
fn raw_exit(func: &str, retval: &str, depth: u32, call: u64, ret: u64) -> String {
    format!(
        "func={func} retval={retval} depth={depth} overrun=0 calltime={call:#x} rettime={ret:#x}"
    )
}

/// `--retval`: each return's value reaches trace-cmd as the `retval` of
/// Linux 6.5+'s `funcgraph_exit` (CONFIG_FUNCTION_GRAPH_RETVAL), all 64
/// bits of RAX as recorded (ERR_PTR(-ENOMEM), -EAGAIN in EAX with junk
/// above, a void function's leftover RAX); the raw fields print it, a
/// filter on it matches, and the function graph prints as it did without
/// return values.
#[test]
fn return_values_are_funcgraph_exit_retval() {
    use fixture::ATTACH_NS as T;
    let t = fixture::values_trace();
    let exit = |func, retval, depth, call, ret| raw_exit(func, retval, depth, T + call, T + ret);
    assert_eq!(
        raw_exits(&t, "retval-raw", &[]),
        [
            (
                1,
                exit("hrtimer_interrupt", "fffffffffffffff4", 1, 3_000, 5_500)
            ),
            (
                1,
                exit("__hrtimer_run_queues", "1fffffff5", 1, 7_000, 7_500)
            ),
            (1, exit("tick_sched_timer", "1", 1, 9_000, 9_400)),
            (
                0,
                exit("tick_do_update_jiffies64", "dead", 3, 1_400, 16_400)
            ),
            (0, exit("tick_sched_timer", "0", 2, 1_300, 16_401)),
            (0, exit("tick_sched_timer", "7", 2, 16_500, 16_800)),
            (0, exit("__hrtimer_run_queues", "0", 1, 1_200, 17_000)),
            (0, exit("schedule", "5555", 0, 8_000, 40_000)),
            (
                0,
                exit("hrtimer_interrupt", "ffff88800abcd000", 0, 1_000, 150_000)
            ),
        ]
    );
    // A filter compares the field as a number.
    assert_eq!(
        raw_exits(
            &t,
            "retval-filter",
            &["-F", "funcgraph_exit: retval == 0xfffffffffffffff4"]
        ),
        [(
            1,
            exit("hrtimer_interrupt", "fffffffffffffff4", 1, 3_000, 5_500)
        )]
    );
    // The format trace-cmd read is the kernel's.
    let dump = trace_cmd(&t, "retval-dump", "dump", &["--ftrace-events"]);
    assert!(dump.contains(
        "\tfield:unsigned long func;\toffset:8;\tsize:8;\tsigned:0;\n\
         \tfield:unsigned long retval;\toffset:16;\tsize:8;\tsigned:0;\n\
         \tfield:int depth;\toffset:24;\tsize:4;\tsigned:1;\n\
         \tfield:unsigned int overrun;\toffset:28;\tsize:4;\tsigned:0;\n\
         \tfield:unsigned long long calltime;\toffset:32;\tsize:8;\tsigned:0;\n\
         \tfield:unsigned long long rettime;\toffset:40;\tsize:8;\tsigned:0;\n\n\
         print fmt: \"<-- %ps (%d) (start: %llx  end: %llx) over: %d retval: %lx\", \
         (void *)REC->func, REC->depth, REC->calltime, REC->rettime, REC->depth, REC->retval\n"
    ));
    // The graph: what trace-cmd printed for the trace without values.
    let mut plain = t.clone();
    plain.meta.retval = false;
    for args in [&[][..], GRAPH_ARGS] {
        let r = report(&t, "retval-graph", args);
        assert_eq!(r, report(&plain, "retval-plain", args), "{args:?}");
    }
    let r = report(&t, "retval-graph", GRAPH_ARGS);
    let entry = |f: &str, depth| Graphed::Entry {
        func: f.into(),
        depth,
    };
    let exit = |f: &str, depth, ns| Graphed::Exit {
        func: f.into(),
        depth,
        dur: dur(ns),
    };
    assert_eq!(
        graphed(&r)[&1],
        [
            entry("cpu_idle_loop", 0),
            entry("hrtimer_interrupt", 1),
            exit("hrtimer_interrupt", 1, 2_500),
            entry("do_exit_thing", 1),
            entry("__hrtimer_run_queues", 1),
            exit("__hrtimer_run_queues", 1, 500),
            entry("schedule", 0),
            entry("tick_sched_timer", 1),
            exit("tick_sched_timer", 1, 400),
        ]
    );
}

/// Return values trace-cmd could mistake: -ENOENT in all 64 bits, a value
/// that is a traced function's address (hex, not its name: the print fmt
/// says `%lx`), 0 and all ones; an unhooked call in between has no exit.
#[test]
fn return_values_by_hand() {
    let caller = TEXT + 0x10_010;
    // (ts, func, slot, RAX at a return)
    let ev = [
        (1_000u64, 2u32, slot(1, 0), 0u64),
        (1_100, 3, slot(1, 1), 0),
        (1_200, 3, slot(1, 1) | RETURN_BIT, 0xffff_ffff_ffff_fffe),
        (1_300, 1, 0, 0),
        (1_400, 4, slot(1, 1), 0),
        (1_450, 0, slot(1, 2), 0),
        (1_460, 0, slot(1, 2) | RETURN_BIT, u64::MAX),
        (1_500, 4, slot(1, 1) | RETURN_BIT, TEXT + 0x1000),
        (1_600, 2, slot(1, 0) | RETURN_BIT, 0),
    ];
    let events: Vec<_> = ev.iter().map(|&(ts, f, _, _)| (ts, 0, f, caller)).collect();
    let mut t = trace_of(1, &events);
    for (e, &(_, _, slot, rax)) in t.events.iter_mut().zip(&ev) {
        e.slot = slot;
        e.data = rax;
    }
    t.meta.graph = true;
    t.meta.retval = true;
    let exit = |func, retval, depth, call, ret| (0, raw_exit(func, retval, depth, call, ret));
    assert_eq!(
        raw_exits(&t, "retval-hand", &[]),
        [
            exit("__hrtimer_run_queues", "fffffffffffffffe", 1, 1_100, 1_200),
            exit(
                "hrtimer_start_range_ns",
                "ffffffffffffffff",
                2,
                1_450,
                1_460
            ),
            exit("hrtimer_wakeup", "ffffffff81001000", 1, 1_400, 1_500),
            exit("hrtimer_interrupt", "0", 0, 1_000, 1_600),
        ]
    );
    let mut bytes = Vec::new();
    let w = write_tracedat_counted(&t, &mut bytes).unwrap();
    assert_eq!((w.function, w.funcgraph_entry, w.funcgraph_exit), (1, 4, 4));
}

/// 64-bit FNV-1a, as report_golden.rs digests outputs.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Without `--retval` the file is what it was before return values
/// (Linux 6.1's `funcgraph_exit`, digests of the files then), whatever
/// returns' `data` holds.
#[test]
fn without_return_values_the_file_is_unchanged() {
    let mut values = fixture::values_trace();
    values.meta.retval = false;
    for (name, t, digest) in [
        ("graph", fixture::graph_trace(), 0x5867_cfab_ac3b_e0ed),
        ("values without retval", values, 0x5867_cfab_ac3b_e0ed),
        ("tasks", fixture::tasks_trace(), 0xad7d_f31d_1941_be26),
        ("stacks", fixture::stacks_trace(), 0x7187_d419_a130_3de9),
        ("entries", fixture::trace(), 0x9ad7_4b4a_e0e9_64e2),
    ] {
        let mut bytes = Vec::new();
        write_tracedat(&t, &mut bytes).unwrap();
        assert_eq!(fnv1a(&bytes), digest, "{name}");
        assert!(!bytes.windows(6).any(|w| w == b"retval"), "{name}");
    }
}
