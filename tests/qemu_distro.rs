//! `vmtrace attach` on a distribution kernel vmtrace's tests did not build:
//! Debian's 6.12 cloud kernel (guest/build.sh debian-6.12), given as its
//! vmlinuz alone (symbols from its kallsyms), booted in QEMU/TCG with the
//! workload initramfs. It has KASLR, IBT, return thunks, ITS and call-depth
//! tracking, and so rewrites its own text at boot in nearly every function:
//! the check that the file is the running kernel's must allow for that
//! (it refused this kernel). Exact counts, memory as found, in both modes.
//! And the same kernel with 5-level paging (QEMU's CPU with LA57): trap
//! and exitless modes, rings in the ring device or in the low pages, a
//! module's functions, repairs, all as found (issue 40).

mod common;

use std::path::Path;
use std::time::Duration;

use common::attach::*;
use common::guard::*;
use common::qemu::*;
use common::s;
use tracer::kernel::symbols::KernelImage;
use tracer::qemu::journal;
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

/// Debian's 6.12 (built with CONFIG_X86_5LEVEL) booted on QEMU's `max`
/// CPU with LA57, its kernel command line ending in `append`, the test
/// module loaded, with `cpus` vCPUs, and what vmtrace may change, as
/// found.
struct La57 {
    bz: std::path::PathBuf,
    kernel: Kernel,
    image: KernelImage,
    guest: QemuGuest,
    worker: u32,
    before: Memory,
    entries: Vec<u64>,
    modules: Vec<(String, Vec<u8>)>,
    pci: String,
}

impl La57 {
    /// Booted with 5-level paging: CR4.LA57 on every vCPU (its top page
    /// table a PML5, its direct map and vmalloc area elsewhere).
    fn boot(append: &str, cpus: u32) -> La57 {
        let bz = debian_612();
        let kernel = Kernel::from_bzimage(&bz);
        let guest = QemuGuest::boot(QemuOpts {
            kernel: bz.clone(),
            initrd: Some(vmt_test_initramfs()),
            qemu_args: vec!["-cpu".into(), "max,+la57".into()],
            append: append.into(),
            cpus,
        });
        let w = guest.wait_ready().unwrap();
        let qmp = guest.qmp_socket();
        let file = vmm::boot::KernelFile::open(&bz).unwrap();
        let image = tracer::kernel::find::kernel_image(&file, tracer::kernel::find::Given::Nothing)
            .unwrap()
            .image;
        let cr4 = cr4s(qmp);
        assert_eq!(cr4.len(), cpus as usize, "{cr4:x?}");
        assert!(cr4.iter().all(|c| c & CR4_LA57 != 0), "{cr4:x?}");
        guest.send_line("insmod /vmt_test.ko");
        let got = guest.wait_for("workload: insmod", COMMAND_TIMEOUT).unwrap();
        assert!(got.contains("workload: insmod 0"), "{got}");
        let modules = module_texts(qmp, &image);
        assert!(modules.iter().any(|(n, _)| n == "vmt_test"), "{modules:?}");
        let (before, _) = kernel.read(qmp);
        let entries = top_entries(qmp, &image, &kernel);
        assert_eq!(
            entries, [0; 4],
            "entries vmtrace uses, as the kernel keeps them"
        );
        La57 {
            pci: info_pci(qmp),
            bz,
            kernel,
            image,
            worker: w.worker,
            guest,
            before,
            entries,
            modules,
        }
    }

    fn qmp(&self) -> &Path {
        self.guest.qmp_socket()
    }

    /// The low MiB, the kernel's text, the page-table entries vmtrace
    /// writes, the modules' text and the PCI devices as found; no stub.
    fn found(&self, when: &str) {
        let qmp = self.qmp();
        let (after, _) = self.kernel.read(qmp);
        assert_same(&self.before, &after, when);
        let entries = top_entries(qmp, &self.image, &self.kernel);
        assert_eq!(entries, self.entries, "{when}: page tables");
        assert_eq!(module_texts(qmp, &self.image), self.modules, "{when}");
        assert_eq!(info_pci(qmp), self.pci, "{when}");
        assert_no_gdbstub(qmp);
    }

    /// `vmtrace attach` of `trace` in `mode` (`more` arguments too),
    /// attached: its attach line.
    fn attach(&self, mode: &str, trace: &str, more: &[&str]) -> (Attach, String) {
        let args = ["--kernel", s(&self.bz), "--format", "json"];
        let args = [&args[..], &["--trace", trace, "--mode", mode], more].concat();
        let mut a = Attach::start(self.qmp(), &args);
        let line = a.wait_line("vmtrace: attached to QEMU");
        assert!(line.contains(mode), "{line}");
        (a, line)
    }

    /// An attach in `mode` whose line says `where_`: getpid and the
    /// module's `vmt_hit` counted exactly, nothing dropped, all as found.
    /// Only the worker's calls are kept (`--comm`): each call's task is
    /// read through the PML5 (its `task_struct` in the moved direct map).
    fn traced_exactly(&self, mode: &str, where_: &str) {
        let comm = ["--comm", WORKER_COMM];
        let (a, line) = self.attach(mode, "__x64_sys_getpid,vmt_hit", &comm);
        assert!(line.contains(where_), "{line}");
        self.guest.go("getpid", LA57_CALLS).unwrap();
        self.guest.send_line(&format!("vmt {LA57_HITS}"));
        let got = self.guest.wait_for("workload: vmt", COMMAND_TIMEOUT);
        assert!(got.unwrap().contains(&format!("vmt {LA57_HITS} pid=")));
        a.signal(libc::SIGINT);
        let e = a.end();
        assert!(e.status.success(), "{mode}: {}: {}", e.status, e.stderr);
        assert!(e.stderr.contains("1 loaded module"), "{}", e.stderr);
        let counts = e.counts();
        assert_eq!(count_of(&counts, &GETPID), LA57_CALLS, "{mode}: {counts:?}");
        let hits = counts.get("vmt_hit [vmt_test]");
        assert_eq!(hits, Some(&LA57_HITS), "{mode}: {counts:?}");
        assert_eq!(e.json()["dropped"], 0, "{}", e.stdout);
        self.found(&format!("after a {mode} trace with 5-level paging"));
    }

    /// An exitless attach of `trace` killed with its guardian: its code's
    /// page-directory entry left present in the kernel's table.
    fn killed(&self, trace: &str) -> Vec<u64> {
        let (a, _) = self.attach("exitless", trace, &[]);
        kill_with_guardian(a);
        let left = top_entries(self.qmp(), &self.image, &self.kernel);
        assert_eq!(left[1] & 1, 1, "{left:x?}");
        left
    }

    /// Still 5-level, running, and answering.
    fn runs_on(&self) {
        assert!(cr4s(self.qmp()).iter().all(|c| c & CR4_LA57 != 0));
        assert_runs_on(&self.guest, self.worker);
    }
}

/// 5-level paging (issue 40), on a guest that takes the ring device: with
/// the test module loaded (read through the PML5 before the attach, and
/// followed by trap mode's module hooks), a trap-mode and an exitless
/// attach (rings in the device, mapped through entry 508 of the kernel's
/// page-upper directory under its P4D) count exactly and leave all as
/// found; an exitless attach killed with its guardian is repaired by
/// `vmtrace detach` (entries, device, bytes).
#[test]
fn a_five_level_paging_guest_is_traced_exactly_and_repaired() {
    let g = La57::boot("", 2);
    g.traced_exactly("trap", "trap mode");
    g.traced_exactly("exitless", "hot-plugged ivshmem device");
    let left = g.killed("__x64_sys_getpid,vmt_hit");
    assert_eq!(left[0] & 1, 1, "the rings' entry 508: {left:x?}");
    detach_removes_ring_device(g.qmp());
    g.found("after a killed attach and vmtrace detach, with 5-level paging");
    g.runs_on();
}

/// 5-level paging on a guest without ACPI (no ring device): vmtrace's
/// code and rings in its free low pages, mapped through the fixmap's page
/// directory under the P4D; counted exactly; a killed attach repaired by
/// `vmtrace detach` without its journal (the guest's marker: sites and
/// entries, exit 1), then with it (the pages' bytes).
#[test]
fn a_five_level_paging_guest_keeps_its_rings_in_low_memory() {
    // Without ACPI, Debian's kernel starts no second CPU here: one vCPU.
    let g = La57::boot("acpi=off", 1);
    g.traced_exactly("exitless", "unused low pages");
    // The marker names the image's sites only: getpid alone.
    let left = g.killed("__x64_sys_getpid");
    assert_eq!(left[0], 0, "no entry 508 without the device: {left:x?}");
    let pid = Qmp::connect(g.qmp(), Duration::from_secs(10))
        .unwrap()
        .pid()
        .unwrap();
    let path = journal::path_for(pid, journal::start_time(pid).unwrap());
    let aside = path.with_extension("aside");
    std::fs::rename(&path, &aside).unwrap();
    let o = detach(g.qmp());
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "{err}");
    for n in ["1 sites restored", "3 page-directory entries cleared"] {
        assert!(err.contains(n), "{n:?} in {err}");
    }
    let entries = top_entries(g.qmp(), &g.image, &g.kernel);
    assert_eq!(entries, g.entries, "without the journal");
    std::fs::rename(&aside, &path).unwrap();
    let o = detach(g.qmp());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    g.found("after a killed attach and vmtrace detach, with 5-level paging");
    g.runs_on();
}
