//! `vmtrace script [FILE]`: every stored event of a saved trace on stdout,
//! one line each (`tracer::trace::export::script`; with `-F` the fields
//! asked for, `script_fields`), in time order, as `perf script` prints a
//! perf.data; `--comm`/`--pid`/`--tid`/`--sym` keep some events.

use tracer::trace::datafile;

use crate::cli::ScriptArgs;
use crate::config::ScriptConfig;
use crate::emit::to_stdout;
use crate::error::{Error, Outcome};

pub fn main(args: &ScriptArgs) -> Result<Outcome, Error> {
    let cfg = ScriptConfig::check(args)?;
    let trace = datafile::load(&cfg.input)?;
    crate::recorded::say_on_terminal(&cfg.input, &trace.meta);
    let fields = cfg.fields_of(&trace)?;
    let trace = cfg.shown.apply(trace, &cfg.input)?;
    let trace = match &cfg.window {
        Some(w) => tracer::trace::window::restrict(&trace, w),
        None => trace,
    };
    to_stdout("script", |w| match fields.is_empty() {
        true => tracer::trace::export::script::write_script(&trace, w),
        false => tracer::trace::export::script_fields::write_script_fields(&trace, &fields, w),
    })?;
    Ok(Outcome::Clean)
}
