//! The kernel's own top page table, `init_top_pgt` (arch/x86/kernel/head_64.S),
//! walked with no vCPU at hand (the module list is read while the guest
//! runs) and in the paging mode the kernel runs in.
//!
//! Its kernel half is every task's (each task's top table copies its
//! entries), so the image, its data and the modules are mapped through it.
//! A kernel built with CONFIG_X86_5LEVEL on a CPU with LA57 (and not booted
//! with `no5lvl`) runs with 5-level paging: `init_top_pgt` is then a PML5,
//! whose entry 511 leads to `level4_kernel_pgt` (a P4D of which only entry
//! 511 is used) and on to the same `level3_kernel_pgt` as with 4 levels
//! (arch/x86/kernel/head64.c, `__startup_64` and `x86_64_start_kernel`).
//! The mode is not a constant of the kernel file, so it is read from the
//! table itself: the table maps its own running address onto itself in
//! its own mode only. Read as a PML4, a PML5 leads from entry 511 to
//! `level4_kernel_pgt`'s empty entry 510; read as a PML5, a PML4 leads to
//! the fixmap's page directory (`level3_kernel_pgt` entry 511) where the
//! image's page directory should be.

use vmm::gva::{AddressSpace, PagingMode};
use vmm::GuestRam;

use super::kaslr::KernelOffset;
use super::symbols::KernelImage;

/// The kernel's top page table (arch/x86/kernel/head_64.S).
pub const INIT_TOP_PGT: &str = "init_top_pgt";

/// The paging modes a 64-bit Linux kernel runs in: 4-level, and 5-level
/// (CR4.LA57) where built for it and the CPU has it.
pub const KERNEL_PAGING_MODES: [PagingMode; 2] = [PagingMode::Level4, PagingMode::Level5];

/// The walk of the top table at guest-physical `root`, which runs at
/// virtual address `va`: in the one mode in which it maps `va` onto
/// `root`. None where neither does (not the kernel's top table, or not
/// at that address).
pub fn self_mapped(ram: &dyn GuestRam, root: u64, va: u64) -> Option<AddressSpace<'_>> {
    KERNEL_PAGING_MODES
        .into_iter()
        .map(|mode| AddressSpace::new(ram, root, mode))
        .find(|s| s.translate(va).is_ok_and(|t| t.gpa == root))
}

/// The guest-physical address of `init_top_pgt` in a kernel at physical
/// KASLR offset `phys`.
pub fn root(image: &KernelImage, phys: i64) -> Option<u64> {
    let pgt = vmm::layout::kernel_virt_to_phys(image.symbol(INIT_TOP_PGT)?.addr)?;
    Some(pgt.wrapping_add(phys as u64))
}

/// The kernel's own address space: `init_top_pgt` of the kernel at
/// `offset`, walked in the paging mode the kernel runs in. None: no such
/// symbol, or a table that does not map itself there.
pub fn kernel_space<'m>(
    ram: &'m dyn GuestRam,
    image: &KernelImage,
    offset: KernelOffset,
) -> Option<AddressSpace<'m>> {
    let root = root(image, offset.phys)?;
    let va = offset.runtime(image.symbol(INIT_TOP_PGT)?.addr);
    self_mapped(ram, root, va)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

    /// Present and writable: a table entry as head_64.S makes them.
    const TABLE: u64 = 0b11;
    /// A 2 MiB leaf (present, writable, PS).
    const LEAF_2M: u64 = TABLE | 0x80;
    /// The image's link address and where it is loaded (the KASLR steps
    /// below move both).
    const TEXT: u64 = 0xffff_ffff_8100_0000;
    const LOAD: u64 = 0x100_0000;

    fn put(mem: &GuestMemoryMmap, gpa: u64, v: u64) {
        mem.write_obj(v, GuestAddress(gpa)).unwrap();
    }

    /// The kernel's boot tables as head_64.S and head64.c leave them, for
    /// an image of 4 MiB loaded at `LOAD + phys`, running at `TEXT + virt`,
    /// with `init_top_pgt` at its start: the top table (a PML4, or with
    /// `la57` a PML5 whose entry 511 leads to `level4_kernel_pgt`), then
    /// `level3_kernel_pgt` (510: the image's page directory; 511: the
    /// fixmap's), `level2_kernel_pgt`, `level2_fixmap_pgt` (506-507 in
    /// use), each a page of the image.
    fn boot_tables(la57: bool, virt: u64, phys: u64) -> GuestMemoryMmap {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 64 << 20)]).unwrap();
        let base = LOAD + phys;
        let [top, l4, l3, l2, fixmap, l1] = [0, 1, 2, 3, 4, 5].map(|i| base + i * 0x1000);
        let index = |va: u64, shift: u32| ((va >> shift) & 511) * 8;
        let run = TEXT + virt;
        if la57 {
            put(&mem, top + 511 * 8, l4 | TABLE);
            put(&mem, l4 + 511 * 8, l3 | TABLE);
        } else {
            put(&mem, top + 511 * 8, l3 | TABLE);
        }
        put(&mem, l3 + 510 * 8, l2 | TABLE);
        put(&mem, l3 + 511 * 8, fixmap | TABLE);
        for i in 0..2 {
            put(
                &mem,
                l2 + index(run, 21) + i * 8,
                (base + i * 0x20_0000) | LEAF_2M,
            );
            put(&mem, fixmap + (506 + i) * 8, l1 | TABLE);
        }
        mem
    }

    /// 5-level tables are walked as 5-level and 4-level as 4-level, at any
    /// KASLR offset: each maps the table's own address onto itself in its
    /// mode alone.
    #[test]
    fn the_top_table_is_walked_in_the_mode_it_maps_itself_in() {
        for (la57, mode) in [(false, PagingMode::Level4), (true, PagingMode::Level5)] {
            for (virt, phys) in [(0, 0), (0x2a0_0000, 0x160_0000)] {
                let mem = boot_tables(la57, virt, phys);
                let root = LOAD + phys;
                let space = self_mapped(&mem, root, TEXT + virt).expect("a mode");
                assert_eq!(space.mode(), mode, "la57 {la57}");
                assert_eq!(space.root(), root);
                // The image's text is reached through it.
                let t = space.translate(TEXT + virt + 0x12_3456).unwrap();
                assert_eq!(t.gpa, root + 0x12_3456);
                // The other mode does not map it.
                let other = KERNEL_PAGING_MODES.into_iter().find(|&m| m != mode);
                let wrong = AddressSpace::new(&mem, root, other.unwrap());
                assert_ne!(wrong.translate(TEXT + virt).map(|t| t.gpa), Ok(root));
                // At another offset the table is not there.
                assert!(self_mapped(&mem, root, TEXT + virt + 0x20_0000).is_none());
            }
        }
    }
}
