//! The 64-bit entry state of a vCPU: page tables, GDT, segments, control
//! registers, general registers, FPU, boot MSRs and the local APIC's LINT pins.
//!
//! One small function per step, each with its own error, so a failure names
//! the step.

use kvm_bindings::{kvm_fpu, kvm_msr_entry, kvm_regs, kvm_segment, kvm_sregs, Msrs};
use kvm_ioctls::VcpuFd;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::layout;

#[derive(Debug, thiserror::Error)]
pub enum RegsError {
    #[error("cannot write the boot page tables at {addr:#x}: {source}")]
    PageTables {
        addr: u64,
        source: vm_memory::GuestMemoryError,
    },
    #[error("cannot write the GDT at {addr:#x}: {source}")]
    Gdt {
        addr: u64,
        source: vm_memory::GuestMemoryError,
    },
    #[error("KVM_{ioctl} failed on vCPU {cpu}: {source}")]
    Ioctl {
        ioctl: &'static str,
        cpu: usize,
        source: kvm_ioctls::Error,
    },
    #[error("KVM_SET_MSRS set only {set} of {wanted} boot MSRs on vCPU {cpu}")]
    Msrs {
        cpu: usize,
        set: usize,
        wanted: usize,
    },
}

// Page-table entry bits (Intel SDM vol. 3, 4.5).
const PTE_PRESENT: u64 = 1 << 0;
const PTE_WRITABLE: u64 = 1 << 1;
const PTE_HUGE: u64 = 1 << 7;
const PAGE_2M: u64 = 2 << 20;

// Control-register bits.
const CR0_PE: u64 = 1 << 0;
const CR0_MP: u64 = 1 << 1;
const CR0_ET: u64 = 1 << 4;
const CR0_NE: u64 = 1 << 5;
const CR0_WP: u64 = 1 << 16;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;

/// Index of PML4 / PDPT entries that map Linux's `__START_KERNEL_map`.
const PML4_KERNEL_INDEX: u64 = 511;
const PDPT_KERNEL_INDEX: u64 = 510;

/// Write the boot page tables: the first 4 GiB identity-mapped, and
/// 0xffffffff80000000 (1 GiB, as Linux's own `level2_kernel_pgt` covers at
/// most) mapped to physical 0, with 2 MiB pages. The top 1 GiB
/// (0xffffffffc0000000-) stays unmapped, as the fixmap range Linux keeps
/// free there for others is: vmtrace maps its own code there (exitless).
pub fn setup_page_tables(mem: &GuestMemoryMmap) -> Result<(), RegsError> {
    let put = |addr: u64, val: u64| {
        mem.write_obj(val, GuestAddress(addr))
            .map_err(|source| RegsError::PageTables { addr, source })
    };
    let table = PTE_PRESENT | PTE_WRITABLE;
    put(layout::PML4_START, layout::PDPT_IDENT_START | table)?;
    put(
        layout::PML4_START + PML4_KERNEL_INDEX * 8,
        layout::PDPT_HIGH_START | table,
    )?;
    for pd in 0..layout::PD_COUNT {
        let pd_addr = layout::PD_START + pd * 0x1000;
        put(layout::PDPT_IDENT_START + pd * 8, pd_addr | table)?;
        for i in 0..512 {
            let phys = (pd * 512 + i) * PAGE_2M;
            put(pd_addr + i * 8, phys | table | PTE_HUGE)?;
        }
    }
    // The kernel map's 1 GiB is the first identity page directory.
    put(
        layout::PDPT_HIGH_START + PDPT_KERNEL_INDEX * 8,
        layout::PD_START | table,
    )?;
    Ok(())
}

/// GDT entries: null, null, 64-bit code (0x10), data (0x18), TSS (0x20).
const GDT: [u64; 5] = [
    0,
    0,
    0x00af_9b00_0000_ffff, // code: present, DPL 0, execute/read, L=1, G=1
    0x00cf_9300_0000_ffff, // data: present, DPL 0, read/write, D/B=1, G=1
    0x008f_8b00_0000_ffff, // TSS: present, busy 64-bit TSS (KVM wants a valid TR)
];
const TSS_SELECTOR: u16 = 0x20;

/// Write the GDT and an empty IDT.
pub fn setup_gdt(mem: &GuestMemoryMmap) -> Result<(), RegsError> {
    for (i, entry) in GDT.iter().enumerate() {
        let addr = layout::GDT_START + i as u64 * 8;
        mem.write_obj(*entry, GuestAddress(addr))
            .map_err(|source| RegsError::Gdt { addr, source })?;
    }
    mem.write_obj(0u64, GuestAddress(layout::IDT_START))
        .map_err(|source| RegsError::Gdt {
            addr: layout::IDT_START,
            source,
        })
}

/// A segment register as KVM wants it, from its GDT entry.
fn segment(selector: u16, entry: u64) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector,
        type_: ((entry >> 40) & 0xf) as u8,
        present: ((entry >> 47) & 1) as u8,
        dpl: ((entry >> 45) & 3) as u8,
        db: ((entry >> 54) & 1) as u8,
        s: ((entry >> 44) & 1) as u8,
        l: ((entry >> 53) & 1) as u8,
        g: ((entry >> 55) & 1) as u8,
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}

/// Segments, descriptor tables and control registers for 64-bit long mode.
pub fn setup_sregs(vcpu: &VcpuFd, cpu: usize) -> Result<(), RegsError> {
    let ioctl = |ioctl, source| RegsError::Ioctl { ioctl, cpu, source };
    let mut sregs: kvm_sregs = vcpu.get_sregs().map_err(|e| ioctl("GET_SREGS", e))?;
    let code = segment(layout::BOOT_CS, GDT[2]);
    let data = segment(layout::BOOT_DS, GDT[3]);
    sregs.cs = code;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = segment(TSS_SELECTOR, GDT[4]);
    sregs.gdt.base = layout::GDT_START;
    sregs.gdt.limit = (GDT.len() * 8 - 1) as u16;
    sregs.idt.base = layout::IDT_START;
    sregs.idt.limit = 7;
    sregs.cr0 = CR0_PE | CR0_MP | CR0_ET | CR0_NE | CR0_WP | CR0_PG;
    sregs.cr3 = layout::PML4_START;
    sregs.cr4 = CR4_PAE;
    sregs.efer = EFER_LME | EFER_LMA;
    vcpu.set_sregs(&sregs).map_err(|e| ioctl("SET_SREGS", e))
}

/// General registers at entry: RIP, and the three argument registers the boot
/// protocol defines (Linux: RSI = zero page; vmtrace direct boot: RDI = vCPU
/// index, RSI = command line, RDX = vCPU count).
pub fn setup_regs(vcpu: &VcpuFd, cpu: usize, rip: u64, args: [u64; 3]) -> Result<(), RegsError> {
    let regs = kvm_regs {
        rflags: 0x2, // bit 1 is reserved and always set; IF clear
        rip,
        rdi: args[0],
        rsi: args[1],
        rdx: args[2],
        // A scratch stack below the zero page; Linux and the mini guest set their own.
        rsp: layout::ZERO_PAGE_START - 0x10,
        ..Default::default()
    };
    vcpu.set_regs(&regs).map_err(|source| RegsError::Ioctl {
        ioctl: "SET_REGS",
        cpu,
        source,
    })
}

/// x87 control word and MXCSR at their power-on defaults.
pub fn setup_fpu(vcpu: &VcpuFd, cpu: usize) -> Result<(), RegsError> {
    let fpu = kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    };
    vcpu.set_fpu(&fpu).map_err(|source| RegsError::Ioctl {
        ioctl: "SET_FPU",
        cpu,
        source,
    })
}

// MSR indices (Intel SDM vol. 4).
const MSR_IA32_SYSENTER_CS: u32 = 0x174;
const MSR_IA32_SYSENTER_ESP: u32 = 0x175;
const MSR_IA32_SYSENTER_EIP: u32 = 0x176;
const MSR_STAR: u32 = 0xc000_0081;
const MSR_LSTAR: u32 = 0xc000_0082;
const MSR_CSTAR: u32 = 0xc000_0083;
const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;
const MSR_IA32_TSC: u32 = 0x10;
const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
const MISC_ENABLE_FAST_STRING: u64 = 1;
const MSR_MTRR_DEF_TYPE: u32 = 0x2ff;
/// MTRRs enabled, default memory type write-back.
const MTRR_ENABLE_WB: u64 = (1 << 11) | 6;

/// The MSRs a freshly reset CPU would have, plus write-back MTRRs so Linux
/// does not map all of RAM uncached.
pub fn setup_msrs(vcpu: &VcpuFd, cpu: usize) -> Result<(), RegsError> {
    let entries: Vec<kvm_msr_entry> = [
        (MSR_IA32_SYSENTER_CS, 0),
        (MSR_IA32_SYSENTER_ESP, 0),
        (MSR_IA32_SYSENTER_EIP, 0),
        (MSR_STAR, 0),
        (MSR_CSTAR, 0),
        (MSR_KERNEL_GS_BASE, 0),
        (MSR_SYSCALL_MASK, 0),
        (MSR_LSTAR, 0),
        (MSR_IA32_TSC, 0),
        (MSR_IA32_MISC_ENABLE, MISC_ENABLE_FAST_STRING),
        (MSR_MTRR_DEF_TYPE, MTRR_ENABLE_WB),
    ]
    .iter()
    .map(|&(index, data)| kvm_msr_entry {
        index,
        data,
        ..Default::default()
    })
    .collect();
    let wanted = entries.len();
    let msrs = Msrs::from_entries(&entries).expect("boot MSR list fits a Msrs FamStruct");
    let set = vcpu.set_msrs(&msrs).map_err(|source| RegsError::Ioctl {
        ioctl: "SET_MSRS",
        cpu,
        source,
    })?;
    if set != wanted {
        return Err(RegsError::Msrs { cpu, set, wanted });
    }
    Ok(())
}

// Local APIC register offsets and delivery modes (Intel SDM vol. 3, 11.5.1).
const APIC_LVT0: usize = 0x350;
const APIC_LVT1: usize = 0x360;
const APIC_MODE_NMI: u32 = 0x4;
const APIC_MODE_EXTINT: u32 = 0x7;

/// Wire LINT0 to the legacy PIC (ExtINT) and LINT1 to NMI, as firmware does;
/// Linux relies on it for the PIT timer before the IO-APIC is up.
pub fn setup_lint(vcpu: &VcpuFd, cpu: usize) -> Result<(), RegsError> {
    let ioctl = |ioctl, source| RegsError::Ioctl { ioctl, cpu, source };
    let mut lapic = vcpu.get_lapic().map_err(|e| ioctl("GET_LAPIC", e))?;
    let set_mode = |regs: &mut [std::os::raw::c_char], off: usize, mode: u32| {
        let mut bytes = [0u8; 4];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = regs[off + i] as u8;
        }
        let v = (u32::from_le_bytes(bytes) & !0x700) | (mode << 8);
        for (i, b) in v.to_le_bytes().iter().enumerate() {
            regs[off + i] = *b as std::os::raw::c_char;
        }
    };
    set_mode(&mut lapic.regs, APIC_LVT0, APIC_MODE_EXTINT);
    set_mode(&mut lapic.regs, APIC_LVT1, APIC_MODE_NMI);
    vcpu.set_lapic(&lapic).map_err(|e| ioctl("SET_LAPIC", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 64 << 20)]).unwrap()
    }

    #[test]
    fn page_tables_map_identity_and_kernel_high() {
        let m = mem();
        setup_page_tables(&m).unwrap();
        let pml4_0: u64 = m.read_obj(GuestAddress(layout::PML4_START)).unwrap();
        assert_eq!(pml4_0, layout::PDPT_IDENT_START | 3);
        let pml4_511: u64 = m
            .read_obj(GuestAddress(layout::PML4_START + 511 * 8))
            .unwrap();
        assert_eq!(pml4_511, layout::PDPT_HIGH_START | 3);
        // Walk 0xffffffff81000000 by hand through the GVA walker.
        let t = crate::gva::translate(
            &m,
            layout::PML4_START,
            crate::gva::PagingMode::Level4,
            0xffff_ffff_8100_0123,
        )
        .unwrap();
        assert_eq!(t.gpa, 0x100_0123);
        let t = crate::gva::translate(
            &m,
            layout::PML4_START,
            crate::gva::PagingMode::Level4,
            0xdead_beef,
        )
        .unwrap();
        assert_eq!(t.gpa, 0xdead_beef);
        // The top 1 GiB is left free.
        assert!(crate::gva::translate(
            &m,
            layout::PML4_START,
            crate::gva::PagingMode::Level4,
            0xffff_ffff_ff80_0000,
        )
        .is_err());
    }

    #[test]
    fn gdt_entries_read_back() {
        let m = mem();
        setup_gdt(&m).unwrap();
        let code: u64 = m
            .read_obj(GuestAddress(layout::GDT_START + u64::from(layout::BOOT_CS)))
            .unwrap();
        assert_eq!(code, GDT[2]);
        let data: u64 = m
            .read_obj(GuestAddress(layout::GDT_START + u64::from(layout::BOOT_DS)))
            .unwrap();
        assert_eq!(data, GDT[3]);
        let s = segment(layout::BOOT_CS, code);
        assert_eq!((s.l, s.present, s.type_, s.s), (1, 1, 0xb, 1));
    }
}
