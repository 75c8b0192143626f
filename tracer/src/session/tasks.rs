//! The guest tasks a session has seen, shared by whoever records events
//! (the trap recorders, one per vCPU, and the exitless drainer) and the
//! store that saves them. An event names its task by a small id (1-based:
//! `Event::task`, 0 = unknown) so that events stay fixed-size; the table
//! grows only, so an id never changes meaning, and the store can save the
//! entries added since it last looked before the events that use them.

use std::collections::HashMap;
use std::sync::Mutex;

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
