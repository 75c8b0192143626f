//! The kernel stacks of `--stack` calls, shared by the trap recorders that
//! unwind them and the store that saves them. An entry names its stack by
//! a small id (1-based: `Event::stack`, 0 = none); equal stacks share one
//! id (a timer interrupt's stack repeats thousands of times), and the table
//! only grows, so the store can save the stacks added since it last looked
//! before the events that name them (as it does tasks, `session::tasks`).

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Mutex, OnceLock, RwLock};

use vmm::gva::AddressSpace;

use crate::kernel::filter::Globs;
use crate::kernel::module_orc::ModuleOrc;
use crate::kernel::symbols::KernelImage;
use crate::kernel::unwind::orc_table::{ModuleTable, OrcLayout};
use crate::kernel::unwind::{EntryRegs, ReturnFixup, StackMemory, UnwindCtx, Unwinder};
use crate::trace::model::Stack;

/// Every distinct stack seen, in first-seen order.
#[derive(Debug, Default)]
pub struct StackTable {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    stacks: Vec<Stack>,
    ids: HashMap<Stack, u32>,
}

impl StackTable {
    pub fn new() -> StackTable {
        StackTable::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The id of `stack` (`Event::stack`), added if new.
    pub fn intern(&self, stack: Stack) -> u32 {
        let mut inner = self.lock();
        if let Some(&id) = inner.ids.get(&stack) {
            return id;
        }
        inner.stacks.push(stack.clone());
        let id = u32::try_from(inner.stacks.len()).unwrap_or(u32::MAX);
        inner.ids.insert(stack, id);
        id
    }

    /// How many stacks the table holds.
    pub fn len(&self) -> usize {
        self.lock().stacks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The stacks from index `from` on (ids `from + 1`...).
    pub fn since(&self, from: usize) -> Vec<Stack> {
        self.lock().stacks.get(from..).unwrap_or_default().to_vec()
    }

    /// Every stack, in id order (`Trace::stacks`).
    pub fn all(&self) -> Vec<Stack> {
        self.since(0)
    }
}

/// A trap's address space as the unwinder reads it.
pub struct SpaceMemory<'s, 'a>(pub &'s mut AddressSpace<'a>);

impl StackMemory for SpaceMemory<'_, '_> {
    fn read_u64(&mut self, va: u64) -> Option<u64> {
        self.0.read_u64(va).ok()
    }
}

/// How a session unwinds the stacks of `--stack` calls: the kernel's
/// unwinder, its text, which sites unwind, the table every recorder
/// interns into, and the KASLR slide (known at the first attach).
#[derive(Debug)]
pub struct StackSource {
    unwinder: Unwinder,
    /// Kernel text at link addresses (`UnwindCtx::text`).
    text: Vec<(u64, u64)>,
    /// Per site (`SiteIndex` order): does a call there record its stack.
    sites: Vec<bool>,
    pub table: std::sync::Arc<StackTable>,
    slide: OnceLock<i64>,
    /// Modules loaded again at a new address during the trace: their text
    /// now (running addresses), and where it ran at the attach, which the
    /// unwinder's ORC entries and `text` are of.
    moved: RwLock<Vec<(Range<u64>, u64)>>,
    /// The `--stack` globs, for functions added during the trace.
    globs: Option<Globs>,
    /// Modules first loaded during the trace (`qemu::module_added`).
    added: RwLock<Added>,
}

/// What `--stack` knows of the modules first loaded during the trace.
#[derive(Debug, Default)]
struct Added {
    /// Per spare slot (`plan::added_sites`, site `sites.len() + k`): does
    /// a call there record its stack.
    stacks: Vec<bool>,
    /// Each module loaded now: its text and ORC entries, read at its load.
    tables: Vec<ModuleTable>,
}

/// A return address in a module's text moved since the attach, seen at
/// the attach's address (the same code there: `qemu::module_hooks` traces
/// a reloaded module only as the attach found it); any other as `inner`
/// has it.
struct Moved<'a> {
    inner: &'a dyn ReturnFixup,
    moved: &'a [(Range<u64>, u64)],
}

impl Moved<'_> {
    fn at_attach(&self, ip: u64) -> u64 {
        match self.moved.iter().find(|(now, _)| now.contains(&ip)) {
            Some((now, then)) => ip - now.start + then,
            None => ip,
        }
    }
}

impl ReturnFixup for Moved<'_> {
    fn real(&self, slot: u64, value: u64) -> u64 {
        self.at_attach(self.inner.real(slot, value))
    }
}

impl StackSource {
    pub fn new(
        unwinder: Unwinder,
        image: &KernelImage,
        sites: Vec<bool>,
        table: std::sync::Arc<StackTable>,
    ) -> StackSource {
        StackSource::with_globs(unwinder, image, sites, table, None)
    }

    /// `new`, with the `--stack` globs that judge the functions of the
    /// modules first loaded during the trace (`set_added`).
    pub fn with_globs(
        unwinder: Unwinder,
        image: &KernelImage,
        sites: Vec<bool>,
        table: std::sync::Arc<StackTable>,
        globs: Option<Globs>,
    ) -> StackSource {
        let modules = image.modules.iter().map(|m| {
            let link = |a: u64| a.wrapping_sub(m.virt as u64);
            (link(m.text.start), link(m.text.end))
        });
        let text = [image.text, image.init_text]
            .into_iter()
            .flatten()
            .chain(modules)
            .collect();
        StackSource {
            unwinder,
            text,
            sites,
            table,
            slide: OnceLock::new(),
            moved: RwLock::new(Vec::new()),
            globs,
            added: RwLock::new(Added::default()),
        }
    }

    /// The modules first loaded during the trace, now: the functions
    /// given spare slots so far, slot by slot (`function [module]`), and
    /// each loaded module's text and ORC entries (running addresses),
    /// read at its load (`qemu::module_added::FirstLoads::loaded_orc`).
    pub fn set_added(&self, functions: &[String], modules: &[(Range<u64>, &ModuleOrc)]) {
        let slide = self.slide.get().copied().unwrap_or(0) as u64;
        let layout = match &self.unwinder {
            Unwinder::Orc(t) => t.layout(),
            // (Frame pointers need only the text.)
            Unwinder::FramePointer => OrcLayout::New,
        };
        let stacks = functions
            .iter()
            .map(|f| {
                // By `function [module]` or the bare name, as at the attach.
                let bare = f.split_once(" [").map_or(f.as_str(), |(b, _)| b);
                let names = [f.as_str(), bare];
                self.globs.as_ref().is_some_and(|g| g.is_match_any(&names))
            })
            .collect();
        let tables = modules
            .iter()
            .map(|(text, orc)| {
                let link = |a: u64| a.wrapping_sub(slide);
                let entries = orc.iter().map(|&(ip, raw)| (link(ip), raw));
                ModuleTable::new((link(text.start), link(text.end)), layout, entries)
            })
            .collect();
        *self.added.write().unwrap_or_else(|e| e.into_inner()) = Added { stacks, tables };
    }

    /// The modules loaded again at new addresses, now: each one's text
    /// (running addresses) and its start at the attach
    /// (`qemu::module_hooks::ModuleHooks::moved`).
    pub fn set_moved(&self, moved: Vec<(Range<u64>, u64)>) {
        *self.moved.write().unwrap_or_else(|e| e.into_inner()) = moved;
    }

    /// The kernel's KASLR slide, once the first attach has found it.
    pub fn set_slide(&self, slide: i64) {
        let _ = self.slide.set(slide);
    }

    /// The plan's sites: a spare slot k is site `planned() + k`.
    pub fn planned(&self) -> usize {
        self.sites.len()
    }

    /// The spare slots whose calls record their stacks (`set_added`),
    /// ascending.
    pub fn added_stacked(&self) -> Vec<usize> {
        let added = self.added.read().unwrap_or_else(|e| e.into_inner());
        let stacked = added.stacks.iter().enumerate().filter(|(_, &s)| s);
        stacked.map(|(k, _)| k).collect()
    }

    /// Does a call at site `i` record its stack.
    pub fn at(&self, i: usize) -> bool {
        match self.sites.get(i) {
            Some(&at) => at,
            // A spare slot's: a function of a module first loaded.
            None => {
                let added = self.added.read().unwrap_or_else(|e| e.into_inner());
                let k = i - self.sites.len();
                added.stacks.get(k).copied().unwrap_or(false)
            }
        }
    }

    /// Unwinds from `regs` through `mem` and interns the stack: its id.
    pub fn record(
        &self,
        regs: EntryRegs,
        mem: &mut dyn StackMemory,
        fixup: &dyn ReturnFixup,
    ) -> u32 {
        let moved = self.moved.read().unwrap_or_else(|e| e.into_inner());
        let fixup = Moved {
            inner: fixup,
            moved: &moved,
        };
        let regs = EntryRegs {
            ip: fixup.at_attach(regs.ip),
            ..regs
        };
        let added = self.added.read().unwrap_or_else(|e| e.into_inner());
        let ctx = UnwindCtx {
            slide: self.slide.get().copied().unwrap_or(0),
            text: &self.text,
            fixup: &fixup,
            modules: &added.tables,
        };
        self.table.intern(self.unwinder.unwind(regs, mem, &ctx))
    }
}

impl super::Tracer {
    /// How `--stack` calls unwind (None: no stacks recorded): what the
    /// module hooks tell of a traced module loaded again elsewhere.
    pub fn stack_source(&self) -> Option<&std::sync::Arc<StackSource>> {
        self.stacks.as_ref()
    }
}
