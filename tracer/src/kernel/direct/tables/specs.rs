//! Where each table of the kernel's code sits and how its entries read,
//! in Linux 6.1 and 6.12 (each layout's `struct` named on it).

use super::KernelTable;

/// Where a table sits in vmlinux and how its entries read. Every table's
/// first field is an s32 relative to its own address; the layouts are
/// those of Linux 6.1 and 6.12 (see the `struct` named on each).
/// `.parainstructions`, whose entries hold absolute addresses, is read
/// apart (`paravirt`).
pub(super) struct Spec {
    pub(super) table: KernelTable,
    pub(super) section: &'static str,
    /// The linker script's bounds, when the table sits inside another
    /// output section (`__jump_table` and the static calls are in `.data`,
    /// where a bzImage's kallsyms has them only with `CONFIG_KALLSYMS_ALL`).
    pub(super) bounds: (&'static str, &'static str),
    /// Candidate entry sizes: `struct alt_instr` grew from 12 bytes (6.1)
    /// to 14 (6.3+: `ft_flags`); the right one is told by the entries.
    pub(super) sizes: &'static [usize],
    /// The table ends in zero entries, which the kernel skips: `.smp_locks`
    /// is padded to a page (vmlinux.lds.S; `alternatives_smp_lock` skips
    /// `!*poff`).
    pub(super) padded: bool,
    /// A function only a kernel with this table has: if the table is not
    /// found but it is there, the image does not say where the table is
    /// (`TableError::NotFound`), rather than having none.
    pub(super) evidence: Option<&'static str>,
}

pub(super) const SPECS: [Spec; 11] = [
    // struct exception_table_entry { int insn, fixup, data; }
    Spec {
        table: KernelTable::ExTable,
        section: "__ex_table",
        bounds: ("__start___ex_table", "__stop___ex_table"),
        sizes: &[12],
        padded: false,
        evidence: None,
    },
    // struct alt_instr { s32 instr_offset; s32 repl_offset; ...;
    //                    u8 instrlen; u8 replacementlen; } __packed
    Spec {
        table: KernelTable::Alternative,
        section: ".altinstructions",
        bounds: ("__alt_instructions", "__alt_instructions_end"),
        sizes: &[12, 14],
        padded: false,
        evidence: None,
    },
    // struct jump_entry { s32 code; s32 target; long key; }
    // (kernel/jump_label.c, built with CONFIG_JUMP_LABEL only, has
    // jump_label_init).
    Spec {
        table: KernelTable::JumpLabel,
        section: "__jump_table",
        bounds: ("__start___jump_table", "__stop___jump_table"),
        sizes: &[16],
        padded: false,
        evidence: Some("jump_label_init"),
    },
    // struct static_call_site { s32 addr; s32 key; }. Not found on a
    // bzImage without KALLSYMS_ALL: `targets` finds its sites as objtool
    // does, the calls and jumps to a `__SCT__` trampoline.
    Spec {
        table: KernelTable::StaticCall,
        section: ".static_call_sites",
        bounds: ("__start_static_call_sites", "__stop_static_call_sites"),
        sizes: &[8],
        padded: false,
        evidence: None,
    },
    // struct static_call_tramp_key { s32 tramp; s32 key; } (exported
    // trampolines; all of them are also `__SCT__` symbols).
    Spec {
        table: KernelTable::StaticCallTramp,
        section: ".static_call_tramp_key",
        bounds: (
            "__start_static_call_tramp_key",
            "__stop_static_call_tramp_key",
        ),
        sizes: &[8],
        padded: false,
        evidence: None,
    },
    // s32 each
    Spec {
        table: KernelTable::Retpoline,
        section: ".retpoline_sites",
        bounds: ("__retpoline_sites", "__retpoline_sites_end"),
        sizes: &[4],
        padded: false,
        evidence: None,
    },
    Spec {
        table: KernelTable::ReturnThunk,
        section: ".return_sites",
        bounds: ("__return_sites", "__return_sites_end"),
        sizes: &[4],
        padded: false,
        evidence: None,
    },
    Spec {
        table: KernelTable::CallDepth,
        section: ".call_sites",
        bounds: ("__call_sites", "__call_sites_end"),
        sizes: &[4],
        padded: false,
        evidence: None,
    },
    Spec {
        table: KernelTable::EndbrSeal,
        section: ".ibt_endbr_seal",
        bounds: ("__ibt_endbr_seal", "__ibt_endbr_seal_end"),
        sizes: &[4],
        padded: false,
        evidence: None,
    },
    // s32 each, a LOCK prefix (alternative.h LOCK_PREFIX_HERE).
    Spec {
        table: KernelTable::SmpLock,
        section: ".smp_locks",
        bounds: ("__smp_locks", "__smp_locks_end"),
        sizes: &[4],
        padded: true,
        evidence: None,
    },
    // s32 each, a `__cfi_` preamble (alternative.c cfi_rewrite_preamble).
    Spec {
        table: KernelTable::CfiSite,
        section: ".cfi_sites",
        bounds: ("__cfi_sites", "__cfi_sites_end"),
        sizes: &[4],
        padded: false,
        evidence: None,
    },
];

/// Bytes of a `__cfi_` preamble FineIBT rewrites (`fineibt_preamble_size`
/// in 6.12's arch/x86/kernel/alternative.c: the 16 bytes of padding
/// before the function).
pub(super) const CFI_PREAMBLE_LEN: u64 = 16;

/// Bytes of a static call trampoline `static_call_update` rewrites: the
/// jump (or `ret`) it starts with (arch/x86/kernel/static_call.c
/// `__static_call_transform`, a 5-byte `CALL_INSN_SIZE` poke).
pub(super) const TRAMP_PATCH_LEN: u64 = 5;

/// What names a static call trampoline (include/linux/static_call_types.h
/// `STATIC_CALL_TRAMP_PREFIX`).
pub const TRAMP_PREFIX: &str = "__SCT__";
