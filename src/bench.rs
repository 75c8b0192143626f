//! `vmtrace bench`: what tracing costs, measured side by side in one run.
//!
//! Everything is measured in one process, one run, so the figures can be
//! compared with each other even on a host whose KVM distorts absolute times
//! (see shared/KVM-HOST.md: nested KVM that emulates guest ring 0, ~1 µs per
//! guest instruction, ~7-10 µs per port-I/O exit). Ratios are what carry over
//! to other hosts; absolute times do not.
//!
//! # Methods
//!
//! The mini guest runs `iters=N` iterations of its hrtimer-like workload per
//! vCPU (count mode: a fixed amount of work, then power off). Three
//! configurations are booted, each `--reps` times, in rotating order so that
//! drift on the host hits all three alike:
//!
//! - **untraced**: no site patched;
//! - **resume-only**: the `hrtimer_*` sites patched (`hrtimer_start_range_ns`,
//!   `hrtimer_try_to_cancel`, `hrtimer_interrupt`, `hrtimer_wakeup`: 3.5 calls
//!   per iteration), with a trap handler that does the least any trap handler
//!   must: find the site from RIP (the same `SiteIndex` lookup the recorder
//!   uses) and resume the guest after it;
//! - **recorder**: the same sites, with vmtrace's real per-vCPU `Recorder`
//!   (clock read, exact counter, caller read from the guest stack, event
//!   buffered and handed to the collector thread).
//!
//! Each run starts paused, is attached, and is timed from the resume to the
//! guest's power-off, so VM creation, boot and attach are outside the timing;
//! the guest executes the same instructions in all three (a 5-byte NOP or
//! `out; nop3` of which only the `out` runs), so the difference in run time
//! is the cost of the exits and their handling. With `T` the run time and
//! `X` the trace-port exits per vCPU (counted by the VMM):
//!
//! - **(a) exit round trip** = (T_resume-only − T_untraced) / X: one `out`
//!   exit from the guest to vmtrace's vCPU loop and back into KVM_RUN, with
//!   the cheapest handler possible. This is the floor for any trap-based
//!   tracer on this VMM and host.
//! - **(b) traced call** = (T_recorder − T_untraced) / X.
//! - **(c)** = b / a, from the medians over the repetitions. Goal ≤ 1.2: the
//!   recorder adds at most 20 % to the exit it cannot avoid.
//!
//! As a cross-check on (b) − (a), which is small next to the run-to-run
//! noise, both handlers are also timed alone, in process, on a `Trap` built
//! over the mini guest's memory (no exit involved).
//!
//! - **(d) pause**: the mini guest in `mode=loop` with 1, 2 and 4 vCPUs, all
//!   running; `--cycles` empty pauses (latency = request to all parked; window
//!   = all parked to release, with nothing done), then `--cycles` attach and
//!   detach cycles of all its patchable sites (9, `mini_init_setup` is init
//!   text), each in its own pause, window measured as for the empty pauses.
//! - **(e) attach window vs. sites**: the Linux vmlinux (`--vmlinux`, default
//!   guest/out/vmlinux) loaded into a VM at its physical addresses, with the
//!   boot page tables, started paused and never run (booting Linux takes
//!   minutes on emulating hosts). `Tracer::attach` — the vmlinux check and the
//!   patching, exactly what a live attach does while the vCPUs are parked —
//!   is timed for 10, 100, 1,000 and all of the sites `--trace '*'` selects
//!   (spread evenly over the text), each `E_REPS` times, with a `detach`
//!   between. That time is the pause window such an attach needs.
//! - **loading**: `KernelImage::load` + `SiteTable::build` of that vmlinux.
//! - **report**: `report::render` with callers, and the JSON export, of a
//!   synthetic trace of `--report-events` events (default 10 M) over 500
//!   functions, 200 callers, 4 vCPUs.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracer::record::{self, SiteIndex};
use tracer::report::{self, ReportOptions};
use tracer::sites::{SiteTable, SITE_LEN};
use tracer::symbols::KernelImage;
use tracer::trace::{Event, FuncSym, Trace, TraceMeta};
use tracer::tracing::{Plan, Tracer};
use vmm::gva::PagingMode;
use vmm::vcpu::ExitKind;
use vmm::{NoTracer, Running, StopReason, Trap, TrapHandler, Vm, VmConfig};

use crate::cli::BenchArgs;
use crate::session::{emulator_host, Error, Outcome};

/// The functions traced for (a) and (b).
const TRACE_GLOB: &str = "hrtimer_*";
/// Guest memory of the mini guest, MiB.
const MINI_MEM_MIB: u64 = 64;
/// Guest memory for the Linux image of (e), MiB (its segments end below 27 MiB).
const LINUX_MEM_MIB: u64 = 96;
/// No single guest run of the bench may take longer.
const RUN_TIMEOUT: Duration = Duration::from_secs(300);
/// vCPU counts for (d).
const PAUSE_VCPUS: [u64; 3] = [1, 2, 4];
/// How long a `mode=loop` guest runs before the first pause.
const SETTLE: Duration = Duration::from_millis(100);
/// Site counts for (e); "all" is added.
const E_SITES: [usize; 3] = [10, 100, 1000];
/// Attach/detach repetitions per site count in (e).
const E_REPS: usize = 5;
/// Traps per handler in the in-process cross-check.
const HANDLER_TRAPS: usize = 1_000_000;
/// The synthetic trace of the report figure.
const REPORT_FUNCS: usize = 500;
const REPORT_CALLERS: usize = 200;
const REPORT_CPUS: u32 = 4;
/// Length of `out imm8, al`.
const OUT_LEN: u64 = 2;

/// Goals.
const GOAL_RATIO: f64 = 1.2;
const GOAL_WINDOW_100_US: f64 = 1_000.0;
const GOAL_WINDOW_ALL_US: f64 = 10_000.0;
const GOAL_LOAD_MS: f64 = 100.0;
const GOAL_REPORT_S: f64 = 1.0;
const GOAL_REPORT_EVENTS: u64 = 10_000_000;

fn input(e: impl std::fmt::Display) -> Error {
    Error::Input(e.to_string())
}

fn runtime(e: impl std::fmt::Display) -> Error {
    Error::Runtime(e.to_string())
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Nearest-rank percentile of `v` (unsorted).
fn pct(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    s[rank.clamp(1, s.len()) - 1]
}

fn median(v: &[f64]) -> f64 {
    pct(v, 50.0)
}

fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}

/// The directory holding `guest/`: the working directory if it has
/// guest/build.sh, else the source tree this binary was built from.
fn project_root() -> PathBuf {
    let cwd = PathBuf::from(".");
    if cwd.join("guest/build.sh").is_file() {
        return cwd;
    }
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    if src.join("guest/build.sh").is_file() {
        return src;
    }
    cwd
}

/// `--kernel`, else guest/out/mini.elf (built with guest/build.sh if missing).
fn mini_kernel(args: &BenchArgs) -> Result<PathBuf, Error> {
    if let Some(k) = &args.kernel {
        if !k.is_file() {
            return Err(Error::Input(format!(
                "kernel {} does not exist; build the mini guest with `bash guest/build.sh mini` or pass --kernel PATH",
                k.display()
            )));
        }
        return Ok(k.clone());
    }
    let root = project_root();
    let kernel = root.join("guest/out/mini.elf");
    if !kernel.is_file() {
        eprintln!(
            "vmtrace bench: {} is missing; building it",
            kernel.display()
        );
        let st = Command::new("bash")
            .arg(root.join("guest/build.sh"))
            .arg("mini")
            .status()
            .map_err(|e| Error::Input(format!("cannot run guest/build.sh mini: {e}")))?;
        if !st.success() || !kernel.is_file() {
            return Err(Error::Input(
                "`bash guest/build.sh mini` failed; build the mini guest or pass --kernel PATH"
                    .into(),
            ));
        }
    }
    Ok(kernel)
}

/// `--vmlinux`, else guest/out/vmlinux if present.
fn linux_vmlinux(args: &BenchArgs) -> Result<Option<PathBuf>, Error> {
    match &args.vmlinux {
        Some(p) if p.is_file() => Ok(Some(p.clone())),
        Some(p) => Err(Error::Input(format!(
            "vmlinux {} does not exist; build it with `bash guest/build.sh linux`",
            p.display()
        ))),
        None => {
            let p = project_root().join("guest/out/vmlinux");
            Ok(p.is_file().then_some(p))
        }
    }
}

fn mini_config(kernel: &Path, cpus: u64, cmdline: String) -> VmConfig {
    VmConfig {
        kernel: kernel.to_owned(),
        initrd: None,
        cpus,
        mem_mib: MINI_MEM_MIB,
        cmdline,
        console: Box::new(std::io::sink()),
        timeout: Some(RUN_TIMEOUT),
        hide_hypercalls: emulator_host(),
    }
}

/// The cheapest correct trap handler: find the site, resume after it.
struct ResumeOnly {
    index: Arc<SiteIndex>,
}

impl TrapHandler for ResumeOnly {
    fn on_trap(&mut self, trap: &mut Trap<'_>) -> Result<(), String> {
        let i = self
            .index
            .find(trap.rip)
            .ok_or_else(|| format!("trap at {:#x}, not a patched site", trap.rip))?;
        trap.set_rip(self.index.addrs[i] + SITE_LEN as u64);
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Untraced,
    ResumeOnly,
    Recorder,
}

const MODES: [Mode; 3] = [Mode::Untraced, Mode::ResumeOnly, Mode::Recorder];

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Untraced => "untraced",
            Mode::ResumeOnly => "resume-only",
            Mode::Recorder => "recorder",
        }
    }
}

/// One timed run of the mini guest.
struct TimedRun {
    /// From the resume to the power-off.
    guest: Duration,
    /// Trace-port exits, all vCPUs.
    traps: u64,
}

/// Stop a guest that is still running, wait for its threads.
fn stop(running: Running) -> vmm::RunReport {
    running.request_stop(StopReason::Requested);
    running.finish()
}

fn timed_run(kernel: &Path, cpus: u64, iters: u64, mode: Mode) -> Result<TimedRun, Error> {
    let vm = Vm::create(mini_config(kernel, cpus, format!("iters={iters}"))).map_err(input)?;
    let ncpus = vm.cpus();
    let mut tracer = None;
    let handlers: Vec<Box<dyn TrapHandler>> = match mode {
        Mode::Untraced => (0..ncpus)
            .map(|_| Box::new(NoTracer) as Box<dyn TrapHandler>)
            .collect(),
        Mode::ResumeOnly | Mode::Recorder => {
            let plan = Plan::new(kernel, &[TRACE_GLOB.to_string()], &[]).map_err(input)?;
            let index = Arc::new(SiteIndex::new(plan.targets.clone()));
            let (t, recorders) = Tracer::new(plan, ncpus, u64::MAX);
            tracer = Some(t);
            if mode == Mode::Recorder {
                recorders
            } else {
                drop(recorders);
                (0..ncpus)
                    .map(|_| {
                        Box::new(ResumeOnly {
                            index: Arc::clone(&index),
                        }) as Box<dyn TrapHandler>
                    })
                    .collect()
            }
        }
    };
    let running = vm.start(handlers, true).map_err(runtime)?;
    let mem = running.memory().clone();
    let attached = {
        let p = running.pause_all();
        match tracer.as_mut() {
            Some(t) => t.attach(&p, ncpus).map(|_| ()),
            None => Ok(()),
        }
    };
    if let Err(e) = attached {
        stop(running);
        return Err(Error::Input(e.to_string()));
    }
    let t0 = Instant::now();
    let reason = running.wait();
    let guest = t0.elapsed();
    let report = running.finish();
    if let Some(mut t) = tracer {
        t.detach(&mem).map_err(runtime)?;
        let trace = t.finish(kernel, reason.to_string());
        if mode == Mode::Recorder && trace.meta.events_total != traps(&report) {
            return Err(Error::Runtime(format!(
                "recorder counted {} calls for {} trace exits",
                trace.meta.events_total,
                traps(&report)
            )));
        }
    }
    if !reason.is_clean() {
        return Err(Error::Runtime(format!(
            "the mini guest ({} run) did not end cleanly: {reason}; console: {}",
            mode.name(),
            report.console_tail.join(" | ")
        )));
    }
    if mode != Mode::Untraced && traps(&report) == 0 {
        return Err(Error::Runtime(format!(
            "no {TRACE_GLOB} call trapped in the {} run",
            mode.name()
        )));
    }
    Ok(TimedRun {
        guest,
        traps: traps(&report),
    })
}

fn traps(report: &vmm::RunReport) -> u64 {
    report.vcpus.iter().map(|v| v.get(ExitKind::Trap)).sum()
}

/// (a), (b), (c).
struct CallCosts {
    /// Per repetition, µs.
    a: Vec<f64>,
    b: Vec<f64>,
    /// Median guest run time per mode, ms.
    run_ms: [f64; 3],
    /// Trace exits per vCPU in a traced run.
    traps_per_cpu: f64,
}

fn call_costs(kernel: &Path, cpus: u64, iters: u64, reps: usize) -> Result<CallCosts, Error> {
    let mut times = [Vec::new(), Vec::new(), Vec::new()];
    let mut a = Vec::new();
    let mut b = Vec::new();
    let mut traps_per_cpu = 0.0;
    for rep in 0..reps {
        let mut t = [0.0f64; 3];
        let mut x = [0u64; 3];
        for k in 0..3 {
            let m = (k + rep) % 3;
            let r = timed_run(kernel, cpus, iters, MODES[m])?;
            t[m] = us(r.guest);
            x[m] = r.traps;
            times[m].push(us(r.guest) / 1e3);
        }
        if x[1] != x[2] {
            return Err(Error::Runtime(format!(
                "resume-only and recorder runs took {} and {} trace exits for the same workload",
                x[1], x[2]
            )));
        }
        traps_per_cpu = x[1] as f64 / cpus as f64;
        a.push((t[1] - t[0]) / traps_per_cpu);
        b.push((t[2] - t[0]) / traps_per_cpu);
        eprintln!(
            "vmtrace bench: rep {}/{reps}: untraced {:.1} ms, resume-only {:.1} ms, recorder {:.1} ms, {} exits",
            rep + 1,
            t[0] / 1e3,
            t[1] / 1e3,
            t[2] / 1e3,
            x[1]
        );
    }
    Ok(CallCosts {
        a,
        b,
        run_ms: [median(&times[0]), median(&times[1]), median(&times[2])],
        traps_per_cpu,
    })
}

/// The handlers alone, in process: ns per `on_trap` for resume-only and the
/// recorder, on a Trap over the mini guest's memory (loaded, page tables set).
fn handler_alone(kernel: &Path) -> Result<(f64, f64), Error> {
    let vm = Vm::create(mini_config(kernel, 1, String::new())).map_err(input)?;
    let mem = vm.memory();
    let plan = Plan::new(kernel, &[TRACE_GLOB.to_string()], &[]).map_err(input)?;
    let index = Arc::new(SiteIndex::new(plan.targets.clone()));
    // RIP past the `out` (this host's convention), cycling over the sites;
    // RSP on the mini guest's first stack page.
    let rips: Vec<u64> = index.addrs.iter().map(|a| a + OUT_LEN).collect();
    let rsp = plan
        .image
        .symbol("__bss_start")
        .map(|s| s.addr + 0x800)
        .ok_or_else(|| Error::Runtime(format!("{} has no __bss_start", kernel.display())))?;
    let cr3 = vmm::layout::PML4_START;
    let time = |h: &mut dyn TrapHandler| -> Result<f64, Error> {
        let t = Instant::now();
        for i in 0..HANDLER_TRAPS {
            let mut trap =
                Trap::for_bench(0, rips[i % rips.len()], rsp, cr3, PagingMode::Level4, mem);
            h.on_trap(&mut trap).map_err(Error::Runtime)?;
        }
        h.flush();
        Ok(t.elapsed().as_secs_f64() * 1e9 / HANDLER_TRAPS as f64)
    };
    let resume = time(&mut ResumeOnly {
        index: Arc::clone(&index),
    })?;
    let (shared, mut recs, collector) = record::recorders(Arc::clone(&index), 1, u64::MAX);
    let mut rec = recs.pop().expect("one recorder");
    let recorder = time(&mut rec)?;
    drop(rec);
    let events = collector.join().map(|e| e.len()).unwrap_or(0);
    if events != HANDLER_TRAPS
        || shared
            .parent_unreadable
            .load(std::sync::atomic::Ordering::Relaxed)
            != 0
    {
        return Err(Error::Runtime(format!(
            "in-process recorder stored {events} of {HANDLER_TRAPS} events"
        )));
    }
    Ok((resume, recorder))
}

/// (d) for one vCPU count, µs.
struct PauseFigures {
    vcpus: u64,
    sites: usize,
    latency: Vec<f64>,
    window: Vec<f64>,
    attach: Vec<f64>,
    detach: Vec<f64>,
}

fn pause_figures(kernel: &Path, vcpus: u64, cycles: usize) -> Result<PauseFigures, Error> {
    let plan = Plan::new(kernel, &["*".to_string()], &[]).map_err(input)?;
    let sites = plan.targets.len();
    let vm = Vm::create(mini_config(kernel, vcpus, "mode=loop".into())).map_err(input)?;
    let ncpus = vm.cpus();
    let (mut tracer, handlers) = Tracer::new(plan, ncpus, 10_000_000);
    let running = vm.start(handlers, false).map_err(runtime)?;
    let mem = running.memory().clone();
    let gap = |i: usize| Duration::from_micros(1500 + 500 * (i % 3) as u64);
    let mut f = PauseFigures {
        vcpus,
        sites,
        latency: Vec::new(),
        window: Vec::new(),
        attach: Vec::new(),
        detach: Vec::new(),
    };
    let result = (|| -> Result<(), Error> {
        std::thread::sleep(SETTLE);
        for i in 0..cycles {
            let p = running.pause_all();
            f.latency.push(us(p.latency()));
            f.window.push(us(p.window()));
            drop(p);
            std::thread::sleep(gap(i));
        }
        for i in 0..cycles {
            {
                let p = running.pause_all();
                tracer.attach(&p, ncpus).map_err(input)?;
                f.attach.push(us(p.window()));
            }
            std::thread::sleep(gap(i));
            {
                let p = running.pause_all();
                tracer.detach(p.memory()).map_err(runtime)?;
                f.detach.push(us(p.window()));
            }
            std::thread::sleep(gap(i));
        }
        Ok(())
    })();
    let report = stop(running);
    // Whatever happened, no site stays patched.
    let detached = tracer.detach(&mem);
    let trace = tracer.finish(kernel, report.reason.to_string());
    result?;
    detached.map_err(runtime)?;
    if report.reason != StopReason::Requested {
        return Err(Error::Runtime(format!(
            "the mini guest ({vcpus} vCPUs, mode=loop) stopped on its own: {}; console: {}",
            report.reason,
            report.console_tail.join(" | ")
        )));
    }
    if trace.meta.events_total == 0 {
        return Err(Error::Runtime(format!(
            "no call traced in {cycles} attach cycles with {vcpus} vCPUs"
        )));
    }
    Ok(f)
}

/// (e) for one site count, µs.
struct AttachFigures {
    sites: usize,
    attach: Vec<f64>,
    detach: Vec<f64>,
}

/// (e) and the loading figure (ms per load).
fn attach_scaling(vmlinux: &Path) -> Result<(Vec<AttachFigures>, Vec<f64>, usize), Error> {
    // The sites `--trace '*'` patches, and their functions.
    let all = Plan::new(vmlinux, &["*".to_string()], &[]).map_err(input)?;
    let (all_targets, all_funcs, total_sites) =
        (all.targets.clone(), all.funcs.clone(), all.sites.len());
    drop(all);
    let cfg = VmConfig {
        kernel: vmlinux.to_owned(),
        initrd: None,
        cpus: 1,
        mem_mib: LINUX_MEM_MIB,
        cmdline: String::new(),
        console: Box::new(std::io::sink()),
        timeout: None,
        hide_hypercalls: emulator_host(),
    };
    let vm = Vm::create(cfg).map_err(input)?;
    let running = vm
        .start(vec![Box::new(NoTracer) as Box<dyn TrapHandler>], true)
        .map_err(runtime)?;
    // Held for the whole measurement: this guest never runs.
    let paused = running.pause_all();
    let mut loads = Vec::new();
    let mut figures = Vec::new();
    let result = (|| -> Result<(), Error> {
        let mut counts: Vec<usize> = E_SITES
            .iter()
            .copied()
            .filter(|&n| n < all_targets.len())
            .collect();
        counts.push(all_targets.len());
        for n in counts {
            let t = Instant::now();
            let image = KernelImage::load(vmlinux).map_err(input)?;
            let sites = SiteTable::build(&image).map_err(input)?;
            loads.push(t.elapsed().as_secs_f64() * 1e3);
            let step = (all_targets.len() / n).max(1);
            let targets: Vec<(u64, u32)> =
                all_targets.iter().step_by(step).take(n).copied().collect();
            let plan = Plan {
                image,
                sites,
                funcs: all_funcs.clone(),
                targets,
                skipped_init: 0,
            };
            let (mut tracer, handlers) = Tracer::new(plan, 1, 0);
            drop(handlers);
            let mut f = AttachFigures {
                sites: n,
                attach: Vec::new(),
                detach: Vec::new(),
            };
            for _ in 0..E_REPS {
                let t = Instant::now();
                let patched = tracer.attach(&paused, 1).map_err(input)?.patched;
                f.attach.push(us(t.elapsed()));
                eprintln!("DEBUG e {n} attach {:.1}", us(t.elapsed()));
                if patched != n {
                    tracer.detach(paused.memory()).map_err(runtime)?;
                    return Err(Error::Runtime(format!(
                        "patched {patched} of {n} sites of {}",
                        vmlinux.display()
                    )));
                }
                let t = Instant::now();
                let d = tracer.detach(paused.memory()).map_err(runtime)?;
                f.detach.push(us(t.elapsed()));
                if d.restored != n {
                    return Err(Error::Runtime(format!(
                        "restored {} of {n} sites of {}",
                        d.restored,
                        vmlinux.display()
                    )));
                }
            }
            tracer.finish(vmlinux, String::new());
            figures.push(f);
        }
        Ok(())
    })();
    // Stop before releasing the pause, so the kernel never starts.
    running.request_stop(StopReason::Requested);
    drop(paused);
    running.finish();
    result?;
    Ok((figures, loads, total_sites))
}

/// A deterministic synthetic trace: `events` calls of 500 functions from 200
/// callers on 4 vCPUs, skewed like a real trace (a few hot functions), with
/// 1 in 1,000 return addresses in no known function.
pub fn synthetic_trace(events: u64) -> Trace {
    const TEXT: u64 = 0xffff_ffff_8100_0000;
    const CALLER_TEXT: u64 = 0xffff_ffff_8200_0000;
    let functions: Vec<FuncSym> = (0..REPORT_FUNCS)
        .map(|i| FuncSym {
            name: format!("subsys{}_function_{i}", i % 17),
            addr: TEXT + i as u64 * 0x400,
            size: 0x300,
        })
        .collect();
    let callers: Vec<FuncSym> = (0..REPORT_CALLERS)
        .map(|i| FuncSym {
            name: format!("caller_{i}"),
            addr: CALLER_TEXT + i as u64 * 0x200,
            size: 0x200,
        })
        .collect();
    let mut counts = vec![vec![0u64; REPORT_CPUS as usize]; REPORT_FUNCS];
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        // xorshift64*
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let mut ev = Vec::with_capacity(events as usize);
    for i in 0..events {
        let r = next();
        // Skewed: the product of two uniforms favours small indices.
        let func = ((r % 1000) * ((r >> 10) % 1000) / 2000) as usize % REPORT_FUNCS;
        let cpu = (i % u64::from(REPORT_CPUS)) as u32;
        let parent = if (r >> 20) % 1000 == 0 {
            0xffff_ffff_8300_0000 + (r >> 32) % 0x1000
        } else {
            let c = (func * 7 + ((r >> 30) % 3) as usize) % REPORT_CALLERS;
            CALLER_TEXT + c as u64 * 0x200 + 0x10 + (r >> 40) % 0x100
        };
        counts[func][cpu as usize] += 1;
        ev.push(Event {
            ts_ns: 1_000_000 + i * 100,
            parent,
            func: func as u32,
            cpu,
        });
    }
    Trace {
        meta: TraceMeta {
            kernel: "synthetic".into(),
            build_id: None,
            cpus: REPORT_CPUS,
            attach_ns: 1_000_000,
            detach_ns: 1_000_000 + events * 100,
            sites_patched: REPORT_FUNCS as u64,
            events_total: events,
            stop_reason: "synthetic".into(),
            ..TraceMeta::default()
        },
        functions,
        counts,
        callers,
        events: ev,
    }
}

/// Seconds to render the text report with callers, and to export JSON.
fn report_figures(events: u64) -> Result<(f64, f64), Error> {
    let trace = synthetic_trace(events);
    let opts = ReportOptions {
        callers: true,
        ..ReportOptions::default()
    };
    let t = Instant::now();
    let text = report::render(&trace, &opts);
    let render = t.elapsed().as_secs_f64();
    let t = Instant::now();
    tracer::export::write_json(&trace, std::io::sink()).map_err(runtime)?;
    let json = t.elapsed().as_secs_f64();
    if !text.contains("caller_") {
        return Err(Error::Runtime("synthetic report has no callers".into()));
    }
    Ok((render, json))
}

/// One goal's verdict.
struct Goal {
    name: String,
    measured: String,
    /// None: not measured (and why).
    pass: Result<bool, String>,
}

/// A JSON string literal.
fn jstr(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A JSON number (non-finite values, which the figures never should be, as null).
fn jnum(v: f64) -> String {
    if v.is_finite() {
        format!("{v}")
    } else {
        "null".into()
    }
}

pub fn run(args: &BenchArgs) -> Result<Outcome, Error> {
    if args.iters == 0 {
        return Err(Error::Input("--iters must be at least 1".into()));
    }
    if args.cpus == 0 || args.cpus > u64::from(vmm::vm::MAX_CPUS) {
        return Err(Error::Input(format!(
            "--cpus {} is out of range; use 1 to {}",
            args.cpus,
            vmm::vm::MAX_CPUS
        )));
    }
    if args.reps == 0 || args.cycles == 0 || args.report_events == 0 {
        return Err(Error::Input(
            "--reps, --cycles and --report-events must be at least 1".into(),
        ));
    }
    let kernel = mini_kernel(args)?;
    let vmlinux = linux_vmlinux(args)?;
    if let Some(p) = &args.json {
        // Fail on an unwritable path now, not after two minutes.
        std::fs::File::create(p)
            .map_err(|e| Error::Input(format!("cannot create {}: {e}", p.display())))?;
    }
    let started = Instant::now();
    let emulated = emulator_host();

    eprintln!(
        "vmtrace bench: (a)(b) {} x 3 runs of {} (iters={}, {} vCPU)",
        args.reps,
        kernel.display(),
        args.iters,
        args.cpus
    );
    let costs = call_costs(&kernel, args.cpus, args.iters, args.reps)?;
    let a = median(&costs.a);
    let b = median(&costs.b);
    let c = b / a;
    if !(a > 0.0 && b > 0.0) {
        return Err(Error::Runtime(format!(
            "traced runs were not slower than untraced ones (a = {a:.2} µs, b = {b:.2} µs): \
             the runs are too short for this host's noise; raise --iters or --reps"
        )));
    }
    eprintln!("vmtrace bench: handlers alone, {HANDLER_TRAPS} traps each");
    let (h_resume, h_recorder) = handler_alone(&kernel)?;

    let mut pauses = Vec::new();
    for n in PAUSE_VCPUS {
        eprintln!(
            "vmtrace bench: (d) {n} vCPU(s), mode=loop: {} pauses, {} attach/detach cycles",
            args.cycles, args.cycles
        );
        pauses.push(pause_figures(&kernel, n, args.cycles)?);
    }

    let scaling = match &vmlinux {
        Some(v) => {
            eprintln!(
                "vmtrace bench: (e) attach windows on {} (loaded, not booted)",
                v.display()
            );
            Some(attach_scaling(v)?)
        }
        None => {
            eprintln!(
                "vmtrace bench: (e) and loading skipped: no guest/out/vmlinux \
                 (build it with `bash guest/build.sh linux`, or pass --vmlinux PATH)"
            );
            None
        }
    };

    eprintln!(
        "vmtrace bench: report of {} synthetic events",
        report::thousands(args.report_events)
    );
    let (render_s, json_s) = report_figures(args.report_events)?;

    // ---- figures ----
    let mut figures: Vec<(String, f64)> = vec![
        ("a_exit_round_trip_us".into(), a),
        ("b_traced_call_us".into(), b),
        ("c_ratio".into(), c),
        ("handler_resume_only_ns".into(), h_resume),
        ("handler_recorder_ns".into(), h_recorder),
        ("run_untraced_ms".into(), costs.run_ms[0]),
        ("run_resume_only_ms".into(), costs.run_ms[1]),
        ("run_recorder_ms".into(), costs.run_ms[2]),
    ];
    for p in &pauses {
        let n = p.vcpus;
        for (what, v) in [
            ("latency", &p.latency),
            ("window", &p.window),
            ("attach_window", &p.attach),
            ("detach_window", &p.detach),
        ] {
            figures.push((format!("d_{n}cpu_{what}_p50_us"), pct(v, 50.0)));
            figures.push((format!("d_{n}cpu_{what}_p99_us"), pct(v, 99.0)));
        }
    }
    if let Some((e, loads, _)) = &scaling {
        for f in e {
            figures.push((format!("e_{}_sites_attach_us", f.sites), median(&f.attach)));
            figures.push((format!("e_{}_sites_attach_max_us", f.sites), max(&f.attach)));
            figures.push((format!("e_{}_sites_detach_us", f.sites), median(&f.detach)));
        }
        figures.push(("load_ms".into(), median(loads)));
    }
    figures.push(("report_render_s".into(), render_s));
    figures.push(("report_json_s".into(), json_s));

    // ---- goals ----
    let mut goals = vec![Goal {
        name: format!("cost per traced call <= {GOAL_RATIO} x exit round trip"),
        measured: format!("b/a = {c:.3} ({b:.2} / {a:.2} µs)"),
        pass: Ok(c <= GOAL_RATIO),
    }];
    let window_goal = |sites: &str, limit: f64, pick: &dyn Fn(&AttachFigures) -> bool| {
        let name = format!("pause window for {sites} sites <= {} ms", limit / 1e3);
        match &scaling {
            Some((e, _, _)) => match e.iter().find(|f| pick(f)) {
                Some(f) => Goal {
                    name,
                    measured: format!(
                        "{:.1} µs for {} sites (p50 of {E_REPS}; max {:.1} µs)",
                        median(&f.attach),
                        f.sites,
                        max(&f.attach)
                    ),
                    pass: Ok(median(&f.attach) <= limit),
                },
                None => Goal {
                    name,
                    measured: "-".into(),
                    pass: Err("the vmlinux has fewer sites".into()),
                },
            },
            None => Goal {
                name,
                measured: "-".into(),
                pass: Err("no vmlinux".into()),
            },
        }
    };
    let nall = scaling
        .as_ref()
        .map(|(e, _, _)| e.last().map(|f| f.sites).unwrap_or(0))
        .unwrap_or(0);
    goals.push(window_goal("100", GOAL_WINDOW_100_US, &|f| f.sites == 100));
    goals.push(window_goal("all", GOAL_WINDOW_ALL_US, &|f| f.sites == nall));
    goals.push(match &scaling {
        Some((_, loads, total)) => Goal {
            name: format!("symbol + site loading <= {GOAL_LOAD_MS} ms"),
            measured: format!(
                "{:.1} ms for {} sites (median of {}; {:.1}..{:.1})",
                median(loads),
                report::thousands(*total as u64),
                loads.len(),
                min(loads),
                max(loads)
            ),
            pass: Ok(median(loads) <= GOAL_LOAD_MS),
        },
        None => Goal {
            name: format!("symbol + site loading <= {GOAL_LOAD_MS} ms"),
            measured: "-".into(),
            pass: Err("no vmlinux".into()),
        },
    });
    goals.push(Goal {
        name: format!(
            "report for {} events <= {GOAL_REPORT_S} s",
            report::thousands(GOAL_REPORT_EVENTS)
        ),
        measured: format!(
            "{render_s:.3} s for {} events",
            report::thousands(args.report_events)
        ),
        pass: if args.report_events == GOAL_REPORT_EVENTS {
            Ok(render_s <= GOAL_REPORT_S)
        } else {
            Err(format!(
                "measured with {} events, not {}",
                report::thousands(args.report_events),
                report::thousands(GOAL_REPORT_EVENTS)
            ))
        },
    });

    // ---- table ----
    let mut o = String::new();
    use std::fmt::Write as _;
    let _ = writeln!(
        o,
        "vmtrace bench: mini guest {}, {} vCPU, iters={}, {} runs per configuration",
        kernel.display(),
        args.cpus,
        args.iters,
        args.reps
    );
    if emulated {
        let _ = writeln!(
            o,
            "host: KVM emulates guest ring 0 here (kvm_pvm): absolute times are several times \
             bare metal; compare the ratios"
        );
    }
    let _ = writeln!(o);
    let spread = |v: &[f64]| format!("{:.2} .. {:.2}", min(v), max(v));
    let _ = writeln!(o, "{:<58} {:>12}  {}", "figure", "value", "spread / detail");
    let _ = writeln!(
        o,
        "{:<58} {:>12}  min .. max of {} reps; {:.1} exits/vCPU per traced run",
        "(a) exit round trip (resume-only handler)",
        format!("{a:.2} µs"),
        args.reps,
        costs.traps_per_cpu
    );
    let _ = writeln!(o, "{:<58} {:>12}  {}", "", "", spread(&costs.a));
    let _ = writeln!(
        o,
        "{:<58} {:>12}  {}",
        "(b) cost per traced call (recorder)",
        format!("{b:.2} µs"),
        spread(&costs.b)
    );
    let _ = writeln!(
        o,
        "{:<58} {:>12}  goal <= {GOAL_RATIO}",
        "(c) b / a",
        format!("{c:.3}")
    );
    let _ = writeln!(
        o,
        "{:<58} {:>12}  run times (median): untraced {:.1} ms, resume-only {:.1} ms, recorder {:.1} ms",
        "",
        "",
        costs.run_ms[0],
        costs.run_ms[1],
        costs.run_ms[2]
    );
    let _ = writeln!(
        o,
        "{:<58} {:>12}  in process, no exit: cross-check of b - a",
        "    handler alone: recorder",
        format!("{h_recorder:.0} ns")
    );
    let _ = writeln!(
        o,
        "{:<58} {:>12}",
        "    handler alone: resume-only",
        format!("{h_resume:.0} ns")
    );
    for p in &pauses {
        let row = |what: &str, v: &[f64]| {
            format!(
                "{:<58} {:>12}  p99 {:.1} µs (max {:.1})",
                format!("(d) {} vCPU, mode=loop: {what}", p.vcpus),
                format!("{:.1} µs", pct(v, 50.0)),
                pct(v, 99.0),
                max(v)
            )
        };
        let _ = writeln!(o, "{}", row("pause latency p50", &p.latency));
        let _ = writeln!(o, "{}", row("empty pause window p50", &p.window));
        let _ = writeln!(
            o,
            "{}",
            row(&format!("attach window p50 ({} sites)", p.sites), &p.attach)
        );
        let _ = writeln!(
            o,
            "{}",
            row(&format!("detach window p50 ({} sites)", p.sites), &p.detach)
        );
    }
    match &scaling {
        Some((e, loads, total)) => {
            for f in e {
                let _ = writeln!(
                    o,
                    "{:<58} {:>12}  max {:.1} µs; detach {:.1} µs",
                    format!(
                        "(e) attach window, {} sites (Linux image)",
                        report::thousands(f.sites as u64)
                    ),
                    format!("{:.1} µs", median(&f.attach)),
                    max(&f.attach),
                    median(&f.detach)
                );
            }
            let _ = writeln!(
                o,
                "{:<58} {:>12}  {} loads, {:.1} .. {:.1} ms; {} sites",
                "symbol + site loading (vmlinux)",
                format!("{:.1} ms", median(loads)),
                loads.len(),
                min(loads),
                max(loads),
                report::thousands(*total as u64)
            );
        }
        None => {
            let _ = writeln!(
                o,
                "(e) and loading: not measured, no vmlinux (bash guest/build.sh linux, or --vmlinux PATH)"
            );
        }
    }
    let _ = writeln!(
        o,
        "{:<58} {:>12}",
        format!(
            "report, {} events, text with callers",
            report::thousands(args.report_events)
        ),
        format!("{render_s:.3} s")
    );
    let _ = writeln!(
        o,
        "{:<58} {:>12}",
        "JSON export, same trace",
        format!("{json_s:.3} s")
    );
    let _ = writeln!(o);
    let _ = writeln!(o, "goals:");
    for g in &goals {
        let verdict = match &g.pass {
            Ok(true) => "PASS".to_string(),
            Ok(false) => "MISS".to_string(),
            Err(_) => "SKIP".to_string(),
        };
        let why = match &g.pass {
            Err(w) => format!(" (not judged: {w})"),
            _ => String::new(),
        };
        let _ = writeln!(o, "  {verdict}  {:<48} {}{why}", g.name, g.measured);
    }
    let _ = writeln!(o);
    let _ = writeln!(o, "methods:");
    for (k, m) in methods() {
        let _ = writeln!(o, "  {k} {m}");
    }
    let _ = writeln!(o, "\nbench took {:.1} s", started.elapsed().as_secs_f64());
    print!("{o}");
    let _ = std::io::stdout().flush();

    if let Some(path) = &args.json {
        let mut j = String::from("{\n");
        let _ = writeln!(j, "  \"schema\": \"vmtrace-bench/1\",");
        let _ = writeln!(j, "  \"kernel\": {},", jstr(&kernel.display().to_string()));
        let _ = writeln!(
            j,
            "  \"vmlinux\": {},",
            vmlinux
                .as_ref()
                .map(|v| jstr(&v.display().to_string()))
                .unwrap_or_else(|| "null".into())
        );
        let _ = writeln!(j, "  \"emulator_host\": {emulated},");
        let _ = writeln!(j, "  \"iters\": {},", args.iters);
        let _ = writeln!(j, "  \"cpus\": {},", args.cpus);
        let _ = writeln!(j, "  \"reps\": {},", args.reps);
        let _ = writeln!(j, "  \"cycles\": {},", args.cycles);
        let _ = writeln!(j, "  \"report_events\": {},", args.report_events);
        let _ = writeln!(j, "  \"figures\": {{");
        for (i, (k, v)) in figures.iter().enumerate() {
            let comma = if i + 1 < figures.len() { "," } else { "" };
            let _ = writeln!(j, "    {}: {}{comma}", jstr(k), jnum(*v));
        }
        let _ = writeln!(j, "  }},");
        let _ = writeln!(j, "  \"goals\": [");
        for (i, g) in goals.iter().enumerate() {
            let comma = if i + 1 < goals.len() { "," } else { "" };
            let status = match &g.pass {
                Ok(true) => "PASS",
                Ok(false) => "MISS",
                Err(_) => "SKIP",
            };
            let _ = writeln!(
                j,
                "    {{\"goal\": {}, \"measured\": {}, \"status\": \"{status}\"}}{comma}",
                jstr(&g.name),
                jstr(&g.measured)
            );
        }
        let _ = writeln!(j, "  ],");
        let _ = writeln!(j, "  \"methods\": {{");
        let ms = methods();
        for (i, (k, m)) in ms.iter().enumerate() {
            let comma = if i + 1 < ms.len() { "," } else { "" };
            let _ = writeln!(j, "    {}: {}{comma}", jstr(k), jstr(m));
        }
        let _ = writeln!(j, "  }}");
        j.push_str("}\n");
        std::fs::write(path, j)
            .map_err(|e| Error::Runtime(format!("cannot write {}: {e}", path.display())))?;
    }
    Ok(Outcome::Clean)
}

/// How each figure is measured (printed, and saved in the JSON).
fn methods() -> Vec<(&'static str, String)> {
    vec![
        (
            "(a)",
            format!(
                "(T_resume-only - T_untraced) / exits per vCPU: the mini guest (count mode) booted \
                 untraced and with the {TRACE_GLOB} sites patched, timed from resume to power-off; the \
                 resume-only handler just finds the site and resumes after it, so this is one `out` \
                 exit through KVM and vmtrace's vCPU loop and back"
            ),
        ),
        (
            "(b)",
            "(T_recorder - T_untraced) / exits per vCPU, same runs with vmtrace's real Recorder \
             (configurations interleaved in rotating order, medians over the repetitions)"
                .into(),
        ),
        ("(c)", "median(b) / median(a)".into()),
        (
            "(d)",
            "mini guest in mode=loop with 1, 2, 4 vCPUs running: latency = pause request to all \
             vCPUs parked; window = all parked to release (empty pauses, then pauses in which all \
             9 patchable sites are attached, or detached)"
                .into(),
        ),
        (
            "(e)",
            format!(
                "the Linux vmlinux loaded into a VM at its physical addresses, started paused and \
                 never booted; Tracer::attach (vmlinux check + patching, what a live attach does \
                 while all vCPUs are parked) timed for 10, 100, 1,000 and all sites --trace '*' \
                 selects, spread evenly over the text, p50 of {E_REPS}"
            ),
        ),
        (
            "load",
            "KernelImage::load + SiteTable::build of the vmlinux, median over the loads done for (e)"
                .into(),
        ),
        (
            "report",
            format!(
                "report::render with callers of a synthetic trace ({REPORT_FUNCS} functions, \
                 {REPORT_CALLERS} callers, {REPORT_CPUS} vCPUs), and export::write_json to a sink"
            ),
        ),
    ]
}
