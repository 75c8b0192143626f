//! The guest tasks a session has seen, shared by whoever records events
//! (the trap recorders, one per vCPU, and the exitless drainer) and the
//! store that saves them. An event names its task by a small id (1-based:
//! `Event::task`, 0 = unknown) so that events stay fixed-size; the table
//! grows only, so an id never changes meaning, and the store can save the
//! entries added since it last looked before the events that use them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use vmm::gva::AddressSpace;

use crate::kernel::kaslr::KernelOffset;
use crate::kernel::task::{comm_string, TaskLayout, COMM_LEN};
use crate::plan::tasks::TaskFilter;
use crate::trace::model::Task;

/// Every distinct task (pid, tgid, comm) seen, in first-seen order.
#[derive(Debug, Default)]
pub struct TaskTable {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    tasks: Vec<Task>,
    ids: HashMap<Task, u32>,
}

impl TaskTable {
    pub fn new() -> TaskTable {
        TaskTable::default()
    }

    /// The id of `task` (`Event::task`), added if new. Callers keep their
    /// own cache in front of it: this takes a lock.
    pub fn intern(&self, task: &Task) -> u32 {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&id) = inner.ids.get(task) {
            return id;
        }
        inner.tasks.push(task.clone());
        let id = u32::try_from(inner.tasks.len()).unwrap_or(u32::MAX);
        inner.ids.insert(task.clone(), id);
        id
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
    /// front of the shared table's lock).
    pub fn id(
        &self,
        cache: &mut HashMap<TaskKey, Seen>,
        space: &mut AddressSpace<'_>,
        key: TaskKey,
    ) -> Seen {
        if let Some(&seen) = cache.get(&key) {
            return seen;
        }
        let seen = self.name(space, key);
        cache.insert(key, seen);
        seen
    }

    /// The id of the task `key` names (its tgid read now) and whether the
    /// filter keeps it; no cache.
    pub fn name(&self, space: &mut AddressSpace<'_>, key: TaskKey) -> Seen {
        let (task, pid, comm) = key;
        let tgid = read_u32(space, task.wrapping_add(u64::from(self.layout.tgid))).unwrap_or(pid);
        let task = Task {
            pid,
            tgid,
            comm: comm_string(&comm),
        };
        (
            self.table.intern(&task),
            self.filter.accepts(pid, &task.comm),
        )
    }

    /// What a reader makes of a call whose task it could not read: no id,
    /// kept only when nothing is filtered.
    pub fn unreadable(&self) -> Seen {
        (0, !self.filter.is_active())
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
