//! What the user sees at the end of a traced run, and `vmtrace report`.

use std::fs::File;
use std::io::{BufWriter, Write};

use tracer::model::Trace;
use tracer::report::{self, ReportOptions, Sort};
use tracer::{export, tracefile};

use crate::cli::{Format, OutputArgs, ReportArgs, SortKey};
use crate::session::{Error, Outcome};

fn options(out: &OutputArgs) -> Result<ReportOptions, Error> {
    let cpus = match &out.cpu {
        Some(list) => {
            Some(report::parse_cpu_list(list).map_err(|e| Error::Input(format!("--cpu: {e}")))?)
        }
        None => None,
    };
    Ok(ReportOptions {
        sort: match out.sort {
            SortKey::Count => Sort::Count,
            SortKey::Name => Sort::Name,
            SortKey::Cpu => Sort::Cpu,
        },
        cpus,
        callers: out.callers,
        ..ReportOptions::default()
    })
}

/// Check the output options before the guest boots, so a typo costs nothing.
pub fn validate(out: &OutputArgs) -> Result<(), Error> {
    options(out).map(|_| ())
}

/// Print the report, or write the chosen export / the saved trace.
pub fn emit(trace: &Trace, out: &OutputArgs) -> Result<(), Error> {
    let opts = options(out)?;
    let io = |path: &std::path::Path| {
        let p = path.display().to_string();
        move |e: std::io::Error| Error::Runtime(format!("cannot write {p}: {e}"))
    };
    match (out.format, &out.output) {
        (Format::Text, None) => print!("{}", report::render(trace, &opts)),
        (Format::Text, Some(path)) => {
            tracefile::save(trace, path).map_err(|e| Error::Runtime(e.to_string()))?;
            print!("{}", report::render(trace, &opts));
            eprintln!(
                "vmtrace: trace saved to {} (read it with: vmtrace report -i {})",
                path.display(),
                path.display()
            );
        }
        (fmt, path) => {
            let sink: Box<dyn Write> = match path {
                Some(p) => Box::new(File::create(p).map_err(io(p))?),
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
                .map_err(|e| Error::Runtime(format!("cannot write the {fmt:?} output: {e}")))?;
        }
    }
    Ok(())
}

/// `vmtrace report -i FILE`.
pub fn report_command(args: &ReportArgs) -> Result<Outcome, Error> {
    validate(&args.output)?;
    let trace = tracefile::load(&args.input).map_err(|e| Error::Input(e.to_string()))?;
    if args.output.format == Format::Text && args.output.output.is_some() {
        return Err(Error::Input(
            "vmtrace report -o needs --format json, csv or chrome".into(),
        ));
    }
    emit(&trace, &args.output)?;
    Ok(Outcome::Clean)
}
