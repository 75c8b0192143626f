//! Exitless mode's way past an event's `tp->funcs` test on a kernel with
//! static calls (`crate::kernel::events::enabled_branch`): each enabled
//! site's `mov R, [tp->funcs]` is made to read `tp->iterator` instead,
//! its displacement alone rewritten (one instruction of the same length,
//! so no guest context can be inside what changes). `tp->iterator` holds
//! `__traceiter_NAME`'s address, never NULL: the `test` passes, `__data`
//! reads 8 bytes of that function's code (which `__traceiter_NAME`
//! overwrites before any use, include/linux/tracepoint.h), and the static
//! call, `__traceiter_NAME` while the guest has no probe registered,
//! reaches the traced iterator: the event is recorded by the exitless
//! trampoline at its ftrace site, with its arguments, never stopping the
//! guest. The loads are journaled as the jumps are
//! (`super::journal::JournaledJump`, key 0: given back at every detach
//! whatever the guest did) and restored with them.
//!
//! A probe the guest registered meanwhile would get that `__data` if the
//! static call went to it (a single probe is the static call's target):
//! attach's guard keeps it on `__traceiter_NAME` (`super::event_guard`).

use vm_memory::GuestAddress;
use vmm::{GuestRam, Stopped};

use super::error::QemuError;
use super::guest::QemuStop;
use super::journal::{hex, JournaledJump};
use crate::kernel::events::enabled_branch::redirect_load;
use crate::kernel::kaslr::KernelOffset;
use crate::plan::events::EventPlan;

/// Bytes read at a load: the longest instruction.
const INSN_MAX: usize = 15;

/// Every planned `tp->funcs` load, checked in `stop` and re-encoded to read
/// `tp->iterator` (running addresses); none for an event any of whose
/// sites has no test found (`EventPlan::behind_static_calls` names it).
pub(super) fn plan(
    stop: &QemuStop<'_>,
    events: &EventPlan,
    offset: KernelOffset,
) -> Result<Vec<JournaledJump>, QemuError> {
    let ram = &**stop.ram();
    let whole = events
        .events
        .iter()
        .filter(|e| e.static_call && !e.tests.is_empty() && e.tests.len() >= e.sites.len());
    let mut out = Vec::new();
    for e in whole {
        for t in &e.tests {
            let va = offset.runtime(t.load);
            let gpa = events.gpa(ram, offset, e, t.load).ok_or_else(|| {
                QemuError::NotTraceable(format!("the tp->funcs load at {va:#x} is not mapped"))
            })?;
            let mut now = vec![0u8; INSN_MAX];
            read(ram, gpa, &mut now)?;
            let (from, to) = (offset.runtime(e.funcs), offset.runtime(e.iterator_cell));
            let new = redirect_load(&now, va, from, to).map_err(|why| QemuError::EventLoad {
                event: e.full_name(),
                va,
                why,
            })?;
            now.truncate(new.len());
            out.push(JournaledJump {
                module: None,
                va,
                gpa,
                nop: hex(&now),
                jump: hex(&new),
                key_gpa: 0,
            });
        }
    }
    Ok(out)
}

/// Of the journaled `jumps`: (call sites, loads), known by their bytes
/// before (a site's are the kernel's NOP).
pub(super) fn split(jumps: &[JournaledJump]) -> (usize, usize) {
    let is_nop = |j: &&JournaledJump| {
        let nop = super::journal::unhex(&j.nop).unwrap_or_default();
        crate::kernel::events::jump_sites::nop_at(&nop, j.va).is_ok()
    };
    let sites = jumps.iter().filter(is_nop).count();
    (sites, jumps.len() - sites)
}

fn read(ram: &dyn GuestRam, gpa: u64, b: &mut [u8]) -> Result<(), QemuError> {
    ram.read_slice(b, GuestAddress(gpa))
        .map_err(|e| QemuError::NotTraceable(e.to_string()))
}
