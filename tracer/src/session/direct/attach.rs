//! A tracer's attach with direct entries: the survey and context check
//! (reads only), then the writes (code page mapped, stubs, jumps).

use std::sync::Arc;

use vmm::gva::AddressSpace;
use vmm::{GuestRam, Stopped};

use super::contexts::{self, Stacks, VcpuRegs};
use super::{jump_for, keep_stubbed, DirectSurvey, Head, Ready};
use crate::error::TracerError;
use crate::kernel::kaslr::KernelOffset;
use crate::session::exitless::map::Mapped;
use crate::session::patch::{self, PatchError, PatchedSite, Surveyed};
use crate::session::{NotReady, Tracer};

/// Attaches that may find a guest context inside a site's displaced bytes
/// and wait for the next pause; after them such sites are left out.
pub const MAX_BUSY_WAITS: u32 = 50;

/// What an attach's checks found of the direct sites.
#[derive(Debug, Default)]
pub struct DirectChecked {
    pub ready: Vec<Ready>,
}

impl Tracer {
    /// Where each spare stub runs, by spare site (slot), for the direct
    /// entries of modules first loaded during the trace; empty: none (no
    /// direct entries, or the function graph's).
    pub fn direct_spare_stubs(&self) -> Vec<u64> {
        let direct = self.direct.as_ref();
        direct.map(|d| d.sites.spare_stub_vas()).unwrap_or_default()
    }

    /// The survey of the direct sites under `paused` at `off`, and the
    /// check that no guest context is inside one (`contexts`): the sites
    /// to write, or why the guest is not ready. Reads only.
    pub(in crate::session) fn check_direct(
        &mut self,
        space: &mut AddressSpace<'_>,
        off: KernelOffset,
        paused: &dyn Stopped,
    ) -> Result<Result<(Surveyed, DirectChecked), NotReady>, TracerError> {
        let (fentry, calls) = self.call_sites(off);
        let wait = calls == patch::CallSites::Wait;
        let direct = self.direct.as_mut().expect("a direct tracer");
        let (surveyed, ready, changed) = match direct.sites.survey(space, off.virt, fentry, wait)? {
            DirectSurvey::CallSites { calls, first } => {
                return Ok(Err(NotReady::CallSites { calls, first }))
            }
            DirectSurvey::Ready {
                surveyed,
                ready,
                changed,
            } => (surveyed, ready, changed),
        };
        let vcpus = VcpuRegs::of(paused);
        let stacks = Stacks::read(space, &self.stack_layout, off, paused.cpus());
        // On a preemptible kernel, the stacks of every task it may have
        // preempted in kernel mode too.
        let tasks = match self.plan.direct.as_ref().and_then(|d| d.preempted) {
            None => Vec::new(),
            Some(list) => match contexts::task_stacks(space, &list, off.virt) {
                Ok(t) => t,
                Err(e) if direct.busy_waits < MAX_BUSY_WAITS => {
                    direct.busy_waits += 1;
                    return Ok(Err(NotReady::DirectTasks { why: e.to_string() }));
                }
                Err(e) => return Err(PatchError::TaskWalk(e.to_string()).into()),
            },
        };
        let ranges = direct.sites.ranges(off.virt);
        let found = contexts::find(space, &ranges, &vcpus, &stacks, &tasks);
        let who = |cpu: Option<usize>| match cpu {
            Some(cpu) => format!("vCPU {cpu}"),
            None => "a task switched out".to_string(),
        };
        if direct.busy_waits < MAX_BUSY_WAITS {
            if let Some(u) = found.unreadable {
                direct.busy_waits += 1;
                return Ok(Err(NotReady::DirectStackUnreadable {
                    who: who(u.cpu),
                    at: u.at,
                }));
            }
            if let Some(b) = found.inside.first() {
                direct.busy_waits += 1;
                return Ok(Err(NotReady::DirectBusy {
                    sites: found.busy_sites().len(),
                    who: who(b.cpu),
                    at: b.at,
                }));
            }
        }
        // Out of waits: a site with a context inside is left out, and
        // every site when a stack could not be read.
        let busy_sites: std::collections::BTreeSet<usize> = match found.unreadable {
            Some(_) => (0..ranges.len()).collect(),
            None => found.busy_sites(),
        };
        let surveyed = surveyed.retain(|k| !busy_sites.contains(&k));
        let ready = ready
            .into_iter()
            .filter(|r| !busy_sites.contains(&r.k))
            .collect();
        direct.counts = (changed, busy_sites.len(), tasks.len());
        Ok(Ok((surveyed, DirectChecked { ready })))
    }

    /// The writes of a direct attach: vmtrace's region mapped (and in
    /// exitless mode installed), every ready site's stub, then the jumps.
    pub(in crate::session) fn write_direct(
        &mut self,
        space: &mut AddressSpace<'_>,
        surveyed: Surveyed,
        checked: DirectChecked,
        ram: &Arc<dyn GuestRam>,
    ) -> Result<(Vec<PatchedSite>, usize, Mapped), TracerError> {
        let mapped = match self.reach.exitless_mut() {
            Some(ex) => ex.install(space, ram)?,
            None => self.install_code_page(space)?,
        };
        let direct = &self.direct.as_ref().expect("a direct tracer").sites;
        let stacks = self.stacks.as_deref();
        let ex = self.reach.exitless();
        let head = |k: usize| match ex {
            // A `--stack` call traps: its stack is unwound host-side.
            Some(ex) if !stacks.is_some_and(|s| s.at(k)) => {
                Head::Call(ex.plan().trampoline.stub_va(k as u32))
            }
            _ => Head::Trap,
        };
        let jumps = direct.write_stubs(space.memory(), &checked.ready, head)?;
        if ex.is_some() {
            direct.write_spares(space.memory())?;
        }
        // In a QEMU's free pages, the stubs' pages were backed just now.
        let mapped = match ex {
            Some(ex) => ex.map_backed(space)?.unwrap_or(mapped),
            None => mapped,
        };
        // Before any jump: traps find their site by the stub's address.
        // The same at every attach: they depend on the site count only.
        let same = self.plan.index.set_stubs(direct.stub_vas());
        debug_assert!(same, "direct stubs moved between attaches");
        let surveyed = keep_stubbed(surveyed, &jumps);
        let (sites, skipped) = patch::write(space.memory(), surveyed, |k, addr| {
            jump_for(&jumps, k, addr)
        })?;
        Ok((sites, skipped, mapped))
    }
}
