//! call/stack: what recording the kernel stack (`--stack`) adds to a
//! trapped call, in phases of one running mini guest, as (a)-(c) measure a
//! traced call (`calls`): the guest runs `stack=1` (guest/mini/README.md
//! "stack=1": `stack_leaf` called through four known chains of 2 to 5
//! frames, unwound by frame pointers), `stack_*` traced in trap mode.
//!
//! Three kinds of phase, in rotating order, `--rounds` rounds of `--iters`
//! iterations per vCPU, switched under pauses:
//!
//! - **untraced**: no site patched;
//! - **trap**: the `stack_*` sites trap to the real recorder of a tracer
//!   planned without `--stack`;
//! - **stack**: the same sites trap to the recorder of a tracer planned with
//!   `--stack stack_leaf` (`Request::stack`): each `stack_leaf` call also
//!   unwinds its stack through the guest's memory and interns it.
//!
//! Two tracers over one VM, at most one attached at a time; each vCPU's
//! handler hands a trap to one tracer's recorder, chosen by a flag flipped
//! under the pause that switches phases (as call/trap's handler chooses
//! between resume-only and the recorder), and counts it.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tracer::kernel::symbols::KernelImage;
use tracer::plan::{ModeChoice, Request, TracePlan};
use tracer::session::Tracer;
use tracer::trace::model::{StackEnd, Trace};
use vmm::exit::ExitKind;
use vmm::gva::{AddressSpace, PagingMode};
use vmm::{Paused, StopReason, Trap, TrapError, TrapHandler, Vm};

use super::phases::{timed_phase, IterCounters};
use super::{guest_config, stop, MINI_MEM_MIB, SETTLE};
use crate::bench::median;
use crate::error::{Error, Flags, InputError, RuntimeError};
use vmm::advice::Advice;

/// The functions traced, and the one whose calls record their stack.
pub const STACK_GLOB: &str = "stack_*";
pub const STACK_FUNC: &str = "stack_leaf";
/// The mini guest's command line: iterate, and call the stack chains.
pub const STACK_CMDLINE: &str = "mode=loop stack=1";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Untraced,
    Trap,
    Stack,
}

const MODES: [Mode; 3] = [Mode::Untraced, Mode::Trap, Mode::Stack];

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Untraced => "untraced",
            Mode::Trap => "trap",
            Mode::Stack => "stack",
        }
    }
}

/// One vCPU's handler: the recorder of the tracer without stacks
/// (`recorders[0]`) or of the one with (`[1]`), chosen by a flag the
/// controller flips while the guest is paused; the traps each took (one
/// writer: a plain load and store).
struct Switch {
    stack: Arc<AtomicBool>,
    traps: [Arc<AtomicU64>; 2],
    recorders: [Box<dyn TrapHandler>; 2],
}

impl TrapHandler for Switch {
    fn on_trap(&mut self, trap: &mut Trap<'_>) -> Result<(), TrapError> {
        let k = usize::from(self.stack.load(Ordering::Relaxed));
        let n = &self.traps[k];
        n.store(n.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        self.recorders[k].on_trap(trap)
    }

    fn flush(&mut self) {
        for r in &mut self.recorders {
            r.flush();
        }
    }
}

/// call/stack as measured.
#[derive(Clone, Debug)]
pub struct StackCosts {
    /// Per round, µs per guest iteration per vCPU: untraced, trap, stack.
    pub rounds: Vec<[f64; 3]>,
    /// Traced (`stack_*`) calls per iteration, over the trap and stack
    /// phases.
    pub calls_per_iter: f64,
    /// `stack_leaf` calls (each recording its stack) per iteration, over
    /// the stack phases.
    pub stacks_per_iter: f64,
    /// `stack_leaf` calls recorded with their stack, and their frames.
    pub stacks: u64,
    pub frames: u64,
    /// Distinct stacks (`Trace::stacks`: the guest's four chains).
    pub distinct: usize,
    /// Trace-port exits in the stack phases, and the calls traced there.
    pub stack_exits: u64,
    pub stack_calls: u64,
    /// The recorders timed alone in process (`stack_alone`).
    pub alone: Option<StackAlone>,
}

/// call/stack's cross-check (`stack_alone`): the recorders alone, ns per
/// `on_trap`.
#[derive(Clone, Debug)]
pub struct StackAlone {
    pub recorder_ns: f64,
    pub recorder_stack_ns: f64,
    /// Frames of the stack the traps unwound.
    pub frames: usize,
}

impl StackCosts {
    fn per_round(&self, f: impl Fn(&[f64; 3]) -> f64) -> Vec<f64> {
        self.rounds.iter().map(f).collect()
    }

    /// µs per traced call without its stack, per round: (t_trap −
    /// t_untraced) / calls per iteration.
    pub fn without_us(&self) -> Vec<f64> {
        let x = self.calls_per_iter;
        self.per_round(|t| (t[1] - t[0]) / x)
    }

    /// µs the stack adds to a `stack_leaf` call, per round: (t_stack −
    /// t_trap) / stacks per iteration.
    pub fn extra_us(&self) -> Vec<f64> {
        let l = self.stacks_per_iter;
        self.per_round(|t| (t[2] - t[1]) / l)
    }

    /// µs per `stack_leaf` call with its stack, per round: the traced
    /// call's cost plus its stack's.
    pub fn with_us(&self) -> Vec<f64> {
        let (x, l) = (self.calls_per_iter, self.stacks_per_iter);
        self.per_round(|t| (t[1] - t[0]) / x + (t[2] - t[1]) / l)
    }

    /// With over without, per round.
    pub fn ratios(&self) -> Vec<f64> {
        self.with_us()
            .iter()
            .zip(self.without_us())
            .map(|(w, wo)| w / wo)
            .collect()
    }

    /// Frames per recorded stack, mean over the calls.
    pub fn frames_mean(&self) -> f64 {
        self.frames as f64 / self.stacks as f64
    }

    /// Trace-port exits per traced call in the stack phases (1).
    pub fn exits_per_call(&self) -> f64 {
        self.stack_exits as f64 / self.stack_calls as f64
    }

    /// Median µs per iteration, by phase.
    pub fn iter_us(&self) -> [f64; 3] {
        let m = |i: usize| median(&self.per_round(|t| t[i]));
        [m(0), m(1), m(2)]
    }
}

/// Iterations done in each kind of phase (exact counts read under the
/// pauses that began and ended them).
#[derive(Default)]
struct Iters {
    by_mode: [u64; 3],
}

impl Iters {
    /// Count the phase `mode` that began at `from` iterations and ended
    /// at `now`.
    fn close(&mut self, phase: Option<(Mode, u64)>, now: u64) {
        if let Some((mode, from)) = phase {
            self.by_mode[mode as usize] += now - from;
        }
    }
}

/// The trap-mode plan for `stack_*`, with `--stack stack_leaf` or without.
pub(super) fn plan(
    image: KernelImage,
    cpus: usize,
    stack: bool,
) -> Result<tracer::plan::Plan, Error> {
    let req = Request {
        trace: vec![STACK_GLOB.to_string()],
        notrace: Vec::new(),
        graph: false,
        mode: ModeChoice::Trap,
        ring_events: None,
        cpus,
        emulator_host: false,
        linux: false,
        pids: Vec::new(),
        comm: None,
        args: Vec::new(),
        retval: false,
        stack: if stack {
            vec![STACK_FUNC.to_string()]
        } else {
            Vec::new()
        },
        entry: Default::default(),
        events: Vec::new(),
        module_events: Vec::new(),
    };
    Ok(TracePlan::build(image, &req)
        .map_err(InputError::from)?
        .plan)
}

/// The two tracers; at most one attached at a time.
struct Tracers {
    plain: Tracer,
    stack: Tracer,
}

impl Tracers {
    /// Under pause `p`, make the phase `mode` run next.
    fn switch(&mut self, p: &Paused<'_>, flag: &AtomicBool, mode: Mode) -> Result<(), Error> {
        for (t, wanted) in [
            (&mut self.plain, mode == Mode::Trap),
            (&mut self.stack, mode == Mode::Stack),
        ] {
            if !wanted && t.is_attached() {
                t.detach(p.memory()).map_err(RuntimeError::Restore)?;
            }
        }
        flag.store(mode == Mode::Stack, Ordering::Relaxed);
        for (t, wanted) in [
            (&mut self.plain, mode == Mode::Trap),
            (&mut self.stack, mode == Mode::Stack),
        ] {
            if wanted && !t.is_attached() {
                t.attach(p)?.attached()?;
            }
        }
        Ok(())
    }
}

/// call/stack: the mini guest with `stack=1` in `mode=loop`, phases of
/// `iters` iterations per vCPU, untraced / trap / stack in rotating order,
/// `reps` rounds. See the module documentation.
pub fn stack_costs(kernel: &Path, cpus: u64, iters: u64, reps: usize) -> Result<StackCosts, Error> {
    let vm = Vm::create(guest_config(kernel, cpus, MINI_MEM_MIB, STACK_CMDLINE)?)?;
    let ncpus = vm.cpus();
    let load = || KernelImage::load(kernel).map_err(tracer::error::TracerError::from);
    let (plain, plain_recs) = Tracer::new(plan(load()?, ncpus, false)?, ncpus, u64::MAX);
    let (stack, stack_recs) = Tracer::new(plan(load()?, ncpus, true)?, ncpus, u64::MAX);
    let mut tracers = Tracers { plain, stack };
    let flag = Arc::new(AtomicBool::new(false));
    let new = || Arc::new(AtomicU64::new(0));
    let traps: Vec<[Arc<AtomicU64>; 2]> = (0..ncpus).map(|_| [new(), new()]).collect();
    let handlers: Vec<Box<dyn TrapHandler>> = plain_recs
        .into_iter()
        .zip(stack_recs)
        .zip(&traps)
        .map(|((plain, stacked), [t0, t1])| {
            Box::new(Switch {
                stack: Arc::clone(&flag),
                traps: [Arc::clone(t0), Arc::clone(t1)],
                recorders: [plain, stacked],
            }) as Box<dyn TrapHandler>
        })
        .collect();
    let running = vm.start(handlers, false).map_err(RuntimeError::Start)?;
    let result = run_phases(&running, &mut tracers, &flag, ncpus, iters, reps);

    // Stop, restore every site whatever happened, then judge.
    let mem = running.memory().clone();
    let report = stop(running);
    let restored = [tracers.plain.detach(&mem), tracers.stack.detach(&mem)];
    let reason = report.reason.say(&Flags);
    let plain = tracers.plain.finish(kernel, reason.clone());
    let stacked = tracers.stack.finish(kernel, reason);
    let (rounds, done) = result?;
    for r in restored {
        r.map_err(RuntimeError::Restore)?;
    }
    let measure = |m: String| -> Error { RuntimeError::Measure(m).into() };
    if report.reason != StopReason::Requested {
        return Err(measure(format!(
            "the mini guest (stack=1) stopped on its own: {}; console: {}",
            report.reason.say(&Flags),
            report.console_tail.join(" | ")
        )));
    }
    let sum = |k: usize| traps.iter().map(|t| t[k].load(Ordering::Relaxed)).sum();
    let port_exits: u64 = report.vcpus.iter().map(|v| v.get(ExitKind::Trap)).sum();
    judge(
        rounds,
        &done,
        [sum(0), sum(1)],
        port_exits,
        [&plain, &stacked],
    )
    .map_err(measure)
}

/// The rounds of phases, µs per iteration by phase, and the iterations of
/// each kind of phase. Both tracers are detached at the end.
fn run_phases(
    running: &vmm::Running,
    tracers: &mut Tracers,
    flag: &AtomicBool,
    ncpus: usize,
    iters: u64,
    reps: usize,
) -> Result<(Vec<[f64; 3]>, Iters), Error> {
    let map = AddressSpace::new(
        running.memory(),
        vmm::layout::PML4_START,
        PagingMode::Level4,
    );
    let mut counters = IterCounters::new(map, &tracers.plain.plan().image, ncpus, &[])?;
    std::thread::sleep(SETTLE);
    let mut done = Iters::default();
    let mut pending: Option<(Mode, u64)> = None;
    let mut rounds = Vec::new();
    for round in 0..reps {
        let mut tau = [0.0f64; 3];
        for k in 0..3 {
            let m = (k + round) % 3;
            // Between phases: read the exact counts, switch, resume.
            let start = {
                let p = running.pause_all();
                let now = counters.total()?;
                done.close(pending.take(), now);
                tracers.switch(&p, flag, MODES[m])?;
                pending = Some((MODES[m], now));
                counters.read()?
            };
            tau[m] = timed_phase(running, &mut counters, &start, iters, MODES[m].name())?;
        }
        note!(
            "vmtrace bench: call/stack round {}/{reps}: µs per iteration: untraced {:.1}, trap \
             {:.1}, stack {:.1}",
            round + 1,
            tau[0],
            tau[1],
            tau[2]
        );
        rounds.push(tau);
    }
    let p = running.pause_all();
    done.close(pending.take(), counters.total()?);
    tracers.switch(&p, flag, Mode::Untraced)?;
    Ok((rounds, done))
}

/// The figures, from the rounds, the iterations of each kind of phase, the
/// traps each tracer's recorders took (`[plain, stack]`), the run's
/// trace-port exits and the two traces; an error unless the counts are
/// exact: every exit a trap one of the recorders took and recorded as one
/// call, no stack in the plain trace, one in the stack trace at every
/// `stack_leaf` call and only there, each unwound to the bottom.
fn judge(
    rounds: Vec<[f64; 3]>,
    done: &Iters,
    traps: [u64; 2],
    port_exits: u64,
    [plain, stacked]: [&Trace; 2],
) -> Result<StackCosts, String> {
    let calls = [plain.meta.events_total, stacked.meta.events_total];
    if port_exits != traps[0] + traps[1] || traps != calls {
        return Err(format!(
            "{port_exits} trace-port exits, {traps:?} traps taken by the recorders without and \
             with stacks, {calls:?} calls recorded"
        ));
    }
    let [_, trap_iters, stack_iters] = done.by_mode;
    if calls[1] == 0 || trap_iters == 0 || stack_iters == 0 {
        return Err(format!("no {STACK_GLOB} call trapped in the traced phases"));
    }
    if plain.events.iter().any(|e| e.stack != 0) || !plain.stacks.is_empty() {
        return Err("the tracer without --stack recorded stacks".into());
    }
    let (mut stacks, mut frames) = (0u64, 0u64);
    for e in &stacked.events {
        let leaf = stacked.functions[e.func as usize].name == STACK_FUNC;
        match (stacked.stack_of(e), leaf) {
            (Some(s), true) if s.end == StackEnd::Bottom => {
                stacks += 1;
                frames += s.frames.len() as u64;
            }
            (Some(s), true) => {
                return Err(format!(
                    "a {STACK_FUNC} stack of {} frames ended {:?}, not at the bottom",
                    s.frames.len(),
                    s.end
                ))
            }
            (None, true) => return Err(format!("a {STACK_FUNC} call without its stack")),
            (Some(_), false) => return Err(format!("a stack at a call other than {STACK_FUNC}")),
            (None, false) => {}
        }
    }
    Ok(StackCosts {
        rounds,
        calls_per_iter: (calls[0] + calls[1]) as f64 / (trap_iters + stack_iters) as f64,
        stacks_per_iter: stacks as f64 / stack_iters as f64,
        stacks,
        frames,
        distinct: stacked.stacks.len(),
        stack_exits: traps[1],
        stack_calls: calls[1],
        alone: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 4.75 stack_* calls and 1.875 stack_leaf calls per iteration (the
    /// guest's: 1 + 1 + 1/2 + 3/8, and 1 + 1/2 + 1/4 + 1/8).
    fn costs(rounds: Vec<[f64; 3]>) -> StackCosts {
        StackCosts {
            rounds,
            calls_per_iter: 4.75,
            stacks_per_iter: 1.875,
            stacks: 1875,
            frames: 6625,
            distinct: 4,
            stack_exits: 4750,
            stack_calls: 4750,
            alone: None,
        }
    }

    #[test]
    fn cost_with_and_without_the_stack_per_call() {
        // Untraced 10 µs; trap: 4.75 calls of 10 µs; stack: 1.875 of them
        // 2 µs more (3.75 µs per iteration).
        let c = costs(vec![[10.0, 57.5, 61.25], [10.0, 57.5, 61.25]]);
        assert_eq!(c.without_us(), [10.0, 10.0]);
        assert_eq!(c.extra_us(), [2.0, 2.0]);
        assert_eq!(c.with_us(), [12.0, 12.0]);
        assert_eq!(c.ratios(), [1.2, 1.2]);
        assert_eq!(c.exits_per_call(), 1.0);
        // (4 + 3/2 + 2/4 + 5/8) / 1.875 frames.
        assert!((c.frames_mean() - 53.0 / 15.0).abs() < 1e-12);
        assert_eq!(c.iter_us(), [10.0, 57.5, 61.25]);
    }

    #[test]
    fn iterations_count_by_kind_of_phase() {
        let mut it = Iters::default();
        it.close(None, 100);
        it.close(Some((Mode::Untraced, 100)), 200);
        it.close(Some((Mode::Trap, 200)), 260);
        it.close(Some((Mode::Stack, 260)), 300);
        it.close(Some((Mode::Trap, 300)), 310);
        assert_eq!(it.by_mode, [100, 70, 40]);
    }
}
