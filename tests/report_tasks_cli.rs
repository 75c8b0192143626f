//! `vmtrace report` and `vmtrace script` of a saved trace whose events
//! name their guest task, through the binary: every view against the
//! golden outputs of tracer/tests/tasks.rs (the same trace,
//! `tasks.vmtrace`), and `--by task`'s option checks.

mod common;

use std::fs;

use common::*;

fn golden(name: &str) -> String {
    fs::read_to_string(root().join("tracer/tests/golden").join(name)).unwrap()
}

fn run(cmd: &str, more: &[&str]) -> String {
    let trace = root().join("tracer/tests/golden/tasks.vmtrace");
    let mut args = vec![cmd, "-i", trace.to_str().unwrap()];
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
fn report_and_script_of_a_trace_with_tasks() {
    // Without a terminal the report is 100 columns wide, as the golden's.
    assert_eq!(
        run("report", &["--by", "task"]),
        section("tasks.txt", "count")
    );
    assert_eq!(
        run("report", &["--by", "task", "--sort", "name"]),
        section("tasks.txt", "name")
    );
    assert_eq!(
        run("report", &["--by", "task", "--cpu", "1"]),
        section("tasks.txt", "cpu 1")
    );
    assert_eq!(
        run("report", &["--by", "task", "--percent-limit", "15"]),
        section("tasks.txt", "percent-limit 15")
    );
    assert_eq!(run("report", &[]), section("tasks.txt", "by function"));
    assert_eq!(run("report", &["--tree"]), golden("tasks.tree.txt"));
    for (format, file) in [
        ("json", "tasks.json"),
        ("csv", "tasks.csv"),
        ("chrome", "tasks.chrome.json"),
        ("folded", "tasks.folded"),
    ] {
        assert_eq!(
            run("report", &["--format", format]),
            golden(file),
            "{format}"
        );
    }
    assert_eq!(run("script", &[]), golden("tasks.script.txt"));
}

#[test]
fn by_task_refuses_what_it_cannot_show() {
    let trace = root().join("tracer/tests/golden/tasks.vmtrace");
    let t = trace.to_str().unwrap();
    for (args, want) in [
        (
            &["report", t, "--by", "task", "-g"][..],
            "vmtrace: -g applies to the report by function; with --by task use --sort count or --sort name, without -g",
        ),
        (
            &["report", t, "--by", "task", "--sort", "self"][..],
            "vmtrace: --sort self applies to the report by function; with --by task use --sort count or --sort name, without -g",
        ),
        (
            &["report", t, "--by", "task", "--format", "json"][..],
            "vmtrace: --by applies to the text report, not to --format json; drop one of them",
        ),
    ] {
        let out = vmtrace(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert_eq!(stderr(&out).trim_end(), want, "{args:?}");
        assert_eq!(stdout(&out), "");
    }
}
