//! Exitless mode's region staged while the guest runs, before the
//! attach's stop: its memory chosen (the ring device, `super::ring_device`,
//! else the guest's free pages alone), its rings, tables and pool written.

use std::sync::{Arc, Mutex};

use super::drive::{Arming, QemuVm};
use super::error::QemuError;
use super::guest::ClockSource;
use super::ivshmem::SharedRings;
use super::journal::Journal;
use super::mode::{falls_back, FreeRoom};
use super::ring_device;
use crate::plan::attach_mode::{self, Decision, Refused, Room};
use crate::plan::TracePlan;
use crate::session::exitless::backing::{Backed, RegionPages};
use crate::session::Tracer;

/// Rings sized to the ring device: plug it, the guest running. Where it
/// cannot be plugged, the rings sized to the free pages instead (or, in
/// auto mode, trap mode where they do not fit), saying why.
pub(super) fn ring_memory(
    vm: &mut QemuVm,
    journal: &mut Journal,
    plan: &TracePlan,
    cpus: usize,
    decided: Decision<FreeRoom>,
) -> Result<(Decision<FreeRoom>, Option<SharedRings>), QemuError> {
    let room = match decided {
        Decision::Exitless(_, ref room) if room.own_rings => room.clone(),
        d => return Ok((d, None)),
    };
    let size = match (room.high, room.own_code) {
        (Some(size), _) => size,
        (None, true) => ring_device::SIZE_WITH_CODE,
        (None, false) => ring_device::SIZE,
    };
    let efi = room.high.and(room.efi);
    let device = match ring_device::plug(&mut vm.qmp, journal, size, efi) {
        Ok(s) => {
            let decided = match decided {
                // The rings' memory is there now: past the region's layout.
                Decision::Exitless(mut code, room) if room.high.is_some() => {
                    code.place_rings(s.gpa + ring_device::RINGS_OFF);
                    Decision::Exitless(code, room)
                }
                d => d,
            };
            return Ok((decided, Some(s)));
        }
        Err(e) => e.to_string(),
    };
    let low = Room {
        pages: room.low.pages.len(),
        own_rings: false,
        own_code: false,
        ring_area: 0,
        found: FreeRoom {
            own_rings: false,
            own_code: false,
            high: None,
            efi: None,
            ..room
        },
    };
    match attach_mode::decide(plan, cpus, || Ok::<_, QemuError>(low), falls_back) {
        Ok(Decision::Trap { why }) => Ok((
            Decision::Trap {
                why: why.map(|w| format!("{w} (no ring device: {device})")),
            },
            None,
        )),
        Ok(d) => Ok((d, None)),
        Err(Refused::Plan(e)) => Err(e.into()),
        Err(Refused::Room(e)) => Err(e),
    }
}

/// Exitless mode's region in the guest's free pages (its rings in the ring
/// device's memory, if `shared`), its rings, tables and
/// pool written while the guest runs (unmapped until the attach): the
/// attach's stop then only writes the code, the mapping and the sites.
pub(super) fn exitless_region(
    vm: &mut QemuVm,
    tracer: &mut Tracer,
    room: FreeRoom,
    shared: Option<SharedRings>,
) -> Result<(), QemuError> {
    let (pages, view) = match shared {
        Some(s) => {
            let pages = match (room.high, room.own_code) {
                (Some(size), own_code) => {
                    let at = ring_device::Placed {
                        gpa: s.gpa,
                        size,
                        nx: room.nx,
                        efi: room.efi,
                    };
                    ring_device::sized_pages(room.low.pages, at, own_code)
                }
                (None, true) => RegionPages::with_own_region(s.gpa),
                (None, false) => RegionPages::with_own_data(room.low.pages, s.gpa),
            };
            let pages = Arc::new(Mutex::new(pages));
            let own = ring_device::own_memory(&s);
            let view = Backed::with_own(vm.guest.ram(), Arc::clone(&pages), own);
            (pages, view)
        }
        None => {
            let pages = Arc::new(Mutex::new(RegionPages::new(room.low.pages)));
            (Arc::clone(&pages), Backed::new(vm.guest.ram(), pages))
        }
    };
    tracer.back_region(Arc::clone(&pages));
    vm.guest.set_view(Arc::new(view));
    vm.guest.set_clock(ClockSource {
        tsc_khz: room.tsc_khz,
    });
    vm.arming = Arming::Exitless { pages };
    tracer.stage(vm.guest.view())?;
    Ok(())
}
