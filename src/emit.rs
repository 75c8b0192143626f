//! What the user gets at the end of a traced run or `vmtrace report`: the
//! view on stdout (the text report, the call tree or an export format),
//! the exports (`--export FMT=FILE`) and the data file (`-o`, `record`).
//!
//! Nothing is lost quietly. The view comes first (what the user watches
//! for), then the exports, then the line that says where the data file is
//! (written while the guest ran, `cmd::run`; or why it could not be), last
//! so that it ends the run as perf's does. Each output is
//! written whatever happened to the others; every failure is one line, the
//! last one the command's error (exit status 1). Files are written by
//! `tracer::trace::output_path`'s rules (atomically over regular files, into
//! character devices, nothing else; checked before the run by
//! `config::output`); a failed write says what was left at the path. A
//! closed stdout (`vmtrace ... | head -1`) ends the view quietly and the
//! files are still written. Events counted but not stored are said on
//! stderr for CSV (which has no place for them), Chrome (whose `otherData`
//! holds them too), folded stacks and trace.dat; JSON has `dropped`, the
//! text report its `events:` line.
//!
//! `--tree` prints the call tree where the text report would go. The
//! function-graph views (`--tree`, folded stacks,
//! `config::Output::graph_view`) of a trace without returns are refused
//! before it is loaded (`cmd::report`) and before a run without `--graph`;
//! should one get here anyway, the tree falls back to the report and folded
//! stacks come out empty, each with a line on stderr.

use std::io::{self, Write};
use std::path::Path;

use tracer::trace::model::{Trace, TraceMeta};
use tracer::trace::output_path::{self, Target};
use tracer::trace::{export, report};

use crate::cli::{ExportFormat, Format};
use crate::config::{Export, Output, View};
use crate::datafile::{self, Streamed};
use crate::error::RuntimeError;

/// Every output of `out`, in the order above. `streamed`: the data file,
/// when the run wrote it as it went (then it is not saved again here).
pub fn emit(trace: &Trace, out: &Output, streamed: Option<Streamed>) -> Result<(), RuntimeError> {
    let mut failures = Vec::new();
    let mut shown = None;
    if let Some(view) = &out.view {
        match show(trace, view) {
            Ok(()) => shown = Some(view.format),
            Err(e) => failures.push(e),
        }
    }
    let restricted;
    let exported = match &out.export_window {
        Some(w) if !out.exports.is_empty() => {
            restricted = tracer::trace::window::restrict(trace, w);
            &restricted
        }
        _ => trace,
    };
    for e in &out.exports {
        if let Err(err) = write_export_file(exported, e, shown) {
            failures.push(err);
        }
    }
    if let Some(streamed) = streamed {
        match streamed {
            Ok(w) => note!(
                "vmtrace: {}",
                datafile::wrote_line(&w.path, w.events, w.returns, w.unstored, w.kept.as_deref())
            ),
            Err(e) => failures.push(e),
        }
    }
    // All but the last said here; the last is the command's error.
    let last = failures.pop();
    for f in failures {
        note!("vmtrace: {f}");
    }
    last.map_or(Ok(()), Err)
}

/// The view on stdout, cut to its window.
fn show(trace: &Trace, view: &View) -> Result<(), RuntimeError> {
    let restricted;
    let trace = match &view.window {
        Some(w) => {
            restricted = tracer::trace::window::restrict(trace, w);
            &restricted
        }
        None => trace,
    };
    let Some(fmt) = as_export(view.format) else {
        return print_report(trace, view);
    };
    let r = write_export(fmt, trace, &mut io::stdout().lock());
    closed_pipe_is_fine(r).map_err(|source| RuntimeError::Stdout {
        what: export_name(fmt),
        source,
    })?;
    note_dropped(fmt, trace);
    Ok(())
}

/// The text report (or with `--tree` the call tree) on stdout.
fn print_report(trace: &Trace, view: &View) -> Result<(), RuntimeError> {
    let mut stdout = io::stdout().lock();
    let r = match &view.tree {
        Some(tree) if trace.meta.graph => report::write_tree(trace, tree, &mut stdout),
        _ => {
            if view.tree.is_some() {
                note!("vmtrace: --tree needs a function-graph trace (--graph); the report follows");
            }
            let text = report::render(trace, &view.report);
            stdout.write_all(text.as_bytes())
        }
    }
    .and_then(|()| stdout.flush());
    closed_pipe_is_fine(r).map_err(|source| RuntimeError::Stdout {
        what: "report",
        source,
    })
}

/// Print what `body` writes on stdout; a closed pipe ends it quietly.
pub fn to_stdout(
    what: &'static str,
    body: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> Result<(), RuntimeError> {
    let mut stdout = io::stdout().lock();
    let r = body(&mut stdout).and_then(|()| stdout.flush());
    closed_pipe_is_fine(r).map_err(|source| RuntimeError::Stdout { what, source })
}

/// The reader went away (`| head`): what it did not read, it did not want.
fn closed_pipe_is_fine(r: io::Result<()>) -> io::Result<()> {
    match r {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        r => r,
    }
}

fn write_export_file(trace: &Trace, e: &Export, shown: Option<Format>) -> Result<(), RuntimeError> {
    let name = export_name(e.format);
    match output_path::write(&e.path, |w| write_export(e.format, trace, w)) {
        Ok(_) => {
            note_dropped(e.format, trace);
            Ok(())
        }
        Err(source) => Err(RuntimeError::Lost {
            what: name,
            path: e.path.clone(),
            source,
            note: left_behind(&e.path, shown),
        }),
    }
}

/// What a failed write left at `path`, and what the user has all the same.
fn left_behind(path: &Path, shown: Option<Format>) -> String {
    let mut note = match output_path::target(path) {
        Ok(Target::Device(_)) => "what reached the device is incomplete".to_string(),
        _ => "nothing was written there (a file of that name is as it was)".to_string(),
    };
    match shown.map(as_export) {
        Some(None) => note.push_str("; the text report is on stdout"),
        Some(Some(f)) => note.push_str(&format!("; the {} is on stdout", export_name(f))),
        None => {}
    }
    note
}

/// The export a `--format` prints on stdout; None for the text report.
fn as_export(fmt: Format) -> Option<ExportFormat> {
    match fmt {
        Format::Text => None,
        Format::Json => Some(ExportFormat::Json),
        Format::Csv => Some(ExportFormat::Csv),
        Format::Chrome => Some(ExportFormat::Chrome),
        Format::Folded => Some(ExportFormat::Folded),
    }
}

fn write_export(fmt: ExportFormat, trace: &Trace, w: &mut dyn Write) -> io::Result<()> {
    match fmt {
        ExportFormat::Json => export::write_json(trace, w),
        ExportFormat::Csv => export::write_csv(trace, w),
        ExportFormat::Chrome => export::write_chrome(trace, w),
        ExportFormat::Folded => export::write_folded(trace, w),
        ExportFormat::TraceDat => export::write_tracedat(trace, w),
    }
}

fn export_name(fmt: ExportFormat) -> &'static str {
    match fmt {
        ExportFormat::Json => "JSON output",
        ExportFormat::Csv => "CSV output",
        ExportFormat::Chrome => "Chrome trace",
        ExportFormat::Folded => "folded stacks",
        ExportFormat::TraceDat => "trace.dat",
    }
}

/// Why events were not stored: the causes the trace counted
/// (`TraceMeta::drops`, the writer's losses); a trace from an older file
/// counted none, so the possible ones are said.
fn drop_causes(m: &TraceMeta) -> String {
    let d = &m.drops;
    let lost: u64 = m.lost.iter().sum();
    let why: Vec<String> = [
        (d.ring_full_total(), "found their exitless ring full"),
        (d.over_budget, "over --max-events"),
        (d.overwritten, "overwritten (--overwrite)"),
        (lost, "lost: the data file's writer fell behind"),
    ]
    .into_iter()
    .filter(|&(n, _)| n > 0)
    .map(|(n, what)| format!("{n} {what}"))
    .collect();
    match why.is_empty() {
        true => "over --max-events, or a full exitless ring".into(),
        false => why.join(", "),
    }
}

/// CSV rows and trace.dat records are stored events only, a trace viewer
/// shows what it has, and folded stacks only the calls whose entry and
/// return were stored: say on stderr how many events they miss. (JSON has
/// `dropped`, the text report its `events:` line.)
fn note_dropped(fmt: ExportFormat, trace: &Trace) {
    let m = &trace.meta;
    if fmt == ExportFormat::Folded && !m.graph && trace.stacks.is_empty() {
        note!(
            "vmtrace: the folded stacks are empty: this trace has no returns (trace with --graph)"
        );
        return;
    }
    if m.events_dropped + m.returns_dropped == 0 || fmt == ExportFormat::Json {
        return;
    }
    let entries = trace.events.iter().filter(|e| !e.is_return()).count();
    // (Entries only: the wording predates returns, and scripts read it.)
    let returns = if m.returns_dropped > 0 {
        format!(", and {} returns", m.returns_dropped)
    } else {
        String::new()
    };
    note!(
        "vmtrace: the {} holds {entries} of {} events: {}{returns} were counted but not stored ({}){}",
        export_name(fmt),
        m.events_total,
        m.events_dropped,
        drop_causes(m),
        match fmt {
            ExportFormat::Chrome => " (its otherData says so too)",
            ExportFormat::Folded => "; calls without a stored entry and return are not in it",
            _ => "; the counts in --format json are exact",
        }
    );
}
