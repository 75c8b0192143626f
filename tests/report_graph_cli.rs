//! `vmtrace report` of a saved function-graph trace through the binary:
//! the tree, folded stacks and duration sorts, against the golden outputs
//! of tracer/tests/report_golden.rs (the same trace, `graph.vmtrace`).

mod common;

use std::fs;

use common::*;

fn golden(name: &str) -> String {
    fs::read_to_string(root().join("tracer/tests/golden").join(name)).unwrap()
}

fn report(more: &[&str]) -> String {
    let graph = root().join("tracer/tests/golden/graph.vmtrace");
    let mut args = vec!["report", "-i", graph.to_str().unwrap()];
    args.extend_from_slice(more);
    let out = vmtrace(&args);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
    assert_eq!(stderr(&out), "", "{args:?}");
    stdout(&out)
}

/// The section of a golden file after the line `==== LABEL`.
fn section(file: &str, label: &str) -> String {
    let text = golden(file);
    let start = text.find(&format!("==== {label}\n")).unwrap() + label.len() + 6;
    let end = text[start..]
        .find("\n==== ")
        .map_or(text.len(), |e| start + e + 1);
    text[start..end].to_string()
}

#[test]
fn report_tree_folded_and_sorts_of_a_graph_trace() {
    assert_eq!(
        report(&["--tree"]),
        section("graph.tree.txt", "depth=None threshold_ns=0 cpus=None")
    );
    assert_eq!(
        report(&["--tree", "--depth", "2"]),
        section("graph.tree.txt", "depth=Some(2) threshold_ns=0 cpus=None")
    );
    assert_eq!(
        report(&["--tree", "--threshold", "10us"]),
        section("graph.tree.txt", "depth=None threshold_ns=10000 cpus=None")
    );
    assert_eq!(
        report(&["--tree", "--threshold", "1us", "--cpu", "1"]),
        section(
            "graph.tree.txt",
            "depth=None threshold_ns=1000 cpus=Some([1])"
        )
    );
    assert_eq!(report(&["--format", "folded"]), golden("graph.folded"));
    // Without a terminal the report is 100 columns wide, as the golden's.
    for (key, label) in [
        ("count", "Count"),
        ("total", "Total"),
        ("self", "SelfTime"),
        ("avg", "Avg"),
        ("max", "Max"),
    ] {
        assert_eq!(
            report(&["--sort", key]),
            section(
                "graph.txt",
                &format!("sort={label} callers=false cpus=None width=100")
            ),
            "--sort {key}"
        );
    }
    assert_eq!(
        report(&["--sort", "self", "-g", "--cpu", "1"]),
        section(
            "graph.txt",
            "sort=SelfTime callers=true cpus=Some([1]) width=100"
        )
    );
}
