//! Saved traces (`-o FILE`, `vmtrace report -i FILE`): round trips and every
//! kind of bad file, on synthetic traces (no KVM needed).

#[path = "report_fixture.rs"]
mod fixture;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use tracer::trace::datafile::{
    load, save, Section, TraceFileError, DATA_VERSION, EVENT_SIZE, EVENT_SIZE_V2, MAGIC, VERSION,
};
use tracer::trace::model::Trace;
use tracer::trace::report::{render, render_tree, ReportOptions, Sort, TreeOptions};

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
    /// Offset of the `stop_reason` length.
    stop_reason: usize,
    /// Offsets of the `mode` length and of `trap_exits` (version 2; in
    /// version 1, where the functions start).
    mode: usize,
    trap_exits: usize,
    functions: usize,
    counts: usize,
    /// The returns section (version 3; where the callers start before).
    returns: usize,
    callers: usize,
    events: usize,
    /// Offset of the first event record.
    records: usize,
    /// Size of one event record, and the offset of `func` in it.
    event: usize,
    func: usize,
    end: usize,
}

fn str_len(s: &str) -> usize {
    4 + s.len()
}

fn layout_v(t: &Trace, version: u32) -> Layout {
    let syms = |v: &[tracer::kernel::symbols::Symbol]| {
        4 + v.iter().map(|s| str_len(&s.name) + 16).sum::<usize>()
    };
    let m = &t.meta;
    let header = 20;
    let stop_reason =
        header + str_len(&m.kernel) + 1 + m.build_id.as_deref().map_or(0, str_len) + 4 + 10 * 8;
    let mode = stop_reason + str_len(&m.stop_reason);
    let (trap_exits, functions) = match version {
        1 => (mode, mode),
        2 => (mode + str_len(&m.mode), mode + str_len(&m.mode) + 8),
        // graph (1 byte), returns_dropped, unhooked, tsc_khz.
        3 => (
            mode + str_len(&m.mode),
            mode + str_len(&m.mode) + 8 + 1 + 24,
        ),
        // and symbols.
        4 => (
            mode + str_len(&m.mode),
            mode + str_len(&m.mode) + 8 + 1 + 24 + str_len(&m.symbols),
        ),
        v => panic!("no layout for version {v}"),
    };
    let counts = functions + syms(&t.functions);
    let returns = counts + 8 + t.functions.len() * m.cpus as usize * 8;
    let callers = if version >= 3 {
        returns + 8 + t.returns.iter().map(Vec::len).sum::<usize>() * 8
    } else {
        returns
    };
    let events = callers + syms(&t.callers);
    let records = events + 8;
    let (event, func) = if version >= 3 {
        (EVENT_SIZE, 24)
    } else {
        (EVENT_SIZE_V2, 16)
    };
    Layout {
        header,
        stop_reason,
        mode,
        trap_exits,
        functions,
        counts,
        returns,
        callers,
        events,
        records,
        event,
        func,
        end: records + t.events.len() * event,
    }
}

/// The layout of the current format, version 4.
fn layout(t: &Trace) -> Layout {
    layout_v(t, VERSION)
}

/// `t` encoded byte by byte as documented in tracefile/mod.rs, independently
/// of `save`: version 4, 3 (no `symbols`), 2 (nor graph fields, returns or
/// event slots), or 1 (nor `mode` and `trap_exits`).
fn encode(t: &Trace, version: u32) -> Vec<u8> {
    fn put_str(b: &mut Vec<u8>, s: &str) {
        b.extend_from_slice(&(s.len() as u32).to_le_bytes());
        b.extend_from_slice(s.as_bytes());
    }
    fn put_syms(b: &mut Vec<u8>, v: &[tracer::kernel::symbols::Symbol]) {
        b.extend_from_slice(&(v.len() as u32).to_le_bytes());
        for s in v {
            put_str(b, &s.name);
            b.extend_from_slice(&s.addr.to_le_bytes());
            b.extend_from_slice(&s.size.to_le_bytes());
        }
    }
    let m = &t.meta;
    let mut b = Vec::new();
    b.extend_from_slice(b"VMTRACE\0");
    b.extend_from_slice(&version.to_le_bytes());
    b.extend_from_slice(&[0; 8]); // file_len, set below
    put_str(&mut b, &m.kernel);
    match &m.build_id {
        Some(id) => {
            b.push(1);
            put_str(&mut b, id);
        }
        None => b.push(0),
    }
    b.extend_from_slice(&m.cpus.to_le_bytes());
    for v in [
        m.attach_ns,
        m.detach_ns,
        m.sites_patched,
        m.sites_skipped_init,
        m.sites_skipped_other,
        m.attach_window_ns,
        m.attach_latency_ns,
        m.events_total,
        m.events_dropped,
        m.parent_unreadable,
    ] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    put_str(&mut b, &m.stop_reason);
    if version >= 2 {
        put_str(&mut b, &m.mode);
        b.extend_from_slice(&m.trap_exits.to_le_bytes());
    }
    if version >= 3 {
        b.push(u8::from(m.graph));
        for v in [m.returns_dropped, m.unhooked, m.tsc_khz] {
            b.extend_from_slice(&v.to_le_bytes());
        }
    }
    if version >= 4 {
        put_str(&mut b, &m.symbols);
    }
    put_syms(&mut b, &t.functions);
    b.extend_from_slice(&(t.counts.len() as u32).to_le_bytes());
    b.extend_from_slice(&m.cpus.to_le_bytes());
    for c in t.counts.iter().flatten() {
        b.extend_from_slice(&c.to_le_bytes());
    }
    if version >= 3 {
        let cols = if m.graph { m.cpus } else { 0 };
        b.extend_from_slice(&(t.returns.len() as u32).to_le_bytes());
        b.extend_from_slice(&cols.to_le_bytes());
        for c in t.returns.iter().flatten() {
            b.extend_from_slice(&c.to_le_bytes());
        }
    }
    put_syms(&mut b, &t.callers);
    b.extend_from_slice(&(t.events.len() as u64).to_le_bytes());
    for e in &t.events {
        b.extend_from_slice(&e.ts_ns.to_le_bytes());
        b.extend_from_slice(&e.parent.to_le_bytes());
        if version >= 3 {
            b.extend_from_slice(&e.slot.to_le_bytes());
        }
        b.extend_from_slice(&e.func.to_le_bytes());
        b.extend_from_slice(&e.cpu.to_le_bytes());
    }
    let len = b.len() as u64;
    put_u64(&mut b, 12, len);
    assert_eq!(b.len(), layout_v(t, version).end);
    b
}

/// What a version-1 file of `t` loads as: trap mode, every call an exit.
fn as_version_1(t: &Trace) -> Trace {
    let mut want = t.clone();
    want.meta.mode = "trap".into();
    want.meta.trap_exits = t.meta.events_total;
    want
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// `fixture::big_trace(n)` made consistent, as a loaded trace must be: the
/// counts are those of the events, plus the dropped ones (on function 0, vCPU 0).
fn big(n: usize) -> Trace {
    let mut t = fixture::big_trace(n);
    for row in &mut t.counts {
        row.iter_mut().for_each(|c| *c = 0);
    }
    for e in &t.events {
        t.counts[e.func as usize][e.cpu as usize] += 1;
    }
    t.counts[0][0] += t.meta.events_dropped;
    t.meta.events_total = n as u64 + t.meta.events_dropped;
    t.meta.parent_unreadable = t.meta.parent_unreadable.min(t.meta.events_total);
    t
}

/// The fixture in exitless mode: no exits at the trace port.
fn exitless() -> Trace {
    let mut t = fixture::trace();
    t.meta.mode = "exitless".into();
    t.meta.trap_exits = 0;
    t
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

/// Every render of `back` matches that of `want`.
fn folded(t: &Trace) -> Vec<u8> {
    let mut v = Vec::new();
    tracer::trace::export::write_folded(t, &mut v).unwrap();
    v
}

fn assert_same_reports(back: &Trace, want: &Trace, name: &str) {
    for sort in [Sort::Count, Sort::Name, Sort::Cpu] {
        for callers in [false, true] {
            let o = ReportOptions {
                sort,
                callers,
                cpus: callers.then(|| vec![0, 2]),
                ..Default::default()
            };
            assert_eq!(render(back, &o), render(want, &o), "{name}");
        }
    }
}

#[test]
fn report_tracefile_round_trip() {
    let dir = scratch("round-trip");
    for (name, t) in [
        ("fixture", fixture::trace()),
        ("empty", Trace::default()),
        ("big", big(200_000)),
        ("no-build-id", {
            let mut t = fixture::trace();
            t.meta.build_id = None;
            t.meta.kernel = "/tmp/ünïcode kernel".into();
            t
        }),
        ("exitless", exitless()),
        ("big-exitless", {
            let mut t = big(100_000);
            t.meta.mode = "exitless".into();
            t.meta.trap_exits = 0;
            t
        }),
        // Returns, slots, unhooked and unmatched ones, a migrated return.
        ("graph", fixture::graph_trace()),
    ] {
        let p = dir.join(format!("{name}.vmtrace"));
        save(&t, &p).unwrap();
        let back = load(&p).unwrap();
        assert!(back == t, "{name}: round trip differs");
        assert_eq!(back.meta.mode, t.meta.mode, "{name}");
        assert_eq!(back.meta.trap_exits, t.meta.trap_exits, "{name}");
        assert_same_reports(&back, &t, name);
        assert_eq!(
            fs::metadata(&p).unwrap().len() as usize,
            layout(&t).end,
            "{name}"
        );
    }
    // The function graph and its views survive the round trip.
    let graph = load(&dir.join("graph.vmtrace")).unwrap();
    let want = fixture::graph_trace();
    assert!(graph.meta.graph && graph.meta.unhooked == 1 && graph.meta.tsc_khz == 2_000_000);
    assert_eq!(graph.returns, want.returns);
    let tree = TreeOptions::default();
    assert_eq!(render_tree(&graph, &tree), render_tree(&want, &tree));
    assert_eq!(folded(&graph), folded(&want));
    assert!(!folded(&graph).is_empty());
    // The mode round-trips as saved, whichever it is.
    let trap = load(&dir.join("fixture.vmtrace")).unwrap();
    assert_eq!(trap.meta.mode, "trap");
    assert_eq!(trap.meta.trap_exits, trap.meta.events_total);
    let exitless = load(&dir.join("exitless.vmtrace")).unwrap();
    assert_eq!(exitless.meta.mode, "exitless");
    assert_eq!(exitless.meta.trap_exits, 0);
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
            "big-exitless.vmtrace",
            "big.vmtrace",
            "empty.vmtrace",
            "exitless.vmtrace",
            "fixture.vmtrace",
            "graph.vmtrace",
            "no-build-id.vmtrace"
        ]
    );
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn report_tracefile_layout_matches_the_documented_format() {
    for t in [fixture::trace(), exitless()] {
        let b = saved_bytes(&t);
        let l = layout(&t);
        let m = &t.meta;
        assert_eq!(b.len(), l.end);
        // Byte for byte what the documented format says.
        assert!(
            b == encode(&t, VERSION),
            "{}: differs from the format",
            m.mode
        );
        assert_eq!(&b[..8], MAGIC);
        assert_eq!(&b[..8], b"VMTRACE\0");
        assert_eq!(u32_at(&b, 8), 4);
        assert_eq!(u32_at(&b, 8), VERSION);
        assert_eq!(u64_at(&b, 12), b.len() as u64);
        let kernel_len = u32_at(&b, 20) as usize;
        assert_eq!(&b[24..24 + kernel_len], m.kernel.as_bytes());
        // The ten u64 fields, right before the stop reason.
        assert_eq!(u64_at(&b, l.stop_reason - 80), m.attach_ns);
        assert_eq!(u64_at(&b, l.stop_reason - 24), m.events_total);
        assert_eq!(u64_at(&b, l.stop_reason - 8), m.parent_unreadable);
        // stop_reason, then mode and trap_exits, then the functions.
        let n = u32_at(&b, l.stop_reason) as usize;
        assert_eq!(
            &b[l.stop_reason + 4..l.stop_reason + 4 + n],
            m.stop_reason.as_bytes()
        );
        assert_eq!(l.mode, l.stop_reason + 4 + n);
        let n = u32_at(&b, l.mode) as usize;
        assert_eq!(n, m.mode.len());
        assert_eq!(&b[l.mode + 4..l.mode + 4 + n], m.mode.as_bytes());
        assert_eq!(l.trap_exits, l.mode + 4 + n);
        assert_eq!(u64_at(&b, l.trap_exits), m.trap_exits);
        // graph, returns_dropped, unhooked, tsc_khz and symbols, then the
        // functions.
        assert_eq!(b[l.trap_exits + 8], u8::from(m.graph));
        let symbols = l.trap_exits + 8 + 1 + 24;
        let n = u32_at(&b, symbols) as usize;
        assert_eq!(&b[symbols + 4..symbols + 4 + n], m.symbols.as_bytes());
        assert_eq!(l.functions, symbols + 4 + n);
        assert_eq!(u32_at(&b, l.functions), 7);
        assert_eq!(u32_at(&b, l.counts), 7);
        assert_eq!(u32_at(&b, l.counts + 4), 4);
        // counts[0][1] (row-major, after rows and cols).
        assert_eq!(u64_at(&b, l.counts + 16), 998);
        // No function graph: an empty returns section.
        assert_eq!(u64_at(&b, l.returns), 0);
        assert_eq!(l.callers, l.returns + 8);
        assert_eq!(u32_at(&b, l.callers), 2);
        assert_eq!(u64_at(&b, l.events), t.events.len() as u64);
        let e = &b[l.records..l.records + EVENT_SIZE];
        assert_eq!(u64_at(e, 0), t.events[0].ts_ns);
        assert_eq!(u64_at(e, 8), t.events[0].parent);
        assert_eq!(u64_at(e, 16), t.events[0].slot);
        assert_eq!(u32_at(e, 24), t.events[0].func);
        assert_eq!(u32_at(e, 28), t.events[0].cpu);
    }
    // The exact bytes of the fixture's mode fields.
    let t = fixture::trace();
    let b = saved_bytes(&t);
    let l = layout(&t);
    assert_eq!(&b[l.mode..l.trap_exits], b"\x04\0\0\0trap");
    assert_eq!(
        &b[l.trap_exits..l.trap_exits + 8],
        &t.meta.events_total.to_le_bytes()
    );
    let t = exitless();
    let b = saved_bytes(&t);
    let l = layout(&t);
    assert_eq!(
        &b[l.mode..l.trap_exits + 8],
        b"\x08\0\0\0exitless\0\0\0\0\0\0\0\0"
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
    let t = fixture::trace();
    let mut b = saved_bytes(&t);
    for v in [0, DATA_VERSION + 1, u32::MAX] {
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
        assert!(
            msg.contains(&format!("reads versions 1 to {DATA_VERSION}")),
            "{msg}"
        );
    }
    // Versions 4, 3, 2 and 1 are read.
    put_u32(&mut b, 8, 4);
    assert_eq!(load_bytes("version-4", &b).unwrap(), t);
    assert_eq!(load_bytes("version-3", &encode(&t, 3)).unwrap(), t);
    let mut b = encode(&t, 2);
    assert_eq!(load_bytes("version-2", &b).unwrap(), t);
    let b1 = encode(&t, 1);
    assert_eq!(u32_at(&b1, 8), 1);
    assert_eq!(load_bytes("version-1", &b1).unwrap(), as_version_1(&t));
    // A version-2 file claiming version 1 is read as version 1: its mode
    // field is taken for the functions, and the file is corrupt.
    put_u32(&mut b, 8, 1);
    let e = load_bytes("version-2-as-1", &b).unwrap_err();
    assert!(matches!(e, TraceFileError::Corrupt { .. }), "{e:?}");
}

/// Every cut of `b` (the bytes of a file laid out as `l`), from the empty file
/// to one byte short, is truncation in the section the cut falls in.
fn check_every_cut(name: &str, b: &[u8], l: &Layout) {
    let section_at = |len: usize| {
        if len < l.header {
            Section::Preamble
        } else if len < l.functions {
            Section::Header
        } else if len < l.counts {
            Section::Functions
        } else if len < l.returns {
            Section::Counts
        } else if len < l.callers {
            Section::Returns
        } else if len < l.events {
            Section::Callers
        } else {
            Section::Events
        }
    };
    let mut seen = Vec::new();
    for len in 0..b.len() {
        match load_bytes(name, &b[..len]) {
            Err(TraceFileError::Truncated { section, .. }) => {
                assert_eq!(section, section_at(len), "{name}: cut at {len}");
                if !seen.contains(&section) {
                    seen.push(section);
                }
            }
            other => panic!("{name}: cut at {len} of {}: {other:?}", b.len()),
        }
    }
    let mut want = vec![
        Section::Preamble,
        Section::Header,
        Section::Functions,
        Section::Counts,
        Section::Returns,
        Section::Callers,
        Section::Events,
    ];
    // Before version 3 there is no returns section.
    if l.returns == l.callers {
        want.retain(|&s| s != Section::Returns);
    }
    assert_eq!(seen, want, "{name}");
}

#[test]
fn report_tracefile_truncated_in_every_section() {
    for t in [fixture::trace(), exitless()] {
        let b = saved_bytes(&t);
        let l = layout(&t);
        check_every_cut(&format!("truncated-{}", t.meta.mode), &b, &l);
        // Cuts inside the new header fields: the mode's length, its bytes,
        // trap_exits, and right before the functions.
        for len in [
            l.mode,
            l.mode + 2,
            l.mode + 4,
            l.mode + 5,
            l.trap_exits,
            l.trap_exits + 7,
        ] {
            let e = load_bytes("truncated-mode", &b[..len]).unwrap_err();
            assert!(
                matches!(
                    e,
                    TraceFileError::Truncated {
                        section: Section::Header,
                        ..
                    }
                ),
                "cut at {len}: {e:?}"
            );
        }
        let e = load_bytes("truncated-functions", &b[..l.functions]).unwrap_err();
        assert!(
            matches!(
                e,
                TraceFileError::Truncated {
                    section: Section::Functions,
                    ..
                }
            ),
            "{e:?}"
        );
        let e = load_bytes("truncated-msg", &b[..l.records + 5]).unwrap_err();
        assert!(
            e.to_string()
                .contains("truncated trace file (ends inside the events section)"),
            "{e}"
        );
        let e = load_bytes("truncated-msg-header", &b[..l.trap_exits + 3]).unwrap_err();
        assert!(
            e.to_string()
                .contains("truncated trace file (ends inside the header section)"),
            "{e}"
        );
    }
}

#[test]
fn report_tracefile_corrupt_contents() {
    let t = fixture::trace();
    let b = saved_bytes(&t);
    let l = layout(&t);

    // An event's function index out of range.
    let mut c = b.clone();
    put_u32(&mut c, l.records + 3 * l.event + l.func, 99);
    corrupt_in(
        load_bytes("func", &c),
        Section::Events,
        "event 3 has function index 99",
    );
    // An event's vCPU out of range.
    let mut c = b.clone();
    put_u32(&mut c, l.records + l.func + 4, 4);
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
    // Invalid UTF-8 in the kernel name, the stop reason and the mode.
    let mut c = b.clone();
    c[l.header + 4] = 0xff;
    corrupt_in(load_bytes("utf8", &c), Section::Header, "not valid UTF-8");
    let mut c = b.clone();
    c[l.stop_reason + 4] = 0xff;
    corrupt_in(
        load_bytes("utf8-stop", &c),
        Section::Header,
        "stop reason is not valid UTF-8",
    );
    let mut c = b.clone();
    c[l.mode + 4 + 3] = 0xc3; // "tra\xc3": a truncated two-byte sequence
    corrupt_in(
        load_bytes("utf8-mode", &c),
        Section::Header,
        "mode is not valid UTF-8",
    );
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
        "bytes are left in the file",
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
    // 2^60 events: 2^60 * 32 bytes overflows u64.
    let mut c = b.clone();
    put_u64(&mut c, l.events, 1 << 60);
    corrupt_in(
        load_bytes("events-2^60", &c),
        Section::Events,
        "absurd event count",
    );
    // 2^58 events: fits u64 but not the file.
    let mut c = b.clone();
    put_u64(&mut c, l.events, 1 << 58);
    corrupt_in(
        load_bytes("events-2^58", &c),
        Section::Events,
        "but only 480 remain",
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
    let mut c = b.clone();
    put_u32(&mut c, l.stop_reason, u32::MAX);
    corrupt_in(
        load_bytes("stop-len", &c),
        Section::Header,
        "stop reason would take 4294967295 bytes",
    );
    let mut c = b.clone();
    put_u32(&mut c, l.mode, u32::MAX);
    corrupt_in(
        load_bytes("mode-len", &c),
        Section::Header,
        "mode would take 4294967295 bytes",
    );
    // The mode's length one byte more than what file_len leaves after it.
    let mut c = b.clone();
    let left = (l.end - l.mode - 4) as u32;
    put_u32(&mut c, l.mode, left + 1);
    corrupt_in(
        load_bytes("mode-len-2", &c),
        Section::Header,
        &format!("mode would take {} bytes but only {left} remain", left + 1),
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
    // Likewise for the mode's length: truncation in the header.
    let mut c = b.clone();
    put_u64(&mut c, 12, 1 << 63);
    put_u32(&mut c, l.mode, u32::MAX);
    let e = load_bytes("file-len-huge-mode", &c).unwrap_err();
    assert!(
        matches!(
            e,
            TraceFileError::Truncated {
                section: Section::Header,
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
fn report_tracefile_reads_version_1() {
    for (name, t) in [
        ("fixture", fixture::trace()),
        ("empty", Trace::default()),
        ("big", big(100_000)),
        // Whatever the trace says, a version-1 file has no mode: it is trap.
        ("was-exitless", exitless()),
        ("no-build-id", {
            let mut t = fixture::trace();
            t.meta.build_id = None;
            t.meta.trap_exits = 5;
            t
        }),
    ] {
        let b = encode(&t, 1);
        let l = layout_v(&t, 1);
        assert_eq!(b.len(), l.end, "{name}");
        assert_eq!(b.len() + 4 + t.meta.mode.len() + 8, layout_v(&t, 2).end);
        assert_eq!(u32_at(&b, 8), 1);
        assert_eq!(u64_at(&b, 12), b.len() as u64);
        // The functions follow the stop reason directly.
        assert_eq!(l.functions, l.stop_reason + str_len(&t.meta.stop_reason));
        assert_eq!(u32_at(&b, l.functions), t.functions.len() as u32);
        let back = load_bytes(&format!("v1-{name}"), &b).unwrap();
        assert_eq!(back.meta.mode, "trap", "{name}");
        assert_eq!(back.meta.trap_exits, back.meta.events_total, "{name}");
        assert_eq!(back.meta.events_total, t.meta.events_total, "{name}");
        let want = as_version_1(&t);
        assert!(back == want, "{name}: version 1 read differs");
        assert_same_reports(&back, &want, name);
        // Saved again, it is a current-version file that round-trips.
        let b2 = saved_bytes(&back);
        assert_eq!(u32_at(&b2, 8), VERSION);
        assert!(b2 == encode(&want, VERSION), "{name}: resaved differs");
        assert_eq!(
            load_bytes(&format!("v1-resaved-{name}"), &b2).unwrap(),
            want
        );
    }
    // trap_exits comes from events_total, not from the stored events.
    let t = fixture::trace();
    let back = load_bytes("v1-total", &encode(&t, 1)).unwrap();
    assert_ne!(t.meta.events_total, t.events.len() as u64);
    assert_eq!(back.meta.trap_exits, t.meta.events_total);

    // Version 1 files are checked as strictly: truncation in every section,
    // corrupt contents at their version-1 offsets.
    let b = encode(&t, 1);
    let l = layout_v(&t, 1);
    check_every_cut("v1-truncated", &b, &l);
    let mut c = b.clone();
    put_u32(&mut c, l.records + 3 * l.event + l.func, 99);
    corrupt_in(
        load_bytes("v1-func", &c),
        Section::Events,
        "event 3 has function index 99",
    );
    let mut c = b.clone();
    put_u32(&mut c, l.counts + 4, 3);
    corrupt_in(
        load_bytes("v1-cols", &c),
        Section::Counts,
        "counts are 7 x 3",
    );
    let mut c = b.clone();
    put_u32(&mut c, l.functions, u32::MAX);
    corrupt_in(
        load_bytes("v1-functions", &c),
        Section::Functions,
        "4294967295 functions",
    );
    let mut c = b.clone();
    put_u64(&mut c, l.events, 1 << 59);
    corrupt_in(
        load_bytes("v1-events", &c),
        Section::Events,
        "but only 360 remain",
    );
    let mut c = b.clone();
    c.extend_from_slice(&[0; 24]);
    corrupt_in(
        load_bytes("v1-trailing", &c),
        Section::Preamble,
        "24 trailing bytes",
    );
    let len = c.len() as u64;
    put_u64(&mut c, 12, len);
    corrupt_in(
        load_bytes("v1-trailing-2", &c),
        Section::Events,
        "bytes are left in the file",
    );
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
    let t = big(10_000_000);
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

/// Numbers that cannot be true are refused on load (before, each was
/// reported as if true: a 409654543053731968.00% share, stored > total, ...).
#[test]
fn report_tracefile_impossible_numbers_are_refused() {
    let t = fixture::trace();
    let b = encode(&t, VERSION);
    let l = layout(&t);
    let at = |i: usize| l.stop_reason - 10 * 8 + i * 8;
    let m = &t.meta;
    assert!(m.events_dropped < m.events_total && !t.events.is_empty());

    // detach before attach.
    let mut x = b.clone();
    put_u64(&mut x, at(1), m.attach_ns - 1);
    corrupt_in(load_bytes("detach", &x), Section::Header, "before attach");
    // more dropped than in all.
    let mut x = b.clone();
    put_u64(&mut x, at(8), m.events_total + 1);
    corrupt_in(load_bytes("dropped", &x), Section::Header, "dropped of");
    // unreadable callers beyond the total.
    let mut x = b.clone();
    put_u64(&mut x, at(9), m.events_total + 1);
    corrupt_in(load_bytes("unreadable", &x), Section::Header, "unreadable");
    // a total that the counts do not add up to (stored > total as well).
    let mut x = b.clone();
    put_u64(&mut x, at(7), m.events_dropped);
    corrupt_in(load_bytes("total", &x), Section::Counts, "add up to");
    // counts that overflow when added up.
    let mut x = b.clone();
    put_u64(&mut x, l.counts + 8, u64::MAX);
    corrupt_in(load_bytes("overflow", &x), Section::Counts, "past 2^64");
    // counts moved between vCPUs: totals still agree, per-vCPU sums do not.
    let mut t2 = t.clone();
    let row = t2
        .counts
        .iter()
        .position(|r| r.iter().filter(|&&c| c > 0).count() >= 1)
        .unwrap();
    t2.meta.events_dropped = 0;
    t2.meta.events_total = t2.events.len() as u64;
    // A consistent trace with nothing dropped: counts from the events.
    for r in &mut t2.counts {
        r.iter_mut().for_each(|c| *c = 0);
    }
    for e in &t2.events {
        t2.counts[e.func as usize][e.cpu as usize] += 1;
    }
    let ok = encode(&t2, VERSION);
    load_bytes("consistent", &ok).unwrap();
    let l2 = layout(&t2);
    let mut x = ok.clone();
    let (f, c) = t2
        .counts
        .iter()
        .enumerate()
        .find_map(|(f, r)| r.iter().position(|&c| c > 0).map(|c| (f, c)))
        .unwrap();
    let cols = t2.meta.cpus as usize;
    let other = (c + 1) % cols;
    let off = |f: usize, c: usize| l2.counts + 8 + (f * cols + c) * 8;
    put_u64(&mut x, off(f, c), t2.counts[f][c] - 1);
    put_u64(&mut x, off(f, other), t2.counts[f][other] + 1);
    corrupt_in(load_bytes("per-cpu", &x), Section::Events, "stored on vCPU");
    let _ = row;
    // stored + dropped != total.
    let mut x = b.clone();
    put_u64(&mut x, at(8), m.events_dropped - 1);
    put_u64(&mut x, at(7), m.events_total - 1);
    put_u64(&mut x, l.counts + 8, u64_at(&b, l.counts + 8));
    let r = load_bytes("stored", &x);
    assert!(r.is_err(), "{r:?}");
}

/// The event count must say exactly the bytes left: a file claiming more
/// events than it holds, or one padded far beyond its events (a sparse
/// 10 GiB file claiming 7,000 events), is refused at once, allocating nothing.
#[test]
fn report_tracefile_event_count_against_the_file_size() {
    let t = fixture::trace();
    let b = encode(&t, VERSION);
    let l = layout(&t);
    let n = t.events.len() as u64;
    let mut x = b.clone();
    put_u64(&mut x, l.events, n + 1);
    corrupt_in(
        load_bytes("more", &x),
        Section::Events,
        "but only 480 remain",
    );
    let mut x = b.clone();
    put_u64(&mut x, l.events, u64::MAX / 32);
    corrupt_in(
        load_bytes("huge", &x),
        Section::Events,
        "but only 480 remain",
    );
    let mut x = b.clone();
    put_u64(&mut x, l.events, n - 1);
    corrupt_in(load_bytes("fewer", &x), Section::Events, "bytes are left");

    // Sparse: the preamble's length and the file's both 10 GiB.
    let dir = scratch("sparse");
    let p = dir.join("t.vmtrace");
    let big: u64 = 10 << 30;
    let mut x = b.clone();
    put_u64(&mut x, 12, big);
    put_u64(&mut x, l.events, 7000);
    fs::write(&p, &x).unwrap();
    fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(big)
        .unwrap();
    // Refused from what the file says, not by reading its 10 GiB: a count
    // of the bytes this thread read, not a time (CI hosts are noisy).
    let before = thread_read_bytes();
    let r = load(&p);
    let read = thread_read_bytes() - before;
    assert!(read < 16 << 20, "{read} bytes read: {r:?}");
    match r {
        Err(TraceFileError::Corrupt {
            section, detail, ..
        }) => {
            assert_eq!(section, Section::Events);
            assert!(detail.contains("7000 events"), "{detail}");
        }
        other => panic!("{other:?}"),
    }
    fs::remove_dir_all(&dir).unwrap();
}

/// A FIFO, a directory or a device is refused at once (a FIFO blocked forever).
#[test]
fn report_tracefile_non_regular_files_are_refused() {
    let dir = scratch("fifo");
    let fifo = dir.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a NUL-terminated path that outlives the call; mkfifo
    // only reads it.
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(rc, 0, "mkfifo {}", std::io::Error::last_os_error());
    for (p, kind) in [
        (fifo.as_path(), "FIFO"),
        (dir.as_path(), "directory"),
        (Path::new("/dev/zero"), "character device"),
    ] {
        // Refused without opening it for reading (a FIFO would block that
        // open forever, a device be read without end): on a thread, so that
        // such a bug fails here rather than hanging the run. The bound is a
        // guard against a hang, not a measured time.
        let path = p.to_path_buf();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(load(&path));
        });
        let e = rx
            .recv_timeout(std::time::Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("loading the {kind} did not return"))
            .unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains(kind) && msg.contains("not a regular file"),
            "{msg}"
        );
        assert!(!msg.contains('\n'));
    }
    fs::remove_dir_all(&dir).unwrap();
}

/// Version 4 keeps where the symbols came from; a version-3 file (the same
/// without it) still loads, with the source unknown.
#[test]
fn symbol_source_is_saved_and_version_3_still_loads() {
    let mut t = Trace::synthetic(100);
    t.meta.symbols = "kallsyms in the lz4 payload of /k/bzImage (no vmlinux found)".into();
    let dir = scratch("symbols-v4");
    let p = dir.join("t.vmtrace");
    save(&t, &p).unwrap();
    let b = fs::read(&p).unwrap();
    assert_eq!(u32_at(&b, 8), VERSION);
    assert!(b == encode(&t, VERSION), "differs from the format");
    assert_eq!(load(&p).unwrap(), t);
    fs::remove_dir_all(&dir).unwrap();
    let v3 = load_bytes("symbols-v3", &encode(&t, 3)).unwrap();
    let mut want = t.clone();
    want.meta.symbols = String::new();
    assert_eq!(v3, want);
}

/// Bytes this thread has read through read(2) and the like so far
/// (`rchar` of /proc/thread-self/io).
fn thread_read_bytes() -> u64 {
    let io = fs::read_to_string("/proc/thread-self/io").expect("/proc/thread-self/io");
    io.lines()
        .find_map(|l| l.strip_prefix("rchar: "))
        .and_then(|v| v.trim().parse().ok())
        .expect("an rchar line")
}
