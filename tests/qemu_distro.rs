//! `vmtrace attach` on a distribution kernel vmtrace's tests did not build:
//! Debian's 6.12 cloud kernel (guest/build.sh debian-6.12), given as its
//! vmlinuz alone (symbols from its kallsyms), booted in QEMU/TCG with the
//! workload initramfs. It has KASLR, IBT, return thunks, ITS and call-depth
//! tracking, and so rewrites its own text at boot in nearly every function:
//! the check that the file is the running kernel's must allow for that
//! (it refused this kernel). Exact counts, memory as found, in both modes.

mod common;

use common::attach::*;
use common::guard::*;
use common::qemu::*;
use common::s;
use std::path::Path;
use std::time::Duration;

use tracer::kernel::symbols::KernelImage;
use tracer::qemu::procmem::ProcRam;
use tracer::qemu::qmp::Qmp;
use tracer::qemu::queries::Queries;

/// getpid's function: `__x64_sys_getpid` and `__do_sys_getpid` share an
/// address, and the report names it by one of them.
const GETPID: [&str; 2] = ["__do_sys_getpid", "__x64_sys_getpid"];

#[test]
fn a_distribution_kernel_is_traced_exactly_and_left_as_found() {
    let bz = debian_612();
    let kernel = Kernel::from_bzimage(&bz);
    let guest = QemuGuest::boot(QemuOpts {
        kernel: bz.clone(),
        ..QemuOpts::linux()
    });
    let w = guest.wait_ready().unwrap();
    let qmp = guest.qmp_socket();
    let (before, _) = kernel.read(qmp);
    for (mode, calls) in [("exitless", 300), ("trap", 40)] {
        let args = [
            "--kernel",
            s(&bz),
            "--format",
            "json",
            "--trace",
            "__x64_sys_getpid",
            "--mode",
            mode,
        ];
        let mut a = Attach::start(qmp, &args);
        let line = a.wait_line("vmtrace: attached to QEMU");
        assert!(line.contains(mode), "{line}");
        guest.go("getpid", calls).unwrap();
        a.signal(libc::SIGINT);
        let e = a.end();
        assert!(e.status.success(), "{mode}: {}: {}", e.status, e.stderr);
        assert_eq!(
            count_of(&e.counts(), &GETPID),
            calls,
            "{mode}: {}",
            e.stdout
        );
        assert_eq!(e.json()["dropped"], 0, "{}", e.stdout);
        let (after, _) = kernel.read(qmp);
        assert_same(
            &before,
            &after,
            &format!("by a {mode} trace of Debian's kernel"),
        );
        assert_no_gdbstub(qmp);
        assert_runs_on(&guest, w.worker);
    }
}

/// CR4.LA57 (bit 12): 5-level paging.
const CR4_LA57: u64 = 1 << 12;
/// Calls of each attach below.
const LA57_CALLS: u64 = 300;
/// Calls of vmt_hit (the test module's) in each attach below.
const LA57_HITS: u64 = 50;

/// Every vCPU's CR4, from HMP's `info registers -a` (QEMU's own view: no
/// stop, no gdbstub).
fn cr4s(qmp: &Path) -> Vec<u64> {
    let text = Qmp::connect(qmp, Duration::from_secs(10))
        .unwrap()
        .hmp("info registers -a")
        .unwrap();
    text.split_whitespace()
        .filter_map(|w| w.strip_prefix("CR4="))
        .map(|v| u64::from_str_radix(v, 16).unwrap())
        .collect()
}

/// The kernel's page-upper directory of its top 512 GiB and its page
/// directory of the top 1 GiB (head_64.S): under its P4D with 5-level
/// paging as under its PML4 with 4. vmtrace maps its rings through the
/// first's entry 508 and its region through the second's 508-510.
const TOP_TABLES: [(&str, u64, usize); 2] =
    [("level3_kernel_pgt", 508, 1), ("level2_fixmap_pgt", 508, 3)];

/// The entries of `TOP_TABLES` vmtrace may write, read from RAM.
fn top_entries(qmp: &Path, image: &KernelImage, kernel: &Kernel) -> Vec<u64> {
    let w = kernel.watch(qmp);
    let mut out = Vec::new();
    for (name, first, n) in TOP_TABLES {
        let at = image.symbol(name).expect(name).addr - KERNEL_MAP + w.phys + first * 8;
        for i in 0..n as u64 {
            let mut b = [0u8; 8];
            w.ram.read(at + i * 8, &mut b).unwrap();
            out.push(u64::from_le_bytes(b));
        }
    }
    out
}

/// The guest's modules and each one's text, read as vmtrace reads them
/// (`tracer::qemu::modules`: through the kernel's own top page table, in
/// its paging mode).
fn module_texts(qmp: &Path, image: &KernelImage) -> Vec<(String, Vec<u8>)> {
    let mut q = Qmp::connect(qmp, Duration::from_secs(10)).unwrap();
    let ram = ProcRam::open(q.pid().unwrap(), &q.ram_layout().unwrap()).unwrap();
    let m = tracer::qemu::modules::read(&ram, image).unwrap().unwrap();
    m.list.into_iter().map(|(m, t)| (m.name, t)).collect()
}

/// 5-level paging (issue 40): Debian's 6.12 (built with CONFIG_X86_5LEVEL)
/// on QEMU's `max` CPU with LA57 boots with CR4.LA57 on every vCPU: its
/// top page table is a PML5, its direct map and vmalloc area elsewhere.
/// With the test module loaded (read through that PML5 before the attach,
/// and followed by trap mode's module hooks), a trap-mode and an exitless
/// attach (rings in the hot-plugged device, mapped through entry 508 of
/// the kernel's page-upper directory under its P4D) count getpid and the
/// module's `vmt_hit` exactly, and leave the kernel's low MiB, its text
/// and the module's text as found; an exitless attach killed with its
/// guardian is repaired by `vmtrace detach` (entries, device, bytes).
#[test]
fn a_five_level_paging_guest_is_traced_exactly_and_repaired() {
    let bz = debian_612();
    let kernel = Kernel::from_bzimage(&bz);
    let guest = QemuGuest::boot(QemuOpts {
        kernel: bz.clone(),
        initrd: Some(vmt_test_initramfs()),
        qemu_args: vec!["-cpu".into(), "max,+la57".into()],
        ..QemuOpts::linux()
    });
    let w = guest.wait_ready().unwrap();
    let qmp = guest.qmp_socket();
    let file = vmm::boot::KernelFile::open(&bz).unwrap();
    let image = tracer::kernel::find::kernel_image(&file, tracer::kernel::find::Given::Nothing)
        .unwrap()
        .image;
    let cr4 = cr4s(qmp);
    assert_eq!(cr4.len(), 2, "{cr4:x?}");
    assert!(cr4.iter().all(|c| c & CR4_LA57 != 0), "{cr4:x?}");
    guest.send_line("insmod /vmt_test.ko");
    let got = guest.wait_for("workload: insmod", COMMAND_TIMEOUT).unwrap();
    assert!(got.contains("workload: insmod 0"), "{got}");
    let modules = module_texts(qmp, &image);
    assert!(modules.iter().any(|(n, _)| n == "vmt_test"), "{modules:?}");
    let (before, _) = kernel.read(qmp);
    let pci = info_pci(qmp);
    let entries = top_entries(qmp, &image, &kernel);
    assert_eq!(
        entries, [0; 4],
        "entries vmtrace may use, as the kernel keeps them"
    );
    let found = |when: &str| {
        let (after, _) = kernel.read(qmp);
        assert_same(&before, &after, when);
        assert_eq!(
            top_entries(qmp, &image, &kernel),
            entries,
            "{when}: page tables"
        );
        assert_eq!(module_texts(qmp, &image), modules, "{when}: modules");
        assert_eq!(info_pci(qmp), pci, "{when}");
        assert_no_gdbstub(qmp);
    };
    let args = |mode| {
        [
            "--kernel",
            s(&bz),
            "--format",
            "json",
            "--trace",
            "__x64_sys_getpid,vmt_hit",
            "--mode",
            mode,
        ]
    };
    for mode in ["trap", "exitless"] {
        let mut a = Attach::start(qmp, &args(mode));
        let line = a.wait_line("vmtrace: attached to QEMU");
        assert!(line.contains(mode), "{line}");
        if mode == "exitless" {
            assert!(line.contains("hot-plugged ivshmem device"), "{line}");
        }
        guest.go("getpid", LA57_CALLS).unwrap();
        guest.send_line(&format!("vmt {LA57_HITS}"));
        guest.wait_for("workload: vmt", COMMAND_TIMEOUT).unwrap();
        a.signal(libc::SIGINT);
        let e = a.end();
        assert!(e.status.success(), "{mode}: {}: {}", e.status, e.stderr);
        assert!(e.stderr.contains("1 loaded module"), "{}", e.stderr);
        let counts = e.counts();
        assert_eq!(count_of(&counts, &GETPID), LA57_CALLS, "{mode}: {counts:?}");
        assert_eq!(
            counts.get("vmt_hit [vmt_test]"),
            Some(&LA57_HITS),
            "{mode}: {counts:?}"
        );
        assert_eq!(e.json()["dropped"], 0, "{}", e.stdout);
        found(&format!("after a {mode} trace with 5-level paging"));
    }
    // Killed with its guardian: the journal's repair.
    let mut a = Attach::start(qmp, &args("exitless"));
    a.wait_line("vmtrace: attached to QEMU");
    kill_with_guardian(a);
    // Left mapped where the kernel's own walk finds them: the rings' entry
    // 508 and the code's page directory entry (both tables, present).
    let left = top_entries(qmp, &image, &kernel);
    assert!(left[0] & 1 == 1 && left[1] & 1 == 1, "{left:x?}");
    detach_removes_ring_device(qmp);
    found("after a killed attach and vmtrace detach, with 5-level paging");
    assert!(cr4s(qmp).iter().all(|c| c & CR4_LA57 != 0));
    assert_runs_on(&guest, w.worker);
}
