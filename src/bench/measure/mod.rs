//! Taking the figures (`results` judges and renders them): the shared run
//! plumbing, (d) pause, (e) attach window vs. sites, loading and report
//! times; (a)-(c) are in `calls`, (f) in `exitless`, call/stack in `stack`,
//! the phases they run in `phases`, (h) in `record`, (i) in `ftrace`.

mod attach_modes;
mod calls;
mod direct;
mod drain;
mod drain_producer;
mod events;
mod exitless;
pub mod ftrace;
mod phases;
mod qemu;
mod record;
mod stack;
mod stack_alone;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vmm::Stopped;

use tracer::error::TracerError;
use tracer::kernel::sites::SiteTable;
use tracer::kernel::symbols::KernelImage;
use tracer::plan::Plan;
use tracer::session::record::SiteIndex;
use tracer::session::{Session, SessionError, Start, Tracer};
use tracer::trace::report::{self, ReportOptions};
use vmm::boot::KernelFile;
use vmm::{NoTracer, Paused, Running, StopReason, TrapHandler, Vm, VmConfig, VmSize};

pub use attach_modes::{attach_modes, AttachModes, ATTACH_GLOB};
pub use calls::{call_costs, handler_alone, CallCosts, HandlerAlone, HANDLER_TRAPS};
pub use direct::{
    attach_direct, direct_sites, DirectAttach, DirectSiteCounts, StubCount, DIRECT_SITES,
};
pub use drain::{drain_figures, DrainFigures, DrainMemory, DrainRun, DRAIN_CPUS};
pub use events::{event_costs, EventCosts, COSTED_EVENTS};
pub use exitless::{exitless_costs, ExitlessCosts, SPIN, SPIN_COUNT_TOLERANCE};
pub use ftrace::{
    ftrace_figures, BootConfig, FtraceFigures, LinuxGuest, BOOT_CONFIGS, FTRACE_CMDLINE,
    FTRACE_GLOB, FTRACE_SETUP_CMDLINE,
};
pub use qemu::{qemu_figures, QemuFigures, K_CALLS, K_GLOBS, K_TRAP_CALLS};
pub use record::{record_figures, RecordFigures, PEAK_SLACK};
pub use stack::{stack_costs, StackAlone, StackCosts, STACK_CMDLINE, STACK_FUNC, STACK_GLOB};
pub use stack_alone::stack_alone;

use phases::{wait_calls, IterCounters};
use vmm::gva::{AddressSpace, PagingMode};

use crate::bench::us;
use crate::error::{Error, Flags, RuntimeError};
use vmm::advice::Advice;

/// The functions traced for (a), (b) and (f).
pub const TRACE_GLOB: &str = "hrtimer_*";
/// Guest memory of the mini guest, MiB.
const MINI_MEM_MIB: u64 = 64;
/// Guest memory for the Linux image of (e), MiB (its segments end below 27 MiB).
const LINUX_MEM_MIB: u64 = 96;
/// vCPU counts for (d).
pub const PAUSE_VCPUS: [u64; 3] = [1, 2, 4];
/// How long a `mode=loop` guest runs before the first pause.
const SETTLE: Duration = Duration::from_millis(100);
/// Site counts for (e); "all" is added.
const E_SITES: [usize; 3] = [10, 100, 1000];
/// Attach/detach repetitions per site count in (e).
pub const E_REPS: usize = 5;

/// A guest the bench stops itself (so no timeout), its console discarded.
fn guest_config(kernel: &Path, cpus: u64, mem_mib: u64, cmdline: &str) -> Result<VmConfig, Error> {
    Ok(VmConfig {
        kernel: KernelFile::open(kernel)?,
        initrd: None,
        size: VmSize::new(cpus, mem_mib)?,
        cmdline: cmdline.into(),
        console: Box::new(std::io::sink()),
        timeout: None,
        hide_hypercalls: vmm::host::emulates_ring0(),
    })
}

/// The mini guest in `mode=loop`.
fn mini_config(kernel: &Path, cpus: u64) -> Result<VmConfig, Error> {
    guest_config(kernel, cpus, MINI_MEM_MIB, "mode=loop")
}

/// Stop a guest that is still running, wait for its threads.
fn stop(running: Running) -> vmm::RunReport {
    running.request_stop(StopReason::Requested);
    running.finish()
}

/// Start the guest under `tracer` as the library's session does, running
/// at once: the bench attaches and detaches as it measures.
fn session(
    vm: Vm,
    tracer: Tracer,
    handlers: Vec<Box<dyn TrapHandler>>,
    kernel: &Path,
) -> Result<Session, Error> {
    Session::with_tracer(vm, tracer, handlers, kernel, Start::Running).map_err(|e| match e {
        SessionError::Start(e) => RuntimeError::Start(e).into(),
        e => RuntimeError::Measure(e.to_string()).into(),
    })
}

/// End a measured run as every session ends (`Session::end`: stop the
/// guest, restore every site whatever happened, close the trace), then fail
/// if the measurement failed, the guest stopped on its own, or nothing was
/// traced; else return what was measured.
fn wind_down<T>(session: Session, result: Result<T, Error>, what: &str) -> Result<T, Error> {
    let ended = session.end(&Flags);
    let measured = result?;
    ended.detached.map_err(RuntimeError::Restore)?;
    let report = &ended.report;
    if report.reason != StopReason::Requested {
        return Err(RuntimeError::Measure(format!(
            "{what} stopped on its own: {}; console: {}",
            report.reason.say(&Flags),
            report.console_tail.join(" | ")
        ))
        .into());
    }
    if ended.summary.meta.events_total == 0 {
        return Err(RuntimeError::Measure(format!("{what}: no call was traced")).into());
    }
    Ok(measured)
}

/// (d) for one vCPU count, µs.
pub struct PauseFigures {
    pub vcpus: u64,
    pub sites: usize,
    pub latency: Vec<f64>,
    pub window: Vec<f64>,
    pub attach: Vec<f64>,
    pub detach: Vec<f64>,
}

/// (d) with `vcpus` vCPUs: `cycles` empty pauses, then `cycles` attach and
/// detach cycles of all the mini guest's patchable sites.
pub fn pause_figures(kernel: &Path, vcpus: u64, cycles: usize) -> Result<PauseFigures, Error> {
    let plan = Plan::new(kernel, &["*".to_string()], &[])?;
    let sites = plan.index.addrs.len();
    let vm = Vm::create(mini_config(kernel, vcpus)?)?;
    let ncpus = vm.cpus();
    let (tracer, handlers) = Tracer::new(plan, ncpus, 10_000_000);
    let mut session = session(vm, tracer, handlers, kernel)?;
    let (running, tracer) = session.parts();
    let gap = |i: usize| Duration::from_micros(1500 + 500 * (i % 3) as u64);
    let mem = running.memory().clone();
    let map = AddressSpace::new(&mem, vmm::layout::PML4_START, PagingMode::Level4);
    // A function the guest counts, traced by `--trace '*'`.
    let counted = ["hrtimer_start_range_ns"];
    let mut counters = IterCounters::new(map, &tracer.plan().image, ncpus, &counted)?;
    let result = (|| -> Result<PauseFigures, Error> {
        let mut f = PauseFigures {
            vcpus,
            sites,
            latency: Vec::new(),
            window: Vec::new(),
            attach: Vec::new(),
            detach: Vec::new(),
        };
        std::thread::sleep(SETTLE);
        let stopped = || match running.wait_stop(Duration::ZERO) {
            Some(r) => Err(RuntimeError::GuestStopped {
                what: "mini guest",
                reason: r,
            }),
            None => Ok(()),
        };
        for i in 0..cycles {
            stopped()?;
            let p = running.pause_all();
            f.latency.push(us(p.latency()));
            f.window.push(us(p.window()));
            drop(p);
            std::thread::sleep(gap(i));
        }
        for i in 0..cycles {
            stopped()?;
            let from = {
                let p = running.pause_all();
                tracer.attach(&p)?.attached()?;
                f.attach.push(us(p.window()));
                counters.calls_total()?
            };
            std::thread::sleep(gap(i));
            // Each attach traces something (`wind_down` checks that a call
            // was traced), however long this host leaves the vCPUs idle:
            // of the calls counted after the attach, one per vCPU may have
            // passed its site before it.
            let min = from + ncpus as u64 + 1;
            wait_calls(
                running,
                &mut counters,
                min,
                "between an attach and its detach",
            )?;
            {
                let p = running.pause_all();
                tracer.detach(p.memory()).map_err(RuntimeError::Restore)?;
                f.detach.push(us(p.window()));
            }
            std::thread::sleep(gap(i));
        }
        Ok(f)
    })();
    wind_down(
        session,
        result,
        &format!("the mini guest ({vcpus} vCPUs, mode=loop)"),
    )
}

/// (e) for one site count, µs.
pub struct AttachFigures {
    /// "10", "100", "1000" or "all".
    pub label: String,
    pub sites: usize,
    pub attach: Vec<f64>,
    pub detach: Vec<f64>,
}

/// (e) and loading.
pub struct Scaling {
    /// By site count, ascending.
    pub attach: Vec<AttachFigures>,
    /// ms per load of the vmlinux's symbols and sites.
    pub loads_ms: Vec<f64>,
    /// Sites in the vmlinux's table.
    pub total_sites: usize,
}

/// (e) and the loading figure, on `vmlinux` loaded into a VM that never runs.
pub fn attach_scaling(vmlinux: &Path) -> Result<Scaling, Error> {
    // The sites `--trace '*'` patches, and their functions.
    let all = Plan::new(vmlinux, &["*".to_string()], &[])?;
    let (all_targets, all_funcs, total_sites) = (
        all.index.sites().collect::<Vec<_>>(),
        all.funcs.clone(),
        all.sites.len(),
    );
    drop(all);
    let vm = Vm::create(guest_config(vmlinux, 1, LINUX_MEM_MIB, "")?)?;
    let running = vm
        .start(vec![Box::new(NoTracer) as Box<dyn TrapHandler>], true)
        .map_err(RuntimeError::Start)?;
    // Held for the whole measurement: this guest never runs.
    let paused = running.pause_all();
    let mut loads = Vec::new();
    let mut figures = Vec::new();
    let result = (|| -> Result<(), Error> {
        let mut counts: Vec<(String, usize)> = E_SITES
            .iter()
            .filter(|&&n| n < all_targets.len())
            .map(|&n| (n.to_string(), n))
            .collect();
        counts.push(("all".into(), all_targets.len()));
        for (label, n) in counts {
            let t = Instant::now();
            let mut image = KernelImage::load(vmlinux).map_err(TracerError::from)?;
            let sites = SiteTable::build(&image).map_err(TracerError::from)?;
            loads.push(t.elapsed().as_secs_f64() * 1e3);
            // Never run, so its ftrace_init never converts its `call
            // __fentry__` sites: patch them as they are, as for a kernel
            // that does not convert its own.
            image.linux = false;
            let step = (all_targets.len() / n).max(1);
            let targets: Vec<(u64, u32)> =
                all_targets.iter().step_by(step).take(n).copied().collect();
            let plan = Plan {
                image,
                sites,
                funcs: all_funcs.clone(),
                index: Arc::new(SiteIndex::new(targets)),
                skipped_init: 0,
                ftrace_enabled: None,
                graph: false,
                // The attach's cost alone: no task read at calls.
                tasks: Default::default(),
                btf: None,
                values: Default::default(),
                arg_funcs: None,
                stacks: None,
                entry: tracer::plan::entry::EntryKind::Ftrace,
                direct: None,
                boot_patched: Default::default(),
                events: Default::default(),
                coming: None,
            };
            figures.push(attach_figures(plan, label, n, &paused, vmlinux)?);
        }
        Ok(())
    })();
    // Stop before releasing the pause, so the kernel never starts.
    running.request_stop(StopReason::Requested);
    drop(paused);
    running.finish();
    result?;
    Ok(Scaling {
        attach: figures,
        loads_ms: loads,
        total_sites,
    })
}

/// (e) for one site count: `E_REPS` attaches of `f.sites` sites, each
/// detached; the run fails unless each patches and restores them all.
/// The attach and detach windows of `plan`'s `n` sites under `paused`,
/// with a trap-mode tracer of its own: the kernel was loaded at its link
/// addresses and never run, so there is no KASLR to find.
pub(super) fn attach_figures(
    plan: Plan,
    label: String,
    n: usize,
    paused: &Paused<'_>,
    vmlinux: &Path,
) -> Result<AttachFigures, Error> {
    let (mut tracer, handlers) = Tracer::new(plan, 1, 0);
    drop(handlers);
    tracer.assume_kernel_offset(tracer::kernel::kaslr::KernelOffset::NONE);
    let mut f = AttachFigures {
        label,
        sites: n,
        attach: Vec::new(),
        detach: Vec::new(),
    };
    time_attaches(&mut tracer, paused, &mut f, vmlinux)?;
    tracer.finish(vmlinux, String::new());
    Ok(f)
}

fn time_attaches(
    tracer: &mut Tracer,
    paused: &Paused<'_>,
    f: &mut AttachFigures,
    vmlinux: &Path,
) -> Result<(), Error> {
    let n = f.sites;
    for _ in 0..E_REPS {
        let t = Instant::now();
        let patched = tracer.attach(paused)?.attached()?.patched;
        f.attach.push(us(t.elapsed()));
        if patched != n {
            tracer
                .detach(paused.memory())
                .map_err(RuntimeError::Restore)?;
            return Err(RuntimeError::Measure(format!(
                "patched {patched} of {n} sites of {}",
                vmlinux.display()
            ))
            .into());
        }
        let t = Instant::now();
        let d = tracer
            .detach(paused.memory())
            .map_err(RuntimeError::Restore)?;
        f.detach.push(us(t.elapsed()));
        if d.restored != n {
            return Err(RuntimeError::Measure(format!(
                "restored {} of {n} sites of {}",
                d.restored,
                vmlinux.display()
            ))
            .into());
        }
    }
    Ok(())
}

/// Seconds to render the text report with callers, and to export JSON.
pub fn report_figures(events: u64) -> Result<(f64, f64), Error> {
    let trace = tracer::trace::model::Trace::synthetic(events);
    let opts = ReportOptions {
        callers: true,
        ..ReportOptions::default()
    };
    let t = Instant::now();
    let text = report::render(&trace, &opts);
    let render = t.elapsed().as_secs_f64();
    let t = Instant::now();
    tracer::trace::export::write_json(&trace, std::io::sink()).map_err(|source| {
        RuntimeError::Export {
            format: "JSON".into(),
            source,
        }
    })?;
    let json = t.elapsed().as_secs_f64();
    if !text.contains("caller_") {
        return Err(RuntimeError::Measure("synthetic report has no callers".into()).into());
    }
    Ok((render, json))
}
