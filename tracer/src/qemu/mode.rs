//! What a QEMU guest offers exitless mode, found at the first stop: its
//! free low memory for vmtrace's code and rings, its TSC rate, and the CPUs
//! its kernel may run on (one ring each). The
//! mode itself is a plan step (`crate::plan::attach_mode`); this module
//! says which of the guest's reasons let auto mode fall back to trap mode.

use vmm::gva::{AddressSpace, Level};
use vmm::Stopped;

use super::error::QemuError;
use super::guest::QemuStop;
use super::ring_device;
use crate::kernel::cpus::GuestCpus;
use crate::kernel::high_rings::{self, EfiTable};
use crate::kernel::kaslr::KernelOffset;
use crate::kernel::lowmem::{self, LowMemError, LowMemory};
use crate::kernel::pci_hotplug;
use crate::kernel::symbols::KernelImage;
use crate::plan::attach_mode::{self, Room};
use crate::plan::exitless::layout::{CODE_VA, LARGE_PAGE, PAGE, PD_COUNT, REGION_LEN};

/// The region's pages, all in the ring device when it holds the code too.
const REGION_PAGES: usize = (REGION_LEN / PAGE) as usize;
use crate::plan::Plan;

/// Where exitless mode's region can live and how fast the guest's TSC
/// runs, from the first stop.
#[derive(Clone, Debug)]
pub struct FreeRoom {
    pub low: LowMemory,
    pub tsc_khz: u32,
    /// The rings are sized to the ring device, to be plugged.
    pub own_rings: bool,
    /// The code and tables go in the ring device too: no guest page is
    /// known unused (a kernel before 5.13 keeps no low MiB to itself).
    pub own_code: bool,
    /// With `own_rings`: the device's size when its rings go past the data
    /// window, at entry 508 (`crate::kernel::high_rings`; sized by
    /// `--buffer`, `super::ring_device::size_for`); None: the rings share
    /// the data window (`ring_device::SIZE`, `SIZE_WITH_CODE`).
    pub high: Option<u64>,
    /// With `high`: the UEFI runtime services' page tables, whose entry 508
    /// is written and cleared with the kernel's (a guest booted by UEFI).
    pub efi: Option<EfiTable>,
    /// The guest enabled NX (the rings' entries are not executable).
    pub nx: bool,
}

/// Room for exitless mode in the stopped guest: its free low memory and
/// its TSC rate.
pub fn room(
    stop: &QemuStop<'_>,
    plan: &Plan,
    offset: KernelOffset,
    device: u64,
) -> Result<Room<FreeRoom>, QemuError> {
    let mut space = kernel_space(stop, &plan.image, offset)?;
    // A region an earlier attach had to leave (calls that had not
    // returned through it) lives in the same free pages: nothing may be
    // written there while it is mapped.
    let left = (0..PD_COUNT as u64)
        .map(|i| space.entry(CODE_VA + i * LARGE_PAGE, Level::Pd))
        .any(|e| e.is_ok_and(|e| !e.is_empty()));
    if left {
        return Err(QemuError::RegionLeft);
    }
    // A kernel that takes a hot-plugged PCI device gets the ring device
    // (`super::ivshmem`), plugged once the guest runs again; one that
    // cannot would never let it go (QEMU waits for the guest's eject).
    let own_rings = pci_hotplug::acpi_pci_hotplug(&mut space, &plan.image, offset).is_ok();
    let (high, efi) = high_device(&mut space, plan, offset, own_rings.then_some(device));
    let (low, own_code) = match lowmem::find(&mut space, &plan.image, offset) {
        // Direct entries with the function graph, more than the free pages
        // leave them: the whole region in the device, as before 5.13.
        Ok(low) if own_rings && attach_mode::code_needs_own_memory(plan) => (
            LowMemory {
                pages: Vec::new(),
                ..low
            },
            true,
        ),
        Ok(low) => (low, false),
        // Before 5.13 no guest page is known unused: the whole region
        // (code, tables, rings) in the device, the guest's pages untouched.
        Err(LowMemError::TooOld(major, minor)) if own_rings => (
            LowMemory {
                pages: Vec::new(),
                trampoline: (0, 0),
                version: (major, minor),
            },
            true,
        ),
        Err(e) => return Err(e.into()),
    };
    let tsc_khz = match plan.image.symbol("tsc_khz") {
        Some(s) => space
            .read_array::<4>(offset.runtime(s.addr))
            .map(u32::from_le_bytes)
            .unwrap_or(0),
        None => 0,
    };
    // 0 when the kernel found no usable TSC (TCG's): the host's rate is
    // the guest's (`clock`).
    let tsc_khz = match tsc_khz {
        0 => super::clock::host_tsc_khz(),
        k => k,
    };
    if tsc_khz == 0 {
        return Err(QemuError::NoTscRate(tsc_khz));
    }
    Ok(Room {
        // The device's pages below the data window hold the code.
        pages: match own_code {
            true => REGION_PAGES,
            false => low.pages.len(),
        },
        own_rings,
        own_code,
        ring_area: high.map_or(0, ring_device::ring_area),
        found: FreeRoom {
            low,
            tsc_khz,
            own_rings,
            own_code,
            high,
            efi,
            nx: space.nx_enabled(),
        },
    })
}

/// The ring device's size for `device` bytes asked (None: no device),
/// when its rings may go past the data window: where the kernel leaves
/// entry 508 alone; with the EFI page table whose entry 508 is set with
/// the kernel's, if it has one.
fn high_device(
    space: &mut AddressSpace<'_>,
    plan: &Plan,
    offset: KernelOffset,
    device: Option<u64>,
) -> (Option<u64>, Option<EfiTable>) {
    let Some(device) = device else {
        return (None, None);
    };
    let btf = plan.btf.as_deref();
    match high_rings::entry_508_free(space, &plan.image, btf, offset) {
        Ok(efi) => (Some(ring_device::size_for(device)), efi),
        Err(_) => (None, None),
    }
}

/// How many CPUs the rings are for: every CPU number the guest kernel may
/// ever use (`nr_cpu_ids`: its possible CPUs, offline and hot-pluggable
/// ones included), and at least QEMU's `vcpus`. A CPU the guest brings
/// online later, or QEMU hot-adds, then finds its ring. QEMU's count when
/// the kernel's CPU variables cannot be read (not in the symbols, or not
/// readable yet): the attach reads them again under its stop and refuses
/// what cannot be this kernel's (`Tracer::attach`), and trap mode needs
/// none of it.
pub fn ring_cpus(stop: &QemuStop<'_>, plan: &Plan, offset: KernelOffset, vcpus: usize) -> usize {
    let Ok(mut space) = kernel_space(stop, &plan.image, offset) else {
        return vcpus;
    };
    match GuestCpus::read(&mut space, &plan.image, offset) {
        Ok(Some(g)) => g.nr_cpu_ids.max(vcpus),
        _ => vcpus,
    }
}

/// Errors that leave exitless mode no room in this guest (and trap mode
/// through the stub unaffected); a guest still booting is none of them.
pub fn falls_back(e: &QemuError) -> bool {
    match e {
        QemuError::NoRoom(LowMemError::Booting) => false,
        QemuError::NoRoom(_) | QemuError::NoTscRate(_) => true,
        // vmtrace's own region left by an earlier attach: said as it is
        // (it goes at the guest's reboot), no slow fallback.
        _ => false,
    }
}

/// The kernel's own page tables (never a PTI user table), as an attach
/// picks them.
fn kernel_space<'a>(
    stop: &'a QemuStop<'_>,
    image: &KernelImage,
    offset: KernelOffset,
) -> Result<AddressSpace<'a>, QemuError> {
    // Kernel data must be mapped (a PTI user table maps only text).
    let probes: Vec<u64> = ["e820_table", "linux_banner"]
        .iter()
        .filter_map(|n| image.symbol(n))
        .map(|s| offset.runtime(s.addr))
        .collect();
    crate::session::kernel_space(stop.vcpu_spaces(), &probes)
        .ok_or_else(|| QemuError::NotTraceable("no vCPU maps the kernel's data".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_room_in_low_memory_or_no_tsc_rate_falls_back_a_booting_guest_does_not() {
        assert!(falls_back(&QemuError::NoRoom(LowMemError::TooOld(5, 10))));
        assert!(falls_back(&QemuError::NoRoom(LowMemError::NoSymbol(
            "real_mode_header"
        ))));
        assert!(falls_back(&QemuError::NoTscRate(0)));
        // A guest still booting is not ready, not roomless.
        assert!(!falls_back(&QemuError::NoRoom(LowMemError::Booting)));
        // An earlier attach's region still mapped (graph calls in flight):
        // said, not worked around.
        assert!(!falls_back(&QemuError::RegionLeft));
    }
}
