//! What the user sees at the end of a traced run.

use tracer::trace::Trace;

use crate::cli::OutputArgs;
use crate::session::Error;

/// Print the count table (temporary until the report module lands).
pub fn emit(trace: &Trace, _out: &OutputArgs) -> Result<(), Error> {
    let mut rows: Vec<(u64, &str, &Vec<u64>)> = trace
        .functions
        .iter()
        .enumerate()
        .map(|(i, f)| (trace.total(i), f.name.as_str(), &trace.counts[i]))
        .collect();
    rows.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
    println!(
        "# events: {}  dropped: {}",
        trace.meta.events_total, trace.meta.events_dropped
    );
    for (n, name, per_cpu) in rows {
        println!("{n:>12}  {name:<40} {per_cpu:?}");
    }
    Ok(())
}
