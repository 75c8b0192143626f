//! The kernel modules a running guest has loaded, read from its memory:
//! the `modules` list (kernel/module/main.c), and of each `struct module`
//! its name, its text (`mem[MOD_TEXT]` since Linux 6.4, `core_layout`
//! before: include/linux/module.h), its own symbols (`kallsyms`: an
//! `Elf64_Sym` table and its strings, kernel/module/kallsyms.c) and its
//! ftrace call sites (`ftrace_callsites`, the module's `__mcount_loc`
//! relocated: kernel/module/main.c, find_module_sections), and its events
//! (`trace_events`, the module's `_ftrace_events` section: the same
//! function). Offsets from
//! the kernel's BTF: a kernel without it is refused.

use std::ops::Range;

use vmm::gva::{AddressSpace, GvaError};

use crate::kernel::btf::{BtfError, KernelBtf};
pub use crate::kernel::image_module::ModuleLayout;
use crate::kernel::image_module::TextAt;
use crate::kernel::kaslr::KernelOffset;
use crate::kernel::module_tables::{ModuleTables, ModuleTablesLayout, TablesError};
use crate::kernel::symbols::KernelImage;
use crate::kernel::top_table::{kernel_space, INIT_TOP_PGT};

/// The list of loaded modules, the walk's head (kernel/module/main.c).
pub const MODULES: &str = "modules";
/// `MODULE_NAME_LEN` on a 64-bit kernel: `64 - sizeof(unsigned long)`.
pub const MODULE_NAME_LEN: usize = 56;
/// `struct module.state` of a module still being set up
/// (`MODULE_STATE_UNFORMED`): its fields are not filled yet, and the
/// kernel's own walks (kallsyms, ftrace) skip it too.
pub(crate) const MODULE_STATE_UNFORMED: u32 = 3;
/// `MODULE_STATE_GOING`: being unloaded (or its init failed), its text
/// about to be freed: never a module to patch.
pub(crate) const MODULE_STATE_GOING: u32 = 2;
/// Size of one `Elf64_Sym` (`st_name` u32, `st_info`, `st_other`,
/// `st_shndx` u16, `st_value` u64, `st_size` u64).
const ELF64_SYM_SIZE: u64 = 24;
/// `STT_FUNC` in `st_info`'s low nibble.
const STT_FUNC: u8 = 2;
/// More modules than any kernel loads: a list longer is not one (a
/// corrupt or moving list), and the walk stops.
pub(crate) const MAX_MODULES: usize = 4096;
/// More symbols or sites than one module has (the largest, amdgpu, has
/// about 20 000 functions).
const MAX_ENTRIES: u64 = 1 << 20;
/// Longest symbol name read (`KSYM_NAME_LEN`).
const KSYM_NAME_LEN: usize = 512;

/// Why the modules could not be found or read.
#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    #[error("{} has no `{MODULES}` symbol: the kernel was built without CONFIG_MODULES", path.display())]
    NoModules { path: std::path::PathBuf },
    #[error("the kernel's modules cannot be read without its BTF: {0}")]
    Btf(#[from] BtfError),
    #[error("cannot find the kernel's modules: {0}")]
    Unlocated(String),
    /// The kernel's banner is nowhere in the guest's RAM: it runs another
    /// kernel (an attach refuses that in its own words).
    #[error("cannot find the kernel's modules: the kernel's banner is nowhere in RAM (the guest runs another kernel)")]
    OtherKernel,
    #[error("reading the module list at {addr:#x}: {source}")]
    Read {
        addr: u64,
        #[source]
        source: GvaError,
    },
    #[error("the module list at {head:#x} has more than {MAX_MODULES} entries: it is not a list")]
    TooLong { head: u64 },
    #[error("module {name} at {addr:#x}: {source}")]
    Tables {
        name: String,
        addr: u64,
        #[source]
        source: TablesError,
    },
    #[error("module {name} at {addr:#x}: {what} ({count}) is not a module's")]
    Implausible {
        name: String,
        addr: u64,
        what: &'static str,
        count: u64,
    },
}

/// One function of a module, from its own symbol table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleFunction {
    pub name: String,
    pub addr: u64,
    pub size: u64,
}

/// A module as the guest has it loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadedModule {
    pub name: String,
    /// Its `struct module`'s address.
    pub addr: u64,
    /// Its core text (init text is freed once it has loaded).
    pub text: Range<u64>,
    /// Its functions (`STT_FUNC` symbols in its text), by address.
    pub functions: Vec<ModuleFunction>,
    /// Its ftrace call sites, ascending (those in its core text: the
    /// kernel's own list keeps the init ones too, freed after load).
    pub sites: Vec<u64>,
    /// Its events' `struct trace_event_call` addresses
    /// (`crate::kernel::events::module_events` reads them).
    pub events: Vec<u64>,
    /// Its exception table, jump labels and static call sites in its
    /// core text (`crate::kernel::module_tables`).
    pub tables: ModuleTables,
}

impl LoadedModule {
    /// The function whose code holds `addr`.
    pub fn function_at(&self, addr: u64) -> Option<&ModuleFunction> {
        let i = self.functions.partition_point(|f| f.addr <= addr);
        let f = self.functions.get(i.checked_sub(1)?)?;
        (addr < f.addr + f.size.max(1)).then_some(f)
    }
}

impl ModuleLayout {
    /// The layout of `image`'s modules, from `btf`.
    pub fn find(image: &KernelImage, btf: &KernelBtf) -> Result<ModuleLayout, ModuleError> {
        let head = image
            .symbol(MODULES)
            .ok_or_else(|| ModuleError::NoModules {
                path: image.path.clone(),
            })?
            .addr;
        let m = |f: &str| btf.member("module", f).map(|at| at.offset);
        let text = if btf.has_struct("module_memory") {
            // MOD_TEXT is 0 in every kernel that has it; BTF says so too.
            let index = btf
                .enum_declaring("MOD_TEXT")
                .and_then(|e| e.into_iter().find(|(n, _)| n == "MOD_TEXT"))
                .map_or(0, |(_, v)| v as u32);
            TextAt::Memory {
                at: m("mem")? + index * btf.struct_size("module_memory")?,
                base: btf.member("module_memory", "base")?.offset,
                size: btf.member("module_memory", "size")?.offset,
            }
        } else {
            TextAt::Layout {
                at: m("core_layout")?,
                base: btf.member("module_layout", "base")?.offset,
                text_size: btf.member("module_layout", "text_size")?.offset,
            }
        };
        let k = |f: &str| btf.member("mod_kallsyms", f).map(|at| at.offset);
        Ok(ModuleLayout {
            head,
            state: m("state")?,
            list: m("list")?,
            name: m("name")?,
            text,
            kallsyms: m("kallsyms")?,
            symtab: k("symtab")?,
            num_symtab: k("num_symtab")?,
            strtab: k("strtab")?,
            ftrace_callsites: m("ftrace_callsites")?,
            num_ftrace_callsites: m("num_ftrace_callsites")?,
            trace_events: m("trace_events").ok().zip(m("num_trace_events").ok()),
            orc: crate::kernel::module_orc::ModuleOrcLayout::find(btf),
            tables: ModuleTablesLayout::find(btf),
        })
    }
}

/// Guest-virtual reads, each failure naming its address.
struct Reader<'s, 'm> {
    space: &'s mut AddressSpace<'m>,
}

impl Reader<'_, '_> {
    fn bytes(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), ModuleError> {
        self.space
            .read(addr, buf)
            .map_err(|source| ModuleError::Read { addr, source })
    }

    fn u64(&mut self, addr: u64) -> Result<u64, ModuleError> {
        let mut b = [0u8; 8];
        self.bytes(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    fn u32(&mut self, addr: u64) -> Result<u32, ModuleError> {
        let mut b = [0u8; 4];
        self.bytes(addr, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    /// A NUL-terminated string of at most `max` bytes (read in pieces that
    /// stop at the page's end: the next page may not be mapped).
    fn string(&mut self, addr: u64, max: usize) -> Result<String, ModuleError> {
        let mut out = Vec::new();
        let mut at = addr;
        while out.len() < max {
            let room = (0x1000 - (at & 0xfff)) as usize;
            let mut buf = vec![0u8; room.min(64).min(max - out.len())];
            self.bytes(at, &mut buf)?;
            if let Some(end) = buf.iter().position(|&b| b == 0) {
                out.extend_from_slice(&buf[..end]);
                break;
            }
            out.extend_from_slice(&buf);
            at += buf.len() as u64;
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }
}

/// Every module on the list whose head is at `head` (the link address
/// in `layout` moved by the kernel's virtual KASLR offset), in list order
/// (the newest first), but those still being set up or going away. Read while the
/// guest is stopped, or while no module loads or unloads.
pub fn loaded(
    space: &mut AddressSpace<'_>,
    layout: &ModuleLayout,
    head: u64,
) -> Result<Vec<LoadedModule>, ModuleError> {
    let mut r = Reader { space };
    let mut out = Vec::new();
    let mut link = r.u64(head)?;
    while link != head {
        if out.len() >= MAX_MODULES {
            return Err(ModuleError::TooLong { head });
        }
        let module = link - u64::from(layout.list);
        let state = r.u32(module + u64::from(layout.state))?;
        if state != MODULE_STATE_UNFORMED && state != MODULE_STATE_GOING {
            out.push(read_module(&mut r, layout, module)?);
        }
        link = r.u64(link)?;
    }
    Ok(out)
}

/// The `struct module` at `module`, read as the list's (a module the
/// kernel is loading, in its load path's stop: its text, symbols and
/// sites are in place by then).
pub fn module_at(
    space: &mut AddressSpace<'_>,
    layout: &ModuleLayout,
    module: u64,
) -> Result<LoadedModule, ModuleError> {
    read_module(&mut Reader { space }, layout, module)
}

/// One `struct module` at `module`.
// Long: one read after another of the fields the tracer needs, each
// checked where it is read.
fn read_module(
    r: &mut Reader<'_, '_>,
    l: &ModuleLayout,
    module: u64,
) -> Result<LoadedModule, ModuleError> {
    let name = r.string(module + u64::from(l.name), MODULE_NAME_LEN)?;
    let text = match l.text {
        TextAt::Memory { at, base, size } => {
            let mem = module + u64::from(at);
            let start = r.u64(mem + u64::from(base))?;
            start..start + u64::from(r.u32(mem + u64::from(size))?)
        }
        TextAt::Layout {
            at,
            base,
            text_size,
        } => {
            let lay = module + u64::from(at);
            let start = r.u64(lay + u64::from(base))?;
            start..start + u64::from(r.u32(lay + u64::from(text_size))?)
        }
    };
    let count = |r: &mut Reader<'_, '_>, at: u64, what| -> Result<u64, ModuleError> {
        let n = u64::from(r.u32(at)?);
        match n <= MAX_ENTRIES {
            true => Ok(n),
            false => Err(ModuleError::Implausible {
                name: name.clone(),
                addr: module,
                what,
                count: n,
            }),
        }
    };
    let kallsyms = r.u64(module + u64::from(l.kallsyms))?;
    let mut functions = Vec::new();
    if kallsyms != 0 {
        let symtab = r.u64(kallsyms + u64::from(l.symtab))?;
        let n = count(r, kallsyms + u64::from(l.num_symtab), "its symbol count")?;
        let strtab = r.u64(kallsyms + u64::from(l.strtab))?;
        functions = read_functions(r, symtab, n, strtab, &text)?;
    }
    let n = count(
        r,
        module + u64::from(l.num_ftrace_callsites),
        "its ftrace site count",
    )?;
    let callsites = r.u64(module + u64::from(l.ftrace_callsites))?;
    let mut sites = Vec::new();
    if n > 0 && callsites != 0 {
        let mut buf = vec![0u8; (n * 8) as usize];
        r.bytes(callsites, &mut buf)?;
        sites = buf
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .filter(|a| text.contains(a))
            .collect();
        sites.sort_unstable();
        sites.dedup();
    }
    let mut events = Vec::new();
    if let Some((array, num)) = l.trace_events {
        let n = count(r, module + u64::from(num), "its event count")?;
        let array = r.u64(module + u64::from(array))?;
        if n > 0 && array != 0 {
            let mut buf = vec![0u8; (n * 8) as usize];
            r.bytes(array, &mut buf)?;
            let word = |c: &[u8]| u64::from_le_bytes(c.try_into().expect("8 bytes"));
            events = buf.chunks_exact(8).map(word).collect();
        }
    }
    let tables = read_tables(r, l, module, &text, &name)?;
    Ok(LoadedModule {
        name,
        addr: module,
        text,
        functions,
        sites,
        events,
        tables,
    })
}

/// The tables of the module `name` at `module`, whose text is `text`
/// (`crate::kernel::module_tables`).
fn read_tables(
    r: &mut Reader<'_, '_>,
    l: &ModuleLayout,
    module: u64,
    text: &Range<u64>,
    name: &str,
) -> Result<ModuleTables, ModuleError> {
    let mut read = |a: u64, b: &mut [u8]| r.bytes(a, b).map_err(|e| e.to_string());
    ModuleTables::read(&l.tables, module, text, &mut read).map_err(|source| ModuleError::Tables {
        name: name.to_string(),
        addr: module,
        source,
    })
}

/// The `STT_FUNC` symbols of a module's table (`n` entries at `symtab`,
/// names in `strtab`) that lie in its core `text`, sorted by address.
fn read_functions(
    r: &mut Reader<'_, '_>,
    symtab: u64,
    n: u64,
    strtab: u64,
    text: &Range<u64>,
) -> Result<Vec<ModuleFunction>, ModuleError> {
    let mut table = vec![0u8; (n * ELF64_SYM_SIZE) as usize];
    r.bytes(symtab, &mut table)?;
    let mut out = Vec::new();
    for sym in table.chunks_exact(ELF64_SYM_SIZE as usize) {
        let word = |at: usize| u64::from_le_bytes(sym[at..at + 8].try_into().expect("8 bytes"));
        let (st_name, info) = (u32::from_le_bytes(sym[..4].try_into().expect("4")), sym[4]);
        let (addr, size) = (word(8), word(16));
        if info & 0xf != STT_FUNC || !text.contains(&addr) || st_name == 0 {
            continue;
        }
        let name = r.string(strtab + u64::from(st_name), KSYM_NAME_LEN)?;
        out.push(ModuleFunction { name, addr, size });
    }
    out.sort_by(|a, b| (a.addr, &a.name).cmp(&(b.addr, &b.name)));
    Ok(out)
}

/// Which of the modules `image` holds are still loaded where they were
/// read (same `struct module`, name and text), one flag each: a module
/// unloaded since has its text freed, and nothing may be written there.
pub fn still_loaded(
    ram: &dyn vmm::GuestRam,
    image: &KernelImage,
) -> Result<Vec<bool>, ModuleError> {
    let Some(first) = image.modules.first() else {
        return Ok(Vec::new());
    };
    let offset = KernelOffset {
        virt: first.virt,
        phys: first.phys,
    };
    let mut space = kernel_space(ram, image, offset)
        .ok_or_else(|| ModuleError::Unlocated(format!("{INIT_TOP_PGT} does not map the kernel")))?;
    let head = first.layout.head.wrapping_add(first.virt as u64);
    let now = loaded(&mut space, &first.layout, head)?;
    Ok(image
        .modules
        .iter()
        .map(|m| {
            now.iter()
                .any(|n| n.name == m.name && n.addr == m.addr && n.text == m.text)
        })
        .collect())
}
