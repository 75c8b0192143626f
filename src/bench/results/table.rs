//! The printed table: per bench its section (headed by its name and the
//! question it answers), then the goals' verdicts and the methods.

use std::fmt::{self, Write as _};
use std::path::Path;

use tracer::trace::report;

use super::super::measure::{PauseFigures, Scaling, E_REPS};
use super::super::suite::{bench, BenchId};
use super::exitless::{num, num_us};
use super::methods::methods_shown;
use super::{
    attach_modes, direct, drain, exitless, ftrace, max, min, qemu, record, stack, Goal, Results,
    Run, COUNTS_ONLY,
};
use crate::bench::{median, pct};
use crate::config::BenchConfig;

/// The printed report.
pub fn table(r: &Results, goals: &[Goal], run: &Run<'_>) -> String {
    let mut o = String::new();
    // Writing to a String cannot fail.
    let _ = write_table(&mut o, r, goals, run);
    o
}

fn write_table(o: &mut String, r: &Results, goals: &[Goal], run: &Run<'_>) -> fmt::Result {
    let cfg = run.cfg;
    match &cfg.kernel {
        Some(k) => writeln!(o, "vmtrace bench: mini guest {}", k.display())?,
        None => writeln!(o, "vmtrace bench: no mini guest needed")?,
    }
    if cfg.benches.named {
        let names: Vec<&str> = cfg.benches.ids.iter().map(|&id| bench(id).name).collect();
        writeln!(o, "benches: {}", names.join(", "))?;
    }
    if vmm::host::emulates_ring0() {
        writeln!(
            o,
            "host: KVM emulates guest ring 0 here (kvm_pvm): absolute times are several times \
             bare metal; compare ratios"
        )?;
    }
    writeln!(o)?;
    for id in TABLE_ORDER {
        if cfg.benches.shows(id) {
            let b = bench(id);
            writeln!(o, "# {}: {}", b.name, b.goal)?;
            write_bench(o, id, r, cfg)?;
            writeln!(o)?;
        }
    }
    writeln!(o, "goals:")?;
    for g in goals {
        let why = match &g.pass {
            Err(w) => format!(" (not judged: {w})"),
            Ok(_) => String::new(),
        };
        writeln!(o, "  {}  {:<48} {}{why}", g.status(), g.name, g.measured)?;
    }
    writeln!(o)?;
    writeln!(o, "methods:")?;
    for (k, m) in methods_shown(cfg) {
        writeln!(o, "  {k:<7} {m}")?;
    }
    writeln!(o)?;
    writeln!(
        o,
        "vmtrace bench took {:.1} s",
        run.started.elapsed().as_secs_f64()
    )
}

/// The order the benches' sections have always been printed in.
const TABLE_ORDER: [BenchId; 16] = [
    BenchId::CallTrap,
    BenchId::AttachPause,
    BenchId::AttachScaling,
    BenchId::CallExitless,
    BenchId::CallGraph,
    BenchId::CallStack,
    BenchId::ReportRender,
    BenchId::RecordThroughput,
    BenchId::AttachModes,
    BenchId::BootFtrace,
    BenchId::QemuAttach,
    BenchId::QemuDrain,
    BenchId::CallDirect,
    BenchId::AttachDirect,
    BenchId::SitesDirect,
    BenchId::EventsCost,
];

/// One bench's section: its figures, or not measured, and why.
// Long: one arm per bench, each a call or its not-measured line.
fn write_bench(o: &mut String, id: BenchId, r: &Results, cfg: &BenchConfig) -> fmt::Result {
    match id {
        BenchId::CallTrap => match &r.costs {
            Some(_) => write_calls(o, r, cfg),
            None => writeln!(o, "(a)-(c) per traced call: NOT MEASURED, {COUNTS_ONLY}"),
        },
        BenchId::AttachPause => match r.pauses.is_empty() {
            false => write_pauses(o, &r.pauses, cfg),
            true => writeln!(o, "(d) pause: NOT MEASURED, {COUNTS_ONLY}"),
        },
        BenchId::AttachScaling => match (&r.scaling, &cfg.vmlinux) {
            (Some(s), Some(v)) => write_scaling(o, s, v),
            _ if cfg.counts_only => writeln!(o, "(e) and loading: NOT MEASURED, {COUNTS_ONLY}"),
            _ => writeln!(
                o,
                "(e) and loading: NOT MEASURED, no vmlinux (build it with `bash guest/build.sh \
                 linux`, or pass --vmlinux PATH)"
            ),
        },
        BenchId::CallExitless => match &r.exitless {
            Some(c) => exitless::write(o, c, cfg),
            None => writeln!(o, "(f) exitless vs. trap: NOT MEASURED"),
        },
        BenchId::CallGraph => match &r.graph {
            Some(g) => exitless::write_graph(o, g, r.exitless.as_ref(), cfg),
            None => writeln!(o, "(g) function graph: NOT MEASURED"),
        },
        BenchId::CallStack => match &r.stack {
            Some(c) => stack::write(o, c, cfg),
            None => writeln!(o, "call/stack: NOT MEASURED, {COUNTS_ONLY}"),
        },
        BenchId::ReportRender => match r.report {
            Some((render, json)) => writeln!(
                o,
                "report: {} events, text with callers {render:.3} s; JSON export {json:.3} s",
                report::thousands(cfg.report_events),
            ),
            None => writeln!(o, "report: NOT MEASURED, {COUNTS_ONLY}"),
        },
        BenchId::RecordThroughput => match &r.record {
            Some(rec) => record::write(o, rec),
            None => writeln!(o, "(h) recording to disk: NOT MEASURED, {COUNTS_ONLY}"),
        },
        BenchId::AttachModes => match &r.attach_modes {
            Some(am) => attach_modes::write(o, am),
            None => writeln!(o, "(j) attach pause by mode: NOT MEASURED, {COUNTS_ONLY}"),
        },
        BenchId::BootFtrace => ftrace::write(o, &r.ftrace),
        BenchId::QemuAttach => match &r.qemu {
            Some(q) => qemu::write(o, q),
            None => writeln!(
                o,
                "(k) vmtrace attach on QEMU: NOT MEASURED, not asked for (vmtrace bench qemu)"
            ),
        },
        BenchId::QemuDrain => match &r.drain {
            Some(d) => drain::write(o, d),
            None => writeln!(
                o,
                "qemu/drain: NOT MEASURED, not asked for (vmtrace bench qemu/drain)"
            ),
        },
        BenchId::CallDirect => match &r.direct {
            Some(d) => direct::write_call(o, d, r.exitless.as_ref(), cfg),
            None => writeln!(o, "call/direct: NOT MEASURED, {}", direct_not_run(id, cfg)),
        },
        BenchId::AttachDirect => match &r.direct_attach {
            Some(a) => direct::write_attach(o, a),
            None => writeln!(
                o,
                "attach/direct: NOT MEASURED, {}",
                direct_not_run(id, cfg)
            ),
        },
        BenchId::SitesDirect => match r.direct_sites.is_empty() {
            false => direct::write_sites(o, &r.direct_sites, cfg),
            true => writeln!(o, "sites/direct: NOT MEASURED, {}", direct_not_run(id, cfg)),
        },
        BenchId::EventsCost => match &r.events {
            Some(c) => super::events::write(o, c, cfg),
            None => writeln!(o, "events/cost: NOT MEASURED, {}", direct_not_run(id, cfg)),
        },
    }
}

/// Why a direct entries' bench was not measured.
pub(super) fn direct_not_run(id: BenchId, cfg: &BenchConfig) -> String {
    match id {
        _ if cfg.counts_only => COUNTS_ONLY.into(),
        BenchId::AttachDirect | BenchId::SitesDirect | BenchId::EventsCost
            if cfg.vmlinux.is_none() =>
        {
            "no vmlinux (build it with `bash guest/build.sh linux`, or pass --vmlinux PATH)".into()
        }
        _ => "not run".into(),
    }
}

/// (a)-(c): one row per figure, its median and, given the per-round
/// values, their range.
fn write_calls(o: &mut String, r: &Results, cfg: &BenchConfig) -> fmt::Result {
    let (Some(c), Some(handlers)) = (&r.costs, &r.handlers) else {
        return Ok(());
    };
    writeln!(
        o,
        "(a)-(c) per traced call: {} vCPU, mode=loop, {} rounds of untraced / resume-only / recorder \
         phases of {} iterations; {:.2} exits per iteration",
        cfg.cpus, cfg.rounds, cfg.iters, c.exits_per_iter
    )?;
    writeln!(o, "  {:<44} {:>10}   rounds min .. max", "", "median")?;
    let ratios = c.ratios();
    let us = |v: f64| num_us(v, 2);
    let range = |v: f64, rounds| (!v.is_nan()).then_some(rounds);
    let extra = if r.a.is_nan() || r.b.is_nan() {
        f64::NAN
    } else {
        median(&c.b_minus_a)
    };
    let rows: [Row<'_>; 6] = [
        (
            "(a) exit round trip (resume-only handler)",
            us(r.a),
            range(r.a, &c.a[..]),
        ),
        (
            "(b) cost per traced call (recorder)",
            us(r.b),
            range(r.b, &c.b[..]),
        ),
        ("(c) b / a", num(r.c, 3), range(r.c, &ratios[..])),
        (
            "    recorder - resume-only, per call",
            us(extra),
            range(extra, &c.b_minus_a[..]),
        ),
        (
            "    handler alone in process: recorder",
            format!("{:.0} ns", handlers.recorder_ns),
            None,
        ),
        (
            "    handler alone in process: resume-only",
            format!("{:.0} ns", handlers.resume_only_ns),
            None,
        ),
    ];
    write_rows(o, &rows)?;
    if let Some(why) = &r.calls_not_measured {
        writeln!(o, "  times not measured: {why}")?;
    }
    writeln!(
        o,
        "  µs per guest iteration: untraced {:.1}, resume-only {:.1}, recorder {:.1}",
        c.iter_us[0], c.iter_us[1], c.iter_us[2]
    )
}

/// Rows of (a)-(c) and (f): label, median and, given the per-round values,
/// their range.
pub(super) type Row<'a> = (&'a str, String, Option<&'a [f64]>);

pub(super) fn write_rows(o: &mut String, rows: &[Row<'_>]) -> fmt::Result {
    for (label, median, rounds) in rows {
        write!(o, "  {label:<44} {median:>10}")?;
        if let Some(v) = rounds {
            write!(o, "   {:.2} .. {:.2}", min(v), max(v))?;
        }
        writeln!(o)?;
    }
    Ok(())
}

/// `v` µs with one decimal, as (d) and (e) print their times.
fn us1(v: f64) -> String {
    format!("{v:.1} µs")
}

/// (d): p50, p99 and max of each kind of pause, by vCPU count.
fn write_pauses(o: &mut String, pauses: &[PauseFigures], cfg: &BenchConfig) -> fmt::Result {
    writeln!(
        o,
        "(d) pause, mini guest mode=loop, {} pauses + {} attach/detach cycles per vCPU count",
        cfg.cycles, cfg.cycles
    )?;
    writeln!(
        o,
        "  {:<8} {:<26} {:>11} {:>11} {:>11}",
        "vCPUs", "", "p50", "p99", "max"
    )?;
    for p in pauses {
        let rows = [
            ("pause latency".to_string(), &p.latency),
            ("window, empty pause".to_string(), &p.window),
            (format!("attach window ({} sites)", p.sites), &p.attach),
            (format!("detach window ({} sites)", p.sites), &p.detach),
        ];
        for (i, (what, v)) in rows.iter().enumerate() {
            // The vCPU count heads its group of rows.
            let n = if i == 0 {
                p.vcpus.to_string()
            } else {
                String::new()
            };
            writeln!(
                o,
                "  {n:<8} {what:<26} {:>11} {:>11} {:>11}",
                us1(pct(v, 50.0)),
                us1(pct(v, 99.0)),
                us1(max(v))
            )?;
        }
    }
    Ok(())
}

/// (e) and loading, measured on `vmlinux`.
fn write_scaling(o: &mut String, s: &Scaling, vmlinux: &Path) -> fmt::Result {
    writeln!(
        o,
        "(e) attach window vs. sites: {} loaded into a paused VM, never booted; {E_REPS} \
         attaches each",
        vmlinux.display()
    )?;
    writeln!(
        o,
        "  {:<14} {:>11} {:>11} {:>11} {:>12}",
        "sites", "first", "p50", "max", "detach p50"
    )?;
    for f in &s.attach {
        let label = if f.label == "all" {
            format!("all ({})", report::thousands(f.sites as u64))
        } else {
            report::thousands(f.sites as u64)
        };
        writeln!(
            o,
            "  {label:<14} {:>11} {:>11} {:>11} {:>12}",
            us1(f.attach[0]),
            us1(median(&f.attach)),
            us1(max(&f.attach)),
            us1(median(&f.detach))
        )?;
    }
    writeln!(o)?;
    writeln!(
        o,
        "loading: KernelImage::load + SiteTable::build of {} ({} sites): median {:.1} ms \
         of {} ({:.1} .. {:.1} ms)",
        vmlinux.display(),
        report::thousands(s.total_sites as u64),
        median(&s.loads_ms),
        s.loads_ms.len(),
        min(&s.loads_ms),
        max(&s.loads_ms)
    )
}
