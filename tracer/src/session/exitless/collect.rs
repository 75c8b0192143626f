//! The host side of exitless tracing: a thread that drains every CPU's ring
//! while the guest runs, counts each call, and hands events (stamped on the
//! host clock) to the same collector the trap path feeds.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;
use vmm::GuestRam;

use crossbeam_channel::{Receiver, Sender};
use vmm::pause::GuestClock;

use super::child_starts::ChildStarts;
use super::pace::{run_soon, Pace};
use super::ring::{self, Record, RingError, RingReader};
use crate::kernel::task::COMM_LEN;
use crate::plan::exitless::layout::RingLayout;
use crate::plan::site_index::SiteIndex;
use crate::session::args::ArgSource;
use crate::session::counters::{Counters, BATCH};
use crate::session::record::event_fields::FieldSource;
use crate::session::tasks::{Seen, TaskSource};
use crate::trace::model::{Event, Task};
use std::collections::HashMap;
use vmm::gva::{AddressSpace, PagingMode};

/// What a drainer needs when it starts (at the first attach): the clock
/// that dates records, where calls are counted, the sites' functions, and
/// what it names and records of each call.
pub struct DrainStart {
    pub clock: GuestClock,
    pub counters: Arc<Counters>,
    pub index: Arc<SiteIndex>,
    pub tasks: Option<DrainTasks>,
    pub values: DrainValues,
}

/// What the drainer records of calls' values: entries' arguments (into
/// this table; their records hold them) and returns' values.
#[derive(Debug, Default)]
pub struct DrainValues {
    /// Only at the sites it selects (`--args=GLOB`): the shared body stores
    /// every call's arguments, a per-site body only a selected site's.
    pub args: Option<ArgSource>,
    pub retval: bool,
    /// The traced events' fields (`-e`), read as each record is drained.
    pub fields: Option<DrainFields>,
    /// `ret_from_fork`'s records made the new tasks' exits of the forking
    /// syscalls traced (`child_starts`).
    pub child_exits: Option<ChildStarts>,
}

/// How the drainer reads an event's fields: from the record's arguments,
/// through the kernel's page tables (root and mode), after the event
/// (`FieldSource::read_later`: what does not last past it shows unread).
/// A record is drained within about a millisecond of its event (`pace`):
/// the tasks an event names are alive then.
#[derive(Debug)]
pub struct DrainFields {
    pub source: FieldSource,
    pub root: u64,
    pub mode: PagingMode,
}

/// Where the drainer hands its batches of events (the store), and where
/// the store hands emptied ones back, to be filled again before any is
/// allocated (as a recorder does): a fresh batch each time faulted in its
/// pages, a twentieth of the drain's time (`perf record`).
pub struct Sink {
    pub tx: Sender<Vec<Event>>,
    pub free: Option<Receiver<Vec<Event>>>,
}

impl From<Sender<Vec<Event>>> for Sink {
    fn from(tx: Sender<Vec<Event>>) -> Sink {
        Sink { tx, free: None }
    }
}

/// The tasks one drain pass met: (`task_struct` address, pid) to id and
/// filter verdict.
type SeenTasks = HashMap<(u64, u32), Seen>;

/// How the drainer names the tasks records carry: the session's source,
/// and the kernel's page tables (root and mode), through which it reads a
/// task's comm and tgid while the guest runs.
#[derive(Debug)]
pub struct DrainTasks {
    pub source: Arc<TaskSource>,
    pub root: u64,
    pub mode: PagingMode,
}

impl DrainTasks {
    /// The id and filter verdict of the task at `task` with `pid` (what a
    /// record holds). Its comm is read when the drainer first meets it in a
    /// pass (ftrace's saved_cmdlines caveat: a task renamed between its call
    /// and the drain shows its new name); a `task_struct` that no longer
    /// holds that pid (freed, reused) gives comm `<...>`, as trace-cmd
    /// prints an unknown one.
    ///
    /// `store`: an event will be stored for it (the budget is not spent);
    /// else a task new to the table is not added to it (id 0), nor cached.
    /// A task the filter rejects is never added.
    fn seen(
        &self,
        mem: &dyn GuestRam,
        cache: &mut SeenTasks,
        (task, pid): (u64, u32),
        store: bool,
    ) -> Seen {
        if task == 0 {
            return self.source.unreadable();
        }
        if let Some(&seen) = cache.get(&(task, pid)) {
            return seen;
        }
        let mut space = AddressSpace::new(mem, self.root, self.mode);
        let seen = match self.source.key(&mut space, task) {
            Some(key) if key.1 == pid => self.source.name(&mut space, key, store),
            _ => {
                let unknown = Task {
                    pid,
                    tgid: pid,
                    comm: "<...>".into(),
                };
                match self.source.filter.accepts(pid, &unknown.comm) {
                    true if store => (self.source.table.intern(&unknown), true),
                    keep => (0, keep),
                }
            }
        };
        if store || !seen.1 {
            cache.insert((task, pid), seen);
        }
        seen
    }
}

impl DrainTasks {
    /// `seen` for a task whose name at the call the record holds (a new
    /// task's, at its `ret_from_fork`: it may rename itself or exec before
    /// the drain): that name names it and is what the filter sees. Not
    /// cached: one record per task.
    fn seen_as(
        &self,
        mem: &dyn GuestRam,
        (task, pid): (u64, u32),
        comm: [u8; COMM_LEN],
        store: bool,
    ) -> Seen {
        let mut space = AddressSpace::new(mem, self.root, self.mode);
        self.source.name(&mut space, (task, pid, comm), store)
    }
}

/// What the drainer shares with the tracer.
#[derive(Debug, Default)]
pub struct DrainStats {
    /// Records whose CPU or site index is out of range (a guest that wrote
    /// over vmtrace's rings): skipped, counted.
    pub bad_records: AtomicU64,
    /// Slots found reserved and never committed by the last drain, after
    /// the guest stopped: calls whose writer stopped (or was preempted)
    /// between reserving its record and committing it. Their site is not
    /// known, so they are in no per-function count.
    pub unfinished: AtomicU64,
    /// Ring-full drops counted while a ring's drain was held at a reserved
    /// record (`RingReader::held_drops`), as of the last pass.
    pub held: AtomicU64,
}

#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    #[error("draining vmtrace's rings: {0}")]
    Ring(#[from] RingError),
    #[error("the ring drainer thread panicked")]
    Panicked,
}

/// A running drainer.
pub struct Drainer {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Result<(), RingError>>,
    pub stats: Arc<DrainStats>,
}

/// Everything one drain pass needs: the rings, and where records go.
struct Pass {
    mem: Arc<dyn GuestRam>,
    reader: RingReader,
    out: Out,
}

/// Where drained records go: counts, events on the host clock, the budget.
/// Returns (function graph) count in `Counters::returns`, entries recorded
/// without a hook in `Counters::unhooked`.
struct Out {
    clock: GuestClock,
    counters: Arc<Counters>,
    index: Arc<SiteIndex>,
    sink: Sink,
    stats: Arc<DrainStats>,
    buf: Vec<Event>,
    /// Events this drainer may still store without touching the budget.
    reserved: usize,
    /// Function graph: the records carry slots.
    graph: bool,
    /// Naming tasks, with the ids met in this pass.
    tasks: Option<(DrainTasks, SeenTasks)>,
    values: DrainValues,
}

impl Pass {
    /// Drain every ring once; returns the records consumed. The `last`
    /// pass (the guest has stopped) reads past the slots reserved and not
    /// committed, and counts them.
    fn run(&mut self, last: bool) -> Result<usize, RingError> {
        let out = &mut self.out;
        let mem = &*self.mem;
        // Comms are read again each pass: renamed tasks show their new name.
        if let Some((_, cache)) = out.tasks.as_mut() {
            cache.clear();
        }
        let n = if last {
            self.reader
                .drain_final(mem, |cpu, r| out.record(mem, cpu, r))
        } else {
            self.reader.drain(mem, |cpu, r| out.record(mem, cpu, r))
        };
        out.flush();
        let held = self.reader.held_drops();
        out.stats.held.store(held, Ordering::Relaxed);
        if last {
            let unfinished = (0..self.reader.layout().cpus)
                .map(|cpu| self.reader.unfinished(cpu))
                .sum();
            out.stats.unfinished.store(unfinished, Ordering::Relaxed);
        }
        n
    }
}

impl Out {
    /// Hand the buffered events to the collector.
    fn flush(&mut self) {
        if !self.buf.is_empty() {
            let next = (self.sink.free.as_ref().and_then(|f| f.try_recv().ok()))
                .unwrap_or_else(|| Vec::with_capacity(BATCH));
            let batch = std::mem::replace(&mut self.buf, next);
            // The collector only goes away after every sender is dropped.
            let _ = self.sink.tx.send(batch);
        }
    }

    /// `r`, or the new task's exit it is (`ret_from_fork`'s record), with
    /// the name the task had then; None: a record to drop (another of
    /// `ret_from_fork`'s).
    fn child_exit(&self, r: Record) -> Option<(Record, Option<[u8; COMM_LEN]>)> {
        match self.values.child_exits.as_ref().and_then(|c| c.at(&r)) {
            None => Some((r, None)),
            Some(exit) => exit.map(|e| (e.record, e.comm)),
        }
    }

    /// The id and filter verdict of `r`'s task: by `comm` where the record
    /// holds the name the task had at the call (a new task's), else by the
    /// name the drain reads (`DrainTasks::seen`).
    fn task_of(
        &mut self,
        mem: &dyn GuestRam,
        r: &Record,
        comm: Option<[u8; COMM_LEN]>,
        store: bool,
    ) -> Seen {
        match (self.tasks.as_mut(), comm) {
            (Some((t, _)), Some(comm)) => t.seen_as(mem, (r.task, r.pid), comm, store),
            (Some((t, cache)), None) => t.seen(mem, cache, (r.task, r.pid), store),
            (None, _) => (0, true),
        }
    }

    fn record(&mut self, mem: &dyn GuestRam, cpu: usize, r: Record) {
        let Some((r, comm)) = self.child_exit(r) else {
            return;
        };
        // The task first: a call the filter rejects (`--comm`; the guest
        // code already dropped the pids not kept) is in no count.
        if self.tasks.is_some() && self.reserved == 0 {
            // Whether an event may be stored, before a task is added.
            self.reserved = self.counters.reserve(BATCH);
        }
        let store = self.reserved > 0;
        let (task, kept) = self.task_of(mem, &r, comm, store);
        let is_return = r.slot & crate::trace::model::RETURN_BIT != 0;
        if !kept {
            // Calls rejected, and new tasks' exits (as trap mode counts
            // them); returns hooked before the host saw the comm go.
            if !is_return || comm.is_some() {
                self.counters.filtered.fetch_add(1, Ordering::Relaxed);
            }
            return;
        }
        let site = r.site as usize;
        let counts = if is_return {
            &self.counters.returns
        } else {
            &self.counters.counts
        };
        let Some(count) = counts.get(cpu).and_then(|row| row.get(site)) else {
            self.stats.bad_records.fetch_add(1, Ordering::Relaxed);
            return;
        };
        // Single writer (this thread) in exitless mode.
        count.store(count.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        if self.graph && r.slot == 0 {
            self.counters.unhooked.fetch_add(1, Ordering::Relaxed);
        }
        if self.reserved == 0 {
            self.reserved = self.counters.reserve(BATCH);
            if self.reserved == 0 {
                self.counters.over_budget(is_return);
                return;
            }
        }
        self.reserved -= 1;
        // Only a clock with no anchor yet (a QEMU's) reads the host clock:
        // nothing more per record for one read at the pause.
        if !self.clock.is_anchored() {
            self.clock.anchor_at(r.tsc, vmm::Trap::now_ns());
        }
        let data = match (&r.args, &self.values.args) {
            (Some(args), Some(source)) => {
                let fields = self.values.fields.as_ref().and_then(|f| {
                    let mut space = AddressSpace::new(mem, f.root, f.mode);
                    f.source
                        .read_later(site, args, r.strings.as_ref(), &mut space)
                });
                source.push_with_fields(site, *args, fields)
            }
            _ if is_return && self.values.retval => r.ret,
            _ => 0,
        };
        self.buf.push(Event {
            slot: r.slot,
            ts_ns: self.clock.host_ns(r.tsc),
            parent: r.parent,
            func: self.index.func(site),
            cpu: cpu as u32,
            task,
            stack: 0,
            data,
        });
        // A batch at a time, as a recorder hands them over: a pass over
        // rings of 262,144 records made batches of megabytes (each grown
        // by doubling into fresh pages, then copied whole into one
        // block), and the store's queue, counted in batches, held far
        // more than its buffer.
        if self.buf.len() >= BATCH {
            self.flush();
        }
    }
}

impl Drainer {
    /// Start draining `layout`'s rings in `mem` (already initialised).
    pub fn start(
        mem: Arc<dyn GuestRam>,
        layout: RingLayout,
        sink: Sink,
        go: DrainStart,
    ) -> Drainer {
        let DrainStart {
            clock,
            counters,
            index,
            tasks,
            values,
        } = go;
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(DrainStats::default());
        let cap = layout.cap;
        let mut pass = Pass {
            mem,
            reader: RingReader::new(layout),
            out: Out {
                clock,
                counters,
                index,
                sink,
                stats: Arc::clone(&stats),
                buf: Vec::with_capacity(BATCH),
                reserved: 0,
                graph: layout.graph,
                tasks: tasks.map(|t| (t, HashMap::new())),
                values,
            },
        };
        let flag = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name("ring-drainer".into())
            .spawn(move || {
                let mut pace = Pace::new(cap, Instant::now());
                let mut urgent = false;
                loop {
                    // Read the flag first: a pass after it was set sees
                    // every record the stopped guest committed.
                    let stopping = flag.load(Ordering::Acquire);
                    let started = Instant::now();
                    let n = pass.run(stopping)?;
                    if stopping {
                        return Ok(());
                    }
                    let next = pace.after_pass(started, n);
                    if next.urgent != urgent {
                        urgent = next.urgent;
                        run_soon(urgent);
                    }
                    std::thread::sleep(next.sleep);
                }
            })
            .expect("spawn the ring drainer thread");
        Drainer {
            stop,
            handle,
            stats,
        }
    }

    /// Drain what is left and stop (the guest has stopped: what it left
    /// reserved and not committed is counted as unfinished). Its event
    /// sender goes with it.
    pub fn finish(self) -> Result<(), DrainError> {
        self.stop.store(true, Ordering::Release);
        match self.handle.join() {
            Ok(r) => Ok(r?),
            Err(_) => Err(DrainError::Panicked),
        }
    }
}

/// Function graph: frames of the pool still busy (hooked calls that have
/// not returned yet).
pub fn live_frames(mem: &dyn GuestRam) -> Result<usize, RingError> {
    use crate::plan::exitless::layout::{DATA_GPA, FRAMES, FRAMES_OFF, FRAME_BUSY, FRAME_LEN};
    let mut pool = vec![0u8; (FRAMES * FRAME_LEN) as usize];
    let gpa = DATA_GPA + FRAMES_OFF;
    mem.read_slice(&mut pool, vm_memory::GuestAddress(gpa))
        .map_err(|source| RingError::Memory {
            what: "reading the frame pool",
            cpu: 0,
            gpa,
            source,
        })?;
    let busy = FRAME_BUSY as usize..FRAME_BUSY as usize + 4;
    Ok(pool
        .chunks_exact(FRAME_LEN as usize)
        .filter(|f| f[busy.clone()] != [0; 4])
        .count())
}

/// Calls counted, not recorded (their ring was full), per CPU and site.
pub fn drops(mem: &dyn GuestRam, layout: &RingLayout) -> Result<Vec<Vec<u64>>, RingError> {
    (0..layout.cpus)
        .map(|cpu| ring::drops(mem, layout, cpu))
        .collect()
}

/// Every ring's return drop counters, `[cpu][site]` (function graph).
pub fn ret_drops(mem: &dyn GuestRam, layout: &RingLayout) -> Result<Vec<Vec<u64>>, RingError> {
    (0..layout.cpus)
        .map(|cpu| ring::ret_drops(mem, layout, cpu))
        .collect()
}
