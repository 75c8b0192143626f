//! `vmtrace report` and `vmtrace script`, checked: the saved trace to read
//! (`FILE`, `-i FILE` or vmtrace.data here), the view, the exports.

use std::path::{Path, PathBuf};

use tracer::trace::window::Window;

use super::output::{self, Export, Output, View};
use crate::cli::{InputArgs, ReportArgs, ScriptArgs, DEFAULT_DATA};
use crate::error::InputError;

/// `vmtrace report`, checked.
pub struct ReportConfig {
    pub input: PathBuf,
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
        Ok(ReportConfig { input, output })
    }
}

/// `vmtrace script`, checked.
pub struct ScriptConfig {
    pub input: PathBuf,
    pub window: Option<Window>,
}

impl ScriptConfig {
    pub fn check(args: &ScriptArgs) -> Result<ScriptConfig, InputError> {
        let window = output::window(&args.window)?;
        Ok(ScriptConfig {
            input: input(&args.input)?,
            window,
        })
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
