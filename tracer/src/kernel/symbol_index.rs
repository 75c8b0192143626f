//! Which function holds an address, in a few steps whatever the number of
//! functions: the store moves every event's caller to its link address
//! and marks its function (`session::store::Fixup`), millions of times a
//! second. A binary search of the ~60,000 functions of a kernel (16 steps,
//! each a cache miss in a table of names) took 40% of the store thread's
//! time (`perf record` on `vmtrace bench record/throughput`).
//!
//! The functions' addresses and sizes are kept apart from their names, in
//! address order, and a table of buckets (`1 << shift` bytes of address
//! each) says which functions start before each bucket: a lookup searches
//! only the few functions from its bucket's to the next's.

use super::symbols::Symbol;

/// The most buckets an index has (a `u32` each): 1 MiB of table, whatever
/// the span of the addresses (a kernel's text and its modules).
const MAX_BUCKETS: u64 = 1 << 18;
/// The smallest bucket: 4 KiB, a few functions of a kernel's text.
const MIN_SHIFT: u32 = 12;

/// The functions of a table sorted by address, indexed for
/// `function_index_at`'s answer.
#[derive(Debug, Default)]
pub struct SymbolIndex {
    /// Each function's address and size, as in the table.
    addrs: Vec<u64>,
    sizes: Vec<u64>,
    /// The first function's address, and the bucket size's log2.
    base: u64,
    shift: u32,
    /// `starts[b]`: how many functions start before bucket `b`; one more
    /// entry than buckets.
    starts: Vec<u32>,
}

impl SymbolIndex {
    /// The index of `functions`, sorted by address (as
    /// `function_index_at` needs them).
    pub fn new(functions: &[Symbol]) -> SymbolIndex {
        let addrs: Vec<u64> = functions.iter().map(|f| f.addr).collect();
        let sizes = functions.iter().map(|f| f.size).collect();
        let (Some(&base), Some(&last)) = (addrs.first(), addrs.last()) else {
            return SymbolIndex::default();
        };
        let span = last - base + 1;
        let mut shift = MIN_SHIFT;
        while span >> shift >= MAX_BUCKETS {
            shift += 1;
        }
        let buckets = (span >> shift) as usize + 1;
        let starts = (0..=buckets as u64)
            .map(|b| {
                let at = base.saturating_add(b << shift);
                addrs.partition_point(|&a| a < at) as u32
            })
            .collect();
        SymbolIndex {
            addrs,
            sizes,
            base,
            shift,
            starts,
        }
    }

    /// The function holding `addr`: `function_index_at(functions, addr)`.
    pub fn at(&self, addr: u64) -> Option<usize> {
        let rel = addr.checked_sub(self.base)?;
        let b = usize::try_from(rel >> self.shift).ok()?;
        // Past the last bucket: the last function, if it holds `addr`.
        let (lo, hi) = match self.starts.get(b + 1) {
            Some(&hi) => (self.starts[b] as usize, hi as usize),
            None => (self.addrs.len(), self.addrs.len()),
        };
        // The last function starting at or before `addr`: in this bucket,
        // or the last of an earlier one.
        let i = lo + self.addrs[lo..hi].partition_point(|&a| a <= addr);
        let i = i.checked_sub(1)?;
        let size = self.sizes[i];
        (size == 0 || addr - self.addrs[i] < size).then_some(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::symbols::function_index_at;

    /// `SymbolIndex::at` and `function_index_at` agree (the oracle).
    fn agrees(functions: &[Symbol], index: &SymbolIndex, addr: u64) -> bool {
        index.at(addr) == function_index_at(functions, addr)
    }

    fn sym(addr: u64, size: u64) -> Symbol {
        Symbol {
            name: format!("f{addr:x}"),
            addr,
            size,
        }
    }

    /// Every address near every function's edges, in a table with a gap
    /// of a gigabyte (text, then modules), sizeless symbols, and
    /// functions sharing an address, gives the binary search's answer.
    #[test]
    fn the_index_finds_what_the_binary_search_finds() {
        let text = 0xffff_ffff_8100_0000u64;
        let mut functions: Vec<Symbol> = (0..3000u64)
            .map(|i| sym(text + i * 0x1a0 + (i % 7) * 0x30, 0x100 + (i % 5) * 0x40))
            .collect();
        functions.push(sym(text + 3000 * 0x1a0 + 0x1000, 0));
        functions.push(sym(text + 3000 * 0x1a0 + 0x1000, 0x80));
        let modules = 0xffff_ffff_c000_0000u64;
        functions.extend((0..50u64).map(|i| sym(modules + i * 0x2000, 0x800)));
        functions.sort_by_key(|f| f.addr);
        let index = SymbolIndex::new(&functions);
        for f in &functions {
            for addr in [
                f.addr - 1,
                f.addr,
                f.addr + 1,
                f.addr + f.size,
                f.addr + 0x7ff,
            ] {
                assert!(agrees(&functions, &index, addr), "{addr:#x}");
            }
        }
        for addr in [0, text - 1, modules - 1, u64::MAX, modules + 50 * 0x2000] {
            assert!(agrees(&functions, &index, addr), "{addr:#x}");
        }
        assert_eq!(SymbolIndex::new(&[]).at(text), None);
    }
}
