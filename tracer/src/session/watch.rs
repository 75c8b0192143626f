//! Tracing through a debugger's breakpoints instead of patched sites (a
//! QEMU's gdbstub, where no guest memory is free for exitless mode): the
//! sites are checked exactly as an attach checks them before it writes, but
//! nothing is written to the guest; the breakpoints are set and removed by
//! the caller, and each hit goes to the trap-mode recorders
//! (`record::Recorder`) as a trap at the site.
//!
//! Direct entries break at the function's entry (the caller steps the real
//! first instruction); the function graph leaves each entry's frame to the
//! caller (`Recorder::frames_by_breakpoints`), whose breakpoint at the
//! return address catches the return: no return address is rewritten.

use vmm::Stopped;

use super::patch::{AttachCounts, DetachCounts};
use super::record::Recorder;
use super::{NotReady, Recording, Tracer};
use crate::error::TracerError;
use crate::plan::Plan;

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
    #[error(transparent)]
    Tracer(#[from] TracerError),
}

/// What the breakpoints of a watched tracer are (`Tracer::watched`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatchKind {
    /// At functions' entries (direct): the real first instruction is
    /// stepped, not skipped.
    pub direct: bool,
    /// Function graph: returns caught at their return addresses.
    pub returns: bool,
}

impl Tracer {
    /// A trap-mode tracer whose recorders write nothing to the guest
    /// (breakpoints of a debugger's: `watch_sites`): with `plan.graph`,
    /// each entry's frame is left to the caller (`Recorder::take_entered`).
    pub fn watched(plan: Plan, ncpus: usize, rec: Recording) -> (Tracer, Vec<Recorder>) {
        Tracer::trap_with(plan, ncpus, rec, |plan, recs| {
            if plan.graph {
                for r in recs {
                    r.frames_by_breakpoints();
                }
            }
            None
        })
    }

    /// What this tracer's breakpoints are.
    pub fn watch_kind(&self) -> WatchKind {
        WatchKind {
            direct: self.direct.is_some(),
            returns: self.plan.graph,
        }
    }

    /// The sites to break at under `paused` (every vCPU stopped), found
    /// and checked as `attach` checks the sites it patches: the kernel and
    /// its offsets, its ftrace_init finished, each site read; direct
    /// entries with every rule an attach applies (conservatively: the
    /// displacement rules too, though nothing is displaced). Writes
    /// nothing. Trap mode through `watched` only.
    pub fn watch_sites(&mut self, paused: &dyn Stopped) -> Result<Watch, WatchError> {
        if self.reach.exitless().is_some() {
            return Err(WatchError::Exitless);
        }
        if self.reach.graph_hook().is_some() {
            return Err(WatchError::Graph);
        }
        match self.check(paused)? {
            Ok(c) => match c.direct {
                Some(d) => {
                    let sites: Vec<u64> = d.ready.iter().map(|r| r.addr).collect();
                    let others = self.plan.index.addrs.len() - sites.len();
                    Ok(Watch::Ready { sites, others })
                }
                None => {
                    let (sites, others) = c.surveyed.nops();
                    Ok(Watch::Ready { sites, others })
                }
            },
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
