//! vmtrace's own VMM follows the kernel modules the guest loads and
//! unloads during the trace (issue 37): the attach puts its trap (`out`,
//! as at any site: `crate::session::patch`) on the two ftrace sites of the
//! module notifier chain's calls (`crate::kernel::module_notify`), and
//! the vCPU that takes one handles it with every other vCPU paused
//! (`vmm::Trap::stop_world`), as the attach's writes are made, before
//! the guest goes on:
//!
//! - a module coming (its text final, its ftrace sites NOPs, none of its
//!   code run yet): read from its `struct module`, the functions the
//!   selection takes (`super::module_added`, as `vmtrace attach` judges
//!   them) get a spare site each, and their sites are written: the trap
//!   in trap mode, a call to the spare site's body in exitless mode;
//! - a module going (its exit run, its text not freed yet): its sites
//!   given back their NOPs (counted), the spare sites' addresses cleared.
//!
//! Nothing else of the guest changes. A detach walks the module list and restores only the sites of
//! modules still loaded where they were written (a load that failed after
//! its notifiers, `bug_cleanup` in kernel/module/main.c, frees a module
//! without the going call).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use vmm::gva::{AddressSpace, PhysSpan};
use vmm::{GuestRam, Trap};

use super::module_added::FirstLoads;
use super::module_marks::{Judged, Marks};
use super::patch::{self, PatchError, PatchedSite, Surveyed};
use super::stacks::StackSource;
use super::Tracer;
use crate::error::TracerError;
use crate::kernel::kaslr::KernelOffset;
use crate::kernel::module_notify::{ModuleNotify, Notified};
use crate::kernel::modules::{loaded, module_at, ModuleLayout};
use crate::kernel::sites::{is_kernel_nop5, SITE_LEN};
use crate::kernel::top_table::kernel_space;
use crate::plan::exitless::trampoline::call_bytes;
use crate::plan::site_index::OUT_LEN;
use crate::plan::Plan;

/// The own VMM's module traps, shared by every vCPU's recorder and the
/// tracer (which sets them up at the attach and takes them out at the
/// detach). The state is locked only when a module comes or goes.
#[derive(Debug)]
pub struct ModuleTraps {
    notify: ModuleNotify,
    layout: ModuleLayout,
    state: Mutex<Option<Following>>,
    /// Exits at the two sites: not traced calls (the trace's own exits
    /// leave them out), the cost of following.
    exits: AtomicU64,
}

/// What following needs once attached.
#[derive(Debug)]
struct Following {
    first: FirstLoads,
    /// Exitless mode: what each spare site calls, by slot; None: trap
    /// mode (the trap).
    stubs: Option<Vec<u64>>,
    /// Module sites written and not given back yet.
    written: Vec<Written>,
    counts: Counts,
    /// The guest's ftrace records, marked as the attach's (None where the
    /// attach could not mark them either: it said why).
    marks: Option<Marks>,
    /// `--stack`: told of each module's functions and ORC entries at its
    /// load and unload, as `vmtrace attach`'s load hook tells it
    /// (`FirstLoads::read_orc`, `tell_stacks`).
    stacks: Option<Arc<StackSource>>,
}

/// A module site vmtrace wrote.
#[derive(Debug)]
struct Written {
    va: u64,
    /// The `struct module` whose text holds it.
    module: u64,
    span: PhysSpan,
    original: [u8; SITE_LEN],
    bytes: [u8; SITE_LEN],
}

/// What the traps did, for the detach line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Sites given their NOP back at an unload.
    pub restored: usize,
    /// Module sites not written: not a NOP (the guest's own ftrace uses
    /// it), or unreadable.
    pub untraced: usize,
    /// Modules whose `struct module` could not be read at their load.
    pub unreadable: usize,
    /// At the detach: sites of modules gone without their going call
    /// (their text freed): left alone.
    pub gone: usize,
}

impl ModuleTraps {
    /// The traps of `plan`, when it follows modules in the own VMM.
    pub fn of(plan: &Plan) -> Option<Arc<ModuleTraps>> {
        let coming = plan.coming.as_ref()?;
        Some(Arc::new(ModuleTraps {
            notify: coming.notify?,
            layout: coming.layout,
            state: Mutex::new(None),
            exits: AtomicU64::new(0),
        }))
    }

    fn state(&self) -> MutexGuard<'_, Option<Following>> {
        // A panic elsewhere while holding it left whole values.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The two trap sites (link addresses).
    fn sites(&self) -> [u64; 2] {
        [self.notify.coming, self.notify.going]
    }

    /// Whether the site at running address `addr` is one of the two (a
    /// traced function's site there traps in exitless mode too).
    pub fn at(&self, addr: u64, slide: i64) -> bool {
        self.sites().contains(&addr.wrapping_sub(slide as u64))
    }

    /// Exits at the two sites so far.
    pub fn exits(&self) -> u64 {
        self.exits.load(Ordering::Relaxed)
    }

    /// A trap at `trap.rip`, the kernel `slide` bytes from its link
    /// addresses: if it is at one of the two sites, the address to resume
    /// at (past the site), and the module coming or going, if one is
    /// (for `handle`, every other vCPU paused).
    pub fn at_trap(&self, trap: &Trap<'_>, slide: i64) -> Option<(u64, Option<Notified>)> {
        let link = trap.rip.wrapping_sub(slide as u64);
        // At the `out` or just past it (`SiteIndex::find`).
        let site = [link, link.wrapping_sub(OUT_LEN)]
            .into_iter()
            .find(|s| self.sites().contains(s))?;
        let resume = site.wrapping_add_signed(slide) + SITE_LEN as u64;
        self.exits.fetch_add(1, Ordering::Relaxed);
        let what = self.notify.notified(site, &trap.args, slide)?;
        Some((resume, (what != Notified::Other).then_some(what)))
    }

    /// A module coming or going (`at_trap`), handled with every other
    /// vCPU paused: its sites written, or given back.
    pub fn handle(&self, trap: &mut Trap<'_>, what: Notified) {
        let mut state = self.state();
        let Some(f) = state.as_mut() else {
            return;
        };
        match what {
            Notified::Coming(module) => f.coming(trap.space(), &self.layout, module),
            Notified::Going(module) => f.going(trap.space().memory(), module),
            Notified::Other => {}
        }
    }
}

impl Following {
    /// The module at `module` comes: its selected functions' sites written.
    fn coming(&mut self, space: &mut AddressSpace<'_>, layout: &ModuleLayout, module: u64) {
        let Ok(mut read) = module_at(space, layout, module) else {
            self.counts.unreadable += 1;
            return;
        };
        // Completed from its file, if one has its build id.
        let btf = self.first.module_btf(space, &mut read, module);
        let vas = self.first.loading(&read, module, btf.as_ref());
        // Its ORC entries, before any of its code runs: its stacks unwind
        // through its frames.
        self.first.read_orc(space, &read, module);
        self.tell_stacks();
        let judged = match self.marks.as_ref() {
            Some(m) => m.judge(space, &vas),
            None => vec![Judged::Write; vas.len()],
        };
        for (va, j) in vas.into_iter().zip(judged) {
            let refused = match (j, self.marks.as_mut()) {
                (Judged::InUse, _) => true,
                (Judged::Mark(gpa), Some(m)) => m.mark(space.memory(), va, gpa).is_err(),
                _ => false,
            };
            if refused {
                self.counts.untraced += 1;
                continue;
            }
            let bytes = match &self.stubs {
                None => Some(patch::TRAP),
                // Exitless mode: a `--stack` function traps, as a planned
                // `--stack` site does (the trap path unwinds).
                Some(_) if self.records_stack(va) => Some(patch::TRAP),
                Some(stubs) => self
                    .first
                    .slot_of(va)
                    .and_then(|k| stubs.get(k))
                    .and_then(|&stub| call_bytes(va, stub).ok()),
            };
            let written = bytes.and_then(|b| write_site(space, va, module, b));
            match written {
                Some(w) => self.written.push(w),
                None => {
                    if let Some(m) = self.marks.as_mut() {
                        let _ = m.unmark(space.memory(), va);
                    }
                    self.counts.untraced += 1;
                }
            }
        }
    }

    /// The module at `module` goes: its sites given back before its text
    /// is freed.
    fn going(&mut self, mem: &dyn GuestRam, module: u64) {
        let vas = self.first.freeing(module);
        let (gone, kept): (Vec<Written>, Vec<Written>) = std::mem::take(&mut self.written)
            .into_iter()
            .partition(|w| w.module == module || vas.contains(&w.va));
        self.written = kept;
        for w in gone {
            // Its record goes with the module (`ftrace_release_mod`).
            if let Some(m) = self.marks.as_mut() {
                m.forget(w.va);
            }
            if restore(mem, &w) {
                self.counts.restored += 1;
            }
        }
        self.tell_stacks();
    }

    /// `--stack` told of the modules loaded now (and those loaded again
    /// elsewhere), as at `vmtrace attach`'s load and free hooks.
    fn tell_stacks(&self) {
        if let Some(s) = &self.stacks {
            s.set_moved(self.first.moved());
            self.first.tell_stacks(s);
        }
    }

    /// Does a call at the added site at `va` record its stack.
    fn records_stack(&self, va: u64) -> bool {
        let (Some(s), Some(k)) = (&self.stacks, self.first.slot_of(va)) else {
            return false;
        };
        s.at(s.planned() + k)
    }
}

/// The site at `va` of the module at `module`, if it holds the kernel's
/// NOP, made `bytes`.
fn write_site(
    space: &mut AddressSpace<'_>,
    va: u64,
    module: u64,
    bytes: [u8; SITE_LEN],
) -> Option<Written> {
    let span = space.span(va, SITE_LEN).ok()?;
    let mut original = [0u8; SITE_LEN];
    span.read(space.memory(), &mut original).ok()?;
    if !is_kernel_nop5(&original) {
        return None;
    }
    span.write(space.memory(), &bytes).ok()?;
    Some(Written {
        va,
        module,
        span,
        original,
        bytes,
    })
}

/// `w`'s NOP back, if it still holds vmtrace's bytes (anything else is not
/// vmtrace's to touch).
fn restore(mem: &dyn GuestRam, w: &Written) -> bool {
    let mut now = [0u8; SITE_LEN];
    if w.span.read(mem, &mut now).is_err() || now != w.bytes {
        return false;
    }
    w.span.write(mem, &w.original).is_ok()
}

impl Tracer {
    /// The module traps placed (after every other site, under the
    /// attach's stop) and their state set up; on an error every site is
    /// given back. Nothing when the plan does not follow modules.
    pub(super) fn follow_modules(
        &mut self,
        space: &mut AddressSpace<'_>,
        off: KernelOffset,
        ram: &Arc<dyn GuestRam>,
    ) -> Result<(), TracerError> {
        let (Some(traps), Some(coming)) = (self.module_traps.clone(), self.plan.coming.as_ref())
        else {
            return Ok(());
        };
        let mut found = Vec::new();
        for (k, link) in traps.sites().into_iter().enumerate() {
            let addr = off.runtime(link);
            // A traced function's site traps already (`writes`).
            if self.patched.iter().any(|p| p.addr == addr) {
                continue;
            }
            let span = space.span(addr, SITE_LEN).map_err(|e| PatchError::Memory {
                addr,
                gpa: 0,
                why: e.to_string(),
            })?;
            let mut original = [0u8; SITE_LEN];
            span.read(space.memory(), &mut original)
                .map_err(|e| PatchError::Memory {
                    addr,
                    gpa: span.start(),
                    why: e.to_string(),
                })?;
            if !is_kernel_nop5(&original) {
                self.detach(&**ram)?;
                return Err(PatchError::Memory {
                    addr,
                    gpa: span.start(),
                    why: "the module loader's trap site is not the kernel's NOP".into(),
                }
                .into());
            }
            found.push((k, addr, span, original));
        }
        let written = patch::write(space.memory(), Surveyed::entries(found, 0), |_, _| {
            Ok(patch::TRAP)
        });
        let sites: Vec<PatchedSite> = match written {
            Ok((sites, _)) => sites,
            Err(e) => {
                self.detach(&**ram)?;
                return Err(e.into());
            }
        };
        self.attach_counts.module_traps = sites.len();
        self.patched.extend(sites);
        let mut first = FirstLoads::of_plan(coming, &self.plan);
        let stubs = self.trampoline().map(|t| {
            let planned = self.plan.index.addrs.len();
            (planned..t.sites())
                .map(|k| t.stub_va(k as u32))
                .collect::<Vec<_>>()
        });
        if let Some(s) = &stubs {
            first.limit_to(s.len());
        }
        let marks = self.ftrace_records().cloned().map(|r| Marks::new(r, off));
        let stacks = self.stacks.clone();
        if stacks.is_some() {
            first.want_orc();
        }
        *traps.state() = Some(Following {
            first,
            stubs,
            written: Vec::new(),
            counts: Counts::default(),
            marks,
            stacks,
        });
        Ok(())
    }

    /// At a detach, before every other site is restored: the module sites
    /// written since the attach given their NOPs back, those of modules
    /// still loaded where they were written; the counts for the detach
    /// line. The traps themselves are among the other sites.
    pub(super) fn unfollow_modules(&mut self, mem: &dyn GuestRam, c: &mut patch::DetachCounts) {
        let Some(traps) = self.module_traps.clone() else {
            return;
        };
        // Taken: a vCPU that took a trap before the detach's stop and
        // handles it after finds nothing to follow (the traps are gone).
        let Some(mut f) = traps.state().take() else {
            return;
        };
        let f = &mut f;
        let written = std::mem::take(&mut f.written);
        let live = self.offset.and_then(|off| {
            let mut space = kernel_space(mem, &self.plan.image, off)?;
            let head = traps.layout.head.wrapping_add(off.virt as u64);
            loaded(&mut space, &traps.layout, head).ok()
        });
        let mut restored = std::collections::HashSet::new();
        for w in written {
            let here = live.as_ref().is_some_and(|l| {
                l.iter()
                    .any(|m| m.addr == w.module && m.text.contains(&w.va))
            });
            match here && restore(mem, &w) {
                true => {
                    c.restored += 1;
                    restored.insert(w.va);
                }
                false => f.counts.gone += 1,
            }
        }
        // The records of the sites restored given back, as the attach's.
        let space = self
            .offset
            .and_then(|off| kernel_space(mem, &self.plan.image, off));
        if let (Some(m), Some(mut space)) = (f.marks.as_mut(), space) {
            let r = m.give_back(&mut space, |site| restored.contains(&site));
            for g in [&mut c.guest_ftrace, &mut self.detached.guest_ftrace] {
                g.cleared += r.cleared;
                g.kept += r.kept;
                g.why = g.why.or(r.why);
            }
        }
        // Totals of the session: the same at every detach.
        for c in [&mut *c, &mut self.detached] {
            c.module_first = f.first.modules();
            c.module_unloads = f.first.gone;
            c.module_reloads = f.first.again;
            c.module_restored = f.counts.restored;
            c.module_unslotted = f.first.unslotted;
            c.module_in_use = f.counts.untraced;
            c.module_untraced = f.counts.unreadable;
            c.module_gone = f.counts.gone;
            c.module_trap_exits = traps.exits();
        }
    }

    /// Exits at the module loader's traps (`module_traps`): the cost of
    /// following the guest's modules, not traced calls.
    pub fn module_trap_exits(&self) -> u64 {
        self.module_traps.as_ref().map_or(0, |t| t.exits())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::module_notify::{MODULE_STATE_COMING, MODULE_STATE_GOING};
    use kvm_bindings::{kvm_regs, kvm_sregs};
    use vm_memory::{GuestAddress, GuestMemoryMmap};

    /// A trap at `rip` with the argument registers `args` (RDI, RSI, RDX,
    /// RCX): what `at_trap` says.
    fn at(
        traps: &ModuleTraps,
        rip: u64,
        args: [u64; 4],
        slide: i64,
    ) -> Option<(u64, Option<Notified>)> {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x1000)]).unwrap();
        let regs = kvm_regs {
            rip,
            rdi: args[0],
            rsi: args[1],
            rdx: args[2],
            rcx: args[3],
            ..Default::default()
        };
        let trap = Trap::new(0, &regs, &kvm_sregs::default(), &mem);
        traps.at_trap(&trap, slide)
    }

    /// The two sites' traps, at the `out` or past it, are the module
    /// loader's: resumed past the site, a module named only on the module
    /// chain with its state; each counted as an exit; any other trap not.
    #[test]
    fn the_loaders_traps_name_the_module_coming_or_going() {
        let notify = ModuleNotify {
            list: 0xffff_ffff_8200_0000,
            coming: 0xffff_ffff_8100_1000,
            going: 0xffff_ffff_8100_2000,
        };
        let traps = ModuleTraps {
            notify,
            layout: ModuleLayout::unused(),
            state: Mutex::new(None),
            exits: AtomicU64::new(0),
        };
        let slide = 0x20_0000;
        let run = |a: u64| a + slide as u64;
        let (list, module) = (run(notify.list), 0xffff_ffff_c000_4000);
        let coming = [list, MODULE_STATE_COMING, MODULE_STATE_GOING, module];
        assert_eq!(
            at(&traps, run(notify.coming), coming, slide),
            Some((run(notify.coming) + 5, Some(Notified::Coming(module))))
        );
        let going = [list, MODULE_STATE_GOING, module, 0];
        assert_eq!(
            at(&traps, run(notify.going) + OUT_LEN, going, slide),
            Some((run(notify.going) + 5, Some(Notified::Going(module))))
        );
        let other_chain = [list + 0x40, MODULE_STATE_GOING, module, 0];
        assert_eq!(
            at(&traps, run(notify.going), other_chain, slide),
            Some((run(notify.going) + 5, None))
        );
        assert_eq!(at(&traps, run(notify.going) + 5, going, slide), None);
        assert_eq!(traps.exits(), 3);
    }
}
