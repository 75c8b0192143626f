//! The own files (`--modules DIR`) of the modules first loaded during the
//! trace: at each load hook, the file whose build id is the one in the
//! module's read-only data (`crate::kernel::module_build_id::rodata_build_id`:
//! the kernel sets the notes sysfs shows only after the load hooks) gives
//! the module the symbols its kallsyms lacks and, without its own BTF in
//! the guest's memory (`crate::kernel::module_btf`), the prototypes of its
//! functions for `--args` and `--retval`, as a module loaded before an
//! attach takes them (`crate::kernel::ko_file`). Each file is read once,
//! for every later load; what a module took is said once
//! (`FileUses`, for the CLI).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use vmm::gva::AddressSpace;

use crate::kernel::btf::KernelBtf;
use crate::kernel::ko_file::{FileTake, FileUse, FileUses};
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

/// The module files of `--modules DIR` for the modules first loaded
/// during the trace, and each file once read, by build id.
#[derive(Debug)]
pub struct LoadFiles {
    files: Arc<ModuleFiles>,
    rodata: RodataAt,
    read: HashMap<Vec<u8>, Read>,
    /// Modules whose file's use was said (once each).
    said: HashSet<String>,
    uses: FileUses,
}

/// A file read: what it gives, and its prototypes once asked for.
#[derive(Debug)]
struct Read {
    take: FileTake,
    prototypes: Option<Arc<HashMap<String, Prototype>>>,
}

impl LoadFiles {
    /// None: BTF does not describe the modules' read-only data.
    pub fn new(files: Arc<ModuleFiles>, base: &KernelBtf, uses: FileUses) -> Option<LoadFiles> {
        Some(LoadFiles {
            files,
            rodata: RodataAt::find(base)?,
            read: HashMap::new(),
            said: HashSet::new(),
            uses,
        })
    }

    /// `read`, loading with its `struct module` at `module`, completed
    /// from its file (the functions and sizes its kallsyms lacks), and
    /// the prototypes the file gives when `base` (the vmlinux's BTF) asks
    /// for them (the module has no BTF in the guest's memory). None: no
    /// file has its build id (or it cannot be read), or none asked.
    pub fn take(
        &mut self,
        space: &mut AddressSpace<'_>,
        read: &mut LoadedModule,
        module: u64,
        base: Option<&KernelBtf>,
    ) -> Option<ModulePrototypes> {
        let id = rodata_build_id(space, &self.rodata, module).ok().flatten();
        let name = read.name.clone();
        let path = match self.files.find(&name, id.as_deref()) {
            Matched::Nothing => return None,
            Matched::Differs(named) => {
                let files = named.iter().map(|f| (f.path.clone(), f.build_id.clone()));
                let files = files.collect();
                self.say(FileUse::Differs {
                    module: name,
                    loaded: id,
                    files,
                });
                return None;
            }
            Matched::File(f) => f.path.clone(),
        };
        let id = id.expect("a file matched by its build id");
        if !self.read.contains_key(&id) {
            // Its prototypes read with it when asked for now; later,
            // when a load first asks (`Read::prototypes`).
            match FileTake::read(&path, &name, base) {
                Ok(take) => {
                    let prototypes = take.prototypes.as_ref().map(|p| Arc::new(p.0.clone()));
                    self.read.insert(id.clone(), Read { take, prototypes });
                }
                Err(error) => {
                    self.say(FileUse::Unreadable {
                        module: name,
                        error,
                    });
                    return None;
                }
            }
        }
        let r = self.read.get_mut(&id).expect("just read");
        let functions = r.take.complete(read);
        if let (Some(b), None) = (base, &r.prototypes) {
            // Asked for by this load only: the file read again for them.
            if let Ok(again) = FileTake::read(&path, &name, Some(b)) {
                r.take.prototypes = again.prototypes;
                r.prototypes = r.take.prototypes.as_ref().map(|p| Arc::new(p.0.clone()));
            }
        }
        let took = base.and(r.prototypes.clone());
        let from = took.as_ref().and(r.take.prototypes.as_ref().map(|p| p.1));
        self.say(FileUse::Used {
            module: name,
            path,
            build_id: id,
            functions,
            prototypes: from,
        });
        took.map(ModulePrototypes::File)
    }

    /// `u` told the CLI, the first time its module's file is judged.
    fn say(&mut self, u: FileUse) {
        let module = match &u {
            FileUse::Used { module, .. }
            | FileUse::Differs { module, .. }
            | FileUse::Unreadable { module, .. } => module.clone(),
        };
        if self.said.insert(module) {
            self.uses.push(u);
        }
    }
}
