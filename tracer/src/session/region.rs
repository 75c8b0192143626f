//! vmtrace's region in a guest whose VMM gives vmtrace no memory of its own
//! (a running QEMU): placed in guest pages the guest never uses, and taken
//! out again at the end, so that the guest is left as it was found.

use std::sync::{Arc, Mutex};

use vmm::gva::AddressSpace;
use vmm::Stopped;

use super::direct::contexts::{self, Stacks, TaskStack, VcpuRegs};
use super::exitless::backing::RegionPages;
use super::exitless::state::ExitlessError;
use super::{kernel_space, Tracer};
use crate::error::TracerError;
use crate::kernel::kaslr::KernelOffset;
use crate::kernel::stack_bounds::StackLayout;
use crate::kernel::task_list::{TaskList, PREEMPT_SCHEDULE};
use crate::plan::exitless::layout::{CODE_LEN, CODE_VA};
use crate::session::patch::PatchError;

/// Why the region cannot be taken out at this stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Busy {
    /// vCPU `cpu` is running vmtrace's code (at `rip`).
    InCode { cpu: usize, rip: u64 },
    /// Function graph: `frames` hooked calls have not returned: they
    /// return into vmtrace's code (a task asleep in a traced function).
    FramesLive { frames: usize },
    /// On a preemptible kernel: a context will return to `at`, in
    /// vmtrace's code, from the stack of vCPU `cpu` or (None) of a task
    /// preempted and switched out there.
    OnStack { cpu: Option<usize>, at: u64 },
}

impl std::fmt::Display for Busy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Busy::InCode { cpu, rip } => write!(f, "vCPU {cpu} stayed in it (at {rip:#x})"),
            Busy::FramesLive { frames } => write!(
                f,
                "{frames} hooked calls had not returned, and return through it"
            ),
            Busy::OnStack { cpu: Some(cpu), at } => {
                write!(f, "vCPU {cpu}'s stack returns into it (to {at:#x})")
            }
            Busy::OnStack { cpu: None, at } => write!(
                f,
                "a task preempted inside it stayed there (it returns to {at:#x})"
            ),
        }
    }
}

impl Tracer {
    /// Put the exitless region in `pages` instead of vmtrace's own slot.
    /// Before the first attach; nothing in trap mode.
    pub fn back_region(&mut self, pages: Arc<Mutex<RegionPages>>) {
        if let Some(ex) = self.reach.exitless_mut() {
            ex.back_region(pages);
        }
    }

    /// Take the region out of the guest after the last detach and drain:
    /// its page-table entries cleared, its pages given back what they held.
    /// Refused (nothing written) while a stopped vCPU runs vmtrace's code,
    /// or (function graph) a hooked call has yet to return through it:
    /// resume, let them leave, and stop again. On a kernel that preempts
    /// tasks in kernel mode, also while a context will return into it: a
    /// word of a kernel-mode vCPU's stack, or of the stack of a task
    /// preempted and switched out (a walk of the kernel's task list, as
    /// direct entries do: `direct::contexts`), that is an address in
    /// vmtrace's code. A context interrupted inside that code on a kernel
    /// that cannot preempt is not looked for: the caller lets the guest run
    /// between the detach and this, and an interrupt handler returns long
    /// before. (vmtrace's own VMM never takes its region out.)
    pub fn remove_region(
        &mut self,
        stopped: &dyn Stopped,
    ) -> Result<Result<usize, Busy>, TracerError> {
        if let Some(busy) = self.region_busy(stopped)? {
            return Ok(Err(busy));
        }
        let Some(ex) = self.reach.exitless_mut() else {
            return Ok(Ok(0));
        };
        let mut space =
            kernel_space(stopped.vcpu_spaces(), &[CODE_VA]).ok_or(PatchError::NoPaging)?;
        let cleared = ex
            .remove(&mut space)
            .map_err(|e: ExitlessError| TracerError::from(e))?;
        Ok(Ok(cleared))
    }

    /// What a repair without the kernel's image needs to look for tasks
    /// switched out inside vmtrace's code (`returns_into_code_of`): the
    /// task list's layout, the stack size and where the kernel runs. None
    /// on a kernel that cannot preempt a task in kernel mode (no task is
    /// ever switched out there), or without BTF (no layout).
    pub fn task_scan(&self) -> Option<TaskScan> {
        self.plan.image.symbol(PREEMPT_SCHEDULE)?;
        let list = TaskList::find(&self.plan.image, self.plan.btf.as_deref()?).ok()?;
        Some(TaskScan {
            list,
            thread_size: self.stack_layout.thread_size,
            slide: self.offset.unwrap_or_default().virt,
        })
    }

    /// Why the region cannot be taken out at this stop (`remove_region`),
    /// if it cannot: a vCPU in its code, a hooked call yet to return, or (a
    /// preemptible kernel) a context whose stack returns into it. The
    /// caller drains the rings for the last time when it can, before their
    /// pages are given back.
    pub fn region_busy(&self, stopped: &dyn Stopped) -> Result<Option<Busy>, TracerError> {
        let Some(ex) = self.reach.exitless() else {
            return Ok(None);
        };
        for cpu in 0..stopped.cpus() {
            if let Some(s) = stopped.snapshot(cpu) {
                let rip = s.regs.rip;
                if (CODE_VA..CODE_VA + CODE_LEN).contains(&rip) {
                    return Ok(Some(Busy::InCode { cpu, rip }));
                }
            }
        }
        let frames = ex.live_frames()?;
        if frames > 0 {
            return Ok(Some(Busy::FramesLive { frames }));
        }
        if self.plan.image.symbol(PREEMPT_SCHEDULE).is_none() {
            return Ok(None);
        }
        let mut space =
            kernel_space(stopped.vcpu_spaces(), &[CODE_VA]).ok_or(PatchError::NoPaging)?;
        let off = self.offset.unwrap_or_default();
        let list = self
            .plan
            .btf
            .as_deref()
            .map(|btf| TaskList::find(&self.plan.image, btf))
            .transpose()
            .map_err(|e| PatchError::TaskWalk(e.to_string()))?
            .ok_or_else(|| PatchError::TaskWalk("the kernel has no BTF".into()))?;
        returns_into_code(&mut space, stopped, &list, &self.stack_layout, off)
    }
}

/// The first context (a kernel-mode vCPU, or a task switched out, as
/// preemption leaves it) that returns into vmtrace's code: a word of its
/// stacks (`contexts::find`), from its stack pointer up, in the code page.
/// The kernel runs at `off`, its stacks laid out as `layout` says.
pub fn returns_into_code(
    space: &mut AddressSpace<'_>,
    stopped: &dyn Stopped,
    list: &TaskList,
    layout: &StackLayout,
    off: KernelOffset,
) -> Result<Option<Busy>, TracerError> {
    let vcpus = VcpuRegs::of(stopped);
    let stacks = Stacks::read(space, layout, off, stopped.cpus());
    let tasks = contexts::task_stacks(space, list, off.virt)
        .map_err(|e| PatchError::TaskWalk(e.to_string()))?;
    Ok(inside_code(space, &vcpus, &stacks, &tasks))
}

/// The tasks of a preemptible kernel as a repair walks them, from what the
/// attach kept of its image (`Tracer::task_scan`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TaskScan {
    pub list: TaskList,
    /// `THREAD_SIZE`.
    pub thread_size: u64,
    /// The kernel's virtual offset from its link addresses (KASLR).
    pub slide: i64,
}

/// `returns_into_code` for a repair, which has no stack layout: every
/// kernel-mode vCPU's stack (as a task stack: up to its `THREAD_SIZE`
/// boundary) and every task's, walked as `scan` says.
pub fn returns_into_code_of(
    space: &mut AddressSpace<'_>,
    vcpus: &[VcpuRegs],
    scan: &TaskScan,
) -> Result<Option<Busy>, contexts::WalkError> {
    let stacks = Stacks {
        thread_size: scan.thread_size,
        ..Stacks::default()
    };
    let tasks = contexts::task_stacks(space, &scan.list, scan.slide)?;
    Ok(inside_code(space, vcpus, &stacks, &tasks))
}

/// `returns_into_code` for these vCPUs, stacks and tasks.
fn inside_code(
    space: &mut AddressSpace<'_>,
    vcpus: &[VcpuRegs],
    stacks: &Stacks,
    tasks: &[TaskStack],
) -> Option<Busy> {
    // `contexts::find` takes a range's first byte as outside it.
    let code = [(CODE_VA - 1, CODE_VA + CODE_LEN)];
    contexts::find(space, &code, vcpus, stacks, tasks)
        .inside
        .first()
        .map(|i| Busy::OnStack {
            cpu: i.cpu,
            at: i.at,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
    use vmm::gva::PagingMode;

    /// A task preempted inside the trampoline (its interrupted context,
    /// with a RIP in vmtrace's code, on its stack) keeps the region; so
    /// does a kernel-mode vCPU whose stack returns there. A stack without
    /// such a word, or a vCPU in user mode, does not.
    #[test]
    fn a_task_preempted_inside_the_code_keeps_the_region() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 16 << 20)]).unwrap();
        vmm::boot::regs::setup_page_tables(&mem).unwrap();
        // Two 16 KiB stacks, identity-mapped: the task's and the vCPU's.
        let (task_sp, vcpu_sp) = (0x20_3f00u64, 0x30_3f00u64);
        let in_code = CODE_VA + 0x1234;
        let mut space = AddressSpace::new(&mem, vmm::layout::PML4_START, PagingMode::Level4);
        let stacks = Stacks {
            thread_size: 16 << 10,
            ..Stacks::default()
        };
        let task = [TaskStack {
            sp: task_sp,
            base: task_sp & !0x3fff,
        }];
        let inside_code =
            |space: &mut AddressSpace<'_>, vcpus: &[VcpuRegs], tasks: &[TaskStack]| {
                inside_code(space, vcpus, &stacks, tasks)
            };
        let vcpu = |user_mode| VcpuRegs {
            cpu: 1,
            rip: 0xffff_ffff_8100_0000,
            rsp: vcpu_sp,
            user_mode,
        };
        assert_eq!(inside_code(&mut space, &[vcpu(false)], &task), None);
        // The task's saved frame: the interrupted RIP, 0x40 above its SP.
        mem.write_obj(in_code, GuestAddress(task_sp + 0x40))
            .unwrap();
        assert_eq!(
            inside_code(&mut space, &[vcpu(false)], &task),
            Some(Busy::OnStack {
                cpu: None,
                at: in_code
            })
        );
        let busy = Busy::OnStack {
            cpu: None,
            at: in_code,
        };
        assert!(busy.to_string().starts_with("a task preempted inside it"));
        // The code's last byte counts, the byte past it does not.
        mem.write_obj(CODE_VA + CODE_LEN, GuestAddress(task_sp + 0x40))
            .unwrap();
        assert_eq!(inside_code(&mut space, &[], &task), None);
        mem.write_obj(CODE_VA, GuestAddress(task_sp + 0x40))
            .unwrap();
        assert!(inside_code(&mut space, &[], &task).is_some());
        // A vCPU in kernel mode whose stack returns into the code.
        mem.write_obj(in_code, GuestAddress(vcpu_sp + 8)).unwrap();
        let found = inside_code(&mut space, &[vcpu(false)], &[]);
        assert_eq!(
            found,
            Some(Busy::OnStack {
                cpu: Some(1),
                at: in_code
            })
        );
        assert_eq!(inside_code(&mut space, &[vcpu(true)], &[]), None);
    }

    /// The repair's walk, from the journal alone: a task switched out with
    /// vmtrace's code on its stack keeps the region; a list it cannot walk
    /// is an error (the repair then keeps the region too).
    #[test]
    fn a_repair_finds_a_task_switched_out_inside_the_code_from_its_journal() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 64 << 20)]).unwrap();
        vmm::boot::regs::setup_page_tables(&mem).unwrap();
        let (base, phys) = (0xffff_ffff_8100_0000u64, 0x100_0000u64);
        let put = |va: u64, v: u64| mem.write_obj(v, GuestAddress(phys + (va - base))).unwrap();
        // init_task alone, one thread, its stack identity-mapped low.
        let scan = TaskScan {
            list: TaskList {
                init_task: base,
                tasks: 0x10,
                stack: 0x18,
                sp: 0x80,
                signal: 0x20,
                thread_head: 0x8,
                thread_node: 0x30,
            },
            thread_size: 16 << 10,
            slide: 0,
        };
        let signal = base + 0x10000;
        put(base + 0x10, base + 0x10);
        put(base + 0x20, signal);
        put(signal + 0x8, base + 0x30);
        put(base + 0x30, signal + 0x8);
        let (stack, sp) = (0x20_0000u64, 0x20_3f00u64);
        put(base + 0x18, stack);
        put(base + 0x80, sp);
        let mut space = AddressSpace::new(&mem, vmm::layout::PML4_START, PagingMode::Level4);
        assert_eq!(returns_into_code_of(&mut space, &[], &scan).unwrap(), None);
        let in_code = CODE_VA + 0x40;
        mem.write_obj(in_code, GuestAddress(sp + 0x40)).unwrap();
        assert_eq!(
            returns_into_code_of(&mut space, &[], &scan).unwrap(),
            Some(Busy::OnStack {
                cpu: None,
                at: in_code
            })
        );
        // The journal keeps it as JSON.
        let text = serde_json::to_string(&scan).unwrap();
        assert_eq!(serde_json::from_str::<TaskScan>(&text).unwrap(), scan);
        put(base + 0x10, 0xffff_8000_dead_0000);
        assert!(returns_into_code_of(&mut space, &[], &scan).is_err());
    }
}
