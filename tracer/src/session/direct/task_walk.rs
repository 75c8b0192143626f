//! Every task's stack, from a walk of the guest kernel's task list: where
//! a task off its CPU keeps what it was doing. On a preemptible kernel any
//! task may have been preempted in kernel mode, whatever its state: one
//! preempted right after `set_current_state()` is not `TASK_RUNNING`, and
//! its interrupted context is on its stack all the same. So every task is
//! scanned, as the kernel's own livepatch checks every task's stack before
//! it switches it (kernel/livepatch/transition.c, klp_try_complete_transition).

use vmm::gva::{AddressSpace, GvaError};

use crate::kernel::task_list::TaskList;

/// At most this many tasks are walked (a list that does not come back to
/// its head within them is read as broken).
pub const MAX_TASKS: usize = 1 << 20;

/// Why the guest's task list could not be walked.
#[derive(Debug, thiserror::Error)]
pub enum WalkError {
    #[error("the guest's task list cannot be read: {0}")]
    Read(#[from] GvaError),
    #[error("the guest's task list does not end within {MAX_TASKS} tasks")]
    TooLong,
}

/// A task's stack as it was switched out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskStack {
    /// The stack pointer it was switched out with (`thread.sp`).
    pub sp: u64,
    /// The stack's lowest address (`task_struct.stack`).
    pub base: u64,
}

/// The stack of every task of the kernel whose task list is `list`,
/// `slide` bytes from its link addresses: every thread of every process,
/// as `for_each_process_thread` walks them, but those whose stack is
/// freed (an exited task not reaped yet: `stack` is NULL).
pub fn task_stacks(
    space: &mut AddressSpace<'_>,
    list: &TaskList,
    slide: i64,
) -> Result<Vec<TaskStack>, WalkError> {
    let head = list.init_task.wrapping_add_signed(slide) + u64::from(list.tasks);
    let (mut stacks, mut seen, mut link) = (Vec::new(), 0, head);
    loop {
        let process = link - u64::from(list.tasks);
        let signal = space.read_u64(process + u64::from(list.signal))?;
        let threads = signal + u64::from(list.thread_head);
        let mut t = space.read_u64(threads)?;
        while t != threads {
            let task = t - u64::from(list.thread_node);
            let base = space.read_u64(task + u64::from(list.stack))?;
            if base != 0 {
                let sp = space.read_u64(task + u64::from(list.sp))?;
                stacks.push(TaskStack { sp, base });
            }
            t = space.read_u64(t)?;
            seen += 1;
            if seen > MAX_TASKS {
                return Err(WalkError::TooLong);
            }
        }
        link = space.read_u64(link)?;
        if link == head {
            return Ok(stacks);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
    use vmm::gva::PagingMode;

    #[test]
    fn the_walk_finds_every_thread_of_every_process_whatever_its_state() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 64 << 20)]).unwrap();
        vmm::boot::regs::setup_page_tables(&mem).unwrap();
        let (base, phys) = (0xffff_ffff_8100_0000u64, 0x100_0000u64);
        let list = TaskList {
            init_task: base,
            tasks: 0x10,
            stack: 0x18,
            sp: 0x80,
            signal: 0x20,
            thread_head: 0x8,
            thread_node: 0x30,
        };
        // Tasks at base + 0x1000 * n; signal structs at base + 0x10000 * p.
        let task = |n: u64| base + 0x1000 * n;
        let put = |va: u64, v: u64| mem.write_obj(v, GuestAddress(phys + (va - base))).unwrap();
        // Processes: init_task (0) alone; process 1 with threads 1, 2, 3.
        let processes: [(u64, &[u64]); 2] = [(0, &[0]), (1, &[1, 2, 3])];
        for (i, (p, threads)) in processes.iter().enumerate() {
            let next = processes[(i + 1) % 2].0;
            put(task(*p) + 0x10, task(next) + 0x10);
            let signal = base + 0x10000 * (p + 1);
            put(task(*p) + 0x20, signal);
            let head = signal + 0x8;
            let nodes: Vec<u64> = threads.iter().map(|&t| task(t) + 0x30).collect();
            put(head, nodes[0]);
            for (j, &n) in nodes.iter().enumerate() {
                put(n, *nodes.get(j + 1).unwrap_or(&head));
            }
        }
        // Thread 2 sleeps (its state is not read: it counts as any
        // other); thread 3 has exited and its stack is freed (NULL).
        for t in 0..3u64 {
            put(task(t) + 0x80, 0x7000 + t);
            put(task(t) + 0x18, 0x4000 * (t + 1));
        }
        put(task(3) + 0x80, 0x7003);
        let mut space = AddressSpace::new(&mem, vmm::layout::PML4_START, PagingMode::Level4);
        let stacks = task_stacks(&mut space, &list, 0).unwrap();
        let want: Vec<TaskStack> = (0..3u64)
            .map(|t| TaskStack {
                sp: 0x7000 + t,
                base: 0x4000 * (t + 1),
            })
            .collect();
        assert_eq!(stacks, want);
        // A list that leads nowhere is an error, not an endless walk.
        put(task(1) + 0x10, 0xffff_8000_dead_0000);
        assert!(task_stacks(&mut space, &list, 0).is_err());
    }
}
