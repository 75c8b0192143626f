//! The guest kernel's per-CPU variables as vmtrace's code reads them:
//! `gs:[disp32]`, as the kernel's own `this_cpu_read()` does.
//!
//! x86-64 Linux has had two layouts (both: CPU i's copy of variable `v` is at
//! `__per_cpu_offset[i] + &v`, and GS base = `__per_cpu_offset[i]`):
//!
//! - **Up to 6.14**: the per-CPU section is linked at address 0
//!   (`PERCPU_VADDR(..., 0, :percpu)`), so a per-CPU symbol's value is its
//!   offset in the area, a small number; the relocs tool leaves references
//!   to it alone, so KASLR does not move it; GS base = the CPU's area.
//! - **6.15 and later** ("x86/percpu/64: Use relative percpu offsets"): the
//!   section is linked in the kernel image like other data, so a per-CPU
//!   symbol's value is a kernel address (0xffffffff8...), relocated by KASLR
//!   like any other; GS base = the CPU's area less `__per_cpu_start` (0 on
//!   the boot CPU until its area exists, when it reads the template in the
//!   image). `gs:[disp32]` still reaches it: a kernel address is a
//!   sign-extended 32-bit displacement.

use crate::kernel::kaslr::KernelOffset;

/// Which of the two layouts a per-CPU symbol is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PerCpuLayout {
    /// An offset in the area (the section linked at 0): up to Linux 6.14.
    Offset,
    /// A kernel address (the section linked in the image): Linux 6.15+.
    Address,
}

/// The lowest kernel-image address: `__START_KERNEL_map`, where the kernel
/// half's top 2 GiB (sign-extended 32-bit displacements) begins.
const KERNEL_MAP: u64 = 0xffff_ffff_8000_0000;

/// A per-CPU variable of the guest kernel, from its symbol's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PerCpuVar {
    /// The symbol's value in the vmlinux.
    pub link: u64,
    pub layout: PerCpuLayout,
}

impl PerCpuVar {
    /// The variable whose symbol has value `addr`, or None when it is in
    /// neither layout (not a per-CPU symbol a `gs:[disp32]` can read).
    pub fn from_symbol(addr: u64) -> Option<PerCpuVar> {
        let layout = if addr < i32::MAX as u64 {
            PerCpuLayout::Offset
        } else if addr >= KERNEL_MAP {
            PerCpuLayout::Address
        } else {
            return None;
        };
        Some(PerCpuVar { link: addr, layout })
    }

    /// The `gs:[disp32]` displacement that reads it on the kernel running
    /// at `off` from its link addresses; None if KASLR moved it out of the
    /// top 2 GiB (no kernel is placed there).
    pub fn gs_disp(self, off: KernelOffset) -> Option<i32> {
        match self.layout {
            // Absolute: KASLR moves the image, not the offsets in an area.
            PerCpuLayout::Offset => i32::try_from(self.link).ok(),
            PerCpuLayout::Address => {
                let va = off.runtime(self.link);
                (va >= KERNEL_MAP).then_some(va as i64 as i32)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_layouts_give_the_displacement_the_kernel_itself_uses() {
        let slide = KernelOffset {
            virt: 0x1e00_0000,
            phys: 0x1e00_0000,
        };
        // 6.1's cpu_number (an offset in the area): KASLR does not move it.
        let old = PerCpuVar::from_symbol(0x1c11c).unwrap();
        assert_eq!(old.layout, PerCpuLayout::Offset);
        assert_eq!(old.gs_disp(KernelOffset::NONE), Some(0x1c11c));
        assert_eq!(old.gs_disp(slide), Some(0x1c11c));
        // 6.15's (a kernel address): sign-extended, and moved by KASLR.
        let new = PerCpuVar::from_symbol(0xffff_ffff_8250_4018).unwrap();
        assert_eq!(new.layout, PerCpuLayout::Address);
        assert_eq!(
            new.gs_disp(KernelOffset::NONE),
            Some(0xffff_ffff_8250_4018u64 as i64 as i32)
        );
        assert_eq!(
            new.gs_disp(slide).map(|d| d as i64 as u64),
            Some(0xffff_ffff_a050_4018)
        );
        // Neither: between 2 GiB and the kernel map, or slid out of reach.
        for bad in [0x8000_0000u64, 0xffff_8880_0000_0000, 0x7fff_ffff_ffff] {
            assert_eq!(PerCpuVar::from_symbol(bad), None, "{bad:#x}");
        }
        let top = PerCpuVar::from_symbol(0xffff_ffff_ff00_0000).unwrap();
        let wrap = KernelOffset {
            virt: 0x0200_0000,
            phys: 0,
        };
        assert_eq!(top.gs_disp(wrap), None);
    }
}
