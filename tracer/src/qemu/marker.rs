//! vmtrace's marker in the guest: one page of its exitless region that
//! says whose region it is, which free pages it may take and which sites
//! may call into it, so that a repair finds and takes it out even when the
//! host's journal (`super::journal`) is gone. What the pages held before
//! is in the journal only (it does not fit here).
//!
//! The marker is the region's spare page directory (`SPARE_PD_GPA`): a
//! guest whose tables have a page directory above vmtrace's addresses (a
//! Linux guest: its fixmap's) never has it mapped or walked, and on a guest
//! without one the attach overwrites it with the directory (zeros first),
//! which only loses the marker. A detach gives the page its bytes back,
//! marker gone.
//!
//! The sites of modules vmtrace wrote are named too, after the image's:
//! the image's are found by its linear mapping, a module's through the
//! kernel's page tables (its text is mapped page by page), so a repair
//! restores them as well. The marker is written again whenever a module's
//! site is written or given back during the trace (`super::module_follow`).
//!
//! On a guest booted through UEFI it also names the runtime services' page
//! tables (`efi_mm.pgd`, which the attach found through the kernel's BTF)
//! whose entry 508 the attach set with the kernel's: the repair has no
//! kernel file to find them with, and clears that entry there too.

use crate::kernel::kaslr::KernelOffset;
use crate::plan::exitless::layout::{PAGE, SPARE_PD_GPA};

/// The page starts with it.
pub const MAGIC: [u8; 16] = *b"vmtrace-region\0\x01";
/// Where the marker is, as the region names it (`Backed` puts it in one
/// of the free pages, always the first: `backing::slot`).
pub const MARKER_GPA: u64 = SPARE_PD_GPA;
/// Fixed fields after the magic, then the pages (u32 page numbers), then
/// the sites, then the modules' (u32: running address minus
/// `KERNEL_MAP_BASE`; module text is above it too, within 2 GiB).
const HEADER: usize = 64;
/// Where the fixed fields keep the counts of the image's sites and of
/// the modules' (u16 each: a page holds at most 1,008 words). Markers
/// written before the modules' count held the image's as a u32 there, so
/// read as no module sites.
const SITES_AT: usize = 52;
/// Where the fixed fields keep the UEFI page tables' page number (0: none;
/// a u32 page number reaches 16 TiB of guest-physical memory). Markers
/// written before it have 0 there.
const EFI_AT: usize = 60;
/// The kernel image's virtual base (`__START_KERNEL_map`): sites are kept
/// as u32 offsets from it (the image spans at most 1 GiB).
const KERNEL_MAP_BASE: u64 = vmm::layout::KERNEL_MAP_BASE;
/// The region's pages are in the first MiB: this far is looked through.
const LOW_MIB: u64 = 1 << 20;

/// What the marker says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Marker {
    pub vmtrace_pid: u32,
    pub vmtrace_start: u64,
    pub qemu_pid: u32,
    /// The kernel's KASLR offsets: a site's guest-physical address.
    pub offset: KernelOffset,
    /// The free pages the region may take (guest-physical).
    pub pages: Vec<u64>,
    /// The sites the attach may patch (running addresses).
    pub sites: Vec<u64>,
    /// The modules' sites vmtrace wrote (running addresses, located
    /// through the kernel's page tables).
    pub module_sites: Vec<u64>,
    /// More sites than fit: those past `sites` are not named.
    pub truncated: bool,
    /// The UEFI runtime services' top-level page table (guest-physical),
    /// whose entry 508 maps the rings too (a guest booted through UEFI).
    pub efi_root: Option<u64>,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

impl Marker {
    /// The page's bytes: as many sites as fit.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; PAGE as usize];
        let room = (b.len() - HEADER) / 4;
        let pages = self.pages.len().min(room);
        let sites = self.sites.len().min(room - pages);
        let modules = self.module_sites.len().min(room - pages - sites);
        let truncated =
            self.truncated || sites < self.sites.len() || modules < self.module_sites.len();
        b[..16].copy_from_slice(&MAGIC);
        b[16..20].copy_from_slice(&self.vmtrace_pid.to_le_bytes());
        b[20..24].copy_from_slice(&self.qemu_pid.to_le_bytes());
        b[24..32].copy_from_slice(&self.vmtrace_start.to_le_bytes());
        b[32..40].copy_from_slice(&self.offset.virt.to_le_bytes());
        b[40..48].copy_from_slice(&self.offset.phys.to_le_bytes());
        b[48..52].copy_from_slice(&(pages as u32).to_le_bytes());
        b[SITES_AT..SITES_AT + 2].copy_from_slice(&(sites as u16).to_le_bytes());
        b[SITES_AT + 2..SITES_AT + 4].copy_from_slice(&(modules as u16).to_le_bytes());
        b[56..60].copy_from_slice(&u32::from(truncated).to_le_bytes());
        let efi = self.efi_root.and_then(|r| u32::try_from(r / PAGE).ok());
        b[EFI_AT..EFI_AT + 4].copy_from_slice(&efi.unwrap_or(0).to_le_bytes());
        let words = self.pages[..pages]
            .iter()
            .map(|&p| (p / PAGE) as u32)
            .chain(
                self.sites[..sites]
                    .iter()
                    .chain(&self.module_sites[..modules])
                    .map(|&va| va.wrapping_sub(KERNEL_MAP_BASE) as u32),
            );
        for (i, w) in words.enumerate() {
            let at = HEADER + i * 4;
            b[at..at + 4].copy_from_slice(&w.to_le_bytes());
        }
        b
    }

    /// A marker's page, or None if `b` is not one.
    pub fn decode(b: &[u8]) -> Option<Marker> {
        if b.get(..16)? != MAGIC {
            return None;
        }
        let pages = u32_at(b, 48)? as usize;
        let u16_at = |at: usize| Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?));
        let sites = usize::from(u16_at(SITES_AT)?);
        let modules = usize::from(u16_at(SITES_AT + 2)?);
        let word = |i: usize| u32_at(b, HEADER + i * 4);
        let va = |i: usize| Some(KERNEL_MAP_BASE + u64::from(word(i)?));
        Some(Marker {
            vmtrace_pid: u32_at(b, 16)?,
            qemu_pid: u32_at(b, 20)?,
            vmtrace_start: u64_at(b, 24)?,
            offset: KernelOffset {
                virt: u64_at(b, 32)? as i64,
                phys: u64_at(b, 40)? as i64,
            },
            pages: (0..pages)
                .map(|i| Some(u64::from(word(i)?) * PAGE))
                .collect::<Option<_>>()?,
            sites: (pages..pages + sites).map(va).collect::<Option<_>>()?,
            module_sites: (pages + sites..pages + sites + modules)
                .map(va)
                .collect::<Option<_>>()?,
            truncated: u32_at(b, 56)? != 0,
            efi_root: Some(u64::from(u32_at(b, EFI_AT)?) * PAGE).filter(|&r| r != 0),
        })
    }

    /// Site `va`'s guest-physical address.
    pub fn site_gpa(&self, va: u64) -> Option<u64> {
        self.offset.phys_of(self.offset.link(va))
    }
}

/// The marker in the guest's first MiB, and where it is: `read` reads
/// guest-physical memory (the guest may be running).
pub fn find(read: impl Fn(u64, &mut [u8]) -> bool) -> Option<(u64, Marker)> {
    let mut magic = [0u8; 16];
    (0..LOW_MIB).step_by(PAGE as usize).find_map(|gpa| {
        if !read(gpa, &mut magic) || magic != MAGIC {
            return None;
        }
        let mut page = vec![0u8; PAGE as usize];
        read(gpa, &mut page).then_some(())?;
        Some((gpa, Marker::decode(&page)?))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marker(sites: usize) -> Marker {
        Marker {
            vmtrace_pid: 42,
            vmtrace_start: 7,
            qemu_pid: 9,
            offset: KernelOffset {
                virt: 0x2e00_0000,
                phys: 0x2e00_0000,
            },
            pages: (1..153).map(|p| p * PAGE).collect(),
            sites: (0..sites as u64)
                .map(|i| 0xffff_ffff_ae00_0000 + i * 16)
                .collect(),
            module_sites: Vec::new(),
            truncated: false,
            efi_root: None,
        }
    }

    #[test]
    fn a_marker_round_trips_and_says_when_sites_did_not_fit() {
        let m = marker(400);
        assert_eq!(Marker::decode(&m.encode()), Some(m.clone()));
        assert_eq!(m.site_gpa(0xffff_ffff_ae00_0010), Some(0x2e00_0010));
        let big = marker(2000);
        let back = Marker::decode(&big.encode()).unwrap();
        assert!(back.truncated);
        assert_eq!(back.sites[..], big.sites[..back.sites.len()]);
        assert_eq!(back.pages, big.pages);
        // Not a marker: nothing.
        assert_eq!(Marker::decode(&[0u8; 4096]), None);
        // A UEFI guest's: its runtime services' page tables too.
        let efi = Marker {
            efi_root: Some(0x7e6_5000),
            ..marker(3)
        };
        assert_eq!(Marker::decode(&efi.encode()), Some(efi));
        // Modules' sites after the image's, and as many as fit.
        let modules = Marker {
            module_sites: vec![0xffff_ffff_c012_3014, 0xffff_ffff_c012_3ffe],
            ..marker(3)
        };
        assert_eq!(Marker::decode(&modules.encode()), Some(modules));
        let full = Marker {
            module_sites: vec![0xffff_ffff_c012_3014; 900],
            ..marker(400)
        };
        let back = Marker::decode(&full.encode()).unwrap();
        assert!(back.truncated);
        assert_eq!(back.sites, full.sites);
        assert!(back.module_sites.len() < 900);
    }
}
