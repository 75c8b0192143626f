//! `vmtrace script [FILE]`: every stored event of a saved trace on stdout,
//! one line each (`tracer::trace::export::script`), in time order, as `perf
//! script` prints a perf.data.

use tracer::trace::datafile;

use crate::cli::ScriptArgs;
use crate::config::ScriptConfig;
use crate::emit::to_stdout;
use crate::error::{Error, Outcome};

pub fn main(args: &ScriptArgs) -> Result<Outcome, Error> {
    let cfg = ScriptConfig::check(args)?;
    let trace = datafile::load(&cfg.input)?;
    let trace = match &cfg.window {
        Some(w) => tracer::trace::window::restrict(&trace, w),
        None => trace,
    };
    to_stdout("script", |w| {
        tracer::trace::export::script::write_script(&trace, w)
    })?;
    Ok(Outcome::Clean)
}
