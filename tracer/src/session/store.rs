//! Where recorded events go. The recorders (one per vCPU, `record`) and the
//! exitless drainer hand batches of events to one thread, which keeps them
//! in memory, streams them to the data file while the guest runs, or keeps
//! only the newest of each vCPU (the flight recorder).
//!
//! Memory stays bounded when streaming: batches wait in a queue of at most
//! `buffer` bytes. A recorder never waits for the disk (that would stall
//! its vCPU): when the queue is full its batch is counted as lost, per
//! vCPU, and the counts stay exact. The exitless drainer does wait: the
//! guest's rings are its buffer, and a full ring is counted by the
//! trampoline. A write error ends the writing, not the run: what comes
//! after is counted as lost and the error is returned at the end.
//!
//! The store owns the session's guest tasks (`TaskTable`): whoever records
//! an event interns its task there first (`Store::tasks`), and before each
//! batch goes to the data file the tasks added since the last one go too,
//! so that a file cut short names the task of every event it holds.
//!
//! It owns the calls' arguments (`ArgTable`, `Store::args`) the same way:
//! streaming, the arguments recorded since the last batch go to the file
//! before it, and are then forgotten; the flight recorder takes them out
//! of the table as batches come, keeps those of the events its rings
//! hold, and numbers them afresh when it writes (the file holds only the
//! arguments of the events it keeps).
//!
//! It owns the kernel stacks of `--stack` entries (`StackTable`,
//! `Store::stacks`) as it does the tasks: the stacks added since the last
//! batch go to the file before it (the table only grows, so the flight
//! recorder's file may hold stacks only dropped events named).

use std::collections::{HashMap, VecDeque};
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};

use crate::kernel::symbol_index::SymbolIndex;
use crate::kernel::symbols::Symbol;
use crate::plan::site_index::SiteIndex;
use crate::session::args::ArgTable;
use crate::session::counters::{Counters, BATCH};
use crate::session::stacks::StackTable;
use crate::session::tasks::TaskTable;
use crate::trace::datafile::stream::DataFile;
use crate::trace::datafile::EVENT_SIZE;
use crate::trace::fields::FieldValue;
use crate::trace::model::{Event, Trace, ARG_REGS};

/// Batches the flight recorder's queue holds: it only moves events into
/// memory, so it never falls far behind.
const OVERWRITE_QUEUE: usize = 64;
/// The smallest streaming queue, in batches.
const MIN_QUEUE: usize = 2;

/// How events are kept.
#[derive(Debug)]
pub enum Storage {
    /// Every stored event in memory until the run ends (up to
    /// `--max-events`): tests and benchmarks.
    Memory,
    /// Written to the data file while the guest runs, with at most
    /// `buffer` bytes of events waiting.
    Stream { file: DataFile, buffer: u64 },
    /// The flight recorder: the newest `per_cpu` events of each vCPU kept
    /// in memory, written to the data file when the run stops.
    Overwrite { file: DataFile, per_cpu: u64 },
}

impl Storage {
    /// The data file, if events go to one.
    pub fn file(&self) -> Option<&DataFile> {
        match self {
            Storage::Memory => None,
            Storage::Stream { file, .. } | Storage::Overwrite { file, .. } => Some(file),
        }
    }
}

/// The batches a queue of `buffer` bytes holds.
pub fn queue_batches(buffer: u64) -> usize {
    let batch = (BATCH * EVENT_SIZE) as u64;
    usize::try_from(buffer / batch)
        .unwrap_or(usize::MAX)
        .max(MIN_QUEUE)
}

/// What the store thread kept, once every sender is gone.
pub enum Stored {
    /// All stored events, sorted by time.
    Memory(Vec<Event>),
    /// The data file, every event written (the footer is not).
    File(FileStored),
}

pub struct FileStored {
    pub file: DataFile,
    /// `seen[f]`: function `f` of the kernel holds some event's caller.
    pub seen: Vec<bool>,
    /// The first write error; what followed it was counted as lost.
    pub error: Option<io::Error>,
}

/// Callers are read where the kernel runs; the symbols are at its link
/// addresses (KASLR's virtual offset, `SiteIndex::slide`).
pub struct Fixup {
    pub index: Arc<SiteIndex>,
    /// The kernel's functions, sorted by address (`KernelImage::functions`).
    pub functions: Arc<Vec<Symbol>>,
}

impl Fixup {
    /// The functions indexed for `apply` (made once, by the store thread).
    fn lookup(&self) -> SymbolIndex {
        SymbolIndex::new(&self.functions)
    }

    /// Each event's caller at its link address, when a function is there
    /// (found through `lookup`, this fixup's); marks that function in
    /// `seen`.
    fn apply(&self, lookup: &SymbolIndex, events: &mut [Event], seen: &mut [bool]) {
        let slide = self.index.slide();
        for e in events {
            let link = e.parent.wrapping_sub(slide as u64);
            if let Some(i) = lookup.at(link) {
                e.parent = link;
                seen[i] = true;
            }
        }
    }
}

/// The running store thread.
pub struct Store {
    pub thread: JoinHandle<Stored>,
    /// With a data file: where the session sends the file's `HEAD` (the
    /// trace before the run), which the thread writes before any event.
    pub head: Option<Sender<Trace>>,
    /// Emptied batches handed back for the recorders to fill again. Memory
    /// then stays at what the queues hold: a batch freed by this thread
    /// would go back to the allocator arena of the vCPU thread that
    /// allocated it, and each arena would keep the most its thread ever
    /// had queued (measured: up to 2.5 times the buffer with 4 vCPUs).
    pub free: Receiver<Vec<Event>>,
    /// The guest tasks events name (`Event::task`), created with the store.
    tasks: Arc<TaskTable>,
    /// The arguments entries name (`Event::data`), created with the store.
    args: Arc<ArgTable>,
    /// The kernel stacks entries name (`Event::stack`), created with the
    /// store.
    stacks: Arc<StackTable>,
}

impl Store {
    /// The table a recorder interns an event's task in (before it hands
    /// the event over), shared with the store thread that saves it.
    pub fn tasks(&self) -> Arc<TaskTable> {
        Arc::clone(&self.tasks)
    }

    /// The table a recorder pushes an entry's arguments to (before it
    /// hands the event over, its id in `Event::data`), shared with the
    /// store thread that saves them.
    pub fn args(&self) -> Arc<ArgTable> {
        Arc::clone(&self.args)
    }

    /// The table a recorder interns an entry's kernel stack in (before it
    /// hands the event over, its id in `Event::stack`), shared with the
    /// store thread that saves them.
    pub fn stacks(&self) -> Arc<StackTable> {
        Arc::clone(&self.stacks)
    }
}

/// Start the store thread; returns where batches go and the thread.
pub fn spawn(
    storage: Storage,
    counters: Arc<Counters>,
    fixup: Fixup,
) -> (Sender<Vec<Event>>, Store) {
    let (head_tx, head_rx) = crossbeam_channel::bounded::<Trace>(1);
    let head = storage.file().is_some().then_some(head_tx);
    let (free_tx, free) = crossbeam_channel::bounded(match &storage {
        Storage::Stream { buffer, .. } => queue_batches(*buffer),
        // Memory keeps every batch; the flight recorder copies them out.
        Storage::Memory => 0,
        Storage::Overwrite { .. } => OVERWRITE_QUEUE,
    });
    let (tx, rx) = match &storage {
        Storage::Memory => crossbeam_channel::unbounded(),
        Storage::Stream { buffer, .. } => crossbeam_channel::bounded(queue_batches(*buffer)),
        Storage::Overwrite { .. } => crossbeam_channel::bounded(OVERWRITE_QUEUE),
    };
    let tasks = Arc::new(TaskTable::new());
    let table = Arc::clone(&tasks);
    let args = Arc::new(ArgTable::new());
    let arg_table = Arc::clone(&args);
    let stacks = Arc::new(StackTable::new());
    let stack_table = Arc::clone(&stacks);
    let handle = std::thread::Builder::new()
        .name("store".into())
        .spawn(move || match storage {
            Storage::Memory => Stored::Memory(collect(rx, &fixup)),
            Storage::Stream { mut file, .. } => {
                let error = write_head(&head_rx, &mut file);
                let out = Out {
                    file,
                    error,
                    index: Arc::clone(&fixup.index),
                    tasks: &table,
                    args: &arg_table,
                    stacks: &stack_table,
                };
                Stored::File(stream(rx, &free_tx, out, &counters, &fixup))
            }
            Storage::Overwrite { mut file, per_cpu } => {
                let error = write_head(&head_rx, &mut file);
                let out = Out {
                    file,
                    error,
                    index: Arc::clone(&fixup.index),
                    tasks: &table,
                    args: &arg_table,
                    stacks: &stack_table,
                };
                Stored::File(overwrite(rx, &free_tx, out, per_cpu, &counters, &fixup))
            }
        })
        .expect("spawn the store thread");
    (
        tx,
        Store {
            thread: handle,
            head,
            free,
            tasks,
            args,
            stacks,
        },
    )
}

/// The data file being written, its first write error, and the tasks,
/// arguments and stacks it saves before the events that name them.
struct Out<'a> {
    file: DataFile,
    error: Option<io::Error>,
    /// The sites, and the functions added during the trace (a module
    /// first loaded), which go in the file before the events naming them.
    index: Arc<SiteIndex>,
    tasks: &'a TaskTable,
    args: &'a ArgTable,
    stacks: &'a StackTable,
}

impl Out<'_> {
    /// Writes `events` (counted as lost after a write error), after the
    /// tasks and the arguments added since the last write: their events
    /// may name them. The arguments written are forgotten.
    fn write(&mut self, events: &[Event], counters: &Counters) {
        let (args, fields) = match self.error {
            None => {
                // Both in one lock: an entry pushed meanwhile comes with
                // its fields in the next write, never its fields alone.
                self.args.since_with_fields(self.file.args_saved())
            }
            Some(_) => (Vec::new(), Vec::new()),
        };
        self.write_with(events, &args, &fields, counters);
        // After an error nothing more is written: nothing to keep.
        let saved = match self.error {
            None => self.file.args_saved(),
            Some(_) => self.args.len(),
        };
        self.args.forget(saved);
    }

    /// Writes `events` after the tasks and stacks added since the last
    /// write and `args`, the next arguments (the flight recorder's,
    /// numbered as its events name them), with their events' `fields`.
    fn write_with(
        &mut self,
        events: &[Event],
        args: &[[u64; ARG_REGS]],
        fields: &[(u64, Vec<FieldValue>)],
        counters: &Counters,
    ) {
        if self.error.is_some() {
            counters.lose(events);
            return;
        }
        let new = self.tasks.since(self.file.tasks_saved());
        let stacks = self.stacks.since(self.file.stacks_saved());
        let r = self
            .write_added()
            .and_then(|()| self.file.write_tasks(&new))
            .and_then(|()| self.file.write_args(args))
            .and_then(|()| self.file.write_fields(fields))
            .and_then(|()| self.file.write_stacks(&stacks))
            .and_then(|()| self.file.write_events(events));
        if let Err(e) = r {
            counters.lose(events);
            self.error = Some(e);
        }
    }

    /// The functions added during the trace since the last write (a `FUNC`
    /// block): events may name them.
    fn write_added(&mut self) -> io::Result<()> {
        let added = self.index.added();
        let saved = self
            .file
            .funcs_saved()
            .checked_sub(added.first_func() as usize);
        let Some(saved) = saved.filter(|&s| added.used() > s) else {
            return Ok(());
        };
        let functions = added.functions();
        self.file.write_functions(&functions[saved..])
    }

    fn stored(self, seen: Vec<bool>) -> FileStored {
        FileStored {
            file: self.file,
            seen,
            error: self.error,
        }
    }
}

/// The `HEAD` block, once the session sends it (it sends it before the
/// guest runs; without it, e.g. a session that failed to start, the file
/// has none and readers refuse it as truncated).
fn write_head(rx: &Receiver<Trace>, file: &mut DataFile) -> Option<io::Error> {
    let head = rx.recv().ok()?;
    file.head(&head).err()
}

/// Hand an emptied batch back to the recorders (dropped if they have
/// enough spare ones).
fn recycle(free: &Sender<Vec<Event>>, mut batch: Vec<Event>) {
    batch.clear();
    let _ = free.try_send(batch);
}

/// Memory: every batch (callers at their link addresses, as the data
/// file gets them), sorted by time at the end.
fn collect(rx: Receiver<Vec<Event>>, fixup: &Fixup) -> Vec<Event> {
    let mut events = Vec::new();
    // The caller functions are found again from the events at the end.
    let mut seen = vec![false; fixup.functions.len()];
    let lookup = fixup.lookup();
    for mut batch in rx {
        fixup.apply(&lookup, &mut batch, &mut seen);
        events.extend_from_slice(&batch);
    }
    events.sort_by_key(|e| (e.ts_ns, e.cpu));
    events
}

/// Streaming: each batch becomes a block of the data file as it arrives.
fn stream(
    rx: Receiver<Vec<Event>>,
    free: &Sender<Vec<Event>>,
    mut out: Out,
    counters: &Counters,
    fixup: &Fixup,
) -> FileStored {
    let mut seen = vec![false; fixup.functions.len()];
    let lookup = fixup.lookup();
    for mut batch in rx {
        if out.error.is_none() {
            fixup.apply(&lookup, &mut batch, &mut seen);
        }
        out.write(&batch, counters);
        recycle(free, batch);
    }
    out.stored(seen)
}

/// The flight recorder: the newest `per_cpu` events of each vCPU; older
/// ones are counted as dropped as they are pushed out.
fn overwrite(
    rx: Receiver<Vec<Event>>,
    free: &Sender<Vec<Event>>,
    mut out: Out,
    per_cpu: u64,
    counters: &Counters,
    fixup: &Fixup,
) -> FileStored {
    let keep = usize::try_from(per_cpu).unwrap_or(usize::MAX);
    let mut rings: Vec<VecDeque<Event>> = (0..counters.counts.len())
        .map(|_| VecDeque::new())
        .collect();
    let mut pending = Pending::default();
    for batch in rx {
        // Every argument the batch names was pushed before it was sent.
        pending.take(out.args);
        for &e in &batch {
            let Some(ring) = rings.get_mut(e.cpu as usize) else {
                continue;
            };
            ring.push_back(e);
            if ring.len() > keep {
                if let Some(old) = ring.pop_front() {
                    counters.drop_stored(&old);
                    pending.drop_of(&old);
                }
            }
        }
        recycle(free, batch);
    }
    pending.take(out.args);
    let mut seen = vec![false; fixup.functions.len()];
    let lookup = fixup.lookup();
    for ring in rings {
        let (a, b) = ring.as_slices();
        for part in [a, b] {
            let mut part = part.to_vec();
            if out.error.is_none() {
                fixup.apply(&lookup, &mut part, &mut seen);
            }
            let (args, fields) = pending.renumber(&mut part, out.file.args_saved());
            out.write_with(&part, &args, &fields, counters);
        }
    }
    out.stored(seen)
}

/// The flight recorder's arguments (and events' fields): those of the
/// events its rings hold (and of events still on their way; those of
/// events lost on the way, a full queue, stay until the end), by their id
/// in the table.
#[derive(Default)]
struct Pending(HashMap<u64, [u64; ARG_REGS]>, HashMap<u64, Vec<FieldValue>>);

/// The arguments and fields of the flight recorder's events, numbered
/// as the file will name them.
type Renumbered = (Vec<[u64; ARG_REGS]>, Vec<(u64, Vec<FieldValue>)>);

impl Pending {
    /// Takes the arguments pushed since the last call out of the table.
    fn take(&mut self, table: &ArgTable) {
        let (first, args, fields) = table.drain_with_fields();
        self.0.extend(
            args.into_iter()
                .enumerate()
                .map(|(i, a)| ((first + i + 1) as u64, a)),
        );
        self.1.extend(fields);
    }

    /// Forgets the arguments of `e`, pushed out of its ring.
    fn drop_of(&mut self, e: &Event) {
        if !e.is_return() && e.data != 0 {
            self.0.remove(&e.data);
            self.1.remove(&e.data);
        }
    }

    /// The arguments of `events`' entries, in order, each entry's id
    /// renumbered to follow the `saved` ones already in the file; and
    /// their fields by the new ids.
    fn renumber(&mut self, events: &mut [Event], saved: usize) -> Renumbered {
        let mut args = Vec::new();
        let mut fields = Vec::new();
        for e in events.iter_mut().filter(|e| !e.is_return() && e.data != 0) {
            match self.0.remove(&e.data) {
                Some(a) => {
                    args.push(a);
                    let id = (saved + args.len()) as u64;
                    if let Some(f) = self.1.remove(&e.data) {
                        fields.push((id, f));
                    }
                    e.data = id;
                }
                // Not recorded (cannot happen: pushed before the event).
                None => e.data = 0,
            }
        }
        (args, fields)
    }
}

/// How a session records: the `--max-events` budget and where the events
/// go (`crate::session::store`).
pub struct Recording {
    pub max_events: u64,
    pub storage: Storage,
    /// The kernel file the guest boots (named in the data file).
    pub kernel: PathBuf,
    /// Who runs the guest, when not vmtrace's own VMM (e.g. the QEMU of
    /// `vmtrace attach`); empty otherwise. Named in the trace.
    pub vmm: String,
    /// The command line that asked for the recording (argv as given);
    /// kept in the data file.
    pub cmdline: Vec<String>,
}

impl Recording {
    /// Every event in memory, at most `max_events` of them.
    pub fn memory(max_events: u64) -> Recording {
        Recording {
            max_events,
            storage: Storage::Memory,
            kernel: PathBuf::new(),
            vmm: String::new(),
            cmdline: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_size_follows_the_buffer() {
        let batch = (BATCH * EVENT_SIZE) as u64;
        assert_eq!(queue_batches(0), MIN_QUEUE);
        assert_eq!(queue_batches(64 << 20), (64 << 20) / batch as usize);
        assert_eq!(queue_batches(u64::MAX), (u64::MAX / batch) as usize);
    }

    #[test]
    fn callers_move_to_link_addresses_only_onto_functions() {
        let index = Arc::new(SiteIndex::new(vec![(0x1000, 0)]));
        index.set_slide(0x10_0000);
        let functions = Arc::new(vec![Symbol {
            name: "f".into(),
            addr: 0x2000,
            size: 0x100,
        }]);
        let fixup = Fixup { index, functions };
        let mut seen = vec![false];
        let mut ev = [
            Event {
                parent: 0x10_2010,
                ..Event::default()
            },
            Event {
                parent: 0x5555,
                ..Event::default()
            },
        ];
        fixup.apply(&fixup.lookup(), &mut ev, &mut seen);
        assert_eq!(ev[0].parent, 0x2010);
        assert_eq!(ev[1].parent, 0x5555);
        assert_eq!(seen, [true]);
    }

    use crate::trace::model::{Task, TraceMeta};

    fn task(pid: u32, comm: &str) -> Task {
        Task {
            pid,
            tgid: pid,
            comm: comm.into(),
        }
    }

    /// A one-vCPU, one-function trace before the run, and an event of it.
    fn head() -> Trace {
        Trace {
            meta: TraceMeta {
                cpus: 1,
                ..TraceMeta::default()
            },
            functions: vec![Symbol {
                name: "f".into(),
                addr: 0x1000,
                size: 0x10,
            }],
            counts: vec![vec![0]],
            ..Trace::default()
        }
    }

    fn event(ts_ns: u64, task: u32) -> Event {
        Event {
            ts_ns,
            task,
            ..Event::default()
        }
    }

    /// Streams two batches whose tasks were interned in the store's table
    /// (the second's after the first was sent), then stops without the
    /// footer, as a killed recording does: the file names every event's
    /// task. `storage`: a data file at `path`, streamed or kept newest
    /// first.
    fn record_with_tasks(storage: impl FnOnce(DataFile) -> Storage, path: &std::path::Path) {
        let file = DataFile::create(path).unwrap();
        let counters = Arc::new(Counters::new(1, 1, 100));
        let fixup = Fixup {
            index: Arc::new(SiteIndex::new(vec![(0x1000, 0)])),
            functions: Arc::new(Vec::new()),
        };
        let (tx, store) = spawn(storage(file), counters, fixup);
        store.head.as_ref().unwrap().send(head()).unwrap();
        let tasks = store.tasks();
        let sh = tasks.intern(&task(7, "sh"));
        tx.send(vec![event(10, sh), event(11, 0)]).unwrap();
        let ls = tasks.intern(&task(7, "ls"));
        let idle = tasks.intern(&task(0, "swapper/0"));
        tx.send(vec![event(12, ls), event(13, idle)]).unwrap();
        drop(tx);
        let Stored::File(f) = store.thread.join().unwrap() else {
            panic!("a data file")
        };
        assert!(f.error.is_none());
        assert_eq!(f.file.tasks_saved(), 3);
    }

    #[test]
    fn a_streamed_file_cut_short_names_its_events_tasks() {
        let dir = std::env::temp_dir().join(format!("vmtrace-store-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("stream.data");
        record_with_tasks(
            |file| Storage::Stream {
                file,
                buffer: 1 << 20,
            },
            &path,
        );
        let t = crate::trace::datafile::load(&path).unwrap();
        assert!(t.meta.incomplete);
        assert_eq!(
            t.tasks,
            [task(7, "sh"), task(7, "ls"), task(0, "swapper/0")]
        );
        let names: Vec<Option<&str>> = t
            .events
            .iter()
            .map(|e| t.task_of(e).map(|t| t.comm.as_str()))
            .collect();
        assert_eq!(names, [Some("sh"), None, Some("ls"), Some("swapper/0")]);

        // The flight recorder writes the newest event at the end, after
        // the tasks.
        let path = dir.join("overwrite.data");
        record_with_tasks(|file| Storage::Overwrite { file, per_cpu: 1 }, &path);
        let t = crate::trace::datafile::load(&path).unwrap();
        assert_eq!(t.events.len(), 1);
        assert_eq!(t.task_of(&t.events[0]), Some(&task(0, "swapper/0")));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A module first loaded during the trace: the function its site adds
    /// goes in the file (a `FUNC` block) before the first event naming it,
    /// so a recording cut short still names it.
    #[test]
    fn a_function_added_during_the_trace_is_named_before_its_events() {
        let dir = std::env::temp_dir().join(format!("vmtrace-store-add-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("added.data");
        let file = DataFile::create(&path).unwrap();
        let counters = Arc::new(Counters::new(1, 2, 100));
        let index = Arc::new(SiteIndex::new(vec![(0x1000, 0)]).with_added(1, 1));
        let fixup = Fixup {
            index: Arc::clone(&index),
            functions: Arc::new(Vec::new()),
        };
        let storage = Storage::Stream {
            file,
            buffer: 1 << 20,
        };
        let (tx, store) = spawn(storage, counters, fixup);
        store.head.as_ref().unwrap().send(head()).unwrap();
        tx.send(vec![event(10, 0)]).unwrap();
        let hit = Symbol {
            name: "vmt_hit [vmt_test]".into(),
            addr: 0xffff_ffff_c000_0000,
            size: 0x40,
        };
        index.added().add(0xffff_ffff_c000_0004, hit).unwrap();
        let added = Event {
            func: 1,
            ..event(11, 0)
        };
        tx.send(vec![added]).unwrap();
        drop(tx);
        let Stored::File(f) = store.thread.join().unwrap() else {
            panic!("a data file")
        };
        assert!(f.error.is_none());
        let t = crate::trace::datafile::load(&path).unwrap();
        assert!(t.meta.incomplete);
        let names: Vec<&str> = t
            .events
            .iter()
            .map(|e| t.functions[e.func as usize].name.as_str())
            .collect();
        assert_eq!(names, ["f", "vmt_hit [vmt_test]"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Streams entries whose kernel stacks were interned in the store's
    /// table (the second batch's after the first was sent), then stops
    /// without the footer: the file holds the stack of every entry it
    /// keeps, streamed or kept by the flight recorder (`per_cpu` 1).
    #[test]
    fn a_file_cut_short_names_its_entries_stacks() {
        use crate::kernel::unwind::{Stack, StackEnd};
        let dir = std::env::temp_dir().join(format!("vmtrace-store-st-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let stack = |f: u64, end| Stack {
            frames: vec![f, f + 0x100],
            end,
            exact: 0,
        };
        let (a, b) = (
            stack(0x1010, StackEnd::Bottom),
            stack(0x2020, StackEnd::NotText),
        );
        for overwrite in [false, true] {
            let path = dir.join(format!("stacks-{overwrite}.data"));
            let file = DataFile::create(&path).unwrap();
            let storage = match overwrite {
                false => Storage::Stream {
                    file,
                    buffer: 1 << 20,
                },
                true => Storage::Overwrite { file, per_cpu: 1 },
            };
            let fixup = Fixup {
                index: Arc::new(SiteIndex::new(vec![(0x1000, 0)])),
                functions: Arc::new(Vec::new()),
            };
            let (tx, store) = spawn(storage, Arc::new(Counters::new(1, 1, 100)), fixup);
            store.head.as_ref().unwrap().send(head()).unwrap();
            let table = store.stacks();
            let with = |ts_ns, stack| Event {
                ts_ns,
                stack,
                ..Event::default()
            };
            tx.send(vec![with(10, table.intern(a.clone())), with(11, 0)])
                .unwrap();
            let second = table.intern(b.clone());
            tx.send(vec![with(12, second), with(13, table.intern(a.clone()))])
                .unwrap();
            drop(tx);
            let Stored::File(f) = store.thread.join().unwrap() else {
                panic!("a data file")
            };
            assert!(f.error.is_none());
            assert_eq!(f.file.stacks_saved(), 2);
            let t = crate::trace::datafile::load(&path).unwrap();
            assert!(t.meta.incomplete);
            assert_eq!(t.stacks, [a.clone(), b.clone()]);
            let got: Vec<Option<&Stack>> = t.events.iter().map(|e| t.stack_of(e)).collect();
            match overwrite {
                false => assert_eq!(got, [Some(&a), None, Some(&b), Some(&a)]),
                true => assert_eq!(got, [Some(&a)]),
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// An entry with arguments `id` (`Event::data`) at `ts_ns`, or a return.
    fn entry(ts_ns: u64, data: u64, ret: bool) -> Event {
        Event {
            ts_ns,
            data,
            slot: if ret { 0x101 } else { 0x100 },
            ..Event::default()
        }
    }

    /// Event entries' fields by their arguments id, as the table gives them.
    type Fields = Vec<(u64, Vec<FieldValue>)>;

    /// An event's fields, told apart by `n`.
    fn fields(n: i64) -> Vec<FieldValue> {
        vec![FieldValue::Int(n), FieldValue::Str(format!("wl-{n}"))]
    }

    /// Records three batches through a store whose every entry's arguments
    /// were pushed to its table first, and stops without the footer (as a
    /// killed recording does); returns the table, and the trace read back.
    fn record_with_args(
        storage: impl FnOnce(DataFile) -> Storage,
        path: &std::path::Path,
    ) -> (Arc<ArgTable>, Trace) {
        let file = DataFile::create(path).unwrap();
        let counters = Arc::new(Counters::new(1, 1, 100));
        let fixup = Fixup {
            index: Arc::new(SiteIndex::new(vec![(0x1000, 0)])),
            functions: Arc::new(Vec::new()),
        };
        let (tx, store) = spawn(storage(file), counters, fixup);
        let mut h = head();
        h.meta.graph = true;
        h.returns = vec![vec![0]];
        h.meta.args = true;
        h.meta.retval = true;
        store.head.as_ref().unwrap().send(h).unwrap();
        let args = store.args();
        let a = |i: u64| [i, i + 1, i + 2, i + 3, i + 4, i + 5];
        let one = args.push(a(10));
        tx.send(vec![entry(10, one, false), entry(11, u64::MAX, true)])
            .unwrap();
        // Two entries of events (`-e`), their fields kept with the arguments.
        let two = args.push_with(a(20), Some(fields(20)));
        let three = args.push_with(a(30), Some(fields(30)));
        tx.send(vec![entry(12, two, false), entry(13, 0, false)])
            .unwrap();
        tx.send(vec![entry(14, three, false), entry(15, 5, true)])
            .unwrap();
        drop(tx);
        let Stored::File(f) = store.thread.join().unwrap() else {
            panic!("a data file")
        };
        assert!(f.error.is_none());
        (args, crate::trace::datafile::load(path).unwrap())
    }

    /// The store's two reads of the table, as it made them before, with
    /// an entry pushed between them (a drainer runs beside the store):
    /// the second entry's fields are written before its arguments, and
    /// the file's reader refuses them (`vmtrace run` then reported the
    /// counts alone, no event: `linux_guest`'s empty callers). Read in
    /// one lock, the same interleaving writes them after.
    #[test]
    fn fields_taken_apart_from_their_arguments_make_a_file_no_reader_takes() {
        let dir = std::env::temp_dir().join(format!("vmtrace-store-split-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut h = head();
        h.meta.args = true;
        let write = |path: &std::path::Path, batches: &[(Vec<[u64; ARG_REGS]>, Fields)]| {
            let mut file = DataFile::create(path).unwrap();
            file.head(&h).unwrap();
            for (args, fields) in batches {
                file.write_args(args).unwrap();
                file.write_fields(fields).unwrap();
            }
            let events: Vec<Event> = (1..=2)
                .map(|i| Event {
                    ts_ns: i,
                    data: i,
                    ..Event::default()
                })
                .collect();
            file.write_events(&events).unwrap();
            crate::trace::datafile::load(path)
        };
        let a = |i: u64| [i; ARG_REGS];
        // Before: `since`, the push, then `fields_since`.
        let table = ArgTable::new();
        table.push_with(a(1), Some(fields(1)));
        let args = table.since(0);
        table.push_with(a(2), Some(fields(2)));
        let first = (args, table.fields_since(0));
        table.forget(1);
        let second = (table.since(1), table.fields_since(1));
        let e = write(&dir.join("split.data"), &[first, second]).unwrap_err();
        assert!(
            e.to_string()
                .contains("fields of arguments 2, but 1 are saved"),
            "{e}"
        );
        // Now: one read, the push before or after it.
        let table = ArgTable::new();
        table.push_with(a(1), Some(fields(1)));
        let first = table.since_with_fields(0);
        table.push_with(a(2), Some(fields(2)));
        table.forget(1);
        let second = table.since_with_fields(1);
        let t = write(&dir.join("whole.data"), &[first, second]).unwrap();
        let want = [(1, fields(1)), (2, fields(2))];
        assert_eq!(t.fields.values, want.into_iter().collect());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The fault that emptied `linux_guest`'s exitless `-e` reports: the
    /// store took an entry's fields without its arguments when the entry
    /// was pushed between its two reads of the table (the drainer runs
    /// beside it), and the file's reader refused the fields. A pusher
    /// thread races the store's writes here: the file reads back whole,
    /// every entry's fields under its arguments.
    #[test]
    fn fields_pushed_while_the_store_writes_stay_after_their_arguments() {
        let dir = std::env::temp_dir().join(format!("vmtrace-store-race-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("race.data");
        let file = DataFile::create(&path).unwrap();
        let counters = Arc::new(Counters::new(1, 1, 100));
        let fixup = Fixup {
            index: Arc::new(SiteIndex::new(vec![(0x1000, 0)])),
            functions: Arc::new(Vec::new()),
        };
        let storage = Storage::Stream {
            file,
            buffer: 1 << 20,
        };
        let (tx, store) = spawn(storage, counters, fixup);
        let mut h = head();
        h.meta.args = true;
        store.head.as_ref().unwrap().send(h).unwrap();
        let args = store.args();
        // The pusher pushes as a drainer does, while empty batches make the
        // store write again and again; the entries go last, in one batch.
        const N: u64 = 100_000;
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let pushed = Arc::clone(&done);
        let pusher = std::thread::spawn(move || {
            for i in 1..=N {
                args.push_with([i; ARG_REGS], Some(fields(i as i64)));
            }
            pushed.store(true, std::sync::atomic::Ordering::Release);
        });
        while !done.load(std::sync::atomic::Ordering::Acquire) {
            tx.send(Vec::new()).unwrap();
        }
        pusher.join().unwrap();
        let events = (1..=N).map(|i| Event {
            ts_ns: i,
            data: i,
            ..Event::default()
        });
        tx.send(events.collect()).unwrap();
        drop(tx);
        let Stored::File(f) = store.thread.join().unwrap() else {
            panic!("a data file")
        };
        assert!(f.error.is_none());
        let t = crate::trace::datafile::load(&path).unwrap();
        assert_eq!(t.args.len() as u64, N);
        assert_eq!(t.fields.values.len() as u64, N);
        assert!(t
            .events
            .iter()
            .all(|e| t.fields.values[&e.data] == fields(e.ts_ns as i64)));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_store_saves_each_entrys_arguments_before_it() {
        let dir = std::env::temp_dir().join(format!("vmtrace-store-args-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = |i: u64| [i, i + 1, i + 2, i + 3, i + 4, i + 5];
        let path = dir.join("stream.data");
        let (table, t) = record_with_args(
            |file| Storage::Stream {
                file,
                buffer: 1 << 20,
            },
            &path,
        );
        assert!(t.meta.incomplete);
        // Written and forgotten: the table keeps none.
        assert_eq!(table.len(), 3);
        assert!(table.since(0).is_empty() && table.all_fields().is_empty());
        assert_eq!(t.args, [a(10), a(20), a(30)]);
        let kept = [(2, fields(20)), (3, fields(30))];
        assert_eq!(t.fields.values, kept.into_iter().collect());
        let got: Vec<(u64, Option<[u64; ARG_REGS]>, u64)> = t
            .events
            .iter()
            .map(|e| (e.ts_ns, t.args_of(e).copied(), e.data))
            .collect();
        assert_eq!(
            got,
            [
                (10, Some(a(10)), 1),
                (11, None, u64::MAX),
                (12, Some(a(20)), 2),
                (13, None, 0),
                (14, Some(a(30)), 3),
                (15, None, 5),
            ]
        );

        // The flight recorder keeps the newest 3 and only their arguments,
        // numbered afresh.
        let path = dir.join("overwrite.data");
        let (table, t) = record_with_args(|file| Storage::Overwrite { file, per_cpu: 3 }, &path);
        assert!(table.since(0).is_empty());
        assert_eq!(t.args, [a(30)]);
        // Its fields under its new id.
        assert_eq!(t.fields.values, [(1, fields(30))].into_iter().collect());
        let got: Vec<(u64, Option<[u64; ARG_REGS]>, u64)> = t
            .events
            .iter()
            .map(|e| (e.ts_ns, t.args_of(e).copied(), e.data))
            .collect();
        assert_eq!(got, [(13, None, 0), (14, Some(a(30)), 1), (15, None, 5)]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
