//! A `KernelImage` from a bzImage alone: its payload (the vmlinux, stripped
//! of its symbol table, see `crate::kernel::payload`) gives the sections and bytes,
//! kallsyms the names (`crate::kernel::kallsyms`), and a scan of `.init.data` the
//! `__mcount_loc` table, whose bounds are data symbols that kallsyms does not
//! hold (without `CONFIG_KALLSYMS_ALL`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use object::{Object, ObjectSection};

use crate::advice::{join, Plain, Remedy, TracerAdvice, TracerWords};
use crate::kernel::kallsyms::{self, KallsymsEntry, KallsymsError};
use crate::kernel::payload::Compression;
use crate::kernel::sites::{classify, site_function, SiteKind, FENTRY, SITE_LEN};
use crate::kernel::symbols::{
    group_aliases, index_sections, FileSection, Indexed, KernelImage, Symbol, SymbolError,
    MCOUNT_ENTRY_SIZE,
};

/// The section kallsyms is emitted into (scripts/kallsyms.c).
const KALLSYMS_SECTION: &str = ".rodata";
/// The section the `__mcount_loc` table is linked into (MCOUNT_REC in
/// include/asm-generic/vmlinux.lds.h, inside INIT_DATA).
const MCOUNT_SECTION: &str = ".init.data";
/// Why a bzImage alone gave no symbols.
#[derive(Debug, thiserror::Error)]
#[error("{}", self.say(&Plain))]
pub enum PayloadSymbolError {
    Payload(#[from] crate::kernel::payload::PayloadError),
    Elf(SymbolError),
    NoKallsyms {
        path: PathBuf,
        compression: crate::kernel::payload::Compression,
        source: KallsymsError,
    },
    NoFunctions {
        path: PathBuf,
    },
}

/// This module's own errors say to pass the unstripped vmlinux instead.
impl TracerAdvice for PayloadSymbolError {
    fn problem(&self, w: &dyn TracerWords) -> String {
        match self {
            PayloadSymbolError::Payload(e) => e.problem(w),
            PayloadSymbolError::Elf(e) => e.problem(w),
            PayloadSymbolError::NoKallsyms {
                path,
                compression,
                source,
            } => format!(
                "{}: no kallsyms in its {compression} payload ({source})",
                path.display()
            ),
            PayloadSymbolError::NoFunctions { path } => format!(
                "{}: kallsyms in its payload name no function in the kernel text",
                path.display()
            ),
        }
    }

    fn remedy(&self) -> Option<Remedy> {
        match self {
            PayloadSymbolError::Payload(e) => e.remedy(),
            PayloadSymbolError::Elf(e) => e.remedy(),
            _ => Some(Remedy::UnstrippedKernelVmlinux),
        }
    }

    fn say(&self, w: &dyn TracerWords) -> String {
        match self {
            PayloadSymbolError::Payload(e) => e.say(w),
            PayloadSymbolError::Elf(e) => e.say(w),
            e => join(e.problem(w), e.remedy(), w),
        }
    }
}

/// What `load` found, besides the image.
#[derive(Debug, Clone)]
pub struct PayloadInfo {
    pub compression: crate::kernel::payload::Compression,
    pub decompress_time: Duration,
    pub layout: kallsyms::Layout,
    /// kallsyms entries, and how many are functions.
    pub kallsyms: usize,
    /// Where the `__mcount_loc` table was found (virtual addresses; 0..0:
    /// none, a kernel built without ftrace).
    pub mcount_loc: (u64, u64),
}

/// The symbols and ftrace sites of the bzImage at `path`, from its payload.
pub fn load(path: &Path) -> Result<(KernelImage, PayloadInfo), PayloadSymbolError> {
    from_payload(path, crate::kernel::payload::extract(path)?)
}

/// The symbols and ftrace sites of a bzImage opened once, from its payload.
pub fn load_from(
    kernel: &vmm::boot::KernelFile,
) -> Result<(KernelImage, PayloadInfo), PayloadSymbolError> {
    from_payload(kernel.path(), crate::kernel::payload::extract_from(kernel)?)
}

fn from_payload(
    path: &Path,
    payload: crate::kernel::payload::Payload,
) -> Result<(KernelImage, PayloadInfo), PayloadSymbolError> {
    let compression = payload.compression;
    let bytes = payload.elf;
    let ElfFacts {
        build_id,
        sections,
        table,
        mcount_section,
        section_text,
    } = read_elf(path, &bytes, compression)?;

    let (symbols, functions, aliases) = index_kallsyms(&table.entries);
    if functions.is_empty() {
        return Err(PayloadSymbolError::NoFunctions {
            path: path.to_owned(),
        });
    }
    let bounds = |start: &str, stop: &str| match (symbols.get(start), symbols.get(stop)) {
        (Some(s), Some(e)) => Some((s.addr, e.addr)),
        _ => None,
    };
    let init_text = bounds("_sinittext", "_einittext");
    let text = bounds("_stext", "_etext").or(section_text);
    let source = format!(
        "kallsyms in the {compression} payload of {}",
        path.display()
    );
    let mut image = KernelImage {
        path: path.to_owned(),
        build_id,
        functions,
        aliases,
        mcount_loc: Vec::new(),
        init_text,
        text,
        source,
        // kallsyms: a Linux kernel.
        linux: true,
        // kallsyms has no symbol types.
        typed: None,
        entries: std::sync::OnceLock::new(),
        symbols,
        sections,
        bytes: std::sync::Arc::new(bytes),
        modules: Vec::new(),
    };
    // A kernel built without ftrace has none: direct entries trace it
    // (`--entry`), and the plan names what is missing if ftrace's are asked.
    let (start, entries) = match mcount_section {
        Some((offset, len, va)) => {
            find_mcount_loc(&image, offset, len, va).unwrap_or((0, Vec::new()))
        }
        None => (0, Vec::new()),
    };
    let stop = start + entries.len() as u64 * MCOUNT_ENTRY_SIZE;
    image.mcount_loc = entries;
    let info = PayloadInfo {
        compression,
        decompress_time: payload.elapsed,
        layout: table.layout,
        kallsyms: table.entries.len(),
        mcount_loc: (start, stop),
    };
    Ok((image, info))
}

/// What the payload's ELF gives besides its bytes.
struct ElfFacts {
    build_id: Option<Vec<u8>>,
    sections: Vec<FileSection>,
    table: kallsyms::Kallsyms,
    /// `MCOUNT_SECTION`'s (file offset, length, virtual address).
    mcount_section: Option<(usize, usize, u64)>,
    /// `.text`'s bounds, if the kallsyms have none.
    section_text: Option<(u64, u64)>,
}

/// Parses the payload's ELF `bytes`: its build id, sections, kallsyms and
/// where its `__mcount_loc` table may be.
fn read_elf(
    path: &Path,
    bytes: &[u8],
    compression: Compression,
) -> Result<ElfFacts, PayloadSymbolError> {
    let elf_err = |source| {
        PayloadSymbolError::Elf(SymbolError::Malformed {
            path: path.to_owned(),
            source,
        })
    };
    let file = object::File::parse(bytes).map_err(elf_err)?;
    let build_id = file.build_id().map_err(elf_err)?.map(<[u8]>::to_vec);
    let (sections, _) =
        index_sections(&file, path, bytes.len()).map_err(PayloadSymbolError::Elf)?;
    // A section's place in the file: offset, length, virtual address (in
    // the file: index_sections checked every allocated section).
    let section = |name: &str| {
        let s = file.section_by_name(name)?;
        let (offset, size) = s.file_range()?;
        Some((
            usize::try_from(offset).ok()?,
            usize::try_from(size).ok()?,
            s.address(),
        ))
    };
    let no_kallsyms = |source| PayloadSymbolError::NoKallsyms {
        path: path.to_owned(),
        compression,
        source,
    };
    let rodata = section(KALLSYMS_SECTION)
        .and_then(|(offset, len, va)| Some((bytes.get(offset..offset.checked_add(len)?)?, va)));
    let (rodata, rodata_va) = rodata.ok_or_else(|| no_kallsyms(KallsymsError::NoTokenTable))?;
    let table = kallsyms::find(rodata, rodata_va).map_err(no_kallsyms)?;
    let mcount_section = section(MCOUNT_SECTION);
    let section_text = file
        .section_by_name(".text")
        .map(|s| (s.address(), s.address().saturating_add(s.size())));
    drop(file);
    Ok(ElfFacts {
        build_id,
        sections,
        table,
        mcount_section,
        section_text,
    })
}

/// The text section bounds the linker script defines (they are text
/// symbols in kallsyms, but no function's): `_stext`, `__sched_text_start`,
/// `__indirect_thunk_end`, ...
fn is_text_bound(name: &str) -> bool {
    const BOUNDS: [&str; 7] = [
        "_text",
        "_stext",
        "_etext",
        "_sinittext",
        "_einittext",
        "__indirect_thunk_start",
        "__indirect_thunk_end",
    ];
    BOUNDS.contains(&name)
        || (name.starts_with("__")
            && (name.ends_with("_text_start") || name.ends_with("_text_end")))
}

/// Whether a kallsyms text symbol names a function: not an assembler local
/// label that kallsyms keeps (`.E_copy`, `.slowpath`: a name starting with
/// '.'), nor a text section bound (`is_text_bound`). A vmlinux has neither
/// as a function (untyped, no size); kallsyms has no types or sizes, so
/// the names tell. A global label inside an assembly function
/// (`entry_SYSCALL_64_after_hwframe`, SYM_INNER_LABEL) looks like a
/// function here and stays one.
fn is_function(e: &KallsymsEntry) -> bool {
    e.is_text() && !e.name.starts_with('.') && !is_text_bound(&e.name)
}

/// kallsyms by name (a global beats a local, then the first), the
/// functions by address (`is_function`), each as large as the distance to
/// the next symbol, and their aliases: among the names at one address, the
/// first in kallsyms' own order is the function's (the name the kernel's
/// `kallsyms_lookup` gives it; a vmlinux's symbols are put in that order,
/// `crate::kernel::symbols::kallsyms_order`), and the others are aliases.
fn index_kallsyms(entries: &[KallsymsEntry]) -> Indexed {
    let mut symbols: HashMap<String, (Symbol, bool)> = HashMap::new();
    // In kallsyms order: by address, then the kernel's order of names.
    let mut candidates: Vec<Symbol> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        // kallsyms has no sizes: up to the next higher address.
        let next = entries[i + 1..]
            .iter()
            .map(|n| n.addr)
            .find(|&a| a > e.addr);
        let size = next.map_or(0, |n| n - e.addr);
        let sym = Symbol {
            name: e.name.clone(),
            addr: e.addr,
            size,
        };
        let global = e.is_global();
        if is_function(e) {
            candidates.push(sym.clone());
        }
        match symbols.get(&e.name) {
            Some((_, true)) => {}
            Some((_, false)) if !global => {}
            _ => {
                symbols.insert(e.name.clone(), (sym, global));
            }
        }
    }
    // Stable, and a no-op but for a table out of address order: the
    // kernel's order of names at one address stays.
    candidates.sort_by_key(|s| s.addr);
    let (functions, aliases) = group_aliases(candidates);
    let symbols = symbols.into_iter().map(|(k, (s, _))| (k, s)).collect();
    (symbols, functions, aliases)
}

/// The `__mcount_loc` table in the section at file offset `offset` (`len`
/// bytes, virtual address `va`): the run of 8-byte-aligned words each
/// inside the kernel text that holds the most ftrace call sites (a
/// function's entry, or entry + 4 behind `endbr64`, holding a 5-byte NOP or
/// `call __fentry__`), trimmed to its first and last site; most of its
/// entries must be sites (a few are stale: overridden weak functions).
/// The run need not ascend: scripts/sorttable sorts the table at build
/// time only since 5.15 (BUILDTIME_MCOUNT_SORT, later made the default);
/// before, it is each object's own sorted list in link order (Debian's 5.10
/// has 1,350 descents in its 33,982 entries) and ftrace_init sorts it at
/// boot. Nothing else in init data is a long list of such addresses.
/// Entries the build zeroed (sorted first) are left out, as `SiteTable`
/// ignores them anyway: the table found ends at `__stop_mcount_loc` and
/// starts at its first non-zero entry, which tests/linux_symbols.rs checks
/// against the real 6.1 and 6.12 vmlinux.
fn find_mcount_loc(
    image: &KernelImage,
    offset: usize,
    len: usize,
    va: u64,
) -> Option<(u64, Vec<u64>)> {
    let fentry = image.symbol(FENTRY).map(|s| s.addr);
    let ranges: Vec<(u64, u64)> = [image.text, image.init_text]
        .into_iter()
        .flatten()
        .collect();
    let in_text = |a: u64| ranges.iter().any(|&(s, e)| (s..e).contains(&a));
    let is_site = |addr: u64| {
        site_function(image, addr).is_some()
            && image
                .file_bytes(addr, SITE_LEN)
                .is_some_and(|b| classify(b, addr, fentry) != SiteKind::Other)
    };
    let data = image.bytes.get(offset..offset.checked_add(len)?)?;
    let skip = (va.wrapping_neg() % MCOUNT_ENTRY_SIZE) as usize;
    let words: Vec<u64> = data
        .get(skip..)?
        .chunks_exact(MCOUNT_ENTRY_SIZE as usize)
        .map(|c| {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            u64::from_le_bytes(w)
        })
        .collect();
    // (start, end, sites) of the best run so far, and of the current one.
    let mut best: Option<(usize, usize, usize)> = None;
    let mut run: Option<(usize, usize)> = None;
    for (i, &w) in words.iter().enumerate().chain([(words.len(), &0)]) {
        let inside = i < words.len() && in_text(w);
        if let Some((start, sites)) = run {
            if inside {
                run = Some((start, sites + usize::from(is_site(w))));
                continue;
            }
            if best.is_none_or(|(_, _, b)| sites > b) {
                best = Some((start, i, sites));
            }
        }
        run = inside.then(|| (i, usize::from(is_site(w))));
    }
    let (s, e, sites) = best?;
    // Text addresses next to the table (another table's) are no sites.
    let s = (s..e).find(|&i| is_site(words[i]))?;
    let e = (s..e).rfind(|&i| is_site(words[i]))? + 1;
    if sites == 0 || sites * 2 < e - s {
        return None;
    }
    let start = va + skip as u64 + s as u64 * MCOUNT_ENTRY_SIZE;
    Some((start, words[s..e].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, addr: u64, kind: u8) -> KallsymsEntry {
        KallsymsEntry {
            name: name.into(),
            addr,
            kind,
        }
    }

    /// Aliases named as the kernel names them (the first in kallsyms'
    /// order, a local one too), and no local label or section bound as a
    /// function; sizes reach the next symbol of any kind.
    #[test]
    fn kallsyms_functions_aliases_and_labels() {
        const T: u64 = 0xffff_ffff_8100_0000;
        // kallsyms' own order: by address, then as scripts/kallsyms.c sorts.
        let entries = [
            entry("_stext", T, b'T'),
            entry("__do_sys_getpid", T, b't'),
            entry("__ia32_sys_getpid", T, b'T'),
            entry("__x64_sys_getpid", T, b'T'),
            entry(".E_copy", T + 0x20, b't'),
            entry("copy_user_generic_unrolled", T + 0x40, b'T'),
            entry("schedule", T + 0x80, b'T'),
            entry("__sched_text_start", T + 0x80, b'T'),
            entry("jiffies", T + 0x100, b'D'),
            entry("_etext", T + 0x100, b'T'),
        ];
        let (symbols, functions, aliases) = index_kallsyms(&entries);
        let got: Vec<(&str, u64, u64)> = functions
            .iter()
            .map(|f| (f.name.as_str(), f.addr - T, f.size))
            .collect();
        assert_eq!(
            got,
            [
                ("__do_sys_getpid", 0, 0x20),
                ("copy_user_generic_unrolled", 0x40, 0x40),
                ("schedule", 0x80, 0x80),
            ]
        );
        assert_eq!(
            aliases,
            [
                (0, "__ia32_sys_getpid".to_string()),
                (0, "__x64_sys_getpid".to_string())
            ]
        );
        // Every symbol stays one by name (the bounds vmtrace reads).
        assert_eq!(symbols["_etext"].addr, T + 0x100);
        assert_eq!(symbols[".E_copy"].addr, T + 0x20);
    }
}
