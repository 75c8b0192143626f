//! Figures (a), (b) and (c): the cost of one traced call against the exit
//! round trip it cannot avoid, in phases of one running mini guest (see the
//! `bench` module documentation), and the two handlers timed alone.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tracer::kernel::sites::SITE_LEN;
use tracer::plan::Plan;
use tracer::session::record::{self, SiteIndex, OUT_LEN};
use tracer::session::Tracer;
use vmm::gva::{AddressSpace, PagingMode};
use vmm::{Paused, Trap, TrapError, TrapHandler, Vm};

use super::phases::{timed_phase, IterCounters};
use super::{mini_config, wind_down, SETTLE, TRACE_GLOB};
use crate::bench::median;
use crate::error::{Error, InputError, RuntimeError};

/// Traps per handler in the in-process cross-check.
pub const HANDLER_TRAPS: usize = 1_000_000;

/// The cheapest correct trap handler: find the site, resume after it.
struct ResumeOnly {
    index: Arc<SiteIndex>,
}

impl TrapHandler for ResumeOnly {
    fn on_trap(&mut self, trap: &mut Trap<'_>) -> Result<(), TrapError> {
        let i = self.index.find(trap.rip).ok_or(TrapError::UnknownSite {
            cpu: trap.cpu,
            rip: trap.rip,
        })?;
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
    fn on_trap(&mut self, trap: &mut Trap<'_>) -> Result<(), TrapError> {
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

/// (a), (b), (c).
pub struct CallCosts {
    /// Per round, µs.
    pub a: Vec<f64>,
    pub b: Vec<f64>,
    /// Per round, µs: (T_recorder - T_resume-only) per exit.
    pub b_minus_a: Vec<f64>,
    /// Median µs per iteration per vCPU, by mode.
    pub iter_us: [f64; 3],
    /// Trace exits per iteration (measured).
    pub exits_per_iter: f64,
}

impl CallCosts {
    /// (c) per round: b / a.
    pub fn ratios(&self) -> Vec<f64> {
        self.a.iter().zip(&self.b).map(|(a, b)| b / a).collect()
    }

    /// From each round's µs per iteration by mode (`MODES` order) and the
    /// trace exits per iteration `e`.
    fn from_rounds(rounds: &[[f64; 3]], e: f64) -> CallCosts {
        let per_exit = |k: fn(&[f64; 3]) -> f64| rounds.iter().map(|t| k(t) / e).collect();
        let median_of = |m: usize| median(&rounds.iter().map(|t| t[m]).collect::<Vec<_>>());
        CallCosts {
            a: per_exit(|t| t[1] - t[0]),
            b: per_exit(|t| t[2] - t[0]),
            b_minus_a: per_exit(|t| t[2] - t[1]),
            iter_us: [median_of(0), median_of(1), median_of(2)],
            exits_per_iter: e,
        }
    }
}

/// Iterations and traps summed over the traced phases (their ratio is the
/// trace exits per iteration).
#[derive(Default)]
struct TracedTotals {
    iters: u64,
    traps: u64,
}

/// The phase running now, and the exact counts at its start (read paused).
struct Phase {
    mode: Mode,
    iters: u64,
    traps: u64,
}

impl TracedTotals {
    /// Count the phase that ended with `iters` iterations and `traps` traps
    /// done in all, if it was traced.
    fn close(&mut self, phase: Option<Phase>, iters: u64, traps: u64) {
        if let Some(p) = phase.filter(|p| p.mode != Mode::Untraced) {
            self.iters += iters - p.iters;
            self.traps += traps - p.traps;
        }
    }
}

/// Under pause `p`, make the phase `mode` run next: untraced (detached),
/// or attached with the resume-only handler or the recorder.
fn switch(
    tracer: &mut Tracer,
    p: &Paused<'_>,
    record: &AtomicBool,
    mode: Mode,
) -> Result<(), Error> {
    match mode {
        Mode::Untraced => {
            if tracer.is_attached() {
                tracer.detach(p.memory()).map_err(RuntimeError::Restore)?;
            }
        }
        mode => {
            record.store(mode == Mode::Recorder, Ordering::Relaxed);
            if !tracer.is_attached() {
                tracer.attach(p)?.attached()?;
            }
        }
    }
    Ok(())
}

/// Figures (a) and (b): the mini guest in `mode=loop`, phases of `iters`
/// iterations per vCPU, untraced / resume-only / recorder in rotating order,
/// `reps` rounds. See the `bench` module documentation.
pub fn call_costs(kernel: &Path, cpus: u64, iters: u64, reps: usize) -> Result<CallCosts, Error> {
    let plan = Plan::new(kernel, &[TRACE_GLOB.to_string()], &[])?;
    let index = Arc::clone(&plan.index);
    let vm = Vm::create(mini_config(kernel, cpus)?)?;
    let ncpus = vm.cpus();
    let (tracer, recorders) = Tracer::new(plan, ncpus, u64::MAX);
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
    let mut session = super::session(vm, tracer, handlers, kernel)?;
    let (running, tracer) = session.parts();
    let mem = running.memory().clone();
    let total_traps = || traps.iter().map(|t| t.load(Ordering::Relaxed)).sum::<u64>();
    let result = (|| -> Result<CallCosts, Error> {
        let map = AddressSpace::new(&mem, vmm::layout::PML4_START, PagingMode::Level4);
        let mut counters = IterCounters::new(map, &tracer.plan().image, ncpus, &[])?;
        std::thread::sleep(SETTLE);
        let mut traced = TracedTotals::default();
        let mut pending: Option<Phase> = None;
        let mut rounds: Vec<[f64; 3]> = Vec::new();
        for round in 0..reps {
            let mut tau = [0.0f64; 3];
            for k in 0..3 {
                let m = (k + round) % 3;
                // Between phases: read the exact counts, switch, resume.
                let start = {
                    let p = running.pause_all();
                    let now = counters.total()?;
                    let tr = total_traps();
                    traced.close(pending.take(), now, tr);
                    switch(tracer, &p, &record, MODES[m])?;
                    pending = Some(Phase {
                        mode: MODES[m],
                        iters: now,
                        traps: tr,
                    });
                    counters.read()?
                };
                tau[m] = timed_phase(running, &mut counters, &start, iters, MODES[m].name())?;
            }
            note!(
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
            let now = counters.total()?;
            traced.close(pending.take(), now, total_traps());
            switch(tracer, &p, &record, Mode::Untraced)?;
        }
        if traced.iters == 0 || traced.traps == 0 {
            return Err(RuntimeError::Measure(format!(
                "no {TRACE_GLOB} call trapped in the traced phases"
            ))
            .into());
        }
        let e = traced.traps as f64 / traced.iters as f64;
        Ok(CallCosts::from_rounds(&rounds, e))
    })();
    wind_down(session, result, "the mini guest")
}

/// The handlers timed alone, ns per `on_trap`.
pub struct HandlerAlone {
    pub resume_only_ns: f64,
    pub recorder_ns: f64,
}

/// The handlers alone, in process: ns per `on_trap` for resume-only and the
/// recorder, on a Trap over the mini guest's memory (loaded, page tables set).
pub fn handler_alone(kernel: &Path) -> Result<HandlerAlone, Error> {
    let vm = Vm::create(mini_config(kernel, 1)?)?;
    let mem = vm.memory();
    let plan = Plan::new(kernel, &[TRACE_GLOB.to_string()], &[])?;
    let index = Arc::clone(&plan.index);
    // RIP past the `out` (this host's convention), cycling over the sites;
    // RSP on the mini guest's first stack page.
    let rips: Vec<u64> = index.addrs.iter().map(|a| a + OUT_LEN).collect();
    let rsp = plan
        .image
        .symbol("__bss_start")
        .map(|s| s.addr + 0x800)
        .ok_or_else(|| InputError::NotMini {
            path: kernel.to_owned(),
            why: "it has no __bss_start".into(),
        })?;
    let cr3 = vmm::layout::PML4_START;
    let time = |h: &mut dyn TrapHandler| -> Result<f64, Error> {
        let t = Instant::now();
        for i in 0..HANDLER_TRAPS {
            let mut trap =
                Trap::for_bench(0, rips[i % rips.len()], rsp, cr3, PagingMode::Level4, mem);
            h.on_trap(&mut trap).map_err(RuntimeError::Trap)?;
        }
        h.flush();
        Ok(t.elapsed().as_secs_f64() * 1e9 / HANDLER_TRAPS as f64)
    };
    let resume_only_ns = time(&mut ResumeOnly {
        index: Arc::clone(&index),
    })?;
    let (shared, mut recs, store) = record::recorders(
        Arc::clone(&index),
        1,
        u64::MAX,
        tracer::session::store::Storage::Memory,
        Arc::new(Vec::new()),
    );
    let mut rec = recs.pop().expect("one recorder");
    let recorder_ns = time(&mut rec)?;
    drop(rec);
    let events = match store.thread.join() {
        Ok(tracer::session::store::Stored::Memory(e)) => e.len(),
        _ => 0,
    };
    if events != HANDLER_TRAPS || shared.parent_unreadable.load(Ordering::Relaxed) != 0 {
        return Err(RuntimeError::Measure(format!(
            "in-process recorder stored {events} of {HANDLER_TRAPS} events"
        ))
        .into());
    }
    Ok(HandlerAlone {
        resume_only_ns,
        recorder_ns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_per_exit_from_rounds() {
        // µs per iteration: untraced, resume-only, recorder; 2 exits each.
        let rounds = [[10.0, 30.0, 32.0], [12.0, 30.0, 34.0], [11.0, 31.0, 33.0]];
        let c = CallCosts::from_rounds(&rounds, 2.0);
        assert_eq!(c.a, [10.0, 9.0, 10.0]);
        assert_eq!(c.b, [11.0, 11.0, 11.0]);
        assert_eq!(c.b_minus_a, [1.0, 2.0, 1.0]);
        assert_eq!(c.iter_us, [11.0, 30.0, 33.0]);
        assert_eq!(c.exits_per_iter, 2.0);
    }

    #[test]
    fn only_traced_phases_count_toward_exits() {
        let mut t = TracedTotals::default();
        let phase = |mode| {
            Some(Phase {
                mode,
                iters: 100,
                traps: 50,
            })
        };
        t.close(None, 100, 50);
        t.close(phase(Mode::Untraced), 200, 50);
        t.close(phase(Mode::ResumeOnly), 150, 80);
        t.close(phase(Mode::Recorder), 110, 60);
        assert_eq!((t.iters, t.traps), (60, 40));
    }
}
