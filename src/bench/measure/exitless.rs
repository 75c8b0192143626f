//! Figure set (f): a traced call in exitless mode (vmtrace's trampoline in
//! the guest, no exit) against trap mode, in phases of one running mini
//! guest, with a calibration spin that prices one guest instruction (see the
//! `bench` module documentation). Where KVM's emulator runs every guest
//! instruction, the same phases also count them (KVM's `insn_emulation`,
//! read under the pauses that switch phases).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tracer::kernel::symbols::KernelImage;
use tracer::plan::entry::EntryChoice;
use tracer::plan::exitless::layout::RETURN_TRAP_VA;
use tracer::plan::Plan;
use tracer::session::Tracer;
use vmm::exit::ExitKind;
use vmm::gva::{AddressSpace, PagingMode};
use vmm::kvm_stats::KvmStats;
use vmm::{Running, StopReason, Trap, TrapError, TrapHandler, Vm};

use super::phases::{pause_settled, timed_phase, unsettled, GuestU32, IterCounters};
use super::{mini_config, stop, SETTLE, TRACE_GLOB};
use crate::bench::median;
use crate::error::{Error, Flags, RuntimeError};
use vmm::advice::Advice;

/// `mini_spin` in the spin phases: each iteration then runs `2 * SPIN`
/// instructions more than with 0 (guest/mini/mini.h, `MINI_SPIN_INSNS`).
/// Large enough that the spin dominates the noise of a phase.
pub const SPIN: u32 = 200;
/// The mini guest's calibration knob.
const MINI_SPIN: &str = "mini_spin";
/// The instructions KVM counted per spin-phase iteration must be `2 * SPIN`
/// more than per untraced iteration within this fraction for the counts to
/// be used: else KVM's emulator does not run every guest instruction here
/// (hardware-virtualized KVM), or the phases are too short for the partial
/// iterations at their edges not to matter.
pub const SPIN_COUNT_TOLERANCE: f64 = 0.02;

/// Bytes of the return trap's slot (`RET_STUBS_OFF - RETURN_TRAP_OFF`).
const RETURN_TRAP_LEN: u64 = 16;

/// The phases of (f), in the order of `ExitlessCosts::rounds`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// No site patched, `mini_spin` 0.
    Untraced,
    /// No site patched, `mini_spin` = `SPIN`.
    Spin,
    /// The `hrtimer_*` sites trap to vmtrace's recorder.
    Trap,
    /// The same sites call vmtrace's trampoline in the guest.
    Exitless,
}

pub const PHASES: [Phase; 4] = [Phase::Untraced, Phase::Spin, Phase::Trap, Phase::Exitless];

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Untraced => "untraced",
            Phase::Spin => "spin",
            Phase::Trap => "trap",
            Phase::Exitless => "exitless",
        }
    }
}

/// A vCPU's handler: counts every trace-port trap, at a site (an entry) or
/// at vmtrace's return trap (`--graph`: the return of a call the trap
/// tracer hooked, which may come in a later phase), then hands it on.
struct TrapCount {
    traps: Arc<AtomicU64>,
    returns: Arc<AtomicU64>,
    inner: Box<dyn TrapHandler>,
}

impl TrapHandler for TrapCount {
    fn on_trap(&mut self, trap: &mut Trap<'_>) -> Result<(), TrapError> {
        // The return trap is at its own place in vmtrace's code page; sites
        // are in the kernel, or (direct entries) in their stubs in that page.
        let n = if (RETURN_TRAP_VA..RETURN_TRAP_VA + RETURN_TRAP_LEN).contains(&trap.rip) {
            &self.returns
        } else {
            &self.traps
        };
        // One writer (this vCPU's thread): a plain load and store.
        n.store(n.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        self.inner.on_trap(trap)
    }

    fn flush(&mut self) {
        self.inner.flush();
    }
}

/// Iterations, traced calls (the guest's own count) and trace-port traps
/// at sites of one finished phase (exact: read under the settled pauses
/// that began and ended it), and the guest instructions KVM's emulator ran
/// in it (None: KVM does not count them).
#[derive(Clone, Copy, Debug)]
pub struct PhaseCount {
    pub phase: Phase,
    /// The round it belongs to.
    pub round: usize,
    pub iters: u64,
    pub calls: u64,
    pub traps: u64,
    pub insns: Option<u64>,
}

impl PhaseCount {
    /// The counts of the phase that began at `self` (the counts so far
    /// then) and ended at `now`.
    fn until(&self, now: &PhaseCount) -> PhaseCount {
        PhaseCount {
            phase: self.phase,
            round: self.round,
            iters: now.iters - self.iters,
            calls: now.calls - self.calls,
            traps: now.traps - self.traps,
            insns: self.insns.zip(now.insns).map(|(a, b)| b - a),
        }
    }
}

/// What the two tracers counted over the whole run.
#[derive(Clone, Copy, Debug)]
pub struct TracerCounts {
    /// Calls the trap tracer counted (it is attached in trap phases only).
    pub trap_calls: u64,
    /// Trace-port exits of the whole run: entries and (graph) returns.
    pub trap_exits: u64,
    /// Calls the exitless tracer counted, recorded or dropped in the guest.
    pub exitless_calls: u64,
}

/// (f) as measured.
#[derive(Clone, Debug)]
pub struct ExitlessCosts {
    /// Per round, µs per guest iteration per vCPU, in `PHASES` order.
    pub rounds: Vec<[f64; 4]>,
    /// Traced calls per iteration: calls / iterations over the trap phases.
    pub calls_per_iter: f64,
    /// Calls made in the exitless phases (the guest's count, which the
    /// exitless tracer's equals).
    pub exitless_calls: u64,
    /// Trace-port traps at sites during the exitless phases (0, or the run
    /// fails).
    pub exitless_traps: u64,
    /// The trampoline's instructions per recorded call, counted in its code
    /// (with the graph: a hooked entry's and its return's together).
    pub static_instructions: usize,
    /// With the guest's tasks recorded (a kernel with BTF): the same code's
    /// instructions per recorded call without the task, and per call that a
    /// one-pid `--pid` filter rejects, counted in code generated so.
    pub task_variants: Option<(usize, usize)>,
    /// Trace-port traps per traced call in the trap phases (1; 2 with the
    /// graph: the entry and the return).
    pub trap_exits_per_call: f64,
    /// Per round, guest instructions per iteration (all vCPUs' instructions
    /// over all vCPUs' iterations) counted by KVM's emulator, in `PHASES`
    /// order; None where KVM does not count them.
    pub counted: Option<Vec<[f64; 4]>>,
    /// Direct entries (call/direct): the stubs' instructions, counted in
    /// their code; None for ftrace sites.
    pub stubs: Option<super::StubCount>,
}

impl ExitlessCosts {
    /// Per round: `f(t)` for each round's µs per iteration by phase.
    fn per_round(&self, f: impl Fn(&[f64; 4]) -> f64) -> Vec<f64> {
        self.rounds.iter().map(f).collect()
    }

    /// µs per guest instruction, per round: (t_spin - t_untraced) / 2·SPIN.
    pub fn us_per_insn(&self) -> Vec<f64> {
        self.per_round(|t| (t[1] - t[0]) / (2.0 * f64::from(SPIN)))
    }

    /// µs per traced call in trap mode, per round.
    pub fn trap_us(&self) -> Vec<f64> {
        let e = self.calls_per_iter;
        self.per_round(|t| (t[2] - t[0]) / e)
    }

    /// µs per traced call in exitless mode, per round.
    pub fn exitless_us(&self) -> Vec<f64> {
        let e = self.calls_per_iter;
        self.per_round(|t| (t[3] - t[0]) / e)
    }

    /// Exitless / trap per call, per round.
    pub fn ratios(&self) -> Vec<f64> {
        self.per_round(|t| (t[3] - t[0]) / (t[2] - t[0]))
    }

    /// Guest instructions per exitless call, per round: its µs over the µs
    /// of one calibration instruction.
    pub fn instructions(&self) -> Vec<f64> {
        let e = self.calls_per_iter;
        let s = 2.0 * f64::from(SPIN);
        self.per_round(|t| ((t[3] - t[0]) / e) / ((t[1] - t[0]) / s))
    }

    /// Trace-port exits per traced call in the exitless phases.
    pub fn exits_per_call(&self) -> f64 {
        self.exitless_traps as f64 / self.exitless_calls as f64
    }

    /// Per round, the instructions KVM counted per spin iteration over
    /// those per untraced one: `2 * SPIN` where its emulator runs every
    /// guest instruction.
    pub fn spin_counted(&self) -> Option<Vec<f64>> {
        let c = self.counted.as_ref()?;
        Some(c.iter().map(|i| i[1] - i[0]).collect())
    }

    /// Guest instructions per exitless call counted by KVM's emulator, per
    /// round, with the time figure's accounting: (instructions per exitless
    /// iteration - per untraced iteration) / calls per iteration. Err: not
    /// available, and why (KVM does not count, or the calibration spin was
    /// not counted as the `2 * SPIN` instructions it is).
    pub fn counted_instructions(&self) -> Result<Vec<f64>, String> {
        let (Some(c), Some(spin)) = (&self.counted, self.spin_counted()) else {
            return Err("KVM gives no instruction count (no KVM_GET_STATS_FD or no \
                        insn_emulation statistic)"
                .into());
        };
        let want = 2.0 * f64::from(SPIN);
        let got = median(&spin);
        // (NaN, from a phase without iterations, is not within either.)
        let within = (got - want).abs() <= SPIN_COUNT_TOLERANCE * want;
        if !within {
            return Err(format!(
                "KVM's emulator counted {got:.1} instructions more per spin iteration, not \
                 2 x {SPIN} = {want:.0} (± {:.0} %): it does not run every guest instruction \
                 on this host (hardware-virtualized KVM), or the phases are too short \
                 (--iters)",
                SPIN_COUNT_TOLERANCE * 100.0
            ));
        }
        let e = self.calls_per_iter;
        Ok(c.iter().map(|i| (i[3] - i[0]) / e).collect())
    }

    /// Median µs per iteration, by phase.
    pub fn iter_us(&self) -> [f64; 4] {
        let m = |i: usize| median(&self.per_round(|t| t[i]));
        [m(0), m(1), m(2), m(3)]
    }

    /// From the rounds, the finished phases' counts and what the tracers
    /// counted; an error unless every count is exact: the trap tracer
    /// counted the calls the guest made in the trap phases (at least one),
    /// the exitless tracer those of the exitless phases (at least one), and
    /// no site trapped in an exitless phase.
    fn judge(
        rounds: Vec<[f64; 4]>,
        phases: &[PhaseCount],
        tracers: TracerCounts,
        static_instructions: usize,
    ) -> Result<ExitlessCosts, String> {
        let sum = |p: Phase| {
            phases
                .iter()
                .filter(|c| c.phase == p)
                .fold((0, 0, 0), |(i, n, t), c| {
                    (i + c.iters, n + c.calls, t + c.traps)
                })
        };
        let (trap_iters, trap_calls, trap_traps) = sum(Phase::Trap);
        if trap_iters == 0 || trap_traps == 0 || tracers.trap_calls == 0 {
            return Err(format!("no {TRACE_GLOB} call trapped in the trap phases"));
        }
        // The trap tracer counts calls only while attached: in trap phases.
        if tracers.trap_calls != trap_calls || trap_traps != trap_calls {
            return Err(format!(
                "the trap tracer counted {} calls and took {trap_traps} traps at sites in the trap \
                 phases, where the guest made {trap_calls} calls",
                tracers.trap_calls
            ));
        }
        let (ex_iters, ex_calls, ex_traps) = sum(Phase::Exitless);
        if ex_traps > 0 {
            return Err(format!(
                "the exitless phases took {ex_traps} trace-port traps at sites in {ex_calls} \
                 calls: the sites trapped instead of calling the trampoline"
            ));
        }
        if tracers.exitless_calls == 0 || tracers.exitless_calls != ex_calls {
            return Err(format!(
                "the exitless tracer counted {} calls in {ex_iters} iterations of the exitless \
                 phases, where the guest made {ex_calls}",
                tracers.exitless_calls
            ));
        }
        let counted = counted_per_iter(phases, rounds.len());
        Ok(ExitlessCosts {
            rounds,
            calls_per_iter: trap_calls as f64 / trap_iters as f64,
            exitless_calls: ex_calls,
            exitless_traps: ex_traps,
            static_instructions,
            task_variants: None,
            trap_exits_per_call: tracers.trap_exits as f64 / tracers.trap_calls as f64,
            counted,
            stubs: None,
        })
    }
}

/// Per round, instructions per iteration by phase in `PHASES` order, from
/// the finished phases' counts; None unless KVM counted every phase of
/// every round (and each ran at least one iteration).
fn counted_per_iter(phases: &[PhaseCount], rounds: usize) -> Option<Vec<[f64; 4]>> {
    (0..rounds)
        .map(|r| {
            let mut per = [0.0; 4];
            for (k, p) in PHASES.iter().enumerate() {
                let c = phases.iter().find(|c| c.round == r && c.phase == *p)?;
                if c.iters == 0 {
                    return None;
                }
                per[k] = c.insns? as f64 / c.iters as f64;
            }
            Some(per)
        })
        .collect()
}

/// The two tracers over one guest; at most one attached at a time.
struct Tracers {
    trap: Tracer,
    exitless: Tracer,
    /// The figure set they measure, for the progress lines: (f) or (g).
    label: &'static str,
}

impl Tracers {
    /// Under the pause `p`: detach the tracer `phase` does not use, attach
    /// the one it does (if any).
    fn switch(&mut self, p: &vmm::Paused<'_>, phase: Phase) -> Result<(), Error> {
        for (t, wanted) in [
            (&mut self.trap, phase == Phase::Trap),
            (&mut self.exitless, phase == Phase::Exitless),
        ] {
            if !wanted && t.is_attached() {
                t.detach(p.memory()).map_err(RuntimeError::Restore)?;
            }
        }
        for (t, wanted) in [
            (&mut self.trap, phase == Phase::Trap),
            (&mut self.exitless, phase == Phase::Exitless),
        ] {
            if wanted && !t.is_attached() {
                t.attach(p)?.attached()?;
            }
        }
        Ok(())
    }
}

/// One vCPU's traps at sites and at the return trap.
type TrapCounters = [Arc<AtomicU64>; 2];

/// The trap tracer's recorders, each wrapped to count the traps it sees
/// per vCPU: at sites (`[0]`) and at the return trap (`[1]`).
fn counting(
    recorders: Vec<Box<dyn TrapHandler>>,
) -> (Vec<TrapCounters>, Vec<Box<dyn TrapHandler>>) {
    let new = || Arc::new(AtomicU64::new(0));
    let traps: Vec<TrapCounters> = recorders.iter().map(|_| [new(), new()]).collect();
    let handlers = recorders
        .into_iter()
        .zip(&traps)
        .map(|(inner, [t, r])| {
            Box::new(TrapCount {
                traps: Arc::clone(t),
                returns: Arc::clone(r),
                inner,
            }) as Box<dyn TrapHandler>
        })
        .collect();
    (traps, handlers)
}

/// Every trace-port exit went through the counting handlers (`[entries,
/// returns]`), and each was a call's entry or (graph) return the trap
/// tracer recorded.
fn check_exits(
    port_exits: u64,
    [entries, returns]: [u64; 2],
    trap: &tracer::trace::model::Trace,
) -> Result<(), String> {
    let trap_returns: u64 = trap.returns.iter().flatten().sum();
    let recorded = trap.meta.events_total + trap_returns;
    if port_exits != entries + returns || recorded != port_exits || trap_returns != returns {
        return Err(format!(
            "{port_exits} trace-port exits, {entries} at sites and {returns} at the return trap \
             counted by the handlers, {recorded} recorded ({trap_returns} returns)"
        ));
    }
    Ok(())
}

/// Figure set (f): the mini guest in `mode=loop`, phases of `iters`
/// iterations per vCPU, untraced / spin / trap / exitless in rotating order,
/// `reps` rounds. With `graph`, figure set (g): the same with both tracers
/// hooking returns (`--graph`), in a VM of its own. `entry`: the sites
/// are ftrace's, or direct entries (call/direct, on a kernel without
/// ftrace). See the `bench` module documentation.
// Long: one run of the phases, from the VM's creation to the exact counts'
// judgement; its steps share the two tracers and the VM.
pub fn exitless_costs(
    kernel: &Path,
    cpus: u64,
    iters: u64,
    reps: usize,
    graph: bool,
    entry: EntryChoice,
) -> Result<ExitlessCosts, Error> {
    let glob = [TRACE_GLOB.to_string()];
    let plan = || -> Result<Plan, Error> {
        Ok(match entry {
            EntryChoice::Ftrace => Plan::new(kernel, &glob, &[])?,
            _ => {
                let image = KernelImage::load_without_sites(kernel)
                    .map_err(tracer::error::TracerError::from)?;
                Plan::with_entry(image, &glob, &[], entry)?
            }
        })
    };
    let mut trap_plan = plan()?;
    let spin = GuestU32::new(&trap_plan.image, MINI_SPIN)?;
    let mut exitless_plan = plan()?;
    trap_plan.graph = graph;
    exitless_plan.graph = graph;
    let vm = Vm::create(mini_config(kernel, cpus)?)?;
    let ncpus = vm.cpus();
    let (trap, recorders) = Tracer::new(trap_plan, ncpus, u64::MAX);
    // The exitless tracer's handlers would only see traps at its own sites,
    // and there are none: the trap tracer's recorders are the vCPUs' handlers.
    // Dropped now: its collector ends only once they are gone.
    let (exitless, unused) = Tracer::exitless(exitless_plan, ncpus, u64::MAX, None)?;
    drop(unused);
    let static_instructions = exitless
        .trampoline()
        .map(|t| t.common_path_instructions() + t.return_path.len())
        .ok_or_else(|| RuntimeError::Measure("the exitless tracer has no trampoline".into()))?;
    let task_variants = exitless.task_path_variants();
    let stubs = super::direct::stub_count(&exitless).map_err(RuntimeError::Measure)?;
    let static_instructions = static_instructions + stubs.as_ref().map_or(0, |s| s.around);
    let mut tracers = Tracers {
        trap,
        exitless,
        label: if graph { "(g)" } else { "(f)" },
    };
    let (traps, handlers) = counting(recorders);
    let running = vm.start(handlers, false).map_err(RuntimeError::Start)?;
    // Traps at sites (k = 0) or at the return trap (k = 1), all vCPUs.
    let sum = |k: usize| {
        traps
            .iter()
            .map(|t| t[k].load(Ordering::Relaxed))
            .sum::<u64>()
    };
    let total_traps = || sum(0);
    let result = run_phases(
        &running,
        &mut tracers,
        &spin,
        ncpus,
        iters,
        reps,
        &total_traps,
    );

    // Stop, restore every site whatever happened, then judge.
    let mem = running.memory().clone();
    let report = stop(running);
    let restored = [tracers.trap.detach(&mem), tracers.exitless.detach(&mem)];
    let reason = report.reason.say(&Flags);
    let trap_trace = tracers.trap.finish(kernel, reason.clone());
    let exitless_trace = tracers.exitless.finish(kernel, reason);
    let (rounds, phases) = result?;
    for r in restored {
        r.map_err(RuntimeError::Restore)?;
    }
    let measure = |m: String| -> Error { RuntimeError::Measure(m).into() };
    if report.reason != StopReason::Requested {
        return Err(measure(format!(
            "the mini guest stopped on its own: {}; console: {}",
            report.reason.say(&Flags),
            report.console_tail.join(" | ")
        )));
    }
    let port_exits: u64 = report.vcpus.iter().map(|v| v.get(ExitKind::Trap)).sum();
    check_exits(port_exits, [sum(0), sum(1)], &trap_trace).map_err(measure)?;
    let tracers = TracerCounts {
        trap_calls: trap_trace.meta.events_total,
        trap_exits: port_exits,
        exitless_calls: exitless_trace.meta.events_total,
    };
    let mut costs =
        ExitlessCosts::judge(rounds, &phases, tracers, static_instructions).map_err(measure)?;
    costs.task_variants = task_variants;
    costs.stubs = stubs;
    Ok(costs)
}

/// All vCPUs' instructions KVM's emulator ran so far (read under a
/// pause); None: KVM does not count them.
fn emulated(kvm: &KvmStats, label: &str) -> Result<Option<u64>, Error> {
    let per_cpu = kvm
        .instructions()
        .map_err(|e| RuntimeError::Measure(format!("{label}: reading KVM's statistics: {e}")))?;
    Ok(per_cpu.map(|v| v.iter().sum()))
}

/// The rounds of phases, µs per iteration by phase, and every finished
/// phase's exact counts. Both tracers are detached at the end.
fn run_phases(
    running: &Running,
    tracers: &mut Tracers,
    spin: &GuestU32,
    ncpus: usize,
    iters: u64,
    reps: usize,
    total_traps: &dyn Fn() -> u64,
) -> Result<(Vec<[f64; 4]>, Vec<PhaseCount>), Error> {
    let label = tracers.label;
    let mem = running.memory();
    let map = AddressSpace::new(mem, vmm::layout::PML4_START, PagingMode::Level4);
    let plan = tracers.trap.plan();
    let traced: Vec<&str> = plan
        .funcs
        .iter()
        .map(|&f| plan.image.functions[f].name.as_str())
        .collect();
    let mut counters = IterCounters::new(map, &plan.image, ncpus, &traced)?;
    let unsettled = unsettled(&plan.image, &plan.funcs);
    let kvm = running.kvm_stats();
    let insns = || emulated(&kvm, label);
    std::thread::sleep(SETTLE);
    let mut finished: Vec<PhaseCount> = Vec::new();
    // The phase running now, with the counts at its start.
    let mut current: Option<PhaseCount> = None;
    let mut close = |current: Option<PhaseCount>, now: PhaseCount| {
        finished.extend(current.map(|c| c.until(&now)));
    };
    // The counts so far, for `phase` of `round` (read under a pause).
    let read = |counters: &mut IterCounters<'_>, phase, round| -> Result<PhaseCount, Error> {
        Ok(PhaseCount {
            phase,
            round,
            iters: counters.total()?,
            calls: counters.calls_total()?,
            traps: total_traps(),
            insns: insns()?,
        })
    };
    let mut rounds = Vec::new();
    for round in 0..reps {
        let mut tau = [0.0f64; 4];
        for k in 0..PHASES.len() {
            let m = (k + round) % PHASES.len();
            let phase = PHASES[m];
            // Between phases, no vCPU between a site and the guest's count
            // of its call: read the exact counts, switch, resume.
            let start = {
                let p = pause_settled(running, &unsettled)?;
                let now = read(&mut counters, phase, round)?;
                close(current.take(), now);
                spin.set(&p, if phase == Phase::Spin { SPIN } else { 0 })?;
                tracers.switch(&p, phase)?;
                current = Some(now);
                counters.read()?
            };
            tau[m] = timed_phase(running, &mut counters, &start, iters, phase.name())?;
        }
        note!(
            "vmtrace bench: {label} round {}/{reps}: µs per iteration: untraced {:.1}, spin {SPIN} {:.1}, \
             trap {:.1}, exitless {:.1}",
            round + 1,
            tau[0],
            tau[1],
            tau[2],
            tau[3]
        );
        rounds.push(tau);
    }
    let p = pause_settled(running, &unsettled)?;
    close(current.take(), read(&mut counters, Phase::Untraced, reps)?);
    spin.set(&p, 0)?;
    tracers.switch(&p, Phase::Untraced)?;
    Ok((rounds, finished))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A phase of `iters` iterations in which the guest made `calls` calls
    /// and `traps` of them trapped at their site.
    fn count(phase: Phase, iters: u64, calls: u64, traps: u64) -> PhaseCount {
        PhaseCount {
            phase,
            round: 0,
            iters,
            calls,
            traps,
            insns: None,
        }
    }

    /// A phase of round `round` in which KVM counted `insns` instructions;
    /// 3.5 calls per iteration, trapped in the trap phases.
    fn counted(phase: Phase, round: usize, iters: u64, insns: u64) -> PhaseCount {
        let calls = 7 * iters / 2;
        PhaseCount {
            phase,
            round,
            iters,
            calls,
            traps: if phase == Phase::Trap { calls } else { 0 },
            insns: Some(insns),
        }
    }

    /// What the tracers counted: `trap` calls (`exits` exits), `exitless`.
    fn tracers(trap: u64, exits: u64, exitless: u64) -> TracerCounts {
        TracerCounts {
            trap_calls: trap,
            trap_exits: exits,
            exitless_calls: exitless,
        }
    }

    /// Two rounds, every phase counted: 60 instructions per untraced
    /// iteration, 460 per spin one, 3.5 calls of `per_call` instructions
    /// more per exitless one (the trap phases' `out` replaces a NOP).
    fn counted_rounds(per_call: f64, spin_extra: u64) -> Vec<PhaseCount> {
        let ex = (60.0 + 3.5 * per_call) as u64;
        let mut v = Vec::new();
        for r in 0..2 {
            let iters = 200 * (r as u64 + 1);
            v.push(counted(Phase::Untraced, r, iters, 60 * iters));
            v.push(counted(Phase::Spin, r, iters, (60 + spin_extra) * iters));
            v.push(counted(Phase::Trap, r, iters, 60 * iters));
            v.push(counted(Phase::Exitless, r, iters, ex * iters));
        }
        v
    }

    #[test]
    fn figures_from_rounds() {
        // µs per iteration: untraced, spin (2 * 200 instructions), trap, exitless.
        let rounds = vec![[10.0, 410.0, 45.0, 108.0], [12.0, 412.0, 47.0, 110.0]];
        let phases = [
            count(Phase::Trap, 100, 350, 350),
            count(Phase::Exitless, 100, 349, 0),
            count(Phase::Trap, 100, 350, 350),
            count(Phase::Exitless, 200, 701, 0),
        ];
        let c = ExitlessCosts::judge(rounds, &phases, tracers(700, 700, 1050), 28).unwrap();
        assert_eq!(c.calls_per_iter, 3.5);
        assert_eq!(c.trap_exits_per_call, 1.0);
        assert_eq!(c.us_per_insn(), [1.0, 1.0]);
        assert_eq!(c.trap_us(), [10.0, 10.0]);
        assert_eq!(c.exitless_us(), [28.0, 28.0]);
        assert_eq!(c.ratios(), [2.8, 2.8]);
        assert_eq!(c.instructions(), [28.0, 28.0]);
        assert_eq!(c.exits_per_call(), 0.0);
        assert_eq!(c.iter_us(), [10.0, 410.0, 45.0, 108.0]);
        assert_eq!(c.exitless_calls, 1050);
        assert_eq!(c.static_instructions, 28);
    }

    #[test]
    fn graph_figures_count_calls_not_traps() {
        // With the graph, a trap-mode call takes two exits, its entry's at
        // the site and its return's (maybe in a later phase): the calls per
        // iteration are the guest's, the exits per call the run's.
        let rounds = vec![[10.0, 410.0, 80.0, 300.0]];
        let phases = [
            count(Phase::Trap, 100, 350, 350),
            count(Phase::Exitless, 100, 350, 0),
        ];
        let c = ExitlessCosts::judge(rounds, &phases, tracers(350, 700, 350), 80).unwrap();
        assert_eq!(c.calls_per_iter, 3.5);
        assert_eq!(c.trap_exits_per_call, 2.0);
        assert_eq!(c.trap_us(), [20.0]);
        assert_eq!(c.instructions(), [290.0 / 3.5]);
    }

    #[test]
    fn every_count_must_be_exact() {
        let rounds = vec![[10.0, 410.0, 45.0, 108.0]];
        let trap = count(Phase::Trap, 100, 350, 350);
        let judge = |phases: &[PhaseCount], t| ExitlessCosts::judge(rounds.clone(), phases, t, 28);
        // One trap at a site in an exitless phase: the run fails (it used
        // to pass under 1 % of the calls).
        let e = judge(
            &[trap, count(Phase::Exitless, 100, 350, 1)],
            tracers(350, 351, 349),
        )
        .unwrap_err();
        assert!(
            e.contains("the exitless phases took 1 trace-port traps at sites in 350 calls"),
            "{e}"
        );
        // The exitless tracer counted one call more, or one fewer, than
        // the guest made in the exitless phases.
        for n in [349, 351] {
            let e = judge(
                &[trap, count(Phase::Exitless, 100, 350, 0)],
                tracers(350, 350, n),
            )
            .unwrap_err();
            assert!(
                e.contains(&format!(
                    "the exitless tracer counted {n} calls in 100 iterations of the exitless \
                     phases, where the guest made 350"
                )),
                "{e}"
            );
        }
        // The trap tracer likewise, in the trap phases.
        let e = judge(
            &[trap, count(Phase::Exitless, 100, 350, 0)],
            tracers(349, 349, 350),
        )
        .unwrap_err();
        assert!(e.contains("the trap tracer counted 349 calls"), "{e}");
        // Untraced exitless phases, or no trap at all in trap phases.
        let e = judge(
            &[trap, count(Phase::Exitless, 100, 350, 0)],
            tracers(350, 350, 0),
        )
        .unwrap_err();
        assert!(e.contains("counted 0 calls"), "{e}");
        let phases = [
            count(Phase::Trap, 100, 0, 0),
            count(Phase::Exitless, 100, 350, 0),
        ];
        let e = judge(&phases, tracers(0, 0, 350)).unwrap_err();
        assert!(e.contains("no hrtimer_* call trapped"), "{e}");
        // Exact: accepted.
        let c = judge(
            &[trap, count(Phase::Exitless, 100, 350, 0)],
            tracers(350, 350, 350),
        )
        .unwrap();
        assert_eq!((c.exitless_calls, c.exits_per_call()), (350, 0.0));
    }

    #[test]
    fn instructions_counted_by_kvm_per_call() {
        let rounds = vec![[10.0, 410.0, 45.0, 108.0]; 2];
        // 3.5 calls per iteration (2,100 in 600 trap iterations), 28
        // instructions each; 2,100 exitless calls.
        let phases = counted_rounds(28.0, 400);
        let c =
            ExitlessCosts::judge(rounds.clone(), &phases, tracers(2100, 2100, 2100), 28).unwrap();
        assert_eq!(
            c.counted,
            Some(vec![[60.0, 460.0, 60.0, 158.0], [60.0, 460.0, 60.0, 158.0]])
        );
        assert_eq!(c.spin_counted(), Some(vec![400.0, 400.0]));
        assert_eq!(c.counted_instructions(), Ok(vec![28.0, 28.0]));

        // The graph: 80 per call.
        let phases = counted_rounds(80.0, 400);
        let c =
            ExitlessCosts::judge(rounds.clone(), &phases, tracers(2100, 2100, 2100), 80).unwrap();
        assert_eq!(c.counted_instructions(), Ok(vec![80.0, 80.0]));

        // Within 2 % of 2 x SPIN: used.
        let phases = counted_rounds(28.0, 392);
        let c =
            ExitlessCosts::judge(rounds.clone(), &phases, tracers(2100, 2100, 2100), 28).unwrap();
        assert!(c.counted_instructions().is_ok());
    }

    #[test]
    fn counts_of_a_kvm_that_does_not_emulate_are_not_used() {
        let rounds = vec![[10.0, 410.0, 45.0, 108.0]; 2];
        // Hardware-virtualized KVM: the spin's 400 instructions run natively,
        // KVM's emulator counts none of them.
        let phases = counted_rounds(28.0, 0);
        let c =
            ExitlessCosts::judge(rounds.clone(), &phases, tracers(2100, 2100, 2100), 28).unwrap();
        assert_eq!(c.spin_counted(), Some(vec![0.0, 0.0]));
        let e = c.counted_instructions().unwrap_err();
        assert!(
            e.contains("counted 0.0 instructions more per spin iteration, not 2 x 200 = 400"),
            "{e}"
        );
        let phases = counted_rounds(28.0, 391);
        let c =
            ExitlessCosts::judge(rounds.clone(), &phases, tracers(2100, 2100, 2100), 28).unwrap();
        assert!(c.counted_instructions().is_err());

        // No count at all (no stats fd), or a phase without one.
        let mut phases = counted_rounds(28.0, 400);
        phases[5].insns = None;
        let c =
            ExitlessCosts::judge(rounds.clone(), &phases, tracers(2100, 2100, 2100), 28).unwrap();
        assert_eq!(c.counted, None);
        let e = c.counted_instructions().unwrap_err();
        assert!(e.contains("KVM gives no instruction count"), "{e}");
        // A round whose phases are not all there (or ran no iteration).
        let phases = counted_rounds(28.0, 400);
        let c = ExitlessCosts::judge(rounds.clone(), &phases[..7], tracers(2100, 2100, 700), 28)
            .unwrap();
        assert_eq!(c.counted, None);
    }
}
