//! The figures table `--markdown FILE` writes: per bench its headline
//! figures (the JSON's `benches[].values`) and the few more the docs cite,
//! the goals' verdicts, and what was not measured, between two markers,
//! headed by the command, host and date that measured them. Made from the
//! JSON document, so the table says what `--json` says.
//!
//! Only std, serde_json and thiserror: tests/docs_figures.rs includes this
//! file to check that docs/benchmarks.md's table parses and renders back as
//! written.

use std::fmt::Write as _;

use serde_json::Value;

/// The lines that open and close the figures block in a Markdown file.
pub const BEGIN: &str = "<!-- bench:figures begin -->";
pub const END: &str = "<!-- bench:figures end -->";

const FIGURES_HEAD: &str = "| bench | figure | value | unit | samples: min .. max |";
const GOALS_HEAD: &str = "| bench | goal | measured | verdict |";
const NOT_MEASURED: &str = "Not measured in this run:";
const NOT_MEASURED_VALUE: &str = "not measured";

/// Figures cited in the docs besides each bench's headline values: bench,
/// key in its `figures`, unit.
const MORE: &[(&str, &str, &str)] = &[
    ("call/trap", "handler_recorder_ns", "ns"),
    ("call/trap", "handler_resume_only_ns", "ns"),
    ("call/exitless", "trap_us_per_call", "µs"),
    ("call/exitless", "exitless_us_per_call", "µs"),
    ("call/exitless", "us_per_guest_instruction", "µs"),
    (
        "call/exitless",
        "guest_instructions_per_call_static",
        "guest instructions",
    ),
    ("call/graph", "trap_us_per_call", "µs"),
    (
        "call/graph",
        "guest_instructions_per_call_static",
        "guest instructions",
    ),
    ("call/stack", "stack_handler_stack_ns", "ns"),
    ("call/stack", "stack_handler_recorder_ns", "ns"),
    ("record/throughput", "h_record_mb_per_s", "MB/s"),
    ("qemu/attach", "k_trap_ns_per_call", "ns"),
    ("qemu/attach", "k_trap_direct_ns_per_call", "ns"),
    ("qemu/attach", "k_trap_graph_ns_per_call", "ns"),
    ("qemu/attach", "k_stored_share", "ratio"),
];

#[derive(Debug, PartialEq, thiserror::Error)]
pub enum MarkdownError {
    #[error("no figures block (its first line `<!-- bench:figures begin -->`, its last `<!-- bench:figures end -->`)")]
    NoBlock,
    #[error("figures block, line {line}: {what}")]
    Line { line: usize, what: String },
    #[error("the bench's JSON has no {0}")]
    Json(&'static str),
    /// A table that does not read back as written: a bug.
    #[error("the table does not read back as written: {0}")]
    NotReadBack(Box<MarkdownError>),
}

/// The figures block, parsed.
#[derive(Debug, PartialEq)]
pub struct FiguresTable {
    /// The command that measured the figures, on what host, when.
    pub command: String,
    pub host: String,
    pub date: String,
    pub figures: Vec<Figure>,
    pub goals: Vec<GoalRow>,
    /// Benches (or some of their figures) not measured, and why.
    pub not_measured: Vec<(String, String)>,
}

#[derive(Debug, PartialEq)]
pub struct Figure {
    pub bench: String,
    pub key: String,
    /// None: not measured.
    pub value: Option<f64>,
    pub unit: String,
    /// The samples behind a median, and their min and max.
    pub spread: Option<(u64, f64, f64)>,
}

#[derive(Debug, PartialEq)]
pub struct GoalRow {
    pub bench: String,
    pub goal: String,
    pub measured: String,
    /// PASS, MISS, or SKIP: why.
    pub verdict: String,
}

/// The table of the bench's JSON document `doc`, measured by `command` on
/// `host` on `date`.
pub fn from_json(
    doc: &Value,
    command: &str,
    host: &str,
    date: &str,
) -> Result<FiguresTable, MarkdownError> {
    let mut t = FiguresTable {
        command: command.into(),
        host: host.into(),
        date: date.into(),
        figures: Vec::new(),
        goals: Vec::new(),
        not_measured: Vec::new(),
    };
    let benches = doc["benches"]
        .as_array()
        .ok_or(MarkdownError::Json("benches"))?;
    for b in benches {
        let name = b["name"]
            .as_str()
            .ok_or(MarkdownError::Json("bench name"))?;
        if let Some(why) = b["not_measured"].as_str() {
            t.not_measured.push((name.into(), why.into()));
        }
        for v in b["values"].as_array().into_iter().flatten() {
            let spread = match (v["samples"].as_u64(), v["min"].as_f64(), v["max"].as_f64()) {
                (Some(n), Some(lo), Some(hi)) => Some((n, lo, hi)),
                _ => None,
            };
            t.figures.push(Figure {
                bench: name.into(),
                key: v["key"]
                    .as_str()
                    .ok_or(MarkdownError::Json("value key"))?
                    .into(),
                value: v["value"].as_f64(),
                unit: v["unit"].as_str().unwrap_or("").into(),
                spread,
            });
        }
        let more = MORE.iter().filter(|(bench, _, _)| *bench == name);
        for (_, key, unit) in more {
            if let Some(v) = b["figures"].get(key) {
                t.figures.push(Figure {
                    bench: name.into(),
                    key: (*key).into(),
                    value: v.as_f64(),
                    unit: (*unit).into(),
                    spread: None,
                });
            }
        }
        for g in b["goals"].as_array().into_iter().flatten() {
            let status = g["status"]
                .as_str()
                .ok_or(MarkdownError::Json("goal status"))?;
            t.goals.push(GoalRow {
                bench: name.into(),
                goal: g["goal"].as_str().unwrap_or("").into(),
                measured: g["measured"].as_str().unwrap_or("").into(),
                verdict: match g["not_judged"].as_str() {
                    Some(why) => format!("{status}: {why}"),
                    None => status.into(),
                },
            });
        }
    }
    Ok(t)
}

/// A figure as the table writes it: integers from 100 up with thousands
/// separators, 1 decimal from 10, 2 from 1, else 3 significant digits.
pub fn number(v: f64) -> String {
    // Rounding may carry a value into the next range (99.96 -> 100.0):
    // written again from what was written, it is written as that range does.
    let once = number_once(v);
    match parse_number(&once) {
        Some(r) => number_once(r),
        None => once,
    }
}

fn number_once(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 {
        let r = v.round();
        let digits = format!("{}", r.abs() as u128);
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        let sign = if r < 0.0 { "-" } else { "" };
        format!("{sign}{out}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else if a == 0.0 {
        "0".into()
    } else {
        let decimals = (2.0 - a.log10().floor()) as usize;
        format!("{v:.decimals$}")
    }
}

fn parse_number(s: &str) -> Option<f64> {
    s.replace(',', "").parse().ok()
}

/// A table cell's text: on one line, `|` escaped.
fn cell(s: &str) -> String {
    s.replace('\n', " ").replace('|', "\\|")
}

/// The figures block, markers included, ending with a newline.
pub fn render(t: &FiguresTable) -> String {
    let mut o = String::new();
    // Writing to a String cannot fail.
    let _ = write_block(&mut o, t);
    o
}

/// The figures block, checked to parse back into what renders it again
/// (what tests/docs_figures.rs asks of docs/benchmarks.md).
pub fn render_checked(t: &FiguresTable) -> Result<String, MarkdownError> {
    let block = render(t);
    let back = parse(&block).map_err(|e| MarkdownError::NotReadBack(Box::new(e)))?;
    match render(&back) == block {
        true => Ok(block),
        false => Err(MarkdownError::NotReadBack(Box::new(MarkdownError::Line {
            line: 1,
            what: "rendered again, it differs".into(),
        }))),
    }
}

fn write_block(o: &mut String, t: &FiguresTable) -> std::fmt::Result {
    writeln!(o, "{BEGIN}")?;
    writeln!(o, "- command: `{}`", t.command)?;
    writeln!(o, "- host: {}", t.host)?;
    writeln!(o, "- date: {}", t.date)?;
    writeln!(o)?;
    writeln!(o, "{FIGURES_HEAD}")?;
    writeln!(o, "|---|---|---:|---|---|")?;
    for f in &t.figures {
        let value = f.value.map_or_else(|| NOT_MEASURED_VALUE.into(), number);
        let spread = f.spread.map_or_else(String::new, |(n, lo, hi)| {
            format!("{n}: {} .. {}", number(lo), number(hi))
        });
        writeln!(
            o,
            "| `{}` | `{}` | {value} | {} | {spread} |",
            f.bench,
            f.key,
            cell(&f.unit)
        )?;
    }
    writeln!(o)?;
    writeln!(o, "{GOALS_HEAD}")?;
    writeln!(o, "|---|---|---|---|")?;
    for g in &t.goals {
        writeln!(
            o,
            "| `{}` | {} | {} | {} |",
            g.bench,
            cell(&g.goal),
            cell(&g.measured),
            cell(&g.verdict)
        )?;
    }
    if !t.not_measured.is_empty() {
        writeln!(o)?;
        writeln!(o, "{NOT_MEASURED}")?;
        writeln!(o)?;
        for (bench, why) in &t.not_measured {
            writeln!(o, "- `{bench}`: {why}")?;
        }
    }
    writeln!(o, "{END}")
}

/// `text` with its figures block replaced by `block`; None: `text` has no
/// figures block.
pub fn splice(text: &str, block: &str) -> Option<String> {
    let (start, end) = block_range(text)?;
    Some(format!("{}{block}{}", &text[..start], &text[end..]))
}

/// The byte range of the figures block in `text`: from its BEGIN line to
/// the end of its END line.
fn block_range(text: &str) -> Option<(usize, usize)> {
    let mut at = 0;
    let mut start = None;
    for line in text.split_inclusive('\n') {
        let here = at;
        at += line.len();
        match (line.trim_end(), start) {
            (BEGIN, None) => start = Some(here),
            (END, Some(s)) => return Some((s, at)),
            _ => {}
        }
    }
    None
}

/// The figures block of `text` (a Markdown file), parsed.
pub fn parse(text: &str) -> Result<FiguresTable, MarkdownError> {
    let (start, end) = block_range(text).ok_or(MarkdownError::NoBlock)?;
    // Line numbers in errors count from the file's first line.
    let first = text[..start].lines().count() + 1;
    let lines: Vec<&str> = text[start..end].lines().collect();
    let mut p = Parser {
        lines,
        at: 1,
        first,
    };
    let command = p.field("- command: `")?;
    let command = command
        .strip_suffix('`')
        .ok_or_else(|| p.error("the command not in backquotes"))?
        .to_string();
    let host = p.field("- host: ")?.to_string();
    let date = p.field("- date: ")?.to_string();
    p.expect("")?;
    p.expect(FIGURES_HEAD)?;
    p.expect("|---|---|---:|---|---|")?;
    let mut figures = Vec::new();
    while let Some(cells) = p.row(5)? {
        figures.push(p.figure(&cells)?);
    }
    p.expect("")?;
    p.expect(GOALS_HEAD)?;
    p.expect("|---|---|---|---|")?;
    let mut goals = Vec::new();
    while let Some(c) = p.row(4)? {
        goals.push(GoalRow {
            bench: p.code(&c[0])?,
            goal: c[1].clone(),
            measured: c[2].clone(),
            verdict: p.verdict(&c[3])?,
        });
    }
    let mut not_measured = Vec::new();
    if p.peek() == Some("") {
        p.expect("")?;
        p.expect(NOT_MEASURED)?;
        p.expect("")?;
        while let Some(line) = p.peek().and_then(|l| l.strip_prefix("- `")) {
            let (bench, why) = line
                .split_once("`: ")
                .ok_or_else(|| p.error("not `- `BENCH`: WHY`"))?;
            not_measured.push((bench.to_string(), why.to_string()));
            p.at += 1;
        }
    }
    p.expect(END)?;
    Ok(FiguresTable {
        command,
        host,
        date,
        figures,
        goals,
        not_measured,
    })
}

/// The block's lines, and the one being read.
struct Parser<'a> {
    lines: Vec<&'a str>,
    at: usize,
    /// The block's first line in its file.
    first: usize,
}

impl<'a> Parser<'a> {
    fn error(&self, what: impl Into<String>) -> MarkdownError {
        MarkdownError::Line {
            line: self.first + self.at,
            what: what.into(),
        }
    }

    fn peek(&self) -> Option<&'a str> {
        self.lines.get(self.at).copied()
    }

    fn expect(&mut self, want: &str) -> Result<(), MarkdownError> {
        match self.peek() {
            Some(l) if l == want => {
                self.at += 1;
                Ok(())
            }
            l => Err(self.error(format!("{:?} where {want:?} belongs", l.unwrap_or("")))),
        }
    }

    /// The rest of a line that starts with `prefix`.
    fn field(&mut self, prefix: &str) -> Result<&'a str, MarkdownError> {
        let rest = self.peek().and_then(|l| l.strip_prefix(prefix));
        let rest = rest.ok_or_else(|| self.error(format!("no line starting {prefix:?}")))?;
        self.at += 1;
        Ok(rest)
    }

    /// A table row of `n` cells, unescaped; None at the table's end.
    fn row(&mut self, n: usize) -> Result<Option<Vec<String>>, MarkdownError> {
        let Some(line) = self.peek().filter(|l| l.starts_with('|')) else {
            return Ok(None);
        };
        let inner = line
            .strip_prefix("| ")
            .and_then(|l| l.strip_suffix(" |"))
            .ok_or_else(|| self.error("a row not in `| ... |`"))?;
        let (mut cells, mut cur) = (Vec::new(), String::new());
        let mut chars = inner.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' if chars.peek() == Some(&'|') => {
                    chars.next();
                    cur.push('|');
                }
                '|' => cells.push(std::mem::take(&mut cur)),
                _ => cur.push(c),
            }
        }
        cells.push(cur);
        let cells: Vec<String> = cells.iter().map(|c| c.trim().to_string()).collect();
        if cells.len() != n {
            return Err(self.error(format!("{} cells, not {n}", cells.len())));
        }
        self.at += 1;
        Ok(Some(cells))
    }

    /// A cell in backquotes: its text.
    fn code(&self, c: &str) -> Result<String, MarkdownError> {
        c.strip_prefix('`')
            .and_then(|c| c.strip_suffix('`'))
            .map(str::to_string)
            .ok_or_else(|| self.error(format!("{c:?} not in backquotes")))
    }

    fn number(&self, c: &str) -> Result<f64, MarkdownError> {
        parse_number(c).ok_or_else(|| self.error(format!("{c:?} is not a number")))
    }

    fn figure(&self, c: &[String]) -> Result<Figure, MarkdownError> {
        let value = match c[2].as_str() {
            NOT_MEASURED_VALUE => None,
            v => Some(self.number(v)?),
        };
        let spread = match c[4].as_str() {
            "" => None,
            s => {
                let bad = || self.error(format!("{s:?} is not `N: MIN .. MAX`"));
                let (n, range) = s.split_once(": ").ok_or_else(bad)?;
                let (lo, hi) = range.split_once(" .. ").ok_or_else(bad)?;
                let n = n.parse().map_err(|_| bad())?;
                Some((n, self.number(lo)?, self.number(hi)?))
            }
        };
        Ok(Figure {
            bench: self.code(&c[0])?,
            key: self.code(&c[1])?,
            value,
            unit: c[3].clone(),
            spread,
        })
    }

    fn verdict(&self, c: &str) -> Result<String, MarkdownError> {
        let status = c.split(':').next().unwrap_or("");
        match status {
            "PASS" | "MISS" | "SKIP" => Ok(c.to_string()),
            _ => Err(self.error(format!("verdict {c:?} is not PASS, MISS or SKIP"))),
        }
    }
}
