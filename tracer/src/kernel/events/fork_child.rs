//! A new task's return from the syscall that created it (`clone`, `fork`,
//! `vfork`, `clone3`): the child never returns through the syscall's
//! function (`__x64_sys_fork`). Since Linux 6.5 (arch/x86/kernel/process.c)
//! it starts in `ret_from_fork_asm` (arch/x86/entry/entry_64.S), which
//! calls the C function `ret_from_fork(prev, regs, fn, fn_arg)` (an ftrace
//! site): `regs` the child's `struct pt_regs` (the parent's registers as
//! the syscall saved them, copied by `copy_thread`, which sets `regs->ax`
//! to 0), `fn` NULL for a user task (a kernel thread's function
//! otherwise). `ret_from_fork` then returns to user mode through
//! `syscall_exit_to_user_mode(regs)`, where ftrace records the child's
//! `sys_exit_NAME` (`syscall_exit_work`), its number `regs->orig_ax`
//! (`syscall_get_nr`) and its `ret` `regs->ax`. Before 6.5 `ret_from_fork`
//! is assembly without an ftrace site (6.1's entry_64.S).

use crate::kernel::btf::KernelBtf;
use crate::kernel::events::syscall_format::{EXIT, SYSTEM};
use crate::kernel::symbols::KernelImage;

/// The C function a new task starts in.
pub const RET_FROM_FORK: &str = "ret_from_fork";
/// The assembly that calls it: named only where `ret_from_fork` is C.
const RET_FROM_FORK_ASM: &str = "ret_from_fork_asm";
/// The syscalls that create a task returning through `ret_from_fork`.
const FORKING: [&str; 4] = ["clone", "clone3", "fork", "vfork"];
/// `ret_from_fork`'s arguments' registers (indices from RDI): `regs`
/// (RSI) and `fn` (RDX).
pub const REGS_ARG: usize = 1;
pub const FN_ARG: usize = 2;
/// `ret_from_fork`'s return-address slot is this far below `regs`:
/// `ret_from_fork_asm` passes its RSP as `regs` and calls it at once
/// (`movq %rsp, %rsi`, then `call ret_from_fork`, nothing pushed
/// between), where trap mode reads it from RSP.
pub const SLOT_BELOW_REGS: u64 = 8;

/// Where the child's syscall number and return value are in its
/// `struct pt_regs` (BTF offsets).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForkRegs {
    /// `orig_ax`: the number of the syscall that created the task.
    pub orig_ax: u32,
    /// `ax`: its return value in the child (0).
    pub ax: u32,
}

impl ForkRegs {
    /// The offsets, when the kernel's `ret_from_fork` is the C function
    /// (`ret_from_fork_asm` named) and BTF has `struct pt_regs`; None
    /// otherwise.
    pub fn find(image: &KernelImage, btf: &KernelBtf) -> Option<ForkRegs> {
        image.symbol(RET_FROM_FORK_ASM)?;
        image.symbol(RET_FROM_FORK)?;
        Some(ForkRegs {
            orig_ax: btf.member("pt_regs", "orig_ax").ok()?.offset,
            ax: btf.member("pt_regs", "ax").ok()?.offset,
        })
    }
}

/// Whether event `full` (`syscalls:sys_exit_fork`) is the exit of a
/// syscall whose child returns through `ret_from_fork`.
pub fn is_forking_exit(full: &str) -> bool {
    let name = full.strip_prefix(SYSTEM).and_then(|n| n.strip_prefix(':'));
    let name = name.and_then(|n| n.strip_prefix(EXIT));
    name.is_some_and(|n| FORKING.contains(&n))
}

#[cfg(test)]
mod tests {
    use super::is_forking_exit;

    #[test]
    fn the_forking_syscalls_exits_are_known() {
        assert!(is_forking_exit("syscalls:sys_exit_fork"));
        assert!(is_forking_exit("syscalls:sys_exit_clone3"));
        assert!(!is_forking_exit("syscalls:sys_enter_fork"));
        assert!(!is_forking_exit("syscalls:sys_exit_forkx"));
        assert!(!is_forking_exit("sched:sys_exit_fork"));
    }
}
