//! Exitless mode's guest code, planned: the ring layout, the trampoline
//! (site bodies, function-graph code, return stubs), and how it returns,
//! generated once with the plan it belongs to (`ExitlessPlan`). The live
//! session writes, maps, drains and removes it (`crate::session::exitless`,
//! whose module comment describes the region and the ring protocol).

pub mod body;
pub mod disasm;
mod displacements;
pub mod error;
pub mod graph_code;
pub mod layout;
pub mod ret;
mod spec;
pub mod strcopy;
pub mod symbols;
pub mod trampoline;

use std::sync::Arc;

use crate::kernel::kaslr::KernelOffset;
use crate::kernel::percpu::PerCpuVar;
use crate::kernel::sites::SITE_LEN;
use crate::kernel::symbols::KernelImage;
use crate::plan::syscall_events::ChildExitSites;
use crate::plan::tasks::TaskPlan;
use crate::plan::{Plan, ValuePlan};
use error::{ExitlessPlanError, TrampolineError};
use layout::{direct_stubs_len, RecordKind, RingLayout, CODE_LEN};
use ret::Return;
use strcopy::{CopyFns, StrCopy};
use symbols::{ALTERNATIVES_PATCHED, CPU_NUMBER, PCPU_HOT, PCPU_HOT_CPU_NUMBER, RETURN_THUNK};
use trampoline::{TaskCode, Trampoline, TrampolineSpec, MAX_FILTER_PIDS};

/// What each record holds besides the call: the return too (function
/// graph), the task (and which pids to keep), the values.
#[derive(Clone, Debug)]
pub struct Records<'a> {
    pub graph: bool,
    pub tasks: &'a TaskPlan,
    pub values: ValuePlan,
    /// With `values.args`: per site, does it record its calls' arguments
    /// (`Plan::arg_sites`; None: every site).
    pub arg_sites: Option<Arc<[bool]>>,
    /// The sites are direct entries: their stubs take the end of the code
    /// page (`layout::direct_stubs_len`).
    pub direct: bool,
    /// Spare sites after the plan's, for the functions of modules first
    /// loaded during the trace (`crate::plan::added_sites`): each gets
    /// what a planned site gets, its body (or stub) and drop counters.
    pub added: usize,
    /// Per site, the strings of its event that its body copies
    /// (`strcopy`); None: no site's.
    pub copies: Option<Arc<[Vec<StrCopy>]>>,
    /// The children's exits of forking syscalls traced: `ret_from_fork`'s
    /// site is recorded with its words, never hooked
    /// (`TrampolineSpec::entry_only`).
    pub child_exits: Option<ChildExitSites>,
}

impl<'a> Records<'a> {
    /// What `plan` asks the records to hold.
    pub fn of(plan: &'a Plan) -> Records<'a> {
        Records {
            graph: plan.graph,
            tasks: &plan.tasks,
            values: plan.values,
            arg_sites: with_spares(plan.arg_sites(), plan.exitless_added()),
            direct: plan.direct.is_some(),
            added: plan.exitless_added(),
            copies: site_copies(plan),
            child_exits: plan.child_exit_sites(),
        }
    }
}

/// `arg_sites` with `added` spare sites after the plan's, each storing
/// its calls' arguments: which function a spare site gets is known only
/// at its module's load, so the drainer keeps those of the functions the
/// `--args` globs select (`AddedSites::records_args`) and drops the rest.
fn with_spares(arg_sites: Option<Arc<[bool]>>, added: usize) -> Option<Arc<[bool]>> {
    let planned = arg_sites?;
    let spares = std::iter::repeat_n(true, added);
    Some(planned.iter().copied().chain(spares).collect())
}

/// Per site of `plan`, the strings of its event that do not last past it
/// (`strcopy::copies`), and `ret_from_fork`'s words when the children's
/// exits are traced (`strcopy::fork_words`); None when no site has any,
/// or when the plan traces the kernel's copy functions themselves (each
/// copy would then be recorded inside the event's own record, and the
/// fields show unread).
fn site_copies(plan: &Plan) -> Option<Arc<[Vec<StrCopy>]>> {
    let offsets = plan.events.offsets?;
    if !plan.values.args {
        return None;
    }
    let traced = |name: &str| {
        plan.funcs
            .iter()
            .any(|f| plan.image.names(*f).any(|n| n == name))
    };
    if traced(strcopy::STRNCPY_NOFAULT) || traced(strcopy::COPY_NOFAULT) {
        return None;
    }
    let formats = plan.event_formats();
    let mut copies: Vec<Vec<StrCopy>> = formats
        .iter()
        .map(|f| {
            f.as_ref()
                .map_or(Vec::new(), |f| strcopy::copies(f, &offsets))
        })
        .collect();
    // A new task's syscall, return value and name, at its `ret_from_fork`.
    if let Some(c) = plan.child_exit_sites() {
        if let Some(at) = copies.get_mut(c.site) {
            *at = strcopy::fork_words(c.regs, plan.tasks.layout.map(|l| l.comm));
        }
    }
    copies.iter().any(|c| !c.is_empty()).then(|| copies.into())
}

/// Exitless mode's guest code and rings for one plan: made once, at the
/// kernel's link addresses, and fitted to the running kernel at the first
/// attach (`fit`).
#[derive(Clone, Debug)]
pub struct ExitlessPlan {
    pub trampoline: Trampoline,
    /// What the trampoline was generated for (its CPU number's displacement
    /// is the link-time one until `fit`).
    spec: TrampolineSpec,
    /// The kernel's CPU number, in its per-CPU layout.
    cpu_number: PerCpuVar,
    /// What the code records of tasks, and the pids it keeps.
    tasks: TaskPlan,
    /// Records per ring the plan asked for, before `set_rings` fitted them
    /// to memory other than vmtrace's own.
    asked: u64,
    /// The shared body and a stub per site, even where per-site bodies fit
    /// the code page (`compact`): a guest's few free pages.
    compact: bool,
    /// The kernel's copy functions at their link addresses, when the code
    /// calls them (`fit` moves them with KASLR).
    copy_link: Option<CopyFns>,
    /// The children's exits of forking syscalls traced (`Records`).
    child_exits: Option<ChildExitSites>,
}

impl ExitlessPlan {
    /// The rings and the code for this image, CPU count and site count
    /// (`ring_records` per ring; None: as many as fit), and `what.added`
    /// spare sites after those.
    pub fn build(
        image: &KernelImage,
        cpus: usize,
        sites: usize,
        ring_records: Option<u64>,
        what: Records<'_>,
    ) -> Result<ExitlessPlan, ExitlessPlanError> {
        let Records {
            graph,
            tasks,
            values,
            arg_sites,
            direct,
            added,
            copies,
            child_exits,
        } = what;
        let addr = match (image.symbol(CPU_NUMBER), image.symbol(PCPU_HOT)) {
            (Some(s), _) => s.addr,
            (None, Some(hot)) => hot.addr.saturating_add(PCPU_HOT_CPU_NUMBER),
            (None, None) => return Err(ExitlessPlanError::NoCpuNumber(image.path.clone())),
        };
        let bad = || ExitlessPlanError::BadCpuNumber {
            path: image.path.clone(),
            off: addr,
        };
        let cpu_number = PerCpuVar::from_symbol(addr).ok_or_else(bad)?;
        // Its compiled returns are thunk jumps, which the kernel may keep or
        // rewrite once it knows its CPU: read before then, `__fentry__` would
        // say jump where the kernel returns by `ret` (or the other way), and
        // only `alternatives_patched` tells when. Refused before the guest runs
        // (`--mode auto` then traps).
        if image.symbol(RETURN_THUNK).is_some() && image.symbol(ALTERNATIVES_PATCHED).is_none() {
            return Err(ExitlessPlanError::AlternativesUnknown {
                place: image.path.display().to_string(),
            });
        }
        // The copy functions, at their link addresses until `fit`; without
        // them (or without copies) records hold no strings. In the shared
        // shape (and the function graph's) a site with copies gets an entry
        // path of its own (`trampoline::emit_code`).
        let copy_fns = copy_fns(image, KernelOffset::NONE);
        let copies = copies
            .filter(|_| copy_fns.is_some())
            .filter(|c| c.iter().any(|s| !s.is_empty()));
        let kind = match (&copies, values.args) {
            (Some(_), true) => RecordKind::Strings,
            (_, args) => RecordKind::of_args(args),
        };
        let spec = TrampolineSpec {
            layout: RingLayout::with_kind(cpus, sites + added, ring_records, graph, kind)?,
            cpu_number_disp: cpu_number.gs_disp(KernelOffset::NONE).ok_or_else(bad)?,
            preemptible: image.symbol(symbols::PREEMPT_SCHEDULE).is_some(),
            // `ret; int3` until `fit` reads how the kernel returns.
            ret: Default::default(),
            task: task_code(tasks, KernelOffset::NONE)?,
            retval: graph && values.retval,
            arg_sites,
            reserve: match direct {
                true => direct_stubs_len(sites + layout::direct_spares(direct, graph, added)),
                false => 0,
            },
            copy_fns: copies.as_ref().and(copy_fns),
            copies,
            entry_only: child_exits.as_ref().map(|c| c.site),
        };
        Ok(ExitlessPlan {
            asked: spec.layout.cap,
            trampoline: generate(&spec, false)?,
            copy_link: spec.copy_fns,
            spec,
            cpu_number,
            tasks: tasks.clone(),
            compact: false,
            child_exits,
        })
    }

    /// The same code for `cpus` rings of `cap` records each (where they
    /// must fit memory other than vmtrace's own, the guest's free pages,
    /// and be there for every CPU number the guest kernel may use, which
    /// only the running guest tells).
    pub fn set_rings(&mut self, cpus: usize, cap: u64) -> Result<(), ExitlessPlanError> {
        let l = self.spec.layout;
        let layout = RingLayout::with_kind(cpus, l.sites, Some(cap), l.graph, l.kind())?;
        self.regenerate(layout)
    }

    /// The same code for `cpus` rings of `cap` records at `HIGH_RINGS_VA`,
    /// in `area` bytes of memory of vmtrace's own (`RingLayout::high`);
    /// `place_rings` says where that memory is once it is there.
    pub fn set_high_rings(
        &mut self,
        cpus: usize,
        cap: u64,
        area: u64,
    ) -> Result<(), ExitlessPlanError> {
        let l = self.spec.layout;
        let layout = RingLayout::high(cpus, l.sites, cap, l.graph, l.kind(), area)?;
        self.regenerate(layout)
    }

    /// The high rings' guest-physical address (the code reads only their
    /// virtual ones: nothing is generated again).
    pub fn place_rings(&mut self, gpa: u64) {
        let l = self.spec.layout;
        self.spec.layout = l.placed(l.va, gpa);
    }

    fn regenerate(&mut self, layout: RingLayout) -> Result<(), ExitlessPlanError> {
        if layout != self.spec.layout {
            let spec = TrampolineSpec {
                layout,
                ..self.spec.clone()
            };
            self.trampoline = generate(&spec, self.compact)?;
            self.spec = spec;
        }
        Ok(())
    }

    /// The same code in its smallest shape: one shared body and a stub per
    /// site (a few instructions more per call) instead of a body per site,
    /// for memory that holds no more (the default guest's free low pages
    /// hold 152 pages; `--trace '*'`'s 9,865 bodies took 359).
    pub fn compact(&mut self) -> Result<(), ExitlessPlanError> {
        if !self.compact {
            self.trampoline = generate(&self.spec, true)?;
            self.compact = true;
        }
        Ok(())
    }

    /// Records per ring asked for (`--buffer`, or what vmtrace's own
    /// region holds): `layout().cap` unless `set_rings` gave fewer.
    pub fn asked_records(&self) -> u64 {
        self.asked
    }

    /// The rings' layout.
    pub fn layout(&self) -> RingLayout {
        self.spec.layout
    }

    /// The kernel's per-CPU CPU number, and where the code reads it
    /// (`gs:[disp]`).
    pub fn cpu_number(&self) -> (PerCpuVar, i32) {
        (self.cpu_number, self.spec.cpu_number_disp)
    }

    /// Where the code reads the current task and its pid, and where that
    /// task's comm is: `gs:[current_disp]`, then `[task + pid_off]`; the
    /// attach reads them there first (`Exitless::check_current_tasks`).
    /// None when the code records no task.
    pub fn task_reads(&self) -> Option<TaskReads> {
        let code = self.spec.task?;
        Some(TaskReads {
            current_disp: code.current_disp,
            pid_off: code.pid_off,
            comm_off: self.tasks.layout?.comm,
        })
    }

    /// Does the code copy events' strings (`strcopy`), calling the
    /// kernel's copy functions? (Words, a syscall's registers, call none.)
    pub fn copies_strings(&self) -> bool {
        let strings = |c: &Vec<StrCopy>| c.iter().any(|s| !s.is_word());
        self.spec.copy_fns.is_some()
            && self
                .spec
                .copies
                .as_ref()
                .is_some_and(|c| c.iter().any(strings))
    }

    /// The children's exits of forking syscalls traced, and the words
    /// `ret_from_fork`'s site copies into its records
    /// (`strcopy::fork_words`; none: the kernel's copy functions traced,
    /// or absent), which the drainer reads back; None: none traced.
    pub fn child_exits(&self) -> Option<(ChildExitSites, &[StrCopy])> {
        let sites = self.child_exits.clone()?;
        let words = self.spec.site_copies(sites.site);
        Some((sites, words))
    }

    /// How the trampoline returns (after `fit`).
    pub fn ret(&self) -> Return {
        self.spec.ret
    }

    /// Pages of code the trampoline takes (what a region in the guest's own
    /// pages must fit): those not all padding, as the session writes them
    /// there.
    pub fn code_pages(&self) -> usize {
        self.trampoline
            .code
            .chunks(CODE_PAGE)
            .filter(|c| !padding(c))
            .count()
    }

    /// Fit the code to the kernel running at `off` whose `__fentry__`
    /// returns as `ret` does: the CPU number's displacement where KASLR
    /// moved it (Linux 6.15+ per-CPU symbols are kernel addresses), the
    /// task's, and the returns. True when the code changed (nothing may be
    /// patched to it yet: the sites' targets move).
    pub fn fit(&mut self, off: KernelOffset, ret: Return) -> Result<bool, ExitlessPlanError> {
        let disp = self
            .cpu_number
            .gs_disp(off)
            .ok_or(ExitlessPlanError::CpuNumberOutOfReach {
                link: self.cpu_number.link,
                runtime: off.runtime(self.cpu_number.link),
            })?;
        let spec = TrampolineSpec {
            cpu_number_disp: disp,
            ret,
            task: task_code(&self.tasks, off)?,
            copy_fns: self.copy_link.map(|c| CopyFns {
                strncpy: off.runtime(c.strncpy),
                copy: off.runtime(c.copy),
            }),
            ..self.spec.clone()
        };
        if spec == self.spec {
            return Ok(false);
        }
        // Displacements and immediates differ; with a return thunk or
        // depth accounting the bodies are longer, so the sites' targets
        // are taken from the new code.
        self.trampoline = generate(&spec, self.compact)?;
        self.spec = spec;
        Ok(true)
    }

    /// The guest instructions of this trampoline's paths in other
    /// configurations, for the bench: a recorded call without the task
    /// (None when this code records none), and a call that a one-pid filter
    /// rejects, as the code walked with its first branch taken.
    pub fn task_path_variants(&self) -> Result<Option<(usize, usize)>, ExitlessPlanError> {
        let Some(task) = self.spec.task else {
            return Ok(None);
        };
        let without = generate(
            &TrampolineSpec {
                task: None,
                ..self.spec.clone()
            },
            self.compact,
        )?;
        let mut one_pid = task;
        one_pid.npids = 1;
        let filtered = generate(
            &TrampolineSpec {
                task: Some(one_pid),
                ..self.spec.clone()
            },
            self.compact,
        )?;
        let stub = match filtered.shape {
            trampoline::Shape::PerSite => 0,
            trampoline::Shape::Shared => trampoline::STUB_INSTRUCTIONS,
        };
        let rejected = disasm::walk_path(&filtered.code, filtered.common_va(), 1)
            .map_err(TrampolineError::from)?;
        Ok(Some((
            without.common_path_instructions(),
            stub + rejected.len(),
        )))
    }

    /// The bytes site `k` at `addr` becomes: a call to its stub.
    pub fn site_bytes(&self, k: usize, addr: u64) -> Result<[u8; SITE_LEN], TrampolineError> {
        trampoline::call_bytes(addr, self.trampoline.stub_va(k as u32))
    }
}

/// Where the trampoline reads the current task (`ExitlessPlan::task_reads`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskReads {
    /// `gs:[current_disp]` is the current task's `task_struct` address.
    pub current_disp: i32,
    /// `task_struct.pid`'s offset.
    pub pid_off: u32,
    /// `task_struct.comm`'s offset.
    pub comm_off: u32,
}

/// The unit in which the code is written to guest memory: pages, so that
/// in guest pages the padding between its parts takes no page.
pub const CODE_PAGE: usize = 4096;

/// A page of the code that holds only the padding between its parts.
pub fn padding(page: &[u8]) -> bool {
    page.iter().all(|&b| b == trampoline::INT3)
}

/// The kernel's nofault copy functions (`strcopy`) in `image`, at `off`;
/// None when it lacks either.
fn copy_fns(image: &KernelImage, off: KernelOffset) -> Option<CopyFns> {
    let at = |name| image.symbol(name).map(|s| off.runtime(s.addr));
    Some(CopyFns {
        strncpy: at(strcopy::STRNCPY_NOFAULT)?,
        copy: at(strcopy::COPY_NOFAULT)?,
    })
}

/// What the code records of tasks for the kernel at `off` (the current
/// task's displacement moves with KASLR in the 6.15+ per-CPU layout only);
/// None when the kernel's task layout is unknown.
fn task_code(tasks: &TaskPlan, off: KernelOffset) -> Result<Option<TaskCode>, ExitlessPlanError> {
    let Some(layout) = tasks.layout else {
        return Ok(None);
    };
    let pids = &tasks.filter.pids;
    if pids.len() > MAX_FILTER_PIDS {
        return Err(ExitlessPlanError::TooManyPids(pids.len()));
    }
    let mut code = TaskCode {
        current_disp: 0,
        pid_off: layout.pid,
        pids: [0; MAX_FILTER_PIDS],
        npids: pids.len(),
    };
    code.pids[..pids.len()].copy_from_slice(pids);
    let disp = layout
        .current_var
        .gs_disp(off)
        .and_then(|d| d.checked_add(i32::try_from(layout.current_member).ok()?))
        .ok_or(ExitlessPlanError::CpuNumberOutOfReach {
            link: layout.current_var.link,
            runtime: off.runtime(layout.current_var.link),
        })?;
    code.current_disp = disp;
    Ok(Some(code))
}

/// The trampoline for `spec` (in the shared shape when `compact`), if it
/// fits its code page.
fn generate(spec: &TrampolineSpec, compact: bool) -> Result<Trampoline, ExitlessPlanError> {
    let trampoline = match compact {
        true => trampoline::generate_shaped(spec, trampoline::Shape::Shared)?,
        false => trampoline::generate(spec)?,
    };
    if trampoline.code.len() as u64 > CODE_LEN {
        return Err(ExitlessPlanError::CodeTooBig {
            len: trampoline.code.len(),
        });
    }
    Ok(trampoline)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spare sites store every call's arguments after the plan's
    /// selection; without `--args` (None) none is added.
    #[test]
    fn spare_sites_store_arguments_when_any_site_does() {
        let planned: Arc<[bool]> = vec![false, true].into();
        let all = with_spares(Some(planned), 3).unwrap();
        assert_eq!(&*all, &[false, true, true, true, true]);
        assert_eq!(with_spares(None, 3), None);
    }
}
