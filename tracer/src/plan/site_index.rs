//! The index of patchable sites: from a trap's RIP to its site and traced
//! function, in the running (possibly KASLR-moved) kernel.

use std::sync::atomic::{AtomicU64, Ordering};

/// Length of `out imm8, al`: on hosts whose KVM completes the `out` before
/// exiting (this CI host), RIP is already this far past the site.
pub const OUT_LEN: u64 = 2;

/// The patchable sites, sorted by address, each with its traced function.
#[derive(Debug, Default)]
pub struct SiteIndex {
    /// Link addresses (the vmlinux's).
    pub addrs: Vec<u64>,
    pub funcs: Vec<u32>,
    /// How far the running kernel is from them (KASLR's virtual offset),
    /// set once at the first attach, before any site traps.
    slide: AtomicU64,
}

impl SiteIndex {
    /// `sites`: (address, function index), any order.
    pub fn new(mut sites: Vec<(u64, u32)>) -> Self {
        sites.sort_unstable();
        sites.dedup_by_key(|s| s.0);
        SiteIndex {
            addrs: sites.iter().map(|s| s.0).collect(),
            funcs: sites.iter().map(|s| s.1).collect(),
            slide: AtomicU64::new(0),
        }
    }

    /// The kernel runs `virt` bytes from its link addresses (`kaslr`).
    pub fn set_slide(&self, virt: i64) {
        self.slide.store(virt as u64, Ordering::Relaxed);
    }

    /// How far the running kernel is from its link addresses (0 until the
    /// first attach found it).
    pub fn slide(&self) -> i64 {
        self.slide.load(Ordering::Relaxed) as i64
    }

    /// Where site `i` is in the running kernel.
    pub fn running_addr(&self, i: usize) -> u64 {
        self.addrs[i].wrapping_add(self.slide.load(Ordering::Relaxed))
    }

    /// (address, function) of every site, in address order.
    pub fn sites(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.addrs.iter().copied().zip(self.funcs.iter().copied())
    }

    fn exact(&self, addr: u64) -> Option<usize> {
        self.addrs.binary_search(&addr).ok()
    }

    /// The site a trap at `rip` came from: RIP at the `out` (bare-metal KVM's
    /// fast PIO path) or just past it (KVM's emulator). Sites are five bytes
    /// apart at least, so the two cannot both match.
    pub fn find(&self, rip: u64) -> Option<usize> {
        // Set before the sites were patched, under the pause that every
        // vCPU's next entry synchronizes with: Relaxed is enough.
        let rip = rip.wrapping_sub(self.slide.load(Ordering::Relaxed));
        self.exact(rip)
            .or_else(|| self.exact(rip.wrapping_sub(OUT_LEN)))
    }
}
