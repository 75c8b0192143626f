//! The output options, checked: how the trace is shown or saved, for a traced
//! run and for `vmtrace report`.

use std::path::{Path, PathBuf};

use tracer::export::file;
use tracer::report::{self, ReportOptions, Sort};

use crate::cli::{Format, OutputArgs, ReportArgs, SortKey};
use crate::error::InputError;

/// How the trace is shown or saved.
#[derive(Clone, Debug)]
pub struct Output {
    pub format: Format,
    /// `-o FILE`: the export, or with the text format the binary trace.
    pub path: Option<PathBuf>,
    pub report: ReportOptions,
    /// No live status line.
    pub quiet: bool,
}

impl Output {
    pub fn check(args: &OutputArgs) -> Result<Output, InputError> {
        let cpus = match &args.cpu {
            Some(list) => Some(report::parse_cpu_list(list).map_err(InputError::CpuList)?),
            None => None,
        };
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
                },
                cpus,
                callers: args.callers,
                ..ReportOptions::default()
            },
            quiet: args.quiet,
        })
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
