//! The libraries' messages name no CLI flag (issue 23): an error says what is
//! wrong and carries the input it names and its remedy as data
//! (`vmm::advice`, `tracer::advice`); the CLI words them with its flags
//! (src/error.rs).
//!
//! A scan of the code of vmm/src and tracer/src, comments left out: no
//! string may hold `--` followed by a letter, except the report and list
//! wording below, which is output shared with `vmtrace report` and `list`
//! and pinned by golden files and tests.

use std::path::{Path, PathBuf};

/// (file under the workspace, text on the line): flag names that stay.
const KEPT: &[(&str, &str)] = &[
    // Report wording, kept: the report says which option hid rows, what
    // `--overwrite`/`--max-events` did, and labels the `--cpu` header line.
    ("tracer/src/trace/report/text.rs", "(--percent-limit)"),
    ("tracer/src/trace/report/tasks.rs", "(--percent-limit)"),
    (
        "tracer/src/trace/report/header.rs",
        "--overwrite keeps the newest",
    ),
    ("tracer/src/trace/report/header.rs", "(over --max-events,"),
    (
        "tracer/src/trace/report/header.rs",
        "(\"--cpu\", cpu_line(report))",
    ),
    (
        "tracer/src/trace/report/header.rs",
        "a full ring, --max-events or a full queue",
    ),
    ("tracer/src/trace/export/script.rs", "(over --max-events or"),
    // `vmtrace list`'s marker of a function `--graph` leaves out.
    ("tracer/src/plan/list.rs", "\" [no --graph]\""),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read_dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Whether `line` holds `--` then a lowercase letter outside a `//` comment.
fn names_a_flag(line: &str) -> bool {
    let code = line.trim_start();
    if code.starts_with("//") {
        return false;
    }
    // A trailing comment: the libraries' strings hold no " // ".
    let code = code.split(" // ").next().unwrap_or(code);
    code.as_bytes()
        .windows(3)
        .any(|w| w[0] == b'-' && w[1] == b'-' && w[2].is_ascii_lowercase())
}

#[test]
fn library_code_names_no_cli_flag() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["vmm/src", "tracer/src"] {
        rust_files(&root.join(dir), &mut files);
    }
    files.sort();
    assert!(files.len() > 50, "{} files", files.len());
    let mut found = Vec::new();
    let mut kept = vec![false; KEPT.len()];
    for path in &files {
        let rel = path.strip_prefix(root).expect("under the root");
        let rel = rel.to_string_lossy();
        let text = std::fs::read_to_string(path).expect("read");
        for (n, line) in text.lines().enumerate() {
            if !names_a_flag(line) {
                continue;
            }
            match KEPT.iter().position(|(f, t)| *f == rel && line.contains(t)) {
                Some(i) => kept[i] = true,
                None => found.push(format!("{rel}:{}: {}", n + 1, line.trim())),
            }
        }
    }
    assert!(
        found.is_empty(),
        "library code names CLI flags; say the input or remedy as data \
         (vmm::advice, tracer::advice) and word it in src/error.rs:\n{}",
        found.join("\n")
    );
    // An entry no line needs any more goes.
    let stale: Vec<_> = KEPT
        .iter()
        .zip(&kept)
        .filter(|(_, used)| !**used)
        .map(|(k, _)| k)
        .collect();
    assert!(stale.is_empty(), "allowed but not found: {stale:?}");
}

#[test]
fn the_scan_sees_flags_in_strings_not_in_comments() {
    assert!(names_a_flag(
        r#"    #[error("--cpus {0} is out of range")]"#
    ));
    assert!(names_a_flag(
        r#"         reads a bzImage (or no --vmlinux: ...)""#
    ));
    assert!(!names_a_flag("    /// `--trace` globs"));
    assert!(!names_a_flag("    let x = 1; // --graph hooks returns"));
    assert!(!names_a_flag("    x -= -1;"));
}
