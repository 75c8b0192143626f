//! Exitless mode follows a traced module through unloads and loads, with
//! trap mode's two breakpoints (`super::module_hooks` says where and why),
//! each hit handled with the VM stopped and the vCPU then stepped over the
//! real instruction there. At the free hook the module's sites get back
//! the bytes they held at the attach (counted) before its text is freed.
//! At the load hook the module is read and a one-shot breakpoint set at
//! the hook's return (journaled); there, once the guest's ftrace has
//! enabled the module's records, each site found again whose record the
//! guest does not use gets its record marked (`crate::session::module_marks`) and
//! a call to the stub of the attach's site (journaled first), so its
//! calls land in the attach's site index and count as the plan's
//! function: no stub or ring slot is added. A module first loaded during
//! the trace (`crate::session::module_added`) is written the same way, each of its
//! traced functions' sites a call to the body of a spare site of the
//! code (`crate::plan::added_sites`), its own. A site straddling two pages
//! is written in both (`super::site_span`), under the stop. Each site
//! written or given back is named in the guest's marker too
//! (`super::marker`), for a repair without the journal. With `--entry
//! direct`, a first-loaded module's entry that displaced other
//! instructions than its ftrace NOP gets a stub of its own in a spare
//! stub slot (`direct_sites`) and a `jmp` there.

mod direct_sites;

use std::collections::HashMap;
use std::sync::Arc;

use vmm::gva::{AddressSpace, PhysSpan};
use vmm::GuestRam;

use super::breakpoints::Served;
use super::gdb::GdbError;
use super::guest::{Hit, QemuStop};
use super::journal::{hex, Journal, JournalError, JournaledJump, JournaledSite};
use super::marker::{Marker, MARKER_GPA};
use super::module_hooks::{HookError, ModuleHooks};
use super::step::BreakOps;
use super::step::Stepped;
use crate::kernel::ftrace_records::Reenabled;
use crate::kernel::sites::SITE_LEN;
use crate::plan::exitless::layout::PAGE;
use crate::session::module_marks::{Judged, Marks};

/// `call rel32`'s opcode.
const CALL: u8 = 0xe8;
/// `jmp rel32`'s opcode: a direct entry's jump to its stub.
const JMP: u8 = 0xe9;

/// Why a module's sites could not be followed.
#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    #[error(transparent)]
    Gdb(#[from] GdbError),
    #[error(transparent)]
    Hook(#[from] HookError),
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error("module site {addr:#x}: {why}")]
    Site { addr: u64, why: String },
    #[error("vmtrace's marker in the guest: {0}")]
    Marker(vmm::RamError),
}

/// A site vmtrace wrote (at a load hook, or a module's at the attach):
/// where, and what it held and holds (`call`: a call, or a direct entry's
/// jump).
#[derive(Debug)]
struct Rewritten {
    va: u64,
    span: PhysSpan,
    original: [u8; SITE_LEN],
    call: [u8; SITE_LEN],
}

/// A module's site as the attach wrote it: its bytes before, vmtrace's
/// bytes, and what it calls at a load elsewhere (None: not traced there).
type AttachSite = ([u8; SITE_LEN], [u8; SITE_LEN], Option<u64>);

/// A traced module being loaded: the load hook's return, where its sites
/// are written, and the stack pointer there (the hook's frame popped).
#[derive(Debug)]
struct Coming {
    ret: u64,
    rsp: u64,
    /// Each site found again, and the stub its call goes to.
    sites: Vec<(u64, u64)>,
}

/// The hooks of an exitless attach, and the module sites written since.
pub struct ModuleFollow {
    hooks: ModuleHooks,
    /// Each traced module site at the attach: its bytes then, what
    /// vmtrace wrote there (a call, or a direct entry's jump), and what
    /// the site calls once its module is loaded elsewhere (None: it is
    /// not traced there).
    at_attach: HashMap<u64, AttachSite>,
    written: Vec<Rewritten>,
    /// Sites given their bytes back at an unload.
    pub restored: usize,
    /// The attach's sites among them (the tracer's detach must forget).
    given_back: Vec<u64>,
    journal: Option<Journal>,
    /// The guest's marker as the attach wrote it, naming the module sites
    /// written since too (None: no marker, trap mode's).
    marker: Option<Marker>,
    /// Modules between the load hook and its return.
    coming: Vec<Coming>,
    /// The guest's ftrace records marked at loads; None where the attach
    /// could not mark them either (it said why).
    marks: Option<Marks>,
    /// Sites of modules loaded again left untraced because the guest's
    /// own ftrace used them (or was changing its records) at the load.
    pub in_use: usize,
    /// Direct entries of modules loaded again left untraced: each
    /// displaced other instructions than an ftrace NOP, and its stub runs
    /// them relocated for the attach's address only.
    pub displaced: usize,
    /// What each spare site calls (its body or stub in vmtrace's code),
    /// by slot: where a function of a module first loaded during the
    /// trace lands (`crate::plan::added_sites`).
    added_stubs: Vec<u64>,
    /// Each spare site's direct stub slot, by slot (`direct_sites`);
    /// empty: none.
    spare_stubs: Vec<u64>,
    /// The attach's direct entries of traced modules that displaced
    /// instructions: their stubs, written again at a reload.
    reentries: direct_sites::Reentries,
    /// Texts of traced modules unloaded whose events' call sites and
    /// `tp->funcs` loads were given back then (`release_events`), and how
    /// many: the detach and the event guard leave them.
    pub released: Vec<std::ops::Range<u64>>,
    pub event_sites_released: usize,
    /// The module events of the attach, traced again at their modules'
    /// loads (`super::event_reload`); and what the guard is to learn
    /// since its last hit (`super::drive`): texts gone, sites written.
    pub reload: super::event_reload::ReloadEvents,
    pub guard_news: super::event_reload::GuardNews,
}

impl ModuleFollow {
    /// Under the attach's stop, once its sites are written: the stub each
    /// traced module site of `hooks` calls now, and the two breakpoints
    /// (named in `journal` first). `marks`: the guest's ftrace records,
    /// where the attach marked its own. `added_stubs`: what each spare
    /// site of the code calls, for the modules first loaded (no more
    /// slots are given). `marker`: the guest's, as the attach wrote it.
    /// On an error, none is left set.
    pub fn start(
        mut hooks: ModuleHooks,
        stop: &QemuStop<'_>,
        (mut journal, marker): (Option<Journal>, Option<Marker>),
        marks: Option<Marks>,
        added_stubs: Vec<u64>,
    ) -> Result<ModuleFollow, FollowError> {
        if let Some(f) = hooks.first.as_mut() {
            f.limit_to(added_stubs.len());
        }
        let ram = Arc::clone(vmm::Stopped::ram(stop));
        let mut space = hooks.space(&*ram);
        let mut at_attach = HashMap::new();
        let mut reentries = direct_sites::Reentries::default();
        for (va, bytes, ftrace) in hooks.attach_sites() {
            let mut now = [0u8; SITE_LEN];
            if space.read(va, &mut now).is_err() {
                continue;
            }
            // An ftrace site calls its stub; a direct entry jumps to its
            // stub, whose first instruction (exitless) calls the site's
            // body, as an ftrace site would: that body is what the site
            // calls at a load elsewhere, if it is an ftrace site (an
            // entry that displaced other instructions gets its stub
            // written again there: `direct_sites`).
            let target = match call_target(va, &now) {
                Some(stub) => Some(Some(stub)),
                None => jump_target(va, &now).map(|stub| {
                    let mut first = [0u8; SITE_LEN];
                    let read = space.read(stub, &mut first).is_ok();
                    let body = read.then(|| call_target(stub, &first)).flatten();
                    reentries.note(va, stub, body.filter(|_| !ftrace));
                    body.filter(|_| ftrace)
                }),
            };
            if let Some(target) = target {
                at_attach.insert(va, (bytes, now, target));
            }
        }
        if let Some(j) = journal.as_mut() {
            j.record.breakpoints.extend([hooks.load, hooks.free]);
            j.save()?;
        }
        stop.set_breakpoint(hooks.load)?;
        if let Err(e) = stop.set_breakpoint(hooks.free) {
            let _ = stop.clear_breakpoint(hooks.load);
            return Err(e.into());
        }
        Ok(ModuleFollow {
            hooks,
            at_attach,
            written: Vec::new(),
            restored: 0,
            given_back: Vec::new(),
            journal,
            marker,
            coming: Vec::new(),
            marks,
            in_use: 0,
            displaced: 0,
            added_stubs,
            spare_stubs: Vec::new(),
            reentries,
            released: Vec::new(),
            event_sites_released: 0,
            reload: Default::default(),
            guard_news: Default::default(),
        })
    }

    /// The events' call sites made jumps after the attach, and the event
    /// guard's `breakpoints` (`super::event_guard`): kept in each later
    /// save of the journal, the first now (the attach's save of the events
    /// knew nothing of the hooks').
    pub fn name_jumps(
        &mut self,
        jumps: &[JournaledJump],
        breakpoints: &[u64],
    ) -> Result<(), FollowError> {
        if let Some(j) = self.journal.as_mut() {
            j.record.jumps = jumps.to_vec();
            for &b in breakpoints {
                if !j.record.breakpoints.contains(&b) {
                    j.record.breakpoints.push(b);
                }
            }
            j.save()?;
        }
        Ok(())
    }

    /// The attach's sites given back at an unload: the tracer's detach
    /// leaves them (`Tracer::forget_sites`).
    pub fn given_back(&self) -> &[u64] {
        &self.given_back
    }

    /// Traced modules unloaded, loaded again, and sites of those loaded
    /// again left untraced (`ModuleHooks::cycles`).
    pub fn cycles(&self) -> (usize, usize, usize) {
        self.hooks.cycles()
    }

    /// Modules first loaded during the trace and traced, and their
    /// functions' loads left untraced for want of a slot.
    pub fn first_loaded(&self) -> (usize, usize) {
        self.hooks.first_loaded()
    }

    /// Their functions refused a direct entry, said by rule.
    pub fn first_refused(&self) -> Option<String> {
        self.hooks.first_refused()
    }

    /// What the site at `new` (standing for the attach's site `at`, or
    /// for itself: a module first loaded) calls.
    fn stub_for(&self, new: u64, at: u64) -> Option<u64> {
        if let Some(&(_, _, stub)) = self.at_attach.get(&at) {
            return stub.or_else(|| self.reentry_body(at));
        }
        let k = self.hooks.first.as_ref()?.slot_of(new)?;
        self.added_stubs.get(k).copied()
    }

    /// A breakpoint's stop (SIGTRAP) on `cpu`: a hook's handled and the VM
    /// resumed; any other left alone.
    pub fn serve_hit(&mut self, hit: Hit<'_>, cpu: usize) -> Result<Served, FollowError> {
        let signal = hit.reply.signal;
        let regs = hit.snapshot(cpu)?.regs;
        let rip = regs.rip;
        let returning = |c: &Vec<Coming>| c.iter().any(|c| c.ret == rip);
        let ram = Arc::clone(hit.ram());
        if rip == self.hooks.load || rip == self.hooks.free {
            self.handle(rip, regs.rdi, regs.rsp, &*ram, &hit)?;
        } else if returning(&self.coming) {
            self.returned(rip, regs.rsp, &*ram)?;
            if !returning(&self.coming) {
                // One-shot: out, and the vCPU runs on from here.
                hit.clear(rip)?;
                self.unjournal_breakpoint(rip)?;
                hit.resume(None)?;
                return Ok(Served::Hit);
            }
        } else {
            hit.hold();
            return Ok(Served::NotOurs { signal });
        }
        // Handled twice, a hook finds nothing more to do: a step cut
        // short needs no memory of it.
        match hit.step_over(cpu, rip)? {
            Stepped::Moved | Stepped::Stayed => hit.resume(None)?,
            Stepped::Stopped { signal, .. } => {
                hit.hold();
                return Ok(Served::NotOurs { signal });
            }
        }
        Ok(Served::Hit)
    }

    /// The hook at `rip` for the `struct module` at `module`, the vCPU's
    /// stack at `rsp` (the hook's return address on top).
    fn handle(
        &mut self,
        rip: u64,
        module: u64,
        rsp: u64,
        ram: &dyn GuestRam,
        hit: &dyn BreakOps,
    ) -> Result<(), FollowError> {
        let mut space = self.hooks.space(ram);
        if rip == self.hooks.load {
            let mut sites = Vec::new();
            for (new, at) in self.hooks.loading(ram, module)? {
                match self.stub_for(new, at) {
                    Some(stub) => sites.push((new, stub)),
                    None if self.at_attach.contains_key(&at) => self.displaced += 1,
                    None => self.hooks.untraced += 1,
                }
            }
            if let Some(r) = self.hooks.reloaded.take() {
                self.events_again(&r, ram)?;
            }
            if sites.is_empty() {
                return Ok(());
            }
            let ret = space.read_u64(rsp).map_err(|e| FollowError::Site {
                addr: rsp,
                why: format!("the load hook's return address: {e}"),
            })?;
            if !self.coming.iter().any(|c| c.ret == ret) {
                if let Some(j) = self.journal.as_mut() {
                    j.record.breakpoints.push(ret);
                    j.save()?;
                }
                hit.set(ret)?;
            }
            self.coming.push(Coming {
                ret,
                rsp: rsp + 8,
                sites,
            });
            return Ok(());
        }
        // Its events' sites first, the text still there.
        if let Some(text) = self.hooks.traced_text(module) {
            self.release_events(&text, ram)?;
        }
        for va in self.hooks.freeing(module) {
            if let Some(m) = self.marks.as_mut() {
                m.forget(va);
            }
            let site = match self.written.iter().position(|w| w.va == va) {
                Some(i) => Some(self.written.swap_remove(i)),
                // (A first-loaded module's site left to the guest's
                // ftrace at its load is neither.)
                None if !self.at_attach.contains_key(&va) => None,
                None => {
                    self.given_back.push(va);
                    self.attach_site(&mut space, va)
                }
            };
            let Some(w) = site else { continue };
            if restore(ram, &w)? {
                self.restored += 1;
            }
            self.unjournal(va)?;
            self.remark(ram, |m| m.module_sites.retain(|&s| s != va))?;
        }
        Ok(())
    }

    /// A traced module's text `text` goes away: its events' call sites and
    /// `tp->funcs` loads get their bytes back and leave the journal
    /// (nothing is written there once the memory is freed).
    fn release_events(
        &mut self,
        text: &std::ops::Range<u64>,
        ram: &dyn GuestRam,
    ) -> Result<(), FollowError> {
        let site = |e: vmm::RamError| FollowError::Site {
            addr: text.start,
            why: format!("giving its events' sites back: {e}"),
        };
        if let Some(j) = self.journal.as_mut() {
            let given =
                super::event_sites::release(ram, &mut j.record.jumps, text).map_err(site)?;
            j.save()?;
            self.event_sites_released += given;
        }
        self.reload.forget(text);
        self.guard_news.gone.push(text.clone());
        self.released.push(text.clone());
        Ok(())
    }

    /// The events of the module `r` loaded again, enabled as the attach
    /// enabled them (`super::event_reload`): journaled, then written; the
    /// guard learns them at the drive's next turn.
    fn events_again(
        &mut self,
        r: &super::module_hooks::Reloaded,
        ram: &dyn GuestRam,
    ) -> Result<(), FollowError> {
        // (A load at the text of one gone: its sites are live again.)
        self.released
            .retain(|t| !(t.start < r.text.end && r.text.start < t.end));
        let found = self.reload.found_again(r, &mut self.hooks.space(ram), true);
        for a in found {
            if let Some(j) = self.journal.as_mut() {
                j.record.jumps.extend(a.jumps.iter().cloned());
                j.save()?;
            }
            for j in &a.jumps {
                let bytes = super::journal::unhex(&j.jump).unwrap_or_default();
                let write = ram.write_slice(&bytes, vm_memory::GuestAddress(j.gpa));
                write.map_err(|e| FollowError::Site {
                    addr: j.va,
                    why: format!("writing a reloaded module's event site: {e}"),
                })?;
            }
            self.reload.live.extend(a.jumps.iter().cloned());
            self.guard_news.sites.extend(a.jumps);
            self.guard_news.statics.extend(a.statics);
        }
        Ok(())
    }

    /// The load hook returned at `rip` with the stack at `rsp`: the
    /// coming module's sites, judged by their records now, written.
    fn returned(&mut self, rip: u64, rsp: u64, ram: &dyn GuestRam) -> Result<(), FollowError> {
        let Some(i) = self
            .coming
            .iter()
            .position(|c| c.ret == rip && c.rsp == rsp)
        else {
            // Another path through that address: nothing of ours.
            return Ok(());
        };
        let c = self.coming.swap_remove(i);
        let mut space = self.hooks.space(ram);
        let vas: Vec<u64> = c.sites.iter().map(|s| s.0).collect();
        let judged = match self.marks.as_ref() {
            Some(m) => m.judge(&mut space, &vas),
            None => vec![Judged::Write; vas.len()],
        };
        for ((va, stub), j) in c.sites.into_iter().zip(judged) {
            let site = |why: String| FollowError::Site { addr: va, why };
            match (j, self.marks.as_mut()) {
                (Judged::InUse, _) => {
                    self.in_use += 1;
                    continue;
                }
                (Judged::Mark(gpa), Some(m)) => m.mark(ram, va, gpa).map_err(site)?,
                _ => {}
            }
            if let Err(e) = self.write_site(&mut space, va, stub) {
                if let Some(m) = self.marks.as_mut() {
                    let _ = m.unmark(ram, va);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// An attach-time site as vmtrace wrote it.
    fn attach_site(&self, space: &mut AddressSpace<'_>, va: u64) -> Option<Rewritten> {
        let &(original, written, _) = self.at_attach.get(&va)?;
        Some(Rewritten {
            va,
            span: space.span(va, SITE_LEN).ok()?,
            original,
            call: written,
        })
    }

    /// The loaded module's site at `va` gets `call` (a call, or a direct
    /// entry's jump), journaled first.
    fn rewrite(
        &mut self,
        space: &mut AddressSpace<'_>,
        va: u64,
        call: [u8; SITE_LEN],
    ) -> Result<(), FollowError> {
        let site = |why: String| FollowError::Site { addr: va, why };
        // (Across two pages, a piece in each: the stop keeps the guest
        // from running either half-written.)
        let span = space.span(va, SITE_LEN).map_err(|e| site(e.to_string()))?;
        let mut original = [0u8; SITE_LEN];
        let mem = space.memory();
        span.read(mem, &mut original)
            .map_err(|e| site(e.to_string()))?;
        if let Some(j) = self.journal.as_mut() {
            let next = (va | (PAGE - 1)) + 1;
            let tail = match next - va < SITE_LEN as u64 {
                true => Some(space.gpa(next).map_err(|e| site(e.to_string()))?),
                false => None,
            };
            j.record.sites.push(JournaledSite {
                va,
                gpa: span.start(),
                original: hex(&original),
                tail,
            });
            j.save()?;
        }
        self.remark(mem, |m| m.module_sites.push(va))?;
        span.write(mem, &call).map_err(|e| site(e.to_string()))?;
        self.written.push(Rewritten {
            va,
            span,
            original,
            call,
        });
        Ok(())
    }

    /// The load hook's return at `ret` is no longer a breakpoint.
    fn unjournal_breakpoint(&mut self, ret: u64) -> Result<(), FollowError> {
        if let Some(j) = self.journal.as_mut() {
            j.record.breakpoints.retain(|&b| b != ret);
            j.save()?;
        }
        Ok(())
    }

    /// The guest's marker changed by `change`, written again (before a
    /// site is written, after it is given back).
    fn remark(
        &mut self,
        mem: &dyn GuestRam,
        change: impl FnOnce(&mut Marker),
    ) -> Result<(), FollowError> {
        let Some(m) = self.marker.as_mut() else {
            return Ok(());
        };
        change(m);
        mem.write_slice(&m.encode(), vm_memory::GuestAddress(MARKER_GPA))
            .map_err(FollowError::Marker)
    }

    /// The site at `va` given back: no longer the repair's.
    fn unjournal(&mut self, va: u64) -> Result<(), FollowError> {
        if let Some(j) = self.journal.as_mut() {
            j.record.sites.retain(|s| s.va != va);
            j.save()?;
        }
        Ok(())
    }

    /// Inside the detach's stop: the breakpoints out, every site written
    /// since the attach that still holds vmtrace's call given its bytes
    /// back, and their records in the guest's ftrace as the attach's are
    /// (`Marks::give_back`). Returns how many sites, and the records.
    pub fn detach(&mut self, stop: &QemuStop<'_>) -> Result<(usize, Reenabled), FollowError> {
        stop.clear_breakpoint(self.hooks.load)?;
        stop.clear_breakpoint(self.hooks.free)?;
        let mut rets: Vec<u64> = self.coming.drain(..).map(|c| c.ret).collect();
        rets.sort_unstable();
        rets.dedup();
        for ret in rets {
            stop.clear_breakpoint(ret)?;
        }
        let ram = Arc::clone(vmm::Stopped::ram(stop));
        let mut restored = std::collections::HashSet::new();
        for w in std::mem::take(&mut self.written) {
            if restore(&*ram, &w)? {
                restored.insert(w.va);
            }
        }
        let records = match self.marks.as_mut() {
            Some(m) => {
                let mut space = self.hooks.space(&*ram);
                m.give_back(&mut space, |site| restored.contains(&site))
            }
            None => Reenabled::default(),
        };
        Ok((restored.len(), records))
    }
}

/// Where a `call rel32` at `va` goes, if `bytes` are one.
fn call_target(va: u64, bytes: &[u8; SITE_LEN]) -> Option<u64> {
    let rel = i32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
    (bytes[0] == CALL).then(|| {
        va.wrapping_add(SITE_LEN as u64)
            .wrapping_add_signed(rel.into())
    })
}

/// Where a `jmp rel32` at `va` goes (a direct entry's jump to its
/// stub), if `bytes` are one.
fn jump_target(va: u64, bytes: &[u8; SITE_LEN]) -> Option<u64> {
    let rel = i32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
    (bytes[0] == JMP).then(|| {
        va.wrapping_add(SITE_LEN as u64)
            .wrapping_add_signed(rel.into())
    })
}

/// `w`'s original bytes back, if it still holds vmtrace's call (anything
/// else is not vmtrace's to touch).
fn restore(ram: &dyn GuestRam, w: &Rewritten) -> Result<bool, FollowError> {
    let site = |e: vmm::gva::GvaError| FollowError::Site {
        addr: w.va,
        why: e.to_string(),
    };
    let mut now = [0u8; SITE_LEN];
    w.span.read(ram, &mut now).map_err(site)?;
    if now != w.call {
        return Ok(false);
    }
    w.span.write(ram, &w.original).map_err(site)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::exitless::trampoline::call_bytes;

    #[test]
    fn a_call_is_read_back_to_its_target_and_anything_else_is_not() {
        let site = 0xffff_ffff_c000_1014;
        let stub = 0xffff_ffff_ff80_0040;
        let call = call_bytes(site, stub).unwrap();
        assert_eq!(call_target(site, &call), Some(stub));
        assert_eq!(call_target(site, &[0x0f, 0x1f, 0x44, 0, 0]), None);
    }
}
