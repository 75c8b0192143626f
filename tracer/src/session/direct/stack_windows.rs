//! Which stack a stack pointer is on, and where that stack ends, as the
//! kernel placed them (`crate::kernel::stack_bounds`): each CPU's IRQ and
//! exception stacks, read from its per-CPU area under the pause, else a
//! task stack (`THREAD_SIZE`, aligned to it: kernel/fork.c allocates them
//! `THREAD_ALIGN`ed, the init task's is placed so by the linker script).

use vmm::gva::AddressSpace;

use crate::kernel::kaslr::KernelOffset;
use crate::kernel::percpu::PerCpuVar;
use crate::kernel::stack_bounds::StackLayout;

/// The stack a stack pointer is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StackWindow {
    /// A CPU's IRQ stack: the word at `top - 8` is the stack pointer it
    /// came from (`call_on_stack`, arch/x86/include/asm/irq_stack.h).
    Irq { top: u64 },
    /// A CPU's exception (IST) stack: the CPU pushed the interrupted
    /// context's frame (SS, RSP, RFLAGS, CS, RIP) at its top.
    Exception { top: u64 },
    /// A task stack (or, for a vCPU in entry text, whatever stack it is
    /// on: the user's, or the CPU entry area's).
    Task { top: u64 },
}

/// The stacks of the guest kernel as one pause found them.
#[derive(Clone, Debug, Default)]
pub struct Stacks {
    /// `THREAD_SIZE`.
    pub thread_size: u64,
    /// Each CPU's IRQ stack, `(lowest, top)`.
    pub irq: Vec<(u64, u64)>,
    /// Each CPU's exception stacks, `(lowest, top)`.
    pub exception: Vec<(u64, u64)>,
    /// Entry text, running addresses.
    pub entry_text: Option<(u64, u64)>,
}

impl Stacks {
    /// The stacks of the kernel running at `off` whose layout is `layout`,
    /// on its first `cpus` CPUs. A CPU whose per-CPU pointers cannot be
    /// read, or are not set yet, has none listed: its stack pointer then
    /// counts as on a task stack.
    pub fn read(
        space: &mut AddressSpace<'_>,
        layout: &StackLayout,
        off: KernelOffset,
        cpus: usize,
    ) -> Stacks {
        let mut s = Stacks {
            thread_size: layout.thread_size,
            entry_text: layout
                .entry_text
                .map(|(a, b)| (off.runtime(a), off.runtime(b))),
            ..Stacks::default()
        };
        let Some(table) = layout.per_cpu_offset.map(|a| off.runtime(a)) else {
            return s;
        };
        for cpu in 0..cpus as u64 {
            let Ok(area) = space.read_u64(table + 8 * cpu) else {
                continue;
            };
            let mut ptr = |var: PerCpuVar, member: u32| {
                let va = area
                    .wrapping_add(var.gs_disp(off)? as i64 as u64)
                    .wrapping_add(u64::from(member));
                space.read_u64(va).ok().filter(|&p| p != 0)
            };
            if let Some(hsp) = layout.hardirq_stack_ptr.and_then(|(v, m)| ptr(v, m)) {
                // It points at the top word (irq_64.c: `va + IRQ_STACK_SIZE - 8`).
                let top = hsp.wrapping_add(8);
                s.irq.push((top.wrapping_sub(layout.irq_stack_size), top));
            }
            if let Some((var, members)) = &layout.exception_stacks {
                if let Some(base) = ptr(*var, 0) {
                    for &(at, size) in members {
                        let lo = base.wrapping_add(u64::from(at));
                        s.exception.push((lo, lo.wrapping_add(u64::from(size))));
                    }
                }
            }
        }
        s
    }

    /// The stack `sp` is on.
    pub fn window(&self, sp: u64) -> StackWindow {
        let on = |r: &&(u64, u64)| sp >= r.0 && sp < r.1;
        if let Some(&(_, top)) = self.irq.iter().find(on) {
            return StackWindow::Irq { top };
        }
        if let Some(&(_, top)) = self.exception.iter().find(on) {
            return StackWindow::Exception { top };
        }
        let top = (sp & !(self.thread_size - 1)).wrapping_add(self.thread_size);
        StackWindow::Task { top }
    }

    /// Is `rip` in entry text, where a vCPU may still run on a stack
    /// that is none of the kernel's own (the CPU entry area's)?
    pub fn in_entry_text(&self, rip: u64) -> bool {
        self.entry_text.is_some_and(|(a, b)| rip >= a && rip < b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stack_pointer_is_placed_on_its_stack_by_the_kernels_bounds() {
        let s = Stacks {
            thread_size: 32 << 10,
            // A vmapped IRQ stack, page-aligned only.
            irq: vec![(0xffff_c900_0000_5000, 0xffff_c900_0000_9000)],
            exception: vec![(0xffff_fe00_0000_1000, 0xffff_fe00_0000_3000)],
            entry_text: None,
        };
        assert_eq!(
            s.window(0xffff_c900_0000_8ff0),
            StackWindow::Irq {
                top: 0xffff_c900_0000_9000
            }
        );
        assert_eq!(
            s.window(0xffff_fe00_0000_2000),
            StackWindow::Exception {
                top: 0xffff_fe00_0000_3000
            }
        );
        // KASAN's 32 KiB task stacks, aligned to their size.
        assert_eq!(
            s.window(0xffff_c900_0001_0008),
            StackWindow::Task {
                top: 0xffff_c900_0001_8000
            }
        );
    }
}
