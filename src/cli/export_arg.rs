//! `--export FMT=FILE`: which formats, and how the argument is read.

use std::path::PathBuf;

/// `--export FMT=FILE`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportArg {
    pub format: ExportFormat,
    pub path: PathBuf,
}

/// What `--export` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExportFormat {
    Json,
    Csv,
    Chrome,
    Folded,
    /// trace-cmd's trace.dat, for KernelShark and `trace-cmd report`.
    TraceDat,
}

impl ExportFormat {
    pub const ALL: [ExportFormat; 5] = [
        ExportFormat::Json,
        ExportFormat::Csv,
        ExportFormat::Chrome,
        ExportFormat::Folded,
        ExportFormat::TraceDat,
    ];

    /// As typed in `--export FMT=FILE`.
    pub fn name(self) -> &'static str {
        match self {
            ExportFormat::Json => "json",
            ExportFormat::Csv => "csv",
            ExportFormat::Chrome => "chrome",
            ExportFormat::Folded => "folded",
            ExportFormat::TraceDat => "trace.dat",
        }
    }
}

/// `FMT=FILE`, e.g. `json=trace.json`.
pub(super) fn parse_export(s: &str) -> Result<ExportArg, String> {
    let formats = ExportFormat::ALL.map(ExportFormat::name).join(", ");
    let Some((fmt, path)) = s.split_once('=') else {
        return Err(format!(
            "expected FMT=FILE (e.g. json=trace.json); FMT is one of {formats}"
        ));
    };
    let format = ExportFormat::ALL
        .into_iter()
        .find(|f| f.name() == fmt)
        .ok_or_else(|| format!("unknown format '{fmt}'; use one of {formats}"))?;
    if path.is_empty() {
        return Err(format!("no FILE after '{fmt}='"));
    }
    Ok(ExportArg {
        format,
        path: PathBuf::from(path),
    })
}
