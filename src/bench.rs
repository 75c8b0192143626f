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
//! **(a), (b), (c): per traced call.** One mini guest in `mode=loop` (each
//! vCPU iterates its hrtimer-like workload until stopped), `--cpus` vCPUs
//! (1 by default: no competition for this 2-core host's CPUs). The guest runs
//! in phases of three kinds:
//!
//! - **untraced**: no site patched;
//! - **resume-only**: the `hrtimer_*` sites patched (`hrtimer_start_range_ns`,
//!   `hrtimer_try_to_cancel`, `hrtimer_interrupt`, `hrtimer_wakeup`: 3.5
//!   calls per iteration), each trap handled by the least any trap handler
//!   must do: find the site from RIP (the `SiteIndex` lookup the recorder
//!   uses too) and resume the guest after it;
//! - **recorder**: the same sites, with vmtrace's real per-vCPU `Recorder`
//!   (clock read, exact counter, caller read from the guest stack, event
//!   buffered and handed to the collector thread).
//!
//! Each phase runs until every vCPU has made `--iters` more iterations, read
//! from the guest's own counters (`mini_cpus[cpu].count[do_idle]`) through
//! its page tables, polled every `PHASE_POLL`; `t` = µs per iteration per
//! vCPU. Phases switch under a pause (attach, detach, or flip the handler's
//! mode), in rotating order, `--rounds` rounds. The guest executes the same
//! instructions in all three (a 5-byte NOP, or `out` + `nop3` of which only
//! the `out` runs), so with `X` the exits per iteration (counted by the
//! handler over all traced phases):
//!
//! - **(a) exit round trip** = (t_resume-only − t_untraced) / X: one `out`
//!   exit from the guest to vmtrace's vCPU loop and back into KVM_RUN with
//!   the cheapest correct handler: the floor for any trap-based tracer on
//!   this VMM and host;
//! - **(b) traced call** = (t_recorder − t_untraced) / X;
//! - **(c)** = b / a per round; a, b, c are medians over the rounds. Goal ≤
//!   1.2: the recorder adds at most 20 % to the exit it cannot avoid.
//!
//! Why phases in one running guest rather than separate boots per
//! configuration: on this host a freshly created VM runs much slower at first
//! (its memory is faulted in and shadowed as it is touched), and by a
//! different amount each boot; separate count-mode runs gave per-exit
//! figures scattered over ±40 %, while interleaved phases of a warm guest
//! agree within a few per cent. As a cross-check of b − a, both handlers are
//! also timed alone, in process, on a `Trap` over the mini guest's memory (no
//! exit; the cold caches after a real exit are not in that figure).
//!
//! **(d) pause**: the mini guest in `mode=loop` with 1, 2 and 4 vCPUs, all
//! running; `--cycles` empty pauses (latency = request to all parked; window
//! = all parked to release, nothing done), then `--cycles` attach and detach
//! cycles of all its patchable sites (9: `mini_init_setup` is init text),
//! each in its own pause, window measured the same way.
//!
//! **(e) attach window vs. sites**: the mini guest has 10 sites, so the Linux
//! vmlinux (`--vmlinux`, default guest/out/vmlinux) is loaded into a VM at its
//! physical addresses, with the boot page tables, started paused and never
//! run (booting Linux takes minutes on emulating hosts). `Tracer::attach` —
//! the vmlinux check and the patching, exactly what a live attach does while
//! the vCPUs are parked, so the pause window it needs — is timed for 10, 100,
//! 1,000 and all of the sites `--trace '*'` selects (spread evenly over the
//! text), `E_REPS` times each with a `detach` between; the first is reported
//! apart (cold caches), the goals are judged on the worst.
//!
//! **Loading**: `KernelImage::load` + `SiteTable::build` of that vmlinux.
//!
//! **Report**: `report::render` with callers, and the JSON export, of a
//! synthetic trace of `--report-events` events (default 10 M) over 500
//! functions, 200 callers, 4 vCPUs.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracer::patch::TextMap;
use tracer::record::{self, SiteIndex};
use tracer::report::{self, ReportOptions};
use tracer::sites::{SiteTable, SITE_LEN};
use tracer::symbols::KernelImage;
use tracer::trace::{SYNTH_CALLERS, SYNTH_CPUS, SYNTH_FUNCS};
use tracer::tracing::{Plan, Tracer};
use vmm::gva::PagingMode;
use vmm::{NoTracer, Running, StopReason, Trap, TrapHandler, Vm, VmConfig};

use crate::cli::BenchArgs;
use crate::session::{emulator_host, Error, Outcome};

/// The functions traced for (a) and (b).
const TRACE_GLOB: &str = "hrtimer_*";
/// Guest memory of the mini guest, MiB.
const MINI_MEM_MIB: u64 = 64;
/// Guest memory for the Linux image of (e), MiB (its segments end below 27 MiB).
const LINUX_MEM_MIB: u64 = 96;
/// No measured phase of (a)/(b) may take longer.
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
/// The mini guest's per-vCPU counters, and how many vCPU blocks it has.
const MINI_CPUS: &str = "mini_cpus";
const MINI_MAX_CPUS: u64 = 64;
/// How often a (a)/(b) phase looks at the guest's iteration counters.
const PHASE_POLL: Duration = Duration::from_micros(500);
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

/// The mini guest in `mode=loop` (stopped by the bench, so no timeout).
fn mini_config(kernel: &Path, cpus: u64) -> VmConfig {
    VmConfig {
        kernel: kernel.to_owned(),
        initrd: None,
        cpus,
        mem_mib: MINI_MEM_MIB,
        cmdline: "mode=loop".into(),
        console: Box::new(std::io::sink()),
        timeout: None,
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

/// Stop a guest that is still running, wait for its threads.
fn stop(running: Running) -> vmm::RunReport {
    running.request_stop(StopReason::Requested);
    running.finish()
}

/// End a measured run: stop the guest, restore every site whatever happened,
/// then fail if the measurement failed, the guest stopped on its own, or
/// nothing was traced.
fn wind_down(
    running: Running,
    mut tracer: Tracer,
    kernel: &Path,
    result: Result<(), Error>,
    what: &str,
) -> Result<(), Error> {
    let mem = running.memory().clone();
    let report = stop(running);
    let detached = tracer.detach(&mem);
    let trace = tracer.finish(kernel, report.reason.to_string());
    result?;
    detached.map_err(runtime)?;
    if report.reason != StopReason::Requested {
        return Err(Error::Runtime(format!(
            "{what} stopped on its own: {}; console: {}",
            report.reason,
            report.console_tail.join(" | ")
        )));
    }
    if trace.meta.events_total == 0 {
        return Err(Error::Runtime(format!("{what}: no call was traced")));
    }
    Ok(())
}

/// One vCPU's handler for (a) and (b): resume-only or the real recorder,
/// chosen by a flag the controller flips while the guest is paused, and a
/// count of traps (one writer: a plain load and store).
struct Switch {
    record: Arc<AtomicBool>,
    traps: Arc<AtomicU64>,
    resume: ResumeOnly,
    recorder: Box<dyn TrapHandler>,
}

impl TrapHandler for Switch {
    fn on_trap(&mut self, trap: &mut Trap<'_>) -> Result<(), String> {
        self.traps
            .store(self.traps.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        if self.record.load(Ordering::Relaxed) {
            self.recorder.on_trap(trap)
        } else {
            self.resume.on_trap(trap)
        }
    }

    fn flush(&mut self) {
        self.recorder.flush();
    }
}

/// The mini guest's own iteration counters (`mini_cpus[cpu].count[do_idle]`),
/// read through its page tables while it runs (an aligned u64 the guest
/// stores with one instruction) or while it is paused.
struct IterCounters<'a> {
    map: TextMap<'a>,
    vas: Vec<u64>,
}

impl<'a> IterCounters<'a> {
    /// `map`: a TextMap over the mini guest's memory and boot page tables.
    fn new(map: TextMap<'a>, image: &KernelImage, ncpus: usize) -> Result<Self, Error> {
        let sym = image.symbol(MINI_CPUS).ok_or_else(|| {
            Error::Input(format!(
                "{} has no {MINI_CPUS} symbol",
                image.path.display()
            ))
        })?;
        let stride = sym.size / MINI_MAX_CPUS;
        if sym.size % MINI_MAX_CPUS != 0 || stride < 8 {
            return Err(Error::Input(format!(
                "{MINI_CPUS} in {} is {} bytes, not {MINI_MAX_CPUS} per-vCPU blocks",
                image.path.display(),
                sym.size
            )));
        }
        Ok(IterCounters {
            map,
            vas: (0..ncpus as u64).map(|c| sym.addr + c * stride).collect(),
        })
    }

    fn read(&mut self) -> Result<Vec<u64>, Error> {
        self.vas
            .iter()
            .map(|&va| {
                self.map
                    .read::<8>(va)
                    .map(u64::from_le_bytes)
                    .map_err(|e| Error::Runtime(format!("reading the guest's counters: {e}")))
            })
            .collect()
    }
}

/// (a), (b), (c).
struct CallCosts {
    /// Per round, µs.
    a: Vec<f64>,
    b: Vec<f64>,
    /// Per round, µs: (T_recorder - T_resume-only) per exit.
    b_minus_a: Vec<f64>,
    /// Median µs per iteration per vCPU, by mode.
    iter_us: [f64; 3],
    /// Trace exits per iteration (measured).
    exits_per_iter: f64,
}

/// Figures (a) and (b): the mini guest in `mode=loop`, phases of `iters`
/// iterations per vCPU, untraced / resume-only / recorder in rotating order,
/// `reps` rounds. See the module documentation.
fn call_costs(kernel: &Path, cpus: u64, iters: u64, reps: usize) -> Result<CallCosts, Error> {
    let plan = Plan::new(kernel, &[TRACE_GLOB.to_string()], &[]).map_err(input)?;
    let index = Arc::new(SiteIndex::new(plan.targets.clone()));
    let vm = Vm::create(mini_config(kernel, cpus)).map_err(input)?;
    let ncpus = vm.cpus();
    let (mut tracer, recorders) = Tracer::new(plan, ncpus, u64::MAX);
    let record = Arc::new(AtomicBool::new(false));
    let traps: Vec<Arc<AtomicU64>> = (0..ncpus).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let handlers: Vec<Box<dyn TrapHandler>> = recorders
        .into_iter()
        .zip(&traps)
        .map(|(recorder, t)| {
            Box::new(Switch {
                record: Arc::clone(&record),
                traps: Arc::clone(t),
                resume: ResumeOnly {
                    index: Arc::clone(&index),
                },
                recorder,
            }) as Box<dyn TrapHandler>
        })
        .collect();
    let running = vm.start(handlers, false).map_err(runtime)?;
    let mem = running.memory().clone();
    let total_traps = || traps.iter().map(|t| t.load(Ordering::Relaxed)).sum::<u64>();
    let mut out = CallCosts {
        a: Vec::new(),
        b: Vec::new(),
        b_minus_a: Vec::new(),
        iter_us: [0.0; 3],
        exits_per_iter: 0.0,
    };
    let mut taus: [Vec<f64>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    let result = (|| -> Result<(), Error> {
        let map = TextMap::new(&mem, vmm::layout::PML4_START, PagingMode::Level4);
        let mut counters = IterCounters::new(map, &tracer.plan().image, ncpus)?;
        std::thread::sleep(SETTLE);
        let (mut traced_iters, mut traced_traps) = (0u64, 0u64);
        // Exact counts at the start of the phase running now (read paused).
        let mut pending: Option<(usize, u64, u64)> = None;
        let mut rounds: Vec<[f64; 3]> = Vec::new();
        for round in 0..reps {
            let mut tau = [0.0f64; 3];
            for k in 0..3 {
                let m = (k + round) % 3;
                // Between phases: read the exact counts, switch, resume.
                let start = {
                    let p = running.pause_all();
                    let now = counters.read()?.iter().sum::<u64>();
                    let tr = total_traps();
                    if let Some((pm, i0, t0)) = pending.take() {
                        if MODES[pm] != Mode::Untraced {
                            traced_iters += now - i0;
                            traced_traps += tr - t0;
                        }
                    }
                    match MODES[m] {
                        Mode::Untraced => {
                            if tracer.is_attached() {
                                tracer.detach(p.memory()).map_err(runtime)?;
                            }
                        }
                        mode => {
                            record.store(mode == Mode::Recorder, Ordering::Relaxed);
                            if !tracer.is_attached() {
                                tracer.attach(&p, ncpus).map_err(input)?;
                            }
                        }
                    }
                    pending = Some((m, now, tr));
                    counters.read()?
                };
                let t0 = Instant::now();
                loop {
                    std::thread::sleep(PHASE_POLL);
                    if let Some(r) = running.wait_stop(Duration::ZERO) {
                        return Err(Error::Runtime(format!("the mini guest stopped: {r}")));
                    }
                    let now = counters.read()?;
                    let elapsed = t0.elapsed();
                    let done: Vec<u64> = now.iter().zip(&start).map(|(n, s)| n - s).collect();
                    if done.iter().all(|&d| d >= iters) {
                        let per_cpu = done.iter().sum::<u64>() as f64 / ncpus as f64;
                        tau[m] = us(elapsed) / per_cpu;
                        break;
                    }
                    if elapsed > RUN_TIMEOUT {
                        return Err(Error::Runtime(format!(
                            "the mini guest did only {done:?} iterations in {} s ({} phase)",
                            elapsed.as_secs(),
                            MODES[m].name()
                        )));
                    }
                }
            }
            eprintln!(
                "vmtrace bench: round {}/{reps}: µs per iteration: untraced {:.1}, resume-only {:.1}, recorder {:.1}",
                round + 1,
                tau[0],
                tau[1],
                tau[2]
            );
            rounds.push(tau);
        }
        {
            let p = running.pause_all();
            let now = counters.read()?.iter().sum::<u64>();
            if let Some((pm, i0, t0)) = pending.take() {
                if MODES[pm] != Mode::Untraced {
                    traced_iters += now - i0;
                    traced_traps += total_traps() - t0;
                }
            }
            if tracer.is_attached() {
                tracer.detach(p.memory()).map_err(runtime)?;
            }
        }
        if traced_iters == 0 || traced_traps == 0 {
            return Err(Error::Runtime(format!(
                "no {TRACE_GLOB} call trapped in the traced phases"
            )));
        }
        let e = traced_traps as f64 / traced_iters as f64;
        out.exits_per_iter = e;
        for tau in &rounds {
            out.a.push((tau[1] - tau[0]) / e);
            out.b.push((tau[2] - tau[0]) / e);
            out.b_minus_a.push((tau[2] - tau[1]) / e);
            for m in 0..3 {
                taus[m].push(tau[m]);
            }
        }
        out.iter_us = [median(&taus[0]), median(&taus[1]), median(&taus[2])];
        Ok(())
    })();
    wind_down(running, tracer, kernel, result, "the mini guest")?;
    Ok(out)
}

/// The handlers alone, in process: ns per `on_trap` for resume-only and the
/// recorder, on a Trap over the mini guest's memory (loaded, page tables set).
fn handler_alone(kernel: &Path) -> Result<(f64, f64), Error> {
    let vm = Vm::create(mini_config(kernel, 1)).map_err(input)?;
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
    let vm = Vm::create(mini_config(kernel, vcpus)).map_err(input)?;
    let ncpus = vm.cpus();
    let (mut tracer, handlers) = Tracer::new(plan, ncpus, 10_000_000);
    let running = vm.start(handlers, false).map_err(runtime)?;
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
        let stopped = || match running.wait_stop(Duration::ZERO) {
            Some(r) => Err(Error::Runtime(format!("the mini guest stopped: {r}"))),
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
    wind_down(
        running,
        tracer,
        kernel,
        result,
        &format!("the mini guest ({vcpus} vCPUs, mode=loop)"),
    )?;
    Ok(f)
}

/// (e) for one site count, µs.
struct AttachFigures {
    /// "10", "100", "1000" or "all".
    label: String,
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
        let mut counts: Vec<(String, usize)> = E_SITES
            .iter()
            .filter(|&&n| n < all_targets.len())
            .map(|&n| (n.to_string(), n))
            .collect();
        counts.push(("all".into(), all_targets.len()));
        for (label, n) in counts {
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
                label,
                sites: n,
                attach: Vec::new(),
                detach: Vec::new(),
            };
            for _ in 0..E_REPS {
                let t = Instant::now();
                let patched = tracer.attach(&paused, 1).map_err(input)?.patched;
                f.attach.push(us(t.elapsed()));
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

/// Seconds to render the text report with callers, and to export JSON.
fn report_figures(events: u64) -> Result<(f64, f64), Error> {
    let trace = tracer::trace::Trace::synthetic(events);
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
    /// Met or not; Err: not judged, and why.
    pass: Result<bool, String>,
}

impl Goal {
    fn status(&self) -> &'static str {
        match self.pass {
            Ok(true) => "PASS",
            Ok(false) => "MISS",
            Err(_) => "SKIP",
        }
    }
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

/// A JSON number (a non-finite value, which no figure should be, as null).
fn jnum(v: f64) -> String {
    if v.is_finite() {
        format!("{v}")
    } else {
        "null".into()
    }
}

/// Everything measured.
struct Results {
    costs: CallCosts,
    a: f64,
    b: f64,
    c: f64,
    /// Handlers alone, ns: resume-only, recorder.
    handlers: (f64, f64),
    pauses: Vec<PauseFigures>,
    /// (e), loads (ms), sites in the vmlinux's table.
    scaling: Option<(Vec<AttachFigures>, Vec<f64>, usize)>,
    render_s: f64,
    json_s: f64,
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
    if args.rounds == 0 || args.cycles == 0 || args.report_events == 0 {
        return Err(Error::Input(
            "--rounds, --cycles and --report-events must be at least 1".into(),
        ));
    }
    let kernel = mini_kernel(args)?;
    let vmlinux = linux_vmlinux(args)?;
    if let Some(p) = &args.json {
        // Fail on an unwritable path now, not after a minute of measuring.
        std::fs::File::create(p)
            .map_err(|e| Error::Input(format!("cannot create {}: {e}", p.display())))?;
    }
    let started = Instant::now();

    eprintln!(
        "vmtrace bench: (a)(b) {} rounds of 3 phases x {} iterations of {} ({} vCPU, mode=loop)",
        args.rounds,
        args.iters,
        kernel.display(),
        args.cpus
    );
    let costs = call_costs(&kernel, args.cpus, args.iters, args.rounds)?;
    let a = median(&costs.a);
    let b = median(&costs.b);
    let ratios: Vec<f64> = costs.a.iter().zip(&costs.b).map(|(a, b)| b / a).collect();
    let c = median(&ratios);
    if !(a > 0.0 && b > 0.0 && c > 0.0) {
        return Err(Error::Runtime(format!(
            "traced phases were not slower than untraced ones (a = {a:.2} µs, b = {b:.2} µs): \
             the phases are too short for this host's noise; raise --iters or --rounds"
        )));
    }
    eprintln!("vmtrace bench: handlers alone, {HANDLER_TRAPS} traps each");
    let handlers = handler_alone(&kernel)?;

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

    let r = Results {
        costs,
        a,
        b,
        c,
        handlers,
        pauses,
        scaling,
        render_s,
        json_s,
    };
    let figures = figures(&r);
    let goals = goals(&r, args);
    print!(
        "{}",
        table(&r, &goals, args, &kernel, vmlinux.as_deref(), started)
    );
    let _ = std::io::stdout().flush();
    if let Some(path) = &args.json {
        let j = json(&figures, &goals, args, &kernel, vmlinux.as_deref());
        std::fs::write(path, j)
            .map_err(|e| Error::Runtime(format!("cannot write {}: {e}", path.display())))?;
    }
    Ok(Outcome::Clean)
}

/// The figures by name, as saved in the JSON. Those named `a_`..`e_` are
/// the figures (a) to (e).
fn figures(r: &Results) -> Vec<(String, f64)> {
    let mut f: Vec<(String, f64)> = vec![
        ("a_exit_round_trip_us".into(), r.a),
        ("b_traced_call_us".into(), r.b),
        ("c_ratio".into(), r.c),
        (
            "recorder_extra_per_call_us".into(),
            median(&r.costs.b_minus_a),
        ),
        ("iter_untraced_us".into(), r.costs.iter_us[0]),
        ("iter_resume_only_us".into(), r.costs.iter_us[1]),
        ("iter_recorder_us".into(), r.costs.iter_us[2]),
        ("exits_per_iter".into(), r.costs.exits_per_iter),
        ("handler_resume_only_ns".into(), r.handlers.0),
        ("handler_recorder_ns".into(), r.handlers.1),
    ];
    for p in &r.pauses {
        let n = p.vcpus;
        for (what, v) in [
            ("latency", &p.latency),
            ("window", &p.window),
            ("attach_window", &p.attach),
            ("detach_window", &p.detach),
        ] {
            f.push((format!("d_{n}cpu_{what}_p50_us"), pct(v, 50.0)));
            f.push((format!("d_{n}cpu_{what}_p99_us"), pct(v, 99.0)));
        }
        f.push((format!("d_{n}cpu_sites"), p.sites as f64));
    }
    if let Some((e, loads, total)) = &r.scaling {
        for s in e {
            let l = &s.label;
            f.push((format!("e_{l}_sites_attach_first_us"), s.attach[0]));
            f.push((format!("e_{l}_sites_attach_p50_us"), median(&s.attach)));
            f.push((format!("e_{l}_sites_attach_max_us"), max(&s.attach)));
            f.push((format!("e_{l}_sites_detach_p50_us"), median(&s.detach)));
            f.push((format!("e_{l}_sites"), s.sites as f64));
        }
        f.push(("load_ms".into(), median(loads)));
        f.push(("load_sites".into(), *total as f64));
    }
    f.push(("report_render_s".into(), r.render_s));
    f.push(("report_json_s".into(), r.json_s));
    f
}

fn goals(r: &Results, args: &BenchArgs) -> Vec<Goal> {
    let mut goals = vec![Goal {
        name: format!("cost per traced call <= {GOAL_RATIO} x exit round trip"),
        measured: format!("b/a = {:.3} (b {:.2} µs, a {:.2} µs)", r.c, r.b, r.a),
        pass: Ok(r.c <= GOAL_RATIO),
    }];
    for (label, limit) in [("100", GOAL_WINDOW_100_US), ("all", GOAL_WINDOW_ALL_US)] {
        let name = format!("pause window for {label} sites <= {} ms", limit / 1e3);
        let found = r
            .scaling
            .as_ref()
            .and_then(|(e, _, _)| e.iter().find(|f| f.label == label));
        goals.push(match (found, &r.scaling) {
            (Some(f), _) => Goal {
                name,
                measured: format!(
                    "worst {:.1} µs of {E_REPS} attaches of {} sites (first {:.1}, p50 {:.1})",
                    max(&f.attach),
                    report::thousands(f.sites as u64),
                    f.attach[0],
                    median(&f.attach)
                ),
                pass: Ok(max(&f.attach) <= limit),
            },
            (None, Some(_)) => Goal {
                name,
                measured: "-".into(),
                pass: Err("the vmlinux has fewer sites".into()),
            },
            (None, None) => Goal {
                name,
                measured: "-".into(),
                pass: Err("no vmlinux".into()),
            },
        });
    }
    let name = format!("symbol + site loading <= {GOAL_LOAD_MS} ms");
    goals.push(match &r.scaling {
        Some((_, loads, total)) => Goal {
            name,
            measured: format!(
                "median {:.1} ms of {} loads ({} sites; max {:.1} ms)",
                median(loads),
                loads.len(),
                report::thousands(*total as u64),
                max(loads)
            ),
            pass: Ok(median(loads) <= GOAL_LOAD_MS),
        },
        None => Goal {
            name,
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
            "{:.3} s for {} events",
            r.render_s,
            report::thousands(args.report_events)
        ),
        pass: if args.report_events == GOAL_REPORT_EVENTS {
            Ok(r.render_s <= GOAL_REPORT_S)
        } else {
            Err(format!(
                "measured with {} events",
                report::thousands(args.report_events)
            ))
        },
    });
    goals
}

/// The printed report.
fn table(
    r: &Results,
    goals: &[Goal],
    args: &BenchArgs,
    kernel: &Path,
    vmlinux: Option<&Path>,
    started: Instant,
) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let range = |v: &[f64]| format!("{:.2} .. {:.2}", min(v), max(v));
    let _ = writeln!(o, "vmtrace bench: mini guest {}", kernel.display());
    if emulator_host() {
        let _ = writeln!(
            o,
            "host: KVM emulates guest ring 0 here (kvm_pvm): absolute times are several times \
             bare metal; compare ratios"
        );
    }
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "(a)-(c) per traced call: {} vCPU, mode=loop, {} rounds of untraced / resume-only / recorder \
         phases of {} iterations; {:.2} exits per iteration",
        args.cpus, args.rounds, args.iters, r.costs.exits_per_iter
    );
    let _ = writeln!(o, "  {:<44} {:>10}   rounds min .. max", "", "median");
    let _ = writeln!(
        o,
        "  {:<44} {:>10}   {}",
        "(a) exit round trip (resume-only handler)",
        format!("{:.2} µs", r.a),
        range(&r.costs.a)
    );
    let _ = writeln!(
        o,
        "  {:<44} {:>10}   {}",
        "(b) cost per traced call (recorder)",
        format!("{:.2} µs", r.b),
        range(&r.costs.b)
    );
    let ratios: Vec<f64> = r
        .costs
        .a
        .iter()
        .zip(&r.costs.b)
        .map(|(a, b)| b / a)
        .collect();
    let _ = writeln!(
        o,
        "  {:<44} {:>10}   {}",
        "(c) b / a",
        format!("{:.3}", r.c),
        range(&ratios)
    );
    let _ = writeln!(
        o,
        "  {:<44} {:>10}   {}",
        "    recorder - resume-only, per call",
        format!("{:.2} µs", median(&r.costs.b_minus_a)),
        range(&r.costs.b_minus_a)
    );
    let _ = writeln!(
        o,
        "  {:<44} {:>10}",
        "    handler alone in process: recorder",
        format!("{:.0} ns", r.handlers.1)
    );
    let _ = writeln!(
        o,
        "  {:<44} {:>10}",
        "    handler alone in process: resume-only",
        format!("{:.0} ns", r.handlers.0)
    );
    let _ = writeln!(
        o,
        "  µs per guest iteration: untraced {:.1}, resume-only {:.1}, recorder {:.1}",
        r.costs.iter_us[0], r.costs.iter_us[1], r.costs.iter_us[2]
    );
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "(d) pause, mini guest mode=loop, {} pauses + {} attach/detach cycles per vCPU count",
        args.cycles, args.cycles
    );
    let _ = writeln!(
        o,
        "  {:<8} {:<26} {:>11} {:>11} {:>11}",
        "vCPUs", "", "p50", "p99", "max"
    );
    for p in &r.pauses {
        for (i, (what, v)) in [
            ("pause latency".to_string(), &p.latency),
            ("window, empty pause".to_string(), &p.window),
            (format!("attach window ({} sites)", p.sites), &p.attach),
            (format!("detach window ({} sites)", p.sites), &p.detach),
        ]
        .iter()
        .enumerate()
        {
            let n = if i == 0 {
                p.vcpus.to_string()
            } else {
                String::new()
            };
            let _ = writeln!(
                o,
                "  {n:<8} {what:<26} {:>11} {:>11} {:>11}",
                format!("{:.1} µs", pct(v, 50.0)),
                format!("{:.1} µs", pct(v, 99.0)),
                format!("{:.1} µs", max(v))
            );
        }
    }
    let _ = writeln!(o);
    match (&r.scaling, vmlinux) {
        (Some((e, loads, total)), Some(v)) => {
            let _ = writeln!(
                o,
                "(e) attach window vs. sites: {} loaded into a paused VM, never booted; {E_REPS} \
                 attaches each",
                v.display()
            );
            let _ = writeln!(
                o,
                "  {:<14} {:>11} {:>11} {:>11} {:>12}",
                "sites", "first", "p50", "max", "detach p50"
            );
            for f in e {
                let label = if f.label == "all" {
                    format!("all ({})", report::thousands(f.sites as u64))
                } else {
                    report::thousands(f.sites as u64)
                };
                let _ = writeln!(
                    o,
                    "  {label:<14} {:>11} {:>11} {:>11} {:>12}",
                    format!("{:.1} µs", f.attach[0]),
                    format!("{:.1} µs", median(&f.attach)),
                    format!("{:.1} µs", max(&f.attach)),
                    format!("{:.1} µs", median(&f.detach))
                );
            }
            let _ = writeln!(o);
            let _ = writeln!(
                o,
                "loading: KernelImage::load + SiteTable::build of {} ({} sites): median {:.1} ms \
                 of {} ({:.1} .. {:.1} ms)",
                v.display(),
                report::thousands(*total as u64),
                median(loads),
                loads.len(),
                min(loads),
                max(loads)
            );
        }
        _ => {
            let _ = writeln!(
                o,
                "(e) and loading: NOT MEASURED, no vmlinux (build it with `bash guest/build.sh \
                 linux`, or pass --vmlinux PATH)"
            );
        }
    }
    let _ = writeln!(
        o,
        "report: {} events, text with callers {:.3} s; JSON export {:.3} s",
        report::thousands(args.report_events),
        r.render_s,
        r.json_s
    );
    let _ = writeln!(o);
    let _ = writeln!(o, "goals:");
    for g in goals {
        let why = match &g.pass {
            Err(w) => format!(" (not judged: {w})"),
            Ok(_) => String::new(),
        };
        let _ = writeln!(o, "  {}  {:<48} {}{why}", g.status(), g.name, g.measured);
    }
    let _ = writeln!(o);
    let _ = writeln!(o, "methods:");
    for (k, m) in methods() {
        let _ = writeln!(o, "  {k:<7} {m}");
    }
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "vmtrace bench took {:.1} s",
        started.elapsed().as_secs_f64()
    );
    o
}

/// The JSON document of `--json FILE`.
fn json(
    figures: &[(String, f64)],
    goals: &[Goal],
    args: &BenchArgs,
    kernel: &Path,
    vmlinux: Option<&Path>,
) -> String {
    use std::fmt::Write as _;
    let mut j = String::from("{\n");
    let _ = writeln!(j, "  \"schema\": \"vmtrace-bench/1\",");
    let _ = writeln!(j, "  \"kernel\": {},", jstr(&kernel.display().to_string()));
    let _ = writeln!(
        j,
        "  \"vmlinux\": {},",
        vmlinux
            .map(|v| jstr(&v.display().to_string()))
            .unwrap_or_else(|| "null".into())
    );
    let _ = writeln!(j, "  \"emulator_host\": {},", emulator_host());
    let _ = writeln!(j, "  \"iters\": {},", args.iters);
    let _ = writeln!(j, "  \"cpus\": {},", args.cpus);
    let _ = writeln!(j, "  \"rounds\": {},", args.rounds);
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
        let why = match &g.pass {
            Err(w) => jstr(w),
            Ok(_) => "null".into(),
        };
        let _ = writeln!(
            j,
            "    {{\"goal\": {}, \"status\": \"{}\", \"measured\": {}, \"not_judged\": {why}}}{comma}",
            jstr(&g.name),
            g.status(),
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
    j
}

/// How each figure is measured (printed, and saved in the JSON).
fn methods() -> Vec<(&'static str, String)> {
    vec![
        (
            "(a)",
            format!(
                "one `out` exit through KVM and vmtrace's vCPU loop and back, with the cheapest \
                 correct handler (find the site, resume after it): (t_resume-only - t_untraced) / \
                 exits per iteration, t = µs per guest iteration per vCPU in phases of --iters \
                 iterations of the mini guest (mode=loop) with the {TRACE_GLOB} sites patched \
                 (or not)"
            ),
        ),
        (
            "(b)",
            "(t_recorder - t_untraced) / exits per iteration, the same with vmtrace's real \
             per-vCPU Recorder; the three phases run in rotating order in one guest, --rounds \
             times, and a and b are medians over the rounds"
                .into(),
        ),
        (
            "(c)",
            "b / a per round, median over the rounds; the handlers timed alone in process \
             (no exit) cross-check b - a"
                .into(),
        ),
        (
            "(d)",
            "the mini guest in mode=loop with 1, 2 and 4 vCPUs running: latency = pause \
             request to all vCPUs parked; window = all parked to release, for empty pauses and \
             for pauses that attach (or detach) all its patchable sites"
                .into(),
        ),
        (
            "(e)",
            "the Linux vmlinux loaded into a VM at its physical addresses with the boot page \
             tables, started paused and never booted (booting takes minutes here): \
             Tracer::attach, i.e. the vmlinux check and the patching a live attach does while \
             the vCPUs are parked, timed for 10, 100, 1,000 and all the sites --trace '*' \
             selects, spread evenly over the text; goals judged on the worst attach"
                .into(),
        ),
        (
            "loading",
            "KernelImage::load + SiteTable::build of that vmlinux, median of the loads made for (e)"
                .into(),
        ),
        (
            "report",
            format!(
                "report::render with callers, and export::write_json to a sink, of a synthetic \
                 trace: {SYNTH_FUNCS} functions, {SYNTH_CALLERS} callers, {SYNTH_CPUS} vCPUs"
            ),
        ),
    ]
}
