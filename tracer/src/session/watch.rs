//! Tracing through a debugger's breakpoints instead of patched sites (a
//! QEMU's gdbstub, where no guest memory is free for exitless mode): the
//! sites are checked exactly as an attach checks them before it writes, but
//! nothing is written to the guest; the breakpoints are set and removed by
//! the caller, and each hit goes to the trap-mode recorders
//! (`record::Recorder`) as a trap at the site.

use vmm::Stopped;

use super::patch::{AttachCounts, DetachCounts};
use super::{NotReady, Tracer};
use crate::error::TracerError;

/// The sites to break at, or why the guest is not ready yet.
#[derive(Debug)]
pub enum Watch {
    /// Running addresses of the selected sites that hold the 5-byte NOP;
    /// `others` selected sites hold anything else (or are unmapped).
    Ready {
        sites: Vec<u64>,
        others: usize,
    },
    NotReady(NotReady),
}

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("breakpoints are watched by a trap-mode tracer, and this one is exitless")]
    Exitless,
    #[error(
        "the function graph hooks returns by writing guest memory; watched breakpoints write none"
    )]
    Graph,
    #[error("direct entries are written into guest text; watched breakpoints write none")]
    Direct,
    #[error(transparent)]
    Tracer(#[from] TracerError),
}

impl Tracer {
    /// The sites to break at under `paused` (every vCPU stopped), found
    /// and checked as `attach` checks the sites it patches: the kernel and
    /// its offsets, its ftrace_init finished, each site read. Writes
    /// nothing. Trap mode without the function graph only.
    pub fn watch_sites(&mut self, paused: &dyn Stopped) -> Result<Watch, WatchError> {
        if self.reach.exitless().is_some() {
            return Err(WatchError::Exitless);
        }
        if self.reach.graph_hook().is_some() {
            return Err(WatchError::Graph);
        }
        if self.direct.is_some() {
            return Err(WatchError::Direct);
        }
        match self.check(paused)? {
            Ok(c) => {
                let (sites, others) = c.surveyed.nops();
                Ok(Watch::Ready { sites, others })
            }
            Err(why) => Ok(Watch::NotReady(why)),
        }
    }

    /// The caller set a breakpoint at each of `sites` sites under `paused`
    /// (`others` selected ones were left out): the attach's counts.
    pub fn watching(&mut self, sites: usize, others: usize, paused: &dyn Stopped) {
        self.attach_counts = AttachCounts {
            patched: sites,
            skipped_other: others,
            ..AttachCounts::default()
        };
        self.attached_at(paused);
    }

    /// The caller removed `removed` breakpoints: the detach's counts.
    pub fn unwatched(&mut self, removed: usize) -> DetachCounts {
        let c = DetachCounts {
            restored: removed,
            ..DetachCounts::default()
        };
        self.detached.restored += removed;
        self.times.detach_ns = vmm::Trap::now_ns();
        c
    }
}
