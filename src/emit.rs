//! What the user gets at the end of a traced run or `vmtrace report`: the
//! text report, an export, or the saved trace.

use std::fs::File;
use std::io::{BufWriter, Write};

use tracer::model::Trace;
use tracer::{export, report, tracefile};

use crate::cli::Format;
use crate::config::Output;
use crate::error::RuntimeError;

/// Print the report, or write the chosen export / the saved trace.
pub fn emit(trace: &Trace, out: &Output) -> Result<(), RuntimeError> {
    match (out.format, &out.path) {
        (Format::Text, None) => print!("{}", report::render(trace, &out.report)),
        (Format::Text, Some(path)) => {
            tracefile::save(trace, path).map_err(RuntimeError::Save)?;
            print!("{}", report::render(trace, &out.report));
            eprintln!(
                "vmtrace: trace saved to {} (read it with: vmtrace report -i {})",
                path.display(),
                path.display()
            );
        }
        (fmt, path) => {
            let sink: Box<dyn Write> = match path {
                Some(p) => Box::new(File::create(p).map_err(|source| RuntimeError::Write {
                    path: p.clone(),
                    source,
                })?),
                None => Box::new(std::io::stdout().lock()),
            };
            let mut w = BufWriter::new(sink);
            let r = match fmt {
                Format::Json => export::write_json(trace, &mut w),
                Format::Csv => export::write_csv(trace, &mut w),
                Format::Chrome => export::write_chrome(trace, &mut w),
                Format::Text => unreachable!("handled above"),
            };
            r.and_then(|()| w.flush())
                .map_err(|source| RuntimeError::Export {
                    format: format!("{fmt:?}"),
                    source,
                })?;
        }
    }
    Ok(())
}
