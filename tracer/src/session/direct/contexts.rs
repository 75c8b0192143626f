//! No guest context may be inside a direct site's displaced bytes (past
//! their first) when they change: it would resume in the middle of the
//! jump. Under the pause, for every vCPU in kernel mode: its RIP, and every
//! word of its stack from RSP to the top of its stack (interrupted
//! contexts' saved RIPs and return addresses are there; a stale word counts
//! too, which only delays the site). A task switched out keeps only return
//! addresses of calls, and a displaced `call` is always the last displaced
//! instruction (the jump needs 5 bytes, a call is 5): its return address
//! is past the displaced bytes. So on a kernel that cannot preempt a task
//! in kernel mode, the vCPUs are all there is to check. On one that can,
//! a task preempted by an interrupt is runnable (`TASK_RUNNING`) and off
//! its CPU, the interrupted context on its stack: every runnable task's
//! stack is scanned too, from the stack pointer it was switched out with
//! (`preempted_stacks`, a walk of the kernel's task list).

use vmm::gva::{AddressSpace, GvaError};

use crate::kernel::task_list::{TaskList, TASK_RUNNING};

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

/// Linux x86-64's kernel stacks (task and IRQ) are 16 KiB, aligned to
/// their size (THREAD_SIZE, IRQ_STACK_SIZE without KASAN).
pub const STACK_SIZE: u64 = 16 << 10;

/// A vCPU as the check needs it.
#[derive(Clone, Copy, Debug)]
pub struct VcpuRegs {
    pub cpu: usize,
    pub rip: u64,
    pub rsp: u64,
    /// It runs at CPL 3: no kernel context to check.
    pub user_mode: bool,
}

/// Selector bits 1:0 of CS: the privilege level a vCPU runs at.
const CS_RPL_MASK: u16 = 3;

impl VcpuRegs {
    /// Every stopped vCPU whose registers are known.
    pub fn of(stopped: &dyn vmm::Stopped) -> Vec<VcpuRegs> {
        (0..stopped.cpus())
            .filter_map(|cpu| {
                let s = stopped.snapshot(cpu)?;
                Some(VcpuRegs {
                    cpu,
                    rip: s.regs.rip,
                    rsp: s.regs.rsp,
                    user_mode: s.sregs.cs.selector & CS_RPL_MASK == 3,
                })
            })
            .collect()
    }
}

/// A context found inside a site's displaced bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Inside {
    /// Index of the site (into the ranges given).
    pub k: usize,
    /// The vCPU; None for a task switched out (`stacks`).
    pub cpu: Option<usize>,
    /// The address inside the displaced bytes.
    pub at: u64,
    /// Where it was: the vCPU's RIP, or a word on its stack.
    pub on_stack: bool,
}

/// The sites of `ranges` (running `(start, end)` of each site's displaced
/// bytes, by site) that some context of `vcpus`, or on the stacks of tasks
/// switched out at `stacks` (their saved stack pointers), is inside.
pub fn find(
    space: &mut AddressSpace<'_>,
    ranges: &[(u64, u64)],
    vcpus: &[VcpuRegs],
    stacks: &[u64],
) -> Vec<Inside> {
    let mut sorted: Vec<(u64, u64, usize)> = ranges
        .iter()
        .enumerate()
        .map(|(k, &(s, e))| (s, e, k))
        .collect();
    sorted.sort_unstable();
    let inside = |a: u64| {
        let i = sorted.partition_point(|r| r.0 < a).checked_sub(1)?;
        let (s, e, k) = sorted[i];
        (a > s && a < e).then_some(k)
    };
    let mut busy = Vec::new();
    for v in vcpus.iter().filter(|v| !v.user_mode) {
        if let Some(k) = inside(v.rip) {
            busy.push(Inside {
                k,
                cpu: Some(v.cpu),
                at: v.rip,
                on_stack: false,
            });
        }
    }
    let on_cpus = vcpus
        .iter()
        .filter(|v| !v.user_mode)
        .map(|v| (Some(v.cpu), v.rsp));
    for (cpu, sp) in on_cpus.chain(stacks.iter().map(|&sp| (None, sp))) {
        for word in stack_words(space, sp) {
            if let Some(k) = inside(word) {
                busy.push(Inside {
                    k,
                    cpu,
                    at: word,
                    on_stack: true,
                });
            }
        }
    }
    busy
}

/// The saved stack pointers of every runnable task of the kernel whose
/// task list is `list`, `slide` bytes from its link addresses: where a
/// task preempted in kernel mode keeps its interrupted context. Every
/// thread of every process, as `for_each_process_thread` walks them.
pub fn preempted_stacks(
    space: &mut AddressSpace<'_>,
    list: &TaskList,
    slide: i64,
) -> Result<Vec<u64>, WalkError> {
    let head = list.init_task.wrapping_add_signed(slide) + u64::from(list.tasks);
    let (mut sps, mut seen, mut link) = (Vec::new(), 0, head);
    loop {
        let process = link - u64::from(list.tasks);
        let signal = space.read_u64(process + u64::from(list.signal))?;
        let threads = signal + u64::from(list.thread_head);
        let mut t = space.read_u64(threads)?;
        while t != threads {
            let task = t - u64::from(list.thread_node);
            let state = space.read_array::<4>(task + u64::from(list.state))?;
            if u32::from_le_bytes(state) == TASK_RUNNING {
                sps.push(space.read_u64(task + u64::from(list.sp))?);
            }
            t = space.read_u64(t)?;
            seen += 1;
            if seen > MAX_TASKS {
                return Err(WalkError::TooLong);
            }
        }
        link = space.read_u64(link)?;
        if link == head {
            return Ok(sps);
        }
    }
}

/// The words from `rsp` to the top of its stack, page by page, up to the
/// first page that cannot be read.
fn stack_words(space: &mut AddressSpace<'_>, rsp: u64) -> Vec<u64> {
    const PAGE: u64 = 4096;
    let rsp = rsp & !7;
    let top = (rsp | (STACK_SIZE - 1)).wrapping_add(1);
    let mut words = Vec::new();
    let mut at = rsp;
    while at < top && at != 0 {
        let end = ((at | (PAGE - 1)) + 1).min(top);
        let mut buf = vec![0u8; (end - at) as usize];
        if space.read(at, &mut buf).is_err() {
            break;
        }
        words.extend(
            buf.chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8"))),
        );
        at = end;
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
    use vmm::gva::PagingMode;

    #[test]
    fn a_rip_or_a_stack_word_inside_the_displaced_bytes_is_found() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 64 << 20)]).unwrap();
        vmm::boot::regs::setup_page_tables(&mem).unwrap();
        let base = 0xffff_ffff_8100_0000u64;
        let ranges = [(base + 0x100, base + 0x107), (base + 0x200, base + 0x205)];
        // A stack at 0x20_0000..0x20_4000 (16 KiB aligned), RSP near its top.
        let stack_top = 0x20_4000u64;
        let rsp = stack_top - 0x40;
        mem.write_obj(base + 0x203, GuestAddress(rsp + 0x18))
            .unwrap();
        // Below RSP: dead, not read.
        mem.write_obj(base + 0x101, GuestAddress(rsp - 8)).unwrap();
        let mut space = AddressSpace::new(&mem, vmm::layout::PML4_START, PagingMode::Level4);
        let v = |cpu, rip, user_mode| VcpuRegs {
            cpu,
            rip,
            rsp,
            user_mode,
        };
        let busy = find(&mut space, &ranges, &[v(0, base + 0x102, false)], &[]);
        let at = |k, cpu, at, on_stack| Inside {
            k,
            cpu,
            at,
            on_stack,
        };
        assert_eq!(
            busy,
            [
                at(0, Some(0), base + 0x102, false),
                at(1, Some(0), base + 0x203, true)
            ]
        );
        // A task switched out with its stack at RSP: found the same way.
        let busy = find(&mut space, &ranges, &[], &[rsp]);
        assert_eq!(busy, [at(1, None, base + 0x203, true)]);
        // The first byte is fine (the jump is there), and so is a user-mode vCPU.
        let busy = find(
            &mut space,
            &ranges[..1],
            &[v(0, base + 0x100, false), v(1, base + 0x103, true)],
            &[],
        );
        assert!(busy.is_empty(), "{busy:?}");
    }

    #[test]
    fn the_walk_finds_every_runnable_thread_of_every_process() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 64 << 20)]).unwrap();
        vmm::boot::regs::setup_page_tables(&mem).unwrap();
        let (base, phys) = (0xffff_ffff_8100_0000u64, 0x100_0000u64);
        let list = TaskList {
            init_task: base,
            tasks: 0x10,
            state: 0x4,
            sp: 0x80,
            signal: 0x20,
            thread_head: 0x8,
            thread_node: 0x30,
        };
        // Tasks at base + 0x1000 * n; signal structs at base + 0x10000 * p.
        let task = |n: u64| base + 0x1000 * n;
        let put = |va: u64, v: u64| mem.write_obj(v, GuestAddress(phys + (va - base))).unwrap();
        let put32 = |va: u64, v: u32| mem.write_obj(v, GuestAddress(phys + (va - base))).unwrap();
        // Processes: init_task (0) alone; process 1 with threads 1 and 2.
        let processes: [(u64, &[u64]); 2] = [(0, &[0]), (1, &[1, 2])];
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
        // Thread 2 sleeps (state 1); 0 and 1 are runnable.
        for (t, state) in [(0u64, 0u32), (1, 0), (2, 1)] {
            put32(task(t) + 0x4, state);
            put(task(t) + 0x80, 0x7000 + t);
        }
        let mut space = AddressSpace::new(&mem, vmm::layout::PML4_START, PagingMode::Level4);
        let sps = preempted_stacks(&mut space, &list, 0).unwrap();
        assert_eq!(sps, [0x7000, 0x7001]);
        // A list that leads nowhere is an error, not an endless walk.
        put(task(1) + 0x10, 0xffff_8000_dead_0000);
        assert!(preempted_stacks(&mut space, &list, 0).is_err());
    }
}
