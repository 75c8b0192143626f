//! The function graph through a gdbstub, as a debugger's "finish": each
//! entry's frame waits here for its return, caught by a breakpoint at the
//! return address (one per address, counted by the frames waiting on it).
//! Nothing is written to the guest: no return address is rewritten.
//!
//! A frame is the return address's slot (RSP at the entry: the site is
//! before any push, at an ftrace NOP or a function's first byte) and the
//! return address. A hit at a return breakpoint is a frame's return when
//! `ret` popped that slot (RSP = slot + 8) and RIP is its return address.
//!
//! Frames that never return (a task that exits inside one, a frame an
//! exception fixup unwinds) must not pile up nor be matched by a later
//! stack at the same place. So frames are dropped, counted as `stale`:
//! - deeper than an entry or a return seen on the same stack: a task's
//!   stack is `THREAD_SIZE`-aligned (16 KiB or more), so a 16 KiB-aligned
//!   window holds slots of that stack only, and the stack has since been
//!   popped above them. (IRQ and exception stacks are mapped page by page:
//!   a window may hold the end of a neighbour, whose frame is then dropped
//!   too: its return is not seen, never matched wrongly.)
//! - at an entry's own slot with another return address (that slot now
//!   holds another call's return address).
//!
//! Frames at one slot with the same return address are tail calls (the
//! callee enters with the caller's return address at RSP): they return
//! together, innermost first. At most `MAX_FRAMES` wait; an entry beyond
//! them is not followed (`full`), as the exitless graph's full pool.

use std::collections::{BTreeMap, HashMap};

use crate::session::record::Entered;

/// Frames waiting at most, over all stacks.
pub const MAX_FRAMES: usize = 16_384;
/// Tail calls stacked at one slot at most (the oldest goes first).
const MAX_AT_SLOT: usize = 16;
/// A window of one kernel stack (THREAD_SIZE is 16 KiB at least on x86-64,
/// and stacks are aligned to it: arch/x86/include/asm/page_64_types.h).
const STACK_WINDOW: u64 = 16 << 10;

/// One entry waiting for its return.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Waiting {
    pub entered: Entered,
    /// The vCPU it entered on (a task may return on another).
    pub cpu: usize,
}

/// What an entry or a return did to the return breakpoints.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// A breakpoint to set (its first frame).
    pub set: Option<u64>,
    /// Breakpoints no frame waits on any more.
    pub clear: Vec<u64>,
}

/// The frames waiting, by slot, and the return breakpoints they need.
#[derive(Debug, Default)]
pub struct Frames {
    by_slot: BTreeMap<u64, Vec<Waiting>>,
    /// Frames waiting on each return address (its breakpoint is set while
    /// this is above 0).
    waiting: HashMap<u64, u32>,
    live: usize,
    /// Frames dropped without a return (unwound, or their task gone).
    pub stale: u64,
    /// Entries not followed: `MAX_FRAMES` were waiting.
    pub full: u64,
    /// Return breakpoint hits that were no waiting frame's return.
    pub unmatched: u64,
}

impl Frames {
    /// Frames waiting.
    pub fn live(&self) -> usize {
        self.live
    }

    /// Is a breakpoint set at `addr` for frames waiting on it?
    pub fn breaks_at(&self, addr: u64) -> bool {
        self.waiting.contains_key(&addr)
    }

    /// Every return breakpoint set.
    pub fn addrs(&self) -> impl Iterator<Item = u64> + '_ {
        self.waiting.keys().copied()
    }

    /// The entry `e` on `cpu`: its frame waits (unless `MAX_FRAMES` do).
    pub fn enter(&mut self, e: Entered, cpu: usize) -> Changes {
        let mut ch = Changes::default();
        self.drop_deeper(e.slot, &mut ch);
        let at = self.by_slot.remove(&e.slot).unwrap_or_default();
        let (mut keep, gone): (Vec<Waiting>, Vec<Waiting>) =
            at.into_iter().partition(|f| f.entered.ret == e.ret);
        for f in gone {
            self.forget(&f, &mut ch);
        }
        if keep.len() >= MAX_AT_SLOT {
            let f = keep.remove(0);
            self.forget(&f, &mut ch);
        }
        if self.live >= MAX_FRAMES {
            self.full += 1;
        } else {
            keep.push(Waiting { entered: e, cpu });
            self.live += 1;
            let n = self.waiting.entry(e.ret).or_insert(0);
            *n += 1;
            if *n == 1 {
                // (Cleared just above for a frame gone: it stays set.)
                match ch.clear.iter().position(|&a| a == e.ret) {
                    Some(i) => {
                        ch.clear.swap_remove(i);
                    }
                    None => ch.set = Some(e.ret),
                }
            }
        }
        if !keep.is_empty() {
            self.by_slot.insert(e.slot, keep);
        }
        ch
    }

    /// A stop at return breakpoint `rip` with `rsp`: the frames it returns
    /// (innermost first; empty if none waited), and the breakpoints no
    /// frame needs any more.
    pub fn returned(&mut self, rip: u64, rsp: u64) -> (Vec<Waiting>, Changes) {
        let mut ch = Changes::default();
        let slot = rsp.wrapping_sub(8);
        let ours = self
            .by_slot
            .get(&slot)
            .is_some_and(|at| at.iter().all(|f| f.entered.ret == rip));
        if !ours {
            self.unmatched += 1;
            return (Vec::new(), ch);
        }
        let mut done = self.by_slot.remove(&slot).unwrap_or_default();
        for f in &done {
            self.release(f.entered.ret, &mut ch);
        }
        self.live -= done.len();
        self.drop_deeper(slot, &mut ch);
        done.reverse();
        (done, ch)
    }

    /// Every frame, taken out (the detach): returns the breakpoints to
    /// clear and the frames that never returned.
    pub fn take_all(&mut self) -> (Vec<u64>, usize) {
        let addrs = self.waiting.drain().map(|(a, _)| a).collect();
        let open = self.live;
        self.by_slot.clear();
        self.live = 0;
        (addrs, open)
    }

    /// Drop the frames deeper than `slot` on its stack (below it, in its
    /// 16 KiB window).
    fn drop_deeper(&mut self, slot: u64, ch: &mut Changes) {
        let low = slot & !(STACK_WINDOW - 1);
        let deeper: Vec<u64> = self.by_slot.range(low..slot).map(|(&s, _)| s).collect();
        for s in deeper {
            for f in self.by_slot.remove(&s).unwrap_or_default() {
                self.forget(&f, ch);
            }
        }
    }

    /// Waiting `f` (already out of `by_slot`) will never return.
    fn forget(&mut self, f: &Waiting, ch: &mut Changes) {
        self.stale += 1;
        self.live -= 1;
        self.release(f.entered.ret, ch);
    }

    fn release(&mut self, ret: u64, ch: &mut Changes) {
        if let Some(n) = self.waiting.get_mut(&ret) {
            *n -= 1;
            if *n == 0 {
                self.waiting.remove(&ret);
                ch.clear.push(ret);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STACK: u64 = 0xffff_c900_0001_0000;

    fn entry(site: u32, slot: u64, ret: u64) -> Entered {
        Entered {
            site,
            slot,
            ret,
            task: 7,
        }
    }

    #[test]
    fn a_return_matches_its_frame_by_slot_and_address_and_clears_its_breakpoint() {
        let mut f = Frames::default();
        let ch = f.enter(entry(1, STACK + 0x3f00, 0xa000), 0);
        assert_eq!(ch.set, Some(0xa000));
        // A second frame on the same return address shares the breakpoint.
        let other = 0xffff_c900_0002_0000 + 0x3f00;
        assert_eq!(f.enter(entry(2, other, 0xa000), 1).set, None);
        assert!(f.breaks_at(0xa000));
        // Another path through 0xa000 (no frame at its slot): not a return.
        let (done, ch) = f.returned(0xa000, STACK + 0x2f08);
        assert!(done.is_empty() && ch.clear.is_empty());
        assert_eq!(f.unmatched, 1);
        // Wrong address at the right slot: not a return either.
        assert!(f.returned(0xb000, STACK + 0x3f08).0.is_empty());
        // The first frame's return, on another vCPU: the breakpoint stays
        // for the second.
        let (done, ch) = f.returned(0xa000, STACK + 0x3f08);
        assert_eq!(done.len(), 1);
        assert_eq!((done[0].entered.site, done[0].cpu), (1, 0));
        assert!(ch.clear.is_empty());
        let (done, ch) = f.returned(0xa000, other + 8);
        assert_eq!(done[0].entered.site, 2);
        assert_eq!(ch.clear, vec![0xa000]);
        assert_eq!((f.live(), f.stale), (0, 0));
        assert!(!f.breaks_at(0xa000));
    }

    #[test]
    fn tail_calls_return_together_innermost_first() {
        let mut f = Frames::default();
        f.enter(entry(1, STACK + 0x3f00, 0xa000), 0);
        // The tail callee enters with the caller's return address.
        assert_eq!(f.enter(entry(2, STACK + 0x3f00, 0xa000), 0).set, None);
        let (done, ch) = f.returned(0xa000, STACK + 0x3f08);
        let sites: Vec<u32> = done.iter().map(|d| d.entered.site).collect();
        assert_eq!(sites, [2, 1]);
        assert_eq!(ch.clear, vec![0xa000]);
    }

    /// A task that exits inside a traced function leaves its frame: a
    /// later stack at the same place never returns through it.
    #[test]
    fn frames_that_never_return_are_dropped_not_matched() {
        let mut f = Frames::default();
        // Deep in a stack: a frame whose task exits.
        f.enter(entry(1, STACK + 0x1000, 0xa000), 0);
        // The stack reused: an entry shallower on it drops the frame.
        let ch = f.enter(entry(2, STACK + 0x3000, 0xb000), 0);
        assert_eq!(ch.set, Some(0xb000));
        assert_eq!(ch.clear, vec![0xa000]);
        assert_eq!((f.live(), f.stale), (1, 1));
        // A path through 0xa000 at the old slot is no return now.
        assert!(f.returned(0xa000, STACK + 0x1008).0.is_empty());
        // Another call's return address at a frame's slot: that frame is gone.
        let ch = f.enter(entry(3, STACK + 0x3000, 0xc000), 0);
        assert_eq!((ch.set, ch.clear), (Some(0xc000), vec![0xb000]));
        // A return drops what is deeper on its stack, not on another's.
        let next = STACK + STACK_WINDOW;
        f.enter(entry(4, next + 0x100, 0xd000), 1);
        f.enter(entry(5, STACK + 0x2000, 0xe000), 0);
        let (done, ch) = f.returned(0xc000, STACK + 0x3008);
        assert_eq!(done[0].entered.site, 3);
        assert_eq!(ch.clear.len(), 2, "{ch:?}");
        assert_eq!(f.live(), 1);
        assert!(f.breaks_at(0xd000));
    }

    #[test]
    fn frames_are_bounded() {
        let mut f = Frames::default();
        for i in 0..MAX_FRAMES as u64 + 10 {
            // Each at the top of a stack of its own.
            f.enter(entry(0, STACK + i * 2 * STACK_WINDOW, 0xa000 + i), 0);
        }
        assert_eq!((f.live(), f.full), (MAX_FRAMES, 10));
        assert_eq!(f.addrs().count(), MAX_FRAMES);
        let (addrs, open) = f.take_all();
        assert_eq!((addrs.len(), open, f.live()), (MAX_FRAMES, MAX_FRAMES, 0));
        // Tail calls at one slot: the oldest goes past MAX_AT_SLOT.
        for _ in 0..MAX_AT_SLOT + 2 {
            f.enter(entry(0, STACK, 0xa000), 0);
        }
        assert_eq!((f.live(), f.stale), (MAX_AT_SLOT, 2));
    }
}
