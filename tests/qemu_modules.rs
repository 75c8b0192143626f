//! Kernel modules in a running guest (issue 37): Debian's 6.12 cloud kernel
//! in QEMU/TCG, given as its vmlinuz alone (symbols from its kallsyms,
//! layouts from its BTF), with the workload initramfs carrying vmtrace's
//! test module (guest/linux/vmt_test, built against Debian's headers by
//! guest/build.sh vmt-test). The workload loads it with finit_module;
//! `tracer::kernel::modules` finds it in the guest's memory (name, text,
//! functions, ftrace sites, each site the NOP the kernel left there);
//! `vmtrace attach --trace 'vmt_*'` (and `'*:mod:vmt_test'`) traces its
//! functions, named `vmt_hit [vmt_test]`, exactly, in exitless and trap
//! modes, and leaves its text as found; unloaded during a trace, its sites
//! are left alone at the detach (its text is freed), and it is gone from
//! the list; in trap, exitless and exitless `--graph` modes, unloaded and
//! loaded again 20 times, it is followed (each cycle's calls counted);
//! first loaded during a trace (`vmt_*:mod:vmt_test` waiting for it) in
//! trap, exitless and exitless `--graph` modes, it is traced from its
//! load, through 20 more cycles, exactly (with `--entry direct` in trap
//! and exitless modes by its direct entries, vmt_exit's included); an
//! exitless attach killed after such a load is repaired by `vmtrace
//! detach`.
//! Debian's own binfmt_misc.ko, from the kernel's package, is traced the
//! same way (by name and by `:mod:`). With `--modules DIR`, the module
//! loaded without its BTF (/vmt_nobtf.ko) has its values shown by its
//! file's DWARF, loaded before the attach or during it, and a file of
//! another build is refused. One boot for all.

mod common;
#[path = "qemu_modules/events.rs"]
mod events;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::attach::*;
use common::console::assert_no_complaint;
use common::guard::*;
use common::qemu::*;
use common::s;
use tracer::kernel::btf::KernelBtf;
use tracer::kernel::find::{kernel_image, Given};
use tracer::kernel::module_build_id::{ko_build_id, loaded_build_id, NotesLayout};
use tracer::kernel::modules::{loaded, LoadedModule, ModuleLayout};
use tracer::qemu::journal;
use tracer::qemu::procmem::ProcRam;
use tracer::qemu::qmp::Qmp;
use tracer::qemu::queries::Queries;
use vm_memory::GuestAddress;
use vmm::gva::{AddressSpace, PagingMode};
use vmm::{GuestRam, RamError};

/// The 5-byte NOP the kernel leaves at an ftrace site it does not trace
/// (x86's `ftrace_nop_replace`, `x86_nops[5]`).
const NOP5: [u8; 5] = [0x0f, 0x1f, 0x44, 0x00, 0x00];
/// The kernel's top page table (arch/x86/kernel/head_64.S): kernel and
/// module mappings are the same in every task's.
const INIT_TOP_PGT: &str = "init_top_pgt";

/// Guest RAM read through QEMU's /proc/PID/mem while the guest runs:
/// enough for a page-table walk (`AddressSpace`); this test writes nothing.
struct ReadOnly(ProcRam);

impl GuestRam for ReadOnly {
    fn read_bytes(&self, buf: &mut [u8], addr: GuestAddress) -> Result<(), RamError> {
        self.0
            .read(addr.0, buf)
            .map_err(|e| RamError::new(addr.0, buf.len(), e))
    }
    fn write_bytes(&self, data: &[u8], addr: GuestAddress) -> Result<(), RamError> {
        Err(RamError::new(addr.0, data.len(), "read-only"))
    }
    fn load_u32(&self, addr: GuestAddress, _: Ordering) -> Result<u32, RamError> {
        let mut b = [0u8; 4];
        self.read_bytes(&mut b, addr)?;
        Ok(u32::from_le_bytes(b))
    }
    fn load_u64(&self, addr: GuestAddress, _: Ordering) -> Result<u64, RamError> {
        let mut b = [0u8; 8];
        self.read_bytes(&mut b, addr)?;
        Ok(u64::from_le_bytes(b))
    }
    fn store_u32(&self, _: u32, addr: GuestAddress, _: Ordering) -> Result<(), RamError> {
        Err(RamError::new(addr.0, 4, "read-only"))
    }
    fn store_u64(&self, _: u64, addr: GuestAddress, _: Ordering) -> Result<(), RamError> {
        Err(RamError::new(addr.0, 8, "read-only"))
    }
    fn contains(&self, addr: GuestAddress, len: usize) -> bool {
        self.0.read(addr.0, &mut vec![0u8; len]).is_ok()
    }
}

/// The guest's modules, read from its memory as vmtrace reads them.
struct Modules {
    ram: ReadOnly,
    root: u64,
    layout: ModuleLayout,
    /// Where a module's notes are (its build id).
    notes: NotesLayout,
    /// `modules`' address in the running kernel (KASLR applied).
    head: u64,
}

impl Modules {
    fn open(guest: &QemuGuest, kernel: &Kernel, bz: &std::path::Path) -> Modules {
        let file = vmm::boot::KernelFile::open(bz).unwrap();
        let image = kernel_image(&file, Given::Nothing).unwrap().image;
        let btf = KernelBtf::from_image(&image).unwrap();
        let layout = ModuleLayout::find(&image, &btf).unwrap();
        let mut qmp = Qmp::connect(guest.qmp_socket(), Duration::from_secs(10)).unwrap();
        let ram = ReadOnly(ProcRam::open(qmp.pid().unwrap(), &qmp.ram_layout().unwrap()).unwrap());
        let phys = kernel.phys_offset(&ram.0);
        let pa = |link: u64| link - KERNEL_MAP + phys;
        let root = pa(image.symbol(INIT_TOP_PGT).expect(INIT_TOP_PGT).addr);
        // The virtual KASLR offset: the one 2 MiB step at which the
        // kernel's tables map `modules` where it is in RAM.
        let space = AddressSpace::new(&ram, root, PagingMode::Level4);
        let steps: Vec<u64> = (0..512u64)
            .map(|i| layout.head + i * KASLR_ALIGN)
            .filter(|&va| space.translate(va).is_ok_and(|t| t.gpa == pa(layout.head)))
            .collect();
        assert_eq!(steps.len(), 1, "modules mapped at {steps:x?}");
        Modules {
            notes: NotesLayout::find(&btf).expect("notes_attrs in BTF"),
            head: steps[0],
            ram,
            root,
            layout,
        }
    }

    fn read(&self) -> (Vec<LoadedModule>, AddressSpace<'_>) {
        let mut space = AddressSpace::new(&self.ram, self.root, PagingMode::Level4);
        let list = loaded(&mut space, &self.layout, self.head).unwrap();
        (list, space)
    }
}

/// The kernel stack at each entry of `vmt_hit` in Debian's 6.12, innermost
/// first: the module's `vmt_batch` and `vmt_write` (its `proc_write`),
/// called through procfs (fs/proc/inode.c) by the write system call from
/// user mode; 6.12's `entry_SYSCALL_64_after_hwframe` is a sized symbol
/// (arch/x86/entry/entry_64.S, SYM_INNER_LABEL), so the call is named by it.
const MODULE_CHAIN: [&str; 7] = [
    "vmt_batch [vmt_test]",
    "vmt_write [vmt_test]",
    "proc_reg_write",
    "vfs_write",
    "ksys_write",
    "do_syscall_64",
    "entry_SYSCALL_64_after_hwframe",
];

/// Send the workload `line`; its answer must be `workload: REPLY
/// pid=WORKER` (an error line names REPLY too, and fails at once).
fn command(guest: &QemuGuest, line: &str, reply: &str, worker: u32) {
    guest.send_line(line);
    let got = guest.wait_for(reply, COMMAND_TIMEOUT).unwrap();
    let want = format!("workload: {reply} pid={worker}");
    assert!(got.contains(&want), "{line}: {got}");
}

/// The guest's own ftrace (the workload's `ftrace ...` commands): its
/// reply line.
fn guest_ftrace(guest: &QemuGuest, command: &str) -> String {
    guest.send_line(&format!("ftrace {command}"));
    let word = command.split(' ').next().unwrap();
    guest
        .wait_for(&format!("workload: ftrace {word}"), COMMAND_TIMEOUT)
        .unwrap()
}

#[test]
fn a_loaded_module_is_found_in_guest_memory_and_gone_once_unloaded() {
    let bz = debian_612();
    let kernel = Kernel::from_bzimage(&bz);
    let guest = QemuGuest::boot(QemuOpts {
        kernel: bz.clone(),
        initrd: Some(vmt_test_initramfs()),
        ..QemuOpts::linux()
    });
    let w = guest.wait_ready().unwrap();
    let modules = Modules::open(&guest, &kernel, &bz);
    let (before, _) = modules.read();
    assert!(before.iter().all(|m| m.name != "vmt_test"), "{before:?}");
    command(&guest, "insmod /vmt_test.ko", "insmod 0", w.worker);
    command(&guest, "vmt 7", "vmt 7", w.worker);

    let (list, mut space) = modules.read();
    assert_eq!(list.len(), before.len() + 1, "{list:?}");
    // The newest module is the list's first.
    let m = &list[0];
    assert_eq!(m.name, "vmt_test", "{list:?}");
    assert!(m.text.start < m.text.end, "{m:?}");
    let names: Vec<&str> = m.functions.iter().map(|f| f.name.as_str()).collect();
    for f in ["vmt_hit", "vmt_batch", "vmt_write"] {
        assert!(names.contains(&f), "{f} not in {names:?}");
    }
    // One site per traceable function (init and exit code aside), each in
    // its function's first instructions (after an `endbr64` under IBT)
    // and a NOP now.
    for f in ["vmt_hit", "vmt_batch", "vmt_write"] {
        let func = m.functions.iter().find(|x| x.name == f).unwrap();
        let sites: Vec<u64> = m
            .sites
            .iter()
            .copied()
            .filter(|&s| m.function_at(s) == Some(func))
            .collect();
        assert_eq!(
            sites.len(),
            1,
            "{f} at {:#x}: sites {:x?}",
            func.addr,
            m.sites
        );
        assert!(sites[0] - func.addr <= 4, "{f}: site {:#x}", sites[0]);
        let mut bytes = [0u8; 5];
        space.read(sites[0], &mut bytes).unwrap();
        assert_eq!(bytes, NOP5, "{f}'s site {:#x}", sites[0]);
    }

    // Its build id, from its notes in the guest's memory, is the file's
    // (what matches a host's .ko to the loaded module).
    let ko = bz.with_file_name("vmt_test.ko");
    let file_id = ko_build_id(&ko)
        .unwrap()
        .expect("vmt_test.ko has a build id");
    let id = loaded_build_id(&mut space, &modules.notes, m).unwrap();
    assert_eq!(id.as_ref(), Some(&file_id), "{}", ko.display());
    let other = ko_build_id(&bz.with_file_name("binfmt_misc.ko")).unwrap();
    assert!(other.is_some() && other != id, "{other:x?}");

    let text = |space: &mut AddressSpace<'_>| {
        let mut b = vec![0u8; (m.text.end - m.text.start) as usize];
        space.read(m.text.start, &mut b).unwrap();
        b
    };
    let found = text(&mut space);
    for (mode, glob, k, graph) in [
        ("exitless", "vmt_*", 300, false),
        // Within the graph ring the guest's free low pages hold: 2 x (K + 2) records.
        ("exitless", "vmt_*", 50, true),
        ("trap", "*:mod:vmt_test", 40, false),
    ] {
        let mut args = vec![
            "--kernel",
            s(&bz),
            "--format",
            "json",
            "--trace",
            glob,
            "--mode",
            mode,
        ];
        if graph {
            args.push("--graph");
        }
        // Trap mode records vmt_hit's argument, shown by the module's own
        // BTF, read from the kernel's `btf_modules` at the attach.
        let data = std::env::temp_dir().join(format!("vmtrace-loaded-{}.data", std::process::id()));
        if mode == "trap" {
            args.extend(["--args=vmt_hit", "-o", s(&data)]);
        }
        let mut a = Attach::start(guest.qmp_socket(), &args);
        let line = a.wait_line("vmtrace: attached to QEMU");
        assert!(line.contains(mode), "{line}");
        command(&guest, &format!("vmt {k}"), &format!("vmt {k}"), w.worker);
        a.signal(libc::SIGINT);
        let e = a.end();
        assert!(e.status.success(), "{mode}: {}: {}", e.status, e.stderr);
        assert!(
            e.stderr.contains("1 loaded module in the guest"),
            "{}",
            e.stderr
        );
        let counts = e.counts();
        assert_eq!(
            counts.get("vmt_hit [vmt_test]"),
            Some(&k),
            "{mode}: {counts:?}"
        );
        assert_eq!(
            counts.get("vmt_batch [vmt_test]"),
            Some(&1),
            "{mode}: {counts:?}"
        );
        assert_eq!(
            counts.get("vmt_write [vmt_test]"),
            Some(&1),
            "{mode}: {counts:?}"
        );
        assert_eq!(e.json()["dropped"], 0, "{}", e.stdout);
        if graph {
            // Every call returned through its hook: vmt_hit's, vmt_batch's,
            // vmt_write's.
            assert_eq!(e.json()["graph"]["returns"], k + 2, "{}", e.stdout);
        }
        if mode == "trap" {
            assert_args_shown(&data, k);
        }
        assert_eq!(
            text(&mut space),
            found,
            "{mode}: the module's text after the trace"
        );
        assert_no_gdbstub(guest.qmp_socket());
    }

    // Listed as ftrace lists it, by name or by `:mod:`, once each.
    for glob in ["vmt_*", "*:mod:vmt_test"] {
        let o = common::vmtrace(&[
            "list",
            "--qmp",
            s(guest.qmp_socket()),
            "--kernel",
            s(&bz),
            glob,
        ]);
        assert!(o.status.success(), "{}", common::stderr(&o));
        let out = common::stdout(&o);
        let lines: Vec<&str> = out.lines().collect();
        for want in [
            "vmt_hit [vmt_test]",
            "vmt_batch [vmt_test]",
            "vmt_write [vmt_test]",
            "vmt_exit [vmt_test] [notrace]",
        ] {
            assert!(lines.contains(&want), "{glob}: {want:?} not in:\n{out}");
        }
        assert!(!lines.contains(&"vmt_hit"), "{glob}: {out}");
    }

    module_stacks(&guest, &bz, w.worker, &modules);
    direct_entries(&guest, &bz, w.worker, &modules);
    distribution_module(&guest, &bz, w.worker, &modules);
    module_events(&guest, &bz, w.worker);
    events::module_event_traced(&guest, &bz, w.worker, &modules);

    // Unloaded and loaded again 20 times during a trace in each mode (one
    // console round trip: `vmtcycles`, each cycle K calls, the unload and
    // the load): every cycle's calls counted, the module's breakpoints
    // removed (exitless: its sites restored) at each unload, before its
    // text is freed, and set (written) again at each load, before its init
    // runs.
    module_hook_traced(&guest, &bz, "vmt_hit,ftrace_module_enable");
    for (mode, graph) in [("trap", false), ("exitless", false), ("exitless", true)] {
        cycles(&guest, &bz, m, w.worker, &modules, mode, graph);
    }
    // Exitless with direct entries too: the reloaded module's sites the
    // load wrote (calls into the bodies its stubs call) repaired alike.
    for mode in [
        ("trap", "ftrace"),
        ("exitless", "ftrace"),
        ("exitless", "direct"),
    ] {
        killed_after_a_reload(&guest, &bz, w.worker, &modules, mode);
    }

    // Unloaded during an exitless trace: its calls until then counted, its
    // sites restored at the unload (before its text is freed), none left
    // for the detach, and said so.
    let args = ["--kernel", s(&bz), "--format", "json", "--trace", "vmt_*"];
    let mut a = Attach::start(guest.qmp_socket(), &args);
    a.wait_line("vmtrace: attached to QEMU");
    command(&guest, "vmt 5", "vmt 5", w.worker);
    command(&guest, "rmmod vmt_test", "rmmod 0", w.worker);
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    assert_eq!(
        e.counts().get("vmt_hit [vmt_test]"),
        Some(&5),
        "{}",
        e.stdout
    );
    assert!(
        e.stderr.contains(
            "a traced module went away 1 times (its sites restored, 3 in all, before its memory \
             was freed) and came back 0 times"
        ),
        "{}",
        e.stderr
    );
    assert_no_gdbstub(guest.qmp_socket());
    let (after, _) = modules.read();
    assert_eq!(after, before);
    assert_runs_on(&guest, w.worker);

    // Waiting for a module, the hooks are needed as much: refused too
    // (the hook's own breakpoint would be the site's, no load seen).
    module_hook_traced(&guest, &bz, "vmt_*:mod:vmt_test,ftrace_module_enable");
    args_waiting_refused(&guest, &bz);
    events::waiting_refused(&guest, &bz);
    for (mode, graph, entry) in [
        ("trap", false, "ftrace"),
        ("exitless", false, "ftrace"),
        ("exitless", true, "ftrace"),
        // getppid and the module's functions by their direct entries:
        // vmt_exit's, which displaces real instructions, exitless through
        // a stub of its own written at each load.
        ("exitless", false, "direct"),
        ("trap", false, "direct"),
    ] {
        first_load(&guest, &bz, w.worker, &modules, (mode, graph, entry));
    }
    for (journal, entry) in [(true, "ftrace"), (false, "ftrace"), (true, "direct")] {
        killed_after_a_first_load(&guest, &bz, w.worker, &modules, (journal, entry));
    }
    first_load_stacks(&guest, &bz, w.worker, &modules);
    let (after, _) = modules.read();
    assert_eq!(after, before);
    module_files(&guest, &bz, w.worker);
    let (after, _) = modules.read();
    assert_eq!(after, before);
}

/// `--modules DIR`: vmt_test loaded from /vmt_nobtf.ko (its .BTF taken
/// out, its build id the same: guest/build.sh), so the guest keeps no BTF
/// of it. With DIR holding that file (under another name, a directory
/// down), matched by build id, `--args=vmt_hit` shows `(i=0)` ... by the
/// file's DWARF, said in one line and named in the report's `symbols`;
/// with DIR holding a copy whose build id differs (one byte of it
/// changed), the file is not used, said naming both build ids, and
/// vmt_hit has no prototype (its argument register recorded raw, `i`).
/// And first loaded from /vmt_nobtf.ko during a trap-mode trace waiting
/// for it (`vmt_*:mod:vmt_test`), with DIR holding its file: `(i=0)` ...
/// by the file's DWARF, matched at its load hook.
fn module_files(guest: &QemuGuest, bz: &std::path::Path, worker: u32) {
    const K: u64 = 6;
    let hex = |id: &[u8]| id.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let nobtf = bz.with_file_name("vmt_nobtf.ko");
    let id = ko_build_id(&nobtf).unwrap().expect("a build id");
    let base = std::env::temp_dir().join(format!("vmtrace-modfiles-{}", std::process::id()));
    let (good, bad) = (base.join("good"), base.join("bad"));
    std::fs::create_dir_all(good.join("extra")).unwrap();
    std::fs::create_dir_all(&bad).unwrap();
    let good_ko = good.join("extra/vmt_test.ko");
    std::fs::copy(&nobtf, &good_ko).unwrap();
    let mut bytes = std::fs::read(&nobtf).unwrap();
    let at = (bytes.windows(id.len()))
        .position(|w| w == id.as_slice())
        .unwrap();
    bytes[at] ^= 0xff;
    let bad_ko = bad.join("vmt_test.ko");
    std::fs::write(&bad_ko, &bytes).unwrap();
    let other = ko_build_id(&bad_ko).unwrap().unwrap();
    assert_ne!(other, id);
    command(guest, "insmod /vmt_nobtf.ko", "insmod 0", worker);
    for (dir, by_file) in [(&good, true), (&bad, false)] {
        let data =
            std::env::temp_dir().join(format!("vmtrace-modfiles-{}.data", std::process::id()));
        let args = [
            "--kernel",
            s(bz),
            "--format",
            "json",
            "--trace",
            "vmt_*",
            "--mode",
            "trap",
            "--args=vmt_hit",
            "--modules",
            s(dir),
            "-o",
            s(&data),
        ];
        let e = attach_vmt(guest, &args, worker, None, K);
        if by_file {
            let line = format!(
                "vmtrace: module vmt_test: {} has its build id {}: taken from it: its prototypes, \
                 from its DWARF",
                good_ko.display(),
                hex(&id)
            );
            assert!(e.stderr.contains(&line), "{}", e.stderr);
            let symbols = e.json()["symbols"].as_str().unwrap().to_string();
            let want = format!(
                "; modules' files by build id: vmt_test from {}",
                good_ko.display()
            );
            assert!(symbols.ends_with(&want), "{symbols}");
            assert_args_shown(&data, K);
            continue;
        }
        let line = format!(
            "vmtrace: {} is not used: its build id {} is not module vmt_test's, which has build id \
             {}",
            bad_ko.display(),
            hex(&other),
            hex(&id)
        );
        assert!(e.stderr.contains(&line), "{}", e.stderr);
        assert!(!e.stderr.contains("taken from it"), "{}", e.stderr);
        let trace = tracer::trace::datafile::load(&data).unwrap();
        let (hit, calls) = common::vmt_hit_calls(&trace);
        assert_eq!(trace.prototypes.get(hit), Some(&None), "no BTF, no file");
        let first: Vec<u64> = calls.iter().map(|c| trace.args_of(c).unwrap()[0]).collect();
        assert_eq!(first, (0..K).collect::<Vec<u64>>());
        std::fs::remove_file(&data).unwrap();
    }
    command(guest, "rmmod vmt_test", "rmmod 0", worker);
    // First loaded during the trace: its build id read from its read-only
    // data at the load hook (its sysfs notes come later), its file's
    // DWARF gives vmt_hit its prototype.
    let data = std::env::temp_dir().join(format!("vmtrace-modfirst-{}.data", std::process::id()));
    let args = [
        "--kernel",
        s(bz),
        "--format",
        "json",
        "--mode",
        "trap",
        "--trace",
        "vmt_*:mod:vmt_test,__x64_sys_getppid",
        "--args",
        "--modules",
        s(&good),
        "-o",
        s(&data),
    ];
    let e = attach_vmt(guest, &args, worker, Some("insmod /vmt_nobtf.ko"), K);
    // Named where the symbols came from as a loaded module's file is,
    // though it came after the start: the report's line and the data file's.
    common::module_file_named(&e.json(), &data, &good_ko);
    assert_args_shown(&data, K);
    // The file is named once, at the load, as for a loaded module.
    let line = format!(
        "vmtrace: module vmt_test: {} has its build id {}: taken from it: its prototypes, from \
         its DWARF",
        good_ko.display(),
        hex(&id)
    );
    assert_eq!(e.stderr.matches(&line).count(), 1, "{}", e.stderr);
    command(guest, "rmmod vmt_test", "rmmod 0", worker);
    std::fs::remove_dir_all(&base).unwrap();
    assert_no_gdbstub(guest.qmp_socket());
    assert_no_complaint(&guest.console(), &BAD, "");
}

/// A module first loaded during a trace in `mode` (exitless: with the
/// function graph if `graph`), `--entry` `entry` (the attach's sites):
/// `vmt_*:mod:vmt_test` waits for it (said),
/// the workload loads it, then `vmtcycles 20 K` (K calls, the unload, the
/// load again): exactly 20 x K hits, named `vmt_hit [vmt_test]` (with
/// the graph, every return too), its breakpoints taken out (exitless: its
/// sites restored) at each unload and set (written, its ftrace records
/// marked) again at each load, the comings and goings said; after the
/// detach its sites the kernel's NOPs (its records the guest's ftrace's
/// again), no gdbstub left and nothing on the console; unloaded after.
fn first_load(
    guest: &QemuGuest,
    bz: &std::path::Path,
    worker: u32,
    modules: &Modules,
    (mode, graph, entry): (&str, bool, &str),
) {
    const CYCLES: u64 = 20;
    const K: u64 = 5;
    let mut args = vec![
        "--kernel",
        s(bz),
        "--format",
        "json",
        "--mode",
        mode,
        "--entry",
        entry,
        "--trace",
        "vmt_*:mod:vmt_test,__x64_sys_getppid",
    ];
    if graph {
        args.push("--graph");
    }
    let mut a = Attach::start(guest.qmp_socket(), &args);
    let line = a.wait_line("vmtrace: attached to QEMU");
    assert!(line.contains(mode), "{line}");
    command(guest, "insmod /vmt_test.ko", "insmod 0", worker);
    let line = format!("vmtcycles {CYCLES} {K} /vmt_test.ko");
    command(guest, &line, &format!("vmtcycles {CYCLES}"), worker);
    let sites = sites_now(modules, mode, "at the last load");
    let direct = entry == "direct";
    // Direct entries: vmt_exit's too (no ftrace site: its entry displaces
    // real instructions), exitless a `jmp` to its own stub.
    let traced = match direct {
        true => first_load_entries(modules, mode),
        false => None,
    };
    // Exitless: its records marked as the attach's are, so the guest's
    // own ftrace refuses vmt_hit while vmtrace's call is at its site.
    let guests_ftrace = mode == "exitless" && !graph;
    if guests_ftrace {
        let on = guest_ftrace(guest, "on vmt_hit");
        assert_eq!(on, "workload: ftrace on vmt_hit=-22 tracer=off");
    }
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{mode}: {}: {}", e.status, e.stderr);
    let (_, mut space) = modules.read();
    for &site in &sites {
        let mut bytes = [0u8; 5];
        space.read(site, &mut bytes).unwrap();
        assert_eq!(bytes, NOP5, "site {site:#x} after the detach");
    }
    if let Some(t) = traced.as_ref() {
        t.given_back(modules, mode);
    }
    if guests_ftrace {
        // Given back at the detach: the guest's ftrace traces it again.
        let on = guest_ftrace(guest, "on vmt_hit");
        assert_eq!(on, "workload: ftrace on vmt_hit=0 tracer=0");
        let off = guest_ftrace(guest, "off");
        assert_eq!(off, "workload: ftrace off tracer=0 filter=0");
    }
    command(guest, "rmmod vmt_test", "rmmod 0", worker);
    assert!(
        e.stderr.contains(
            "vmtrace: 'vmt_*:mod:vmt_test': no such module loaded yet; its functions are traced \
             when the guest loads it"
        ),
        "{}",
        e.stderr
    );
    let counts = e.counts();
    // Direct entries: vmt_exit, run at each of the 20 unloads, too.
    let exits = match direct {
        true => CYCLES,
        false => 0,
    };
    for (f, n) in [
        ("vmt_hit", CYCLES * K),
        ("vmt_batch", CYCLES),
        ("vmt_write", CYCLES),
        ("vmt_exit", exits),
    ] {
        let name = format!("{f} [vmt_test]");
        assert_eq!(
            counts.get(&name).copied().unwrap_or(0),
            n,
            "{mode} {graph}: {f}: {counts:?}"
        );
    }
    assert!(!e.stderr.contains("refused a direct entry"), "{}", e.stderr);
    assert_eq!(e.json()["dropped"], 0, "{}", e.stdout);
    if graph {
        // Every call returned through its hook (none of getppid's here).
        let returns = e.json()["graph"]["returns"].as_u64().unwrap();
        let getppid = counts.get("__x64_sys_getppid").copied().unwrap_or(0);
        assert_eq!(returns, CYCLES * (K + 2) + getppid, "{}", e.stdout);
    }
    // Loaded 21 times (the first, then once a cycle), unloaded 20 times;
    // exitless, its 3 sites (direct: 4, vmt_exit's) and getppid's restored
    // at the detach.
    let n = 3 + u64::from(direct);
    let (how, restored) = match mode {
        "trap" => ("its breakpoints removed".to_string(), String::new()),
        _ => (
            format!("its sites restored, {} in all,", CYCLES * n),
            format!("{} sites restored; ", n + 1),
        ),
    };
    assert!(
        e.stderr.contains(&format!(
            "{restored}a traced module went away {CYCLES} times ({how} before its memory was \
             freed) and came back {CYCLES} times (traced again); 1 module first loaded during the \
             trace, traced from its load"
        )),
        "{mode}: {}",
        e.stderr
    );
    assert_no_gdbstub(guest.qmp_socket());
    assert_no_complaint(&guest.console(), &BAD, "");
    assert_runs_on(guest, worker);
}

/// The journal `vmtrace attach` keeps for this guest's QEMU.
fn journal_of(guest: &QemuGuest) -> std::path::PathBuf {
    let start = journal::start_time(guest.pid()).unwrap();
    let path = journal::path_for(guest.pid(), start);
    assert!(path.is_file(), "{}", path.display());
    path
}

/// The sites of `vmt_test`'s functions that `vmt_*` traces.
/// vmt_test's traced sites as the guest's memory has them now (`when`
/// names the moment); in exitless mode each a call into vmtrace's code
/// (the body its stub calls), written at the module's load.
fn sites_now(modules: &Modules, mode: &str, when: &str) -> Vec<u64> {
    let (list, mut space) = modules.read();
    let now = list.iter().find(|m| m.name == "vmt_test").expect("loaded");
    let sites = traced_sites(now);
    if mode == "exitless" {
        for &site in &sites {
            let mut bytes = [0u8; 5];
            space.read(site, &mut bytes).unwrap();
            assert_eq!(bytes[0], 0xe8, "site {site:#x} {when}");
        }
    }
    sites
}

/// vmtrace's code, where a direct entry's `jmp` goes (the top 8 MiB:
/// docs/attach.md, Where vmtrace's code and rings live).
const VMTRACE_CODE: std::ops::Range<u64> = 0xffff_ffff_ff80_0000..u64::MAX;
/// `endbr64`, which a function's direct entry follows under IBT.
const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// A first-loaded module's text during a trace with direct entries: its
/// start, its bytes, and its traced entries (the three ftrace sites and
/// vmt_exit's first instruction, after its `endbr64`).
struct EntriesText {
    start: u64,
    text: Vec<u8>,
    sites: Vec<u64>,
}

/// `EntriesText` of vmt_test as loaded now; exitless, vmt_exit's entry a
/// `jmp` into vmtrace's code (its stub, written at the load).
fn first_load_entries(modules: &Modules, mode: &str) -> Option<EntriesText> {
    let (list, mut space) = modules.read();
    let m = list.iter().find(|m| m.name == "vmt_test").expect("loaded");
    let mut text = vec![0u8; (m.text.end - m.text.start) as usize];
    space.read(m.text.start, &mut text).unwrap();
    let exit = m.functions.iter().find(|f| f.name == "vmt_exit").unwrap();
    let mut first = [0u8; 4];
    space.read(exit.addr, &mut first).unwrap();
    let site = exit.addr + if first == ENDBR64 { 4 } else { 0 };
    let mut bytes = [0u8; 5];
    space.read(site, &mut bytes).unwrap();
    if mode == "exitless" {
        let rel = i32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
        let to = (site + 5).wrapping_add_signed(rel.into());
        assert_eq!(bytes[0], 0xe9, "vmt_exit's entry {site:#x}: {bytes:x?}");
        assert!(VMTRACE_CODE.contains(&to), "vmt_exit's jump to {to:#x}");
    }
    let mut sites = traced_sites(m);
    sites.push(site);
    Some(EntriesText {
        start: m.text.start,
        text,
        sites,
    })
}

impl EntriesText {
    /// After the detach, the same load's text: trap mode wrote nothing,
    /// byte for byte the same; exitless the same but at the entries,
    /// which hold no jump or call into vmtrace's code any more.
    fn given_back(&self, modules: &Modules, mode: &str) {
        let (list, mut space) = modules.read();
        let m = list.iter().find(|m| m.name == "vmt_test").expect("loaded");
        assert_eq!(m.text.start, self.start, "the same load");
        let mut now = vec![0u8; self.text.len()];
        space.read(m.text.start, &mut now).unwrap();
        let at = |site: u64| (site - self.start) as usize;
        let mut during = self.text.clone();
        if mode == "exitless" {
            for &site in &self.sites {
                let (i, b) = (at(site), &now[at(site)..at(site) + 5]);
                assert!(b[0] != 0xe8 && b[0] != 0xe9, "{site:#x} after: {b:x?}");
                during[i..i + 5].copy_from_slice(b);
            }
        }
        assert!(during == now, "{mode}: vmt_test's text after the detach");
    }
}

fn traced_sites(m: &LoadedModule) -> Vec<u64> {
    let traced = |s: &u64| {
        let f = m.function_at(*s);
        f.is_some_and(|f| ["vmt_hit", "vmt_batch", "vmt_write"].contains(&f.name.as_str()))
    };
    let sites: Vec<u64> = m.sites.iter().copied().filter(traced).collect();
    assert_eq!(sites.len(), 3, "{m:?}");
    sites
}

/// An exitless attach waiting for `vmt_test`, killed (SIGKILL, with its
/// guardian) once the module's first load wrote its sites (journaled, and
/// named in the guest's marker): `vmtrace detach` leaves no gdbstub, the
/// module's sites the kernel's NOPs, and its calls run on; unloaded
/// after. Without `journal` (moved aside) the repair goes by the marker
/// alone: the module's sites found through the kernel's page tables and
/// restored with getppid's, vmtrace's entries cleared, only the pages'
/// bytes unknown (exit 1); the journal back, a second repair gives those.
/// With `--entry direct` (the journal kept), vmt_exit's entry too: its
/// `jmp` to the stub written at the load is given its bytes back, and the
/// unload after runs it untraced.
fn killed_after_a_first_load(
    guest: &QemuGuest,
    bz: &std::path::Path,
    worker: u32,
    modules: &Modules,
    (journal, entry): (bool, &str),
) {
    let args = [
        "--kernel",
        s(bz),
        "--mode",
        "exitless",
        "--entry",
        entry,
        "--trace",
        "vmt_*:mod:vmt_test,__x64_sys_getppid",
    ];
    let mut a = Attach::start(guest.qmp_socket(), &args);
    a.wait_line("vmtrace: attached to QEMU");
    command(guest, "insmod /vmt_test.ko", "insmod 0", worker);
    let (list, mut space) = modules.read();
    let now = list.iter().find(|m| m.name == "vmt_test").expect("loaded");
    let sites = traced_sites(now);
    let read = |space: &mut AddressSpace<'_>, site: u64| {
        let mut bytes = [0u8; 5];
        space.read(site, &mut bytes).unwrap();
        bytes
    };
    for &site in &sites {
        assert_eq!(
            read(&mut space, site)[0],
            0xe8,
            "site {site:#x} after the load"
        );
    }
    let entries = match entry {
        "direct" => first_load_entries(modules, "exitless"),
        _ => None,
    };
    // The module still runs (its calls go through the sites), and every
    // site is its NOP again.
    let assert_nops = |when: &str| {
        command(guest, "vmt 3", "vmt 3", worker);
        let (_, mut space) = modules.read();
        for &site in &sites {
            assert_eq!(read(&mut space, site), NOP5, "site {site:#x} {when}");
        }
    };
    kill_with_guardian(a);
    if !journal {
        let path = journal_of(guest);
        let aside = path.with_extension("aside");
        std::fs::rename(&path, &aside).unwrap();
        let o = detach(guest.qmp_socket());
        let err = common::stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{err}");
        for n in [
            "4 sites restored (0 of 4 were as found)",
            "page-directory entries cleared",
            "what they held before is in its journal only",
        ] {
            assert!(err.contains(n), "{n:?} in {err}");
        }
        assert!(!err.contains("left in place"), "{err}");
        assert_nops("after the marker's repair");
        std::fs::rename(&aside, &path).unwrap();
    }
    let o = detach(guest.qmp_socket());
    assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
    assert_no_gdbstub(guest.qmp_socket());
    assert_nops("after the repair");
    if let Some(t) = entries.as_ref() {
        t.given_back(modules, "exitless");
    }
    command(guest, "rmmod vmt_test", "rmmod 0", worker);
    assert_no_complaint(&guest.console(), &BAD, "");
    assert_runs_on(guest, worker);
}

/// Tracing a function of the kernel's module load path where vmtrace
/// follows modules (`ftrace_module_enable`, by direct entry: the kernel's
/// ftrace code has no ftrace sites) with a module's function (`trace`: a
/// loaded module's, or a `:mod:` glob waiting for one): refused in one
/// line, exit status 2, before the guest is touched (no gdbstub left).
fn module_hook_traced(guest: &QemuGuest, bz: &std::path::Path, trace: &str) {
    let o = common::vmtrace(&[
        "attach",
        "--qmp",
        s(guest.qmp_socket()),
        "--kernel",
        s(bz),
        "--entry",
        "direct",
        "--trace",
        trace,
    ]);
    let err = common::stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    // One line, the last (after the kernel's and the modules' notes).
    let refused: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("ftrace_module_enable"))
        .collect();
    assert_eq!(refused.len(), 1, "{err}");
    assert_eq!(err.lines().last(), Some(refused[0]), "{err}");
    assert!(
        refused[0]
            .starts_with("vmtrace: --trace selects ftrace_module_enable, where vmtrace follows"),
        "{err}"
    );
    assert_no_gdbstub(guest.qmp_socket());
}

/// The trace saved in `data`: its `k` calls of `vmt_hit [vmt_test]`
/// shown by the module's BTF, `vmt_hit(unsigned long i)`, i from 0 to
/// k - 1 in order (the file removed).
fn assert_args_shown(data: &std::path::Path, k: u64) {
    let trace = tracer::trace::datafile::load(data).unwrap();
    let (hit, calls) = common::vmt_hit_calls(&trace);
    let shown: Vec<String> = (calls.iter())
        .map(|e| tracer::trace::values::entry_args(&trace, e).unwrap_or_default())
        .collect();
    let want: Vec<String> = (0..k).map(|i| format!("(i={i})")).collect();
    assert_eq!(shown, want, "{:?}", trace.prototypes.get(hit));
    std::fs::remove_file(data).unwrap();
}

/// `--args` with a `:mod:` glob waiting for its module: the spare sites a
/// module first loaded gets record no arguments, so refused in one line,
/// exit status 2, before the guest is touched (no gdbstub left).
fn args_waiting_refused(guest: &QemuGuest, bz: &std::path::Path) {
    let o = common::vmtrace(&[
        "attach",
        "--qmp",
        s(guest.qmp_socket()),
        "--kernel",
        s(bz),
        "--args",
        "--trace",
        "vmt_*:mod:vmt_test,__x64_sys_getppid",
    ]);
    let err = common::stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(
        err.lines().last(),
        Some(
            "vmtrace: --args with 'vmt_*:mod:vmt_test', a module not loaded yet: the functions of \
             a module the guest loads during the trace record arguments in trap mode only \
             (exitless mode's spare sites hold none); add --mode trap, load it before the \
             attach, or trace without --args"
        ),
        "{err}"
    );
    assert_no_gdbstub(guest.qmp_socket());
}

/// `vmtcycles 20 K` under a trace of `vmt_*` in `mode` (exitless: with
/// the function graph if `graph`), the module `first` loaded at the
/// attach: exactly 20 x K hits (and each call's return with the graph),
/// the unloads and loads said (exitless: its 3 sites restored at each
/// unload), the module at the end (loaded at a new address) the attach's
/// functions with their sites NOPs as the kernel left them, and no
/// `BUG:`/`WARNING:`/`Oops` on the console.
fn cycles(
    guest: &QemuGuest,
    bz: &std::path::Path,
    first: &LoadedModule,
    worker: u32,
    modules: &Modules,
    mode: &str,
    graph: bool,
) {
    const CYCLES: u64 = 20;
    const K: u64 = 5;
    let mut args = vec![
        "--kernel",
        s(bz),
        "--format",
        "json",
        "--trace",
        "vmt_*",
        "--mode",
        mode,
    ];
    if graph {
        args.push("--graph");
    }
    let mut a = Attach::start(guest.qmp_socket(), &args);
    a.wait_line("vmtrace: attached to QEMU");
    let line = format!("vmtcycles {CYCLES} {K} /vmt_test.ko");
    command(guest, &line, &format!("vmtcycles {CYCLES}"), worker);
    // Exitless: the reloaded module's records are marked as the attach's
    // are, so the guest's own ftrace refuses vmt_hit while vmtrace's call
    // is at its site (it would find it there: `ftrace bug`).
    let guests_ftrace = mode == "exitless" && !graph;
    if guests_ftrace {
        let on = guest_ftrace(guest, "on vmt_hit");
        assert_eq!(on, "workload: ftrace on vmt_hit=-22 tracer=off");
    }
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{mode}: {}: {}", e.status, e.stderr);
    assert!(!e.stderr.contains("stay excluded"), "{}", e.stderr);
    if guests_ftrace {
        // Given back at the detach: the guest's ftrace traces it again.
        let on = guest_ftrace(guest, "on vmt_hit");
        assert_eq!(on, "workload: ftrace on vmt_hit=0 tracer=0");
        let enabled = guest_ftrace(guest, "enabled");
        assert_eq!(enabled, "workload: ftrace enabled vmt_hit");
        command(guest, "vmt 3", "vmt 3", worker);
        let off = guest_ftrace(guest, "off");
        assert_eq!(off, "workload: ftrace off tracer=0 filter=0");
    }
    let counts = e.counts();
    for (f, n) in [
        ("vmt_hit", CYCLES * K),
        ("vmt_batch", CYCLES),
        ("vmt_write", CYCLES),
    ] {
        assert_eq!(
            counts.get(&format!("{f} [vmt_test]")),
            Some(&n),
            "{mode} {graph}: {f}: {counts:?}"
        );
    }
    assert_eq!(e.json()["dropped"], 0, "{}", e.stdout);
    if graph {
        assert_eq!(
            e.json()["graph"]["returns"],
            CYCLES * (K + 2),
            "{}",
            e.stdout
        );
    }
    // Every site vmtrace wrote was given back by vmtrace: none found
    // changed at the detach.
    let detached = e.stderr.lines().find(|l| l.contains("detached"));
    assert!(
        detached.is_some_and(|l| !l.contains("changed by the guest")),
        "{}",
        e.stderr
    );
    let how = match mode {
        "trap" => "its breakpoints removed".to_string(),
        _ => format!("its sites restored, {} in all,", CYCLES * 3),
    };
    assert!(
        e.stderr.contains(&format!(
            "a traced module went away {CYCLES} times ({how} before its memory was freed) and \
             came back {CYCLES} times (traced again)"
        )),
        "{mode}: {}",
        e.stderr
    );
    assert_no_gdbstub(guest.qmp_socket());
    assert_no_complaint(&guest.console(), &BAD, "");
    let (list, mut space) = modules.read();
    let now = list.iter().find(|m| m.name == "vmt_test").expect("loaded");
    let shape = |m: &LoadedModule| {
        let f: Vec<_> = m
            .functions
            .iter()
            .map(|f| (&f.name, f.addr - m.text.start, f.size))
            .collect();
        let s: Vec<_> = m.sites.iter().map(|s| s - m.text.start).collect();
        format!("{f:?} {s:?}")
    };
    assert_eq!(shape(now), shape(first));
    for &site in &now.sites {
        let mut bytes = [0u8; 5];
        space.read(site, &mut bytes).unwrap();
        assert_eq!(bytes, NOP5, "site {site:#x} after {CYCLES} cycles");
    }
}

/// An attach of `vmt_*` in `mode` (`--entry` `entry`) killed with its
/// guardian after the module went and came back (its load and unload hooks set, the reloaded
/// module's breakpoints, or exitless its sites, journaled): `vmtrace
/// detach` leaves no gdbstub, the module's sites NOPs, and its calls run
/// on (a breakpoint left with no debugger would stop the guest at the
/// first; a call left to vmtrace's code taken out would crash it).
fn killed_after_a_reload(
    guest: &QemuGuest,
    bz: &std::path::Path,
    worker: u32,
    modules: &Modules,
    (mode, entry): (&str, &str),
) {
    let args = [
        "--kernel",
        s(bz),
        "--trace",
        "vmt_*",
        "--mode",
        mode,
        "--entry",
        entry,
    ];
    let mut a = Attach::start(guest.qmp_socket(), &args);
    a.wait_line("vmtrace: attached to QEMU");
    command(guest, "vmtcycles 1 2 /vmt_test.ko", "vmtcycles 1", worker);
    kill_with_guardian(a);
    let o = detach(guest.qmp_socket());
    assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
    assert_no_gdbstub(guest.qmp_socket());
    command(guest, "vmt 3", "vmt 3", worker);
    let (list, mut space) = modules.read();
    let now = list.iter().find(|m| m.name == "vmt_test").expect("loaded");
    for &site in &now.sites {
        let mut bytes = [0u8; 5];
        space.read(site, &mut bytes).unwrap();
        assert_eq!(bytes, NOP5, "site {site:#x} after the repair");
    }
}

/// Debian's own binfmt_misc.ko, from the kernel's package (no hardware to
/// find; guest/build.sh vmt-test puts it in the initramfs, executable):
/// loaded, its `load_misc_binary` (the first binary format execve tries)
/// traced by name in exitless mode and by `:mod:` in trap mode, with the
/// vmlinuz alone and its symbols from the guest's memory: exactly once per
/// `execve` of a file no format takes (the .ko itself). Unloaded after.
fn distribution_module(guest: &QemuGuest, bz: &std::path::Path, worker: u32, modules: &Modules) {
    const N: u64 = 10;
    command(guest, "insmod /binfmt_misc.ko", "insmod 0", worker);
    module_jump_labels(modules);
    for (mode, glob, entry) in [
        ("exitless", "load_misc_binary", "ftrace"),
        ("trap", "*:mod:binfmt_misc", "ftrace"),
        ("exitless", "load_misc_binary", "direct"),
    ] {
        let args = [
            "--kernel",
            s(bz),
            "--format",
            "json",
            "--trace",
            glob,
            "--mode",
            mode,
            "--entry",
            entry,
        ];
        let mut a = Attach::start(guest.qmp_socket(), &args);
        a.wait_line("vmtrace: attached to QEMU");
        let line = format!("exec {N} /binfmt_misc.ko");
        command(guest, &line, &format!("exec {N}"), worker);
        a.signal(libc::SIGINT);
        let e = a.end();
        assert!(e.status.success(), "{glob}: {}: {}", e.status, e.stderr);
        assert!(
            e.stderr.contains("2 loaded modules in the guest"),
            "{}",
            e.stderr
        );
        let counts = e.counts();
        assert_eq!(
            counts.get("load_misc_binary [binfmt_misc]"),
            Some(&N),
            "{glob}: {counts:?}"
        );
        assert!(
            counts.keys().all(|f| f.ends_with(" [binfmt_misc]")),
            "{glob}: {counts:?}"
        );
        assert_no_gdbstub(guest.qmp_socket());
    }
    command(guest, "rmmod binfmt_misc", "rmmod 0", worker);
}

/// binfmt_misc's jump labels, read from its `struct module` as its
/// direct entries' analysis reads them (`tracer::kernel::module_tables`):
/// each in its text, a jump label's 2- or 5-byte NOP or jump there, its
/// target in its text too.
fn module_jump_labels(modules: &Modules) {
    let (list, mut space) = modules.read();
    let m = list
        .iter()
        .find(|m| m.name == "binfmt_misc")
        .expect("loaded");
    let jumps = &m.tables.jumps;
    assert!(!jumps.is_empty(), "{:?}", m.tables);
    for &(site, target) in jumps {
        assert!(
            m.text.contains(&site) && m.text.contains(&target),
            "{site:#x} -> {target:#x}"
        );
        let mut b = [0u8; 5];
        space.read(site, &mut b).unwrap();
        let known = [&[0x66, 0x90][..], &NOP5[..], &[0xeb][..], &[0xe9][..]];
        assert!(
            known.iter().any(|k| b.starts_with(k)),
            "jump label at {site:#x}: {b:x?}"
        );
    }
}

/// Direct entries (`--entry direct`) on a module loaded before the
/// attach, its text as found then: exitless, each
/// function's first instructions a jump to its stub; a function the
/// guest's own ftrace traces (vmt_hit) is left to it, as a vmlinux
/// function is, and the others' records are marked (the guest's ftrace
/// refuses vmt_batch meanwhile); trap mode, breakpoints: exact counts,
/// the text as found after each. Then, in each mode, the module unloaded
/// during the trace (its exit function, vmt_exit, which has no ftrace
/// site, called by its direct entry) and loaded again (binfmt_misc.ko
/// loaded between, mostly elsewhere): its sites restored at the unload
/// (exitless, with and without the function graph: every call's return
/// seen) and traced again at the load, exactly; unloaded and loaded once
/// more, vmt_exit counted again where the first reload found its bytes
/// again (exitless: its stub written again for the new address), else
/// said as a site whose code changed.
fn direct_entries(guest: &QemuGuest, bz: &std::path::Path, worker: u32, modules: &Modules) {
    const K: u64 = 6;
    let text = |space: &mut AddressSpace<'_>, m: &LoadedModule| {
        let mut b = vec![0u8; (m.text.end - m.text.start) as usize];
        space.read(m.text.start, &mut b).unwrap();
        b
    };
    let (list, mut space) = modules.read();
    let m = list.iter().find(|m| m.name == "vmt_test").expect("loaded");
    let found = text(&mut space, m);
    // (`vmt_*:mod:`: the module's event functions, `__traceiter_vmt_event`
    // and the like, are no `vmt_*`, and a direct entry each would add up.)
    for (mode, glob) in [("exitless", "vmt_*"), ("trap", "vmt_*:mod:vmt_test")] {
        let exitless = mode == "exitless";
        if exitless {
            let on = guest_ftrace(guest, "on vmt_hit");
            assert_eq!(on, "workload: ftrace on vmt_hit=0 tracer=0");
        }
        let more = ["--entry", "direct", "--mode", mode];
        let mut a = attach_json(guest.qmp_socket(), bz, glob, &more);
        let line = a.wait_line("vmtrace: attached to QEMU");
        let want = match exitless {
            true => "3 sites patched, exitless".to_string(),
            false => "a gdbstub breakpoint at each of 4 function entries (direct)".to_string(),
        };
        assert!(line.contains(&want), "{line}");
        command(guest, &format!("vmt {K}"), &format!("vmt {K}"), worker);
        if exitless {
            // The guest's tracer off before the detach, which then gives
            // the records back; vmt_batch's is marked: refused meanwhile.
            let off = guest_ftrace(guest, "off");
            assert_eq!(off, "workload: ftrace off tracer=0 filter=0");
            let on = guest_ftrace(guest, "on vmt_batch");
            assert_eq!(on, "workload: ftrace on vmt_batch=-22 tracer=off");
        }
        a.signal(libc::SIGINT);
        let e = a.end();
        assert!(e.status.success(), "{mode}: {}: {}", e.status, e.stderr);
        assert!(!e.stderr.contains("stay excluded"), "{}", e.stderr);
        let counts = e.counts();
        let hits = if exitless { 0 } else { K };
        for (f, n) in [("vmt_hit", hits), ("vmt_batch", 1), ("vmt_write", 1)] {
            let name = format!("{f} [vmt_test]");
            assert_eq!(
                counts.get(&name).copied().unwrap_or(0),
                n,
                "{mode}: {counts:?}"
            );
        }
        assert_eq!(e.json()["dropped"], 0, "{}", e.stdout);
        if exitless {
            // Given back: the guest's ftrace takes vmt_batch again.
            let on = guest_ftrace(guest, "on vmt_batch");
            assert_eq!(on, "workload: ftrace on vmt_batch=0 tracer=0");
            let off = guest_ftrace(guest, "off");
            assert_eq!(off, "workload: ftrace off tracer=0 filter=0");
        }
        let (_, mut space) = modules.read();
        assert_eq!(
            text(&mut space, m),
            found,
            "{mode}: the module's text after the trace"
        );
        assert_no_gdbstub(guest.qmp_socket());
    }
    for (mode, glob, graph) in [
        ("exitless", "vmt_*", false),
        ("exitless", "vmt_*", true),
        ("trap", "vmt_*:mod:vmt_test", false),
    ] {
        let mut more = vec!["--entry", "direct", "--mode", mode];
        if graph {
            more.push("--graph");
        }
        let mut a = attach_json(guest.qmp_socket(), bz, glob, &more);
        a.wait_line("vmtrace: attached to QEMU");
        command(guest, &format!("vmt {K}"), &format!("vmt {K}"), worker);
        let moved = reload_between(guest, worker, modules);
        eprintln!("{mode}: vmt_test loaded again elsewhere: {moved}");
        command(guest, &format!("vmt {K}"), &format!("vmt {K}"), worker);
        // Unloaded and loaded once more: the reloaded vmt_exit runs.
        command(guest, "rmmod vmt_test", "rmmod 0", worker);
        command(guest, "insmod /vmt_test.ko", "insmod 0", worker);
        let sites = sites_now(modules, mode, "after the reloads");
        a.signal(libc::SIGINT);
        let e = a.end();
        assert!(e.status.success(), "{mode}: {}: {}", e.status, e.stderr);
        let counts = e.counts();
        // vmt_exit's entry displaced `mov .bss(%rip),%rdi`: reloaded, its
        // bytes are the same only where the module's text and data moved
        // by the same distance (6.4+ allocates them apart), else it is a
        // site whose code changed, untraced and said (in trap mode its
        // breakpoint is then not set again: one fewer to remove). Found
        // again at the first reload (`again`: exitless, a new stub for the
        // new address), it counts the second unload's call.
        let exits = counts.get("vmt_exit [vmt_test]").copied().unwrap_or(0);
        assert!(exits == 1 || exits == 2, "{mode}: {counts:?}");
        let again = exits - 1;
        for (f, n) in [("vmt_hit", 2 * K), ("vmt_batch", 2), ("vmt_write", 2)] {
            let name = format!("{f} [vmt_test]");
            assert_eq!(counts.get(&name), Some(&n), "{mode}: {counts:?}");
        }
        if graph {
            // Every call returned through its hook, through the reloads.
            let returns = 2 * K + 5 + again;
            assert_eq!(e.json()["graph"]["returns"], returns, "{}", e.stdout);
        }
        // Whether the second reload found vmt_exit's bytes again (`last`):
        // either, its entry restored at the detach or not written.
        let said: Vec<String> = (0..2u64)
            .map(|last| {
                let changed = (1 - again) + (1 - last);
                let but = match changed {
                    0 => String::new(),
                    n => format!(", but {n} sites whose code changed"),
                };
                let how = match mode {
                    "exitless" => format!(
                        "{} sites restored; a traced module went away 2 times (its sites \
                         restored, {} in all,",
                        3 + last,
                        7 + again
                    ),
                    _ => format!(
                        "{} breakpoints removed; a traced module went away 2 times (its \
                         breakpoints removed",
                        3 + last
                    ),
                };
                format!(
                    "{how} before its memory was freed) and came back 2 times (traced again{but})"
                )
            })
            .collect();
        assert!(
            said.iter().any(|l| e.stderr.contains(l)),
            "{mode}: {}",
            e.stderr
        );
        let (_, mut space) = modules.read();
        for &site in &sites {
            let mut bytes = [0u8; 5];
            space.read(site, &mut bytes).unwrap();
            assert_eq!(bytes, NOP5, "{mode}: site {site:#x} after the detach");
        }
        assert_no_gdbstub(guest.qmp_socket());
    }
    assert_no_complaint(&guest.console(), &BAD, "");
    assert_runs_on(guest, worker);
}

/// The events of the guest's modules, as `list -e --qmp` reads them from
/// its memory: Debian's own kyber-iosched.ko (guest/build.sh vmt-test puts
/// it in the initramfs) lists its three tracepoints, `kyber:*`, by its
/// name once loaded, and by its module (`GLOB:mod:kyber_iosched`);
/// unloaded, they are gone (no such event: exit status 2).
fn module_events(guest: &QemuGuest, bz: &std::path::Path, worker: u32) {
    let list = |globs: &[&str]| {
        let qmp = s(guest.qmp_socket());
        let mut args = vec!["list", "-e", "--qmp", qmp, "--kernel", s(bz)];
        args.extend(globs);
        common::vmtrace(&args)
    };
    command(guest, "insmod /kyber-iosched.ko", "insmod 0", worker);
    // By their system and name, and by their module (whose name is not
    // the system's), in one call: each once.
    let o = list(&[
        "kyber:kyber_adjust",
        "kyber_l*:mod:kyber_iosched",
        "kyber_throttled:mod:kyber_*",
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let lines: Vec<String> = common::stdout(&o).lines().map(String::from).collect();
    let want = ["kyber_adjust", "kyber_latency", "kyber_throttled"]
        .map(|e| format!("kyber:{e} [kyber_iosched]"));
    assert_eq!(lines, want, "{}", common::stderr(&o));
    let said = "vmtrace: 0 events (and 3 of the guest's modules) in 1 subsystem";
    assert!(common::stderr(&o).contains(said), "{}", common::stderr(&o));
    command(guest, "rmmod kyber_iosched", "rmmod 0", worker);
    let o = list(&["kyber:*"]);
    assert_eq!(o.status.code(), Some(2), "{}", common::stderr(&o));
    assert!(common::stdout(&o).is_empty(), "{}", common::stdout(&o));
}

/// `--stack vmt_hit` in trap mode: each of the K calls' kernel stacks
/// unwinds through the module's own functions (their ORC tables read from
/// the guest's memory) and the write system call beneath, to the worker's
/// user-mode registers: one stack for all K, and for K more once the
/// module is unloaded and loaded again at a new address during the trace.
fn module_stacks(guest: &QemuGuest, bz: &std::path::Path, worker: u32, modules: &Modules) {
    const K: u64 = 4;
    let more = ["--stack", "vmt_hit", "--mode", "trap"];
    let a = attach_json(guest.qmp_socket(), bz, "vmt_hit", &more);
    command(guest, &format!("vmt {K}"), &format!("vmt {K}"), worker);
    // Loaded again elsewhere: its calls unwind through the attach's ORC
    // entries of its code, to the same stack.
    reload_elsewhere(guest, worker, modules);
    command(guest, &format!("vmt {K}"), &format!("vmt {K}"), worker);
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    assert_one_module_stack(&e, 2 * K);
}

/// Unload vmt_test and load it again at another address (binfmt_misc.ko
/// loaded between takes the memory it leaves, and goes again).
fn reload_elsewhere(guest: &QemuGuest, worker: u32, modules: &Modules) {
    assert!(
        reload_between(guest, worker, modules),
        "loaded again where it was"
    );
}

/// Unload vmt_test and load it again, binfmt_misc.ko loaded between (and
/// unloaded after): whether it moved (the kernel frees module memory
/// lazily, so it may not: binfmt_misc takes it or not).
fn reload_between(guest: &QemuGuest, worker: u32, modules: &Modules) -> bool {
    let text = || {
        let (list, _) = modules.read();
        let m = list.iter().find(|m| m.name == "vmt_test").expect("loaded");
        m.text.clone()
    };
    let before = text();
    command(guest, "rmmod vmt_test", "rmmod 0", worker);
    command(guest, "insmod /binfmt_misc.ko", "insmod 0", worker);
    command(guest, "insmod /vmt_test.ko", "insmod 0", worker);
    command(guest, "rmmod binfmt_misc", "rmmod 0", worker);
    text().start != before.start
}

/// `calls` calls of vmt_hit in the attach's JSON report, all with one
/// stack: complete, down to user mode, through [`MODULE_CHAIN`].
fn assert_one_module_stack(e: &Ended, calls: u64) {
    let v = e.json();
    assert_eq!(e.counts().get("vmt_hit [vmt_test]"), Some(&calls), "{v}");
    let stacks = v["stacks"].as_array().unwrap_or_else(|| panic!("{v}"));
    assert_eq!(stacks.len(), 1, "{v}");
    let st = &stacks[0];
    assert_eq!(
        (&st["end"], &st["complete"]),
        (&"user".into(), &true.into()),
        "{st}"
    );
    let chain: Vec<&str> = st["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|fr| fr["function"].as_str().unwrap_or_else(|| panic!("{fr}")))
        .collect();
    assert_eq!(chain, MODULE_CHAIN, "{st}");
}

/// `--stack vmt_hit` in trap mode with `vmt_*:mod:vmt_test` waiting: the
/// workload loads the module during the trace and calls it, then loads
/// it again at another address and calls it again; each call's stack
/// unwinds through the module's frames (its ORC tables read at its load
/// from its `struct module`) to the worker's user-mode registers, the
/// second load's as the first's: one stack for all 2 x K calls, its
/// frames named by the module's traced functions. With `--args` in the
/// same attach: each `vmt_hit(i)` call's argument register is the `i`
/// the module passes, 0 to K - 1 at each write (its values raw: the
/// module's BTF is not read, so the trace has no prototype for it).
fn first_load_stacks(guest: &QemuGuest, bz: &std::path::Path, worker: u32, modules: &Modules) {
    const K: u64 = 4;
    let data = std::env::temp_dir().join(format!("vmtrace-first-load-{}.data", std::process::id()));
    let trace = "vmt_*:mod:vmt_test,__x64_sys_getppid";
    let more = [
        "--stack",
        "vmt_hit",
        "--args",
        "--mode",
        "trap",
        "-o",
        s(&data),
    ];
    let a = attach_json(guest.qmp_socket(), bz, trace, &more);
    command(guest, "insmod /vmt_test.ko", "insmod 0", worker);
    command(guest, &format!("vmt {K}"), &format!("vmt {K}"), worker);
    reload_elsewhere(guest, worker, modules);
    command(guest, &format!("vmt {K}"), &format!("vmt {K}"), worker);
    a.signal(libc::SIGINT);
    let e = a.end();
    command(guest, "rmmod vmt_test", "rmmod 0", worker);
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    assert_one_module_stack(&e, 2 * K);
    // vmt_hit(i), i from 0 to K - 1 at each of the two writes, in order.
    let trace = tracer::trace::datafile::load(&data).unwrap();
    let (hit, calls) = common::vmt_hit_calls(&trace);
    let got: Vec<u64> = calls
        .iter()
        .map(|e| {
            trace
                .args_of(e)
                .unwrap_or_else(|| panic!("no arguments: {e:?}"))[0]
        })
        .collect();
    let want: Vec<u64> = (0..K).chain(0..K).collect();
    assert_eq!(got, want);
    // Shown by the module's own BTF, read from `mod->btf_data` at the
    // load hook: `vmt_hit(unsigned long i)`, its first argument `i`.
    let shown: Vec<String> = (calls.iter())
        .map(|e| tracer::trace::values::entry_args(&trace, e).unwrap_or_default())
        .collect();
    let want: Vec<String> = want.iter().map(|i| format!("(i={i})")).collect();
    assert_eq!(shown, want, "{:?}", trace.prototypes.get(hit));
    std::fs::remove_file(&data).unwrap();
    assert_no_gdbstub(guest.qmp_socket());
    assert_runs_on(guest, worker);
}

/// An attach with `args`; once it is attached, `load` (a console command
/// loading the module, if any) and `vmt k`; ended by Ctrl-C: its exit
/// status checked and vmt_hit's k calls counted.
fn attach_vmt(guest: &QemuGuest, args: &[&str], worker: u32, load: Option<&str>, k: u64) -> Ended {
    let mut a = Attach::start(guest.qmp_socket(), args);
    a.wait_line("vmtrace: attached to QEMU");
    if let Some(load) = load {
        command(guest, load, "insmod 0", worker);
    }
    command(guest, &format!("vmt {k}"), &format!("vmt {k}"), worker);
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    let hits = e.counts().get("vmt_hit [vmt_test]").copied();
    assert_eq!(hits, Some(k), "{}", e.stdout);
    e
}
