//! The guest's own ftrace records of a module's sites that vmtrace writes
//! at a load (`vmtrace attach`'s exitless mode, `crate::qemu::module_follow`;
//! the own VMM, `super::module_traps`), marked as the attach marks
//! its sites' (`crate::session::guest_ftrace`): `FTRACE_FL_DISABLED`, so
//! that the guest's ftrace never writes, checks nor counts a site holding
//! vmtrace's call, and a site the guest's ftrace uses is left out.
//!
//! Judged once `ftrace_module_enable` has returned, not at its entry: until
//! then the module's records are the kernel's own disabled ones
//! (`ftrace_module_init`), and the function clears that flag on each and
//! enables those the guest's tracers filter on (kernel/trace/ftrace.c).

use vm_memory::GuestAddress;
use vmm::gva::AddressSpace;
use vmm::GuestRam;

use crate::kernel::ftrace_records::{Excluded, FtraceRecords, RecordUse, Reenabled};
use crate::kernel::kaslr::KernelOffset;

/// What to do with one site of a module just loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Judged {
    /// Mark its record (the flags word at this guest-physical address)
    /// and write the site.
    Mark(u64),
    /// Write the site; its record is the kernel's to keep (disabled by
    /// the kernel itself, or none found, or the records unreadable: as
    /// the attach, which then says so).
    Write,
    /// Leave it untraced: the guest's ftrace uses it, or was changing
    /// its records (`ftrace_lock` or `text_mutex` held) at the load.
    InUse,
}

/// The records of the guest's ftrace, and those marked at loads.
#[derive(Debug)]
pub struct Marks {
    records: FtraceRecords,
    offset: KernelOffset,
    /// (site, guest-physical address of its record's flags word).
    marked: Vec<(u64, u64)>,
}

impl Marks {
    pub fn new(records: FtraceRecords, offset: KernelOffset) -> Marks {
        Marks {
            records,
            offset,
            marked: Vec::new(),
        }
    }

    /// Each of `sites` (a module's, just enabled by the guest's ftrace):
    /// what to do with it. Reads only.
    pub fn judge(&self, space: &mut AddressSpace<'_>, sites: &[u64]) -> Vec<Judged> {
        let all = |j| vec![j; sites.len()];
        match self.records.held_lock(space, self.offset) {
            Ok(Some(_)) => return all(Judged::InUse),
            Ok(None) => {}
            Err(_) => return all(Judged::Write),
        }
        let Ok(found) = self.records.records_of(space, self.offset, sites) else {
            return all(Judged::Write);
        };
        found
            .into_iter()
            .map(|rec| {
                let Some(rec) = rec else {
                    return Judged::Write;
                };
                match self.records.layout.use_of(rec.flags) {
                    RecordUse::InUse => Judged::InUse,
                    RecordUse::Disabled => Judged::Write,
                    RecordUse::Free => match space.gpa(rec.flags_va) {
                        Ok(gpa) => Judged::Mark(gpa),
                        Err(_) => Judged::InUse,
                    },
                }
            })
            .collect()
    }

    /// Sets the flag of the record at `gpa` (site `va`'s), before its
    /// site is written.
    pub fn mark(&mut self, ram: &dyn GuestRam, va: u64, gpa: u64) -> Result<(), String> {
        self.flip(ram, gpa, true)?;
        self.marked.push((va, gpa));
        Ok(())
    }

    /// The site at `va` was not written after all: its record as it was.
    pub fn unmark(&mut self, ram: &dyn GuestRam, va: u64) -> Result<(), String> {
        let Some(i) = self.marked.iter().position(|m| m.0 == va) else {
            return Ok(());
        };
        let (_, gpa) = self.marked.swap_remove(i);
        self.flip(ram, gpa, false)
    }

    /// The site at `va` goes with its module: the kernel frees its record
    /// (`ftrace_release_mod`), which is never written again.
    pub fn forget(&mut self, va: u64) {
        self.marked.retain(|m| m.0 != va);
    }

    /// At the detach, once the sites are restored (`restored(site)`):
    /// the records marked given back where the attach's would be
    /// (`Excluded::reenable`), else kept and said.
    pub fn give_back(
        &mut self,
        space: &mut AddressSpace<'_>,
        restored: impl Fn(u64) -> bool,
    ) -> Reenabled {
        let records = std::mem::take(&mut self.marked);
        if records.is_empty() {
            return Reenabled::default();
        }
        let n = records.len();
        let Ok(words) = self.records.detach_words(space, self.offset) else {
            return crate::session::guest_ftrace::unreadable(n);
        };
        let ex = Excluded {
            records,
            words,
            disabled: self.records.layout.disabled,
        };
        crate::session::guest_ftrace::reenable(&ex, space.memory(), restored)
    }

    fn flip(&self, ram: &dyn GuestRam, gpa: u64, set: bool) -> Result<(), String> {
        let at = GuestAddress(gpa);
        let order = std::sync::atomic::Ordering::SeqCst;
        let flags: u64 = ram.load(at, order).map_err(|e| e.to_string())?;
        let bit = self.records.layout.disabled;
        let flags = if set { flags | bit } else { flags & !bit };
        ram.store(flags, at, order).map_err(|e| e.to_string())
    }
}
