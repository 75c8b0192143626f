//! Kernel stacks (`--stack`) from the store on: saved in the data file
//! (version 9, `STACK` blocks before the events that name them), read
//! back whole or cut short, refused when corrupt; and shown by every
//! output (`report_fixture::stacks_trace`), byte for byte against golden
//! files (`VMTRACE_BLESS=1` writes them), the lines that matter spelled
//! out here too.

#[path = "report_fixture.rs"]
mod fixture;

use std::fs;
use std::path::{Path, PathBuf};

use tracer::kernel::unwind::{Stack, StackEnd};
use tracer::session::stacks::StackTable;
use tracer::trace::datafile::{load, save, DataFile, Section, TraceFileError, DATA_VERSION};
use tracer::trace::model::{Event, Trace};

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vmtrace-stacks-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

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

fn version_of(path: &Path) -> u32 {
    let b = fs::read(path).unwrap();
    u32::from_le_bytes(b[8..12].try_into().unwrap())
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
fn a_trace_with_stacks_saves_as_a_data_file_and_reads_back() {
    let t = fixture::stacks_trace();
    let path = tmp("stacks.vmtrace");
    save(&t, &path).unwrap();
    assert_eq!(version_of(&path), DATA_VERSION);
    let back = load(&path).unwrap();
    assert_eq!(back.stacks, fixture::stacks());
    assert_eq!(back.meta.stacks, fixture::STACKS_NOTE);
    assert_eq!(
        back.meta.stack_funcs,
        [fixture::G_TICK, fixture::G_SCHEDULE]
    );
    assert_eq!(back, t);
    let tick = back
        .events
        .iter()
        .find(|e| e.ts_ns == fixture::ATTACH_NS + 9_000)
        .unwrap();
    assert_eq!(back.stack_of(tick).unwrap().end, StackEnd::TooDeep);
    check("stacks.vmtrace", &fs::read(&path).unwrap());

    // The note alone (stacks asked, none recorded) is kept too.
    let mut t = fixture::graph_trace();
    t.meta.stacks = "frame pointers (no .orc_unwind section)".into();
    save(&t, &path).unwrap();
    assert_eq!(version_of(&path), DATA_VERSION);
    assert_eq!(load(&path).unwrap(), t);
}

/// `golden/tasks.v8.data` and `golden/values.v8.data` were written by the
/// version-8 writer (before stacks) from the tasks and values fixtures:
/// they still read as those traces, no stack anywhere.
#[test]
fn version_8_data_files_still_read() {
    for (name, want) in [
        ("tasks.v8.data", fixture::tasks_trace()),
        ("values.v8.data", fixture::values_trace()),
    ] {
        let path = golden_dir().join(name);
        assert_eq!(version_of(&path), 8, "{name}");
        let back = load(&path).unwrap();
        assert!(back.stacks.is_empty() && back.meta.stacks.is_empty());
        assert!(back.events.iter().all(|e| e.stack == 0));
        assert_eq!(back, want, "{name}");
    }
}

/// The stack of synthetic entry `i`: 30 distinct ones, first seen over the
/// run, so that new stacks keep arriving between batches; every fifth
/// entry has none.
fn stack_of(i: usize) -> Option<Stack> {
    if i % 5 == 4 {
        return None;
    }
    let n = (i / 700).min(29) as u64;
    let k = (i as u64 * 11) % (n + 1);
    Some(Stack {
        frames: (0..=k % 7)
            .map(|d| 0xffff_ffff_8100_0000 + k * 0x100 + d)
            .collect(),
        end: if k.is_multiple_of(3) {
            StackEnd::Bottom
        } else {
            StackEnd::Unreadable
        },
        exact: k & 1,
    })
}

/// Streams `t` as the store does: each vCPU's events in batches, each
/// batch's stacks interned first and those new since the last batch
/// written before it. Returns the table.
fn stream_with_stacks(t: &mut Trace, path: &Path, complete: bool) -> StackTable {
    let table = StackTable::new();
    let mut f = DataFile::create(path).unwrap();
    let mut head = t.clone();
    head.events.clear();
    head.meta.stacks = "frame pointers (test)".into();
    f.head(&head).unwrap();
    let n = t.events.len();
    for cpu in 0..t.meta.cpus {
        let idx: Vec<usize> = (0..n).filter(|&i| t.events[i].cpu == cpu).collect();
        for b in idx.chunks(600) {
            let mut batch = Vec::new();
            for &i in b {
                let e = &mut t.events[i];
                if !e.is_return() {
                    e.stack = stack_of(i).map_or(0, |s| table.intern(s));
                }
                batch.push(*e);
            }
            f.write_stacks(&table.since(f.stacks_saved())).unwrap();
            f.write_events(&batch).unwrap();
        }
    }
    t.stacks = table.all();
    t.meta.stacks = "frame pointers (test)".into();
    if complete {
        f.finish(t).unwrap();
    }
    table
}

#[test]
fn a_streamed_file_with_stacks_reads_back_with_them() {
    let mut t = Trace::synthetic(20_000);
    let path = tmp("stacks.data");
    let table = stream_with_stacks(&mut t, &path, true);
    assert_eq!(table.len(), fixture_distinct_stacks(20_000));
    let back = load(&path).unwrap();
    assert!(!back.meta.incomplete);
    assert_eq!(back.stacks, table.all());
    let mut want = t.events.clone();
    want.sort_by_key(|e| (e.ts_ns, e.cpu));
    assert_eq!(back.events, want);
    assert!(back.events.iter().filter(|e| e.stack != 0).count() > 10_000);
}

/// The distinct stacks of the first `n` synthetic entries.
fn fixture_distinct_stacks(n: usize) -> usize {
    let all: std::collections::HashSet<Stack> = (0..n).filter_map(stack_of).collect();
    all.len()
}

/// Killed at any byte: every event kept still has its stack.
#[test]
fn a_streamed_file_with_stacks_cut_anywhere_keeps_each_events_stack() {
    let mut t = Trace::synthetic(20_000);
    let path = tmp("stacks-whole.data");
    stream_with_stacks(&mut t, &path, false);
    let whole = fs::read(&path).unwrap();
    // Synthetic events have distinct times.
    let stack_at: std::collections::HashMap<u64, Option<Stack>> = t
        .events
        .iter()
        .map(|e| (e.ts_ns, t.stack_of(e).cloned()))
        .collect();
    let cut = tmp("stacks-cut.data");
    let head_len = u32::from_le_bytes(whole[24..28].try_into().unwrap()) as usize;
    let head_end = 20 + 12 + head_len;
    let mut at = whole.len();
    let mut checked = 0;
    while at >= head_end {
        fs::write(&cut, &whole[..at]).unwrap();
        let back = load(&cut).unwrap_or_else(|e| panic!("cut at {at}: {e}"));
        assert!(back.meta.incomplete);
        assert_eq!(back.meta.stacks, "frame pointers (test)");
        for e in &back.events {
            assert_eq!(back.stack_of(e).cloned(), stack_at[&e.ts_ns], "cut at {at}");
            checked += 1;
        }
        assert_eq!(back.stacks[..], t.stacks[..back.stacks.len()]);
        at -= 1 + at / 23;
    }
    assert!(checked > 100_000, "{checked}");
}

/// A file cut short keeps the callers its stacks' frames name (a return
/// address names the function of the call before it).
#[test]
fn a_file_cut_short_keeps_the_callers_of_its_stacks() {
    let mut t = fixture::stacks_trace();
    // HEAD's callers: every function of the kernel, some unused.
    let mut head = t.clone();
    head.events.clear();
    head.callers.push(tracer::kernel::symbols::Symbol {
        name: "unused".into(),
        addr: 0xffff_ffff_8400_0000,
        size: 0x10,
    });
    let path = tmp("stacks-cut-callers.data");
    let mut f = DataFile::create(&path).unwrap();
    f.head(&head).unwrap();
    // Only the entry of stack 4, whose frames are in no event's parent.
    t.events.retain(|e| e.stack == 4);
    for e in &mut t.events {
        e.parent = 0;
        e.task = 0;
        e.slot = 0;
        e.stack = 1;
    }
    f.write_stacks(&fixture::stacks()[3..]).unwrap();
    f.write_events(&t.events).unwrap();
    let back = load(&path).unwrap();
    assert!(back.meta.incomplete);
    let names: Vec<&str> = back.callers.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["hrtimer_interrupt", "__hrtimer_run_queues"]);
}

#[test]
fn a_stack_past_the_saved_ones_is_corruption() {
    let t = fixture::stacks_trace();
    let path = tmp("stacks-ok.data");
    save(&t, &path).unwrap();
    let good = fs::read(&path).unwrap();
    let bl = blocks(&good);
    let tags: Vec<&[u8; 4]> = bl.iter().map(|(_, tag, _)| tag).collect();
    assert_eq!(
        tags,
        [b"HEAD", b"TASK", b"STAK", b"EVTS", b"FOOT", b"END\0"]
    );

    // The first event (48-byte records after the count: its stack at 36)
    // names stack 5 of 4.
    let (start, _, payload) = bl[3].clone();
    let mut b = good.clone();
    let at = payload.start + 4 + 36;
    patch(&mut b, start, payload.clone(), at, &5u32.to_le_bytes());
    fs::write(&path, &b).unwrap();
    assert_eq!(
        corrupt(&path),
        (
            Section::Events,
            "event 0 names stack 5 but 4 are saved before it".into()
        )
    );

    // A return naming a stack: event 6 (5,500 ns) is one.
    let mut b = good.clone();
    let at = payload.start + 4 + 6 * 48 + 36;
    patch(&mut b, start, payload.clone(), at, &1u32.to_le_bytes());
    fs::write(&path, &b).unwrap();
    assert_eq!(
        corrupt(&path),
        (
            Section::Events,
            "event 6 is a return but names stack 1".into()
        )
    );

    // A stack block that does not follow the stacks before it.
    let (start, _, payload) = bl[2].clone();
    let mut b = good.clone();
    patch(
        &mut b,
        start,
        payload.clone(),
        payload.start,
        &1u32.to_le_bytes(),
    );
    fs::write(&path, &b).unwrap();
    let msg = load(&path).unwrap_err().to_string();
    assert!(
        msg.ends_with(
            "corrupt trace file (stacks section): a stack block starts at stack 2 but 0 stacks came before it"
        ),
        "{msg}"
    );

    // An end code StackEnd does not know.
    let mut b = good.clone();
    patch(&mut b, start, payload.clone(), payload.start + 8, &[7]);
    fs::write(&path, &b).unwrap();
    assert_eq!(
        corrupt(&path),
        (Section::Stacks, "stack 1 ends with code 7".into())
    );

    // More frames than a stack keeps.
    let mut b = good.clone();
    patch(
        &mut b,
        start,
        payload.clone(),
        payload.start + 9,
        &65u32.to_le_bytes(),
    );
    fs::write(&path, &b).unwrap();
    assert_eq!(
        corrupt(&path),
        (Section::Stacks, "stack 1 has 65 frames (at most 64)".into())
    );

    // A stack function past the functions.
    let mut t = fixture::stacks_trace();
    t.meta.stack_funcs.push(8);
    let e = save(&t, &path).unwrap_err().to_string();
    assert!(
        e.ends_with("header: stack function 8 but there are 8 functions"),
        "{e}"
    );
}

/// Events without stacks are unchanged by the new record size: an entry
/// whose stack is 0 has none, in memory and read back.
#[test]
fn entries_without_stacks_have_none() {
    let t = fixture::stacks_trace();
    let without: Vec<&Event> = t.events.iter().filter(|e| e.stack == 0).collect();
    assert_eq!(without.len(), t.events.len() - 5);
    assert!(without.iter().all(|e| t.stack_of(e).is_none()));
}

fn script(t: &Trace) -> String {
    let mut out = Vec::new();
    tracer::trace::export::script::write_script(t, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

/// `script`: after each entry with a stack, ftrace's `<stack trace>` line
/// with the entry's task, CPU and time, one ` => function+0xoffset` per
/// frame (a frame at a function's end named by the function before; one
/// in no known function in hex), and a cut stack's reason.
#[test]
fn script_prints_each_entrys_stack_after_it() {
    let t = fixture::stacks_trace();
    let s = script(&t);
    check("stacks.script.txt", s.as_bytes());
    assert!(
        s.contains(&format!(
            "\n# stacks: {} (5 entries with a '<stack trace>')\n",
            fixture::STACKS_NOTE
        )),
        "{s}"
    );
    let first = "          <idle>-0       (-------) [000]  1000.000001: tick_sched_timer <-__hrtimer_run_queues\n\
                 \x20         <idle>-0       (-------) [000]  1000.000001: <stack trace>\n\
                 \x20=> __hrtimer_run_queues+0x30\n\
                 \x20=> hrtimer_interrupt+0x20\n\
                 \x20=> sysvec_apic_timer_interrupt+0x10\n\
                 \x20=> cpu_idle_loop+0x40\n\
                 \x20         <idle>-0       (-------) [000]  1000.000001: tick_do_update_jiffies64 <-__hrtimer_run_queues\n";
    assert!(s.contains(first), "{s}");
    let cut = ": <stack trace>\n => schedule+0x50\n => worker_thread+0x20\n => 0xffffffff83000100\n => ... (cut: too deep)\n";
    assert!(s.contains(cut), "{s}");
    let at_end = ": <stack trace>\n => __hrtimer_run_queues+0x38\n => hrtimer_interrupt+0x200\n";
    assert!(s.contains(at_end), "{s}");
    assert_eq!(s.matches(": <stack trace>\n").count(), 5);
    // Entered from user mode: complete, no cut line.
    let user = ": <stack trace>\n => worker_thread+0x20\n";
    assert!(s.contains(user), "{s}");
    assert_eq!(s.matches("(cut: ").count(), 1);

    // Without stacks, nothing changes.
    let mut plain = t.clone();
    plain.stacks.clear();
    plain.meta.stacks.clear();
    plain.meta.stack_funcs.clear();
    plain.events.iter_mut().for_each(|e| e.stack = 0);
    assert_eq!(script(&plain), script(&fixture::tasks_trace()));
    assert!(!script(&plain).contains("stack"));
}

fn report(t: &Trace, cpus: Option<Vec<u32>>) -> String {
    let opts = tracer::trace::report::ReportOptions {
        cpus,
        ..tracer::trace::report::ReportOptions::whole_trace()
    };
    tracer::trace::report::render(t, &opts)
}

/// The report's header says how stacks were unwound and how many calls
/// carry one; its stacks section lists each `--stack` function's stacks,
/// most calls first, caller first, a cut stack starting with why.
#[test]
fn the_report_shows_each_stack_functions_stacks() {
    let t = fixture::stacks_trace();
    let r = report(&t, None);
    check("stacks.txt", r.as_bytes());
    assert!(
        r.contains(&format!(
            "# stacks:       {}; 5 of 12 stored calls carry one, 4 distinct\n",
            fixture::STACKS_NOTE
        )),
        "{r}"
    );
    let section = "#\n# kernel stacks, caller first (perf report -g caller):\n#\n\
        tick_sched_timer: 4 calls with a stack, 3 distinct\n\
        \x20  50.00%  2 calls\n\
        \x20           cpu_idle_loop+0x40\n\
        \x20           sysvec_apic_timer_interrupt+0x10\n\
        \x20           hrtimer_interrupt+0x20\n\
        \x20           __hrtimer_run_queues+0x30\n\
        \x20           tick_sched_timer\n\
        \x20  25.00%  1 call\n\
        \x20           ... (cut: too deep)\n\
        \x20           0xffffffff83000100\n\
        \x20           worker_thread+0x20\n\
        \x20           schedule+0x50\n\
        \x20           tick_sched_timer\n\
        \x20  25.00%  1 call\n\
        \x20           hrtimer_interrupt+0x200\n\
        \x20           __hrtimer_run_queues+0x38\n\
        \x20           tick_sched_timer\n\
        schedule: 1 call with a stack, 1 distinct\n\
        \x20 100.00%  1 call\n\
        \x20           worker_thread+0x20\n\
        \x20           schedule\n";
    assert!(r.ends_with(section), "{r}");

    // --cpu 1: only vCPU 1's entries count.
    let r = report(&t, Some(vec![1]));
    assert!(
        r.contains("tick_sched_timer: 1 call with a stack, 1 distinct\n  100.00%  1 call\n            ... (cut: too deep)\n"),
        "{r}"
    );

    // Without stacks: no line, no section.
    let r = report(&fixture::tasks_trace(), None);
    assert!(!r.contains("stack"), "{r}");
}

/// At most 10 stacks a function, then what the others add up to.
#[test]
fn the_report_sums_up_a_functions_stacks_past_ten() {
    let mut t = fixture::stacks_trace();
    // 13 distinct stacks for tick_sched_timer's 4 stored calls is not
    // possible: give every entry of the trace its own stack instead, and
    // make every function a stack function.
    t.stacks.clear();
    let mut n = 0;
    for e in t.events.iter_mut().filter(|e| !e.is_return()) {
        n += 1;
        e.stack = n;
        t.stacks.push(Stack {
            frames: vec![0xffff_ffff_8100_1230 + u64::from(n)],
            end: StackEnd::Bottom,
            exact: 0,
        });
    }
    // Every entry under one function.
    let mut counts = vec![vec![0u64; 2]; t.functions.len()];
    for e in t.events.iter_mut().filter(|e| !e.is_return()) {
        e.func = fixture::G_TICK;
        counts[fixture::G_TICK as usize][e.cpu as usize] += 1;
    }
    t.counts = counts;
    let r = report(&t, None);
    assert!(
        r.contains("tick_sched_timer: 12 calls with a stack, 12 distinct\n"),
        "{r}"
    );
    assert_eq!(r.matches("    8.33%  1 call\n").count(), 10, "{r}");
    assert!(
        r.contains("\n  ... 2 more stacks (2 calls)\nschedule: no stored call with a stack\n"),
        "{r}"
    );
}

/// The JSON report: every stack (frames symbolized, how it ends), how they
/// were unwound, and per stack function its stacks' ids with their calls.
#[test]
fn the_json_report_has_the_stacks() {
    let t = fixture::stacks_trace();
    let v = tracer::trace::export::to_json(&t);
    let mut out = Vec::new();
    tracer::trace::export::write_json(&t, &mut out).unwrap();
    check("stacks.json", &out);
    assert_eq!(v["stacks_source"], fixture::STACKS_NOTE);
    let stacks = v["stacks"].as_array().unwrap();
    assert_eq!(stacks.len(), 4);
    assert_eq!(
        stacks[2],
        serde_json::json!({
            "id": 3,
            "frames": [
                { "addr": "0xffffffff81001650", "function": "schedule", "offset": 0x50 },
                { "addr": "0xffffffff82000020", "function": "worker_thread", "offset": 0x20 },
                { "addr": "0xffffffff83000100", "function": null, "offset": null },
            ],
            "end": "too_deep",
            "complete": false,
        })
    );
    assert_eq!(stacks[3]["frames"][1]["function"], "hrtimer_interrupt");
    assert_eq!(stacks[3]["frames"][1]["offset"], 0x200);
    assert_eq!(stacks[1]["end"], "user");
    assert_eq!(stacks[1]["complete"], true);
    let f = |name: &str| {
        v["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(
        f("tick_sched_timer")["stacks"],
        serde_json::json!([
            { "id": 1, "count": 2 },
            { "id": 3, "count": 1 },
            { "id": 4, "count": 1 },
        ])
    );
    assert_eq!(
        f("schedule")["stacks"],
        serde_json::json!([{ "id": 2, "count": 1 }])
    );
    assert!(f("hrtimer_interrupt").get("stacks").is_none());
    let plain = tracer::trace::export::to_json(&fixture::tasks_trace());
    assert!(plain.get("stacks").is_none() && plain.get("stacks_source").is_none());
}

fn output(f: impl FnOnce(&mut Vec<u8>) -> std::io::Result<()>) -> String {
    let mut out = Vec::new();
    f(&mut out).unwrap();
    String::from_utf8(out).unwrap()
}

/// The CSV's last column, `stack`: frames innermost first, `;`-joined.
#[test]
fn the_csv_has_a_stack_column() {
    let t = fixture::stacks_trace();
    let csv = output(|w| tracer::trace::export::write_csv(&t, w));
    check("stacks.csv", csv.as_bytes());
    let mut lines = csv.lines();
    assert_eq!(
        lines.next().unwrap(),
        "ts_ns,cpu,function,addr,parent,caller,kind,slot,pid,tgid,comm,stack"
    );
    assert!(
        csv.contains(",entry,0xffffc90000033fb8,60,57,gdbus,schedule+0x50;worker_thread+0x20;0xffffffff83000100\n"),
        "{csv}"
    );
    assert!(
        csv.contains(",__hrtimer_run_queues+0x38;hrtimer_interrupt+0x200\n"),
        "{csv}"
    );
    // Entries without a stack, and returns, leave it empty.
    assert_eq!(csv.lines().filter(|l| l.ends_with(',')).count(), 22 - 5);
    // Without stacks: no column.
    let plain = output(|w| tracer::trace::export::write_csv(&fixture::tasks_trace(), w));
    assert!(!plain.contains("stack"), "{plain}");
}

/// Folded output: each entry with a stack is `comm;outermost;...;caller;
/// function COUNT`, on top of a function graph's self-time lines.
#[test]
fn folded_output_folds_the_entries_stacks() {
    let t = fixture::stacks_trace();
    let folded = output(|w| tracer::trace::export::write_folded(&t, w));
    check("stacks.folded", folded.as_bytes());
    assert!(
        folded.contains("\nswapper;cpu_idle_loop;sysvec_apic_timer_interrupt;hrtimer_interrupt;__hrtimer_run_queues;tick_sched_timer 1\n"),
        "{folded}"
    );
    assert!(
        folded.starts_with("gdbus;0xffffffff83000100;worker_thread;schedule;tick_sched_timer 1\n"),
        "{folded}"
    );
    assert!(
        folded.contains("\ngdbus;worker_thread;schedule 1\n"),
        "{folded}"
    );
    // Stack 4's entry has no known task: no comm.
    assert!(
        folded.contains("\nhrtimer_interrupt;__hrtimer_run_queues;tick_sched_timer 1\n"),
        "{folded}"
    );
    // The self-time lines stay.
    assert!(folded.contains("\ngdbus;schedule 31600\n"), "{folded}");

    // An entry-only trace folds its stacks only; two entries with the same
    // path add up.
    let mut t = fixture::stacks_trace();
    t.events.retain(|e| !e.is_return());
    t.events.iter_mut().for_each(|e| {
        e.slot = 0;
        e.task = 0;
    });
    t.returns.clear();
    t.meta.graph = false;
    t.meta.unhooked = 0;
    let folded = output(|w| tracer::trace::export::write_folded(&t, w));
    assert_eq!(
        folded,
        "0xffffffff83000100;worker_thread;schedule;tick_sched_timer 1\n\
         cpu_idle_loop;sysvec_apic_timer_interrupt;hrtimer_interrupt;__hrtimer_run_queues;tick_sched_timer 2\n\
         hrtimer_interrupt;__hrtimer_run_queues;tick_sched_timer 1\n\
         worker_thread;schedule 1\n"
    );
}

/// trace.dat: a `kernel_stack` event after each entry with a stack, which
/// Debian's `trace-cmd report` prints as ftrace's own (`<stack trace >`,
/// `=> function (address)` per frame), entry-only and function graph.
#[test]
fn trace_cmd_reports_the_kernel_stacks() {
    for graph in [true, false] {
        let mut t = fixture::stacks_trace();
        if !graph {
            t.events.retain(|e| !e.is_return());
            t.events.iter_mut().for_each(|e| e.slot = 0);
            t.returns.clear();
            t.meta.graph = false;
            t.meta.unhooked = 0;
        }
        let path = tmp(&format!("stacks-{graph}.dat"));
        let mut bytes = Vec::new();
        let w = tracer::trace::export::tracedat::write_tracedat_counted(&t, &mut bytes).unwrap();
        assert_eq!(w.kernel_stack, 5);
        fs::write(&path, &bytes).unwrap();
        let out = std::process::Command::new("trace-cmd")
            .args(["report", "-i"])
            .arg(&path)
            .output()
            .expect("trace-cmd is not installed: `apt-get install trace-cmd`");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && stderr.trim().is_empty(), "{stderr}");
        assert_eq!(stdout.matches("kernel_stack:").count(), 5, "{stdout}");
        let want = "<stack trace >\n=> __hrtimer_run_queues (ffffffff81001230)\n\
                    => hrtimer_interrupt (ffffffff81001020)\n\
                    => sysvec_apic_timer_interrupt (ffffffff82002010)\n\
                    => cpu_idle_loop (ffffffff81001840)\n";
        assert_eq!(stdout.matches(want).count(), 2, "{stdout}");
        let cut = "<stack trace >\n=> schedule (ffffffff81001650)\n\
                   => worker_thread (ffffffff82000020)\n";
        assert!(stdout.contains(cut), "{stdout}");
        // Each follows its entry, same task, CPU and time.
        let lines: Vec<&str> = stdout.lines().collect();
        let i = lines
            .iter()
            .position(|l| l.contains("kernel_stack:") && l.contains("gdbus-60"))
            .unwrap();
        let time = |l: &str| l.split(':').next().unwrap().to_string();
        assert!(lines[i - 1].contains("schedule"), "{stdout}");
        assert_eq!(
            time(lines[i - 1]),
            time(lines[i]).replace("kernel_stack", "")
        );
        let _ = fs::remove_file(&path);
    }
}

/// A stack too long for an event header's `type_len` (over 112 bytes: 12
/// frames) is written in the long form, which trace-cmd reads whole: here
/// 64 frames, the most a stack keeps.
#[test]
fn trace_cmd_reads_a_64_frame_stack() {
    let mut t = fixture::stacks_trace();
    t.stacks[0].frames = (0..64u64).map(|i| fixture::WORKER_THREAD + 1 + i).collect();
    let path = tmp("stacks-long.dat");
    let mut bytes = Vec::new();
    tracer::trace::export::write_tracedat(&t, &mut bytes).unwrap();
    fs::write(&path, &bytes).unwrap();
    let out = std::process::Command::new("trace-cmd")
        .args(["report", "-i"])
        .arg(&path)
        .output()
        .expect("trace-cmd is not installed: `apt-get install trace-cmd`");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut want = String::from("<stack trace >\n");
    for i in 0..64u64 {
        want += &format!("=> worker_thread ({:x})\n", fixture::WORKER_THREAD + 1 + i);
    }
    assert_eq!(stdout.matches(&want).count(), 2, "{stdout}");
    // The events after them are still read.
    assert!(
        stdout.contains("=> schedule (ffffffff81001650)\n"),
        "{stdout}"
    );
    assert_eq!(stdout.matches("kernel_stack:").count(), 5, "{stdout}");
    let _ = fs::remove_file(&path);
}

/// An interrupt can land on a function's first instruction: that frame
/// (an interrupted instruction's own address, `Stack::exact`) is named by
/// the function holding it, not by the byte before it as a return address
/// is; the mask survives the data file.
#[test]
fn an_interrupted_first_instruction_is_named_by_its_own_function() {
    let mut t = fixture::stacks_trace();
    // Stack 4's second frame is __hrtimer_run_queues' first byte.
    let entry = t.events.iter().position(|e| e.stack == 4).unwrap();
    let before = script(&t);
    assert!(before.contains(" => hrtimer_interrupt+0x"), "{before}");
    t.stacks[3].exact = 1 << 1;
    let after = script(&t);
    assert!(after.contains(" => __hrtimer_run_queues+0x0\n"), "{after}");
    let path = tmp("exact.vmtrace");
    save(&t, &path).unwrap();
    let back = load(&path).unwrap();
    assert_eq!(back.stacks[3].exact, 1 << 1);
    assert_eq!(back.events[entry].stack, 4);
    assert_eq!(script(&back), after);
}
