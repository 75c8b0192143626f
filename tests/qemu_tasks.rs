//! The guest task of each call under `vmtrace attach` (real QEMU/TCG, the
//! workload guest of tests/common/qemu.rs): the worker process, whose pid
//! the guest prints, makes a system call exactly N times; vmtrace names
//! those N calls by the worker's pid, tgid and comm (`wl-worker`), and
//! `--pid` and `--comm` keep exactly the calls they name, the others counted
//! as rejected, in exitless mode (the pid compared by vmtrace's code in the
//! guest) and in trap mode (through gdbstub breakpoints); `--stack` records
//! each call's kernel stack, the syscall path from user mode, in trap mode.

mod common;

use common::attach::*;
use common::qemu::*;
use common::s;

/// getpid's function, by either of its names (they share an address).
const GETPID: [&str; 2] = ["__do_sys_getpid", "__x64_sys_getpid"];
/// The workload's worker's comm (guest/linux/workload.c).
const WORKER: &str = "wl-worker";

/// Attach with `args`, run `go getpid n`, detach: the report's JSON.
fn getpids(guest: &QemuGuest, bz: &str, args: &[&str], n: u64) -> serde_json::Value {
    let base = [
        "--kernel",
        bz,
        "--format",
        "json",
        "--trace",
        "__x64_sys_getpid",
    ];
    let mut a = Attach::start(guest.qmp_socket(), &[&base[..], args].concat());
    let line = a.wait_line("vmtrace: attached to QEMU");
    let mode = if args.contains(&"trap") {
        "trap mode"
    } else {
        "exitless"
    };
    assert!(line.contains(mode), "{line}");
    guest.go("getpid", n).unwrap();
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    let v = e.json();
    assert_eq!(v["dropped"], 0, "{v}");
    v
}

/// The report's count of getpid (0 when no call was kept).
fn count(v: &serde_json::Value) -> u64 {
    v["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| GETPID.contains(&f["name"].as_str().unwrap()))
        .map_or(0, |f| f["count"].as_u64().unwrap())
}

/// The one task the report names, with its calls.
fn only_task(v: &serde_json::Value) -> (u64, u64, String, u64) {
    let tasks = v["tasks"]
        .as_array()
        .unwrap_or_else(|| panic!("no tasks: {v}"));
    assert_eq!(tasks.len(), 1, "{v}");
    let t = &tasks[0];
    (
        t["pid"].as_u64().unwrap(),
        t["tgid"].as_u64().unwrap(),
        t["comm"].as_str().unwrap().to_string(),
        t["count"].as_u64().unwrap(),
    )
}

#[test]
fn attach_names_the_worker_and_filters_by_pid_and_comm() {
    let (bz, _) = common::linux_61();
    let guest = QemuGuest::boot(QemuOpts::linux());
    let w = guest.wait_ready().unwrap();
    let worker = u64::from(w.worker);
    let pid = w.worker.to_string();

    // Exitless (auto, under QEMU): every call the worker's, by its name.
    let v = getpids(&guest, s(&bz), &[], 300);
    assert_eq!(v["mode"], "exitless", "{v}");
    assert_eq!(count(&v), 300, "{v}");
    assert_eq!(only_task(&v), (worker, worker, WORKER.into(), 300));
    assert_eq!(v["filtered"], 0, "{v}");

    // --pid of the worker keeps them all; of init (pid 1), none: the
    // trampoline rejected each, and counted it.
    let v = getpids(&guest, s(&bz), &["--pid", &pid], 120);
    assert_eq!((count(&v), &v["filtered"]), (120, &0.into()), "{v}");
    assert_eq!(only_task(&v).3, 120);
    let v = getpids(&guest, s(&bz), &["--pid", "1"], 80);
    assert_eq!((count(&v), &v["filtered"]), (0, &80.into()), "{v}");
    assert!(
        v["tasks_source"]
            .as_str()
            .unwrap()
            .ends_with("kept only pid 1"),
        "{v}"
    );

    // Trap mode, through gdbstub breakpoints: the task read at each stop.
    let trap = ["--mode", "trap"];
    let v = getpids(
        &guest,
        s(&bz),
        &[&trap[..], &["--comm", "wl-*"]].concat(),
        40,
    );
    assert_eq!(v["mode"], "trap", "{v}");
    assert_eq!(only_task(&v), (worker, worker, WORKER.into(), 40));
    let v = getpids(
        &guest,
        s(&bz),
        &[&trap[..], &["--comm", "nobody"]].concat(),
        30,
    );
    assert_eq!((count(&v), &v["filtered"]), (0, &30.into()), "{v}");
}

/// `openat` of a missing path, N times by the worker: N calls of
/// `do_sys_openat2` by the worker, each with the same user pointer as its
/// `filename` argument (named from the kernel's BTF) and each returning
/// -2, named `-ENOENT` (`--args --graph --retval`), in exitless mode (the
/// trampoline records the argument registers and RAX); `--pid` keeps only
/// the worker's.
#[test]
fn attach_records_arguments_and_errno_return_values() {
    const N: u64 = 60;
    let (bz, _) = common::linux_61();
    let guest = QemuGuest::boot(QemuOpts::linux());
    let w = guest.wait_ready().unwrap();
    let dir = common::scratch_in("qemu-tasks", "values");
    let data = dir.join("openat.data");
    let pid = w.worker.to_string();
    let args = [
        "--kernel",
        s(&bz),
        "--trace",
        "do_sys_openat2",
        "--graph",
        "--args",
        "--retval",
        "--pid",
        &pid,
        "-o",
        s(&data),
    ];
    let mut a = Attach::start(guest.qmp_socket(), &args);
    let line = a.wait_line("vmtrace: attached to QEMU");
    assert!(line.contains("exitless"), "{line}");
    guest.go("openat", N).unwrap();
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    let script = std::process::Command::new(env!("CARGO_BIN_EXE_vmtrace"))
        .args(["script", s(&data)])
        .output()
        .unwrap();
    assert!(script.status.success());
    let text = String::from_utf8_lossy(&script.stdout);
    let me = format!("{WORKER}-{pid}");
    let (mut calls, mut returns) = (Vec::new(), 0);
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        assert!(l.trim_start().starts_with(&me), "another task: {l}");
        if let Some(rest) = l.split("do_sys_openat2(").nth(1) {
            let filename = rest
                .split(", ")
                .find_map(|a| a.strip_prefix("filename=0x"))
                .unwrap_or_else(|| panic!("no filename argument: {l}"));
            assert!(rest.starts_with("dfd=-100, "), "AT_FDCWD: {l}");
            calls.push(filename.to_string());
        } else {
            assert!(l.ends_with("ret=-2 (-ENOENT)"), "{l}");
            returns += 1;
        }
    }
    assert_eq!((calls.len() as u64, returns), (N, N), "{text}");
    assert!(calls.iter().all(|f| f == &calls[0]), "one path: {calls:?}");
    // `attach -o` keeps its command line in the data file, as `record`
    // does (tests/record_cli.rs checks how it is shown).
    let json = std::process::Command::new(env!("CARGO_BIN_EXE_vmtrace"))
        .args(["report", s(&data), "--format", "json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let head = [env!("CARGO_BIN_EXE_vmtrace"), "attach", "--qmp"];
    let argv: Vec<&str> = head
        .into_iter()
        .chain([s(guest.qmp_socket()), "-q"])
        .chain(args)
        .collect();
    assert_eq!(v["cmdline"], serde_json::json!(argv));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The kernel stack at each entry of `do_sys_openat2` in this guest's 6.1
/// kernel, innermost first (its callers' return addresses, as its own
/// `dump_stack()` would list them): `entry_SYSCALL_64` (arch/x86/entry/
/// entry_64.S, past its inner label `entry_SYSCALL_64_after_hwframe`, a
/// 0-size symbol) saved the user registers and called `do_syscall_64`,
/// which (`do_syscall_x64` inlined) called 6.1.192's `x64_sys_call`
/// (arch/x86/entry/syscall_64.c: a switch on the number), which tail-jumps
/// to `__x64_sys_openat` (fs/open.c's SYSCALL_DEFINE4(openat)), which
/// tail-jumps to `do_sys_open`: neither jump leaves a return address, so
/// neither is in the stack. `do_sys_open` calls `do_sys_openat2`.
const OPENAT_CHAIN: [&str; 3] = ["do_sys_open", "do_syscall_64", "entry_SYSCALL_64"];

/// The JSON report of a `--stack do_sys_openat2` run in which the worker
/// made `n` openat calls: exactly those calls, all on one stack, whose
/// frames are all named, that reached the worker's user-mode registers,
/// and whose chain is [`OPENAT_CHAIN`]; that stack's frames as `script`
/// prints them (` => function+0xoffset`).
fn openat_stacks(v: &serde_json::Value, worker: u64, n: u64) -> Vec<String> {
    assert_eq!(v["mode"], "trap", "{v}");
    assert_eq!(v["dropped"], 0, "{v}");
    assert_eq!(only_task(v), (worker, worker, WORKER.into(), n));
    let functions = v["functions"].as_array().unwrap();
    assert_eq!(functions.len(), 1, "{v}");
    let f = &functions[0];
    assert_eq!(
        (&f["name"], &f["count"]),
        (&"do_sys_openat2".into(), &n.into())
    );
    // One path for every call: one stack, carried by each.
    let used = f["stacks"].as_array().unwrap_or_else(|| panic!("{f}"));
    assert_eq!(used.len(), 1, "{f}");
    assert_eq!(used[0]["count"], n, "{f}");
    let stacks = v["stacks"].as_array().unwrap_or_else(|| panic!("{v}"));
    assert_eq!(stacks.len(), 1, "only the worker's calls: {v}");
    let st = &stacks[0];
    assert_eq!((&st["id"], &used[0]["id"]), (&1.into(), &1.into()), "{v}");
    assert_eq!(
        (&st["end"], &st["complete"]),
        (&"user".into(), &true.into())
    );
    let frames = st["frames"].as_array().unwrap();
    let chain: Vec<&str> = frames
        .iter()
        .map(|fr| fr["function"].as_str().unwrap_or_else(|| panic!("{fr}")))
        .collect();
    assert_eq!(chain, OPENAT_CHAIN, "{st}");
    frames
        .iter()
        .map(|fr| {
            let off = fr["offset"].as_u64().unwrap();
            assert!(off > 0, "a return address is past its call: {fr}");
            format!(" => {}+{off:#x}", fr["function"].as_str().unwrap())
        })
        .collect()
}

/// `--stack do_sys_openat2` under QEMU: the worker's N `openat` calls,
/// each with the kernel stack unwound at its breakpoint stop (ORC), the
/// syscall path down to the user-mode registers, in the report and in
/// `script`; `--mode auto` traces stacks in trap mode and says why;
/// `--mode exitless` is refused (bad input, one line naming `--mode trap`)
/// and leaves the guest running.
#[test]
fn attach_records_the_kernel_stack_of_each_call() {
    const N: u64 = 30;
    let (bz, _) = common::linux_61();
    let guest = QemuGuest::boot(QemuOpts::linux());
    let w = guest.wait_ready().unwrap();
    let worker = u64::from(w.worker);
    let pid = w.worker.to_string();
    let stack = [
        "--kernel",
        s(&bz),
        "--format",
        "json",
        "--trace",
        "do_sys_openat2",
        "--stack",
        "do_sys_openat2",
        "--pid",
        &pid,
    ];

    let exitless = [&stack[..], &["--mode", "exitless"]].concat();
    let e = Attach::start(guest.qmp_socket(), &exitless).end();
    assert_eq!(e.status.code(), Some(2), "{}", e.stderr);
    assert_eq!(
        e.stderr,
        "vmtrace: kernel stacks are unwound while a breakpoint holds the guest, and exitless \
         calls never stop it; use --mode trap"
    );

    // Trap mode, with a data file for `script`.
    let dir = common::scratch_in("qemu-tasks", "stacks");
    let data = dir.join("openat.data");
    let trap = [&stack[..], &["--mode", "trap", "-o", s(&data)]].concat();
    let mut a = Attach::start(guest.qmp_socket(), &trap);
    let line = a.wait_line("vmtrace: attached to QEMU");
    assert!(line.contains("trap mode"), "{line}");
    guest.go("openat", N).unwrap();
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    let frames = openat_stacks(&e.json(), worker, N);

    // `script`: each entry, then `<stack trace>` and the same frames.
    let script = std::process::Command::new(env!("CARGO_BIN_EXE_vmtrace"))
        .args(["script", s(&data)])
        .output()
        .unwrap();
    assert!(script.status.success());
    let text = String::from_utf8_lossy(&script.stdout);
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    let each = 2 + frames.len();
    assert_eq!(lines.len() as u64, N * each as u64, "{text}");
    let me = format!("{WORKER}-{pid}");
    for call in lines.chunks(each) {
        assert!(call[0].trim_start().starts_with(&me), "{text}");
        assert!(
            call[0].ends_with(": do_sys_openat2 <-do_sys_open"),
            "{text}"
        );
        assert!(call[1].trim_start().starts_with(&me), "{text}");
        assert!(call[1].ends_with(": <stack trace>"), "{text}");
        assert_eq!(call[2..], frames[..], "{text}");
    }
    let _ = std::fs::remove_dir_all(&dir);

    // Auto mode: trap mode, for the stacks, said as the reason.
    let mut a = Attach::start(guest.qmp_socket(), &stack);
    let line = a.wait_line("vmtrace: attached to QEMU");
    assert!(line.contains("trap mode"), "{line}");
    let note = a.wait_line("tracing through gdbstub breakpoints instead");
    assert!(
        note.starts_with(
            "vmtrace: kernel stacks are unwound at breakpoint stops: tracing through gdbstub \
             breakpoints instead"
        ),
        "{note}"
    );
    guest.go("openat", N).unwrap();
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    openat_stacks(&e.json(), worker, N);
}
