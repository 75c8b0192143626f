//! The traced events' fields (`-e`), read by whoever records an entry of
//! an event's `__traceiter_NAME` while the vCPU is stopped there (the
//! event's arguments and the structures they point to are valid then), and
//! kept by the entry's arguments id (`Event::data`) in the arguments'
//! table (`session::args`), which the store saves them from.

use std::sync::Arc;

use vmm::gva::AddressSpace;

use crate::kernel::events::field_values::{read_fields, read_fields_where};
use crate::kernel::events::fields::{EventFormat, FieldOffsets, FieldValue};
use crate::plan::exitless::strcopy::{self, STRINGS_LEN};

/// The event's arguments among the registers at its function's entry: a
/// tracepoint's after the probe's `__data` (RDI), a syscall event's from
/// RDI, its `struct pt_regs *`.
fn event_args<'a>(format: &EventFormat, regs: &'a [u64; 6]) -> &'a [u64] {
    match format.syscall() {
        Some(_) => regs,
        None => &regs[1..],
    }
}

/// Which sites are events', their formats, and where their values go.
#[derive(Clone, Debug)]
pub struct FieldSource {
    /// Per site (`Plan::index`): its event's format, None for a function.
    formats: Arc<[Option<Arc<EventFormat>>]>,
    offsets: FieldOffsets,
}

impl FieldSource {
    /// Site `k`'s event's format at `formats[k]` (None: a function's);
    /// None when no site is an event's.
    pub fn of(
        formats: Arc<[Option<Arc<EventFormat>>]>,
        offsets: FieldOffsets,
    ) -> Option<FieldSource> {
        let any = formats.iter().any(Option::is_some);
        any.then_some(FieldSource { formats, offsets })
    }

    /// At an entry of site `site`, registers `args` (RDI, the probe's
    /// `__data`, first): its event's fields, read through `space`; None
    /// at a function's site.
    pub fn read(
        &self,
        site: usize,
        args: &[u64; 6],
        space: &mut AddressSpace<'_>,
    ) -> Option<Vec<FieldValue>> {
        let format = self.formats.get(site)?.as_ref()?;
        let mut read = |va: u64, b: &mut [u8]| space.read(va, b).is_ok();
        Some(read_fields(
            format,
            event_args(format, args),
            &self.offsets,
            &mut read,
        ))
    }

    /// `read`, later than the event (exitless mode's drain, the guest
    /// running on): the fields that do not last past the event
    /// (`EventFormat::lasts`) are not read; they are those the event's
    /// body copied into the record at the event (`strings`, `strcopy`),
    /// else unread.
    pub fn read_later(
        &self,
        site: usize,
        args: &[u64; 6],
        strings: Option<&[u8; STRINGS_LEN]>,
        space: &mut AddressSpace<'_>,
    ) -> Option<Vec<FieldValue>> {
        let format = self.formats.get(site)?.as_ref()?;
        let mut read = |va: u64, b: &mut [u8]| space.read(va, b).is_ok();
        let lasting = |i: usize| format.lasts(i);
        let args = event_args(format, args);
        let mut values = read_fields_where(format, args, &self.offsets, &mut read, lasting);
        if let Some(area) = strings {
            strcopy::fill(format, &self.offsets, area, &mut values);
        }
        Some(values)
    }
}

#[cfg(test)]
mod tests {
    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
    use vmm::gva::PagingMode;

    use super::*;
    use crate::kernel::events::fields::{EventFormat, FieldValue};
    use crate::kernel::events::{EventArg, EventKind, KernelEvent};
    use crate::session::args::{ArgSource, ArgTable};

    /// The kernel map of `setup_page_tables`: virtual 0xffffffff80000000 +
    /// physical.
    const KMAP: u64 = 0xffff_ffff_8000_0000;
    /// The top 1 GiB, which it leaves unmapped.
    const UNMAPPED: u64 = 0xffff_ffff_c000_0000;

    fn task_rename() -> EventFormat {
        let arg = |ty: &str, name: &str| EventArg {
            ty: ty.into(),
            name: name.into(),
        };
        EventFormat::of(&KernelEvent {
            system: "task".into(),
            name: "task_rename".into(),
            kind: EventKind::Tracepoint,
            call: 0,
            tracepoint: None,
            key: None,
            iterator: None,
            args: Some(vec![
                arg("struct task_struct *", "task"),
                arg("const char *", "comm"),
            ]),
            listed: true,
            syscall: None,
        })
        .unwrap()
    }

    /// An entry at an event's site keeps its fields, read through the
    /// guest's page tables, by its arguments id; one at a function's site
    /// keeps none; an unmapped pointer reads as unread.
    #[test]
    fn an_events_entry_keeps_its_fields_by_its_arguments_id() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 64 << 20)]).unwrap();
        vmm::boot::regs::setup_page_tables(&mem).unwrap();
        let off = FieldOffsets {
            comm: 0x10,
            pid: 0x20,
            tgid: 0x24,
            prio: 0x28,
            exit_state: 0x2c,
            cpu: Some(0x30),
            signal: 0x38,
            oom_score_adj: 0x8,
            filename: 0,
        };
        let (task, signal, name) = (0x100_0000u64, 0x100_1000u64, 0x100_2000u64);
        mem.write_slice(b"wl-worker\0", GuestAddress(task + 0x10))
            .unwrap();
        mem.write_obj(73u32, GuestAddress(task + 0x20)).unwrap();
        mem.write_obj(KMAP + signal, GuestAddress(task + 0x38))
            .unwrap();
        mem.write_obj(-1000i16, GuestAddress(signal + 8)).unwrap();
        mem.write_slice(b"wl-child\0", GuestAddress(name)).unwrap();
        let src = FieldSource {
            formats: vec![None, Some(Arc::new(task_rename()))].into(),
            offsets: off,
        };
        let table = Arc::new(ArgTable::new());
        let args = ArgSource::new(&table, Some(vec![true, true].into())).unwrap();
        let mut space = AddressSpace::new(&mem, vmm::layout::PML4_START, PagingMode::Level4);
        let mut entry = |site: usize, regs: [u64; 6]| {
            let fields = src.read(site, &regs, &mut space);
            args.push_with_fields(site, regs, fields)
        };
        let regs = [0, KMAP + task, KMAP + name, 0, 0, 0];
        assert_eq!(entry(1, regs), 1);
        assert_eq!(entry(0, regs), 2);
        // The name at an address no page maps.
        assert_eq!(entry(1, [0, KMAP + task, UNMAPPED, 0, 0, 0]), 3);
        let kept = table.all_fields();
        assert_eq!(kept.len(), 2);
        let s = |v: &str| FieldValue::Str(v.into());
        let want = [
            FieldValue::Int(73),
            s("wl-worker"),
            s("wl-child"),
            FieldValue::Int(-1000),
        ];
        assert_eq!(kept[&1], want);
        assert_eq!(kept[&3][2], FieldValue::Unread);
        // Saved: forgotten with their arguments.
        table.forget(1);
        assert_eq!(table.fields_since(0).len(), 1);
    }
}
