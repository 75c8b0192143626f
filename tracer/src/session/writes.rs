//! The writes of an attach with ftrace sites, after every check: vmtrace's
//! region mapped (exitless) or its code page (trap-mode graph), then the
//! sites.

use std::sync::Arc;

use vm_memory::GuestAddress;
use vmm::gva::AddressSpace;
use vmm::GuestRam;

use super::exitless::map::Mapped;
use super::exitless::state::{Exitless, ExitlessError};
use super::patch::{self, PatchError, PatchedSite};
use super::reach::Reach;
use super::Tracer;
use crate::error::TracerError;
use crate::plan::exitless::layout::{CODE_GPA, RETURN_TRAP_OFF};

impl Tracer {
    /// The writes of an attach, after every check: vmtrace's region mapped
    /// (exitless) or its return trap placed (trap-mode graph), then the
    /// surveyed sites. Returns the sites written, those skipped, and how
    /// the region was mapped.
    pub(super) fn write_sites(
        &mut self,
        space: &mut AddressSpace<'_>,
        surveyed: patch::Surveyed,
        ram: &Arc<dyn GuestRam>,
    ) -> Result<(Vec<PatchedSite>, usize, Option<Mapped>), TracerError> {
        if let Some(ex) = self.reach.exitless_mut() {
            let mapped = ex.install(space, ram)?;
            let ex: &Exitless = ex;
            let stacks = self.stacks.as_deref();
            let (modules, slide) = (self.module_traps.as_deref(), self.plan.index.slide());
            let (sites, skipped) = patch::write(space.memory(), surveyed, |k, addr| {
                // A `--stack` call traps: its stack is unwound host-side;
                // so does the site of a module trap (`module_traps`).
                if stacks.is_some_and(|s| s.at(k)) || modules.is_some_and(|m| m.at(addr, slide)) {
                    return Ok(patch::TRAP);
                }
                ex.site_bytes(k, addr).map_err(|e| PatchError::Memory {
                    addr,
                    gpa: 0,
                    why: e.to_string(),
                })
            })?;
            return Ok((sites, skipped, Some(mapped)));
        }
        let mapped = match self.reach.graph_hook().is_some() {
            true => Some(self.install_code_page(space)?),
            false => None,
        };
        let (sites, skipped) = patch::write(space.memory(), surveyed, |_, _| Ok(patch::TRAP))?;
        Ok((sites, skipped, mapped))
    }

    /// Trap mode: map vmtrace's code page (direct entries' stubs, the
    /// function graph's return trap), and with the graph put the return
    /// trap in it (once; it stays until the guest ends, so hooked returns
    /// work after a detach). Mapping first: nothing is written when the
    /// guest's tables refuse it.
    pub(super) fn install_code_page(
        &mut self,
        space: &mut AddressSpace<'_>,
    ) -> Result<crate::session::exitless::map::Mapped, TracerError> {
        let mapped = crate::session::exitless::map::map(space).map_err(ExitlessError::from)?;
        if let Reach::Trap {
            graph: Some(_),
            return_trap_in: in_guest @ false,
        } = &mut self.reach
        {
            space
                .memory()
                .write_slice(
                    &patch::RETURN_TRAP,
                    GuestAddress(CODE_GPA + RETURN_TRAP_OFF),
                )
                .map_err(|e| ExitlessError::Memory(e.to_string()))?;
            *in_guest = true;
        }
        Ok(mapped)
    }
}
