//! The end of a session: exact counts from the recorders' counters (and
//! the rings' drop counters), the run's facts, and the events, in memory or
//! in the data file, whose footer is written here.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use super::Tracer;
use crate::error::TracerError;
use crate::kernel::symbols::Symbol;
use crate::plan::exitless::layout::{CODE_LEN, CODE_VA};
use crate::session::args::ArgTable;
use crate::session::patch;
use crate::session::stacks::StackTable;
use crate::session::store::Stored;
use crate::session::tasks::TaskTable;
use crate::trace::datafile::TraceFileError;
use crate::trace::model::{Event, Trace, TraceMeta};

impl Tracer {
    /// The guest tasks this session's events name (the store's table):
    /// whoever records an event interns its task here first.
    pub fn task_table(&self) -> std::sync::Arc<TaskTable> {
        std::sync::Arc::clone(&self.tables.tasks)
    }

    /// The arguments this session's entries name (the store's table):
    /// whoever records an entry with its arguments (`plan().values.args`)
    /// pushes them here first and puts the id in `Event::data`.
    pub fn arg_table(&self) -> std::sync::Arc<ArgTable> {
        std::sync::Arc::clone(&self.tables.args)
    }

    /// The kernel stacks this session's entries name (the store's table):
    /// whoever records an entry's stack (`--stack`) interns it here first
    /// and puts the id in `Event::stack`.
    pub fn stack_table(&self) -> std::sync::Arc<StackTable> {
        std::sync::Arc::clone(&self.tables.stacks)
    }

    /// The traced events' ids as the guest kernel gave them, read from
    /// `ram` (`event_ids`): vmtrace's own VMM attaches before the kernel
    /// numbers its events, so it reads them at the end of the run, for
    /// the formats the trace takes at `finish`. Returns the ids read.
    pub fn read_event_ids(&mut self, ram: &dyn vmm::GuestRam) -> usize {
        match self.offset {
            Some(off) => super::event_ids::read(ram, &mut self.plan.events, off),
            None => 0,
        }
    }

    /// The traced events' formats by function (`EventFields::formats`),
    /// when their fields are recorded (BTF gave the offsets); else none.
    fn event_formats(&self) -> Vec<Option<crate::trace::fields::EventFormat>> {
        let plan = &self.plan;
        if plan.events.is_empty() || plan.events.offsets.is_none() {
            return Vec::new();
        }
        let of = |f: &usize| {
            let mut names = plan.image.names(*f);
            names.find_map(|n| plan.events.entry_format(n)).cloned()
        };
        plan.funcs.iter().map(of).collect()
    }

    /// The syscall exits' formats by function (`EventFields::return_formats`),
    /// like `event_formats`.
    fn return_formats(&self) -> Vec<Option<crate::trace::fields::EventFormat>> {
        let plan = &self.plan;
        if !plan.events.needs_returns() || plan.events.offsets.is_none() {
            return Vec::new();
        }
        let of = |f: &usize| {
            let mut names = plan.image.names(*f);
            names.find_map(|n| plan.events.return_format(n)).cloned()
        };
        plan.funcs.iter().map(of).collect()
    }

    /// The trace's functions: the plan's, then those a module first
    /// loaded during the trace added.
    fn nfuncs(&self) -> usize {
        self.plan.funcs.len() + self.plan.index.added().used()
    }

    /// Exact calls so far, per traced function and vCPU: recorded, plus (in
    /// exitless mode) counted in the guest when a ring was full.
    pub fn counts(&self) -> Vec<Vec<u64>> {
        self.counts_with(&self.ring_drops())
    }

    /// `counts`, with the full-ring drops (per CPU and site) already read.
    fn counts_with(&self, ring_drops: &[Vec<u64>]) -> Vec<Vec<u64>> {
        let mut counts = vec![vec![0u64; self.ncpus()]; self.nfuncs()];
        for (cpu, per_site) in self.counters.counts.iter().enumerate() {
            for (i, c) in per_site.iter().enumerate().take(self.plan.index.live()) {
                counts[self.plan.index.func(i) as usize][cpu] += c.load(Ordering::Relaxed);
            }
        }
        // (Spare sites not given out have no function yet, and no calls.)
        for (cpu, per_site) in ring_drops.iter().enumerate() {
            for (i, d) in per_site.iter().enumerate().take(self.plan.index.live()) {
                counts[self.plan.index.func(i) as usize][cpu] += d;
            }
        }
        counts
    }

    /// Exact returns per traced function and vCPU (function graph; empty
    /// otherwise).
    pub fn returns(&self) -> Vec<Vec<u64>> {
        if !self.plan.graph {
            return Vec::new();
        }
        let mut returns = vec![vec![0u64; self.ncpus()]; self.nfuncs()];
        for (cpu, per_site) in self.counters.returns.iter().enumerate() {
            for (i, c) in per_site.iter().enumerate().take(self.plan.index.live()) {
                returns[self.plan.index.func(i) as usize][cpu] += c.load(Ordering::Relaxed);
            }
        }
        for (cpu, per_site) in self.ring_ret_drops().iter().enumerate() {
            for (i, d) in per_site.iter().enumerate().take(self.plan.index.live()) {
                returns[self.plan.index.func(i) as usize][cpu] += d;
            }
        }
        returns
    }

    /// Returns counted, not recorded, because their CPU's ring was full.
    pub(super) fn ring_ret_drops(&self) -> Vec<Vec<u64>> {
        self.reach
            .exitless()
            .filter(|_| self.plan.graph)
            .and_then(|ex| ex.ret_drops().ok())
            .unwrap_or_default()
    }

    /// Calls counted, not recorded, because their CPU's ring was full.
    fn ring_drops(&self) -> Vec<Vec<u64>> {
        self.reach
            .exitless()
            .and_then(|ex| ex.drops().ok())
            .unwrap_or_default()
    }

    /// Stop the drainer after draining what the stopped guest left (exitless
    /// mode); a no-op in trap mode. Call it before `finish` to see its error
    /// (events that could not be drained); `finish` calls it again, which
    /// then does nothing.
    pub fn stop_draining(&mut self) -> Result<(), TracerError> {
        match self.reach.exitless_mut() {
            Some(ex) => Ok(ex.finish()?),
            None => Ok(()),
        }
    }

    /// Where the recording stands, for a live status line: cheap enough to
    /// call every second (exitless mode reads the rings' drop counters from
    /// guest memory).
    pub fn progress(&self) -> Progress {
        let ring_drops: u64 = self.ring_drops().iter().flatten().sum();
        let ring_ret_drops: u64 = self.ring_ret_drops().iter().flatten().sum();
        let c = &self.counters;
        let sum = |rows: &[Box<[std::sync::atomic::AtomicU64]>]| -> u64 {
            rows.iter()
                .flat_map(|r| r.iter())
                .map(|a| a.load(Ordering::Relaxed))
                .sum()
        };
        let calls = sum(&c.counts) + ring_drops;
        let returns = sum(&c.returns) + ring_ret_drops;
        let dropped = c.dropped.load(Ordering::Relaxed)
            + c.returns_dropped.load(Ordering::Relaxed)
            + ring_drops
            + ring_ret_drops;
        Progress {
            calls,
            returns,
            dropped,
            lost: c.lost.iter().map(|l| l.load(Ordering::Relaxed)).sum(),
        }
    }

    /// `rip` as `function+0xoffset`, from the traced kernel's symbols (slid
    /// by its KASLR offset, once known); in exitless mode, a vCPU running
    /// vmtrace's own code (a traced call being recorded) is named so, as
    /// `vmtrace's trampoline+0xoffset`: that code is in no kernel symbol.
    pub fn function_at(&self, rip: u64) -> Option<String> {
        if self.trampoline().is_some() && (CODE_VA..CODE_VA + CODE_LEN).contains(&rip) {
            return Some(format!("vmtrace's trampoline+{:#x}", rip - CODE_VA));
        }
        let image = &self.plan.image;
        let link = match self.kernel_offset() {
            Some(o) => o.link(rip),
            // Not Linux: it runs where it was linked.
            None if !image.linux => rip,
            // Linux before its offset was found: it may have moved.
            None => return None,
        };
        let f = image.function_at(link)?;
        Some(format!("{}+{:#x}", f.name, link - f.addr))
    }

    /// Everything recorded, once the vCPU threads (and so the recorders) are
    /// gone. With a data file, the events are in the file, not in the
    /// returned trace: see [`Tracer::finish_stored`].
    pub fn finish(self, kernel: &Path, stop_reason: String) -> Trace {
        self.finish_stored(kernel, stop_reason, 0).0
    }

    /// `finish`, and with a data file how its writing ended: the file is
    /// complete (its footer written) unless this is an error. A write error
    /// during the run is returned here too; the events it cost are counted
    /// as lost in the trace. `trap_exits`: the run's exits at the trace
    /// port (the run report has them), for the footer.
    pub fn finish_stored(
        mut self,
        kernel: &Path,
        stop_reason: String,
        trap_exits: u64,
    ) -> (Trace, Option<Result<Saved, TraceFileError>>) {
        // The drainer's sender must be gone before the store can end.
        let _ = self.stop_draining();
        let stored = self.store.take().and_then(|c| c.join().ok());
        // In memory, the events' arguments (a data file has them).
        let mut args = Vec::new();
        let mut fields = Default::default();
        let (events, file) = match stored {
            Some(Stored::Memory(mut events)) => {
                args = self.tables.args.all();
                fields = self.tables.args.all_fields();
                // (Callers are at link addresses already: the store's Fixup.)
                if self.plan.graph {
                    // Tail callees found vmtrace's hook as their return address.
                    crate::trace::model::unhook_callers(&mut events, CODE_VA..CODE_VA + CODE_LEN);
                }
                (events, None)
            }
            Some(Stored::File(f)) => (Vec::new(), Some(f)),
            None => (Vec::new(), None),
        };
        let mut trace = self.trace_now(kernel, stop_reason);
        let callers = self.callers(&events, &trace, file.as_ref().map(|f| &f.seen[..]));
        trace.meta.trap_exits = trap_exits;
        trace.callers = callers;
        trace.events = events;
        trace.args = args;
        trace.fields.values = fields;
        let saved = file.map(|f| {
            let path = f.file.path().to_path_buf();
            let write_err = |source| TraceFileError::Write {
                path: path.clone(),
                source,
            };
            let mut file = f.file;
            if let Some(e) = f.error {
                // The footer still goes out if it can: the file stays readable.
                let _ = file.finish(&trace);
                return Err(write_err(e));
            }
            file.finish(&trace).map_err(write_err)?;
            Ok(Saved {
                path: path.clone(),
                bytes: file.bytes(),
                events: file.events(),
            })
        });
        (trace, saved)
    }

    /// The kernel functions the trace's return addresses fall in, by
    /// address: the callers of `events` (in memory) or those the store
    /// `seen` (a data file's), and the functions of every frame of
    /// `trace`'s stacks (a return address names the function of the call
    /// before it: the address minus one, for a call that ends its
    /// function).
    fn callers(&self, events: &[Event], trace: &Trace, seen: Option<&[bool]>) -> Vec<Symbol> {
        let image = &self.plan.image;
        let mut used = seen.map_or_else(|| vec![false; image.functions.len()], <[bool]>::to_vec);
        // And the functions of modules first loaded during the trace
        // (`plan::added_sites`), at their first load's addresses.
        let mut added = self.plan.index.added().functions();
        added.sort_by_key(|s| s.addr);
        let mut used_added = vec![false; added.len()];
        let frames = trace
            .stacks
            .iter()
            .flat_map(|s| (0..s.frames.len()).map(|i| s.lookup_addr(i)));
        let addrs = events.iter().map(|e| e.parent);
        for a in addrs.chain(frames) {
            if let Some(i) = image.function_index_at(a) {
                used[i] = true;
            } else if let Some(k) = added.partition_point(|f| f.addr <= a).checked_sub(1) {
                let f = &added[k];
                used_added[k] |= a < f.addr + f.size.max(1);
            }
        }
        // The image's functions are sorted by address.
        let mut callers: Vec<Symbol> = image
            .functions
            .iter()
            .zip(used)
            .filter(|&(_, u)| u)
            .map(|(f, _)| f.clone())
            .collect();
        let added = added.into_iter().zip(used_added).filter(|&(_, u)| u);
        callers.extend(added.map(|(f, _)| f));
        callers.sort_by_key(|s| s.addr);
        callers
    }

    /// Where the symbols came from: the kernel's source, naming the files
    /// of `--modules DIR` that modules first loaded during the trace used
    /// so far after those of the modules found at an attach (the `FOOT`
    /// names them, the `HEAD` cannot).
    fn symbols(&self) -> String {
        let used = (self.plan.coming.as_ref()).map_or_else(Vec::new, |c| c.said.used());
        crate::kernel::ko_file::with_files(&self.plan.image.source, &used)
    }

    /// The trace as known now, without events or callers: what a data
    /// file's `HEAD` says before the run and its `FOOT` after it.
    // Long: most of it is `TraceMeta`'s literal, one run fact a line.
    fn trace_now(&self, kernel: &Path, stop_reason: String) -> Trace {
        let image = &self.plan.image;
        let mut functions: Vec<Symbol> = self
            .plan
            .funcs
            .iter()
            .map(|&f| image.functions[f].clone())
            .collect();
        // A module first loaded during the trace: its functions after.
        functions.extend(self.plan.index.added().functions());
        // Read from guest memory once: counts and the dropped total agree.
        let ring_drops = self.ring_drops();
        let stop_reason = match self.reach.exitless().is_some_and(|ex| ex.drops_stale()) {
            true => format!(
                "{stop_reason}; guest memory was unreadable at the end: the dropped counts are \
                 the last ones read (within a status interval of the end)"
            ),
            false => stop_reason,
        };
        let counts = self.counts_with(&ring_drops);
        let total: u64 = counts.iter().flatten().sum();
        let detach_ns = if self.times.detach_ns == 0 && self.times.attach_ns != 0 {
            vmm::Trap::now_ns()
        } else {
            self.times.detach_ns
        };
        let c = &self.counters;
        let lost: Vec<u64> = c.lost.iter().map(|l| l.load(Ordering::Relaxed)).collect();
        let meta = TraceMeta {
            kernel: kernel.display().to_string(),
            build_id: image
                .build_id
                .as_ref()
                .map(|b| patch::hex(b).replace(' ', "")),
            cpus: self.ncpus() as u32,
            attach_ns: self.times.attach_ns,
            detach_ns,
            sites_patched: self.attach_counts.patched as u64,
            sites_skipped_init: self.plan.skipped_init as u64,
            sites_skipped_other: self.attach_counts.skipped_other as u64,
            attach_window_ns: self.times.attach_window.as_nanos() as u64,
            attach_latency_ns: self.times.attach_latency.as_nanos() as u64,
            events_total: total,
            events_dropped: c.dropped.load(Ordering::Relaxed)
                + ring_drops.iter().flatten().sum::<u64>(),
            parent_unreadable: c.parent_unreadable.load(Ordering::Relaxed),
            stop_reason,
            mode: self.mode_name().into(),
            // The caller knows the exits (the run report); see `Trace`.
            trap_exits: 0,
            graph: self.plan.graph,
            returns_dropped: c.returns_dropped.load(Ordering::Relaxed)
                + self.ring_ret_drops().iter().flatten().sum::<u64>(),
            unhooked: c.unhooked.load(Ordering::Relaxed),
            tsc_khz: self.times.tsc_khz,
            symbols: self.symbols(),
            lost: if lost.iter().any(|&l| l > 0) {
                lost
            } else {
                Vec::new()
            },
            overwrite: self.overwrite,
            rejected_sites: self.plan.sites.rejected_summary().unwrap_or_default(),
            kernel_offset: self
                .kernel_offset()
                .filter(|o| !o.is_none())
                .map(|o| (o.virt, o.phys)),
            incomplete: false,
            // The run report has them; the caller adds them.
            guest_instructions_emulated: None,
            unfinished: self.reach.exitless().map_or(0, |ex| ex.unfinished()),
            vmm: self.vmm.clone(),
            tasks: self.tasks_note(),
            filtered: c.filtered.load(Ordering::Relaxed)
                + self.reach.exitless().map_or(0, |ex| ex.filtered()),
            shown: String::new(),
            args: self.plan.values.args,
            retval: self.plan.values.retval,
            stacks: self
                .plan
                .stacks
                .as_ref()
                .map(|s| s.note.clone())
                .unwrap_or_default(),
            stack_funcs: self.stack_funcs(),
            drops: self.drop_causes(&ring_drops),
            cmdline: self.cmdline.clone(),
        };
        Trace {
            meta,
            counts,
            returns: self.returns(),
            callers: Vec::new(),
            events: Vec::new(),
            // Every task seen so far: a data file's HEAD and FOOT save those
            // its events did not name yet.
            tasks: self.tables.tasks.all(),
            // Events' arguments: the store saves them (`finish_stored`).
            args: Vec::new(),
            prototypes: padded(self.all_prototypes(), functions.len()),
            // Every stack so far: in memory the trace's; a data file's
            // FOOT saves those its events did not name yet.
            stacks: self.tables.stacks.all(),
            // The events' formats; a data file's blocks, or `finish_stored`
            // in memory, have their values.
            fields: crate::trace::fields::EventFields {
                formats: padded(self.event_formats(), functions.len()),
                values: Default::default(),
                return_formats: padded(self.return_formats(), functions.len()),
            },
            functions,
        }
    }

    /// The functions whose calls recorded their stacks (`--stack`), as
    /// indices into the trace's functions: the plan's, then those of
    /// modules first loaded during the trace that the globs select (after
    /// the plan's functions, slot by slot).
    fn stack_funcs(&self) -> Vec<u32> {
        let Some(plan) = self.plan.stacks.as_ref() else {
            return Vec::new();
        };
        let base = self.plan.funcs.len() as u32;
        let added = self.stacks.as_ref().map(|s| s.added_stacked());
        let added = added.unwrap_or_default().into_iter();
        plan.funcs
            .iter()
            .copied()
            .chain(added.map(|k| base + k as u32))
            .collect()
    }

    /// The prototypes of the plan's functions, then of those added
    /// during the trace (`plan::added_sites`); empty when values are not
    /// recorded.
    fn all_prototypes(&self) -> Vec<Option<crate::trace::model::Prototype>> {
        let mut all = self.prototypes.clone();
        if self.plan.value_btf().is_some() {
            // (A plan that waits for its modules alone has no function.)
            all.resize(self.plan.funcs.len(), None);
            all.extend(self.plan.index.added().prototypes());
        }
        all
    }

    /// `TraceMeta::tasks`: where the tasks came from (and the filter), or
    /// why there are none.
    fn tasks_note(&self) -> String {
        let f = &self.plan.tasks.filter;
        let note = if f.is_active() {
            format!("{}; kept only {}", self.plan.tasks.note, f.describe())
        } else {
            self.plan.tasks.note.clone()
        };
        // A guest that met more tasks than the table holds (`MAX_TASKS`).
        match self.tables.tasks.overflow() {
            0 => note,
            n => format!(
                "{note}; {n} tasks met past the first {} are not named",
                crate::session::tasks::MAX_TASKS
            ),
        }
    }

    /// The data file's `HEAD`: the trace before the run, every kernel
    /// function a possible caller (so that a file cut short still names
    /// its callers).
    pub(super) fn head(&self, kernel: &Path) -> Trace {
        let mut t = self.trace_now(kernel, String::new());
        t.callers = self.plan.image.functions.clone();
        t
    }

    /// Hand the data file's `HEAD` to the store thread (with a data file).
    pub(super) fn send_head(&self, head: Option<crossbeam_channel::Sender<Trace>>, kernel: &Path) {
        if let Some(tx) = head {
            // The store thread waits for it; it outlives this call.
            let _ = tx.send(self.head(kernel));
        }
    }
}

/// Where a recording stands (`Tracer::progress`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    /// Calls counted (exact), and returns (function graph).
    pub calls: u64,
    pub returns: u64,
    /// Events counted but not stored (any reason), of which `lost`: the
    /// writer fell behind or the disk refused them.
    pub dropped: u64,
    pub lost: u64,
}

impl Progress {
    /// Events stored (or on their way to the data file).
    pub fn stored(&self) -> u64 {
        (self.calls + self.returns).saturating_sub(self.dropped)
    }
}

/// A data file written to its end.
#[derive(Debug, Clone)]
pub struct Saved {
    pub path: PathBuf,
    pub bytes: u64,
    pub events: u64,
}

/// A per-function table (`Option`s; empty: none kept) as long as the
/// trace's `n` functions: a function added during the trace has none.
fn padded<T>(mut per_func: Vec<Option<T>>, n: usize) -> Vec<Option<T>> {
    if !per_func.is_empty() {
        per_func.resize_with(n, || None);
    }
    per_func
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A vCPU stopped inside vmtrace's exitless code is named as such, not
    /// left without a function (before: "cpu0 stopped at rip 0x...", no
    /// name, when a signal caught a vCPU recording a call); kernel
    /// addresses keep their function.
    #[test]
    fn a_vcpu_in_vmtraces_own_code_is_named() {
        use crate::plan::{Mode, Plan};
        use crate::session::Recording;
        let kernel = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest/out/mini.elf");
        let plan = || Plan::new(&kernel, &["*".to_string()], &[]).unwrap();
        let p = plan();
        let f = &p.image.functions[p.funcs[0]];
        let (name, addr) = (f.name.clone(), f.addr);
        let rec = Recording::memory(1000);
        let mode = Mode::exitless(&p, 1, None).unwrap();
        let (exitless, _) = Tracer::create(p, 1, mode, rec).unwrap();
        assert_eq!(
            exitless.function_at(CODE_VA + 0x1a).as_deref(),
            Some("vmtrace's trampoline+0x1a")
        );
        assert_eq!(
            exitless.function_at(CODE_VA + CODE_LEN - 1),
            Some(format!("vmtrace's trampoline+{:#x}", CODE_LEN - 1))
        );
        assert_eq!(exitless.function_at(addr + 1), Some(format!("{name}+0x1")));
        // Trap mode maps no code there.
        let (trap, _) = Tracer::new(plan(), 1, 1000);
        assert_eq!(trap.function_at(CODE_VA + 0x1a), None);
    }

    /// The tasks interned in the session's table, and where they came
    /// from, reach the trace, in memory and in the data file's footer.
    #[test]
    fn the_trace_has_the_sessions_tasks() {
        use crate::plan::{Mode, Plan};
        use crate::session::store::Storage;
        use crate::session::Recording;
        use crate::trace::datafile::DataFile;
        use crate::trace::model::Task;
        let kernel = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest/out/mini.elf");
        let plan = || Plan::new(&kernel, &["*".to_string()], &[]).unwrap();
        let sh = Task {
            pid: 7,
            tgid: 7,
            comm: "sh".into(),
        };
        let (t, handlers) = Tracer::new(plan(), 1, 1000);
        assert_eq!(t.task_table().intern(&sh), 1);
        drop(handlers);
        let trace = t.finish(&kernel, "stopped".into());
        assert_eq!(trace.tasks, std::slice::from_ref(&sh));
        let from = format!("from the BTF of {}", kernel.display());
        assert_eq!(trace.meta.tasks, from);

        let dir = std::env::temp_dir().join(format!("vmtrace-finish-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tasks.data");
        let rec = Recording {
            max_events: 1000,
            storage: Storage::Stream {
                file: DataFile::create(&path).unwrap(),
                buffer: 1 << 20,
            },
            kernel: kernel.clone(),
            vmm: String::new(),
            cmdline: Vec::new(),
        };
        let (t, handlers) = Tracer::create(plan(), 1, Mode::Trap, rec).unwrap();
        t.task_table().intern(&sh);
        drop(handlers);
        let (trace, saved) = t.finish_stored(&kernel, "stopped".into(), 0);
        saved.unwrap().unwrap();
        assert_eq!(trace.tasks, std::slice::from_ref(&sh));
        let back = crate::trace::datafile::load(&path).unwrap();
        assert_eq!(back.tasks, [sh]);
        assert_eq!(back.meta.tasks, from);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The stacks interned in the session's table reach the trace, in
    /// memory and in the data file, and the functions of their frames are
    /// callers (a frame at a function's end names the function before).
    #[test]
    fn the_trace_has_the_sessions_stacks_and_their_callers() {
        use crate::kernel::unwind::{Stack, StackEnd};
        use crate::plan::{Mode, Plan};
        use crate::session::store::Storage;
        use crate::session::Recording;
        use crate::trace::datafile::DataFile;
        let kernel = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest/out/mini.elf");
        let plan = || Plan::new(&kernel, &["*".to_string()], &[]).unwrap();
        let image = plan().image;
        // Two functions next to each other: a frame inside the first, and
        // one at its very end (the second's first byte).
        let (f, g) = image
            .functions
            .windows(2)
            .map(|w| (&w[0], &w[1]))
            .find(|(f, g)| f.addr + f.size == g.addr && f.size > 8)
            .expect("two adjacent functions");
        let stack = Stack {
            frames: vec![f.addr + 5, g.addr],
            end: StackEnd::Bottom,
            exact: 0,
        };
        let (t, handlers) = Tracer::new(plan(), 1, 1000);
        assert_eq!(t.stack_table().intern(stack.clone()), 1);
        drop(handlers);
        let trace = t.finish(&kernel, "stopped".into());
        assert_eq!(trace.stacks, std::slice::from_ref(&stack));
        let names: Vec<&str> = trace.callers.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, [f.name.as_str()]);

        let dir = std::env::temp_dir().join(format!("vmtrace-finish-st-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("stacks.data");
        let rec = Recording {
            max_events: 1000,
            storage: Storage::Stream {
                file: DataFile::create(&path).unwrap(),
                buffer: 1 << 20,
            },
            kernel: kernel.clone(),
            vmm: String::new(),
            cmdline: Vec::new(),
        };
        let (t, handlers) = Tracer::create(plan(), 1, Mode::Trap, rec).unwrap();
        t.stack_table().intern(stack.clone());
        drop(handlers);
        let (trace, saved) = t.finish_stored(&kernel, "stopped".into(), 0);
        saved.unwrap().unwrap();
        let back = crate::trace::datafile::load(&path).unwrap();
        assert_eq!(back.stacks, [stack]);
        assert_eq!(back.callers, trace.callers);
        assert_eq!(back.callers.len(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// With values asked, the trace has each traced function's prototype
    /// and the arguments pushed to the session's table: in memory, and in
    /// the data file (whose events name them).
    #[test]
    fn the_trace_has_the_sessions_prototypes_and_arguments() {
        use crate::plan::{Mode, Plan, ValuePlan};
        use crate::session::store::Storage;
        use crate::session::Recording;
        use crate::trace::datafile::DataFile;
        use crate::trace::model::ValueKind;
        let kernel = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest/out/mini.elf");
        let plan = |values| {
            let mut p = Plan::new(&kernel, &["args_*".to_string()], &[]).unwrap();
            p.values = values;
            p
        };
        let both = ValuePlan {
            args: true,
            retval: true,
        };
        let (t, handlers) = Tracer::new(plan(both), 1, 1000);
        assert_eq!(t.arg_table().push([1, 2, 3, 4, 5, 6]), 1);
        drop(handlers);
        let trace = t.finish(&kernel, "stopped".into());
        assert!(trace.meta.args && trace.meta.retval);
        assert_eq!(trace.args, [[1, 2, 3, 4, 5, 6]]);
        assert_eq!(trace.prototypes.len(), trace.functions.len());
        let errno = trace
            .functions
            .iter()
            .position(|f| f.name == "args_errno")
            .unwrap();
        let p = trace.prototypes[errno].as_ref().unwrap();
        assert_eq!(p.ret, ValueKind::Signed(4));
        assert!(trace.prototypes.iter().all(Option::is_some));

        // Not asked: no prototypes, no arguments.
        let (t, handlers) = Tracer::new(plan(ValuePlan::default()), 1, 1000);
        drop(handlers);
        let trace = t.finish(&kernel, "stopped".into());
        assert!(!trace.meta.args && trace.prototypes.is_empty() && trace.args.is_empty());

        let dir = std::env::temp_dir().join(format!("vmtrace-finish-args-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("values.data");
        let rec = Recording {
            max_events: 1000,
            storage: Storage::Stream {
                file: DataFile::create(&path).unwrap(),
                buffer: 1 << 20,
            },
            kernel: kernel.clone(),
            vmm: String::new(),
            cmdline: Vec::new(),
        };
        let (t, handlers) = Tracer::create(plan(both), 1, Mode::Trap, rec).unwrap();
        drop(handlers);
        let (trace, saved) = t.finish_stored(&kernel, "stopped".into(), 0);
        saved.unwrap().unwrap();
        let back = crate::trace::datafile::load(&path).unwrap();
        assert!(back.meta.args && back.meta.retval);
        assert_eq!(back.prototypes, trace.prototypes);
        assert_eq!(
            back.prototypes[errno].as_ref().unwrap().ret,
            ValueKind::Signed(4)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
