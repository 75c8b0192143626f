//! What tracing costs, measured side by side in one run: the
//! implementation of `vmtrace bench` (the command is `cmd::bench`). Each
//! figure set is a bench with a name (`suite`: `call/trap` for (a)-(c),
//! ..., `boot/ftrace` for (i)); `run` runs those a config selects.
//!
//! Everything is measured in one process, one run, so the figures can be
//! compared with each other even on a host whose KVM distorts absolute times
//! (see docs/emulating-kvm.md: nested KVM that emulates guest ring 0; the
//! figures of one run are in docs/benchmarks.md). Ratios are what carry
//! over to other hosts; absolute times do not.
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
//! **(f) exitless vs. trap, per traced call.** A second mini guest in
//! `mode=loop`, the same phase technique as (a)-(c) (phases of `--iters`
//! iterations per vCPU, switched under pauses, in rotating order, `--rounds`
//! rounds, exact counts read under the pauses), with four kinds of phase:
//!
//! - **untraced**: no site patched, `mini_spin` = 0;
//! - **spin**: no site patched, `mini_spin` = `SPIN` (200): each iteration
//!   also runs the guest's calibration spin, `2 * SPIN` = 400 guest
//!   instructions more than with 0 (guest/mini/mini.h `MINI_SPIN_INSNS`:
//!   `mov`, `test`, `jz`, then `mini_spin` times `dec` + `jnz`), enough to
//!   dominate a phase's noise;
//! - **trap**: the `hrtimer_*` sites trap to vmtrace's real recorder
//!   (`Tracer::new`);
//! - **exitless**: the same sites call vmtrace's trampoline in the guest
//!   (`Tracer::exitless`, rings of the default size).
//!
//! Two tracers over one VM, at most one attached at a time: the trap
//! tracer's recorders are the vCPUs' handlers, each wrapped to count the
//! trace-port traps it sees; the exitless tracer's handlers are dropped (no
//! site of its traps). Calls per iteration `X` = traps / iterations over the
//! trap phases (3.5 on the mini workload). With `t` = µs per iteration per
//! vCPU, per round:
//!
//! - t_insn = (t_spin − t_untraced) / (2 · SPIN): µs per guest instruction
//!   of the calibration loop;
//! - trap µs per call = (t_trap − t_untraced) / X, exitless µs per call =
//!   (t_exitless − t_untraced) / X, and their ratio;
//! - guest instructions per traced call, measured = exitless µs per call /
//!   t_insn (goal ≤ 30); static = the trampoline's
//!   `common_path_instructions()` (stub + common path of a recorded call,
//!   counted in its code: `trampoline::COMMON_PATH_INSTRUCTIONS`);
//! - guest instructions per traced call, **counted**: where KVM runs guest
//!   ring 0 in its instruction emulator, its per-vCPU statistic
//!   `insn_emulation` (`vmm::kvm_stats`) counts every guest instruction, so
//!   the same pauses that read the iteration counters read it too, all
//!   vCPUs summed: with `i` = instructions per iteration of a phase (its
//!   instructions over its iterations), counted = (i_exitless −
//!   i_untraced) / X, the time figure's accounting (the exitless phase's
//!   instructions minus the untraced phase's per iteration times its
//!   iterations, over its calls). Used only if the spin phase counted
//!   i_spin − i_untraced = 2 · SPIN within 2 % (`SPIN_COUNT_TOLERANCE`):
//!   on hardware-virtualized KVM the emulator runs almost none of the
//!   guest's instructions, and the figure is reported not available, with
//!   why. The phases' edges fall inside iterations, so the count differs
//!   from a whole number by up to about one iteration's instructions over
//!   a phase's calls;
//!
//! all reported as medians over the rounds; and exits per traced call in
//! exitless mode = trace-port traps at sites in the exitless phases / calls
//! in them, goal ≤ 0.01. On a host whose KVM emulates guest ring 0 (every
//! guest instruction emulated) an exitless call costs more than an exit;
//! `--mode auto` picks traps there.
//!
//! The counts of (f) and (g) are exact, and checked exactly. The guest
//! counts its own calls (`mini_cpus[cpu].count[f]`, in each function right
//! after its site), and the phases switch only at a *settled* pause: one
//! where no vCPU's RIP is in a traced function or in vmtrace's code (a
//! pause that finds one there is released and taken again), so every call
//! falls, site and count, in one phase. The run fails unless the trap
//! tracer counted exactly the calls the guest made in the trap phases, the
//! exitless tracer (records and drops) exactly those of the exitless
//! phases, and no site trapped in an exitless phase. A trap at vmtrace's
//! return trap (`--graph`: the return of a call the trap tracer hooked,
//! which may come in the next phase) is a return, not a site trapping.
//!
//! **Noise.** A figure taken from the difference of two phases' times, (a),
//! (b), (c) and the times of (f) and (g), is not measured when that
//! difference is not positive (the host's noise swamped it, as happens
//! with short phases): it is null in the JSON (`not_measured` in
//! `figures`, `timing_not_measured` in the `exitless` and `graph` objects
//! say why), "not measured" in the table, its goal not judged, and every
//! other figure is still given; the run still exits 0.
//!
//! **(g) function graph.** (f) again in a third mini guest, both tracers
//! built from a plan with `graph` (returns hooked: `--graph`): per call, an
//! entry and its return. Calls per iteration come from the calls the trap
//! tracer counted (each takes two trace-port exits now: exits per call =
//! traps / calls, against (f)'s 1); the exitless figures as in (f), the
//! static count being the hooked entry's path plus the return path
//! (`Trampoline::return_path`). Printed beside (f)'s entry-only figures:
//! the return hook's added cost, in exits per call (trap) and guest
//! instructions per call (exitless), the units that carry over to other
//! hosts.
//!
//! **(i) vmtrace against the guest's own ftrace** (only with
//! `--linux-boots N`: each boot of the Linux guest takes a minute or more
//! on an emulating host). The default Linux guest booted to its end (1
//! vCPU, 96 MiB, as tests/linux_guest.rs boots it) in five configurations,
//! N boots each, interleaved (the order rotates every round): untraced;
//! the guest's function tracer (`--cmdline 'ftrace=function
//! ftrace_filter=kernfs_*'`); the same on functions never called (`ftrace=function
//! ftrace_filter=__x64_sys_*`: its setup alone, taken off for "ftrace less its
//! setup"); vmtrace `--trace 'kernfs_*' --mode trap`; and
//! `--mode exitless`. Each boot is the vmtrace binary itself as a subprocess
//! (`--stats`: KVM's instruction count and the run's time; `--format
//! json`: calls and trap exits). Per round, added per call = (the boot's
//! instructions − that round's untraced boot's) / calls, calls being what
//! every vmtrace boot traced (the same number each boot, or the figure
//! fails, as it does on a guest console with `ftrace bug`, `WARNING:` or
//! `BUG:`); the same for time; medians over the rounds, and the untraced
//! boots' own spread beside them.
//!
//! **Loading**: `KernelImage::load` + `SiteTable::build` of that vmlinux.
//!
//! **Report**: `report::render` with callers, and the JSON export, of a
//! synthetic trace of `--report-events` events (default 10 M) over 500
//! functions, 200 callers, 4 vCPUs.
//!
//! **(h) recording to disk.** No guest: `SYNTH_CPUS` (4) producer threads
//! stand in for the vCPUs' recorders. Each sends batches of `BATCH` (4,096)
//! events, taken from the synthetic trace's events (its vCPU's), through
//! the store thread of `record::recorders` (`Storage::Stream`, buffer
//! `RECORD_BUFFER` = 64 MiB, `vmtrace record`'s default) to a data file in
//! the temporary directory. Each batch is an emptied one the store handed
//! back (as `Recorder::flush` takes them), filled from a pre-built batch (so
//! making events costs next to nothing), and handed over waiting for room
//! in the queue, as the exitless drainer does: the disk sets the pace, the
//! figure is the sustained rate, and all `--record-events` events (default
//! 100 M, 3.2 GB) are stored. (A trap-mode recorder never waits and counts
//! a refused batch as lost; that path is the streaming test's.) Events per
//! second = events stored / time from the first send to the file's end
//! (every sender gone, the store thread joined, `FOOT` and `END` written);
//! MB per second = the file's bytes / that time. The data is then in the
//! page cache: an `fsync` is timed after, for the rate to the disk itself
//! (not judged). The goal (≥ 10 M events/s) is judged on events stored.
//!
//! Peak memory: the RSS before, then the process's peak RSS reset by
//! writing `5` to `/proc/self/clear_refs` (Linux ≥ 4.0; checked: the peak
//! must fall to the RSS, else the goal is not judged), and `VmHWM` of
//! `/proc/self/status` read after. Goal: the growth at most the buffer +
//! `PEAK_SLACK` (64 MiB: the batches being built and written, thread
//! stacks, the allocator's slack), whatever the size of the trace. The file
//! is deleted after. Before the RSS is read, `malloc_trim` hands the
//! memory earlier figures freed back to the kernel: kept by the allocator,
//! it would be reused by (h) without the RSS growing. Batches are reused
//! (the queue plus the pool of emptied ones, each at most the buffer), so
//! glibc's per-thread arenas do not each keep the most their thread ever
//! had queued, as they did before (1.8 to 2.5 times the buffer).
//!
//! `measure` takes the figures; `results` judges them against the goals and
//! prints them (and writes `--json FILE`).
//!
//! The benches by name (`vmtrace bench list`): call/trap (a)-(c),
//! call/exitless (f), call/graph (g), call/stack (`measure::stack`: a
//! trapped call with its kernel stack against without, in phases of the
//! mini guest with `stack=1`, as (a)-(c)), attach/pause (d), attach/scaling (e)
//! and loading, attach/modes (j), record/throughput (h), report/render
//! (report), boot/ftrace (i); and direct entries' (`measure::direct`,
//! docs/benchmarks.md): call/direct ((f) with direct entries on the mini
//! guest without ftrace), attach/direct ((e) for 100 and 1,000 direct
//! sites), sites/direct (the functions `DirectPlan::build` proves safe, and
//! refuses by rule, on the vmlinux and `--distro-kernel`); events/cost
//! (`measure::events`: an exitless event's instructions beside a function
//! entry's, counted in the vmlinux's code).

pub mod measure;
pub mod results;
pub mod run;
pub mod suite;

use std::time::Duration;

use crate::stats;

/// Microseconds, the unit of most figures.
fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Nearest-rank percentile of a figure's samples; NaN for none, which the
/// JSON writes as null.
fn pct(v: &[f64], p: f64) -> f64 {
    stats::percentile(v, p).unwrap_or(f64::NAN)
}

pub fn median(v: &[f64]) -> f64 {
    pct(v, 50.0)
}

/// A figure taken from the difference of two phases' times: itself if
/// positive, else NaN, not measured (the JSON writes null; the table and
/// the JSON say why, from `swamped`).
pub fn fig(v: f64) -> f64 {
    if v.is_finite() && v > 0.0 {
        v
    } else {
        f64::NAN
    }
}

/// Why figures from phase differences were not measured: `extra` names
/// each kind of phase with its median µs per iteration more than the
/// untraced phases; those not positive were lost in the host's noise.
/// None when every one was positive.
pub fn swamped(extra: &[(&str, f64)]) -> Option<String> {
    let lost: Vec<String> = extra
        .iter()
        .filter(|(_, v)| fig(*v).is_nan())
        .map(|(what, v)| format!("{what} {v:+.2} µs"))
        .collect();
    (!lost.is_empty()).then(|| {
        format!(
            "phases were not slower than the untraced ones (per iteration: {}): this host's \
             noise swamped the difference; raise --iters or --rounds",
            lost.join(", ")
        )
    })
}
