//! Each figure in the docs comes from one bench run: docs/benchmarks.md
//! holds the table `vmtrace bench --markdown` writes, exactly as it writes
//! it, and no other doc (nor benchmarks.md's own prose) quotes a figure of
//! the kind the bench measures: they link to the table. No KVM needed.

use std::path::{Path, PathBuf};

// The bench's own table code (std, serde_json and thiserror only), so the
// doc's table is parsed and rendered as the bench renders it.
#[allow(dead_code)]
#[path = "../src/bench/results/markdown.rs"]
mod markdown;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// docs/benchmarks.md's figures block parses, and renders back as written.
#[test]
fn benchmarks_table_is_as_the_bench_writes_it() {
    let text = read("docs/benchmarks.md");
    let table = markdown::parse(&text).unwrap_or_else(|e| panic!("docs/benchmarks.md: {e}"));
    let block = markdown::render(&table);
    assert_eq!(markdown::splice(&text, &block).as_deref(), Some(&*text));
    assert!(
        table.command.starts_with("vmtrace bench "),
        "{}",
        table.command
    );
    let measured = table.figures.iter().filter(|f| f.value.is_some()).count();
    assert!(measured >= 10, "{measured} figures measured: {table:?}");
    assert!(!table.goals.is_empty());
}

/// A table edited by hand in a way the bench never writes is refused.
#[test]
fn hand_edited_tables_do_not_parse() {
    let text = read("docs/benchmarks.md");
    let table = markdown::parse(&text).unwrap();
    let f = table.figures.iter().find(|f| f.value.is_some()).unwrap();
    let row = format!("| `{}` | `{}` |", f.bench, f.key);
    let at = text.find(&row).unwrap();
    let line_end = at + text[at..].find('\n').unwrap();
    let line = &text[at..line_end];
    let value = line.split(" | ").nth(2).unwrap();
    for edited in [
        line.replacen(value, &format!("{value}0000"), 1),
        line.replacen(value, &format!("~{value}"), 1),
        line.replacen(" |", " | x |", 1),
    ] {
        let edited = text.replacen(line, &edited, 1);
        let back = markdown::parse(&edited).map(|t| markdown::render(&t));
        assert!(
            back.is_err() || markdown::splice(&edited, &back.unwrap()).as_deref() != Some(&*edited),
            "{edited}"
        );
    }
    assert_eq!(
        markdown::parse("no table"),
        Err(markdown::MarkdownError::NoBlock)
    );
}

/// Units of the figures the bench reports, longest first. Its instruction
/// figures are per call ("N guest instructions", "N instructions per
/// call"); "N instructions" alone is a count of vmtrace's code, which its
/// unit tests check against the code (how-it-works.md describes it so).
const UNITS: &[&str] = &[
    "events per second",
    "records per second",
    "instructions per traced call",
    "instructions per call",
    "guest instructions",
    "events/s",
    "records/s",
    "MB/s",
    "M/s",
    "µs",
    "us",
    "ns",
    "ms",
];

/// Quantities with those units that are not figures of the bench: design
/// constants and examples. (file, the text as found, why.)
const NOT_FIGURES: &[(&str, &str, &str)] = &[
    (
        "docs/attach.md",
        "50 ms",
        "intervals vmtrace waits by design",
    ),
    (
        "docs/how-it-works.md",
        "10 ms",
        "how long a reserved ring slot may stay uncommitted, by design",
    ),
    (
        "docs/output.md",
        "1.8 ms",
        "the span of the Chrome export's picture",
    ),
    (
        "docs/output.md",
        "10 us",
        "the graph view's duration marks (ftrace's)",
    ),
    (
        "docs/output.md",
        "100 us",
        "the graph view's duration marks (ftrace's)",
    ),
    (
        "docs/output.md",
        "1 ms",
        "the graph view's duration marks (ftrace's)",
    ),
    (
        "docs/output.md",
        "10 ms",
        "the graph view's duration marks (ftrace's)",
    ),
    (
        "docs/output.md",
        "100 ms",
        "the graph view's duration marks (ftrace's)",
    ),
];

/// Figures quoted in the prose of a Markdown text: (line, the figure).
/// Not code (fenced, indented by four, or in backquotes), not the figures
/// block, not a bound (after `<=`, `>=`, "at most", "at least"), not part
/// of a name or version (after a letter, `_` or `.`).
fn figures_in(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let (mut fenced, mut in_block) = (false, false);
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_end();
        if trimmed == markdown::BEGIN || trimmed == markdown::END {
            in_block = trimmed == markdown::BEGIN;
            continue;
        }
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || in_block || line.starts_with("    ") || line.starts_with('\t') {
            continue;
        }
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        out.extend(figures_in_line(&prose).into_iter().map(|f| (i + 1, f)));
    }
    out
}

fn figures_in_line(s: &str) -> Vec<String> {
    let c: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let starts = c[i].is_ascii_digit()
            && (i == 0 || !(c[i - 1].is_alphanumeric() || "_.,".contains(c[i - 1])));
        if !starts {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < c.len()
            && (c[j].is_ascii_digit()
                || (",.-".contains(c[j]) && j + 1 < c.len() && c[j + 1].is_ascii_digit()))
        {
            j += 1;
        }
        let before: String = c[..i].iter().collect::<String>();
        let before = before.trim_end().trim_end_matches('~').trim_end();
        let bound = ["<=", ">=", "≤", "≥", "<", ">", "at most", "at least"]
            .iter()
            .any(|b| before.ends_with(b));
        let rest: String = c[j..].iter().collect();
        let rest = rest.trim_start();
        let rest = rest.strip_prefix("M ").unwrap_or(rest);
        let unit = UNITS.iter().find(|u| {
            rest.strip_prefix(**u)
                .is_some_and(|after| !after.starts_with(|ch: char| ch.is_alphanumeric()))
        });
        if let (Some(u), false) = (unit, bound) {
            let number: String = c[i..j].iter().collect();
            out.push(format!("{number} {u}"));
        }
        i = j.max(i + 1);
    }
    out
}

/// The docs besides the changelog, which records what each change measured.
fn docs() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md")];
    for e in std::fs::read_dir(root().join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") && !p.ends_with("CHANGELOG.md") {
            files.push(p);
        }
    }
    files.sort();
    files
}

fn rel(p: &Path) -> String {
    p.strip_prefix(root()).unwrap().display().to_string()
}

#[test]
fn no_doc_repeats_a_bench_figure() {
    let files = docs();
    assert!(files.len() >= 10, "{files:?}");
    let mut found = Vec::new();
    let mut used = vec![false; NOT_FIGURES.len()];
    for f in &files {
        let name = rel(f);
        let text = std::fs::read_to_string(f).unwrap();
        for (line, figure) in figures_in(&text) {
            let allowed = NOT_FIGURES
                .iter()
                .position(|(file, text, _)| *file == name && *text == figure);
            match allowed {
                Some(k) => used[k] = true,
                None => found.push(format!("{name}:{line}: {figure}")),
            }
        }
    }
    // An exception no doc needs any more goes, so the list stays the few
    // quantities that are not figures.
    let unused: Vec<_> = NOT_FIGURES
        .iter()
        .zip(&used)
        .filter(|(_, u)| !**u)
        .map(|(n, _)| n)
        .collect();
    assert!(unused.is_empty(), "exceptions no doc needs: {unused:?}");
    assert!(
        found.is_empty(),
        "bench figures quoted outside docs/benchmarks.md's table (link to \
         benchmarks.md#figures instead):\n{}",
        found.join("\n")
    );
}

/// Every `benchmarks.md#anchor` link in the docs names a heading there.
#[test]
fn links_to_the_figures_land() {
    let bench = read("docs/benchmarks.md");
    let anchors: Vec<String> = bench
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|h| {
            let h = h.trim_start_matches('#').trim().to_lowercase();
            h.chars()
                .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect();
    assert!(anchors.iter().any(|a| a == "figures"), "{anchors:?}");
    let mut links = 0;
    for f in docs() {
        let text = std::fs::read_to_string(&f).unwrap();
        for (i, part) in text.split("benchmarks.md#").enumerate().skip(1) {
            let anchor: String = part
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '-' || *c == '_')
                .collect();
            assert!(
                anchors.contains(&anchor),
                "{}: link {i} to benchmarks.md#{anchor}: no such heading",
                rel(&f)
            );
            links += 1;
        }
    }
    assert!(links >= 5, "{links} links to benchmarks.md's headings");
}

/// The scanner finds figures in prose, and only there.
#[test]
fn the_scanner_finds_figures_and_only_figures() {
    let doc = "\
A trap costs 3.6 µs here, ~0.58 µs per instruction,
the drain about 180,000 records/s (24.6 M events/s on disk),
and an exitless call 21 guest instructions; a pause 1.2 ms.
A recorded call is 21 instructions, 25 instructions per call with its task.

    vmtrace: attached in a 146 µs pause
```
2.5 ms in a fenced block
```
Inline `10us` and `1.5ms`, a goal <= 1 ms and at most 20 ms, 64 KiB,
Linux 6.1, x86_64, 28 sites, 10,640 ftrace sites, 2 vCPUs, mini_spin 200.
<!-- bench:figures begin -->
| `call/trap` | `a_exit_round_trip_us` | 3.22 | µs | |
<!-- bench:figures end -->
";
    let found = figures_in(doc);
    assert_eq!(
        found,
        [
            (1, "3.6 µs".to_string()),
            (1, "0.58 µs".to_string()),
            (2, "180,000 records/s".to_string()),
            (2, "24.6 events/s".to_string()),
            (3, "21 guest instructions".to_string()),
            (3, "1.2 ms".to_string()),
            (4, "25 instructions per call".to_string()),
        ]
    );
}
