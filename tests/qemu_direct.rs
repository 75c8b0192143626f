//! `vmtrace attach --entry direct` on a distribution kernel: Debian's 6.12
//! cloud kernel (guest/build.sh debian-6.12, its vmlinuz alone: symbols
//! from its kallsyms) booted in QEMU/TCG with the workload initramfs and
//! `preempt=full` on one vCPU, busy (`busy 2`: two tasks forking, sleeping
//! on timers and calling getppid and openat, competing with the worker for
//! the vCPU, so that the scheduler preempts them anywhere: in the kernel,
//! in vmtrace's stubs, trampoline and return hook) while vmtrace attaches
//! and detaches direct entries on over 1,000 functions, ten times
//! exitless with the function graph (the code, its return stubs and frames
//! in a hot-plugged ring device: the guest's free pages hold the graph's
//! parts and 63 direct stubs only), twice exitless without it (on busier
//! functions, some of which block); then ten times in trap mode, with the function graph (breakpoints at
//! the entries and at the return addresses: nothing written, so nothing
//! to fit). Each cycle: getpid's calls (and with the graph its returns)
//! counted exactly, the code taken out only once no task is inside it (a
//! preempted task never returns into removed code), no kernel complaint on
//! the console, every byte of the kernel's text and of the low MiB as
//! found, the stub gone, `info pci` as before and no ring file left. Once,
//! between two exitless cycles, an attach with the code in the device is
//! killed and `vmtrace detach` repairs it (the next cycle's attach finds
//! no region left mapped).

mod common;

use common::attach::*;
use common::console::assert_no_complaint;
use common::guard::*;
use common::qemu::*;
use common::s;
use tracer::qemu::journal;
use tracer::qemu::qmp::Qmp;

/// getpid's function: `__x64_sys_getpid` and `__do_sys_getpid` share an
/// address, and the report names it by one of them.
const GETPID: [&str; 2] = ["__do_sys_getpid", "__x64_sys_getpid"];

/// More than 1,000 functions of Debian's 6.12 cloud kernel, busy ones
/// among them (system calls, forks, timers, the scheduler's clocks).
const MANY: &str = "__x64_sys_*,do_*,vfs_*,ksys_*,copy_*,find_*,tick_*,hrtimer_*,ktime_*";
/// More than 1,000 functions of the same kernel for the function graph,
/// every one of which returns soon: none that blocks (`do_wait`, the
/// worker's console `vfs_read`) or never returns (`do_exit`, a task's
/// `get_signal` that exits it), whose hooked call would keep the code
/// mapped at the detach (getpid's among them).
const GRAPH_MANY: &str = "__x64_sys_get*,copy_*,find_*,tick_*,ktime_*,get_*,put_*,rb_*,kmem_*,\
                          alloc_*,free_*,update_*,!get_signal";
/// Direct entries `MANY` patches at least (the report's `sites_patched`:
/// 1,192 with the rules of this writing).
const MANY_SITES: u64 = 1000;
/// Exitless attach/detach cycles with the function graph.
const CYCLES: u64 = 10;
/// Exitless cycles without it, over `MANY`.
const PLAIN_CYCLES: u64 = 2;
/// Trap-mode cycles (`--graph` over `MANY`).
const TRAP_CYCLES: u64 = 10;

/// One cycle's kind.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Exitless,
    ExitlessGraph,
    TrapGraph,
}

#[test]
fn direct_entries_attach_and_detach_under_load() {
    let bz = debian_612();
    let kernel = Kernel::from_bzimage(&bz);
    let guest = QemuGuest::boot(QemuOpts {
        kernel: bz.clone(),
        cpus: 1,
        append: "preempt=full".into(),
        ..QemuOpts::linux()
    });
    let w = guest.wait_ready().unwrap();
    let qmp = guest.qmp_socket();
    let (before, _) = kernel.read(qmp);
    let pci = info_pci(qmp);
    let pid = Qmp::connect(qmp, std::time::Duration::from_secs(10))
        .unwrap()
        .pid()
        .unwrap();
    let as_found = |when: &str| {
        assert_no_complaint(&guest.console(), &BAD, when);
        let (after, _) = kernel.read(qmp);
        // Bytes the guest's own static keys changed meanwhile are not
        // vmtrace's (seen once on a host at load 16: ten label sites).
        assert_same_but_guest_labels(&before, &after, when);
        assert_no_gdbstub(qmp);
        assert_eq!(info_pci(qmp), pci, "{when}: the ring device stayed");
        assert_eq!(ring_files(pid), Vec::<String>::new(), "{when}");
    };
    guest.send_line("busy 2");
    guest.wait_for("workload: busy 2", COMMAND_TIMEOUT).unwrap();
    let one = |cycle: u64, kind: Kind| {
        let when = format!("cycle {cycle} {}", kind.name());
        let e = attach_cycle(&guest, qmp, &bz, kind, cycle, &when);
        as_found(&when);
        e
    };
    for cycle in 0..CYCLES {
        // Killed while its code is in the device: the repair takes it out
        // of the page tables before the device goes (else this cycle's
        // attach would find a region left mapped).
        if cycle == CYCLES - 2 {
            killed_in_device(&guest, qmp, &bz, pid);
            as_found("after a killed attach with the code in the device and vmtrace detach");
        }
        one(cycle, Kind::ExitlessGraph);
    }
    for cycle in 0..PLAIN_CYCLES {
        one(cycle, Kind::Exitless);
    }
    for cycle in 0..TRAP_CYCLES {
        one(cycle, Kind::TrapGraph);
    }
    assert_runs_on(&guest, w.worker);
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Exitless => "exitless",
            Kind::ExitlessGraph => "exitless --graph",
            Kind::TrapGraph => "trap --graph",
        }
    }
}

/// One attach, `go getpid` while attached, and the detach, checked.
fn attach_cycle(
    guest: &QemuGuest,
    qmp: &std::path::Path,
    bz: &std::path::Path,
    kind: Kind,
    cycle: u64,
    when: &str,
) -> Ended {
    let (mode, glob, graph) = match kind {
        Kind::Exitless => ("exitless", MANY, &[][..]),
        Kind::ExitlessGraph => ("exitless", GRAPH_MANY, &["--graph"][..]),
        Kind::TrapGraph => ("trap", MANY, &["--graph"][..]),
    };
    let args = [
        &["--kernel", s(bz), "--entry", "direct", "--format", "json"][..],
        &["--mode", mode, "--trace", glob],
        graph,
    ]
    .concat();
    let mut a = Attach::start(qmp, &args);
    let line = a.wait_line("vmtrace: attached to QEMU");
    let said = match kind {
        Kind::TrapGraph => "function entries (direct) and at each return address awaited",
        // The free pages hold 63 direct stubs beside the graph's parts.
        Kind::ExitlessGraph => IN_DEVICE,
        Kind::Exitless => "exitless",
    };
    assert!(line.contains(said), "{when}: {line}");
    if kind != Kind::TrapGraph {
        // A preemptible kernel: the journal keeps how a repair walks its
        // tasks, to keep the code while a task switched out inside it
        // would return there.
        let start = journal::start_time(guest.pid()).unwrap();
        let text = std::fs::read_to_string(journal::path_for(guest.pid(), start)).unwrap();
        let record: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(
            record["tasks"]["thread_size"].as_u64().unwrap_or(0) >= 16 << 10,
            "{when}: the journal keeps no task walk: {}",
            record["tasks"]
        );
    }
    // Every call of a trap-mode cycle stops the VM (twice, and its return
    // once more): fewer of them.
    let calls = match kind {
        Kind::TrapGraph => 20 + cycle,
        _ => 50 + 7 * cycle,
    };
    if let Err(e) = guest.go("getpid", calls) {
        panic!("{when}: {e}\n{}", first_complaint(&guest.console()));
    }
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{when}: {}: {}", e.status, e.stderr);
    let detached = match kind {
        Kind::TrapGraph => "breakpoints removed; the guest runs on",
        _ => "vmtrace's code and page-table entries taken out",
    };
    assert!(e.stderr.contains(detached), "{when}: {}", e.stderr);
    let patched = e.json()["sites_patched"].as_u64().unwrap();
    assert!(patched >= MANY_SITES, "{when}: {patched} sites patched");
    assert_eq!(
        count_of(&e.counts(), &GETPID),
        calls,
        "{when}: {}",
        e.stdout
    );
    if kind != Kind::Exitless {
        assert_eq!(returns_of(&e, &GETPID), calls, "{when}: {}", e.stdout);
    }
    e
}

/// How the attached line says the code went in the ring device.
const IN_DEVICE: &str = "vmtrace's code and rings in a hot-plugged ivshmem device";

/// An exitless `--graph` attach over `MANY`, its code in the ring device,
/// killed with its guardian while the workload calls; `vmtrace detach`
/// gives the sites back, takes the region out of the page tables and the
/// device away.
fn killed_in_device(guest: &QemuGuest, qmp: &std::path::Path, bz: &std::path::Path, pid: u32) {
    let args = [
        &["--kernel", s(bz), "--entry", "direct", "--mode", "exitless"][..],
        &["--graph", "--trace", GRAPH_MANY],
    ]
    .concat();
    let mut a = Attach::start(qmp, &args);
    let line = a.wait_line("vmtrace: attached to QEMU");
    assert!(line.contains(IN_DEVICE), "{line}");
    guest.go("getpid", 20).unwrap();
    kill_with_guardian(a);
    assert_eq!(ring_files(pid).len(), 1);
    let err = detach_removes_ring_device(qmp);
    // Its three entries, pointing into the device, cleared.
    assert!(err.contains("3 page-directory entries cleared"), "{err}");
}

/// The returns the report counts for the functions `names` name.
fn returns_of(e: &Ended, names: &[&str]) -> u64 {
    let j = e.json();
    j["functions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| names.contains(&f["name"].as_str().unwrap_or_default()))
        .map(|f| f["returns"].as_u64().unwrap_or(0))
        .sum()
}

/// The console from a little before the kernel's first complaint on.
fn first_complaint(console: &str) -> &str {
    let at = BAD
        .iter()
        .filter_map(|b| console.find(b))
        .min()
        .unwrap_or(0);
    let from = console[..at].rfind('\n').unwrap_or(0);
    let from = console[..from].rfind('\n').unwrap_or(0);
    console
        .get(from..(at + 8000).min(console.len()))
        .unwrap_or(console)
}

/// What a direct attach cannot do is refused in one line (exit 2) before
/// anything is written, the guest running on as found: in exitless mode,
/// more direct entries with the function graph than its room leaves (63;
/// the project's guest takes no ring device, which would hold them).
/// Auto mode traces them in trap mode instead, saying why, with exact
/// counts of calls and returns (it was refused before: trap mode had no
/// direct entries). The project's 6.1 guest and its system calls.
#[test]
fn what_a_direct_attach_cannot_do_is_refused_in_one_line() {
    let (bz, kernel, guest, w, before) = boot_linux(QemuOpts::linux());
    let qmp = guest.qmp_socket();
    let base = ["--kernel", s(&bz), "--entry", "direct", "--duration", "1"];
    let args = ["--mode", "exitless", "--graph", "--trace", "__x64_sys_*"];
    let said = "direct entries with the function graph: its return stubs and frames take the \
                guest's unused memory their stubs would need, and leave room for 63; trace \
                fewer functions, or without the function graph";
    let e = Attach::start(qmp, &[&base[..], &args[..]].concat()).end();
    assert_eq!(e.status.code(), Some(2), "{args:?}: {}", e.stderr);
    let last = e.stderr.trim_end().lines().last().unwrap_or_default();
    assert!(last.contains(said), "{args:?}: {}", e.stderr);
    assert_no_gdbstub(qmp);
    let (after, _) = kernel.read(qmp);
    assert_same(&before, &after, "by a refused direct attach");
    // Auto mode: trap mode where exitless mode has no room.
    let args = ["--format", "json", "--graph", "--trace", "__x64_sys_*"];
    let mut a = Attach::start(qmp, &[&base[..4], &args[..]].concat());
    let line = a.wait_line("vmtrace: attached to QEMU");
    assert!(line.contains("function entries (direct) and at each return address awaited (function graph), trap mode"), "{line}");
    guest.go("getpid", 30).unwrap();
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    assert!(e.stderr.contains("leave room for 63"), "{}", e.stderr);
    assert_eq!(count_of(&e.counts(), &GETPID), 30, "{}", e.stdout);
    assert_eq!(returns_of(&e, &GETPID), 30, "{}", e.stdout);
    let (after, _) = kernel.read(qmp);
    assert_same(&before, &after, "by a direct attach in trap mode");
    assert_no_gdbstub(qmp);
    assert_runs_on(&guest, w.worker);
}

/// The guest's own static-key flips are told from a jump vmtrace left: a
/// label NOP turned into a `jmp` inside the text passes, the same NOP
/// turned into a `jmp` far out of it (where vmtrace's stubs are) fails.
#[test]
fn the_guests_own_label_flips_are_told_from_vmtraces_jumps() {
    let text = |bytes: &[u8]| Memory {
        pieces: vec![(0x100_0000, bytes.to_vec())],
    };
    let mut found = vec![0xccu8; 64];
    found[8..13].copy_from_slice(&[0x0f, 0x1f, 0x44, 0x00, 0x00]);
    found[20..22].copy_from_slice(&[0x66, 0x90]);
    let before = text(&found);
    let mut flipped = found.clone();
    flipped[8..13].copy_from_slice(&[0xe9, 0x10, 0x00, 0x00, 0x00]);
    flipped[20..22].copy_from_slice(&[0xeb, 0x04]);
    assert_eq!(
        assert_same_but_guest_labels(&before, &text(&flipped), "flipped"),
        2
    );
    // And back: the key turned off again.
    assert_eq!(
        assert_same_but_guest_labels(&text(&flipped), &before, "back"),
        2
    );
    let mut left = found.clone();
    left[8..13].copy_from_slice(&[0xe9, 0x00, 0x00, 0x80, 0x7e]);
    let outside = std::panic::catch_unwind(|| {
        assert_same_but_guest_labels(&before, &text(&left), "left");
    });
    assert!(outside.is_err(), "a jump out of the text passed");
}
