//! Whether a kernel symbol is a function entry, as decided once per image
//! (`crate::kernel::direct::entries` decides; `KernelImage` keeps it): the
//! verdicts alone, so that the image can hold them without depending on
//! the analysis.

use std::fmt;

/// Why a symbol is no function entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotEntry {
    /// GCC's `foo.cold` (or `foo.cold.N`): the unlikely part of `foo`,
    /// reached by jumps from it.
    Cold,
    /// A `__pfx_` or `__cfi_` preamble: padding or a type hash before a
    /// function, never run as one.
    Preamble,
    /// An ELF vmlinux's untyped symbol (an assembly label) no call targets.
    Untyped,
    /// A kallsyms symbol no call targets, without an ftrace site or a
    /// `__pfx_` symbol.
    Unproved,
}

impl fmt::Display for NotEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NotEntry::Cold => "a `.cold` fragment, which its function jumps to",
            NotEntry::Preamble => "a preamble before a function (`__pfx_`, `__cfi_`)",
            NotEntry::Untyped => "an untyped assembly label that no call targets",
            NotEntry::Unproved => {
                "no call targets it, and it has no ftrace site or `__pfx_` symbol \
                 (kallsyms has no symbol types)"
            }
        })
    }
}

/// Each function's verdict, found once per image (`KernelImage::entries`).
#[derive(Debug, Default)]
pub struct Entries {
    /// By function index: None for an entry.
    pub(crate) not: Vec<Option<NotEntry>>,
}

impl Entries {
    /// Why function `func` is no entry (None: it is one).
    pub fn not_entry(&self, func: usize) -> Option<NotEntry> {
        self.not.get(func).copied().flatten()
    }
}
