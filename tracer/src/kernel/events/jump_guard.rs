//! What vmtrace does when the guest's jump_label code comes to one of the
//! traced events' call sites, whichever backend stops it there (`vmtrace
//! attach`'s breakpoint, `crate::qemu::guarded_sites`; the own VMM's trap
//! at the function's ftrace site, `crate::session::event_jumps`).
//!
//! The guest enabling an event (its key's first probe) calls
//! `arch_jump_label_transform_queue(entry, JUMP_LABEL_JMP)` for each site
//! of its key, which checks that the site holds its NOP and queues the
//! kernel's jump over it (arch/x86/kernel/jump_label.c `__jump_label_patch`,
//! which BUGs on anything else; while the kernel boots,
//! `system_state == SYSTEM_BOOTING`, the same call patches the site at
//! once through `arch_jump_label_transform`, with the same check).
//! vmtrace's jump is that very jump (same length, same target:
//! `super::jump_sites`), so the call is made to return `true` at once, the
//! site untouched: the site never holds its NOP meanwhile, and the event
//! is never lost. The site is the guest's from then on; when the guest
//! disables the event again, the call to make it its NOP returns at once
//! too, and the site, keeping the jump, is vmtrace's again. A site of
//! vmtrace's the kernel is to make its NOP (never taken over) holds the
//! jump its check expects: the call runs.

use std::collections::HashMap;

/// The function the guard stops at (kernel/jump_label.c
/// `__jump_label_update` calls it for every site of a key it updates, x86
/// having `HAVE_JUMP_LABEL_BATCH`).
pub const QUEUE_FN: &str = "arch_jump_label_transform_queue";

/// `enum jump_label_type`'s `JUMP_LABEL_JMP` (include/linux/jump_label.h):
/// `arch_jump_label_transform_queue`'s second argument when the site is
/// to become its jump (its key enabled).
pub const JUMP_LABEL_JMP: u64 = 1;

/// What the guard does at a call of `arch_jump_label_transform_queue`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queued {
    /// Not a site of vmtrace's (or one holding something else than its
    /// jump): the function runs as ever.
    NotOurs,
    /// vmtrace's site, to be made the kernel's jump, which is already
    /// there: the vCPU is to return `true` from the function at once, the
    /// site untouched. The site is the guest's from then on.
    Returned,
    /// vmtrace's site, to be made the NOP (its key disabled): the function
    /// runs, its check finding the jump it expects, and the kernel
    /// patches the site. The site is the guest's from then on.
    Left,
    /// A site the guest took over (`Returned`), to be made its NOP again
    /// as the guest disables its event: the vCPU is to return `true` at
    /// once, the site keeping the jump, which is vmtrace's again (its
    /// event still recorded; given its NOP at the detach).
    TakenBack,
}

impl Queued {
    /// Whether the vCPU is to return `true` from the function at once.
    pub fn returns(self) -> bool {
        matches!(self, Queued::Returned | Queued::TakenBack)
    }

    /// Whether the guest took a site over (it enabled its event).
    pub fn taken_over(self) -> bool {
        matches!(self, Queued::Returned | Queued::Left)
    }
}

/// What a guard did during a trace, for the detach line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GuardCounts {
    /// Calls of `QUEUE_FN` served (the own VMM: exits at its trap).
    pub exits: u64,
    /// Sites given to the guest as it enabled their events, and taken
    /// back as it disabled them.
    pub given: usize,
    pub taken_back: usize,
    /// Sites the guest held at the end: left holding its jumps.
    pub kept: usize,
}

/// The guarded sites by their code's running address, each with what the
/// backend needs to read it (`T`): vmtrace's, and those the guest took
/// over.
#[derive(Debug)]
pub struct GuardedSites<T> {
    /// vmtrace's jumps the guest has not taken over.
    pub ours: HashMap<u64, T>,
    /// Those it took over (enabled their event itself): it may disable
    /// them again, and vmtrace then takes them back.
    pub given: HashMap<u64, T>,
}

impl<T> Default for GuardedSites<T> {
    fn default() -> Self {
        GuardedSites {
            ours: HashMap::new(),
            given: HashMap::new(),
        }
    }
}

impl<T> GuardedSites<T> {
    pub fn new(sites: impl IntoIterator<Item = (u64, T)>) -> GuardedSites<T> {
        GuardedSites {
            ours: sites.into_iter().collect(),
            given: HashMap::new(),
        }
    }

    /// The kernel's call for the site at `code` (`kind`: its
    /// `jump_label_type`), `holds_jump` telling whether a site holds
    /// vmtrace's jump now: what to do, the site moved between `ours` and
    /// `given` accordingly (the module's comment). The caller makes the
    /// vCPU return when `Queued::returns` says so, and must, once this
    /// returned `Returned` or `TakenBack`.
    pub fn queue<E>(
        &mut self,
        code: u64,
        kind: u64,
        holds_jump: impl Fn(&T) -> Result<bool, E>,
    ) -> Result<Queued, E> {
        if kind != JUMP_LABEL_JMP {
            // The guest disabling an event it enabled: its site keeps the
            // jump, vmtrace's again, and the event is still recorded.
            if let Some(j) = self.given.remove(&code) {
                if !holds_jump(&j)? {
                    return Ok(Queued::NotOurs);
                }
                self.ours.insert(code, j);
                return Ok(Queued::TakenBack);
            }
        }
        let Some(j) = self.ours.remove(&code) else {
            return Ok(Queued::NotOurs);
        };
        if !holds_jump(&j)? {
            return Ok(Queued::NotOurs);
        }
        if kind != JUMP_LABEL_JMP {
            return Ok(Queued::Left);
        }
        self.given.insert(code, j);
        Ok(Queued::Returned)
    }

    /// Forget the sites in `text` (a module going away): nothing is
    /// written there after.
    pub fn forget(&mut self, text: &std::ops::Range<u64>) {
        self.ours.retain(|va, _| !text.contains(va));
        self.given.retain(|va, _| !text.contains(va));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const JUMP_LABEL_NOP: u64 = 0;
    const A: u64 = 0xffff_ffff_8100_0000;

    fn held(_: &()) -> Result<bool, ()> {
        Ok(true)
    }

    /// Enabled, disabled, enabled again by the guest: the site goes to it
    /// and back, the call returning at once each time; a second enabling
    /// of a site the guest has already is not vmtrace's business.
    #[test]
    fn a_site_goes_to_the_guest_and_back() {
        let mut s = GuardedSites::new([(A, ())]);
        let q = |s: &mut GuardedSites<()>, kind| s.queue(A, kind, held).unwrap();
        assert_eq!(q(&mut s, JUMP_LABEL_JMP), Queued::Returned);
        assert!(s.given.contains_key(&A) && s.ours.is_empty());
        assert_eq!(q(&mut s, JUMP_LABEL_JMP), Queued::NotOurs);
        assert_eq!(q(&mut s, JUMP_LABEL_NOP), Queued::TakenBack);
        assert!(s.ours.contains_key(&A) && s.given.is_empty());
        assert_eq!(q(&mut s, JUMP_LABEL_NOP), Queued::Left);
        assert!(s.ours.is_empty() && s.given.is_empty());
        assert_eq!(q(&mut s, JUMP_LABEL_JMP), Queued::NotOurs);
    }

    /// A site no longer holding vmtrace's jump is left to the kernel, and
    /// forgotten.
    #[test]
    fn a_site_not_holding_the_jump_is_the_kernels() {
        let mut s = GuardedSites::new([(A, ())]);
        let q = s.queue(A, JUMP_LABEL_JMP, |_| Ok::<_, ()>(false));
        assert_eq!(q, Ok(Queued::NotOurs));
        assert!(s.ours.is_empty() && s.given.is_empty());
    }
}
