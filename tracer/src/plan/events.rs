//! The events to trace (`-e sched:sched_switch`): each selected tracepoint
//! event's call sites to enable (its `__jump_table` NOPs, made jumps under
//! vmtrace's stop) and its `__traceiter_NAME`, which the plan then traces
//! like a function with its arguments: with no probe registered in the
//! guest the enabled branch calls it and it returns at once
//! (`crate::kernel::events::jump_sites`).

use crate::kernel::btf::KernelBtf;
use crate::kernel::events::enabled_branch::{self, FuncsTest};
use crate::kernel::events::fields::{EventFormat, FieldOffsets};
use crate::kernel::events::fork_child::RET_FROM_FORK;
use crate::kernel::events::jump_sites::{self, JumpEntry, JumpSite, JumpSiteError};
use crate::kernel::events::module_events::ModuleEvent;
use crate::kernel::events::syscall_format::Side;
use crate::kernel::events::{counted, ftrace_format};
use crate::kernel::events::{
    EventError, EventGlobError, EventGlobs, EventKind, EventTable, KernelEvent,
};
use crate::kernel::kaslr::KernelOffset;
use crate::kernel::symbols::KernelImage;
use crate::kernel::top_table::{self, INIT_TOP_PGT};
use crate::plan::module_events::{self, LinkedEvent};
use crate::plan::syscall_events::{self, ChildExits, PlannedSyscall};

/// Where x86's jump_label checks and patches each site of a key being
/// enabled (arch/x86/kernel/jump_label.c), after boot.
const GUARD: &str = "arch_jump_label_transform_queue";

/// Where a static call is pointed at a new function, after boot
/// (kernel/static_call_inline.c `__static_call_update(key, tramp, func)`):
/// the guest registering a probe on a tracepoint points the event's static
/// call at it there (kernel/tracepoint.c `tracepoint_update_call`).
const STATIC_CALL_GUARD: &str = "__static_call_update";

/// Why the events asked cannot be traced.
#[derive(Debug, thiserror::Error)]
pub enum EventPlanError {
    #[error(transparent)]
    Glob(#[from] EventGlobError),
    #[error(transparent)]
    Table(#[from] EventError),
    #[error(transparent)]
    Sites(#[from] JumpSiteError),
    #[error(
        "{}: event {event} is not a tracepoint of its own ({kind}); only tracepoint and \
         syscall events can be traced",
        path.display()
    )]
    NotTracepoint {
        path: std::path::PathBuf,
        event: String,
        kind: &'static str,
    },
    #[error(transparent)]
    Syscall(#[from] syscall_events::SyscallEventError),
    #[error(
        "{}: the kernel has jump labels, whose event call sites vmtrace's own VMM does not \
         enable yet (an attach to the kernel running in QEMU does)",
        path.display()
    )]
    JumpLabelsOnOwnVmm { path: std::path::PathBuf },
}

/// One event to trace.
#[derive(Clone, Debug)]
pub struct PlannedEvent {
    /// `sched`, `sched_switch`.
    pub system: String,
    pub name: String,
    /// Its static key (link-time address): its `enabled` count says
    /// whether the guest has enabled the event itself.
    pub key: u64,
    /// `__traceiter_NAME` (link-time address).
    pub iterator: u64,
    /// Its call sites, NOPs in the image.
    pub sites: Vec<JumpSite>,
    /// The kernel calls it through a static call (`__SCT__tp_func_NAME`,
    /// CONFIG_HAVE_STATIC_CALL): its enabled branch then tests `tp->funcs`
    /// first and calls `__traceiter_NAME` only when a probe is registered
    /// (include/linux/tracepoint.h `__DO_TRACE_CALL`), so an enabled site
    /// alone records nothing.
    pub static_call: bool,
    /// With `static_call`: its trampoline `__SCT__tp_func_NAME` (link-time
    /// address), which names it at `__static_call_update`.
    pub tramp: Option<u64>,
    /// With `static_call`: each site's `tp->funcs` test, which a trap
    /// makes pass for vmtrace alone (`enabled_branch`); fewer than the
    /// sites when some do not decode as expected.
    pub tests: Vec<FuncsTest>,
    /// `tp->funcs` (link-time address).
    pub funcs: u64,
    /// `tp->iterator` (link-time address): it holds `__traceiter_NAME`'s
    /// address, never NULL, the cell exitless mode's `tp->funcs` loads read
    /// instead (`crate::qemu::funcs_loads`).
    pub iterator_cell: u64,
    /// Its fields by name (`kernel::events::fields`); None when BTF does
    /// not give its arguments.
    pub format: Option<EventFormat>,
    /// `call->event.type` (link-time address): the event's id, which the
    /// kernel gives it at boot (0 in the image), read in the guest at the
    /// attach (`crate::qemu::event_ids`); None when BTF lacks the members.
    pub id_cell: Option<u64>,
    /// The module whose event it is (`vmt_test`), None for the image's:
    /// its addresses are in the module's memory, which the kernel's page
    /// tables map (`EventPlan::gpa`), not the image's linear mapping.
    pub module: Option<String>,
}

impl PlannedEvent {
    /// `__traceiter_sched_switch`: the function traced for it.
    pub fn iterator_name(&self) -> String {
        format!("__traceiter_{}", self.name)
    }

    pub fn full_name(&self) -> String {
        format!("{}:{}", self.system, self.name)
    }
}

/// Without jump labels: each static-call event's `tp->funcs` tests, found
/// in the text (`kernel::events::counted`).
fn find_counted_tests(image: &KernelImage, events: &mut [PlannedEvent]) {
    let wanted: Vec<counted::CountedEvent> = events
        .iter()
        .map(|e| {
            let sct = image.symbol(&format!("__SCT__tp_func_{}", e.name));
            counted::CountedEvent {
                funcs: e.funcs,
                callees: sct
                    .map(|s| s.addr)
                    .into_iter()
                    .chain([e.iterator])
                    .collect(),
            }
        })
        .collect();
    for (e, tests) in events.iter_mut().zip(counted::funcs_tests(image, &wanted)) {
        if e.static_call {
            e.tests = tests;
        }
    }
}

/// Where an event is called from, and how.
struct Calls {
    sites: Vec<JumpSite>,
    /// Its static call's trampoline, `__SCT__tp_func_NAME`.
    tramp: Option<u64>,
    tests: Vec<FuncsTest>,
    static_call: bool,
}

/// The call sites of tracepoint event `e` (its key `key`, its `tp->funcs`
/// at `funcs`), from the image's jump table `table` or, for a module's
/// event, the module's (None: the kernel has no jump labels; its tests
/// are found later in one pass over the text), each checked.
fn calls(
    image: &KernelImage,
    e: &KernelEvent,
    key: u64,
    funcs: u64,
    module: Option<&LinkedEvent>,
    table: Option<&[JumpEntry]>,
) -> Result<Calls, EventPlanError> {
    let sites = match (table, module) {
        (None, _) => Vec::new(),
        (Some(_), Some(m)) => m.sites(image, key)?,
        (Some(t), None) => jump_sites::event_sites(image, t, &e.full_name(), key)?,
    };
    let tramp = match module {
        Some(m) => m.tramp(image),
        None => (image.symbol(&format!("__SCT__tp_func_{}", e.name))).map(|s| s.addr),
    };
    // A module's static call may have no symbol its kallsyms keep: its
    // sites' code says (their `tp->funcs` tests).
    let tests: Vec<FuncsTest> = match (tramp.is_some() || module.is_some(), table) {
        (true, Some(_)) => sites
            .iter()
            .filter_map(|s| enabled_branch::funcs_test(image, s.target, funcs))
            .collect(),
        (true, None) | (false, _) => Vec::new(),
    };
    let static_call = tramp.is_some() || (module.is_some() && !tests.is_empty());
    Ok(Calls {
        sites,
        tramp,
        tests,
        static_call,
    })
}

/// The events a plan traces.
#[derive(Clone, Debug, Default)]
pub struct EventPlan {
    pub events: Vec<PlannedEvent>,
    /// The syscall events, each recorded at its syscall's function
    /// (`plan::syscall_events`).
    pub syscalls: Vec<PlannedSyscall>,
    /// The children's exits of the forking syscalls among them, recorded
    /// at `ret_from_fork` (`syscall_events::ChildExits`).
    pub child_exits: Option<ChildExits>,
    /// `arch_jump_label_transform_queue` (link-time), where the guest's own
    /// enabling of a key checks each site for its NOP: attach makes the
    /// call return at once there for vmtrace's sites, which hold the
    /// kernel's own jump (`crate::qemu::guarded_sites`).
    pub guard: Option<u64>,
    /// `__static_call_update` (link-time), where the guest's registering of
    /// a probe points an event's static call at it: exitless mode keeps it
    /// on `__traceiter_NAME` there (`crate::qemu::event_guard`).
    pub static_call_guard: Option<u64>,
    /// Where the covered events' fields are read (None: BTF lacks a
    /// structure member they need; the fields then read as unknown).
    pub offsets: Option<FieldOffsets>,
    /// The kernel has no jump labels (`kernel::events::counted`): its call
    /// sites test each key's `enabled` count, which only the own VMM sets
    /// (`crate::session::event_keys`); the events have no `sites`, and
    /// their `tests` were found in the text.
    pub counted_keys: bool,
    /// `init_top_pgt` (link-time), through which a module's event's
    /// addresses are translated (`EventPlan::gpa`).
    pub top_pgt: Option<u64>,
}

/// Where `call->event.type` is in a `struct trace_event_call`
/// (include/linux/trace_events.h: its `struct trace_event event`, whose
/// `int type` is the event's id); None when BTF lacks either member.
fn id_offset(btf: &KernelBtf) -> Option<u64> {
    let event = btf.member("trace_event_call", "event").ok()?;
    let ty = btf.member("trace_event", "type").ok()?;
    Some(u64::from(event.offset + ty.offset))
}

impl EventPlan {
    /// The events of `image` that `globs` select, each with its call
    /// sites checked; empty `globs`: none.
    pub fn build(image: &KernelImage, globs: &[String]) -> Result<EventPlan, EventPlanError> {
        EventPlan::build_with(image, globs, &[])
    }

    /// [`EventPlan::build`], the events of the guest's loaded modules
    /// (`modules`, read at an attach) selected as the image's.
    pub fn build_with(
        image: &KernelImage,
        globs: &[String],
        modules: &[ModuleEvent],
    ) -> Result<EventPlan, EventPlanError> {
        if globs.is_empty() {
            return Ok(EventPlan::default());
        }
        let globs = EventGlobs::parse(globs)?;
        let btf = KernelBtf::from_image(image).map_err(EventError::from)?;
        let mut table = EventTable::read(image, &btf)?;
        // The loaded modules' events are selected as the image's (an
        // attach read them with the modules).
        let modules = module_events::linked(image, modules);
        table.events.extend(modules.iter().map(|m| m.event.clone()));
        syscall_events::check_table(image, &table, &globs)?;
        let entries = jump_sites::entries(image)?;
        let counted_keys = entries.is_empty();
        // `struct tracepoint`'s members (include/linux/tracepoint-defs.h).
        let at = |ty: &str, m: &str| btf.member(ty, m).map(|m| u64::from(m.offset));
        let tp_funcs = at("tracepoint", "funcs").map_err(EventError::from)?;
        let tp_iterator = at("tracepoint", "iterator").map_err(EventError::from)?;
        let id_at = id_offset(&btf);
        let (mut events, mut syscalls) = (Vec::new(), Vec::new());
        for e in table.select(&globs)? {
            if let Some(s) = PlannedSyscall::of(image, &btf, e, id_at)? {
                syscalls.push(s);
                continue;
            }
            let full = e.full_name();
            let (Some(key), Some(iterator), EventKind::Tracepoint) = (e.key, e.iterator, e.kind)
            else {
                return Err(EventPlanError::NotTracepoint {
                    path: image.path.clone(),
                    event: full,
                    kind: "a format only",
                });
            };
            let module = modules.iter().find(|m| m.event.call == e.call);
            let funcs = tp_funcs + e.tracepoint.unwrap_or_default();
            let iterator_cell = tp_iterator + e.tracepoint.unwrap_or_default();
            let table = (!counted_keys).then_some(entries.as_slice());
            let c = calls(image, e, key, funcs, module, table)?;
            let ftrace = match module {
                Some(m) => m.format.clone(),
                None => ftrace_format::read(image, &btf, e),
            };
            events.push(PlannedEvent {
                system: e.system.clone(),
                name: e.name.clone(),
                key,
                iterator,
                sites: c.sites,
                static_call: c.static_call,
                tramp: c.tramp,
                tests: c.tests,
                funcs,
                iterator_cell,
                format: EventFormat::of(e).map(|f| EventFormat { ftrace, ..f }),
                id_cell: id_at.map(|at| e.call + at),
                module: module.map(|m| m.module.clone()),
            });
        }
        if counted_keys {
            find_counted_tests(image, &mut events);
        }
        let guard = image.symbol(GUARD).map(|s| s.addr);
        let offsets = FieldOffsets::find(&btf).ok();
        Ok(EventPlan {
            events,
            child_exits: ChildExits::of(image, &btf, &syscalls),
            syscalls,
            guard,
            static_call_guard: image.symbol(STATIC_CALL_GUARD).map(|s| s.addr),
            offsets,
            counted_keys,
            top_pgt: image.symbol(INIT_TOP_PGT).map(|s| s.addr),
        })
    }

    /// The events whose `__traceiter_NAME` only a guest's probe makes
    /// called (`PlannedEvent::static_call`) because a site's `tp->funcs`
    /// test was not found: trap mode passes the tests with a breakpoint,
    /// exitless mode by making their loads read `tp->iterator`.
    pub fn behind_static_calls(&self) -> Vec<String> {
        // Without jump labels the sites are the tests found (none: silent).
        let silent = |e: &&PlannedEvent| {
            e.static_call && (e.tests.is_empty() || e.tests.len() < e.sites.len())
        };
        self.events
            .iter()
            .filter(silent)
            .map(PlannedEvent::full_name)
            .collect()
    }

    /// No event at all.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty() && self.syscalls.is_empty()
    }

    /// Whether a syscall's exit is traced: its function's return is
    /// hooked, with its value.
    pub fn needs_returns(&self) -> bool {
        self.syscalls.iter().any(|s| s.side == Side::Exit)
    }

    /// The format of the event recorded at function `func`'s entry
    /// (`__traceiter_NAME`, or a syscall's `__x64_sys_NAME`), if any.
    pub fn entry_format(&self, func: &str) -> Option<&EventFormat> {
        if let Some(e) = self.by_iterator(func) {
            return e.format.as_ref();
        }
        self.syscall_format(func, Side::Enter)
    }

    /// The format of the event recorded at function `func`'s return (a
    /// syscall's `sys_exit_NAME`), if any.
    pub fn return_format(&self, func: &str) -> Option<&EventFormat> {
        self.syscall_format(func, Side::Exit)
    }

    fn syscall_format(&self, func: &str, side: Side) -> Option<&EventFormat> {
        let s = self
            .syscalls
            .iter()
            .find(|s| s.func == func && s.side == side);
        s?.format.as_ref()
    }

    /// Whether any event is called through a static call (its `tp->funcs`
    /// tests are passed by vmtrace).
    pub fn any_static_call(&self) -> bool {
        self.events.iter().any(|e| e.static_call)
    }

    /// Can the own VMM enable them? Only on a kernel without jump labels
    /// so far (`crate::session::event_keys`); syscall events need no call
    /// site enabled.
    pub fn on_own_vmm(&self, path: &std::path::Path) -> Result<(), EventPlanError> {
        match !self.counted_keys && !self.events.is_empty() {
            true => Err(EventPlanError::JumpLabelsOnOwnVmm {
                path: path.to_path_buf(),
            }),
            false => Ok(()),
        }
    }

    /// Can `vmtrace attach` enable them? Not on a kernel without jump
    /// labels: there only the own VMM, which owns the guest, sets the
    /// keys' counts (`crate::session::event_keys`).
    pub fn attachable(&self, path: &std::path::Path) -> Result<(), EventPlanError> {
        match self.counted_keys && !self.events.is_empty() {
            true => Err(JumpSiteError::NoJumpLabels {
                path: path.to_path_buf(),
            }
            .into()),
            false => Ok(()),
        }
    }

    /// The functions to trace for them (`__traceiter_NAME` each, each
    /// syscall's function once, and `ret_from_fork` for the children's
    /// exits).
    pub fn iterator_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .events
            .iter()
            .map(PlannedEvent::iterator_name)
            .collect();
        for s in &self.syscalls {
            if !names.contains(&s.func) {
                names.push(s.func.clone());
            }
        }
        if self.child_exits.is_some() {
            names.push(RET_FROM_FORK.to_string());
        }
        names
    }

    /// Every call site to enable, with its event's key.
    pub fn sites(&self) -> impl Iterator<Item = (&PlannedEvent, &JumpSite)> {
        self.events
            .iter()
            .flat_map(|e| e.sites.iter().map(move |s| (e, s)))
    }

    /// The guest-physical address of event `e`'s link-time address `link`
    /// in `ram`, the kernel at `offset`: the image's through its linear
    /// mapping, a module's through the kernel's own page tables (a
    /// module's memory is mapped page by page). None: not mapped.
    pub fn gpa(
        &self,
        ram: &dyn vmm::GuestRam,
        offset: KernelOffset,
        e: &PlannedEvent,
        link: u64,
    ) -> Option<u64> {
        if e.module.is_none() {
            return offset.phys_of(link);
        }
        let pgt = self.top_pgt?;
        let root = vmm::layout::kernel_virt_to_phys(pgt)?.checked_add_signed(offset.phys)?;
        let space = top_table::self_mapped(ram, root, offset.runtime(pgt))?;
        space.translate(offset.runtime(link)).ok().map(|t| t.gpa)
    }

    /// The event whose `__traceiter_NAME` is named `func`.
    pub fn by_iterator(&self, func: &str) -> Option<&PlannedEvent> {
        let name = func.strip_prefix("__traceiter_")?;
        self.events.iter().find(|e| e.name == name)
    }
}
