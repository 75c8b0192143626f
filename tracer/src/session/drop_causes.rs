//! Why the session's dropped events were dropped (`DropCauses`): the
//! rings' drop counters per vCPU (vmtrace's code in the guest found no free
//! slot), the drain's share of them (held at a reserved record), the
//! rings' size asked and given, and the recorders' own causes.

use std::sync::atomic::Ordering;

use super::Tracer;
use crate::trace::model::DropCauses;

impl Tracer {
    /// The causes as known now; `ring_drops`: the calls' ring drop
    /// counters, per CPU and site, as read once for the whole trace.
    pub(super) fn drop_causes(&self, ring_drops: &[Vec<u64>]) -> DropCauses {
        let mut ring_full: Vec<u64> = ring_drops.iter().map(|s| s.iter().sum()).collect();
        for (cpu, per_site) in self.ring_ret_drops().iter().enumerate() {
            if cpu >= ring_full.len() {
                ring_full.resize(cpu + 1, 0);
            }
            ring_full[cpu] += per_site.iter().sum::<u64>();
        }
        if ring_full.iter().all(|&n| n == 0) {
            ring_full.clear();
        }
        let ex = self.reach.exitless();
        let (ring_asked, ring_given) = ex.map_or((0, 0), |ex| ex.ring_records());
        let c = &self.counters;
        DropCauses {
            ring_full,
            held: ex.map_or(0, |ex| ex.held_drops()),
            ring_asked,
            ring_given,
            over_budget: c.over_budget.load(Ordering::Relaxed),
            overwritten: c.overwritten.load(Ordering::Relaxed),
        }
    }
}
