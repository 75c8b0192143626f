//! Keeping the guest's own ftrace off the sites vmtrace patches.
//!
//! The guest's ftrace expects its NOP at every site it enables (perf's or
//! trace-cmd's function tracer, kprobes on a function entry, BPF fentry,
//! livepatch); finding vmtrace's call there is its `ftrace_bug` and
//! `ftrace_kill()`, until the guest reboots. So in the stop that patches
//! the sites, an attach marks their records disabled, as the kernel does
//! for weak functions (`kernel::ftrace_records`), and leaves out the sites
//! the guest's ftrace already uses; the detach's stop gives the records
//! back when that leaves ftrace's accounting as it was. Meanwhile the
//! guest's ftrace does not see those functions: `set_ftrace_filter`
//! refuses them, and a kprobe, BPF fentry or livepatch attached to one
//! gets no call.

use std::collections::HashSet;
use std::sync::Arc;

use vmm::gva::AddressSpace;
use vmm::GuestRam;

use crate::error::TracerError;
use crate::kernel::ftrace_records::{
    DetachWords, Excluded, FtraceRecords, KeptWhy, RecordUse, Reenabled,
};
use crate::kernel::kaslr::KernelOffset;
use crate::kernel::sites::FENTRY;
use crate::plan::Plan;
use crate::session::direct::attach::DirectChecked;
use crate::session::exitless::map::Mapped;
use crate::session::patch::{PatchError, PatchedSite, Surveyed};
use crate::session::{NotReady, Tracer};

/// What an attach wrote: the sites, how many were skipped, how vmtrace's
/// region was mapped, and what was done for the guest's ftrace.
type Written = (Vec<PatchedSite>, usize, Option<Mapped>, Guarded);

/// How far a tracer can keep the guest's ftrace off its sites.
#[derive(Debug)]
pub enum Guard {
    /// The kernel has no ftrace of its own (not Linux, or no
    /// `__fentry__`): nothing to keep off.
    NoFtrace,
    /// Its records can be found and marked.
    Records(FtraceRecords),
    /// They cannot: why.
    Unguarded(String),
}

/// What an attach did for the guest's ftrace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Guarded {
    /// Records vmtrace marked disabled.
    pub excluded: usize,
    /// Sites left out because the guest's ftrace uses them.
    pub in_use: usize,
    /// Why the sites' records were not marked (the guest's ftrace must
    /// then stay off the traced functions).
    pub unguarded: Option<String>,
}

/// What an attach's stop will do for the guest's ftrace: the records to
/// mark, once the sites are written.
#[derive(Debug)]
pub struct Staged {
    pub excluded: Option<Excluded>,
    pub guarded: Guarded,
}

impl Guard {
    /// From the plan's kernel, before any stop (reading the flags from
    /// BTF scans all its types).
    pub fn of(plan: &Plan) -> Guard {
        if !plan.image.linux || plan.image.symbol(FENTRY).is_none() {
            return Guard::NoFtrace;
        }
        match FtraceRecords::find(&plan.image, plan.btf.as_deref()) {
            Ok(r) => Guard::Records(r),
            Err(e) => Guard::Unguarded(e.to_string()),
        }
    }

    /// Under the attach's stop, before anything is written: the guest is
    /// not ready while it holds `ftrace_lock` or `text_mutex`; otherwise
    /// the sites whose records the guest uses are left out of `surveyed`
    /// (`direct`: direct entries, whose survey is kept whole; such an
    /// entry holds a call, which the direct survey leaves alone), and the
    /// free records of the others are staged for marking. Reads only.
    pub fn stage(
        &self,
        space: &mut AddressSpace<'_>,
        off: KernelOffset,
        surveyed: Surveyed,
        direct: bool,
    ) -> Result<(Surveyed, Staged), NotReady> {
        let r = match self {
            Guard::NoFtrace => return Ok((surveyed, Staged::unguarded(None))),
            Guard::Unguarded(why) => return Ok((surveyed, Staged::unguarded(Some(why.clone())))),
            Guard::Records(r) => r,
        };
        match r.held_lock(space, off) {
            Ok(Some(lock)) => return Err(NotReady::GuestFtraceBusy { lock }),
            Ok(None) => {}
            Err(e) => return Ok((surveyed, Staged::unguarded(Some(e.to_string())))),
        }
        let sites = surveyed.sites();
        let addrs: Vec<u64> = sites.iter().map(|&(_, a, _)| a).collect();
        let staged = r.records_of(space, off, &addrs).and_then(|found| {
            let mut records = Vec::new();
            let mut in_use = Vec::new();
            for (&(k, site, written), rec) in sites.iter().zip(found) {
                let Some(rec) = rec else { continue };
                match r.layout.use_of(rec.flags) {
                    // Its site calls the guest's tracer (not written
                    // anyway), or is about to.
                    RecordUse::InUse => in_use.push(k),
                    RecordUse::Free if written => records.push((site, gpa(space, rec.flags_va)?)),
                    RecordUse::Free | RecordUse::Disabled => {}
                }
            }
            let words: DetachWords = r.detach_words(space, off)?;
            Ok((records, in_use, words))
        });
        let (records, in_use, words) = match staged {
            Ok(s) => s,
            Err(e) => return Ok((surveyed, Staged::unguarded(Some(e.to_string())))),
        };
        let surveyed = match direct {
            true => surveyed,
            false => {
                let in_use: HashSet<usize> = in_use.iter().copied().collect();
                surveyed.retain(|k| !in_use.contains(&k))
            }
        };
        let guarded = Guarded {
            excluded: records.len(),
            in_use: if direct { 0 } else { in_use.len() },
            unguarded: None,
        };
        let excluded = Excluded {
            records,
            words,
            disabled: r.layout.disabled,
        };
        Ok((
            surveyed,
            Staged {
                excluded: Some(excluded),
                guarded,
            },
        ))
    }
}

impl Staged {
    fn unguarded(why: Option<String>) -> Staged {
        Staged {
            excluded: None,
            guarded: Guarded {
                unguarded: why,
                ..Guarded::default()
            },
        }
    }
}

fn gpa(
    space: &mut AddressSpace<'_>,
    va: u64,
) -> Result<u64, crate::kernel::ftrace_records::FtraceRecordsError> {
    space.gpa(va).map_err(
        |e| crate::kernel::ftrace_records::FtraceRecordsError::Read {
            what: "ftrace record",
            va,
            why: e.to_string(),
        },
    )
}

impl Tracer {
    /// The guest's ftrace records as its kernel lays them out, when they
    /// can be marked: a module's loaded later are marked the same way
    /// (`crate::session::module_marks`).
    pub fn ftrace_records(&self) -> Option<&FtraceRecords> {
        match &self.guest_ftrace {
            Guard::Records(r) => Some(r),
            _ => None,
        }
    }

    /// Under the attach's stop, every check done: the guest's ftrace kept
    /// off the sites (its records marked before the sites are written,
    /// unmarked again if writing them fails), then the sites written.
    pub(super) fn write_guarded(
        &mut self,
        space: &mut AddressSpace<'_>,
        off: KernelOffset,
        surveyed: Surveyed,
        direct: Option<DirectChecked>,
        ram: &Arc<dyn GuestRam>,
    ) -> Result<Result<Written, NotReady>, TracerError> {
        let staged = self
            .guest_ftrace
            .stage(space, off, surveyed, direct.is_some());
        let (surveyed, staged) = match staged {
            Ok(s) => s,
            Err(not_ready) => return Ok(Err(not_ready)),
        };
        if let Some(ex) = &staged.excluded {
            ex.disable(&**ram).map_err(|e| PatchError::Memory {
                addr: 0,
                gpa: 0,
                why: e.to_string(),
            })?;
        }
        let written = match direct {
            Some(d) => self
                .write_direct(space, surveyed, d, ram)
                .map(|(p, s, m)| (p, s, self.reach.exitless().is_some().then_some(m))),
            None => self.write_sites(space, surveyed, ram),
        };
        match written {
            Ok((patched, skipped, mapped)) => {
                self.excluded = staged.excluded;
                Ok(Ok((patched, skipped, mapped, staged.guarded)))
            }
            Err(e) => {
                if let Some(ex) = &staged.excluded {
                    let _ = ex.undo(&**ram);
                }
                Err(e)
            }
        }
    }

    /// At a detach, the sites restored: the records the attach marked given
    /// back where that is safe (`reenable`), added to the session's.
    pub(super) fn reenable_guest_ftrace(&mut self, mem: &dyn GuestRam) -> Reenabled {
        let Some(ex) = self.excluded.take() else {
            return Reenabled::default();
        };
        let restored: HashSet<u64> = self
            .patched
            .iter()
            .filter(|p| p.holds_original(mem))
            .map(|p| p.addr)
            .collect();
        let r = reenable(&ex, mem, |site| restored.contains(&site));
        let total = &mut self.detached.guest_ftrace;
        total.cleared += r.cleared;
        total.kept += r.kept;
        total.why = total.why.or(r.why);
        r
    }
}

/// Give the records back at a detach (`Excluded::reenable`); where their
/// words cannot be read, they stay disabled.
pub fn reenable(
    excluded: &Excluded,
    mem: &dyn GuestRam,
    restored: impl Fn(u64) -> bool,
) -> Reenabled {
    excluded
        .reenable(mem, restored)
        .unwrap_or(unreadable(excluded.records.len()))
}

/// `n` records kept disabled: the guest's words could not be read.
pub fn unreadable(n: usize) -> Reenabled {
    Reenabled {
        cleared: 0,
        kept: n,
        why: Some(KeptWhy::Unreadable),
    }
}

/// The lines an attach says about the guest's ftrace.
pub fn attach_lines(g: &Guarded) -> Vec<String> {
    let mut lines = Vec::new();
    if g.in_use > 0 {
        lines.push(format!(
            "vmtrace: {} selected functions are in use by the guest's own ftrace: left out",
            g.in_use
        ));
    }
    if let Some(why) = &g.unguarded {
        lines.push(format!(
            "vmtrace: the guest's own ftrace (function tracer, kprobes, BPF fentry, livepatch) \
             must not be enabled on the traced functions until the detach ({why})"
        ));
    }
    lines
}

/// The line a detach says about records it could not give back.
pub fn detach_line(r: &Reenabled) -> Option<String> {
    let why = r.why?;
    (r.kept > 0).then(|| {
        format!(
            "vmtrace: {} functions stay excluded from the guest's own ftrace until it reboots \
             ({why})",
            r.kept
        )
    })
}
