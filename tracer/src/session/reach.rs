//! What a tracer holds for its mode and its kind of entries alone: the
//! states its `Tracer` moves through, one enum per choice.

use std::sync::Arc;

use super::direct::DirectSites;
use super::exitless::state::Exitless;
use super::record::GraphHook;

/// How traced calls reach vmtrace, with what only that mode has.
pub(super) enum Reach {
    /// Each call exits to vmtrace.
    Trap {
        /// The function graph's return hooks (None without the graph).
        graph: Option<Arc<GraphHook>>,
        /// With the graph: the return trap is in guest memory (it stays
        /// there until the guest ends, so hooked returns work after a
        /// detach).
        return_trap_in: bool,
    },
    /// Each call runs vmtrace's code in the guest: its code, rings and
    /// drainer.
    Exitless(Box<Exitless>),
}

impl Reach {
    pub(super) fn exitless(&self) -> Option<&Exitless> {
        match self {
            Reach::Exitless(ex) => Some(ex),
            Reach::Trap { .. } => None,
        }
    }

    pub(super) fn exitless_mut(&mut self) -> Option<&mut Exitless> {
        match self {
            Reach::Exitless(ex) => Some(ex),
            Reach::Trap { .. } => None,
        }
    }

    /// Trap mode's return hooks (function graph).
    pub(super) fn graph_hook(&self) -> Option<&Arc<GraphHook>> {
        match self {
            Reach::Trap { graph, .. } => graph.as_ref(),
            Reach::Exitless(_) => None,
        }
    }

    /// "trap" or "exitless" (`crate::plan::Mode::name`).
    pub(super) fn name(&self) -> &'static str {
        match self {
            Reach::Trap { .. } => "trap",
            Reach::Exitless(_) => "exitless",
        }
    }
}

/// Direct entries' sites and stubs, and what their attaches found.
pub(super) struct DirectState {
    pub(super) sites: DirectSites,
    /// Attaches so far that found a guest context inside a direct site.
    pub(super) busy_waits: u32,
    /// The last attach: sites whose text had changed, sites left out
    /// because a context stayed inside them, tasks' stacks checked.
    pub(super) counts: (usize, usize, usize),
}

impl DirectState {
    pub(super) fn new(sites: DirectSites) -> DirectState {
        DirectState {
            sites,
            busy_waits: 0,
            counts: (0, 0, 0),
        }
    }
}

/// When the attach and the detach happened, and how the attach's stop went.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Times {
    pub(super) attach_ns: u64,
    pub(super) detach_ns: u64,
    pub(super) attach_window: std::time::Duration,
    pub(super) attach_latency: std::time::Duration,
    /// The guest TSC's rate, read at attach (0 until then).
    pub(super) tsc_khz: u64,
}
