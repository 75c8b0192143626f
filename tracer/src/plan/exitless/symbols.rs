//! The guest kernel's symbols exitless tracing reads or looks for, by
//! name: where its code finds the CPU number, whether the kernel can
//! preempt, how it returns.

/// The kernel's per-CPU CPU number (`smp_processor_id()`), read through GS
/// in either per-CPU layout (`percpu`).
pub const CPU_NUMBER: &str = "cpu_number";
/// Linux 6.2 to 6.14 keep it in the per-CPU `struct pcpu_hot`
/// (arch/x86/include/asm/current.h): after `current_task` (8 bytes) and
/// `preempt_count` (4), so at offset 12; `smp_processor_id()` there reads
/// `gs:pcpu_hot+0xc` (checked in the 6.12 guest's code).
pub const PCPU_HOT: &str = "pcpu_hot";
pub const PCPU_HOT_CPU_NUMBER: u64 = 12;
pub use crate::kernel::task_list::PREEMPT_SCHEDULE;
/// The kernel's table of per-CPU area offsets (`unsigned long
/// __per_cpu_offset[NR_CPUS]`, arch/x86/kernel/setup_percpu.c): CPU i's
/// per-CPU variable `v` is at `__per_cpu_offset[i] + &v`.
pub const PER_CPU_OFFSET: &str = "__per_cpu_offset";
/// The return thunk a kernel built with return thunks
/// (CONFIG_MITIGATION_RETHUNK) jumps to from every return it compiled,
/// until its alternatives rewrite them (arch/x86/lib/retpoline.S).
pub const RETURN_THUNK: &str = "__x86_return_thunk";
/// The return thunk against Indirect Target Selection
/// (CONFIG_MITIGATION_ITS), which leaves some returns plain (`ret`).
pub const ITS_RETURN_THUNK: &str = "its_return_thunk";
/// Set to 1 when the kernel has applied its alternatives, return sites
/// included (arch/x86/kernel/alternative.c).
pub const ALTERNATIVES_PATCHED: &str = "alternatives_patched";
