//! Whether a running Linux kernel leaves page-upper-directory entry 508 of
//! its top 512 GiB (`0xffffffff00000000`, 1 GiB) to vmtrace's rings, read
//! from its own state at each attach:
//!
//! - the entry is empty in the kernel's page tables (Linux never maps the
//!   hole between the EFI region and the kernel text:
//!   Documentation/x86/x86_64/mm.rst; `level3_kernel_pgt` in head_64.S
//!   fills only 510 and 511);
//! - no EFI page table copies it. A kernel booted through UEFI runs its
//!   runtime services on `efi_mm`, whose top page-upper directory is a
//!   copy of the kernel's, taken once at boot
//!   (arch/x86/platform/efi/efi_64.c `efi_sync_low_kernel_mappings`: the
//!   entries from `pud_index(EFI_VA_START)`, 508, up are copied by value).
//!   An entry set later is missing there, and an interrupt taken during a
//!   runtime service call would run vmtrace's code on that table and
//!   fault writing its ring. So a kernel whose `efi_mm.pgd` is set keeps
//!   its rings in the data window (entries 509-510 of the fixmap's page
//!   directory, a page both tables share).

use vmm::gva::{AddressSpace, Level};

use super::btf::KernelBtf;
use super::kaslr::KernelOffset;
use super::symbols::KernelImage;

/// The start of entry 508's 1 GiB (511 << 39 | 508 << 30, sign-extended).
pub const HIGH_RINGS_VA: u64 = 0xffff_ffff_0000_0000;

/// The kernel's EFI address space (drivers/firmware/efi/efi.c).
const EFI_MM: &str = "efi_mm";

/// Why entry 508 is not vmtrace's to use.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HighRingsUnfit {
    #[error("page-upper-directory entry 508 ({HIGH_RINGS_VA:#x}) holds {0:#x}")]
    InUse(u64),
    #[error("cannot walk the guest's page tables to {HIGH_RINGS_VA:#x}")]
    Walk,
    #[error("the guest runs UEFI runtime services on page tables of their own (efi_mm), which copied the kernel's top entries at boot")]
    Efi,
    #[error("the kernel has {EFI_MM} but no BTF to read its page tables' address with")]
    EfiUnknown,
}

/// Ok when entry 508 is the rings' in the kernel of `space` (its own page
/// tables, at `offset`).
pub fn entry_508_free(
    space: &mut AddressSpace<'_>,
    image: &KernelImage,
    btf: Option<&KernelBtf>,
    offset: KernelOffset,
) -> Result<(), HighRingsUnfit> {
    let e = space
        .entry(HIGH_RINGS_VA, Level::Pdpt)
        .map_err(|_| HighRingsUnfit::Walk)?;
    if !e.is_empty() {
        return Err(HighRingsUnfit::InUse(e.value));
    }
    let Some(efi_mm) = image.symbol(EFI_MM) else {
        // Built without EFI: no other table.
        return Ok(());
    };
    let pgd = btf
        .and_then(|b| b.member("mm_struct", "pgd").ok())
        .ok_or(HighRingsUnfit::EfiUnknown)?
        .offset;
    let at = offset.runtime(efi_mm.addr) + u64::from(pgd);
    match space.read_u64(at) {
        Ok(0) => Ok(()),
        Ok(_) => Err(HighRingsUnfit::Efi),
        Err(_) => Err(HighRingsUnfit::EfiUnknown),
    }
}
