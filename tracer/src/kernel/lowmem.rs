//! Guest memory a running Linux kernel never uses, proved from the
//! kernel's own state: the pages of its first MiB of RAM outside its
//! real-mode trampoline.
//!
//! Since 5.13 (arch/x86/realmode/init.c, `reserve_real_mode`) Linux
//! reserves the whole first MiB of RAM in memblock at boot, so none of it
//! ever reaches the page allocator; it places its real-mode trampoline
//! (AP start-up, resume, reboot) there and uses nothing else of it after
//! boot but BIOS data it reads early (page 0). So the free pages are the
//! RAM of its e820 table below 1 MiB, without page 0 and without the
//! trampoline (`real_mode_header` points at it; `real_mode_blob` ..
//! `real_mode_blob_end` in the image is its size).

use vmm::gva::{AddressSpace, GvaError};

use super::kaslr::KernelOffset;
use super::symbols::KernelImage;

/// Where the kernel's reservation ends.
pub const LOW_END: u64 = 1 << 20;
/// Page 0: the real-mode interrupt table and the BIOS data area.
const LOW_START: u64 = 0x1000;
const PAGE: u64 = 4096;
/// First release that reserves all of the first MiB.
const SINCE: (u32, u32) = (5, 13);
/// e820 type of usable RAM (arch/x86/include/asm/e820/types.h).
const E820_RAM: u32 = 1;
/// `struct e820_entry` is packed: addr u64, size u64, type u32.
const E820_ENTRY_LEN: usize = 20;
/// More entries than any `struct e820_table` holds (E820_MAX_ENTRIES).
const E820_MOST: u32 = 1024;

#[derive(Debug, thiserror::Error)]
pub enum LowMemError {
    #[error(
        "the kernel image has no {0} symbol: cannot tell which guest memory the guest never uses"
    )]
    NoSymbol(&'static str),
    #[error("the kernel is Linux {0}.{1}, older than 5.13, which does not keep the first MiB of RAM to itself: no guest memory is known to be unused")]
    TooOld(u32, u32),
    #[error("cannot read the guest's {what} at {va:#x}: {source}")]
    Read {
        what: &'static str,
        va: u64,
        source: GvaError,
    },
    #[error("the guest's e820 table says it has {0} entries: not a booted kernel's table")]
    BadE820(u32),
    #[error("the guest kernel has not placed its real-mode trampoline yet (real_mode_header is 0): it is still booting")]
    Booting,
}

/// The free pages found, and what was left out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LowMemory {
    /// Guest-physical addresses of the free 4 KiB pages, ascending.
    pub pages: Vec<u64>,
    /// The real-mode trampoline's pages: [start, end).
    pub trampoline: (u64, u64),
    /// The kernel's release.
    pub version: (u32, u32),
}

/// "Linux version 6.1.192 ..." -> (6, 1).
pub fn parse_version(banner: &[u8]) -> Option<(u32, u32)> {
    let text = std::str::from_utf8(banner.get(..64.min(banner.len()))?).ok()?;
    let v = text.strip_prefix("Linux version ")?;
    let mut it = v.split(|c: char| !c.is_ascii_digit());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// The 4 KiB pages of `ram` ranges ([start, end)) inside
/// [`LOW_START`, `LOW_END`) and outside every `holes` range.
pub fn free_pages(ram: &[(u64, u64)], holes: &[(u64, u64)]) -> Vec<u64> {
    let mut out = Vec::new();
    for &(start, end) in ram {
        let first = start.max(LOW_START).div_ceil(PAGE) * PAGE;
        let last = end.min(LOW_END) / PAGE * PAGE;
        let mut p = first;
        while p < last {
            if !holes.iter().any(|&(s, e)| p < e && p + PAGE > s) {
                out.push(p);
            }
            p += PAGE;
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The RAM ranges of the guest kernel's e820 table, [start, end), through
/// its pointer at `ptr` (`struct e820_table *e820_table`).
fn e820_ram(space: &mut AddressSpace<'_>, ptr: u64) -> Result<Vec<(u64, u64)>, LowMemError> {
    let va = space.read_u64(ptr).map_err(|source| LowMemError::Read {
        what: "e820_table pointer",
        va: ptr,
        source,
    })?;
    let read = |what| move |source| LowMemError::Read { what, va, source };
    let n = u32::from_le_bytes(space.read_array::<4>(va).map_err(read("e820 table"))?);
    if n == 0 || n > E820_MOST {
        return Err(LowMemError::BadE820(n));
    }
    let mut raw = vec![0u8; n as usize * E820_ENTRY_LEN];
    space.read(va + 4, &mut raw).map_err(read("e820 table"))?;
    let u64_at = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or_default());
    Ok(raw
        .chunks_exact(E820_ENTRY_LEN)
        .filter(|e| u32::from_le_bytes([e[16], e[17], e[18], e[19]]) == E820_RAM)
        .map(|e| {
            let (addr, size) = (u64_at(&e[0..8]), u64_at(&e[8..16]));
            (addr, addr.saturating_add(size))
        })
        .collect())
}

/// The free low pages of the kernel running in `space` at `off`.
pub fn find(
    space: &mut AddressSpace<'_>,
    image: &KernelImage,
    off: KernelOffset,
) -> Result<LowMemory, LowMemError> {
    let sym = |name| image.symbol(name).ok_or(LowMemError::NoSymbol(name));
    let banner = sym("linux_banner")?;
    let version = image
        .file_bytes(banner.addr, 64)
        .and_then(parse_version)
        .ok_or(LowMemError::NoSymbol("linux_banner"))?;
    if version < SINCE {
        return Err(LowMemError::TooOld(version.0, version.1));
    }
    let ram = e820_ram(space, off.runtime(sym("e820_table")?.addr))?;
    let header_va = off.runtime(sym("real_mode_header")?.addr);
    let read = |what, va| move |source| LowMemError::Read { what, va, source };
    let header = u64::from_le_bytes(
        space
            .read_array::<8>(header_va)
            .map_err(read("real_mode_header", header_va))?,
    );
    if header == 0 {
        return Err(LowMemError::Booting);
    }
    let base = space
        .translate(header)
        .map_err(read("real-mode trampoline", header))?
        .gpa;
    // Its size from the image; without it, everything from it up.
    let end = match (
        image.symbol("real_mode_blob"),
        image.symbol("real_mode_blob_end"),
    ) {
        (Some(b), Some(e)) if e.addr > b.addr => base + (e.addr - b.addr),
        _ => LOW_END,
    };
    let trampoline = (base / PAGE * PAGE, end.div_ceil(PAGE) * PAGE);
    Ok(LowMemory {
        pages: free_pages(&ram, &[trampoline]),
        trampoline,
        version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_from_banners() {
        assert_eq!(
            parse_version(b"Linux version 6.1.192 (vmtrace@x)"),
            Some((6, 1))
        );
        assert_eq!(parse_version(b"Linux version 5.13.0-rc1 ("), Some((5, 13)));
        assert_eq!(parse_version(b"Linux version 4.19.0\0"), Some((4, 19)));
        assert_eq!(parse_version(b"Linux Version"), None);
        assert_eq!(parse_version(b"\xff\xfe"), None);
    }

    #[test]
    fn free_pages_are_low_ram_without_page_0_and_the_holes() {
        // QEMU/SeaBIOS: RAM 0-0x9fc00, then the EBDA; RAM again from 1 MiB.
        let ram = [(0, 0x9fc00), (0x10_0000, 0x1000_0000)];
        let pages = free_pages(&ram, &[(0x98000, 0x9e000)]);
        assert_eq!(pages.first(), Some(&0x1000));
        // The partial page below the EBDA is not free; nothing from 1 MiB.
        assert_eq!(pages.last(), Some(&0x9e000));
        assert!(!pages.contains(&0x9f000));
        assert!(!pages.iter().any(|&p| (0x98000..0x9e000).contains(&p)));
        assert_eq!(pages.len(), (0x98 - 1) + 1);
        // Overlapping RAM ranges give each page once.
        assert_eq!(
            free_pages(&[(0, 0x3000), (0x2000, 0x4000)], &[]),
            vec![0x1000, 0x2000, 0x3000]
        );
    }
}
