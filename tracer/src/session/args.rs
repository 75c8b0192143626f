//! The arguments of traced calls (`--args`), shared by whoever records an
//! entry (the trap recorders, the exitless drainer) and the store that
//! saves them: an entry's `Event::data` is its arguments' id here
//! (1-based), pushed before the event is handed on, so that the store can
//! save the arguments added since it last looked before the events that
//! name them (as it does the tasks, `session::tasks`).
//!
//! Unlike tasks, arguments are one per call: a store that has saved some
//! to the data file forgets them (`forget`), and the flight recorder takes
//! them out as they come (`drain`), so that memory does not grow with the
//! run. Ids stay as pushed.
//!
//! An event's entry (`-e`) also keeps its fields here, by the same id
//! (`session::record::event_fields`), forgotten and drained with its
//! arguments.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::trace::fields::FieldValue;
use crate::trace::model::ARG_REGS;

/// Where a recorder (trap or exitless) puts entries' arguments, and at
/// which sites it does (`Plan::arg_sites`: `--args=GLOB` selects some).
#[derive(Clone, Debug)]
pub struct ArgSource {
    pub table: Arc<ArgTable>,
    /// Per site: does a call there record its arguments.
    pub sites: Arc<[bool]>,
    /// The sites added during the trace, numbered after `sites`
    /// (`plan::added_sites`: each slot says whether it records them).
    pub added: Option<Arc<crate::plan::site_index::SiteIndex>>,
}

impl ArgSource {
    /// Entries' arguments into `table`, at `sites` (`Plan::arg_sites`;
    /// None without `--args`: None).
    pub fn new(table: &Arc<ArgTable>, sites: Option<Arc<[bool]>>) -> Option<ArgSource> {
        Some(ArgSource {
            table: Arc::clone(table),
            sites: sites?,
            added: None,
        })
    }

    /// This source, recording at the sites of `index` added during the
    /// trace too, as each slot says (trap mode).
    pub fn with_added(self, index: &Arc<crate::plan::site_index::SiteIndex>) -> ArgSource {
        ArgSource {
            added: Some(Arc::clone(index)),
            ..self
        }
    }

    /// The id of a call's arguments at site `site` (`Event::data`), kept;
    /// 0 (none) if the site records none.
    pub fn push_at(&self, site: usize, args: [u64; ARG_REGS]) -> u64 {
        self.push_with_fields(site, args, None)
    }

    /// `push_at`, an event's `fields` (if any) kept with the arguments in
    /// one step, so that the store never saves one without the other.
    pub fn push_with_fields(
        &self,
        site: usize,
        args: [u64; ARG_REGS],
        fields: Option<Vec<FieldValue>>,
    ) -> u64 {
        let added = |k: usize| {
            let index = self.added.as_ref();
            index.is_some_and(|i| i.added().records_args(k))
        };
        match self.sites.get(site) {
            Some(true) => self.table.push_with(args, fields),
            Some(false) => 0,
            None if added(site - self.sites.len()) => self.table.push_with(args, fields),
            None => 0,
        }
    }
}

/// Every recorded call's arguments not yet forgotten, in the order they
/// were pushed.
#[derive(Debug, Default)]
pub struct ArgTable {
    inner: Mutex<Kept>,
}

#[derive(Debug, Default)]
struct Kept {
    /// Arguments forgotten: the first kept has id `base + 1`.
    base: usize,
    args: Vec<[u64; ARG_REGS]>,
    /// Event entries' fields by their arguments' id, those not forgotten.
    fields: BTreeMap<u64, Vec<FieldValue>>,
}

impl ArgTable {
    pub fn new() -> ArgTable {
        ArgTable::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps one call's argument registers; its id (`Event::data`).
    pub fn push(&self, args: [u64; ARG_REGS]) -> u64 {
        self.push_with(args, None)
    }

    /// `push`, with an event's fields (`-e`) under the same id.
    pub fn push_with(&self, args: [u64; ARG_REGS], fields: Option<Vec<FieldValue>>) -> u64 {
        let mut k = self.lock();
        k.args.push(args);
        let id = (k.base + k.args.len()) as u64;
        if let Some(f) = fields {
            k.fields.insert(id, f);
        }
        id
    }

    /// Arguments pushed so far (the last id given), forgotten ones included.
    pub fn len(&self) -> usize {
        let k = self.lock();
        k.base + k.args.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The arguments from index `from` on (ids `from + 1`...), those not
    /// forgotten.
    pub fn since(&self, from: usize) -> Vec<[u64; ARG_REGS]> {
        let k = self.lock();
        k.args
            .get(from.saturating_sub(k.base)..)
            .unwrap_or_default()
            .to_vec()
    }

    /// Every call's arguments, in id order (`Trace::args`): complete when
    /// none were forgotten (events kept in memory).
    pub fn all(&self) -> Vec<[u64; ARG_REGS]> {
        self.since(0)
    }

    /// Forgets the arguments before index `upto` (ids up to `upto`): they
    /// are saved.
    pub fn forget(&self, upto: usize) {
        let mut k = self.lock();
        let n = upto.saturating_sub(k.base).min(k.args.len());
        k.args.drain(..n);
        k.base += n;
        let first_kept = k.base as u64 + 1;
        let keep = k.fields.split_off(&first_kept);
        k.fields = keep;
    }

    /// The fields of the entries whose ids follow `from` (those not
    /// forgotten), in id order. Alone, for readers of fields only: a
    /// writer of both takes them with their arguments (`since_with_fields`).
    pub fn fields_since(&self, from: usize) -> Vec<(u64, Vec<FieldValue>)> {
        let k = self.lock();
        let after = k.fields.range(from as u64 + 1..);
        after.map(|(id, v)| (*id, v.clone())).collect()
    }

    /// `since(from)` and `fields_since(from)` under one lock: the fields
    /// are exactly those of the arguments returned. Taken in two locks, an
    /// entry pushed between them (a ring drainer or a recorder runs beside
    /// the store) had its fields taken without its arguments, and a data
    /// file then held fields before the arguments they name, which its
    /// reader refuses.
    #[allow(clippy::type_complexity)]
    pub fn since_with_fields(
        &self,
        from: usize,
    ) -> (Vec<[u64; ARG_REGS]>, Vec<(u64, Vec<FieldValue>)>) {
        let k = self.lock();
        let args = k
            .args
            .get(from.saturating_sub(k.base)..)
            .unwrap_or_default()
            .to_vec();
        let fields = k.fields.range(from as u64 + 1..);
        (args, fields.map(|(id, v)| (*id, v.clone())).collect())
    }

    /// Every entry's fields kept, by id (`Trace::fields`): complete when
    /// none were forgotten (events kept in memory).
    pub fn all_fields(&self) -> BTreeMap<u64, Vec<FieldValue>> {
        self.lock().fields.clone()
    }

    /// Takes every argument kept: the index of the first (its id is one
    /// more) and the arguments.
    pub fn drain(&self) -> (usize, Vec<[u64; ARG_REGS]>) {
        let mut k = self.lock();
        let first = k.base;
        let args = std::mem::take(&mut k.args);
        k.base += args.len();
        (first, args)
    }

    /// `drain`, and every entry's fields kept with them, under one lock
    /// (the flight recorder's; as `since_with_fields`): the fields taken
    /// are those of the arguments taken.
    #[allow(clippy::type_complexity)]
    pub fn drain_with_fields(
        &self,
    ) -> (usize, Vec<[u64; ARG_REGS]>, BTreeMap<u64, Vec<FieldValue>>) {
        let mut k = self.lock();
        let first = k.base;
        let args = std::mem::take(&mut k.args);
        k.base += args.len();
        (first, args, std::mem::take(&mut k.fields))
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

    #[test]
    fn forgotten_and_drained_arguments_keep_the_ids() {
        let t = ArgTable::new();
        for i in 1..=4 {
            t.push([i; ARG_REGS]);
        }
        t.forget(3);
        assert_eq!(t.len(), 4);
        assert_eq!(t.since(3), vec![[4; ARG_REGS]]);
        // Before the forgotten ones: what is kept.
        assert_eq!(t.since(0), vec![[4; ARG_REGS]]);
        assert_eq!(t.push([5; ARG_REGS]), 5);
        assert_eq!(t.drain(), (3, vec![[4; ARG_REGS], [5; ARG_REGS]]));
        assert_eq!(t.drain(), (5, Vec::new()));
        assert_eq!(t.push([6; ARG_REGS]), 6);
        t.forget(2);
        assert_eq!(t.since(5), vec![[6; ARG_REGS]]);
    }
}
