//! Fuzz-style property tests (proptest, stable Rust): thousands of mutated
//! inputs per run for the trace-file loader and the ELF/vmlinux loader with
//! the site-table builder. Each must end in `Ok` or an error, never a panic
//! or a hang, and never grow the process beyond `RSS_LIMIT`. What loads is
//! then put through every reader a command has: the text report and call
//! tree (`report`), `script`, every `--export` format (the trace.dat writer
//! included) and `list`. Those run from a fixed seed (`deterministic`), so
//! a failure is found again by the next run. (`tests/fuzz_cli.rs` does the
//! same through the binary, for exit statuses and one-line errors.)

#[path = "report_fixture.rs"]
mod fixture;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRng, TestRunner};

use tracer::kernel::sites::SiteTable;
use tracer::kernel::symbols::KernelImage;
use tracer::trace::datafile::{load, save, DataFile};

/// Far above what loading these small files needs; far below what a length
/// field trusted blindly would allocate (GiBs).
const RSS_LIMIT: u64 = 512 << 20;
/// Cases per property (CI runs them all in well under a minute).
const CASES: u32 = 3000;

fn config() -> Config {
    Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    }
}

/// The process's resident set size, bytes.
fn rss() -> u64 {
    let status = fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .map_or(0, |kb| kb.trim().parse::<u64>().unwrap() * 1024)
}

fn scratch(name: &str) -> PathBuf {
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("fuzz-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// A mutation of a valid file.
#[derive(Debug, Clone)]
enum Mutation {
    /// Flip bit `bit` of byte `at` (modulo the length).
    Flip { at: usize, bit: u8 },
    /// Keep only the first `len` bytes (modulo the length + 1).
    Truncate { len: usize },
    /// Write a little-endian length-like value at `at`.
    Word { at: usize, value: u64, wide: bool },
    /// Append `n` bytes of `byte`.
    Append { n: usize, byte: u8 },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let values = prop_oneof![
        Just(0u64),
        Just(1),
        Just(u64::from(u32::MAX)),
        Just(u64::MAX),
        Just(1 << 31),
        Just(1 << 40),
        0u64..4096,
        any::<u64>(),
    ];
    prop_oneof![
        4 => (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        1 => any::<usize>().prop_map(|len| Mutation::Truncate { len }),
        3 => (any::<usize>(), values, any::<bool>())
            .prop_map(|(at, value, wide)| Mutation::Word { at, value, wide }),
        1 => (0usize..64, any::<u8>()).prop_map(|(n, byte)| Mutation::Append { n, byte }),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    if bytes.is_empty() {
        return;
    }
    match *m {
        Mutation::Flip { at, bit } => {
            let i = at % bytes.len();
            bytes[i] ^= 1 << bit;
        }
        Mutation::Truncate { len } => bytes.truncate(len % (bytes.len() + 1)),
        Mutation::Word { at, value, wide } => {
            let w = if wide { 8 } else { 4 };
            if bytes.len() >= w {
                let i = at % (bytes.len() - w + 1);
                bytes[i..i + w].copy_from_slice(&value.to_le_bytes()[..w]);
            }
        }
        Mutation::Append { n, byte } => bytes.extend(std::iter::repeat_n(byte, n)),
    }
}

/// The fixture trace as saved.
fn saved_trace() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| {
        let dir = scratch("seed");
        let p = dir.join("t.vmtrace");
        save(&fixture::trace(), &p).unwrap();
        let b = fs::read(&p).unwrap();
        fs::remove_dir_all(&dir).unwrap();
        b
    })
}

/// The fixture trace as a data file (format 5) that `record` streams:
/// HEAD, events in batches of 3 per vCPU, FOOT, END.
fn data_file() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| {
        let dir = scratch("seed5");
        let p = dir.join("t.data");
        let t = fixture::trace();
        let mut f = DataFile::create(&p).unwrap();
        let mut head = t.clone();
        head.events.clear();
        f.head(&head).unwrap();
        for cpu in 0..t.meta.cpus {
            let mine: Vec<_> = t.events.iter().filter(|e| e.cpu == cpu).copied().collect();
            for b in mine.chunks(3) {
                f.write_events(b).unwrap();
            }
        }
        f.finish(&t).unwrap();
        drop(f);
        let b = fs::read(&p).unwrap();
        // It reads back as the trace (events sorted by time again).
        let back = load(&p).unwrap();
        assert_eq!(back.counts, t.counts);
        assert_eq!(back.events.len(), t.events.len());
        fs::remove_dir_all(&dir).unwrap();
        b
    })
}

/// guest/out/mini.elf, (re)built once per test process.
fn mini_elf() -> &'static [u8] {
    static ELF: OnceLock<Vec<u8>> = OnceLock::new();
    ELF.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let st = Command::new("bash")
            .args(["guest/build.sh", "mini"])
            .current_dir(&root)
            .status()
            .expect("run bash guest/build.sh mini");
        assert!(st.success(), "`bash guest/build.sh mini` failed");
        fs::read(root.join("guest/out/mini.elf")).unwrap()
    })
}

#[test]
fn fuzz_trace_file_loader() {
    let seed = saved_trace();
    let dir = scratch("trace");
    let p = dir.join("t.vmtrace");
    let ok = std::cell::Cell::new(0u32);
    proptest!(config(), |(muts in prop::collection::vec(mutation(), 1..4))| {
        let mut b = seed.to_vec();
        for m in &muts {
            apply(&mut b, m);
        }
        fs::write(&p, &b).unwrap();
        match load(&p) {
            Ok(t) => {
                ok.set(ok.get() + 1);
                // What loads is consistent.
                prop_assert!(t.events.len() as u64 + t.meta.events_dropped == t.meta.events_total);
                prop_assert!(t.meta.attach_ns <= t.meta.detach_ns);
            }
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(!msg.contains('\n'), "{}", msg);
            }
        }
        prop_assert!(rss() < RSS_LIMIT, "RSS {} after {:?}", rss(), muts);
    });
    // Some mutations (e.g. of a timestamp or an address) leave a valid file.
    assert!(ok.get() > 0);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn fuzz_data_file_loader() {
    let seed = data_file();
    let dir = scratch("data");
    let p = dir.join("t.data");
    proptest!(config(), |(muts in prop::collection::vec(mutation(), 1..4))| {
        let mut b = seed.to_vec();
        for m in &muts {
            apply(&mut b, m);
        }
        fs::write(&p, &b).unwrap();
        match load(&p) {
            Ok(t) => {
                // Whole, or cut short (counts then from the events): consistent either way.
                prop_assert!(t.events.len() as u64 <= t.meta.events_total + t.returns.iter().flatten().sum::<u64>());
                prop_assert!(t.meta.attach_ns <= t.meta.detach_ns);
                let total: u64 = t.counts.iter().flatten().sum();
                prop_assert_eq!(total, t.meta.events_total);
            }
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(!msg.contains('\n'), "{}", msg);
            }
        }
        prop_assert!(rss() < RSS_LIMIT, "RSS {} after {:?}", rss(), muts);
    });
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn fuzz_elf_loader_and_site_table() {
    let seed = mini_elf();
    let dir = scratch("elf");
    let p = dir.join("kernel.elf");
    proptest!(config(), |(muts in prop::collection::vec(mutation(), 1..4))| {
        let mut b = seed.to_vec();
        for m in &muts {
            apply(&mut b, m);
        }
        fs::write(&p, &b).unwrap();
        if let Ok(image) = KernelImage::load(&p) {
            if let Ok(table) = SiteTable::build(&image) {
                prop_assert!(table.rejected <= table.entries);
                prop_assert!(table.rejected_examples.len() <= table.rejected);
                for s in &table.sites {
                    prop_assert!((s.func as usize) < image.functions.len());
                }
                let _ = table.rejected_summary();
            }
        }
        prop_assert!(rss() < RSS_LIMIT, "RSS {} after {:?}", rss(), muts);
    });
    fs::remove_dir_all(&dir).unwrap();
}

/// A runner from a fixed seed: the same cases every run.
fn deterministic(cases: u32) -> TestRunner {
    let config = Config { cases, ..config() };
    let rng = TestRng::deterministic_rng(config.rng_algorithm);
    TestRunner::new_with_rng(config, rng)
}

/// The fixture's function-graph trace as a data file, as `data_file`.
fn graph_data_file() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| {
        let dir = scratch("seedg");
        let p = dir.join("g.data");
        let t = fixture::graph_trace();
        let mut f = DataFile::create(&p).unwrap();
        let mut head = t.clone();
        head.events.clear();
        f.head(&head).unwrap();
        f.write_events(&t.events).unwrap();
        f.finish(&t).unwrap();
        drop(f);
        let b = fs::read(&p).unwrap();
        assert!(load(&p).unwrap().meta.graph);
        fs::remove_dir_all(&dir).unwrap();
        b
    })
}

/// Every view a command prints of `t`: none may panic; a writer's error
/// (there is none for a Vec) would be one line.
fn every_view(t: &tracer::trace::model::Trace) -> Result<(), TestCaseError> {
    use tracer::trace::export;
    use tracer::trace::report::{self, ReportOptions, TreeOptions};
    let _ = report::render(t, &ReportOptions::default());
    let _ = report::render(
        t,
        &ReportOptions {
            callers: true,
            cpus: Some(vec![0, 1]),
            percent_limit: Some(5.0),
            ..ReportOptions::default()
        },
    );
    if t.meta.graph {
        let _ = report::render_tree(t, &TreeOptions::default());
        let _ = report::render_tree(
            t,
            &TreeOptions {
                depth: Some(2),
                threshold_ns: 1000,
                ..TreeOptions::default()
            },
        );
    }
    let mut out: Vec<u8> = Vec::new();
    let writes: [(&str, io::Result<()>); 6] = [
        ("json", export::write_json(t, &mut out)),
        ("csv", export::write_csv(t, &mut out)),
        ("chrome", export::write_chrome(t, &mut out)),
        ("folded", export::write_folded(t, &mut out)),
        ("trace.dat", export::write_tracedat(t, &mut out)),
        ("script", export::script::write_script(t, &mut out)),
    ];
    for (what, r) in writes {
        if let Err(e) = r {
            let msg = e.to_string();
            prop_assert!(!msg.contains('\n'), "{}: {}", what, msg);
        }
    }
    Ok(())
}

/// Mutated data files (entries only, and function graph) through every
/// view of `report`, `script` and `--export`.
#[test]
fn fuzz_every_view_of_a_mutated_data_file() {
    let dir = scratch("views");
    let p = dir.join("t.data");
    let loaded = std::cell::Cell::new(0u32);
    for seed in [data_file(), graph_data_file()] {
        let mut runner = deterministic(CASES / 2);
        let r = runner.run(&prop::collection::vec(mutation(), 1..4), |muts| {
            let mut b = seed.to_vec();
            for m in &muts {
                apply(&mut b, m);
            }
            fs::write(&p, &b).unwrap();
            match load(&p) {
                Ok(t) => {
                    loaded.set(loaded.get() + 1);
                    every_view(&t)?;
                }
                Err(e) => {
                    let msg = e.to_string();
                    prop_assert!(!msg.contains('\n'), "{}", msg);
                }
            }
            prop_assert!(rss() < RSS_LIMIT, "RSS {} after {:?}", rss(), muts);
            Ok(())
        });
        if let Err(e) = r {
            panic!("{e}");
        }
    }
    // Some mutations (a block cut off, a byte outside the blocks) still
    // load: the views were exercised (most are refused by the checksums:
    // `fuzz_every_view_of_a_crafted_data_file` writes valid ones).
    assert!(loaded.get() > 50, "{} loaded", loaded.get());
    fs::remove_dir_all(&dir).unwrap();
}

/// Mutated ELF kernels through `list`'s reading (symbols, sites, the
/// listing and its summary).
#[test]
fn fuzz_list_of_a_mutated_elf() {
    use tracer::plan::list::Listing;
    let seed = mini_elf();
    let dir = scratch("list");
    let p = dir.join("kernel.elf");
    let globs = [
        vec![],
        vec!["hrtimer_*".to_string()],
        vec!["*,!do_*".to_string()],
    ];
    let mut runner = deterministic(CASES / 2);
    let r = runner.run(
        &(prop::collection::vec(mutation(), 1..4), 0usize..3),
        |(muts, g)| {
            let mut b = seed.to_vec();
            for m in &muts {
                apply(&mut b, m);
            }
            fs::write(&p, &b).unwrap();
            if let Ok(image) = KernelImage::load(&p) {
                if let Ok(sites) = SiteTable::build(&image) {
                    match Listing::new(&image, &sites, &globs[g]) {
                        Ok(l) => {
                            let mut out = Vec::new();
                            l.write(&mut out).unwrap();
                            let _ = l.summary();
                        }
                        Err(e) => {
                            let msg = e.to_string();
                            prop_assert!(!msg.contains('\n'), "{}", msg);
                        }
                    }
                }
            }
            prop_assert!(rss() < RSS_LIMIT, "RSS {} after {:?}", rss(), muts);
            Ok(())
        },
    );
    if let Err(e) = r {
        panic!("{e}");
    }
    fs::remove_dir_all(&dir).unwrap();
}

/// A change to one field of one event (index modulo the events).
#[derive(Debug, Clone)]
enum EventEdit {
    Ts { at: usize, ts: u64 },
    Parent { at: usize, parent: u64 },
    Slot { at: usize, slot: u64 },
    Func { at: usize, func: u32 },
    Cpu { at: usize, cpu: u32 },
    Swap { a: usize, b: usize },
}

fn event_edit() -> impl Strategy<Value = EventEdit> {
    let word = prop_oneof![
        Just(0u64),
        Just(1),
        Just(u64::MAX),
        Just(1 << 63),
        any::<u64>()
    ];
    let small = prop_oneof![Just(0u32), Just(1), Just(2), Just(u32::MAX), any::<u32>()];
    prop_oneof![
        (any::<usize>(), word.clone()).prop_map(|(at, ts)| EventEdit::Ts { at, ts }),
        (any::<usize>(), word.clone()).prop_map(|(at, parent)| EventEdit::Parent { at, parent }),
        (any::<usize>(), word).prop_map(|(at, slot)| EventEdit::Slot { at, slot }),
        (any::<usize>(), small.clone()).prop_map(|(at, func)| EventEdit::Func { at, func }),
        (any::<usize>(), small).prop_map(|(at, cpu)| EventEdit::Cpu { at, cpu }),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| EventEdit::Swap { a, b }),
    ]
}

fn edit(events: &mut [tracer::trace::model::Event], e: &EventEdit) {
    let n = events.len();
    if n == 0 {
        return;
    }
    match *e {
        EventEdit::Ts { at, ts } => events[at % n].ts_ns = ts,
        EventEdit::Parent { at, parent } => events[at % n].parent = parent,
        EventEdit::Slot { at, slot } => events[at % n].slot = slot,
        EventEdit::Func { at, func } => events[at % n].func = func,
        EventEdit::Cpu { at, cpu } => events[at % n].cpu = cpu,
        EventEdit::Swap { a, b } => events.swap(a % n, b % n),
    }
}

/// A crafted data file: valid blocks and checksums (written by vmtrace's
/// own writer) holding events no run records (a function or vCPU out of
/// range, a return without its call, times out of order, a slot of
/// another stack). It loads or is refused in one line; what loads goes
/// through every view.
#[test]
fn fuzz_every_view_of_a_crafted_data_file() {
    let dir = scratch("crafted");
    let p = dir.join("t.data");
    for base in [fixture::trace(), fixture::graph_trace()] {
        let mut runner = deterministic(CASES / 3);
        let r = runner.run(&prop::collection::vec(event_edit(), 1..6), |edits| {
            let mut t = base.clone();
            for e in &edits {
                edit(&mut t.events, e);
            }
            let mut f = DataFile::create(&p).unwrap();
            let mut head = t.clone();
            head.events.clear();
            f.head(&head).unwrap();
            f.write_events(&t.events).unwrap();
            f.finish(&t).unwrap();
            drop(f);
            match load(&p) {
                Ok(t) => every_view(&t)?,
                Err(e) => {
                    let msg = e.to_string();
                    prop_assert!(!msg.contains('\n'), "{}", msg);
                }
            }
            Ok(())
        });
        if let Err(e) = r {
            panic!("{e}");
        }
    }
    fs::remove_dir_all(&dir).unwrap();
}
