//! The data file (format version 11) as `vmtrace record` streams it: read
//! back whole, read after the writer was killed at any byte, refused when
//! corrupt in the middle; guest tasks saved before the events that name
//! them; why events were dropped and the command line kept; version 5, 7,
//! 9 and 10 files still read; functions added during the trace (`FUNC`
//! blocks, version 14) named before the events that name them.

use std::path::{Path, PathBuf};

#[path = "report_fixture.rs"]
mod fixture;

use tracer::session::tasks::TaskTable;
use tracer::trace::cmdline::{MAX_ARGS, MAX_ARG_BYTES};
use tracer::trace::datafile::{load, save, DataFile, Section, TraceFileError, DATA_VERSION};
use tracer::trace::model::{DropCauses, Event, Task, Trace};

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vmtrace-datafile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// The format version a data file at `path` was written in.
fn version_of(path: &Path) -> u32 {
    let bytes = std::fs::read(path).unwrap();
    u32::from_le_bytes(bytes[8..12].try_into().unwrap())
}

/// What the session writes as `HEAD`: no counts yet, every function a
/// possible caller.
fn head_of(t: &Trace) -> Trace {
    let mut h = t.clone();
    h.events.clear();
    for row in &mut h.counts {
        row.iter_mut().for_each(|c| *c = 0);
    }
    h.meta.events_total = 0;
    h.meta.events_dropped = 0;
    h.meta.attach_ns = 0;
    h.meta.detach_ns = 0;
    h
}

/// Writes `t` as the store does: HEAD, events per vCPU in batches (not in
/// global time order), FOOT + END unless `complete` is false.
fn write(t: &Trace, path: &Path, batch: usize, complete: bool) -> u64 {
    let mut f = DataFile::create(path).unwrap();
    f.head(&head_of(t)).unwrap();
    for cpu in 0..t.meta.cpus {
        let mine: Vec<Event> = t.events.iter().filter(|e| e.cpu == cpu).copied().collect();
        for b in mine.chunks(batch) {
            f.write_events(b).unwrap();
        }
    }
    if complete {
        f.finish(t).unwrap();
    }
    f.bytes()
}

#[test]
fn a_complete_data_file_reads_back_as_the_trace() {
    let mut t = Trace::synthetic(50_000);
    // What only the data file keeps: losses, the flight recorder, rejected
    // sites, the kernel's offsets, the calls never committed (version 6).
    t.meta.lost = vec![0, 0, 0, 0];
    t.meta.unfinished = 3;
    t.meta.overwrite = true;
    t.meta.rejected_sites =
        "72 __mcount_loc entries not at a function entry (in no function: 0xffffffff81000000, ...)"
            .into();
    t.meta.kernel_offset = Some((0x3b80_0000, -0x20_0000));
    let path = tmp("complete.data");
    let bytes = write(&t, &path, 4096, true);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), bytes);
    let back = load(&path).unwrap();
    assert!(!back.meta.incomplete);
    assert_eq!(back.events.len(), t.events.len());
    // Sorted by time again, whatever order the vCPUs' batches came in.
    assert!(back.events.windows(2).all(|w| w[0].ts_ns <= w[1].ts_ns));
    let mut want = t.events.clone();
    want.sort_by_key(|e| (e.ts_ns, e.cpu));
    assert_eq!(back.events, want);
    assert_eq!(back.counts, t.counts);
    assert_eq!(back.meta, t.meta);
    assert_eq!(back.functions, t.functions);
}

/// `golden/graph.v5.data` was written by the version-5 writer (before
/// `unfinished` was kept) from the graph fixture, with a loss on vCPU 1,
/// the flight recorder, rejected sites and KASLR offsets: it still reads
/// as that trace, nothing unfinished.
#[test]
fn a_version_5_data_file_still_reads() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/graph.v5.data");
    assert_eq!(version_of(&path), 5);
    let mut want = fixture::graph_trace();
    want.meta.lost = vec![0; want.meta.cpus as usize];
    want.meta.lost[1] = 7;
    want.meta.overwrite = true;
    want.meta.rejected_sites = "3 __mcount_loc entries not at a function entry".into();
    want.meta.kernel_offset = Some((0x3b80_0000, -0x20_0000));
    let back = load(&path).unwrap();
    assert_eq!(back.meta.unfinished, 0);
    assert_eq!(back, want);
}

#[test]
fn a_file_cut_anywhere_reads_up_to_its_last_complete_block() {
    let t = Trace::synthetic(20_000);
    let path = tmp("whole.data");
    write(&t, &path, 1000, false);
    let whole = std::fs::read(&path).unwrap();
    let cut = tmp("cut.data");
    // Preamble (20 bytes), then HEAD: tag, length, payload, checksum.
    let head_len = u32::from_le_bytes(whole[24..28].try_into().unwrap()) as usize;
    let head_end = 20 + 12 + head_len;
    let mut last_events = usize::MAX;
    let mut seen_partial = false;
    // From the end back to inside the HEAD block, in uneven steps.
    let mut at = whole.len();
    while at > 40 {
        std::fs::write(&cut, &whole[..at]).unwrap();
        match load(&cut) {
            Ok(back) => {
                assert!(back.meta.incomplete, "cut at {at}");
                assert!(back.meta.stop_reason.contains("cut short"));
                // Whole blocks only: a multiple of the batch per vCPU.
                assert!(back.events.len() <= last_events);
                assert_eq!(back.events.len() % 1000, 0, "cut at {at}");
                let total: u64 = back.counts.iter().flatten().sum();
                assert_eq!(total, back.events.len() as u64);
                assert_eq!(back.meta.events_total, total);
                if back.events.len() < t.events.len() {
                    seen_partial = true;
                }
                // Callers of the kept events are named.
                for e in &back.events {
                    if t.caller_of(e.parent).is_some() {
                        assert!(back.caller_of(e.parent).is_some());
                    }
                }
                last_events = back.events.len();
            }
            Err(TraceFileError::Truncated { .. }) => {
                // Only before the HEAD block is whole.
                assert!(at < head_end, "cut at {at} refused");
            }
            Err(e) => panic!("cut at {at}: {e}"),
        }
        at -= 1 + at / 17;
    }
    assert!(seen_partial);
}

#[test]
fn a_bad_block_in_the_middle_is_corruption() {
    let t = Trace::synthetic(10_000);
    let path = tmp("corrupt.data");
    write(&t, &path, 1000, true);
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x55;
    std::fs::write(&path, &bytes).unwrap();
    let e = load(&path).unwrap_err().to_string();
    assert!(e.contains("corrupt") && e.contains("checksum"), "{e}");
}

#[test]
fn an_empty_data_file_says_it_is_truncated() {
    let path = tmp("empty.data");
    drop(DataFile::create(&path).unwrap());
    let e = load(&path).unwrap_err();
    assert!(matches!(e, TraceFileError::Truncated { .. }), "{e}");
}

/// `golden/graph.v7.data` was written by the version-7 writer (before
/// tasks) from the graph fixture, with a loss on vCPU 1, calls never
/// committed, rejected sites, KASLR offsets and the QEMU that ran the
/// guest: it still reads as that trace, no task known.
#[test]
fn a_version_7_data_file_still_reads() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/graph.v7.data");
    assert_eq!(version_of(&path), 7);
    let mut want = fixture::graph_trace();
    want.meta.lost = vec![0; want.meta.cpus as usize];
    want.meta.lost[1] = 7;
    want.meta.unfinished = 2;
    want.meta.rejected_sites = "3 __mcount_loc entries not at a function entry".into();
    want.meta.kernel_offset = Some((0x3b80_0000, -0x20_0000));
    want.meta.vmm = "QEMU 7.2.22 (pid 4242, kvm; QMP /run/qemu.sock)".into();
    let back = load(&path).unwrap();
    assert!(back.tasks.is_empty());
    assert!(back.events.iter().all(|e| e.task == 0));
    assert_eq!(back, want);
}

/// A trace with guest tasks saves as a data file (version 4 has no room
/// for them) and reads back as itself; one without stays version 4.
#[test]
fn a_trace_with_tasks_saves_and_loads_back() {
    for t in [fixture::tasks_trace(), fixture::tasks_entry_trace()] {
        let path = tmp("tasks.vmtrace");
        save(&t, &path).unwrap();
        assert_eq!(version_of(&path), DATA_VERSION);
        assert_eq!(load(&path).unwrap(), t);
    }
    // The source alone (no task known) is kept too.
    let mut t = fixture::graph_trace();
    t.meta.tasks = "no BTF in guest/out/vmlinux".into();
    let path = tmp("source.vmtrace");
    save(&t, &path).unwrap();
    assert_eq!(load(&path).unwrap(), t);
    save(&fixture::graph_trace(), &path).unwrap();
    assert_eq!(version_of(&path), 4);
}

/// The task of synthetic event `i`: 40 tasks, first seen over the run, so
/// that new tasks keep arriving between batches.
fn task_of(i: usize) -> Task {
    let n = (i / 500).min(39) as u32;
    let k = (i as u32 * 7) % (n + 1);
    Task {
        pid: 100 + k,
        tgid: 100 + k - k % 4,
        comm: format!("task{k}"),
    }
}

/// Streams `t` as the store does: each vCPU's events in batches, each
/// batch's tasks interned first and the tasks new since the last batch
/// written before it. Returns the table.
fn stream_with_tasks(t: &mut Trace, path: &Path, complete: bool) -> TaskTable {
    let table = TaskTable::new();
    let mut f = DataFile::create(path).unwrap();
    f.head(&head_of(t)).unwrap();
    let n = t.events.len();
    for (i, e) in t.events.iter_mut().enumerate() {
        e.task = if i % 10 == 9 { 0 } else { u32::MAX };
    }
    for cpu in 0..t.meta.cpus {
        let idx: Vec<usize> = (0..n).filter(|&i| t.events[i].cpu == cpu).collect();
        for b in idx.chunks(700) {
            let mut batch = Vec::new();
            for &i in b {
                let e = &mut t.events[i];
                if e.task != 0 {
                    e.task = table.intern(&task_of(i));
                }
                batch.push(*e);
            }
            f.write_tasks(&table.since(f.tasks_saved())).unwrap();
            f.write_events(&batch).unwrap();
        }
    }
    t.tasks = table.all();
    if complete {
        f.finish(t).unwrap();
    }
    table
}

#[test]
fn a_streamed_file_with_tasks_reads_back_with_them() {
    let mut t = Trace::synthetic(20_000);
    let path = tmp("tasks.data");
    let table = stream_with_tasks(&mut t, &path, true);
    assert_eq!(table.len(), 40);
    let back = load(&path).unwrap();
    assert!(!back.meta.incomplete);
    assert_eq!(back.tasks, table.all());
    let mut want = t.events.clone();
    want.sort_by_key(|e| (e.ts_ns, e.cpu));
    assert_eq!(back.events, want);
}

/// Killed at any byte: every event kept still has its task, a call whose
/// task was unknown still has none.
#[test]
fn a_streamed_file_with_tasks_cut_anywhere_keeps_each_events_task() {
    let mut t = Trace::synthetic(20_000);
    let path = tmp("tasks-whole.data");
    stream_with_tasks(&mut t, &path, false);
    let whole = std::fs::read(&path).unwrap();
    // Synthetic events have distinct times.
    let task_at: std::collections::HashMap<u64, Option<Task>> = t
        .events
        .iter()
        .map(|e| (e.ts_ns, t.task_of(e).cloned()))
        .collect();
    let cut = tmp("tasks-cut.data");
    let head_len = u32::from_le_bytes(whole[24..28].try_into().unwrap()) as usize;
    let head_end = 20 + 12 + head_len;
    let mut at = whole.len();
    let mut checked = 0;
    while at >= head_end {
        std::fs::write(&cut, &whole[..at]).unwrap();
        let back = load(&cut).unwrap_or_else(|e| panic!("cut at {at}: {e}"));
        assert!(back.meta.incomplete);
        for e in &back.events {
            assert_eq!(back.task_of(e).cloned(), task_at[&e.ts_ns], "cut at {at}");
            checked += 1;
        }
        // No more tasks than the events kept could name, in first-seen order.
        assert_eq!(back.tasks[..], t.tasks[..back.tasks.len()]);
        at -= 1 + at / 23;
    }
    assert!(checked > 100_000, "{checked}");
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
fn patch(b: &mut [u8], block: usize, payload: std::ops::Range<usize>, pos: usize, v: u32) {
    b[pos..pos + 4].copy_from_slice(&v.to_le_bytes());
    let crc = crc32fast::hash(&b[block..payload.end]);
    b[payload.end..payload.end + 4].copy_from_slice(&crc.to_le_bytes());
}

#[test]
fn a_task_past_the_saved_ones_is_corruption() {
    let t = fixture::tasks_entry_trace();
    let path = tmp("tasks-ok.data");
    save(&t, &path).unwrap();
    let good = std::fs::read(&path).unwrap();
    let bl = blocks(&good);
    let tags: Vec<&[u8; 4]> = bl.iter().map(|(_, tag, _)| tag).collect();
    assert_eq!(tags, [b"HEAD", b"TASK", b"EVTS", b"FOOT", b"END\0"]);

    // The first event (36 bytes after the count) names task 7 of 6.
    let (start, _, payload) = bl[2].clone();
    let mut b = good.clone();
    patch(&mut b, start, payload.clone(), payload.start + 4 + 32, 7);
    std::fs::write(&path, &b).unwrap();
    match load(&path).unwrap_err() {
        TraceFileError::Corrupt {
            section, detail, ..
        } => {
            assert_eq!(section, Section::Events);
            assert_eq!(
                detail,
                "event 0 names task 7 but 6 tasks are saved before it"
            );
        }
        e => panic!("{e}"),
    }
    let msg = load(&path).unwrap_err().to_string();
    assert!(msg.contains("corrupt trace file (events section)"), "{msg}");

    // A task block that does not follow the tasks before it.
    let (start, _, payload) = bl[1].clone();
    let mut b = good.clone();
    patch(&mut b, start, payload.clone(), payload.start, 1);
    std::fs::write(&path, &b).unwrap();
    let msg = load(&path).unwrap_err().to_string();
    assert!(
        msg.ends_with(
            "corrupt trace file (tasks section): a task block starts at task 2 but 0 tasks came before it"
        ),
        "{msg}"
    );
}

/// Why events were dropped (version 10) is kept: each cause's count, the
/// ring-full drops per vCPU, the rings' size asked and given.
#[test]
fn the_causes_of_drops_save_and_load_back() {
    let mut t = fixture::tasks_trace();
    let cpus = t.meta.cpus as usize;
    t.meta.drops = DropCauses {
        ring_full: (0..cpus as u64).map(|c| 10 * c).collect(),
        held: 3,
        ring_asked: 8192,
        ring_given: 64,
        over_budget: 5,
        overwritten: 0,
    };
    let path = tmp("drops.vmtrace");
    save(&t, &path).unwrap();
    assert_eq!(load(&path).unwrap(), t);
    // Ring-full drops for another vCPU count than the trace's: corrupt.
    t.meta.drops.ring_full.push(1);
    save(&t, &path).unwrap();
    let e = load(&path).unwrap_err();
    assert!(matches!(e, TraceFileError::Corrupt { .. }), "{e}");
    assert!(e.to_string().contains("ring-full drops for"), "{e}");
}

/// `golden/mini.v9.data` was recorded by the version-9 writer (vmtrace
/// before this format said why events were dropped), from the mini guest
/// on 2 vCPUs with 4-record rings: 2,100 calls, 215 stored. It still
/// reads, with no cause said.
#[test]
fn a_version_9_data_file_still_reads() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/mini.v9.data");
    assert_eq!(version_of(&path), 9);
    let back = load(&path).unwrap();
    assert_eq!(
        (
            back.meta.events_total,
            back.events.len(),
            back.meta.events_dropped
        ),
        (2100, 215, 1885)
    );
    assert_eq!(back.meta.drops, DropCauses::default());
}

/// `golden/mini.v10.data` was recorded by the version-10 writer (vmtrace
/// before this format kept the command line): `vmtrace record --kernel
/// guest/out/mini.elf --cpus 2 --cmdline iters=40 --trace
/// 'hrtimer_*,__hrtimer_run_queues' --mode exitless --ring-events 4`: 360
/// calls, 231 stored, the others dropped for a full ring. It still reads,
/// its drop causes too, with no command line.
#[test]
fn a_version_10_data_file_still_reads() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/mini.v10.data");
    assert_eq!(version_of(&path), 10);
    let back = load(&path).unwrap();
    let m = &back.meta;
    assert_eq!(
        (m.events_total, back.events.len(), m.events_dropped),
        (360, 231, 129)
    );
    assert_eq!(
        (m.drops.ring_full.as_slice(), m.drops.held),
        (&[36, 93][..], 1)
    );
    assert!(m.cmdline.is_empty(), "{:?}", m.cmdline);
}

/// The command line (version 11) is kept argument by argument, exactly,
/// in a file saved whole and in one streamed; a trace with nothing else
/// of a data file's is saved as one for it.
#[test]
fn the_command_line_saves_and_loads_back() {
    let mut t = fixture::trace();
    let argv = [
        "vmtrace",
        "--trace",
        "hrtimer_*",
        "-o",
        "my trace.data",
        "it's $HOME",
        "",
        "a\nnew\nline",
        "\u{e9}t\u{e9}",
    ];
    t.meta.cmdline = argv.iter().map(|a| a.to_string()).collect();
    let path = tmp("cmdline.vmtrace");
    save(&t, &path).unwrap();
    assert_eq!(version_of(&path), DATA_VERSION);
    assert_eq!(load(&path).unwrap(), t);
    let mut tasks = fixture::tasks_trace();
    tasks.meta.cmdline = t.meta.cmdline.clone();
    let streamed = tmp("cmdline.data");
    write(&tasks, &streamed, 3, true);
    assert_eq!(load(&streamed).unwrap(), tasks);
    // Past the bounds: what fits is kept, and says it was cut.
    t.meta.cmdline = vec!["x".repeat(MAX_ARG_BYTES + 1); MAX_ARGS + 1];
    save(&t, &path).unwrap();
    let back = load(&path).unwrap().meta.cmdline;
    assert_eq!(back.len(), MAX_ARGS);
    assert!(back[0].len() <= MAX_ARG_BYTES && back[0].ends_with("[...]"));
    assert_eq!(back[MAX_ARGS - 1], "[2 more arguments]");
}

/// A module first loaded during the trace: `t` with its last `added`
/// functions renamed as a module's, and its events split in two halves,
/// the functions added only in the second (as the trap path meets them).
fn with_added_functions(added: usize) -> (Trace, usize) {
    let mut t = Trace::synthetic(20_000);
    let known = t.functions.len() - added;
    for (i, f) in t.functions[known..].iter_mut().enumerate() {
        f.name = format!("vmt_fn{i} [vmt_test]");
        f.addr = 0xffff_ffff_c000_0000 + i as u64 * 0x40;
    }
    // Events of the added functions come after the first half only.
    let half = t.events[t.events.len() / 2].ts_ns;
    t.events
        .retain(|e| (e.func as usize) < known || e.ts_ns >= half);
    // (The synthetic trace favours small indices: calls given to them.)
    for (k, e) in t.events.iter_mut().enumerate() {
        if e.ts_ns >= half && k % 37 == 0 {
            e.func = (known + k % added) as u32;
        }
    }
    for row in &mut t.counts {
        row.iter_mut().for_each(|c| *c = 0);
    }
    for e in &t.events {
        t.counts[e.func as usize][e.cpu as usize] += 1;
    }
    t.meta.events_total = t.events.len() as u64;
    (t, known)
}

/// Writes `t` as the store does when functions come during the trace:
/// `HEAD` with the first `known`, then events in time order in batches,
/// each batch after a `FUNC` block with the functions it first names.
fn write_with_added(t: &Trace, known: usize, path: &Path, complete: bool) {
    let mut head = head_of(t);
    head.functions.truncate(known);
    head.counts.truncate(known);
    let mut f = DataFile::create(path).unwrap();
    f.head(&head).unwrap();
    assert_eq!(f.funcs_saved(), known);
    for batch in t.events.chunks(500) {
        let need = batch.iter().map(|e| e.func as usize + 1).max().unwrap();
        if need > f.funcs_saved() {
            let from = f.funcs_saved();
            f.write_functions(&t.functions[from..need]).unwrap();
        }
        f.write_events(batch).unwrap();
    }
    if complete {
        f.finish(t).unwrap();
    }
}

#[test]
fn functions_added_during_the_trace_read_back_named() {
    let (t, known) = with_added_functions(3);
    let path = tmp("added.data");
    write_with_added(&t, known, &path, true);
    assert_eq!(version_of(&path), DATA_VERSION);
    let b = std::fs::read(&path).unwrap();
    let funcs = blocks(&b)
        .iter()
        .filter(|(_, tag, _)| tag == b"FUNC")
        .count();
    assert!((1..=3).contains(&funcs), "{funcs} FUNC blocks");
    let back = load(&path).unwrap();
    assert!(!back.meta.incomplete);
    assert_eq!(back.functions, t.functions);
    assert_eq!(back.counts, t.counts);
    assert_eq!(back.events.len(), t.events.len());
    let added: u64 = back.counts[known..].iter().flatten().sum();
    assert!(added > 0);
    assert_eq!(back.functions[known].name, "vmt_fn0 [vmt_test]");
}

#[test]
fn a_file_with_functions_added_cut_anywhere_names_each_kept_events_function() {
    let (t, known) = with_added_functions(3);
    let path = tmp("added-whole.data");
    write_with_added(&t, known, &path, false);
    let whole = std::fs::read(&path).unwrap();
    let cut = tmp("added-cut.data");
    let (mut at, mut saw_added) = (whole.len(), false);
    while at > 40 {
        std::fs::write(&cut, &whole[..at]).unwrap();
        match load(&cut) {
            Ok(back) => {
                assert!(back.meta.incomplete);
                // The functions named are HEAD's and a prefix of the added.
                assert_eq!(back.functions[..], t.functions[..back.functions.len()]);
                assert!(back.functions.len() >= known);
                assert!(back
                    .events
                    .iter()
                    .all(|e| (e.func as usize) < back.functions.len()));
                assert_eq!(back.counts.len(), back.functions.len());
                saw_added |= back.functions.len() > known;
            }
            Err(TraceFileError::Truncated { .. }) => {}
            Err(e) => panic!("cut at {at}: {e}"),
        }
        at -= 1 + at / 19;
    }
    assert!(saw_added);
}

#[test]
fn an_event_of_a_function_not_yet_added_is_corruption() {
    let (t, known) = with_added_functions(1);
    let path = tmp("added-bad.data");
    write_with_added(&t, known, &path, true);
    let good = std::fs::read(&path).unwrap();
    let bl = blocks(&good);
    let at = bl.iter().position(|(_, tag, _)| tag == b"FUNC").unwrap();

    // The FUNC block's `first` off by one.
    let (start, _, payload) = bl[at].clone();
    let mut b = good.clone();
    patch(
        &mut b,
        start,
        payload.clone(),
        payload.start,
        known as u32 + 1,
    );
    std::fs::write(&path, &b).unwrap();
    let msg = load(&path).unwrap_err().to_string();
    assert!(
        msg.ends_with(&format!(
            "corrupt trace file (functions section): a function block starts at function {} but {known} came before it",
            known + 1
        )),
        "{msg}"
    );

    // The FUNC block taken out: an event after it names the function
    // it added, past those named.
    let mut b = good.clone();
    b.drain(start..payload.end + 4);
    std::fs::write(&path, &b).unwrap();
    let msg = load(&path).unwrap_err().to_string();
    assert!(
        msg.contains(&format!(
            "function index {known} but there are {known} functions"
        )),
        "{msg}"
    );
}
