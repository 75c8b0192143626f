//! `vmtrace report` and `vmtrace script`, checked: the saved trace to read
//! (`FILE`, `-i FILE` or vmtrace.data here), the view, the exports.

use std::path::{Path, PathBuf};

use tracer::trace::export::script_fields::ScriptField;
use tracer::trace::filter::TraceFilter;
use tracer::trace::model::Trace;
use tracer::trace::window::Window;

use super::output::{self, Export, Output, View};
use crate::cli::{FieldArg, InputArgs, ReportArgs, ScriptArgs, ShownArgs, DEFAULT_DATA};
use crate::error::InputError;

/// `vmtrace report`, checked.
pub struct ReportConfig {
    pub input: PathBuf,
    /// `--comm`, `--pid`, `--tid`, `--sym`: the events every view shows.
    pub shown: Shown,
    /// The view on stdout and the exports, each of the part of the trace
    /// `--time`/`--cpu` asked for; no data file.
    pub output: Output,
}

impl ReportConfig {
    /// The options first, cheapest first, then the input: a bad option is
    /// said even when the file is missing too.
    pub fn check(args: &ReportArgs) -> Result<ReportConfig, InputError> {
        if args.output.is_some() {
            return Err(InputError::ReportOutput);
        }
        let shown = Shown::check(&args.shown)?;
        let view = View::check(&args.view)?;
        let export_window = view.asked.clone();
        let exports: Vec<Export> = args
            .export
            .iter()
            .map(|a| {
                output::check_path(&a.path, "--export")?;
                Ok(Export {
                    format: a.format,
                    path: a.path.clone(),
                })
            })
            .collect::<Result<_, InputError>>()?;
        let output = Output {
            view: Some(view),
            data: None,
            exports,
            export_window,
            quiet: true,
        };
        let input = input(&args.input)?;
        let mut files = output.files();
        // Converting a file must not write over it.
        files.insert(0, ("the input".to_string(), input.as_path()));
        output::distinct(&files)?;
        Ok(ReportConfig {
            input,
            shown,
            output,
        })
    }
}

/// `vmtrace script`, checked.
pub struct ScriptConfig {
    pub input: PathBuf,
    pub window: Option<Window>,
    pub shown: Shown,
    /// `-F`: the fields of each line, in order; empty: the whole line.
    pub fields: Vec<FieldArg>,
}

impl ScriptConfig {
    pub fn check(args: &ScriptArgs) -> Result<ScriptConfig, InputError> {
        let window = output::window(&args.window)?;
        let shown = Shown::check(&args.shown)?;
        Ok(ScriptConfig {
            input: input(&args.input)?,
            window,
            shown,
            fields: args.fields.fields.clone(),
        })
    }

    /// The `-F` fields, once `trace` (read from `input`) has each.
    pub fn fields_of(&self, trace: &Trace) -> Result<Vec<ScriptField>, InputError> {
        self.fields
            .iter()
            .map(|&f| {
                f.field()
                    .check(trace)
                    .map(|()| f.field())
                    .map_err(|missing| InputError::FieldMissing {
                        field: f.name(),
                        path: self.input.clone(),
                        missing,
                    })
            })
            .collect()
    }
}

/// The filters after recording, checked.
pub struct Shown {
    filter: TraceFilter,
    /// The filters as given (`--comm sh* --tid 7`), for the header.
    label: String,
    /// The task filters given, for the error of a trace without tasks.
    task_flags: Vec<&'static str>,
}

impl Shown {
    fn check(args: &ShownArgs) -> Result<Shown, InputError> {
        // Only globs can be wrong before the trace is read (no path yet).
        let filter = TraceFilter::new(&args.comm, &args.pid, &args.tid, &args.sym)
            .map_err(|e| InputError::shown(e, &[], Path::new("")))?;
        let ids = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        let mut label: Vec<String> = args.comm.iter().map(|g| format!("--comm {g}")).collect();
        let mut task_flags = Vec::new();
        for (flag, given) in [("--pid", &args.pid), ("--tid", &args.tid)] {
            if !given.is_empty() {
                label.push(format!("{flag} {}", ids(given)));
                task_flags.push(flag);
            }
        }
        if !args.comm.is_empty() {
            task_flags.insert(0, "--comm");
        }
        label.extend(args.sym.iter().map(|g| format!("--sym {g}")));
        Ok(Shown {
            filter,
            label: label.join(" "),
            task_flags,
        })
    }

    /// The part of `trace` (read from `path`) the filters keep: the trace
    /// itself when none was given.
    pub fn apply(&self, trace: Trace, path: &Path) -> Result<Trace, InputError> {
        if !self.filter.is_active() {
            return Ok(trace);
        }
        self.filter
            .apply(&trace, &self.label)
            .map_err(|e| InputError::shown(e, &self.task_flags, path))
    }
}

/// The trace to read: `FILE`, `-i FILE`, or vmtrace.data here, which must
/// then exist (a named file's problems are said when it is loaded).
fn input(args: &InputArgs) -> Result<PathBuf, InputError> {
    if let Some(p) = args.file.as_ref().or(args.input.as_ref()) {
        return Ok(p.clone());
    }
    let default = Path::new(DEFAULT_DATA);
    if std::fs::symlink_metadata(default).is_err() {
        return Err(InputError::NoDataFile(default.to_path_buf()));
    }
    Ok(default.to_path_buf())
}
