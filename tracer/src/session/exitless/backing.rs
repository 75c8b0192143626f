//! vmtrace's region in pages of guest RAM that the guest never uses, for a
//! VMM that cannot give vmtrace memory of its own (a running QEMU).
//!
//! The tracer addresses the region as always (`REGION_GPA..+REGION_LEN` is
//! then a name, not memory): each 4 KiB page of it gets one of the free
//! pages at its first write, in the order of the writes (the same plan
//! gives the same pages), and `map` maps the backed pages one by one with
//! 4 KiB entries instead of three 2 MiB ones. Reads of a page never written
//! see zeros, as in vmtrace's own slot. What each page held before is kept
//! and written back when the region is taken out: the guest's memory is
//! left byte for byte as it was found.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use vm_memory::GuestAddress;

use crate::kernel::high_rings::EfiTable;
use vmm::{GuestRam, RamError};

pub use crate::plan::exitless::layout::PAGE;
use crate::plan::exitless::layout::{
    CODE_GPA, CODE_SLOTS, DATA_GPA, DIRECT_STUB_PAGES, FRAME_NEXT_OFF, REGION_GPA, REGION_LEN,
    RETURN_TRAP_OFF, SPARE_PD_GPA, STUB_PAGES, TABLE_SLOTS,
};

/// Which free page backs which page of the region.
///
/// The free page a region page gets depends on that page alone (`slot`),
/// never on what else a session maps: after a detach the guest's TLBs may
/// still translate vmtrace's addresses to the pages of that session (the
/// entries are gone, nothing flushed them), and a later session reaching
/// one of those addresses must find the same page behind it. Tables and
/// code from the lowest free page up, the function graph's parts at fixed
/// places after the first `CODE_SLOTS` code pages, the rings from the
/// highest down; two region pages of one session on one free page is an
/// error (too little room).
#[derive(Debug, Default)]
pub struct RegionPages {
    /// The free guest-physical pages, lowest first.
    free: Vec<u64>,
    /// Region page -> the guest-physical page behind it.
    backed: BTreeMap<u64, u64>,
    /// Slots given out, and to which region page.
    taken: BTreeMap<usize, u64>,
    /// Each backing page's bytes before vmtrace's first write to it.
    original: BTreeMap<u64, Vec<u8>>,
    /// Guest-physical memory of vmtrace's own behind the whole data window
    /// (a QEMU device's BAR: `crate::qemu::ivshmem`), if any: the data
    /// pages map onto it one to one, nothing of the guest's is kept.
    own_data: Option<u64>,
    /// Guest-physical memory of vmtrace's own behind the whole region, if
    /// any (no guest page is known unused): every page maps onto it one
    /// to one, the data window `own_data` inside it.
    own_region: Option<u64>,
    /// Rings of their own past the data window, if any (`HighRings`).
    high: Option<HighRings>,
}

/// Rings in vmtrace's own memory mapped at `HIGH_RINGS_VA`
/// (`crate::plan::exitless::layout::RingLayout::high`): the page directory
/// vmtrace fills for page-upper-directory entry 508, and the rings its
/// 2 MiB entries map, both in that memory (a ring device's BAR).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HighRings {
    /// Guest-physical address of the page directory (a 4 KiB page).
    pub pd: u64,
    /// Guest-physical address of the rings (2 MiB-aligned), and their bytes.
    pub rings: u64,
    pub len: u64,
    /// The guest enabled NX: the rings' entries are not executable.
    pub nx: bool,
    /// The UEFI runtime services' page tables, whose entry 508 is set and
    /// cleared with the kernel's (`crate::kernel::high_rings`).
    pub efi: Option<EfiTable>,
}

/// Where region page `page` goes among the free pages, of `n` (None: past
/// them).
fn slot(page: u64, n: usize) -> Option<usize> {
    let in_pages = |base: u64| ((page - base) / PAGE) as usize;
    let top = |i: usize| n.checked_sub(1 + i);
    if page >= SPARE_PD_GPA {
        return Some(in_pages(SPARE_PD_GPA)).filter(|&i| i < TABLE_SLOTS);
    }
    if page >= DATA_GPA {
        let d = in_pages(DATA_GPA);
        let pool = (FRAME_NEXT_OFF / PAGE) as usize;
        return match d >= pool {
            true => Some(TABLE_SLOTS + CODE_SLOTS + STUB_PAGES + d - pool),
            false => top(d),
        };
    }
    let c = in_pages(CODE_GPA);
    let trap = (RETURN_TRAP_OFF / PAGE) as usize;
    // The function graph's code slots: its return stubs, then the return
    // trap's page, the last (direct entries' stubs share that page).
    let graph = TABLE_SLOTS + CODE_SLOTS;
    match c.cmp(&trap) {
        std::cmp::Ordering::Greater => Some(graph + c - trap - 1),
        std::cmp::Ordering::Equal => Some(graph + STUB_PAGES - 1),
        // Direct entries' stubs below the return trap's page: the return
        // stubs' slots, from the last down (`DIRECT_STUB_PAGES`).
        std::cmp::Ordering::Less if c + DIRECT_STUB_PAGES >= trap => {
            Some(graph + STUB_PAGES - 1 - (trap - c))
        }
        std::cmp::Ordering::Less => Some(TABLE_SLOTS + c),
    }
}

impl RegionPages {
    /// `free`: guest-physical page addresses the guest never uses.
    pub fn new(mut free: Vec<u64>) -> RegionPages {
        free.sort_unstable();
        free.dedup();
        RegionPages {
            free,
            ..RegionPages::default()
        }
    }

    /// `new`, with the data window (`DATA_GPA..+DATA_LEN`: the rings and
    /// the function graph's frames) in vmtrace's own memory at `gpa`.
    pub fn with_own_data(free: Vec<u64>, gpa: u64) -> RegionPages {
        RegionPages {
            own_data: Some(gpa),
            ..RegionPages::new(free)
        }
    }

    /// The whole region (code, tables, data window) in vmtrace's own
    /// memory at `gpa`, `REGION_LEN` bytes: no guest page used.
    pub fn with_own_region(gpa: u64) -> RegionPages {
        RegionPages {
            own_data: Some(gpa + (DATA_GPA - REGION_GPA)),
            own_region: Some(gpa),
            ..RegionPages::default()
        }
    }

    /// The same, with rings of their own past the data window (`high`).
    pub fn with_high(self, high: HighRings) -> RegionPages {
        RegionPages {
            high: Some(high),
            ..self
        }
    }

    /// The rings of their own past the data window, if any.
    pub fn high(&self) -> Option<HighRings> {
        self.high
    }

    /// The page behind region page `page`, if it has one.
    pub fn real(&self, page: u64) -> Option<u64> {
        self.backed.get(&page).copied()
    }

    /// The page behind `page`, given one now (its bytes kept, read through
    /// `ram`) if it has none.
    fn back(&mut self, page: u64, ram: &dyn GuestRam) -> Result<u64, RamError> {
        if let Some(&real) = self.backed.get(&page) {
            return Ok(real);
        }
        if let Some(base) = self.own_region {
            let real = base + (page - REGION_GPA);
            self.backed.insert(page, real);
            return Ok(real);
        }
        if let Some(base) = self
            .own_data
            .filter(|_| (DATA_GPA..SPARE_PD_GPA).contains(&page))
        {
            let real = base + (page - DATA_GPA);
            self.backed.insert(page, real);
            return Ok(real);
        }
        let full = || {
            RamError::new(
                page,
                PAGE as usize,
                format!(
                    "vmtrace's code and rings need more than the {} KiB of guest memory the guest \
                     leaves unused",
                    self.free.len() as u64 * PAGE / 1024
                ),
            )
        };
        let at = slot(page, self.free.len())
            .filter(|&i| i < self.free.len() && !self.taken.contains_key(&i))
            .ok_or_else(full)?;
        let real = self.free[at];
        let mut was = vec![0u8; PAGE as usize];
        ram.read_slice(&mut was, GuestAddress(real))?;
        self.original.insert(real, was);
        self.backed.insert(page, real);
        self.taken.insert(at, page);
        Ok(real)
    }

    /// Every (region page, real page) pair, in region order.
    pub fn pages(&self) -> Vec<(u64, u64)> {
        self.backed.iter().map(|(&p, &r)| (p, r)).collect()
    }

    /// Every backing page and what it held before vmtrace wrote to it.
    pub fn originals(&self) -> Vec<(u64, Vec<u8>)> {
        self.original.iter().map(|(&r, b)| (r, b.clone())).collect()
    }

    /// Where vmtrace's own memory for the data window is, if it has some.
    pub fn own_data(&self) -> Option<u64> {
        self.own_data
    }

    /// Where vmtrace's own memory for the whole region is, if it has some.
    pub fn own_region(&self) -> Option<u64> {
        self.own_region
    }

    /// Free pages given out so far, and in all.
    pub fn used(&self) -> (usize, usize) {
        (self.taken.len(), self.free.len())
    }
}

/// Guest RAM with vmtrace's region behind `pages`.
pub struct Backed {
    inner: Arc<dyn GuestRam>,
    pages: Arc<Mutex<RegionPages>>,
    /// vmtrace's own mapping of its own memory (`RegionPages::with_own_data`)
    /// at the guest-physical addresses the guest sees it at: the rings are
    /// read and written there, a memory access, not through `inner`.
    own: Option<Arc<dyn GuestRam>>,
}

fn in_region(gpa: u64) -> bool {
    (REGION_GPA..REGION_GPA + REGION_LEN).contains(&gpa)
}

impl Backed {
    pub fn new(inner: Arc<dyn GuestRam>, pages: Arc<Mutex<RegionPages>>) -> Backed {
        Backed {
            inner,
            pages,
            own: None,
        }
    }

    /// `new`, with `own` holding the memory `pages`' data window is in.
    pub fn with_own(
        inner: Arc<dyn GuestRam>,
        pages: Arc<Mutex<RegionPages>>,
        own: Arc<dyn GuestRam>,
    ) -> Backed {
        Backed {
            own: Some(own),
            ..Backed::new(inner, pages)
        }
    }

    /// Where guest-physical `real` (`len` bytes) is read and written.
    fn mem(&self, real: u64, len: usize) -> &dyn GuestRam {
        match &self.own {
            Some(own) if own.contains(GuestAddress(real), len) => &**own,
            _ => &*self.inner,
        }
    }

    fn pages(&self) -> MutexGuard<'_, RegionPages> {
        self.pages.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Each piece of `len` bytes at `gpa` that lies in one page: its offset
    /// in the access, its length, and where it really is (None: a region
    /// page with no backing, read as zeros). Region pages are backed first
    /// when `write`.
    fn pieces(
        &self,
        gpa: u64,
        len: usize,
        write: bool,
    ) -> Result<Vec<(usize, usize, Option<u64>)>, RamError> {
        if !in_region(gpa) && !in_region(gpa.saturating_add(len as u64).saturating_sub(1)) {
            return Ok(vec![(0, len, Some(gpa))]);
        }
        let mut out = Vec::new();
        let mut done = 0usize;
        while done < len {
            let at = gpa + done as u64;
            let n = (len - done).min((PAGE - at % PAGE) as usize);
            let real = if in_region(at) {
                let page = at & !(PAGE - 1);
                let real = match write {
                    true => Some(self.pages().back(page, &*self.inner)?),
                    false => self.pages().real(page),
                };
                real.map(|r| r + at % PAGE)
            } else {
                Some(at)
            };
            out.push((done, n, real));
            done += n;
        }
        Ok(out)
    }

    /// A word access: it never spans pages (it is aligned).
    fn word(&self, addr: GuestAddress, len: usize, write: bool) -> Result<Option<u64>, RamError> {
        let p = self.pieces(addr.0, len, write)?;
        match p.as_slice() {
            [(_, _, real)] => Ok(*real),
            _ => Err(RamError::new(addr.0, len, "a word across two pages")),
        }
    }
}

impl GuestRam for Backed {
    fn read_bytes(&self, buf: &mut [u8], addr: GuestAddress) -> Result<(), RamError> {
        for (off, n, real) in self.pieces(addr.0, buf.len(), false)? {
            match real {
                Some(r) => self
                    .mem(r, n)
                    .read_slice(&mut buf[off..off + n], GuestAddress(r))?,
                None => buf[off..off + n].fill(0),
            }
        }
        Ok(())
    }
    fn write_bytes(&self, data: &[u8], addr: GuestAddress) -> Result<(), RamError> {
        for (off, n, real) in self.pieces(addr.0, data.len(), true)? {
            // Backed: `pieces` gave every region page a page.
            let r = real.unwrap_or(addr.0 + off as u64);
            self.mem(r, n)
                .write_slice(&data[off..off + n], GuestAddress(r))?;
        }
        Ok(())
    }
    fn load_u32(&self, addr: GuestAddress, order: Ordering) -> Result<u32, RamError> {
        match self.word(addr, 4, false)? {
            Some(r) => self.mem(r, 4).load_u32(GuestAddress(r), order),
            None => Ok(0),
        }
    }
    fn load_u64(&self, addr: GuestAddress, order: Ordering) -> Result<u64, RamError> {
        match self.word(addr, 8, false)? {
            Some(r) => self.mem(r, 8).load_u64(GuestAddress(r), order),
            None => Ok(0),
        }
    }
    fn store_u32(&self, v: u32, addr: GuestAddress, order: Ordering) -> Result<(), RamError> {
        let r = self.word(addr, 4, true)?.unwrap_or(addr.0);
        self.mem(r, 4).store_u32(v, GuestAddress(r), order)
    }
    fn store_u64(&self, v: u64, addr: GuestAddress, order: Ordering) -> Result<(), RamError> {
        let r = self.word(addr, 8, true)?.unwrap_or(addr.0);
        self.mem(r, 8).store_u64(v, GuestAddress(r), order)
    }
    fn store_data_u64(&self, v: u64, addr: GuestAddress) -> Result<(), RamError> {
        let r = self.word(addr, 8, true)?.unwrap_or(addr.0);
        self.mem(r, 8).store_data_u64(v, GuestAddress(r))
    }
    fn contains(&self, addr: GuestAddress, len: usize) -> bool {
        in_region(addr.0)
            || self.own.as_ref().is_some_and(|o| o.contains(addr, len))
            || self.inner.contains(addr, len)
    }
    fn reads_in_order(&self, addr: GuestAddress, len: usize) -> bool {
        // Past the region (the rings of a ring device): where `read_bytes`
        // reads them. Region pages are translated page by page: no.
        !in_region(addr.0)
            && !in_region(addr.0.saturating_add(len as u64).saturating_sub(1))
            && self.mem(addr.0, len).reads_in_order(addr, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::exitless::layout::{CODE_LEN, DATA_LEN, GRAPH_BOTTOM};
    use vm_memory::GuestMemoryMmap;

    /// 31 free pages, 0x1000..0x20000.
    fn free() -> Vec<u64> {
        (0x1000..0x20000).step_by(0x1000).collect()
    }

    #[test]
    fn each_region_page_has_its_own_free_page_whatever_else_is_mapped() {
        let n = 31;
        // Tables, then code from the bottom; rings from the top.
        assert_eq!(slot(SPARE_PD_GPA, n), Some(0));
        assert_eq!(slot(SPARE_PD_GPA + 3 * PAGE, n), Some(3));
        assert_eq!(slot(SPARE_PD_GPA + 4 * PAGE, n), None);
        assert_eq!(slot(CODE_GPA + PAGE, n), Some(5));
        assert_eq!(slot(DATA_GPA, n), Some(30));
        assert_eq!(slot(DATA_GPA + 2 * PAGE, n), Some(28));
        // The graph's return stubs and frame pool: fixed, after CODE_SLOTS;
        // the return trap's page last.
        let graph = 4 + CODE_SLOTS;
        assert_eq!(
            slot(CODE_GPA + RETURN_TRAP_OFF, n),
            Some(graph + STUB_PAGES - 1)
        );
        assert_eq!(slot(CODE_GPA + RETURN_TRAP_OFF + PAGE, n), Some(graph));
        assert_eq!(
            slot(CODE_GPA + CODE_LEN - PAGE, n),
            Some(graph + STUB_PAGES - 2)
        );
        assert_eq!(slot(DATA_GPA + DATA_LEN - PAGE, n), Some(GRAPH_BOTTOM - 1));
        // Direct entries' stubs below the return trap's page: the return
        // stubs' slots from the last down.
        let below = CODE_GPA + RETURN_TRAP_OFF - PAGE;
        assert_eq!(slot(below, n), Some(graph + STUB_PAGES - 2));
        let lowest = CODE_GPA + RETURN_TRAP_OFF - DIRECT_STUB_PAGES as u64 * PAGE;
        assert_eq!(slot(lowest, n), Some(graph));
        let code = (lowest - PAGE - CODE_GPA) / PAGE;
        assert_eq!(slot(lowest - PAGE, n), Some(4 + code as usize));
    }

    #[test]
    fn region_pages_are_backed_at_first_write_and_read_as_zeros_before() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        vm_memory::Bytes::write_slice(&mem, &[0xaa; 4], GuestAddress(0x5ffc)).unwrap();
        let pages = Arc::new(Mutex::new(RegionPages::new(free())));
        let ram: &dyn GuestRam = &Backed::new(Arc::new(mem.clone()), Arc::clone(&pages));
        assert_eq!(ram.read_obj::<u64>(GuestAddress(REGION_GPA + 8)), Ok(0));
        // A write across two code pages backs both: the 5th and 6th free.
        ram.write_slice(&[1, 2, 3, 4], GuestAddress(REGION_GPA + PAGE - 2))
            .unwrap();
        let mut b = [0u8; 2];
        vm_memory::Bytes::read_slice(&mem, &mut b, GuestAddress(0x5000 + PAGE - 2)).unwrap();
        assert_eq!(b, [1, 2]);
        vm_memory::Bytes::read_slice(&mem, &mut b, GuestAddress(0x6000)).unwrap();
        assert_eq!(b, [3, 4]);
        // A ring word: the highest free page.
        ram.store(7u64, GuestAddress(DATA_GPA + 8), Ordering::Release)
            .unwrap();
        assert_eq!(
            ram.load::<u64>(GuestAddress(DATA_GPA + 8), Ordering::Acquire),
            Ok(7)
        );
        assert_eq!(
            pages.lock().unwrap().pages(),
            vec![
                (REGION_GPA, 0x5000),
                (REGION_GPA + PAGE, 0x6000),
                (DATA_GPA, 0x1f000)
            ]
        );
        // What the pages held before is kept.
        let orig = pages.lock().unwrap().originals();
        assert_eq!(orig[0].0, 0x5000);
        assert_eq!(&orig[0].1[PAGE as usize - 4..], &[0xaa; 4]);
        // Outside the region: the guest's own RAM, untranslated.
        ram.write_obj(9u32, GuestAddress(0x100)).unwrap();
        assert_eq!(
            vm_memory::Bytes::read_obj::<u32>(&mem, GuestAddress(0x100)).unwrap(),
            9
        );
        // Rings grown down into the code: a clear error naming the room.
        let e = ram
            .write_obj(1u8, GuestAddress(DATA_GPA + 25 * PAGE))
            .unwrap_err();
        assert!(e.why.contains("more than the 124 KiB"), "{e}");
    }

    /// The data window in memory of vmtrace's own (an ivshmem BAR): ring
    /// accesses go to that mapping, one to one, and take no free page; the
    /// code still takes free pages.
    #[test]
    fn own_data_memory_takes_the_rings_one_to_one() {
        let bar = 0x1_0000_0000u64;
        let low = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let own = GuestMemoryMmap::from_ranges(&[(GuestAddress(bar), DATA_LEN as usize)]).unwrap();
        let pages = Arc::new(Mutex::new(RegionPages::with_own_data(free(), bar)));
        let ram: &dyn GuestRam = &Backed::with_own(
            Arc::new(low.clone()),
            Arc::clone(&pages),
            Arc::new(own.clone()),
        );
        ram.store(
            7u64,
            GuestAddress(DATA_GPA + 3 * PAGE + 8),
            Ordering::Release,
        )
        .unwrap();
        let at = GuestAddress(bar + 3 * PAGE + 8);
        assert_eq!(vm_memory::Bytes::read_obj::<u64>(&own, at).unwrap(), 7);
        // The frame pool too, past what free pages would hold.
        ram.write_slice(&[5; 8], GuestAddress(DATA_GPA + DATA_LEN - 8))
            .unwrap();
        let end = GuestAddress(bar + DATA_LEN - 8);
        assert_eq!(
            vm_memory::Bytes::read_obj::<u64>(&own, end).unwrap(),
            0x0505_0505_0505_0505
        );
        ram.write_obj(1u8, GuestAddress(REGION_GPA)).unwrap();
        assert_eq!(pages.lock().unwrap().used(), (1, 31));
        assert!(pages
            .lock()
            .unwrap()
            .originals()
            .iter()
            .all(|(r, _)| *r < 1 << 20));
    }

    /// The whole region in memory of vmtrace's own (a kernel before 5.13,
    /// no page known free): code, data window and tables one to one in
    /// it, the guest's RAM never written nor kept.
    #[test]
    fn own_region_memory_takes_every_page_one_to_one() {
        let bar = 0x1_0000_0000u64;
        let low = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let own =
            GuestMemoryMmap::from_ranges(&[(GuestAddress(bar), REGION_LEN as usize)]).unwrap();
        let pages = Arc::new(Mutex::new(RegionPages::with_own_region(bar)));
        let ram: &dyn GuestRam = &Backed::with_own(
            Arc::new(low.clone()),
            Arc::clone(&pages),
            Arc::new(own.clone()),
        );
        for (gpa, v) in [(CODE_GPA + 8, 1u64), (DATA_GPA + 16, 2), (SPARE_PD_GPA, 3)] {
            ram.write_obj(v, GuestAddress(gpa)).unwrap();
            let at = GuestAddress(bar + (gpa - REGION_GPA));
            assert_eq!(vm_memory::Bytes::read_obj::<u64>(&own, at).unwrap(), v);
        }
        let p = pages.lock().unwrap();
        assert_eq!(p.used(), (0, 0));
        assert!(p.originals().is_empty());
        assert_eq!(p.own_data(), Some(bar + (DATA_GPA - REGION_GPA)));
    }
}
