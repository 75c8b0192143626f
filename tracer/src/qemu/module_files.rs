//! The loaded modules of a running guest (`crate::qemu::modules`)
//! completed from their own files given on the host (`--modules DIR`):
//! each module whose build id, read from the guest's memory, is a file's
//! takes from it what the memory lacks (`crate::kernel::ko_file`); a file
//! named as a loaded module but of another build is never used.

use std::collections::HashMap;

use super::modules::GuestModules;
use crate::kernel::ko_file::complete;
pub use crate::kernel::ko_file::FileUse;
use crate::kernel::module_files::{Matched, ModuleFiles};
use crate::kernel::prototype::Prototype;

/// A module's prototypes from its file's DWARF, by its `struct module`'s
/// address.
pub type DwarfPrototypes = (u64, HashMap<String, Prototype>);

/// Complete `gm`'s modules from `files`: what each file did (modules
/// without a file of their name or build id are not said), and the
/// prototypes taken from DWARF, by `struct module` address, for
/// `KernelImage::set_module_prototypes` once the modules are added.
pub fn complete_from(
    gm: &mut GuestModules,
    files: &ModuleFiles,
) -> (Vec<FileUse>, Vec<DwarfPrototypes>) {
    let mut uses = Vec::new();
    let mut dwarf = Vec::new();
    for (m, _) in gm.list.iter_mut() {
        let id = gm.build_ids.iter().find(|(a, _)| *a == m.addr);
        let id = id.map(|(_, id)| id.clone());
        let file = match files.find(&m.name, id.as_deref()) {
            Matched::Nothing => continue,
            Matched::Differs(named) => {
                uses.push(FileUse::Differs {
                    module: m.name.clone(),
                    loaded: id,
                    files: named
                        .iter()
                        .map(|f| (f.path.clone(), f.build_id.clone()))
                        .collect(),
                });
                continue;
            }
            Matched::File(f) => f,
        };
        let has_btf = gm.btf.iter().any(|(a, _)| *a == m.addr);
        let taken = match complete(m, &file.path, has_btf) {
            Ok(t) => t,
            Err(error) => {
                uses.push(FileUse::Unreadable {
                    module: m.name.clone(),
                    error,
                });
                continue;
            }
        };
        let prototypes = if let Some(btf) = taken.btf {
            gm.btf.push((m.addr, btf));
            Some("BTF")
        } else if !taken.prototypes.is_empty() {
            dwarf.push((m.addr, taken.prototypes));
            Some("DWARF")
        } else {
            None
        };
        uses.push(FileUse::Used {
            module: m.name.clone(),
            path: file.path.clone(),
            build_id: id.unwrap_or_default(),
            functions: taken.functions,
            prototypes,
        });
    }
    (uses, dwarf)
}
