//! A traced module's events traced again once the guest loads it again
//! during the trace (issues 37 and 38): at the load hook
//! (`super::module_hooks`), before its init runs, each event the attach
//! enabled in the module is found again in the new load, at the same
//! offsets in its text with the same bytes (each call site its NOP, a
//! jump label entry of the same target whose key is one key for all the
//! event's sites), and enabled as the attach did (trap mode: its
//! `tp->funcs` tests made breakpoints; exitless: its `tp->funcs` loads
//! redirected), its call sites the same jumps (a `JMP rel` to a target
//! in the same function: the same bytes wherever the text is). Its data
//! (the `struct tracepoint`) moves apart from its text (6.4+): its cells
//! are found from the new key, `tp->funcs` and `tp->iterator` at the
//! offsets from the key they had at the attach. Its hits land on the
//! attach's `__traceiter_NAME` site (the module's functions are followed
//! so), which records them as the attach's event: same name, same id. An
//! event whose sites differ in any way is left untraced (counted).

use vmm::gva::AddressSpace;

use super::journal::{hex, JournaledJump};
use super::module_hooks::Reloaded;
use crate::kernel::events::enabled_branch::redirect_load;
use crate::kernel::kaslr::KernelOffset;
use crate::kernel::module_walk::ModuleId;
use crate::kernel::symbols::KernelImage;
use crate::plan::events::EventPlan;

/// Bytes read at a `tp->funcs` load: the longest instruction.
const INSN_MAX: usize = 15;
/// A `__jump_table` entry's key carries flag bits in its two low bits
/// (include/linux/jump_label.h `JUMP_TYPE_MASK`, `JUMP_TYPE_LINKED`).
const KEY_FLAGS: u64 = 3;

/// One module event as the attach enabled it (running addresses).
#[derive(Clone, Debug)]
struct AttachEvent {
    module: String,
    key: u64,
    funcs: u64,
    iterator_cell: u64,
    iterator: u64,
    tramp: Option<u64>,
    /// Each call site: its address, its jump's target, its NOP, vmtrace's
    /// jump.
    sites: Vec<(u64, u64, Vec<u8>, Vec<u8>)>,
    /// Each `tp->funcs` test: the load, the test, the instruction after
    /// the `je`, the register.
    tests: Vec<(u64, u64, u64, String)>,
    /// The attach made its tests breakpoints (trap), or redirected its
    /// loads (exitless): as `super::event_sites::skips` and
    /// `super::funcs_loads::plan` chose.
    skips: bool,
    loads: bool,
}

/// What a reloaded module's event gets, as its attach did.
#[derive(Debug, Default)]
pub struct Again {
    /// Its call sites (and, exitless, its loads) as journaled.
    pub jumps: Vec<JournaledJump>,
    /// Trap mode: its `tp->funcs` tests, each as `super::breakpoints`'s
    /// `FuncsSkip` has it: the test, the instruction after the `je`, the
    /// register, its value (8 bytes before `tp->funcs`).
    pub skips: Vec<(u64, u64, String, u64)>,
    /// Its static call trampoline, with its iterator (the guard's).
    pub statics: Vec<(u64, u64)>,
}

/// What exitless mode's guard (`super::event_guard`) is to learn of the
/// module follower since its last hit: module texts gone (their sites
/// given back), sites written at loads, static calls to keep.
#[derive(Debug, Default)]
pub struct GuardNews {
    pub gone: Vec<std::ops::Range<u64>>,
    pub sites: Vec<JournaledJump>,
    pub statics: Vec<(u64, u64)>,
}

/// The module events of an attach, found again at their modules' loads.
#[derive(Debug, Default)]
pub struct ReloadEvents {
    events: Vec<AttachEvent>,
    /// Events traced again at a load, and left untraced (their code
    /// there differs from the attach's).
    pub again: usize,
    pub untraced: usize,
    /// The sites written at loads and not given back since (each module
    /// unload takes its own out): the detach gives them back.
    pub live: Vec<JournaledJump>,
    /// The attach's modules: the sites written at a load name the module
    /// loaded again (`super::event_modules`).
    modules: Vec<ModuleId>,
}

impl ReloadEvents {
    /// The module events of `events` as the attach enabled them.
    pub fn of(events: &EventPlan, image: &KernelImage, offset: KernelOffset) -> ReloadEvents {
        let rt = |a: u64| offset.runtime(a);
        let events = (events.events.iter())
            .filter_map(|e| {
                Some(AttachEvent {
                    module: e.module.clone()?,
                    key: rt(e.key),
                    funcs: rt(e.funcs),
                    iterator_cell: rt(e.iterator_cell),
                    iterator: rt(e.iterator),
                    tramp: e.tramp.map(rt),
                    sites: (e.sites.iter())
                        .map(|s| (rt(s.code), rt(s.target), s.nop.clone(), s.jump.clone()))
                        .collect(),
                    tests: (e.tests.iter())
                        .map(|t| (rt(t.load), rt(t.test), rt(t.after_je), t.reg.clone()))
                        .collect(),
                    skips: e.static_call && e.tests.len() == e.sites.len(),
                    loads: e.static_call && !e.tests.is_empty() && e.tests.len() >= e.sites.len(),
                })
            })
            .collect();
        ReloadEvents {
            events,
            modules: image.modules.iter().map(ModuleId::of).collect(),
            ..ReloadEvents::default()
        }
    }

    /// The events of the module `r` loaded again (read through `space`),
    /// each found again as the attach enabled it: for trap mode
    /// (`exitless` false) its call sites and tests, for exitless its call
    /// sites and loads. Those that differ are counted untraced.
    pub fn found_again(
        &mut self,
        r: &Reloaded,
        space: &mut AddressSpace<'_>,
        exitless: bool,
    ) -> Vec<Again> {
        let mut out = Vec::new();
        let module = self.modules.iter().find(|m| m.name == r.name);
        let module = module.map(|m| m.again(r.module, r.text.clone()));
        for e in self.events.iter().filter(|e| e.module == r.name) {
            match again(e, r, space, exitless) {
                Some(mut a) => {
                    self.again += 1;
                    a.jumps.iter_mut().for_each(|j| j.module = module.clone());
                    out.push(a);
                }
                None => self.untraced += 1,
            }
        }
        out
    }

    /// A module's text `text` goes away: its sites written at its load
    /// are given back by then (`super::event_sites::release`).
    pub fn forget(&mut self, text: &std::ops::Range<u64>) {
        self.live.retain(|j| !text.contains(&j.va));
    }
}

/// `e` found again in the load `r`: None where anything differs.
fn again(
    e: &AttachEvent,
    r: &Reloaded,
    space: &mut AddressSpace<'_>,
    exitless: bool,
) -> Option<Again> {
    // (Running addresses: the text moved by `moved`, the data by the key's
    // move.)
    let moved = r.text.start.wrapping_sub(r.was.start);
    let text = |a: u64| r.was.contains(&a).then(|| a.wrapping_add(moved));
    let key_at = |code: u64| {
        let k = r.keys.iter().find(|k| k.0 == code)?;
        Some(k.1 & !KEY_FLAGS)
    };
    let first = text(e.sites.first()?.0)?;
    let key = key_at(first)?;
    let data = key.wrapping_sub(e.key);
    let key_gpa = gpa(space, key, 4)?;
    let mut a = Again::default();
    for (code, target, nop, jump) in &e.sites {
        let va = text(*code)?;
        let same_entry = r.jumps.contains(&(va, target.wrapping_add(moved)));
        if !same_entry || key_at(va)? != key {
            return None;
        }
        let mut now = vec![0u8; nop.len()];
        space.read(va, &mut now).ok()?;
        if now != *nop {
            return None;
        }
        a.jumps.push(JournaledJump {
            module: None,
            va,
            gpa: gpa(space, va, nop.len())?,
            nop: hex(nop),
            jump: hex(jump),
            key_gpa,
        });
    }
    let funcs = e.funcs.wrapping_add(data);
    for (load, test, after_je, reg) in &e.tests {
        if exitless && e.loads {
            let va = text(*load)?;
            let mut now = vec![0u8; INSN_MAX];
            space.read(va, &mut now).ok()?;
            let cell = e.iterator_cell.wrapping_add(data);
            let new = redirect_load(&now, va, funcs, cell).ok()?;
            now.truncate(new.len());
            a.jumps.push(JournaledJump {
                module: None,
                va,
                gpa: gpa(space, va, new.len())?,
                nop: hex(&now),
                jump: hex(&new),
                key_gpa: 0,
            });
        }
        if !exitless && e.skips {
            // 8 bytes before `tp->funcs`, as the attach's (`FuncsSkip`).
            a.skips
                .push((text(*test)?, text(*after_je)?, reg.clone(), funcs - 8));
        }
    }
    if let Some(t) = e.tramp.and_then(text) {
        a.statics.push((t, text(e.iterator)?));
    }
    Some(a)
}

/// The guest-physical address of `len` bytes at `va`, in one page.
fn gpa(space: &mut AddressSpace<'_>, va: u64, len: usize) -> Option<u64> {
    let start = space.gpa(va).ok()?;
    let last = space.gpa(va + len as u64 - 1).ok()?;
    (last == start + len as u64 - 1).then_some(start)
}

#[cfg(test)]
#[path = "event_reload_tests.rs"]
mod tests;
