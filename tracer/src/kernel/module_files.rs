//! Module files given on the host (`--modules DIR`): every `*.ko` under a
//! directory (and `.ko.gz`, `.ko.xz`, `.ko.zst`, as distributions and
//! kmod ship them), indexed by build id, so that each module the guest has
//! loaded is matched to its own file, never to another build of the same
//! name (`crate::kernel::module_build_id` reads the loaded one's).
//!
//! The scan reads of each file only its headers, its build id note and
//! its `.modinfo` (an uncompressed file through `object::ReadCache`, so a
//! tree of debug modules, gigabytes of DWARF, costs a few reads a file);
//! a compressed file is decompressed whole. The matched file is read
//! whole later (`crate::kernel::ko_file`).

use std::fs::File;
use std::path::{Path, PathBuf};

use object::read::ReadCache;
use object::{Object, ObjectSection};

use crate::kernel::payload::Compression;

/// A module file's name ends so: uncompressed, or compressed by kmod's
/// formats (`modules.dep` names them so).
const SUFFIXES: [(&str, Option<Compression>); 4] = [
    (".ko", None),
    (".ko.gz", Some(Compression::Gzip)),
    (".ko.xz", Some(Compression::Xz)),
    (".ko.zst", Some(Compression::Zstd)),
];
/// Larger than any module decompresses to (amdgpu with DWARF is ~500 MiB).
const MAX_KO: u64 = 2 << 30;
/// Deeper than any module tree (`kernel/drivers/net/ethernet/VENDOR/...`):
/// a deeper walk is a loop of bind mounts or the like.
const MAX_DEPTH: u32 = 32;
/// The `.modinfo` key the kernel's modpost writes the module's name under.
const MODINFO_NAME: &[u8] = b"name=";

/// Why a directory of module files cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ModuleFilesError {
    #[error("{} is not a directory", path.display())]
    NoDir { path: PathBuf },
    #[error("{} holds no module file (*.ko, *.ko.gz, *.ko.xz, *.ko.zst), nor do its subdirectories", path.display())]
    Empty { path: PathBuf },
    #[error("cannot list {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Why one module file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum KoFileError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} does not decompress: {why}", path.display())]
    Decompress { path: PathBuf, why: String },
    #[error("{} is not an ELF file: {source}", path.display())]
    NotElf {
        path: PathBuf,
        #[source]
        source: object::Error,
    },
}

/// One module file: where, the module's name, its build id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleFile {
    pub path: PathBuf,
    /// The module's name as the kernel knows it (`.modinfo`'s `name=`,
    /// else the file's name with `-` as `_`).
    pub name: String,
    /// None: the file has no build id note (it matches nothing).
    pub build_id: Option<Vec<u8>>,
}

/// The module files under one directory.
#[derive(Debug, Default)]
pub struct ModuleFiles {
    pub files: Vec<ModuleFile>,
    /// Files named as modules that could not be read, and why.
    pub unreadable: Vec<KoFileError>,
}

/// What the files say of one loaded module.
#[derive(Debug, PartialEq, Eq)]
pub enum Matched<'a> {
    /// The file of its build id.
    File(&'a ModuleFile),
    /// No file has its build id; these are named like it (other builds).
    Differs(Vec<&'a ModuleFile>),
    /// No file has its build id, none is named like it.
    Nothing,
}

impl ModuleFiles {
    /// Every module file under `dir`, recursively (symbolic links to
    /// files followed, to directories not: a tree never loops).
    pub fn scan(dir: &Path) -> Result<ModuleFiles, ModuleFilesError> {
        if !dir.is_dir() {
            return Err(ModuleFilesError::NoDir {
                path: dir.to_path_buf(),
            });
        }
        let mut paths = Vec::new();
        walk(dir, 0, &mut paths).map_err(|source| ModuleFilesError::Read {
            path: dir.to_path_buf(),
            source,
        })?;
        if paths.is_empty() {
            return Err(ModuleFilesError::Empty {
                path: dir.to_path_buf(),
            });
        }
        paths.sort();
        let mut out = ModuleFiles::default();
        for path in paths {
            match describe(&path) {
                Ok(f) => out.files.push(f),
                Err(e) => out.unreadable.push(e),
            }
        }
        Ok(out)
    }

    /// The file of the loaded module `name` whose build id is `id` (None:
    /// its build id could not be read, so nothing matches it).
    pub fn find(&self, name: &str, id: Option<&[u8]>) -> Matched<'_> {
        if let Some(f) = id.and_then(|id| {
            self.files
                .iter()
                .find(|f| f.build_id.as_deref() == Some(id))
        }) {
            return Matched::File(f);
        }
        let named: Vec<&ModuleFile> = self.files.iter().filter(|f| f.name == name).collect();
        match named.is_empty() {
            true => Matched::Nothing,
            false => Matched::Differs(named),
        }
    }
}

/// The module files under `dir` (`depth` directories down), into `out`.
fn walk(dir: &Path, depth: u32, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    if depth > MAX_DEPTH {
        return Ok(());
    }
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let kind = entry.file_type()?;
        if kind.is_dir() {
            walk(&path, depth + 1, out)?;
        } else if compression(&path).is_some() && path.is_file() {
            out.push(path);
        }
    }
    Ok(())
}

/// Whether `path` is named as a module file, and how it is compressed
/// (Some(None): not at all).
fn compression(path: &Path) -> Option<Option<Compression>> {
    let name = path.file_name()?.to_str()?;
    SUFFIXES
        .iter()
        .find(|(s, _)| name.len() > s.len() && name.ends_with(s))
        .map(|&(_, c)| c)
}

/// The module's name from the file's name: `kyber-iosched.ko.xz` is
/// `kyber_iosched`, as the kernel and kmod name it.
fn name_of_file(path: &Path) -> String {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let name = name.unwrap_or_default();
    let stem = name.split(".ko").next().unwrap_or_default();
    stem.replace('-', "_")
}

/// The whole (decompressed) bytes of the module file at `path`.
pub fn read_ko(path: &Path) -> Result<Vec<u8>, KoFileError> {
    let bytes = std::fs::read(path).map_err(|source| KoFileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    match compression(path).flatten() {
        None => Ok(bytes),
        Some(c) => c
            .decompress(&bytes, MAX_KO)
            .map_err(|why| KoFileError::Decompress {
                path: path.to_path_buf(),
                why,
            }),
    }
}

/// The name and build id of the module file at `path`.
fn describe(path: &Path) -> Result<ModuleFile, KoFileError> {
    let not_elf = |source| KoFileError::NotElf {
        path: path.to_path_buf(),
        source,
    };
    let (name, build_id) = match compression(path).flatten() {
        Some(_) => {
            let bytes = read_ko(path)?;
            let file = object::File::parse(bytes.as_slice()).map_err(not_elf)?;
            identity(&file).map_err(not_elf)?
        }
        None => {
            let f = File::open(path).map_err(|source| KoFileError::Read {
                path: path.to_path_buf(),
                source,
            })?;
            let cache = ReadCache::new(f);
            let file = object::File::parse(&cache).map_err(not_elf)?;
            identity(&file).map_err(not_elf)?
        }
    };
    Ok(ModuleFile {
        path: path.to_path_buf(),
        name: name.unwrap_or_else(|| name_of_file(path)),
        build_id,
    })
}

/// A module file's `.modinfo` name, if it says one, and its build id.
fn identity<'d, O: Object<'d>>(
    file: &O,
) -> Result<(Option<String>, Option<Vec<u8>>), object::Error> {
    let build_id = file.build_id()?.map(<[u8]>::to_vec);
    let name = match file.section_by_name(".modinfo") {
        Some(s) => s.data()?.split(|&b| b == 0).find_map(|kv| {
            let v = kv.strip_prefix(MODINFO_NAME)?;
            Some(String::from_utf8_lossy(v).into_owned())
        }),
        None => None,
    };
    Ok((name.filter(|n| !n.is_empty()), build_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// guest/out/debian-6.12, or None (skipped) when `guest/build.sh
    /// debian-6.12` and `vmt-test` have not run.
    fn debian_612() -> Option<PathBuf> {
        let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest/out/debian-6.12");
        if !out.join("vmt_test.ko").is_file() || !out.join("kyber-iosched.ko").is_file() {
            eprintln!("SKIPPED: run `bash guest/build.sh vmt-test`");
            return None;
        }
        Some(out)
    }

    /// A tree of Debian's own modules and the test module, one of them
    /// compressed in each of kmod's formats, one a few directories down:
    /// each found, named as the kernel names it (kyber-iosched's
    /// `.modinfo` says `kyber_iosched`), with the build id its file has.
    #[test]
    fn a_tree_of_real_module_files_is_indexed_by_build_id() {
        let Some(out) = debian_612() else { return };
        let dir = std::env::temp_dir().join(format!("vmtrace-modfiles-{}", std::process::id()));
        let deep = dir.join("kernel/block/x");
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::copy(out.join("vmt_test.ko"), dir.join("vmt_test.ko")).unwrap();
        let kyber = std::fs::read(out.join("kyber-iosched.ko")).unwrap();
        let gz = {
            use std::io::Write;
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(&kyber).unwrap();
            e.finish().unwrap()
        };
        std::fs::write(deep.join("kyber-iosched.ko.gz"), gz).unwrap();
        std::fs::write(dir.join("notes.txt"), b"not a module").unwrap();
        std::fs::write(dir.join("broken.ko"), b"not an ELF").unwrap();
        let files = ModuleFiles::scan(&dir).unwrap();
        let id = |p: &Path| crate::kernel::module_build_id::ko_build_id(p).unwrap();
        let names: Vec<&str> = files.files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["kyber_iosched", "vmt_test"], "{files:?}");
        assert_eq!(files.files[0].build_id, id(&out.join("kyber-iosched.ko")));
        assert_eq!(files.files[1].build_id, id(&out.join("vmt_test.ko")));
        assert!(files.files[0].build_id.is_some());
        assert_eq!(files.unreadable.len(), 1, "{:?}", files.unreadable);
        assert!(files.unreadable[0]
            .to_string()
            .contains("broken.ko is not an ELF file"));

        // Matched by build id only; a name alone gives the other builds.
        let vmt = files.files[1].build_id.clone();
        assert_eq!(
            files.find("anything", vmt.as_deref()),
            Matched::File(&files.files[1])
        );
        assert_eq!(
            files.find("vmt_test", Some(&[1, 2, 3])),
            Matched::Differs(vec![&files.files[1]])
        );
        assert_eq!(
            files.find("vmt_test", None),
            Matched::Differs(vec![&files.files[1]])
        );
        assert_eq!(files.find("xfs", Some(&[1, 2, 3])), Matched::Nothing);
        // The compressed one reads whole as the original.
        assert_eq!(read_ko(&files.files[0].path).unwrap(), kyber);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_directory_without_modules_is_refused() {
        let dir = std::env::temp_dir().join(format!("vmtrace-nomod-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/vmlinux"), b"x").unwrap();
        let e = ModuleFiles::scan(&dir).unwrap_err();
        assert!(matches!(e, ModuleFilesError::Empty { .. }), "{e}");
        let e = ModuleFiles::scan(&dir.join("none")).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("{} is not a directory", dir.join("none").display())
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn module_names_from_file_names() {
        for (file, name, c) in [
            ("a/kyber-iosched.ko", "kyber_iosched", Some(None)),
            ("nf_tables.ko.xz", "nf_tables", Some(Some(Compression::Xz))),
            ("x.ko.zst", "x", Some(Some(Compression::Zstd))),
            ("x.ko.gz", "x", Some(Some(Compression::Gzip))),
            (".ko", "", None),
            ("x.ko.bz2", "x", None),
        ] {
            assert_eq!(compression(Path::new(file)), c, "{file}");
            if c.is_some() {
                assert_eq!(name_of_file(Path::new(file)), name, "{file}");
            }
        }
    }
}
