//! A new task's `sys_exit_fork` (clone, vfork, clone3) in trap mode: the
//! child starts in `ret_from_fork(prev, regs, fn, fn_arg)`, never
//! returning through the syscall's function (`kernel::events::fork_child`).
//! Its site's trap records, for a user task (`fn` NULL) whose
//! `regs->orig_ax` is a traced forking syscall's number, that syscall
//! function's return in the child, `ret` `regs->ax` (0): what ftrace
//! records at the child's `syscall_exit_work`. The call of
//! `ret_from_fork` itself is not recorded (vmtrace traces it for this).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use vmm::Trap;

use super::Recorder;
use crate::kernel::events::fork_child::{FN_ARG, REGS_ARG};
use crate::plan::syscall_events::ChildExitSites;
use crate::trace::model::{Event, RETURN_BIT};

impl Recorder {
    /// Record the children's exits of the forking syscalls traced at
    /// `ret_from_fork`'s site.
    pub fn record_child_exits(&mut self, sites: Option<Arc<ChildExitSites>>) {
        self.child_exits = sites;
    }

    /// At site `i`: if it is `ret_from_fork`'s, the child's exit is
    /// recorded (if the task is a user task created by a traced forking
    /// syscall, and kept) and true returned: the call is not one to
    /// record.
    pub(super) fn at_child_start(&mut self, i: usize, trap: &mut Trap<'_>) -> bool {
        let Some(c) = self.child_exits.as_ref().filter(|c| c.site == i) else {
            return false;
        };
        let c = Arc::clone(c);
        let ts_ns = Trap::now_ns();
        // A kernel thread: `fn` is its function.
        if trap.args[FN_ARG] != 0 {
            return true;
        }
        let regs = trap.args[REGS_ARG];
        let mut word = |off: u32| {
            let mut b = [0u8; 8];
            let at = regs.wrapping_add(u64::from(off));
            trap.space()
                .read(at, &mut b)
                .ok()
                .map(|_| u64::from_le_bytes(b))
        };
        let (Some(nr), Some(ret)) = (word(c.regs.orig_ax), word(c.regs.ax)) else {
            return true;
        };
        let Some(&(_, site)) = c.exits.iter().find(|(n, _)| *n == nr) else {
            return true;
        };
        let (task, kept) = self.task_of(trap);
        if !kept {
            self.counters.filtered.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        let n = &self.counters.returns[self.cpu as usize][site];
        n.store(n.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        if !self.take_budget() {
            self.counters.over_budget(true);
            return true;
        }
        self.push(Event {
            ts_ns,
            // Where the child goes from here is user mode, as a syscall's
            // return: no kernel address.
            parent: 0,
            // `ret_from_fork`'s return-address slot: the child's stack, no
            // entry stored there (the report counts it as a return without
            // its entry).
            slot: trap.rsp | RETURN_BIT,
            func: self.index.func(site),
            cpu: self.cpu,
            task,
            stack: 0,
            data: if self.retval { ret } else { 0 },
        });
        true
    }
}
