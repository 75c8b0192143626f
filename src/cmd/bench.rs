//! `vmtrace bench`: list the benches, or measure what tracing costs with
//! those named (see the `bench` module for the methods), print the table,
//! write `--json FILE`.

use std::io::Write as _;
use std::time::Instant;

use crate::bench::{results, run, suite};
use crate::cli::BenchArgs;
use crate::config::BenchConfig;
use crate::error::{Error, Outcome, RuntimeError};

pub fn main(args: &BenchArgs) -> Result<Outcome, Error> {
    if let Some(benches) = BenchConfig::to_list(args)? {
        // A closed stdout loses the list; nothing else to do.
        let _ = write!(std::io::stdout(), "{}", suite::list(&benches));
        return Ok(Outcome::Clean);
    }
    let cfg = BenchConfig::check(args)?;
    let started = Instant::now();
    let r = run::run(&cfg)?;
    let goals = results::goals(&r, &cfg);
    let run = results::Run { cfg: &cfg, started };
    // A closed stdout loses the table, not the run (the JSON is written).
    let _ = write!(std::io::stdout(), "{}", results::table(&r, &goals, &run));
    let _ = std::io::stdout().flush();
    if let Some(path) = &cfg.json {
        let j = results::json(&r, &goals, &run).map_err(RuntimeError::BenchJson)?;
        // Atomically over a regular file, into a device, nothing else.
        tracer::trace::output_path::write(path, |w| w.write_all(j.as_bytes())).map_err(
            |source| RuntimeError::Write {
                path: path.clone(),
                source,
            },
        )?;
    }
    // The table and the JSON say so too; the run did not do what was asked.
    if let Some(Err(e)) = &r.ftrace {
        return Err(RuntimeError::Measure(format!("boot/ftrace (i): {e}")).into());
    }
    Ok(Outcome::Clean)
}
