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
use crate::plan::exitless::layout::{DATA_LEN, REGION_LEN};

/// The device's memory: the whole data window, which the rings and the
/// function graph's frames take (`crate::plan::attach_mode`'s own rings).
pub const SIZE: u64 = DATA_LEN;
/// The device's memory when it holds the whole region, code and tables
/// too (a guest with no page known unused): a power of two, as ivshmem's
/// BAR must be.
pub const SIZE_WITH_CODE: u64 = REGION_LEN;

/// Journal, then plug the ring device into the QEMU `qmp` reaches.
/// `size`: `SIZE`, or `SIZE_WITH_CODE`.
pub fn plug(qmp: &mut Monitor, journal: &mut Journal, size: u64) -> Result<SharedRings, QemuError> {
    let names = SharedNames::new(std::process::id(), journal.record.qemu_pid, size);
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
