//! `vmtrace report -i FILE`: the report of a saved trace, or an export of it.

use tracer::tracefile;

use crate::cli::ReportArgs;
use crate::config::ReportConfig;
use crate::emit::emit;
use crate::error::{Error, Outcome};

pub fn main(args: &ReportArgs) -> Result<Outcome, Error> {
    let cfg = ReportConfig::check(args)?;
    let trace = tracefile::load(&cfg.input)?;
    emit(&trace, &cfg.output)?;
    Ok(Outcome::Clean)
}
