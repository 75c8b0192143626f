//! Where a Linux kernel keeps every task, for a walk of them all from the
//! host: `init_task`, each process on its `tasks` list, each of its threads
//! on its signal struct's `thread_head` list (`for_each_process_thread`),
//! and of each thread its stack (`stack`, NULL once an exited task's stack
//! is freed: kernel/fork.c, release_task_stack) and the stack pointer it
//! was switched out with (`thread.sp`). Offsets from the kernel's BTF.

use crate::kernel::btf::{BtfError, KernelBtf};
use crate::kernel::symbols::KernelImage;

/// Defined only by a kernel built with `CONFIG_PREEMPTION`
/// (kernel/sched/core.c), dynamic preemption included: its tasks can be
/// preempted anywhere, vmtrace's trampoline and a function's first
/// instructions too.
pub const PREEMPT_SCHEDULE: &str = "preempt_schedule";

/// The first task, the list's head (`init/init_task.c`).
pub const INIT_TASK: &str = "init_task";

/// Offsets into `struct task_struct` and `struct signal_struct`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TaskList {
    /// `init_task`'s link address.
    pub init_task: u64,
    /// `task_struct.tasks` (a `list_head`: `next` first).
    pub tasks: u32,
    /// `task_struct.stack` (a pointer to its lowest byte).
    pub stack: u32,
    /// `task_struct.thread.sp`.
    pub sp: u32,
    /// `task_struct.signal` (a pointer).
    pub signal: u32,
    /// `signal_struct.thread_head`.
    pub thread_head: u32,
    /// `task_struct.thread_node`.
    pub thread_node: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum TaskListError {
    #[error("{} has no {INIT_TASK} symbol", path.display())]
    NoInitTask { path: std::path::PathBuf },
    #[error(transparent)]
    Btf(#[from] BtfError),
}

impl TaskList {
    /// The layout of `image`'s task list, from its BTF.
    pub fn find(image: &KernelImage, btf: &KernelBtf) -> Result<TaskList, TaskListError> {
        let init_task = image
            .symbol(INIT_TASK)
            .ok_or_else(|| TaskListError::NoInitTask {
                path: image.path.clone(),
            })?
            .addr;
        let task = |m: &str| btf.member("task_struct", m).map(|at| at.offset);
        Ok(TaskList {
            init_task,
            tasks: task("tasks")?,
            stack: task("stack")?,
            sp: task("thread")? + btf.member("thread_struct", "sp")?.offset,
            signal: task("signal")?,
            thread_head: btf.member("signal_struct", "thread_head")?.offset,
            thread_node: task("thread_node")?,
        })
    }
}
