//! `vmtrace bench`: measure what tracing costs (see the `bench` module for
//! the methods), print the table, write `--json FILE`.

use std::io::Write as _;
use std::time::Instant;

use tracer::trace::report;

use crate::bench::measure::{
    self, CallCosts, HandlerAlone, PauseFigures, RecordFigures, Scaling, HANDLER_TRAPS, PAUSE_VCPUS,
};
use crate::bench::results::{self, Results};
use crate::bench::{fig, median, swamped};
use crate::cli::BenchArgs;
use crate::config::BenchConfig;
use crate::error::{Error, Outcome, RuntimeError};

pub fn main(args: &BenchArgs) -> Result<Outcome, Error> {
    let cfg = BenchConfig::check(args)?;
    let started = Instant::now();

    // (a)-(c), and the handlers alone.
    let calls = if cfg.counts_only {
        None
    } else {
        Some(call_figures(&cfg)?)
    };
    note!(
        "vmtrace bench: (f) {} rounds of 4 phases (untraced, spin {}, trap, exitless) x {} \
         iterations ({} vCPU, mode=loop)",
        cfg.rounds,
        measure::SPIN,
        cfg.iters,
        cfg.cpus
    );
    let exitless = measure::exitless_costs(&cfg.kernel, cfg.cpus, cfg.iters, cfg.rounds, false)?;

    note!(
        "vmtrace bench: (g) the same 4 phases with return hooks (--graph) x {} iterations",
        cfg.iters
    );
    let graph = measure::exitless_costs(&cfg.kernel, cfg.cpus, cfg.iters, cfg.rounds, true)?;

    let (pauses, scaling, record, report) = if cfg.counts_only {
        note!("vmtrace bench: --counts-only: (a)-(e), (h), (j) and the report figure skipped");
        (Vec::new(), None, None, None)
    } else {
        other_figures(&cfg)?
    };
    let attach_modes = if cfg.counts_only {
        None
    } else {
        note!(
            "vmtrace bench: (j) first attach of every mini guest site, trap and exitless, in {} \
             fresh guests",
            cfg.rounds
        );
        Some(measure::attach_modes(&cfg.kernel, cfg.cpus, cfg.rounds)?)
    };

    // Last, and only when asked for: minutes of Linux boots.
    let ftrace = match &cfg.linux {
        Some(guest) => {
            note!(
                "vmtrace bench: (i) {} boots of {} in each of {} configurations ({}), \
                 interleaved",
                cfg.linux_boots,
                guest.kernel.display(),
                measure::BOOT_CONFIGS.len(),
                measure::BOOT_CONFIGS.map(|c| c.name()).join(", ")
            );
            Some(measure::ftrace_figures(guest, cfg.linux_boots))
        }
        None => {
            note!(
                "vmtrace bench: (i) vmtrace vs. the guest's ftrace skipped (run it with \
                 --linux-boots N: 5 x N boots of the Linux guest)"
            );
            None
        }
    };

    let (costs, a, b, c, calls_not_measured, handlers) = match calls {
        Some(c) => (Some(c.0), c.1, c.2, c.3, c.4, Some(c.5)),
        None => (None, f64::NAN, f64::NAN, f64::NAN, None, None),
    };
    let r = Results {
        costs,
        a,
        b,
        c,
        calls_not_measured,
        handlers,
        exitless,
        graph,
        pauses,
        scaling,
        report,
        record,
        attach_modes,
        ftrace,
    };
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
        return Err(RuntimeError::Measure(format!("(i): {e}")).into());
    }
    Ok(Outcome::Clean)
}

/// (a)-(c) and the handlers alone: the costs, a, b, c (NaN where this
/// host's noise swamped them, never a failure), why, the handlers.
type CallFigures = (CallCosts, f64, f64, f64, Option<String>, HandlerAlone);

fn call_figures(cfg: &BenchConfig) -> Result<CallFigures, Error> {
    note!(
        "vmtrace bench: (a)(b) {} rounds of 3 phases x {} iterations of {} ({} vCPU, mode=loop)",
        cfg.rounds,
        cfg.iters,
        cfg.kernel.display(),
        cfg.cpus
    );
    let costs = measure::call_costs(&cfg.kernel, cfg.cpus, cfg.iters, cfg.rounds)?;
    // Differences of the phases' times: not measured where this host's
    // noise swamped them (said in the table and the JSON).
    let (a, b) = (median(&costs.a), median(&costs.b));
    let e = costs.exits_per_iter;
    let why = swamped(&[("resume-only", a * e), ("recorder", b * e)]);
    let (a, b) = (fig(a), fig(b));
    let c = if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        median(&costs.ratios())
    };
    note!("vmtrace bench: handlers alone, {HANDLER_TRAPS} traps each");
    let handlers = measure::handler_alone(&cfg.kernel)?;
    Ok((costs, a, b, c, why, handlers))
}

/// (d), (e) with loading, (h), and the report figure (seconds to render,
/// to export JSON).
type OtherFigures = (
    Vec<PauseFigures>,
    Option<Scaling>,
    Option<RecordFigures>,
    Option<(f64, f64)>,
);

fn other_figures(cfg: &BenchConfig) -> Result<OtherFigures, Error> {
    let mut pauses = Vec::new();
    for n in PAUSE_VCPUS {
        note!(
            "vmtrace bench: (d) {n} vCPU(s), mode=loop: {} pauses, {} attach/detach cycles",
            cfg.cycles,
            cfg.cycles
        );
        pauses.push(measure::pause_figures(&cfg.kernel, n, cfg.cycles)?);
    }

    let scaling = match &cfg.vmlinux {
        Some(v) => {
            note!(
                "vmtrace bench: (e) attach windows on {} (loaded, not booted)",
                v.display()
            );
            Some(measure::attach_scaling(v)?)
        }
        None => {
            note!(
                "vmtrace bench: (e) and loading skipped: no guest/out/vmlinux \
                 (build it with `bash guest/build.sh linux`, or pass --vmlinux PATH)"
            );
            None
        }
    };

    // Before the report figure: its trace of --report-events events, freed,
    // would leave the allocator more to hand back before (h) reads its RSS.
    note!(
        "vmtrace bench: (h) recording {} events to a data file in {}",
        report::thousands(cfg.record_events),
        std::env::temp_dir().display()
    );
    let record = measure::record_figures(cfg.record_events)?;

    note!(
        "vmtrace bench: report of {} synthetic events",
        report::thousands(cfg.report_events)
    );
    let (render_s, json_s) = measure::report_figures(cfg.report_events)?;
    Ok((pauses, scaling, Some(record), Some((render_s, json_s))))
}
