//! Whether a running Linux kernel leaves page-upper-directory entry 508 of
//! its top 512 GiB (`0xffffffff00000000`, 1 GiB) to vmtrace's rings, read
//! from its own state at each attach:
//!
//! - the entry is empty in the kernel's page tables (Linux never maps the
//!   hole between the EFI region and the kernel text:
//!   Documentation/x86/x86_64/mm.rst; `level3_kernel_pgt` in head_64.S
//!   fills only 510 and 511);
//! - and, on a kernel booted through UEFI, empty in the EFI page table
//!   too. Such a kernel runs its runtime services on `efi_mm`, whose top
//!   page-upper directory is its own page (`efi_alloc_page_tables`), a
//!   copy of the kernel's taken at boot (arch/x86/platform/efi/efi_64.c
//!   `efi_sync_low_kernel_mappings`: entries 0 to `pud_index(EFI_VA_END)`
//!   and from `pud_index(EFI_VA_START)`, 508, up, by value; the EFI
//!   regions go below `EFI_VA_START`, entries 444-507). An entry set later
//!   in the kernel's is missing there, and an interrupt taken during a
//!   runtime service call would run vmtrace's code on that table and
//!   fault writing its ring: so vmtrace writes entry 508 in both tables
//!   and clears it in both (`EfiTable`). The page directories below
//!   (510, 511: the fixmap's, with vmtrace's code) are shared, not copied.
//!   With 5-level paging the copy is one level up (the P4D entries below
//!   `EFI_VA_END`'s), and the same walk finds EFI's own page-upper
//!   directory.

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
    #[error("entry 508 of the UEFI runtime services' page tables (efi_mm) holds {0:#x}")]
    EfiInUse(u64),
    #[error("cannot walk the UEFI runtime services' page tables (efi_mm, at {0:#x}) to {HIGH_RINGS_VA:#x}")]
    EfiWalk(u64),
    #[error("the kernel has {EFI_MM} but no BTF to read its page tables' address with")]
    EfiUnknown,
}

/// The UEFI runtime services' own page tables (`efi_mm.pgd`): their
/// top-level table's guest-physical address, for `AddressSpace::with_root`.
/// Entry 508 of their page-upper directory must be written and cleared
/// with the kernel's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EfiTable {
    pub root: u64,
}

/// Ok when entry 508 is the rings' in the kernel of `space` (its own page
/// tables, at `offset`): with the EFI page table where vmtrace must write
/// it too (a kernel booted through UEFI), None where there is none.
pub fn entry_508_free(
    space: &mut AddressSpace<'_>,
    image: &KernelImage,
    btf: Option<&KernelBtf>,
    offset: KernelOffset,
) -> Result<Option<EfiTable>, HighRingsUnfit> {
    let e = space
        .entry(HIGH_RINGS_VA, Level::Pdpt)
        .map_err(|_| HighRingsUnfit::Walk)?;
    if !e.is_empty() {
        return Err(HighRingsUnfit::InUse(e.value));
    }
    let Some(efi_mm) = image.symbol(EFI_MM) else {
        // Built without EFI: no other table.
        return Ok(None);
    };
    let pgd = btf
        .and_then(|b| b.member("mm_struct", "pgd").ok())
        .ok_or(HighRingsUnfit::EfiUnknown)?
        .offset;
    let at = offset.runtime(efi_mm.addr) + u64::from(pgd);
    let pgd = match space.read_u64(at) {
        // Not booted through UEFI (or without runtime services).
        Ok(0) => return Ok(None),
        Ok(va) => va,
        Err(_) => return Err(HighRingsUnfit::EfiUnknown),
    };
    // A kernel virtual address (the direct map) of a page-aligned table.
    let root = space
        .gpa(pgd)
        .ok()
        .filter(|r| r % 4096 == 0)
        .ok_or(HighRingsUnfit::EfiWalk(pgd))?;
    let efi = space.with_root(root);
    let e = efi
        .entry(HIGH_RINGS_VA, Level::Pdpt)
        .map_err(|_| HighRingsUnfit::EfiWalk(root))?;
    if !e.is_empty() {
        return Err(HighRingsUnfit::EfiInUse(e.value));
    }
    Ok(Some(EfiTable { root }))
}
