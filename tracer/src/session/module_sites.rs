//! The sites of modules the guest unloaded during a trace: their text is
//! freed (and may be reused), so a detach writes nothing there.

use vmm::GuestRam;

use crate::kernel::modules::still_loaded;
use crate::kernel::symbols::KernelImage;
use crate::session::patch::{self, DetachCounts, PatchError, PatchedSite};

/// Take out of `patched` the sites in the text of `image`'s modules that
/// are no longer loaded; returns how many. When the module list cannot be
/// read, none: every site is restored as usual (one left patched in a
/// live module would call vmtrace's region after it is gone).
pub fn drop_freed(
    mem: &dyn GuestRam,
    image: &KernelImage,
    patched: &mut Vec<PatchedSite>,
) -> usize {
    let Ok(loaded) = still_loaded(mem, image) else {
        return 0;
    };
    let gone: Vec<_> = image
        .modules
        .iter()
        .zip(loaded)
        .filter(|(_, l)| !l)
        .map(|(m, _)| m.text.clone())
        .collect();
    let before = patched.len();
    patched.retain(|s| !gone.iter().any(|t| t.contains(&s.addr)));
    before - patched.len()
}

/// `patch::detach` of `patched` but the sites of modules unloaded since
/// (`drop_freed`, taken out of `patched`), counted apart.
pub fn detach(
    mem: &dyn GuestRam,
    image: &KernelImage,
    patched: &mut Vec<PatchedSite>,
) -> Result<DetachCounts, PatchError> {
    let module_gone = drop_freed(mem, image, patched);
    Ok(DetachCounts {
        module_gone,
        ..patch::detach(mem, patched)?
    })
}

impl crate::session::Tracer {
    /// Sites at `addrs` given their bytes back by someone else (a
    /// module's, at its unload, `crate::qemu::module_follow`): no longer
    /// the detach's, whose text may since be freed. Their records in the
    /// guest's ftrace went with the module (`ftrace_release_mod` frees
    /// them): never written again, nor counted as kept.
    pub fn forget_sites(&mut self, addrs: &[u64]) {
        self.patched.retain(|s| !addrs.contains(&s.addr));
        if let Some(ex) = self.excluded.as_mut() {
            ex.records.retain(|(site, _)| !addrs.contains(site));
        }
    }
}
