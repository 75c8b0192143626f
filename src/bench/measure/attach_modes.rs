//! (j) the attach's pause, exitless against trap, on the same guest: the
//! window in which every vCPU stands still while `Tracer::attach` patches
//! (and, exitless, maps vmtrace's region), as `vmtrace` itself attaches.

use std::path::Path;
use std::time::Duration;
use vmm::Stopped;

use tracer::plan::Plan;
use tracer::session::Tracer;
use vmm::{StopReason, Vm};

use super::{mini_config, stop, SETTLE};
use crate::bench::us;
use crate::error::{Error, RuntimeError};

/// The functions traced: every site of the mini guest (20 outside init
/// text), about the ~18 sites of the attaches that were measured slow.
pub const ATTACH_GLOB: &str = "*";

/// (j), µs per first attach, one per VM (round).
pub struct AttachModes {
    pub sites: usize,
    pub trap: Vec<f64>,
    pub exitless: Vec<f64>,
}

impl AttachModes {
    /// Exitless over trap, per round.
    pub fn ratios(&self) -> Vec<f64> {
        self.exitless
            .iter()
            .zip(&self.trap)
            .map(|(e, t)| e / t)
            .collect()
    }
}

/// (j): `rounds` fresh mini guests (`mode=loop`, `cpus` vCPUs), each with a
/// trap and an exitless tracer of every site; in each, the first attach of
/// each tracer (in alternating order), each in its own pause and detached
/// in the next. The exitless tracer is staged first (`Tracer::stage`, as
/// `vmtrace` does once the guest runs): the window is what an attach
/// costs the guest, not what vmtrace prepares while it runs.
pub fn attach_modes(kernel: &Path, cpus: u64, rounds: usize) -> Result<AttachModes, Error> {
    let mut f = AttachModes {
        sites: 0,
        trap: Vec::new(),
        exitless: Vec::new(),
    };
    for round in 0..rounds {
        let (trap, exitless, sites) = one_round(kernel, cpus, round % 2 == 1)?;
        f.sites = sites;
        f.trap.push(trap);
        f.exitless.push(exitless);
    }
    Ok(f)
}

/// One fresh guest: (trap µs, exitless µs, sites), exitless first if asked.
fn one_round(kernel: &Path, cpus: u64, exitless_first: bool) -> Result<(f64, f64, usize), Error> {
    let glob = [ATTACH_GLOB.to_string()];
    let trap_plan = Plan::new(kernel, &glob, &[])?;
    let sites = trap_plan.index.addrs.len();
    let exitless_plan = Plan::new(kernel, &glob, &[])?;
    let vm = Vm::create(mini_config(kernel, cpus)?)?;
    let ncpus = vm.cpus();
    let (mut trap, recorders) = Tracer::new(trap_plan, ncpus, u64::MAX);
    // Its handlers would only see traps at its own sites; it writes none.
    let (mut exitless, unused) = Tracer::exitless(exitless_plan, ncpus, u64::MAX, None)?;
    drop(unused);
    let running = vm.start(recorders, false).map_err(RuntimeError::Start)?;
    let result = (|| -> Result<(f64, f64), Error> {
        exitless.stage(running.ram())?;
        std::thread::sleep(SETTLE);
        let mut windows = [0.0; 2];
        let order = if exitless_first { [1, 0] } else { [0, 1] };
        for i in order {
            let t = if i == 0 { &mut trap } else { &mut exitless };
            if let Some(r) = running.wait_stop(Duration::ZERO) {
                return Err(RuntimeError::GuestStopped {
                    what: "mini guest",
                    reason: r,
                }
                .into());
            }
            {
                let p = running.pause_all();
                t.attach(&p)?.attached()?;
                windows[i] = us(p.window());
            }
            std::thread::sleep(SETTLE / 10);
            {
                let p = running.pause_all();
                t.detach(p.memory()).map_err(RuntimeError::Restore)?;
            }
        }
        Ok((windows[0], windows[1]))
    })();
    let mem = running.memory().clone();
    let report = stop(running);
    let restored = [trap.detach(&mem), exitless.detach(&mem)];
    let reason = report.reason.to_string();
    trap.finish(kernel, reason.clone());
    exitless.finish(kernel, reason);
    let (t, e) = result?;
    for r in restored {
        r.map_err(RuntimeError::Restore)?;
    }
    if report.reason != StopReason::Requested {
        return Err(RuntimeError::Measure(format!(
            "(j): the mini guest stopped on its own: {}",
            report.reason
        ))
        .into());
    }
    Ok((t, e, sites))
}
