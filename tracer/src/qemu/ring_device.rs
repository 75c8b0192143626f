//! The ring device in an attach's life (`super::ivshmem`): named in the
//! journal before anything is added, plugged while the guest runs (before
//! the attach's stop, which it does not lengthen), unplugged once the
//! region is out of the guest's page tables, the journal then forgetting it.

use std::sync::Arc;

use vmm::GuestRam;

use super::error::QemuError;
use super::ivshmem::{self, IvshmemError, SharedNames, SharedRings};
use super::journal::Journal;
use super::monitor::Monitor;
use crate::kernel::high_rings::EfiTable;
use crate::plan::exitless::layout::{
    DATA_GPA, DATA_LEN, HIGH_RINGS_MAX, LARGE_PAGE, PAGE, REGION_GPA, REGION_LEN,
};
use crate::session::exitless::backing::{HighRings, RegionPages};

/// The device's memory: the whole data window, which the rings and the
/// function graph's frames take (`crate::plan::attach_mode`'s own rings),
/// where the rings cannot have entry 508 (`FreeRoom::high`).
pub const SIZE: u64 = DATA_LEN;
/// The device's memory when it holds the whole region, code and tables
/// too (a guest with no page known unused): a power of two, as ivshmem's
/// BAR must be.
pub const SIZE_WITH_CODE: u64 = REGION_LEN;

/// A device sized by `--buffer` (`size_for`) is laid out as the region
/// (code, data window, tables: `SIZE_WITH_CODE`, its code part unused
/// when the code is in the guest's free pages), then the rings, mapped at
/// `HIGH_RINGS_VA`: they start here.
pub const RINGS_OFF: u64 = REGION_LEN;
/// Its last 2 MiB hold only entry 508's page directory, in their last page
/// (`high_pd`): outside the region's first 8 MiB, whose guest-physical
/// addresses may be the region's own names (`REGION_GPA`, 4 GiB, is where
/// a guest often puts the BAR), and outside the rings' writable mapping.
const PD_TAIL: u64 = LARGE_PAGE;
/// The smallest such device: rings of 6 MiB, more than the data window's.
pub const MIN_SIZED: u64 = 2 * REGION_LEN;
/// The largest: its rings, less the region, in the 1 GiB entry 508 maps.
pub const MAX_SIZED: u64 = HIGH_RINGS_MAX;
/// `--buffer`'s default, for a session given no size (its 64 MiB device
/// keeps 16 MiB per ring on 2 CPUs: a 200,000-call burst on one CPU).
pub const DEFAULT_SIZED: u64 = 64 << 20;

/// The device for `buffer` bytes of events: a power of two (a BAR's
/// size), between `MIN_SIZED` and `MAX_SIZED`.
pub fn size_for(buffer: u64) -> u64 {
    buffer
        .max(1)
        .checked_next_power_of_two()
        .unwrap_or(MAX_SIZED)
        .clamp(MIN_SIZED, MAX_SIZED)
}

/// Bytes of rings a device of `size` (`size_for`) holds.
pub fn ring_area(size: u64) -> u64 {
    size - RINGS_OFF - PD_TAIL
}

/// Where entry 508's page directory is in a device of `size`.
fn high_pd(size: u64) -> u64 {
    size - PAGE
}

/// A device sized by `--buffer`, where the guest put it, and how its
/// rings are mapped.
#[derive(Clone, Copy, Debug)]
pub struct Placed {
    pub gpa: u64,
    pub size: u64,
    /// The guest enabled NX: the rings are not executable.
    pub nx: bool,
    /// The UEFI runtime services' page tables, mapped alike.
    pub efi: Option<EfiTable>,
}

/// The region's pages with a device sized by `--buffer` `at`: the whole
/// region in it (`own_code`), or its data window (the code in the guest's
/// `free` pages); the rings past them, at `HIGH_RINGS_VA`.
pub fn sized_pages(free: Vec<u64>, at: Placed, own_code: bool) -> RegionPages {
    let gpa = at.gpa;
    let pages = match own_code {
        true => RegionPages::with_own_region(gpa),
        false => RegionPages::with_own_data(free, gpa + (DATA_GPA - REGION_GPA)),
    };
    pages.with_high(HighRings {
        pd: gpa + high_pd(at.size),
        rings: gpa + RINGS_OFF,
        len: ring_area(at.size),
        nx: at.nx,
        efi: at.efi,
    })
}

/// Journal, then plug the ring device into the QEMU `qmp` reaches.
/// `size`: `SIZE`, `SIZE_WITH_CODE`, or `size_for`'s; `efi`: the UEFI page
/// tables whose entry 508 will map its rings too (journaled with it, for
/// a repair).
pub fn plug(
    qmp: &mut Monitor,
    journal: &mut Journal,
    size: u64,
    efi: Option<EfiTable>,
) -> Result<SharedRings, QemuError> {
    let names = SharedNames {
        efi,
        ..SharedNames::new(std::process::id(), journal.record.qemu_pid, size)
    };
    journal.set_shared(Some(names.clone()))?;
    match qmp.burst(|m| ivshmem::plug(m, &names)) {
        Ok(s) => {
            // Its address too, for a repair's rule (`repair::region`);
            // unjournaled, it must not stay.
            if let Err(e) = journal.set_shared(Some(s.names.clone())) {
                let _ = qmp.burst(|m| ivshmem::unplug(m, &s.names));
                let _ = journal.set_shared(None);
                return Err(e.into());
            }
            Ok(s)
        }
        Err(e) => {
            // `plug` took out what it added.
            journal.set_shared(None)?;
            Err(e.into())
        }
    }
}

/// Unplug the device the journal names, if any, and forget it there.
pub fn unplug(qmp: &mut Monitor, journal: &mut Journal) -> Result<(), IvshmemError> {
    let Some(names) = journal.record.shared.clone() else {
        return Ok(());
    };
    qmp.burst(|m| ivshmem::unplug(m, &names))?;
    // (A journal that cannot be written any more is removed next.)
    let _ = journal.set_shared(None);
    Ok(())
}

/// vmtrace's own mapping of the device's memory, for `Backed::with_own`.
pub fn own_memory(s: &SharedRings) -> Arc<dyn GuestRam> {
    Arc::new(s.mem.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_is_a_power_of_two_between_16_mib_and_1_gib() {
        assert_eq!(size_for(64 << 20), 64 << 20);
        assert_eq!(size_for(65 << 20), 128 << 20);
        assert_eq!(size_for(1 << 20), MIN_SIZED);
        assert_eq!(size_for(1 << 30), 1 << 30);
        assert_eq!(size_for(u64::MAX), MAX_SIZED);
        assert_eq!(ring_area(DEFAULT_SIZED), 54 << 20);
        // The directory is past the rings and the region.
        let at = Placed {
            gpa: 1 << 32,
            size: DEFAULT_SIZED,
            nx: true,
            efi: None,
        };
        let p = sized_pages(vec![], at, false);
        let h = p.high().unwrap();
        assert_eq!(h.rings, (1 << 32) + RINGS_OFF);
        assert_eq!(h.pd, (1 << 32) + DEFAULT_SIZED - PAGE);
        assert!(h.rings + h.len <= h.pd && h.pd >= (1 << 32) + REGION_LEN);
        assert_eq!(p.own_data(), Some((1 << 32) + (DATA_GPA - REGION_GPA)));
    }
}
