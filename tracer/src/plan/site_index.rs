//! The index of patchable sites: from a trap's RIP to its site and traced
//! function, in the running (possibly KASLR-moved) kernel.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::kernel::sites::SITE_LEN;
use crate::plan::added_sites::AddedSites;

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
    /// Sites added during the trace (a module first loaded), numbered
    /// after `addrs`; none unless reserved (`with_added`).
    added: AddedSites,
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
            added: AddedSites::default(),
        }
    }

    /// With `n` slots for sites added during the trace, their functions
    /// numbered from `first_func` (the plan's function count).
    pub fn with_added(mut self, n: usize, first_func: u32) -> Self {
        self.added = AddedSites::new(n, first_func);
        self
    }

    /// The sites added during the trace.
    pub fn added(&self) -> &AddedSites {
        &self.added
    }

    /// Sites, the plan's and the slots for those added: what per-site
    /// tables are sized by.
    pub fn capacity(&self) -> usize {
        self.addrs.len() + self.added.capacity()
    }

    /// Sites so far, the plan's and those added: per-site tables are
    /// read up to here.
    pub fn live(&self) -> usize {
        self.addrs.len() + self.added.used()
    }

    /// The traced function (index into the trace's functions) of site `i`.
    pub fn func(&self, i: usize) -> u32 {
        match i.checked_sub(self.addrs.len()) {
            None => self.funcs[i],
            Some(k) => self.added.func(k),
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
        if i >= self.addrs.len() {
            return self.running_addr(i) + SITE_LEN as u64;
        }
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

    /// Where site `i` is in the running kernel (an added site: 0 while
    /// its module is not loaded).
    pub fn running_addr(&self, i: usize) -> u64 {
        match i.checked_sub(self.addrs.len()) {
            None => self.addrs[i].wrapping_add(self.slide.load(Ordering::Relaxed)),
            Some(k) => self.added.addr(k),
        }
    }

    /// (address, function) of every site, in address order.
    pub fn sites(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.addrs.iter().copied().zip(self.funcs.iter().copied())
    }

    /// The site a trap at `rip` came from: RIP at the `out` (bare-metal KVM's
    /// fast PIO path) or just past it (KVM's emulator), at the site or, for
    /// direct entries, at its stub; or at a site added during the trace
    /// (numbered after the plan's). Sites (and stubs) are five bytes apart
    /// at least, so the two cannot both match.
    pub fn find(&self, rip: u64) -> Option<usize> {
        self.find_planned(rip).or_else(|| {
            // Only once a module came: one atomic load on a miss before.
            if self.added.used() == 0 {
                return None;
            }
            let k = self.added.find(rip);
            let k = k.or_else(|| self.added.find(rip.wrapping_sub(OUT_LEN)))?;
            Some(self.addrs.len() + k)
        })
    }

    fn find_planned(&self, rip: u64) -> Option<usize> {
        // Set before the sites were patched, under the pause that every
        // vCPU's next entry synchronizes with: Relaxed is enough.
        if let Some(stubs) = self.stubs.get() {
            return at_or_past(stubs, rip);
        }
        at_or_past(
            &self.addrs,
            rip.wrapping_sub(self.slide.load(Ordering::Relaxed)),
        )
    }
}

/// The entry of sorted `addrs` that is `rip` or `OUT_LEN` before it, by one
/// binary search (a trap's handler searched twice before): entries are
/// five bytes apart at least, so the greatest at or below `rip` is the
/// only candidate.
fn at_or_past(addrs: &[u64], rip: u64) -> Option<usize> {
    let k = addrs.partition_point(|&a| a <= rip).checked_sub(1)?;
    let a = addrs[k];
    (a == rip || a == rip.wrapping_sub(OUT_LEN)).then_some(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trap_is_found_at_its_site_or_just_past_the_out_and_nowhere_else() {
        let idx = SiteIndex::new(vec![(0x1000, 0), (0x1005, 1), (0x2000, 2)]);
        let found = |rip| idx.find(rip);
        assert_eq!(found(0x1000), Some(0));
        assert_eq!(found(0x1002), Some(0));
        assert_eq!(found(0x1005), Some(1));
        assert_eq!(found(0x1007), Some(1));
        assert_eq!(found(0x2002), Some(2));
        for rip in [
            0,
            1,
            0xfff,
            0x1001,
            0x1003,
            0x1006,
            0x1008,
            0x1fff,
            0x2001,
            0x2003,
            u64::MAX,
        ] {
            assert_eq!(found(rip), None, "{rip:#x}");
        }
    }

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

    #[test]
    fn sites_added_during_the_trace_follow_the_plans_with_functions_of_their_own() {
        let idx = SiteIndex::new(vec![(0x1000, 0), (0x2000, 1)]).with_added(2, 5);
        idx.set_slide(0x10_0000);
        assert_eq!(idx.capacity(), 4);
        let module = 0xffff_ffff_c000_0014;
        assert_eq!(idx.find(module), None, "nothing added yet");
        let sym = |name: &str, addr| crate::kernel::symbols::Symbol {
            name: name.into(),
            addr,
            size: 0x40,
        };
        assert_eq!(idx.live(), 2);
        assert_eq!(
            idx.added()
                .add(module, sym("vmt_hit [vmt_test]", module - 4)),
            Some(0)
        );
        assert_eq!(idx.live(), 3);
        // At the site or just past its `out`; running addresses, not slid.
        assert_eq!(idx.find(module), Some(2));
        assert_eq!(idx.find(module + OUT_LEN), Some(2));
        assert_eq!(idx.func(2), 5);
        assert_eq!(idx.func(1), 1, "the plan's sites keep theirs");
        assert_eq!(idx.running_addr(2), module);
        assert_eq!(idx.resume_addr(2), module + SITE_LEN as u64);
        assert_eq!(idx.find(0x10_2000), Some(1));
        // Unloaded, then loaded again elsewhere: the same slot.
        idx.added().set(0, 0);
        assert_eq!(idx.find(module), None);
        idx.added().set(0, module + 0x8000);
        assert_eq!(idx.find(module + 0x8000), Some(2));
        let other = 0xffff_ffff_c001_0000;
        assert_eq!(
            idx.added().add(other, sym("vmt_batch [vmt_test]", other)),
            Some(1)
        );
        assert_eq!(idx.func(3), 6);
        let third = 0xffff_ffff_c002_0000;
        assert_eq!(
            idx.added().add(third, sym("x [vmt_test]", third)),
            None,
            "full"
        );
        assert_eq!(idx.added().used(), 2);
        let names: Vec<String> = idx
            .added()
            .functions()
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(names, ["vmt_hit [vmt_test]", "vmt_batch [vmt_test]"]);
    }

    /// With direct entries (the own VMM's `--entry direct`), a module's
    /// function added during the trace still traps at its ftrace site:
    /// found there, resumed past it; the plan's sites in their stubs.
    #[test]
    fn sites_added_to_direct_entries_trap_at_their_ftrace_sites() {
        let idx = SiteIndex::new(vec![(0x1000, 0)]).with_added(1, 1);
        let stub = 0xffff_ffff_ff9f_0000;
        assert!(idx.set_stubs(vec![stub].into()));
        let module = 0xffff_ffff_c000_0014;
        let sym = crate::kernel::symbols::Symbol {
            name: "vmt_hit [vmt_test]".into(),
            addr: module - 4,
            size: 0x40,
        };
        assert_eq!(idx.added().add(module, sym), Some(0));
        assert_eq!(idx.find(module + OUT_LEN), Some(1));
        assert_eq!(idx.resume_addr(1), module + SITE_LEN as u64);
        assert_eq!(idx.find(stub), Some(0));
        assert_eq!(idx.resume_addr(0), stub + SITE_LEN as u64);
    }
}
