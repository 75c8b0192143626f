//! The kernel's tables of code it patches or treats specially at run time
//! (exception fixups, alternatives, paravirt sites, LOCK prefixes, jump
//! labels, static calls and their trampolines, retpoline, return-thunk,
//! call-depth and CFI sites, ftrace sites), the entry and noinstr text
//! bounds, and every branch from elsewhere that lands near a function's
//! entry (`targets`): what a direct entry must not displace. Read from the
//! image file; a table the kernel does not have (the mini guest has only
//! `__ex_table`) is empty, and one it has but the file does not locate is
//! an error (`TableError::NotFound`).

mod paravirt;
mod specs;
mod targets;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;

use object::{Object, ObjectSection};

pub use specs::TRAMP_PREFIX;
use specs::{Spec, CFI_PREAMBLE_LEN, SPECS, TRAMP_PATCH_LEN};
pub use targets::{BranchSource, BranchTargets, ForeignBranch};

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
    // Issue 35 (tables): what the kernel also rewrites at boot or at run time.
    /// `.parainstructions` (up to 6.7; 6.8+ makes them alternatives):
    /// paravirt calls replaced at boot (`apply_paravirt`).
    Paravirt,
    /// `.smp_locks`: LOCK prefixes turned into DS prefixes and back when
    /// CPUs go and come (`alternatives_smp_lock`/`_unlock`).
    SmpLock,
    /// `.cfi_sites` (6.2+, FineIBT): kCFI preambles rewritten at boot.
    CfiSite,
    /// A static call trampoline (`__SCT__*`, `.static_call_tramp_key`):
    /// its jump is rewritten by every `static_call_update`.
    StaticCallTramp,
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
            KernelTable::Paravirt => "paravirt call site",
            KernelTable::SmpLock => "LOCK prefix (.smp_locks)",
            KernelTable::CfiSite => "CFI preamble",
            KernelTable::StaticCallTramp => "static call trampoline",
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
            KernelTable::CallDepth => "call-site",
            KernelTable::EndbrSeal => "endbr-seal",
            KernelTable::Ftrace => "ftrace-site",
            KernelTable::Paravirt => "paravirt",
            KernelTable::SmpLock => "smp-lock",
            KernelTable::CfiSite => "cfi-site",
            KernelTable::StaticCallTramp => "static-call-trampoline",
        }
    }
}

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
    #[error(
        "{}: the kernel has {what}s (it has {evidence}), but the image does not say where \
         its {section} table is ({start}/{stop}: kallsyms names data only with \
         CONFIG_KALLSYMS_ALL); without it no direct entry can be proved safe",
        path.display()
    )]
    NotFound {
        path: std::path::PathBuf,
        what: &'static str,
        evidence: &'static str,
        section: &'static str,
        start: &'static str,
        stop: &'static str,
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
    /// Each loaded module's `.noinstr.text` (link addresses).
    pub module_noinstr: Vec<(u64, u64)>,
    /// The retpoline thunks (`__x86_indirect_thunk_*`, and 6.12's
    /// `__x86_indirect_jump_thunk_*`): a jump to one is an indirect jump.
    pub indirect_thunks: Vec<(u64, u64)>,
    /// Branches from elsewhere (tables, other functions) that land near a
    /// function's entry: `read` fills it, `read_patch_sites` does not.
    pub targets: BranchTargets,
}

/// What the tables say besides their sites, for `targets`: each
/// exception fixup, jump label target and alternative replacement.
#[derive(Debug, Default)]
pub(crate) struct TableLinks {
    /// `(faulting instruction, fixup)`.
    pub fixups: Vec<(u64, u64)>,
    /// `(jump label site, its jump's target)`.
    pub jumps: Vec<(u64, u64)>,
    /// `(site, instrlen, replacement, replacementlen)`.
    pub alts: Vec<(u64, u8, u64, u8)>,
    /// The image's sections of code: `(name, start, end)`.
    pub code: Vec<(String, u64, u64)>,
}

impl SiteTables {
    /// Reads every table of `image`, and decodes its whole text for the
    /// branches from elsewhere (`targets`). A table the kernel has but the
    /// image does not locate is an error: without it nothing can be proved.
    pub fn read(image: &KernelImage) -> Result<SiteTables, TableError> {
        let (mut t, links) = SiteTables::read_tables(image, true)?;
        t.targets = BranchTargets::collect(image, &links, &mut t);
        t.sites.sort_unstable();
        Ok(t)
    }

    /// The tables' sites only (no decoding), a table not located being
    /// empty: the bytes the kernel may have rewritten (`BootPatched`).
    pub fn read_patch_sites(image: &KernelImage) -> Result<SiteTables, TableError> {
        SiteTables::read_tables(image, false).map(|(t, _)| t)
    }

    /// The tables of `image`, one module's functions alone (a module the
    /// guest first loads during a trace: `super::module`), with what the
    /// kernel's own tables say of code outside it: its retpoline thunks
    /// (`thunks`, a jump to one is an indirect jump) and its static call
    /// trampolines (`trampolines`: a call or jump of the module's to one
    /// is a static call site). The module's own sites and branches as
    /// `read` finds them for a module added to the kernel's image.
    pub fn read_module(
        image: &KernelImage,
        thunks: &[(u64, u64)],
        trampolines: &[u64],
    ) -> Result<SiteTables, TableError> {
        let (mut t, links) = SiteTables::read_tables(image, false)?;
        t.indirect_thunks.extend_from_slice(thunks);
        for &a in trampolines {
            let site = (a, a + TRAMP_PATCH_LEN, KernelTable::StaticCallTramp);
            t.sites.push(site);
        }
        t.sites.sort_unstable();
        t.targets = BranchTargets::collect(image, &links, &mut t);
        t.sites.sort_unstable();
        Ok(t)
    }

    /// Every table's sites, sorted; `strict`: a table not located on a
    /// kernel that has it is an error.
    fn read_tables(
        image: &KernelImage,
        strict: bool,
    ) -> Result<(SiteTables, TableLinks), TableError> {
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
        let mut links = TableLinks {
            code: file.as_ref().map(text_sections).unwrap_or_default(),
            ..TableLinks::default()
        };
        let code: Vec<(u64, u64)> = links.code.iter().map(|c| (c.1, c.2)).collect();
        for spec in &SPECS {
            let Some((addr, end)) = bounds(spec.bounds.0, spec.bounds.1, spec.section) else {
                let evidence = spec.evidence.filter(|&e| image.symbol(e).is_some());
                if let Some(evidence) = evidence.filter(|_| strict) {
                    return Err(TableError::NotFound {
                        path: image.path.clone(),
                        what: spec.table.site(),
                        evidence,
                        section: spec.section,
                        start: spec.bounds.0,
                        stop: spec.bounds.1,
                    });
                }
                continue;
            };
            let len = (end - addr) as usize;
            t.read_table(image, &code, spec, addr, len, &mut links)?;
        }
        let pv = bounds(paravirt::BOUNDS.0, paravirt::BOUNDS.1, paravirt::SECTION);
        if let Some((addr, end)) = pv {
            for (site, len) in paravirt::read(image, &code, addr, end)? {
                t.sites.push((site, site + len, KernelTable::Paravirt));
            }
        }
        t.add_trampolines(image);
        t.add_modules(image, &mut links);
        // objtool lists `call __fentry__` among the call sites, but the
        // kernel never redirects it (6.12's arch/x86/kernel/callthunks.c
        // skip_addr): ftrace owns it.
        let ftrace: std::collections::HashSet<u64> = image.mcount_loc.iter().copied().collect();
        t.sites
            .retain(|s| s.2 != KernelTable::CallDepth || !ftrace.contains(&s.0));
        for &a in &image.mcount_loc {
            t.sites.push((a, a + SITE_LEN as u64, KernelTable::Ftrace));
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
        Ok((t, links))
    }

    /// Every static call trampoline, by its `__SCT__` name (kallsyms has
    /// them: they are text) besides `.static_call_tramp_key`'s.
    fn add_trampolines(&mut self, image: &KernelImage) {
        let known: BTreeSet<u64> = self
            .sites
            .iter()
            .filter(|s| s.2 == KernelTable::StaticCallTramp)
            .map(|s| s.0)
            .collect();
        let named: BTreeSet<u64> = image
            .symbols
            .iter()
            .filter(|(name, _)| name.starts_with(TRAMP_PREFIX))
            .map(|(_, s)| s.addr)
            .filter(|a| !known.contains(a))
            .collect();
        for a in named {
            let site = (a, a + TRAMP_PATCH_LEN, KernelTable::StaticCallTramp);
            self.sites.push(site);
        }
    }

    /// The sites of the loaded modules `image` holds (its functions'
    /// code read from the guest, `crate::kernel::module_image`), at link
    /// addresses: each one's exception table, jump labels and static
    /// call sites (`crate::kernel::module_tables`), its static call
    /// trampolines by name, and every LOCK prefix in its functions (the
    /// kernel keeps a module's `.smp_locks` out of `struct module`, and
    /// flips them when CPUs come on a guest booted with one of several).
    fn add_modules(&mut self, image: &KernelImage, links: &mut TableLinks) {
        for m in &image.modules {
            let link = |a: u64| a.wrapping_sub(m.virt as u64);
            for &(at, table) in &m.tables.sites {
                self.sites.push((link(at), link(at) + 1, table));
            }
            let pairs = |v: &[(u64, u64)]| {
                v.iter()
                    .map(|&(a, b)| (link(a), link(b)))
                    .collect::<Vec<_>>()
            };
            links.fixups.extend(pairs(&m.tables.fixups));
            links.jumps.extend(pairs(&m.tables.jumps));
            if let Some((s, e)) = m.tables.noinstr {
                self.module_noinstr.push((link(s), link(e)));
            }
            let text = link(m.text.start)..link(m.text.end);
            let ours = image.functions.iter().filter(|f| text.contains(&f.addr));
            for f in ours {
                if f.name.starts_with(TRAMP_PREFIX) {
                    self.sites.push((
                        f.addr,
                        f.addr + TRAMP_PATCH_LEN,
                        KernelTable::StaticCallTramp,
                    ));
                }
                let code = usize::try_from(f.size)
                    .ok()
                    .and_then(|n| image.file_bytes(f.addr, n));
                for at in code.map(|c| lock_prefixes(f.addr, c)).unwrap_or_default() {
                    self.sites.push((at, at + 1, KernelTable::SmpLock));
                }
            }
        }
    }

    /// The static call trampolines' addresses, sorted.
    pub fn trampolines(&self) -> Vec<u64> {
        let mut t: Vec<u64> = self
            .sites
            .iter()
            .filter(|s| s.2 == KernelTable::StaticCallTramp)
            .map(|s| s.0)
            .collect();
        t.sort_unstable();
        t.dedup();
        t
    }

    /// Adds `len` bytes at `addr` as a site of `table`.
    pub fn insert(&mut self, table: KernelTable, addr: u64, len: u64) {
        let at = self.sites.partition_point(|s| s.0 <= addr);
        self.sites.insert(at, (addr, addr + len.max(1), table));
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
    /// are relative to the entry), unsorted; what else its entries say
    /// goes to `links`.
    fn read_table(
        &mut self,
        image: &KernelImage,
        code: &[(u64, u64)],
        spec: &Spec,
        addr: u64,
        len: usize,
        links: &mut TableLinks,
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
        let real = |e: &[u8]| !spec.padded || e[..4] != [0; 4];
        let size = *spec
            .sizes
            .iter()
            .find(|&&size| {
                entries(addr, data, size).is_some_and(|mut e| {
                    e.all(|(c, _, entry)| !real(entry) || in_code(image, code, c))
                })
            })
            .ok_or_else(malformed)?;
        let entries = entries(addr, data, size).ok_or_else(malformed)?;
        for (code, at, entry) in entries.filter(|e| real(e.2)) {
            // The second field, where a table has one, is an s32 relative
            // to itself too.
            let second = || {
                let rel = i32::from_le_bytes([entry[4], entry[5], entry[6], entry[7]]);
                (at + 4).wrapping_add_signed(i64::from(rel))
            };
            // An alternative covers `instrlen` bytes (its entry's
            // second-to-last byte), a CFI site its preamble; the others
            // one instruction, which starts inside the displaced bytes if
            // it overlaps them.
            let len = match spec.table {
                KernelTable::Alternative => u64::from(entry[size - 2]),
                KernelTable::CfiSite => CFI_PREAMBLE_LEN,
                KernelTable::StaticCallTramp => TRAMP_PATCH_LEN,
                _ => 1,
            };
            match spec.table {
                KernelTable::ExTable => links.fixups.push((code, second())),
                KernelTable::JumpLabel => links.jumps.push((code, second())),
                KernelTable::Alternative => {
                    let (ilen, rlen) = (entry[size - 2], entry[size - 1]);
                    links.alts.push((code, ilen, second(), rlen));
                }
                _ => {}
            }
            self.sites.push((code, code + len.max(1), spec.table));
        }
        Ok(())
    }
}

/// Where each instruction of the code `code` at `addr` with a LOCK
/// prefix, or a DS one (what the kernel makes of a LOCK prefix on one
/// CPU, `alternatives_smp_unlock`), is: a `.smp_locks` entry names the
/// prefix, in the instruction's first bytes.
fn lock_prefixes(addr: u64, code: &[u8]) -> Vec<u64> {
    let mut d = iced_x86::Decoder::with_ip(64, code, addr, iced_x86::DecoderOptions::NONE);
    let mut out = Vec::new();
    while d.can_decode() {
        let i = d.decode();
        if i.has_lock_prefix() || i.segment_prefix() == iced_x86::Register::DS {
            out.push(i.ip());
        }
    }
    out
}

/// Every code section of `file`: (name, start, end).
fn text_sections(file: &object::File<'_>) -> Vec<(String, u64, u64)> {
    use object::{Object, ObjectSection};
    file.sections()
        .filter(|s| s.kind() == object::SectionKind::Text)
        .map(|s| {
            let name = s.name().unwrap_or_default().to_string();
            (name, s.address(), s.address() + s.size())
        })
        .collect()
}

/// Each entry of `size` bytes of a table at `addr`: the code address its
/// first field (s32, relative to itself) gives, the entry's own address
/// and bytes; None if `data` is not whole entries.
fn entries(addr: u64, data: &[u8], size: usize) -> Option<impl Iterator<Item = (u64, u64, &[u8])>> {
    data.len().is_multiple_of(size).then(|| {
        data.chunks_exact(size).enumerate().map(move |(i, e)| {
            let rel = i32::from_le_bytes([e[0], e[1], e[2], e[3]]);
            let at = addr + (i * size) as u64;
            (at.wrapping_add_signed(i64::from(rel)), at, e)
        })
    })
}

/// Whether `addr` is in the kernel's code: a function, the (init) text, or
/// another section of code (`code`).
pub(crate) fn in_code(image: &KernelImage, code: &[(u64, u64)], addr: u64) -> bool {
    let within = |r: Option<(u64, u64)>| r.is_some_and(|(s, e)| (s..e).contains(&addr));
    image.function_at(addr).is_some()
        || within(image.text)
        || within(image.init_text)
        || code.iter().any(|&(s, e)| (s..e).contains(&addr))
}

#[cfg(test)]
mod lock_tests {
    /// `lock incl (%rdi)`, `ret`, `ds incl (%rdi)` (a LOCK prefix a
    /// one-CPU kernel made a DS one), `incl (%rdi)`: the first and third.
    #[test]
    fn lock_and_ds_prefixed_instructions_are_found() {
        let code = [0xf0, 0xff, 0x07, 0xc3, 0x3e, 0xff, 0x07, 0xff, 0x07];
        assert_eq!(super::lock_prefixes(0x1000, &code), vec![0x1000, 0x1004]);
    }
}
