//! The kernel text the running kernel no longer holds as the file does,
//! because the kernel rewrote it itself: at boot its alternatives, paravirt
//! sites, retpoline and return-thunk sites (ITS included), call-depth call
//! sites, CFI preambles and sealed `endbr64`s, and its LOCK prefixes on one
//! CPU; later its jump labels, static calls and their trampolines
//! (`direct::tables` reads the tables that list them). Comparing the
//! running text with the file (is this the kernel's very build?) skips
//! these bytes: a distribution kernel rewrites thousands of them, in nearly
//! every function.

use iced_x86::{Decoder, DecoderOptions};

use super::direct::tables::{KernelTable, SiteTables, TableError};
use super::symbols::KernelImage;

/// Link-address ranges the kernel may have rewritten, sorted and merged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BootPatched {
    ranges: Vec<(u64, u64)>,
}

/// The longest x86 instruction: what a site's instruction is decoded from.
const MAX_INSN: usize = 15;

impl BootPatched {
    /// Every site of the kernel's patch tables as the bytes it covers: an
    /// alternative its `instrlen`, a paravirt site its `len`, a CFI
    /// preamble or trampoline what the kernel rewrites of it, any other
    /// site its instruction (decoded from the file; a LOCK prefix's, the
    /// whole locked instruction). ftrace's own sites are not included
    /// (vmtrace checks those itself).
    pub fn read(image: &KernelImage) -> Result<BootPatched, TableError> {
        let tables = SiteTables::read_patch_sites(image)?;
        let mut ranges: Vec<(u64, u64)> = tables
            .sites()
            .iter()
            .filter(|s| s.2 != KernelTable::Ftrace && s.2 != KernelTable::ExTable)
            .map(|&(start, end, table)| match table {
                KernelTable::Alternative
                | KernelTable::Paravirt
                | KernelTable::CfiSite
                | KernelTable::StaticCallTramp => (start, end),
                _ => (start, start + insn_len(image, start)),
            })
            .collect();
        ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
        for (s, e) in ranges {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        Ok(BootPatched { ranges: merged })
    }

    /// From ranges already known (tests).
    pub fn from_ranges(mut ranges: Vec<(u64, u64)>) -> BootPatched {
        ranges.sort_unstable();
        BootPatched { ranges }
    }

    /// May the kernel have rewritten the byte at link address `addr`?
    pub fn covers(&self, addr: u64) -> bool {
        let i = self.ranges.partition_point(|r| r.0 <= addr);
        i > 0 && addr < self.ranges[i - 1].1
    }

    /// How many ranges.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

/// The length of the instruction at link address `addr` in the file (1 if
/// it cannot be decoded: the site's first byte at least).
fn insn_len(image: &KernelImage, addr: u64) -> u64 {
    let bytes = (1..=MAX_INSN)
        .rev()
        .find_map(|n| image.file_bytes(addr, n))
        .unwrap_or_default();
    let mut d = Decoder::with_ip(64, bytes, addr, DecoderOptions::NONE);
    match d.decode() {
        i if i.is_invalid() => 1,
        i => i.len() as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covers_the_bytes_of_each_range_only() {
        let b = BootPatched::from_ranges(vec![(0x20, 0x25), (0x10, 0x12)]);
        assert!(!b.covers(0x0f));
        assert!(b.covers(0x10) && b.covers(0x11));
        assert!(!b.covers(0x12));
        assert!(b.covers(0x24) && !b.covers(0x25));
    }
}
