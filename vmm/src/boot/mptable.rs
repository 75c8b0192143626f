//! Intel MultiProcessor Specification 1.4 tables: how a guest without ACPI
//! learns its CPUs, its IO-APIC and how ISA interrupts reach it.
//!
//! Linux (`arch/x86/kernel/mpparse.c`) looks for the 16-byte *floating
//! pointer* ("_MP_") on 16-byte boundaries in the last KiB of base memory
//! (`0x9fc00..0xa0000`), then follows its `physptr` to the *configuration
//! table* ("PCMP"): a header followed by processor, bus, IO-APIC, IO interrupt
//! and local interrupt entries.
//!
//! Placement: a processor entry is 20 bytes, so for 64 CPUs the configuration
//! table alone (about 1.5 KiB) does not fit in the 1 KiB EBDA. The floating
//! pointer therefore sits at [`EBDA_START`] and the configuration table just
//! below it, at [`MPTABLE_START`]; the whole MP area is
//! `[MPTABLE_START, LOW_MEM_END)` and the e820 map (see `boot::linux`) ends
//! low RAM at [`MPTABLE_START`]. Linux also `memblock_reserve`s both
//! structures when it finds them.
//!
//! There is no maintained crates.io crate that builds MP tables against our
//! vm-memory version (the MP code of Firecracker, crosvm, cloud-hypervisor
//! and dbs-boot lives inside those projects), hence this small module.

use std::mem::size_of;

use vm_memory::{
    ByteValued, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryError, GuestMemoryMmap,
};

use crate::layout::{APIC_BASE, EBDA_START, IOAPIC_BASE, LOW_MEM_END};

pub use crate::layout::{MAX_CPUS, MPTABLE_START};

/// Errors from [`setup_mptable`].
#[derive(Debug, thiserror::Error)]
pub enum MpTableError {
    #[error("MP table: {0} CPUs requested, at most {MAX_CPUS} are supported")]
    TooManyCpus(u8),
    #[error("MP table: at least one CPU is required")]
    NoCpus,
    #[error(
        "MP table: guest memory does not cover [{start:#x}, {end:#x}), where the MP table goes"
    )]
    NotEnoughMemory { start: u64, end: u64 },
    #[error("MP table: writing the {what} at {addr:#x}: {source}")]
    Write {
        what: &'static str,
        addr: u64,
        source: GuestMemoryError,
    },
}

// Signatures and values from the MP specification 1.4 and Linux's
// arch/x86/include/asm/mpspec_def.h.
const MPF_SIGNATURE: [u8; 4] = *b"_MP_";
const MPC_SIGNATURE: [u8; 4] = *b"PCMP";
/// MP specification revision 1.4.
const MP_SPEC_REV: u8 = 4;
const MPC_OEM: [u8; 8] = *b"VMTRACE ";
const MPC_PRODUCT_ID: [u8; 12] = *b"VMTRACE VMM ";

// Entry types.
const MP_PROCESSOR: u8 = 0;
const MP_BUS: u8 = 1;
const MP_IOAPIC: u8 = 2;
const MP_INTSRC: u8 = 3;
const MP_LINTSRC: u8 = 4;

// Processor entry flags.
const CPU_ENABLED: u8 = 1 << 0;
const CPU_BOOTPROCESSOR: u8 = 1 << 1;
/// Local APIC version of KVM's in-kernel LAPIC (integrated APIC).
const LAPIC_VERSION: u8 = 0x14;
/// Version register value of KVM's in-kernel IO-APIC.
const IOAPIC_VERSION: u8 = 0x11;
/// CPU signature: family 6, model 0, stepping 0 (Linux only prints it).
const CPU_SIGNATURE: u32 = 0x600;
/// CPUID.1:EDX feature bits: FPU and on-chip APIC.
const CPU_FEATURES: u32 = (1 << 0) | (1 << 9);

const ISA_BUS_ID: u8 = 0;
const BUS_TYPE_ISA: [u8; 6] = *b"ISA   ";
/// IO-APIC flag: usable.
const MPC_APIC_USABLE: u8 = 1;

// Interrupt types of IO and local interrupt entries.
const MP_INT: u8 = 0;
const MP_NMI: u8 = 1;
const MP_EXTINT: u8 = 3;
/// Polarity and trigger mode "conform to the bus" (ISA: active high, edge).
const MP_IRQ_DEFAULT: u16 = 0;
/// Local interrupt entries' destination meaning "every local APIC".
const MP_APIC_ALL: u8 = 0xff;
/// ISA interrupt lines 0..15.
const ISA_IRQS: u8 = 16;

/// MP floating pointer structure.
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, Default)]
struct MpfIntel {
    signature: [u8; 4],
    physptr: u32,
    /// Length in 16-byte units.
    length: u8,
    specification: u8,
    checksum: u8,
    /// Feature byte 1: 0 means "a configuration table is present".
    feature1: u8,
    /// Feature byte 2: bit 7 = IMCR present (PIC mode); 0 = virtual wire.
    feature2: u8,
    feature3: [u8; 3],
}
// SAFETY: `MpfIntel` is `repr(C, packed)` with only integer fields, so it has
// no padding and every byte pattern is a valid value.
unsafe impl ByteValued for MpfIntel {}

/// MP configuration table header.
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, Default)]
struct MpcTable {
    signature: [u8; 4],
    /// Length of the base table, header included.
    length: u16,
    spec: u8,
    checksum: u8,
    oem: [u8; 8],
    productid: [u8; 12],
    oemptr: u32,
    oemsize: u16,
    /// Number of entries in the base table.
    oemcount: u16,
    lapic: u32,
    /// Extended table length and checksum, and a reserved byte.
    reserved: u32,
}
// SAFETY: `repr(C, packed)` with only integer fields: no padding, every byte
// pattern is valid.
unsafe impl ByteValued for MpcTable {}

/// Processor entry.
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, Default)]
struct MpcCpu {
    type_: u8,
    apicid: u8,
    apicver: u8,
    cpuflag: u8,
    cpufeature: u32,
    featureflag: u32,
    reserved: [u32; 2],
}
// SAFETY: `repr(C, packed)` with only integer fields: no padding, every byte
// pattern is valid.
unsafe impl ByteValued for MpcCpu {}

/// Bus entry.
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, Default)]
struct MpcBus {
    type_: u8,
    busid: u8,
    bustype: [u8; 6],
}
// SAFETY: `repr(C, packed)` with only integer fields: no padding, every byte
// pattern is valid.
unsafe impl ByteValued for MpcBus {}

/// IO-APIC entry.
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, Default)]
struct MpcIoapic {
    type_: u8,
    apicid: u8,
    apicver: u8,
    flags: u8,
    apicaddr: u32,
}
// SAFETY: `repr(C, packed)` with only integer fields: no padding, every byte
// pattern is valid.
unsafe impl ByteValued for MpcIoapic {}

/// IO interrupt assignment entry (type 3) and local interrupt assignment
/// entry (type 4) share this layout; for type 4 the last two bytes are the
/// destination local APIC id and its LINTn pin.
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, Default)]
struct MpcIntsrc {
    type_: u8,
    irqtype: u8,
    irqflag: u16,
    srcbus: u8,
    srcbusirq: u8,
    dstapic: u8,
    dstirq: u8,
}
// SAFETY: `repr(C, packed)` with only integer fields: no padding, every byte
// pattern is valid.
unsafe impl ByteValued for MpcIntsrc {}

/// Number of entries in the configuration table for `num_cpus` CPUs.
const fn entry_count(num_cpus: u8) -> usize {
    // CPUs, the ISA bus, the IO-APIC, ISA IRQs, LINT0 and LINT1.
    num_cpus as usize + 1 + 1 + ISA_IRQS as usize + 2
}

/// Length in bytes of the configuration table for `num_cpus` CPUs.
const fn config_table_len(num_cpus: u8) -> usize {
    size_of::<MpcTable>()
        + num_cpus as usize * size_of::<MpcCpu>()
        + size_of::<MpcBus>()
        + size_of::<MpcIoapic>()
        + (ISA_IRQS as usize + 2) * size_of::<MpcIntsrc>()
}

// The largest table must end before the floating pointer.
const _: () = assert!(MPTABLE_START + config_table_len(MAX_CPUS) as u64 <= EBDA_START);
const _: () = assert!(EBDA_START + size_of::<MpfIntel>() as u64 <= LOW_MEM_END);

/// The value that makes `bytes` sum to zero modulo 256 when added to them.
fn checksum(bytes: &[u8]) -> u8 {
    bytes
        .iter()
        .fold(0u8, |sum, b| sum.wrapping_add(*b))
        .wrapping_neg()
}

fn check_cpu_count(num_cpus: u8) -> Result<(), MpTableError> {
    match num_cpus {
        0 => Err(MpTableError::NoCpus),
        n if n > MAX_CPUS => Err(MpTableError::TooManyCpus(n)),
        _ => Ok(()),
    }
}

/// Processor entry for the vCPU with local APIC id `apic_id`; id 0 is the
/// bootstrap processor.
fn cpu_entry(apic_id: u8) -> MpcCpu {
    let bsp = if apic_id == 0 { CPU_BOOTPROCESSOR } else { 0 };
    MpcCpu {
        type_: MP_PROCESSOR,
        apicid: apic_id,
        apicver: LAPIC_VERSION,
        cpuflag: CPU_ENABLED | bsp,
        cpufeature: CPU_SIGNATURE,
        featureflag: CPU_FEATURES,
        reserved: [0; 2],
    }
}

fn isa_bus_entry() -> MpcBus {
    MpcBus {
        type_: MP_BUS,
        busid: ISA_BUS_ID,
        bustype: BUS_TYPE_ISA,
    }
}

fn ioapic_entry(ioapic_id: u8) -> MpcIoapic {
    MpcIoapic {
        type_: MP_IOAPIC,
        apicid: ioapic_id,
        apicver: IOAPIC_VERSION,
        flags: MPC_APIC_USABLE,
        apicaddr: IOAPIC_BASE as u32,
    }
}

/// ISA IRQ `irq` arrives on IO-APIC pin `irq`.
///
/// Identity, as Firecracker does, and unlike real PCs (whose ACPI tables
/// override IRQ 0 to pin 2): KVM's default GSI routing
/// (`kvm_setup_default_irq_routing`) wires GSI n to PIC pin n and IO-APIC
/// pin n, and the in-kernel PIT raises GSI 0, so the timer really does
/// arrive on pin 0. An "IRQ 0 -> pin 2" entry would send Linux looking for
/// the timer on a pin nothing drives, unless the VMM installed QEMU-style
/// custom routing (it does not).
fn isa_irq_entry(irq: u8, ioapic_id: u8) -> MpcIntsrc {
    MpcIntsrc {
        type_: MP_INTSRC,
        irqtype: MP_INT,
        irqflag: MP_IRQ_DEFAULT,
        srcbus: ISA_BUS_ID,
        srcbusirq: irq,
        dstapic: ioapic_id,
        dstirq: irq,
    }
}

/// Local interrupt entry: interrupt type `irqtype` on pin LINT`lint` of the
/// local APIC `apic_id`.
fn local_irq_entry(irqtype: u8, apic_id: u8, lint: u8) -> MpcIntsrc {
    MpcIntsrc {
        type_: MP_LINTSRC,
        irqtype,
        irqflag: MP_IRQ_DEFAULT,
        srcbus: ISA_BUS_ID,
        srcbusirq: 0,
        dstapic: apic_id,
        dstirq: lint,
    }
}

/// The configuration table (header and entries, checksummed) for
/// `num_cpus` CPUs, as the bytes to write at [`MPTABLE_START`].
fn config_table(num_cpus: u8) -> Vec<u8> {
    let ioapic_id = num_cpus;
    let mut entries = Vec::with_capacity(config_table_len(num_cpus));
    for apic_id in 0..num_cpus {
        entries.extend_from_slice(cpu_entry(apic_id).as_slice());
    }
    entries.extend_from_slice(isa_bus_entry().as_slice());
    entries.extend_from_slice(ioapic_entry(ioapic_id).as_slice());
    for irq in 0..ISA_IRQS {
        entries.extend_from_slice(isa_irq_entry(irq, ioapic_id).as_slice());
    }
    // The 8259 PIC's output (virtual wire mode) on the BSP's LINT0; NMIs on
    // every CPU's LINT1. Same as Firecracker.
    entries.extend_from_slice(local_irq_entry(MP_EXTINT, 0, 0).as_slice());
    entries.extend_from_slice(local_irq_entry(MP_NMI, MP_APIC_ALL, 1).as_slice());

    let mut header = MpcTable {
        signature: MPC_SIGNATURE,
        length: (size_of::<MpcTable>() + entries.len()) as u16,
        spec: MP_SPEC_REV,
        checksum: 0,
        oem: MPC_OEM,
        productid: MPC_PRODUCT_ID,
        oemptr: 0,
        oemsize: 0,
        oemcount: entry_count(num_cpus) as u16,
        lapic: APIC_BASE as u32,
        reserved: 0,
    };
    let mut table = [header.as_slice(), &entries].concat();
    header.checksum = checksum(&table);
    table[..size_of::<MpcTable>()].copy_from_slice(header.as_slice());
    debug_assert_eq!(table.len(), config_table_len(num_cpus));
    table
}

/// The floating pointer to a configuration table at `table_addr`.
fn floating_pointer(table_addr: u64) -> MpfIntel {
    let mut mpf = MpfIntel {
        signature: MPF_SIGNATURE,
        physptr: table_addr as u32,
        length: (size_of::<MpfIntel>() / 16) as u8,
        specification: MP_SPEC_REV,
        ..Default::default()
    };
    mpf.checksum = checksum(mpf.as_slice());
    mpf
}

/// The MP area must be guest RAM.
fn check_memory(mem: &GuestMemoryMmap) -> Result<(), MpTableError> {
    let len = (LOW_MEM_END - MPTABLE_START) as usize;
    if mem.check_range(GuestAddress(MPTABLE_START), len) {
        Ok(())
    } else {
        Err(MpTableError::NotEnoughMemory {
            start: MPTABLE_START,
            end: LOW_MEM_END,
        })
    }
}

fn write_bytes(
    mem: &GuestMemoryMmap,
    what: &'static str,
    addr: u64,
    bytes: &[u8],
) -> Result<(), MpTableError> {
    mem.write_slice(bytes, GuestAddress(addr))
        .map_err(|source| MpTableError::Write { what, addr, source })
}

/// Write an MP floating pointer (at [`EBDA_START`]) and configuration table
/// (at [`MPTABLE_START`]) describing `num_cpus` CPUs with APIC ids `0..n`
/// (CPU 0 the BSP), one ISA bus, the IO-APIC at [`IOAPIC_BASE`] with id
/// `num_cpus`, ISA IRQs 0..15 on IO-APIC pins 0..15, LINT0 ExtINT and LINT1
/// NMI. The whole MP area `[MPTABLE_START, LOW_MEM_END)` is cleared first, so
/// no stale signature survives.
pub fn setup_mptable(mem: &GuestMemoryMmap, num_cpus: u8) -> Result<(), MpTableError> {
    check_cpu_count(num_cpus)?;
    check_memory(mem)?;
    let area = vec![0u8; (LOW_MEM_END - MPTABLE_START) as usize];
    write_bytes(mem, "cleared MP area", MPTABLE_START, &area)?;
    write_bytes(
        mem,
        "MP configuration table",
        MPTABLE_START,
        &config_table(num_cpus),
    )?;
    let mpf = floating_pointer(MPTABLE_START);
    write_bytes(mem, "MP floating pointer", EBDA_START, mpf.as_slice())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guest_mem(size: u64) -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), size as usize)]).unwrap()
    }

    fn read_bytes(mem: &GuestMemoryMmap, addr: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        mem.read_slice(&mut buf, GuestAddress(addr)).unwrap();
        buf
    }

    fn sum(bytes: &[u8]) -> u8 {
        bytes.iter().fold(0u8, |s, b| s.wrapping_add(*b))
    }

    /// Scan `[EBDA_START, LOW_MEM_END)` like Linux's `smp_scan_config`.
    fn find_floating_pointer(mem: &GuestMemoryMmap) -> u64 {
        let found: Vec<u64> = (EBDA_START..LOW_MEM_END)
            .step_by(16)
            .filter(|&a| read_bytes(mem, a, 4) == b"_MP_")
            .collect();
        assert_eq!(found.len(), 1, "exactly one _MP_ signature in the EBDA");
        found[0]
    }

    /// Everything the tests check about a table written for `n` CPUs.
    fn check_table(mem: &GuestMemoryMmap, n: u8) {
        let mpf_addr = find_floating_pointer(mem);
        assert_eq!(mpf_addr % 16, 0);
        let mpf: MpfIntel = mem.read_obj(GuestAddress(mpf_addr)).unwrap();
        assert_eq!(sum(mpf.as_slice()), 0, "floating pointer checksum");
        assert_eq!({ mpf.length }, 1);
        assert_eq!({ mpf.specification }, 4);
        assert_eq!({ mpf.feature1 }, 0, "a configuration table is present");

        let table_addr = u64::from(mpf.physptr);
        let hdr: MpcTable = mem.read_obj(GuestAddress(table_addr)).unwrap();
        assert_eq!(hdr.signature, *b"PCMP");
        let len = usize::from(hdr.length);
        assert!(
            table_addr + len as u64 <= EBDA_START,
            "table overlaps pointer"
        );
        assert!(table_addr >= MPTABLE_START);
        let table = read_bytes(mem, table_addr, len);
        assert_eq!(sum(&table), 0, "configuration table checksum");
        assert_eq!({ hdr.lapic }, APIC_BASE as u32);

        // Walk the entries.
        let mut off = size_of::<MpcTable>();
        let mut count = 0;
        let mut cpus = Vec::new();
        let (mut buses, mut ioapics, mut lints) = (0, 0, Vec::new());
        let mut irqs = Vec::new();
        while off < len {
            let at = GuestAddress(table_addr + off as u64);
            off += match table[off] {
                MP_PROCESSOR => {
                    let cpu: MpcCpu = mem.read_obj(at).unwrap();
                    cpus.push((cpu.apicid, cpu.cpuflag));
                    size_of::<MpcCpu>()
                }
                MP_BUS => {
                    let bus: MpcBus = mem.read_obj(at).unwrap();
                    assert_eq!(bus.bustype, *b"ISA   ");
                    buses += 1;
                    size_of::<MpcBus>()
                }
                MP_IOAPIC => {
                    let io: MpcIoapic = mem.read_obj(at).unwrap();
                    assert_eq!(io.apicid, n, "IO-APIC id follows the CPUs");
                    assert_eq!({ io.apicaddr }, IOAPIC_BASE as u32);
                    assert_eq!(io.flags & MPC_APIC_USABLE, MPC_APIC_USABLE);
                    ioapics += 1;
                    size_of::<MpcIoapic>()
                }
                MP_INTSRC => {
                    let e: MpcIntsrc = mem.read_obj(at).unwrap();
                    assert_eq!(e.dstapic, n);
                    irqs.push((e.srcbusirq, e.dstirq));
                    size_of::<MpcIntsrc>()
                }
                MP_LINTSRC => {
                    let e: MpcIntsrc = mem.read_obj(at).unwrap();
                    lints.push((e.irqtype, e.dstirq));
                    size_of::<MpcIntsrc>()
                }
                t => panic!("unknown entry type {t} at offset {off}"),
            };
            count += 1;
        }
        assert_eq!(off, len, "entries end exactly at the table length");
        assert_eq!(usize::from(hdr.oemcount), count, "entry count");

        assert_eq!(cpus.len(), usize::from(n));
        for (i, &(apic_id, flags)) in cpus.iter().enumerate() {
            assert_eq!(usize::from(apic_id), i);
            assert_eq!(flags & CPU_ENABLED, CPU_ENABLED);
            assert_eq!(
                flags & CPU_BOOTPROCESSOR != 0,
                i == 0,
                "BSP flag of CPU {i}"
            );
        }
        assert_eq!((buses, ioapics), (1, 1));
        let identity: Vec<(u8, u8)> = (0..16).map(|i| (i, i)).collect();
        assert_eq!(irqs, identity);
        assert_eq!(lints, vec![(MP_EXTINT, 0), (MP_NMI, 1)]);
    }

    #[test]
    fn one_cpu() {
        let mem = guest_mem(1 << 20);
        setup_mptable(&mem, 1).unwrap();
        check_table(&mem, 1);
    }

    #[test]
    fn four_cpus() {
        let mem = guest_mem(1 << 20);
        setup_mptable(&mem, 4).unwrap();
        check_table(&mem, 4);
    }

    #[test]
    fn sixty_four_cpus_fit_below_low_mem_end() {
        let mem = guest_mem(1 << 20);
        setup_mptable(&mem, 64).unwrap();
        check_table(&mem, 64);
    }

    #[test]
    fn rewriting_with_fewer_cpus_leaves_no_stale_entries() {
        let mem = guest_mem(1 << 20);
        setup_mptable(&mem, 64).unwrap();
        setup_mptable(&mem, 2).unwrap();
        check_table(&mem, 2);
    }

    #[test]
    fn memory_just_covering_the_mp_area_is_enough() {
        let mem = guest_mem(LOW_MEM_END);
        setup_mptable(&mem, MAX_CPUS).unwrap();
        check_table(&mem, MAX_CPUS);
    }

    #[test]
    fn too_many_cpus() {
        let mem = guest_mem(1 << 20);
        assert!(matches!(
            setup_mptable(&mem, 65),
            Err(MpTableError::TooManyCpus(65))
        ));
        assert!(matches!(
            setup_mptable(&mem, 255),
            Err(MpTableError::TooManyCpus(255))
        ));
    }

    #[test]
    fn zero_cpus() {
        let mem = guest_mem(1 << 20);
        assert!(matches!(setup_mptable(&mem, 0), Err(MpTableError::NoCpus)));
    }

    #[test]
    fn not_enough_memory() {
        let mem = guest_mem(LOW_MEM_END - 1);
        let err = setup_mptable(&mem, 1).unwrap_err();
        assert!(matches!(err, MpTableError::NotEnoughMemory { .. }), "{err}");
    }

    #[test]
    fn struct_sizes_match_the_spec() {
        assert_eq!(size_of::<MpfIntel>(), 16);
        assert_eq!(size_of::<MpcTable>(), 44);
        assert_eq!(size_of::<MpcCpu>(), 20);
        assert_eq!(size_of::<MpcBus>(), 8);
        assert_eq!(size_of::<MpcIoapic>(), 8);
        assert_eq!(size_of::<MpcIntsrc>(), 8);
    }
}
