//! One guest address space: a root table and a paging mode over guest
//! memory, with a small translation cache (4 KiB pieces, and huge pages
//! whole). The one way vmtrace reaches guest memory by virtual address
//! (trap path, patcher, readiness check, benches).
//!
//! Like a hardware TLB the cache is not coherent with the guest's page
//! tables, so an `AddressSpace` lives only as long as they cannot change:
//! for one trap (built from that exit's registers), or for one pause.

use std::sync::atomic::Ordering;

use kvm_bindings::kvm_sregs;
use vm_memory::GuestAddress;

use crate::ram::GuestRam;

use super::{
    read_entry, translate, GvaError, Level, PagingMode, Translation, ENTRY_SIZE, PAGE_OFFSET_MASK,
    PAGE_SHIFT, PAGE_SIZE_4K, PHYS_ADDR_MASK, PTE_PS,
};

/// CR0.PG: paging enabled.
const CR0_PG: u64 = 1 << 31;
/// EFER.NXE: the XD bit (63) of page-table entries is honoured; without it
/// that bit is reserved.
const EFER_NXE: u64 = 1 << 11;
/// Direct-mapped cache slots; a power of two so the slot is a mask.
const CACHE_SLOTS: usize = 16;
/// Huge pages (2 MiB, 1 GiB) remembered whole: a trap's reads (the per-CPU
/// current task, its `task_struct`, the stack) often fall in one or two of
/// a kernel's huge pages, each of which would otherwise cost a walk per
/// 4 KiB piece.
const HUGE_SLOTS: usize = 2;

/// One cached 4 KiB translation: virtual page number to the guest-physical
/// base of that 4 KiB piece (of a huge page: the piece holding it).
#[derive(Clone, Copy, Debug)]
struct Cached {
    vpn: u64,
    page_gpa: u64,
}

/// One cached huge-page translation: the page's virtual and guest-physical
/// bases, and its size.
#[derive(Clone, Copy, Debug)]
struct Huge {
    va: u64,
    gpa: u64,
    size: u64,
}

/// Guest memory as one address space sees it.
#[derive(Debug)]
pub struct AddressSpace<'m> {
    mem: &'m dyn GuestRam,
    /// CR3 as loaded (bits 11:0 PCID or PWT/PCD, bit 63 no-flush: masked off
    /// by the walk).
    root: u64,
    mode: PagingMode,
    /// EFER.NXE was set in the vCPU this space came from.
    nx: bool,
    cache: [Option<Cached>; CACHE_SLOTS],
    huge: [Option<Huge>; HUGE_SLOTS],
    /// The huge slot the next huge page replaces (round robin).
    next_huge: usize,
}

impl<'m> AddressSpace<'m> {
    pub fn new(mem: &'m dyn GuestRam, root: u64, mode: PagingMode) -> Self {
        AddressSpace {
            mem,
            root,
            mode,
            nx: false,
            cache: [None; CACHE_SLOTS],
            huge: [None; HUGE_SLOTS],
            next_huge: 0,
        }
    }

    /// The same space, with EFER.NXE as given (the guest honours XD).
    pub fn with_nx(mut self, nx: bool) -> Self {
        self.nx = nx;
        self
    }

    /// May entries carry XD (bit 63)? Only when the guest set EFER.NXE.
    pub fn nx_enabled(&self) -> bool {
        self.nx
    }

    /// The address space a vCPU with these system registers uses; None
    /// while it runs with paging off.
    pub fn of_vcpu(mem: &'m dyn GuestRam, sregs: &kvm_sregs) -> Option<Self> {
        (sregs.cr0 & CR0_PG != 0).then(|| {
            Self::new(mem, sregs.cr3, PagingMode::from_cr4(sregs.cr4))
                .with_nx(sregs.efer & EFER_NXE != 0)
        })
    }

    /// The same tables rooted elsewhere (e.g. the kernel half of a
    /// page-table-isolation pair), with an empty cache.
    pub fn with_root(&self, root: u64) -> Self {
        Self::new(self.mem, root, self.mode).with_nx(self.nx)
    }

    pub fn root(&self) -> u64 {
        self.root
    }

    pub fn mode(&self) -> PagingMode {
        self.mode
    }

    pub fn memory(&self) -> &'m dyn GuestRam {
        self.mem
    }

    /// Forget every cached translation (after the guest's tables may have
    /// changed).
    pub fn flush(&mut self) {
        self.cache = [None; CACHE_SLOTS];
        self.huge = [None; HUGE_SLOTS];
    }

    /// Walks the tables for `gva` (uncached; see `gpa` for the cached form).
    pub fn translate(&self, gva: u64) -> Result<Translation, GvaError> {
        translate(self.mem, self.root, self.mode, gva)
    }

    /// Guest-physical address of the byte at `gva`, through the cache.
    pub fn gpa(&mut self, gva: u64) -> Result<u64, GvaError> {
        let vpn = gva >> PAGE_SHIFT;
        let slot = vpn as usize % CACHE_SLOTS;
        if let Some(c) = self.cache[slot].filter(|c| c.vpn == vpn) {
            return Ok(c.page_gpa | (gva & PAGE_OFFSET_MASK));
        }
        let mut huge = self.huge.iter().flatten();
        if let Some(h) = huge.find(|h| gva.wrapping_sub(h.va) < h.size) {
            return Ok(h.gpa + (gva - h.va));
        }
        let t = self.translate(gva)?;
        if t.page_size > PAGE_SIZE_4K {
            let off = gva & (t.page_size - 1);
            self.huge[self.next_huge] = Some(Huge {
                va: gva - off,
                gpa: t.gpa - off,
                size: t.page_size,
            });
            self.next_huge = (self.next_huge + 1) % HUGE_SLOTS;
        } else {
            self.cache[slot] = Some(Cached {
                vpn,
                page_gpa: t.gpa & !PAGE_OFFSET_MASK,
            });
        }
        Ok(t.gpa)
    }

    /// Where the `len` bytes at `gva` live, page by page.
    pub fn span(&mut self, gva: u64, len: usize) -> Result<PhysSpan, GvaError> {
        let mut span = PhysSpan::default();
        let mut done = 0;
        while done < len {
            let at = gva.wrapping_add(done as u64);
            let gpa = self.gpa(at)?;
            let left_in_page = (PAGE_SIZE_4K - (at & PAGE_OFFSET_MASK)) as usize;
            let n = (len - done).min(left_in_page);
            if !self.mem.contains(GuestAddress(gpa), n) {
                return Err(GvaError::PageOutsideRam { gva: at, gpa });
            }
            span.segments.push((gpa, n));
            done += n;
        }
        Ok(span)
    }

    /// Reads `buf.len()` bytes at `gva`, across pages.
    pub fn read(&mut self, gva: u64, buf: &mut [u8]) -> Result<(), GvaError> {
        // Within one 4 KiB page (the trap path's reads): no span to build,
        // so no allocation per read.
        if !buf.is_empty() && (gva & PAGE_OFFSET_MASK) + buf.len() as u64 <= PAGE_SIZE_4K {
            let gpa = self.gpa(gva)?;
            return self
                .mem
                .read_slice(buf, GuestAddress(gpa))
                .map_err(|_| GvaError::PageOutsideRam { gva, gpa });
        }
        self.span(gva, buf.len())?.read(self.mem, buf)
    }

    /// Reads `N` bytes at `gva`.
    pub fn read_array<const N: usize>(&mut self, gva: u64) -> Result<[u8; N], GvaError> {
        let mut b = [0u8; N];
        self.read(gva, &mut b)?;
        Ok(b)
    }

    /// Reads a little-endian u64 at `gva` (e.g. a return address at RSP).
    pub fn read_u64(&mut self, gva: u64) -> Result<u64, GvaError> {
        // Aligned (a return address, a pointer): one word load, which
        // never crosses a page.
        if gva.is_multiple_of(8) {
            let gpa = self.gpa(gva)?;
            return self
                .mem
                .load_u64(GuestAddress(gpa), Ordering::Relaxed)
                .map_err(|_| GvaError::PageOutsideRam { gva, gpa });
        }
        self.read_array::<8>(gva).map(u64::from_le_bytes)
    }

    /// Writes `data` at `gva`: every page is translated and checked against
    /// RAM first, so an error never leaves a partial write.
    pub fn write(&mut self, gva: u64, data: &[u8]) -> Result<(), GvaError> {
        self.span(gva, data.len())?.write(self.mem, data)
    }

    /// The `level` entry on the walk for `gva`, present or not: the tables
    /// above it must be present and not huge pages. For mapping memory of
    /// vmtrace's own into the guest.
    pub fn entry(&self, gva: u64, level: Level) -> Result<Entry, GvaError> {
        if !self.mode.is_canonical(gva) {
            return Err(GvaError::NonCanonical {
                gva,
                mode: self.mode,
            });
        }
        let levels = || self.mode.upper_levels().iter().chain(&[Level::Pt]);
        if !levels().any(|&l| l == level) {
            return Err(GvaError::LevelNotUsed {
                level,
                mode: self.mode,
            });
        }
        let mut table = self.root & PHYS_ADDR_MASK;
        for &l in levels() {
            let gpa = l.entry_gpa(table, gva);
            if l == level {
                let value = self.read_phys_u64(gpa, gva, l)?;
                return Ok(Entry { gpa, value, level });
            }
            let e = read_entry(self.mem, table, l, gva)?;
            if e & PTE_PS != 0 {
                return Err(GvaError::HugePageAbove { gva, level: l });
            }
            table = e & PHYS_ADDR_MASK;
        }
        unreachable!("{level} is one of the levels walked")
    }

    /// Replace a page-table entry read with `entry`, if it still holds what
    /// was read (else `EntryChanged`, nothing written). Drops the cache.
    /// The caller holds every vCPU parked.
    pub fn set_entry(&mut self, entry: &Entry, value: u64) -> Result<(), GvaError> {
        let now = self.read_phys_u64(entry.gpa, 0, entry.level)?;
        if now != entry.value {
            return Err(GvaError::EntryChanged {
                level: entry.level,
                gpa: entry.gpa,
                expected: entry.value,
                found: now,
            });
        }
        self.mem
            .write_obj(value.to_le(), GuestAddress(entry.gpa))
            .map_err(|_| GvaError::TableOutsideRam {
                gva: 0,
                level: entry.level,
                table_gpa: entry.gpa,
            })?;
        self.flush();
        Ok(())
    }

    fn read_phys_u64(&self, gpa: u64, gva: u64, level: Level) -> Result<u64, GvaError> {
        let mut raw = [0u8; ENTRY_SIZE as usize];
        self.mem
            .read_slice(&mut raw, GuestAddress(gpa))
            .map_err(|_| GvaError::TableOutsideRam {
                gva,
                level,
                table_gpa: gpa & !PAGE_OFFSET_MASK,
            })?;
        Ok(u64::from_le_bytes(raw))
    }
}

/// One page-table entry as read: where it is and what it held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub gpa: u64,
    pub value: u64,
    pub level: Level,
}

impl Entry {
    /// Nothing mapped here, nor anything the guest keeps in a non-present
    /// entry (swap or migration entries use the other bits).
    pub fn is_empty(&self) -> bool {
        self.value == 0
    }
}

/// Bytes pinned to guest-physical addresses (at most one segment per page):
/// read and written with no walk, so they stay reachable after the vCPUs
/// that translated them have stopped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PhysSpan {
    /// (guest-physical address, length), in virtual order.
    segments: Vec<(u64, usize)>,
}

impl PhysSpan {
    /// Guest-physical address of the first byte.
    pub fn start(&self) -> u64 {
        self.segments.first().map_or(0, |s| s.0)
    }

    pub fn len(&self) -> usize {
        self.segments.iter().map(|s| s.1).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Fills `buf` (exactly `len()` bytes) from guest memory.
    pub fn read(&self, mem: &dyn GuestRam, buf: &mut [u8]) -> Result<(), GvaError> {
        self.each(buf.len(), |gpa, at, n| {
            mem.read_slice(&mut buf[at..at + n], GuestAddress(gpa))
        })
    }

    /// Writes `data` (exactly `len()` bytes); every segment was checked
    /// against RAM when the span was made.
    pub fn write(&self, mem: &dyn GuestRam, data: &[u8]) -> Result<(), GvaError> {
        self.each(data.len(), |gpa, at, n| {
            mem.write_slice(&data[at..at + n], GuestAddress(gpa))
        })
    }

    fn each<E>(
        &self,
        len: usize,
        mut f: impl FnMut(u64, usize, usize) -> Result<(), E>,
    ) -> Result<(), GvaError> {
        assert_eq!(len, self.len(), "buffer and span differ in length");
        let mut at = 0;
        for &(gpa, n) in &self.segments {
            f(gpa, at, n).map_err(|_| GvaError::PageOutsideRam { gva: 0, gpa })?;
            at += n;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use vm_memory::{Bytes, GuestMemoryMmap};

    use super::*;
    use crate::layout::{PD_START, PML4_START};

    /// The boot page tables: the kernel map's 2 MiB pages over RAM.
    fn guest() -> GuestMemoryMmap {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 64 << 20)]).unwrap();
        crate::boot::regs::setup_page_tables(&mem).unwrap();
        mem
    }

    const KERNEL_MAP: u64 = 0xffff_ffff_8000_0000;

    /// Point the kernel map's 2 MiB page `page` (physical 2 MiB * `page`)
    /// at physical `to`.
    fn remap(mem: &GuestMemoryMmap, page: u64, to: u64) {
        let pde = GuestAddress(PD_START + page * 8);
        let flags = mem.read_obj::<u64>(pde).unwrap() & 0xfff;
        mem.write_obj(to | flags, pde).unwrap();
    }

    #[test]
    fn a_huge_page_is_cached_whole_for_the_view_and_dropped_by_flush() {
        let mem = guest();
        // Two 4 KiB pieces of the 2 MiB page at physical 20 MiB, and the
        // same offsets in the page at 32 MiB.
        let (old, new) = (0x140_0000u64, 0x200_0000u64);
        for (base, v) in [(old, 0xaaaa_u64), (new, 0xbbbb)] {
            mem.write_obj(v, GuestAddress(base + 0x10)).unwrap();
            mem.write_obj(v + 1, GuestAddress(base + 0x5_0010)).unwrap();
        }
        let mut view = AddressSpace::new(&mem, PML4_START, PagingMode::Level4);
        assert_eq!(view.read_u64(KERNEL_MAP + old + 0x10).unwrap(), 0xaaaa);
        remap(&mem, old >> 21, new);
        // Another 4 KiB piece of the same huge page: translated by the
        // view's cache (as a TLB would), not by a new walk.
        assert_eq!(view.read_u64(KERNEL_MAP + old + 0x5_0010).unwrap(), 0xaaab);
        view.flush();
        assert_eq!(view.read_u64(KERNEL_MAP + old + 0x10).unwrap(), 0xbbbb);
        // A trap's fresh view walks the tables as they are now.
        remap(&mem, old >> 21, old);
        let mut fresh = AddressSpace::new(&mem, PML4_START, PagingMode::Level4);
        assert_eq!(fresh.read_u64(KERNEL_MAP + old + 0x5_0010).unwrap(), 0xaaab);
    }

    #[test]
    fn reads_within_and_across_pages_and_outside_ram() {
        let mem = guest();
        let at = 0x30_0ffcu64;
        mem.write_slice(&[1, 2, 3, 4, 5, 6, 7, 8], GuestAddress(at))
            .unwrap();
        let mut view = AddressSpace::new(&mem, PML4_START, PagingMode::Level4);
        // Across a 4 KiB boundary (a span), and within one page.
        assert_eq!(
            view.read_array::<8>(KERNEL_MAP + at).unwrap(),
            [1, 2, 3, 4, 5, 6, 7, 8]
        );
        assert_eq!(view.read_array::<4>(KERNEL_MAP + at).unwrap(), [1, 2, 3, 4]);
        assert_eq!(view.read_array::<0>(KERNEL_MAP + at).unwrap(), []);
        // Mapped by the tables, past the end of RAM: an error naming it.
        let past = 0x3ff_fff8u64 + 0x10_0000;
        assert!(matches!(
            view.read_u64(KERNEL_MAP + past),
            Err(GvaError::PageOutsideRam { .. })
        ));
    }
}
