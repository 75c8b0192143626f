//! Exitless direct entries of a module first loaded during the trace
//! (issue 37): written at its load hook's return, as its ftrace sites
//! would be (`super::ModuleFollow::returned`), before any of its code runs.
//!
//! An entry that displaced its ftrace NOP alone gets a `call` to its spare
//! site's body, as an ftrace site (its stub would call that body and jump
//! straight back). One that displaced other instructions (a `notrace` or
//! `__exit` function's first ones) gets a stub of its own in its spare
//! site's stub slot (`crate::session::direct::DirectSites::spare_stub_vas`,
//! mapped and filled with `int3` at the attach), built as an attach's
//! (`crate::session::direct::stub`: `call` the body, the displaced
//! instructions relocated, `jmp` back), from the running bytes decoded
//! again, which must be the instructions the load hook judged; then the
//! site gets its `jmp` there, journaled first.
//!
//! The slot is the function's: at the module's next load it is written
//! again for the new address. The old stub jumps back only into the text
//! the kernel freed at the unload (once the module's exit has run, none
//! of its code may run any more), so nothing can still need it.
//!
//! So is the stub of an attach's direct entry in a traced module
//! (`Reentries`): loaded again elsewhere, its function found again with
//! the same bytes at the same offset (`super::ModuleHooks::loading`), the
//! entry's stub is written again in the attach's slot for the new address
//! (its relocated instructions' targets and its jump back were the old
//! address's), and the new site jumps there.

use std::collections::HashMap;

use vmm::gva::AddressSpace;

use super::{FollowError, ModuleFollow};
use crate::kernel::direct::DirectSite;
use crate::kernel::sites::SITE_LEN;
use crate::plan::exitless::trampoline::call_bytes;
use crate::session::direct::{same_instructions, stub, Head};

/// The attach's direct entries of traced modules that displaced other
/// instructions than an ftrace NOP, by running address: the stub each
/// jumps to and the body it calls, and their analysis.
#[derive(Debug, Default)]
pub(super) struct Reentries {
    stubs: HashMap<u64, (u64, u64)>,
    sites: HashMap<u64, DirectSite>,
}

impl Reentries {
    /// The attach's site at `va` jumps to `stub`, which calls `body` (if
    /// it does, and the entry displaced instructions).
    pub(super) fn note(&mut self, va: u64, stub: u64, body: Option<u64>) {
        if let Some(body) = body {
            self.stubs.insert(va, (stub, body));
        }
    }
}

impl ModuleFollow {
    /// Give the spare sites their direct stub slots, by slot (`spare`;
    /// empty: none), and the attach's direct entries in traced modules
    /// their analysis (`attach`, by running address: those that displaced
    /// instructions are traced again at a reload).
    pub fn with_direct(
        mut self,
        spare: Vec<u64>,
        attach: HashMap<u64, DirectSite>,
    ) -> ModuleFollow {
        self.spare_stubs = spare;
        self.reentries.sites = attach;
        self
    }

    /// What the attach's site at `at`, an entry that displaced
    /// instructions, calls once its module is loaded elsewhere: its
    /// stub's body, if its stub can be written again.
    pub(super) fn reentry_body(&self, at: u64) -> Option<u64> {
        let r = &self.reentries;
        r.sites.get(&at).and(r.stubs.get(&at)).map(|s| s.1)
    }

    /// The direct entry at `va` of a module loaded now, if it displaced
    /// other instructions than its ftrace NOP (it needs a stub), and the
    /// slot of its stub: a first-loaded module's spare one, or the
    /// attach's entry's.
    fn displacing(&self, va: u64) -> Option<(DirectSite, u64)> {
        if let Some(at) = self.hooks.attach_site_of(va) {
            let r = &self.reentries;
            let (site, stub) = (r.sites.get(&at)?, r.stubs.get(&at)?.0);
            return Some((site.clone(), stub));
        }
        let first = self.hooks.first.as_ref()?;
        let site = first.direct.as_ref()?.sites.get(&va)?;
        let stub = self.spare_stubs.get(first.slot_of(va)?).copied();
        stub.filter(|_| !site.ftrace_nop).map(|s| (site.clone(), s))
    }

    /// The site at `va` of a module loaded now gets vmtrace's bytes: a
    /// `call` to `body`, or (a direct entry that displaced instructions)
    /// its stub, then a `jmp` to it.
    pub(super) fn write_site(
        &mut self,
        space: &mut AddressSpace<'_>,
        va: u64,
        body: u64,
    ) -> Result<(), FollowError> {
        let site = |why: String| FollowError::Site { addr: va, why };
        let bytes = match self.displacing(va) {
            None => call_bytes(va, body).map_err(|e| site(e.to_string()))?,
            Some((d, at)) => write_stub(space, va, &d, (body, at))?,
        };
        self.rewrite(space, va, bytes)
    }
}

/// Writes the stub of the entry `d` (its displaced instructions, at any
/// address) now at `va`, calling `body`, in its slot `at`; the jump its
/// site gets.
fn write_stub(
    space: &mut AddressSpace<'_>,
    va: u64,
    d: &DirectSite,
    (body, at): (u64, u64),
) -> Result<[u8; SITE_LEN], FollowError> {
    let site = |why: String| FollowError::Site { addr: va, why };
    let mut bytes = vec![0u8; d.len];
    space
        .read(va, &mut bytes)
        .map_err(|e| site(format!("reading its displaced bytes: {e}")))?;
    // The text is final since the load hook judged it (or found the
    // attach's bytes): the same instructions, or nothing is written.
    let live = same_instructions(d, &bytes, va)
        .ok_or_else(|| site("its first instructions changed since its load hook".into()))?;
    let code =
        stub::build(va, d.len, &live, Head::Call(body), at).map_err(|e| site(e.to_string()))?;
    let jump = stub::jump(va, at).ok_or_else(|| site(format!("{at:#x} out of reach")))?;
    space
        .write(at, &code)
        .map_err(|e| site(format!("writing its stub at {at:#x}: {e}")))?;
    Ok(jump)
}
