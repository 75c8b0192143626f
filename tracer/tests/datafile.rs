//! The data file (format version 7) as `vmtrace record` streams it: read
//! back whole, read after the writer was killed at any byte, refused when
//! corrupt in the middle; version 5 files still read.

use std::path::{Path, PathBuf};

#[path = "report_fixture.rs"]
mod fixture;

use tracer::trace::datafile::{load, DataFile, TraceFileError};
use tracer::trace::model::{Event, Trace};

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vmtrace-datafile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
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
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 5);
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
