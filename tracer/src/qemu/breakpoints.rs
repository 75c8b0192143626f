//! Trap mode through QEMU's gdbstub, where no guest memory is free for
//! exitless mode: a breakpoint of QEMU's own (`Z0`) at every selected site
//! (under TCG QEMU keeps them in its translator: guest text is never
//! written), each hit a stop of every vCPU that the trap-mode recorders
//! (`session::record`) take as a trap at the site, the vCPU then moved past
//! the site's 5-byte NOP (checked at the attach) as running it would, and
//! the VM resumed. Per hit the stub sees two packets: `g` (QEMU selected
//! the vCPU that hit) and `c ADDR` (resume, that vCPU past the site; no
//! reply). Still slow: QEMU stops every vCPU for each hit, and under TCG
//! flushes its translations at every breakpoint stop (gdb_vm_state_change
//! up to QEMU 10), about 0.7 ms a call here; but it needs nothing of the
//! guest.
//!
//! Direct entries break at the function's first byte, whose instruction is
//! real: after the hit is recorded the vCPU is stepped over it alone
//! (`super::step`): two stops a call. With the function graph, each entry's
//! frame waits for its return at a breakpoint on the return address
//! (`super::frames`): one more stop per call (and a step where another
//! frame still waits on that address).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use vmm::{Trap, TrapHandler};

mod hooks;

use super::frames::{Changes, Frames};
use super::gdb::GdbError;
use super::guarded_sites::{self, Queued};
use super::guest::{QemuGuest, QemuStop};
use super::journal::{JournalError, ReturnJournal};
use super::step::{BreakOps, Stepped, SIGTRAP};
use super::trap::StopReply;
use crate::session::record::Recorder;
use crate::session::watch::WatchKind;
use crate::session::Tracer;

/// The breakpoints set, and the recorders their hits go to.
pub struct Breakpoints {
    sites: HashSet<u64>,
    kind: WatchKind,
    /// One per vCPU, in the stub's thread order.
    handlers: Vec<Recorder>,
    /// Function graph: frames waiting for their returns, and the return
    /// breakpoints they need (`super::frames`).
    frames: Frames,
    /// A vCPU whose step someone else's stop cut short before the
    /// instruction ran, and where: its next hit there is the same call.
    restep: HashMap<usize, u64>,
    /// Traps at no site of vmtrace's: resumed.
    pub other_stops: u64,
    /// Steps over a breakpoint (direct entries, return addresses).
    pub steps: u64,
    /// Names each return address before its breakpoint is set (for the
    /// repair of a killed vmtrace inside someone else's stop).
    journal: Option<ReturnJournal>,
    /// Traced events' `tp->funcs` tests (`kernel::events::enabled_branch`):
    /// at each, the register tested and what it is given when NULL, and
    /// where the vCPU goes on (past the `je`).
    skips: HashMap<u64, FuncsSkip>,
    /// `arch_jump_label_transform_queue`'s address, and the events' call
    /// sites by their code's address: the guest enabling one of them
    /// returns at once, vmtrace's jump being the kernel's own, never
    /// finding it where it expects its NOP (which would BUG:
    /// `super::guarded_sites`).
    guard: Option<(u64, crate::kernel::kaslr::KernelOffset)>,
    guarded: guarded_sites::Sites,
    /// Sites the guest took over (enabled their event itself), and those
    /// taken back as it disabled the event again.
    pub taken_over: usize,
    pub taken_back: usize,
    /// `__static_call_update`: the guest registering the first probe of a
    /// traced event keeps its static call on `__traceiter_NAME`, which
    /// calls the probe and stops here, so every event is still recorded
    /// (`super::static_guard::StaticGuard`).
    statics: Option<super::static_guard::StaticGuard>,
    /// Static call updates kept on the iterator.
    pub kept: usize,
    /// Breakpoints in the module load and free paths, and the sites of
    /// traced modules loaded again, each with the attach-time site (the
    /// plan's) it stands for (`super::module_hooks`).
    hooks: Option<super::module_hooks::ModuleHooks>,
    moved: HashMap<u64, u64>,
    /// Texts of traced modules unloaded whose events' sites were given
    /// back then (`hooks::release_events`), and how many sites.
    released: Vec<std::ops::Range<u64>>,
    event_sites_released: usize,
    /// The module events of the attach, traced again at their modules'
    /// loads (`super::event_reload`).
    pub(in crate::qemu) reload: Option<super::event_reload::ReloadEvents>,
    /// Why the module hooks could not be set, where some traced site or
    /// `:mod:` glob needs them.
    pub unfollowed: Option<String>,
    /// How `--stack` calls unwind, told of traced modules loaded again
    /// at new addresses.
    stacks: Option<std::sync::Arc<crate::session::stacks::StackSource>>,
}

/// One `tp->funcs` test, as the trap at it passes it (running addresses).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FuncsSkip {
    pub test: u64,
    pub after_je: u64,
    /// The register tested (gdb's name), and its value for vmtrace's
    /// call: 8 bytes before `tp->funcs`, so that `__data` reads NULL.
    pub reg: String,
    pub value: u64,
}

/// How the VM goes on after a hit was handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    /// Resume, the vCPU moved to this address if given (an ftrace NOP
    /// skipped).
    Resume(Option<u64>),
    /// Step the vCPU over the real instruction at this breakpoint first.
    Step(u64),
}

/// What one wait for a stop found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Served {
    /// A stop at a breakpoint, recorded; the VM runs again.
    Hit,
    /// The VM ran on.
    Idle,
    /// The VM stopped for someone else (gdb `signal`: 2 a QMP `stop`, 29
    /// an I/O error, 14 a watchdog, ...; QEMU's gdb_vm_state_change), and
    /// stays stopped.
    NotOurs { signal: u8 },
}

/// Why a hit could not be handled.
#[derive(Debug, thiserror::Error)]
pub enum HitError {
    #[error(transparent)]
    Gdb(#[from] GdbError),
    #[error(transparent)]
    Trap(#[from] vmm::TrapError),
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error("cannot give an event's call site back to the guest: {0}")]
    Site(String),
    #[error(transparent)]
    Module(#[from] super::module_hooks::HookError),
    #[error(transparent)]
    Guard(#[from] super::guarded_sites::GuardError),
}

/// Guest memory unreadable at a guarded event site.
pub(super) fn site_err(e: vmm::RamError) -> HitError {
    HitError::Site(e.to_string())
}

impl Breakpoints {
    /// Set a breakpoint at each of `sites` inside `stop`; on an error, the
    /// ones set are removed again.
    pub fn set(
        stop: &QemuStop<'_>,
        sites: &[u64],
        kind: WatchKind,
        handlers: Vec<Recorder>,
    ) -> Result<Breakpoints, GdbError> {
        let mut set = HashSet::with_capacity(sites.len());
        for &a in sites {
            if let Err(e) = stop.set_breakpoint(a) {
                for &b in &set {
                    let _ = stop.clear_breakpoint(b);
                }
                return Err(e);
            }
            set.insert(a);
        }
        Ok(Breakpoints {
            sites: set,
            kind,
            handlers,
            frames: Frames::default(),
            restep: HashMap::new(),
            other_stops: 0,
            steps: 0,
            journal: None,
            skips: HashMap::new(),
            released: Vec::new(),
            event_sites_released: 0,
            reload: None,
            guard: None,
            guarded: Default::default(),
            taken_over: 0,
            taken_back: 0,
            statics: None,
            kept: 0,
            hooks: None,
            moved: HashMap::new(),
            unfollowed: None,
            stacks: None,
        })
    }

    /// Breakpoints set at sites.
    pub fn len(&self) -> usize {
        self.sites.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sites.is_empty()
    }

    /// The function graph's frames (what waits, what was dropped).
    pub fn frames(&self) -> &Frames {
        &self.frames
    }

    /// Waits up to `timeout` for the running VM to stop; records a hit and
    /// resumes the VM (after stepping the vCPU over a real instruction).
    /// A stop that is no breakpoint's (a user's `stop`, an I/O error, a
    /// watchdog: the stop reply's signal says which) is left alone:
    /// resuming it would undo it; so is one that comes during a step.
    pub fn serve(&mut self, guest: &QemuGuest, timeout: Duration) -> Result<Served, HitError> {
        let Some(hit) = guest.wait_hit(timeout)? else {
            return Ok(Served::Idle);
        };
        if hit.reply.signal != SIGTRAP {
            let signal = hit.reply.signal;
            hit.hold();
            return Ok(Served::NotOurs { signal });
        }
        let Some(cpu) = hit.cpu else {
            self.other_stops += 1;
            hit.resume(None)?;
            return Ok(Served::Hit);
        };
        let snap = hit.snapshot(cpu)?;
        let ram = std::sync::Arc::clone(hit.ram());
        match self.handle(cpu, &snap, &*ram, &hit)? {
            // One packet: the vCPU moved past the site as the VM resumes.
            Next::Resume(pc) => hit.resume(pc)?,
            Next::Step(addr) => {
                self.steps += 1;
                match hit.step_over(cpu, addr)? {
                    Stepped::Moved => hit.resume(None)?,
                    Stepped::Stayed => {
                        self.restep.insert(cpu, addr);
                        hit.resume(None)?
                    }
                    Stepped::Stopped { signal, moved } => {
                        if !moved {
                            self.restep.insert(cpu, addr);
                        }
                        hit.hold();
                        return Ok(Served::NotOurs { signal });
                    }
                }
            }
        }
        Ok(Served::Hit)
    }

    /// A hit on `cpu` (registers `snap`), breakpoints changed through
    /// `ops`: a return the graph waits for (recorded with RAX), an entry
    /// (to its recorder, which counts it and reads the caller at [RSP]; its
    /// frame then waits), or neither (resumed). Says how to go on.
    fn handle(
        &mut self,
        cpu: usize,
        snap: &vmm::pause::VcpuSnapshot,
        ram: &dyn vmm::GuestRam,
        ops: &dyn BreakOps,
    ) -> Result<Next, HitError> {
        let rip = snap.regs.rip;
        if let Some(next) = self.handle_event_stop(cpu, snap, ram, ops)? {
            return Ok(next);
        }
        if self
            .hooks
            .as_ref()
            .is_some_and(|k| k.load == rip || k.free == rip)
        {
            self.module_hook(rip, snap.regs.rdi, ram, ops)?;
            return Ok(Next::Step(rip));
        }
        if self.restep.remove(&cpu) == Some(rip) {
            // Recorded at the hit whose step was cut short.
            return Ok(Next::Step(rip));
        }
        let at_return = self.frames.breaks_at(rip) && !self.sites.contains(&rip);
        if at_return {
            let (done, ch) = self.frames.returned(rip, snap.regs.rsp);
            if let Some(h) = self.handlers.get_mut(cpu) {
                for f in &done {
                    h.on_frame_return(&f.entered, snap.regs.rax);
                }
            }
            self.apply(ch, ops)?;
        }
        if !self.sites.contains(&rip) {
            return Ok(match (at_return, self.frames.breaks_at(rip)) {
                (true, true) => Next::Step(rip),
                (true, false) => Next::Resume(None),
                (false, _) => {
                    // A trap at no breakpoint of vmtrace's (one just removed).
                    self.other_stops += 1;
                    Next::Resume(None)
                }
            });
        }
        let at = self.planned_site(rip);
        let Some(h) = self.handlers.get_mut(cpu) else {
            return Ok(Next::Resume(None));
        };
        let regs = kvm_bindings::kvm_regs {
            rip: at,
            ..snap.regs
        };
        let mut trap = Trap::new(cpu, &regs, &snap.sregs, ram);
        h.on_trap(&mut trap)?;
        let moved = trap.new_rip().map(|a| a.wrapping_add(rip.wrapping_sub(at)));
        if let Some(e) = h.take_entered() {
            let full = self.frames.full;
            let ch = self.frames.enter(e, cpu);
            if self.frames.full > full {
                h.not_followed();
            }
            self.apply(ch, ops)?;
        }
        Ok(match self.kind.direct {
            // The function's real first instruction: stepped.
            true => Next::Step(rip),
            // The ftrace NOP: skipped, as running it would.
            false => Next::Resume(moved),
        })
    }

    /// A hit at one of the events' breakpoints (a `tp->funcs` test, the
    /// guards'), handled; None for any other.
    fn handle_event_stop(
        &mut self,
        cpu: usize,
        snap: &vmm::pause::VcpuSnapshot,
        ram: &dyn vmm::GuestRam,
        ops: &dyn BreakOps,
    ) -> Result<Option<Next>, HitError> {
        let rip = snap.regs.rip;
        if let Some(k) = self.skips.get(&rip) {
            // A NULL `tp->funcs` (no probe of the guest's) made vmtrace's
            // pointer; either way the `je` is not taken.
            if gpr(&snap.regs, &k.reg) == Some(0) {
                ops.set_reg(cpu, &k.reg, k.value)?;
            }
            return Ok(Some(Next::Resume(Some(k.after_je))));
        }
        if let Some((_, offset)) = self.guard.filter(|g| g.0 == rip) {
            return self.serve_guard(cpu, snap, offset, ram, ops).map(Some);
        }
        if let Some(g) = self.statics.as_ref().filter(|g| g.at == rip) {
            self.kept += usize::from(g.keep(cpu, &snap.regs, ops)?);
            return Ok(Some(Next::Step(rip)));
        }
        Ok(None)
    }

    /// The attach's site that the site at `rip` stands for: itself, or
    /// for a reloaded module's, the attach's (no lookup on the per-hit
    /// path while no module moved).
    fn planned_site(&self, rip: u64) -> u64 {
        match self.moved.is_empty() {
            true => rip,
            false => self.moved.get(&rip).copied().unwrap_or(rip),
        }
    }

    /// Name the return breakpoints set from now on in `journal`.
    pub fn journal_returns(&mut self, journal: ReturnJournal) {
        self.journal = Some(journal);
    }

    /// The events' call sites made jumps after the attach: kept in each
    /// later save of the return journal.
    pub fn name_jumps(&mut self, jumps: &[super::journal::JournaledJump]) {
        if let Some(j) = self.journal.as_mut() {
            j.name_jumps(jumps);
        }
    }

    /// A breakpoint (already journaled) at `at`, the kernel's
    /// `arch_jump_label_transform_queue`, guarding `jumps` (by their
    /// running addresses: the kernel sorted its table at boot, so an
    /// entry is known by the code it names).
    pub fn guard(
        &mut self,
        stop: &QemuStop<'_>,
        at: u64,
        offset: crate::kernel::kaslr::KernelOffset,
        jumps: &[super::journal::JournaledJump],
    ) -> Result<(), HitError> {
        stop.set_breakpoint(at)?;
        self.guard = Some((at, offset));
        self.guarded = guarded_sites::Sites::new(jumps.iter().cloned());
        Ok(())
    }

    /// A breakpoint (already journaled) at `__static_call_update`, keeping
    /// the traced events' static calls on their iterators.
    pub fn keep_static_calls(
        &mut self,
        stop: &QemuStop<'_>,
        statics: super::static_guard::StaticGuard,
    ) -> Result<(), HitError> {
        stop.set_breakpoint(statics.at)?;
        self.statics = Some(statics);
        Ok(())
    }

    /// A hit at `arch_jump_label_transform_queue` on `cpu` (registers
    /// `snap`): see `super::guarded_sites`. Says how to go on.
    fn serve_guard(
        &mut self,
        cpu: usize,
        snap: &vmm::pause::VcpuSnapshot,
        offset: crate::kernel::kaslr::KernelOffset,
        ram: &dyn vmm::GuestRam,
        ops: &dyn BreakOps,
    ) -> Result<Next, HitError> {
        let q = guarded_sites::serve_queue(cpu, snap, offset, &mut self.guarded, ram, ops)?;
        self.taken_over += usize::from(matches!(q, Queued::Returned | Queued::Left));
        self.taken_back += usize::from(q == Queued::TakenBack);
        Ok(match q {
            // Its registers already say where it returns to.
            Queued::Returned | Queued::TakenBack => Next::Resume(None),
            Queued::Left | Queued::NotOurs => Next::Step(snap.regs.rip),
        })
    }

    /// Breakpoints at the events' `tp->funcs` tests (already journaled),
    /// set in `stop`.
    pub fn add_skips(
        &mut self,
        stop: &QemuStop<'_>,
        skips: Vec<FuncsSkip>,
    ) -> Result<(), HitError> {
        for k in skips {
            if let Some(j) = self.journal.as_mut() {
                j.add(k.test)?;
            }
            stop.set_breakpoint(k.test)?;
            self.skips.insert(k.test, k);
        }
        Ok(())
    }

    /// Set and clear the return breakpoints `ch` says (not at a site: the
    /// site's own breakpoint stays, and stops there anyway); each set one
    /// journaled first.
    fn apply(&mut self, ch: Changes, ops: &dyn BreakOps) -> Result<(), HitError> {
        for a in ch.set.into_iter().filter(|a| !self.sites.contains(a)) {
            if let Some(j) = &mut self.journal {
                j.add(a)?;
            }
            ops.set(a)?;
        }
        for a in ch.clear.into_iter().filter(|a| !self.sites.contains(a)) {
            ops.clear(a)?;
        }
        Ok(())
    }

    /// Inside vmtrace's own final stop: a hit that came just before it (its
    /// stop reply was the stop's) is recorded as any other (not moved:
    /// with the breakpoints gone the vCPU runs its instruction; but a
    /// guard's hit made to return sets the vCPU's registers); then every
    /// breakpoint, at sites and at returns, is removed, every guarded event
    /// site still vmtrace's given its NOP (`super::guarded_sites`), the
    /// recorders flushed and dropped. Returns the breakpoints removed at
    /// sites.
    pub fn remove(
        &mut self,
        guest: &QemuGuest,
        stop: &QemuStop<'_>,
        last: Option<StopReply>,
    ) -> Result<usize, HitError> {
        let hit = last
            .filter(|r| r.signal == SIGTRAP)
            .and_then(|r| guest.cpu_of(r.thread?));
        if let Some(cpu) = hit {
            if let Some(snap) = vmm::Stopped::snapshot(stop, cpu) {
                self.handle(cpu, &snap, &**vmm::Stopped::ram(stop), stop)?;
            }
        }
        // Frames left open: their returns are never seen (the graph says
        // so from the events, as of the exitless graph's).
        let (returns, _open) = self.frames.take_all();
        for a in returns.into_iter().filter(|a| !self.sites.contains(a)) {
            stop.clear_breakpoint(a)?;
        }
        for (a, _) in self.skips.drain() {
            stop.clear_breakpoint(a)?;
        }
        if let Some((g, _)) = self.guard.take() {
            stop.clear_breakpoint(g)?;
        }
        if let Some(g) = self.statics.take() {
            stop.clear_breakpoint(g.at)?;
        }
        // Whatever their key's count: see `super::guarded_sites`.
        let ram = std::sync::Arc::clone(vmm::Stopped::ram(stop));
        guarded_sites::give_back_all(&mut self.guarded, &*ram).map_err(site_err)?;
        if let Some(k) = &self.hooks {
            stop.clear_breakpoint(k.load)?;
            stop.clear_breakpoint(k.free)?;
        }
        let mut removed = 0;
        for &a in &self.sites {
            stop.clear_breakpoint(a)?;
            removed += 1;
        }
        self.sites.clear();
        self.finish();
        Ok(removed)
    }

    /// Flush and drop the recorders: the store ends once they are gone.
    pub fn finish(&mut self) {
        for h in &mut self.handlers {
            h.flush();
        }
        self.handlers.clear();
    }
}

/// General register `name` (gdb's name) of `r`.
fn gpr(r: &kvm_bindings::kvm_regs, name: &str) -> Option<u64> {
    Some(match name {
        "rax" => r.rax,
        "rbx" => r.rbx,
        "rcx" => r.rcx,
        "rdx" => r.rdx,
        "rsi" => r.rsi,
        "rdi" => r.rdi,
        "rbp" => r.rbp,
        "r8" => r.r8,
        "r9" => r.r9,
        "r10" => r.r10,
        "r11" => r.r11,
        "r12" => r.r12,
        "r13" => r.r13,
        "r14" => r.r14,
        "r15" => r.r15,
        _ => return None,
    })
}

/// Set the breakpoints of `tracer`'s watched sites (`Tracer::watch_sites`)
/// under `stop`, and count them as its attach.
pub fn watch(
    tracer: &mut Tracer,
    stop: &QemuStop<'_>,
    sites: &[u64],
    others: usize,
    handlers: Vec<Recorder>,
    journal: Option<ReturnJournal>,
) -> Result<Breakpoints, GdbError> {
    let mut b = Breakpoints::set(stop, sites, tracer.watch_kind(), handlers)?;
    if let Some(j) = journal {
        b.journal_returns(j);
    }
    // Without the hooks an unloaded module's breakpoints stay (on freed
    // text) until the detach, as before them: only the stub's own errors
    // end the attach.
    b.stacks = tracer.stack_source().cloned();
    match b.hook_modules(stop, tracer.plan()) {
        Err(HitError::Gdb(e)) => {
            for &a in &b.sites {
                let _ = stop.clear_breakpoint(a);
            }
            b.finish();
            return Err(e);
        }
        // Said by the attach (`unfollowed`).
        Err(e) => b.unfollowed = Some(e.to_string()),
        Ok(()) => {}
    }
    tracer.watching(b.len(), others, stop);
    Ok(b)
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

    use super::*;
    use crate::session::record::{recorders, SiteIndex};
    use crate::session::store::{Storage, Stored};
    use crate::trace::model::RETURN_BIT;

    const SITE: u64 = 0xffff_ffff_8100_0000;
    /// The traced function's caller: its return address.
    const RET: u64 = 0xffff_ffff_8100_2345;
    /// RSP at the entry: the kernel map's 2 MiB page at physical 20 MiB.
    const RSP: u64 = 0xffff_ffff_8140_0ff8;

    /// Breakpoints set and cleared, in order.
    #[derive(Default)]
    struct Ops(RefCell<Vec<(char, u64)>>);
    impl BreakOps for Ops {
        fn set(&self, addr: u64) -> Result<(), GdbError> {
            self.0.borrow_mut().push(('Z', addr));
            Ok(())
        }
        fn clear(&self, addr: u64) -> Result<(), GdbError> {
            self.0.borrow_mut().push(('z', addr));
            Ok(())
        }
        fn set_reg(&self, _: usize, _: &str, value: u64) -> Result<(), GdbError> {
            self.0.borrow_mut().push(('P', value));
            Ok(())
        }
    }

    fn snap(rip: u64, rsp: u64, rax: u64) -> vmm::pause::VcpuSnapshot {
        let mut s = vmm::pause::VcpuSnapshot {
            regs: Default::default(),
            sregs: Default::default(),
            clock: None,
            syscall_entry: None,
        };
        (s.regs.rip, s.regs.rsp, s.regs.rax) = (rip, rsp, rax);
        s.sregs.cr3 = vmm::layout::PML4_START;
        s
    }

    /// A hit at a direct entry is recorded, its vCPU stepped, its return
    /// breakpoint set; the return (RSP one slot up) recorded with RAX and
    /// its breakpoint cleared without a step; a later stop there (the
    /// breakpoint gone) resumed; a step someone else's stop cut short is
    /// stepped again, not recorded twice; an ftrace site is skipped.
    #[test]
    fn hits_are_recorded_stepped_and_their_returns_matched() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 64 << 20)]).unwrap();
        vmm::boot::regs::setup_page_tables(&mem).unwrap();
        mem.write_obj(RET, GuestAddress(0x140_0ff8)).unwrap();
        let index = Arc::new(SiteIndex::new(vec![(SITE, 0)]));
        let (counters, mut recs, store) =
            recorders(index, 1, 100, Storage::Memory, Arc::new(Vec::new()));
        recs[0].frames_by_breakpoints();
        recs[0].record_values(None, true);
        let kind = WatchKind {
            direct: true,
            returns: true,
        };
        let mut b = Breakpoints {
            sites: [SITE].into(),
            kind,
            handlers: recs,
            frames: Frames::default(),
            restep: HashMap::new(),
            other_stops: 0,
            steps: 0,
            journal: None,
            skips: HashMap::new(),
            released: Vec::new(),
            event_sites_released: 0,
            reload: None,
            guard: None,
            guarded: Default::default(),
            taken_over: 0,
            taken_back: 0,
            statics: None,
            kept: 0,
            hooks: None,
            moved: HashMap::new(),
            unfollowed: None,
            stacks: None,
        };
        let ops = Ops::default();
        let hit =
            |b: &mut Breakpoints, rip, rsp, rax| b.handle(0, &snap(rip, rsp, rax), &mem, &ops);
        assert_eq!(hit(&mut b, SITE, RSP, 0).unwrap(), Next::Step(SITE));
        assert_eq!(*ops.0.borrow(), [('Z', RET)]);
        assert_eq!(b.frames().live(), 1);
        // Another path through RET (RSP elsewhere): stepped, not recorded.
        assert_eq!(hit(&mut b, RET, RSP + 0x100, 7).unwrap(), Next::Step(RET));
        assert_eq!(b.frames().unmatched, 1);
        // The return.
        assert_eq!(hit(&mut b, RET, RSP + 8, 42).unwrap(), Next::Resume(None));
        assert_eq!(*ops.0.borrow(), [('Z', RET), ('z', RET)]);
        // The breakpoint gone: a stop there is no one's.
        assert_eq!(hit(&mut b, RET, RSP + 8, 0).unwrap(), Next::Resume(None));
        assert_eq!(b.other_stops, 1);
        // A step cut short at the site: stepped again, not recorded.
        b.restep.insert(0, SITE);
        assert_eq!(hit(&mut b, SITE, RSP, 0).unwrap(), Next::Step(SITE));
        assert_eq!(counters.counts[0][0].load(Ordering::Relaxed), 1);
        assert_eq!(counters.returns[0][0].load(Ordering::Relaxed), 1);
        // An ftrace site: its NOP skipped as the VM resumes.
        b.kind.direct = false;
        let next = hit(&mut b, SITE, RSP, 0).unwrap();
        assert_eq!(next, Next::Resume(Some(SITE + 5)));
        b.finish();
        let Stored::Memory(events) = store.thread.join().unwrap() else {
            panic!("kept in memory")
        };
        let ret = events.iter().find(|e| e.slot & RETURN_BIT != 0).unwrap();
        assert_eq!(
            (ret.slot, ret.parent, ret.data),
            (RSP | RETURN_BIT, RET, 42)
        );
        let entries: Vec<u64> = events
            .iter()
            .filter(|e| e.slot & RETURN_BIT == 0)
            .map(|e| e.slot)
            .collect();
        assert_eq!(entries, [RSP, RSP]);
    }

    /// A trap at an event's `tp->funcs` test moves the vCPU past its `je`,
    /// giving the register vmtrace's pointer only when it is NULL (no
    /// probe of the guest's); no recorder sees it.
    #[test]
    fn a_funcs_test_is_passed_and_nothing_recorded() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let test = SITE + 0x40;
        let skip = FuncsSkip {
            test,
            after_je: test + 5,
            reg: "rax".into(),
            value: 0xffff_ffff_82e3_2f40,
        };
        let mut b = Breakpoints {
            sites: [SITE].into(),
            kind: WatchKind {
                direct: false,
                returns: false,
            },
            handlers: Vec::new(),
            frames: Frames::default(),
            restep: HashMap::new(),
            other_stops: 0,
            steps: 0,
            journal: None,
            skips: [(test, skip)].into(),
            released: Vec::new(),
            event_sites_released: 0,
            reload: None,
            guard: None,
            guarded: Default::default(),
            taken_over: 0,
            taken_back: 0,
            statics: None,
            kept: 0,
            hooks: None,
            moved: HashMap::new(),
            unfollowed: None,
            stacks: None,
        };
        let ops = Ops::default();
        let next = b.handle(0, &snap(test, RSP, 0), &mem, &ops).unwrap();
        assert_eq!(next, Next::Resume(Some(test + 5)));
        assert_eq!(*ops.0.borrow(), [('P', 0xffff_ffff_82e3_2f40)]);
        // A probe's array (not NULL) is left to the guest.
        let next = b.handle(0, &snap(test, RSP, 0x1000), &mem, &ops).unwrap();
        assert_eq!(next, Next::Resume(Some(test + 5)));
        assert_eq!(ops.0.borrow().len(), 1);
        assert_eq!(b.other_stops, 0);
        // The guest's first probe on the event: its static call update
        // (tramp in RSI, func in RDX) is kept on the iterator, the vCPU
        // stepped; an update to the iterator, or of another static call,
        // is left as it is.
        const UPDATE: u64 = 0xffff_ffff_8120_0000;
        const TRAMP: u64 = 0xffff_ffff_8100_1000;
        const ITER: u64 = 0xffff_ffff_8110_0040;
        const PROBE: u64 = 0xffff_ffff_8130_0080;
        b.statics = Some(super::super::static_guard::StaticGuard {
            at: UPDATE,
            iterators: [(TRAMP, ITER)].into(),
        });
        for (tramp, func) in [(TRAMP, PROBE), (TRAMP, ITER), (TRAMP + 8, PROBE)] {
            let mut s = snap(UPDATE, RSP, 0);
            (s.regs.rsi, s.regs.rdx) = (tramp, func);
            assert_eq!(b.handle(0, &s, &mem, &ops).unwrap(), Next::Step(UPDATE));
        }
        assert_eq!(ops.0.borrow()[1..], [('P', ITER)]);
        assert_eq!((b.kept, b.other_stops), (1, 0));
    }
}
