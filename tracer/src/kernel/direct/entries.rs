//! Which symbols are function entries: code the kernel enters with a
//! `call` (or a tail call's `jmp`), so that `[rsp]` there is a return
//! address and the registers follow the C calling convention. Only those
//! get a direct entry: `--graph` takes `[rsp]` for the return address, and
//! a label in the middle of code (an assembly label such as
//! `ret_from_fork`, a `.cold` fragment its function jumps to) has none.
//!
//! The evidence, found once per image (docs/direct.md, "Which symbols are
//! entries"):
//! - some `call rel32` in the image's code targets the address
//!   (`crate::kernel::calls`): sound for any symbol;
//! - an ftrace site at its start (or after ENDBR64): the compiler puts
//!   `call __fentry__` only at a C function's entry (`-mfentry`);
//! - a typed function symbol (STT_FUNC) of an ELF vmlinux: C functions and
//!   assembly `SYM_FUNC_START` ones, which objtool checks follow the C
//!   ABI; assembly `SYM_CODE_START` and inner labels are untyped;
//! - from kallsyms (no types), an objtool `__pfx_NAME` symbol right
//!   before it: objtool makes one only for STT_FUNC symbols
//!   (tools/objtool/check.c, `add_prefix_symbols`).
//!
//! An ENDBR64 alone is no evidence: assembly puts it at jump-table targets
//! (the `crc_N` labels of arch/x86/crypto/crc32c-pcl-intel-asm_64.S),
//! inner labels (`vmx_vmexit`) and interrupt entries too.
//!
//! Whatever the evidence, GCC's `.cold` fragments and the `__pfx_` /
//! `__cfi_` preambles (objtool's and clang's, before a function) are no
//! entries.

pub use crate::kernel::not_entry::{Entries, NotEntry};
use crate::kernel::symbols::KernelImage;

/// The verdict on every function of `image`.
pub fn entries_of(image: &KernelImage) -> Entries {
    let calls = crate::kernel::calls::call_targets(image);
    let mut ftrace = image.mcount_loc.clone();
    ftrace.sort_unstable();
    let has = |v: &[u64], a: u64| v.binary_search(&a).is_ok();
    let not = (0..image.functions.len())
        .map(|func| {
            let f = &image.functions[func];
            if let Some(why) = by_name(&f.name) {
                return Some(why);
            }
            let after_endbr = f.addr + ENDBR64_LEN;
            let proved = has(&calls, f.addr)
                || has(&ftrace, f.addr)
                || has(&ftrace, after_endbr)
                || match &image.typed {
                    Some(typed) => typed[func],
                    None => has_prefix_symbol(image, func),
                };
            match (proved, image.typed.is_some()) {
                (true, _) => None,
                (false, true) => Some(NotEntry::Untyped),
                (false, false) => Some(NotEntry::Unproved),
            }
        })
        .collect();
    Entries { not }
}

/// Bytes of ENDBR64, which a function's ftrace site follows under IBT.
const ENDBR64_LEN: u64 = crate::kernel::sites::ENDBR64.len() as u64;

/// objtool's prefix symbols (`__pfx_`, CONFIG_CALL_PADDING) and clang's
/// kCFI type-hash preambles (`__cfi_`, CONFIG_CFI_CLANG).
const PREAMBLES: [&str; 2] = ["__pfx_", "__cfi_"];

/// What a name alone says: a `.cold` fragment (`foo.cold`,
/// `foo.part.0.cold`, `foo.cold.12`) or a preamble.
fn by_name(name: &str) -> Option<NotEntry> {
    if PREAMBLES.iter().any(|p| name.starts_with(p)) {
        return Some(NotEntry::Preamble);
    }
    let mut parts = name.split('.').skip(1);
    parts.any(|p| p == "cold").then_some(NotEntry::Cold)
}

/// Whether the function before `func` is its objtool prefix: named
/// `__pfx_` and one of `func`'s names, ending where `func` starts.
fn has_prefix_symbol(image: &KernelImage, func: usize) -> bool {
    let Some(prev) = func.checked_sub(1) else {
        return false;
    };
    let p = &image.functions[prev];
    let f = &image.functions[func];
    if p.addr + p.size != f.addr {
        return false;
    }
    image.names(prev).any(|pn| {
        pn.strip_prefix(PREAMBLES[0])
            .is_some_and(|rest| image.names(func).any(|n| n == rest))
    })
}

impl KernelImage {
    /// Why function `func` is no function entry (None: it is one), decided
    /// once for every function on first use.
    pub fn not_entry(&self, func: usize) -> Option<NotEntry> {
        self.entries
            .get_or_init(|| entries_of(self))
            .not_entry(func)
    }

    /// The bytes direct-entry analysis reads as function `func`: its own,
    /// and from kallsyms (where a size runs to the next symbol) those of
    /// the symbols right after it that are no entries (inner labels,
    /// preambles), so that a branch from past an inner label is seen.
    pub fn entry_extent(&self, func: usize) -> u64 {
        let f = &self.functions[func];
        if self.typed.is_some() {
            return f.size;
        }
        let mut end = f.addr + f.size;
        for (next, g) in self.functions.iter().enumerate().skip(func + 1) {
            // Contiguous (no other symbol between), no entry, and not
            // another function's cold code.
            let inner = matches!(
                self.not_entry(next),
                Some(NotEntry::Preamble | NotEntry::Unproved)
            );
            if g.addr != end || g.size == 0 || !inner {
                break;
            }
            end = g.addr + g.size;
        }
        end - f.addr
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_are_no_entries() {
        for cold in ["foo.cold", "foo.part.0.cold", "foo.cold.12"] {
            assert_eq!(by_name(cold), Some(NotEntry::Cold), "{cold}");
        }
        for pre in ["__pfx_schedule", "__cfi_schedule"] {
            assert_eq!(by_name(pre), Some(NotEntry::Preamble), "{pre}");
        }
        for entry in [
            "schedule",
            "foo.part.0",
            "foo.isra.0",
            "coldplug",
            "x.colder",
        ] {
            assert_eq!(by_name(entry), None, "{entry}");
        }
    }
}
