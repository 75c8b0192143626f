//! The phase technique of (a)-(c) and (f): one running mini guest in
//! `mode=loop`, switched between configurations under pauses; each phase
//! runs until every vCPU made a given number of iterations, read from the
//! guest's own counters.

use std::time::{Duration, Instant};

use tracer::symbols::KernelImage;
use vmm::gva::{AddressSpace, PagingMode};
use vmm::{Paused, Running};

use crate::bench::us;
use crate::error::{Error, InputError, RuntimeError};

/// No measured phase may take longer.
const RUN_TIMEOUT: Duration = Duration::from_secs(300);
/// The mini guest's per-vCPU counters, and how many vCPU blocks it has.
const MINI_CPUS: &str = "mini_cpus";
const MINI_MAX_CPUS: u64 = 64;
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
}

impl<'a> IterCounters<'a> {
    /// `map`: an AddressSpace over the mini guest's memory and boot page tables.
    pub(super) fn new(
        map: AddressSpace<'a>,
        image: &KernelImage,
        ncpus: usize,
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
        Ok(IterCounters {
            map,
            vas: (0..ncpus as u64).map(|c| sym.addr + c * stride).collect(),
        })
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
