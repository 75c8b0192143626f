//! Mapping vmtrace's region into the guest's kernel address space, under a
//! pause, through the guest's own page tables.

use vm_memory::GuestAddress;
use vmm::gva::{AddressSpace, Entry, GvaError, Level};

use std::sync::Mutex;

use super::backing::{HighRings, RegionPages, PAGE};
use crate::advice::{Plain, Remedy, TracerAdvice, TracerWords};
use crate::plan::exitless::layout::{
    CODE_GPA, CODE_VA, DATA_GPA, HIGH_RINGS_PUD, HIGH_RINGS_VA, LARGE_PAGE, PD_COUNT, REGION_GPA,
    SPARE_PD_GPA,
};

/// Entry bits (Intel SDM vol. 3A, 4.5): present, writable, page size (a 2 MiB
/// leaf in a PDE), execute-disable. U/S (bit 2) and G (bit 8) stay clear:
/// supervisor-only, and not global, so nothing outlives a CR3 switch in a TLB.
const PTE_PRESENT: u64 = 1 << 0;
const PTE_WRITABLE: u64 = 1 << 1;
const PTE_PS: u64 = 1 << 7;
const PTE_XD: u64 = 1 << 63;
/// A table entry's bits: present and writable (the leaves below decide).
const TABLE: u64 = PTE_PRESENT | PTE_WRITABLE;
/// Accessed and dirty: the CPU sets them in entries it uses, vmtrace's own
/// included, so they do not make an entry someone else's.
const PTE_ACCESSED_DIRTY: u64 = (1 << 5) | (1 << 6);

/// Does `entry` hold what vmtrace wrote (`want`), whatever the CPU marked?
fn ours(entry: u64, want: u64) -> bool {
    entry & !PTE_ACCESSED_DIRTY == want
}

#[derive(Debug, thiserror::Error)]
pub enum MapError {
    #[error("{}", self.say(&Plain))]
    SlotInUse {
        index: usize,
        va: u64,
        gpa: u64,
        value: u64,
    },
    #[error("{}", self.say(&Plain))]
    HugePage { va: u64 },
    #[error("{}", self.say(&Plain))]
    Walk { va: u64, source: GvaError },
    #[error("cannot write the page directory of vmtrace's trampoline: {0}")]
    Memory(String),
}

impl TracerAdvice for MapError {
    fn problem(&self, _: &dyn TracerWords) -> String {
        match self {
            MapError::SlotInUse {
                index,
                va,
                gpa,
                value,
            } => format!(
                "page-directory entry {index} for {va:#x} (at guest physical {gpa:#x}) holds \
                 {value:#x}, not empty: the guest uses the range vmtrace maps its trampoline into"
            ),
            MapError::HugePage { va } => format!(
                "the page directory above {va:#x} is a 1 GiB page: no room for vmtrace's trampoline"
            ),
            MapError::Walk { va, source } => {
                format!("cannot walk the guest's page tables to {va:#x}: {source}")
            }
            e => e.to_string(),
        }
    }

    /// The trampoline cannot be mapped here; traps need no mapping.
    fn remedy(&self) -> Option<Remedy> {
        match self {
            MapError::SlotInUse { .. } | MapError::HugePage { .. } | MapError::Walk { .. } => {
                Some(Remedy::TrapMode)
            }
            MapError::Memory(_) => None,
        }
    }
}

/// What the guest's tables hold for the region after `map`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapped {
    /// vmtrace installed the page directory itself (the guest had none).
    pub own_pd: bool,
    /// The entries were vmtrace's already (a second attach).
    pub reused: bool,
}

/// The leaf each of the `PD_COUNT` entries gets: code read-only and
/// executable, data writable and (where the guest enabled NX) not executable.
fn leaves(nx: bool) -> [u64; PD_COUNT] {
    let xd = if nx { PTE_XD } else { 0 };
    let mut out = [0; PD_COUNT];
    for (i, e) in out.iter_mut().enumerate() {
        *e = if i == 0 {
            CODE_GPA | PTE_PRESENT | PTE_PS
        } else {
            (DATA_GPA + (i as u64 - 1) * LARGE_PAGE) | PTE_PRESENT | PTE_WRITABLE | PTE_PS | xd
        };
    }
    out
}

/// Map the region at `CODE_VA..` in `space` (the kernel's tables: every
/// process shares the kernel half). The entries must be empty, or hold
/// exactly what vmtrace writes (a previous attach): anything else is
/// refused before a byte is written. A missing page directory above the
/// range (the mini guest) is vmtrace's own, from its region.
pub fn map(space: &mut AddressSpace<'_>) -> Result<Mapped, MapError> {
    map_with(space, None)
}

/// `map`, with the region in `pages` (4 KiB entries) when given, else in
/// vmtrace's own slot (2 MiB entries).
pub fn map_with(
    space: &mut AddressSpace<'_>,
    pages: Option<&Mutex<RegionPages>>,
) -> Result<Mapped, MapError> {
    let walk = |va| move |source| MapError::Walk { va, source };
    let mut own_pd = false;
    let pdpte = space.entry(CODE_VA, Level::Pdpt).map_err(walk(CODE_VA))?;
    if pdpte.value & PTE_PRESENT == 0 {
        if !pdpte.is_empty() {
            return Err(MapError::SlotInUse {
                index: 511,
                va: CODE_VA,
                gpa: pdpte.gpa,
                value: pdpte.value,
            });
        }
        space
            .memory()
            .write_slice(&[0u8; 4096], GuestAddress(SPARE_PD_GPA))
            .map_err(|e| MapError::Memory(e.to_string()))?;
        let pd = real(pages, SPARE_PD_GPA)?;
        space.set_entry(&pdpte, pd | TABLE).map_err(walk(CODE_VA))?;
        own_pd = true;
    } else if pdpte.value & PTE_PS != 0 {
        return Err(MapError::HugePage { va: CODE_VA });
    }
    let high = pages.and_then(|p| lock(p).high());
    // Rings past the data window: entry 508 of the top page-upper
    // directory, empty (or vmtrace's already), checked before any write;
    // in the UEFI runtime services' own copy of that directory too.
    let high_entries = match high {
        Some(h) => high_entries(space, &h)?,
        None => Vec::new(),
    };
    let want = match pages {
        None => leaves(space.nx_enabled()),
        Some(p) => page_tables(space, p, space.nx_enabled())?,
    };
    let mut entries: Vec<Entry> = Vec::with_capacity(PD_COUNT);
    for (i, &w) in want.iter().enumerate() {
        let va = CODE_VA + i as u64 * LARGE_PAGE;
        let e = space.entry(va, Level::Pd).map_err(walk(va))?;
        if !e.is_empty() && !ours(e.value, w) {
            return Err(MapError::SlotInUse {
                index: ((va >> 21) & 511) as usize,
                va,
                gpa: e.gpa,
                value: e.value,
            });
        }
        entries.push(e);
    }
    let reused = entries.iter().zip(&want).all(|(e, &w)| ours(e.value, w));
    for (e, &w) in entries.iter().zip(&want) {
        if !ours(e.value, w) {
            space.set_entry(e, w).map_err(walk(CODE_VA))?;
        }
    }
    // Its page directory was written with the rings, before the stop
    // (`high_directory`): one entry here (and one in EFI's table).
    if let Some(h) = high {
        let w = high_entry_value(&h);
        for (root, e) in high_entries.iter().filter(|(_, e)| !ours(e.value, w)) {
            match *root == space.root() {
                true => space.set_entry(e, w),
                false => space.with_root(*root).set_entry(e, w),
            }
            .map_err(walk(HIGH_RINGS_VA))?;
        }
    }
    Ok(Mapped { own_pd, reused })
}

/// What entry 508 holds once mapped: a table, the rings' page directory.
fn high_entry_value(h: &HighRings) -> u64 {
    h.pd | TABLE
}

/// Entry 508 of the kernel's page-upper directory of its top 512 GiB, and
/// of the UEFI runtime services' copy if `h` names one: (the root walked,
/// the entry), each empty or vmtrace's already; else refused.
fn high_entries(space: &AddressSpace<'_>, h: &HighRings) -> Result<Vec<(u64, Entry)>, MapError> {
    let walk = |source| MapError::Walk {
        va: HIGH_RINGS_VA,
        source,
    };
    let roots = std::iter::once(space.root()).chain(h.efi.map(|e| e.root));
    let mut out = Vec::new();
    for root in roots {
        let e = space
            .with_root(root)
            .entry(HIGH_RINGS_VA, Level::Pdpt)
            .map_err(walk)?;
        if !e.is_empty() && !ours(e.value, high_entry_value(h)) {
            return Err(MapError::SlotInUse {
                index: HIGH_RINGS_PUD,
                va: HIGH_RINGS_VA,
                gpa: e.gpa,
                value: e.value,
            });
        }
        // One table for both (never so in Linux): written once.
        if out.iter().all(|(_, o): &(u64, Entry)| o.gpa != e.gpa) {
            out.push((root, e));
        }
    }
    Ok(out)
}

/// The guest-physical page behind region page `page` (itself without
/// `pages`).
fn real(pages: Option<&Mutex<RegionPages>>, page: u64) -> Result<u64, MapError> {
    match pages {
        None => Ok(page),
        Some(p) => lock(p)
            .real(page)
            .ok_or_else(|| MapError::Memory(format!("region page {page:#x} has no backing"))),
    }
}

fn lock(p: &Mutex<RegionPages>) -> std::sync::MutexGuard<'_, RegionPages> {
    p.lock().unwrap_or_else(|e| e.into_inner())
}

/// Region page of the page table behind page-directory entry `i`: after
/// the spare page directory.
fn table_page(i: usize) -> u64 {
    SPARE_PD_GPA + (1 + i as u64) * PAGE
}

/// With the region in `pages`: one page table per entry, mapping each
/// backed 4 KiB page (code read-only and executable, data writable and
/// NX), written to its own backed page; returns the entries pointing at
/// them. The tables are vmtrace's pages, unreachable until an entry is set.
fn page_tables(
    space: &AddressSpace<'_>,
    pages: &Mutex<RegionPages>,
    nx: bool,
) -> Result<[u64; PD_COUNT], MapError> {
    let xd = if nx { PTE_XD } else { 0 };
    let mut out = [0; PD_COUNT];
    let skip = rings_only_entry(&lock(pages));
    for (i, e) in out.iter_mut().enumerate() {
        if skip == Some(i) {
            continue;
        }
        let base = CODE_GPA + i as u64 * LARGE_PAGE;
        let leaf = match i {
            0 => PTE_PRESENT,
            _ => PTE_PRESENT | PTE_WRITABLE | xd,
        };
        let large = large_leaf(&lock(pages), i, leaf);
        if let Some(large) = large {
            *e = large;
            continue;
        }
        let mut table = [0u8; PAGE as usize];
        for (j, slot) in table.chunks_exact_mut(8).enumerate() {
            if let Some(r) = lock(pages).real(base + j as u64 * PAGE) {
                slot.copy_from_slice(&(r | leaf).to_le_bytes());
            }
        }
        space
            .memory()
            .write_slice(&table, GuestAddress(table_page(i)))
            .map_err(|e| MapError::Memory(e.to_string()))?;
        *e = real(Some(pages), table_page(i))? | TABLE;
    }
    Ok(out)
}

/// Entry `i` as one 2 MiB leaf (`leaf`'s bits) where its 2 MiB are all in
/// vmtrace's own memory (a QEMU device's BAR), 2 MiB-aligned there: no
/// page table to write, and one TLB entry for 512 pages. Code and tables
/// in the guest's free pages, or memory of its own that is not aligned,
/// keep 4 KiB entries.
fn large_leaf(pages: &RegionPages, i: usize, leaf: u64) -> Option<u64> {
    let base = CODE_GPA + i as u64 * LARGE_PAGE;
    let real = match (pages.own_region(), pages.own_data()) {
        (Some(region), _) => region + (base - REGION_GPA),
        (None, Some(data)) if base >= DATA_GPA => data + (base - DATA_GPA),
        _ => return None,
    };
    (real % LARGE_PAGE == 0).then_some(real | leaf | PTE_PS)
}

/// The entry of the data window that holds rings only (509: the frame
/// pool is in 510), left empty when the rings are past the window.
fn rings_only_entry(pages: &RegionPages) -> Option<usize> {
    pages.high().map(|_| 1)
}

/// The page directory of entry 508 (`HighRings`): a 2 MiB entry per 2 MiB
/// of rings, present, writable, supervisor-only, not global, and not
/// executable where the guest enabled NX; the rest empty.
pub fn high_directory(h: &HighRings) -> Vec<u8> {
    let xd = if h.nx { PTE_XD } else { 0 };
    let mut pd = vec![0u8; PAGE as usize];
    let n = h.len.div_ceil(LARGE_PAGE) as usize;
    for (i, slot) in pd.chunks_exact_mut(8).take(n).enumerate() {
        let leaf = (h.rings + i as u64 * LARGE_PAGE) | PTE_PRESENT | PTE_WRITABLE | PTE_PS | xd;
        slot.copy_from_slice(&leaf.to_le_bytes());
    }
    pd
}

/// The entry `map_with` wrote for entry `i` with the region in `pages`.
fn written(pages: &Mutex<RegionPages>, i: usize, nx: bool) -> Result<u64, MapError> {
    if rings_only_entry(&lock(pages)) == Some(i) {
        return Ok(0);
    }
    let leaf = match i {
        0 => PTE_PRESENT,
        _ => PTE_PRESENT | PTE_WRITABLE | if nx { PTE_XD } else { 0 },
    };
    // (The lock is let go before `real` takes it again.)
    let large = large_leaf(&lock(pages), i, leaf);
    match large {
        Some(large) => Ok(large),
        None => Ok(real(Some(pages), table_page(i))? | TABLE),
    }
}

/// Undo `map_with`: clear the entries that hold what vmtrace wrote (and
/// the top entry, if the page directory was vmtrace's own). The caller
/// holds every vCPU stopped and knows no context runs in the region.
pub fn unmap(
    space: &mut AddressSpace<'_>,
    pages: Option<&Mutex<RegionPages>>,
) -> Result<usize, MapError> {
    let walk = |va| move |source| MapError::Walk { va, source };
    let mut cleared = 0;
    if let Some(h) = pages.and_then(|p| lock(p).high()) {
        // The kernel's entry 508, and the UEFI page tables' copy.
        let roots = std::iter::once(space.root()).chain(h.efi.map(|e| e.root));
        for root in roots.collect::<Vec<_>>() {
            let e = space
                .with_root(root)
                .entry(HIGH_RINGS_VA, Level::Pdpt)
                .map_err(walk(HIGH_RINGS_VA))?;
            if !e.is_empty() && ours(e.value, high_entry_value(&h)) {
                match root == space.root() {
                    true => space.set_entry(&e, 0),
                    false => space.with_root(root).set_entry(&e, 0),
                }
                .map_err(walk(HIGH_RINGS_VA))?;
                cleared += 1;
            }
        }
    }
    let pdpte = space.entry(CODE_VA, Level::Pdpt).map_err(walk(CODE_VA))?;
    if pdpte.value & PTE_PRESENT == 0 || pdpte.value & PTE_PS != 0 {
        return Ok(cleared);
    }
    for i in 0..PD_COUNT {
        let va = CODE_VA + i as u64 * LARGE_PAGE;
        let e = space.entry(va, Level::Pd).map_err(walk(va))?;
        let want = match pages {
            None => leaves(space.nx_enabled())[i],
            Some(p) => written(p, i, space.nx_enabled())?,
        };
        if !e.is_empty() && ours(e.value, want) {
            space.set_entry(&e, 0).map_err(walk(va))?;
            cleared += 1;
        }
    }
    let own = real(pages, SPARE_PD_GPA).ok();
    if own.is_some_and(|pd| ours(pdpte.value, pd | TABLE)) {
        space.set_entry(&pdpte, 0).map_err(walk(CODE_VA))?;
    }
    Ok(cleared)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::exitless::layout::{DATA_VA, PD_FIRST, REGION_GPA, REGION_LEN};
    use vm_memory::Bytes;
    use vm_memory::GuestMemoryMmap;
    use vmm::gva::PagingMode;

    fn memory() -> GuestMemoryMmap {
        let mem = GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), 64 << 20),
            (GuestAddress(REGION_GPA), REGION_LEN as usize),
        ])
        .unwrap();
        vmm::boot::regs::setup_page_tables(&mem).unwrap();
        mem
    }

    /// A Linux-like layout: PDPT[511] -> a page directory (level2_fixmap_pgt)
    /// with the fixmap's two entries (506, 507) present.
    fn with_fixmap_pd(mem: &GuestMemoryMmap) -> u64 {
        let pd = 0x30_0000u64;
        mem.write_slice(&[0u8; 4096], GuestAddress(pd)).unwrap();
        for i in [506u64, 507] {
            mem.write_obj((0x40_0000 + i * 0x1000) | TABLE, GuestAddress(pd + i * 8))
                .unwrap();
        }
        mem.write_obj(
            pd | TABLE,
            GuestAddress(vmm::layout::PDPT_HIGH_START + 511 * 8),
        )
        .unwrap();
        pd
    }

    fn space(mem: &GuestMemoryMmap) -> AddressSpace<'_> {
        AddressSpace::new(mem, vmm::layout::PML4_START, PagingMode::Level4).with_nx(true)
    }

    #[test]
    fn maps_into_the_empty_fixmap_entries_and_reuses_them() {
        let mem = memory();
        let pd = with_fixmap_pd(&mem);
        let mut s = space(&mem);
        let m = map(&mut s).unwrap();
        assert_eq!(
            m,
            Mapped {
                own_pd: false,
                reused: false
            }
        );
        assert_eq!(s.translate(CODE_VA + 5).unwrap().gpa, CODE_GPA + 5);
        assert_eq!(
            s.translate(DATA_VA + LARGE_PAGE + 7).unwrap().gpa,
            DATA_GPA + LARGE_PAGE + 7
        );
        let code: u64 = mem
            .read_obj(GuestAddress(pd + PD_FIRST as u64 * 8))
            .unwrap();
        let data: u64 = mem
            .read_obj(GuestAddress(pd + (PD_FIRST as u64 + 1) * 8))
            .unwrap();
        assert_eq!(
            code & (PTE_WRITABLE | PTE_XD | 4 | 0x100),
            0,
            "code: RO, X, supervisor, not global"
        );
        assert_eq!(
            data & (PTE_WRITABLE | PTE_XD | 4 | 0x100),
            PTE_WRITABLE | PTE_XD
        );
        // The fixmap's own entries are untouched.
        let fix: u64 = mem.read_obj(GuestAddress(pd + 506 * 8)).unwrap();
        assert_eq!(fix, (0x40_0000 + 506 * 0x1000) | TABLE);
        // A second attach finds its own entries.
        assert_eq!(
            map(&mut space(&mem)).unwrap(),
            Mapped {
                own_pd: false,
                reused: true
            }
        );
    }

    #[test]
    fn a_guest_without_a_directory_there_gets_vmtraces_own() {
        let mem = memory();
        let m = map(&mut space(&mem)).unwrap();
        assert!(m.own_pd && !m.reused);
        assert_eq!(space(&mem).translate(CODE_VA).unwrap().gpa, CODE_GPA);
        assert_eq!(
            map(&mut space(&mem)).unwrap(),
            Mapped {
                own_pd: false,
                reused: true
            }
        );
    }

    #[test]
    fn an_entry_in_use_is_refused_and_nothing_is_written() {
        let mem = memory();
        let pd = with_fixmap_pd(&mem);
        let busy = pd + (PD_FIRST as u64 + 2) * 8;
        mem.write_obj(0x80_0000u64 | PTE_PRESENT | PTE_PS, GuestAddress(busy))
            .unwrap();
        let err = map(&mut space(&mem)).unwrap_err();
        assert!(
            matches!(err, MapError::SlotInUse { index: 510, .. }),
            "{err}"
        );
        assert_eq!(err.remedy(), Some(Remedy::TrapMode));
        assert!(err.to_string().ends_with("; trace in trap mode"), "{err}");
        let code: u64 = mem
            .read_obj(GuestAddress(pd + PD_FIRST as u64 * 8))
            .unwrap();
        assert_eq!(code, 0, "nothing written before the check");
    }

    #[test]
    fn tables_that_cannot_be_walked_are_a_clear_error() {
        let mem = memory();
        // CR3 outside guest RAM.
        let mut s = AddressSpace::new(&mem, 0x7000_0000_0000, PagingMode::Level4);
        let err = map(&mut s).unwrap_err();
        assert!(matches!(err, MapError::Walk { .. }), "{err}");
        // Without NXE, no XD bit: it would be reserved.
        let mut s = AddressSpace::new(&mem, vmm::layout::PML4_START, PagingMode::Level4);
        map(&mut s).unwrap();
        assert_eq!(s.translate(DATA_VA).unwrap().gpa, DATA_GPA);
        let pd: u64 = mem
            .read_obj::<u64>(GuestAddress(vmm::layout::PDPT_HIGH_START + 511 * 8))
            .unwrap()
            & !0xfff;
        let data: u64 = mem
            .read_obj(GuestAddress(pd + (PD_FIRST as u64 + 1) * 8))
            .unwrap();
        assert_eq!(data & PTE_XD, 0);
    }

    #[test]
    fn a_region_in_free_guest_pages_is_mapped_page_by_page_and_unmapped() {
        use crate::session::exitless::backing::Backed;
        use std::sync::Arc;
        let mem = memory();
        let pd = with_fixmap_pd(&mem);
        let free: Vec<u64> = (0x1000..0x20000).step_by(0x1000).collect();
        let pages = Arc::new(Mutex::new(RegionPages::new(free)));
        let ram = Backed::new(Arc::new(mem.clone()), Arc::clone(&pages));
        let ram: &dyn vmm::GuestRam = &ram;
        // What stage writes: code, the spare directory, a ring page.
        ram.write_slice(b"code", GuestAddress(CODE_GPA)).unwrap();
        ram.write_slice(&[0u8; 4096], GuestAddress(SPARE_PD_GPA))
            .unwrap();
        ram.write_slice(b"ring", GuestAddress(DATA_GPA + PAGE))
            .unwrap();
        let mut s =
            AddressSpace::new(ram, vmm::layout::PML4_START, PagingMode::Level4).with_nx(true);
        let m = map_with(&mut s, Some(&pages)).unwrap();
        assert_eq!(
            m,
            Mapped {
                own_pd: false,
                reused: false
            }
        );
        // Code at the fifth free page (after the tables), the second ring
        // page at the second highest.
        assert_eq!(s.translate(CODE_VA + 2).unwrap().gpa, 0x5002);
        assert_eq!(s.translate(DATA_VA + PAGE + 3).unwrap().gpa, 0x1e003);
        assert!(
            s.translate(DATA_VA).is_err(),
            "a page never written is not mapped"
        );
        let mut b = [0u8; 4];
        s.read(DATA_VA + PAGE, &mut b).unwrap();
        assert_eq!(&b, b"ring");
        assert!(map_with(&mut s, Some(&pages)).unwrap().reused);
        // Unmapped: the three entries cleared, the fixmap's kept.
        assert_eq!(unmap(&mut s, Some(&pages)).unwrap(), 3);
        let mut s = AddressSpace::new(ram, vmm::layout::PML4_START, PagingMode::Level4);
        assert!(s.translate(CODE_VA).is_err());
        for i in 0..PD_COUNT as u64 {
            let e: u64 = mem
                .read_obj(GuestAddress(pd + (PD_FIRST as u64 + i) * 8))
                .unwrap();
            assert_eq!(e, 0);
        }
        let fix: u64 = mem.read_obj(GuestAddress(pd + 506 * 8)).unwrap();
        assert_eq!(fix, (0x40_0000 + 506 * 0x1000) | TABLE);
        assert_eq!(unmap(&mut s, Some(&pages)).unwrap(), 0);
    }

    #[test]
    fn own_memory_2_mib_aligned_is_mapped_with_2_mib_entries() {
        use crate::session::exitless::backing::Backed;
        use std::sync::Arc;
        let mem = memory();
        let pd = with_fixmap_pd(&mem);
        let free: Vec<u64> = (0x1000..0x20000).step_by(0x1000).collect();
        // The data window in the region's own memory (a device's BAR).
        let own = DATA_GPA;
        let pages = Arc::new(Mutex::new(RegionPages::with_own_data(free, own)));
        let ram = Backed::new(Arc::new(mem.clone()), Arc::clone(&pages));
        let ram: &dyn vmm::GuestRam = &ram;
        ram.write_slice(b"code", GuestAddress(CODE_GPA)).unwrap();
        let mut s =
            AddressSpace::new(ram, vmm::layout::PML4_START, PagingMode::Level4).with_nx(true);
        map_with(&mut s, Some(&pages)).unwrap();
        for i in 1..PD_COUNT as u64 {
            let e: u64 = mem
                .read_obj(GuestAddress(pd + (PD_FIRST as u64 + i) * 8))
                .unwrap();
            let want = (own + (i - 1) * LARGE_PAGE) | PTE_PRESENT | PTE_WRITABLE | PTE_PS | PTE_XD;
            assert_eq!(e, want, "entry {i}");
        }
        // Every data page mapped, written or not; the code page by page.
        let last = DATA_VA + 2 * LARGE_PAGE - 1;
        assert_eq!(s.translate(last).unwrap().gpa, own + 2 * LARGE_PAGE - 1);
        assert_eq!(s.translate(CODE_VA + 2).unwrap().gpa, 0x5002);
        assert!(map_with(&mut s, Some(&pages)).unwrap().reused);
        assert_eq!(unmap(&mut s, Some(&pages)).unwrap(), 3);
        // Not 2 MiB-aligned: 4 KiB entries.
        let odd = RegionPages::with_own_data(vec![], own + PAGE);
        assert_eq!(large_leaf(&odd, 1, PTE_PRESENT), None);
        assert_eq!(large_leaf(&odd, 0, PTE_PRESENT), None);
    }

    /// A 16 MiB ring "device" at 32 MiB: the data window 2 MiB in, the
    /// rings' directory in the spare 2 MiB, the rings from 8 MiB; and the
    /// region's pages, with free ones below 128 KiB.
    fn ring_device(
        efi: Option<crate::kernel::high_rings::EfiTable>,
    ) -> (HighRings, std::sync::Arc<Mutex<RegionPages>>) {
        let free: Vec<u64> = (0x1000..0x20000).step_by(0x1000).collect();
        let dev = 32 << 20;
        let high = HighRings {
            pd: dev + (6 << 20) + 4 * PAGE,
            rings: dev + (8 << 20),
            len: 8 << 20,
            nx: true,
            efi,
        };
        let pages = RegionPages::with_own_data(free, dev + LARGE_PAGE).with_high(high);
        (high, std::sync::Arc::new(Mutex::new(pages)))
    }

    /// Copies the page at `from` to `to`, as efi_64.c copies the kernel's
    /// tables.
    fn copy_page(mem: &GuestMemoryMmap, from: u64, to: u64) {
        let mut page = [0u8; 4096];
        mem.read_slice(&mut page, GuestAddress(from)).unwrap();
        mem.write_slice(&page, GuestAddress(to)).unwrap();
    }

    /// Rings past the data window (a ring device sized by `--buffer`):
    /// entry 508 of the top page-upper directory points at their page
    /// directory, whose 2 MiB entries map them; the data window's
    /// rings-only entry stays empty; all cleared again.
    #[test]
    fn high_rings_are_mapped_through_entry_508_and_unmapped() {
        use crate::session::exitless::backing::Backed;
        use std::sync::Arc;
        let mem = memory();
        let pd = with_fixmap_pd(&mem);
        let (high, pages) = ring_device(None);
        let ram = Backed::new(Arc::new(mem.clone()), Arc::clone(&pages));
        let ram: &dyn vmm::GuestRam = &ram;
        ram.write_slice(b"code", GuestAddress(CODE_GPA)).unwrap();
        ram.write_slice(&high_directory(&high), GuestAddress(high.pd))
            .unwrap();
        let pud = vmm::layout::PDPT_HIGH_START + HIGH_RINGS_PUD as u64 * 8;
        assert_eq!(mem.read_obj::<u64>(GuestAddress(pud)).unwrap(), 0);
        let mut s =
            AddressSpace::new(ram, vmm::layout::PML4_START, PagingMode::Level4).with_nx(true);
        map_with(&mut s, Some(&pages)).unwrap();
        assert_eq!(
            mem.read_obj::<u64>(GuestAddress(pud)).unwrap(),
            high.pd | TABLE
        );
        let at = HIGH_RINGS_VA + (5 << 20) + 9;
        assert_eq!(s.translate(at).unwrap().gpa, high.rings + (5 << 20) + 9);
        assert!(s.translate(HIGH_RINGS_VA + high.len).is_err());
        let e = |i: u64| mem.read_obj::<u64>(GuestAddress(pd + (PD_FIRST as u64 + i) * 8));
        assert_eq!(e(1).unwrap(), 0, "the rings-only entry 509");
        assert_ne!(e(2).unwrap(), 0, "the frame pool's 510");
        assert!(map_with(&mut s, Some(&pages)).unwrap().reused);
        // Entry 508 held by someone else: refused, nothing written.
        mem.write_obj(0x7000u64 | TABLE, GuestAddress(pud)).unwrap();
        assert!(matches!(
            map_with(&mut s, Some(&pages)),
            Err(MapError::SlotInUse { index: 508, .. })
        ));
        mem.write_obj(high.pd | TABLE, GuestAddress(pud)).unwrap();
        assert_eq!(unmap(&mut s, Some(&pages)).unwrap(), 3);
        assert_eq!(mem.read_obj::<u64>(GuestAddress(pud)).unwrap(), 0);
        assert!((0..PD_COUNT as u64).all(|i| e(i).unwrap() == 0));
    }

    /// A guest booted by UEFI: its runtime services' top page-upper
    /// directory is a copy of the kernel's (efi_64.c), so entry 508 is
    /// written in both and cleared in both; one held in the copy refuses.
    #[test]
    fn high_rings_are_mapped_in_the_efi_tables_too() {
        use crate::kernel::high_rings::EfiTable;
        use crate::session::exitless::backing::Backed;
        use std::sync::Arc;
        let mem = memory();
        with_fixmap_pd(&mem);
        // EFI's root and its own copy of the top PUD, as efi_64.c makes them.
        let (efi_root, efi_pud) = (0x50_0000u64, 0x50_1000u64);
        copy_page(&mem, vmm::layout::PML4_START, efi_root);
        copy_page(&mem, vmm::layout::PDPT_HIGH_START, efi_pud);
        mem.write_obj(efi_pud | TABLE, GuestAddress(efi_root + 511 * 8))
            .unwrap();
        let (high, pages) = ring_device(Some(EfiTable { root: efi_root }));
        let ram = Backed::new(Arc::new(mem.clone()), Arc::clone(&pages));
        let ram: &dyn vmm::GuestRam = &ram;
        ram.write_slice(&high_directory(&high), GuestAddress(high.pd))
            .unwrap();
        let kernel = vmm::layout::PDPT_HIGH_START + HIGH_RINGS_PUD as u64 * 8;
        let efi = efi_pud + HIGH_RINGS_PUD as u64 * 8;
        let at = |gpa| mem.read_obj::<u64>(GuestAddress(gpa)).unwrap();
        let mut s =
            AddressSpace::new(ram, vmm::layout::PML4_START, PagingMode::Level4).with_nx(true);
        // Held in EFI's copy: refused, the kernel's left empty.
        mem.write_obj(0x7000u64 | TABLE, GuestAddress(efi)).unwrap();
        assert!(matches!(
            map_with(&mut s, Some(&pages)),
            Err(MapError::SlotInUse { index: 508, .. })
        ));
        assert_eq!(at(kernel), 0);
        mem.write_obj(0u64, GuestAddress(efi)).unwrap();
        map_with(&mut s, Some(&pages)).unwrap();
        assert_eq!((at(kernel), at(efi)), (high.pd | TABLE, high.pd | TABLE));
        let mut e = s.with_root(efi_root);
        let ring = HIGH_RINGS_VA + (3 << 20);
        assert_eq!(e.gpa(ring).unwrap(), high.rings + (3 << 20));
        assert_eq!(unmap(&mut s, Some(&pages)).unwrap(), 4);
        assert_eq!((at(kernel), at(efi)), (0, 0));
    }

    /// 5-level paging (CR4.LA57): the kernel's top table is a PML5 whose
    /// entry 511 leads to its P4D (`level4_kernel_pgt`), whose entry 511
    /// leads to the same page-upper directory as with 4 levels; a guest
    /// booted by UEFI has a PML5 of its own for the runtime services with a
    /// P4D of its own below entry 511 (efi_64.c, `efi_alloc_page_tables`),
    /// whose entry 511 leads to EFI's own copy of that directory. The same
    /// walk reaches the kernel's directories and EFI's copy: the region's
    /// entries go into the kernel's fixmap directory, and entry 508 into
    /// both page-upper directories, through the two P4Ds; all cleared.
    #[test]
    fn five_level_tables_get_the_region_and_entry_508_in_both_tables() {
        use crate::kernel::high_rings::EfiTable;
        use crate::session::exitless::backing::Backed;
        use std::sync::Arc;
        let mem = memory();
        let pd = with_fixmap_pd(&mem);
        // The boot PML4 serves as the kernel's P4D under a PML5 of its own.
        let pml5 = 0x51_0000u64;
        let (efi_pml5, efi_p4d, efi_pud) = (0x50_0000u64, 0x50_2000u64, 0x50_1000u64);
        copy_page(&mem, vmm::layout::PML4_START, efi_p4d);
        copy_page(&mem, vmm::layout::PDPT_HIGH_START, efi_pud);
        for (table, entry) in [
            (pml5, vmm::layout::PML4_START),
            (efi_pml5, efi_p4d),
            (efi_p4d, efi_pud),
        ] {
            mem.write_obj(entry | TABLE, GuestAddress(table + 511 * 8))
                .unwrap();
        }
        let (high, pages) = ring_device(Some(EfiTable { root: efi_pml5 }));
        let ram = Backed::new(Arc::new(mem.clone()), Arc::clone(&pages));
        let ram: &dyn vmm::GuestRam = &ram;
        ram.write_slice(b"code", GuestAddress(CODE_GPA)).unwrap();
        ram.write_slice(&high_directory(&high), GuestAddress(high.pd))
            .unwrap();
        let kernel = vmm::layout::PDPT_HIGH_START + HIGH_RINGS_PUD as u64 * 8;
        let efi = efi_pud + HIGH_RINGS_PUD as u64 * 8;
        let at = |gpa| mem.read_obj::<u64>(GuestAddress(gpa)).unwrap();
        let mut s = AddressSpace::new(ram, pml5, PagingMode::Level5).with_nx(true);
        map_with(&mut s, Some(&pages)).unwrap();
        assert_eq!((at(kernel), at(efi)), (high.pd | TABLE, high.pd | TABLE));
        assert_ne!(at(pd + PD_FIRST as u64 * 8), 0, "the code's entry");
        let mut b = [0u8; 4];
        s.read(CODE_VA, &mut b).unwrap();
        assert_eq!(&b, b"code");
        let ring = HIGH_RINGS_VA + (3 << 20);
        for root in [pml5, efi_pml5] {
            let mut t = s.with_root(root);
            assert_eq!(t.gpa(ring).unwrap(), high.rings + (3 << 20), "{root:#x}");
        }
        // Read as 4-level, the PML5 does not map the rings.
        let flat = AddressSpace::new(ram, pml5, PagingMode::Level4);
        assert!(flat.translate(ring).is_err());
        assert!(map_with(&mut s, Some(&pages)).unwrap().reused);
        assert_eq!(unmap(&mut s, Some(&pages)).unwrap(), 4);
        assert_eq!((at(kernel), at(efi)), (0, 0));
        assert!((0..PD_COUNT as u64).all(|i| at(pd + (PD_FIRST as u64 + i) * 8) == 0));
    }
}
