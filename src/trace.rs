//! `vmtrace --trace ...`: boot, attach, record, detach, report.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tracer::session::{Attach, Plan, Tracer};
use vmm::boot::Protocol;
use vmm::{Running, StopReason, Vm, VmConfig};

use crate::cli::RunArgs;
use crate::session::{outcome, print_stats, secs, Error, Outcome};

/// How often the controller looks at the guest while it runs.
const POLL: Duration = Duration::from_millis(20);
/// How often the live status line is redrawn.
const STATUS_EVERY: Duration = Duration::from_secs(1);

/// The vmlinux with symbols: `--vmlinux`, else the kernel itself when it is an
/// ELF, else `vmlinux` beside the bzImage.
fn vmlinux_path(args: &RunArgs, kernel: &Path) -> Result<PathBuf, Error> {
    if let Some(p) = &args.vmlinux {
        return Ok(p.clone());
    }
    let is_bz = std::fs::File::open(kernel)
        .ok()
        .and_then(|mut f| vmm::boot::linux::is_bzimage(&mut f).ok())
        .unwrap_or(false);
    if !is_bz {
        return Ok(kernel.to_owned());
    }
    let beside = kernel.with_file_name("vmlinux");
    if beside.is_file() {
        return Ok(beside);
    }
    Err(Error::Input(format!(
        "{} is a bzImage without symbols and there is no {}; pass the kernel's unstripped vmlinux with --vmlinux PATH",
        kernel.display(),
        beside.display()
    )))
}

pub fn run_traced(args: &RunArgs, cfg: VmConfig) -> Result<Outcome, Error> {
    let kernel = cfg.kernel.clone();
    let vmlinux = vmlinux_path(args, &kernel)?;
    let plan =
        Plan::new(&vmlinux, &args.trace, &args.notrace).map_err(|e| Error::Input(e.to_string()))?;
    let duration = secs(args.duration, "--duration")?;
    crate::output::validate(&args.output)?;
    let vm = Vm::create(cfg).map_err(|e| Error::Input(e.to_string()))?;
    let direct = vm.boot_plan().protocol == Protocol::Direct;
    if args.from_boot && !direct {
        return Err(Error::Input(
            "--from-boot is not possible with Linux: the kernel rewrites its own call sites in ftrace_init \
             and would find vmtrace's trap instead of `call __fentry__`; vmtrace attaches right after ftrace_init"
                .into(),
        ));
    }
    let ncpus = vm.cpus();
    let (mut tracer, handlers) = Tracer::new(plan, ncpus, args.max_events);
    // A kernel that does not patch its own sites (the mini guest) is traced
    // from its first instruction; Linux once its ftrace_init made the sites NOPs.
    let running = vm
        .start(handlers, direct)
        .map_err(|e| Error::Runtime(e.to_string()))?;
    let mem = running.memory().clone();

    let result = trace_loop(args, &running, &mut tracer, direct, duration);
    // Whatever happened: stop the guest, then put every byte back.
    let run_report = running.finish();
    // What every detach of the run restored, including one at --duration.
    let detach = tracer.detach(&mem).map(|_| tracer.detached.clone());
    let attached = tracer.attach_counts.patched;
    let reason = run_report.reason.clone();
    let trace = tracer.finish(&kernel, reason.to_string());
    result?;
    match detach {
        Ok(d) if attached > 0 => eprintln!(
            "vmtrace: detached: {} sites restored{}",
            d.restored,
            if d.changed > 0 {
                format!(", {} changed by the guest and left alone", d.changed)
            } else {
                String::new()
            }
        ),
        Ok(_) => {}
        Err(e) => return Err(Error::Runtime(format!("restoring guest text failed: {e}"))),
    }
    eprintln!(
        "vmtrace: {} after {:.2} s",
        run_report.reason,
        run_report.elapsed.as_secs_f64()
    );
    if args.stats {
        print_stats(&run_report);
    }
    if attached == 0 {
        return Err(Error::Runtime(format!(
            "the guest stopped ({}) before vmtrace could attach; nothing was traced",
            run_report.reason
        )));
    }
    crate::output::emit(&trace, &args.output)?;
    Ok(outcome(&run_report.reason))
}

/// Attach when the guest is ready, trace until it stops or `--duration`
/// ends, detach under a pause when vmtrace is the one stopping it.
fn trace_loop(
    args: &RunArgs,
    running: &Running,
    tracer: &mut Tracer,
    attach_now: bool,
    duration: Option<Duration>,
) -> Result<(), Error> {
    // Attach: once the guest's ftrace_init is done (polled), then under a
    // pause only if every selected site agrees; otherwise resume and retry.
    let mut retries = 0u32;
    loop {
        if attach_now || tracer.guest_ready(running.memory()) {
            let paused = running.pause_all();
            let attempt = tracer.attach(&paused).map_err(|e| {
                running.request_stop(StopReason::Requested);
                Error::Input(e.to_string())
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
            eprintln!(
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
            break;
        }
        if running.wait_stop(POLL).is_some() {
            return Ok(());
        }
    }
    // Trace.
    let start = Instant::now();
    let status = !args.output.quiet && std::io::stderr().is_terminal();
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
                .map_err(|e| Error::Runtime(e.to_string()))?;
            drop(paused);
            running.request_stop(StopReason::Requested);
            break;
        }
        if status && last_status.elapsed() >= STATUS_EVERY {
            last_status = Instant::now();
            let events: u64 = tracer.counts().iter().flatten().sum();
            let secs = start.elapsed().as_secs_f64();
            eprint!(
                "\r\x1b[Kvmtrace: {secs:7.1} s  {events:>14} events  {:>12.0} events/s",
                events as f64 / secs
            );
            let _ = std::io::stderr().flush();
        }
    }
    if status {
        eprint!("\r\x1b[K");
    }
    Ok(())
}
