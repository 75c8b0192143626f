//! The guest's own ftrace keeps working while vmtrace traces it (issue 34,
//! item 12): the default 6.1 guest in QEMU/TCG turns its function tracer
//! on and off (the workload's `ftrace` commands, through tracefs) while
//! `vmtrace attach` traces `__x64_sys_getpid`, and in the reverse order.
//! Its ftrace never meets vmtrace's call at a site (no `ftrace bug`, no
//! WARNING), refuses the functions vmtrace traces meanwhile, traces them
//! again after the detach; vmtrace's counts are exact and the guest's
//! memory is as it was. Also: the kernels' record layout read from BTF.

mod common;

use common::attach::*;
use common::guard::*;
use common::qemu::*;
use common::s;
use tracer::kernel::btf::KernelBtf;
use tracer::kernel::ftrace_records::{FtraceRecords, RecordLayout};
use tracer::kernel::symbols::KernelImage;

const GETPID: [&str; 2] = ["__do_sys_getpid", "__x64_sys_getpid"];
const GETPPID: [&str; 2] = ["__do_sys_getppid", "__x64_sys_getppid"];
/// What `set_ftrace_filter` answers for a function whose record is
/// disabled (`match_records` skips it): -EINVAL.
const EXCLUDED: &str = "-22";

/// The record layout and flags of a kernel, from its vmlinux and BTF.
fn layout(vmlinux: &std::path::Path) -> RecordLayout {
    let image = KernelImage::load(vmlinux).unwrap();
    let btf = KernelBtf::from_image(&image).unwrap();
    FtraceRecords::find(&image, Some(&btf)).unwrap().layout
}

#[test]
fn record_layouts_come_from_btf() {
    let (_, vmlinux) = common::linux_61();
    let l = layout(&vmlinux);
    // include/linux/ftrace.h of 6.1.
    assert_eq!((l.disabled, l.enabled), (1 << 25, 1 << 31));
    assert_eq!(l.ref_max, (1 << 23) - 1);
    assert_eq!((l.rec_size, l.rec_ip, l.rec_flags), (16, 0, 8));
    assert_eq!(
        (l.pg_next, l.pg_records, l.pg_index, l.mutex_owner),
        (0, 8, 16, 0)
    );
    if let Some((_, vmlinux)) = common::linux_612() {
        // 6.12: the same flag, a count of 19 bits.
        let l = layout(&vmlinux);
        assert_eq!((l.disabled, l.ref_max), (1 << 25, (1 << 19) - 1));
    }
}

/// `ftrace COMMAND` to the workload; its answer line.
fn ftrace(guest: &QemuGuest, command: &str) -> String {
    guest.send_line(&format!("ftrace {command}"));
    let word = command.split(' ').next().unwrap();
    guest
        .wait_for(&format!("workload: ftrace {word}"), COMMAND_TIMEOUT)
        .unwrap()
}

/// The guest's function tracer counted `n` calls of `func`.
fn assert_hits(guest: &QemuGuest, func: &str, n: u64) {
    let line = ftrace(guest, &format!("hits {func}"));
    assert_eq!(
        line,
        format!("workload: ftrace hits {func} {n}"),
        "{}",
        guest.console()
    );
}

/// The guest's own tracer works on `func` (`syscall` calls it): on, `n`
/// calls seen, listed in enabled_functions, off.
fn assert_guest_traces(guest: &QemuGuest, func: &str, syscall: &str) {
    let on = ftrace(guest, &format!("on {func}"));
    assert_eq!(on, format!("workload: ftrace on {func}=0 tracer=0"));
    guest.go(syscall, 7).unwrap();
    assert_hits(guest, func, 7);
    let enabled = ftrace(guest, "enabled");
    assert!(enabled.contains(func), "{enabled}");
    assert_eq!(
        ftrace(guest, "off"),
        "workload: ftrace off tracer=0 filter=0"
    );
}

/// The name the guest's ftrace knows a function by, of its two aliases
/// (`names`: they share an address, and kallsyms names it once): the one
/// `set_ftrace_filter` takes.
fn ftrace_name(guest: &QemuGuest, names: [&'static str; 2]) -> &'static str {
    let on = ftrace(guest, &format!("on {} {}", names[0], names[1]));
    let name = names
        .into_iter()
        .find(|n| on.contains(&format!(" {n}=0 ")))
        .unwrap_or_else(|| panic!("{on}"));
    assert_eq!(
        ftrace(guest, "off"),
        "workload: ftrace off tracer=0 filter=0"
    );
    name
}

/// Ctrl-C, a clean detach with nothing left excluded, the counts.
fn detach(a: Attach) -> Ended {
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    assert!(
        e.stderr.contains("vmtrace: detached (signal 2): "),
        "{}",
        e.stderr
    );
    assert!(!e.stderr.contains("stay excluded"), "{}", e.stderr);
    assert_eq!(e.json()["dropped"], 0, "{}", e.stdout);
    e
}

/// vmtrace attached with `args` (tracing getpid) while the guest's own
/// function tracer is turned on for getpid and getppid (`names`, its
/// names for them): it may not have getpid (vmtrace's: excluded), has
/// getppid; `calls` of each are made, the guest's tracer sees exactly the
/// getppid ones, is turned off, and vmtrace detaches having counted every
/// getpid.
fn beside_the_guests_ftrace(
    guest: &QemuGuest,
    args: &[&str],
    (pid, ppid): (&str, &str),
    (getpids, getppids): (u64, u64),
) -> Ended {
    let a = Attach::start(guest.qmp_socket(), args).attached();
    let on = ftrace(guest, &format!("on {pid} {ppid}"));
    assert_eq!(
        on,
        format!("workload: ftrace on {pid}={EXCLUDED} {ppid}=0 tracer=0")
    );
    guest.go("getpid", getpids).unwrap();
    guest.go("getppid", getppids).unwrap();
    assert_hits(guest, ppid, getppids);
    assert_hits(guest, pid, 0);
    assert_eq!(
        ftrace(guest, "off"),
        "workload: ftrace off tracer=0 filter=0"
    );
    let e = detach(a);
    assert_eq!(count_of(&e.counts(), &GETPID), getpids, "{}", e.stdout);
    e
}

/// The 6.1 guest booted with its own tracer turned on and off once (the
/// guest's ftrace settles its own code, ftrace_caller's call, as it stays
/// after any later use) and tracing getppid: the bzImage, the kernel, the
/// guest, its workload, and the guest's names for getpid and getppid.
fn settled_guest() -> (
    std::path::PathBuf,
    Kernel,
    QemuGuest,
    Workload,
    (&'static str, &'static str),
) {
    let (bz, vmlinux) = common::linux_61();
    let kernel = Kernel::new(&vmlinux);
    let guest = QemuGuest::boot(QemuOpts::linux());
    let w = guest.wait_ready().unwrap();
    let (pid, ppid) = (ftrace_name(&guest, GETPID), ftrace_name(&guest, GETPPID));
    assert_guest_traces(&guest, ppid, "getppid");
    (bz, kernel, guest, w, (pid, ppid))
}

#[test]
fn the_guests_own_function_tracer_works_around_an_attach() {
    let (bz, kernel, guest, w, (pid, ppid)) = settled_guest();
    let qmp = guest.qmp_socket();
    let (before, _) = kernel.read(qmp);
    let base = ["--kernel", s(&bz), "--format", "json"];

    // The guest's tracer on while vmtrace traces getpid: it may not have
    // getpid (vmtrace's), has getppid; off again before the detach.
    let args = [&base[..], &["--trace", "__x64_sys_getpid"]].concat();
    let e = beside_the_guests_ftrace(&guest, &args, (pid, ppid), (300, 20));
    let counts = e.counts();
    assert_eq!(counts.len(), 1, "{counts:?}");
    let (after, _) = kernel.read(qmp);
    assert_same(&before, &after, "by an attach the guest's ftrace ran under");
    // getpid's record is the guest's again.
    assert_guest_traces(&guest, pid, "getpid");
    assert_runs_on(&guest, w.worker);

    // The reverse: the guest's tracer on getpid before the attach (vmtrace
    // leaves getpid out, traces getppid), off during it.
    let on = ftrace(&guest, &format!("on {pid}"));
    assert_eq!(on, format!("workload: ftrace on {pid}=0 tracer=0"));
    let trace = ["--trace", "__x64_sys_getpid,__x64_sys_getppid"];
    let mut a = Attach::start(qmp, &[&base[..], &trace].concat()).attached();
    a.wait_line("1 selected functions are in use by the guest's own ftrace: left out");
    guest.go("getpid", 5).unwrap();
    assert_hits(&guest, pid, 5);
    assert_eq!(
        ftrace(&guest, "off"),
        "workload: ftrace off tracer=0 filter=0"
    );
    let on = ftrace(&guest, &format!("on {ppid}"));
    assert_eq!(
        on,
        format!("workload: ftrace on {ppid}={EXCLUDED} tracer=off")
    );
    guest.go("getppid", 40).unwrap();
    guest.go("getpid", 9).unwrap();
    let e = detach(a);
    let counts = e.counts();
    assert_eq!(count_of(&counts, &GETPPID), 40, "{counts:?}");
    // getpid was selected, not patched: listed with no call.
    assert_eq!(counts.values().sum::<u64>(), 40, "{counts:?}");
    assert_eq!(e.json()["sites_patched"], 1, "{}", e.stdout);
    let (after, _) = kernel.read(qmp);
    assert_same(&before, &after, "by an attach beside the guest's ftrace");
    assert_guest_traces(&guest, ppid, "getppid");
    assert_guest_traces(&guest, pid, "getpid");
    assert_runs_on(&guest, w.worker);
}

/// Issue 35, item 5: a direct entry that displaces a function's ftrace NOP
/// puts vmtrace's jump where the guest's ftrace expects its NOP, so its
/// record is marked as an ftrace site's is: the guest's tracer refuses
/// getpid while vmtrace traces it by direct entry (no `ftrace bug` when it
/// is turned on), traces getppid beside it, and has getpid back after the
/// detach.
#[test]
fn a_direct_entry_over_the_ftrace_nop_is_kept_from_the_guests_ftrace() {
    let (bz, kernel, guest, w, (pid, ppid)) = settled_guest();
    let qmp = guest.qmp_socket();
    let (before, _) = kernel.read(qmp);
    let args = [
        "--kernel",
        s(&bz),
        "--format",
        "json",
        "--entry",
        "direct",
        "--trace",
        "__x64_sys_getpid",
    ];
    beside_the_guests_ftrace(&guest, &args, (pid, ppid), (60, 11));
    let (after, _) = kernel.read(qmp);
    assert_same(
        &before,
        &after,
        "by a direct entry the guest's ftrace ran beside",
    );
    assert_guest_traces(&guest, pid, "getpid");
    assert_runs_on(&guest, w.worker);
}
