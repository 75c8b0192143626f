//! `vmtrace attach --entry direct` on a distribution kernel: Debian's 6.12
//! cloud kernel (guest/build.sh debian-6.12, its vmlinuz alone: symbols
//! from its kallsyms) booted in QEMU/TCG with the workload initramfs and
//! `preempt=full` on one vCPU, busy (`busy 2`: two tasks forking, sleeping
//! on timers and calling getppid and openat, competing with the worker for
//! the vCPU, so that the scheduler preempts them anywhere: in the kernel,
//! in vmtrace's stubs, trampoline and return hook) while vmtrace attaches
//! and detaches direct entries, ten times: over 1,000 functions without the
//! function graph, and 56 with it (all its room in the guest's free pages
//! leaves direct entries). Each cycle: getpid's calls counted exactly, the
//! code taken out only once no task is inside it (a preempted task never
//! returns into removed code), no kernel complaint on the console, every
//! byte of the kernel's text and of the low MiB as found.

mod common;

use common::attach::*;
use common::guard::*;
use common::qemu::*;
use common::s;

/// getpid's function: `__x64_sys_getpid` and `__do_sys_getpid` share an
/// address, and the report names it by one of them.
const GETPID: [&str; 2] = ["__do_sys_getpid", "__x64_sys_getpid"];

/// More than 1,000 functions of Debian's 6.12 cloud kernel, busy ones
/// among them (system calls, forks, timers, the scheduler's clocks).
const MANY: &str = "__x64_sys_*,do_*,vfs_*,ksys_*,copy_*,find_*,tick_*,hrtimer_*,ktime_*";
/// Direct entries `MANY` patches at least (the report's `sites_patched`:
/// 1,192 with the rules of this writing).
const MANY_SITES: u64 = 1000;
/// What fits the function graph in the guest's 604 KiB of free low memory
/// (its frame pool and return stubs take 520 KiB, and leave direct
/// entries the 63 stubs of the return trap's page): the get* system calls
/// (the busy tasks' getppid among them) and the high-resolution timers.
const GRAPH: &str = "__x64_sys_get*,hrtimer_*";

/// Attach/detach cycles, each kind in turn.
const CYCLES: u64 = 10;

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
    guest.send_line("busy 2");
    guest.wait_for("workload: busy 2", COMMAND_TIMEOUT).unwrap();
    for cycle in 0..CYCLES {
        let (glob, graph) = match cycle % 2 {
            0 => (MANY, &[][..]),
            _ => (GRAPH, &["--graph"][..]),
        };
        let when = format!("cycle {cycle} {glob} {graph:?}");
        let args = [
            &["--kernel", s(&bz), "--entry", "direct", "--format", "json"][..],
            &["--mode", "exitless", "--trace", glob],
            graph,
        ]
        .concat();
        let mut a = Attach::start(qmp, &args);
        let line = a.wait_line("vmtrace: attached to QEMU");
        assert!(line.contains("exitless"), "{when}: {line}");
        let calls = 50 + 7 * cycle;
        if let Err(e) = guest.go("getpid", calls) {
            panic!("{when}: {e}\n{}", first_complaint(&guest.console()));
        }
        a.signal(libc::SIGINT);
        let e = a.end();
        assert!(e.status.success(), "{when}: {}: {}", e.status, e.stderr);
        assert!(
            e.stderr
                .contains("vmtrace's code and page-table entries taken out"),
            "{when}: {}",
            e.stderr
        );
        if graph.is_empty() {
            let patched = e.json()["sites_patched"].as_u64().unwrap();
            assert!(patched >= MANY_SITES, "{when}: {patched} sites patched");
        }
        assert_eq!(
            count_of(&e.counts(), &GETPID),
            calls,
            "{when}: {}",
            e.stdout
        );
        let console = guest.console();
        for bad in BAD {
            assert!(
                !console.contains(bad),
                "{when}: {bad:?}:\n{}",
                first_complaint(&console)
            );
        }
        let (after, _) = kernel.read(qmp);
        assert_same(&before, &after, &when);
    }
    assert_no_gdbstub(qmp);
    assert_runs_on(&guest, w.worker);
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
/// anything is written, the guest running on as found: trap mode (its
/// stubs would need vmtrace's code in guest memory), and more direct
/// entries with the function graph than its room leaves (63). The
/// project's 6.1 guest, `hrtimer_*` and the system calls.
#[test]
fn what_a_direct_attach_cannot_do_is_refused_in_one_line() {
    let (bz, kernel, guest, w, before) = boot_linux(QemuOpts::linux());
    let qmp = guest.qmp_socket();
    let base = ["--kernel", s(&bz), "--entry", "direct", "--duration", "1"];
    for (args, said) in [
        (
            &["--mode", "trap", "--trace", "hrtimer_*"][..],
            "direct entries jump to stubs in vmtrace's code in guest memory, and trap mode \
             through the gdbstub puts nothing in guest memory; use --mode exitless, or --entry \
             ftrace",
        ),
        (
            &["--graph", "--trace", "__x64_sys_*"][..],
            "direct entries with the function graph: its return stubs and frames take the \
             guest's unused memory their stubs would need, and leave room for 63; trace fewer \
             functions, or without the function graph",
        ),
    ] {
        let e = Attach::start(qmp, &[&base[..], args].concat()).end();
        assert_eq!(e.status.code(), Some(2), "{args:?}: {}", e.stderr);
        let last = e.stderr.trim_end().lines().last().unwrap_or_default();
        assert!(last.contains(said), "{args:?}: {}", e.stderr);
        assert_no_gdbstub(qmp);
    }
    let (after, _) = kernel.read(qmp);
    assert_same(&before, &after, "by refused direct attaches");
    assert_runs_on(&guest, w.worker);
}
