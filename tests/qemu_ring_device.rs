//! Rings in memory of vmtrace's own on a guest with ACPI PCI hot-plug
//! (issue 40): Debian's 6.12 cloud kernel in QEMU's `pc` machine gets an
//! `ivshmem-plain` device for the attach, its BAR mapped as the rings, and
//! loses it at the detach. One boot for every check: `--trace '*'`
//! exitless with exact counts, `--graph` keeping every return of a burst,
//! and a killed attach whose device and file `vmtrace detach` removes
//! (its rings mapped with 2 MiB entries, which the repair clears), first
//! without its journal (the device found through QEMU), then with it.
//! The device is sized by `--buffer` (64 MiB by default), its rings past
//! the data window, mapped through the kernel's empty page-upper-directory
//! entry 508 onto a page directory in the device; a 40,000-call graph
//! burst on `--buffer 32M` (80,000 records on one CPU, five times the old
//! 4 MiB device's 16,384 per ring) is stored whole.
//! After each: the low MiB and the text as found, `info pci` as before,
//! no ring file left on the host, entry 508 empty again.

mod common;

use std::path::Path;
use std::time::Duration;

use common::attach::*;
use common::guard::*;
use common::qemu::*;
use common::s;
use tracer::qemu::journal;
use tracer::qemu::qmp::Qmp;
use tracer::qemu::queries::Queries;

/// Calls of the graph burst: twice as many records on one CPU.
const BURST: u64 = 40_000;
/// getpid's function, by either of the names sharing its address.
const GETPID: [&str; 2] = ["__do_sys_getpid", "__x64_sys_getpid"];
/// How the attach names its device, and how the attached line says so.
const DEVICE: &str = "vmtrace-ivshmem-";
const SAID: &str = "its rings in a hot-plugged ivshmem device";

/// Attached exitless, the rings in a device of `mib` MiB: QEMU lists it
/// meanwhile.
fn attached(qmp: &Path, bz: &Path, args: &[&str], mib: u64) -> Attach {
    attached_said(qmp, bz, args, mib).0
}

/// `attached`, with its attach line.
fn attached_said(qmp: &Path, bz: &Path, args: &[&str], mib: u64) -> (Attach, String) {
    let base = ["--kernel", s(bz), "--format", "json", "--mode", "exitless"];
    let mut a = Attach::start(qmp, &[&base[..], args].concat());
    let line = a.wait_line("vmtrace: attached to QEMU");
    assert!(line.contains(SAID), "{line}");
    assert!(line.contains(&format!("({mib} MiB at 0x")), "{line}");
    assert!(info_pci(qmp).contains(DEVICE), "{}", info_pci(qmp));
    (a, line)
}

/// The kernel's page-upper directory of its top 512 GiB (head_64.S),
/// whose empty entry 508 maps rings past the data window.
const TOP_PUD: &str = "level3_kernel_pgt";

/// Entry 508 of `TOP_PUD` at link address `pud`, read through `w`'s RAM.
fn high_entry(w: &Watch, pud: u64) -> u64 {
    let mut b = [0u8; 8];
    w.ram
        .read(pud - KERNEL_MAP + w.phys + 508 * 8, &mut b)
        .unwrap();
    u64::from_le_bytes(b)
}

/// The kernel's page directory of its top 1 GiB (head_64.S), whose
/// entries 508-510 vmtrace maps its region with.
const TOP_PD: &str = "level2_fixmap_pgt";

/// Entries 508-510 of the kernel's `TOP_PD` at link address `pd`, read
/// through `w`'s RAM (no stop: vmtrace may hold the gdbstub).
fn region_entries(w: &Watch, pd: u64) -> [u64; 3] {
    let mut b = [0u8; 24];
    w.ram
        .read(pd - KERNEL_MAP + w.phys + 508 * 8, &mut b)
        .unwrap();
    [0, 1, 2].map(|i| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap()))
}

/// A guest as found: its bytes, its PCI devices, the host's files.
struct Found<'a> {
    kernel: Kernel,
    qmp: &'a Path,
    pid: u32,
    memory: Memory,
    pci: String,
}

impl Found<'_> {
    fn assert_as_found(&self, when: &str) {
        let (after, _) = self.kernel.read(self.qmp);
        assert_same(&self.memory, &after, when);
        assert_eq!(info_pci(self.qmp), self.pci, "{when}");
        assert_eq!(ring_files(self.pid), Vec::<String>::new(), "{when}");
        assert_no_gdbstub(self.qmp);
    }
}

#[test]
fn an_acpi_guest_gets_ring_memory_of_its_own_for_the_attach_only() {
    let bz = debian_612();
    let guest = QemuGuest::boot(QemuOpts {
        kernel: bz.clone(),
        ..QemuOpts::linux()
    });
    let w = guest.wait_ready().unwrap();
    let qmp = guest.qmp_socket();
    let kernel = Kernel::from_bzimage(&bz);
    let (memory, _) = kernel.read(qmp);
    let file = vmm::boot::KernelFile::open(&bz).unwrap();
    let image = tracer::kernel::find::kernel_image(&file, tracer::kernel::find::Given::Nothing)
        .unwrap()
        .image;
    let pd = image.symbol(TOP_PD).expect(TOP_PD).addr;
    let watch = kernel.watch(qmp);
    let entries = region_entries(&watch, pd);
    let pud = image.symbol(TOP_PUD).expect(TOP_PUD).addr;
    assert_eq!(
        high_entry(&watch, pud),
        0,
        "entry 508 as the kernel keeps it"
    );
    let pid = Qmp::connect(qmp, Duration::from_secs(10))
        .unwrap()
        .pid()
        .unwrap();
    let found = Found {
        kernel,
        qmp,
        pid,
        memory,
        pci: info_pci(qmp),
    };

    // Every function, exitless: refused before for room (`RingsTooBig`).
    let a = attached(qmp, &bz, &["--trace", "*"], 64);
    guest.go("getpid", 500).unwrap();
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    let j = e.json();
    assert!(
        j["sites_patched"].as_u64().unwrap() > 30_000,
        "{}",
        e.stderr
    );
    // Counted exactly (stored, or counted only when a ring was full).
    assert_eq!(count_of(&e.counts(), &GETPID), 500, "{}", e.stderr);
    found.assert_as_found("after an exitless trace of every function");

    // The function graph on a burst of 40,000 calls, 80,000 records on
    // one CPU: every return kept (the low pages' graph rings held 256
    // records, the 4 MiB device's 16,384), in a device `--buffer` sized.
    let args = ["--trace", "__x64_sys_getpid", "--graph", "--buffer", "32M"];
    let a = attached(qmp, &bz, &args, 32);
    guest.go("getpid", BURST).unwrap();
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    let j = e.json();
    assert_eq!(j["dropped"], 0, "{j}");
    assert_eq!(j["events_stored"], BURST, "{j}");
    assert_eq!(j["graph"]["returns_stored"], BURST, "{j}");
    assert_eq!(j["graph"]["returns_dropped"], 0, "{j}");
    assert_eq!(high_entry(&watch, pud), 0, "entry 508 after the detach");
    found.assert_as_found("after an exitless graph trace");

    // Killed with its guardian: the journal names the device, the repair
    // takes it and its file out.
    let a = attached(qmp, &bz, &["--trace", "__x64_sys_getpid"], 64);
    kill_with_guardian(a);
    assert_eq!(ring_files(pid).len(), 1);
    // The data window's frame-pool entry: a 2 MiB page onto the device,
    // present, writable, not executable (bits 0, 1, 7, 63); its rings-only
    // entry 509 unused, the rings past the window.
    let mapped = region_entries(&watch, pd);
    assert_eq!(mapped[1], 0, "{mapped:x?}");
    let leaf = 1 | 2 | 0x80 | 1 << 63;
    assert_eq!(mapped[2] & leaf, leaf, "{mapped:x?}");
    // Entry 508: a table (present, writable, no page size) in the 64 MiB
    // device, whose data window starts 2 MiB in: the frame-pool entry maps
    // the device's 4-6 MiB.
    let device = (mapped[2] & !0xfff & !(1 << 63)) - (4 << 20);
    let high = high_entry(&watch, pud);
    assert_eq!(high & (1 | 2 | 0x80), 1 | 2, "{high:#x}");
    let at = high & !0xfff & !(1 << 63);
    assert!(
        (device..device + (64 << 20)).contains(&at),
        "{high:#x} {device:#x}"
    );
    // Its journal lost: the repair goes by vmtrace's marker in the guest
    // and finds the device through QEMU (`query-pci`, its id), clears the
    // entries onto it and removes it; the low pages' bytes are in the
    // journal only (exit 1, said).
    let start = journal::start_time(pid).unwrap();
    let path = journal::path_for(pid, start);
    let aside = path.with_extension("aside");
    std::fs::rename(&path, &aside).unwrap();
    let o = detach(qmp);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "{err}");
    for n in [
        "1 sites restored",
        "3 page-directory entries cleared",
        "removed vmtrace's ring device",
    ] {
        assert!(err.contains(n), "{n:?} in {err}");
    }
    assert_eq!(region_entries(&watch, pd), entries, "without the journal");
    assert_eq!(high_entry(&watch, pud), 0, "entry 508 without the journal");
    assert_eq!(info_pci(qmp), found.pci, "without the journal");
    assert_eq!(ring_files(pid), Vec::<String>::new(), "without the journal");
    // With the journal back, the pages get their bytes back too.
    std::fs::rename(&aside, &path).unwrap();
    detach_removes_ring_device(qmp);
    found.assert_as_found("after a killed attach and vmtrace detach");
    assert_eq!(
        region_entries(&watch, pd),
        entries,
        "the kernel's page directory"
    );
    assert_eq!(high_entry(&watch, pud), 0, "the kernel's entry 508");
    assert_runs_on(&guest, w.worker);
}

/// OVMF's firmware (Debian's `ovmf` package), to boot a guest by UEFI.
const OVMF_CODE: &str = "/usr/share/OVMF/OVMF_CODE_4M.fd";
const OVMF_VARS: &str = "/usr/share/OVMF/OVMF_VARS_4M.fd";
/// Physical address bits of a page-table entry (bits 12-51).
const ADDR: u64 = 0x000f_ffff_ffff_f000;

/// Entry 508 of the UEFI runtime services' own page-upper directory of
/// the top 512 GiB: `efi_mm.pgd` (a direct-map address, less
/// `page_offset_base`), its entry 511 (QEMU's default TCG CPU has no LA57:
/// 4-level paging), that directory's entry 508.
fn efi_high_entry(w: &Watch, efi_mm_pgd: u64, page_offset_base: u64) -> u64 {
    efi_entry_508(w, efi_mm_pgd, page_offset_base, 4)
}

/// `efi_high_entry` with `levels` levels of paging: with 5, `efi_mm.pgd`
/// is a PML5 whose entry 511 leads to EFI's own P4D, whose entry 511
/// leads to that directory.
fn efi_entry_508(w: &Watch, efi_mm_pgd: u64, page_offset_base: u64, levels: u32) -> u64 {
    let word = |gpa: u64| {
        let mut b = [0u8; 8];
        w.ram.read(gpa, &mut b).unwrap();
        u64::from_le_bytes(b)
    };
    let kernel_data = |link: u64| link - KERNEL_MAP + w.phys;
    let pgd = word(kernel_data(efi_mm_pgd));
    assert_ne!(pgd, 0, "efi_mm.pgd: a guest booted by UEFI has one");
    let mut table = pgd - word(kernel_data(page_offset_base));
    for _ in 3..levels {
        table = word(table + 511 * 8) & ADDR;
    }
    word(table + 508 * 8)
}

/// A UEFI guest as found, and where its two tables' entry 508 are: the
/// kernel's `TOP_PUD` and `efi_mm`'s page directory (link addresses).
struct UefiTables<'a> {
    found: Found<'a>,
    watch: Watch,
    efi_pgd: u64,
    base: u64,
    pud: u64,
}

impl<'a> UefiTables<'a> {
    fn read(bz: &Path, qmp: &'a Path) -> Self {
        let kernel = Kernel::from_bzimage(bz);
        let (memory, _) = kernel.read(qmp);
        let file = vmm::boot::KernelFile::open(bz).unwrap();
        let given = tracer::kernel::find::Given::Nothing;
        let image = tracer::kernel::find::kernel_image(&file, given)
            .unwrap()
            .image;
        let btf = tracer::kernel::btf::KernelBtf::from_image(&image).unwrap();
        let sym = |n: &str| image.symbol(n).unwrap_or_else(|| panic!("{n}")).addr;
        let pgd = u64::from(btf.member("mm_struct", "pgd").unwrap().offset);
        let watch = kernel.watch(qmp);
        let pid = Qmp::connect(qmp, Duration::from_secs(10))
            .unwrap()
            .pid()
            .unwrap();
        UefiTables {
            found: Found {
                kernel,
                qmp,
                pid,
                memory,
                pci: info_pci(qmp),
            },
            watch,
            efi_pgd: sym("efi_mm") + pgd,
            base: sym("page_offset_base"),
            pud: sym(TOP_PUD),
        }
    }
}

/// A guest booted by UEFI (OVMF with Debian's `ovmf` vars), with
/// `qemu_args` more: its QEMU and its workload.
fn boot_uefi(bz: &Path, qemu_args: &[&str]) -> (QemuGuest, common::qemu::Workload) {
    // One vars file per guest: the tests of this file boot theirs side by
    // side, and a copy over a file another QEMU has open breaks its boot.
    static BOOTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = BOOTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("vmtrace-ovmf-vars-{}-{n}.fd", std::process::id());
    let vars = std::env::temp_dir().join(name);
    std::fs::copy(OVMF_VARS, &vars).expect("Debian's ovmf package (apt-get install ovmf)");
    let pflash = |file: &str, ro: &str| format!("if=pflash,format=raw,{ro}file={file}");
    let mut args = vec![
        "-drive".into(),
        pflash(OVMF_CODE, "readonly=on,"),
        "-drive".into(),
        pflash(vars.to_str().unwrap(), ""),
    ];
    args.extend(qemu_args.iter().map(|a| a.to_string()));
    let guest = QemuGuest::boot(QemuOpts {
        kernel: bz.to_owned(),
        qemu_args: args,
        ..QemuOpts::linux()
    });
    let w = guest.wait_ready().unwrap();
    let _ = std::fs::remove_file(&vars);
    (guest, w)
}

/// A guest booted by UEFI (OVMF, Debian 6.12 through its EFI stub) keeps
/// its runtime services' page tables (`efi_mm`), whose top page-upper
/// directory copied the kernel's entries 508-511 at boot: the attach
/// writes entry 508 there too (the line says so), a 40,000-call burst on
/// one CPU is stored whole (the old 4 MiB device held 16,384 records per
/// ring), and the detach, and `vmtrace detach` after a kill (without its
/// journal, then with it), clear it in both tables; the guest runs on as
/// found.
#[test]
fn a_uefi_guest_maps_the_rings_in_its_efi_page_tables_too() {
    let bz = debian_612();
    let (guest, w) = boot_uefi(&bz, &[]);
    let qmp = guest.qmp_socket();
    let UefiTables {
        found,
        watch,
        efi_pgd,
        base,
        pud,
    } = UefiTables::read(&bz, qmp);
    assert_eq!(efi_high_entry(&watch, efi_pgd, base), 0, "EFI's entry 508");
    assert_eq!(high_entry(&watch, pud), 0, "the kernel's entry 508");
    let pid = found.pid;

    let (a, line) = attached_said(qmp, &bz, &["--trace", "__x64_sys_getpid"], 64);
    let efi = "its rings also mapped in the UEFI runtime services' page tables";
    assert!(line.contains(efi), "{line}");
    let high = high_entry(&watch, pud);
    assert_ne!(high, 0);
    assert_eq!(efi_high_entry(&watch, efi_pgd, base), high, "both tables");
    guest.go("getpid", BURST).unwrap();
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    let j = e.json();
    assert_eq!(j["dropped"], 0, "{j}");
    assert_eq!(j["events_stored"], BURST, "{j}");
    assert_eq!(efi_high_entry(&watch, efi_pgd, base), 0, "EFI's, after");
    assert_eq!(high_entry(&watch, pud), 0, "the kernel's, after");
    found.assert_as_found("after an exitless trace of a UEFI guest");

    // Killed with its guardian, its journal lost: `vmtrace detach` goes by
    // the marker in the guest, which names EFI's tables too (the repair
    // has no kernel to find `efi_mm` with), and clears both entries (exit
    // 1: the low pages' bytes are in the journal only).
    let a = attached(qmp, &bz, &["--trace", "__x64_sys_getpid"], 64);
    kill_with_guardian(a);
    let left = efi_high_entry(&watch, efi_pgd, base);
    assert_ne!(left, 0, "left by the kill");
    assert_eq!(high_entry(&watch, pud), left, "both tables, after the kill");
    let start = journal::start_time(pid).unwrap();
    let path = journal::path_for(pid, start);
    let aside = path.with_extension("aside");
    std::fs::rename(&path, &aside).unwrap();
    let o = detach(qmp);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "{err}");
    for n in [
        "1 sites restored",
        "4 page-directory entries cleared",
        "removed vmtrace's ring device",
    ] {
        assert!(err.contains(n), "{n:?} in {err}");
    }
    assert_eq!(
        efi_high_entry(&watch, efi_pgd, base),
        0,
        "EFI's, no journal"
    );
    assert_eq!(high_entry(&watch, pud), 0, "the kernel's, no journal");
    assert_runs_on(&guest, w.worker);
    // With the journal back, the pages get their bytes back too.
    std::fs::rename(&aside, &path).unwrap();
    detach_removes_ring_device(qmp);
    assert_eq!(efi_high_entry(&watch, efi_pgd, base), 0, "EFI's, repaired");
    assert_eq!(high_entry(&watch, pud), 0, "the kernel's, repaired");
    found.assert_as_found("after a killed attach on a UEFI guest and vmtrace detach");
    assert_runs_on(&guest, w.worker);
}

/// CR4.LA57 (bit 12): 5-level paging.
const CR4_LA57: u64 = 1 << 12;

/// 5-level paging (CR4.LA57, QEMU's `max` CPU) on a guest booted by UEFI:
/// `efi_mm`'s PML5 has a P4D of its own under entry 511
/// (`efi_alloc_page_tables`), whose entry 511 is EFI's own copy of the
/// page-upper directory. The attach writes entry 508 there too (the line
/// says so), through the two P4Ds; 300 getpid calls counted exactly; the
/// detach, and `vmtrace detach` after a kill, clear it in both tables.
#[test]
fn a_five_level_uefi_guest_maps_the_rings_in_its_efi_page_tables_too() {
    let bz = debian_612();
    let (guest, w) = boot_uefi(&bz, &["-cpu", "max,+la57"]);
    let qmp = guest.qmp_socket();
    let cr4s = Qmp::connect(qmp, Duration::from_secs(10))
        .unwrap()
        .hmp("info registers -a")
        .unwrap();
    let cr4s: Vec<u64> = cr4s
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("CR4="))
        .map(|v| u64::from_str_radix(v, 16).unwrap())
        .collect();
    assert_eq!(cr4s.len(), 2, "{cr4s:x?}");
    assert!(cr4s.iter().all(|c| c & CR4_LA57 != 0), "{cr4s:x?}");
    let UefiTables {
        found,
        watch,
        efi_pgd,
        base,
        pud,
    } = UefiTables::read(&bz, qmp);
    let efi = || efi_entry_508(&watch, efi_pgd, base, 5);
    assert_eq!(efi(), 0, "EFI's entry 508");
    assert_eq!(high_entry(&watch, pud), 0, "the kernel's entry 508");
    let (a, line) = attached_said(qmp, &bz, &["--trace", "__x64_sys_getpid"], 64);
    let said = "its rings also mapped in the UEFI runtime services' page tables";
    assert!(line.contains(said), "{line}");
    let high = high_entry(&watch, pud);
    assert_ne!(high, 0);
    assert_eq!(efi(), high, "both tables");
    guest.go("getpid", 300).unwrap();
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    assert_eq!(count_of(&e.counts(), &GETPID), 300, "{}", e.stderr);
    assert_eq!(e.json()["dropped"], 0, "{}", e.stdout);
    assert_eq!((efi(), high_entry(&watch, pud)), (0, 0), "after");
    found.assert_as_found("after an exitless trace of a 5-level UEFI guest");
    let a = attached(qmp, &bz, &["--trace", "__x64_sys_getpid"], 64);
    kill_with_guardian(a);
    let left = efi();
    assert_ne!(left, 0, "left by the kill");
    assert_eq!(high_entry(&watch, pud), left, "both tables, after the kill");
    detach_removes_ring_device(qmp);
    assert_eq!((efi(), high_entry(&watch, pud)), (0, 0), "repaired");
    found.assert_as_found("after a killed attach on a 5-level UEFI guest and vmtrace detach");
    assert_runs_on(&guest, w.worker);
}
