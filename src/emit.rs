//! What the user gets at the end of a traced run or `vmtrace report`: the
//! text report, an export, or the saved trace.
//!
//! Nothing is lost quietly. Files are written by `tracer::export::file`'s
//! rules (atomically over regular files, into character devices, nothing
//! else; checked before the run by `config::Output`). The text report is
//! printed before the trace is saved; when an export cannot be written to
//! its file, the text report goes to stdout instead; either way a one-line
//! error names the file and what was left there (exit status 1). A closed
//! stdout (`vmtrace ... | head -1`) ends the output quietly. Events counted
//! but not stored are said on stderr for CSV (which has no place for them),
//! Chrome (whose `otherData` holds them too) and folded stacks; JSON has
//! `dropped`, the text report its `events:` line.
//!
//! `--tree` prints the call tree where the text report would go. The
//! function-graph views (`--tree`, `--format folded`,
//! `config::Output::graph_view`) of a trace without returns are refused
//! before it is loaded (`cmd::report`) and should be before a run without
//! `--graph`; should one get here anyway, the tree falls back to the report
//! and folded stacks come out empty, each with a line on stderr.

use std::io::{self, Write};
use std::path::Path;

use tracer::export::file::{self, Target};
use tracer::model::Trace;
use tracer::tracefile::{self, TraceFileError};
use tracer::{export, report};

use crate::cli::Format;
use crate::config::Output;
use crate::error::RuntimeError;

/// Print the report, or write the chosen export / the saved trace.
pub fn emit(trace: &Trace, out: &Output) -> Result<(), RuntimeError> {
    match (out.format, &out.path) {
        (Format::Text, None) => print_report(trace, out),
        (Format::Text, Some(path)) => {
            // The report first: a failed save must not take it along.
            let printed = print_report(trace, out);
            save(trace, path, printed.is_ok())?;
            let _ = writeln!(
                io::stderr(),
                "vmtrace: trace saved to {} (read it with: vmtrace report -i {})",
                path.display(),
                path.display()
            );
            printed
        }
        (fmt, None) => {
            let r = write_export(fmt, trace, &mut io::stdout().lock());
            closed_pipe_is_fine(r).map_err(|source| RuntimeError::Stdout {
                what: name(fmt),
                source,
            })?;
            note_dropped(fmt, trace);
            Ok(())
        }
        (fmt, Some(path)) => match file::write(path, |w| write_export(fmt, trace, w)) {
            Ok(_) => {
                note_dropped(fmt, trace);
                Ok(())
            }
            Err(source) => {
                // The run's results still reach the user, as the text report.
                let printed = print_report(trace, out).is_ok();
                Err(RuntimeError::Lost {
                    what: name(fmt),
                    path: path.clone(),
                    source,
                    note: left_behind(path, printed, "the text report is on stdout instead"),
                })
            }
        },
    }
}

/// The text report (or with `--tree` the call tree) on stdout; a closed
/// pipe ends it quietly.
fn print_report(trace: &Trace, out: &Output) -> Result<(), RuntimeError> {
    let mut stdout = io::stdout().lock();
    let r = match &out.tree {
        Some(tree) if trace.meta.graph => report::write_tree(trace, tree, &mut stdout),
        _ => {
            if out.tree.is_some() {
                let _ = writeln!(
                    io::stderr(),
                    "vmtrace: --tree needs a function-graph trace (--graph); the report follows"
                );
            }
            let text = report::render(trace, &out.report);
            stdout.write_all(text.as_bytes())
        }
    }
    .and_then(|()| stdout.flush());
    closed_pipe_is_fine(r).map_err(|source| RuntimeError::Stdout {
        what: "report",
        source,
    })
}

/// The reader went away (`| head`): what it did not read, it did not want.
fn closed_pipe_is_fine(r: io::Result<()>) -> io::Result<()> {
    match r {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        r => r,
    }
}

/// Save the binary trace; on failure say what is left at `path`.
fn save(trace: &Trace, path: &Path, printed: bool) -> Result<(), RuntimeError> {
    match tracefile::save(trace, path) {
        Ok(()) => Ok(()),
        Err(TraceFileError::Write { source, .. }) => Err(RuntimeError::Lost {
            what: "trace",
            path: path.to_path_buf(),
            source,
            note: left_behind(path, printed, "the report on stdout is complete"),
        }),
        Err(e) => Err(RuntimeError::Save(e)),
    }
}

/// What a failed write left at `path`, and where the report is.
fn left_behind(path: &Path, printed: bool, report: &str) -> String {
    let left = match file::target(path) {
        Ok(Target::Device(_)) => "what reached the device is incomplete",
        _ => "nothing was written there (a file of that name is as it was)",
    };
    if printed {
        format!("{left}; {report}")
    } else {
        left.to_string()
    }
}

fn write_export(fmt: Format, trace: &Trace, w: &mut dyn Write) -> io::Result<()> {
    match fmt {
        Format::Json => export::write_json(trace, w),
        Format::Csv => export::write_csv(trace, w),
        Format::Chrome => export::write_chrome(trace, w),
        Format::Folded => export::write_folded(trace, w),
        Format::Text => unreachable!("the text format is not an export"),
    }
}

fn name(fmt: Format) -> &'static str {
    match fmt {
        Format::Text => "report",
        Format::Json => "JSON output",
        Format::Csv => "CSV output",
        Format::Chrome => "Chrome trace",
        Format::Folded => "folded stacks",
    }
}

/// CSV rows are stored events only, a trace viewer shows what it has, and
/// folded stacks only the calls whose entry and return were stored: say on
/// stderr how many events they miss. (JSON has `dropped`.)
fn note_dropped(fmt: Format, trace: &Trace) {
    let m = &trace.meta;
    if fmt == Format::Folded && !m.graph {
        let _ = writeln!(
            io::stderr(),
            "vmtrace: the folded stacks are empty: this trace has no returns (trace with --graph)"
        );
        return;
    }
    if m.events_dropped + m.returns_dropped == 0
        || !matches!(fmt, Format::Csv | Format::Chrome | Format::Folded)
    {
        return;
    }
    let entries = trace.events.iter().filter(|e| !e.is_return()).count();
    // (Entries only: the wording predates returns, and scripts read it.)
    let returns = if m.returns_dropped > 0 {
        format!(", and {} returns", m.returns_dropped)
    } else {
        String::new()
    };
    let _ = writeln!(
        io::stderr(),
        "vmtrace: the {} holds {entries} of {} events: {}{returns} were counted but not stored (over --max-events, or a full exitless ring){}",
        name(fmt),
        m.events_total,
        m.events_dropped,
        match fmt {
            Format::Chrome => " (its otherData says so too)",
            Format::Folded => "; calls without a stored entry and return are not in it",
            _ => "; the counts in --format json are exact",
        }
    );
}
