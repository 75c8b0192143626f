//! The index of patchable sites: from a trap's RIP to its site and traced
//! function, in the running (possibly KASLR-moved) kernel.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::kernel::sites::SITE_LEN;

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
    /// Direct entries: where each site's stub is in vmtrace's code page
    /// (ascending with the site), set at the first attach, before any
    /// site is patched. A trapping stub starts with the trap.
    stubs: OnceLock<Box<[u64]>>,
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
            stubs: OnceLock::new(),
        }
    }

    /// Direct entries: site k's stub is at `stubs[k]` (ascending). Set once
    /// (a second attach makes the same stubs); false if different ones
    /// were set before.
    pub fn set_stubs(&self, stubs: Box<[u64]>) -> bool {
        let set = self.stubs.get_or_init(|| stubs.clone());
        **set == *stubs
    }

    /// Where the guest resumes after vmtrace handled a trap of site `i`:
    /// past the trap, at the site (an ftrace site's 3-byte NOP is never
    /// run) or in its direct stub (the displaced instructions).
    pub fn resume_addr(&self, i: usize) -> u64 {
        match self.stubs.get() {
            Some(stubs) => stubs[i] + SITE_LEN as u64,
            None => self.running_addr(i) + SITE_LEN as u64,
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
    /// fast PIO path) or just past it (KVM's emulator), at the site or, for
    /// direct entries, at its stub. Sites (and stubs) are five bytes apart
    /// at least, so the two cannot both match.
    pub fn find(&self, rip: u64) -> Option<usize> {
        // Set before the sites were patched, under the pause that every
        // vCPU's next entry synchronizes with: Relaxed is enough.
        if let Some(stubs) = self.stubs.get() {
            let at = |a: u64| stubs.binary_search(&a).ok();
            return at(rip).or_else(|| at(rip.wrapping_sub(OUT_LEN)));
        }
        let rip = rip.wrapping_sub(self.slide.load(Ordering::Relaxed));
        self.exact(rip)
            .or_else(|| self.exact(rip.wrapping_sub(OUT_LEN)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_sites_trap_in_their_stubs_and_resume_past_the_trap() {
        let idx = SiteIndex::new(vec![(0x2000, 0), (0x1000, 1)]);
        idx.set_slide(0x10_0000);
        assert_eq!(idx.find(0x10_1002), Some(0));
        assert_eq!(idx.resume_addr(0), 0x10_1005);
        let stubs: Box<[u64]> = vec![0xffff_ffff_ff9f_0000, 0xffff_ffff_ff9f_0040].into();
        assert!(idx.set_stubs(stubs.clone()));
        // Once stubs are set, a trap comes from a stub, at its `out` or
        // just past it; the site itself no longer traps.
        assert_eq!(idx.find(0xffff_ffff_ff9f_0040), Some(1));
        assert_eq!(idx.find(0xffff_ffff_ff9f_0002), Some(0));
        assert_eq!(idx.find(0x10_1002), None);
        assert_eq!(idx.resume_addr(1), 0xffff_ffff_ff9f_0045);
        assert_eq!(
            idx.running_addr(1),
            0x10_2000,
            "the site stays the function's"
        );
        assert!(idx.set_stubs(stubs), "the same stubs again");
        assert!(
            !idx.set_stubs(vec![0, 64].into()),
            "other stubs are refused"
        );
    }
}
