//! vmtrace's region in a guest whose VMM gives vmtrace no memory of its own
//! (a running QEMU): placed in guest pages the guest never uses, and taken
//! out again at the end, so that the guest is left as it was found.

use std::sync::{Arc, Mutex};

use vmm::Stopped;

use super::exitless::backing::RegionPages;
use super::exitless::state::ExitlessError;
use super::{kernel_space, Tracer};
use crate::error::TracerError;
use crate::plan::exitless::layout::{CODE_LEN, CODE_VA};
use crate::session::patch::PatchError;

/// Why the region cannot be taken out at this stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Busy {
    /// vCPU `cpu` is running vmtrace's code (at `rip`).
    InCode { cpu: usize, rip: u64 },
    /// Function graph: `frames` hooked calls have not returned: they
    /// return into vmtrace's code (a task asleep in a traced function).
    FramesLive { frames: usize },
}

impl std::fmt::Display for Busy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Busy::InCode { cpu, rip } => write!(f, "vCPU {cpu} stayed in it (at {rip:#x})"),
            Busy::FramesLive { frames } => write!(
                f,
                "{frames} hooked calls had not returned, and return through it"
            ),
        }
    }
}

impl Tracer {
    /// Put the exitless region in `pages` instead of vmtrace's own slot.
    /// Before the first attach; nothing in trap mode.
    pub fn back_region(&mut self, pages: Arc<Mutex<RegionPages>>) {
        if let Some(ex) = self.reach.exitless_mut() {
            ex.back_region(pages);
        }
    }

    /// Take the region out of the guest after the last detach and drain:
    /// its page-table entries cleared, its pages given back what they held.
    /// Refused (nothing written) while a stopped vCPU runs vmtrace's code,
    /// or (function graph) a hooked call has yet to return through it:
    /// resume, let them leave, and stop again. A context interrupted inside that code is
    /// not seen here: the caller lets the guest run between the detach and
    /// this (an interrupt handler returns long before; on a kernel that
    /// preempts there, a task may not, which is why vmtrace's own VMM
    /// never takes its region out).
    pub fn remove_region(
        &mut self,
        stopped: &dyn Stopped,
    ) -> Result<Result<usize, Busy>, TracerError> {
        if let Some(busy) = self.region_busy(stopped)? {
            return Ok(Err(busy));
        }
        let Some(ex) = self.reach.exitless_mut() else {
            return Ok(Ok(0));
        };
        let mut space =
            kernel_space(stopped.vcpu_spaces(), &[CODE_VA]).ok_or(PatchError::NoPaging)?;
        let cleared = ex
            .remove(&mut space)
            .map_err(|e: ExitlessError| TracerError::from(e))?;
        Ok(Ok(cleared))
    }

    /// Why the region cannot be taken out at this stop (`remove_region`),
    /// if it cannot: the caller drains the rings for the last time when it
    /// can, before their pages are given back.
    pub fn region_busy(&self, stopped: &dyn Stopped) -> Result<Option<Busy>, TracerError> {
        let Some(ex) = self.reach.exitless() else {
            return Ok(None);
        };
        for cpu in 0..stopped.cpus() {
            if let Some(s) = stopped.snapshot(cpu) {
                let rip = s.regs.rip;
                if (CODE_VA..CODE_VA + CODE_LEN).contains(&rip) {
                    return Ok(Some(Busy::InCode { cpu, rip }));
                }
            }
        }
        let frames = ex.live_frames()?;
        Ok((frames > 0).then_some(Busy::FramesLive { frames }))
    }
}
