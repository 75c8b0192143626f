//! A running guest's loaded modules (`crate::kernel::modules`) added to its
//! kernel image, so that everything that works on the image's functions
//! and sites (selection, the site table, patching, reports) works on
//! theirs too. A module's function is named `function [module]`, as
//! ftrace's `available_filter_functions` lists it, with its bare name as
//! an alias (a plain glob selects it). Its text becomes a section of the
//! image's "file", with the bytes read from the guest: the site table
//! checks its sites' bytes as it checks the kernel's.
//!
//! The image works in link addresses; a module has none. Its addresses
//! are stored `slide` below the running ones (KASLR's virtual offset), so
//! that the session's one slide gives them back. Modules load above the
//! kernel's image (`MODULES_VADDR` is past its 1 GiB mapping), so their
//! functions sort after the kernel's and its indices do not move.

use std::sync::Arc;

use crate::kernel::image_module::{ImageModule, ModuleLayout};
use crate::kernel::kaslr::KernelOffset;
use crate::kernel::modules::LoadedModule;
use crate::kernel::symbols::{FileSection, KernelImage, Symbol};

/// `function [module]`: a module function's name in reports and lists.
pub fn module_function_name(function: &str, module: &str) -> String {
    format!("{function} [{module}]")
}

impl KernelImage {
    /// Add `modules` (each with its text's bytes as read from the guest)
    /// to the image, the kernel running at `offset` (KASLR). A module below the image's end (never, on x86-64 Linux)
    /// or whose bytes do not cover its text is left out. Returns how many
    /// functions were added.
    pub fn add_modules(
        &mut self,
        modules: &[(LoadedModule, Vec<u8>)],
        layout: ModuleLayout,
        offset: KernelOffset,
    ) -> usize {
        let slide = offset.virt;
        let mut order: Vec<&(LoadedModule, Vec<u8>)> = modules.iter().collect();
        order.sort_by_key(|(m, _)| m.text.start);
        let mut added = 0;
        for (m, text) in order {
            let link = |a: u64| a.wrapping_sub(slide as u64);
            let start = link(m.text.start);
            let above = |end: u64| start >= end;
            let image_end = self.sections.last().map_or(0, |s| s.vaddr + s.size);
            let funcs_end = self.functions.last().map_or(0, |f| f.addr + f.size);
            if !above(image_end)
                || !above(funcs_end)
                || text.len() as u64 != m.text.end - m.text.start
            {
                continue;
            }
            let bytes = Arc::make_mut(&mut self.bytes);
            self.sections.push(FileSection {
                vaddr: start,
                size: text.len() as u64,
                offset: bytes.len(),
            });
            bytes.extend_from_slice(text);
            added += self.add_functions(m, slide);
            self.mcount_loc.extend(m.sites.iter().map(|&s| link(s)));
            self.modules.push(ImageModule {
                name: m.name.clone(),
                addr: m.addr,
                text: m.text.clone(),
                virt: offset.virt,
                phys: offset.phys,
                layout,
                orc: Vec::new(),
                btf: None,
                dwarf: Default::default(),
                tables: m.tables.clone(),
            });
        }
        added
    }

    /// `m`'s functions, one per address (its other names aliases), at
    /// link addresses.
    fn add_functions(&mut self, m: &LoadedModule, slide: i64) -> usize {
        let mut added = 0;
        let mut i = 0;
        while i < m.functions.len() {
            let at = m.functions[i].addr;
            let same = m.functions[i..].iter().take_while(|f| f.addr == at).count();
            let mut names: Vec<&str> = m.functions[i..i + same]
                .iter()
                .map(|f| f.name.as_str())
                .collect();
            // `init_module`/`cleanup_module` alias the module's own names.
            names.sort_by_key(|n| (n.ends_with("_module"), *n));
            let size = m.functions[i..i + same].iter().map(|f| f.size).max();
            let index = self.functions.len();
            self.functions.push(Symbol {
                name: module_function_name(names[0], &m.name),
                addr: at.wrapping_sub(slide as u64),
                size: size.unwrap_or(0),
            });
            let mut aliases: Vec<String> = names.iter().map(|n| n.to_string()).collect();
            aliases.extend(names[1..].iter().map(|n| module_function_name(n, &m.name)));
            aliases.sort();
            self.aliases.extend(aliases.into_iter().map(|n| (index, n)));
            if let Some(typed) = self.typed.as_mut() {
                typed.push(true);
            }
            added += 1;
            i += same;
        }
        added
    }

    /// The ORC entries of the module whose `struct module` is at `addr`
    /// (`--stack` unwinds through its functions with them).
    pub fn set_module_orc(&mut self, addr: u64, orc: crate::kernel::module_orc::ModuleOrc) {
        if let Some(m) = self.modules.iter_mut().find(|m| m.addr == addr) {
            m.orc = orc;
        }
    }

    /// The `.BTF` of the module whose `struct module` is at `addr`.
    pub fn set_module_btf(&mut self, addr: u64, btf: Vec<u8>) {
        if let Some(m) = self.modules.iter_mut().find(|m| m.addr == addr) {
            m.btf = Some(btf.into());
        }
    }

    /// The prototypes of the functions of the module whose `struct
    /// module` is at `addr`, from its file's DWARF.
    pub fn set_module_prototypes(
        &mut self,
        addr: u64,
        prototypes: std::collections::HashMap<String, crate::kernel::prototype::Prototype>,
    ) {
        if let Some(m) = self.modules.iter_mut().find(|m| m.addr == addr) {
            m.dwarf = prototypes.into();
        }
    }

    /// The module whose text holds running address `addr`, if one does.
    pub fn module_at(&self, addr: u64) -> Option<&ImageModule> {
        self.modules.iter().find(|m| m.text.contains(&addr))
    }
}
