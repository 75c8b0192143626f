//! A loaded module's own tables of code the kernel finds by address
//! after the load, read from its `struct module` (include/linux/module.h):
//! its exception table (`extable`, `num_exentries`: where a faulting
//! instruction resumes), its jump labels (`jump_entries`,
//! `num_jump_entries`: rewritten whenever a static key flips) and its
//! static call sites (`static_call_sites`, `num_static_call_sites`:
//! rewritten by every `static_call_update`). A direct entry in one of the
//! module's functions must leave them alone, as the kernel's own
//! (`crate::kernel::direct::tables` adds them to the vmlinux's). What the
//! module loader applies once and for all before the module runs
//! (alternatives, paravirt calls, retpoline and return sites, CFI) needs
//! no table: the text read is already patched. Its LOCK prefixes, which
//! the kernel may still flip when CPUs come (`alternatives_smp_module_add`
//! keeps them on a guest booted with one CPU of several), are not kept in
//! `struct module`: the tables refuse every one in its code instead. And
//! where its `.noinstr.text` is (code that must not be instrumented, as
//! the kernel's own): from its sections as sysfs lists them
//! (`sect_attrs`, kernel/module/sysfs.c: each section's name and address),
//! up to the next section's address.

use crate::kernel::btf::KernelBtf;
use crate::kernel::direct::KernelTable;

/// One table of `struct module`: its pointer's and count's offsets, and
/// the size of one entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TableAt {
    ptr: u32,
    num: u32,
    size: u32,
}

/// Where a module's sections are listed: `struct module.sect_attrs`, a
/// `struct module_sect_attrs` (`nsections`, then `attrs[]`, each a
/// `struct module_sect_attr`: its name at `battr.attr.name`, `address`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SectionsAt {
    ptr: u32,
    nsections: u32,
    attrs: u32,
    size: u32,
    name: u32,
    address: u32,
}

/// Where a module's tables are described, from the kernel's BTF (None: a
/// kernel without that table, e.g. built without jump labels).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModuleTablesLayout {
    pub(crate) extable: Option<TableAt>,
    pub(crate) jumps: Option<TableAt>,
    pub(crate) static_calls: Option<TableAt>,
    pub(crate) sections: Option<SectionsAt>,
}

impl ModuleTablesLayout {
    /// The layout of `struct module`'s tables in `btf`.
    pub fn find(btf: &KernelBtf) -> ModuleTablesLayout {
        let table = |ptr: &str, num: &str, entry: &str| {
            Some(TableAt {
                ptr: btf.member("module", ptr).ok()?.offset,
                num: btf.member("module", num).ok()?.offset,
                size: btf.struct_size(entry).ok().filter(|&s| s >= 8)?,
            })
        };
        ModuleTablesLayout {
            extable: table("extable", "num_exentries", "exception_table_entry"),
            jumps: table("jump_entries", "num_jump_entries", "jump_entry"),
            static_calls: table(
                "static_call_sites",
                "num_static_call_sites",
                "static_call_site",
            ),
            sections: sections(btf),
        }
    }
}

/// `SectionsAt` from `btf` (None: a kernel without sysfs or kallsyms).
fn sections(btf: &KernelBtf) -> Option<SectionsAt> {
    let m = |ty: &str, f: &str| btf.member(ty, f).ok().map(|at| at.offset);
    Some(SectionsAt {
        ptr: m("module", "sect_attrs")?,
        nsections: m("module_sect_attrs", "nsections")?,
        attrs: m("module_sect_attrs", "attrs")?,
        size: btf.struct_size("module_sect_attr").ok()?,
        name: m("module_sect_attr", "battr")?
            + m("bin_attribute", "attr")?
            + m("attribute", "name")?,
        address: m("module_sect_attr", "address")?,
    })
}

/// A module's section whose code must not be instrumented.
const NOINSTR: &str = ".noinstr.text";
/// More sections than a module has (a count beyond is no count).
const MAX_SECTIONS: u64 = 1 << 16;

/// A module's tables, at running addresses, their entries in its core
/// text only (its init text is freed once it has loaded).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModuleTables {
    /// Each entry's instruction, and its table.
    pub sites: Vec<(u64, KernelTable)>,
    /// `(faulting instruction, fixup)` of its exception table.
    pub fixups: Vec<(u64, u64)>,
    /// `(jump label site, its jump's target)`.
    pub jumps: Vec<(u64, u64)>,
    /// `(jump label site, its key's address with the entry's flag bits)`:
    /// which static key each site belongs to (a module's event's call
    /// sites, `crate::kernel::events::module_events`).
    pub keys: Vec<(u64, u64)>,
    /// Its `.noinstr.text`, if it has one: `(start, end)`.
    pub noinstr: Option<(u64, u64)>,
}

/// Reads guest-virtual memory into a buffer, or says why not.
pub type ReadGuest<'r> = &'r mut dyn FnMut(u64, &mut [u8]) -> Result<(), String>;

/// More entries than one module's table has: a count beyond is no count.
const MAX_TABLE_ENTRIES: u64 = 1 << 20;

/// Why a module's tables could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TablesError {
    #[error("its {what} count ({count}) is not a module's")]
    Implausible { what: &'static str, count: u64 },
    #[error("reading its {what} at {addr:#x}: {why}")]
    Read {
        what: &'static str,
        addr: u64,
        why: String,
    },
}

impl ModuleTables {
    /// The tables of the `struct module` at `module`, whose core text is
    /// `text`, read by `read` (guest-virtual; an error says why).
    pub fn read(
        layout: &ModuleTablesLayout,
        module: u64,
        text: &std::ops::Range<u64>,
        read: ReadGuest<'_>,
    ) -> Result<ModuleTables, TablesError> {
        let mut t = ModuleTables::default();
        let tables = [
            (layout.extable, "exception table", KernelTable::ExTable),
            (layout.jumps, "jump table", KernelTable::JumpLabel),
            (
                layout.static_calls,
                "static call table",
                KernelTable::StaticCall,
            ),
        ];
        for (at, what, table) in tables {
            let Some(at) = at else { continue };
            for (code, second, third) in entries(&at, module, what, read)? {
                if !text.contains(&code) {
                    continue;
                }
                t.sites.push((code, table));
                match table {
                    KernelTable::ExTable => t.fixups.push((code, second)),
                    KernelTable::JumpLabel => {
                        t.jumps.push((code, second));
                        t.keys.extend(third.map(|key| (code, key)));
                    }
                    _ => {}
                }
            }
        }
        t.sites.sort_unstable();
        if let Some(at) = layout.sections {
            t.noinstr = noinstr(&at, module, text, read)?;
        }
        Ok(t)
    }
}

/// The `.noinstr.text` of the module at `module`, from its sections'
/// names and addresses: up to the next section's start in its `text`.
fn noinstr(
    at: &SectionsAt,
    module: u64,
    text: &std::ops::Range<u64>,
    read: ReadGuest<'_>,
) -> Result<Option<(u64, u64)>, TablesError> {
    const WHAT: &str = "section list";
    let word = |addr: u64, len: usize, read: ReadGuest<'_>| {
        let mut b = [0u8; 8];
        read(addr, &mut b[..len])
            .map(|()| u64::from_le_bytes(b))
            .map_err(|why| TablesError::Read {
                what: WHAT,
                addr,
                why,
            })
    };
    let attrs = word(module + u64::from(at.ptr), 8, read)?;
    if attrs == 0 {
        return Ok(None);
    }
    let count = word(attrs + u64::from(at.nsections), 4, read)?;
    if count > MAX_SECTIONS {
        return Err(TablesError::Implausible { what: WHAT, count });
    }
    let mut starts = Vec::new();
    let mut ours = None;
    for i in 0..count {
        let attr = attrs + u64::from(at.attrs) + i * u64::from(at.size);
        let address = word(attr + u64::from(at.address), 8, read)?;
        if !text.contains(&address) {
            continue;
        }
        starts.push(address);
        let name = word(attr + u64::from(at.name), 8, read)?;
        let mut b = [0u8; NOINSTR.len() + 1];
        read(name, &mut b).map_err(|why| TablesError::Read {
            what: WHAT,
            addr: name,
            why,
        })?;
        if &b[..NOINSTR.len()] == NOINSTR.as_bytes() && b[NOINSTR.len()] == 0 {
            ours = Some(address);
        }
    }
    Ok(ours.map(|start| {
        let next = starts.iter().copied().filter(|&a| a > start).min();
        (start, next.unwrap_or(text.end))
    }))
}

/// The entries of table `at` of the module at `module`: each one's code
/// address and the address its second field gives (both s32 relative to
/// their own field, as in every table above: arch/x86's
/// `exception_table_entry`, `jump_entry` and `static_call_site`), and for
/// an entry of 16 bytes (a `jump_entry`) the address its third field, a
/// `long` relative to itself, gives (its key, with the flag bits).
fn entries(
    at: &TableAt,
    module: u64,
    what: &'static str,
    read: ReadGuest<'_>,
) -> Result<Vec<(u64, u64, Option<u64>)>, TablesError> {
    // The count is an `unsigned int`, the pointer 8 bytes.
    let field = |addr: u64, len: usize, read: ReadGuest<'_>| {
        let mut b = [0u8; 8];
        read(addr, &mut b[..len])
            .map(|()| u64::from_le_bytes(b))
            .map_err(|why| TablesError::Read { what, addr, why })
    };
    let count = field(module + u64::from(at.num), 4, read)?;
    if count > MAX_TABLE_ENTRIES {
        return Err(TablesError::Implausible { what, count });
    }
    let base = field(module + u64::from(at.ptr), 8, read)?;
    if count == 0 || base == 0 {
        return Ok(Vec::new());
    }
    let size = u64::from(at.size);
    let mut buf = vec![0u8; (count * size) as usize];
    read(base, &mut buf).map_err(|why| TablesError::Read {
        what,
        addr: base,
        why,
    })?;
    let rel = |e: &[u8], off: usize, from: u64| {
        let r = i32::from_le_bytes([e[off], e[off + 1], e[off + 2], e[off + 3]]);
        from.wrapping_add_signed(i64::from(r))
    };
    Ok(buf
        .chunks_exact(at.size as usize)
        .enumerate()
        .map(|(i, e)| {
            let entry = base + i as u64 * size;
            let long = e.get(8..16).map(|l| {
                let l = i64::from_le_bytes(l.try_into().expect("8 bytes"));
                (entry + 8).wrapping_add_signed(l)
            });
            (rel(e, 0, entry), rel(e, 4, entry + 4), long)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A module at 0x1000 whose exception table (2 entries of 12 bytes)
    /// is at 0x2000, its jump table (1 of 16) at 0x3000; no static calls.
    #[test]
    fn a_modules_tables_are_read_relative_to_each_field_and_kept_in_its_text() {
        let layout = ModuleTablesLayout {
            extable: Some(TableAt {
                ptr: 0x10,
                num: 0x18,
                size: 12,
            }),
            jumps: Some(TableAt {
                ptr: 0x20,
                num: 0x28,
                size: 16,
            }),
            static_calls: None,
            sections: None,
        };
        let mut mem = vec![0u8; 0x4000];
        let put = |mem: &mut Vec<u8>, at: usize, b: &[u8]| mem[at..at + b.len()].copy_from_slice(b);
        put(&mut mem, 0x1010, &0x2000u64.to_le_bytes());
        put(&mut mem, 0x1018, &2u32.to_le_bytes());
        put(&mut mem, 0x1020, &0x3000u64.to_le_bytes());
        put(&mut mem, 0x1028, &1u32.to_le_bytes());
        // Entry 0: insn 0x500 -> 0x2000 + (-0x1b00); fixup 0x520 from 0x2004.
        put(&mut mem, 0x2000, &(-0x1b00i32).to_le_bytes());
        put(&mut mem, 0x2004, &(-0x1ae4i32).to_le_bytes());
        // Entry 1: insn outside the text (its init text, freed).
        put(&mut mem, 0x200c, &0x100i32.to_le_bytes());
        // Jump label at 0x600, jumping to 0x610, its key at 0x3800 (bit 1 set).
        put(&mut mem, 0x3000, &(-0x2a00i32).to_le_bytes());
        put(&mut mem, 0x3004, &(-0x29f4i32).to_le_bytes());
        put(&mut mem, 0x3008, &0x7fai64.to_le_bytes());
        let mut read = reader(&mem);
        let t = ModuleTables::read(&layout, 0x1000, &(0x400..0x800), &mut read).unwrap();
        assert_eq!(
            t.sites,
            vec![
                (0x500, KernelTable::ExTable),
                (0x600, KernelTable::JumpLabel)
            ]
        );
        assert_eq!(t.fixups, vec![(0x500, 0x520)]);
        assert_eq!(t.jumps, vec![(0x600, 0x610)]);
        assert_eq!(t.keys, vec![(0x600, 0x3802)]);
    }

    /// A module at 0x1000 whose `sect_attrs` (at 0x1040) points at 0x2000:
    /// 3 sections of 0x20 bytes from 0x2010 (name pointer at +0, address
    /// at +8), `.text` at 0x400, `.noinstr.text` at 0x600, `.text.unlikely`
    /// at 0x700, and `.data` out of the text.
    #[test]
    fn a_modules_noinstr_text_runs_to_its_next_section() {
        let layout = ModuleTablesLayout {
            sections: Some(SectionsAt {
                ptr: 0x40,
                nsections: 0x8,
                attrs: 0x10,
                size: 0x20,
                name: 0,
                address: 8,
            }),
            ..ModuleTablesLayout::default()
        };
        let mut mem = vec![0u8; 0x4000];
        let put = |mem: &mut Vec<u8>, at: usize, b: &[u8]| mem[at..at + b.len()].copy_from_slice(b);
        put(&mut mem, 0x1040, &0x2000u64.to_le_bytes());
        put(&mut mem, 0x2008, &4u32.to_le_bytes());
        let sections = [
            (".text", 0x400u64),
            (".noinstr.text", 0x600),
            (".text.unlikely", 0x700),
            (".data", 0x900),
        ];
        for (i, (name, address)) in sections.iter().enumerate() {
            let attr = 0x2010 + i * 0x20;
            let at = 0x3000 + i * 0x40;
            put(&mut mem, at, name.as_bytes());
            put(&mut mem, attr, &(at as u64).to_le_bytes());
            put(&mut mem, attr + 8, &address.to_le_bytes());
        }
        let mut read = reader(&mem);
        let t = ModuleTables::read(&layout, 0x1000, &(0x400..0x800), &mut read).unwrap();
        assert_eq!(t.noinstr, Some((0x600, 0x700)));
    }

    /// Reads of `mem`, as guest memory at the addresses its offsets are.
    fn reader(mem: &[u8]) -> impl FnMut(u64, &mut [u8]) -> Result<(), String> + '_ {
        |a, b| {
            let a = a as usize;
            mem.get(a..a + b.len())
                .map(|m| b.copy_from_slice(m))
                .ok_or_else(|| "unmapped".to_string())
        }
    }
}
