//! Every output of a trace, byte for byte, against files saved from a known
//! good build: the text report (each sort, `--cpu`, `-g`, width), JSON, CSV,
//! Chrome and the saved trace file; for a function-graph trace also the
//! call tree (`--tree`, with `--depth`, `--threshold`, `--cpu`) and folded
//! stacks. Refactorings must not change a byte;
//! an intended format change regenerates them with `VMTRACE_BLESS=1`.

#[path = "report_fixture.rs"]
mod fixture;

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use tracer::trace::datafile::save;
use tracer::trace::export::{write_chrome, write_csv, write_folded, write_json};
use tracer::trace::model::Trace;
use tracer::trace::report::{render, render_tree, ReportOptions, Sort, TreeOptions};

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// Compares `got` with the golden file `name`, or writes it when blessing.
fn check(name: &str, got: &[u8]) {
    let path = golden_dir().join(name);
    if std::env::var_os("VMTRACE_BLESS").is_some() {
        fs::create_dir_all(golden_dir()).unwrap();
        fs::write(&path, got).unwrap();
        return;
    }
    let want = fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (VMTRACE_BLESS=1 writes it)", path.display()));
    if want != got {
        let at = want.iter().zip(got).take_while(|(a, b)| a == b).count();
        panic!(
            "{name} differs from {} at byte {at} (want {} bytes, got {}):\n{}",
            path.display(),
            want.len(),
            got.len(),
            String::from_utf8_lossy(&got[at.saturating_sub(200)..got.len().min(at + 200)])
        );
    }
}

/// The fixture with names and a kernel path that need quoting everywhere.
fn weird() -> Trace {
    let mut t = fixture::trace();
    t.functions[fixture::DO_IDLE as usize].name = "odd,\"name\"\nwith newline".into();
    t.callers[1].name = "caller, \"quoted\"".into();
    t.meta.kernel = "C:\\kernel \"quoted\"".into();
    t.meta.build_id = None;
    t
}

/// The fixture on 8 vCPUs: the spread column shows min / avg / max.
fn many_cpus() -> Trace {
    let mut t = fixture::trace();
    t.meta.cpus = 8;
    for r in &mut t.counts {
        let c = r.clone();
        r.extend(c.iter().map(|n| n * 2));
    }
    t
}

/// Every report option combination worth a byte check, labelled.
fn option_cases() -> Vec<(String, ReportOptions)> {
    let mut cases = Vec::new();
    for sort in [Sort::Count, Sort::Name, Sort::Cpu] {
        for callers in [false, true] {
            for cpus in [None, Some(vec![1, 2]), Some(vec![0, 2, 9]), Some(vec![7])] {
                for width in [100, 40] {
                    let label =
                        format!("sort={sort:?} callers={callers} cpus={cpus:?} width={width}");
                    cases.push((
                        label,
                        ReportOptions {
                            sort,
                            cpus: cpus.clone(),
                            callers,
                            width,
                            ..ReportOptions::default()
                        },
                    ));
                }
            }
        }
    }
    cases
}

fn all_reports(t: &Trace) -> String {
    let mut out = String::new();
    for (label, o) in option_cases() {
        writeln!(out, "==== {label}").unwrap();
        out.push_str(&render(t, &o));
    }
    out
}

fn exports(t: &Trace) -> [(&'static str, Vec<u8>); 4] {
    let mut json = Vec::new();
    write_json(t, &mut json).unwrap();
    let mut csv = Vec::new();
    write_csv(t, &mut csv).unwrap();
    let mut chrome = Vec::new();
    write_chrome(t, &mut chrome).unwrap();
    [
        ("json", json),
        ("csv", csv),
        ("chrome.json", chrome),
        ("vmtrace", saved(t)),
    ]
}

fn saved(t: &Trace) -> Vec<u8> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("report_golden-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let p = dir.join(format!("{}.vmtrace", t.events.len()));
    save(t, &p).unwrap();
    let b = fs::read(&p).unwrap();
    fs::remove_file(&p).unwrap();
    b
}

/// 64-bit FNV-1a: a stable digest for outputs too large to keep whole.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[test]
fn report_golden_small_traces_are_byte_identical() {
    for (name, t) in [
        ("fixture", fixture::trace()),
        ("weird", weird()),
        ("many_cpus", many_cpus()),
        ("empty", Trace::default()),
    ] {
        check(&format!("{name}.txt"), all_reports(&t).as_bytes());
        for (ext, bytes) in exports(&t) {
            check(&format!("{name}.{ext}"), &bytes);
        }
    }
}

#[test]
fn report_golden_synthetic_trace_digests_are_unchanged() {
    let t = Trace::synthetic(20_000);
    let mut digests = String::new();
    for (label, o) in option_cases() {
        writeln!(
            digests,
            "text {label}: {:016x}",
            fnv1a(render(&t, &o).as_bytes())
        )
        .unwrap();
    }
    for (ext, bytes) in exports(&t) {
        writeln!(digests, "{ext}: {:016x}", fnv1a(&bytes)).unwrap();
    }
    check("synthetic.digests", digests.as_bytes());
}

#[test]
fn report_golden_graph_views_are_byte_identical() {
    let t = fixture::graph_trace();
    let mut text = String::new();
    for sort in [
        Sort::Count,
        Sort::Total,
        Sort::SelfTime,
        Sort::Avg,
        Sort::Max,
    ] {
        for callers in [false, true] {
            for cpus in [None, Some(vec![1])] {
                for width in [100, 160] {
                    writeln!(
                        text,
                        "==== sort={sort:?} callers={callers} cpus={cpus:?} width={width}"
                    )
                    .unwrap();
                    text.push_str(&render(
                        &t,
                        &ReportOptions {
                            sort,
                            cpus: cpus.clone(),
                            callers,
                            width,
                            ..ReportOptions::default()
                        },
                    ));
                }
            }
        }
    }
    check("graph.txt", text.as_bytes());
    let mut trees = String::new();
    for (depth, threshold_ns, cpus) in [
        (None, 0, None),
        (Some(1), 0, None),
        (Some(2), 0, None),
        (None, 10_000, None),
        (None, 1_000, Some(vec![1])),
        (Some(3), 500, Some(vec![0, 7])),
    ] {
        writeln!(
            trees,
            "==== depth={depth:?} threshold_ns={threshold_ns} cpus={cpus:?}"
        )
        .unwrap();
        trees.push_str(&render_tree(
            &t,
            &TreeOptions {
                cpus,
                depth,
                threshold_ns,
            },
        ));
    }
    check("graph.tree.txt", trees.as_bytes());
    let mut folded = Vec::new();
    write_folded(&t, &mut folded).unwrap();
    check("graph.folded", &folded);
    for (ext, bytes) in exports(&t) {
        check(&format!("graph.{ext}"), &bytes);
    }
}
