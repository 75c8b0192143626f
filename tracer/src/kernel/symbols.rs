//! The guest kernel's symbols, read once from its ELF file (vmlinux or the
//! mini guest): functions, the `__mcount_loc` table of ftrace call sites, the
//! text ranges, and the file's bytes by virtual address.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use object::elf::{SHF_ALLOC, SHF_EXECINSTR};
use object::{
    Architecture, BinaryFormat, Object, ObjectSection, ObjectSymbol, SectionFlags, SymbolKind,
    SymbolSection,
};
use vmm::advice::Advice;

use crate::advice::{join, Plain, Remedy, TracerAdvice, TracerWords};

/// Start of the table of ftrace call-site addresses. The kernel's linker script
/// (include/asm-generic/vmlinux.lds.h, MCOUNT_REC) brackets `__mcount_loc`
/// input sections with these two symbols, inside `.init.data`.
pub const MCOUNT_LOC_START: &str = "__start_mcount_loc";
/// End (exclusive) of the `__mcount_loc` table.
pub const MCOUNT_LOC_STOP: &str = "__stop_mcount_loc";
/// Size of one `__mcount_loc` entry: a 64-bit virtual address.
pub const MCOUNT_ENTRY_SIZE: u64 = 8;
/// Bounds of the init text, freed by the kernel after boot.
const INIT_TEXT_BOUNDS: (&str, &str) = ("_sinittext", "_einittext");
/// Bounds of the core kernel text.
const TEXT_BOUNDS: (&str, &str) = ("_stext", "_etext");
/// Linux's version string ("Linux version ..."): only Linux has it.
pub const LINUX_BANNER: &str = "linux_banner";

/// Hint appended to every "no usable __mcount_loc" error.
const FTRACE_CONFIG_HINT: &str = "the kernel was not built with CONFIG_FUNCTION_TRACER=y and \
                                  CONFIG_DYNAMIC_FTRACE=y";

/// Why a kernel image could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum SymbolError {
    #[error("{}", self.say(&Plain))]
    File(#[from] vmm::boot::FileError),
    #[error("cannot read kernel image {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}", self.say(&Plain))]
    NotElf {
        path: PathBuf,
        source: object::Error,
        /// What the file is and what to do, by its first bytes
        /// (`not_elf_hint`), and a remedy said after it.
        hint: &'static str,
        remedy: Option<Remedy>,
    },
    #[error("{} is a {format} file, not ELF; pass the uncompressed vmlinux, not a bzImage", path.display())]
    NotElfFormat { path: PathBuf, format: String },
    #[error("{} is built for {arch}, not x86-64; pass an x86-64 vmlinux", path.display())]
    WrongArch { path: PathBuf, arch: String },
    #[error("{}: malformed ELF ({source}); is the file truncated?", path.display())]
    Malformed {
        path: PathBuf,
        source: object::Error,
    },
    #[error("{}: section {section} lies beyond the end of the file; is the file truncated?", path.display())]
    Truncated { path: PathBuf, section: String },
    #[error("{}", self.say(&Plain))]
    Stripped { path: PathBuf },
    #[error("{} has no __mcount_loc table: {FTRACE_CONFIG_HINT}", path.display())]
    NoMcountLoc { path: PathBuf },
    #[error("{} has an empty __mcount_loc table: {FTRACE_CONFIG_HINT}", path.display())]
    EmptyMcountLoc { path: PathBuf },
    #[error("{}: __mcount_loc table {start:#x}..{stop:#x} is not a whole number of 8-byte entries; the image is corrupt", path.display())]
    BadMcountLoc {
        path: PathBuf,
        start: u64,
        stop: u64,
    },
    #[error("{}: __mcount_loc table {start:#x}..{stop:#x} is not inside any section with file data; the image is corrupt", path.display())]
    McountLocNotInFile {
        path: PathBuf,
        start: u64,
        stop: u64,
    },
}

impl TracerAdvice for SymbolError {
    fn problem(&self, w: &dyn TracerWords) -> String {
        match self {
            // The VMM's error, in the VMM's part of the words.
            SymbolError::File(e) => e.problem(w),
            SymbolError::NotElf {
                path, source, hint, ..
            } => format!(
                "{} is not an ELF file vmtrace can read ({source}){hint}",
                path.display()
            ),
            SymbolError::Stripped { path } => {
                format!("{} has no symbol table (stripped?)", path.display())
            }
            e => e.to_string(),
        }
    }

    fn remedy(&self) -> Option<Remedy> {
        match self {
            SymbolError::NotElf { remedy, .. } => *remedy,
            SymbolError::Stripped { .. } => Some(Remedy::UnstrippedVmlinux),
            SymbolError::NoMcountLoc { .. } | SymbolError::EmptyMcountLoc { .. } => {
                Some(Remedy::DirectEntries)
            }
            _ => None,
        }
    }

    /// `NotElf`'s remedy follows its hint after ": " ("; it is a bzImage:
    /// pass ...").
    fn say(&self, w: &dyn TracerWords) -> String {
        match self {
            SymbolError::NotElf {
                remedy: Some(r), ..
            } => format!("{}: {}", self.problem(w), w.remedy(*r)),
            e => join(e.problem(w), e.remedy(), w),
        }
    }
}

/// A named symbol with its link-time virtual address: as read from the ELF
/// file, and as a trace keeps its functions and callers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Symbol {
    pub name: String,
    pub addr: u64,
    pub size: u64,
}

/// Where one allocated section's bytes sit in the file.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FileSection {
    pub(crate) vaddr: u64,
    pub(crate) size: u64,
    pub(crate) offset: usize,
}

/// Everything the tracer needs from the kernel's ELF file, loaded once.
#[derive(Debug)]
pub struct KernelImage {
    pub path: PathBuf,
    /// The GNU build-id note, to check the guest runs this very build.
    pub build_id: Option<Vec<u8>>,
    /// Code symbols sorted by address, one per address (see `load`).
    pub functions: Vec<Symbol>,
    /// The other names of `functions` (aliases: code symbols at the same
    /// address, e.g. `__do_sys_getpid` of `__x64_sys_getpid`), each with
    /// its function's index, sorted by index then name. `names` gives all.
    pub aliases: Vec<(usize, String)>,
    /// The `__mcount_loc` table as stored in the file, in file order. Linux
    /// keeps it in init data and frees it at boot, so the guest cannot be asked.
    pub mcount_loc: Vec<u64>,
    /// `_sinittext.._einittext` (else the `.init.text` section).
    pub init_text: Option<(u64, u64)>,
    /// `_stext.._etext` (else the `.text` section).
    pub text: Option<(u64, u64)>,
    /// Where the symbols came from, for reports: "the symbol table of
    /// PATH", or kallsyms in a bzImage's payload (see `crate::kernel::bzimage`).
    pub source: String,
    /// A Linux kernel (it has `linux_banner`, or kallsyms): it rewrites its
    /// own ftrace sites at boot (`call __fentry__` to NOP), so a site that
    /// still holds the call is not vmtrace's to patch yet.
    pub linux: bool,
    /// Per function (an index into `functions`), whether one of its names
    /// is a typed function symbol (STT_FUNC); None when the symbols came
    /// from kallsyms, which has no types (`crate::kernel::direct::entries`).
    pub typed: Option<Vec<bool>>,
    /// Which functions are entered by a call, found on first use
    /// (`crate::kernel::direct::entries`).
    pub(crate) entries: std::sync::OnceLock<crate::kernel::not_entry::Entries>,
    /// Every named defined symbol; on name clashes, a global beats a local.
    pub(crate) symbols: HashMap<String, Symbol>,
    /// Allocated sections with file data, sorted by `vaddr`.
    pub(crate) sections: Vec<FileSection>,
    pub(crate) bytes: std::sync::Arc<Vec<u8>>,
    /// The running guest's modules whose functions were added
    /// (`crate::kernel::module_image`); none from a file alone.
    pub modules: Vec<crate::kernel::image_module::ImageModule>,
}

/// Symbols by name, functions by address, and their aliases (the fields of
/// `KernelImage` of those names), as a symbol table gives them.
pub(crate) type Indexed = (HashMap<String, Symbol>, Vec<Symbol>, Vec<(usize, String)>);

/// `Indexed` of a symbol table, with `KernelImage::typed`.
type IndexedTyped = (Indexed, Vec<bool>);

/// A candidate for `functions`, with what decides between aliases.
struct FuncCandidate {
    sym: Symbol,
    /// STB_WEAK (`nm` type `W`).
    weak: bool,
}

/// The order of the names at one address in the kernel's kallsyms
/// (scripts/kallsyms.c `compare_symbols`, alike in Linux 6.1 and 6.12): a
/// weak symbol after the others, then a linker-script bound (`__start_*`,
/// `*_end`, ...) after the others, then fewer leading underscores first,
/// then the order of its input, `nm -n`, which sorts equal addresses by
/// name (byte order: kbuild sets `LC_COLLATE=C`). The kernel's
/// `kallsyms_lookup` gives an address the first of its names in this order,
/// so ftrace and trace-cmd print that name; vmtrace names a function so too.
pub(crate) fn kallsyms_order(a: (&str, bool), b: (&str, bool)) -> std::cmp::Ordering {
    let rank = |(name, weak): (&str, bool)| {
        let underscores = name.bytes().take_while(|&c| c == b'_').count();
        (weak, linker_script_bound(name), underscores)
    };
    rank(a)
        .cmp(&rank(b))
        .then_with(|| a.0.as_bytes().cmp(b.0.as_bytes()))
}

/// scripts/kallsyms.c `may_be_linker_script_provide_symbol`.
fn linker_script_bound(name: &str) -> bool {
    let n = name.as_bytes();
    if n.len() < 8 || !n.starts_with(b"__") {
        return false;
    }
    let rest = &n[2..];
    rest.starts_with(b"start_")
        || rest.starts_with(b"stop_")
        || rest.starts_with(b"end_")
        || n.ends_with(b"_start")
        || n.ends_with(b"_end")
}

/// The index of the function of `functions` (sorted by address, as
/// `KernelImage::functions`) that holds `addr`; a size of 0 (kallsyms) reaches
/// to the next function.
pub fn function_index_at(functions: &[Symbol], addr: u64) -> Option<usize> {
    let i = functions
        .partition_point(|f| f.addr <= addr)
        .checked_sub(1)?;
    let f = &functions[i];
    (f.size == 0 || addr - f.addr < f.size).then_some(i)
}

/// What to say of a file that did not parse as ELF: by its first bytes,
/// not a guess (an empty file, a big-endian or 32-bit ELF, a bzImage).
fn not_elf_hint(bytes: &[u8]) -> (&'static str, Option<Remedy>) {
    /// Offset of a bzImage's "HdrS" magic (Documentation/x86/boot.rst).
    const HDRS: std::ops::Range<usize> = 0x202..0x206;
    if bytes.is_empty() {
        ("; the file is empty: pass the kernel's vmlinux", None)
    } else if bytes.starts_with(b"\x7fELF") && bytes.get(4..6) == Some(&[2, 1][..]) {
        // ELFCLASS64, ELFDATA2LSB: the right kind, its headers broken.
        (
            "; is the file truncated or damaged? pass an intact vmlinux",
            None,
        )
    } else if bytes.starts_with(b"\x7fELF") {
        ("; it is big-endian or 32-bit: pass an x86-64 vmlinux", None)
    } else if bytes.get(HDRS) == Some(b"HdrS") {
        ("; it is a bzImage", Some(Remedy::VmlinuxNotBzImage))
    } else {
        ("; pass the kernel's vmlinux", None)
    }
}

impl KernelImage {
    /// Reads and indexes the ELF file at `path`.
    pub fn load(path: &Path) -> Result<Self, SymbolError> {
        KernelImage::from_bytes(path, Self::read(path)?)
    }

    /// Like `load`, but a file with no `__mcount_loc` table (a kernel built
    /// without ftrace, `mini-noftrace`) loads with `mcount_loc` empty: what
    /// direct entries (`crate::kernel::direct`) read.
    pub fn load_without_sites(path: &Path) -> Result<Self, SymbolError> {
        KernelImage::index(path, Self::read(path)?, false)
    }

    /// `from_bytes`, but a file with no `__mcount_loc` table loads with
    /// `mcount_loc` empty (`--entry` decides whether it needs one).
    pub fn from_bytes_without_sites(
        path: &Path,
        bytes: std::sync::Arc<Vec<u8>>,
    ) -> Result<Self, SymbolError> {
        KernelImage::index(path, bytes, false)
    }

    /// Why this image has no ftrace call sites, if it has none: the error
    /// `load` would have given (None for an image that has them, or whose
    /// symbols came from kallsyms).
    pub fn missing_sites(&self) -> Option<SymbolError> {
        if !self.mcount_loc.is_empty() {
            return None;
        }
        Some(match self.read_mcount_loc() {
            Err(e) => e,
            Ok(_) => SymbolError::EmptyMcountLoc {
                path: self.path.clone(),
            },
        })
    }

    /// The file's bytes, bounded.
    fn read(path: &Path) -> Result<std::sync::Arc<Vec<u8>>, SymbolError> {
        let path = path.to_path_buf();
        // Bounded, and never a FIFO or a device (`/dev/zero` would grow
        // without end).
        let (file, size) = vmm::boot::open_input(
            &path,
            "vmlinux",
            vmm::boot::VMLINUX_MAX_SIZE,
            "the largest vmlinux vmtrace reads",
        )?;
        let bytes = vmm::boot::read_input(&file, size).map_err(|source| SymbolError::Read {
            path: path.clone(),
            source,
        })?;
        drop(file);
        Ok(std::sync::Arc::new(bytes))
    }

    /// Indexes an ELF file already read (`path` names it in messages): a
    /// kernel file opened once (`vmm::boot::KernelFile`) shares its bytes.
    pub fn from_bytes(path: &Path, bytes: std::sync::Arc<Vec<u8>>) -> Result<Self, SymbolError> {
        KernelImage::index(path, bytes, true)
    }

    /// `from_bytes`; without `need_sites`, a missing or empty
    /// `__mcount_loc` leaves `mcount_loc` empty instead of failing.
    fn index(
        path: &Path,
        bytes: std::sync::Arc<Vec<u8>>,
        need_sites: bool,
    ) -> Result<Self, SymbolError> {
        let path = path.to_path_buf();
        let file = object::File::parse(bytes.as_slice()).map_err(|source| {
            let (hint, remedy) = not_elf_hint(&bytes);
            SymbolError::NotElf {
                path: path.clone(),
                source,
                hint,
                remedy,
            }
        })?;
        if file.format() != BinaryFormat::Elf {
            // A bzImage parses as PE (EFI stub): name the mistake.
            let format = format!("{:?}", file.format());
            return Err(SymbolError::NotElfFormat { path, format });
        }
        if file.architecture() != Architecture::X86_64 {
            let arch = format!("{:?}", file.architecture());
            return Err(SymbolError::WrongArch { path, arch });
        }
        let build_id = file
            .build_id()
            .map_err(|source| SymbolError::Malformed {
                path: path.clone(),
                source,
            })?
            .map(<[u8]>::to_vec);

        let (sections, executable) = index_sections(&file, &path, bytes.len())?;
        let ((symbols, functions, aliases), typed) = index_symbols(&file, &executable);
        if symbols.is_empty() {
            return Err(SymbolError::Stripped { path });
        }

        let bounds = |(start, stop): (&str, &str), section: &str| match (
            symbols.get(start),
            symbols.get(stop),
        ) {
            (Some(s), Some(e)) => Some((s.addr, e.addr)),
            _ => file
                .section_by_name(section)
                .map(|s| (s.address(), s.address().saturating_add(s.size()))),
        };
        let init_text = bounds(INIT_TEXT_BOUNDS, ".init.text");
        let text = bounds(TEXT_BOUNDS, ".text");
        drop(file);

        let source = format!("the symbol table of {}", path.display());
        let linux = symbols.contains_key(LINUX_BANNER);
        let mut image = KernelImage {
            path,
            build_id,
            functions,
            aliases,
            mcount_loc: Vec::new(),
            init_text,
            text,
            source,
            linux,
            typed: Some(typed),
            entries: std::sync::OnceLock::new(),
            symbols,
            sections,
            bytes,
            modules: Vec::new(),
        };
        image.mcount_loc = match image.read_mcount_loc() {
            Err(SymbolError::NoMcountLoc { .. } | SymbolError::EmptyMcountLoc { .. })
                if !need_sites =>
            {
                Vec::new()
            }
            r => r?,
        };
        Ok(image)
    }

    /// The function containing `addr`: the nearest function at or below it,
    /// provided `addr` is inside its size (size-0 symbols cover up to the next).
    pub fn function_at(&self, addr: u64) -> Option<&Symbol> {
        self.function_index_at(addr).map(|i| &self.functions[i])
    }

    /// Every name of function `func` (an index into `functions`): the one
    /// `functions` keeps, then its aliases.
    pub fn names(&self, func: usize) -> impl Iterator<Item = &str> {
        let start = self.aliases.partition_point(|(f, _)| *f < func);
        let end = self.aliases.partition_point(|(f, _)| *f <= func);
        let aliases = self.aliases.get(start..end).unwrap_or_default();
        self.functions
            .get(func)
            .map(|f| f.name.as_str())
            .into_iter()
            .chain(aliases.iter().map(|(_, n)| n.as_str()))
    }

    /// Like `function_at`, but the index into `functions`.
    pub fn function_index_at(&self, addr: u64) -> Option<usize> {
        function_index_at(&self.functions, addr)
    }

    /// `len` bytes of the file at virtual address `vaddr`, if one allocated
    /// section with file data holds all of them.
    pub fn file_bytes(&self, vaddr: u64, len: usize) -> Option<&[u8]> {
        let i = self
            .sections
            .partition_point(|s| s.vaddr <= vaddr)
            .checked_sub(1)?;
        let s = self.sections[i];
        let rel = vaddr - s.vaddr;
        if rel.checked_add(len as u64)? > s.size {
            return None;
        }
        let start = s.offset + usize::try_from(rel).ok()?;
        self.bytes.get(start..start + len)
    }

    /// Any defined symbol by name, data included (e.g. `mini_stop`).
    pub fn symbol(&self, name: &str) -> Option<&Symbol> {
        self.symbols.get(name)
    }

    /// Reads `__start_mcount_loc..__stop_mcount_loc` from the section holding it
    /// (a dedicated `__mcount_loc` output section, or `.init.data` as in Linux).
    fn read_mcount_loc(&self) -> Result<Vec<u64>, SymbolError> {
        let path = || self.path.clone();
        let (Some(start), Some(stop)) =
            (self.symbol(MCOUNT_LOC_START), self.symbol(MCOUNT_LOC_STOP))
        else {
            return Err(SymbolError::NoMcountLoc { path: path() });
        };
        let (start, stop) = (start.addr, stop.addr);
        if start == stop {
            return Err(SymbolError::EmptyMcountLoc { path: path() });
        }
        if stop < start || (stop - start) % MCOUNT_ENTRY_SIZE != 0 {
            return Err(SymbolError::BadMcountLoc {
                path: path(),
                start,
                stop,
            });
        }
        let data = usize::try_from(stop - start)
            .ok()
            .and_then(|len| self.file_bytes(start, len))
            .ok_or_else(|| SymbolError::McountLocNotInFile {
                path: path(),
                start,
                stop,
            })?;
        // x86-64 is little-endian; entries are absolute link-time addresses.
        Ok(data
            .chunks_exact(MCOUNT_ENTRY_SIZE as usize)
            .map(|c| {
                let mut entry = [0u8; MCOUNT_ENTRY_SIZE as usize];
                entry.copy_from_slice(c);
                u64::from_le_bytes(entry)
            })
            .collect())
    }
}

/// Allocated sections with file data (sorted by address), and whether each
/// section (by index) is executable.
pub(crate) fn index_sections(
    file: &object::File,
    path: &Path,
    file_len: usize,
) -> Result<(Vec<FileSection>, Vec<bool>), SymbolError> {
    let mut sections = Vec::new();
    let mut executable = vec![false; file.sections().count() + 1];
    for section in file.sections() {
        let SectionFlags::Elf { sh_flags } = section.flags() else {
            continue;
        };
        // Non-allocated sections (symtab, debug info) all sit at address 0.
        if sh_flags & u64::from(SHF_ALLOC) == 0 {
            continue;
        }
        if sh_flags & u64::from(SHF_EXECINSTR) != 0 {
            if let Some(x) = executable.get_mut(section.index().0) {
                *x = true;
            }
        }
        // NOBITS (.bss) has no file range.
        let Some((offset, size)) = section.file_range() else {
            continue;
        };
        let in_file = offset
            .checked_add(size)
            .is_some_and(|end| end <= file_len as u64);
        if !in_file {
            let section = section.name().unwrap_or("?").to_string();
            return Err(SymbolError::Truncated {
                path: path.to_path_buf(),
                section,
            });
        }
        if size > 0 {
            // In range of the file length, so it fits a usize.
            let offset = offset as usize;
            sections.push(FileSection {
                vaddr: section.address(),
                size,
                offset,
            });
        }
    }
    sections.sort_by_key(|s| s.vaddr);
    Ok((sections, executable))
}

/// All named defined symbols by name, the functions sorted by address, and
/// their aliases (`KernelImage::aliases`); and whether each function is
/// typed (`KernelImage::typed`).
///
/// Functions are STT_FUNC symbols, plus untyped symbols with a size in an
/// executable section (Linux's SYM_CODE asm entry points). Where several share
/// an address (aliases), the first in the kernel's kallsyms order
/// ([`kallsyms_order`]) names the function, as the kernel itself names it;
/// the others are its aliases.
fn index_symbols(file: &object::File, executable: &[bool]) -> IndexedTyped {
    let mut symbols: HashMap<String, (Symbol, bool)> = HashMap::new();
    let mut candidates = Vec::new();
    let mut typed_at = std::collections::HashSet::new();
    for sym in file.symbols() {
        let Ok(name) = sym.name() else { continue };
        if name.is_empty() || sym.is_undefined() {
            continue;
        }
        if matches!(sym.kind(), SymbolKind::Section | SymbolKind::File) {
            continue;
        }
        let global = !sym.is_local();
        let weak = sym.is_weak();
        let symbol = Symbol {
            name: name.to_string(),
            addr: sym.address(),
            size: sym.size(),
        };
        let in_text = match sym.section() {
            SymbolSection::Section(idx) => executable.get(idx.0).copied().unwrap_or(false),
            _ => false,
        };
        let typed = sym.kind() == SymbolKind::Text;
        if typed && in_text {
            typed_at.insert(symbol.addr);
        }
        if (typed && in_text) || (sym.kind() == SymbolKind::Unknown && in_text && sym.size() > 0) {
            candidates.push(FuncCandidate {
                sym: symbol.clone(),
                weak,
            });
        }
        match symbols.get(name) {
            Some((_, true)) => {}
            Some((_, false)) if !global => {}
            _ => {
                symbols.insert(name.to_string(), (symbol, global));
            }
        }
    }
    candidates.sort_by(|a, b| {
        a.sym
            .addr
            .cmp(&b.sym.addr)
            .then_with(|| kallsyms_order((&a.sym.name, a.weak), (&b.sym.name, b.weak)))
    });
    let (functions, aliases) = group_aliases(candidates.into_iter().map(|c| c.sym));
    let typed = functions
        .iter()
        .map(|f| typed_at.contains(&f.addr))
        .collect();
    let symbols = symbols.into_iter().map(|(k, (s, _))| (k, s)).collect();
    ((symbols, functions, aliases), typed)
}

/// Functions one per address, the first of each address kept (`symbols`
/// sorted by address, the preferred name first), and the other names at
/// each address as aliases of it (`KernelImage::aliases`).
pub(crate) fn group_aliases(
    symbols: impl IntoIterator<Item = Symbol>,
) -> (Vec<Symbol>, Vec<(usize, String)>) {
    let mut functions: Vec<Symbol> = Vec::new();
    let mut aliases: Vec<(usize, String)> = Vec::new();
    for sym in symbols {
        match functions.last() {
            Some(f) if f.addr == sym.addr => {
                let i = functions.len() - 1;
                // The same name twice (a symbol listed twice) is one name.
                let known = f.name == sym.name
                    || aliases
                        .iter()
                        .rev()
                        .take_while(|(j, _)| *j == i)
                        .any(|(_, n)| *n == sym.name);
                if !known {
                    aliases.push((i, sym.name));
                }
            }
            _ => functions.push(sym),
        }
    }
    aliases.sort();
    (functions, aliases)
}

#[cfg(test)]
mod tests {
    use super::kallsyms_order;

    fn sorted(mut names: Vec<(&'static str, bool)>) -> Vec<&'static str> {
        names.sort_by(|a, b| kallsyms_order(*a, *b));
        names.into_iter().map(|(n, _)| n).collect()
    }

    /// Names at one address, (name, weak), in the order scripts/kallsyms.c
    /// gives them (that of the 6.1 guest's own table for the first two).
    #[test]
    fn names_at_one_address_in_the_kernels_order() {
        // Equal ranks: nm's order, by name.
        assert_eq!(
            sorted(vec![
                ("__x64_sys_getpid", false),
                ("__ia32_sys_getpid", false),
                ("__do_sys_getpid", false),
            ]),
            ["__do_sys_getpid", "__ia32_sys_getpid", "__x64_sys_getpid"]
        );
        // A weak name after the others.
        assert_eq!(
            sorted(vec![
                ("blake2s_compress", true),
                ("blake2s_compress_generic", false)
            ]),
            ["blake2s_compress_generic", "blake2s_compress"]
        );
        // Linker-script bounds after the others; fewer underscores first.
        assert_eq!(
            sorted(vec![
                ("__stop_x", false),
                ("__sched_text_start", false),
                ("_stext", false),
                ("schedule", false),
            ]),
            ["schedule", "_stext", "__sched_text_start", "__stop_x"]
        );
    }
}
