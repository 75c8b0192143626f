//! Guest RAM as the tracer sees it, whoever holds it: this VMM's own
//! memory (`GuestMemoryMmap`, mapped into this process) or another VMM's
//! (a QEMU process, read and written from outside). Everything vmtrace
//! does to a guest — walking its page tables, patching its text, draining
//! its rings — goes through this trait, so the same code serves both.
//!
//! vm-memory's `Bytes` cannot be that interface: its accesses go through
//! volatile slices of memory mapped into this process, which another
//! process's RAM is not.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use vm_memory::{
    ByteValued, Bytes, GuestAddress, GuestMemory, GuestMemoryBackend, GuestMemoryMmap,
    GuestMemoryRegion, Permissions,
};

/// A failed access to guest RAM, with the guest-physical range it was for.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("guest physical {gpa:#x} ({len} bytes): {why}")]
pub struct RamError {
    pub gpa: u64,
    pub len: usize,
    pub why: String,
}

impl RamError {
    pub fn new(gpa: u64, len: usize, why: impl ToString) -> RamError {
        RamError {
            gpa,
            len,
            why: why.to_string(),
        }
    }
}

/// Guest RAM by guest-physical address. The word accesses are single
/// aligned accesses (what the guest's own atomics pair with); `order` is
/// honoured where the memory is shared with this process, and implied by
/// the system call of an outside access.
///
/// The byte accesses have names of their own so that a type that is also
/// vm-memory's `Bytes` (this VMM's memory) never has two methods of one
/// name; callers holding a `dyn GuestRam` use `read_slice`, `write_slice`,
/// `read_obj`, `write_obj`, `load` and `store` as with `Bytes`.
pub trait GuestRam: Send + Sync {
    fn read_bytes(&self, buf: &mut [u8], addr: GuestAddress) -> Result<(), RamError>;
    fn write_bytes(&self, data: &[u8], addr: GuestAddress) -> Result<(), RamError>;
    fn load_u32(&self, addr: GuestAddress, order: Ordering) -> Result<u32, RamError>;
    fn load_u64(&self, addr: GuestAddress, order: Ordering) -> Result<u64, RamError>;
    fn store_u32(&self, v: u32, addr: GuestAddress, order: Ordering) -> Result<(), RamError>;
    fn store_u64(&self, v: u64, addr: GuestAddress, order: Ordering) -> Result<(), RamError>;
    /// `store_u64` of a word that is data, never code, written while every
    /// vCPU is stopped (vmtrace's marks in the guest's ftrace records): a
    /// backend that writes through a slower path to keep translated code
    /// coherent (QEMU's gdbstub, under TCG) may store this one directly.
    fn store_data_u64(&self, v: u64, addr: GuestAddress) -> Result<(), RamError> {
        self.store_u64(v, addr, Ordering::SeqCst)
    }
    /// Are the `len` bytes at `addr` all guest RAM?
    fn contains(&self, addr: GuestAddress, len: usize) -> bool;
    /// Does `read_bytes` of the `len` bytes at `addr` (8-byte aligned)
    /// load each aligned word once, in address order, with x86's load
    /// ordering (no load passes an older one)? Then a word read is as an
    /// acquire of the words before it: a ring record's commit word, first
    /// in the record, read set proves the fields after it written (the
    /// guest stores them before it). False unless the memory is mapped
    /// here (`/proc/PID/mem` copies as the kernel likes).
    fn reads_in_order(&self, addr: GuestAddress, len: usize) -> bool {
        let _ = (addr, len);
        false
    }
}

impl std::fmt::Debug for dyn GuestRam + '_ {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GuestRam")
    }
}

/// The words `GuestRam::load`/`store` move.
pub trait RamWord: Sized {
    fn load(ram: &dyn GuestRam, addr: GuestAddress, order: Ordering) -> Result<Self, RamError>;
    fn store(self, ram: &dyn GuestRam, addr: GuestAddress, order: Ordering)
        -> Result<(), RamError>;
}

/// `RamWord` for a word type through its pair of `GuestRam` methods.
macro_rules! ram_word {
    ($t:ty, $load:ident, $store:ident) => {
        impl RamWord for $t {
            fn load(
                ram: &dyn GuestRam,
                addr: GuestAddress,
                order: Ordering,
            ) -> Result<$t, RamError> {
                ram.$load(addr, order)
            }
            fn store(
                self,
                ram: &dyn GuestRam,
                addr: GuestAddress,
                order: Ordering,
            ) -> Result<(), RamError> {
                ram.$store(self, addr, order)
            }
        }
    };
}

ram_word!(u32, load_u32, store_u32);
ram_word!(u64, load_u64, store_u64);

impl dyn GuestRam + '_ {
    pub fn read_slice(&self, buf: &mut [u8], addr: GuestAddress) -> Result<(), RamError> {
        self.read_bytes(buf, addr)
    }

    pub fn write_slice(&self, data: &[u8], addr: GuestAddress) -> Result<(), RamError> {
        self.write_bytes(data, addr)
    }

    /// A plain-old-data value at `addr`.
    pub fn read_obj<T: ByteValued + Default>(&self, addr: GuestAddress) -> Result<T, RamError> {
        let mut v = T::default();
        self.read_slice(v.as_mut_slice(), addr)?;
        Ok(v)
    }

    pub fn write_obj<T: ByteValued>(&self, v: T, addr: GuestAddress) -> Result<(), RamError> {
        self.write_slice(v.as_slice(), addr)
    }

    pub fn load<T: RamWord>(&self, addr: GuestAddress, order: Ordering) -> Result<T, RamError> {
        T::load(self, addr, order)
    }

    pub fn store<T: RamWord>(
        &self,
        v: T,
        addr: GuestAddress,
        order: Ordering,
    ) -> Result<(), RamError> {
        v.store(self, addr, order)
    }
}

/// This VMM's own memory: mapped here, so words are real atomics.
impl GuestRam for GuestMemoryMmap {
    fn read_bytes(&self, buf: &mut [u8], addr: GuestAddress) -> Result<(), RamError> {
        if let Some(src) = host_span(self, addr, buf.len()) {
            // SAFETY: `host_span` checked that the `buf.len()` bytes from
            // `src` are mapped guest RAM of one region, which lives as long
            // as `self`.
            unsafe { volatile_copy(src, buf) };
            return Ok(());
        }
        Bytes::read_slice(self, buf, addr).map_err(|e| RamError::new(addr.0, buf.len(), e))
    }
    fn write_bytes(&self, data: &[u8], addr: GuestAddress) -> Result<(), RamError> {
        Bytes::write_slice(self, data, addr).map_err(|e| RamError::new(addr.0, data.len(), e))
    }
    fn load_u32(&self, addr: GuestAddress, order: Ordering) -> Result<u32, RamError> {
        if let Some(p) = host_span(self, addr, 4).filter(|p| p.align_offset(4) == 0) {
            // SAFETY: 4 mapped bytes of one region (`host_span`), aligned
            // for an AtomicU32 (checked), living as long as `self`.
            return Ok(unsafe { AtomicU32::from_ptr(p.cast()) }.load(order));
        }
        Bytes::load(self, addr, order).map_err(|e| RamError::new(addr.0, 4, e))
    }
    fn load_u64(&self, addr: GuestAddress, order: Ordering) -> Result<u64, RamError> {
        if let Some(p) = host_span(self, addr, 8).filter(|p| p.align_offset(8) == 0) {
            // SAFETY: 8 mapped bytes of one region (`host_span`), aligned
            // for an AtomicU64 (checked), living as long as `self`.
            return Ok(unsafe { AtomicU64::from_ptr(p.cast()) }.load(order));
        }
        Bytes::load(self, addr, order).map_err(|e| RamError::new(addr.0, 8, e))
    }
    fn store_u32(&self, v: u32, addr: GuestAddress, order: Ordering) -> Result<(), RamError> {
        Bytes::store(self, v, addr, order).map_err(|e| RamError::new(addr.0, 4, e))
    }
    fn store_u64(&self, v: u64, addr: GuestAddress, order: Ordering) -> Result<(), RamError> {
        Bytes::store(self, v, addr, order).map_err(|e| RamError::new(addr.0, 8, e))
    }
    fn contains(&self, addr: GuestAddress, len: usize) -> bool {
        GuestMemory::check_range(self, addr, len, Permissions::Write)
    }
    fn reads_in_order(&self, addr: GuestAddress, len: usize) -> bool {
        // `read_bytes` of one mapped region, word-aligned: `volatile_copy`'s
        // aligned words, ascending (volatile: the compiler keeps their order).
        cfg!(target_arch = "x86_64")
            && host_span(self, addr, len).is_some_and(|p| p.align_offset(8) == 0)
    }
}

/// Copies `dst.len()` bytes from `src` with volatile reads (the guest may
/// write them meanwhile), a word at a time where `src` is word-aligned (a
/// page-table entry, most fields), else a byte at a time.
///
/// # Safety
/// `src` must be valid for reads of `dst.len()` bytes.
unsafe fn volatile_copy(src: *const u8, dst: &mut [u8]) {
    const WORD: usize = std::mem::size_of::<u64>();
    let mut k = 0;
    if src.align_offset(WORD) == 0 {
        while k + WORD <= dst.len() {
            // SAFETY: in bounds (the caller's promise), aligned (checked).
            let w = unsafe { src.add(k).cast::<u64>().read_volatile() };
            dst[k..k + WORD].copy_from_slice(&w.to_ne_bytes());
            k += WORD;
        }
    }
    for (j, b) in dst.iter_mut().enumerate().skip(k) {
        // SAFETY: in bounds (the caller's promise).
        *b = unsafe { src.add(j).read_volatile() };
    }
}

/// Where `len` bytes of guest RAM at `addr` are mapped in this process,
/// when they lie in one region: reads on the trap path go straight to
/// them, not through vm-memory's generic slice iteration (most of a
/// traced call's handler time before). None otherwise: the caller takes
/// the general path, which also reports the error.
///
/// A scan, not vm-memory's binary search: a VM has one to three regions,
/// and the lookup is done for every page-table entry a trap's walks read
/// (it was a fifth of a traced call's handler).
fn host_span(mem: &GuestMemoryMmap, addr: GuestAddress, len: usize) -> Option<*mut u8> {
    for region in mem.iter() {
        let off = addr.0.wrapping_sub(region.start_addr().0);
        if off < region.len() {
            if off.checked_add(len as u64)? > region.len() {
                return None;
            }
            // In bounds (checked): the region's mapping from its start.
            return Some(region.as_ptr().wrapping_add(off as usize));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_memory_through_the_trait() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0x1000), 0x2000)]).unwrap();
        let ram: &dyn GuestRam = &mem;
        ram.write_obj(0x1122_3344_5566_7788u64, GuestAddress(0x1008))
            .unwrap();
        assert_eq!(
            ram.load::<u32>(GuestAddress(0x100c), Ordering::Acquire),
            Ok(0x1122_3344)
        );
        ram.store(7u32, GuestAddress(0x1008), Ordering::Release)
            .unwrap();
        assert_eq!(
            ram.read_obj::<u64>(GuestAddress(0x1008)),
            Ok(0x1122_3344_0000_0007)
        );
        let e = ram.read_obj::<u64>(GuestAddress(0x2ffc)).unwrap_err();
        assert_eq!((e.gpa, e.len), (0x2ffc, 8));
        assert!(ram.read_obj::<u8>(GuestAddress(0x10)).is_err());
    }

    #[test]
    fn reads_within_a_region_across_regions_and_unaligned_agree() {
        // Two regions back to back: a read across their border takes the
        // general path, one inside either the direct one; both the same.
        let mem = GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0x1000), 0x1000),
            (GuestAddress(0x2000), 0x1000),
        ])
        .unwrap();
        let bytes: Vec<u8> = (0..0x40u8).collect();
        Bytes::write_slice(&mem, &bytes, GuestAddress(0x1fe0)).unwrap();
        let ram: &dyn GuestRam = &mem;
        let mut across = [0u8; 0x40];
        ram.read_slice(&mut across, GuestAddress(0x1fe0)).unwrap();
        assert_eq!(across.as_slice(), bytes.as_slice());
        let mut inside = [0u8; 16];
        ram.read_slice(&mut inside, GuestAddress(0x2003)).unwrap();
        assert_eq!(inside.as_slice(), &bytes[0x23..0x33]);
        // A word load stays an atomic one: aligned, or refused as before.
        assert!(ram
            .load::<u64>(GuestAddress(0x2001), Ordering::Relaxed)
            .is_err());
        let want = u64::from_le_bytes(bytes[0x20..0x28].try_into().unwrap());
        assert_eq!(
            ram.load::<u64>(GuestAddress(0x2000), Ordering::Relaxed),
            Ok(want)
        );
        let want = u32::from_le_bytes(bytes[0x1c..0x20].try_into().unwrap());
        assert_eq!(
            ram.load::<u32>(GuestAddress(0x1ffc), Ordering::Relaxed),
            Ok(want)
        );
        // Below the first region, and in a hole between two: no region's.
        let holed = GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0x1000), 0x1000),
            (GuestAddress(0x4000), 0x1000),
        ])
        .unwrap();
        let ram2: &dyn GuestRam = &holed;
        for gpa in [0x0ff8, 0x2000, 0x3ff8, 0x5000] {
            assert!(ram2
                .load::<u64>(GuestAddress(gpa), Ordering::Relaxed)
                .is_err());
        }
        assert!(ram2
            .load::<u64>(GuestAddress(0x4ff8), Ordering::Relaxed)
            .is_ok());
        // Not mapped at all: the general path's error.
        let mut gone = [0u8; 8];
        let e = ram.read_slice(&mut gone, GuestAddress(0x3000)).unwrap_err();
        assert_eq!((e.gpa, e.len), (0x3000, 8));
    }
}
