//! `vmtrace --kernel ...` and `vmtrace record`: boot the guest and, with
//! `--trace`, attach, record, detach, then report and/or save the trace.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use tracer::session::{Attach, Mode, Tracer};
use vmm::boot::Protocol;
use vmm::{NoTracer, RunReport, Running, StopReason, TrapHandler, Vm};

use crate::cli::{OutputArgs, RunArgs};
use crate::config::{Form, KernelKind, RunConfig, TraceConfig};
use crate::emit::emit;
use crate::error::{Error, InputError, Outcome, RuntimeError};
use crate::stats::percentile;

/// How often the controller looks at the guest while it runs.
const POLL: Duration = Duration::from_millis(20);
/// How often the live status line is redrawn.
const STATUS_EVERY: Duration = Duration::from_secs(1);

pub fn main(args: &RunArgs, out: &OutputArgs, form: Form) -> Result<Outcome, Error> {
    let RunConfig {
        vm,
        kind,
        stats,
        trace,
    } = RunConfig::check(args, out, form)?;
    let kernel = vm.kernel.clone();
    let vm = Vm::create(vm)?;
    match trace {
        None => untraced(vm, stats),
        Some(t) => traced(vm, kind, &kernel, stats, t),
    }
}

fn untraced(vm: Vm, stats: bool) -> Result<Outcome, Error> {
    let handlers = (0..vm.cpus())
        .map(|_| Box::new(NoTracer) as Box<dyn TrapHandler>)
        .collect();
    let running = vm.start(handlers, false).map_err(RuntimeError::Start)?;
    running.wait();
    Ok(stopped(&running.finish(), stats))
}

/// Say why and when the guest stopped (and, with `--stats`, how it ran).
fn stopped(report: &RunReport, stats: bool) -> Outcome {
    note!(
        "vmtrace: {} after {:.2} s",
        report.reason,
        report.elapsed.as_secs_f64()
    );
    if stats {
        print_stats(report);
    }
    Outcome::of(&report.reason)
}

fn traced(
    vm: Vm,
    kind: KernelKind,
    kernel: &Path,
    stats: bool,
    cfg: TraceConfig,
) -> Result<Outcome, Error> {
    let TraceConfig {
        plan,
        mode,
        ring_events,
        duration,
        max_events,
        output,
    } = cfg;
    // A kernel that does not patch its own sites (the mini guest) is traced
    // from its first instruction; Linux once its ftrace_init made the sites NOPs.
    let attach_now = !kind.is_linux();
    debug_assert_eq!(
        attach_now,
        vm.boot_plan().protocol == Protocol::Direct,
        "the config and the loader disagree on the boot protocol"
    );
    if let Some(rejected) = plan.sites.rejected_summary() {
        // Left out of tracing, never silently: say which.
        note!(
            "vmtrace: {}: {rejected} (left out)",
            plan.image.path.display()
        );
    }
    let (mut tracer, handlers) = match mode {
        Mode::Trap => Tracer::new(plan, vm.cpus(), max_events),
        Mode::Exitless => Tracer::exitless(plan, vm.cpus(), max_events, ring_events)
            .map_err(|e| Error::Input(InputError::from(e)))?,
    };
    let running = vm
        .start(handlers, attach_now)
        .map_err(RuntimeError::Start)?;
    let mem = running.memory().clone();

    let result = trace_loop(&running, &mut tracer, attach_now, duration, output.quiet);
    // Whatever happened: stop the guest, then put every byte back.
    let run_report = running.finish();
    // What every detach of the run restored, including one at --duration.
    let detach = tracer.detach(&mem).map(|_| tracer.detached.clone());
    let attached = tracer.attach_counts.patched;
    // Exitless: what the stopped guest left in its rings; a loss is said
    // after the report (the counts that remain are still exact).
    let drained = tracer.stop_draining();
    let mut trace = tracer.finish(kernel, run_report.reason.to_string());
    // Exits at the trace port: one per traced call in trap mode, none in
    // exitless mode (traps happen only while sites hold them).
    trace.meta.trap_exits = run_report
        .vcpus
        .iter()
        .map(|v| v.get(vmm::exit::ExitKind::Trap))
        .sum();
    result?;
    match detach {
        Ok(d) if attached > 0 => note!(
            "vmtrace: detached: {} sites restored{}",
            d.restored,
            if d.changed > 0 {
                format!(", {} changed by the guest and left alone", d.changed)
            } else {
                String::new()
            }
        ),
        Ok(_) => {}
        Err(e) => return Err(RuntimeError::Restore(e).into()),
    }
    let outcome = stopped(&run_report, stats);
    if attached == 0 {
        return Err(RuntimeError::NothingTraced(run_report.reason.clone()).into());
    }
    emit(&trace, &output)?;
    drained.map_err(RuntimeError::Drain)?;
    Ok(outcome)
}

/// Attach when the guest is ready, trace until it stops or `--duration`
/// ends, detach under a pause when vmtrace is the one stopping it.
fn trace_loop(
    running: &Running,
    tracer: &mut Tracer,
    attach_now: bool,
    duration: Option<Duration>,
    quiet: bool,
) -> Result<(), Error> {
    // Attach: once the guest's ftrace_init is done (polled), then under a
    // pause only if every selected site agrees; otherwise resume and retry.
    let mut retries = 0u32;
    loop {
        if attach_now || tracer.guest_ready(running.memory()) {
            let paused = running.pause_all();
            let attempt = tracer.attach(&paused).map_err(|e| {
                running.request_stop(StopReason::Requested);
                InputError::Tracer(e)
            })?;
            let c = match attempt {
                Attach::Attached(c) => c.clone(),
                Attach::NotReady(_) => {
                    drop(paused);
                    retries += 1;
                    if running.wait_stop(POLL).is_some() {
                        return Ok(());
                    }
                    continue;
                }
            };
            let window = paused.window();
            let latency = paused.latency();
            drop(paused);
            note!(
                "vmtrace: attached: {} sites patched, {} skipped ({} in init text, {} not a NOP) in a {} µs pause (latency {} µs){}",
                c.patched,
                tracer.plan().skipped_init + c.skipped_other,
                tracer.plan().skipped_init,
                c.skipped_other,
                window.as_micros(),
                latency.as_micros(),
                if retries > 0 {
                    format!(", after {retries} attempts found the guest's ftrace_init still converting sites")
                } else {
                    String::new()
                }
            );
            if let Some(m) = c.exitless {
                note!("vmtrace: exitless: {}", exitless_line(m));
            }
            if let Some(o) = tracer.kernel_offset() {
                let kaslr = if o.is_none() { "no KASLR" } else { "KASLR" };
                note!("vmtrace: kernel offset: {o} ({kaslr})");
            }
            break;
        }
        if running.wait_stop(POLL).is_some() {
            return Ok(());
        }
    }
    // Trace.
    let start = Instant::now();
    let status = !quiet && std::io::stderr().is_terminal();
    let mut last_status = Instant::now();
    loop {
        if running.wait_stop(POLL).is_some() {
            break;
        }
        if duration.is_some_and(|d| start.elapsed() >= d) {
            // Restore under a pause before stopping, so the guest never runs
            // half-restored text.
            let paused = running.pause_all();
            tracer
                .detach(paused.memory())
                .map_err(RuntimeError::Restore)?;
            drop(paused);
            running.request_stop(StopReason::Requested);
            break;
        }
        if status && last_status.elapsed() >= STATUS_EVERY {
            last_status = Instant::now();
            let events: u64 = tracer.counts().iter().flatten().sum();
            let secs = start.elapsed().as_secs_f64();
            note_part!(
                "\r\x1b[Kvmtrace: {secs:7.1} s  {events:>14} events  {:>12.0} events/s",
                events as f64 / secs
            );
            let _ = std::io::stderr().flush();
        }
    }
    if status {
        note_part!("\r\x1b[K");
    }
    Ok(())
}

/// `--stats`: exits per vCPU and kind, assists, pauses.
fn print_stats(report: &RunReport) {
    use vmm::exit::ExitKind;
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "exits per vCPU:");
    let _ = write!(err, "  {:<18}", "kind");
    for cpu in 0..report.vcpus.len() {
        let _ = write!(err, " {:>12}", format!("cpu{cpu}"));
    }
    let _ = writeln!(err);
    for kind in ExitKind::ALL {
        if report.vcpus.iter().all(|v| v.get(kind) == 0) {
            continue;
        }
        let _ = write!(err, "  {:<18}", kind.name());
        for v in &report.vcpus {
            let _ = write!(err, " {:>12}", v.get(kind));
        }
        let _ = writeln!(err);
    }
    for (cpu, v) in report.vcpus.iter().enumerate() {
        for (insn, n) in &v.assists {
            let _ = writeln!(err, "  cpu{cpu}: emulation assist `{insn}` x{n}");
        }
    }
    for (cpu, r) in report.last_regs.iter().enumerate() {
        match r {
            Some(s) => {
                let _ = writeln!(
                    err,
                    "  cpu{cpu} stopped at rip {:#x} (cs {:#x} base {:#x}), rsp {:#x}, cr0 {:#x}, cr3 {:#x}",
                    s.regs.rip, s.sregs.cs.selector, s.sregs.cs.base, s.regs.rsp, s.sregs.cr0, s.sregs.cr3
                );
            }
            None => {
                let _ = writeln!(err, "  cpu{cpu} had already stopped");
            }
        }
    }
    let p = &report.pause;
    if !p.latency_ns.is_empty() {
        let _ = writeln!(
            err,
            "pauses: {}, latency p50 {} us, window p50 {} us",
            p.latency_ns.len(),
            percentile(&p.latency_ns, 50.0).unwrap_or(0) / 1000,
            percentile(&p.window_ns, 50.0).unwrap_or(0) / 1000
        );
    }
}

/// Where exitless mode put vmtrace's code and rings in the guest.
fn exitless_line(m: tracer::exitless::map::Mapped) -> String {
    use tracer::exitless::layout::{CODE_VA, PD_COUNT, PD_FIRST};
    let entries = format!(
        "page-directory entries {PD_FIRST}-{}",
        PD_FIRST + PD_COUNT - 1
    );
    let how = match (m.reused, m.own_pd) {
        (true, _) => format!("{entries} already vmtrace's (an earlier attach)"),
        (false, true) => {
            format!("{entries} of a page directory of vmtrace's own (the guest had none there)")
        }
        (false, false) => format!("{entries}, found empty"),
    };
    format!("trampoline and rings mapped at {CODE_VA:#x}, {how}")
}
