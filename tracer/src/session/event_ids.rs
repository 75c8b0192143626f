//! The traced events' ids as the guest kernel numbers them, so that a
//! trace.dat export names each event as the guest's tracefs does
//! (`events/SYSTEM/NAME/id`, what `trace-cmd` reads in the guest). The
//! kernel gives each event its id at boot, in `call->event.type`
//! (kernel/trace/trace_output.c `register_trace_event`, from
//! `__TRACE_LAST_TYPE` up): the image holds 0 there, so vmtrace reads it
//! in the guest into each event's format
//! (`crate::kernel::events::ftrace_format::FtraceFormat::id`): `attach` in
//! its first stop, before the tracer takes the plan; vmtrace's own VMM at
//! the end of the run (`Tracer::read_event_ids`), as its attach comes
//! before the kernel numbers its events.

use vm_memory::GuestAddress;
use vmm::GuestRam;

use crate::kernel::kaslr::KernelOffset;
use crate::plan::events::EventPlan;

/// The highest id an event may have: `struct trace_entry`'s `type` is an
/// `unsigned short` (include/linux/trace_events.h `TRACE_EVENT_TYPE_MAX`).
const MAX_ID: i32 = u16::MAX as i32;

/// Each of `events`' formats given its id as read in `ram` (the kernel at
/// `offset`); an id not readable, or out of range (a kernel whose event
/// failed to register keeps 0), is left 0: the export then numbers the
/// event itself. Returns the ids read.
pub(crate) fn read(ram: &dyn GuestRam, events: &mut EventPlan, offset: KernelOffset) -> usize {
    let mut read = 0;
    // A module's cell through the kernel's page tables, found first.
    let gpas: Vec<Option<u64>> = (events.events.iter())
        .map(|e| e.id_cell.and_then(|c| events.gpa(ram, offset, e, c)))
        .collect();
    let tracepoints = (events.events.iter_mut())
        .zip(gpas)
        .map(|(e, gpa)| (gpa, &mut e.format));
    let syscalls = events
        .syscalls
        .iter_mut()
        .map(|e| (e.id_cell.and_then(|c| offset.phys_of(c)), &mut e.format));
    for (gpa, format) in tracepoints.chain(syscalls) {
        let (Some(gpa), Some(f)) = (gpa, format.as_mut()) else {
            continue;
        };
        let Some(t) = f.ftrace.as_mut() else {
            continue;
        };
        let mut b = [0u8; 4];
        if ram.read_slice(&mut b, GuestAddress(gpa)).is_err() {
            continue;
        }
        let id = i32::from_le_bytes(b);
        if (1..=MAX_ID).contains(&id) {
            t.id = id as u16;
            read += 1;
        }
    }
    read
}

#[cfg(test)]
mod tests {
    use vm_memory::{Bytes, GuestMemoryMmap};

    use super::*;
    use crate::kernel::events::fields::EventFormat;
    use crate::kernel::events::ftrace_format::FtraceFormat;
    use crate::plan::events::PlannedEvent;

    /// The kernel map: physical = virtual - this.
    const PHYS: u64 = 0xffff_ffff_8000_0000;
    /// Two events' `call->event.type`.
    const SWITCH: u64 = 0xffff_ffff_8160_0040;
    const WAKEUP: u64 = 0xffff_ffff_8160_0140;

    fn event(name: &str, id_cell: Option<u64>) -> PlannedEvent {
        PlannedEvent {
            system: "sched".into(),
            name: name.into(),
            key: 0,
            iterator: 0,
            sites: Vec::new(),
            static_call: false,
            tramp: None,
            tests: Vec::new(),
            funcs: 0,
            iterator_cell: 0,
            format: Some(EventFormat {
                event: format!("sched:{name}"),
                fields: Vec::new(),
                covered: true,
                ftrace: Some(FtraceFormat {
                    id: 0,
                    fields: Vec::new(),
                    print_fmt: String::new(),
                }),
            }),
            id_cell,
            module: None,
        }
    }

    fn id(e: &PlannedEvent) -> u16 {
        e.format.as_ref().unwrap().ftrace.as_ref().unwrap().id
    }

    /// Each event's id is the guest's `call->event.type`; one of 0 (never
    /// registered), one the kernel could not have given, and one whose
    /// cell BTF did not name stay 0.
    #[test]
    fn the_ids_are_the_guests() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 32 << 20)]).unwrap();
        mem.write_obj(316i32, GuestAddress(SWITCH - PHYS)).unwrap();
        mem.write_obj(0i32, GuestAddress(WAKEUP - PHYS)).unwrap();
        let mut plan = EventPlan {
            events: vec![
                event("sched_switch", Some(SWITCH)),
                event("sched_wakeup", Some(WAKEUP)),
                event("sched_waking", None),
            ],
            ..Default::default()
        };
        assert_eq!(read(&mem, &mut plan, KernelOffset::NONE), 1);
        let ids: Vec<u16> = plan.events.iter().map(id).collect();
        assert_eq!(ids, [316, 0, 0]);
        mem.write_obj(70_000i32, GuestAddress(WAKEUP - PHYS))
            .unwrap();
        assert_eq!(read(&mem, &mut plan, KernelOffset::NONE), 1);
        assert_eq!(id(&plan.events[1]), 0);
    }
}
