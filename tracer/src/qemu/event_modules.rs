//! Event sites in a module's text are written back only while that very
//! module is loaded (issues 37 and 38): a module unloaded where vmtrace
//! did not follow it (its unload hook not set, or vmtrace killed) has its
//! memory freed, and a freed page may still hold vmtrace's bytes, or hold
//! them again. Each journaled site in a module names it (its `struct
//! module`'s address, name and text: `crate::kernel::module_walk`), and
//! `vmtrace detach`'s repair walks the guest's module list for it first,
//! as the detach walks it for the attach's modules
//! (`super::event_sites::drop_freed`).

use vmm::Stopped;

use super::guest::QemuStop;
use super::journal::JournaledJump;
use crate::kernel::module_walk::ModuleId;
use crate::kernel::symbols::KernelImage;

/// Each of `jumps` in a module of `image` named by it, as it was read.
pub(super) fn tag(jumps: &mut [JournaledJump], image: &KernelImage) {
    for j in jumps.iter_mut() {
        j.module = image.module_at(j.va).map(ModuleId::of);
    }
}

/// The journaled sites the repair may write: those of the kernel image,
/// and those of a module still loaded as journaled (same `struct module`,
/// name and text); how many were left out, their module gone (`gone`) or
/// the module list unreadable (`unchecked`: left alone too, said).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Repairable {
    pub jumps: Vec<JournaledJump>,
    pub gone: usize,
    pub unchecked: usize,
}

/// The sites of `jumps` the repair may write, in `stop`.
pub(super) fn repairable(stop: &QemuStop<'_>, jumps: &[JournaledJump]) -> Repairable {
    let Some(walk) = jumps.iter().find_map(|j| j.module.as_ref()).map(|m| m.walk) else {
        return Repairable {
            jumps: jumps.to_vec(),
            ..Repairable::default()
        };
    };
    let space = crate::session::kernel_space(stop.vcpu_spaces(), &[walk.head]);
    let loaded = space.and_then(|mut s| walk.loaded(&mut s).ok());
    still_loaded(jumps, loaded.as_deref())
}

/// `jumps` but those of a module not among `loaded` (None: the list
/// could not be read, no module's site is kept).
pub(super) fn still_loaded(jumps: &[JournaledJump], loaded: Option<&[ModuleId]>) -> Repairable {
    let mut out = Repairable::default();
    for j in jumps {
        match (&j.module, loaded) {
            (None, _) => out.jumps.push(j.clone()),
            (Some(_), None) => out.unchecked += 1,
            (Some(m), Some(now)) => match now.iter().any(|n| same(n, m)) {
                true => out.jumps.push(j.clone()),
                false => out.gone += 1,
            },
        }
    }
    out
}

/// The same module: same `struct module`, name and text.
fn same(a: &ModuleId, b: &ModuleId) -> bool {
    a.addr == b.addr && a.name == b.name && a.text == b.text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::module_walk::ModuleWalk;

    const WALK: ModuleWalk = ModuleWalk {
        head: 0xffff_ffff_8200_0000,
        list: 8,
        state: 0,
        name: 0x18,
        text_base: 0x100,
        text_size: 0x108,
    };
    const TEXT: u64 = 0xffff_ffff_c000_0000;

    fn module(addr: u64, text: u64) -> ModuleId {
        ModuleId {
            addr,
            name: "vmt_test".into(),
            text: text..text + 0x2000,
            walk: WALK,
        }
    }

    fn jump(va: u64, module: Option<ModuleId>) -> JournaledJump {
        JournaledJump {
            va,
            gpa: 0x1000,
            nop: "0f1f440000".into(),
            jump: "e910000000".into(),
            key_gpa: 0,
            module,
        }
    }

    /// A site of the kernel image is kept; one of a module kept only
    /// while the same module (`struct module`, name, text) is on the
    /// list: loaded again elsewhere, or at the same text with another
    /// `struct module`, it is gone; with no list read, unchecked.
    #[test]
    fn a_modules_sites_are_kept_only_while_that_module_is_loaded() {
        let was = module(0xffff_ffff_c100_0000, TEXT);
        let jumps = [
            jump(0xffff_ffff_8100_0000, None),
            jump(TEXT + 0x10, Some(was.clone())),
        ];
        let kept = |now: &[ModuleId]| still_loaded(&jumps, Some(now));
        assert_eq!(kept(std::slice::from_ref(&was)).jumps, jumps);
        for now in [
            module(0xffff_ffff_c100_0000, TEXT + 0x10_0000),
            module(0xffff_ffff_c110_0000, TEXT),
            ModuleId {
                name: "vmt_tesu".into(),
                ..was.clone()
            },
        ] {
            let r = kept(&[now]);
            assert_eq!(
                (r.jumps.as_slice(), r.gone, r.unchecked),
                (&jumps[..1], 1, 0)
            );
        }
        let r = still_loaded(&jumps, None);
        assert_eq!(
            (r.jumps.as_slice(), r.gone, r.unchecked),
            (&jumps[..1], 0, 1)
        );
    }
}
