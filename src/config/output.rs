//! The output options, checked: how the trace is shown or saved, for a traced
//! run and for `vmtrace report`.

use std::path::PathBuf;

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

/// `vmtrace report -i FILE`, checked.
pub struct ReportConfig {
    pub input: PathBuf,
    pub output: Output,
}

impl ReportConfig {
    pub fn check(args: &ReportArgs) -> Result<ReportConfig, InputError> {
        let output = Output::check(&args.output)?;
        // The text format's -o writes the binary trace, which `report` was given.
        if output.format == Format::Text && output.path.is_some() {
            return Err(InputError::ReportTextOutput);
        }
        Ok(ReportConfig {
            input: args.input.clone(),
            output,
        })
    }
}
