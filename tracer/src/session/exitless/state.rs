//! One session's exitless machinery: the planned code and rings
//! (`crate::plan::exitless::ExitlessPlan`), where they stand in the guest,
//! and the drainer.

use std::sync::{Arc, Mutex};

use vm_memory::GuestAddress;
use vmm::gva::AddressSpace;
use vmm::GuestRam;

use super::backing::RegionPages;
use super::child_starts::ChildStarts;
use super::code::write_code;
use super::collect::{self, DrainError, DrainStart, Sink};
use super::map::{self, Mapped};
use super::pending::PendingDrainer;
use super::ring;
use crate::kernel::cpus::GuestCpus;
use crate::kernel::kaslr::KernelOffset;
use crate::kernel::sites::SITE_LEN;
use crate::kernel::symbols::KernelImage;
use crate::plan::exitless::error::{ExitlessPlanError, TrampolineError};
use crate::plan::exitless::layout::{RingLayout, DATA_GPA, DATA_LEN, FRAME_NEXT_OFF, SPARE_PD_GPA};
use crate::plan::exitless::ret::Return;
use crate::plan::exitless::symbols::{ALTERNATIVES_PATCHED, ITS_RETURN_THUNK};
use crate::plan::exitless::{ExitlessPlan, TaskReads};

pub use super::error::ExitlessError;

/// Exitless state of one tracing session.
pub struct Exitless {
    /// The code and the rings' layout (fitted to the running kernel at
    /// the first attach: `resolve`).
    plan: ExitlessPlan,
    /// Where the region stands in the guest.
    region: Region,
    /// The events' way to the collector, until the drainer takes it.
    sink: Option<Sink>,
    /// Spawned at `stage`, started at the first attach.
    drainer: Option<PendingDrainer>,
    mem: Option<Arc<dyn GuestRam>>,
    /// The region in free guest pages (`backing`), when the VMM has no
    /// memory of vmtrace's own to give; None: vmtrace's own slot.
    pages: Option<Arc<Mutex<RegionPages>>>,
    /// The rings' drop counters as they were when the region was taken
    /// out of the guest (`remove`): its pages hold the guest's bytes again.
    removed_drops: Option<(PerCpuSite, PerCpuSite)>,
    /// Slots the last drain found reserved and never committed.
    unfinished: u64,
    /// Ring-full drops while a ring's drain was held at a reserved record.
    held_drops: u64,
    /// The rings' filtered counters' sum when the region was taken out.
    removed_filtered: Option<u64>,
    /// The drop counters as last read (calls, returns), for when guest
    /// memory can no longer be read (its QEMU gone): never reported as 0.
    last_drops: Mutex<(Option<PerCpuSite>, Option<PerCpuSite>)>,
    /// A count was answered from `last_drops`.
    drops_stale: std::sync::atomic::AtomicBool,
}

/// Where vmtrace's region stands in the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Region {
    /// Nothing written (or taken out again by `remove`).
    Planned,
    /// Code written and rings initialised (`stage`), in vmtrace's own slot
    /// that the guest cannot reach before `install` maps it.
    Staged,
    /// Mapped into the guest: the code can no longer change (a task may
    /// still be inside the trampoline from an earlier attach), and later
    /// attaches reuse code and rings.
    Installed,
}

/// Counts per CPU and site.
type PerCpuSite = Vec<Vec<u64>>;

impl Exitless {
    /// The session's exitless state for `plan`, its events sent to `sink`.
    pub fn new(plan: ExitlessPlan, sink: Sink) -> Exitless {
        Exitless {
            plan,
            region: Region::Planned,
            sink: Some(sink),
            drainer: None,
            mem: None,
            pages: None,
            removed_drops: None,
            unfinished: 0,
            held_drops: 0,
            removed_filtered: None,
            last_drops: Mutex::new((None, None)),
            drops_stale: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The code and layout this session runs.
    pub fn plan(&self) -> &ExitlessPlan {
        &self.plan
    }

    /// The rings' layout.
    pub fn layout(&self) -> RingLayout {
        self.plan.layout()
    }

    /// Fit the code to the running kernel before its first install: the
    /// CPU number's displacement where KASLR (`off`) moved it (Linux 6.15+
    /// per-CPU symbols are kernel addresses), and returns as the kernel's
    /// `__fentry__` returns now (`ExitlessPlan::fit`). `AlternativesPending`
    /// while the kernel has not yet chosen its return mitigations (nothing
    /// changed: retry later). Calls after the first install change nothing.
    pub fn resolve(
        &mut self,
        space: &mut AddressSpace<'_>,
        image: &KernelImage,
        off: KernelOffset,
    ) -> Result<Resolved, ExitlessError> {
        if self.region == Region::Installed {
            return Ok(Resolved::Ready);
        }
        // The CPU number first: out of reach whatever the returns.
        let (cpu_number, _) = self.plan.cpu_number();
        if cpu_number.gs_disp(off).is_none() {
            return Err(ExitlessPlanError::CpuNumberOutOfReach {
                link: cpu_number.link,
                runtime: off.runtime(cpu_number.link),
            }
            .into());
        }
        // Before anything is read: until the kernel applied its
        // alternatives, `__fentry__` and every return site may still change
        // (and `__fentry__` may be a form only seen then).
        if alternatives_pending(space, image, off) {
            return Ok(Resolved::AlternativesPending);
        }
        let ret = fentry_return(space, image, off)?;
        if self.plan.fit(off, ret)? {
            if let Some(mem) = &self.mem {
                // Staged before the kernel was known: the new code over it
                // (a few KiB, still unreachable by the guest).
                write_code(&**mem, &self.plan.trampoline, self.pages.is_some())
                    .map_err(|e| ExitlessError::Memory(e.to_string()))?;
            }
        }
        Ok(Resolved::Ready)
    }

    /// Write the code, reset the rings and spawn the drainer's thread
    /// (once), and remember `mem` for the drainer. The region is vmtrace's
    /// own slot, outside the guest's RAM and unreachable until `install`
    /// maps it, so this may run while the guest does: before the attach's
    /// pause, which then only maps (zeroing megabytes of never-touched rings
    /// inside the pause was most of an exitless attach's window). `install`
    /// does it in the pause if nobody did before; `resolve` rewrites the
    /// code if the running kernel needs other code.
    pub fn stage(&mut self, ram: &Arc<dyn GuestRam>) -> Result<(), ExitlessError> {
        let mem: &dyn GuestRam = &**ram;
        if self.region != Region::Planned {
            return Ok(());
        }
        let layout = self.layout();
        write_code(mem, &self.plan.trampoline, self.pages.is_some())
            .map_err(|e| ExitlessError::Memory(e.to_string()))?;
        // The spare page directory, touched now (a first write to a host
        // page faults it in): `map` fills it in the pause when the guest
        // has none. Unused before the first `map`, which comes after this.
        mem.write_slice(&[0u8; 4096], GuestAddress(SPARE_PD_GPA))
            .map_err(|e| ExitlessError::Memory(e.to_string()))?;
        ring::init_rings(mem, &layout)?;
        let high = self
            .pages
            .as_deref()
            .and_then(|p| p.lock().unwrap_or_else(|e| e.into_inner()).high());
        if let Some(h) = high {
            // Entry 508's page directory, in vmtrace's own memory: `map`
            // only points the entry at it, in the pause.
            mem.write_slice(&map::high_directory(&h), GuestAddress(h.pd))
                .map_err(|e| ExitlessError::Memory(e.to_string()))?;
        }
        if layout.graph {
            // Every frame free, the ticket counter at 0.
            let pool = vec![0u8; (DATA_LEN - FRAME_NEXT_OFF) as usize];
            mem.write_slice(&pool, GuestAddress(DATA_GPA + FRAME_NEXT_OFF))
                .map_err(|e| ExitlessError::Memory(e.to_string()))?;
        }
        if let Some(sink) = self.sink.take() {
            let pending = PendingDrainer::spawn(Arc::clone(ram), layout, sink)
                .map_err(ExitlessError::Thread)?;
            self.drainer = Some(pending);
        }
        self.region = Region::Staged;
        self.mem = Some(Arc::clone(ram));
        Ok(())
    }

    /// Map the region, staged first if it was not (`stage`). The guest is
    /// paused. Nothing in the guest's tables changes when the mapping is
    /// refused.
    pub fn install(
        &mut self,
        space: &mut AddressSpace<'_>,
        ram: &Arc<dyn GuestRam>,
    ) -> Result<Mapped, ExitlessError> {
        let staged = self.region == Region::Staged;
        self.stage(ram)?;
        if staged && self.pages.is_some() {
            // Staged in guest pages while the guest ran, by a path that
            // may bypass the VMM (a QEMU's TCG keeps what it translated
            // from a page written from outside): the code again, now, by
            // the VMM's own writes.
            write_code(&**ram, &self.plan.trampoline, true)
                .map_err(|e| ExitlessError::Memory(e.to_string()))?;
        }
        let mapped = map::map_with(space, self.pages.as_deref())?;
        self.region = Region::Installed;
        Ok(mapped)
    }

    /// With the region in guest pages: map it again, so that the pages
    /// backed since `install` (direct entries' stubs, written after it)
    /// are mapped too (`map::map_with` maps the pages backed when it runs).
    /// None in vmtrace's own slot, which maps everything.
    pub fn map_backed(
        &self,
        space: &mut AddressSpace<'_>,
    ) -> Result<Option<Mapped>, ExitlessError> {
        match self.pages.as_deref() {
            Some(pages) => Ok(Some(map::map_with(space, Some(pages))?)),
            None => Ok(None),
        }
    }

    /// Function graph: hooked calls that have not returned yet (their
    /// return address is one of vmtrace's return stubs), as the frame pool
    /// says; 0 without the graph or before the first stage.
    pub fn live_frames(&self) -> Result<usize, ExitlessError> {
        match (&self.mem, self.layout().graph) {
            (Some(mem), true) => Ok(collect::live_frames(&**mem)?),
            _ => Ok(0),
        }
    }

    /// Put the region in `pages` (guest pages the guest never uses)
    /// instead of vmtrace's own slot. Before the first stage.
    pub fn back_region(&mut self, pages: Arc<Mutex<RegionPages>>) {
        self.pages = Some(pages);
    }

    /// Take the region out of the guest: its page-table entries cleared
    /// and, when it lives in the guest's pages, what they held written back.
    /// After
    /// the last drain; the caller holds every vCPU stopped and knows that
    /// no context runs in vmtrace's code. Returns the entries cleared.
    pub fn remove(&mut self, space: &mut AddressSpace<'_>) -> Result<usize, ExitlessError> {
        if self.region != Region::Installed {
            return Ok(0);
        }
        let cleared = map::unmap(space, self.pages.as_deref())?;
        // The counts the rings keep, before their pages change back.
        self.removed_drops = Some((self.drops()?, self.ret_drops()?));
        self.removed_filtered = Some(self.filtered());
        if let Some(pages) = &self.pages {
            let originals = pages.lock().unwrap_or_else(|e| e.into_inner()).originals();
            // Written past the region's name: to the guest's pages themselves.
            let ram = self.mem.as_deref().unwrap_or(space.memory());
            for (real, was) in originals {
                ram.write_slice(&was, GuestAddress(real))
                    .map_err(|e| ExitlessError::Memory(e.to_string()))?;
            }
        }
        self.region = Region::Planned;
        Ok(cleared)
    }

    /// Does every CPU's per-CPU CPU number read as one where the trampoline
    /// will read it? The trampoline indexes the rings with it (a number past
    /// them is only counted as dropped: `body::emit_reserve`), so a number
    /// that is not the CPU's own means the symbols describe another per-CPU
    /// layout, and the attach is refused unless:
    ///
    /// - through each parked vCPU's GS base (`gs_bases`: (vCPU, GS base) of
    ///   those at CPL 0), the number has a ring; a GS base whose area is not
    ///   mapped (a vCPU on the entry path, before `swapgs`) tells nothing and
    ///   is skipped;
    /// - through the kernel's `__per_cpu_offset` table (`per_cpu_offset`: its
    ///   runtime address, when the symbols have it), CPU i's number reads i
    ///   for every CPU the guest has (`cpus`: its possible CPUs, read from
    ///   the kernel; without them, every CPU with a ring), or 0 for a CPU the
    ///   kernel has not set up yet (its entry still points at the per-CPU
    ///   template). This also covers the CPUs not running yet at an early
    ///   attach, and those offline. A CPU the guest does not have is never
    ///   set up, and its entry points at the template the kernel freed after
    ///   boot: not read.
    pub fn check_cpu_numbers(
        &self,
        space: &mut AddressSpace<'_>,
        gs_bases: &[(usize, u64)],
        per_cpu_offset: Option<u64>,
        cpus: Option<&GuestCpus>,
    ) -> Result<(), ExitlessError> {
        check_cpu_numbers(
            space,
            self.plan.cpu_number().1,
            self.layout().cpus,
            gs_bases,
            per_cpu_offset.map(|table| (table, cpus)),
        )
    }

    /// Does the current task read as a task where the trampoline will read
    /// it, on every CPU? The code reads `gs:[current]` and then that task's
    /// pid on every traced call (NMIs included), without a check: a
    /// misread layout would fault in the guest at each one. So, like the CPU
    /// number (`check_cpu_numbers`), through each kernel-mode vCPU's GS
    /// base and each possible CPU's `__per_cpu_offset` entry, the current
    /// task must be a kernel address whose pid is a pid (at most the
    /// kernel's `PID_MAX_LIMIT`) and whose comm is a name (NUL-terminated,
    /// not empty, no control character). Nothing to check when the code
    /// records no task. `linux`: Linux points every CPU's current task at
    /// a task from the start (`init_task`); another kernel (the mini
    /// guest) may have none (0) on a CPU not started yet, which tells
    /// nothing.
    pub fn check_current_tasks(
        &self,
        space: &mut AddressSpace<'_>,
        gs_bases: &[(usize, u64)],
        per_cpu_offset: Option<u64>,
        (cpus, linux): (Option<&GuestCpus>, bool),
    ) -> Result<(), ExitlessError> {
        let Some(reads) = self.plan.task_reads() else {
            return Ok(());
        };
        let rings = self.layout().cpus;
        let mut bases: Vec<(usize, u64)> =
            gs_bases.iter().copied().filter(|&(_, b)| b != 0).collect();
        if let Some(table) = per_cpu_offset {
            let (last, has): (usize, Box<dyn Fn(usize) -> bool>) = match cpus {
                Some(g) => (g.nr_cpu_ids, Box::new(|cpu| g.possible(cpu))),
                None => (rings, Box::new(|_| true)),
            };
            for cpu in (0..last).filter(|&cpu| has(cpu)) {
                if let Ok(base) = space.read_u64(table.wrapping_add(cpu as u64 * 8)) {
                    bases.push((cpu, base));
                }
            }
        }
        for (cpu, base) in bases {
            check_current_task(space, reads, (cpu, base), linux)?;
        }
        Ok(())
    }

    /// The bytes site `k` at `addr` becomes: a call to its stub.
    pub fn site_bytes(&self, k: usize, addr: u64) -> Result<[u8; SITE_LEN], TrampolineError> {
        self.plan.site_bytes(k, addr)
    }

    /// Start draining (once): events dated by `clock`, counted in `counters`,
    /// new tasks' exits made as this code records them (`child_starts`).
    /// The drainer's thread was spawned at `stage`: this only tells it.
    pub fn start_drainer(&mut self, mut go: DrainStart) {
        go.values.child_exits = ChildStarts::of(self.plan.child_exits());
        if let Some(d) = &self.drainer {
            d.start(go);
        }
    }

    /// Calls counted in the guest but not recorded (full rings), per CPU and
    /// site; empty before the first install. Guest memory unreadable (its
    /// QEMU gone), the counts as last read (`drops_stale`).
    pub fn drops(&self) -> Result<Vec<Vec<u64>>, ExitlessError> {
        if let Some((d, _)) = &self.removed_drops {
            return Ok(d.clone());
        }
        match &self.mem {
            Some(mem) => {
                let read = collect::drops(&**mem, &self.layout()).map_err(ExitlessError::from);
                self.remembered(read, |l| &mut l.0)
            }
            None => Ok(Vec::new()),
        }
    }

    /// Returns counted in the guest but not recorded (full rings), per CPU
    /// and site; empty before the first install. As `drops`.
    pub fn ret_drops(&self) -> Result<Vec<Vec<u64>>, ExitlessError> {
        if let Some((_, r)) = &self.removed_drops {
            return Ok(r.clone());
        }
        match &self.mem {
            Some(mem) => {
                let read = collect::ret_drops(&**mem, &self.layout()).map_err(ExitlessError::from);
                self.remembered(read, |l| &mut l.1)
            }
            None => Ok(Vec::new()),
        }
    }

    /// `read` kept as the last count in `slot`; a failed read answered with
    /// the last count, if any (and `drops_stale` set).
    fn remembered(
        &self,
        read: Result<PerCpuSite, ExitlessError>,
        slot: impl FnOnce(&mut (Option<PerCpuSite>, Option<PerCpuSite>)) -> &mut Option<PerCpuSite>,
    ) -> Result<PerCpuSite, ExitlessError> {
        let mut last = self.last_drops.lock().unwrap_or_else(|e| e.into_inner());
        let kept = slot(&mut last);
        match read {
            Ok(d) => {
                *kept = Some(d.clone());
                Ok(d)
            }
            Err(e) => match kept {
                Some(d) => {
                    self.drops_stale
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                    Ok(d.clone())
                }
                None => Err(e),
            },
        }
    }

    /// Were some drop counts the last ones read, not the final ones (guest
    /// memory unreadable at the end)?
    pub fn drops_stale(&self) -> bool {
        self.drops_stale.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Calls whose record the last drain found reserved and never
    /// committed (0 before `finish`).
    pub fn unfinished(&self) -> u64 {
        self.unfinished
    }

    /// Ring-full drops (calls and returns) while the drain was held at a
    /// reserved record, not behind (0 before `finish`).
    pub fn held_drops(&self) -> u64 {
        self.held_drops
    }

    /// Records per ring asked (the plan's) and given (fitted to the
    /// guest's memory, `ExitlessPlan::set_rings`).
    pub fn ring_records(&self) -> (u64, u64) {
        (self.plan.asked_records(), self.layout().cap)
    }

    /// Calls the guest code's pid filter rejected, all CPUs (0 before the
    /// first install, or when a ring cannot be read).
    pub fn filtered(&self) -> u64 {
        if let Some(n) = self.removed_filtered {
            return n;
        }
        let Some(mem) = &self.mem else { return 0 };
        let layout = self.layout();
        (0..layout.cpus)
            .filter_map(|cpu| ring::filtered(&**mem, &layout, cpu).ok())
            .sum()
    }

    /// Drain the rest and stop the drainer (the guest has stopped); drops
    /// the event sender either way, so the collector can finish.
    /// Records skipped as out of range are an error too: never silent.
    pub fn finish(&mut self) -> Result<(), ExitlessError> {
        self.sink = None;
        let Some(pending) = self.drainer.take() else {
            return Ok(());
        };
        let Some(d) = pending.join().map_err(|()| DrainError::Panicked)? else {
            return Ok(());
        };
        let stats = std::sync::Arc::clone(&d.stats);
        d.finish()?;
        self.unfinished = stats.unfinished.load(std::sync::atomic::Ordering::Relaxed);
        self.held_drops = stats.held.load(std::sync::atomic::Ordering::Relaxed);
        match stats.bad_records.load(std::sync::atomic::Ordering::Relaxed) {
            0 => Ok(()),
            n => Err(ExitlessError::BadRecords(n)),
        }
    }
}

/// What `Exitless::resolve` found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolved {
    /// The code fits the running kernel.
    Ready,
    /// The kernel's `__fentry__` still returns through the compiler's
    /// return thunk, but the kernel has not applied its alternatives yet
    /// (`alternatives_patched` is 0): it will rewrite every return then.
    AlternativesPending,
}

/// Bytes of `__fentry__` read to see how it returns (`Return::from_fentry`
/// reads at most 8 instructions besides NOPs; its body is about 14 bytes,
/// 15 before alternatives with call depth tracking).
const FENTRY_READ: usize = 48;

/// Has a kernel with `alternatives_patched` not set it yet?
pub(in crate::session) fn alternatives_pending(
    space: &mut AddressSpace<'_>,
    image: &KernelImage,
    off: KernelOffset,
) -> bool {
    image.symbol(ALTERNATIVES_PATCHED).is_some_and(|s| {
        space
            .read_array::<4>(off.runtime(s.addr))
            .map(u32::from_le_bytes)
            == Ok(0)
    })
}

/// How the kernel running at `off` returns from `__fentry__` (the mini
/// guest's default build has none: `ret`).
fn fentry_return(
    space: &mut AddressSpace<'_>,
    image: &KernelImage,
    off: KernelOffset,
) -> Result<Return, ExitlessError> {
    let Some(f) = image.symbol(crate::kernel::sites::FENTRY) else {
        return Ok(Return::default());
    };
    let va = off.runtime(f.addr);
    let code = space
        .read_array::<FENTRY_READ>(va)
        .map_err(|e| ExitlessError::Memory(format!("reading __fentry__ at {va:#x}: {e}")))?;
    let its = image.symbol(ITS_RETURN_THUNK).map(|s| off.runtime(s.addr));
    let ret = Return::from_fentry(&code, va, its).map_err(ExitlessPlanError::from)?;
    // As the plan refuses, for a thunk known only by its code.
    if ret != Return::default() && image.symbol(ALTERNATIVES_PATCHED).is_none() {
        return Err(ExitlessPlanError::AlternativesUnknown {
            place: format!("the guest's __fentry__ at {va:#x}"),
        }
        .into());
    }
    Ok(ret)
}

/// `Exitless::check_cpu_numbers`, for `rings` rings and a CPU number at
/// `gs:[disp]`: GS base + the sign-extended `disp` in either per-CPU layout
/// (`percpu`; from 6.15 a CPU not set up has a 0 entry, so it reads the
/// template in the image, whose number is 0, as before 6.15). `table`: the
/// `__per_cpu_offset` table's address and the guest's own CPUs, if known.
fn check_cpu_numbers(
    space: &mut AddressSpace<'_>,
    disp: i32,
    rings: usize,
    gs_bases: &[(usize, u64)],
    table: Option<(u64, Option<&GuestCpus>)>,
) -> Result<(), ExitlessError> {
    let off = i64::from(disp) as u64;
    let mismatch = |cpu, value| ExitlessError::CpuNumberMismatch {
        cpu,
        value,
        off,
        cpus: rings,
    };
    let read_number = |space: &mut AddressSpace<'_>, base: u64| {
        space
            .read_array::<4>(base.wrapping_add(off))
            .ok()
            .map(u32::from_le_bytes)
    };
    for &(cpu, base) in gs_bases {
        if base == 0 {
            continue;
        }
        match read_number(space, base) {
            Some(value) if value as usize >= rings => return Err(mismatch(cpu, value)),
            _ => {}
        }
    }
    let Some((table, guest)) = table else {
        return Ok(());
    };
    // The CPUs whose per-CPU area the kernel set up: its possible ones.
    let (last, has): (usize, Box<dyn Fn(usize) -> bool>) = match guest {
        Some(g) => (g.nr_cpu_ids, Box::new(|cpu| g.possible(cpu))),
        None => (rings, Box::new(|_| true)),
    };
    for cpu in (0..last).filter(|&cpu| has(cpu)) {
        let entry = table.wrapping_add(cpu as u64 * 8);
        let Ok(base) = space.read_array::<8>(entry).map(u64::from_le_bytes) else {
            continue;
        };
        match read_number(space, base) {
            Some(value) if value as usize != cpu && value != 0 => return Err(mismatch(cpu, value)),
            _ => {}
        }
    }
    Ok(())
}

/// The most pids a 64-bit kernel hands out (include/linux/threads.h
/// `PID_MAX_LIMIT`: 4M).
const PID_MAX_LIMIT: u32 = 4 * 1024 * 1024;
/// Linux's kernel half starts here with 5-level paging (its direct map at
/// 0xff11000000000000 and up: Documentation/arch/x86/x86_64/mm.rst); with
/// 4-level paging at 0xffff800000000000, the addresses between not
/// canonical: a task (in the direct map) is above it in either mode.
const KERNEL_HALF: u64 = 0xff00_0000_0000_0000;

/// `Exitless::check_current_tasks` for CPU `cpu`'s per-CPU area at `base`.
/// A current pointer that cannot be read (an area not mapped: a vCPU on
/// the entry path, before `swapgs`) tells nothing, nor one of 0 outside
/// Linux (`linux`); one that reads must lead to a task.
fn check_current_task(
    space: &mut AddressSpace<'_>,
    reads: TaskReads,
    (cpu, base): (usize, u64),
    linux: bool,
) -> Result<(), ExitlessError> {
    let at = base.wrapping_add(i64::from(reads.current_disp) as u64);
    let task = match space.read_u64(at) {
        Ok(0) if !linux => return Ok(()),
        Ok(task) => task,
        Err(_) => return Ok(()),
    };
    let bad = |why: String| ExitlessError::NotATask {
        cpu,
        off: i64::from(reads.current_disp) as u64,
        task,
        why,
    };
    if task < KERNEL_HALF {
        return Err(bad("not a kernel address".into()));
    }
    let pid = space
        .read_array::<4>(task.wrapping_add(u64::from(reads.pid_off)))
        .map(u32::from_le_bytes)
        .map_err(|e| bad(format!("its pid cannot be read ({e})")))?;
    if pid > PID_MAX_LIMIT {
        return Err(bad(format!("its pid reads {pid}")));
    }
    let mut comm = [0u8; crate::kernel::task::COMM_LEN];
    space
        .read(task.wrapping_add(u64::from(reads.comm_off)), &mut comm)
        .map_err(|e| bad(format!("its comm cannot be read ({e})")))?;
    let name = comm.split(|&b| b == 0).next().unwrap_or_default();
    let named = name.len() < comm.len() && !name.is_empty();
    if !named || name.iter().any(|&b| b < 0x20 || b == 0x7f) {
        return Err(bad(format!(
            "its comm reads {:?}",
            String::from_utf8_lossy(&comm)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
    use vmm::gva::PagingMode;

    /// The VMM's boot page tables: low memory identity-mapped, and the
    /// kernel map (0xffffffff80000000) onto guest-physical 0.
    fn memory() -> GuestMemoryMmap {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 16 << 20)]).unwrap();
        vmm::boot::regs::setup_page_tables(&mem).unwrap();
        mem
    }

    const OFF: i32 = 0x20;
    /// Per-CPU areas at 1 MiB + i * 64 KiB; the template at 4 MiB.
    fn area(cpu: u64) -> u64 {
        0x10_0000 + cpu * 0x1_0000
    }
    const TEMPLATE: u64 = 0x40_0000;
    /// `__per_cpu_offset` at 8 MiB, through the kernel map.
    const TABLE_GPA: u64 = 0x80_0000;
    const TABLE_VA: u64 = vmm::layout::KERNEL_MAP_BASE + TABLE_GPA;

    /// CPU i's area says `numbers[i]`; the table has `set_up` CPUs, the
    /// others pointing at the template (number 0).
    fn guest(numbers: &[u32], set_up: usize) -> GuestMemoryMmap {
        let mem = memory();
        for (i, &n) in numbers.iter().enumerate() {
            mem.write_obj(n, GuestAddress(area(i as u64) + OFF as u64))
                .unwrap();
        }
        for i in 0..8u64 {
            let base = if (i as usize) < set_up {
                area(i)
            } else {
                TEMPLATE
            };
            mem.write_obj(base, GuestAddress(TABLE_GPA + i * 8))
                .unwrap();
        }
        mem
    }

    fn check(mem: &GuestMemoryMmap, cpus: usize, gs: &[(usize, u64)], table: bool) -> String {
        check_guest(mem, cpus, gs, table, None)
    }

    fn check_guest(
        mem: &GuestMemoryMmap,
        cpus: usize,
        gs: &[(usize, u64)],
        table: bool,
        guest: Option<&GuestCpus>,
    ) -> String {
        let mut space = AddressSpace::new(mem, vmm::layout::PML4_START, PagingMode::Level4);
        match check_cpu_numbers(
            &mut space,
            OFF,
            cpus,
            gs,
            table.then_some((TABLE_VA, guest)),
        ) {
            Ok(()) => "ok".into(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn cpu_numbers_are_checked_through_gs_and_the_per_cpu_table() {
        // Four vCPUs, all set up, each reading its own number.
        let mem = guest(&[0, 1, 2, 3], 4);
        let gs: Vec<(usize, u64)> = (0..4).map(|i| (i, area(i as u64))).collect();
        assert_eq!(check(&mem, 4, &gs, true), "ok");
        // An early attach: only CPU 0 runs, CPUs 2 and 3 not set up yet.
        let mem = guest(&[0, 1], 2);
        assert_eq!(check(&mem, 4, &gs[..1], true), "ok");
        // A GS base of 0 or unmapped tells nothing.
        assert_eq!(check(&mem, 4, &[(0, 0), (1, 0x7fff_0000_0000)], true), "ok");
    }

    #[test]
    fn a_number_that_would_index_past_the_rings_is_refused() {
        // Through GS: vCPU 1's number reads 4 with 4 rings.
        let mem = guest(&[0, 4], 2);
        let err = check(&mem, 4, &[(0, area(0)), (1, area(1))], false);
        assert!(
            err.starts_with(
                "CPU 1's per-CPU CPU number reads 4 at per-CPU offset 0x20 (vmtrace has rings for 4 CPUs)"
            ),
            "{err}"
        );
        // Through the table, for a CPU not running yet (no GS base given):
        // CPU 1 reads 7, not 1.
        let mem = guest(&[0, 7], 2);
        let err = check(&mem, 2, &[(0, area(0))], true);
        assert!(
            err.starts_with("CPU 1's per-CPU CPU number reads 7"),
            "{err}"
        );
        // A wrong offset that happens to read 0 on CPU 0 is caught on CPU 1
        // (it reads 0x5a5a5a5a there, not 1).
        let mem = guest(&[0, 0x5a5a_5a5a], 2);
        let err = check(&mem, 2, &[(0, area(0))], true);
        assert!(err.contains("reads 1515870810"), "{err}");
        // Without the table, only the running CPUs are checked.
        assert_eq!(check(&mem, 2, &[(0, area(0))], false), "ok");
    }

    /// A CPU QEMU runs but the guest does not have (`nosmp`, `maxcpus=`
    /// without CPU hotplug, `nr_cpus=`): its `__per_cpu_offset` entry points
    /// at the freed template, which reads 0xcccccccc. Checked against the
    /// guest's possible CPUs it is not read; against QEMU's vCPUs it was.
    #[test]
    fn only_the_cpus_the_guest_has_are_read_through_the_table() {
        let mem = guest(&[0, 0xcccc_cccc], 1);
        // The freed template: what CPU 1's entry points at.
        mem.write_obj(0xcccc_ccccu32, GuestAddress(TEMPLATE + OFF as u64))
            .unwrap();
        let gs = [(0, area(0)), (1, 0)];
        let err = check(&mem, 2, &gs, true);
        assert!(
            err.contains("CPU 1's per-CPU CPU number reads 3435973836"),
            "{err}"
        );
        let one = GuestCpus::new(1, vec![true, false], vec![true, false]);
        assert_eq!(check_guest(&mem, 2, &gs, true, Some(&one)), "ok");
        // A possible CPU that is offline (`maxcpus=1`) is set up: read.
        let mem = guest(&[0, 1], 2);
        let offline = GuestCpus::new(2, vec![true, true], vec![true, false]);
        assert_eq!(check_guest(&mem, 2, &gs, true, Some(&offline)), "ok");
        let mem = guest(&[0, 5], 2);
        let err = check_guest(&mem, 2, &gs, true, Some(&offline));
        assert!(err.contains("CPU 1's per-CPU CPU number reads 5"), "{err}");
    }

    /// A task at 9 MiB (through the kernel map) that CPU 0's current
    /// pointer, at per-CPU offset 0x40, names: pid 42 at 0x10, comm at 0x20.
    fn task_guest(comm: &[u8]) -> (GuestMemoryMmap, u64) {
        let mem = memory();
        let task_gpa = 0x90_0000u64;
        let task = vmm::layout::KERNEL_MAP_BASE + task_gpa;
        mem.write_obj(task, GuestAddress(area(0) + 0x40)).unwrap();
        mem.write_obj(42u32, GuestAddress(task_gpa + 0x10)).unwrap();
        mem.write_slice(comm, GuestAddress(task_gpa + 0x20))
            .unwrap();
        mem.write_obj(0xdead_beef_u32, GuestAddress(task_gpa + 0x30))
            .unwrap();
        (mem, task)
    }

    fn current_check(mem: &GuestMemoryMmap, reads: TaskReads, linux: bool) -> String {
        let mut space = AddressSpace::new(mem, vmm::layout::PML4_START, PagingMode::Level4);
        match check_current_task(&mut space, reads, (0, area(0)), linux) {
            Ok(()) => "ok".into(),
            Err(e) => e.to_string(),
        }
    }

    /// The current task and its pid, as the trampoline will read them on
    /// every call, read first at the attach: a layout that does not
    /// describe the kernel (another build's offsets) is refused in one line
    /// before anything is patched.
    #[test]
    fn a_current_task_that_is_not_a_task_is_refused() {
        let (mem, _) = task_guest(b"wl-worker\0");
        let good = TaskReads {
            current_disp: 0x40,
            pid_off: 0x10,
            comm_off: 0x20,
        };
        assert_eq!(current_check(&mem, good, true), "ok");
        // Another current offset: 0, not a task on Linux (the mini guest's
        // CPUs not started have none yet).
        let off = TaskReads {
            current_disp: 0x48,
            ..good
        };
        let err = current_check(&mem, off, true);
        assert!(
            err.starts_with(
                "CPU 0's current task at per-CPU offset 0x48 reads 0x0, which is not a task \
                 (not a kernel address)"
            ),
            "{err}"
        );
        assert_eq!(current_check(&mem, off, false), "ok");
        // Another pid offset: 0xdeadbeef is no pid.
        let pid = TaskReads {
            pid_off: 0x30,
            ..good
        };
        let err = current_check(&mem, pid, true);
        assert!(err.contains("(its pid reads 3735928559)"), "{err}");
        // Another comm offset, or a comm that is no name.
        let comm = TaskReads {
            comm_off: 0x2a,
            ..good
        };
        assert!(current_check(&mem, comm, true).contains("its comm reads"));
        let (mem, _) = task_guest(b"\x01\x02garbage\0");
        assert!(current_check(&mem, good, true).contains("its comm reads"));
        let (mem, _) = task_guest(&[b'x'; 16]);
        assert!(current_check(&mem, good, true).contains("its comm reads"));
    }
}
