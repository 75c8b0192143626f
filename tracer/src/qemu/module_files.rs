//! The loaded modules of a running guest (`crate::qemu::modules`)
//! completed from their own files given on the host (`--modules DIR`):
//! each module whose build id, read from the guest's memory, is a file's
//! takes from it what the memory lacks (`crate::kernel::ko_file`); a file
//! named as a loaded module but of another build is never used.

use std::collections::HashMap;
use std::path::PathBuf;

use super::modules::GuestModules;
use crate::kernel::ko_file::complete;
use crate::kernel::module_files::{KoFileError, Matched, ModuleFiles};
use crate::kernel::prototype::Prototype;

/// A module's prototypes from its file's DWARF, by its `struct module`'s
/// address.
pub type DwarfPrototypes = (u64, HashMap<String, Prototype>);

/// What the files did for one loaded module.
#[derive(Debug)]
pub enum FileUse {
    /// Its file, by build id, and what was taken from it.
    Used {
        module: String,
        path: PathBuf,
        build_id: Vec<u8>,
        /// Functions added or given their size.
        functions: usize,
        /// Its prototypes came from the file: its `.BTF` ("BTF"), its
        /// DWARF ("DWARF"); None: the guest's memory had its BTF, or the
        /// file has neither.
        prototypes: Option<&'static str>,
    },
    /// Files named as it, of other builds: not used. `loaded`: its build
    /// id in the guest (None: not readable there).
    Differs {
        module: String,
        loaded: Option<Vec<u8>>,
        files: Vec<(PathBuf, Option<Vec<u8>>)>,
    },
    /// Its file matched but could not be read.
    Unreadable { module: String, error: KoFileError },
}

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
