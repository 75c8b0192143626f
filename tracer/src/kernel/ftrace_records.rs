//! The guest ftrace's own records of its call sites, and how vmtrace keeps
//! the guest's ftrace away from the sites it patches.
//!
//! Linux keeps one `struct dyn_ftrace { ip, flags, ... }` per call site, in
//! arrays chained from `ftrace_pages_start` (`struct ftrace_page { next,
//! records, index, order }`, kernel/trace/ftrace.c). A record whose flags
//! have `FTRACE_FL_DISABLED` (and not `FTRACE_FL_ENABLED`) is skipped by
//! `skip_record()`: `ftrace_check_record` ignores it, so ftrace never
//! writes nor verifies that site, and `__ftrace_hash_rec_update` and the
//! ipmodify update never count references to it; `match_records` leaves it
//! out of `set_ftrace_filter`. The kernel marks weak functions' records so
//! (`test_for_valid_rec`), and a module's until it is set up
//! (`ftrace_module_enable`). vmtrace marks the records of the sites it
//! patches the same way for as long as they are patched.
//!
//! The guest changes these flags under `ftrace_lock`, and its text under
//! `text_mutex`: vmtrace writes only when neither mutex has an owner.

use std::sync::atomic::Ordering;

use vm_memory::GuestAddress;
use vmm::gva::AddressSpace;
use vmm::GuestRam;

use crate::kernel::btf::{BtfError, KernelBtf};
use crate::kernel::kaslr::KernelOffset;
use crate::kernel::sites::SITE_LEN;
use crate::kernel::symbols::KernelImage;

/// The head of the record pages (static: in a vmlinux's symbol table, in
/// kallsyms only with CONFIG_KALLSYMS_ALL).
const PAGES_START: &str = "ftrace_pages_start";
/// The mutex under which the guest changes its records' flags.
const FTRACE_LOCK: &str = "ftrace_lock";
/// The mutex under which the guest changes its own text.
const TEXT_MUTEX: &str = "text_mutex";
/// The list of the guest's registered `ftrace_ops`...
const OPS_LIST: &str = "ftrace_ops_list";
/// ...which points at this sentinel when no ops is registered.
const LIST_END: &str = "ftrace_list_end";
/// The flag `skip_record()` tests (1 << 25 in 6.1 and 6.12).
const FL_DISABLED: &str = "FTRACE_FL_DISABLED";
/// The flag of a record whose site calls the guest's tracer (1 << 31).
const FL_ENABLED: &str = "FTRACE_FL_ENABLED";
/// The prefix of the flag enumerators: the reference count is the bits
/// below the lowest of them (`FTRACE_REF_MAX` = (1 << 23) - 1 in 6.1,
/// (1 << 19) - 1 in 6.12, a `#define` that BTF does not keep).
const FL_PREFIX: &str = "FTRACE_FL_";
/// The low bits of `struct mutex`'s `owner` that are flags, not the owner
/// (`MUTEX_FLAGS`, kernel/locking/mutex.c).
const MUTEX_FLAGS: u64 = 0x07;
/// Bounds of a walk of the record pages, far above any kernel's (the 6.1
/// test guest has about 40,000 records in about 80 pages).
const MAX_PAGES: usize = 1 << 16;
const MAX_RECORDS: u64 = 1 << 22;

/// Why the guest's ftrace records cannot be found or read.
#[derive(Debug, thiserror::Error)]
pub enum FtraceRecordsError {
    #[error(
        "the kernel's symbols lack {0} (a static variable: a vmlinux has it, kallsyms only \
         with CONFIG_KALLSYMS_ALL)"
    )]
    NoSymbol(&'static str),
    #[error("the kernel has no BTF to lay out its ftrace records by")]
    NoBtf,
    #[error("the kernel's ftrace records: {0}")]
    Btf(#[from] BtfError),
    #[error("the kernel's BTF has no enumerator {0}")]
    NoEnumerator(&'static str),
    #[error("the guest's {what} at {va:#x} cannot be read: {why}")]
    Read {
        what: &'static str,
        va: u64,
        why: String,
    },
    #[error("the guest's ftrace record pages are not a list vmtrace can walk: {0}")]
    Walk(String),
}

/// Where the fields vmtrace reads are, and the flag bits, in this build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordLayout {
    /// `sizeof(struct dyn_ftrace)`, and its `ip` and `flags` members.
    pub rec_size: u64,
    pub rec_ip: u64,
    pub rec_flags: u64,
    /// `struct ftrace_page`'s `next`, `records` and `index` (records used).
    pub pg_next: u64,
    pub pg_records: u64,
    pub pg_index: u64,
    /// `struct mutex`'s `owner` word.
    pub mutex_owner: u64,
    pub disabled: u64,
    pub enabled: u64,
    /// The reference count's bits (`FTRACE_REF_MAX`).
    pub ref_max: u64,
}

/// What a record's flags say about its site.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordUse {
    /// Unused by the guest's ftrace: vmtrace may patch it and disable it.
    Free,
    /// Disabled by the kernel itself (a weak function, say): its ftrace
    /// never touches it; vmtrace patches it and leaves the flags alone.
    Disabled,
    /// Enabled or referenced by the guest's ftrace: left alone.
    InUse,
}

impl RecordLayout {
    /// The layout from the kernel's BTF.
    pub fn from_btf(btf: &KernelBtf) -> Result<RecordLayout, FtraceRecordsError> {
        let flags = btf
            .enum_declaring(FL_DISABLED)
            .ok_or(FtraceRecordsError::NoEnumerator(FL_DISABLED))?;
        let flag = |name: &'static str| {
            flags
                .iter()
                .find(|(n, _)| n == name)
                .map(|&(_, v)| v)
                .ok_or(FtraceRecordsError::NoEnumerator(name))
        };
        let lowest = flags
            .iter()
            .filter(|(n, v)| n.starts_with(FL_PREFIX) && v.is_power_of_two())
            .map(|&(_, v)| v)
            .min()
            .ok_or(FtraceRecordsError::NoEnumerator(FL_DISABLED))?;
        let off = |ty: &str, m: &str| btf.member(ty, m).map(|a| u64::from(a.offset));
        Ok(RecordLayout {
            rec_size: u64::from(btf.struct_size("dyn_ftrace")?),
            rec_ip: off("dyn_ftrace", "ip")?,
            rec_flags: off("dyn_ftrace", "flags")?,
            pg_next: off("ftrace_page", "next")?,
            pg_records: off("ftrace_page", "records")?,
            pg_index: off("ftrace_page", "index")?,
            mutex_owner: off("mutex", "owner")?,
            disabled: flag(FL_DISABLED)?,
            enabled: flag(FL_ENABLED)?,
            ref_max: lowest - 1,
        })
    }

    /// What `flags` say (as `skip_record()` and `ftrace_rec_count()` read
    /// them).
    pub fn use_of(&self, flags: u64) -> RecordUse {
        if flags & (self.enabled | self.ref_max) != 0 {
            RecordUse::InUse
        } else if flags & self.disabled != 0 {
            RecordUse::Disabled
        } else {
            RecordUse::Free
        }
    }

    /// Does a mutex whose `owner` word is `owner` have an owner?
    pub fn held(owner: u64) -> bool {
        owner & !MUTEX_FLAGS != 0
    }
}

/// A record found for a site: where its flags word is, and what it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FoundRecord {
    pub ip: u64,
    pub flags_va: u64,
    pub flags: u64,
}

/// The guest's ftrace records as this kernel lays them out: the layout,
/// and the symbols' link addresses.
#[derive(Clone, Debug)]
pub struct FtraceRecords {
    pub layout: RecordLayout,
    pages_start: u64,
    ftrace_lock: u64,
    text_mutex: u64,
    ops_list: u64,
    list_end: u64,
}

impl FtraceRecords {
    /// What the kernel `image` needs for vmtrace to keep its ftrace off
    /// patched sites: the symbols, and BTF for the layout.
    pub fn find(
        image: &KernelImage,
        btf: Option<&KernelBtf>,
    ) -> Result<FtraceRecords, FtraceRecordsError> {
        let sym = |name: &'static str| {
            image
                .symbol(name)
                .map(|s| s.addr)
                .ok_or(FtraceRecordsError::NoSymbol(name))
        };
        let pages_start = sym(PAGES_START)?;
        let (ftrace_lock, text_mutex) = (sym(FTRACE_LOCK)?, sym(TEXT_MUTEX)?);
        let (ops_list, list_end) = (sym(OPS_LIST)?, sym(LIST_END)?);
        let layout = RecordLayout::from_btf(btf.ok_or(FtraceRecordsError::NoBtf)?)?;
        Ok(FtraceRecords {
            layout,
            pages_start,
            ftrace_lock,
            text_mutex,
            ops_list,
            list_end,
        })
    }

    /// The first of the guest's `ftrace_lock` and `text_mutex` that has an
    /// owner, if any: the guest is changing its ftrace or its text.
    pub fn held_lock(
        &self,
        space: &mut AddressSpace<'_>,
        off: KernelOffset,
    ) -> Result<Option<&'static str>, FtraceRecordsError> {
        for (name, at) in [
            (FTRACE_LOCK, self.ftrace_lock),
            (TEXT_MUTEX, self.text_mutex),
        ] {
            let owner = read_u64(space, off.runtime(at) + self.layout.mutex_owner, name)?;
            if RecordLayout::held(owner) {
                return Ok(Some(name));
            }
        }
        Ok(None)
    }

    /// The record of each of `sites` (running addresses, sorted or not)
    /// whose `ip` lies in the site's 5 bytes, by walking every record page;
    /// `None` for a site without one.
    pub fn records_of(
        &self,
        space: &mut AddressSpace<'_>,
        off: KernelOffset,
        sites: &[u64],
    ) -> Result<Vec<Option<FoundRecord>>, FtraceRecordsError> {
        let l = self.layout;
        let mut order: Vec<usize> = (0..sites.len()).collect();
        order.sort_by_key(|&k| sites[k]);
        let mut found = vec![None; sites.len()];
        let mut pg = read_u64(space, off.runtime(self.pages_start), PAGES_START)?;
        let mut total = 0u64;
        for _ in 0..MAX_PAGES {
            if pg == 0 {
                return Ok(found);
            }
            let records = read_u64(space, pg + l.pg_records, "ftrace_page.records")?;
            let index = read_u32(space, pg + l.pg_index, "ftrace_page.index")?;
            total += u64::from(index);
            if total > MAX_RECORDS {
                return Err(FtraceRecordsError::Walk(format!(
                    "more than {MAX_RECORDS} records"
                )));
            }
            let mut bytes = vec![0u8; (u64::from(index) * l.rec_size) as usize];
            space
                .read(records, &mut bytes)
                .map_err(|e| FtraceRecordsError::Read {
                    what: "ftrace records",
                    va: records,
                    why: e.to_string(),
                })?;
            for (i, rec) in bytes.chunks_exact(l.rec_size as usize).enumerate() {
                let word = |at: u64| {
                    let at = at as usize;
                    u64::from_le_bytes(rec[at..at + 8].try_into().expect("8 bytes"))
                };
                let ip = word(l.rec_ip);
                // The last site at or before `ip`: its record if `ip` is
                // within its bytes.
                let p = order.partition_point(|&k| sites[k] <= ip);
                let Some(&k) = p.checked_sub(1).map(|p| &order[p]) else {
                    continue;
                };
                if ip - sites[k] < SITE_LEN as u64 {
                    found[k] = Some(FoundRecord {
                        ip,
                        flags_va: records + i as u64 * l.rec_size + l.rec_flags,
                        flags: word(l.rec_flags),
                    });
                }
            }
            pg = read_u64(space, pg + l.pg_next, "ftrace_page.next")?;
        }
        Err(FtraceRecordsError::Walk(format!(
            "more than {MAX_PAGES} pages"
        )))
    }

    /// Where the words a detach reads are in guest physical memory (kernel
    /// data does not move): `ftrace_lock`'s owner, `ftrace_ops_list`, and
    /// the running address of `ftrace_list_end`.
    pub fn detach_words(
        &self,
        space: &mut AddressSpace<'_>,
        off: KernelOffset,
    ) -> Result<DetachWords, FtraceRecordsError> {
        let mut gpa = |va: u64, what: &'static str| {
            space.gpa(va).map_err(|e| FtraceRecordsError::Read {
                what,
                va,
                why: e.to_string(),
            })
        };
        Ok(DetachWords {
            lock_owner: gpa(
                off.runtime(self.ftrace_lock) + self.layout.mutex_owner,
                FTRACE_LOCK,
            )?,
            ops_list: gpa(off.runtime(self.ops_list), OPS_LIST)?,
            list_end: off.runtime(self.list_end),
        })
    }
}

/// What a detach reads to tell whether it may clear the flag again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DetachWords {
    /// Guest physical address of `ftrace_lock`'s owner word.
    pub lock_owner: u64,
    /// Guest physical address of `ftrace_ops_list`.
    pub ops_list: u64,
    /// Running address of `ftrace_list_end`.
    pub list_end: u64,
}

/// The records vmtrace disabled at an attach, to enable again at the
/// detach.
#[derive(Clone, Debug)]
pub struct Excluded {
    /// (site, guest physical address of its record's flags word).
    pub records: Vec<(u64, u64)>,
    pub words: DetachWords,
    pub disabled: u64,
}

/// Why a detach left records disabled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeptWhy {
    /// Some `ftrace_ops` of the guest's is registered: it did not count
    /// these records while they were disabled, and could count down a
    /// record enabled now below zero when it goes (`FTRACE_WARN_ON`, then
    /// `ftrace_kill`).
    OpsRegistered,
    /// The guest held `ftrace_lock`: it is changing its records.
    LockHeld,
    /// A site did not get its NOP back (the guest changed it).
    SiteChanged,
    /// The guest's words could not be read.
    Unreadable,
}

impl std::fmt::Display for KeptWhy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KeptWhy::OpsRegistered => "its ftrace was in use at the detach",
            KeptWhy::LockHeld => "it was changing its ftrace at the detach",
            KeptWhy::SiteChanged => "their sites were changed by the guest and left alone",
            KeptWhy::Unreadable => "its ftrace's words could not be read at the detach",
        })
    }
}

/// What a detach did with the records an attach disabled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reenabled {
    pub cleared: usize,
    /// Left disabled (until the guest reboots), and why.
    pub kept: usize,
    pub why: Option<KeptWhy>,
}

impl Excluded {
    /// Set the flag on every record (under the attach's stop, the locks
    /// found free); on an error, none stays set.
    pub fn disable(&self, mem: &dyn GuestRam) -> Result<(), FtraceRecordsError> {
        for (i, &(_, gpa)) in self.records.iter().enumerate() {
            if let Err(e) = load(mem, gpa).and_then(|f| store(mem, gpa, f | self.disabled)) {
                let done = Excluded {
                    records: self.records[..i].to_vec(),
                    ..self.clone()
                };
                let _ = done.undo(mem);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Clear the flag again where that leaves the guest's ftrace as it
    /// would be had vmtrace never come: no ops registered (so every
    /// record's count is 0 and nothing counted these), `ftrace_lock`
    /// free, and the site back to the guest's NOP (`restored(site)`).
    pub fn reenable(
        &self,
        mem: &dyn GuestRam,
        restored: impl Fn(u64) -> bool,
    ) -> Result<Reenabled, FtraceRecordsError> {
        let n = self.records.len();
        let kept = |why| Reenabled {
            cleared: 0,
            kept: n,
            why: Some(why),
        };
        if n == 0 {
            return Ok(Reenabled::default());
        }
        if RecordLayout::held(load(mem, self.words.lock_owner)?) {
            return Ok(kept(KeptWhy::LockHeld));
        }
        if load(mem, self.words.ops_list)? != self.words.list_end {
            return Ok(kept(KeptWhy::OpsRegistered));
        }
        let mut done = Reenabled::default();
        for &(site, gpa) in &self.records {
            let flags = load(mem, gpa)?;
            if restored(site) && flags & self.disabled != 0 {
                store(mem, gpa, flags & !self.disabled)?;
                done.cleared += 1;
            } else {
                done.kept += 1;
                done.why = Some(KeptWhy::SiteChanged);
            }
        }
        Ok(done)
    }

    /// Clear the flag set by `disable` in the same stop (an attach that
    /// failed after it).
    pub fn undo(&self, mem: &dyn GuestRam) -> Result<(), FtraceRecordsError> {
        for &(_, gpa) in &self.records {
            let flags = load(mem, gpa)?;
            store(mem, gpa, flags & !self.disabled)?;
        }
        Ok(())
    }
}

fn read_u64(
    space: &mut AddressSpace<'_>,
    va: u64,
    what: &'static str,
) -> Result<u64, FtraceRecordsError> {
    space.read_u64(va).map_err(|e| FtraceRecordsError::Read {
        what,
        va,
        why: e.to_string(),
    })
}

fn read_u32(
    space: &mut AddressSpace<'_>,
    va: u64,
    what: &'static str,
) -> Result<u32, FtraceRecordsError> {
    space
        .read_array::<4>(va)
        .map(u32::from_le_bytes)
        .map_err(|e| FtraceRecordsError::Read {
            what,
            va,
            why: e.to_string(),
        })
}

fn load(mem: &dyn GuestRam, gpa: u64) -> Result<u64, FtraceRecordsError> {
    mem.load_u64(GuestAddress(gpa), Ordering::SeqCst)
        .map_err(|e| FtraceRecordsError::Read {
            what: "ftrace word",
            va: gpa,
            why: e.to_string(),
        })
}

fn store(mem: &dyn GuestRam, gpa: u64, v: u64) -> Result<(), FtraceRecordsError> {
    mem.store_data_u64(v, GuestAddress(gpa))
        .map_err(|e| FtraceRecordsError::Read {
            what: "ftrace word (write)",
            va: gpa,
            why: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestMemoryMmap};
    use vmm::gva::PagingMode;

    /// Kernel virtual addresses at 0xffffffff81000000 + x are guest
    /// physical 0x1000000 + x under the boot tables.
    const BASE: u64 = 0xffff_ffff_8100_0000;
    const PHYS: u64 = 0x100_0000;

    /// Linux 6.1's layout on x86-64.
    const LAYOUT: RecordLayout = RecordLayout {
        rec_size: 16,
        rec_ip: 0,
        rec_flags: 8,
        pg_next: 0,
        pg_records: 8,
        pg_index: 16,
        mutex_owner: 0,
        disabled: 1 << 25,
        enabled: 1 << 31,
        ref_max: (1 << 23) - 1,
    };

    /// Where the symbols and structures go (offsets from BASE).
    const PAGES_START: u64 = 0x10_0000;
    const LOCK: u64 = 0x10_0100;
    const TEXT: u64 = 0x10_0200;
    const OPS: u64 = 0x10_0300;
    const END: u64 = 0x10_0400;
    const PAGE1: u64 = 0x11_0000;
    const PAGE2: u64 = 0x11_0100;
    const RECS1: u64 = 0x12_0000;
    const RECS2: u64 = 0x13_0000;

    fn put(mem: &GuestMemoryMmap, off: u64, v: u64) {
        mem.write_obj(v, GuestAddress(PHYS + off)).unwrap();
    }

    fn get(mem: &GuestMemoryMmap, off: u64) -> u64 {
        mem.read_obj(GuestAddress(PHYS + off)).unwrap()
    }

    /// Two record pages: (ip, flags) each.
    fn guest(page1: &[(u64, u64)], page2: &[(u64, u64)]) -> GuestMemoryMmap {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 64 << 20)]).unwrap();
        vmm::boot::regs::setup_page_tables(&mem).unwrap();
        put(&mem, PAGES_START, BASE + PAGE1);
        for (page, next, recs, list) in [
            (PAGE1, BASE + PAGE2, RECS1, page1),
            (PAGE2, 0, RECS2, page2),
        ] {
            put(&mem, page, next);
            put(&mem, page + 8, BASE + recs);
            mem.write_obj(list.len() as u32, GuestAddress(PHYS + page + 16))
                .unwrap();
            for (i, &(ip, flags)) in list.iter().enumerate() {
                put(&mem, recs + 16 * i as u64, ip);
                put(&mem, recs + 16 * i as u64 + 8, flags);
            }
        }
        put(&mem, OPS, BASE + END);
        mem
    }

    fn records() -> FtraceRecords {
        FtraceRecords {
            layout: LAYOUT,
            pages_start: BASE + PAGES_START,
            ftrace_lock: BASE + LOCK,
            text_mutex: BASE + TEXT,
            ops_list: BASE + OPS,
            list_end: BASE + END,
        }
    }

    const ZERO: KernelOffset = KernelOffset { virt: 0, phys: 0 };

    #[test]
    fn flags_tell_free_disabled_and_used_records() {
        assert_eq!(LAYOUT.use_of(0), RecordUse::Free);
        assert_eq!(LAYOUT.use_of(1 << 25), RecordUse::Disabled);
        assert_eq!(LAYOUT.use_of(1), RecordUse::InUse);
        assert_eq!(LAYOUT.use_of(1 << 31), RecordUse::InUse);
        // Disabled yet enabled: skip_record() does not skip it.
        assert_eq!(LAYOUT.use_of((1 << 31) | (1 << 25)), RecordUse::InUse);
        // A flag above the count (REGS) alone is no reference.
        assert_eq!(LAYOUT.use_of(1 << 30), RecordUse::Free);
        assert!(!RecordLayout::held(0));
        assert!(!RecordLayout::held(MUTEX_FLAGS));
        assert!(RecordLayout::held(0xffff_8880_0123_4500));
    }

    #[test]
    fn the_walk_finds_each_sites_record_across_pages() {
        let (a, b, c, d) = (BASE + 0x1000, BASE + 0x2000, BASE + 0x3000, BASE + 0x4000);
        let mem = guest(&[(a, 0), (b, 1)], &[(c + 4, 1 << 25), (BASE + 0x9000, 0)]);
        let mut space = AddressSpace::new(&mem, vmm::layout::PML4_START, PagingMode::Level4);
        let r = records();
        // d has no record; c's record is 4 bytes in (an endbr64 first).
        let found = r.records_of(&mut space, ZERO, &[d, c, a, b]).unwrap();
        let uses: Vec<_> = found
            .iter()
            .map(|f| f.map(|f| LAYOUT.use_of(f.flags)))
            .collect();
        assert_eq!(
            uses,
            [
                None,
                Some(RecordUse::Disabled),
                Some(RecordUse::Free),
                Some(RecordUse::InUse)
            ]
        );
        assert_eq!(found[2].unwrap().flags_va, BASE + RECS1 + 8);
        assert_eq!(found[1].unwrap().ip, c + 4);
        assert_eq!(r.held_lock(&mut space, ZERO).unwrap(), None);
        put(&mem, TEXT, 0xffff_8880_0000_1000);
        assert_eq!(r.held_lock(&mut space, ZERO).unwrap(), Some(TEXT_MUTEX));
    }

    #[test]
    fn a_detach_clears_the_flag_only_when_the_guests_ftrace_is_idle() {
        let a = BASE + 0x1000;
        let mem = guest(&[(a, 1 << 30)], &[]);
        let mut space = AddressSpace::new(&mem, vmm::layout::PML4_START, PagingMode::Level4);
        let r = records();
        let ex = Excluded {
            records: vec![(a, PHYS + RECS1 + 8)],
            words: r.detach_words(&mut space, ZERO).unwrap(),
            disabled: LAYOUT.disabled,
        };
        ex.disable(&mem).unwrap();
        assert_eq!(get(&mem, RECS1 + 8), (1 << 30) | (1 << 25));

        // An ops registered: the flag stays.
        put(&mem, OPS, BASE + 0x5000);
        let kept = ex.reenable(&mem, |_| true).unwrap();
        assert_eq!((kept.kept, kept.why), (1, Some(KeptWhy::OpsRegistered)));
        put(&mem, OPS, BASE + END);
        // ftrace_lock held: the flag stays.
        put(&mem, LOCK, 0xffff_8880_0000_2001);
        let kept = ex.reenable(&mem, |_| true).unwrap();
        assert_eq!(kept.why, Some(KeptWhy::LockHeld));
        put(&mem, LOCK, 0);
        // A site not given back its NOP: the flag stays on it.
        let kept = ex.reenable(&mem, |_| false).unwrap();
        assert_eq!((kept.cleared, kept.kept), (0, 1));
        assert_eq!(kept.why, Some(KeptWhy::SiteChanged));
        // Idle: cleared, the other flags as they were.
        let done = ex.reenable(&mem, |s| s == a).unwrap();
        assert_eq!((done.cleared, done.kept, done.why), (1, 0, None));
        assert_eq!(get(&mem, RECS1 + 8), 1 << 30);
    }
}
