//! The prototypes of a module first loaded during the trace, for
//! `--args` and `--retval`: its own BTF, read from the guest's memory at
//! its load hook (`crate::kernel::module_btf`), or, without one, its own
//! file's (`--modules DIR`): the file whose build id is the one in the
//! module's read-only data (`crate::kernel::module_build_id::rodata_build_id`:
//! the kernel sets the notes sysfs shows only after the load hooks).

use std::collections::HashMap;
use std::sync::Arc;

use vmm::gva::AddressSpace;

use crate::kernel::btf::KernelBtf;
use crate::kernel::ko_file::file_prototypes;
use crate::kernel::module_build_id::{rodata_build_id, RodataAt};
use crate::kernel::module_files::{Matched, ModuleFiles};
use crate::kernel::modules::LoadedModule;
use crate::kernel::prototype::Prototype;

/// Where a loading module's functions' prototypes come from.
#[derive(Debug)]
pub enum ModulePrototypes {
    /// Its own BTF, from the guest's memory.
    Btf(KernelBtf),
    /// Its file's, by name.
    File(Arc<HashMap<String, Prototype>>),
}

impl ModulePrototypes {
    /// The prototype of its function `bare` (its name without `[module]`).
    pub fn of(&self, bare: &str) -> Option<Prototype> {
        match self {
            ModulePrototypes::Btf(b) => b.own_prototype(bare),
            ModulePrototypes::File(f) => f.get(bare).cloned(),
        }
    }
}

/// The module files of `--modules DIR`, for modules without BTF, and each
/// file's prototypes once read (a module loaded again reads no file).
#[derive(Debug)]
pub struct FilePrototypes {
    files: Arc<ModuleFiles>,
    rodata: RodataAt,
    read: HashMap<Vec<u8>, Arc<HashMap<String, Prototype>>>,
}

impl FilePrototypes {
    /// None: BTF does not describe the modules' read-only data.
    pub fn new(files: Arc<ModuleFiles>, base: &KernelBtf) -> Option<FilePrototypes> {
        Some(FilePrototypes {
            files,
            rodata: RodataAt::find(base)?,
            read: HashMap::new(),
        })
    }

    /// The prototypes of `read`, loading with its `struct module` at
    /// `module`, from its file; None: no file has its build id (or it
    /// cannot be read), its values shown raw.
    pub fn of(
        &mut self,
        space: &mut AddressSpace<'_>,
        read: &LoadedModule,
        module: u64,
        base: &KernelBtf,
    ) -> Option<ModulePrototypes> {
        let id = rodata_build_id(space, &self.rodata, module).ok()??;
        if let Some(p) = self.read.get(&id) {
            return Some(ModulePrototypes::File(Arc::clone(p)));
        }
        let Matched::File(file) = self.files.find(&read.name, Some(&id)) else {
            return None;
        };
        let p = Arc::new(file_prototypes(&file.path, &read.name, base).ok()?);
        self.read.insert(id, Arc::clone(&p));
        Some(ModulePrototypes::File(p))
    }
}
