//! Exitless mode's guard for the guest enabling a traced event itself
//! (perf, ftrace, bpftrace): two breakpoints, each a stop of the guest per
//! change of its jump labels or static calls (rare: an event enabled or
//! disabled), none per event.
//!
//! - At `arch_jump_label_transform_queue(entry, type)`, where the kernel
//!   checks each site of a key it enables for its NOP before patching it
//!   (arch/x86/kernel/jump_label.c `__jump_label_patch`, which BUGs on
//!   anything else): for a site of vmtrace's, whose jump is the kernel's
//!   own, the call returns at once, the site untouched (never its NOP in
//!   between, when the event would go unrecorded), and the site is the
//!   guest's from then on (its key is counted: the detach leaves it), as
//!   trap mode does (`super::guarded_sites`).
//! - At `__static_call_update(key, tramp, func)` (kernel/static_call_inline.c),
//!   where registering the first probe points the event's static call at
//!   that probe (kernel/tracepoint.c `tracepoint_update_call`, before the
//!   key is enabled): for a traced event vmtrace makes `func`
//!   `__traceiter_NAME` again, the function the static call already
//!   holds, so the update changes nothing. Exitless mode's redirected
//!   `tp->funcs` loads (`super::funcs_loads`) pass `__traceiter_NAME` a
//!   `__data` that it overwrites: a probe called straight from the static
//!   call would get it and fault. The iterator instead walks `tp->funcs`
//!   and calls each probe with its own data, as the kernel does for two
//!   probes or more; and it is what vmtrace traces, so the event is still
//!   recorded, every one, while the guest's tracer gets it too.
//!
//! The kernel's state stays its own: its static call holds the iterator,
//! which is correct for any number of probes, and its later updates (the
//! last probe removed: the iterator again) find what they expect.

use std::sync::Arc;

use vmm::pause::VcpuSnapshot;
use vmm::GuestRam;

use super::breakpoints::{site_err, HitError, Served};
use super::guarded_sites::{give_back_all, serve_queue, Queued, Sites};
use super::guest::{Hit, QemuGuest, QemuStop};
use super::journal::{unhex, JournaledJump};
use super::static_guard::StaticGuard;
use super::step::{BreakOps, Stepped, SIGTRAP};
use super::trap::StopReply;
use crate::kernel::kaslr::KernelOffset;
use crate::plan::events::EventPlan;

/// The guard's breakpoints and what they watch (running addresses).
#[derive(Debug)]
pub struct EventGuard {
    /// `arch_jump_label_transform_queue`, and vmtrace's sites still its own
    /// (by their code's address).
    jump_queue: Option<u64>,
    guarded: Sites,
    /// `__static_call_update`, and each traced event's static call
    /// trampoline with its `__traceiter_NAME`.
    statics: Option<StaticGuard>,
    offset: KernelOffset,
    /// Sites given to the guest (it enabled their event), and taken back
    /// (it disabled the event again).
    pub taken_over: usize,
    pub taken_back: usize,
    /// Static call updates of traced events kept on their iterator.
    pub kept: usize,
}

impl EventGuard {
    /// Forget vmtrace's sites in `text` (a module gone: they were given
    /// back at its unload).
    pub fn forget(&mut self, text: &std::ops::Range<u64>) {
        self.guarded.forget(text);
    }

    /// What the module follower did since the guard's last turn
    /// (`super::event_reload::GuardNews`): texts gone forgotten, event
    /// sites written at a module's load guarded, their static calls kept.
    pub fn learn(&mut self, news: super::event_reload::GuardNews) {
        news.gone.iter().for_each(|t| self.guarded.forget(t));
        for j in news.sites.into_iter().filter(is_site) {
            self.guarded.ours.insert(j.va, j);
        }
        if let Some(g) = self.statics.as_mut() {
            g.iterators.extend(news.statics);
        }
    }

    /// The guard of `events`' `jumps` (vmtrace's call sites and loads, as
    /// journaled): None when there is nothing to guard. Err: the kernel
    /// calls some event through a static call that vmtrace cannot keep on
    /// its iterator (no `__static_call_update` named): the guest's probe
    /// would get a wrong `__data`.
    pub fn plan(
        events: &EventPlan,
        offset: KernelOffset,
        jumps: &[JournaledJump],
    ) -> Result<Option<EventGuard>, String> {
        let statics = StaticGuard::plan(events, offset)?;
        let jump_queue = events.guard.map(|g| offset.runtime(g));
        let guarded = Sites::new(jumps.iter().filter(|j| is_site(j)).cloned());
        if guarded.ours.is_empty() && statics.is_none() {
            return Ok(None);
        }
        if jump_queue.is_none() && !guarded.ours.is_empty() {
            return Err("the kernel names no arch_jump_label_transform_queue".into());
        }
        Ok(Some(EventGuard {
            jump_queue,
            guarded,
            statics,
            offset,
            taken_over: 0,
            taken_back: 0,
            kept: 0,
        }))
    }

    /// Its breakpoints' addresses (to journal before they are set).
    pub fn breakpoints(&self) -> Vec<u64> {
        self.jump_queue
            .into_iter()
            .chain(self.statics.as_ref().map(|g| g.at))
            .collect()
    }

    /// Its breakpoints set in `stop` (journaled already); on an error none
    /// is left set.
    pub fn set(&self, stop: &QemuStop<'_>) -> Result<(), HitError> {
        let mut set = Vec::new();
        for a in self.breakpoints() {
            if let Err(e) = stop.set_breakpoint(a) {
                for &b in &set {
                    let _ = stop.clear_breakpoint(b);
                }
                return Err(e.into());
            }
            set.push(a);
        }
        Ok(())
    }

    /// In the detach's stop: a hit of the guard's that came just before it
    /// (its stop reply was the stop's: `last`) handled, so the vCPU runs
    /// on as served (the breakpoint gone, it runs its instruction, or
    /// returns from the function as its registers were set); then
    /// the breakpoints out, and each site still vmtrace's given its NOP,
    /// whatever its key's count: one the guest is enabling (its count -1
    /// meanwhile, kernel/jump_label.c `static_key_enable_cpuslocked`) may
    /// have sites it has not queued yet, which it will check for their
    /// NOP. Returns those sites.
    pub fn detach(
        &mut self,
        guest: &QemuGuest,
        stop: &QemuStop<'_>,
        last: Option<StopReply>,
    ) -> Result<usize, HitError> {
        let hit = last
            .filter(|r| r.signal == SIGTRAP)
            .and_then(|r| guest.cpu_of(r.thread?));
        let ram = Arc::clone(vmm::Stopped::ram(stop));
        if let Some(cpu) = hit {
            if let Some(snap) = vmm::Stopped::snapshot(stop, cpu) {
                if self.owns(snap.regs.rip) {
                    self.handle(cpu, &snap, &*ram, stop)?;
                }
            }
        }
        for a in self.breakpoints() {
            stop.clear_breakpoint(a)?;
        }
        let given = give_back_all(&mut self.guarded, &*ram).map_err(site_err)?;
        Ok(given)
    }

    /// Whether the breakpoint at `rip` is the guard's.
    pub fn owns(&self, rip: u64) -> bool {
        self.jump_queue == Some(rip) || self.statics.as_ref().is_some_and(|g| g.at == rip)
    }

    /// The guard's hit on `cpu` (registers `snap`), in the hit's stop.
    /// Returns whether the vCPU was made to return from the function
    /// (`super::guarded_sites::Queued::Returned`): its registers then say
    /// where it goes on, and it is not stepped.
    pub fn handle(
        &mut self,
        cpu: usize,
        snap: &VcpuSnapshot,
        ram: &dyn GuestRam,
        ops: &dyn BreakOps,
    ) -> Result<bool, HitError> {
        let regs = &snap.regs;
        if self.jump_queue == Some(regs.rip) {
            let q = serve_queue(cpu, snap, self.offset, &mut self.guarded, ram, ops)?;
            self.taken_over += usize::from(matches!(q, Queued::Returned | Queued::Left));
            self.taken_back += usize::from(q == Queued::TakenBack);
            return Ok(matches!(q, Queued::Returned | Queued::TakenBack));
        }
        if let Some(g) = self.statics.as_ref().filter(|g| g.at == regs.rip) {
            self.kept += usize::from(g.keep(cpu, regs, ops)?);
        }
        Ok(false)
    }

    /// The hit `hit` (a SIGTRAP on `cpu` at `rip`, the guard's) handled, the
    /// vCPU stepped over the function's first instruction (unless made to
    /// return from it), the VM resumed.
    pub fn serve_hit(&mut self, hit: Hit<'_>, cpu: usize) -> Result<Served, HitError> {
        let snap = hit.snapshot(cpu)?;
        let ram = Arc::clone(hit.ram());
        if self.handle(cpu, &snap, &*ram, &hit)? {
            hit.resume(None)?;
            return Ok(Served::Hit);
        }
        match hit.step_over(cpu, snap.regs.rip)? {
            Stepped::Moved | Stepped::Stayed => hit.resume(None)?,
            Stepped::Stopped { signal, .. } => {
                hit.hold();
                return Ok(Served::NotOurs { signal });
            }
        }
        Ok(Served::Hit)
    }
}

/// A journaled jump that is an event's call site (its bytes before are
/// the kernel's NOP), not a redirected load.
fn is_site(j: &JournaledJump) -> bool {
    let nop = unhex(&j.nop).unwrap_or_default();
    crate::kernel::events::jump_sites::nop_at(&nop, j.va).is_ok()
}

#[cfg(test)]
mod tests {
    use crate::qemu::step::RecordedOps;

    use vm_memory::{GuestAddress, GuestMemoryMmap};

    use super::*;

    const UPDATE: u64 = 0xffff_ffff_8120_0000;
    const TRAMP: u64 = 0xffff_ffff_8100_1000;
    const ITER: u64 = 0xffff_ffff_8110_0040;
    const PROBE: u64 = 0xffff_ffff_8130_0080;

    /// A traced event's static call pointed at a probe is kept on its
    /// iterator (RDX made the iterator); an update of another static call,
    /// or one to the iterator already, is left as it is.
    #[test]
    fn a_traced_events_static_call_stays_on_its_iterator() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let mut g = EventGuard {
            jump_queue: None,
            guarded: Sites::default(),
            statics: Some(StaticGuard {
                at: UPDATE,
                iterators: [(TRAMP, ITER)].into(),
            }),
            offset: KernelOffset::NONE,
            taken_over: 0,
            taken_back: 0,
            kept: 0,
        };
        let ops = RecordedOps::default();
        let regs = |rsi, rdx| VcpuSnapshot {
            regs: kvm_bindings::kvm_regs {
                rip: UPDATE,
                rsi,
                rdx,
                ..Default::default()
            },
            sregs: Default::default(),
            clock: None,
            syscall_entry: None,
        };
        assert!(g.owns(UPDATE) && !g.owns(UPDATE + 4));
        for (tramp, func) in [(TRAMP, PROBE), (TRAMP, ITER), (TRAMP + 8, PROBE)] {
            // Stepped over its first instruction, never made to return.
            assert!(!g.handle(0, &regs(tramp, func), &mem, &ops).unwrap());
        }
        assert_eq!(*ops.0.borrow(), [("rdx".to_string(), ITER)]);
        assert_eq!(g.kept, 1);
        assert_eq!(g.breakpoints(), [UPDATE]);
    }
}
