//! `vmtrace bench`: what tracing costs, measured side by side in one run.

use crate::cli::BenchArgs;
use crate::session::{Error, Outcome};

pub fn run(_args: &BenchArgs) -> Result<Outcome, Error> {
    Err(Error::Input("vmtrace bench is being written".into()))
}
