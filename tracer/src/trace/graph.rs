//! The function graph of a trace: each recorded entry matched with its
//! return, per guest stack, into frames with durations, depth and parent.
//!
//! # Guest stacks
//! A hooked entry records the address of the slot that holds the
//! function's return address (`Event::slot`), and its return records the
//! same slot. Frames are kept per guest stack, not per vCPU: a task can sleep
//! in a traced function and return on another vCPU. A guest stack is the
//! `STACK_SIZE`-aligned region its slots are in: Linux x86-64 allocates each
//! task stack `THREAD_SIZE` (16 KiB without KASAN) bytes aligned to
//! `THREAD_ALIGN` = `THREAD_SIZE` (kernel/fork.c, alloc_thread_stack_node),
//! and the mini guest aligns its stacks the same way. Interrupt and
//! exception stacks are other regions. Two stacks that share one region
//! (Linux's 4 KiB exception stacks in cpu_entry_area, or a 16 KiB IRQ stack
//! that vmap placed across two regions) can make a live frame look stale;
//! vmtrace states this rather than guessing the kernel's stack layout.
//!
//! # Matching
//! Replayed in time order, per stack:
//! - an entry at slot S first ends, as *abandoned*, every live frame at a
//!   slot below S (the stack was unwound past them without a return: a
//!   longjmp, a task that died in a traced function); a live frame at S
//!   itself stays if the entry is a tail call from it (the callee's entry
//!   found the caller's hook in place, so its caller is the live frame's:
//!   `model::unhook_callers`; it returns through both), else it ends the same way
//!   (the call at S returned, but its return was not stored);
//! - a return at S ends abandoned frames below S the same way, then returns
//!   the innermost live frame at S; a return with none (its entry was not
//!   stored) is counted in `Graph::unmatched_returns`.
//!
//! Frames still live at the end are `End::Running` (not returned when
//! tracing stopped); entries without a hook are `End::Unhooked`.
//!
//! # Lost returns
//! A frame ended without its return may have returned after all: its
//! return was counted but not stored (a full ring, `--max-events`, a full
//! store queue). The exact returns per function (`Trace::returns`) less
//! the stored ones bound how many: the frames so ended become
//! `End::Lost`, in entry order, while their function has returns not
//! stored left; the rest stay abandoned. A function both abandoned and
//! dropping returns in one trace can so be miscounted between the two;
//! frames still live at the end stay running (a return dropped after the
//! last stored event on a stack cannot be told from a call still running).
//! Flight-recorder traces (`--overwrite`) drop only events older than every
//! stored one, so none of their stored calls lost its return.

use std::collections::HashMap;

use crate::trace::model::{Event, Trace};

/// log2 of the size and alignment of one guest stack (16 KiB, Linux
/// x86-64's THREAD_SIZE and THREAD_ALIGN without KASAN).
pub const STACK_SHIFT: u32 = 14;
/// Size of one guest stack region.
pub const STACK_SIZE: u64 = 1 << STACK_SHIFT;

/// How a frame ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// Returned at `ts_ns` on vCPU `cpu`.
    Returned { ts_ns: u64, cpu: u32 },
    /// Unwound without a return (see the module comment).
    Abandoned,
    /// Returned, but its return was not stored (counted in its function's
    /// exact returns; see the module comment).
    Lost,
    /// Still running when tracing stopped (or its return was not stored).
    Running,
    /// Its return was not hooked: no frame was free in the guest.
    Unhooked,
}

/// One call of a traced function, with its return when there was one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    /// Index into `Trace::functions`.
    pub func: u32,
    /// vCPU of the entry.
    pub cpu: u32,
    /// The guest task of the entry (`Event::task`: 0 unknown).
    pub task: u32,
    /// Index into `Graph::stacks`; `u32::MAX` for unhooked entries.
    pub stack: u32,
    /// Live frames below it on its stack when it was entered (0: outermost).
    pub depth: u32,
    /// The enclosing frame (index into `Graph::frames`).
    pub parent: Option<u32>,
    pub entry_ns: u64,
    pub end: End,
    /// Where it returns to in its caller.
    pub caller: u64,
    /// Frames entered directly inside it.
    pub children: u32,
    /// Inclusive time of its returned children.
    pub child_ns: u64,
    /// The entry's `Event::data`: its arguments' id (`--args`; 0: none).
    pub args: u64,
    /// The return's `Event::data`: its return value (`--retval`), once
    /// it returned.
    pub ret: u64,
}

impl Frame {
    /// Inclusive time, entry to return; None if it did not return.
    pub fn total_ns(&self) -> Option<u64> {
        match self.end {
            End::Returned { ts_ns, .. } => Some(ts_ns.saturating_sub(self.entry_ns)),
            _ => None,
        }
    }

    /// Time in the function itself: inclusive time minus its returned
    /// children's inclusive time.
    pub fn self_ns(&self) -> Option<u64> {
        self.total_ns().map(|t| t.saturating_sub(self.child_ns))
    }
}

/// Per-function durations over the returned frames.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Durations {
    /// Returned frames (stored entry and return).
    pub returned: u64,
    pub total_ns: u64,
    pub self_ns: u64,
    /// Shortest and longest inclusive time (0 when none returned).
    pub min_ns: u64,
    pub max_ns: u64,
}

impl Durations {
    fn add(&mut self, total: u64, self_ns: u64) {
        if self.returned == 0 || total < self.min_ns {
            self.min_ns = total;
        }
        self.max_ns = self.max_ns.max(total);
        self.returned += 1;
        self.total_ns = self.total_ns.saturating_add(total);
        self.self_ns = self.self_ns.saturating_add(self_ns);
    }

    /// Mean inclusive time.
    pub fn avg_ns(&self) -> u64 {
        self.total_ns.checked_div(self.returned).unwrap_or(0)
    }
}

/// The replayed graph of a trace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Graph {
    /// Every stored entry, in time order.
    pub frames: Vec<Frame>,
    /// Base address of each guest stack region, in order of first use.
    pub stacks: Vec<u64>,
    /// Frames found abandoned.
    pub abandoned: u64,
    /// Frames whose return was counted but not stored.
    pub lost: u64,
    /// Returns with no live frame at their slot (their entry not stored).
    pub unmatched_returns: u64,
    /// Returns whose function differs from the frame at their slot's (the
    /// guest's stack or vmtrace's records are inconsistent).
    pub mismatched_returns: u64,
}

impl Graph {
    /// Replays `trace`'s events (sorted by time) into frames.
    pub fn build(trace: &Trace) -> Graph {
        let mut g = Graph::default();
        // Each frame's slot, by frame index (0 for unhooked entries).
        let mut slots: Vec<u64> = Vec::new();
        // Per stack region: its index and its live frames, outermost first.
        let mut live: HashMap<u64, (u32, Vec<u32>)> = HashMap::new();
        for e in &trace.events {
            let slot = e.stack_slot();
            if slot == 0 {
                if !e.is_return() {
                    g.frames.push(Frame {
                        func: e.func,
                        cpu: e.cpu,
                        task: e.task,
                        stack: u32::MAX,
                        depth: 0,
                        parent: None,
                        entry_ns: e.ts_ns,
                        end: End::Unhooked,
                        caller: e.parent,
                        children: 0,
                        child_ns: 0,
                        args: e.data,
                        ret: 0,
                    });
                    slots.push(0);
                }
                continue;
            }
            let region = slot >> STACK_SHIFT;
            let next_id = g.stacks.len() as u32;
            let (id, stack) = live.entry(region).or_insert_with(|| (next_id, Vec::new()));
            if *id == next_id {
                g.stacks.push(region << STACK_SHIFT);
            }
            g.end_unwound(stack, &slots, e, slot);
            if e.is_return() {
                g.end_returned(stack, &slots, e, slot);
            } else {
                let index = g.frames.len() as u32;
                let parent = stack.last().copied();
                if let Some(p) = parent {
                    g.frames[p as usize].children += 1;
                }
                g.frames.push(Frame {
                    func: e.func,
                    cpu: e.cpu,
                    task: e.task,
                    stack: *id,
                    depth: stack.len() as u32,
                    parent,
                    entry_ns: e.ts_ns,
                    end: End::Running,
                    caller: e.parent,
                    children: 0,
                    child_ns: 0,
                    args: e.data,
                    ret: 0,
                });
                slots.push(slot);
                stack.push(index);
            }
        }
        g.end_lost(trace);
        g
    }

    /// Ends the frame a return event `e` at `slot` returns from: the
    /// innermost live frame of `stack`, if it is at that slot.
    fn end_returned(&mut self, stack: &mut Vec<u32>, slots: &[u64], e: &Event, slot: u64) {
        let Some(&top) = stack.last() else {
            self.unmatched_returns += 1;
            return;
        };
        if slots[top as usize] != slot {
            self.unmatched_returns += 1;
            return;
        }
        stack.pop();
        let f = &mut self.frames[top as usize];
        if f.func != e.func {
            self.mismatched_returns += 1;
        }
        f.end = End::Returned {
            ts_ns: e.ts_ns,
            cpu: e.cpu,
        };
        f.ret = e.data;
        let total = f.total_ns().unwrap_or(0);
        if let Some(p) = f.parent {
            let p = &mut self.frames[p as usize];
            p.child_ns = p.child_ns.saturating_add(total);
        }
    }

    /// Ends, as abandoned, the live frames of `stack` that event `e` at
    /// `slot` shows were unwound without a return: those below the slot,
    /// and for an entry that is not a tail call from them, those at it.
    fn end_unwound(&mut self, stack: &mut Vec<u32>, slots: &[u64], e: &Event, slot: u64) {
        while let Some(&top) = stack.last() {
            let at = slots[top as usize];
            let tail_call = e.parent == self.frames[top as usize].caller;
            if at < slot || (at == slot && !e.is_return() && !tail_call) {
                self.frames[top as usize].end = End::Abandoned;
                self.abandoned += 1;
                stack.pop();
            } else {
                break;
            }
        }
    }

    /// Abandoned frames whose function has returns counted but not stored
    /// left become `End::Lost` (see the module comment), in entry order.
    fn end_lost(&mut self, trace: &Trace) {
        if trace.meta.overwrite {
            return;
        }
        // Per function: exact returns less stored ones.
        let mut room: Vec<u64> = trace
            .returns
            .iter()
            .map(|per_cpu| per_cpu.iter().sum())
            .collect();
        for e in trace.events.iter().filter(|e| e.is_return()) {
            if let Some(r) = room.get_mut(e.func as usize) {
                *r = r.saturating_sub(1);
            }
        }
        for f in &mut self.frames {
            let Some(r) = room.get_mut(f.func as usize) else {
                continue;
            };
            if f.end == End::Abandoned && *r > 0 {
                *r -= 1;
                f.end = End::Lost;
                self.abandoned -= 1;
                self.lost += 1;
            }
        }
    }

    /// Durations per function (`nfunc` of them) and per function and vCPU
    /// of the entry (`[func][cpu]`).
    pub fn durations(&self, nfunc: usize, cpus: usize) -> (Vec<Durations>, Vec<Vec<Durations>>) {
        let mut all = vec![Durations::default(); nfunc];
        let mut per_cpu = vec![vec![Durations::default(); cpus]; nfunc];
        for f in &self.frames {
            let (Some(total), Some(own)) = (f.total_ns(), f.self_ns()) else {
                continue;
            };
            if let Some(d) = all.get_mut(f.func as usize) {
                d.add(total, own);
            }
            if let Some(d) = per_cpu
                .get_mut(f.func as usize)
                .and_then(|r| r.get_mut(f.cpu as usize))
            {
                d.add(total, own);
            }
        }
        (all, per_cpu)
    }

    /// Frames without a stored return, per function: still running when
    /// tracing stopped, abandoned, lost, or unhooked.
    pub fn not_returned(&self, nfunc: usize) -> Vec<u64> {
        let mut n = vec![0u64; nfunc];
        for f in &self.frames {
            if f.total_ns().is_none() {
                if let Some(c) = n.get_mut(f.func as usize) {
                    *c += 1;
                }
            }
        }
        n
    }

    /// The chain of functions from the outermost frame down to `frame`.
    pub fn path(&self, frame: u32) -> Vec<u32> {
        let mut path = Vec::new();
        let mut at = Some(frame);
        while let Some(i) = at {
            let f = &self.frames[i as usize];
            path.push(f.func);
            at = f.parent;
        }
        path.reverse();
        path
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::model::unhook_callers;
    use crate::trace::model::RETURN_BIT;

    const STACK_A: u64 = 0xffff_c900_0001_0000; // a 16 KiB region
    const STACK_B: u64 = 0xffff_c900_0002_0000;
    const HOOK: u64 = 0xffff_ffff_ff80_1000;

    /// An event of `func` on `cpu` at `ts`; its slot `depth` frames of 64
    /// bytes below the top of `stack` (0: not hooked).
    fn ev(ts: u64, func: u32, cpu: u32, stack: u64, depth: u64, ret: bool, parent: u64) -> Event {
        let slot = if stack == 0 {
            0
        } else {
            stack + STACK_SIZE - 8 - depth * 64
        };
        Event {
            ts_ns: ts,
            parent,
            slot: slot | if ret { RETURN_BIT } else { 0 },
            func,
            cpu,
            task: 0,
            stack: 0,
            data: 0,
        }
    }

    fn trace(events: Vec<Event>) -> Trace {
        Trace {
            events,
            ..Trace::default()
        }
    }

    #[test]
    fn nesting_durations_and_self_time() {
        // f0 { f1 { f2 } f2 } on stack A.
        let t = trace(vec![
            ev(100, 0, 0, STACK_A, 0, false, 0x1),
            ev(110, 1, 0, STACK_A, 1, false, 0x2),
            ev(120, 2, 0, STACK_A, 2, false, 0x3),
            ev(150, 2, 0, STACK_A, 2, true, 0x3),
            ev(160, 1, 0, STACK_A, 1, true, 0x2),
            ev(170, 2, 0, STACK_A, 1, false, 0x4),
            ev(175, 2, 0, STACK_A, 1, true, 0x4),
            ev(200, 0, 0, STACK_A, 0, true, 0x1),
        ]);
        let g = Graph::build(&t);
        assert_eq!(g.frames.len(), 4);
        let depths: Vec<u32> = g.frames.iter().map(|f| f.depth).collect();
        assert_eq!(depths, [0, 1, 2, 1]);
        let parents: Vec<Option<u32>> = g.frames.iter().map(|f| f.parent).collect();
        assert_eq!(parents, [None, Some(0), Some(1), Some(0)]);
        assert_eq!(g.frames[0].total_ns(), Some(100));
        assert_eq!(g.frames[0].self_ns(), Some(100 - 50 - 5));
        assert_eq!(g.frames[1].self_ns(), Some(20));
        assert_eq!(g.frames[0].children, 2);
        let (d, per_cpu) = g.durations(3, 1);
        assert_eq!(d[2].returned, 2);
        assert_eq!((d[2].min_ns, d[2].max_ns, d[2].total_ns), (5, 30, 35));
        assert_eq!(per_cpu[2][0], d[2]);
        assert_eq!(g.path(2), [0, 1, 2]);
        assert_eq!((g.abandoned, g.unmatched_returns), (0, 0));
    }

    #[test]
    fn tail_call_nests_and_returns_through_both() {
        // f0 hooked at depth 0 jumps to f1: same slot; f1's caller is the hook.
        let mut events = vec![
            ev(100, 0, 0, STACK_A, 0, false, 0x1),
            ev(110, 1, 0, STACK_A, 0, false, HOOK),
            ev(130, 1, 0, STACK_A, 0, true, HOOK),
            ev(131, 0, 0, STACK_A, 0, true, 0x1),
        ];
        assert_eq!(unhook_callers(&mut events, HOOK..HOOK + 16), 1);
        assert_eq!(events[1].parent, 0x1);
        assert_eq!(events[2].parent, 0x1);
        let g = Graph::build(&trace(events));
        assert_eq!(g.frames[1].parent, Some(0));
        assert_eq!(g.frames[1].total_ns(), Some(20));
        assert_eq!(g.frames[0].total_ns(), Some(31));
        assert_eq!(g.frames[0].self_ns(), Some(11));
        assert_eq!(g.abandoned, 0);
    }

    #[test]
    fn abandoned_frames_are_dropped_at_the_next_outer_event() {
        // f0 { f1 (abandoned by a longjmp) }, then a tail call from f0 at
        // its slot (its caller f0's, as `unhook_callers` leaves it): f1's
        // slot is below it, so f1 was unwound; f0's is not (the new entry
        // nests in it).
        let t = trace(vec![
            ev(100, 0, 0, STACK_A, 0, false, 0x1),
            ev(110, 1, 0, STACK_A, 1, false, 0x2),
            ev(120, 2, 0, STACK_A, 0, false, 0x1),
        ]);
        let g = Graph::build(&t);
        assert_eq!(g.abandoned, 1);
        assert_eq!(g.frames[1].end, End::Abandoned);
        assert_eq!(g.frames[0].end, End::Running);
        assert_eq!(g.frames[2].parent, Some(0));
        // A return at an outer slot ends the inner frames the same way.
        let t = trace(vec![
            ev(100, 0, 0, STACK_A, 0, false, 0x1),
            ev(110, 1, 0, STACK_A, 1, false, 0x2),
            ev(115, 2, 0, STACK_A, 2, false, 0x3),
            ev(130, 0, 0, STACK_A, 0, true, 0x1),
        ]);
        let g = Graph::build(&t);
        assert_eq!(g.abandoned, 2);
        assert_eq!(g.frames[0].total_ns(), Some(30));
        assert_eq!(g.not_returned(3), [0, 1, 1]);
    }

    #[test]
    fn a_call_at_the_slot_of_a_live_frame_from_elsewhere_ends_it() {
        // f0 { f1 (return not stored) ; f2 from another call site at the
        // same slot }: not a tail call from f1, so f1 ended before f2.
        let t = trace(vec![
            ev(100, 0, 0, STACK_A, 0, false, 0x1),
            ev(110, 1, 0, STACK_A, 1, false, 0x2),
            ev(130, 2, 0, STACK_A, 1, false, 0x3),
            ev(140, 2, 0, STACK_A, 1, true, 0x3),
            ev(150, 0, 0, STACK_A, 0, true, 0x1),
        ]);
        let g = Graph::build(&t);
        assert_eq!(g.frames[1].end, End::Abandoned);
        assert_eq!(g.frames[2].parent, Some(0));
        assert_eq!(g.frames[2].depth, 1);
        assert_eq!(g.frames[0].children, 2);
        assert_eq!((g.abandoned, g.lost), (1, 0));
    }

    #[test]
    fn frames_ended_without_return_are_lost_as_far_as_dropped_returns_go() {
        // f0 { f1 f1 f1 f2 } f3(running): f1 returned 3 times (exact), one
        // return stored; f2 returned never (abandoned); f3 once, not stored,
        // but its frame is still live at the end: running, not lost.
        let mut t = trace(vec![
            ev(100, 0, 0, STACK_A, 0, false, 0x1),
            ev(110, 1, 0, STACK_A, 1, false, 0x2),
            ev(120, 1, 0, STACK_A, 1, false, 0x2),
            ev(125, 1, 0, STACK_A, 1, true, 0x2),
            ev(130, 1, 0, STACK_A, 1, false, 0x2),
            ev(140, 2, 0, STACK_A, 2, false, 0x4),
            ev(150, 0, 0, STACK_A, 0, true, 0x1),
            ev(160, 3, 0, STACK_B, 0, false, 0x5),
        ]);
        t.returns = vec![vec![1], vec![3], vec![0], vec![1]];
        let g = Graph::build(&t);
        let ends: Vec<End> = g.frames.iter().map(|f| f.end).collect();
        assert!(matches!(ends[0], End::Returned { .. }));
        // The second f1 nests in the first (same call site: a tail call as
        // far as the events tell) and returns; the first and the third
        // were lost.
        assert_eq!(ends[1], End::Lost);
        assert!(matches!(ends[2], End::Returned { .. }));
        assert_eq!(&ends[3..], [End::Lost, End::Abandoned, End::Running]);
        assert_eq!((g.abandoned, g.lost), (1, 2));
        // A flight recorder's stored calls never lost their return.
        t.meta.overwrite = true;
        let g = Graph::build(&t);
        assert_eq!((g.abandoned, g.lost), (3, 0));
    }

    #[test]
    fn recursion_and_stacks_apart_and_migration() {
        let mut ev_list = Vec::new();
        for d in 0..4 {
            ev_list.push(ev(100 + d, 7, 0, STACK_A, d, false, 0x10));
        }
        // An interrupt on another stack in the middle: not nested in A's.
        ev_list.push(ev(200, 3, 0, STACK_B, 0, false, 0x20));
        ev_list.push(ev(210, 3, 0, STACK_B, 0, true, 0x20));
        for d in (0..4).rev() {
            // The task moved to vCPU 1 before returning.
            ev_list.push(ev(300 + (3 - d), 7, 1, STACK_A, d, true, 0x10));
        }
        let g = Graph::build(&trace(ev_list));
        assert_eq!(g.stacks, [STACK_A, STACK_B]);
        let f: Vec<(u32, u32, Option<u32>)> = g
            .frames
            .iter()
            .map(|f| (f.depth, f.stack, f.parent))
            .collect();
        assert_eq!(
            f,
            [
                (0, 0, None),
                (1, 0, Some(0)),
                (2, 0, Some(1)),
                (3, 0, Some(2)),
                (0, 1, None)
            ]
        );
        assert!(matches!(g.frames[0].end, End::Returned { cpu: 1, .. }));
        assert_eq!(g.frames[3].total_ns(), Some(300 - 103));
        assert_eq!(g.abandoned + g.unmatched_returns, 0);
    }

    #[test]
    fn unmatched_and_unhooked() {
        let t = trace(vec![
            ev(100, 0, 0, 0, 0, false, 0x1),
            ev(110, 1, 0, STACK_A, 0, true, 0x2),
        ]);
        let g = Graph::build(&t);
        assert_eq!(g.unmatched_returns, 1);
        assert_eq!(g.frames.len(), 1);
        assert_eq!(g.frames[0].end, End::Unhooked);
        assert_eq!(g.frames[0].stack, u32::MAX);
    }
}
