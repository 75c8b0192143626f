//! The traced events' fields (`-e`), read by whoever records an entry of
//! an event's `__traceiter_NAME` while the vCPU is stopped there (the
//! event's arguments and the structures they point to are valid then), and
//! kept by the entry's arguments id (`Event::data`), as `session::args`
//! keeps the arguments.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use vmm::gva::AddressSpace;

use crate::kernel::events::field_values::read_fields;
use crate::kernel::events::fields::{EventFormat, FieldOffsets, FieldValue};
use crate::plan::Plan;

/// The fields of each recorded event, by its arguments id.
#[derive(Debug, Default)]
pub struct FieldTable {
    inner: Mutex<HashMap<u64, Vec<FieldValue>>>,
}

impl FieldTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Vec<FieldValue>>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The fields of the entry whose arguments id is `data`.
    pub fn get(&self, data: u64) -> Option<Vec<FieldValue>> {
        self.lock().get(&data).cloned()
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Which sites are events', their formats, and where their values go.
#[derive(Clone, Debug)]
pub struct FieldSource {
    /// Per site (`Plan::index`): its event's format, None for a function.
    formats: Arc<[Option<Arc<EventFormat>>]>,
    offsets: FieldOffsets,
    pub table: Arc<FieldTable>,
}

impl FieldSource {
    /// The plan's events' formats by site; None when it traces no event or
    /// BTF lacks the offsets.
    pub fn new(plan: &Plan, table: &Arc<FieldTable>) -> Option<FieldSource> {
        let offsets = plan.events.offsets?;
        let by_func = |f: &u32| {
            let func = plan.funcs.get(*f as usize)?;
            let mut names = plan.image.names(*func);
            let e = names.find_map(|n| plan.events.by_iterator(n))?;
            e.format.clone().map(Arc::new)
        };
        let formats: Arc<[_]> = plan.index.funcs.iter().map(by_func).collect();
        formats.iter().any(Option::is_some).then(|| FieldSource {
            formats,
            offsets,
            table: Arc::clone(table),
        })
    }

    /// At an entry of site `site` whose arguments id is `data` (0: none
    /// kept, nothing to key the fields by), registers `args` (RDI, the
    /// probe's `__data`, first): its event's fields, read through `space`.
    pub fn record(&self, site: usize, data: u64, args: &[u64; 6], space: &mut AddressSpace<'_>) {
        let Some(Some(format)) = self.formats.get(site) else {
            return;
        };
        if data == 0 {
            return;
        }
        let mut read = |va: u64, b: &mut [u8]| space.read(va, b).is_ok();
        let values = read_fields(format, &args[1..], &self.offsets, &mut read);
        self.table.lock().insert(data, values);
    }
}
