//! Trap mode's breakpoints follow the traced modules the guest unloads and
//! loads again (`crate::qemu::module_hooks` says where and why).

use super::{BreakOps, Breakpoints, HitError, QemuStop};
use crate::qemu::module_hooks::ModuleHooks;
use crate::session::module_added::FirstLoads;

impl Breakpoints {
    /// Breakpoints (journaled first) at the module load and free paths,
    /// when a module's sites are traced (`super::module_hooks`).
    pub fn hook_modules(
        &mut self,
        stop: &QemuStop<'_>,
        plan: &crate::plan::Plan,
    ) -> Result<(), HitError> {
        let ram = std::sync::Arc::clone(vmm::Stopped::ram(stop));
        let (image, virt) = (&plan.image, plan.index.slide());
        // Modules first loaded during the trace, when slots were kept.
        let coming = plan
            .coming
            .as_ref()
            .filter(|_| plan.index.added().capacity() > 0);
        let coming = coming.map(|c| {
            let mut f = FirstLoads::of_plan(c, plan);
            // `--entry direct`: by their direct entries, breakpoints at
            // their first bytes as the attach's.
            if let Some(links) = crate::session::module_direct::direct_links(plan) {
                f.want_direct(links, true);
            }
            // Their stacks unwind through their own ORC entries.
            if self.stacks.is_some() {
                f.want_orc();
            }
            f
        });
        let found = ModuleHooks::new(image, virt, &*ram, &self.sites, coming)?;
        let Some(hooks) = found else { return Ok(()) };
        let mut set = Vec::new();
        for a in [hooks.load, hooks.free] {
            let added = match self.journal.as_mut() {
                Some(j) => j.add(a).map_err(HitError::from),
                None => Ok(()),
            };
            if let Err(e) = added.and_then(|()| Ok(stop.set_breakpoint(a)?)) {
                // None half set: a load seen without its free would leave
                // breakpoints on freed text.
                for &b in &set {
                    let _ = stop.clear_breakpoint(b);
                }
                return Err(e);
            }
            set.push(a);
        }
        self.hooks = Some(hooks);
        Ok(())
    }

    /// A traced module loads (its sites' breakpoints set, journaled first)
    /// or goes away (removed, before its text is freed).
    pub(super) fn module_hook(
        &mut self,
        rip: u64,
        module: u64,
        ram: &dyn vmm::GuestRam,
        ops: &dyn BreakOps,
    ) -> Result<(), HitError> {
        let Some(k) = self.hooks.as_mut() else {
            return Ok(());
        };
        if rip == k.load {
            let sites = k.loading(ram, module)?;
            // Its stacks unwind through the attach's ORC entries, before
            // any of its code runs.
            if let Some(s) = self.stacks.as_ref() {
                s.set_moved(k.moved());
                if let Some(f) = k.first.as_ref() {
                    f.tell_stacks(s);
                }
            }
            for (new, at) in sites {
                if let Some(j) = self.journal.as_mut() {
                    j.add(new)?;
                }
                ops.set(new)?;
                self.sites.insert(new);
                self.moved.insert(new, at);
            }
            self.events_again(ram, ops)?;
        } else {
            // Its events' sites first, the text still there.
            if let Some(text) = k.traced_text(module) {
                self.release_events(&text, ram, ops)?;
            }
            let Some(k) = self.hooks.as_mut() else {
                return Ok(());
            };
            for a in k.freeing(module) {
                // (A removed breakpoint that was never set is no error.)
                ops.clear(a)?;
                self.sites.remove(&a);
                self.moved.remove(&a);
            }
            if let Some(s) = self.stacks.as_ref() {
                s.set_moved(k.moved());
                if let Some(f) = k.first.as_ref() {
                    f.tell_stacks(s);
                }
            }
        }
        Ok(())
    }

    /// The events of the traced module the load hook found loaded again
    /// (`crate::qemu::event_reload`), enabled as the attach enabled them:
    /// journaled first, their tests' breakpoints and the guard's sites
    /// set, then their call sites written.
    fn events_again(
        &mut self,
        ram: &dyn vmm::GuestRam,
        ops: &dyn BreakOps,
    ) -> Result<(), HitError> {
        let (Some(k), Some(ev)) = (self.hooks.as_mut(), self.reload.as_mut()) else {
            return Ok(());
        };
        let Some(r) = k.reloaded.take() else {
            return Ok(());
        };
        // (A load at the text of one gone: its sites are live again.)
        self.released
            .retain(|t| !(t.start < r.text.end && r.text.start < t.end));
        let found = ev.found_again(&r, &mut k.space(ram), false);
        for a in found {
            if let Some(j) = self.journal.as_mut() {
                j.jumps().extend(a.jumps.iter().cloned());
                for s in &a.skips {
                    j.add(s.0)?;
                }
                j.save()?;
            }
            for (test, after_je, reg, value) in a.skips {
                ops.set(test)?;
                let skip = super::FuncsSkip {
                    test,
                    after_je,
                    reg,
                    value,
                };
                self.skips.insert(test, skip);
            }
            if let Some(g) = self.statics.as_mut() {
                g.iterators.extend(a.statics);
            }
            for j in &a.jumps {
                self.guarded.ours.insert(j.va, j.clone());
                let bytes = crate::qemu::journal::unhex(&j.jump).unwrap_or_default();
                let write = ram.write_slice(&bytes, vm_memory::GuestAddress(j.gpa));
                write.map_err(|e| HitError::Site(e.to_string()))?;
            }
            if let Some(ev) = self.reload.as_mut() {
                ev.live.extend(a.jumps);
            }
        }
        Ok(())
    }

    /// A traced module's text `text` goes away: its events' `tp->funcs`
    /// tests lose their breakpoints, and their call sites get their NOPs
    /// back and are forgotten (the journal's, the guard's: nothing is
    /// written there once the memory is freed).
    fn release_events(
        &mut self,
        text: &std::ops::Range<u64>,
        ram: &dyn vmm::GuestRam,
        ops: &dyn BreakOps,
    ) -> Result<(), HitError> {
        let tests: Vec<u64> = self
            .skips
            .keys()
            .copied()
            .filter(|a| text.contains(a))
            .collect();
        for a in tests {
            ops.clear(a)?;
            self.skips.remove(&a);
        }
        self.guarded.forget(text);
        if let Some(ev) = self.reload.as_mut() {
            ev.forget(text);
        }
        let given = match self.journal.as_mut() {
            Some(j) => {
                let site = |e: vmm::RamError| HitError::Site(e.to_string());
                let given =
                    crate::qemu::event_sites::release(ram, j.jumps(), text).map_err(site)?;
                j.save()?;
                given
            }
            None => 0,
        };
        self.released.push(text.clone());
        self.event_sites_released += given;
        Ok(())
    }

    /// Forget the event sites in `texts` (modules gone whose unload was
    /// not followed): the detach gives them nothing back.
    pub fn forget_events(&mut self, texts: &[std::ops::Range<u64>]) {
        texts.iter().for_each(|t| self.guarded.forget(t));
    }

    /// Module texts whose event sites were given back at their unload
    /// (the detach writes nothing there), and how many sites.
    pub fn released_events(&self) -> (&[std::ops::Range<u64>], usize) {
        (&self.released, self.event_sites_released)
    }

    /// Traced modules the guest unloaded, and loaded again, during the
    /// trace; and sites of those loaded again left untraced
    /// (`ModuleHooks::cycles`).
    pub fn module_cycles(&self) -> (usize, usize, usize) {
        self.hooks.as_ref().map_or((0, 0, 0), |k| k.cycles())
    }

    /// Modules first loaded during the trace and traced, and their
    /// functions' loads left untraced for want of a slot.
    pub fn modules_first_loaded(&self) -> (usize, usize) {
        self.hooks.as_ref().map_or((0, 0), |k| k.first_loaded())
    }

    /// The functions of modules first loaded refused a direct entry.
    pub fn modules_first_refused(&self) -> Option<String> {
        self.hooks.as_ref()?.first_refused()
    }
}
