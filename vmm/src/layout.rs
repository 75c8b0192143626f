//! The guest's physical memory map and I/O ports, in one place.
//!
//! Everything the VMM writes into guest memory before the first instruction
//! runs, and every port it answers, is named here.

/// Global descriptor table: null, null, 64-bit code (0x10), data (0x18).
/// The selectors are the ones Linux's 64-bit boot protocol names
/// (`__BOOT_CS` = 0x10, `__BOOT_DS` = 0x18).
pub const GDT_START: u64 = 0x500;
/// Code segment selector used at entry (Linux `__BOOT_CS`).
pub const BOOT_CS: u16 = 0x10;
/// Data segment selector used at entry (Linux `__BOOT_DS`).
pub const BOOT_DS: u16 = 0x18;
/// An empty IDT (after the GDT's five entries): the guest installs its own
/// before it enables interrupts.
pub const IDT_START: u64 = 0x540;

/// Linux `boot_params` ("zero page"), handed to the kernel in RSI.
pub const ZERO_PAGE_START: u64 = 0x7000;

/// Boot page tables. PML4, then the identity PDPT, then the PDPT for the
/// kernel's high mapping, then four page directories of 2 MiB pages that
/// together cover the first 4 GiB.
pub const PML4_START: u64 = 0x9000;
pub const PDPT_IDENT_START: u64 = 0xa000;
pub const PDPT_HIGH_START: u64 = 0xb000;
pub const PD_START: u64 = 0xc000;
/// Number of page directories (each maps 1 GiB with 2 MiB pages).
pub const PD_COUNT: u64 = 4;

/// Kernel command line (NUL-terminated).
pub const CMDLINE_START: u64 = 0x20000;
/// Largest command line accepted, including the NUL (Linux x86 COMMAND_LINE_SIZE).
pub const CMDLINE_MAX_SIZE: usize = 2048;

/// Extended BIOS data area; the MP floating pointer and table live here,
/// where Linux's `find_smp_config` scans for them.
pub const EBDA_START: u64 = 0x9fc00;
/// MP configuration table ("PCMP"), below the EBDA because it outgrows the
/// EBDA's 1 KiB for many CPUs. The MP area is `[MPTABLE_START, LOW_MEM_END)`;
/// the floating pointer is at `EBDA_START`.
pub const MPTABLE_START: u64 = 0x9f000;
/// End of conventional memory (the legacy VGA hole starts here).
pub const LOW_MEM_END: u64 = 0xa0000;
/// ACPI tables, in the BIOS read-only area `0xe0000..0x100000` where Linux
/// (ACPICA `acpi_find_root_pointer`) scans for the RSDP on 16-byte
/// boundaries when the zero page's `acpi_rsdp_addr` is not used. The RSDP
/// comes first, then the other tables; the e820 map reports this range as
/// ACPI (see `boot::acpi`).
pub const ACPI_START: u64 = 0xe_0000;
/// Room for the tables: 64 KiB, far more than 64 CPUs' MADT needs.
pub const ACPI_SIZE: u64 = 0x1_0000;
/// Start of RAM above the legacy BIOS area, where kernels load.
pub const HIGH_MEM_START: u64 = 0x10_0000;

/// Linux's `__START_KERNEL_map`: virtual 0xffffffff80000000 maps physical 0.
pub const KERNEL_MAP_BASE: u64 = 0xffff_ffff_8000_0000;

/// Three pages KVM needs for the real-mode TSS on Intel (`KVM_SET_TSS_ADDR`),
/// just below the 4 GiB boundary, outside RAM.
pub const KVM_TSS_ADDR: u64 = 0xfffb_d000;
/// Local APIC MMIO base (architectural default).
pub const APIC_BASE: u64 = 0xfee0_0000;
/// IO-APIC MMIO base (architectural default).
pub const IOAPIC_BASE: u64 = 0xfec0_0000;

/// Most vCPUs vmtrace boots (`--cpus 1..=64`). APIC ids are `0..n` and the
/// IO-APIC takes id `n`, all within the 8-bit xAPIC id space.
pub const MAX_CPUS: u8 = 64;

/// Guest RAM ends below the 32-bit MMIO hole; we never go above 3 GiB.
pub const MAX_MEM_MIB: u64 = 3072;
/// Smallest guest we accept: room for page tables, boot data and a kernel.
pub const MIN_MEM_MIB: u64 = 32;

/// vmtrace's own memory in the guest (its exitless trampoline and rings): a
/// memory slot at 4 GiB, above all RAM (`MAX_MEM_MIB`) and the 32-bit MMIO
/// hole, and never in the guest's e820 map, so the guest neither uses it
/// nor knows of it until vmtrace maps it into its page tables.
pub const PRIVATE_START: u64 = 0x1_0000_0000;
/// 8 MiB: four 2 MiB pages (see tracer::plan::exitless::layout).
pub const PRIVATE_SIZE: u64 = 8 << 20;

/// COM1 16550 UART.
pub const SERIAL_PORT_BASE: u16 = 0x3f8;
/// Eight registers of the 16550.
pub const SERIAL_PORT_LEN: u16 = 8;
/// COM1's ISA interrupt line.
pub const SERIAL_IRQ: u32 = 4;
/// i8042 keyboard controller command port: writing 0xfe resets the machine
/// (what Linux's `reboot=k` does).
pub const I8042_COMMAND_PORT: u16 = 0x64;
pub const I8042_DATA_PORT: u16 = 0x60;
pub const I8042_RESET_CMD: u8 = 0xfe;

/// vmtrace's power-off port (like QEMU's isa-debug-exit): any byte written
/// here powers the guest off; the byte is the guest's exit status.
pub const POWEROFF_PORT: u16 = 0xf4;

/// ACPI PM1a event block: PM1 status (2 bytes) then PM1 enable (2 bytes).
/// Any free port range works; QEMU's q35 uses the same base. See `acpi_pm`.
pub const PM1A_EVT_PORT: u16 = 0x600;
/// PM1_EVT_LEN: status and enable registers, 16 bits each.
pub const PM1A_EVT_LEN: u8 = 4;
/// ACPI PM1a control register (16 bits): SCI_EN, SLP_TYP, SLP_EN.
pub const PM1A_CNT_PORT: u16 = 0x604;
/// PM1_CNT_LEN.
pub const PM1A_CNT_LEN: u8 = 2;
/// The ACPI system control interrupt: ISA IRQ 9, as on PCs (the FADT's
/// SCI_INT; the MADT makes it level-triggered, active high).
pub const SCI_IRQ: u8 = 9;

/// The port patched call sites write to (`out TRACE_PORT, al`). Each write is
/// one traced function entry. Nothing on a PC decodes port 0xe5.
pub const TRACE_PORT: u16 = 0xe5;

/// Guest-physical address of a virtual address in the kernel's high mapping.
pub fn kernel_virt_to_phys(va: u64) -> Option<u64> {
    va.checked_sub(KERNEL_MAP_BASE)
}
