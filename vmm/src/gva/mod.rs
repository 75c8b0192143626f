//! Guest-virtual to guest-physical translation by walking the guest's own
//! x86-64 page tables from the host.
//!
//! The walk follows the Intel SDM (vol. 3A, ch. 4.5) for 4-level (PML4) and
//! 5-level (PML5, CR4.LA57) paging. It is a *debugger's* walk, not the CPU's:
//! - access rights (R/W, U/S, NX, SMEP/SMAP, protection keys) are not checked,
//!   so the tracer may read and write any mapped page;
//! - accessed/dirty bits are never set, so tracing leaves no footprint in the
//!   guest's page tables;
//! - every table entry and every data byte is a bounds-checked guest memory
//!   access: a hostile or corrupt table yields an error, never a panic.
//!
//! A walk visits at most 5 tables by construction, so self-referencing
//! (recursive) tables cannot make it loop.
//!
//! Everything else reaches guest memory by virtual address through one
//! type, [`AddressSpace`] (space.rs): reads, all-or-nothing writes, bytes
//! pinned to physical addresses for later ([`PhysSpan`]), and page-table
//! entries ([`Entry`]).

use std::sync::atomic::Ordering;

use vm_memory::GuestAddress;

use crate::ram::GuestRam;

mod space;
pub use space::{AddressSpace, Entry, PhysSpan};

/// CR4.LA57 (bit 12): 57-bit linear addresses, i.e. 5-level paging.
const CR4_LA57: u64 = 1 << 12;

/// log2 of the base page size.
const PAGE_SHIFT: u32 = 12;
/// Base page size (4 KiB).
pub const PAGE_SIZE_4K: u64 = 1 << PAGE_SHIFT;
/// Large page mapped by a PDE with PS=1 (2 MiB).
pub const PAGE_SIZE_2M: u64 = 1 << 21;
/// Huge page mapped by a PDPTE with PS=1 (1 GiB).
pub const PAGE_SIZE_1G: u64 = 1 << 30;
/// Byte offset within a 4 KiB page.
const PAGE_OFFSET_MASK: u64 = PAGE_SIZE_4K - 1;

/// Every paging-structure entry is 8 bytes.
const ENTRY_SIZE: u64 = 8;
/// Each level indexes 9 bits of the address (512 entries per 4 KiB table).
const INDEX_MASK: u64 = 0x1ff;

/// Entry bit 0: present. Every other bit is ignored by the CPU when clear.
const PTE_PRESENT: u64 = 1 << 0;
/// Entry bit 7: page size (PS) in a PDPTE/PDE; reserved in PML4E/PML5E;
/// PAT in a PTE.
const PTE_PS: u64 = 1 << 7;
/// Physical address field, bits 51:12 (the architectural maximum
/// MAXPHYADDR is 52). Bit 63 (XD) and the ignored bits 62:52 fall outside.
const PHYS_ADDR_MASK: u64 = 0x000f_ffff_ffff_f000;
/// In a 2 MiB/1 GiB leaf, bit 12 is PAT, not an address bit; the bits
/// between it and the page alignment (20:13 or 29:13) are reserved.
const HUGE_PAT_AND_BELOW: u64 = (1 << 13) - 1;

/// Linear address width with 4-level paging (bits 63:47 must be equal).
const VA_BITS_4LEVEL: u32 = 48;
/// Linear address width with 5-level paging (bits 63:56 must be equal).
const VA_BITS_5LEVEL: u32 = 57;

/// Paging mode from the vCPU's control registers.
///
/// Assumes long mode with paging enabled (CR0.PG=1, EFER.LMA=1), which is all
/// a 64-bit Linux guest ever runs in after early boot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PagingMode {
    /// 4-level paging: PML4, PDPT, PD, PT; 48-bit linear addresses.
    Level4,
    /// 5-level paging (CR4.LA57): PML5 on top; 57-bit linear addresses.
    Level5,
}

impl PagingMode {
    /// The mode selected by CR4.LA57.
    pub fn from_cr4(cr4: u64) -> Self {
        if cr4 & CR4_LA57 != 0 {
            Self::Level5
        } else {
            Self::Level4
        }
    }

    /// Number of implemented linear address bits.
    pub fn va_bits(self) -> u32 {
        match self {
            Self::Level4 => VA_BITS_4LEVEL,
            Self::Level5 => VA_BITS_5LEVEL,
        }
    }

    /// Whether `gva` is canonical: the bits above the implemented width are
    /// copies of the top implemented bit (else the CPU raises #GP).
    pub fn is_canonical(self, gva: u64) -> bool {
        let unused = 64 - self.va_bits();
        // Sign-extend from the top implemented bit and compare.
        (((gva << unused) as i64) >> unused) as u64 == gva
    }

    /// Levels that hold table pointers or huge leaves, top down. The PT
    /// level, whose entries are always 4 KiB leaves, comes after these.
    fn upper_levels(self) -> &'static [Level] {
        match self {
            Self::Level4 => &[Level::Pml4, Level::Pdpt, Level::Pd],
            Self::Level5 => &[Level::Pml5, Level::Pml4, Level::Pdpt, Level::Pd],
        }
    }
}

/// A level of the paging hierarchy, named as in the SDM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// Page map level 5 (5-level paging only); indexed by bits 56:48.
    Pml5,
    /// Page map level 4; indexed by bits 47:39.
    Pml4,
    /// Page directory pointer table; indexed by bits 38:30; PS=1 maps 1 GiB.
    Pdpt,
    /// Page directory; indexed by bits 29:21; PS=1 maps 2 MiB.
    Pd,
    /// Page table; indexed by bits 20:12; maps 4 KiB.
    Pt,
}

impl Level {
    /// Lowest address bit of this level's 9-bit table index.
    fn shift(self) -> u32 {
        match self {
            Self::Pml5 => 48,
            Self::Pml4 => 39,
            Self::Pdpt => 30,
            Self::Pd => 21,
            Self::Pt => 12,
        }
    }

    /// Guest-physical address of the entry for `gva` in the table at `table`.
    fn entry_gpa(self, table: u64, gva: u64) -> u64 {
        table + ((gva >> self.shift()) & INDEX_MASK) * ENTRY_SIZE
    }
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Pml5 => "PML5",
            Self::Pml4 => "PML4",
            Self::Pdpt => "PDPT",
            Self::Pd => "PD",
            Self::Pt => "PT",
        })
    }
}

/// Result of a successful walk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Translation {
    /// Guest-physical address of the byte at the translated address.
    pub gpa: u64,
    /// Size of the page that maps it: 4 KiB, 2 MiB or 1 GiB.
    pub page_size: u64,
}

/// Why a guest-virtual access failed.
///
/// Reserved bits are checked only where they do not depend on the CPU's
/// MAXPHYADDR (PS in PML5E/PML4E, the low bits of huge-page addresses); a
/// too-wide address shows up as `TableOutsideRam`/`PageOutsideRam` instead.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GvaError {
    /// The CPU would raise #GP before walking anything.
    #[error("gva {gva:#x} is not canonical for {mode:?} paging")]
    NonCanonical { gva: u64, mode: PagingMode },
    /// The `level` entry on the walk has P=0 (a #PF in the guest).
    #[error("gva {gva:#x}: {level} entry is not present")]
    NotPresent { gva: u64, level: Level },
    /// The `level` table (CR3 or the entry above) points outside guest RAM.
    #[error("gva {gva:#x}: {level} table at gpa {table_gpa:#x} is outside guest RAM")]
    TableOutsideRam {
        gva: u64,
        level: Level,
        table_gpa: u64,
    },
    /// The `level` entry has `reserved` bits set (a #PF with RSVD=1).
    #[error("gva {gva:#x}: reserved bits {reserved:#x} set in {level} entry {entry:#x}")]
    ReservedBits {
        gva: u64,
        level: Level,
        entry: u64,
        reserved: u64,
    },
    /// The walk succeeded but the data access starting at `gpa` runs
    /// outside guest RAM (e.g. a huge page extending past its end).
    #[error("gva {gva:#x}: access at gpa {gpa:#x} runs outside guest RAM")]
    PageOutsideRam { gva: u64, gpa: u64 },
    /// A page-table entry was asked for below a huge page's leaf.
    #[error("gva {gva:#x}: the {level} entry maps a huge page; there is no table below it")]
    HugePageAbove { gva: u64, level: Level },
    /// This paging mode has no such level (PML5 with 4-level paging).
    #[error("{mode:?} paging has no {level} level")]
    LevelNotUsed { level: Level, mode: PagingMode },
    /// A page-table entry changed between its read and vmtrace's write.
    #[error("{level} entry at gpa {gpa:#x} changed from {expected:#x} to {found:#x}; not written")]
    EntryChanged {
        level: Level,
        gpa: u64,
        expected: u64,
        found: u64,
    },
}

/// Reads the `level` entry for `gva` from the table at `table` and checks
/// its present bit.
fn read_entry(mem: &dyn GuestRam, table: u64, level: Level, gva: u64) -> Result<u64, GvaError> {
    // One aligned word load (entries are 8-byte aligned): the cheapest
    // access each backend has, and a walk is most of a trap's handler.
    // Relaxed, as the CPU's own walk: nothing else is read through it.
    let entry = mem
        .load_u64(GuestAddress(level.entry_gpa(table, gva)), Ordering::Relaxed)
        .map_err(|_| GvaError::TableOutsideRam {
            gva,
            level,
            table_gpa: table,
        })?;
    if entry & PTE_PRESENT == 0 {
        return Err(GvaError::NotPresent { gva, level });
    }
    Ok(entry)
}

/// Translates `gva` through the page tables rooted at `cr3`.
///
/// The returned GPA is not checked against guest RAM (only the tables are):
/// a huge page may legitimately extend past the end of RAM.
pub fn translate(
    mem: &dyn GuestRam,
    cr3: u64,
    mode: PagingMode,
    gva: u64,
) -> Result<Translation, GvaError> {
    if !mode.is_canonical(gva) {
        return Err(GvaError::NonCanonical { gva, mode });
    }
    // CR3 bits 11:0 are PCID or PWT/PCD; bit 63 is the no-flush hint.
    let mut table = cr3 & PHYS_ADDR_MASK;
    for &level in mode.upper_levels() {
        let entry = read_entry(mem, table, level, gva)?;
        if entry & PTE_PS != 0 {
            let page_size = match level {
                Level::Pdpt => PAGE_SIZE_1G,
                Level::Pd => PAGE_SIZE_2M,
                // PS is reserved in PML5/PML4 entries.
                _ => {
                    return Err(GvaError::ReservedBits {
                        gva,
                        level,
                        entry,
                        reserved: PTE_PS,
                    })
                }
            };
            let reserved = entry & (page_size - 1) & !HUGE_PAT_AND_BELOW;
            if reserved != 0 {
                return Err(GvaError::ReservedBits {
                    gva,
                    level,
                    entry,
                    reserved,
                });
            }
            let base = entry & PHYS_ADDR_MASK & !(page_size - 1);
            return Ok(Translation {
                gpa: base | (gva & (page_size - 1)),
                page_size,
            });
        }
        table = entry & PHYS_ADDR_MASK;
    }
    // PT entries are always 4 KiB leaves (their bit 7 is PAT).
    let entry = read_entry(mem, table, Level::Pt, gva)?;
    Ok(Translation {
        gpa: (entry & PHYS_ADDR_MASK) | (gva & PAGE_OFFSET_MASK),
        page_size: PAGE_SIZE_4K,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestMemoryMmap};

    const RAM_SIZE: usize = 16 << 20;
    /// Entry bit 1: writable (set like a real kernel would; not checked).
    const PTE_RW: u64 = 1 << 1;
    /// Page tables are allocated from here up; data pages live above 2 MiB.
    const TABLES_START: u64 = 0x1000;

    fn ram(size: usize) -> GuestMemoryMmap<()> {
        GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), size)]).unwrap()
    }

    fn get(mem: &GuestMemoryMmap<()>, gpa: u64) -> u64 {
        let mut raw = [0u8; 8];
        mem.read_slice(&mut raw, GuestAddress(gpa)).unwrap();
        u64::from_le_bytes(raw)
    }

    fn put(mem: &GuestMemoryMmap<()>, gpa: u64, value: u64) {
        mem.write_slice(&value.to_le_bytes(), GuestAddress(gpa))
            .unwrap();
    }

    /// Builds page tables in guest memory, allocating tables on demand.
    struct Tables<'a> {
        mem: &'a GuestMemoryMmap<()>,
        mode: PagingMode,
        root: u64,
        next: u64,
    }

    impl<'a> Tables<'a> {
        fn new(mem: &'a GuestMemoryMmap<()>, mode: PagingMode) -> Self {
            Self::at(mem, mode, TABLES_START)
        }

        /// Tables allocated from `start` (for several address spaces).
        fn at(mem: &'a GuestMemoryMmap<()>, mode: PagingMode, start: u64) -> Self {
            Self {
                mem,
                mode,
                root: start,
                next: start + PAGE_SIZE_4K,
            }
        }

        fn levels(&self) -> impl Iterator<Item = Level> {
            self.mode.upper_levels().iter().copied().chain([Level::Pt])
        }

        /// Maps `gva` to `gpa` with a page of `size` (4K, 2M or 1G).
        fn map(&mut self, gva: u64, gpa: u64, size: u64) {
            let leaf = match size {
                PAGE_SIZE_4K => Level::Pt,
                PAGE_SIZE_2M => Level::Pd,
                PAGE_SIZE_1G => Level::Pdpt,
                _ => panic!("bad page size {size:#x}"),
            };
            let mut table = self.root;
            for level in self.levels().collect::<Vec<_>>() {
                let slot = level.entry_gpa(table, gva);
                if level == leaf {
                    let ps = if leaf == Level::Pt { 0 } else { PTE_PS };
                    put(self.mem, slot, gpa | PTE_PRESENT | PTE_RW | ps);
                    return;
                }
                let mut entry = get(self.mem, slot);
                if entry & PTE_PRESENT == 0 {
                    entry = self.next | PTE_PRESENT | PTE_RW;
                    self.next += PAGE_SIZE_4K;
                    put(self.mem, slot, entry);
                }
                table = entry & PHYS_ADDR_MASK;
            }
        }

        /// Guest-physical address of the `level` entry used to map `gva`.
        fn slot(&self, gva: u64, level: Level) -> u64 {
            let mut table = self.root;
            for l in self.levels() {
                if l == level {
                    return l.entry_gpa(table, gva);
                }
                table = get(self.mem, l.entry_gpa(table, gva)) & PHYS_ADDR_MASK;
            }
            unreachable!("{level} is not used in {:?}", self.mode)
        }

        fn translate(&self, gva: u64) -> Result<Translation, GvaError> {
            translate(self.mem, self.root, self.mode, gva)
        }
    }

    /// Builds a canonical 4-level address from its table indices.
    fn gva4(pml4: u64, pdpt: u64, pd: u64, pt: u64, offset: u64) -> u64 {
        let gva = (pml4 << 39) | (pdpt << 30) | (pd << 21) | (pt << 12) | offset;
        // Sign-extend bit 47.
        (((gva << 16) as i64) >> 16) as u64
    }

    #[test]
    fn gva_from_cr4_selects_mode() {
        assert_eq!(PagingMode::from_cr4(0), PagingMode::Level4);
        assert_eq!(PagingMode::from_cr4(0x20 | 0x80), PagingMode::Level4);
        assert_eq!(PagingMode::from_cr4(CR4_LA57 | 0x20), PagingMode::Level5);
    }

    #[test]
    fn gva_4k_pages_cross_boundary_read_write() {
        let mem = ram(RAM_SIZE);
        let mut pt = Tables::new(&mem, PagingMode::Level4);
        let gva = 0x7f12_3456_7000;
        // Second virtual page maps *below* the first, far away from it.
        pt.map(gva, 0x50_0000, PAGE_SIZE_4K);
        pt.map(gva + PAGE_SIZE_4K, 0x30_0000, PAGE_SIZE_4K);

        let t = pt.translate(gva + 0x123).unwrap();
        assert_eq!(
            t,
            Translation {
                gpa: 0x50_0123,
                page_size: PAGE_SIZE_4K
            }
        );
        assert_eq!(pt.translate(gva + 0x1008).unwrap().gpa, 0x30_0008);

        // Bit 7 of a PTE is PAT, not PS: still a 4 KiB page at the same base.
        let slot = pt.slot(gva, Level::Pt);
        put(&mem, slot, get(&mem, slot) | PTE_PS);
        assert_eq!(pt.translate(gva + 0x123).unwrap(), t);

        let data: Vec<u8> = (1..=16).collect();
        let start = gva + PAGE_SIZE_4K - 8;
        AddressSpace::new(&mem, pt.root, pt.mode)
            .write(start, &data)
            .unwrap();

        // Bytes landed at the right GPAs on both sides of the boundary.
        let mut first = [0u8; 8];
        let mut second = [0u8; 8];
        mem.read_slice(&mut first, GuestAddress(0x50_0ff8)).unwrap();
        mem.read_slice(&mut second, GuestAddress(0x30_0000))
            .unwrap();
        assert_eq!(first, data[..8]);
        assert_eq!(second, data[8..]);

        let mut back = [0u8; 16];
        AddressSpace::new(&mem, pt.root, pt.mode)
            .read(start, &mut back)
            .unwrap();
        assert_eq!(back[..], data[..]);

        // A u64 straddling the boundary.
        let v = AddressSpace::new(&mem, pt.root, pt.mode)
            .read_u64(gva + PAGE_SIZE_4K - 3)
            .unwrap();
        assert_eq!(v.to_le_bytes(), data[5..13]);
    }

    #[test]
    fn gva_2m_page_masks_pat_bit() {
        let mem = ram(RAM_SIZE);
        let mut pt = Tables::new(&mem, PagingMode::Level4);
        let gva = 0x1234_4000_0000 + 3 * PAGE_SIZE_2M;
        pt.map(gva, 0x40_0000, PAGE_SIZE_2M);
        let t = pt.translate(gva + 0x1_2345).unwrap();
        assert_eq!(
            t,
            Translation {
                gpa: 0x41_2345,
                page_size: PAGE_SIZE_2M
            }
        );

        // Bit 12 of a large-page entry is PAT, not an address bit.
        let slot = pt.slot(gva, Level::Pd);
        put(&mem, slot, get(&mem, slot) | (1 << 12));
        assert_eq!(pt.translate(gva + 0x1_2345).unwrap().gpa, 0x41_2345);

        put(&mem, 0x41_2345, 0xdead_beef_cafe_f00d);
        let v = AddressSpace::new(&mem, pt.root, pt.mode)
            .read_u64(gva + 0x1_2345)
            .unwrap();
        assert_eq!(v, 0xdead_beef_cafe_f00d);
    }

    #[test]
    fn gva_huge_page_reserved_bits() {
        let mem = ram(RAM_SIZE);
        let mut pt = Tables::new(&mem, PagingMode::Level4);
        let gva2m = 0x4000_0000_0000;
        let gva1g = 0x5000_0000_0000;
        pt.map(gva2m, 0x40_0000, PAGE_SIZE_2M);
        pt.map(gva1g, 0, PAGE_SIZE_1G);

        // Bit 13 lies between PAT and the 2 MiB alignment: reserved.
        let slot = pt.slot(gva2m, Level::Pd);
        put(&mem, slot, get(&mem, slot) | (1 << 13));
        assert!(matches!(
            pt.translate(gva2m),
            Err(GvaError::ReservedBits {
                level: Level::Pd,
                reserved: 0x2000,
                ..
            })
        ));

        // Bit 21 is an address bit for 2 MiB pages but reserved for 1 GiB.
        let slot = pt.slot(gva1g, Level::Pdpt);
        put(&mem, slot, get(&mem, slot) | (1 << 21));
        assert!(matches!(
            pt.translate(gva1g),
            Err(GvaError::ReservedBits {
                level: Level::Pdpt,
                reserved: 0x20_0000,
                ..
            })
        ));
    }

    #[test]
    fn gva_1g_page_inside_and_beyond_ram() {
        let mem = ram(RAM_SIZE);
        let mut pt = Tables::new(&mem, PagingMode::Level4);
        let gva = 0x80_0000_0000;
        pt.map(gva, 0, PAGE_SIZE_1G);

        let t = pt.translate(gva + 0xa1_2340).unwrap();
        assert_eq!(
            t,
            Translation {
                gpa: 0xa1_2340,
                page_size: PAGE_SIZE_1G
            }
        );
        put(&mem, 0xa1_2340, 42);
        assert_eq!(
            AddressSpace::new(&mem, pt.root, pt.mode)
                .read_u64(gva + 0xa1_2340)
                .unwrap(),
            42
        );

        // In the page, but past the end of RAM: translates, cannot be read.
        let far = gva + 0x2000_0000;
        assert_eq!(pt.translate(far).unwrap().gpa, 0x2000_0000);
        assert_eq!(
            AddressSpace::new(&mem, pt.root, pt.mode).read_u64(far),
            Err(GvaError::PageOutsideRam {
                gva: far,
                gpa: 0x2000_0000
            })
        );
    }

    #[test]
    fn gva_5level_walk_and_la57_canonical() {
        let mem = ram(RAM_SIZE);
        let mut pt = Tables::new(&mem, PagingMode::Level5);
        // PML5 index 0x12: canonical only with 57-bit addresses.
        let gva = 0x0012_3456_789a_b000;
        pt.map(gva, 0x60_0000, PAGE_SIZE_4K);
        pt.map(gva + PAGE_SIZE_4K, 0x20_3000, PAGE_SIZE_4K);
        pt.map(0x0012_0000_0000_0000, 0x80_0000, PAGE_SIZE_2M);

        assert_eq!(pt.translate(gva + 0x10).unwrap().gpa, 0x60_0010);
        assert_eq!(pt.translate(0x0012_0000_0000_1234).unwrap().gpa, 0x80_1234);

        let data = *b"five level paging";
        let start = gva + PAGE_SIZE_4K - 5;
        AddressSpace::new(&mem, pt.root, pt.mode)
            .write(start, &data)
            .unwrap();
        let mut second = [0u8; 12];
        mem.read_slice(&mut second, GuestAddress(0x20_3000))
            .unwrap();
        assert_eq!(second, data[5..]);
        let mut back = [0u8; 17];
        AddressSpace::new(&mem, pt.root, pt.mode)
            .read(start, &mut back)
            .unwrap();
        assert_eq!(back, data);

        // Same root, 4-level interpretation: the address is not canonical.
        assert_eq!(
            translate(&mem, pt.root, PagingMode::Level4, gva),
            Err(GvaError::NonCanonical {
                gva,
                mode: PagingMode::Level4
            })
        );

        let l4 = PagingMode::Level4;
        let l5 = PagingMode::Level5;
        assert!(l5.is_canonical(0xff00_0000_0000_0000));
        assert!(!l4.is_canonical(0xff00_0000_0000_0000));
        assert!(l4.is_canonical(0xffff_8000_0000_0000));
        assert!(l4.is_canonical(0x0000_7fff_ffff_ffff));
        assert!(!l5.is_canonical(0x0100_0000_0000_0000));
        assert!(!l5.is_canonical(0xfe00_0000_0000_0000));
    }

    #[test]
    fn gva_linux_kernel_high_mapping() {
        // 32 MiB so the kernel's physical load address is backed.
        let mem = ram(32 << 20);
        let mut pt = Tables::new(&mem, PagingMode::Level4);
        // __START_KERNEL_map + 16 MiB, mapped with 2 MiB pages as Linux does:
        // PML4 511, PDPT 510, PD 8.
        let text = 0xffff_ffff_8100_0000;
        assert_eq!(text, gva4(511, 510, 8, 0, 0));
        pt.map(text, 0x100_0000, PAGE_SIZE_2M);

        let t = pt.translate(text + 0x1234).unwrap();
        assert_eq!(
            t,
            Translation {
                gpa: 0x100_1234,
                page_size: PAGE_SIZE_2M
            }
        );

        mem.write_slice(b"\x0f\x1f\x44\x00\x00", GuestAddress(0x100_1234))
            .unwrap();
        let mut insn = [0u8; 5];
        AddressSpace::new(&mem, pt.root, pt.mode)
            .read(text + 0x1234, &mut insn)
            .unwrap();
        assert_eq!(&insn, b"\x0f\x1f\x44\x00\x00");
    }

    #[test]
    fn gva_not_present_at_each_level() {
        for mode in [PagingMode::Level4, PagingMode::Level5] {
            let mem = ram(RAM_SIZE);
            let mut pt = Tables::new(&mem, mode);
            let gva = 0x7f00_1234_5000;
            pt.map(gva, 0x50_0000, PAGE_SIZE_4K);
            assert!(pt.translate(gva).is_ok());
            // Clear present bottom-up so each walk reaches the level.
            for level in pt.levels().collect::<Vec<_>>().into_iter().rev() {
                let slot = pt.slot(gva, level);
                put(&mem, slot, get(&mem, slot) & !PTE_PRESENT);
                assert_eq!(pt.translate(gva), Err(GvaError::NotPresent { gva, level }));
            }
        }
        // An empty table: nothing mapped at all.
        let mem = ram(RAM_SIZE);
        assert_eq!(
            translate(&mem, TABLES_START, PagingMode::Level4, 0x1000),
            Err(GvaError::NotPresent {
                gva: 0x1000,
                level: Level::Pml4
            })
        );
    }

    #[test]
    fn gva_non_canonical_address_errors() {
        let mem = ram(RAM_SIZE);
        let mut pt = Tables::new(&mem, PagingMode::Level4);
        pt.map(0x7fff_ffff_f000, 0x50_0000, PAGE_SIZE_4K);
        let bad = 0x0000_8000_0000_0000;
        assert_eq!(
            pt.translate(bad),
            Err(GvaError::NonCanonical {
                gva: bad,
                mode: PagingMode::Level4
            })
        );
        // A read running off the top of the lower half into the hole.
        let mut buf = [0u8; 16];
        assert_eq!(
            AddressSpace::new(&mem, pt.root, pt.mode).read(0x7fff_ffff_fff8, &mut buf),
            Err(GvaError::NonCanonical {
                gva: bad,
                mode: PagingMode::Level4
            })
        );
    }

    #[test]
    fn gva_self_referencing_tables_terminate() {
        // Recursive mapping: a top-level entry pointing at its own table.
        // Walking through it N times lands on the table itself as data.
        let mem = ram(RAM_SIZE);
        let root = TABLES_START;
        let idx = 0x1ed;
        let self_entry = root | PTE_PRESENT | PTE_RW;
        put(&mem, root + idx * ENTRY_SIZE, self_entry);

        let gva = gva4(idx, idx, idx, idx, 0);
        let t = translate(&mem, root, PagingMode::Level4, gva + 0x18);
        assert_eq!(
            t,
            Ok(Translation {
                gpa: root + 0x18,
                page_size: PAGE_SIZE_4K
            })
        );
        // Reading the recursive slot through itself yields the entry.
        let v = AddressSpace::new(&mem, root, PagingMode::Level4).read_u64(gva + idx * ENTRY_SIZE);
        assert_eq!(v, Ok(self_entry));

        // Same with five levels: five reads, then done.
        let gva5 = (idx << 48) | (gva4(idx, idx, idx, idx, 0x20) & 0xffff_ffff_ffff);
        let gva5 = (((gva5 << 7) as i64) >> 7) as u64;
        let t = translate(&mem, root, PagingMode::Level5, gva5);
        assert_eq!(
            t,
            Ok(Translation {
                gpa: root + 0x20,
                page_size: PAGE_SIZE_4K
            })
        );

        // Any other index through the loop hits an empty slot and stops.
        let other = gva4(idx, idx, 3, 0, 0);
        assert_eq!(
            translate(&mem, root, PagingMode::Level4, other),
            Err(GvaError::NotPresent {
                gva: other,
                level: Level::Pd
            })
        );
    }

    #[test]
    fn gva_table_outside_ram() {
        let mem = ram(RAM_SIZE);
        let mut pt = Tables::new(&mem, PagingMode::Level4);
        let gva = 0x4000_0000;
        pt.map(gva, 0x50_0000, PAGE_SIZE_4K);
        let far_table = 0xfff_ffff_f000;
        put(
            &mem,
            pt.slot(gva, Level::Pml4),
            far_table | PTE_PRESENT | PTE_RW,
        );
        assert_eq!(
            pt.translate(gva),
            Err(GvaError::TableOutsideRam {
                gva,
                level: Level::Pdpt,
                table_gpa: far_table
            })
        );
        // XD (bit 63) and ignored high bits must not leak into the address.
        put(
            &mem,
            pt.slot(gva, Level::Pml4),
            (1 << 63) | (0x7f << 52) | far_table | 1,
        );
        assert_eq!(
            pt.translate(gva),
            Err(GvaError::TableOutsideRam {
                gva,
                level: Level::Pdpt,
                table_gpa: far_table
            })
        );
    }

    #[test]
    fn gva_ps_bit_at_top_levels_rejected() {
        for (mode, level) in [
            (PagingMode::Level4, Level::Pml4),
            (PagingMode::Level5, Level::Pml5),
        ] {
            let mem = ram(RAM_SIZE);
            let mut pt = Tables::new(&mem, mode);
            let gva = 0x4000_0000;
            pt.map(gva, 0x50_0000, PAGE_SIZE_4K);
            let slot = pt.slot(gva, level);
            put(&mem, slot, get(&mem, slot) | PTE_PS);
            assert!(matches!(
                pt.translate(gva),
                Err(GvaError::ReservedBits { level: l, reserved: PTE_PS, .. }) if l == level
            ));
        }
    }

    #[test]
    fn gva_cr3_outside_ram_and_pcid_masked() {
        let mem = ram(RAM_SIZE);
        let mut pt = Tables::new(&mem, PagingMode::Level4);
        pt.map(0x4000_0000, 0x50_0000, PAGE_SIZE_4K);
        // PCID in CR3 bits 11:0 and the no-flush hint in bit 63 are ignored.
        let cr3 = pt.root | 0x5 | (1 << 63);
        assert_eq!(
            translate(&mem, cr3, PagingMode::Level4, 0x4000_0010)
                .unwrap()
                .gpa,
            0x50_0010
        );
        let bad_cr3 = 0x4000_0000;
        assert_eq!(
            translate(&mem, bad_cr3, PagingMode::Level4, 0x10),
            Err(GvaError::TableOutsideRam {
                gva: 0x10,
                level: Level::Pml4,
                table_gpa: bad_cr3
            })
        );
        assert!(matches!(
            translate(&mem, bad_cr3, PagingMode::Level5, 0x10),
            Err(GvaError::TableOutsideRam {
                level: Level::Pml5,
                ..
            })
        ));
    }

    #[test]
    fn gva_write_is_all_or_nothing() {
        let mem = ram(RAM_SIZE);
        let mut pt = Tables::new(&mem, PagingMode::Level4);
        let gva = 0x7000_0000;
        pt.map(gva, 0x50_0000, PAGE_SIZE_4K);
        // Next page not mapped at all.
        let data = [0xaa; 16];
        let r = AddressSpace::new(&mem, pt.root, pt.mode).write(gva + 0xff8, &data);
        assert!(matches!(
            r,
            Err(GvaError::NotPresent {
                level: Level::Pt,
                ..
            })
        ));
        assert_eq!(get(&mem, 0x50_0ff8), 0);

        // Next page mapped beyond RAM.
        pt.map(gva + PAGE_SIZE_4K, 0x4000_0000, PAGE_SIZE_4K);
        let r = AddressSpace::new(&mem, pt.root, pt.mode).write(gva + 0xff8, &data);
        assert_eq!(
            r,
            Err(GvaError::PageOutsideRam {
                gva: gva + PAGE_SIZE_4K,
                gpa: 0x4000_0000
            })
        );
        assert_eq!(get(&mem, 0x50_0ff8), 0);
    }

    #[test]
    fn space_reads_writes_across_pages_and_spans_pin_physical_bytes() {
        let mem = ram(RAM_SIZE);
        let mut pt = Tables::new(&mem, PagingMode::Level4);
        let gva = 0xffff_ffff_8100_0ffe;
        pt.map(gva & !0xfff, 0x50_0000, PAGE_SIZE_4K);
        pt.map((gva & !0xfff) + PAGE_SIZE_4K, 0x30_0000, PAGE_SIZE_4K);
        let mut space = AddressSpace::new(&mem, pt.root, PagingMode::Level4);
        space.write(gva, &[1, 2, 3, 4, 5]).unwrap();
        assert_eq!(space.read_array::<5>(gva).unwrap(), [1, 2, 3, 4, 5]);
        assert_eq!(get(&mem, 0x50_0ff8) >> 48, 0x0201);
        let span = space.span(gva, 5).unwrap();
        assert_eq!((span.start(), span.len()), (0x50_0ffe, 5));
        span.write(&mem, &[9, 9, 9, 9, 9]).unwrap();
        let mut b = [0u8; 3];
        mem.read_slice(&mut b, GuestAddress(0x30_0000)).unwrap();
        assert_eq!(b, [9, 9, 9]);
        // An unmapped second page: nothing written.
        let lone = 0xffff_ffff_8200_0ffe;
        pt.map(lone & !0xfff, 0x60_0000, PAGE_SIZE_4K);
        let mut space = AddressSpace::new(&mem, pt.root, PagingMode::Level4);
        assert!(matches!(
            space.write(lone, &[7; 4]),
            Err(GvaError::NotPresent { .. })
        ));
        assert_eq!(get(&mem, 0x60_0ff8), 0);
    }

    #[test]
    fn space_cache_lives_for_one_view_and_a_new_view_sees_a_remapped_page() {
        // The trap path builds a view per trap: a stack page the guest
        // remapped between two traps must be read at its new place.
        let mem = ram(RAM_SIZE);
        let mut pt = Tables::new(&mem, PagingMode::Level4);
        let stack = 0xffff_c900_0000_3ff8;
        pt.map(stack & !0xfff, 0x40_0000, PAGE_SIZE_4K);
        put(&mem, 0x40_0ff8, 0x1111);
        put(&mem, 0x41_0ff8, 0x2222);
        let mut view = AddressSpace::new(&mem, pt.root, PagingMode::Level4);
        assert_eq!(view.read_u64(stack).unwrap(), 0x1111);
        // The guest reuses the virtual stack page for another physical page.
        put(
            &mem,
            pt.slot(stack, Level::Pt),
            0x41_0000 | PTE_PRESENT | PTE_RW,
        );
        assert_eq!(
            view.read_u64(stack).unwrap(),
            0x1111,
            "cached within the view"
        );
        view.flush();
        assert_eq!(view.read_u64(stack).unwrap(), 0x2222);
        let mut fresh = AddressSpace::new(&mem, pt.root, PagingMode::Level4);
        assert_eq!(fresh.read_u64(stack).unwrap(), 0x2222);
    }

    #[test]
    fn space_entries_are_read_and_written_only_if_unchanged() {
        let mem = ram(RAM_SIZE);
        let mut pt = Tables::new(&mem, PagingMode::Level4);
        // A 2 MiB page at the start of the fixmap PD, as Linux has.
        let pd_base = 0xffff_ffff_ff80_0000u64 - 508 * PAGE_SIZE_2M;
        pt.map(pd_base, 0x20_0000, PAGE_SIZE_2M);
        let mut space = AddressSpace::new(&mem, pt.root, PagingMode::Level4);
        let free = 0xffff_ffff_ff80_0000u64;
        let e = space.entry(free, Level::Pd).unwrap();
        assert!(e.is_empty());
        assert!(space.translate(free).is_err());
        space
            .set_entry(&e, 0x60_0000 | PTE_PRESENT | PTE_PS)
            .unwrap();
        assert_eq!(space.translate(free + 5).unwrap().gpa, 0x60_0005);
        // The same stale read again: refused, nothing written.
        assert!(matches!(
            space.set_entry(&e, 0x80_0000 | PTE_PRESENT | PTE_PS),
            Err(GvaError::EntryChanged { .. })
        ));
        assert_eq!(space.translate(free).unwrap().gpa, 0x60_0000);
        assert!(!space.entry(free, Level::Pd).unwrap().is_empty());
        // Below a 2 MiB leaf there is no page table.
        assert!(matches!(
            space.entry(pd_base, Level::Pt),
            Err(GvaError::HugePageAbove {
                level: Level::Pd,
                ..
            })
        ));
        assert!(matches!(
            space.entry(free, Level::Pml5),
            Err(GvaError::LevelNotUsed { .. })
        ));
    }
}
