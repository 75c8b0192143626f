//! Running the benches a `BenchConfig` selects, in the order they have
//! always run: call/trap, call/exitless, call/graph, call/stack, attach/pause,
//! attach/scaling, record/throughput, report/render, attach/modes, and
//! last boot/ftrace (minutes of Linux boots).

use std::path::Path;

use tracer::plan::entry::EntryChoice;
use tracer::trace::report;

use super::measure::{self, HANDLER_TRAPS, PAUSE_VCPUS};
use super::results::{ftrace, Results};
use super::suite::BenchId;
use super::{fig, median, swamped};
use crate::config::BenchConfig;
use crate::error::{Error, RuntimeError};

/// Every bench `cfg` selects, measured; the others None (or empty).
pub fn run(cfg: &BenchConfig) -> Result<Results, Error> {
    let runs = |id| cfg.benches.runs(id);
    let mut r = Results::default();
    if runs(BenchId::CallTrap) {
        call_figures(cfg, mini(cfg)?, &mut r)?;
    }
    exitless_figures(cfg, &mut r)?;
    if runs(BenchId::CallStack) {
        r.stack = Some(stack_figures(cfg, mini(cfg)?)?);
    }
    if cfg.counts_only {
        note!("vmtrace bench: --counts-only: call/exitless and call/graph alone");
    }
    if runs(BenchId::AttachPause) {
        r.pauses = pause_figures(cfg, mini(cfg)?)?;
    }
    if runs(BenchId::AttachScaling) {
        r.scaling = scaling_figures(cfg)?;
    }
    if runs(BenchId::RecordThroughput) {
        r.record = Some(record_figures(cfg)?);
    }
    if runs(BenchId::ReportRender) {
        note!(
            "vmtrace bench: report/render: report of {} synthetic events",
            report::thousands(cfg.report_events)
        );
        r.report = Some(measure::report_figures(cfg.report_events)?);
    }
    if runs(BenchId::AttachModes) {
        note!(
            "vmtrace bench: attach/modes (j) first attach of every mini guest site, trap and \
             exitless, in {} fresh guests",
            cfg.rounds
        );
        r.attach_modes = Some(measure::attach_modes(mini(cfg)?, cfg.cpus, cfg.rounds)?);
    }
    if runs(BenchId::QemuAttach) {
        let vmlinux = cfg.vmlinux.as_deref().ok_or_else(|| {
            RuntimeError::Measure("(k) needs the Linux guest's vmlinux (--vmlinux)".into())
        })?;
        note!(
            "vmtrace bench: qemu/attach (k) {} rounds on the Linux guest in QEMU (TCG)",
            cfg.rounds
        );
        r.qemu = Some(measure::qemu_figures(vmlinux, cfg.rounds)?);
    }
    if runs(BenchId::QemuDrain) {
        note!(
            "vmtrace bench: qemu/drain draining {} events from rings filled at memory speed to a \
             data file in {}, in a ring device's memory and in the own VMM's",
            report::thousands(cfg.drain_events),
            std::env::temp_dir().display()
        );
        r.drain = Some(measure::drain_figures(cfg.drain_events)?);
    }
    direct_figures(cfg, &mut r)?;
    if let (true, Some(v)) = (runs(BenchId::EventsCost), &cfg.vmlinux) {
        note!(
            "vmtrace bench: events/cost counting {} in {}",
            measure::COSTED_EVENTS,
            v.display()
        );
        r.events = Some(measure::event_costs(v)?);
    }
    r.ftrace = ftrace_figures(cfg);
    Ok(r)
}

/// call/exitless (f) and call/graph (g), those `cfg` selects.
fn exitless_figures(cfg: &BenchConfig, r: &mut Results) -> Result<(), Error> {
    let runs = |id| cfg.benches.runs(id);
    if runs(BenchId::CallExitless) {
        note!(
            "vmtrace bench: call/exitless (f) {} rounds of 4 phases (untraced, spin {}, trap, \
             exitless) x {} iterations ({} vCPU, mode=loop)",
            cfg.rounds,
            measure::SPIN,
            cfg.iters,
            cfg.cpus
        );
        let costs = measure::exitless_costs(
            mini(cfg)?,
            cfg.cpus,
            cfg.iters,
            cfg.rounds,
            false,
            EntryChoice::Ftrace,
        )?;
        r.exitless = Some(costs);
    }
    if runs(BenchId::CallGraph) {
        note!(
            "vmtrace bench: call/graph (g) the same 4 phases with return hooks (--graph) x {} \
             iterations",
            cfg.iters
        );
        let costs = measure::exitless_costs(
            mini(cfg)?,
            cfg.cpus,
            cfg.iters,
            cfg.rounds,
            true,
            EntryChoice::Ftrace,
        )?;
        r.graph = Some(costs);
    }
    Ok(())
}

/// call/direct, attach/direct and sites/direct, those `cfg` selects.
fn direct_figures(cfg: &BenchConfig, r: &mut Results) -> Result<(), Error> {
    let runs = |id| cfg.benches.runs(id);
    if let (true, Some(kernel)) = (runs(BenchId::CallDirect), &cfg.mini_noftrace) {
        note!(
            "vmtrace bench: call/direct {} rounds of 4 phases (untraced, spin {}, trap, exitless) \
             x {} iterations of {}, direct entries",
            cfg.rounds,
            measure::SPIN,
            cfg.iters,
            kernel.display()
        );
        let costs = measure::exitless_costs(
            kernel,
            cfg.cpus,
            cfg.iters,
            cfg.rounds,
            false,
            EntryChoice::Direct,
        )?;
        r.direct = Some(costs);
    }
    let direct_linux = runs(BenchId::AttachDirect) || runs(BenchId::SitesDirect);
    if direct_linux && cfg.vmlinux.is_none() {
        note!(
            "vmtrace bench: attach/direct and sites/direct skipped: no guest/out/vmlinux (build \
             it with `bash guest/build.sh linux`, or pass --vmlinux PATH)"
        );
    }
    if let (true, Some(v)) = (runs(BenchId::AttachDirect), &cfg.direct_vmlinux) {
        note!(
            "vmtrace bench: attach/direct attach windows of direct sites on {} (loaded, not booted)",
            v.display()
        );
        r.direct_attach = Some(measure::attach_direct(v)?);
    }
    if let (true, Some(v)) = (runs(BenchId::SitesDirect), &cfg.vmlinux) {
        note!(
            "vmtrace bench: sites/direct analyzing every function of {}",
            v.display()
        );
        r.direct_sites.push(measure::direct_sites("vmlinux", v)?);
        if let Some(d) = &cfg.distro_kernel {
            note!(
                "vmtrace bench: sites/direct analyzing every function of {}",
                d.display()
            );
            r.direct_sites
                .push(measure::direct_sites("distro kernel", d)?);
        }
    }
    Ok(())
}

/// The mini guest, which the config holds whenever a bench run needs it.
fn mini(cfg: &BenchConfig) -> Result<&Path, Error> {
    cfg.kernel.as_deref().ok_or_else(|| {
        RuntimeError::Measure("no mini guest for a bench that runs on it".into()).into()
    })
}

/// call/stack, and its recorders alone.
fn stack_figures(cfg: &BenchConfig, kernel: &Path) -> Result<measure::StackCosts, Error> {
    note!(
        "vmtrace bench: call/stack {} rounds of 3 phases (untraced, trap, trap --stack {}) x {} \
         iterations ({} vCPU, {})",
        cfg.rounds,
        measure::STACK_FUNC,
        cfg.iters,
        cfg.cpus,
        measure::STACK_CMDLINE
    );
    let mut costs = measure::stack_costs(kernel, cfg.cpus, cfg.iters, cfg.rounds)?;
    note!("vmtrace bench: call/stack recorders alone, {HANDLER_TRAPS} traps each");
    costs.alone = Some(measure::stack_alone(kernel)?);
    Ok(costs)
}

/// call/trap, (a)-(c), and the handlers alone, into `r`: a, b, c are NaN
/// where this host's noise swamped them (never a failure), and
/// `calls_not_measured` says why.
fn call_figures(cfg: &BenchConfig, kernel: &Path, r: &mut Results) -> Result<(), Error> {
    note!(
        "vmtrace bench: call/trap (a)(b) {} rounds of 3 phases x {} iterations of {} ({} vCPU, \
         mode=loop)",
        cfg.rounds,
        cfg.iters,
        kernel.display(),
        cfg.cpus
    );
    let costs = measure::call_costs(kernel, cfg.cpus, cfg.iters, cfg.rounds)?;
    // Differences of the phases' times: not measured where this host's
    // noise swamped them (said in the table and the JSON).
    let (a, b) = (median(&costs.a), median(&costs.b));
    let e = costs.exits_per_iter;
    r.calls_not_measured = swamped(&[("resume-only", a * e), ("recorder", b * e)]);
    (r.a, r.b) = (fig(a), fig(b));
    r.c = if r.a.is_nan() || r.b.is_nan() {
        f64::NAN
    } else {
        median(&costs.ratios())
    };
    r.costs = Some(costs);
    note!("vmtrace bench: handlers alone, {HANDLER_TRAPS} traps each");
    r.handlers = Some(measure::handler_alone(kernel)?);
    Ok(())
}

/// attach/pause, (d): 1, 2 and 4 vCPUs.
fn pause_figures(cfg: &BenchConfig, kernel: &Path) -> Result<Vec<measure::PauseFigures>, Error> {
    let mut pauses = Vec::new();
    for n in PAUSE_VCPUS {
        note!(
            "vmtrace bench: attach/pause (d) {n} vCPU(s), mode=loop: {} pauses, {} \
             attach/detach cycles",
            cfg.cycles,
            cfg.cycles
        );
        pauses.push(measure::pause_figures(kernel, n, cfg.cycles)?);
    }
    Ok(pauses)
}

/// attach/scaling, (e) and loading: skipped without a vmlinux (in the
/// default set; named, the config has one).
fn scaling_figures(cfg: &BenchConfig) -> Result<Option<measure::Scaling>, Error> {
    match &cfg.vmlinux {
        Some(v) => {
            note!(
                "vmtrace bench: attach/scaling (e) attach windows on {} (loaded, not booted)",
                v.display()
            );
            Ok(Some(measure::attach_scaling(v)?))
        }
        None => {
            note!(
                "vmtrace bench: attach/scaling (e) and loading skipped: no guest/out/vmlinux \
                 (build it with `bash guest/build.sh linux`, or pass --vmlinux PATH)"
            );
            Ok(None)
        }
    }
}

/// record/throughput, (h). Before report/render: its trace of
/// --report-events events, freed, would leave the allocator more to hand
/// back before (h) reads its RSS.
fn record_figures(cfg: &BenchConfig) -> Result<measure::RecordFigures, Error> {
    note!(
        "vmtrace bench: record/throughput (h) recording {} events to a data file in {}",
        report::thousands(cfg.record_events),
        std::env::temp_dir().display()
    );
    measure::record_figures(cfg.record_events)
}

/// boot/ftrace, (i): last, and only when asked for (minutes of Linux
/// boots); a failure is a result, said in the table and the JSON.
fn ftrace_figures(cfg: &BenchConfig) -> ftrace::Measured {
    match (&cfg.linux, cfg.benches.runs(BenchId::BootFtrace)) {
        (Some(guest), true) => {
            note!(
                "vmtrace bench: boot/ftrace (i) {} boots of {} in each of {} configurations \
                 ({}), interleaved",
                cfg.linux_boots,
                guest.kernel.display(),
                measure::BOOT_CONFIGS.len(),
                measure::BOOT_CONFIGS.map(|c| c.name()).join(", ")
            );
            Some(measure::ftrace_figures(guest, cfg.linux_boots))
        }
        _ => {
            if !cfg.benches.named {
                note!(
                    "vmtrace bench: boot/ftrace (i), vmtrace vs. the guest's ftrace, skipped \
                     (run it with --linux-boots N: 5 x N boots of the Linux guest)"
                );
            }
            None
        }
    }
}
