//! The phase technique of (a)-(c) and (f): one running mini guest in
//! `mode=loop`, switched between configurations under pauses; each phase
//! runs until every vCPU made a given number of iterations, read from the
//! guest's own counters.
//!
//! The guest also counts its own calls of each function, in the function's
//! body right after its site (`c->count[f]++`, workload.c). (f) and (g)
//! switch phases only at a *settled* pause (`pause_settled`): no vCPU
//! between a traced site and that count, so each call is counted by the
//! guest in the phase whose configuration its site ran with, and the calls
//! a phase made are exact.

use std::ops::Range;
use std::time::{Duration, Instant};
use vmm::Stopped;

use tracer::kernel::symbols::KernelImage;
use vmm::gva::{AddressSpace, PagingMode};
use vmm::{Paused, Running};

use tracer::plan::exitless::layout::{CODE_LEN, CODE_VA};

use crate::bench::us;
use crate::error::{Error, InputError, RuntimeError};

/// No measured phase may take longer.
const RUN_TIMEOUT: Duration = Duration::from_secs(300);
/// The mini guest's per-vCPU counters, and how many vCPU blocks it has.
const MINI_CPUS: &str = "mini_cpus";
const MINI_MAX_CPUS: u64 = 64;
/// The functions whose calls `mini_cpus[cpu].count[]` counts, in the
/// order of its indexes (guest/mini/workload.c, `enum { F_do_idle, ... }`).
const MINI_COUNTED: [&str; 8] = [
    "do_idle",
    "schedule",
    "hrtimer_start_range_ns",
    "hrtimer_try_to_cancel",
    "hrtimer_interrupt",
    "__hrtimer_run_queues",
    "hrtimer_wakeup",
    "tick_sched_timer",
];
/// Pauses `pause_settled` may take before giving up.
const SETTLE_TRIES: usize = 10_000;
/// How often a phase looks at the guest's iteration counters.
const PHASE_POLL: Duration = Duration::from_micros(500);

/// The error for a kernel that is not the mini guest vmtrace expects.
pub(super) fn not_mini(image: &KernelImage, why: String) -> Error {
    InputError::NotMini {
        path: image.path.clone(),
        why,
    }
    .into()
}

/// The mini guest's own iteration counters (`mini_cpus[cpu].count[do_idle]`),
/// read through its page tables while it runs (an aligned u64 the guest
/// stores with one instruction) or while it is paused.
pub(super) struct IterCounters<'a> {
    map: AddressSpace<'a>,
    vas: Vec<u64>,
    /// Per vCPU, the addresses of the traced functions' call counters.
    calls: Vec<Vec<u64>>,
}

impl<'a> IterCounters<'a> {
    /// `map`: an AddressSpace over the mini guest's memory and boot page
    /// tables; `traced`: the names of the traced functions, whose calls
    /// `calls_total` sums (each must be one the guest counts).
    pub(super) fn new(
        map: AddressSpace<'a>,
        image: &KernelImage,
        ncpus: usize,
        traced: &[&str],
    ) -> Result<Self, Error> {
        let sym = image
            .symbol(MINI_CPUS)
            .ok_or_else(|| not_mini(image, format!("it has no {MINI_CPUS} symbol")))?;
        let stride = sym.size / MINI_MAX_CPUS;
        if sym.size % MINI_MAX_CPUS != 0 || stride < 8 {
            return Err(not_mini(
                image,
                format!(
                    "its {MINI_CPUS} is {} bytes, not {MINI_MAX_CPUS} per-vCPU blocks",
                    sym.size
                ),
            ));
        }
        let mut offsets = Vec::new();
        for name in traced {
            let f = MINI_COUNTED.iter().position(|n| n == name).ok_or_else(|| {
                not_mini(
                    image,
                    format!("it traces {name}, which the guest does not count"),
                )
            })?;
            offsets.push(8 * f as u64);
        }
        if 8 * MINI_COUNTED.len() as u64 > stride {
            return Err(not_mini(
                image,
                format!("its {MINI_CPUS} blocks are {stride} bytes, too small for its counts"),
            ));
        }
        let vas: Vec<u64> = (0..ncpus as u64).map(|c| sym.addr + c * stride).collect();
        let calls = vas
            .iter()
            .map(|va| offsets.iter().map(|o| va + o).collect())
            .collect();
        Ok(IterCounters { map, vas, calls })
    }

    /// Iterations so far, per vCPU.
    pub(super) fn read(&mut self) -> Result<Vec<u64>, Error> {
        self.vas
            .iter()
            .map(|&va| {
                self.map
                    .read_array::<8>(va)
                    .map(u64::from_le_bytes)
                    .map_err(|e| {
                        RuntimeError::Measure(format!("reading the guest's counters: {e}")).into()
                    })
            })
            .collect()
    }

    /// Iterations so far, all vCPUs together.
    pub(super) fn total(&mut self) -> Result<u64, Error> {
        Ok(self.read()?.iter().sum())
    }

    /// Calls of the traced functions so far, all vCPUs together, as the
    /// guest counted them (exact at a settled pause).
    pub(super) fn calls_total(&mut self) -> Result<u64, Error> {
        let mut n = 0;
        for &va in self.calls.iter().flatten() {
            n += self
                .map
                .read_array::<8>(va)
                .map(u64::from_le_bytes)
                .map_err(|e| RuntimeError::Measure(format!("reading the guest's counters: {e}")))?;
        }
        Ok(n)
    }
}

/// Where a vCPU may be between a traced call's site and the guest's own
/// count of that call: in a traced function (its site first, the count a
/// few instructions later; the whole function, to need no disassembly),
/// or in vmtrace's own code (a trampoline, a stub, a return thunk).
pub(super) fn unsettled(image: &KernelImage, funcs: &[usize]) -> Vec<Range<u64>> {
    let mut v: Vec<Range<u64>> = funcs
        .iter()
        .map(|&f| {
            let s = &image.functions[f];
            s.addr..s.addr + s.size.max(1)
        })
        .collect();
    v.push(CODE_VA..CODE_VA + CODE_LEN);
    v
}

/// Pause the guest where no vCPU's RIP is in `unsettled`: a pause that
/// finds one there is released and taken again a little later (the
/// ranges run a part of each iteration's instructions, most with the
/// exitless function graph, so a few tries do).
pub(super) fn pause_settled<'r>(
    running: &'r Running,
    unsettled: &[Range<u64>],
) -> Result<Paused<'r>, Error> {
    for _ in 0..SETTLE_TRIES {
        let p = running.pause_all();
        // A vCPU without a snapshot has exited: it runs nothing more.
        let busy = (0..running.cpus())
            .filter_map(|cpu| p.snapshot(cpu))
            .any(|s| unsettled.iter().any(|r| r.contains(&s.regs.rip)));
        if !busy {
            return Ok(p);
        }
        drop(p);
        std::thread::sleep(Duration::from_micros(20));
    }
    Err(RuntimeError::Measure(format!(
        "{SETTLE_TRIES} pauses all found a vCPU in a traced function or in vmtrace's code"
    ))
    .into())
}

/// A 4-byte variable of the mini guest the host sets while the guest is
/// paused (`mini_spin`), written through the boot page tables.
pub(super) struct GuestU32 {
    va: u64,
}

impl GuestU32 {
    pub(super) fn new(image: &KernelImage, name: &str) -> Result<Self, Error> {
        let sym = image
            .symbol(name)
            .filter(|s| s.size == 4)
            .ok_or_else(|| not_mini(image, format!("it has no 4-byte {name}")))?;
        Ok(GuestU32 { va: sym.addr })
    }

    pub(super) fn set(&self, paused: &Paused<'_>, v: u32) -> Result<(), Error> {
        AddressSpace::new(paused.memory(), vmm::layout::PML4_START, PagingMode::Level4)
            .write(self.va, &v.to_le_bytes())
            .map_err(|e| RuntimeError::Measure(format!("writing guest memory: {e}")).into())
    }
}

/// Wait until the guest's calls of the counted functions (`calls_total`)
/// reach `min`: a loaded host may not run a resumed vCPU for milliseconds,
/// and what follows needs the guest to have run (`what` names it in
/// errors).
pub(super) fn wait_calls(
    running: &Running,
    counters: &mut IterCounters<'_>,
    min: u64,
    what: &str,
) -> Result<(), Error> {
    let t0 = Instant::now();
    while counters.calls_total()? < min {
        if let Some(r) = running.wait_stop(PHASE_POLL) {
            return Err(RuntimeError::GuestStopped {
                what: "mini guest",
                reason: r,
            }
            .into());
        }
        if t0.elapsed() > RUN_TIMEOUT {
            return Err(RuntimeError::Measure(format!(
                "the mini guest made too few calls in {} s ({what})",
                RUN_TIMEOUT.as_secs()
            ))
            .into());
        }
    }
    Ok(())
}

/// Let the guest run from `start` (per-vCPU counts read under the pause
/// that began this phase) until every vCPU has made `iters` more
/// iterations; µs per iteration per vCPU. `what` names the phase in errors.
pub(super) fn timed_phase(
    running: &Running,
    counters: &mut IterCounters<'_>,
    start: &[u64],
    iters: u64,
    what: &str,
) -> Result<f64, Error> {
    let t0 = Instant::now();
    loop {
        std::thread::sleep(PHASE_POLL);
        if let Some(r) = running.wait_stop(Duration::ZERO) {
            return Err(RuntimeError::GuestStopped {
                what: "mini guest",
                reason: r,
            }
            .into());
        }
        let now = counters.read()?;
        let elapsed = t0.elapsed();
        let done: Vec<u64> = now.iter().zip(start).map(|(n, s)| n - s).collect();
        if done.iter().all(|&d| d >= iters) {
            let per_cpu = done.iter().sum::<u64>() as f64 / start.len() as f64;
            return Ok(us(elapsed) / per_cpu);
        }
        if elapsed > RUN_TIMEOUT {
            return Err(RuntimeError::Measure(format!(
                "the mini guest did only {done:?} iterations in {} s ({what} phase)",
                elapsed.as_secs()
            ))
            .into());
        }
    }
}
