//! `vmtrace report [FILE]`: the report of a saved trace on stdout, in any
//! `--format`, and its exports, each of the part `--time`/`--cpu` select,
//! of the events `--comm`/`--pid`/`--tid`/`--sym` keep.

use tracer::trace::datafile;

use crate::cli::ReportArgs;
use crate::config::ReportConfig;
use crate::emit::emit;
use crate::error::{Error, InputError, Outcome};

pub fn main(args: &ReportArgs) -> Result<Outcome, Error> {
    let cfg = ReportConfig::check(args)?;
    let trace = datafile::load(&cfg.input)?;
    crate::recorded::say_on_terminal(&cfg.input, &trace.meta);
    // Folded stacks of an entry-only trace are its entries' kernel stacks
    // (`--stack`): only a trace with neither returns nor stacks has none.
    let folds_stacks = |what: &&str| what.contains("folded") && !trace.stacks.is_empty();
    if let Some(what) = cfg
        .output
        .graph_view()
        .filter(|w| !trace.meta.graph && !folds_stacks(w))
    {
        return Err(InputError::NoGraph {
            what,
            path: cfg.input.clone(),
        }
        .into());
    }
    let trace = cfg.shown.apply(trace, &cfg.input)?;
    emit(&trace, &cfg.output, None)?;
    Ok(Outcome::Clean)
}
