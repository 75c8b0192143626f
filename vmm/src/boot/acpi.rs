//! Minimal ACPI tables, built with rust-vmm's `acpi_tables`: how a guest
//! kernel that does not parse MP tables (a distribution kernel, or any kernel
//! with `CONFIG_X86_MPPARSE=n`) finds its CPUs, its IO-APIC and the way to
//! power off. The MP table (`mptable`) is written as well; a kernel with both
//! prefers ACPI.
//!
//! - RSDP (revision 2) at [`ACPI_START`], in the BIOS area Linux scans, and
//!   in the zero page's `acpi_rsdp_addr` (see `boot::linux`);
//! - XSDT: the FADT and the MADT;
//! - FADT: legacy (not hardware-reduced) ACPI with the PM1a event and
//!   control blocks of `acpi_pm`, SCI on IRQ 9, no SMI command port (the
//!   machine is always in ACPI mode), no PM timer, no GPE block; it points at
//!   the FACS and the DSDT;
//! - FACS: required by the spec for legacy ACPI (the firmware waking vector
//!   and global lock live there; vmtrace uses neither);
//! - DSDT: only `\_S5`, the sleep type `acpi_pm` turns into power-off;
//! - MADT: one enabled local APIC per vCPU (APIC id = ACPI UID = vCPU index,
//!   as in the MP table), the IO-APIC (id = vCPU count, GSI base 0), LINT1
//!   as NMI on every CPU, and one interrupt source override, for the SCI.
//!
//! ISA IRQs other than the SCI get no override: IRQ n is GSI n, which is
//! what KVM's default routing does (see `mptable::isa_irq_entry` for why
//! IRQ 0 is not moved to pin 2).

use acpi_tables::aml;
use acpi_tables::facs::FACS;
use acpi_tables::fadt::{FADTBuilder, Flags};
use acpi_tables::madt::{
    EnabledStatus, IoApic, LocalInterruptController, ProcessorLocalApic, MADT,
};
use acpi_tables::rsdp::Rsdp;
use acpi_tables::sdt::Sdt;
use acpi_tables::xsdt::XSDT;
use acpi_tables::{Aml, AmlSink};
use vm_memory::{Bytes, GuestAddress, GuestMemoryError, GuestMemoryMmap};
use zerocopy::little_endian::{U16, U32};
use zerocopy::{Immutable, IntoBytes};

use crate::acpi_pm::S5_SLP_TYP;
use crate::layout::{
    ACPI_SIZE, ACPI_START, APIC_BASE, IOAPIC_BASE, MAX_CPUS, PM1A_CNT_LEN, PM1A_CNT_PORT,
    PM1A_EVT_LEN, PM1A_EVT_PORT, SCI_IRQ,
};

/// Errors from [`setup_acpi`].
#[derive(Debug, thiserror::Error)]
pub enum AcpiError {
    #[error("ACPI tables: {0} CPUs requested, at most {MAX_CPUS} are supported")]
    TooManyCpus(u8),
    #[error("ACPI tables: at least one CPU is required")]
    NoCpus,
    #[error("ACPI tables: {len} bytes do not fit in the {ACPI_SIZE:#x} bytes at {ACPI_START:#x}")]
    TooLarge { len: u64 },
    #[error("ACPI tables: writing the {what} at {addr:#x}: {source}")]
    Write {
        what: &'static str,
        addr: u64,
        source: GuestMemoryError,
    },
}

/// OEM fields of every table. Linux prints them (`ACPI: XSDT 0x... (v01
/// VMTRCE VMTRACE  ...)`); `oem_table_id` must be the same in all tables.
const OEM_ID: [u8; 6] = *b"VMTRCE";
const OEM_TABLE_ID: [u8; 8] = *b"VMTRACE ";
const OEM_REVISION: u32 = 1;
/// DSDT revision 2: AML integers are 64 bits wide.
const DSDT_REVISION: u8 = 2;

/// The RSDP must be on a 16-byte boundary (Linux's scan steps by 16).
const RSDP_ALIGN: u64 = 16;
/// The FACS must be 64-byte aligned (ACPI 6.5 §5.2.10).
const FACS_ALIGN: u64 = 64;
/// Every other table: 8 bytes, for the XSDT's 64-bit entries.
const TABLE_ALIGN: u64 = 8;

/// FADT IAPC_BOOT_ARCH (ACPI 6.5 §5.2.9.3): LEGACY_DEVICES (the COM1 UART
/// and i8042 are ISA devices), 8042 (the reset line `reboot=k` uses), VGA
/// Not Present.
const IAPC_LEGACY_DEVICES: u16 = 1 << 0;
const IAPC_8042: u16 = 1 << 1;
const IAPC_VGA_NOT_PRESENT: u16 = 1 << 2;

/// MADT structure types and lengths (ACPI 6.5 §5.2.12) that `acpi_tables`
/// has no type for.
const MADT_INTERRUPT_SOURCE_OVERRIDE: u8 = 2;
const MADT_LOCAL_APIC_NMI: u8 = 4;
/// MPS INTI flags: active high (polarity 01), level-triggered (trigger 11).
/// The SCI is level-triggered by definition; without an override Linux
/// would program it active low, which KVM's IO-APIC would see inverted.
const INTI_ACTIVE_HIGH_LEVEL: u16 = 0x1 | (0x3 << 2);
/// MPS INTI flags "conforms to the bus" (ISA NMI: edge, high).
const INTI_CONFORMS: u16 = 0;
/// Local APIC NMI "processor UID 0xff": every processor.
const ALL_PROCESSORS: u8 = 0xff;
/// NMIs arrive on each local APIC's LINT1 (as in the MP table).
const NMI_LINT: u8 = 1;
/// The ISA bus, the source bus of every override.
const ISA_BUS: u8 = 0;

/// Interrupt Source Override (MADT type 2): ISA IRQ `source` is GSI `gsi`
/// with the polarity and trigger in `flags`.
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, IntoBytes, Immutable)]
struct InterruptSourceOverride {
    r#type: u8,
    length: u8,
    bus: u8,
    source: u8,
    gsi: U32,
    flags: U16,
}

impl Aml for InterruptSourceOverride {
    fn to_aml_bytes(&self, sink: &mut dyn AmlSink) {
        sink.vec(self.as_bytes());
    }
}

/// Local APIC NMI (MADT type 4): NMIs on pin LINT`lint` of processor `uid`.
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, IntoBytes, Immutable)]
struct LocalApicNmi {
    r#type: u8,
    length: u8,
    uid: u8,
    flags: U16,
    lint: u8,
}

impl Aml for LocalApicNmi {
    fn to_aml_bytes(&self, sink: &mut dyn AmlSink) {
        sink.vec(self.as_bytes());
    }
}

fn check_cpu_count(ncpus: u8) -> Result<(), AcpiError> {
    match ncpus {
        0 => Err(AcpiError::NoCpus),
        n if n > MAX_CPUS => Err(AcpiError::TooManyCpus(n)),
        _ => Ok(()),
    }
}

fn bytes(table: &dyn Aml) -> Vec<u8> {
    let mut v = Vec::new();
    table.to_aml_bytes(&mut v);
    v
}

/// The MADT for `ncpus` vCPUs.
fn madt(ncpus: u8) -> Vec<u8> {
    let mut madt = MADT::new(
        OEM_ID,
        OEM_TABLE_ID,
        OEM_REVISION,
        LocalInterruptController::Address(APIC_BASE as u32),
    );
    for id in 0..ncpus {
        madt.add_structure(ProcessorLocalApic::new(id, id, EnabledStatus::Enabled));
    }
    // The IO-APIC takes the id after the last CPU's, as in the MP table.
    madt.add_structure(IoApic::new(ncpus, IOAPIC_BASE as u32, 0));
    madt.add_structure(InterruptSourceOverride {
        r#type: MADT_INTERRUPT_SOURCE_OVERRIDE,
        length: size_of::<InterruptSourceOverride>() as u8,
        bus: ISA_BUS,
        source: SCI_IRQ,
        gsi: u32::from(SCI_IRQ).into(),
        flags: INTI_ACTIVE_HIGH_LEVEL.into(),
    });
    madt.add_structure(LocalApicNmi {
        r#type: MADT_LOCAL_APIC_NMI,
        length: size_of::<LocalApicNmi>() as u8,
        uid: ALL_PROCESSORS,
        flags: INTI_CONFORMS.into(),
        lint: NMI_LINT,
    });
    bytes(&madt)
}

/// The DSDT: `Name (_S5, Package () { S5_SLP_TYP, S5_SLP_TYP, 0, 0 })`
/// (SLP_TYPa, SLP_TYPb, two reserved bytes). Nothing else: no device needs
/// describing for Linux to find the UART and the i8042 at their ISA ports.
fn dsdt() -> Vec<u8> {
    let s5 = aml::Name::new(
        "_S5_".into(),
        &aml::Package::new(vec![&S5_SLP_TYP, &S5_SLP_TYP, &0u8, &0u8]),
    );
    let mut dsdt = Sdt::new(
        *b"DSDT",
        36,
        DSDT_REVISION,
        OEM_ID,
        OEM_TABLE_ID,
        OEM_REVISION,
    );
    dsdt.append_slice(&bytes(&s5));
    dsdt.as_slice().to_vec()
}

/// The FADT pointing at `dsdt` and `facs`.
fn fadt(dsdt: u64, facs: u64) -> Vec<u8> {
    let mut f = FADTBuilder::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION)
        .dsdt_64(dsdt)
        .firmware_ctrl_64(facs)
        // WBINVD works (ACPI requires it of legacy platforms); no fixed
        // power or sleep button (their events would need the SCI).
        .flag(Flags::Wbinvd)
        .flag(Flags::PwrButton)
        .flag(Flags::SlpButton);
    f.sci_int = u16::from(SCI_IRQ).into();
    f.pm1a_evt_blk = u32::from(PM1A_EVT_PORT).into();
    f.pm1a_cnt_blk = u32::from(PM1A_CNT_PORT).into();
    f.pm1_evt_len = PM1A_EVT_LEN;
    f.pm1_cnt_len = PM1A_CNT_LEN;
    f.iapc_boot_arch = (IAPC_LEGACY_DEVICES | IAPC_8042 | IAPC_VGA_NOT_PRESENT).into();
    bytes(&f.finalize())
}

/// One table (or the RSDP) as written into guest memory.
#[derive(Clone, Debug)]
pub struct Table {
    pub name: &'static str,
    pub addr: u64,
    pub bytes: Vec<u8>,
}

/// Every table and where it goes, for `ncpus` vCPUs; the RSDP first, at
/// [`ACPI_START`].
pub fn tables(ncpus: u8) -> Result<Vec<Table>, AcpiError> {
    check_cpu_count(ncpus)?;
    let align = |at: u64, to: u64| at.next_multiple_of(to);
    let rsdp_at = ACPI_START;
    debug_assert_eq!(rsdp_at % RSDP_ALIGN, 0);
    let xsdt_at = align(rsdp_at + Rsdp::len() as u64, TABLE_ALIGN);
    // Two entries: the FADT and the MADT.
    let xsdt_len = 36 + 2 * 8;
    let fadt_at = align(xsdt_at + xsdt_len, TABLE_ALIGN);
    let facs_at = align(fadt_at + acpi_tables::fadt::FADT::len() as u64, FACS_ALIGN);
    let dsdt_at = align(facs_at + FACS::len() as u64, TABLE_ALIGN);
    let dsdt = dsdt();
    let madt_at = align(dsdt_at + dsdt.len() as u64, TABLE_ALIGN);
    let madt = madt(ncpus);
    let end = madt_at + madt.len() as u64;
    if end > ACPI_START + ACPI_SIZE {
        return Err(AcpiError::TooLarge {
            len: end - ACPI_START,
        });
    }

    let mut xsdt = XSDT::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    xsdt.add_entry(fadt_at);
    xsdt.add_entry(madt_at);
    let xsdt = bytes(&xsdt);
    debug_assert_eq!(xsdt.len() as u64, xsdt_len);
    let table = |name, addr, bytes| Table { name, addr, bytes };
    Ok(vec![
        table("RSDP", rsdp_at, bytes(&Rsdp::new(OEM_ID, xsdt_at))),
        table("XSDT", xsdt_at, xsdt),
        table("FADT", fadt_at, fadt(dsdt_at, facs_at)),
        table("FACS", facs_at, bytes(&FACS::new())),
        table("DSDT", dsdt_at, dsdt),
        table("MADT", madt_at, madt),
    ])
}

/// Write the ACPI tables for `ncpus` vCPUs; returns the RSDP's address.
pub fn setup_acpi(mem: &GuestMemoryMmap, ncpus: u8) -> Result<u64, AcpiError> {
    let tables = tables(ncpus)?;
    for t in &tables {
        mem.write_slice(&t.bytes, GuestAddress(t.addr))
            .map_err(|source| AcpiError::Write {
                what: t.name,
                addr: t.addr,
                source,
            })?;
    }
    Ok(ACPI_START)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acpi_pm::{SLP_EN, SLP_TYP_SHIFT};

    fn sum(b: &[u8]) -> u8 {
        b.iter().fold(0u8, |s, x| s.wrapping_add(*x))
    }
    fn u16_at(b: &[u8], at: usize) -> u16 {
        u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
    }
    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
    }
    fn u64_at(b: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
    }

    /// Tables by signature, read back from guest memory the way Linux
    /// does: RSDP -> XSDT -> each entry, FADT -> DSDT and FACS.
    fn walk(mem: &GuestMemoryMmap, rsdp: u64) -> Vec<(String, u64, Vec<u8>)> {
        let read = |addr: u64, len: usize| {
            let mut b = vec![0u8; len];
            mem.read_slice(&mut b, GuestAddress(addr)).unwrap();
            b
        };
        let table = |addr: u64| {
            let len = u32_at(&read(addr, 8), 4) as usize;
            let b = read(addr, len);
            (String::from_utf8_lossy(&b[..4]).into_owned(), addr, b)
        };
        let r = read(rsdp, 36);
        assert_eq!(&r[..8], b"RSD PTR ");
        assert_eq!(sum(&r[..20]), 0, "RSDP v1 checksum");
        assert_eq!(sum(&r), 0, "RSDP extended checksum");
        assert_eq!(r[15], 2, "revision 2: XSDT");
        let xsdt = table(u64_at(&r, 24));
        let mut out = vec![xsdt.clone()];
        let x = &xsdt.2;
        for i in 0..(x.len() - 36) / 8 {
            let t = table(u64_at(x, 36 + 8 * i));
            if t.0 == "FACP" {
                out.push(table(u64_at(&t.2, 140))); // X_DSDT
                let facs = u64_at(&t.2, 132); // X_FIRMWARE_CTRL
                let f = read(facs, 64);
                out.push(("FACS".into(), facs, f));
            }
            out.push(t);
        }
        out
    }

    #[test]
    fn every_table_checksums_and_is_reachable_from_the_rsdp() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 2 << 20)]).unwrap();
        let rsdp = setup_acpi(&mem, 4).unwrap();
        assert_eq!(rsdp, ACPI_START);
        assert_eq!(rsdp % RSDP_ALIGN, 0);
        let found = walk(&mem, rsdp);
        let names: Vec<&str> = found.iter().map(|t| t.0.as_str()).collect();
        assert_eq!(names, ["XSDT", "DSDT", "FACS", "FACP", "APIC"]);
        for (name, addr, b) in &found {
            assert!(*addr >= ACPI_START && addr + b.len() as u64 <= ACPI_START + ACPI_SIZE);
            if name == "FACS" {
                // No checksum; 64-byte aligned, its length in its header.
                assert_eq!(addr % FACS_ALIGN, 0);
                assert_eq!(u32_at(b, 4), 64);
                continue;
            }
            assert_eq!(sum(b), 0, "{name} checksum");
            assert_eq!(&b[10..16], &OEM_ID, "{name}");
            assert_eq!(&b[16..24], &OEM_TABLE_ID, "{name}");
        }
    }

    #[test]
    fn fadt_offers_pm1a_and_the_sci() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 2 << 20)]).unwrap();
        let found = walk(&mem, setup_acpi(&mem, 1).unwrap());
        let f = &found.iter().find(|t| t.0 == "FACP").unwrap().2;
        assert_eq!(f.len(), 276, "ACPI 6 FADT");
        assert_eq!(u16_at(f, 46), u16::from(SCI_IRQ));
        assert_eq!(u32_at(f, 48), 0, "no SMI_CMD: always in ACPI mode");
        assert_eq!(u32_at(f, 56), u32::from(PM1A_EVT_PORT));
        assert_eq!(u32_at(f, 64), u32::from(PM1A_CNT_PORT));
        assert_eq!(u32_at(f, 76), 0, "no PM timer");
        assert_eq!((f[88], f[89]), (PM1A_EVT_LEN, PM1A_CNT_LEN));
        let flags = u32_at(f, 112);
        assert_eq!(
            flags & Flags::HwReducedAcpi as u32,
            0,
            "legacy ACPI: PM1 blocks used"
        );
        assert_ne!(flags & Flags::PwrButton as u32, 0);
    }

    /// The DSDT's AML is exactly `Name (_S5, Package (4) {5, 5, 0, 0})`,
    /// and that SLP_TYP with SLP_EN is what `acpi_pm` powers off on.
    #[test]
    fn dsdt_names_s5_with_the_sleep_type_acpi_pm_acts_on() {
        let d = dsdt();
        let aml = &d[36..];
        // NameOp "_S5_" PackageOp PkgLength NumElements BytePrefix 5 BytePrefix 5 Zero Zero
        assert_eq!(
            aml,
            [0x08, b'_', b'S', b'5', b'_', 0x12, 0x08, 0x04, 0x0a, 5, 0x0a, 5, 0x00, 0x00]
        );
        assert_eq!(aml[9], S5_SLP_TYP);
        let pm = crate::acpi_pm::Pm1::default();
        let v = (u16::from(aml[9]) << SLP_TYP_SHIFT) | SLP_EN;
        assert!(pm.write(PM1A_CNT_PORT, &v.to_le_bytes()).is_some());
    }

    /// One enabled local APIC per vCPU with APIC id = UID = index, then the
    /// IO-APIC after them, the SCI override and the LINT1 NMI.
    #[test]
    fn madt_has_one_local_apic_per_vcpu() {
        for n in [1u8, 2, 4, 17, MAX_CPUS] {
            let m = madt(n);
            assert_eq!(sum(&m), 0, "{n} CPUs: checksum");
            assert_eq!(u32_at(&m, 4) as usize, m.len());
            assert_eq!(u32_at(&m, 36), APIC_BASE as u32);
            let mut at = 44;
            let mut entries = Vec::new();
            while at < m.len() {
                let (t, len) = (m[at], usize::from(m[at + 1]));
                entries.push((t, m[at..at + len].to_vec()));
                at += len;
            }
            assert_eq!(at, m.len());
            let lapics: Vec<_> = entries.iter().filter(|e| e.0 == 0).collect();
            assert_eq!(lapics.len(), usize::from(n));
            for (i, (_, e)) in lapics.iter().enumerate() {
                assert_eq!(e.len(), 8);
                assert_eq!((e[2], e[3]), (i as u8, i as u8), "UID, APIC id");
                assert_eq!(u32_at(e, 4), 1, "enabled");
            }
            let ioapic = &entries.iter().find(|e| e.0 == 1).unwrap().1;
            assert_eq!(ioapic[2], n, "IO-APIC id after the CPUs'");
            assert_eq!(u32_at(ioapic, 4), IOAPIC_BASE as u32);
            assert_eq!(u32_at(ioapic, 8), 0, "GSI base");
            let iso = &entries.iter().find(|e| e.0 == 2).unwrap().1;
            assert_eq!(iso.len(), 10);
            assert_eq!((iso[2], iso[3]), (ISA_BUS, SCI_IRQ));
            assert_eq!(u32_at(iso, 4), u32::from(SCI_IRQ));
            assert_eq!(u16_at(iso, 8), INTI_ACTIVE_HIGH_LEVEL);
            let nmi = &entries.iter().find(|e| e.0 == 4).unwrap().1;
            assert_eq!(nmi.as_slice(), [4, 6, 0xff, 0, 0, 1]);
            assert_eq!(entries.len(), usize::from(n) + 3);
        }
    }

    #[test]
    fn cpu_counts_out_of_range_are_refused() {
        assert!(matches!(tables(0), Err(AcpiError::NoCpus)));
        assert!(matches!(
            tables(MAX_CPUS + 1),
            Err(AcpiError::TooManyCpus(n)) if n == MAX_CPUS + 1
        ));
        // The largest machine's tables fit, with room to spare.
        let t = tables(MAX_CPUS).unwrap();
        let last = t.last().unwrap();
        assert!(last.addr + last.bytes.len() as u64 <= ACPI_START + ACPI_SIZE);
    }
}
