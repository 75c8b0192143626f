//! The guest tasks a session has seen, shared by whoever records events
//! (the trap recorders, one per vCPU, and the exitless drainer) and the
//! store that saves them. An event names its task by a small id (1-based:
//! `Event::task`, 0 = unknown) so that events stay fixed-size; the table
//! grows only, so an id never changes meaning, and the store can save the
//! entries added since it last looked before the events that use them.
//!
//! What the guest does decides what is met (a thread renaming itself in a
//! loop is a new task at each name), so the table holds only tasks an
//! event is stored for: a task the filter rejects (`--pid`, `--comm`), or
//! met once the event budget (`--max-events`) is spent, is not added; and
//! it holds at most `MAX_TASKS`: beyond, events name no task and the
//! tasks left out are counted (`TaskTable::overflow`, in the report).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use vmm::gva::AddressSpace;

use crate::kernel::kaslr::KernelOffset;
use crate::kernel::task::{comm_string, TaskLayout, COMM_LEN};
use crate::plan::tasks::TaskFilter;
use crate::trace::model::Task;

/// Most tasks a table holds: far more than the threads of a real guest
/// over a trace (each rename or exec of one is another), and a bound on
/// what a guest that renames threads in a loop costs the host (a few MB).
pub const MAX_TASKS: usize = 1 << 16;

/// Every distinct task (pid, tgid, comm) seen, in first-seen order.
#[derive(Debug)]
pub struct TaskTable {
    inner: Mutex<Inner>,
    /// Most tasks held (`MAX_TASKS`, smaller in tests).
    most: usize,
}

#[derive(Debug, Default)]
struct Inner {
    tasks: Vec<Task>,
    ids: HashMap<Task, u32>,
    /// Distinct tasks not added because the table was full (a task met
    /// again is counted again: a bound on them, not their number).
    overflow: u64,
}

impl Default for TaskTable {
    fn default() -> Self {
        TaskTable::with_most(MAX_TASKS)
    }
}

impl TaskTable {
    pub fn new() -> TaskTable {
        TaskTable::default()
    }

    /// A table of at most `most` tasks.
    pub fn with_most(most: usize) -> TaskTable {
        TaskTable {
            inner: Mutex::default(),
            most,
        }
    }

    /// The id of `task` (`Event::task`), added if new; 0 (no task) when the
    /// table is full, counted (`overflow`). Callers keep their own cache in
    /// front of it: this takes a lock.
    pub fn intern(&self, task: &Task) -> u32 {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&id) = inner.ids.get(task) {
            return id;
        }
        if inner.tasks.len() >= self.most {
            inner.overflow += 1;
            return 0;
        }
        inner.tasks.push(task.clone());
        let id = u32::try_from(inner.tasks.len()).unwrap_or(u32::MAX);
        inner.ids.insert(task.clone(), id);
        id
    }

    /// Tasks not added because the table was full (each reader's cache
    /// asks once per task it meets).
    pub fn overflow(&self) -> u64 {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .overflow
    }

    /// How many tasks the table holds.
    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .tasks
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The tasks from index `from` on (ids `from + 1`...): what a stream
    /// has not saved yet.
    pub fn since(&self, from: usize) -> Vec<Task> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.tasks.get(from..).unwrap_or_default().to_vec()
    }

    /// Every task, in id order (`Trace::tasks`).
    pub fn all(&self) -> Vec<Task> {
        self.since(0)
    }
}

/// What identifies a task at a call cheaply: its `task_struct` address,
/// pid and comm (a renamed task is another entry; a freed and reused
/// `task_struct` has another pid).
pub type TaskKey = (u64, u32, [u8; COMM_LEN]);

/// How a session reads the guest's tasks: the kernel's layout, the table
/// every recorder interns into, and where KASLR put the kernel (known at
/// the attach; it moves the current-task variable in the 6.15+ per-CPU
/// layout only).
#[derive(Debug)]
pub struct TaskSource {
    pub layout: TaskLayout,
    pub table: Arc<TaskTable>,
    /// Calls by other tasks are not recorded (`--pid`, `--comm`).
    pub filter: TaskFilter,
    slide: OnceLock<KernelOffset>,
}

/// A task as a reader's cache knows it: its id, and whether the filter
/// keeps its calls.
pub type Seen = (u32, bool);

/// A reader's own cache of the tasks it has named: the few it met last
/// in front, compared in place (a CPU runs a handful of tasks trap after
/// trap, and hashing the key was a tenth of a trap's handler), the rest
/// by key.
#[derive(Debug, Default)]
pub struct TaskCache {
    recent: [Option<(TaskKey, Seen)>; RECENT_TASKS],
    /// Where the next task met is put in `recent` (round robin).
    next: usize,
    seen: HashMap<TaskKey, Seen>,
}

/// Tasks a reader keeps in front of its map.
const RECENT_TASKS: usize = 8;

impl TaskCache {
    fn get(&mut self, key: &TaskKey) -> Option<Seen> {
        if let Some((_, seen)) = self.recent.iter().flatten().find(|(k, _)| k == key) {
            return Some(*seen);
        }
        let seen = *self.seen.get(key)?;
        self.remember(*key, seen);
        Some(seen)
    }

    fn insert(&mut self, key: TaskKey, seen: Seen) {
        self.seen.insert(key, seen);
        self.remember(key, seen);
    }

    fn remember(&mut self, key: TaskKey, seen: Seen) {
        self.recent[self.next] = Some((key, seen));
        self.next = (self.next + 1) % RECENT_TASKS;
    }
}

impl TaskSource {
    pub fn new(layout: TaskLayout, table: Arc<TaskTable>, filter: TaskFilter) -> TaskSource {
        TaskSource {
            layout,
            table,
            filter,
            slide: OnceLock::new(),
        }
    }

    /// The kernel's offset from its link addresses, set once at the attach.
    pub fn set_slide(&self, off: KernelOffset) {
        let _ = self.slide.set(off);
    }

    fn slide(&self) -> KernelOffset {
        self.slide.get().copied().unwrap_or(KernelOffset::NONE)
    }

    /// The current task's `task_struct` address on the CPU whose GS base is
    /// `gs_base`, read through `space`.
    pub fn current(&self, space: &mut AddressSpace<'_>, gs_base: u64) -> Option<u64> {
        let va = self.layout.current_ptr_va(gs_base, self.slide())?;
        space.read_u64(va).ok().filter(|&t| t != 0)
    }

    /// The key of the task at `task` (pid and comm read now).
    pub fn key(&self, space: &mut AddressSpace<'_>, task: u64) -> Option<TaskKey> {
        let pid = read_u32(space, task.wrapping_add(u64::from(self.layout.pid)))?;
        let mut comm = [0u8; COMM_LEN];
        space
            .read(task.wrapping_add(u64::from(self.layout.comm)), &mut comm)
            .ok()?;
        Some((task, pid, comm))
    }

    /// The id of the task `key` names and whether the filter keeps it,
    /// reading its tgid when it is new to `cache` (each reader's own, in
    /// front of the shared table's lock). `store`: an event will be stored
    /// for it (the budget is not spent); else a new task is not added (id
    /// 0), nor cached.
    pub fn id(
        &self,
        cache: &mut TaskCache,
        space: &mut AddressSpace<'_>,
        key: TaskKey,
        store: bool,
    ) -> Seen {
        if let Some(seen) = cache.get(&key) {
            return seen;
        }
        let seen = self.name(space, key, store);
        if store || !seen.1 {
            cache.insert(key, seen);
        }
        seen
    }

    /// The id of the task `key` names (its tgid read now) and whether the
    /// filter keeps it; no cache. A task the filter rejects, or met when
    /// no event will be stored (`store` false), is not added to the table
    /// (id 0).
    pub fn name(&self, space: &mut AddressSpace<'_>, key: TaskKey, store: bool) -> Seen {
        let (task, pid, comm) = key;
        let comm = comm_string(&comm);
        if !self.filter.accepts(pid, &comm) {
            return (0, false);
        }
        if !store {
            return (0, true);
        }
        let tgid = read_u32(space, task.wrapping_add(u64::from(self.layout.tgid))).unwrap_or(pid);
        let task = Task { pid, tgid, comm };
        (self.table.intern(&task), true)
    }

    /// What a reader makes of a call whose task it could not read: no id,
    /// kept only when nothing is filtered.
    pub fn unreadable(&self) -> Seen {
        (0, !self.filter.is_active())
    }
}

/// The kernel's own top-level page table on x86-64 (`swapper_pg_dir` is
/// its alias): the one `init_mm` runs on, which lives as long as the
/// kernel (arch/x86/kernel/head_64.S).
pub const KERNEL_PGD: &str = "init_top_pgt";

/// The first task's `task_struct`, in kernel data: what both tables must
/// map alike (`kernel_root`).
const INIT_TASK: &str = "init_task";

/// A root to read tasks through while the guest runs, in place of `space`'s
/// (some vCPU's CR3 at the attach: a process's page tables, freed and
/// reused once that process exits, after which every read through it is
/// garbage): the kernel's own `init_top_pgt`, at its physical address,
/// when the symbols have it and it maps `init_task` where `space` does.
/// Every process shares its kernel half, where task structs are. Else
/// `space`'s own root.
pub fn kernel_root(
    space: &AddressSpace<'_>,
    image: &crate::kernel::symbols::KernelImage,
    off: KernelOffset,
) -> u64 {
    let (Some(pgd), Some(init)) = (image.symbol(KERNEL_PGD), image.symbol(INIT_TASK)) else {
        return space.root();
    };
    let Some(root) = off.phys_of(pgd.addr) else {
        return space.root();
    };
    let probe = off.runtime(init.addr);
    let kernel = space.with_root(root);
    match (kernel.translate(probe), space.translate(probe)) {
        (Ok(a), Ok(b)) if a.gpa == b.gpa => root,
        _ => space.root(),
    }
}

fn read_u32(space: &mut AddressSpace<'_>, va: u64) -> Option<u32> {
    let mut b = [0u8; 4];
    space.read(va, &mut b).ok()?;
    Some(u32::from_le_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(pid: u32, comm: &str) -> Task {
        Task {
            pid,
            tgid: pid,
            comm: comm.into(),
        }
    }

    #[test]
    fn the_table_holds_at_most_its_bound_and_counts_the_others() {
        let t = TaskTable::with_most(3);
        for i in 0..10u32 {
            let id = t.intern(&task(7, &format!("wl-r{i}")));
            assert_eq!(id, if i < 3 { i + 1 } else { 0 });
        }
        assert_eq!((t.len(), t.overflow()), (3, 7));
        // A task it holds keeps its id.
        assert_eq!(t.intern(&task(7, "wl-r1")), 2);
        assert_eq!(MAX_TASKS, 65_536);
    }

    #[test]
    fn ids_are_stable_one_based_and_shared_by_equal_tasks() {
        let t = TaskTable::new();
        assert_eq!(t.intern(&task(0, "swapper/0")), 1);
        assert_eq!(t.intern(&task(0, "swapper/1")), 2);
        assert_eq!(t.intern(&task(0, "swapper/0")), 1);
        // A task renamed (exec) is a new entry; the old id keeps its name.
        assert_eq!(t.intern(&task(7, "sh")), 3);
        assert_eq!(t.intern(&task(7, "ls")), 4);
        assert_eq!(t.len(), 4);
        assert_eq!(t.since(2), vec![task(7, "sh"), task(7, "ls")]);
        assert_eq!(t.since(9), vec![]);
        assert_eq!(t.all()[1], task(0, "swapper/1"));
    }
}
