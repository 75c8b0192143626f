//! The breakpoint at `__static_call_update(key, tramp, func)`
//! (kernel/static_call_inline.c) that keeps each traced event's static
//! call on its `__traceiter_NAME`: registering the first probe of an event
//! points its static call at that probe (kernel/tracepoint.c
//! `tracepoint_update_call`, before the key is enabled), and the probe
//! called straight from the call site would bypass the iterator vmtrace
//! traces (trap mode: the event unrecorded) and get exitless mode's
//! `__data` (`super::funcs_loads`). Kept on the iterator, which walks
//! `tp->funcs` and calls each probe with its own data, as the kernel does
//! for two probes or more, every event is recorded while the guest's
//! tracer gets it too. Trap mode's (`super::breakpoints`) and exitless
//! mode's (`super::event_guard`) alike.

use std::collections::HashMap;

use super::gdb::GdbError;
use super::step::BreakOps;
use crate::kernel::kaslr::KernelOffset;
use crate::plan::events::EventPlan;

/// `__static_call_update`'s third argument (`func`): RDX, the SysV ABI's.
const FUNC_REG: &str = "rdx";

/// The breakpoint at `__static_call_update` that keeps each traced
/// event's static call on its `__traceiter_NAME` (running addresses),
/// trap mode's and exitless mode's alike.
#[derive(Debug)]
pub struct StaticGuard {
    /// `__static_call_update`.
    pub at: u64,
    /// Each traced event's static call trampoline, with its iterator.
    pub(super) iterators: HashMap<u64, u64>,
}

impl StaticGuard {
    /// The guard of `events`' static calls: None when none is called
    /// through one. Err: some is, and the kernel names no
    /// `__static_call_update` to keep it with.
    pub fn plan(events: &EventPlan, offset: KernelOffset) -> Result<Option<StaticGuard>, String> {
        let iterators: HashMap<u64, u64> = events
            .events
            .iter()
            .filter_map(|e| Some((offset.runtime(e.tramp?), offset.runtime(e.iterator))))
            .collect();
        match (iterators.is_empty(), events.static_call_guard) {
            (true, _) => Ok(None),
            (false, Some(at)) => Ok(Some(StaticGuard {
                at: offset.runtime(at),
                iterators,
            })),
            (false, None) => Err("the kernel names no __static_call_update".into()),
        }
    }

    /// A hit at `__static_call_update(key, tramp, func)` on `cpu`: a
    /// traced event's static call pointed elsewhere than its iterator gets
    /// `func` (RDX) made the iterator, what it holds already. Returns
    /// whether it did.
    pub fn keep(
        &self,
        cpu: usize,
        regs: &kvm_bindings::kvm_regs,
        ops: &dyn BreakOps,
    ) -> Result<bool, GdbError> {
        // (tramp, func): the second and third arguments.
        match self.iterators.get(&regs.rsi) {
            Some(&it) if regs.rdx != it => ops.set_reg(cpu, FUNC_REG, it).map(|()| true),
            _ => Ok(false),
        }
    }
}
