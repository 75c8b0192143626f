//! Saved traces (`-o FILE`, `vmtrace report -i FILE`): round trips and every
//! kind of bad file, on synthetic traces (no KVM needed).

#[path = "report_fixture.rs"]
mod fixture;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use tracer::model::Trace;
use tracer::report::{render, ReportOptions, Sort};
use tracer::tracefile::{load, save, Section, TraceFileError, EVENT_SIZE, MAGIC};

/// A fresh, empty directory for one test.
fn scratch(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "report_tracefile-{}-{name}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// The bytes of the fixture trace as saved.
fn saved_bytes(t: &Trace) -> Vec<u8> {
    let dir = scratch("bytes");
    let p = dir.join("t.vmtrace");
    save(t, &p).unwrap();
    let b = fs::read(&p).unwrap();
    fs::remove_dir_all(&dir).unwrap();
    b
}

/// Loads `bytes` written to a file; checks the error (if any) is one line naming the file.
fn load_bytes(name: &str, bytes: &[u8]) -> Result<Trace, TraceFileError> {
    let dir = scratch(name);
    let p = dir.join("t.vmtrace");
    fs::write(&p, bytes).unwrap();
    let r = load(&p);
    if let Err(e) = &r {
        let msg = e.to_string();
        assert!(!msg.contains('\n'), "multi-line: {msg}");
        assert!(msg.contains(&p.display().to_string()), "no path: {msg}");
        assert_eq!(e.path(), p);
    }
    fs::remove_dir_all(&dir).unwrap();
    r
}

/// Section start offsets, computed from the format documented in tracefile/mod.rs.
struct Layout {
    header: usize,
    functions: usize,
    counts: usize,
    callers: usize,
    events: usize,
    /// Offset of the first event record.
    records: usize,
    end: usize,
}

fn layout(t: &Trace) -> Layout {
    let str_len = |s: &str| 4 + s.len();
    let syms =
        |v: &[tracer::symbols::Symbol]| 4 + v.iter().map(|s| str_len(&s.name) + 16).sum::<usize>();
    let m = &t.meta;
    let header = 20;
    let functions = header
        + str_len(&m.kernel)
        + 1
        + m.build_id.as_deref().map_or(0, str_len)
        + 4
        + 10 * 8
        + str_len(&m.stop_reason);
    let counts = functions + syms(&t.functions);
    let callers = counts + 8 + t.functions.len() * m.cpus as usize * 8;
    let events = callers + syms(&t.callers);
    let records = events + 8;
    Layout {
        header,
        functions,
        counts,
        callers,
        events,
        records,
        end: records + t.events.len() * EVENT_SIZE,
    }
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn corrupt_in(r: Result<Trace, TraceFileError>, want: Section, detail: &str) {
    match r {
        Err(TraceFileError::Corrupt {
            section, detail: d, ..
        }) => {
            assert_eq!(section, want, "{d}");
            assert!(d.contains(detail), "{d:?} lacks {detail:?}");
        }
        other => panic!("expected corrupt {want}, got {other:?}"),
    }
}

#[test]
fn report_tracefile_round_trip() {
    let dir = scratch("round-trip");
    for (name, t) in [
        ("fixture", fixture::trace()),
        ("empty", Trace::default()),
        ("big", fixture::big_trace(200_000)),
        ("no-build-id", {
            let mut t = fixture::trace();
            t.meta.build_id = None;
            t.meta.kernel = "/tmp/ünïcode kernel".into();
            t
        }),
    ] {
        let p = dir.join(format!("{name}.vmtrace"));
        save(&t, &p).unwrap();
        let back = load(&p).unwrap();
        assert!(back == t, "{name}: round trip differs");
        for sort in [Sort::Count, Sort::Name, Sort::Cpu] {
            for callers in [false, true] {
                let o = ReportOptions {
                    sort,
                    callers,
                    cpus: callers.then(|| vec![0, 2]),
                    ..Default::default()
                };
                assert_eq!(render(&back, &o), render(&t, &o), "{name}");
            }
        }
        assert_eq!(
            fs::metadata(&p).unwrap().len() as usize,
            layout(&t).end,
            "{name}"
        );
    }
    // Saving over an existing file replaces it; no temporary file is left.
    let p = dir.join("fixture.vmtrace");
    save(&Trace::default(), &p).unwrap();
    assert_eq!(load(&p).unwrap(), Trace::default());
    let mut left: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left,
        [
            "big.vmtrace",
            "empty.vmtrace",
            "fixture.vmtrace",
            "no-build-id.vmtrace"
        ]
    );
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn report_tracefile_layout_matches_the_documented_format() {
    let t = fixture::trace();
    let b = saved_bytes(&t);
    let l = layout(&t);
    assert_eq!(b.len(), l.end);
    assert_eq!(&b[..8], MAGIC);
    assert_eq!(&b[..8], b"VMTRACE\0");
    assert_eq!(u32::from_le_bytes(b[8..12].try_into().unwrap()), 1);
    assert_eq!(
        u64::from_le_bytes(b[12..20].try_into().unwrap()),
        b.len() as u64
    );
    let kernel_len = u32::from_le_bytes(b[20..24].try_into().unwrap()) as usize;
    assert_eq!(&b[24..24 + kernel_len], t.meta.kernel.as_bytes());
    assert_eq!(
        u32::from_le_bytes(b[l.functions..l.functions + 4].try_into().unwrap()),
        7
    );
    assert_eq!(
        u32::from_le_bytes(b[l.counts..l.counts + 4].try_into().unwrap()),
        7
    );
    assert_eq!(
        u32::from_le_bytes(b[l.counts + 4..l.counts + 8].try_into().unwrap()),
        4
    );
    // counts[0][1] (row-major, after rows and cols).
    assert_eq!(
        u64::from_le_bytes(b[l.counts + 16..l.counts + 24].try_into().unwrap()),
        998
    );
    assert_eq!(
        u64::from_le_bytes(b[l.events..l.events + 8].try_into().unwrap()),
        t.events.len() as u64
    );
    let e = &b[l.records..l.records + EVENT_SIZE];
    assert_eq!(
        u64::from_le_bytes(e[0..8].try_into().unwrap()),
        t.events[0].ts_ns
    );
    assert_eq!(
        u64::from_le_bytes(e[8..16].try_into().unwrap()),
        t.events[0].parent
    );
    assert_eq!(
        u32::from_le_bytes(e[16..20].try_into().unwrap()),
        t.events[0].func
    );
    assert_eq!(
        u32::from_le_bytes(e[20..24].try_into().unwrap()),
        t.events[0].cpu
    );
}

#[test]
fn report_tracefile_bad_magic() {
    let mut b = saved_bytes(&fixture::trace());
    b[..8].copy_from_slice(b"PERFILE2");
    let e = load_bytes("magic", &b).unwrap_err();
    assert!(matches!(e, TraceFileError::BadMagic { .. }), "{e:?}");
    assert!(e.to_string().contains("not a vmtrace trace"), "{e}");
    // Short files that are not a prefix of the magic, text files, ELF files.
    for bytes in [
        &b"hi"[..],
        b"# vmtrace report\n",
        b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0",
    ] {
        let e = load_bytes("magic-short", bytes).unwrap_err();
        assert!(matches!(e, TraceFileError::BadMagic { .. }), "{e:?}");
    }
}

#[test]
fn report_tracefile_unsupported_version() {
    let mut b = saved_bytes(&fixture::trace());
    for v in [2, 0, u32::MAX] {
        put_u32(&mut b, 8, v);
        let e = load_bytes("version", &b).unwrap_err();
        assert!(
            matches!(e, TraceFileError::UnsupportedVersion { version, .. } if version == v),
            "{e:?}"
        );
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("unsupported trace format version {v}")),
            "{msg}"
        );
        assert!(msg.contains("reads version 1"), "{msg}");
    }
}

#[test]
fn report_tracefile_truncated_in_every_section() {
    let t = fixture::trace();
    let b = saved_bytes(&t);
    let l = layout(&t);
    let section_at = |len: usize| {
        if len < l.header {
            Section::Preamble
        } else if len < l.functions {
            Section::Header
        } else if len < l.counts {
            Section::Functions
        } else if len < l.callers {
            Section::Counts
        } else if len < l.events {
            Section::Callers
        } else {
            Section::Events
        }
    };
    let mut seen = Vec::new();
    // Every possible cut, from the empty file to one byte short.
    for len in 0..b.len() {
        match load_bytes("truncated", &b[..len]) {
            Err(TraceFileError::Truncated { section, .. }) => {
                assert_eq!(section, section_at(len), "cut at {len}");
                if !seen.contains(&section) {
                    seen.push(section);
                }
            }
            other => panic!("cut at {len} of {}: {other:?}", b.len()),
        }
    }
    assert_eq!(
        seen,
        [
            Section::Preamble,
            Section::Header,
            Section::Functions,
            Section::Counts,
            Section::Callers,
            Section::Events
        ]
    );
    let e = load_bytes("truncated-msg", &b[..l.records + 5]).unwrap_err();
    assert!(
        e.to_string()
            .contains("truncated trace file (ends inside the events section)"),
        "{e}"
    );
}

#[test]
fn report_tracefile_corrupt_contents() {
    let t = fixture::trace();
    let b = saved_bytes(&t);
    let l = layout(&t);

    // An event's function index out of range.
    let mut c = b.clone();
    put_u32(&mut c, l.records + 3 * EVENT_SIZE + 16, 99);
    corrupt_in(
        load_bytes("func", &c),
        Section::Events,
        "event 3 has function index 99",
    );
    // An event's vCPU out of range.
    let mut c = b.clone();
    put_u32(&mut c, l.records + 20, 4);
    corrupt_in(
        load_bytes("cpu", &c),
        Section::Events,
        "event 0 is on vCPU 4",
    );
    // Counts dimensions that do not match the functions and vCPUs.
    let mut c = b.clone();
    put_u32(&mut c, l.counts, 6);
    corrupt_in(load_bytes("rows", &c), Section::Counts, "counts are 6 x 4");
    let mut c = b.clone();
    put_u32(&mut c, l.counts + 4, 3);
    corrupt_in(load_bytes("cols", &c), Section::Counts, "counts are 7 x 3");
    // has_build_id neither 0 nor 1.
    let kernel_end = l.header + 4 + t.meta.kernel.len();
    let mut c = b.clone();
    c[kernel_end] = 7;
    corrupt_in(
        load_bytes("build-id-flag", &c),
        Section::Header,
        "has_build_id is 7",
    );
    // Invalid UTF-8 in the kernel name.
    let mut c = b.clone();
    c[l.header + 4] = 0xff;
    corrupt_in(load_bytes("utf8", &c), Section::Header, "not valid UTF-8");
    // Callers out of address order: the first one moved past the second.
    let mut c = b.clone();
    let first_addr = l.callers + 4 + 4 + "worker_thread".len();
    put_u64(&mut c, first_addr, u64::MAX);
    corrupt_in(
        load_bytes("callers-order", &c),
        Section::Callers,
        "out of address order",
    );
    // Trailing bytes after the last event, with file_len updated or not.
    let mut c = b.clone();
    c.extend_from_slice(&[0; 24]);
    corrupt_in(
        load_bytes("trailing", &c),
        Section::Preamble,
        "24 trailing bytes",
    );
    let len = c.len() as u64;
    put_u64(&mut c, 12, len);
    corrupt_in(
        load_bytes("trailing-2", &c),
        Section::Events,
        "24 bytes after the last event",
    );
    // A file length shorter than the preamble.
    let mut c = b.clone();
    put_u64(&mut c, 12, 3);
    corrupt_in(
        load_bytes("file-len", &c),
        Section::Preamble,
        "shorter than the preamble",
    );
}

#[test]
fn report_tracefile_absurd_lengths_do_not_allocate() {
    let t = fixture::trace();
    let b = saved_bytes(&t);
    let l = layout(&t);
    // 2^60 events: 2^60 * 24 bytes overflows u64.
    let mut c = b.clone();
    put_u64(&mut c, l.events, 1 << 60);
    corrupt_in(
        load_bytes("events-2^60", &c),
        Section::Events,
        "absurd event count",
    );
    // 2^59 events: fits u64 but not the file.
    let mut c = b.clone();
    put_u64(&mut c, l.events, 1 << 59);
    corrupt_in(
        load_bytes("events-2^59", &c),
        Section::Events,
        "but only 360 remain",
    );
    // u32::MAX functions, callers, string bytes, counts columns.
    let mut c = b.clone();
    put_u32(&mut c, l.functions, u32::MAX);
    corrupt_in(
        load_bytes("functions", &c),
        Section::Functions,
        "4294967295 functions",
    );
    let mut c = b.clone();
    put_u32(&mut c, l.callers, u32::MAX);
    corrupt_in(
        load_bytes("callers", &c),
        Section::Callers,
        "4294967295 callers",
    );
    let mut c = b.clone();
    put_u32(&mut c, l.header, u32::MAX);
    corrupt_in(
        load_bytes("kernel-len", &c),
        Section::Header,
        "kernel would take 4294967295 bytes",
    );
    // A claimed file length of 2^63: every length "fits", the file runs out.
    let mut c = b.clone();
    put_u64(&mut c, 12, 1 << 63);
    put_u64(&mut c, l.events, 1 << 40);
    let e = load_bytes("file-len-huge", &c).unwrap_err();
    assert!(
        matches!(
            e,
            TraceFileError::Truncated {
                section: Section::Events,
                ..
            }
        ),
        "{e:?}"
    );
    // Zero functions but u32::MAX vCPUs: no counts rows to allocate.
    let mut t0 = Trace::default();
    t0.meta.cpus = u32::MAX;
    let b0 = saved_bytes(&t0);
    assert_eq!(load_bytes("cpus-max", &b0).unwrap(), t0);
}

#[test]
fn report_tracefile_io_errors() {
    let dir = scratch("io");
    let missing = dir.join("missing.vmtrace");
    let e = load(&missing).unwrap_err();
    assert!(matches!(e, TraceFileError::Open { .. }), "{e:?}");
    assert!(e
        .to_string()
        .starts_with(&format!("cannot open trace file {}:", missing.display())));
    // Saving into a directory that does not exist.
    let e = save(&fixture::trace(), &dir.join("no/such/dir/t.vmtrace")).unwrap_err();
    assert!(matches!(e, TraceFileError::Write { .. }), "{e:?}");
    assert!(!e.to_string().contains('\n'));
    // A trace that breaks the format's rules is refused, and nothing is written.
    let mut bad = fixture::trace();
    bad.counts.pop();
    let p = dir.join("bad.vmtrace");
    let e = save(&bad, &p).unwrap_err();
    assert!(matches!(e, TraceFileError::Invalid { .. }), "{e:?}");
    assert!(
        e.to_string().contains("6 rows of counts for 7 functions"),
        "{e}"
    );
    let mut bad = fixture::trace();
    bad.events[2].func = 7;
    assert!(matches!(
        save(&bad, &p),
        Err(TraceFileError::Invalid { .. })
    ));
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 0);
    fs::remove_dir_all(&dir).unwrap();
}

/// 10 M events must save + load in well under 2 s in release builds:
/// `cargo test --release -p tracer --test report_tracefile -- --ignored --nocapture`.
#[test]
#[ignore = "timing; run in release"]
fn report_tracefile_10m_events_speed() {
    let t = fixture::big_trace(10_000_000);
    let dir = scratch("speed");
    let p = dir.join("big.vmtrace");
    let start = Instant::now();
    save(&t, &p).unwrap();
    let saved = start.elapsed();
    let back = load(&p).unwrap();
    let total = start.elapsed();
    println!(
        "10M events ({} MB): save {saved:?}, load {:?}, total {total:?}",
        fs::metadata(&p).unwrap().len() >> 20,
        total - saved
    );
    assert!(back == t);
    fs::remove_dir_all(&dir).unwrap();
    assert!(total.as_secs_f64() < 2.0, "{total:?}");
}
