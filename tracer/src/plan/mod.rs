//! What to trace, resolved against the kernel image before the guest
//! runs: the selected functions and their sites, checked once; and the
//! function list `vmtrace list` prints (which functions a plan could hook).

pub mod added_sites;
pub mod args;
pub mod attach_mode;
mod build;
pub mod entry;
pub mod events;
pub mod exitless;
pub mod hookable;
pub mod list;
mod module_events;
pub mod site_index;
pub mod stacks;
pub mod syscall_events;
pub mod tasks;
pub mod traps;

pub use build::{graph_names, ModeChoice, Note, PlanError, Request, TracePlan};

use std::path::Path;
use std::sync::Arc;

use crate::error::TracerError;
use crate::kernel::boot_patched::BootPatched;
use crate::kernel::btf::KernelBtf;
use crate::kernel::events::fields::EventFormat;
use crate::kernel::filter::Filter;
use crate::kernel::module_btf::module_btf;
use crate::kernel::sites::SiteTable;
use crate::kernel::symbols::KernelImage;
use crate::plan::site_index::SiteIndex;

/// The kernel's flag that its ftrace_init has converted every site
/// (`ftrace_enabled`, set to 1 at the end of ftrace_init in kernel/trace/ftrace.c).
pub const FTRACE_ENABLED: &str = "ftrace_enabled";

/// How a traced call reaches vmtrace.
#[derive(Clone, Debug)]
pub enum Mode {
    /// Each call exits to vmtrace (`out` to the trace port).
    Trap,
    /// Each call runs vmtrace's trampoline in the guest and appends to a
    /// ring vmtrace drains: no exit. The code and rings, planned.
    Exitless(Box<exitless::ExitlessPlan>),
}

impl Mode {
    /// Exitless mode for `plan` on `cpus` CPUs, `ring_records` per ring
    /// (None: as many as fit): its code made now.
    pub fn exitless(
        plan: &Plan,
        cpus: usize,
        ring_records: Option<u64>,
    ) -> Result<Mode, exitless::error::ExitlessPlanError> {
        let sites = plan.index.addrs.len();
        let what = exitless::Records::of(plan);
        let code = exitless::ExitlessPlan::build(&plan.image, cpus, sites, ring_records, what)?;
        Ok(Mode::Exitless(Box::new(code)))
    }

    pub fn name(&self) -> &'static str {
        match self {
            Mode::Trap => "trap",
            Mode::Exitless(_) => "exitless",
        }
    }
}

/// What to trace, resolved against the vmlinux before the guest boots.
pub struct Plan {
    pub image: KernelImage,
    pub sites: SiteTable,
    /// Traced functions (indices into `image.functions`), in trace order.
    pub funcs: Vec<usize>,
    /// The sites to patch, each with its index into `funcs`: built once
    /// here, shared by the session and every vCPU's recorder.
    pub index: Arc<SiteIndex>,
    /// Selected sites in init text: never patched (the guest frees and
    /// reuses that memory), reported as skipped.
    pub skipped_init: usize,
    /// Address of the guest's `ftrace_enabled`: the guest converts its own
    /// sites at boot, and vmtrace must not write one before it has finished.
    pub ftrace_enabled: Option<u64>,
    /// Function graph: hook every traced call's return too.
    pub graph: bool,
    /// The guest's tasks: how to read them, and which to keep.
    pub tasks: tasks::TaskPlan,
    /// The kernel's BTF, parsed once (tasks and prototypes come from it);
    /// None when it has none (`tasks.note` says why).
    pub btf: Option<Arc<KernelBtf>>,
    /// Which values of traced calls to record.
    pub values: ValuePlan,
    /// With `values.args`: the traced functions whose calls record their
    /// arguments (indices into `funcs`, ascending: `--args=GLOB`); None:
    /// every traced function's.
    pub arg_funcs: Option<Vec<u32>>,
    /// Which calls record their kernel stack, and how (`--stack`).
    pub stacks: Option<stacks::StackPlan>,
    /// How the functions are entered: ftrace's sites, or direct entries.
    pub entry: entry::EntryKind,
    /// Direct entries: each site's displaced instructions (`entry`
    /// Direct), and the functions refused one.
    pub direct: Option<entry::DirectPlan>,
    /// The text the kernel rewrites itself (`boot_patched`), read at the
    /// first attach.
    pub boot_patched: std::sync::OnceLock<BootPatched>,
    /// The events traced (`-e`): their call sites to enable, their
    /// `__traceiter_NAME` among `funcs`.
    pub events: events::EventPlan,
    /// The modules the guest first loads during the trace
    /// (`reserve_added`); None: not followed.
    pub coming: Option<ComingModules>,
}

/// What following the modules first loaded during a trace needs.
#[derive(Clone, Debug)]
pub struct ComingModules {
    /// The selection as given (`:mod:` globs of modules not loaded then).
    pub selection: Filter,
    /// How to walk the guest's module list.
    pub layout: crate::kernel::modules::ModuleLayout,
    /// The kernel's physical KASLR offset (`vmtrace attach`'s; the own
    /// VMM finds it at the attach).
    pub phys: i64,
    /// The own VMM's traps in the kernel's module loader
    /// (`crate::session::module_traps`); None: `vmtrace attach`'s
    /// breakpoints follow the modules.
    pub notify: Option<crate::kernel::module_notify::ModuleNotify>,
    /// The `--args` globs (None: no `--args`): the functions added that
    /// match record their arguments (trap mode).
    pub args: Option<crate::kernel::filter::Globs>,
    /// The module files given on the host (`--modules DIR`): a module
    /// loaded takes from its file the symbols its kallsyms lacks and,
    /// without BTF, its prototypes.
    pub files: Option<std::sync::Arc<crate::kernel::module_files::ModuleFiles>>,
    /// What those files gave each module, said once a module (for the
    /// CLI, as the trace goes).
    pub said: crate::kernel::ko_file::FileUses,
}

/// Which values of traced calls a session records (`--args`, `--retval`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ValuePlan {
    /// Entries' argument registers (`Trace::args`): of every traced
    /// function, or of those `Plan::arg_funcs` selects.
    pub args: bool,
    /// Each return's RAX (function graph only).
    pub retval: bool,
}

impl ValuePlan {
    /// Either: the trace then has the traced functions' prototypes.
    pub fn any(self) -> bool {
        self.args || self.retval
    }
}

impl Plan {
    pub fn new(vmlinux: &Path, trace: &[String], notrace: &[String]) -> Result<Plan, TracerError> {
        Plan::from_image(KernelImage::load(vmlinux)?, trace, notrace)
    }

    /// The plan for an image loaded some other way (e.g. from a bzImage's
    /// payload, `crate::kernel::bzimage`).
    pub fn from_image(
        image: KernelImage,
        trace: &[String],
        notrace: &[String],
    ) -> Result<Plan, TracerError> {
        Plan::with_entry(image, trace, notrace, entry::EntryChoice::Ftrace)
    }

    /// `from_image`, entering the functions as `choice` says (`--entry`).
    pub fn with_entry(
        image: KernelImage,
        trace: &[String],
        notrace: &[String],
        choice: entry::EntryChoice,
    ) -> Result<Plan, TracerError> {
        Plan::selecting(image, Some((trace, notrace)), choice)
    }

    /// A plan that selects none of the kernel's functions: it traces the
    /// modules the guest loads during the trace only (`reserve_added`).
    pub fn for_modules(
        image: KernelImage,
        choice: entry::EntryChoice,
    ) -> Result<Plan, TracerError> {
        Plan::selecting(image, None, choice)
    }

    /// The plan of the functions `globs` (`--trace`, `--notrace`) select;
    /// None: none.
    fn selecting(
        image: KernelImage,
        globs: Option<(&[String], &[String])>,
        choice: entry::EntryChoice,
    ) -> Result<Plan, TracerError> {
        let entry = choice.resolve(&image);
        let (sites, direct) = match entry {
            entry::EntryKind::Ftrace => {
                if let Some(e) = image.missing_sites() {
                    return Err(e.into());
                }
                (SiteTable::build(&image)?, None)
            }
            entry::EntryKind::Direct => {
                let (direct, sites) = entry::DirectPlan::build(&image)?;
                (sites, Some(direct))
            }
        };
        let selected = match globs {
            None => Vec::new(),
            Some((trace, notrace)) => Filter::new(trace, notrace)?
                .select(&image, &sites)
                .map_err(|e| match &direct {
                    Some(d) => d.name_refusals(&image, e),
                    None => e,
                })?,
        };
        let mut funcs: Vec<usize> = Vec::new();
        let mut func_slot = std::collections::HashMap::new();
        let mut targets = Vec::new();
        let mut skipped_init = 0;
        for i in selected {
            let site = sites.sites[i];
            if site.init {
                skipped_init += 1;
                continue;
            }
            let slot = *func_slot.entry(site.func as usize).or_insert_with(|| {
                funcs.push(site.func as usize);
                funcs.len() as u32 - 1
            });
            targets.push((site.addr, slot));
        }
        let ftrace_enabled = image.symbol(FTRACE_ENABLED).map(|s| s.addr);
        let btf = KernelBtf::from_image(&image).map(Arc::new);
        let tasks = tasks::TaskPlan::find(&image, btf.as_deref());
        Ok(Plan {
            image,
            sites,
            funcs,
            index: Arc::new(SiteIndex::new(targets)),
            skipped_init,
            ftrace_enabled,
            graph: false,
            tasks,
            btf: btf.ok(),
            values: ValuePlan::default(),
            arg_funcs: None,
            stacks: None,
            entry,
            direct,
            boot_patched: Default::default(),
            events: Default::default(),
            coming: None,
        })
    }

    /// Follow the modules the guest first loads during the trace: their
    /// functions that `coming.selection` takes get up to `slots` sites of their
    /// own (`added_sites`). Before the attach (the index is made again).
    pub fn reserve_added(&mut self, coming: ComingModules, slots: usize) {
        let sites = self.index.sites().collect();
        let first = self.funcs.len() as u32;
        self.index = Arc::new(SiteIndex::new(sites).with_added(slots, first));
        self.coming = Some(coming);
    }

    /// Spare sites exitless mode's code has for functions added during the
    /// trace: those reserved, at most `added_sites::EXITLESS_ADDED`.
    pub fn exitless_added(&self) -> usize {
        let reserved = self.index.added().capacity();
        reserved.min(added_sites::EXITLESS_ADDED)
    }

    /// Spare stub slots after the direct sites' (`layout::direct_spares`).
    pub fn direct_spare_stubs(&self) -> usize {
        let direct = self.direct.is_some();
        exitless::layout::direct_spares(direct, self.graph, self.exitless_added())
    }

    /// The text the kernel rewrites itself, which comparing the running
    /// text with the file skips; none when its tables cannot be read (the
    /// comparison then tolerates what it always did).
    pub fn boot_patched(&self) -> &BootPatched {
        self.boot_patched
            .get_or_init(|| BootPatched::read(&self.image).unwrap_or_default())
    }

    /// Per site of `index`: its event's format, None for a function's.
    pub fn event_formats(&self) -> Arc<[Option<Arc<EventFormat>>]> {
        let by_func = |f: &u32| {
            let func = self.funcs.get(*f as usize)?;
            let mut names = self.image.names(*func);
            let format = names.find_map(|n| self.events.entry_format(n))?;
            Some(Arc::new(format.clone()))
        };
        self.index.funcs.iter().map(by_func).collect()
    }

    /// The children's exits of the forking syscalls traced, by site
    /// (`syscall_events::ChildExitSites`); None: none traced.
    pub fn child_exit_sites(&self) -> Option<syscall_events::ChildExitSites> {
        let planned = self.events.child_exits.as_ref()?;
        let site_of = |name: &str| {
            let named = |f: &u32| {
                let func = self.funcs.get(*f as usize);
                func.is_some_and(|&func| self.image.names(func).any(|n| n == name))
            };
            self.index.funcs.iter().position(named)
        };
        syscall_events::ChildExitSites::of(planned, site_of)
    }

    /// Per site of `index`: does a call there record its arguments; None
    /// without `--args`.
    pub fn arg_sites(&self) -> Option<Arc<[bool]>> {
        if !self.values.args {
            return None;
        }
        let selected = |f: &u32| {
            self.arg_funcs
                .as_ref()
                .is_none_or(|a| a.binary_search(f).is_ok())
        };
        Some(self.index.funcs.iter().map(selected).collect())
    }

    /// The traced functions any of whose names `globs` select, as indices
    /// into `funcs` (`Trace::functions`), ascending: what `--stack` and
    /// `--args=GLOB` choose among.
    pub fn traced_matching(&self, globs: &crate::kernel::filter::Globs) -> Vec<u32> {
        self.funcs
            .iter()
            .enumerate()
            .filter(|&(_, &f)| self.image.names(f).any(|n| globs.is_match(n)))
            .map(|(k, _)| k as u32)
            .collect()
    }

    /// The kernel's BTF when values are recorded (`--args`, `--retval`):
    /// the base of the BTF of each module first loaded during the trace,
    /// for its functions' prototypes.
    pub fn value_btf(&self) -> Option<Arc<KernelBtf>> {
        self.btf.clone().filter(|_| self.values.any())
    }

    /// The prototype of each traced function (parallel to `funcs`, None
    /// where BTF does not describe it), when values are recorded; empty
    /// otherwise (`Trace::prototypes`). Every traced function's, also with
    /// `--args=GLOB`: the data file does not say which functions recorded
    /// arguments (an entry without them shows none), and a function's
    /// unshown arguments are as unshown when it recorded none.
    pub fn prototypes(&self) -> Vec<Option<crate::kernel::prototype::Prototype>> {
        let Some(btf) = self.btf.as_ref().filter(|_| self.values.any()) else {
            return Vec::new();
        };
        // A module's function by its module's own BTF only: a vmlinux
        // function of the same name is another function.
        let mut modules = std::collections::HashMap::new();
        let mut of_module = |name: &str| {
            let (bare, module) = name.strip_suffix(']')?.rsplit_once(" [")?;
            let m = self.image.modules.iter().find(|m| m.name == module);
            let own = modules.entry(module.to_owned()).or_insert_with(|| {
                let data = m?.btf.as_deref()?;
                module_btf(module, "guest memory", data, btf).ok()
            });
            // Without BTF, by its file's DWARF (`--modules DIR`).
            let dwarf = || m.and_then(|m| m.dwarf.get(bare).cloned());
            Some(match own.as_ref() {
                Some(b) => b.own_prototype(bare),
                None => dwarf(),
            })
        };
        self.funcs
            .iter()
            .map(|&f| {
                let name = &self.image.functions[f].name;
                of_module(name).unwrap_or_else(|| btf.prototype(name))
            })
            .collect()
    }
}

#[cfg(test)]
mod prototypes_tests;
