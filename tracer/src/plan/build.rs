//! A whole trace plan from a request: the selection (`Plan`), function-graph
//! hooks, the check that something can be patched, and the mode, each
//! decided once before the guest runs. What the caller should tell the user
//! comes back as [`Note`]s; what is wrong as a [`PlanError`].

use crate::advice::{Plain, Remedy, TracerAdvice};

use super::exitless::error::ExitlessPlanError;
use super::{hookable, Mode, Plan, ValuePlan};
use crate::error::TracerError;
use crate::kernel::filter::Filter;
use crate::kernel::symbols::KernelImage;
use crate::kernel::task_list::TaskList;
use crate::plan::entry::MAX_DIRECT_SITES;
use crate::plan::events::EventPlan;
use crate::plan::stacks::StackPlan;
use crate::plan::tasks::TaskFilter;

/// How traced calls should reach vmtrace, as asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModeChoice {
    Trap,
    Exitless,
    /// Trap on a host whose KVM emulates guest ring 0, else exitless where
    /// it can be planned, else trap.
    Auto,
}

/// What to trace and how, as asked.
#[derive(Clone, Debug)]
pub struct Request {
    /// Function globs to trace and to leave out (ftrace's filter syntax).
    pub trace: Vec<String>,
    pub notrace: Vec<String>,
    /// Function graph: hook returns too.
    pub graph: bool,
    pub mode: ModeChoice,
    /// Records per exitless ring (None: as many as fit).
    pub ring_events: Option<u64>,
    pub cpus: usize,
    /// The host's KVM runs guest ring 0 in its instruction emulator
    /// (`vmm::host::emulates_ring0`): there a trap is cheaper than the
    /// trampoline's instructions.
    pub emulator_host: bool,
    /// The kernel is Linux (its own stack traces are affected by the graph).
    pub linux: bool,
    /// Keep only the calls of these tasks (`--pid`; empty: any) and of
    /// tasks whose comm matches (`--comm`).
    pub pids: Vec<u32>,
    pub comm: Option<String>,
    /// Globs of the traced functions whose calls record their arguments
    /// (`--args=GLOB`; `--args` alone is `*`, every traced function);
    /// empty: none.
    pub args: Vec<String>,
    /// Record each traced call's return value (`--retval`): needs `graph`.
    pub retval: bool,
    /// Globs of the traced functions whose calls record their kernel
    /// stack (`--stack`); empty: none.
    pub stack: Vec<String>,
    /// How the traced functions are entered (`--entry`).
    pub entry: crate::plan::entry::EntryChoice,
    /// Event globs to trace (`-e`, ftrace's set_event syntax); empty: none.
    pub events: Vec<String>,
    /// The events of the guest's loaded modules (an attach reads them with
    /// the modules), which `events` selects as the image's.
    pub module_events: Vec<crate::kernel::events::module_events::ModuleEvent>,
}

impl Request {
    /// Trace `trace` on `cpus` CPUs of a Linux guest in `mode`, through
    /// ftrace's sites where the kernel has them, nothing else asked (no
    /// graph, values, stacks or task filter).
    pub fn new(trace: Vec<String>, mode: ModeChoice, cpus: usize) -> Request {
        Request {
            trace,
            notrace: Vec::new(),
            graph: false,
            mode,
            ring_events: None,
            cpus,
            emulator_host: false,
            linux: true,
            pids: Vec::new(),
            comm: None,
            args: Vec::new(),
            retval: false,
            stack: Vec::new(),
            entry: Default::default(),
            events: Vec::new(),
            module_events: Vec::new(),
        }
    }

    /// This request with the events' `__traceiter_NAME` (and syscalls'
    /// `__x64_sys_NAME`) traced, with their arguments (the events' fields
    /// come from them); a syscall's exit hooks returns, with their values.
    fn with_events(&self, events: &EventPlan) -> Request {
        let mut req = self.clone();
        let names = events.iterator_names();
        req.trace.extend(names.iter().cloned());
        req.args.extend(names);
        if events.needs_returns() {
            req.graph = true;
            req.retval = true;
        }
        req
    }
}

/// Something the user should be told about the plan, once it is set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Note {
    /// Function graph: these functions (each with why) are left out: the
    /// guest's unwinder would stop at vmtrace's hook.
    GraphLeftOut(Vec<(String, &'static str)>),
    /// Function graph on Linux: what the guest's own stack traces show
    /// while returns are hooked.
    GraphGuestStacks,
    /// Auto mode chose traps because exitless mode cannot be planned: why
    /// (it names no input), and its remedy (`crate::advice`).
    AutoTrap { why: String, remedy: Option<Remedy> },
    /// Direct entries: how many functions are safe, and how many each rule
    /// refused (`DirectPlan::summary`).
    Direct(String),
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Tracer(#[from] TracerError),
    /// The events asked (`Request::events`) cannot be traced.
    #[error(transparent)]
    Events(#[from] crate::plan::events::EventPlanError),
    /// The comm glob to keep does not compile.
    #[error(transparent)]
    CommGlob(#[from] crate::plan::tasks::CommGlobError),
    /// Tasks to keep were named, and the kernel's task layout is unknown.
    #[error(
        "keeping only some tasks needs the guest's tasks, and this kernel's are unknown ({why})"
    )]
    NoTasks { why: String },
    /// Function graph: every selected function is one whose return must not
    /// be hooked.
    #[error("cannot hook the return of {names}: the guest's unwinder would stop at vmtrace's hook; trace them without the function graph")]
    GraphUnhookable { names: String },
    /// Return values asked without the function graph.
    #[error("return values are read at returns, which only the function graph hooks: trace with the function graph too")]
    RetvalNeedsGraph,
    /// Arguments or return values asked of a kernel without BTF: why it
    /// has none.
    #[error("arguments and return values are shown by the kernel's BTF, and it has none ({why})")]
    ValuesNeedBtf { why: String },
    /// `--args` globs that select nothing traced, or do not compile.
    #[error(transparent)]
    Args(#[from] crate::plan::args::ArgPlanError),
    /// `--stack` globs that select nothing traced, or do not compile.
    #[error(transparent)]
    Stack(#[from] crate::plan::stacks::StackPlanError),
    /// Kernel stacks and the function graph asked of exitless mode.
    #[error("kernel stacks with the function graph are recorded in trap mode only: the unwinder cannot see through exitless return hooks")]
    StackGraphExitless,
    /// Direct entries on a kernel that can preempt a task anywhere in
    /// kernel mode: one preempted inside the displaced bytes cannot be
    /// found from the vCPUs alone.
    #[error("direct entries into a preemptible kernel need its task list, to find the tasks it preempted, and {path}'s is unknown ({why})")]
    DirectPreemptible { path: String, why: String },
    /// More direct sites selected than vmtrace's code page has stubs for.
    #[error("the selection has {sites} direct sites, and vmtrace's code page holds the stubs of {max}; trace fewer functions")]
    TooManyDirect { sites: usize, max: usize },
    /// Every selected site is in init text, which is never patched.
    #[error("the selection has no patchable site: its {skipped} site(s) ({examples}) are all in init text, which the kernel frees after boot; trace functions that run after boot")]
    NoPatchableSite { skipped: usize, examples: String },
}

impl From<ExitlessPlanError> for PlanError {
    fn from(e: ExitlessPlanError) -> PlanError {
        PlanError::Tracer(e.into())
    }
}

/// A plan ready for a session: the selection, the mode (with exitless
/// mode's code), and what to say.
pub struct TracePlan {
    pub plan: Plan,
    pub mode: Mode,
    /// The mode asked for: an attach to a running guest settles `mode`
    /// against the guest's room at its first stop (`attach_mode`).
    pub asked: ModeChoice,
    pub notes: Vec<Note>,
}

impl TracePlan {
    /// Plan `req` against `image`.
    pub fn build(image: KernelImage, req: &Request) -> Result<TracePlan, PlanError> {
        TracePlan::build_from(image, req, false, false)
    }

    /// Plan `req` against `image`, selecting none of the kernel's
    /// functions: `req`'s globs all wait for modules the guest loads
    /// during the trace (`reserve_added` follows); no events.
    pub fn for_modules(image: KernelImage, req: &Request) -> Result<TracePlan, PlanError> {
        TracePlan::build_from(image, req, true, false)
    }

    /// `build`; `waiting`: a `:mod:` glob waits for its module (`vmtrace
    /// attach`), and `--stack` globs may name only its functions.
    pub fn build_waiting(
        image: KernelImage,
        req: &Request,
        waiting: bool,
    ) -> Result<TracePlan, PlanError> {
        TracePlan::build_from(image, req, false, waiting)
    }

    fn build_from(
        image: KernelImage,
        req: &Request,
        modules_only: bool,
        waiting: bool,
    ) -> Result<TracePlan, PlanError> {
        let events = EventPlan::build_with(&image, &req.events, &req.module_events)?;
        let req = &req.with_events(&events);
        let mut plan = match modules_only {
            true => Plan::for_modules(image, req.entry)?,
            false => Plan::with_entry(image, &req.trace, &req.notrace, req.entry)?,
        };
        plan.events = events;
        let mut notes = Vec::new();
        let preempted = match plan.direct {
            Some(_) => preempted_tasks(&plan)?,
            None => None,
        };
        if let Some(direct) = plan.direct.as_mut() {
            direct.preempted = preempted;
            notes.extend(direct.summary().map(Note::Direct));
        }
        plan.tasks.filter = TaskFilter::new(req.pids.clone(), req.comm.as_deref())?;
        if plan.tasks.filter.is_active() && plan.tasks.layout.is_none() {
            return Err(PlanError::NoTasks {
                why: plan.tasks.note.clone(),
            });
        }
        plan.values = values(&plan, req)?;
        if req.graph {
            notes.extend(graph(&mut plan, req.linux)?);
        }
        check_patchable(&plan, req)?;
        if plan.direct.is_some() {
            direct_sites_fit(plan.index.addrs.len())?;
        }
        // After the graph, which may leave functions out and renumber them.
        plan.arg_funcs = crate::plan::args::select(&plan, &req.args)?;
        plan.stacks = StackPlan::build(&plan, &req.stack, waiting)?;
        let mode = choose_mode(&plan, req, &mut notes)?;
        Ok(TracePlan {
            plan,
            mode,
            asked: req.mode,
            notes,
        })
    }
}

impl TracePlan {
    /// Follow the modules the guest first loads during the trace
    /// (`Plan::reserve_added`); exitless mode's code is made again with
    /// their spare sites (`Plan::exitless_added`). `req`: the request the
    /// plan was built from.
    pub fn reserve_added(
        &mut self,
        coming: super::ComingModules,
        slots: usize,
        req: &Request,
    ) -> Result<(), PlanError> {
        self.plan.reserve_added(coming, slots);
        if matches!(self.mode, Mode::Exitless(_)) {
            self.mode = choose_mode(&self.plan, req, &mut self.notes)?;
        }
        Ok(())
    }
}

/// The values to record, checked: return values are read at returns,
/// which only the function graph hooks; values are shown by the kernel's
/// BTF.
fn values(plan: &Plan, req: &Request) -> Result<ValuePlan, PlanError> {
    let values = ValuePlan {
        args: !req.args.is_empty(),
        retval: req.retval,
    };
    if req.retval && !req.graph {
        return Err(PlanError::RetvalNeedsGraph);
    }
    if values.any() && plan.btf.is_none() {
        // Tasks may have come from DWARF: then the BTF is simply missing.
        let why = match plan.tasks.note.strip_prefix("none: ") {
            Some(why) => why.to_string(),
            None => crate::kernel::btf::BtfError::Missing {
                path: plan.image.path.clone(),
            }
            .to_string(),
        };
        return Err(PlanError::ValuesNeedBtf { why });
    }
    Ok(values)
}

/// Hook returns, leaving out (and naming) the functions whose return must
/// not be hooked (`hookable`); refused if nothing else is left to trace.
fn graph(plan: &mut Plan, linux: bool) -> Result<Vec<Note>, PlanError> {
    let had_sites = !plan.index.addrs.is_empty();
    let left_out = hookable::hook_returns(plan);
    let why = |n: &String| (n.clone(), hookable::unhookable(n).unwrap_or_default());
    let left_out: Vec<(String, &'static str)> = left_out.iter().map(why).collect();
    if had_sites && plan.index.addrs.is_empty() {
        return Err(PlanError::GraphUnhookable {
            names: graph_names(&left_out),
        });
    }
    let mut notes = Vec::new();
    if !left_out.is_empty() {
        notes.push(Note::GraphLeftOut(left_out));
    }
    if linux {
        notes.push(Note::GraphGuestStacks);
    }
    Ok(notes)
}

/// "name (why); name (why)", as notes and errors name left-out functions.
pub fn graph_names(left_out: &[(String, &'static str)]) -> String {
    left_out
        .iter()
        .map(|(n, why)| format!("{n} ({why})"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Direct entries: the kernel's task list, to find the tasks it may have
/// preempted in kernel mode, whenever its BTF says where (a kernel that
/// cannot preempt has none such, and the walk then only confirms it); a
/// preemptible kernel (one with `preempt_schedule`) whose BTF does not is
/// refused (`PlanError::DirectPreemptible`).
fn preempted_tasks(plan: &Plan) -> Result<Option<TaskList>, PlanError> {
    use crate::kernel::task_list::PREEMPT_SCHEDULE;
    let found = match plan.btf.as_deref() {
        Some(btf) => TaskList::find(&plan.image, btf).map_err(|e| e.to_string()),
        None => Err(plan.tasks.note.clone()),
    };
    match (found, plan.image.symbol(PREEMPT_SCHEDULE)) {
        (Ok(list), _) => Ok(Some(list)),
        (Err(_), None) => Ok(None),
        (Err(why), Some(_)) => Err(PlanError::DirectPreemptible {
            path: plan.image.path.display().to_string(),
            why,
        }),
    }
}

/// `sites` direct sites have their stubs in vmtrace's code page.
fn direct_sites_fit(sites: usize) -> Result<(), PlanError> {
    match sites > MAX_DIRECT_SITES {
        true => Err(PlanError::TooManyDirect {
            sites,
            max: MAX_DIRECT_SITES,
        }),
        false => Ok(()),
    }
}

/// A selection whose every site is in init text would boot and trace nothing.
fn check_patchable(plan: &Plan, req: &Request) -> Result<(), PlanError> {
    if !plan.index.addrs.is_empty() || plan.skipped_init == 0 {
        return Ok(());
    }
    // Name a few: the selection again (cheap, and it succeeded once).
    let selected = Filter::new(&req.trace, &req.notrace)
        .and_then(|f| f.select(&plan.image, &plan.sites))
        .unwrap_or_default();
    let mut names: Vec<&str> = selected
        .iter()
        .map(|&i| {
            plan.image.functions[plan.sites.sites[i].func as usize]
                .name
                .as_str()
        })
        .take(3)
        .collect();
    if selected.len() > names.len() {
        names.push("...");
    }
    Err(PlanError::NoPatchableSite {
        skipped: plan.skipped_init,
        examples: names.join(", "),
    })
}

/// The mode asked for, its code made now (rings that fit, a kernel whose
/// per-CPU `cpu_number` the trampoline can read); or, for `Auto`, trap on a
/// host whose KVM emulates guest ring 0 (there each guest instruction of
/// the trampoline costs far more than one trapped call's exit: the
/// figures are in docs/benchmarks.md), else exitless where it can be
/// planned, else trap.
fn choose_mode(plan: &Plan, req: &Request, notes: &mut Vec<Note>) -> Result<Mode, PlanError> {
    let exitless = || Mode::exitless(plan, req.cpus, req.ring_events);
    // Exitless return hooks hide callers from the host's unwinder.
    let stack_graph = plan.stacks.is_some() && plan.graph;
    match req.mode {
        ModeChoice::Trap => Ok(Mode::Trap),
        ModeChoice::Exitless if stack_graph => Err(PlanError::StackGraphExitless),
        ModeChoice::Exitless => Ok(exitless()?),
        ModeChoice::Auto if req.emulator_host => Ok(Mode::Trap),
        ModeChoice::Auto if stack_graph => {
            notes.push(Note::AutoTrap {
                why: PlanError::StackGraphExitless.to_string(),
                remedy: None,
            });
            Ok(Mode::Trap)
        }
        ModeChoice::Auto => match exitless() {
            Ok(mode) => Ok(mode),
            Err(e) => {
                notes.push(Note::AutoTrap {
                    why: e.problem(&Plain),
                    remedy: e.remedy(),
                });
                Ok(Mode::Trap)
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(graph: bool, args: bool, retval: bool) -> Request {
        Request {
            trace: vec!["args_*".to_string()],
            notrace: Vec::new(),
            graph,
            mode: ModeChoice::Trap,
            ring_events: None,
            cpus: 1,
            emulator_host: false,
            linux: false,
            pids: Vec::new(),
            comm: None,
            args: match args {
                true => vec!["*".to_string()],
                false => Vec::new(),
            },
            retval,
            stack: Vec::new(),
            entry: Default::default(),
            events: Vec::new(),
            module_events: Vec::new(),
        }
    }

    fn mini() -> Option<KernelImage> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest/out/mini.elf");
        if !path.is_file() {
            eprintln!(
                "SKIPPED: {} is not built; run `bash guest/build.sh mini`",
                path.display()
            );
            return None;
        }
        Some(KernelImage::load(&path).unwrap())
    }

    /// What following modules first loaded during the trace needs (its
    /// layout is never walked here).
    fn coming() -> super::super::ComingModules {
        super::super::ComingModules {
            selection: Filter::new(&["*:mod:m".to_string()], &[]).unwrap(),
            layout: crate::kernel::image_module::ModuleLayout::unused(),
            phys: 0,
            notify: None,
            args: None,
            files: None,
            said: Default::default(),
        }
    }

    /// Exitless mode's code is made again with the spare sites of the
    /// modules first loaded during the trace, at most `EXITLESS_ADDED` of
    /// those reserved: each with a body of its own (a recorded call as
    /// short as a planned site's) and its drop counters; with the graph,
    /// a stub to the shared body as every site.
    #[test]
    fn exitless_code_has_the_spare_sites() {
        use crate::plan::added_sites::EXITLESS_ADDED;
        use crate::plan::exitless::trampoline::{Shape, COMMON_PATH_INSTRUCTIONS};
        if mini().is_none() {
            return;
        }
        for graph in [false, true] {
            let mut req = request(graph, false, false);
            req.mode = ModeChoice::Exitless;
            let mut p = TracePlan::build(mini().unwrap(), &req).unwrap();
            let planned = p.plan.index.addrs.len();
            let Mode::Exitless(code) = &p.mode else {
                panic!("trap mode planned")
            };
            assert_eq!(code.trampoline.sites(), planned);
            let records_off = code.layout().records_off;
            p.reserve_added(coming(), 4096, &req).unwrap();
            assert_eq!(p.plan.exitless_added(), EXITLESS_ADDED);
            let Mode::Exitless(code) = &p.mode else {
                panic!("trap mode planned")
            };
            let t = &code.trampoline;
            // A drop counter each in every ring (two with the graph).
            let counters = if graph { 2 } else { 1 };
            let grown = code.layout().records_off - records_off;
            assert_eq!(grown, counters * 8 * EXITLESS_ADDED as u64);
            assert_eq!(t.sites(), planned + EXITLESS_ADDED);
            assert_eq!(code.layout().sites, planned + EXITLESS_ADDED);
            let stubs: std::collections::HashSet<u64> =
                (0..t.sites()).map(|k| t.stub_va(k as u32)).collect();
            assert_eq!(stubs.len(), t.sites(), "each site its own entry");
            let last = t.sites() - 1;
            match graph {
                true => assert_eq!(t.shape, Shape::Shared),
                false => {
                    assert_eq!(t.shape, Shape::PerSite);
                    let path = |k| t.site_path(k).unwrap().len();
                    assert_eq!(path(last), path(0));
                    assert!(path(0) >= COMMON_PATH_INSTRUCTIONS);
                }
            }
        }
    }

    /// The values asked reach the plan; return values need the function
    /// graph, and values the kernel's BTF: one line each, naming the fix.
    #[test]
    fn values_are_planned_and_checked() {
        if mini().is_none() {
            return;
        }
        let image = || mini().unwrap();
        let p = TracePlan::build(image(), &request(true, true, true)).unwrap();
        assert_eq!(
            p.plan.values,
            ValuePlan {
                args: true,
                retval: true
            }
        );
        assert!(p.plan.btf.is_some());
        assert_eq!(p.plan.prototypes().len(), p.plan.funcs.len());
        let p = TracePlan::build(image(), &request(false, true, false)).unwrap();
        assert!(p.plan.values.args && !p.plan.values.retval);
        let p = TracePlan::build(image(), &request(false, false, false)).unwrap();
        assert!(!p.plan.values.any());
        assert!(p.plan.prototypes().is_empty());

        let Err(e) = TracePlan::build(image(), &request(false, false, true)) else {
            panic!("return values without the graph were planned")
        };
        assert!(matches!(e, PlanError::RetvalNeedsGraph), "{e}");
        assert_eq!(
            e.to_string(),
            "return values are read at returns, which only the function graph hooks: \
             trace with the function graph too"
        );

        let mut plan = Plan::from_image(image(), &["args_*".to_string()], &[]).unwrap();
        plan.btf = None;
        plan.tasks.note = "none: x has no BTF (.BTF section): build the kernel with \
                           CONFIG_DEBUG_INFO_BTF=y (needs pahole, Debian's dwarves)"
            .into();
        let e = values(&plan, &request(false, true, false))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "arguments and return values are shown by the kernel's BTF, and it has none \
             (x has no BTF (.BTF section): build the kernel with CONFIG_DEBUG_INFO_BTF=y \
             (needs pahole, Debian's dwarves))"
        );
        assert!(values(&plan, &request(false, false, false)).is_ok());
        // Tasks from DWARF, no BTF: the values still need BTF, and say so.
        plan.tasks.note = "from the DWARF of x".into();
        let e = values(&plan, &request(false, true, false))
            .unwrap_err()
            .to_string();
        assert!(e.contains("has no BTF (.BTF section)"), "{e}");
    }

    /// `--args=GLOB` selects the traced functions whose calls record their
    /// arguments, by site; `--args` alone (`*`) every one; globs naming no
    /// traced function are refused, naming them.
    #[test]
    fn argument_globs_select_traced_functions() {
        if mini().is_none() {
            return;
        }
        let image = || mini().unwrap();
        let mut req = request(false, true, false);
        let all = TracePlan::build(image(), &req).unwrap().plan;
        let n = all.funcs.len();
        assert!(n >= 5, "{n} args_* functions");
        assert_eq!(all.arg_funcs, Some((0..n as u32).collect()));
        assert!(all.arg_sites().unwrap().iter().all(|&s| s));

        req.args = vec!["args_six,args_nothing".to_string()];
        let p = TracePlan::build(image(), &req).unwrap().plan;
        let six = p
            .funcs
            .iter()
            .position(|&f| p.image.functions[f].name == "args_six")
            .unwrap() as u32;
        assert_eq!(p.arg_funcs, Some(vec![six]));
        let sites = p.arg_sites().unwrap();
        assert_eq!(sites.len(), p.index.funcs.len());
        for (s, &f) in sites.iter().zip(&p.index.funcs) {
            assert_eq!(*s, f == six, "site of function {f}");
        }
        // Prototypes stay every traced function's.
        assert_eq!(p.prototypes().len(), n);

        req.args = vec!["*".to_string(), "!args_six".to_string()];
        let p = TracePlan::build(image(), &req).unwrap().plan;
        assert_eq!(p.arg_funcs.as_ref().map(Vec::len), Some(n - 1));

        req.args = vec!["schedule,vfs_*".to_string()];
        let Err(e) = TracePlan::build(image(), &req) else {
            panic!("argument globs matching nothing traced were planned")
        };
        assert_eq!(
            e.to_string(),
            "the argument globs schedule,vfs_* match none of the traced functions; \
             give globs of functions the trace selects"
        );
        let plan = Plan::from_image(image(), &["args_*".to_string()], &[]).unwrap();
        assert_eq!(plan.arg_sites(), None);
    }

    #[test]
    fn direct_sites_beyond_the_code_pages_stubs_are_refused() {
        assert!(direct_sites_fit(MAX_DIRECT_SITES).is_ok());
        let e = direct_sites_fit(MAX_DIRECT_SITES + 1).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the selection has 28001 direct sites, and vmtrace's code page holds the stubs of \
             28000; trace fewer functions"
        );
    }
}
