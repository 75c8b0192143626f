//! Where vmtrace's own VMM meets the guest kernel's module loader: the
//! module notifier chain's two calls that bracket a module's life as ftrace
//! sees it (kernel/module/main.c). `prepare_coming_module` calls
//! `ftrace_module_enable` (the module's text final and read-only, its
//! ftrace sites NOPs, its ftrace records enabled), then
//! `blocking_notifier_call_chain_robust(&module_notify_list,
//! MODULE_STATE_COMING, MODULE_STATE_GOING, mod)`, before any of the
//! module's code can run (its parameters and its init come after). Every
//! path that frees a module that came that far (`delete_module`, a failed
//! init, a load failing later) first calls
//! `blocking_notifier_call_chain(&module_notify_list, MODULE_STATE_GOING,
//! mod)`, then `ftrace_release_mod`, then frees its text.
//!
//! `vmtrace attach` breaks on `ftrace_module_enable`'s return and on
//! `ftrace_release_mod` (`crate::qemu::module_hooks`): the same two points.
//! The own VMM traps instead, and a trap goes on an ftrace site (a NOP,
//! nothing displaced): kernel/trace/ is built without them, so the two
//! notifier calls' sites stand in for those functions.

use crate::kernel::sites::SiteTable;
use crate::kernel::symbols::KernelImage;

/// The module notifier chain (kernel/module/main.c).
pub const NOTIFY_LIST: &str = "module_notify_list";
/// Called with the chain, `MODULE_STATE_COMING` and the module.
pub const COMING_CALL: &str = "blocking_notifier_call_chain_robust";
/// Called with the chain, `MODULE_STATE_GOING` (or LIVE) and the module.
pub const GOING_CALL: &str = "blocking_notifier_call_chain";
/// `enum module_state` (include/linux/module.h): the value in the chain
/// call's second argument.
pub const MODULE_STATE_COMING: u64 = 1;
pub const MODULE_STATE_GOING: u64 = 2;

/// The two ftrace sites and the chain, at link addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModuleNotify {
    /// `module_notify_list`: the first argument of a module's calls.
    pub list: u64,
    /// The ftrace site of `COMING_CALL`, and of `GOING_CALL`.
    pub coming: u64,
    pub going: u64,
}

/// Which of the two a trap is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Notified {
    /// The module (`struct module *`) is coming: its code not run yet.
    Coming(u64),
    /// The module is going: its text about to be freed.
    Going(u64),
    /// A call on another chain, or of another state: nothing to do.
    Other,
}

impl ModuleNotify {
    /// The kernel's, when it has modules and both calls have an ftrace
    /// site outside the init text; else why not.
    pub fn find(image: &KernelImage, sites: &SiteTable) -> Result<ModuleNotify, String> {
        let list = image
            .symbol(NOTIFY_LIST)
            .ok_or_else(|| format!("`{NOTIFY_LIST}` is not in the kernel's symbols"))?
            .addr;
        let site = |name: &str| {
            let f = image
                .symbol(name)
                .ok_or_else(|| format!("`{name}` is not in the kernel's symbols"))?;
            sites
                .sites
                .iter()
                .find(|s| !s.init && s.addr >= f.addr && s.addr < f.addr + f.size.max(1))
                .map(|s| s.addr)
                .ok_or_else(|| format!("`{name}` has no ftrace site"))
        };
        Ok(ModuleNotify {
            list,
            coming: site(COMING_CALL)?,
            going: site(GOING_CALL)?,
        })
    }

    /// The kernel's, as `find`, for a trace by direct entries, whose
    /// site table holds its direct sites: the ftrace sites of every
    /// function read from the image's `__mcount_loc`, where none of the
    /// direct entries' displaced bytes (`displaced`, link addresses)
    /// covers either site (its stub would run the NOP in vmtrace's page,
    /// and the trap would never be taken); else why not.
    pub fn find_direct(
        image: &KernelImage,
        displaced: &[std::ops::Range<u64>],
    ) -> Result<ModuleNotify, String> {
        let ftrace = SiteTable::build(image).map_err(|e| e.to_string())?;
        let notify = ModuleNotify::find(image, &ftrace)?;
        for (name, site) in [(COMING_CALL, notify.coming), (GOING_CALL, notify.going)] {
            if displaced.iter().any(|d| d.contains(&site)) {
                return Err(format!(
                    "`{name}` is traced by a direct entry, which displaces the ftrace site where vmtrace traps the module loader"
                ));
            }
        }
        Ok(notify)
    }

    /// What a call at the link-time site `site` with argument registers
    /// `args` (RDI, RSI, RDX, RCX, ...) says, the kernel running `slide`
    /// bytes from its link addresses. None: not one of the two sites.
    pub fn notified(&self, site: u64, args: &[u64; 6], slide: i64) -> Option<Notified> {
        let list = self.list.wrapping_add_signed(slide);
        let on_chain = args[0] == list;
        if site == self.coming {
            // (nh, val_up, val_down, v)
            let coming = on_chain && args[1] == MODULE_STATE_COMING;
            return Some(if coming {
                Notified::Coming(args[3])
            } else {
                Notified::Other
            });
        }
        if site == self.going {
            // (nh, val, v)
            let going = on_chain && args[1] == MODULE_STATE_GOING;
            return Some(if going {
                Notified::Going(args[2])
            } else {
                Notified::Other
            });
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_module_chains_coming_and_going_calls_are_modules() {
        let n = ModuleNotify {
            list: 0xffff_ffff_8200_0000,
            coming: 0xffff_ffff_8100_1000,
            going: 0xffff_ffff_8100_2000,
        };
        let slide = 0x1000_0000;
        let list = n.list + slide as u64;
        let module = 0xffff_ffff_c000_1000;
        let coming = [list, MODULE_STATE_COMING, MODULE_STATE_GOING, module, 0, 0];
        assert_eq!(
            n.notified(n.coming, &coming, slide),
            Some(Notified::Coming(module))
        );
        let going = [list, MODULE_STATE_GOING, module, 0, 0, 0];
        assert_eq!(
            n.notified(n.going, &going, slide),
            Some(Notified::Going(module))
        );
        // LIVE (0) on the same chain, another chain, another site.
        let live = [list, 0, module, 0, 0, 0];
        assert_eq!(n.notified(n.going, &live, slide), Some(Notified::Other));
        let other = [list + 8, MODULE_STATE_GOING, module, 0, 0, 0];
        assert_eq!(n.notified(n.going, &other, slide), Some(Notified::Other));
        assert_eq!(n.notified(n.going + 5, &going, slide), None);
    }
}
