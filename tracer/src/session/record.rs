//! Recording function entries on the trap path.
//!
//! Each vCPU thread owns a `Recorder`: it finds the site from RIP, counts the
//! call in its own counters, reads the caller from [RSP] through the trap's
//! own address space, and appends an event to its own buffer; full buffers go to the
//! collector thread over a channel. Nothing on this path takes a lock.
//! Counts are always exact; events beyond `--max-events` are counted as
//! dropped, never lost silently.
//!
//! With the function graph (`GraphHook`), an entry also hooks the return:
//! the return address at [RSP] becomes vmtrace's return trap (kept in the
//! shared `ShadowStacks`), and the return trap records the return and
//! resumes the guest at the real return address.

mod child_exits;
pub mod event_fields;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};
use vmm::{Trap, TrapError, TrapHandler};

use crate::kernel::module_notify::Notified;
use crate::kernel::symbols::Symbol;
use crate::kernel::unwind::{EntryRegs, NoFixup, ReturnFixup};
use crate::session::args::ArgSource;
use crate::session::event_keys::TestTraps;
use crate::session::module_traps::ModuleTraps;
use crate::session::shadow::ShadowStacks;
use crate::session::stacks::{SpaceMemory, StackSource};
use crate::session::store::{self, Storage};
use crate::session::tasks::{Seen, TaskCache, TaskSource};
use crate::trace::model::{Event, RETURN_BIT};

// What the recorders share with the store and the exitless drainer, in
// modules of their own so that the store needs nothing from here; named
// here too, where the recorders' callers look for them.
pub use crate::plan::site_index::{SiteIndex, OUT_LEN};
pub use crate::session::counters::{Counters, BATCH};

/// Trap mode's return hooks: the guest address of the return trap (an
/// `out` to the trace port in vmtrace's code page) and the frames hooked.
#[derive(Debug)]
pub struct GraphHook {
    pub trap_va: u64,
    pub shadow: ShadowStacks,
}

impl ReturnFixup for GraphHook {
    /// A slot holding the return trap: the hooked frame's real return.
    fn real(&self, slot: u64, value: u64) -> u64 {
        if value != self.trap_va {
            return value;
        }
        self.shadow.real_below(slot, self.trap_va).unwrap_or(value)
    }
}

/// An entry whose return a debugger's breakpoint is to catch (the
/// function graph under a gdbstub, where nothing is written: `hook` would
/// write): the site, the return address's slot (RSP at the entry), the
/// return address, the call's task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entered {
    pub site: u32,
    pub slot: u64,
    pub ret: u64,
    pub task: u32,
}

/// One vCPU's trap handler.
pub struct Recorder {
    cpu: u32,
    index: Arc<SiteIndex>,
    counters: Arc<Counters>,
    buf: Vec<Event>,
    /// Events this recorder may still store without touching `budget`.
    reserved: usize,
    tx: Sender<Vec<Event>>,
    /// Emptied batches the store hands back, reused before allocating.
    free: Receiver<Vec<Event>>,
    graph: Option<Arc<GraphHook>>,
    /// The guest's tasks, when its kernel's layout is known; with this
    /// recorder's own cache of the ids it has seen.
    tasks: Option<(Arc<TaskSource>, TaskCache)>,
    /// `--args`: where entries' arguments go, and which sites record them.
    args: Option<ArgSource>,
    /// `-e`: the events' fields, read at their entries.
    fields: Option<event_fields::FieldSource>,
    /// `--retval`: returns carry RAX.
    retval: bool,
    /// `--stack`: which calls unwind their kernel stack, and how.
    stacks: Option<Arc<StackSource>>,
    /// Returns caught by the caller's breakpoints (`Entered`), not hooked.
    frames: bool,
    /// The last entry whose return is to be caught, for the caller.
    entered: Option<Entered>,
    /// `-e` on the own VMM: the events' `tp->funcs` tests, passed.
    event_tests: Option<Arc<TestTraps>>,
    /// The own VMM's traps in the module loader, and the module coming
    /// or going at this trap (handled in `on_world`).
    modules: Option<Arc<ModuleTraps>>,
    module_now: Option<Notified>,
    /// Syscall exits: the children's of the forking syscalls, at
    /// `ret_from_fork` (`child_exits`).
    child_exits: Option<Arc<crate::plan::syscall_events::ChildExitSites>>,
}

impl Recorder {
    /// Record entries' arguments (at the sites `args` selects), and
    /// (`retval`) returns' values.
    pub fn record_values(&mut self, args: Option<ArgSource>, retval: bool) {
        self.args = args;
        self.retval = retval;
    }

    /// Read the traced events' fields at their entries (`-e`).
    pub fn record_fields(&mut self, fields: Option<event_fields::FieldSource>) {
        self.fields = fields;
    }

    /// Follow the modules the guest loads and unloads (`module_traps`).
    pub fn follow_modules(&mut self, traps: Arc<ModuleTraps>) {
        self.modules = Some(traps);
    }

    /// Pass the events' `tp->funcs` tests that trap (`event_keys`).
    pub fn pass_event_tests(&mut self, tests: Arc<TestTraps>) {
        self.event_tests = Some(tests);
    }

    /// Unwind the kernel stack of the calls `source` selects.
    pub fn record_stacks(&mut self, source: Arc<StackSource>) {
        self.stacks = Some(source);
    }

    /// The id of the kernel stack of a call at site `i` (`Event::stack`),
    /// unwound from the trap's registers; 0 if the site records none.
    fn stack_of(&self, i: usize, trap: &mut Trap<'_>) -> u32 {
        let Some(src) = self.stacks.as_ref().filter(|s| s.at(i)) else {
            return 0;
        };
        let regs = EntryRegs {
            ip: self.index.running_addr(i),
            sp: trap.rsp,
            bp: trap.rbp,
        };
        // Hooked returns (this call's own among them) read as the real ones.
        let fixup: &dyn ReturnFixup = match self.graph.as_deref() {
            Some(graph) => graph,
            None => &NoFixup,
        };
        src.record(regs, &mut SpaceMemory(trap.space()), fixup)
    }

    /// Name each event's task (the guest's current task at the trap).
    pub fn record_tasks(&mut self, source: Arc<TaskSource>) {
        self.tasks = Some((source, TaskCache::default()));
    }

    /// The id of the task the trapped vCPU runs (`Event::task`: 0 if
    /// tasks are not recorded or it cannot be read), and whether the task
    /// filter keeps the call.
    fn task_of(&mut self, trap: &mut Trap<'_>) -> Seen {
        if self.tasks.is_none() {
            return (0, true);
        }
        // A task is added to the table only if an event may be stored.
        if self.reserved == 0 {
            self.reserve();
        }
        let store = self.reserved > 0;
        let Some((source, cache)) = self.tasks.as_mut() else {
            return (0, true);
        };
        let gs_base = trap.gs_base;
        let space = trap.space();
        source
            .current(space, gs_base)
            .and_then(|task| source.key(space, task))
            .map_or_else(
                || source.unreadable(),
                |key| source.id(cache, space, key, store),
            )
    }

    fn reserve(&mut self) {
        self.reserved = self.counters.reserve(BATCH);
    }

    /// Where batches of events go: the collector, which ends once every
    /// sender (each recorder's, and any other producer's) is gone.
    pub fn sink(&self) -> Sender<Vec<Event>> {
        self.tx.clone()
    }

    /// Hook returns too (trap-mode function graph).
    pub fn hook_returns(&mut self, graph: Arc<GraphHook>) {
        self.graph = Some(graph);
    }

    /// The function graph with nothing written: each entry's frame is
    /// left for the caller (`take_entered`), who catches its return and
    /// gives it back (`on_frame_return`).
    pub fn frames_by_breakpoints(&mut self) {
        self.frames = true;
    }

    /// The frame of the last entry handled, if its return is to be caught.
    pub fn take_entered(&mut self) -> Option<Entered> {
        self.entered.take()
    }

    /// The caller could not follow the return of the last entry (its
    /// frames were full): counted as a return not hooked.
    pub fn not_followed(&self) {
        self.counters.unhooked.fetch_add(1, Ordering::Relaxed);
    }

    /// The return of frame `f` (`take_entered`) was caught, RAX `rax`.
    pub fn on_frame_return(&mut self, f: &Entered, rax: u64) {
        let ts_ns = Trap::now_ns();
        let site = f.site as usize;
        let c = &self.counters.returns[self.cpu as usize][site];
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        if !self.take_budget() {
            self.counters.over_budget(true);
            return;
        }
        self.push(Event {
            ts_ns,
            parent: f.ret,
            slot: f.slot | RETURN_BIT,
            func: self.index.func(site),
            cpu: self.cpu,
            task: f.task,
            stack: 0,
            data: if self.retval { rax } else { 0 },
        });
    }

    /// Takes one event from the budget; false if none is left.
    fn take_budget(&mut self) -> bool {
        if self.reserved == 0 {
            self.reserve();
            if self.reserved == 0 {
                return false;
            }
        }
        self.reserved -= 1;
        true
    }

    fn push(&mut self, e: Event) {
        self.buf.push(e);
        if self.buf.len() >= BATCH {
            self.flush();
        }
    }

    /// A return trap: the hooked function at the slot below RSP returned.
    /// Resume at its real return address and record the return.
    fn on_return(&mut self, graph: &GraphHook, trap: &mut Trap<'_>) -> Result<(), TrapError> {
        let ts_ns = Trap::now_ns();
        // `ret` popped the hooked return address: the slot is just below RSP.
        let slot = trap.rsp.wrapping_sub(8);
        let Some(f) = graph.shadow.pop(slot) else {
            return Err(TrapError::UnknownReturn {
                cpu: trap.cpu,
                slot,
            });
        };
        // A tail callee returns into its caller's hook: the return trap
        // runs again at once, for the caller's frame at the same slot.
        trap.set_rip(f.ret);
        let site = f.site as usize;
        let c = &self.counters.returns[self.cpu as usize][site];
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        if !self.take_budget() {
            self.counters.over_budget(true);
            return Ok(());
        }
        let parent = if f.ret == graph.trap_va {
            graph
                .shadow
                .real_below(slot, graph.trap_va)
                .unwrap_or(f.ret)
        } else {
            f.ret
        };
        self.push(Event {
            ts_ns,
            parent,
            slot: slot | RETURN_BIT,
            func: self.index.func(site),
            cpu: self.cpu,
            // The call's task, kept in its frame: a call returns in the
            // task that made it.
            task: f.task,
            stack: 0,
            data: if self.retval { trap.rax } else { 0 },
        });
        Ok(())
    }

    /// Replace the return address at `slot` (read as `ret`) with the return
    /// trap; returns the real return address, or None if not hooked.
    fn hook(
        &self,
        graph: &GraphHook,
        trap: &mut Trap<'_>,
        slot: u64,
        ret: u64,
        site: usize,
        task: u32,
    ) -> Option<u64> {
        if ret != graph.trap_va
            && trap
                .space()
                .write(slot, &graph.trap_va.to_le_bytes())
                .is_err()
        {
            self.counters.unhooked.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(
            graph
                .shadow
                .push(slot, ret, site as u32, task, graph.trap_va),
        )
    }
}

impl Recorder {
    /// The caller at [RSP] of a call at site `i` by `task`, with the
    /// function graph its return followed: (parent, the return address's
    /// slot, 0 if its return is not followed); None if unreadable.
    fn caller(&mut self, trap: &mut Trap<'_>, i: usize, task: u32) -> Option<(u64, u64)> {
        // Through the trap's own view: the guest may have remapped the stack
        // page since the last trap (a freed and reused vmalloc stack).
        let rsp = trap.rsp;
        let read = trap.space().read_u64(rsp).ok();
        // Hooked whether or not the entry is stored: returns count exactly.
        match (read, self.graph.as_ref()) {
            (Some(ret), Some(graph)) => match self.hook(graph, trap, rsp, ret, i, task) {
                Some(real) => Some((real, rsp)),
                None => Some((ret, 0)),
            },
            (Some(ret), None) if self.frames => {
                self.entered = Some(Entered {
                    site: i as u32,
                    slot: rsp,
                    ret,
                    task,
                });
                Some((ret, rsp))
            }
            (Some(ret), None) => Some((ret, 0)),
            (None, graph) => {
                if graph.is_some() || self.frames {
                    self.counters.unhooked.fetch_add(1, Ordering::Relaxed);
                }
                None
            }
        }
    }
}

impl Recorder {
    /// A trap that is no traced call (or not only one): at a module
    /// trap (`module_traps`: a traced function's call there is recorded
    /// too), an event's test (`event_keys`), the graph's return trap.
    /// None: a call at `site`, to record.
    fn not_a_call(
        &mut self,
        trap: &mut Trap<'_>,
        site: Option<usize>,
    ) -> Option<Result<(), TrapError>> {
        let slide = self.index.slide();
        // A module trap's site may be a traced function's too: then the
        // call is recorded as well.
        if let Some((resume, what)) = self.modules.as_ref().and_then(|m| m.at_trap(trap, slide)) {
            if what.is_some() {
                self.module_now = what;
                trap.stop_world();
            }
            if site.is_none() {
                trap.set_rip(resume);
                return Some(Ok(()));
            }
        }
        if site.is_none()
            && self
                .event_tests
                .as_ref()
                .is_some_and(|t| t.pass(trap, slide))
        {
            return Some(Ok(()));
        }
        if site.is_none()
            && self
                .graph
                .as_ref()
                .is_some_and(|g| trap_at(g.trap_va, trap.rip))
        {
            // Taken out for the call (on_return needs `self`), then put back.
            let graph = self.graph.take().expect("checked above");
            let r = self.on_return(&graph, trap);
            self.graph = Some(graph);
            return Some(r);
        }
        None
    }
}

impl TrapHandler for Recorder {
    fn on_trap(&mut self, trap: &mut Trap<'_>) -> Result<(), TrapError> {
        self.entered = None;
        let site = self.index.find(trap.rip);
        if let Some(handled) = self.not_a_call(trap, site) {
            return handled;
        }
        let ts_ns = Trap::now_ns();
        let Some(i) = site else {
            return Err(TrapError::UnknownSite {
                cpu: trap.cpu,
                rip: trap.rip,
            });
        };
        trap.set_rip(self.index.resume_addr(i));
        if self.at_child_start(i, trap) {
            return Ok(());
        }
        // The task first: a call the task filter rejects is counted only
        // as rejected (not a call of the function, its return not hooked).
        let (task, kept) = self.task_of(trap);
        if !kept {
            self.counters.filtered.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        let c = &self.counters.counts[self.cpu as usize][i];
        // Single writer: a plain load and store, no locked instruction.
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        let read = self.caller(trap, i, task);
        let (parent, slot) = read.unwrap_or((0, 0));
        if !self.take_budget() {
            self.counters.over_budget(false);
            return Ok(());
        }
        if read.is_none() {
            self.counters
                .parent_unreadable
                .fetch_add(1, Ordering::Relaxed);
        }
        // An event's fields (a lookup by site for the others).
        let fields = match &self.fields {
            Some(f) => {
                let regs = trap.args;
                f.read(i, &regs, trap.space())
            }
            None => None,
        };
        let data = self
            .args
            .as_ref()
            .map_or(0, |a| a.push_with_fields(i, trap.args, fields));
        let stack = self.stack_of(i, trap);
        self.push(Event {
            ts_ns,
            parent,
            slot,
            func: self.index.func(i),
            cpu: self.cpu,
            task,
            stack,
            data,
        });
        Ok(())
    }

    /// A module coming or going (`on_trap` asked), every other vCPU paused.
    fn on_world(&mut self, trap: &mut Trap<'_>) -> Result<(), TrapError> {
        if let (Some(m), Some(what)) = (self.modules.as_ref(), self.module_now.take()) {
            m.handle(trap, what);
        }
        Ok(())
    }

    fn flush(&mut self) {
        if !self.buf.is_empty() {
            let next = self
                .free
                .try_recv()
                .unwrap_or_else(|_| Vec::with_capacity(BATCH));
            let batch = std::mem::replace(&mut self.buf, next);
            // Never wait for the disk with the vCPU stopped: a full queue
            // (the writer is behind) loses the batch, counted.
            if let Err(e) = self.tx.try_send(batch) {
                self.counters.lose(&e.into_inner());
            }
        }
    }
}

/// Is RIP at the return trap: at its `out` or just past it (see
/// `SiteIndex::find`)?
fn trap_at(trap_va: u64, rip: u64) -> bool {
    rip == trap_va || rip == trap_va + OUT_LEN
}

/// Build the recorders (one per vCPU) and the store thread they feed
/// (`crate::session::store`).
pub fn recorders(
    index: Arc<SiteIndex>,
    ncpus: usize,
    max_events: u64,
    storage: Storage,
    functions: Arc<Vec<Symbol>>,
) -> (Arc<Counters>, Vec<Recorder>, store::Store) {
    // Room for the sites a module first loaded during the trace adds.
    let nsites = index.capacity();
    let counters = Arc::new(Counters::new(ncpus, nsites, max_events));
    let fixup = store::Fixup {
        index: Arc::clone(&index),
        functions,
    };
    let (tx, store) = store::spawn(storage, Arc::clone(&counters), fixup);
    let recs = (0..ncpus)
        .map(|cpu| Recorder {
            cpu: cpu as u32,
            index: Arc::clone(&index),
            counters: Arc::clone(&counters),
            buf: Vec::with_capacity(BATCH),
            reserved: 0,
            tx: tx.clone(),
            free: store.free.clone(),
            graph: None,
            tasks: None,
            args: None,
            fields: None,
            retval: false,
            stacks: None,
            frames: false,
            entered: None,
            event_tests: None,
            modules: None,
            module_now: None,
            child_exits: None,
        })
        .collect();
    (counters, recs, store)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_accepts_rip_at_and_past_the_out() {
        let idx = SiteIndex::new(vec![(0x1000, 0), (0x2000, 1), (0x1000, 0)]);
        assert_eq!(idx.addrs, vec![0x1000, 0x2000]);
        assert_eq!(idx.find(0x1000), Some(0));
        assert_eq!(idx.find(0x1002), Some(0));
        assert_eq!(idx.find(0x2002), Some(1));
        assert_eq!(idx.find(0x1001), None);
        assert_eq!(idx.find(0x1005), None);
    }

    #[test]
    fn a_stack_page_remapped_between_two_traps_gives_the_new_caller() {
        use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 64 << 20)]).unwrap();
        vmm::boot::regs::setup_page_tables(&mem).unwrap();
        let site = 0xffff_ffff_8100_0000u64;
        // The stack slot, in the 2 MiB kernel-map page at physical 20 MiB.
        let rsp = 0xffff_ffff_8140_0ff8u64;
        let (old_page, new_page) = (0x140_0000u64, 0x200_0000u64);
        mem.write_obj(0xaaaa_u64, GuestAddress(old_page + 0xff8))
            .unwrap();
        mem.write_obj(0xbbbb_u64, GuestAddress(new_page + 0xff8))
            .unwrap();
        let index = Arc::new(SiteIndex::new(vec![(site, 0)]));
        let (_counters, mut recs, store) =
            recorders(index, 1, 100, Storage::Memory, Arc::new(Vec::new()));
        let cr3 = vmm::layout::PML4_START;
        let mode = vmm::gva::PagingMode::Level4;
        let mut trap = Trap::for_bench(0, site, rsp, cr3, mode, &mem);
        recs[0].on_trap(&mut trap).unwrap();
        // The guest runs and maps that virtual page elsewhere (no pause, no
        // flush in between: exactly what happens between two traps).
        let pde = vmm::layout::PD_START + (old_page >> 21) * 8;
        let flags = mem.read_obj::<u64>(GuestAddress(pde)).unwrap() & 0xfff;
        mem.write_obj(new_page | flags, GuestAddress(pde)).unwrap();
        let mut trap = Trap::for_bench(0, site, rsp, cr3, mode, &mem);
        recs[0].on_trap(&mut trap).unwrap();
        recs[0].flush();
        drop(recs);
        let store::Stored::Memory(events) = store.thread.join().unwrap() else {
            panic!("kept in memory")
        };
        let parents: Vec<u64> = events.iter().map(|e| e.parent).collect();
        assert_eq!(parents, [0xaaaa, 0xbbbb]);
    }

    /// A module first loaded during the trace: its site, added to a slot
    /// reserved at the plan, traps as the plan's do and records its own
    /// function (numbered after the plan's), counted at its own site.
    #[test]
    fn a_site_added_during_the_trace_records_its_own_function() {
        use vm_memory::{GuestAddress, GuestMemoryMmap};
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 64 << 20)]).unwrap();
        vmm::boot::regs::setup_page_tables(&mem).unwrap();
        let (planned, added) = (0xffff_ffff_8100_0000u64, 0xffff_ffff_8120_0000u64);
        let rsp = 0xffff_ffff_8140_0ff8u64;
        let index = Arc::new(SiteIndex::new(vec![(planned, 0)]).with_added(4, 1));
        let (counters, mut recs, store) = recorders(
            Arc::clone(&index),
            1,
            100,
            Storage::Memory,
            Arc::new(Vec::new()),
        );
        let function = Symbol {
            name: "vmt_hit [vmt_test]".into(),
            addr: added - 4,
            size: 0x40,
        };
        assert_eq!(index.added().add(added, function), Some(0));
        let (cr3, mode) = (vmm::layout::PML4_START, vmm::gva::PagingMode::Level4);
        let past_out = added + crate::plan::site_index::OUT_LEN;
        for rip in [planned, added, past_out] {
            let mut trap = Trap::for_bench(0, rip, rsp, cr3, mode, &mem);
            recs[0].on_trap(&mut trap).unwrap();
        }
        recs[0].flush();
        drop(recs);
        let store::Stored::Memory(events) = store.thread.join().unwrap() else {
            panic!("kept in memory")
        };
        let funcs: Vec<u32> = events.iter().map(|e| e.func).collect();
        assert_eq!(funcs, [0, 1, 1]);
        let counted = |site: usize| counters.counts[0][site].load(Ordering::Relaxed);
        assert_eq!((counted(0), counted(1)), (1, 2));
    }
}
