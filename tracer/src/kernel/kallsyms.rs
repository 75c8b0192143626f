//! The kernel's own symbol table, kallsyms, found and decoded in a kernel
//! image that has no ELF symbol table (a bzImage's payload).
//!
//! scripts/kallsyms.c emits its tables into `.rodata`, each label 8-byte
//! aligned (`ALGN`), in one of two orders:
//!
//! - before Linux 6.4: `offsets` (one `i32` per symbol), `relative_base`
//!   (`u64`), `num_syms` (`u32`), `names`, `markers`, [`seqs_of_names`, from
//!   6.2 and in backports such as Debian's 6.1], `token_table`, `token_index`;
//! - from 6.4: `num_syms`, `names`, `markers`, `token_table`, `token_index`,
//!   `offsets`, `relative_base`, `seqs_of_names`.
//!
//! `names` holds each symbol as a length (ULEB128, one or two bytes since 6.1)
//! and that many token numbers; `token_table` holds the 256 tokens as
//! NUL-terminated strings and `token_index` their offsets in it (`u16`). The
//! first character of a decoded name is its `nm` type. Addresses are
//! `relative_base` plus the offset, or, with `CONFIG_KALLSYMS_ABSOLUTE_PERCPU`
//! (x86-64 SMP), `relative_base - 1 - offset` for negative offsets and the
//! offset itself for the (per-CPU) non-negative ones.
//!
//! Finding the tables works as other kallsyms readers (vmlinux-to-elf,
//! pwndbg) do it, anchored on what the format guarantees: every character
//! that occurs in some name stays a token of its own, at its own index, so
//! the tokens for '0'..'9' are the consecutive strings "0", "1", ... "9".
//! That string, checked against the `token_index` that must follow the token
//! table, fixes the token table; `num_syms` is then the position before it
//! from which exactly `num_syms` names decode and end where the markers
//! (checked one by one) and the token table begin.

use std::ops::Range;

/// How many tokens there are: one per byte value.
const TOKENS: usize = 256;
/// The names are indexed every this many symbols (`markers`).
const MARKER_EVERY: usize = 256;
/// kallsyms tables are 8-byte aligned (`ALGN` on 64-bit).
const ALIGN: u64 = 8;
/// The tokens "0" to "9", which every kernel's token table holds in a row.
const DIGIT_TOKENS: &[u8; 20] = b"0\x001\x002\x003\x004\x005\x006\x007\x008\x009\x00";
/// More symbols than any kernel has (a distribution kernel has ~200,000).
const MAX_SYMBOLS: u32 = 1 << 24;
/// Lowest x86-64 kernel address: `relative_base` must be at or above it.
const KERNEL_SPACE: u64 = 0xffff_8000_0000_0000;

/// Why kallsyms could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KallsymsError {
    #[error("no kallsyms token table (the kernel was built without CONFIG_KALLSYMS)")]
    NoTokenTable,
    #[error("a kallsyms token table at {0:#x} but no kallsyms_num_syms/kallsyms_names before it")]
    NoNames(u64),
    #[error(
        "kallsyms names at {names:#x} but no kallsyms_offsets/kallsyms_relative_base that fit them"
    )]
    NoOffsets { names: u64 },
}

/// The kallsyms layout found, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Offsets first (before Linux 6.4); `seqs`: with `seqs_of_names`
    /// between the markers and the tokens (6.2-6.3, and backports).
    OffsetsFirst { seqs: bool },
    /// Offsets after the token index (Linux 6.4 and later).
    OffsetsAfterTokens,
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Layout::OffsetsFirst { seqs: false } => "pre-6.2",
            Layout::OffsetsFirst { seqs: true } => "pre-6.4 with seqs_of_names",
            Layout::OffsetsAfterTokens => "6.4+",
        })
    }
}

/// One kallsyms entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KallsymsEntry {
    pub name: String,
    pub addr: u64,
    /// Its `nm` type: `T`/`t` text, `W`/`w` weak, `D`/`d` data, ...
    pub kind: u8,
}

impl KallsymsEntry {
    /// Code: `T`, `t`, `W`, `w`.
    pub fn is_text(&self) -> bool {
        matches!(self.kind, b'T' | b't' | b'W' | b'w')
    }

    /// Upper-case types are global.
    pub fn is_global(&self) -> bool {
        self.kind.is_ascii_uppercase()
    }
}

/// A kernel's kallsyms, in its own order (by address).
#[derive(Debug, Clone)]
pub struct Kallsyms {
    pub entries: Vec<KallsymsEntry>,
    pub layout: Layout,
    /// Virtual addresses of `kallsyms_token_table` and `kallsyms_num_syms`.
    pub token_table: u64,
    pub num_syms: u64,
}

/// A region of the image: its bytes and the virtual address of the first.
#[derive(Clone, Copy)]
struct Region<'a> {
    data: &'a [u8],
    vaddr: u64,
}

impl Region<'_> {
    fn u16(&self, at: usize) -> Option<u16> {
        let b = self.data.get(at..at.checked_add(2)?)?;
        Some(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&self, at: usize) -> Option<u32> {
        let b = self.data.get(at..at.checked_add(4)?)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&self, at: usize) -> Option<u64> {
        let b = self.data.get(at..at.checked_add(8)?)?;
        let mut w = [0u8; 8];
        w.copy_from_slice(b);
        Some(u64::from_le_bytes(w))
    }
    /// The offset of the next `ALIGN`ed virtual address at or after `at`.
    fn align(&self, at: usize) -> usize {
        let va = self.vaddr.wrapping_add(at as u64);
        at + (va.wrapping_neg() % ALIGN) as usize
    }
    fn aligned(&self, at: usize) -> bool {
        self.vaddr.wrapping_add(at as u64).is_multiple_of(ALIGN)
    }
}

/// The token table and index found in a region.
struct Tokens {
    table: usize,
    index: usize,
    /// Each token's bytes, by number.
    tokens: Vec<Range<usize>>,
}

/// Find and decode kallsyms in `data`, the contents of a section (normally
/// `.rodata`) that starts at virtual address `vaddr`.
pub fn find(data: &[u8], vaddr: u64) -> Result<Kallsyms, KallsymsError> {
    let region = Region { data, vaddr };
    let mut found_tokens = None;
    for tokens in digit_runs(data).filter_map(|at| token_table_at(region, at)) {
        let t = tokens.table as u64 + vaddr;
        found_tokens = Some(t);
        if let Some(names) = names_before(region, &tokens) {
            return decode(region, &tokens, names);
        }
    }
    match found_tokens {
        Some(t) => Err(KallsymsError::NoNames(t)),
        None => Err(KallsymsError::NoTokenTable),
    }
}

/// Offsets of every "0\0...9\0" in `data` that follows a NUL (a token
/// string's start).
fn digit_runs(data: &[u8]) -> impl Iterator<Item = usize> + '_ {
    let first = DIGIT_TOKENS[0];
    data.iter()
        .enumerate()
        .filter(move |&(i, &b)| {
            b == first && i > 0 && data[i - 1] == 0 && data[i..].starts_with(DIGIT_TOKENS)
        })
        .map(|(i, _)| i)
}

/// The token table whose token '0' is at `zero`, if the 256-entry
/// `token_index` that must follow it confirms every token's place.
fn token_table_at(r: Region, zero: usize) -> Option<Tokens> {
    // Walk forward over tokens '0'..=255 to the table's end.
    let mut end = zero;
    for _ in usize::from(b'0')..TOKENS {
        let len = r.data.get(end..)?.iter().position(|&b| b == 0)?;
        if len == 0 {
            return None;
        }
        end += len + 1;
    }
    let index = r.align(end);
    // token_index['0'] is '0''s offset in the table: the table's start.
    let table = zero.checked_sub(usize::from(r.u16(index + 2 * usize::from(b'0'))?))?;
    if !r.aligned(table) || r.u16(index)? != 0 {
        return None;
    }
    let mut tokens = Vec::with_capacity(TOKENS);
    let mut at = table;
    for i in 0..TOKENS {
        if usize::from(r.u16(index + 2 * i)?) != at - table {
            return None;
        }
        let len = r.data.get(at..end)?.iter().position(|&b| b == 0)?;
        if len == 0 {
            return None;
        }
        tokens.push(at..at + len);
        at += len + 1;
    }
    (at == end).then_some(Tokens {
        table,
        index,
        tokens,
    })
}

/// Where `kallsyms_num_syms` and the names are.
struct Names {
    num_syms: usize,
    count: usize,
    /// Each name's token bytes.
    names: Vec<Range<usize>>,
    seqs: bool,
}

/// Search back from the token table for `num_syms`: the position from which
/// exactly that many names decode, followed (aligned) by markers that agree
/// with them, then the token table (6.4+, and before 6.2) or `seqs_of_names`
/// and then the token table (6.2-6.3).
fn names_before(r: Region, tokens: &Tokens) -> Option<Names> {
    let mut p = tokens.table.checked_sub(ALIGN as usize)?;
    while !r.aligned(p) {
        p = p.checked_sub(1)?;
    }
    loop {
        if let Some(n) = names_at(r, p, tokens.table) {
            return Some(n);
        }
        p = p.checked_sub(ALIGN as usize)?;
    }
}

/// The names, if `num_syms` is at `p` (see `names_before`).
fn names_at(r: Region, p: usize, table: usize) -> Option<Names> {
    let count = r.u32(p)?;
    // Padding after the `.long`; each name takes at least 2 bytes.
    if count == 0 || count > MAX_SYMBOLS || r.u32(p + 4)? != 0 {
        return None;
    }
    let count = count as usize;
    let start = p + 8;
    if count.checked_mul(2)? > table.checked_sub(start)? {
        return None;
    }
    let mut names = Vec::with_capacity(count);
    let mut at = start;
    let mut markers = Vec::with_capacity(count.div_ceil(MARKER_EVERY));
    for i in 0..count {
        if i % MARKER_EVERY == 0 {
            markers.push(at - start);
        }
        let b0 = *r.data.get(at)?;
        let (len, head) = if b0 & 0x80 == 0 {
            (usize::from(b0), 1)
        } else {
            let b1 = *r.data.get(at + 1)?;
            (usize::from(b0 & 0x7f) | usize::from(b1) << 7, 2)
        };
        if len == 0 || at + head + len > table {
            return None;
        }
        names.push(at + head..at + head + len);
        at += head + len;
    }
    let m = r.align(at);
    for (k, &off) in markers.iter().enumerate() {
        if r.u32(m + 4 * k)? as usize != off {
            return None;
        }
    }
    let markers_end = m + 4 * markers.len();
    let seqs = if r.align(markers_end) == table {
        false
    } else if r.align(r.align(markers_end) + 3 * count) == table {
        true
    } else {
        return None;
    };
    Some(Names {
        num_syms: p,
        count,
        names,
        seqs,
    })
}

/// Decode the names and find the offsets that go with them.
fn decode(r: Region, tokens: &Tokens, n: Names) -> Result<Kallsyms, KallsymsError> {
    let names: Vec<Vec<u8>> = n
        .names
        .iter()
        .map(|range| {
            let mut s = Vec::new();
            for &t in &r.data[range.clone()] {
                s.extend_from_slice(&r.data[tokens.tokens[usize::from(t)].clone()]);
            }
            s
        })
        .collect();
    let no_offsets = KallsymsError::NoOffsets {
        names: r.vaddr + n.num_syms as u64 + 8,
    };
    // 6.4+: offsets right after the token index; relative_base after them.
    let after = r.align(tokens.index + 2 * TOKENS);
    // Before 6.4: relative_base right before num_syms, offsets before it.
    let before = n
        .num_syms
        .checked_sub(8 + (4 * n.count).next_multiple_of(ALIGN as usize));
    let candidates = [
        (Some(after), Layout::OffsetsAfterTokens),
        (before, Layout::OffsetsFirst { seqs: n.seqs }),
    ];
    for (offsets, layout) in candidates {
        // 6.4+ never has seqs between markers and tokens.
        if layout == Layout::OffsetsAfterTokens && n.seqs {
            continue;
        }
        let Some(offsets) = offsets.filter(|&o| r.aligned(o)) else {
            continue;
        };
        let base_at = r.align(offsets + 4 * n.count);
        let Some(addrs) = addresses(r, offsets, base_at, n.count) else {
            continue;
        };
        let entries = names
            .iter()
            .zip(addrs)
            .filter_map(|(name, addr)| {
                let (&kind, rest) = name.split_first()?;
                Some(KallsymsEntry {
                    name: String::from_utf8_lossy(rest).into_owned(),
                    addr,
                    kind,
                })
            })
            .collect();
        return Ok(Kallsyms {
            entries,
            layout,
            token_table: r.vaddr + tokens.table as u64,
            num_syms: r.vaddr + n.num_syms as u64,
        });
    }
    Err(no_offsets)
}

/// The symbols' addresses from `count` offsets at `offsets` and the
/// `relative_base` at `base_at`, if they are what kallsyms writes: a kernel
/// address as base, and addresses in ascending order (scripts/kallsyms.c
/// sorts by address).
fn addresses(r: Region, offsets: usize, base_at: usize, count: usize) -> Option<Vec<u64>> {
    let base = r.u64(base_at)?;
    if base < KERNEL_SPACE {
        return None;
    }
    let raw: Vec<i32> = (0..count)
        .map(|i| r.u32(offsets + 4 * i).map(|v| v as i32))
        .collect::<Option<_>>()?;
    // With absolute per-CPU symbols every relative offset is negative;
    // without, none is.
    let absolute_percpu = raw.iter().any(|&o| o < 0);
    let addrs: Vec<u64> = raw
        .iter()
        .map(|&o| match (absolute_percpu, o >= 0) {
            (true, true) => o as u64,
            (true, false) => base.wrapping_sub(1).wrapping_sub(o as i64 as u64),
            (false, _) => base.wrapping_add(u64::from(o as u32)),
        })
        .collect();
    addrs.windows(2).all(|w| w[0] <= w[1]).then_some(addrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Arbitrary bytes, with a token-table-like run planted in them, are
        /// an error or a table: never a panic.
        #[test]
        fn arbitrary_data_never_panics(
            data in proptest::collection::vec(proptest::num::u8::ANY, 0..4096),
            at in 0usize..4096,
        ) {
            let mut d = data;
            let at = at.min(d.len());
            d.splice(at..at, DIGIT_TOKENS.iter().copied());
            let _ = find(&d, 0xffff_ffff_8140_0000);
            // Section addresses that are not 8-byte aligned too.
            let _ = find(&d, 0xffff_ffff_8140_0003);
        }
    }
}
