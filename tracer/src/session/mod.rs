//! One tracing session over a running guest: plan the sites, attach (patch
//! under a pause), detach (restore), and turn what was recorded into a Trace.

use std::sync::Arc;
use std::thread::JoinHandle;
use vmm::GuestRam;

use vmm::gva::AddressSpace;
use vmm::{Stopped, TrapHandler, VcpuSpace};

use crate::error::TracerError;
use crate::kernel::cpus::GuestCpus;
use crate::kernel::kaslr::{self, Detected, KernelOffset};
use crate::plan::exitless::layout::RETURN_TRAP_VA;
use crate::plan::{Mode, Plan};
use counters::Counters;
use equip::{boxed, equip, stack_source, task_source};
use exitless::collect::{DrainFields, DrainStart, DrainTasks, DrainValues};
use exitless::state::{Exitless, ExitlessError, Resolved};
use patch::{AttachCounts, CallSites, DetachCounts, PatchError, PatchedSite, Survey};
use reach::{DirectState, Reach, Times};
use record::{GraphHook, Recorder};
use shadow::ShadowStacks;
use stacks::StackSource;
use store::{Storage, Stored};
use tasks::TaskSource;

pub mod args;
pub mod backend;
pub mod counters;
pub mod direct;
mod driver;
mod drop_causes;
mod equip;
pub(crate) mod event_ids;
pub mod event_keys;
pub mod exitless;
mod finish;
pub mod guest_ftrace;
#[cfg(test)]
pub(in crate::session) mod kvm_tests;
pub mod module_added;
pub mod module_direct;
pub mod module_marks;
pub mod module_protos;
pub mod module_sites;
pub mod module_traps;
pub mod patch;
mod reach;
mod ready;
pub mod record;
pub mod region;
pub mod shadow;
pub mod stacks;
pub mod store;
pub mod tasks;
pub mod watch;
mod writes;
pub use backend::{Attached, Observer};
pub use driver::{Ended, Prepared, Session, SessionError, Start};
pub use finish::{Progress, Saved};
pub use ready::{Attach, NotReady};
pub use store::Recording;

/// With page-table isolation, Linux gives each process a pair of top-level
/// tables 8 KiB aligned, the user one 4 KiB above the kernel one, and flips
/// this CR3 bit on every kernel entry and exit (PTI_USER_PGTABLE_BIT in
/// arch/x86/entry/calling.h). The user table maps no kernel text.
const PTI_USER_PGTABLE_BIT: u64 = 1 << 12;

/// What an attach found under its stop, nothing written yet (`check`).
struct Checked<'a> {
    off: KernelOffset,
    /// The kernel's own page tables.
    space: AddressSpace<'a>,
    surveyed: patch::Surveyed,
    /// Each vCPU's GS base, where known.
    gs_bases: Vec<(usize, u64)>,
    /// Direct entries: the sites ready, with their running instructions.
    direct: Option<direct::attach::DirectChecked>,
}

/// A tracing session.
pub struct Tracer {
    plan: Plan,
    counters: Arc<Counters>,
    /// The store thread (`crate::session::store`), until `finish` joins it.
    store: Option<JoinHandle<Stored>>,
    /// Flight recorder: the dropped events are the oldest.
    overwrite: bool,
    patched: Vec<PatchedSite>,
    pub attach_counts: AttachCounts,
    /// All detaches of this session, added up.
    pub detached: DetachCounts,
    times: Times,
    /// How calls reach vmtrace, with what only that mode has.
    reach: Reach,
    /// Direct entries' sites and stubs (None: ftrace sites).
    direct: Option<DirectState>,
    /// Where the kernel runs relative to its vmlinux (KASLR), found at the
    /// first attach attempt that could tell.
    offset: Option<KernelOffset>,
    /// Who runs the guest, when not vmtrace's own VMM (`Recording::vmm`).
    vmm: String,
    /// The command line that asked for the recording (`Recording::cmdline`).
    cmdline: Vec<String>,
    /// How events get their task (None: the kernel's layout is unknown).
    tasks: Option<Arc<TaskSource>>,
    /// How `--stack` calls unwind (None: no stacks recorded).
    stacks: Option<Arc<StackSource>>,
    /// The guest tasks, arguments and kernel stacks events name, shared
    /// with the store (`store::Store::tasks`, `args`, `stacks`).
    tables: Tables,
    /// The traced functions' prototypes when values are recorded
    /// (`Plan::prototypes`, looked up once).
    prototypes: Vec<Option<crate::trace::model::Prototype>>,
    /// How the guest's own ftrace is kept off the patched sites, and the
    /// records the attach marked (`guest_ftrace`).
    guest_ftrace: guest_ftrace::Guard,
    excluded: Option<crate::kernel::ftrace_records::Excluded>,
    /// Where the kernel's stacks are: the context checks of direct
    /// entries and of the region's removal (`direct::contexts`).
    stack_layout: crate::kernel::stack_bounds::StackLayout,
    /// `-e`: the keys whose counts the attach set (`event_keys`).
    event_keys: Vec<event_keys::SetKey>,
    /// The own VMM's traps in the module loader (`module_traps`).
    module_traps: Option<Arc<module_traps::ModuleTraps>>,
}

/// The tables events name, shared with the store.
struct Tables {
    tasks: Arc<tasks::TaskTable>,
    args: Arc<args::ArgTable>,
    stacks: Arc<stacks::StackTable>,
}

impl Tracer {
    /// An exitless tracer (`ring_records` per CPU ring, or as many as fit),
    /// and its trap handlers (which then see no trap: any is an error).
    /// The rings and the code are planned here (`ExitlessPlan`), before the
    /// guest runs. Events are kept in memory.
    pub fn exitless(
        plan: Plan,
        ncpus: usize,
        max_events: u64,
        ring_records: Option<u64>,
    ) -> Result<(Tracer, Vec<Box<dyn TrapHandler>>), TracerError> {
        let mode = Mode::exitless(&plan, ncpus, ring_records)?;
        Tracer::create(plan, ncpus, mode, Recording::memory(max_events))
    }

    /// The tracer and one trap handler per vCPU; with `plan.graph`, the
    /// handlers hook returns too (vmtrace's return trap at `RETURN_TRAP_VA`).
    /// Events are kept in memory.
    pub fn new(plan: Plan, ncpus: usize, max_events: u64) -> (Tracer, Vec<Box<dyn TrapHandler>>) {
        Tracer::trap(plan, ncpus, Recording::memory(max_events))
    }

    /// A tracer in `mode` (with exitless mode's planned code) recording as
    /// `rec` says.
    pub fn create(
        plan: Plan,
        ncpus: usize,
        mode: Mode,
        rec: Recording,
    ) -> Result<(Tracer, Vec<Box<dyn TrapHandler>>), TracerError> {
        let code = match mode {
            Mode::Trap => return Ok(Tracer::trap(plan, ncpus, rec)),
            Mode::Exitless(code) => *code,
        };
        let (counters, recs, store) = record::recorders(
            Arc::clone(&plan.index),
            ncpus,
            rec.max_events,
            rec.storage,
            Arc::new(plan.image.functions.clone()),
        );
        let sink = exitless::collect::Sink {
            tx: recs[0].sink(),
            free: Some(store.free.clone()),
        };
        let ex = Exitless::new(code, sink);
        let table = store.tasks();
        let tasks = task_source(&plan, &table);
        let stacks = stack_source(&plan, &store);
        let mut recs = recs;
        // Only `--stack` sites trap in exitless mode: their recorders name
        // tasks and values as trap mode's do (no function graph here).
        let modules = equip(&mut recs, &plan, &tasks, &stacks, store.args());
        let args = store.args();
        let tables = (table, args, store.stacks());
        let reach = Reach::Exitless(Box::new(ex));
        let mut t = Tracer::assemble(plan, counters, store.thread, false, tables, reach);
        t.module_traps = modules;
        t.tasks = tasks;
        t.stacks = stacks;
        t.vmm = rec.vmm.clone();
        t.cmdline = rec.cmdline.clone();
        t.send_head(store.head, &rec.kernel);
        Ok((t, boxed(recs)))
    }

    fn trap(plan: Plan, ncpus: usize, rec: Recording) -> (Tracer, Vec<Box<dyn TrapHandler>>) {
        let (t, recs) = Tracer::trap_with(plan, ncpus, rec, |plan, recs| {
            let hook = plan.graph.then(|| {
                Arc::new(GraphHook {
                    trap_va: RETURN_TRAP_VA,
                    shadow: ShadowStacks::default(),
                })
            });
            if let Some(hook) = &hook {
                for r in recs {
                    r.hook_returns(Arc::clone(hook));
                }
            }
            hook
        });
        (t, boxed(recs))
    }

    /// A trap-mode tracer and its recorders; `returns` readies them for
    /// the graph as the mode catches returns (the return trap's hook, if any).
    fn trap_with(
        plan: Plan,
        ncpus: usize,
        rec: Recording,
        returns: impl FnOnce(&Plan, &mut [Recorder]) -> Option<Arc<GraphHook>>,
    ) -> (Tracer, Vec<Recorder>) {
        let overwrite = matches!(rec.storage, Storage::Overwrite { .. });
        let (counters, mut recs, store) = record::recorders(
            Arc::clone(&plan.index),
            ncpus,
            rec.max_events,
            rec.storage,
            Arc::new(plan.image.functions.clone()),
        );
        let hook = returns(&plan, &mut recs);
        let table = store.tasks();
        let tasks = task_source(&plan, &table);
        let stacks = stack_source(&plan, &store);
        let modules = equip(&mut recs, &plan, &tasks, &stacks, store.args());
        let tables = (table, store.args(), store.stacks());
        let reach = Reach::Trap {
            graph: hook,
            return_trap_in: false,
        };
        let mut t = Tracer::assemble(plan, counters, store.thread, overwrite, tables, reach);
        t.module_traps = modules;
        t.tasks = tasks;
        t.stacks = stacks;
        t.vmm = rec.vmm.clone();
        t.cmdline = rec.cmdline.clone();
        t.send_head(store.head, &rec.kernel);
        (t, recs)
    }

    fn assemble(
        plan: Plan,
        counters: Arc<Counters>,
        store: JoinHandle<Stored>,
        overwrite: bool,
        (tasks, args, stacks): (
            Arc<tasks::TaskTable>,
            Arc<args::ArgTable>,
            Arc<stacks::StackTable>,
        ),
        reach: Reach,
    ) -> Tracer {
        // What the kernel rewrote of its own text at boot, read from the
        // image now rather than at its first use, inside the attach's
        // pause (`check`): on a distribution kernel that read was most of
        // the pause.
        plan.boot_patched();
        Tracer {
            prototypes: plan.prototypes(),
            guest_ftrace: guest_ftrace::Guard::of(&plan),
            excluded: None,
            direct: direct::DirectSites::of(&plan).map(DirectState::new),
            stack_layout: crate::kernel::stack_bounds::StackLayout::find(
                &plan.image,
                plan.btf.as_deref(),
            ),
            plan,
            counters,
            store: Some(store),
            overwrite,
            patched: Vec::new(),
            attach_counts: AttachCounts::default(),
            detached: DetachCounts::default(),
            times: Times::default(),
            reach,
            offset: None,
            vmm: String::new(),
            cmdline: Vec::new(),
            tasks: None,
            stacks: None,
            tables: Tables {
                tasks,
                args,
                stacks,
            },
            event_keys: Vec::new(),
            module_traps: None,
        }
    }

    /// Take the kernel's offsets as known instead of detecting them at the
    /// first attach: for a kernel loaded where its vmlinux says and never
    /// run (`vmtrace bench`'s attach-scaling figure), whose syscall entry
    /// is not set yet. Before any attach.
    pub fn assume_kernel_offset(&mut self, o: KernelOffset) {
        self.set_offset(o);
    }

    fn set_offset(&mut self, o: KernelOffset) {
        self.plan.index.set_slide(o.virt);
        if let Some(t) = &self.tasks {
            t.set_slide(o);
        }
        if let Some(s) = &self.stacks {
            s.set_slide(o.virt);
        }
        self.offset = Some(o);
    }

    /// The Linux kernel's KASLR offsets, once an attach attempt found them;
    /// None before, and for kernels that are not Linux.
    pub fn kernel_offset(&self) -> Option<KernelOffset> {
        self.offset
            .filter(|_| self.plan.image.symbol(kaslr::SYSCALL_ENTRY).is_some())
    }

    /// Exitless mode with tasks: the instructions of a recorded call without
    /// the task, and of a call a one-pid filter rejects (the bench's
    /// comparisons; `Exitless::task_path_variants`).
    pub fn task_path_variants(&self) -> Option<(usize, usize)> {
        self.reach
            .exitless()
            .and_then(|ex| ex.plan().task_path_variants().ok().flatten())
    }

    /// The exitless trampoline (exitless mode).
    pub fn trampoline(&self) -> Option<&crate::plan::exitless::trampoline::Trampoline> {
        self.reach.exitless().map(|ex| &ex.plan().trampoline)
    }

    /// How calls reach vmtrace: "trap" or "exitless" (`Mode::name`).
    pub fn mode_name(&self) -> &'static str {
        self.reach.name()
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// vCPUs traced: one recorder, and one row of counters, each.
    fn ncpus(&self) -> usize {
        self.counters.counts.len()
    }

    pub fn is_attached(&self) -> bool {
        !self.patched.is_empty()
    }

    /// Prepare what an attach can prepare while the guest runs, so that its
    /// pause is shorter: in exitless mode, vmtrace's code and rings, in its
    /// own memory slot that the guest cannot reach before the attach maps
    /// it (`Exitless::stage`). Optional: an attach does it otherwise. Call
    /// it once the guest's memory exists, e.g. right after the VM starts.
    pub fn stage(&mut self, mem: &Arc<dyn GuestRam>) -> Result<(), TracerError> {
        if let Some(ex) = self.reach.exitless_mut() {
            ex.stage(mem)?;
        }
        Ok(())
    }

    /// Where `__fentry__` runs, and what to do with sites still calling it.
    fn call_sites(&self, off: KernelOffset) -> (Option<u64>, CallSites) {
        let fentry = self
            .plan
            .image
            .symbol(crate::kernel::sites::FENTRY)
            .map(|s| off.runtime(s.addr));
        // Linux converts its own sites in ftrace_init: one still holding
        // `call __fentry__` must wait for it (also when `ftrace_enabled` is
        // unknown, as with symbols from kallsyms); a kernel that does not
        // (the mini guest) has its calls patched.
        let calls = match (self.plan.ftrace_enabled, self.plan.image.linux) {
            (None, false) => CallSites::Patch,
            _ => CallSites::Wait,
        };
        (fentry, calls)
    }

    /// Readies exitless mode's staged code for the kernel found at `off`
    /// and checks the vCPUs' `cpu_number`s, writing nothing the guest can
    /// reach; says why the guest is not ready, if it is not.
    fn prepare_exitless(
        &mut self,
        space: &mut AddressSpace<'_>,
        off: KernelOffset,
        gs_bases: &[(usize, u64)],
    ) -> Result<Option<NotReady>, TracerError> {
        let Some(ex) = self.reach.exitless_mut() else {
            return Ok(None);
        };
        let per_cpu_offset = self
            .plan
            .image
            .symbol(crate::plan::exitless::symbols::PER_CPU_OFFSET)
            .map(|s| off.runtime(s.addr));
        if ex.resolve(space, &self.plan.image, off)? == Resolved::AlternativesPending {
            return Ok(Some(NotReady::AlternativesPending));
        }
        // The guest's own CPUs (not the hypervisor's vCPUs: `nosmp`,
        // `maxcpus=`, a CPU offline).
        let cpus = GuestCpus::read(space, &self.plan.image, off).map_err(ExitlessError::from)?;
        ex.check_cpu_numbers(space, gs_bases, per_cpu_offset, cpus.as_ref())?;
        let linux = self.plan.image.linux;
        ex.check_current_tasks(space, gs_bases, per_cpu_offset, (cpus.as_ref(), linux))?;
        if ex.plan().copies_strings() {
            exitless::copy_fns::check(&self.plan, space, off)?;
        }
        Ok(None)
    }

    /// Patch every target site, if the guest is ready. The guest is paused
    /// by the caller; all writes happen in this one window. When the guest's
    /// own ftrace_init has not finished (its `ftrace_enabled` is 0, or any
    /// selected site still calls `__fentry__`), nothing is written and the
    /// caller should resume the guest and try again.
    pub fn attach(&mut self, paused: &dyn Stopped) -> Result<Attach<'_>, TracerError> {
        let mut c = match self.check(paused)? {
            Ok(c) => c,
            Err(why) => return Ok(Attach::NotReady(why)),
        };
        // Every check before the first write: a guest found not ready is
        // resumed exactly as it was (no site, no page-table entry, nothing
        // the guest can reach changed; `resolve` may rewrite vmtrace's staged
        // code, still unmapped, once, for the kernel it found).
        if let Some(not_ready) = self.prepare_exitless(&mut c.space, c.off, &c.gs_bases)? {
            return Ok(Attach::NotReady(not_ready));
        }
        // Exitless events are dated by the guest's clock: none, no attach.
        let clock = match self.reach {
            Reach::Exitless(_) => Some(paused.guest_clock().ok_or(ExitlessError::NoClock)?),
            Reach::Trap { .. } => None,
        };
        let (patched, skipped, mapped, guarded) =
            match self.write_guarded(&mut c.space, c.off, c.surveyed, c.direct, paused.ram())? {
                Ok(w) => w,
                Err(not_ready) => return Ok(Attach::NotReady(not_ready)),
            };
        let direct = self.direct.as_ref().map_or((0, 0, 0), |d| d.counts);
        self.attach_counts = AttachCounts {
            patched: patched.len(),
            skipped_other: skipped,
            exitless: mapped,
            direct_changed: direct.0,
            direct_busy: direct.1,
            direct_tasks: direct.2,
            guest_ftrace: guarded,
            event_tests: 0,
            event_keys: 0,
            module_traps: 0,
        };
        self.patched = patched;
        self.enable_events(&mut c.space, c.off, paused.ram())?;
        self.follow_modules(&mut c.space, c.off, paused.ram())?;
        if let (Some(ex), Some(clock)) = (self.reach.exitless_mut(), clock) {
            // Task structs are read through the kernel's own tables (the
            // kernel half every process shares): its `init_top_pgt`, not
            // the CR3 of a process that may exit while the guest runs.
            let tasks = self.tasks.as_ref().map(|source| DrainTasks {
                source: Arc::clone(source),
                root: tasks::kernel_root(&c.space, &self.plan.image, c.off),
                mode: c.space.mode(),
            });
            let root = tasks::kernel_root(&c.space, &self.plan.image, c.off);
            let values = DrainValues {
                // (The sites added during the trace record them too.)
                args: args::ArgSource::new(&self.tables.args, self.plan.arg_sites())
                    .map(|a| a.with_added(&self.plan.index)),
                retval: self.plan.graph && self.plan.values.retval,
                fields: equip::field_source(&self.plan).map(|source| DrainFields {
                    source,
                    root,
                    mode: c.space.mode(),
                }),
                child_exits: None, // the code's own: `Exitless::start_drainer`
            };
            ex.start_drainer(DrainStart {
                clock,
                counters: Arc::clone(&self.counters),
                index: Arc::clone(&self.plan.index),
                tasks,
                values,
            });
        }
        self.attached_at(paused);
        Ok(Attach::Attached(&self.attach_counts))
    }

    /// When and how long the attach's stop was.
    fn attached_at(&mut self, paused: &dyn Stopped) {
        self.times.tsc_khz = paused.guest_clock().map_or(0, |c| u64::from(c.tsc_khz));
        self.times.attach_ns = vmm::Trap::now_ns();
        self.times.attach_window = paused.window();
        self.times.attach_latency = paused.latency();
    }

    /// What an attach checks under `paused` before it writes anything:
    /// where the kernel runs, that it is the planned one and has finished
    /// its ftrace_init, and every selected site read. Reads only.
    fn check<'a>(
        &mut self,
        paused: &'a dyn Stopped,
    ) -> Result<Result<Checked<'a>, NotReady>, TracerError> {
        let Some(off) = self.find_offset(paused)? else {
            return Ok(Err(NotReady::KernelOffsetUnknown));
        };
        // The vmlinux's addresses, slid to where the kernel runs.
        let addrs: Vec<u64> = self
            .plan
            .index
            .addrs
            .iter()
            .map(|&a| off.runtime(a))
            .collect();
        let vcpus = paused.vcpu_spaces();
        let gs_bases: Vec<(usize, u64)> = vcpus
            .iter()
            .filter_map(|v| Some((v.cpu, v.gs_base?)))
            .collect();
        // Kernel text (a site) and, when the symbols have it, kernel data
        // (`ftrace_enabled`): a PTI user table maps the one, never the other.
        let data = self.plan.ftrace_enabled.map(|va| off.runtime(va));
        let probes: Vec<u64> = addrs.first().copied().into_iter().chain(data).collect();
        let mut space = kernel_space(vcpus, &probes).ok_or(match addrs.first() {
            Some(&text) => PatchError::NoKernelTables { text, data },
            None => PatchError::NoPaging,
        })?;
        if let Some(va) = data {
            if space.read_array::<4>(va).map(u32::from_le_bytes) == Ok(0) {
                return Ok(Err(NotReady::FtraceInitRunning));
            }
        }
        patch::verify_image(
            &mut space,
            &self.plan.image,
            self.plan.boot_patched(),
            &addrs,
            off.virt,
            self.direct.is_some(),
        )?;
        if self.direct.is_some() {
            // The kernel rewrites its text by address when it applies its
            // alternatives and paravirt calls (apply_alternatives and
            // apply_paravirt, arch/x86/kernel/alternative.c): a jump written
            // before would be overwritten, or cut. Every mode waits.
            if exitless::state::alternatives_pending(&mut space, &self.plan.image, off) {
                return Ok(Err(NotReady::AlternativesPending));
            }
            return Ok(match self.check_direct(&mut space, off, paused)? {
                Ok((surveyed, d)) => Ok(Checked {
                    off,
                    space,
                    surveyed,
                    gs_bases,
                    direct: Some(d),
                }),
                Err(why) => Err(why),
            });
        }
        let (fentry, calls) = self.call_sites(off);
        let surveyed = match patch::survey(&mut space, fentry, &addrs, calls)? {
            Survey::Ready(s) => s,
            Survey::GuestNotReady { calls, first } => {
                return Ok(Err(NotReady::CallSites { calls, first }))
            }
        };
        Ok(Ok(Checked {
            off,
            space,
            surveyed,
            gs_bases,
            direct: None,
        }))
    }

    /// The kernel's offsets (KASLR): known, or detected under `paused`;
    /// None while they cannot be told yet.
    fn find_offset(&mut self, paused: &dyn Stopped) -> Result<Option<KernelOffset>, TracerError> {
        if self.offset.is_none() {
            if let Detected::Offset(o) = kaslr::detect(paused, &self.plan.image)? {
                // Before any site is patched: traps find their site by
                // RIP - o.virt from the first one on.
                self.set_offset(o);
            }
        }
        Ok(self.offset)
    }

    /// Hooked frames still waiting for their return (trap-mode graph).
    pub fn frames_live(&self) -> usize {
        self.reach.graph_hook().map_or(0, |h| h.shadow.live())
    }

    /// Restore every patched site (`module_sites`), the guest paused or stopped: `detached` adds up.
    pub fn detach(&mut self, mem: &dyn GuestRam) -> Result<DetachCounts, TracerError> {
        let mut c = module_sites::detach(mem, &self.plan.image, &mut self.patched)?;
        c.guest_ftrace = self.reenable_guest_ftrace(mem);
        self.unfollow_modules(mem, &mut c);
        c.event_keys = event_keys::restore(mem, &std::mem::take(&mut self.event_keys));
        self.patched.clear();
        self.detached.restored += c.restored;
        self.detached.changed += c.changed;
        self.detached.event_keys += c.event_keys;
        self.times.detach_ns = vmm::Trap::now_ns();
        Ok(c)
    }
}

/// The kernel's own page tables, to read and write kernel text and data
/// and to map vmtrace's region through: never a PTI user table, which maps
/// the kernel's text (Linux clones it there, `pti_clone_kernel_text`) but
/// not its data, and whose upper levels are copies, so that a region
/// mapped there would be missing from the kernel's view.
///
/// With page-table isolation each process has a pair of top-level tables 8
/// KiB aligned, the user one 4 KiB above the kernel one; a vCPU in user mode,
/// or on the kernel's entry path before it switches, has the user one loaded
/// (`PTI_USER_PGTABLE_BIT` set). So of each parked vCPU's CR3 (kernel-mode
/// vCPUs first), the table with that bit clear is tried first, then CR3 as
/// loaded (a kernel without PTI may have its table at any page); the first
/// under which every probe (kernel text, and kernel data when known) is
/// mapped wins. Without probes, the first paged vCPU's.
pub fn kernel_space<'m>(mut vcpus: Vec<VcpuSpace<'m>>, probes: &[u64]) -> Option<AddressSpace<'m>> {
    // Stable: kernel mode (CPL 0) first, otherwise in vCPU order.
    vcpus.sort_by_key(|v| v.user_mode);
    if probes.is_empty() {
        return vcpus.into_iter().next().map(|v| v.space);
    }
    vcpus
        .iter()
        .flat_map(|v| {
            let root = v.space.root();
            [root & !PTI_USER_PGTABLE_BIT, root].map(|r| v.space.with_root(r))
        })
        .find(|a| probes.iter().all(|&va| a.translate(va).is_ok()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::Bytes;
    use vm_memory::GuestAddress;
    use vm_memory::GuestMemoryMmap;

    /// A parked vCPU, in user mode or not, with `cr3` loaded.
    fn vcpu(mem: &GuestMemoryMmap, cpu: usize, cr3: u64, user_mode: bool) -> VcpuSpace<'_> {
        let space = AddressSpace::new(mem, cr3, vmm::gva::PagingMode::Level4);
        VcpuSpace {
            cpu,
            user_mode,
            space,
            gs_base: None,
        }
    }

    /// Guest memory with the boot tables, and a PTI pair at 2 MiB: the
    /// kernel table a copy of the boot PML4; the user table maps only the
    /// 2 MiB of kernel text at `TEXT` (Linux's `pti_clone_kernel_text`),
    /// through upper tables of its own, and no kernel data.
    fn pti_pair() -> (GuestMemoryMmap, u64, u64) {
        let mem = vm_memory::GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 64 << 20)]).unwrap();
        vmm::boot::regs::setup_page_tables(&mem).unwrap();
        let kernel = 0x20_0000u64;
        let user = kernel | PTI_USER_PGTABLE_BIT;
        let mut pml4 = [0u8; 4096];
        mem.read_slice(&mut pml4, GuestAddress(vmm::layout::PML4_START))
            .unwrap();
        mem.write_slice(&pml4, GuestAddress(kernel)).unwrap();
        let (pdpt, pd) = (0x20_2000u64, 0x20_3000u64);
        for t in [user, pdpt, pd] {
            mem.write_slice(&[0u8; 4096], GuestAddress(t)).unwrap();
        }
        let table = 0b11; // present, writable
        mem.write_obj(pdpt | table, GuestAddress(user + 511 * 8))
            .unwrap();
        mem.write_obj(pd | table, GuestAddress(pdpt + 510 * 8))
            .unwrap();
        let pde = ((TEXT >> 21) & 511) * 8;
        mem.write_obj(0x100_0000u64 | table | 0x80, GuestAddress(pd + pde))
            .unwrap();
        (mem, kernel, user)
    }
    const TEXT: u64 = 0xffff_ffff_8100_0000;
    const DATA: u64 = 0xffff_ffff_8140_0000;

    #[test]
    fn the_kernel_table_is_chosen_when_the_user_one_maps_kernel_text() {
        let (mem, kernel, user) = pti_pair();
        let pcid = 0x805; // the user PCID has bit 11 set
        let user_space = AddressSpace::new(&mem, user, vmm::gva::PagingMode::Level4);
        assert_eq!(
            user_space.translate(TEXT).unwrap().gpa,
            0x100_0000,
            "the user table maps kernel text"
        );
        assert!(user_space.translate(DATA).is_err());
        // A late attach finds vCPU 0 in user mode (or on the entry path at
        // CPL 0, still on the user table): before, its user table was used
        // because it mapped the text.
        for user_mode in [true, false] {
            for probes in [&[TEXT][..], &[TEXT, DATA][..]] {
                let vcpus = vec![vcpu(&mem, 0, user | pcid, user_mode)];
                let space = kernel_space(vcpus, probes).expect("the kernel table");
                assert_eq!(space.root() & !0xfff, kernel, "probes {probes:x?}");
            }
        }
        // A kernel without PTI may have its table on an odd page; the page
        // below it (zeros here) maps nothing: CR3 as loaded is used.
        let odd = 0x20_5000u64;
        let mut pml4 = [0u8; 4096];
        mem.read_slice(&mut pml4, GuestAddress(kernel)).unwrap();
        mem.write_slice(&pml4, GuestAddress(odd)).unwrap();
        mem.write_slice(&[0u8; 4096], GuestAddress(odd - 0x1000))
            .unwrap();
        let vcpus = vec![vcpu(&mem, 0, odd, false)];
        assert_eq!(kernel_space(vcpus, &[TEXT, DATA]).unwrap().root(), odd);
        // No table maps the data: none is the kernel's.
        let vcpus = vec![vcpu(&mem, 0, user, true)];
        mem.write_slice(&[0u8; 4096], GuestAddress(kernel)).unwrap();
        assert!(kernel_space(vcpus, &[TEXT, DATA]).is_none());
    }

    #[test]
    fn attach_reaches_kernel_text_past_a_user_mode_vcpu_under_pti() {
        let mem = vm_memory::GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 64 << 20)]).unwrap();
        vmm::boot::regs::setup_page_tables(&mem).unwrap();
        // A PTI pair: the kernel table (a copy of the boot PML4) 8 KiB
        // aligned, the user table above it, empty, so no kernel text in it.
        let kernel = 0x20_0000u64;
        let user = kernel | PTI_USER_PGTABLE_BIT;
        let mut pml4 = [0u8; 4096];
        mem.read_slice(&mut pml4, GuestAddress(vmm::layout::PML4_START))
            .unwrap();
        mem.write_slice(&pml4, GuestAddress(kernel)).unwrap();
        mem.write_slice(&[0u8; 4096], GuestAddress(user)).unwrap();
        let text = 0xffff_ffff_8100_0000u64;
        let pcid = 0x5;
        // vCPU 0 in user mode with the user table (vCPU 1 not paged yet,
        // so not listed).
        let vcpus = vec![vcpu(&mem, 0, user | pcid, true)];
        let space = kernel_space(vcpus, &[text]).expect("a root mapping text");
        assert_eq!(space.root(), kernel | pcid);
        // A kernel-mode vCPU is preferred whatever its position.
        let vcpus = vec![vcpu(&mem, 0, user, true), vcpu(&mem, 1, kernel, false)];
        let space = kernel_space(vcpus, &[text]).unwrap();
        assert_eq!(space.root(), kernel);
        // No paged vCPU: no address space.
        assert!(kernel_space(Vec::new(), &[text]).is_none());
    }
}
