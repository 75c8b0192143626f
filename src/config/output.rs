//! The output options, checked: how the trace is shown or saved, for a traced
//! run and for `vmtrace report`.

use std::path::{Path, PathBuf};

use tracer::export::file;
use tracer::report::{self, ReportOptions, Sort, TreeOptions};

use crate::cli::{Format, OutputArgs, ReportArgs, SortKey};
use crate::error::InputError;

/// How the trace is shown or saved.
#[derive(Clone, Debug)]
pub struct Output {
    pub format: Format,
    /// `-o FILE`: the export, or with the text format the binary trace.
    pub path: Option<PathBuf>,
    pub report: ReportOptions,
    /// `--tree`: the call tree instead of the text report.
    pub tree: Option<TreeOptions>,
    /// No live status line.
    pub quiet: bool,
}

impl Output {
    pub fn check(args: &OutputArgs) -> Result<Output, InputError> {
        let cpus = match &args.cpu {
            Some(list) => Some(report::parse_cpu_list(list).map_err(InputError::CpuList)?),
            None => None,
        };
        let threshold_ns = match &args.threshold {
            Some(t) => Some(report::duration::parse(t).map_err(InputError::Threshold)?),
            None => None,
        };
        if !args.tree {
            if args.depth.is_some() {
                return Err(InputError::NeedsTree { flag: "--depth" });
            }
            if threshold_ns.is_some() {
                return Err(InputError::NeedsTree {
                    flag: "--threshold",
                });
            }
        } else if args.format != Format::Text {
            return Err(InputError::TreeFormat {
                format: format_name(args.format),
            });
        }
        let tree = args.tree.then(|| TreeOptions {
            cpus: cpus.clone(),
            depth: args.depth,
            threshold_ns: threshold_ns.unwrap_or(0),
        });
        if let Some(path) = &args.output {
            check_path(path)?;
        }
        Ok(Output {
            format: args.format,
            path: args.output.clone(),
            report: ReportOptions {
                sort: match args.sort {
                    SortKey::Count => Sort::Count,
                    SortKey::Name => Sort::Name,
                    SortKey::Cpu => Sort::Cpu,
                    SortKey::Total => Sort::Total,
                    SortKey::SelfTime => Sort::SelfTime,
                    SortKey::Avg => Sort::Avg,
                    SortKey::Max => Sort::Max,
                },
                cpus,
                callers: args.callers,
                ..ReportOptions::default()
            },
            tree,
            quiet: args.quiet,
        })
    }

    /// The view asked for that only a function-graph trace has (`--tree`,
    /// `--format folded`), if any: a run without `--graph`, or a saved
    /// trace without returns, cannot show it.
    pub fn graph_view(&self) -> Option<&'static str> {
        if self.tree.is_some() {
            Some("--tree")
        } else if self.format == Format::Folded {
            Some("--format folded")
        } else {
            None
        }
    }
}

/// The `--format` value as typed.
fn format_name(f: Format) -> &'static str {
    match f {
        Format::Text => "text",
        Format::Json => "json",
        Format::Csv => "csv",
        Format::Chrome => "chrome",
        Format::Folded => "folded",
    }
}

/// `-o FILE`, before anything runs: a path `tracer::export::file` will
/// write (a new or regular file, replaced atomically, or a character device
/// written into; a symlink followed; never a directory, FIFO, socket or
/// block device), in a writable directory with room for a start.
fn check_path(path: &Path) -> Result<(), InputError> {
    file::check(path)
        .map(|_| ())
        .map_err(|source| InputError::Output {
            flag: "-o",
            path: path.to_path_buf(),
            source,
        })
}

/// `vmtrace report -i FILE`, checked.
pub struct ReportConfig {
    pub input: PathBuf,
    pub output: Output,
}

impl ReportConfig {
    pub fn check(args: &ReportArgs) -> Result<ReportConfig, InputError> {
        // The text format's -o writes the binary trace, which `report` was given.
        if args.output.format == Format::Text && args.output.output.is_some() {
            return Err(InputError::ReportTextOutput);
        }
        let output = Output::check(&args.output)?;
        Ok(ReportConfig {
            input: args.input.clone(),
            output,
        })
    }
}
