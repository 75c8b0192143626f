//! What a loaded module's own file (`--modules DIR`, matched by build id:
//! `crate::kernel::module_files`) gives that the guest's memory lacks:
//!
//! - functions its kallsyms does not keep, or keeps without a size: each
//!   `STT_FUNC` of the file's `.symtab` placed in the running text by a
//!   function of the same section that both have (the module loader lays
//!   each section out whole, so one shared function gives the section's
//!   place);
//! - its `.BTF`, when the kernel kept none of it;
//! - else its functions' prototypes from its DWARF
//!   (`crate::kernel::dwarf_prototype`), for `--args` and `--retval`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use object::{Object, ObjectSection, ObjectSymbol, SectionIndex, SectionKind, SymbolKind};

use crate::kernel::dwarf::KernelDwarf;
use crate::kernel::module_files::{read_ko, KoFileError};
use crate::kernel::modules::{LoadedModule, ModuleFunction};
use crate::kernel::prototype::Prototype;

/// What the files did for one module (loaded at the attach, or first
/// loaded during the trace).
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

impl FileUse {
    /// A file used, as the symbols' source names it (`MODULE from PATH`);
    /// None for a file not used.
    pub fn named(&self) -> Option<String> {
        match self {
            FileUse::Used { module, path, .. } => Some(format!("{module} from {}", path.display())),
            FileUse::Differs { .. } | FileUse::Unreadable { .. } => None,
        }
    }
}

/// Where the report's `symbols:` line (`TraceMeta::symbols`) names the
/// module files used, after the kernel's own source.
const FILES_USED: &str = "; modules' files by build id: ";

/// `source` (`KernelImage::source`, which may name files already) naming
/// the module files `used` too (`FileUse::named`), in one list.
pub fn with_files(source: &str, used: &[String]) -> String {
    match (used.is_empty(), source.contains(FILES_USED)) {
        (true, _) => source.to_string(),
        (false, true) => format!("{source}, {}", used.join(", ")),
        (false, false) => format!("{source}{FILES_USED}{}", used.join(", ")),
    }
}

/// The uses of module files at the loads of modules first loaded during
/// the trace, as they come, for the CLI to say (shared by the load hooks
/// and the command's view of the session), and the files used, kept for
/// the trace's symbol source (its `FOOT`, written at the end).
#[derive(Clone, Debug, Default)]
pub struct FileUses(Arc<Mutex<Uses>>);

/// [`FileUses`]' list.
#[derive(Debug, Default)]
struct Uses {
    /// Not taken by the CLI yet.
    new: Vec<FileUse>,
    /// Every file used so far (`FileUse::named`), in load order.
    used: Vec<String>,
}

impl FileUses {
    pub fn push(&self, u: FileUse) {
        // A panic elsewhere while holding it left a whole list.
        let mut uses = self.0.lock().unwrap_or_else(|p| p.into_inner());
        uses.used.extend(u.named());
        uses.new.push(u);
    }

    /// The uses not taken yet.
    pub fn take(&self) -> Vec<FileUse> {
        std::mem::take(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()).new)
    }

    /// Every file used so far, taken or not (`FileUse::named`).
    pub fn used(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .used
            .clone()
    }
}

/// What was taken from a module's file.
#[derive(Debug, Default)]
pub struct Taken {
    /// Functions added to the module's, or given their size.
    pub functions: usize,
    /// The file's `.BTF`, when the guest's memory had none of the module.
    pub btf: Option<Vec<u8>>,
    /// Prototypes from the file's DWARF, when neither has BTF (empty: no
    /// DWARF, or not needed).
    pub prototypes: HashMap<String, Prototype>,
}

/// Complete the loaded module `m` from its file at `path`; `has_btf`: the
/// guest's memory gave its BTF.
pub fn complete(m: &mut LoadedModule, path: &Path, has_btf: bool) -> Result<Taken, KoFileError> {
    let bytes = read_ko(path)?;
    let file = object::File::parse(bytes.as_slice()).map_err(|source| KoFileError::NotElf {
        path: path.to_path_buf(),
        source,
    })?;
    let mut taken = Taken {
        functions: add_functions(m, &file_functions(&file)),
        ..Taken::default()
    };
    if has_btf {
        return Ok(taken);
    }
    taken.btf = file
        .section_by_name(crate::kernel::btf::BTF_SECTION)
        .and_then(|s| s.data().ok())
        .filter(|d| !d.is_empty())
        .map(<[u8]>::to_vec);
    if taken.btf.is_none() {
        // No DWARF (a distribution's stripped module): values shown raw.
        if let Ok(dwarf) = KernelDwarf::from_relocatable(path, &bytes) {
            taken.prototypes =
                crate::kernel::dwarf_prototype::prototypes(&dwarf).unwrap_or_default();
        }
    }
    Ok(taken)
}

/// A module file read for a module first loaded during the trace
/// (`crate::session::module_protos`), once for all its loads: its
/// functions, placed at each load as for a loaded module (`complete`),
/// and, when asked, the prototypes it gives them.
#[derive(Debug)]
pub struct FileTake {
    functions: Vec<FileFunction>,
    /// By its `.BTF` split on the vmlinux's ("BTF"), else by its DWARF
    /// ("DWARF"); None: asked for, but it has neither.
    pub prototypes: Option<(HashMap<String, Prototype>, &'static str)>,
}

impl FileTake {
    /// The module file at `path` of module `name`; `base`: the vmlinux's
    /// BTF, when its prototypes are wanted.
    pub fn read(
        path: &Path,
        name: &str,
        base: Option<&crate::kernel::btf::KernelBtf>,
    ) -> Result<FileTake, KoFileError> {
        let bytes = read_ko(path)?;
        let file = object::File::parse(bytes.as_slice()).map_err(|source| KoFileError::NotElf {
            path: path.to_path_buf(),
            source,
        })?;
        let functions = file_functions(&file);
        let prototypes = base.and_then(|b| file_prototypes(&file, &bytes, path, name, b));
        Ok(FileTake {
            functions,
            prototypes,
        })
    }

    /// `m`, a load of this file's module, given the functions and sizes
    /// its kallsyms lacks; how many.
    pub fn complete(&self, m: &mut LoadedModule) -> usize {
        add_functions(m, &self.functions)
    }
}

/// The prototypes the module file `file` (`bytes`, at `path`) gives its
/// functions: by its `.BTF` split on `base` (the vmlinux's), else by its
/// DWARF, and which; None when it has neither.
fn file_prototypes(
    file: &object::File<'_>,
    bytes: &[u8],
    path: &Path,
    name: &str,
    base: &crate::kernel::btf::KernelBtf,
) -> Option<(HashMap<String, Prototype>, &'static str)> {
    let btf = file
        .section_by_name(crate::kernel::btf::BTF_SECTION)
        .and_then(|s| s.data().ok())
        .filter(|d| !d.is_empty());
    if let Some(data) = btf {
        let from = path.display().to_string();
        let btf = crate::kernel::module_btf::module_btf(name, &from, data, base).ok()?;
        let own = file_functions(file)
            .into_iter()
            .filter_map(|f| Some((f.name.clone(), btf.own_prototype(&f.name)?)));
        return Some((own.collect(), "BTF"));
    }
    let dwarf = KernelDwarf::from_relocatable(path, bytes).ok()?;
    let prototypes = crate::kernel::dwarf_prototype::prototypes(&dwarf).ok()?;
    (!prototypes.is_empty()).then_some((prototypes, "DWARF"))
}

/// One function of a module file: its section and its offset there.
#[derive(Clone, Debug, PartialEq, Eq)]
struct FileFunction {
    name: String,
    section: SectionIndex,
    offset: u64,
    size: u64,
}

/// The file's `STT_FUNC` symbols defined in its executable sections.
fn file_functions(file: &object::File<'_>) -> Vec<FileFunction> {
    file.symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.is_definition())
        .filter_map(|s| {
            let section = s.section_index()?;
            let exec = file.section_by_index(section).ok()?.kind() == SectionKind::Text;
            let name = s.name().ok().filter(|n| !n.is_empty())?;
            exec.then(|| FileFunction {
                name: name.to_owned(),
                section,
                offset: s.address(),
                size: s.size(),
            })
        })
        .collect()
}

/// Add to `m` the functions of `file` it lacks in its text, and the
/// sizes it lacks; how many.
fn add_functions(m: &mut LoadedModule, file: &[FileFunction]) -> usize {
    // Each section's running place, from a function named once in both.
    let once = |name: &str| m.functions.iter().filter(|f| f.name == name).count() == 1;
    let mut place: HashMap<SectionIndex, u64> = HashMap::new();
    for f in file {
        if place.contains_key(&f.section) || !once(&f.name) {
            continue;
        }
        if file.iter().filter(|g| g.name == f.name).count() != 1 {
            continue;
        }
        let at = m.functions.iter().find(|g| g.name == f.name).expect("once");
        place.insert(f.section, at.addr.wrapping_sub(f.offset));
    }
    let mut changed = 0;
    for f in file {
        let Some(base) = place.get(&f.section) else {
            continue;
        };
        let addr = base.wrapping_add(f.offset);
        if !m.text.contains(&addr) {
            continue;
        }
        match m
            .functions
            .iter_mut()
            .find(|g| g.addr == addr && g.name == f.name)
        {
            Some(g) if g.size == 0 && f.size > 0 => {
                g.size = f.size;
                changed += 1;
            }
            Some(_) => {}
            None => {
                m.functions.push(ModuleFunction {
                    name: f.name.clone(),
                    addr,
                    size: f.size,
                });
                changed += 1;
            }
        }
    }
    m.functions
        .sort_by(|a, b| (a.addr, &a.name).cmp(&(b.addr, &b.name)));
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test module as a guest would have it loaded at `base`, its
    /// functions from its own file: or None (skipped) unbuilt.
    fn vmt_test() -> Option<(std::path::PathBuf, LoadedModule, Vec<FileFunction>)> {
        let ko = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest/out/debian-6.12/vmt_test.ko");
        if !ko.is_file() {
            eprintln!("SKIPPED: run `bash guest/build.sh vmt-test`");
            return None;
        }
        let bytes = std::fs::read(&ko).unwrap();
        let file = object::File::parse(bytes.as_slice()).unwrap();
        let funcs = file_functions(&file);
        let text = file.section_by_name(".text").unwrap();
        let base = 0xffff_ffff_c000_0000u64;
        let mut functions: Vec<ModuleFunction> = funcs
            .iter()
            .filter(|f| f.section == text.index())
            .map(|f| ModuleFunction {
                name: f.name.clone(),
                addr: base + f.offset,
                size: f.size,
            })
            .collect();
        functions.sort_by(|a, b| (a.addr, &a.name).cmp(&(b.addr, &b.name)));
        let m = LoadedModule {
            name: "vmt_test".into(),
            addr: 0xffff_ffff_c000_8000,
            text: base..base + text.size(),
            functions,
            sites: Vec::new(),
            events: Vec::new(),
            tables: Default::default(),
        };
        Some((ko, m, funcs))
    }

    /// A function the guest's memory lacks (vmt_batch's symbol gone, as a
    /// kernel keeping fewer symbols has it) and a size it lacks
    /// (vmt_hit's) come back from the file, at their running addresses;
    /// what the memory has is left as it is.
    #[test]
    fn the_file_gives_back_what_memory_lacks() {
        let Some((ko, full, funcs)) = vmt_test() else {
            return;
        };
        assert!(funcs.iter().any(|f| f.name == "vmt_hit"), "{funcs:?}");
        let mut m = full.clone();
        m.functions.retain(|f| f.name != "vmt_batch");
        m.functions
            .iter_mut()
            .filter(|f| f.name == "vmt_hit")
            .for_each(|f| f.size = 0);
        assert_eq!(add_functions(&mut m, &funcs), 2);
        assert_eq!(m.functions, full.functions);
        // Nothing more to take: all there.
        assert_eq!(add_functions(&mut m, &funcs), 0);
        // The whole file: its BTF is not taken when memory had one, no
        // DWARF read then.
        let mut m2 = full.clone();
        let t = complete(&mut m2, &ko, true).unwrap();
        assert_eq!((t.functions, t.btf, t.prototypes.len()), (0, None, 0));
        let t = complete(&mut m2, &ko, false).unwrap();
        assert!(t.btf.is_some() && t.prototypes.is_empty());
    }

    /// A module first loaded during the trace takes from its file
    /// (`FileTake`) what a loaded one takes: a function its kallsyms
    /// lacks, placed at this load; and, when asked (on the vmlinux's BTF),
    /// its prototypes: the 6.12 guest's module without `.BTF` gives them
    /// from its DWARF, with it from its BTF, `vmt_hit(unsigned long i)`.
    #[test]
    fn a_first_loaded_module_takes_symbols_and_prototypes_from_its_file() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest/out/linux-6.12");
        let (ko, nobtf) = (dir.join("vmt_test.ko"), dir.join("vmt_nobtf.ko"));
        if !nobtf.is_file() {
            eprintln!("SKIPPED: run `bash guest/build.sh linux-6.12`");
            return;
        }
        let image = crate::kernel::symbols::KernelImage::load(&dir.join("vmlinux")).unwrap();
        let base = crate::kernel::btf::KernelBtf::from_image(&image).unwrap();
        let take = FileTake::read(&nobtf, "vmt_test", None).unwrap();
        assert!(take.prototypes.is_none(), "not asked for");
        let bytes = std::fs::read(&nobtf).unwrap();
        let file = object::File::parse(bytes.as_slice()).unwrap();
        let text = file.section_by_name(".text").unwrap();
        let at = 0xffff_ffff_c000_0000u64;
        let placed = |f: &FileFunction| ModuleFunction {
            name: f.name.clone(),
            addr: at + f.offset,
            size: f.size,
        };
        let funcs = file_functions(&file);
        let mut m = LoadedModule {
            name: "vmt_test".into(),
            addr: 0xffff_ffff_c000_8000,
            text: at..at + text.size(),
            functions: (funcs.iter())
                .filter(|f| f.section == text.index() && f.name != "vmt_batch")
                .map(placed)
                .collect(),
            sites: Vec::new(),
            events: Vec::new(),
            tables: Default::default(),
        };
        assert_eq!(take.complete(&mut m), 1);
        let batch = funcs.iter().find(|f| f.name == "vmt_batch").unwrap();
        assert!(m.functions.contains(&placed(batch)), "{:?}", m.functions);
        for (path, from) in [(&nobtf, "DWARF"), (&ko, "BTF")] {
            let take = FileTake::read(path, "vmt_test", Some(&base)).unwrap();
            let (prototypes, by) = take.prototypes.expect("asked for");
            assert_eq!(by, from);
            let hit = &prototypes["vmt_hit"];
            let names: Vec<&str> = hit.params.iter().map(|p| p.name.as_str()).collect();
            assert_eq!(names, ["i"], "{from}: {hit:?}");
        }
    }

    /// No function in common: nothing can be placed, nothing added.
    #[test]
    fn nothing_placed_without_a_shared_function() {
        let Some((_, full, funcs)) = vmt_test() else {
            return;
        };
        let mut m = LoadedModule {
            functions: Vec::new(),
            ..full
        };
        assert_eq!(add_functions(&mut m, &funcs), 0);
        assert!(m.functions.is_empty());
    }

    /// The files used are kept for the symbols' source after the CLI took
    /// them to say, each named once in one list after any named before.
    #[test]
    fn files_used_reach_the_symbols_source() {
        let uses = FileUses::default();
        let used = |module: &str, path: &str| FileUse::Used {
            module: module.into(),
            path: path.into(),
            build_id: vec![0xab],
            functions: 0,
            prototypes: Some("DWARF"),
        };
        uses.push(used("vmt_test", "/ko/extra/renamed.ko"));
        uses.push(FileUse::Differs {
            module: "other".into(),
            loaded: None,
            files: Vec::new(),
        });
        assert_eq!(uses.take().len(), 2);
        assert!(uses.take().is_empty());
        uses.push(used("vmt_two", "/ko/two.ko"));
        let names = uses.used();
        assert_eq!(
            names,
            [
                "vmt_test from /ko/extra/renamed.ko",
                "vmt_two from /ko/two.ko"
            ]
        );
        let kernel = "/k/vmlinux (given)";
        assert_eq!(with_files(kernel, &[]), kernel);
        assert_eq!(
            with_files(kernel, &names),
            "/k/vmlinux (given); modules' files by build id: vmt_test from \
             /ko/extra/renamed.ko, vmt_two from /ko/two.ko"
        );
        let found = with_files(kernel, &names[..1]);
        assert_eq!(
            with_files(&found, &names[1..]),
            with_files(kernel, &names),
            "one list"
        );
    }
}
