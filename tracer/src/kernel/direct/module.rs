//! Direct entries of a module the guest first loads during a trace
//! (issue 37): its functions proved safe, at its load, by the rules a
//! module found at the attach is judged by (docs/direct.md, "Kernel
//! modules"), on its own code and tables read from its `struct module`.
//!
//! A module found at the attach is added to the kernel's image
//! (`crate::kernel::module_image`) and analyzed with it. One that comes
//! later is analyzed alone, in an image of its own holding only its text
//! and functions (at their running addresses): what the kernel's image
//! would add is only what the kernel's own tables say of code outside the
//! module (`KernelLinks`: the retpoline thunks a module's jump may go to,
//! the static call trampolines its calls may go to). No branch of the
//! kernel's lands in a module's text (the kernel is linked before any
//! module is loaded); the module's own branches, exception fixups and
//! jump labels are decoded and read as the image's would be.

use super::{DirectSite, Refusal, SiteTables, TableError};
use crate::kernel::image_module::ModuleLayout;
use crate::kernel::kaslr::KernelOffset;
use crate::kernel::modules::LoadedModule;
use crate::kernel::symbols::KernelImage;

/// What the kernel's tables say of its own code that a module's direct
/// entries need, at the kernel's link addresses.
#[derive(Clone, Debug, Default)]
pub struct KernelLinks {
    /// The retpoline thunks (`SiteTables::indirect_thunks`).
    pub thunks: Vec<(u64, u64)>,
    /// The static call trampolines' addresses (`SiteTables::trampolines`).
    pub trampolines: Vec<u64>,
}

impl KernelLinks {
    /// What the kernel's `tables` say of its thunks and trampolines.
    pub fn of(tables: &SiteTables) -> KernelLinks {
        KernelLinks {
            thunks: tables.indirect_thunks.clone(),
            trampolines: tables.trampolines(),
        }
    }
}

/// One function of a module, with its direct entry or why it has none.
#[derive(Clone, Debug)]
pub struct ModuleEntry {
    /// `function [module]` first, then its other names (its bare name,
    /// the module's aliases at its address).
    pub names: Vec<String>,
    /// Running address and size.
    pub addr: u64,
    pub size: u64,
    /// Its direct entry, at running addresses.
    pub site: Result<DirectSite, Refusal>,
}

/// Every function of the module `read`, whose core text `text` was read
/// from the guest, with its direct entry or why it has none; `layout`: how
/// the guest's module list is walked, `kernel` the kernel's `KernelLinks`
/// with the kernel `slide` bytes above its link addresses (KASLR).
pub fn module_entries(
    read: &LoadedModule,
    text: &[u8],
    layout: ModuleLayout,
    kernel: &KernelLinks,
    slide: i64,
) -> Result<Vec<ModuleEntry>, TableError> {
    let mut image = KernelImage::empty(&format!("module {}", read.name));
    // At running addresses: no slide between the image and the guest.
    let at = KernelOffset { virt: 0, phys: 0 };
    image.add_modules(&[(read.clone(), text.to_vec())], layout, at);
    let run = |a: u64| a.wrapping_add(slide as u64);
    let thunks: Vec<(u64, u64)> = (kernel.thunks.iter())
        .map(|&(s, e)| (run(s), run(e)))
        .collect();
    let trampolines: Vec<u64> = kernel.trampolines.iter().map(|&a| run(a)).collect();
    let tables = SiteTables::read_module(&image, &thunks, &trampolines)?;
    let entries = (0..image.functions.len())
        .map(|func| {
            let f = &image.functions[func];
            let mut names = vec![f.name.clone()];
            names.extend(image.names(func).filter(|n| *n != f.name).map(String::from));
            ModuleEntry {
                names,
                addr: f.addr,
                size: f.size,
                site: DirectSite::analyze(&image, &tables, func),
            }
        })
        .collect();
    Ok(entries)
}

impl KernelImage {
    /// An image of no file and no code: a module's alone is added to it
    /// (`module_entries`); `what` names it in errors.
    pub(crate) fn empty(what: &str) -> KernelImage {
        KernelImage {
            path: what.into(),
            build_id: None,
            functions: Vec::new(),
            aliases: Vec::new(),
            mcount_loc: Vec::new(),
            init_text: None,
            text: None,
            source: what.to_string(),
            linux: true,
            typed: None,
            entries: Default::default(),
            symbols: Default::default(),
            sections: Vec::new(),
            bytes: Default::default(),
            modules: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::direct::KernelTable;
    use crate::kernel::module_tables::ModuleTables;
    use crate::kernel::modules::ModuleFunction;

    /// A module alone: four functions after their objtool `__pfx_`
    /// padding (what proves them entries from kallsyms), each `endbr64`
    /// then its code: an ftrace NOP (displaced alone), a frame-pointer
    /// prologue, the same with a jump label in its displaced bytes, and a
    /// jump to the kernel's retpoline thunk (given by `KernelLinks`, at a
    /// link address the slide moves): safe, safe, `jump-label`,
    /// `indirect-jump`; the padding is no entry.
    #[test]
    fn a_module_alone_is_judged_with_its_own_tables_and_the_kernels_thunks() {
        const TEXT: u64 = 0xffff_ffff_c000_2000;
        const SLIDE: i64 = 0x1e00_0000;
        const THUNK: u64 = 0xffff_ffff_8200_0000;
        let endbr = [0xf3, 0x0f, 0x1e, 0xfa];
        let nop5 = [0x0f, 0x1f, 0x44, 0x00, 0x00, 0xc3];
        let prologue = [0x55, 0x48, 0x89, 0xe5, 0x53, 0x5b, 0x5d, 0xc3];
        let (mut text, mut functions) = (Vec::new(), Vec::new());
        let names = ["m_ftrace", "m_plain", "m_jump", "m_thunk"];
        let mut starts = Vec::new();
        for name in names {
            let at = TEXT + text.len() as u64;
            text.extend([0x90; 16]);
            let start = at + 16;
            let mut code = endbr.to_vec();
            match name {
                "m_ftrace" => code.extend(nop5),
                "m_thunk" => {
                    // jmp THUNK (rel32), from the code's end.
                    let next = start + code.len() as u64 + 5;
                    let target = THUNK.wrapping_add(SLIDE as u64);
                    let rel = target.wrapping_sub(next) as i64 as i32;
                    code.push(0xe9);
                    code.extend(rel.to_le_bytes());
                }
                _ => code.extend(prologue),
            }
            text.extend(&code);
            functions.push(ModuleFunction {
                name: format!("__pfx_{name}"),
                addr: at,
                size: 16,
            });
            functions.push(ModuleFunction {
                name: name.into(),
                addr: start,
                size: code.len() as u64,
            });
            starts.push(start);
        }
        let m = LoadedModule {
            name: "m".into(),
            addr: 0xffff_ffff_c100_0000,
            text: TEXT..TEXT + text.len() as u64,
            functions,
            sites: vec![starts[0] + 4],
            events: Vec::new(),
            tables: ModuleTables {
                sites: vec![(starts[2] + 5, KernelTable::JumpLabel)],
                ..Default::default()
            },
        };
        let kernel = KernelLinks {
            thunks: vec![(THUNK, THUNK + 0x20)],
            trampolines: Vec::new(),
        };
        let layout = ModuleLayout::unused();
        let entries = module_entries(&m, &text, layout, &kernel, SLIDE).unwrap();
        let verdict = |name: &str| {
            let e = entries.iter().find(|e| e.names[0] == name).unwrap();
            e.site
                .as_ref()
                .map(|s| (s.addr, s.ftrace_nop))
                .map_err(|r| r.rule())
        };
        assert_eq!(verdict("m_ftrace [m]"), Ok((starts[0] + 4, true)));
        assert_eq!(verdict("m_plain [m]"), Ok((starts[1] + 4, false)));
        assert_eq!(verdict("m_jump [m]"), Err("jump-label"));
        assert_eq!(verdict("m_thunk [m]"), Err("indirect-jump"));
        assert_eq!(verdict("__pfx_m_plain [m]"), Err("not-entry"));
        let plain = entries.iter().find(|e| e.names[0] == "m_plain [m]");
        assert!(plain.unwrap().names.contains(&"m_plain".to_string()));
    }
}
