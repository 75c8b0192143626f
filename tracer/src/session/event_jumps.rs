//! `-e` on the own VMM with a kernel that has jump labels (the 6.12
//! guest, distribution kernels): each traced event's `__jump_table` sites
//! made the jumps the kernel would write, as `vmtrace attach` makes them
//! (`crate::kernel::events::jump_sites`), under the attach's stop, after
//! the ftrace sites, with the `tp->funcs` tests behind them passed as on a
//! kernel without jump labels (`super::event_keys`: trap mode's trap over
//! each test, exitless mode's load made to read `tp->iterator`). The
//! key's count is left alone. Every byte written is a `PatchedSite`,
//! given back (each read back) with the ftrace sites at the end of the
//! run, whatever ended it.
//!
//! The guest enabling a traced event itself would find vmtrace's jump
//! where its jump_label code expects the NOP, and BUG. The own VMM owns
//! the guest from its first instruction but has no breakpoint: it puts
//! its trap (`out`, `super::patch::TRAP`) over the ftrace site of
//! `arch_jump_label_transform_queue(entry, type)`, where the kernel checks
//! and patches each site of a key it updates, and serves each call there
//! as `attach` does (`crate::kernel::events::jump_guard`): for one of
//! vmtrace's sites the vCPU returns `true` at once (RIP the return
//! address, RSP past it, RAX 1), the site keeping its jump, the guest's
//! from then on (left holding it at the detach) until the guest disables
//! the event again. Every other call (the kernel flipping its other keys
//! during the boot) is resumed past the site: one exit each, counted
//! apart from the traced calls' (`guard_exits`).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use vmm::gva::{AddressSpace, PhysSpan};
use vmm::{GuestRam, Trap};

use super::patch::{PatchError, PatchedSite};
use crate::kernel::events::jump_guard::{GuardCounts, GuardedSites, Queued};
use crate::kernel::kaslr::KernelOffset;
use crate::kernel::sites::{is_kernel_nop5, SITE_LEN};
use crate::plan::events::EventPlan;
use crate::plan::site_index::OUT_LEN;

/// RAX and RSP by their number in `Trap::gprs`.
const RAX: usize = 0;
const RSP: usize = 4;

/// One of vmtrace's jumps, as the guard reads it.
#[derive(Clone, Debug)]
pub struct GuardedJump {
    span: PhysSpan,
    jump: Vec<u8>,
}

impl GuardedJump {
    fn held(&self, mem: &dyn GuestRam) -> Result<bool, vmm::gva::GvaError> {
        let mut now = vec![0u8; self.span.len()];
        self.span.read(mem, &mut now)?;
        Ok(now == self.jump)
    }
}

/// The guard at `arch_jump_label_transform_queue`'s ftrace site, shared by
/// every vCPU's recorder and the tracer.
#[derive(Debug)]
pub struct JumpGuard {
    /// The site (link-time).
    site: u64,
    sites: Mutex<GuardedSites<GuardedJump>>,
    exits: AtomicU64,
    given: AtomicUsize,
    taken_back: AtomicUsize,
}

impl JumpGuard {
    /// The guard of `plan`'s events, when they have jump labels to write.
    pub fn of(plan: &EventPlan) -> Option<Arc<JumpGuard>> {
        let site = plan.guard_site.filter(|_| !plan.counted_keys)?;
        plan.whole().any(|e| !e.sites.is_empty()).then(|| {
            Arc::new(JumpGuard {
                site,
                sites: Mutex::new(GuardedSites::default()),
                exits: AtomicU64::new(0),
                given: AtomicUsize::new(0),
                taken_back: AtomicUsize::new(0),
            })
        })
    }

    fn sites(&self) -> MutexGuard<'_, GuardedSites<GuardedJump>> {
        // A panic elsewhere while holding it left whole values.
        self.sites.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The site's link-time address.
    pub fn site(&self) -> u64 {
        self.site
    }

    /// Whether the site at running address `addr` is the guard's (a traced
    /// function's site there traps in exitless mode too).
    pub fn at(&self, addr: u64, slide: i64) -> bool {
        addr.wrapping_sub(slide as u64) == self.site
    }

    /// A trap at the guard's site, the kernel `slide` bytes from its link
    /// addresses: None when it is not there. Else whether the vCPU was made
    /// to return `true` (the call is not run: a traced function's call
    /// there is not recorded); if not, the call runs, resumed past the
    /// site when `resume` (the site is no traced function's).
    pub fn serve(&self, trap: &mut Trap<'_>, slide: i64, resume: bool) -> Option<bool> {
        let link = trap.rip.wrapping_sub(slide as u64);
        if link != self.site && link.wrapping_sub(OUT_LEN) != self.site {
            return None;
        }
        self.exits.fetch_add(1, Ordering::Relaxed);
        let returned = self.queue(trap);
        if !returned && resume {
            trap.set_rip(self.site.wrapping_add_signed(slide) + SITE_LEN as u64);
        }
        Some(returned)
    }

    /// `arch_jump_label_transform_queue(entry, type)` at its first
    /// instruction (its ftrace site: nothing pushed yet, the return
    /// address at [RSP]): the entry read (`struct jump_entry { s32 code;
    /// ... }`, the code relative to the entry; the kernel sorted its table
    /// at boot, so an entry is known by the code it names) and the call
    /// served. Anything unreadable leaves the call to run.
    fn queue(&self, trap: &mut Trap<'_>) -> bool {
        let (entry, kind, rsp) = (trap.args[0], trap.args[1], trap.rsp);
        let mut rel = [0u8; 4];
        if trap.space().read(entry, &mut rel).is_err() {
            return false;
        }
        let Ok(ret) = trap.space().read_u64(rsp) else {
            return false;
        };
        let code = entry.wrapping_add_signed(i64::from(i32::from_le_bytes(rel)));
        let mem = trap.space().memory();
        let q = self.sites().queue(code, kind, |j| j.held(mem));
        let q = q.unwrap_or(Queued::NotOurs);
        self.given
            .fetch_add(usize::from(q.taken_over()), Ordering::Relaxed);
        self.taken_back
            .fetch_add(usize::from(q == Queued::TakenBack), Ordering::Relaxed);
        if q.returns() {
            trap.set_gpr(RAX, 1);
            trap.set_gpr(RSP, rsp.wrapping_add(8));
            trap.set_rip(ret);
        }
        q.returns()
    }

    /// The running addresses of the sites the guest holds now (it enabled
    /// their events itself): the detach leaves them its jumps. The guard
    /// forgets every site: a vCPU that trapped before the detach's stop
    /// and is served after finds none of vmtrace's.
    fn release(&self) -> Vec<u64> {
        let mut sites = self.sites();
        sites.ours.clear();
        sites.given.drain().map(|(va, _)| va).collect()
    }

    /// Exits at the guard's trap so far.
    pub fn exits(&self) -> u64 {
        self.exits.load(Ordering::Relaxed)
    }
}

/// A site to write: its running address, its place, the bytes there and
/// those to write (a shorter span's in the first of each, the rest 0).
pub(super) type SiteWrite = (u64, PhysSpan, [u8; SITE_LEN], [u8; SITE_LEN]);

/// The event call sites of `plan` to write (the whole events' only:
/// `EventPlan::whole`), each checked to hold the image's NOP: (running
/// address, place, bytes there, bytes to write), a 2-byte site as a
/// 2-byte span (its bytes in the first two of each array, the rest 0:
/// `super::patch::read_span`).
pub(super) fn jump_sites(
    space: &mut AddressSpace<'_>,
    off: KernelOffset,
    plan: &EventPlan,
) -> Result<Vec<SiteWrite>, PatchError> {
    let mut out = Vec::new();
    for e in plan.whole() {
        for s in &e.sites {
            let addr = off.runtime(s.code);
            let span = space
                .span(addr, s.nop.len())
                .map_err(|err| PatchError::Memory {
                    addr,
                    gpa: 0,
                    why: err.to_string(),
                })?;
            let mut now = vec![0u8; s.nop.len()];
            span.read(space.memory(), &mut now)
                .map_err(|err| PatchError::Memory {
                    addr,
                    gpa: span.start(),
                    why: err.to_string(),
                })?;
            if now != s.nop {
                return Err(PatchError::EventSite {
                    event: e.full_name(),
                    addr,
                    found: super::patch::hex(&now),
                });
            }
            let (mut original, mut jump) = ([0u8; SITE_LEN], [0u8; SITE_LEN]);
            original[..s.nop.len()].copy_from_slice(&s.nop);
            jump[..s.jump.len()].copy_from_slice(&s.jump);
            out.push((addr, span, original, jump));
        }
    }
    Ok(out)
}

/// The guard's own site (running address), if it is to be written: not
/// when a traced function's site is there already (`patched`), which
/// traps in both modes (`super::writes`). Checked to be the kernel's NOP.
pub(super) fn guard_site(
    space: &mut AddressSpace<'_>,
    off: KernelOffset,
    guard: &JumpGuard,
    patched: &[PatchedSite],
) -> Result<Option<(u64, PhysSpan, [u8; SITE_LEN])>, PatchError> {
    let addr = off.runtime(guard.site);
    if patched.iter().any(|p| p.addr == addr) {
        return Ok(None);
    }
    let memory = |gpa: u64, why: String| PatchError::Memory { addr, gpa, why };
    let span = space
        .span(addr, SITE_LEN)
        .map_err(|e| memory(0, e.to_string()))?;
    let mut original = [0u8; SITE_LEN];
    span.read(space.memory(), &mut original)
        .map_err(|e| memory(span.start(), e.to_string()))?;
    if !is_kernel_nop5(&original) {
        let why = "the ftrace site of arch_jump_label_transform_queue, where vmtrace guards \
                   the events' jump labels, is not the kernel's NOP";
        return Err(memory(span.start(), why.into()));
    }
    Ok(Some((addr, span, original)))
}

impl JumpGuard {
    /// The jumps written (`sites`: running address, place, jump), the
    /// guard's from now on.
    pub(super) fn arm(&self, sites: impl IntoIterator<Item = (u64, PhysSpan, Vec<u8>)>) {
        let jumps = sites
            .into_iter()
            .map(|(va, span, jump)| (va, GuardedJump { span, jump }));
        *self.sites() = GuardedSites::new(jumps);
    }
}

impl super::Tracer {
    /// At a detach, before the sites are given back: the event call sites
    /// the guest holds (it enabled their events itself: its key counts
    /// them) taken out of the patched sites, to keep its jumps; what the
    /// guard did, for the detach line (the session's totals).
    pub(super) fn release_jumps(&mut self) -> GuardCounts {
        let Some(g) = self.jump_guard.clone() else {
            return GuardCounts::default();
        };
        let kept = g.release();
        self.patched.retain(|p| !kept.contains(&p.addr));
        let d = &mut self.detached.guard;
        (d.exits, d.kept) = (g.exits(), d.kept + kept.len());
        d.given = g.given.load(Ordering::Relaxed);
        d.taken_back = g.taken_back.load(Ordering::Relaxed);
        GuardCounts {
            kept: kept.len(),
            ..*d
        }
    }

    /// Exits at the jump label guard's trap (`event_jumps`).
    pub fn guard_exits(&self) -> u64 {
        self.jump_guard.as_ref().map_or(0, |g| g.exits())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_bindings::{kvm_regs, kvm_sregs};
    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
    use vmm::gva::PagingMode;

    /// The kernel map (physical = virtual - this) with the boot page
    /// tables, a site, its jump, its `__jump_table` entry, the stack.
    const PHYS: u64 = 0xffff_ffff_8000_0000;
    const SITE: u64 = 0xffff_ffff_8100_0000;
    const GUARD: u64 = 0xffff_ffff_8100_4000;
    const ENTRY: u64 = 0xffff_ffff_8130_0000;
    const STACK: u64 = 0xffff_ffff_8140_0ff8;
    const RET: u64 = 0xffff_ffff_8100_2345;
    const JUMP: [u8; 2] = [0xeb, 0x10];
    const JUMP_LABEL_JMP: u64 = 1;
    const JUMP_LABEL_NOP: u64 = 0;
    const CR0_PG: u64 = 1 << 31;
    const CR4_PAE: u64 = 1 << 5;

    fn guest() -> GuestMemoryMmap {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 32 << 20)]).unwrap();
        vmm::boot::regs::setup_page_tables(&mem).unwrap();
        mem.write_slice(&JUMP, GuestAddress(SITE - PHYS)).unwrap();
        let rel = i32::try_from(SITE as i64 - ENTRY as i64).unwrap();
        mem.write_obj(rel, GuestAddress(ENTRY - PHYS)).unwrap();
        mem.write_obj(RET, GuestAddress(STACK - PHYS)).unwrap();
        mem
    }

    fn guard(mem: &GuestMemoryMmap) -> JumpGuard {
        let g = JumpGuard {
            site: GUARD,
            sites: Mutex::new(GuardedSites::default()),
            exits: AtomicU64::new(0),
            given: AtomicUsize::new(0),
            taken_back: AtomicUsize::new(0),
        };
        let mut space = AddressSpace::new(mem, vmm::layout::PML4_START, PagingMode::Level4);
        let span = space.span(SITE, 2).unwrap();
        g.arm([(SITE, span, JUMP.to_vec())]);
        g
    }

    /// A trap at the guard's site (past its `out`, as the emulating KVM
    /// leaves it) for `entry` and `kind`: what `serve` did, and the
    /// registers it set.
    fn serve(g: &JumpGuard, mem: &GuestMemoryMmap, rip: u64, kind: u64) -> TrapOut {
        let regs = kvm_regs {
            rip,
            rdi: ENTRY,
            rsi: kind,
            rsp: STACK,
            ..Default::default()
        };
        let sregs = kvm_sregs {
            cr0: CR0_PG,
            cr3: vmm::layout::PML4_START,
            cr4: CR4_PAE,
            ..Default::default()
        };
        let mut trap = Trap::new(0, &regs, &sregs, mem);
        let served = g.serve(&mut trap, 0, true);
        (served, trap.new_rip(), trap.new_gprs().collect())
    }

    type TrapOut = (Option<bool>, Option<u64>, Vec<(usize, u64)>);

    /// The guest enabling a traced event: its call at the guard's trap
    /// returns `true` at once (RAX 1, RSP past the return address, RIP
    /// that address), the site keeping vmtrace's jump, the guest's from
    /// then on (the detach keeps it); its disabling gives it back the same
    /// way; a call for any other site runs, resumed past the guard's site;
    /// a trap elsewhere is not the guard's.
    #[test]
    fn the_guest_enabling_a_traced_event_finds_its_jump_there() {
        let mem = guest();
        let g = guard(&mem);
        let back = (Some(RET), vec![(RAX, 1), (RSP, STACK + 8)]);
        let past = GUARD + SITE_LEN as u64;
        let out = serve(&g, &mem, GUARD + OUT_LEN, JUMP_LABEL_JMP);
        assert_eq!(out, (Some(true), back.0, back.1.clone()));
        assert_eq!(g.sites().given.len(), 1);
        assert_eq!(g.release(), vec![SITE]);
        let g = guard(&mem);
        serve(&g, &mem, GUARD, JUMP_LABEL_JMP);
        let out = serve(&g, &mem, GUARD, JUMP_LABEL_NOP);
        assert_eq!(out, (Some(true), back.0, back.1));
        assert!(g.release().is_empty());
        // Not vmtrace's (already the guest's, then none): the call runs.
        let out = serve(&g, &mem, GUARD, JUMP_LABEL_JMP);
        assert_eq!(out, (Some(false), Some(past), vec![]));
        assert_eq!(serve(&g, &mem, GUARD + 1, JUMP_LABEL_JMP).0, None);
        assert_eq!(g.exits(), 3);
        let mut b = [0u8; 2];
        mem.read_slice(&mut b, GuestAddress(SITE - PHYS)).unwrap();
        assert_eq!(b, JUMP);
    }
}
