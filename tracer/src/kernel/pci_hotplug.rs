//! Whether a running Linux kernel takes a PCI device hot-plugged through
//! ACPI, from its own state: ACPI on (`acpi_disabled` and
//! `acpi_pci_disabled` 0: arch/x86/kernel/acpi/boot.c,
//! drivers/acpi/pci_root.c) and the ACPI PCI hot-plug driver built in
//! (drivers/pci/hotplug/acpiphp_glue.c, `acpiphp_enumerate_slots`; it
//! cannot be a module). Such a kernel assigns a hot-added device's BARs
//! at QEMU's ACPI notification and ejects the device at `device_del`; a
//! kernel without it does neither, and a device added to it could never
//! be taken out again (QEMU waits for the guest's eject).

use vmm::gva::AddressSpace;

use super::kaslr::KernelOffset;
use super::symbols::KernelImage;

/// Why a kernel cannot take a hot-plugged PCI device.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HotplugError {
    #[error("the guest kernel has no ACPI PCI hot-plug (no {0} symbol)")]
    NoDriver(&'static str),
    #[error("the guest kernel runs with ACPI off ({0} is set)")]
    AcpiOff(&'static str),
    #[error("cannot read the guest kernel's {what} at {va:#x}")]
    Read { what: &'static str, va: u64 },
}

/// The hot-plug driver's symbol, then the flags that must read 0.
const DRIVER: &str = "acpiphp_enumerate_slots";
const FLAGS: [&str; 2] = ["acpi_disabled", "acpi_pci_disabled"];

/// Ok when the kernel in `space` (at `offset`) takes a hot-plugged PCI
/// device through ACPI.
pub fn acpi_pci_hotplug(
    space: &mut AddressSpace<'_>,
    image: &KernelImage,
    offset: KernelOffset,
) -> Result<(), HotplugError> {
    if image.symbol(DRIVER).is_none() {
        return Err(HotplugError::NoDriver(DRIVER));
    }
    for flag in FLAGS {
        let s = image.symbol(flag).ok_or(HotplugError::NoDriver(flag))?;
        let va = offset.runtime(s.addr);
        let v = space
            .read_array::<4>(va)
            .map(u32::from_le_bytes)
            .map_err(|_| HotplugError::Read { what: flag, va })?;
        if v != 0 {
            return Err(HotplugError::AcpiOff(flag));
        }
    }
    Ok(())
}
