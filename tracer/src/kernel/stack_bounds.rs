//! Where an x86-64 Linux kernel's stacks are and how big, for a scan of
//! them from the host: task stacks (`THREAD_SIZE`, aligned to it), each
//! CPU's IRQ stack (found through its `hardirq_stack_ptr`, which points at
//! the stack's top word: arch/x86/kernel/irq_64.c) and its exception (IST)
//! stacks (`struct cea_exception_stacks`, arch/x86/include/asm/
//! cpu_entry_area.h). Sizes and places from the image's symbols and BTF,
//! never assumed: vmapped IRQ stacks are only page-aligned, and KASAN
//! doubles every size (arch/x86/include/asm/page_64_types.h).

use crate::kernel::btf::KernelBtf;
use crate::kernel::percpu::PerCpuVar;
use crate::kernel::symbols::KernelImage;

/// `THREAD_SIZE` when the image tells nothing (a kernel that is not Linux,
/// such as the mini guest, whose stacks are 16 KiB too): x86-64 Linux's
/// without KASAN (`PAGE_SIZE << THREAD_SIZE_ORDER`, order 2).
pub const DEFAULT_THREAD_SIZE: u64 = 16 << 10;

/// The init task's stack, exactly `THREAD_SIZE` long (`INIT_TASK_DATA` in
/// include/asm-generic/vmlinux.lds.h): its bounds' names up to 6.1, and
/// from 6.2 on.
const INIT_STACK_BOUNDS: [(&str, &str); 2] = [
    ("__start_init_task", "__end_init_task"),
    ("__start_init_stack", "__end_init_stack"),
];

/// The union a task's stack is (include/linux/sched.h): `THREAD_SIZE`
/// bytes, for an image whose symbols lack the init stack's bounds.
const THREAD_UNION: &str = "thread_union";

/// The per-CPU pointer to the top word of the CPU's IRQ stack, where
/// `call_on_stack` keeps the stack pointer it came from
/// (arch/x86/include/asm/irq_stack.h): a variable of its own up to 6.1
/// and from 6.15, a member of `pcpu_hot` between.
pub const HARDIRQ_STACK_PTR: &str = "hardirq_stack_ptr";
const PCPU_HOT: &str = "pcpu_hot";

/// `struct irq_stack`, `IRQ_STACK_SIZE` bytes (arch/x86/include/asm/
/// processor.h). Without BTF the IRQ stack is `THREAD_SIZE` (both are
/// `PAGE_SIZE << (2 + KASAN_STACK_ORDER)`).
const IRQ_STACK: &str = "irq_stack";

/// The per-CPU pointer to the CPU's exception stacks, and their members.
pub const CEA_EXCEPTION_STACKS: &str = "cea_exception_stacks";
const EXCEPTION_STACKS: [&str; 6] = [
    "DF_stack",
    "NMI_stack",
    "DB_stack",
    "MCE_stack",
    "VC_stack",
    "VC2_stack",
];

/// Where each CPU's per-CPU area is (`__per_cpu_offset[cpu]`).
pub const PER_CPU_OFFSET: &str = "__per_cpu_offset";

/// Entry text: a CPU there may still run on a stack that is none of the
/// kernel's (the user one, or the entry stack of the CPU entry area).
const ENTRY_TEXT: (&str, &str) = ("__entry_text_start", "__entry_text_end");

/// What the image says of its stacks (link addresses).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StackLayout {
    /// `THREAD_SIZE`: a task stack's size, and its alignment.
    pub thread_size: u64,
    /// Where it came from, for messages.
    pub thread_size_from: &'static str,
    /// `IRQ_STACK_SIZE`.
    pub irq_stack_size: u64,
    /// `__per_cpu_offset`'s link address.
    pub per_cpu_offset: Option<u64>,
    /// The per-CPU `hardirq_stack_ptr`, and its offset in the variable.
    pub hardirq_stack_ptr: Option<(PerCpuVar, u32)>,
    /// The per-CPU `cea_exception_stacks`, and each stack's (offset, size)
    /// in `struct cea_exception_stacks` (a size 0 one is absent).
    pub exception_stacks: Option<(PerCpuVar, Vec<(u32, u32)>)>,
    /// `__entry_text_start..__entry_text_end`.
    pub entry_text: Option<(u64, u64)>,
}

impl StackLayout {
    /// The layout of `image`'s stacks, from its symbols and `btf`. Looked
    /// up once, before any pause (BTF lookups scan types).
    pub fn find(image: &KernelImage, btf: Option<&KernelBtf>) -> StackLayout {
        let sym = |n: &str| image.symbol(n).map(|s| s.addr);
        let from_symbols = INIT_STACK_BOUNDS.iter().find_map(|(s, e)| {
            let size = sym(e)?.checked_sub(sym(s)?)?;
            (size > 0 && size.is_power_of_two()).then_some(size)
        });
        let from_btf = |name: &str| {
            let size = u64::from(btf?.struct_size(name).ok()?);
            (size > 0 && size.is_power_of_two()).then_some(size)
        };
        let (thread_size, thread_size_from) = match (from_symbols, from_btf(THREAD_UNION)) {
            (Some(s), _) => (s, "the init task's stack"),
            (None, Some(s)) => (s, "BTF's thread_union"),
            (None, None) => (DEFAULT_THREAD_SIZE, "x86-64's default"),
        };
        let per_cpu = |n: &str| {
            sym(n)
                .or_else(|| btf?.percpu_offset(n).map(u64::from))
                .and_then(PerCpuVar::from_symbol)
        };
        let hardirq_stack_ptr = per_cpu(HARDIRQ_STACK_PTR).map(|v| (v, 0)).or_else(|| {
            let at = btf?.member(PCPU_HOT, HARDIRQ_STACK_PTR).ok()?;
            Some((per_cpu(PCPU_HOT)?, at.offset))
        });
        let exception_stacks = per_cpu(CEA_EXCEPTION_STACKS).and_then(|v| {
            let btf = btf?;
            let stacks: Vec<(u32, u32)> = EXCEPTION_STACKS
                .iter()
                .filter_map(|m| btf.member(CEA_EXCEPTION_STACKS, m).ok())
                .filter(|at| at.size > 0)
                .map(|at| (at.offset, at.size))
                .collect();
            (!stacks.is_empty()).then_some((v, stacks))
        });
        StackLayout {
            thread_size,
            thread_size_from,
            irq_stack_size: from_btf(IRQ_STACK).unwrap_or(thread_size),
            per_cpu_offset: sym(PER_CPU_OFFSET),
            hardirq_stack_ptr,
            exception_stacks,
            entry_text: sym(ENTRY_TEXT.0).zip(sym(ENTRY_TEXT.1)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// The 6.1 guest's vmlinux, when built (guest/build.sh linux).
    fn guest_vmlinux(dir: &str) -> Option<KernelImage> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../guest/out")
            .join(dir)
            .join("vmlinux");
        path.exists().then(|| KernelImage::load(&path).unwrap())
    }

    #[test]
    fn the_guests_stacks_are_found_from_symbols_and_btf() {
        for (dir, hot) in [("", false), ("linux-6.12", true)] {
            let Some(image) = guest_vmlinux(dir) else {
                continue;
            };
            let btf = KernelBtf::from_image(&image).unwrap();
            let l = StackLayout::find(&image, Some(&btf));
            assert_eq!(l.thread_size, 16 << 10, "{dir}");
            assert_eq!(l.thread_size_from, "the init task's stack");
            assert_eq!(l.irq_stack_size, 16 << 10, "{dir}");
            assert!(l.per_cpu_offset.is_some() && l.entry_text.is_some());
            let (_, member) = l.hardirq_stack_ptr.expect("hardirq_stack_ptr");
            // 6.12 keeps it in pcpu_hot, past the current task.
            assert_eq!(member != 0, hot, "{dir}");
            // Without KASAN: 6 exception stacks of 8 KiB (#DF, NMI, #DB,
            // #MC, #VC, #VC2), each above a guard page.
            let (_, ex) = l.exception_stacks.expect("cea_exception_stacks");
            let want: Vec<(u32, u32)> = (0..6).map(|i| (4096 + i * 12288, 8192)).collect();
            assert_eq!(ex, want, "{dir}");
        }
    }
}
