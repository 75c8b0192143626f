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
//!
//! `measure` takes the figures; `results` judges them against the goals and
//! prints them (and writes `--json FILE`).

mod measure;
mod results;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use tracer::report;

use crate::cli::BenchArgs;
use crate::session::{Error, Outcome};
use crate::stats;
use measure::{HANDLER_TRAPS, PAUSE_VCPUS};
use results::Results;

/// A failure the user can fix (exit status 2): a missing or wrong kernel.
fn input(e: impl std::fmt::Display) -> Error {
    Error::Input(e.to_string())
}

/// A failure while measuring (exit status 1).
fn runtime(e: impl std::fmt::Display) -> Error {
    Error::Runtime(e.to_string())
}

/// Microseconds, the unit of most figures.
fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Nearest-rank percentile of a figure's samples; NaN for none, which the
/// JSON writes as null.
fn pct(v: &[f64], p: f64) -> f64 {
    stats::percentile(v, p).unwrap_or(f64::NAN)
}

fn median(v: &[f64]) -> f64 {
    pct(v, 50.0)
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

/// `vmtrace bench`: measure, print the table, write `--json FILE`.
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
    let costs = measure::call_costs(&kernel, args.cpus, args.iters, args.rounds)?;
    let a = median(&costs.a);
    let b = median(&costs.b);
    let c = median(&costs.ratios());
    if !(a > 0.0 && b > 0.0 && c > 0.0) {
        return Err(Error::Runtime(format!(
            "traced phases were not slower than untraced ones (a = {a:.2} µs, b = {b:.2} µs): \
             the phases are too short for this host's noise; raise --iters or --rounds"
        )));
    }
    eprintln!("vmtrace bench: handlers alone, {HANDLER_TRAPS} traps each");
    let handlers = measure::handler_alone(&kernel)?;

    let mut pauses = Vec::new();
    for n in PAUSE_VCPUS {
        eprintln!(
            "vmtrace bench: (d) {n} vCPU(s), mode=loop: {} pauses, {} attach/detach cycles",
            args.cycles, args.cycles
        );
        pauses.push(measure::pause_figures(&kernel, n, args.cycles)?);
    }

    let scaling = match &vmlinux {
        Some(v) => {
            eprintln!(
                "vmtrace bench: (e) attach windows on {} (loaded, not booted)",
                v.display()
            );
            Some(measure::attach_scaling(v)?)
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
    let (render_s, json_s) = measure::report_figures(args.report_events)?;

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
    let goals = results::goals(&r, args);
    let run = results::Run {
        args,
        kernel: &kernel,
        vmlinux: vmlinux.as_deref(),
        started,
    };
    print!("{}", results::table(&r, &goals, &run));
    let _ = std::io::stdout().flush();
    if let Some(path) = &args.json {
        let j = results::json(&results::figures(&r), &goals, &run)
            .map_err(|e| Error::Runtime(format!("cannot write the bench's JSON: {e}")))?;
        std::fs::write(path, j)
            .map_err(|e| Error::Runtime(format!("cannot write {}: {e}", path.display())))?;
    }
    Ok(Outcome::Clean)
}
