//! A running guest's module whose functions a kernel image holds
//! (`crate::kernel::module_image` adds them): what the attach checks is
//! still loaded where it was read, and how to walk the module list
//! (`crate::kernel::modules` reads it).

use std::ops::Range;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageModule {
    pub name: String,
    /// Its `struct module`'s running address.
    pub addr: u64,
    /// Its text's running addresses.
    pub text: Range<u64>,
    /// The kernel's virtual and physical KASLR offsets when it was read
    /// (its functions' link addresses in the image are `virt` below their
    /// running ones).
    pub virt: i64,
    pub phys: i64,
    /// How the module list was walked (to walk it again).
    pub layout: ModuleLayout,
    /// Its ORC entries in its text, at running addresses
    /// (`crate::kernel::module_orc`); empty when not read.
    pub orc: crate::kernel::module_orc::ModuleOrc,
    /// Its own `.BTF` (split on the kernel's), for its functions'
    /// prototypes (`crate::kernel::module_btf`); None when not read.
    pub btf: Option<std::sync::Arc<[u8]>>,
    /// Its functions' prototypes from its file's DWARF (`--modules DIR`,
    /// `crate::kernel::ko_file`), for a module without BTF; empty: none.
    pub dwarf:
        std::sync::Arc<std::collections::HashMap<String, crate::kernel::prototype::Prototype>>,
    /// Its exception table, jump labels and static call sites, at
    /// running addresses: what its direct entries leave alone.
    pub tables: crate::kernel::module_tables::ModuleTables,
}

/// Where a module's text is described, by kernel version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TextAt {
    /// Linux 6.4+: `mem[MOD_TEXT]`, a `struct module_memory` (`base`,
    /// `size`): `at` the element's offset in `struct module`.
    Memory { at: u32, base: u32, size: u32 },
    /// Before: `core_layout` (`base`, and `text_size` of its `size`).
    Layout { at: u32, base: u32, text_size: u32 },
}

/// Offsets into `struct module` and its parts, from the kernel's BTF.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModuleLayout {
    /// `modules`' link address.
    pub head: u64,
    pub(crate) state: u32,
    pub(crate) list: u32,
    pub(crate) name: u32,
    pub(crate) text: TextAt,
    pub(crate) kallsyms: u32,
    pub(crate) symtab: u32,
    pub(crate) num_symtab: u32,
    pub(crate) strtab: u32,
    pub(crate) ftrace_callsites: u32,
    pub(crate) num_ftrace_callsites: u32,
    /// `trace_events` and `num_trace_events`: its events' `struct
    /// trace_event_call *` array (None: a kernel without event tracing).
    pub(crate) trace_events: Option<(u32, u32)>,
    /// Where its ORC tables are described (None: the kernel keeps none
    /// for modules): read at a first load, for `--stack`.
    pub orc: Option<ModuleOrcLayout>,
    /// Where its exception table, jump labels and static call sites are.
    pub tables: crate::kernel::module_tables::ModuleTablesLayout,
}

/// Where a module's ORC tables are described in `struct module`, from the
/// kernel's BTF (`crate::kernel::module_orc` finds and reads them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModuleOrcLayout {
    pub(crate) num_orcs: u32,
    pub(crate) orc_unwind_ip: u32,
    pub(crate) orc_unwind: u32,
}

#[cfg(test)]
impl ModuleLayout {
    /// A layout for tests that never walk a guest's modules.
    pub(crate) fn unused() -> ModuleLayout {
        ModuleLayout {
            head: 0,
            state: 0,
            list: 0,
            name: 0,
            text: TextAt::Memory {
                at: 0,
                base: 0,
                size: 8,
            },
            kallsyms: 0,
            symtab: 0,
            num_symtab: 0,
            strtab: 0,
            ftrace_callsites: 0,
            num_ftrace_callsites: 0,
            trace_events: None,
            orc: None,
            tables: Default::default(),
        }
    }
}
