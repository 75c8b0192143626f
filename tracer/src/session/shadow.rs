//! Trap mode's shadow stacks: where each hooked return really goes.
//!
//! At a hooked entry the trap handler replaces the function's return
//! address (the slot at RSP) with vmtrace's return trap and keeps the
//! original here, keyed by the slot's guest-virtual address; the return trap
//! comes back with RSP just above the slot, finds the original and resumes
//! the guest there. Keyed by slot, not by vCPU: a task may sleep in a hooked
//! function and return on another vCPU, and each guest stack has its own
//! slots. Shared by every vCPU's handler behind one lock, taken only in
//! graph mode and only for a few map operations per trap, next to an exit
//! that costs microseconds.
//!
//! A slot holds a stack of frames: a tail call enters the callee with the
//! caller's hook already in the slot, so the callee's frame sits on top of
//! the caller's and the return goes through both. A new entry whose return
//! address is not the hook means the old frames at that slot are gone (the
//! stack was unwound past them without a return): they are replaced. Frames
//! abandoned at slots that are never reused stay until the guest ends;
//! `graph::Graph` finds and counts them from the events.

use std::collections::HashMap;
use std::sync::Mutex;

/// One hooked call: where it really returns, which site it entered by,
/// and the task that made it (`Event::task`: its return's too).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hooked {
    pub ret: u64,
    pub site: u32,
    pub task: u32,
}

/// Every live hooked frame of the guest, by return-address slot.
#[derive(Debug, Default)]
pub struct ShadowStacks {
    slots: Mutex<HashMap<u64, Vec<Hooked>>>,
}

impl ShadowStacks {
    /// Records a hooked entry at `slot` by `task`, whose return address was
    /// `ret` (`ret == hook`: a tail call, stacked on the frame already
    /// there). Returns the real return address: `ret`, or for a tail call
    /// the caller's.
    pub fn push(&self, slot: u64, ret: u64, site: u32, task: u32, hook: u64) -> u64 {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let frames = slots.entry(slot).or_default();
        let real = if ret == hook {
            frames.last().map_or(ret, |f| f.ret_real(hook, frames))
        } else {
            frames.clear();
            ret
        };
        frames.push(Hooked { ret, site, task });
        real
    }

    /// The innermost frame at `slot`, removed: its return arrived.
    pub fn pop(&self, slot: u64) -> Option<Hooked> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let frames = slots.get_mut(&slot)?;
        let f = frames.pop();
        if frames.is_empty() {
            slots.remove(&slot);
        }
        f
    }

    /// The real return address of the frame below the innermost one at
    /// `slot` (what a tail callee's return goes back to in the end).
    pub fn real_below(&self, slot: u64, hook: u64) -> Option<u64> {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let frames = slots.get(&slot)?;
        frames.last().map(|f| f.ret_real(hook, frames))
    }

    /// Hooked frames still live.
    pub fn live(&self) -> usize {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.values().map(Vec::len).sum()
    }
}

impl Hooked {
    /// This frame's real return address: its own, or (a tail call's hook)
    /// the first frame's below it at the same slot that is not the hook.
    fn ret_real(&self, hook: u64, frames: &[Hooked]) -> u64 {
        if self.ret != hook {
            return self.ret;
        }
        frames
            .iter()
            .rev()
            .map(|f| f.ret)
            .find(|&r| r != hook)
            .unwrap_or(hook)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOOK: u64 = 0xffff_ffff_ff80_0000;

    #[test]
    fn frames_by_slot_tail_calls_and_reused_slots() {
        let s = ShadowStacks::default();
        assert_eq!(s.push(0x1000, 0xaaaa, 1, 7, HOOK), 0xaaaa);
        assert_eq!(s.push(0x0f00, 0xbbbb, 2, 0, HOOK), 0xbbbb);
        // A tail call at 0x1000: the real caller is the first frame's.
        assert_eq!(s.push(0x1000, HOOK, 3, 0, HOOK), 0xaaaa);
        assert_eq!(s.live(), 3);
        assert_eq!(s.real_below(0x1000, HOOK), Some(0xaaaa));
        assert_eq!(
            s.pop(0x1000),
            Some(Hooked {
                ret: HOOK,
                site: 3,
                task: 0
            })
        );
        assert_eq!(
            s.pop(0x1000),
            Some(Hooked {
                ret: 0xaaaa,
                site: 1,
                task: 7,
            })
        );
        assert_eq!(s.pop(0x1000), None);
        // 0x0f00 was abandoned; a fresh call at that slot replaces it.
        assert_eq!(s.push(0x0f00, 0xcccc, 4, 9, HOOK), 0xcccc);
        assert_eq!(s.live(), 1);
        assert_eq!(
            s.pop(0x0f00),
            Some(Hooked {
                ret: 0xcccc,
                site: 4,
                task: 9,
            })
        );
        assert_eq!(s.live(), 0);
    }
}
