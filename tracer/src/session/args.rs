//! The arguments of traced calls (`--args`), shared by whoever records an
//! entry (the trap recorders, the exitless drainer) and the store that
//! saves them: an entry's `Event::data` is its arguments' id here
//! (1-based), pushed before the event is handed on, so that the store can
//! save the arguments added since it last looked before the events that
//! name them (as it does the tasks, `session::tasks`).

use std::sync::Mutex;

use crate::trace::model::ARG_REGS;

/// Every recorded call's arguments, in the order they were pushed.
#[derive(Debug, Default)]
pub struct ArgTable {
    inner: Mutex<Vec<[u64; ARG_REGS]>>,
}

impl ArgTable {
    pub fn new() -> ArgTable {
        ArgTable::default()
    }

    /// Keeps one call's argument registers; its id (`Event::data`).
    pub fn push(&self, args: [u64; ARG_REGS]) -> u64 {
        let mut v = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        v.push(args);
        v.len() as u64
    }

    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The arguments from index `from` on (ids `from + 1`...).
    pub fn since(&self, from: usize) -> Vec<[u64; ARG_REGS]> {
        let v = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        v.get(from..).unwrap_or_default().to_vec()
    }

    /// Every call's arguments, in id order (`Trace::args`).
    pub fn all(&self) -> Vec<[u64; ARG_REGS]> {
        self.since(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_one_based_in_push_order() {
        let t = ArgTable::new();
        assert!(t.is_empty());
        assert_eq!(t.push([1, 2, 3, 4, 5, 6]), 1);
        assert_eq!(t.push([7; ARG_REGS]), 2);
        assert_eq!(t.since(1), vec![[7; ARG_REGS]]);
        assert_eq!(t.all().len(), 2);
    }
}
