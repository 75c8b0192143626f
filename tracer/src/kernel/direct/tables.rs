//! The kernel's tables of code it patches or treats specially at run time
//! (exception fixups, alternatives, jump labels, static calls, retpoline
//! and return-thunk sites, ftrace sites), and the entry and noinstr text
//! bounds: what a direct entry must not displace. Read from the image
//! file; a table the kernel does not have (the mini guest has only
//! `__ex_table`) is empty.

use object::{Object, ObjectSection};

use crate::kernel::sites::SITE_LEN;
use crate::kernel::symbols::KernelImage;

/// A table whose sites a direct entry must leave alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KernelTable {
    /// `__ex_table`: instructions that may fault, with their fixups.
    ExTable,
    /// `.altinstructions`: code replaced at boot by CPU feature.
    Alternative,
    /// `__jump_table`: static-key NOPs and jumps.
    JumpLabel,
    /// `.static_call_sites`: calls rewritten by `static_call_update`.
    StaticCall,
    /// `.retpoline_sites`: indirect-thunk calls and jumps.
    Retpoline,
    /// `.return_sites`: jumps to the return thunk.
    ReturnThunk,
    /// `.call_sites`: direct calls redirected at boot for call depth
    /// tracking (6.2+, `CALL_DEPTH_TRACKING`).
    CallDepth,
    /// `.ibt_endbr_seal`: `endbr64`s of functions never called indirectly,
    /// sealed (made NOPs) at boot with IBT.
    EndbrSeal,
    /// `__mcount_loc`: ftrace call sites.
    Ftrace,
}

impl KernelTable {
    /// What one entry is called, in refusals.
    pub fn site(self) -> &'static str {
        match self {
            KernelTable::ExTable => "exception-table entry",
            KernelTable::Alternative => "alternative",
            KernelTable::JumpLabel => "jump label",
            KernelTable::StaticCall => "static call site",
            KernelTable::Retpoline => "retpoline site",
            KernelTable::ReturnThunk => "return-thunk site",
            KernelTable::CallDepth => "call-depth call site",
            KernelTable::EndbrSeal => "sealed endbr",
            KernelTable::Ftrace => "ftrace site",
        }
    }

    /// The summary's key for a refusal by this table.
    pub fn rule(self) -> &'static str {
        match self {
            KernelTable::ExTable => "ex-table",
            KernelTable::Alternative => "alternative",
            KernelTable::JumpLabel => "jump-label",
            KernelTable::StaticCall => "static-call",
            KernelTable::Retpoline => "retpoline",
            KernelTable::ReturnThunk => "return-thunk",
            KernelTable::CallDepth => "call-depth",
            KernelTable::EndbrSeal => "endbr-seal",
            KernelTable::Ftrace => "ftrace-site",
        }
    }
}

/// Where a table sits in vmlinux and how its entries read. Every table's
/// first field is an s32 relative to its own address; the layouts are
/// those of Linux 6.1 and 6.12 (see the `struct` named on each).
struct Spec {
    table: KernelTable,
    section: &'static str,
    /// The linker script's bounds, when the table sits inside another
    /// output section (`__jump_table` and the static calls are in `.data`).
    bounds: (&'static str, &'static str),
    /// Candidate entry sizes: `struct alt_instr` grew from 12 bytes (6.1)
    /// to 14 (6.3+: `ft_flags`); the right one is told by the entries.
    sizes: &'static [usize],
}

const SPECS: [Spec; 8] = [
    // struct exception_table_entry { int insn, fixup, data; }
    Spec {
        table: KernelTable::ExTable,
        section: "__ex_table",
        bounds: ("__start___ex_table", "__stop___ex_table"),
        sizes: &[12],
    },
    // struct alt_instr { s32 instr_offset; s32 repl_offset; ...;
    //                    u8 instrlen; u8 replacementlen; } __packed
    Spec {
        table: KernelTable::Alternative,
        section: ".altinstructions",
        bounds: ("__alt_instructions", "__alt_instructions_end"),
        sizes: &[12, 14],
    },
    // struct jump_entry { s32 code; s32 target; long key; }
    Spec {
        table: KernelTable::JumpLabel,
        section: "__jump_table",
        bounds: ("__start___jump_table", "__stop___jump_table"),
        sizes: &[16],
    },
    // struct static_call_site { s32 addr; s32 key; }
    Spec {
        table: KernelTable::StaticCall,
        section: ".static_call_sites",
        bounds: ("__start_static_call_sites", "__stop_static_call_sites"),
        sizes: &[8],
    },
    // s32 each
    Spec {
        table: KernelTable::Retpoline,
        section: ".retpoline_sites",
        bounds: ("__retpoline_sites", "__retpoline_sites_end"),
        sizes: &[4],
    },
    Spec {
        table: KernelTable::ReturnThunk,
        section: ".return_sites",
        bounds: ("__return_sites", "__return_sites_end"),
        sizes: &[4],
    },
    Spec {
        table: KernelTable::CallDepth,
        section: ".call_sites",
        bounds: ("__call_sites", "__call_sites_end"),
        sizes: &[4],
    },
    Spec {
        table: KernelTable::EndbrSeal,
        section: ".ibt_endbr_seal",
        bounds: ("__ibt_endbr_seal", "__ibt_endbr_seal_end"),
        sizes: &[4],
    },
];

/// A table that is there but cannot be read as its entries.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error(
        "{}: the {section} table ({len} bytes at {addr:#x}) is not a whole number of \
         {sizes:?}-byte entries pointing into code; the image is corrupt or from a kernel \
         vmtrace does not know",
        path.display()
    )]
    Malformed {
        path: std::path::PathBuf,
        section: &'static str,
        addr: u64,
        len: usize,
        sizes: &'static [usize],
    },
}

/// Every site of every table as code ranges, and the text a direct entry
/// stays out of.
#[derive(Debug, Clone, Default)]
pub struct SiteTables {
    /// `(start, end, table)` sorted by start.
    sites: Vec<(u64, u64, KernelTable)>,
    /// `__entry_text_start..__entry_text_end` (else `.entry.text`).
    pub entry_text: Option<(u64, u64)>,
    /// `__noinstr_text_start..__noinstr_text_end` (else `.noinstr.text`).
    pub noinstr_text: Option<(u64, u64)>,
    /// The retpoline thunks (`__x86_indirect_thunk_*`, and 6.12's
    /// `__x86_indirect_jump_thunk_*`): a jump to one is an indirect jump.
    pub indirect_thunks: Vec<(u64, u64)>,
}

impl SiteTables {
    /// Reads every table of `image`; missing ones are empty.
    pub fn read(image: &KernelImage) -> Result<SiteTables, TableError> {
        let file = object::File::parse(image.bytes.as_slice()).ok();
        let bounds = |start: &str, stop: &str, section: &str| match (
            image.symbol(start),
            image.symbol(stop),
        ) {
            (Some(s), Some(e)) if s.addr <= e.addr => Some((s.addr, e.addr)),
            _ => file
                .as_ref()?
                .section_by_name(section)
                .map(|s| (s.address(), s.address() + s.size())),
        };
        let mut t = SiteTables {
            entry_text: bounds("__entry_text_start", "__entry_text_end", ".entry.text"),
            noinstr_text: bounds(
                "__noinstr_text_start",
                "__noinstr_text_end",
                ".noinstr.text",
            ),
            ..SiteTables::default()
        };
        // Code outside the kernel's text proper holds sites too (a return
        // thunk's jump in `.altinstr_replacement` or `.altinstr_aux`).
        let code: Vec<(u64, u64)> = file
            .as_ref()
            .map(|f| {
                f.sections()
                    .filter(|s| s.kind() == object::SectionKind::Text)
                    .map(|s| (s.address(), s.address() + s.size()))
                    .collect()
            })
            .unwrap_or_default();
        for spec in &SPECS {
            let Some((addr, end)) = bounds(spec.bounds.0, spec.bounds.1, spec.section) else {
                continue;
            };
            t.read_table(image, &code, spec, addr, (end - addr) as usize)?;
        }
        for &a in &image.mcount_loc {
            t.push(KernelTable::Ftrace, a, SITE_LEN as u64);
        }
        t.indirect_thunks = image
            .functions
            .iter()
            .filter(|f| {
                f.name.starts_with("__x86_indirect_thunk_")
                    || f.name.starts_with("__x86_indirect_jump_thunk_")
            })
            .map(|f| (f.addr, f.addr + f.size.max(1)))
            .collect();
        t.sites.sort_unstable();
        Ok(t)
    }

    /// Adds `len` bytes at `addr` as a site of `table`.
    pub fn insert(&mut self, table: KernelTable, addr: u64, len: u64) {
        let at = self.sites.partition_point(|s| s.0 <= addr);
        self.sites.insert(at, (addr, addr + len.max(1), table));
    }

    /// Adds a site as `insert` does, unsorted: `read` sorts them all once
    /// (inserting each in order moved the whole table every time: most of
    /// a minute in a debug build for a distribution kernel's 200,000).
    fn push(&mut self, table: KernelTable, addr: u64, len: u64) {
        self.sites.push((addr, addr + len.max(1), table));
    }

    /// Forgets every site of `table`: e.g. ftrace's, to see what direct
    /// entries would make of an ftrace kernel's functions otherwise.
    pub fn remove(&mut self, table: KernelTable) {
        self.sites.retain(|s| s.2 != table);
    }

    /// Every site: `(start, end, table)`, sorted by start; a site of a
    /// table other than the alternatives is its instruction's first byte.
    pub fn sites(&self) -> &[(u64, u64, KernelTable)] {
        &self.sites
    }

    /// How many sites `table` has.
    pub fn count(&self, table: KernelTable) -> usize {
        self.sites.iter().filter(|s| s.2 == table).count()
    }

    /// The first site overlapping `start..end`, with its address.
    pub fn overlap(&self, start: u64, end: u64) -> Option<(KernelTable, u64)> {
        self.overlap_except(start, end, None)
    }

    /// Is there an ftrace site (`__mcount_loc`) at `addr`?
    pub fn ftrace_at(&self, addr: u64) -> bool {
        let from = self.sites.partition_point(|s| s.0 < addr);
        self.sites[from..]
            .iter()
            .take_while(|s| s.0 == addr)
            .any(|s| s.2 == KernelTable::Ftrace)
    }

    /// `overlap`, not counting the sites of table `except`.
    pub fn overlap_except(
        &self,
        start: u64,
        end: u64,
        except: Option<KernelTable>,
    ) -> Option<(KernelTable, u64)> {
        // Sites are a few bytes long; one starting up to 256 bytes before
        // `start` (an alternative's longest) may still reach into it.
        let from = self.sites.partition_point(|s| s.0 + 256 < start);
        self.sites[from..]
            .iter()
            .take_while(|s| s.0 < end)
            .find(|s| s.1 > start && Some(s.2) != except)
            .map(|s| (s.2, s.0))
    }

    /// Reads one table of `len` bytes at `addr` (entries' code addresses
    /// are relative to the entry).
    fn read_table(
        &mut self,
        image: &KernelImage,
        code: &[(u64, u64)],
        spec: &Spec,
        addr: u64,
        len: usize,
    ) -> Result<(), TableError> {
        let malformed = || TableError::Malformed {
            path: image.path.clone(),
            section: spec.section,
            addr,
            len,
            sizes: spec.sizes,
        };
        if len == 0 {
            return Ok(());
        }
        let data = image.file_bytes(addr, len).ok_or_else(malformed)?;
        let size = *spec
            .sizes
            .iter()
            .find(|&&size| {
                entries(addr, data, size)
                    .is_some_and(|mut e| e.all(|(c, _)| in_code(image, code, c)))
            })
            .ok_or_else(malformed)?;
        for (code, entry) in entries(addr, data, size).ok_or_else(malformed)? {
            // An alternative covers `instrlen` bytes (its entry's
            // second-to-last byte); the others one instruction, which
            // starts inside the displaced bytes if it overlaps them.
            let len = match spec.table {
                KernelTable::Alternative => u64::from(entry[size - 2]),
                _ => 1,
            };
            self.push(spec.table, code, len);
        }
        Ok(())
    }
}

/// Each entry of `size` bytes of a table at `addr` with the code address
/// its first field (s32, relative to itself) gives; None if `data` is not
/// whole entries.
fn entries(addr: u64, data: &[u8], size: usize) -> Option<impl Iterator<Item = (u64, &[u8])>> {
    data.len().is_multiple_of(size).then(|| {
        data.chunks_exact(size).enumerate().map(move |(i, e)| {
            let rel = i32::from_le_bytes([e[0], e[1], e[2], e[3]]);
            let at = addr + (i * size) as u64;
            (at.wrapping_add_signed(i64::from(rel)), e)
        })
    })
}

/// Whether `addr` is in the kernel's code: a function, the (init) text, or
/// another section of code (`code`).
fn in_code(image: &KernelImage, code: &[(u64, u64)], addr: u64) -> bool {
    let within = |r: Option<(u64, u64)>| r.is_some_and(|(s, e)| (s..e).contains(&addr));
    image.function_at(addr).is_some()
        || within(image.text)
        || within(image.init_text)
        || code.iter().any(|&(s, e)| (s..e).contains(&addr))
}
