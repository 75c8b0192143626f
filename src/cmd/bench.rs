//! `vmtrace bench`: measure what tracing costs (see the `bench` module for
//! the methods), print the table, write `--json FILE`.

use std::io::Write as _;
use std::time::Instant;

use tracer::report;

use crate::bench::measure::{self, HANDLER_TRAPS, PAUSE_VCPUS};
use crate::bench::median;
use crate::bench::results::{self, Results};
use crate::cli::BenchArgs;
use crate::config::BenchConfig;
use crate::error::{Error, Outcome, RuntimeError};

pub fn main(args: &BenchArgs) -> Result<Outcome, Error> {
    let cfg = BenchConfig::check(args)?;
    let started = Instant::now();

    note!(
        "vmtrace bench: (a)(b) {} rounds of 3 phases x {} iterations of {} ({} vCPU, mode=loop)",
        cfg.rounds,
        cfg.iters,
        cfg.kernel.display(),
        cfg.cpus
    );
    let costs = measure::call_costs(&cfg.kernel, cfg.cpus, cfg.iters, cfg.rounds)?;
    let a = median(&costs.a);
    let b = median(&costs.b);
    let c = median(&costs.ratios());
    if !(a > 0.0 && b > 0.0 && c > 0.0) {
        return Err(RuntimeError::Measure(format!(
            "traced phases were not slower than untraced ones (a = {a:.2} µs, b = {b:.2} µs): \
             the phases are too short for this host's noise; raise --iters or --rounds"
        ))
        .into());
    }
    note!("vmtrace bench: handlers alone, {HANDLER_TRAPS} traps each");
    let handlers = measure::handler_alone(&cfg.kernel)?;

    note!(
        "vmtrace bench: (f) {} rounds of 4 phases (untraced, spin {}, trap, exitless) x {} \
         iterations ({} vCPU, mode=loop)",
        cfg.rounds,
        measure::SPIN,
        cfg.iters,
        cfg.cpus
    );
    let exitless = measure::exitless_costs(&cfg.kernel, cfg.cpus, cfg.iters, cfg.rounds, false)?;
    let (t_insn, ex) = (
        median(&exitless.us_per_insn()),
        median(&exitless.exitless_us()),
    );
    if !(t_insn > 0.0 && ex > 0.0) {
        return Err(RuntimeError::Measure(format!(
            "(f): the spin or exitless phases were not slower than untraced ones ({t_insn:.3} µs \
             per instruction, {ex:.2} µs per exitless call): the phases are too short for this \
             host's noise; raise --iters or --rounds"
        ))
        .into());
    }

    note!(
        "vmtrace bench: (g) the same 4 phases with return hooks (--graph) x {} iterations",
        cfg.iters
    );
    let graph = measure::exitless_costs(&cfg.kernel, cfg.cpus, cfg.iters, cfg.rounds, true)?;

    let mut pauses = Vec::new();
    for n in PAUSE_VCPUS {
        note!(
            "vmtrace bench: (d) {n} vCPU(s), mode=loop: {} pauses, {} attach/detach cycles",
            cfg.cycles,
            cfg.cycles
        );
        pauses.push(measure::pause_figures(&cfg.kernel, n, cfg.cycles)?);
    }

    note!(
        "vmtrace bench: (j) first attach of every mini guest site, trap and exitless, in {} \
         fresh guests",
        cfg.rounds
    );
    let attach_modes = measure::attach_modes(&cfg.kernel, cfg.cpus, cfg.rounds)?;

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

    let r = Results {
        costs,
        a,
        b,
        c,
        handlers,
        exitless,
        graph,
        pauses,
        scaling,
        render_s,
        json_s,
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
        tracer::export::file::write(path, |w| w.write_all(j.as_bytes())).map_err(|source| {
            RuntimeError::Write {
                path: path.clone(),
                source,
            }
        })?;
    }
    // The table and the JSON say so too; the run did not do what was asked.
    if let Some(Err(e)) = &r.ftrace {
        return Err(RuntimeError::Measure(format!("(i): {e}")).into());
    }
    Ok(Outcome::Clean)
}
