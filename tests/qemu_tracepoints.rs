//! `vmtrace attach -e`: the kernel's tracepoints traced from the host in
//! Debian's 6.12 cloud kernel (jump labels, KASLR, static calls) under
//! QEMU/TCG with the workload: while attached, each selected event's call
//! site holds vmtrace's jump (the kernel's own JMP, over its NOP) and trap
//! mode passes its `tp->funcs` test; exactly one `sched_process_fork` per
//! fork and one `task_rename` per rename, their fields as ftrace computes
//! them (child pids those the guest prints), and `sched_switch` lines in
//! `script` and the JSON report whose fields are the tasks that switched,
//! and Debian's `trace-cmd report` of the trace.dat export printing each
//! event's fields as `script` does, with the ids the guest gave them;
//! after the detach the kernel's text is as found, the guest runs on, and
//! its console has no BUG or
//! WARNING (jump_label's checks); a killed attach's guardian restores them
//! from the journal; the guest enabling and disabling a traced event itself
//! meanwhile keeps working. Trap mode (auto mode's choice for such events), whose
//! only writes to the guest are those jumps. The syscall events
//! (`syscalls:sys_enter_*`, `sys_exit_*`), recorded at the syscalls'
//! functions, in trap and exitless modes: exact counts, the return values
//! and arguments the workload's syscalls have, trace-cmd's lines.

mod common;
#[path = "qemu_tracepoints/syscalls.rs"]
mod syscalls;

use std::time::Duration;

use common::attach::*;
use common::guard::*;
use common::qemu::*;
use common::s;

/// How long one workload command may take. Under TCG on a shared host, with
/// every sched_switch and sched_wakeup stopping the guest in trap mode, a
/// step that takes seconds alone took over a minute beside CI's other
/// lane; only a hang should use all of this.
const GUEST_STEP: Duration = Duration::from_secs(300);

/// The first byte of the kernel's NOPs and of the JMP of the same length
/// (arch/x86/kernel/jump_label.c: `0f 1f 44 00 00` / `e9 rel32`,
/// `66 90` / `eb rel8`).
const NOP_TO_JMP: [(u8, u8); 2] = [(0x0f, 0xe9), (0x66, 0xeb)];

/// The tracepoint events whose lines `check_trace_cmd_report` compares.
const SCHED: [&str; 4] = [
    "sched_switch",
    "sched_wakeup",
    "sched_process_fork",
    "task_rename",
];

/// The pids of `workload: forked K pids=P1,P2,... pid=W`.
fn forked_pids(line: &str) -> Vec<u64> {
    let list = line
        .split("pids=")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap();
    list.split(',').map(|p| p.parse().unwrap()).collect()
}

/// The JSON report's records of `event` (`trace_events`).
fn records<'a>(doc: &'a serde_json::Value, event: &str) -> &'a Vec<serde_json::Value> {
    let events = doc["trace_events"].as_array().expect("trace_events");
    let e = events.iter().find(|e| e["event"] == event).expect(event);
    e["records"].as_array().unwrap()
}

/// The fields of sched_process_fork and task_rename, as ftrace computes
/// them: one fork per child, the worker its parent, the children's pids
/// those the guest printed (its last three forks); one rename to
/// `wl-child` per child, by the child itself.
fn check_fork_and_rename_fields(doc: &serde_json::Value, worker: u32, printed: &[u64]) {
    let forks = records(doc, "sched:sched_process_fork");
    assert_eq!(forks.len(), 6, "{forks:?}");
    for f in forks {
        let v = &f["fields"];
        assert_eq!(v["parent_pid"], worker, "{f}");
        assert_eq!(v["parent_comm"], "wl-worker", "{f}");
        assert_eq!(v["child_comm"], "wl-worker", "{f}");
    }
    let children: Vec<u64> = forks[3..]
        .iter()
        .map(|f| f["fields"]["child_pid"].as_u64().unwrap())
        .collect();
    assert_eq!(children, printed, "{forks:?}");
    let renames = records(doc, "task:task_rename");
    for &child in printed {
        let by: Vec<_> = renames
            .iter()
            .filter(|r| r["fields"]["pid"].as_u64() == Some(child))
            .collect();
        assert_eq!(by.len(), 1, "{renames:?}");
        assert_eq!(by[0]["fields"]["newcomm"], "wl-child", "{by:?}");
        assert_eq!(by[0]["fields"]["oldcomm"], "wl-worker", "{by:?}");
    }
}

/// ftrace's task state letters of sched_switch's `prev_state`.
const STATES: [&str; 10] = ["R", "R+", "S", "D", "T", "t", "X", "Z", "P", "I"];

/// `name=value` of a script line's fields.
fn field<'a>(line: &'a str, name: &str) -> &'a str {
    let at = line
        .find(&format!(" {name}="))
        .unwrap_or_else(|| panic!("{name} in {line}"));
    line[at + name.len() + 2..].split(' ').next().unwrap()
}

/// `-e sched:sched_switch` (every task's) in data file `data`, shown by
/// `script` and the JSON report: each line as ftrace prints it, its
/// `prev` the task that ran the event, the next switch on that CPU from
/// the task this one switched to, `prev_state` one of ftrace's letters;
/// the worker among the tasks, by its pid and comm.
fn check_sched_switch(data: &std::path::Path, worker: u32) {
    let script = common::vmtrace(&["script", s(data)]);
    let text = common::stdout(&script);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(": sched_switch: "))
        .collect();
    assert!(lines.len() >= 4, "{text}");
    // By CPU: the task each switch went to.
    let mut next_on: std::collections::HashMap<String, String> = Default::default();
    let mut worker_seen = false;
    for l in &lines {
        let task = l.trim_start().split(' ').next().unwrap();
        let at = l.find(" [").unwrap();
        let cpu = l[at..at + 6].to_string();
        let (prev_pid, prev_comm) = (field(l, "prev_pid"), field(l, "prev_comm"));
        let running = match prev_pid {
            "0" => "<idle>-0".to_string(),
            pid => format!("{prev_comm}-{pid}"),
        };
        assert_eq!(task, running, "{l}");
        assert!(STATES.contains(&field(l, "prev_state")), "{l}");
        if let Some(want) = next_on.get(&cpu) {
            assert_eq!(prev_pid, want, "{l}");
        }
        assert!(l.contains(" ==> next_comm="), "{l}");
        next_on.insert(cpu, field(l, "next_pid").to_string());
        worker_seen |= prev_pid == worker.to_string() && prev_comm == "wl-worker";
    }
    assert!(worker_seen, "{text}");
    let report = common::vmtrace(&["report", s(data), "--format", "json"]);
    let doc: serde_json::Value = serde_json::from_str(&common::stdout(&report)).unwrap();
    let switches = records(&doc, "sched:sched_switch");
    assert_eq!(switches.len(), lines.len());
    for r in switches {
        assert_eq!(r["pid"], r["fields"]["prev_pid"], "{r}");
    }
}

/// Each event line's `EVENT: fields` part (after the task, CPU and time)
/// of `text`, one of `events`, sorted.
fn event_parts(text: &str, events: &[&str]) -> Vec<String> {
    let mut parts: Vec<String> = text
        .lines()
        .filter_map(|l| {
            let at = events
                .iter()
                .filter_map(|e| l.find(&format!(": {e}:")))
                .min()?;
            let (name, fields) = l[at + 2..].split_once(':')?;
            Some(format!("{name}: {}", fields.trim()))
        })
        .collect();
    parts.sort();
    parts
}

/// trace.dat from data file `data` (`report --export`), read by Debian's
/// `trace-cmd report -N` (no plugins: its sched plugin prints switches its
/// own short way): every event line has the fields `script` prints
/// for the same event, and the events `present` are there.
fn check_trace_cmd_report(data: &std::path::Path, events: &[&str], present: &[&str]) {
    let dat = data.with_extension("dat");
    let arg = format!("trace.dat={}", dat.display());
    let o = common::vmtrace(&["report", s(data), "--export", &arg]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let tc = std::process::Command::new("trace-cmd")
        .args(["report", "-N", "-i"])
        .arg(&dat)
        .output()
        .expect("trace-cmd is not installed: apt-get install trace-cmd (CI's .ci/run does)");
    let stderr = String::from_utf8_lossy(&tc.stderr);
    assert!(tc.status.success() && stderr.trim().is_empty(), "{stderr}");
    let report = event_parts(&String::from_utf8_lossy(&tc.stdout), events);
    let script = event_parts(
        &common::stdout(&common::vmtrace(&["script", s(data)])),
        events,
    );
    assert_eq!(report, script);
    for e in present {
        let n = report
            .iter()
            .filter(|l| l.starts_with(&format!("{e}: ")))
            .count();
        assert!(n > 0, "no {e} in {report:?}");
    }
}

#[test]
fn event_sites_are_jumps_while_attached_and_nops_after() {
    let bz = debian_612();
    let kernel = Kernel::from_bzimage(&bz);
    let guest = QemuGuest::boot(QemuOpts {
        kernel: bz.clone(),
        ..QemuOpts::linux()
    });
    let w = guest.wait_ready().unwrap();
    let qmp = guest.qmp_socket();
    let watch = kernel.watch(qmp);
    let before = watch.read();
    let dir = common::scratch_in("tp-switch", "data");
    let forks = dir.join("forks.vmtrace");
    let args = [
        "--kernel",
        s(&bz),
        "-o",
        s(&forks),
        "--format",
        "json",
        "-e",
        "sched:sched_process_fork,task:task_rename",
        // The workload's tasks only: the guest's kernel threads fork too.
        "--comm",
        "wl-*",
    ];
    let mut a = Attach::start(qmp, &args);
    // Auto mode: breakpoints pass the events' `tp->funcs` tests.
    let line = a.wait_line("vmtrace: attached to QEMU");
    assert!(line.contains("trap mode"), "{line}");
    a.wait_line("kernel with static calls are recorded at breakpoint stops");
    let line = a.wait_line("call sites of the events enabled");
    assert!(line.starts_with("vmtrace: 2 call sites"), "{line}");
    let during = watch.read();
    // The events' code runs with the sites enabled: forks and renames.
    guest.send_line("spawn 1 3");
    guest.wait_for("workload: spawned 1", GUEST_STEP).unwrap();
    guest.send_line("rename 2");
    guest.wait_for("workload: renamed 2", GUEST_STEP).unwrap();
    // Three more children, whose pids the guest prints.
    let (printed, e) = pids_then_detach(&guest, a, "forks 3", "workload: forked 3 pids=");
    // One call site each (kernel_clone, __set_task_comm): a NOP made a JMP.
    let changed = diffs(&before, &during);
    let opcodes = changed.iter().filter(|d| NOP_TO_JMP.contains(&(d.1, d.2)));
    assert_eq!(opcodes.count(), 2, "{changed:x?}");
    assert!(changed.len() <= 2 * 5, "{changed:x?}");
    assert!(!e.stderr.contains("not recorded yet"), "{}", e.stderr);
    // One fork per child; a rename per child (wl-child) and per `rename`
    // step of the worker's, and its rename back.
    let counts = e.counts();
    let fork = count_of(&counts, &["__traceiter_sched_process_fork"]);
    let rename = count_of(&counts, &["__traceiter_task_rename"]);
    assert_eq!((fork, rename), (3 + 3, 3 + 2 + 1 + 3), "{}", e.stdout);
    check_fork_and_rename_fields(&e.json(), w.worker, &printed);
    check_trace_cmd_report(&forks, &SCHED, &["sched_process_fork", "task_rename"]);
    assert_same(&before, &watch.read(), "by a trace of events");
    assert_no_gdbstub(qmp);
    assert_runs_on(&guest, w.worker);
    // Killed while attached: its guardian gives the sites back their NOPs
    // from the journal, and takes the breakpoints out.
    let mut a = Attach::start(qmp, &args);
    a.wait_line("call sites of the events enabled");
    a.signal(libc::SIGKILL);
    let e = a.end();
    for n in [
        "2 event call sites given back their NOP",
        "vmtrace: repaired; the VM is as vmtrace would leave it",
    ] {
        assert!(e.stderr.contains(n), "{n:?} in {}", e.stderr);
    }
    assert_same(
        &before,
        &watch.read(),
        "after a killed attach, by its guardian",
    );
    assert_no_gdbstub(qmp);
    assert_runs_on(&guest, w.worker);
    // Every task's sched_switch and sched_wakeup, into a data file, while
    // the workload spawns.
    let data = dir.join("switch.vmtrace");
    let args = [
        "--kernel",
        s(&bz),
        "-e",
        "sched:sched_switch,sched:sched_wakeup,task:task_rename",
        "-o",
        s(&data),
    ];
    let mut a = Attach::start(qmp, &args);
    a.wait_line("call sites of the events enabled");
    for _ in 0..2 {
        guest.send_line("spawn 1 1");
        guest.wait_for("workload: spawned 1", GUEST_STEP).unwrap();
    }
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    assert_same(&before, &watch.read(), "after the sched_switch attach");
    // The guest enables a traced event itself, and disables it: its
    // jump_label finds the jump it writes, then its own (vmtrace's call
    // for its site returns at once), and the detach leaves what it did.
    // Enabling it also registers ftrace's own probe on sched_switch (its
    // comm cache), the event's only one: its static call, kept on
    // __traceiter_sched_switch, still reaches vmtrace's breakpoint, and
    // every child forked meanwhile is seen switched to. Disabling it gives
    // both sites back to vmtrace (the kernel finds what it expects), and
    // both events are still recorded: every fork, every child switched to.
    let fork_data = dir.join("fork.vmtrace");
    let args = [
        "--kernel",
        s(&bz),
        "-e",
        "sched:sched_process_fork,sched:sched_switch",
        "-o",
        s(&fork_data),
    ];
    let mut a = Attach::start(qmp, &args);
    let line = a.wait_line("call sites of the events enabled");
    assert!(line.contains("the guest may enable these events"), "{line}");
    let mut children = Vec::new();
    for on in ["1", "0"] {
        guest.send_line(&format!("ftrace event sched:sched_process_fork {on}"));
        guest
            .wait_for(
                "workload: ftrace event sched:sched_process_fork=0",
                GUEST_STEP,
            )
            .unwrap();
        guest.send_line("forks 2");
        let line = guest
            .wait_for("workload: forked 2 pids=", GUEST_STEP)
            .unwrap();
        children.extend(forked_pids(&line));
    }
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    // Both events' first probes (the fork event's, ftrace's comm cache's),
    // both sites given and taken back.
    let line = e
        .stderr
        .lines()
        .find(|l| l.contains("static call updates kept"));
    let line = line.unwrap_or_else(|| panic!("no updates kept in {}", e.stderr));
    assert_eq!(count_in(line, "static call updates kept"), 2, "{line}");
    assert_eq!(count_in(line, "call sites given"), 2, "{line}");
    assert_eq!(count_in(line, "taken back"), 2, "{line}");
    check_switched_to(&fork_data, &children, w.worker);
    assert_same(
        &before,
        &watch.read(),
        "after the guest enabled an event itself",
    );
    assert_runs_on(&guest, w.worker);
    check_sched_switch(&data, w.worker);
    check_trace_cmd_report(
        &data,
        &SCHED,
        &["sched_switch", "sched_wakeup", "task_rename"],
    );
    let events = [
        "sched:sched_switch",
        "sched:sched_wakeup",
        "task:task_rename",
    ];
    check_guest_ids(&guest, &data.with_extension("dat"), &events);
    exitless_events(&guest, &kernel, &bz, &data, w.worker);
    exitless_graph_strings(&guest, &bz, &data);
    syscalls::checks(&guest, &kernel, &bz, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    let console = guest.console();
    for bad in ["BUG", "WARNING", "Oops", "general protection"] {
        assert!(!console.contains(bad), "{bad}: {console}");
    }
}

/// In data file `data`: the forks of the `worker` are exactly `pids`'s
/// (`sched_process_fork`'s `child_pid`), and each of them is some
/// `sched_switch`'s `next_pid`.
fn check_switched_to(data: &std::path::Path, pids: &[u64], worker: u32) {
    let script = common::vmtrace(&["script", s(data)]);
    let text = common::stdout(&script);
    let of = |event: &str| -> Vec<&str> {
        let tag = format!(": {event}: ");
        text.lines().filter(|l| l.contains(&tag)).collect()
    };
    let next: Vec<&str> = of("sched_switch")
        .iter()
        .map(|l| field(l, "next_pid"))
        .collect();
    let worker = worker.to_string();
    let mut forked: Vec<u64> = of("sched_process_fork")
        .iter()
        .filter(|l| field(l, "pid") == worker)
        .map(|l| field(l, "child_pid").parse().unwrap())
        .collect();
    forked.sort_unstable();
    let mut want = pids.to_vec();
    want.sort_unstable();
    assert_eq!(forked, want, "{text}");
    for p in pids {
        assert!(next.contains(&p.to_string().as_str()), "{p}: {text}");
    }
}

/// The exitless attach's `execs` children `execd`: each renamed itself
/// `wl-child`, then exec'd `/init` (renamed `init` by the exec), and one
/// `sched_process_exec` of `/init` each; the strings copied at the event.
fn check_execs(doc: &serde_json::Value, execd: &[u64]) {
    let renames = records(doc, "task:task_rename");
    let execs = records(doc, "sched:sched_process_exec");
    for &child in execd {
        let names: Vec<_> = renames
            .iter()
            .filter(|r| r["pid"].as_u64() == Some(child))
            .map(|r| {
                (
                    r["fields"]["oldcomm"].clone(),
                    r["fields"]["newcomm"].clone(),
                )
            })
            .collect();
        let want = [("wl-worker", "wl-child"), ("wl-child", "init")];
        let want: Vec<_> = want
            .iter()
            .map(|(o, n)| (o.to_string().into(), n.to_string().into()))
            .collect();
        assert_eq!(names, want, "{renames:?}");
        let by: Vec<_> = execs
            .iter()
            .filter(|r| r["pid"].as_u64() == Some(child))
            .collect();
        assert_eq!(by.len(), 1, "{execs:?}");
        let f = &by[0]["fields"];
        assert_eq!(f["filename"], "/init", "{by:?}");
        assert_eq!(f["pid"], child, "{by:?}");
        assert_eq!(f["old_pid"], child, "{by:?}");
    }
}

/// The number before `what` in `line` (`vmtrace: 3 call sites ...`).
fn count_in(line: &str, what: &str) -> usize {
    let at = line
        .find(what)
        .unwrap_or_else(|| panic!("{what} in {line}"));
    let n = line[..at].trim_end().rsplit(' ').next().unwrap();
    n.parse().unwrap_or_else(|_| panic!("{n} in {line}"))
}

/// `--mode exitless -e`: each enabled site's `tp->funcs` load made to
/// read `tp->iterator` (no breakpoint, no stop per event), the events
/// recorded by the exitless trampoline with their tasks and fields: one
/// `sched_process_fork` per fork, its child pid the one the guest printed,
/// one `task_rename` per child with its names, and one
/// `sched_process_exec` per exec with its file name (which do not last
/// past the event: copied by vmtrace's guest code at the event),
/// `sched_switch` as in trap mode; the kernel's text as found after the
/// detach.
fn exitless_events(
    guest: &QemuGuest,
    kernel: &Kernel,
    bz: &std::path::Path,
    data: &std::path::Path,
    worker: u32,
) {
    let qmp = guest.qmp_socket();
    let watch = kernel.watch(qmp);
    let before = watch.read();
    let _ = std::fs::remove_file(data);
    let args = [
        "--kernel",
        s(bz),
        "--mode",
        "exitless",
        "-e",
        "sched:sched_process_fork,task:task_rename,sched:sched_switch,sched:sched_process_exec",
        "-o",
        s(data),
    ];
    let mut a = Attach::start(qmp, &args);
    let line = a.wait_line("vmtrace: attached to QEMU");
    assert!(line.contains("exitless"), "{line}");
    let line = a.wait_line("call sites of the events enabled");
    assert!(line.contains("the guest may enable these events"), "{line}");
    let sites = count_in(&line, "call sites");
    let line = a.wait_line("tp->funcs loads of the events read tp->iterator");
    assert_eq!(count_in(&line, "tp->funcs loads"), sites, "{line}");
    // Each site's NOP a JMP, each load's displacement changed: nothing else
    // of the kernel's text.
    let during = watch.read();
    let text = diffs(&before, &during);
    let text: Vec<_> = text.iter().filter(|d| d.0 >= LOW).collect();
    let jumps = text.iter().filter(|d| NOP_TO_JMP.contains(&(d.1, d.2)));
    assert_eq!(jumps.count(), sites, "{text:x?}");
    assert!(text.len() <= sites * (5 + 4), "{text:x?}");
    guest.send_line("forks 3");
    let line = guest
        .wait_for("workload: forked 3 pids=", GUEST_STEP)
        .unwrap();
    let mut printed = forked_pids(&line);
    // The guest enables a traced event itself: the guard gives its site
    // back before its jump_label checks it, and keeps its static call on
    // __traceiter_sched_process_fork, which calls the guest's probe with
    // its own data and is still recorded: three more forks, each recorded.
    guest.send_line("ftrace event sched:sched_process_fork 1");
    guest
        .wait_for(
            "workload: ftrace event sched:sched_process_fork=0",
            GUEST_STEP,
        )
        .unwrap();
    guest.send_line("forks 3");
    let line = guest
        .wait_for("workload: forked 3 pids=", GUEST_STEP)
        .unwrap();
    printed.extend(forked_pids(&line));
    // Children that rename themselves and exec /init: the names and the
    // file name are copied at the event, by vmtrace's guest code.
    guest.send_line("execs 2");
    let line = guest
        .wait_for("workload: execd 2 pids=", GUEST_STEP)
        .unwrap();
    let execd = forked_pids(&line);
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    assert!(!e.stderr.contains("not recorded yet"), "{}", e.stderr);
    // sched_process_fork's, and sched_switch's: ftrace's first event
    // registers its own probe there too (its comm cache,
    // kernel/trace/trace_sched_switch.c).
    assert!(
        e.stderr.contains("the guest enabled traced events itself meanwhile: 2 call sites given to it, 0 taken back as it disabled them (vmtrace's again, still recorded; the others its own at the detach), 2 static call updates kept"),
        "{}",
        e.stderr
    );
    // Its site is the guest's jump until the guest disables the event.
    guest.send_line("ftrace event sched:sched_process_fork 0");
    guest
        .wait_for(
            "workload: ftrace event sched:sched_process_fork=0",
            GUEST_STEP,
        )
        .unwrap();
    let report = common::vmtrace(&["report", s(data), "--format", "json"]);
    let doc: serde_json::Value = serde_json::from_str(&common::stdout(&report)).unwrap();
    assert_eq!(doc["mode"], "exitless", "{doc}");
    assert_eq!(doc["dropped"], 0, "{doc}");
    let forks: Vec<_> = records(&doc, "sched:sched_process_fork")
        .iter()
        .filter(|f| f["fields"]["parent_pid"] == worker)
        .collect();
    let children: Vec<u64> = forks
        .iter()
        .map(|f| f["fields"]["child_pid"].as_u64().unwrap())
        .collect();
    // The forks, then the execs' children.
    let all: Vec<u64> = printed.iter().chain(&execd).copied().collect();
    assert_eq!(children, all, "{forks:?}");
    for f in &forks {
        assert_eq!(f["pid"], worker, "{f}");
        assert_eq!(f["fields"]["parent_comm"], "wl-worker", "{f}");
    }
    let renames = records(&doc, "task:task_rename");
    for &child in &printed {
        let by: Vec<_> = renames
            .iter()
            .filter(|r| r["fields"]["pid"].as_u64() == Some(child))
            .collect();
        assert_eq!(by.len(), 1, "{renames:?}");
        assert_eq!(by[0]["pid"], child, "{by:?}");
        // The names, which do not last past the event, as the guest set
        // them: copied into the record at the event.
        assert_eq!(by[0]["fields"]["newcomm"], "wl-child", "{by:?}");
        assert_eq!(by[0]["fields"]["oldcomm"], "wl-worker", "{by:?}");
    }
    check_execs(&doc, &execd);
    for r in records(&doc, "sched:sched_switch") {
        assert_eq!(r["pid"], r["fields"]["prev_pid"], "{r}");
    }
    check_sched_switch(data, worker);
    assert_same(&before, &watch.read(), "after an exitless trace of events");
    assert_no_gdbstub(qmp);
    assert_runs_on(guest, worker);
}

/// `--mode exitless --graph -e`: the graph's shared entry path copies the
/// strings that do not last past the event too (a site's own entry path,
/// `trampoline::emit_code`): each exec'd child's two renames and its
/// exec's file name, as in the per-site bodies of `exitless_events`.
fn exitless_graph_strings(guest: &QemuGuest, bz: &std::path::Path, data: &std::path::Path) {
    let _ = std::fs::remove_file(data);
    let args = [
        "--kernel",
        s(bz),
        "--mode",
        "exitless",
        "--graph",
        "-e",
        "task:task_rename,sched:sched_process_exec",
        "-o",
        s(data),
    ];
    let mut a = Attach::start(guest.qmp_socket(), &args);
    let line = a.wait_line("vmtrace: attached to QEMU");
    assert!(line.contains("exitless"), "{line}");
    let (execd, _) = pids_then_detach(guest, a, "execs 2", "workload: execd 2 pids=");
    let report = common::vmtrace(&["report", s(data), "--format", "json"]);
    let doc: serde_json::Value = serde_json::from_str(&common::stdout(&report)).unwrap();
    assert_eq!(doc["mode"], "exitless", "{doc}");
    assert_eq!(doc["dropped"], 0, "{doc}");
    check_execs(&doc, &execd);
    assert_no_gdbstub(guest.qmp_socket());
}

/// Sends `command` to the guest, takes the pids it prints on its line
/// starting `printed`, then ends the attach `a` by Ctrl-C, its exit
/// checked: the pids, and how it ended.
fn pids_then_detach(
    guest: &QemuGuest,
    a: Attach,
    command: &str,
    printed: &str,
) -> (Vec<u64>, Ended) {
    guest.send_line(command);
    let line = guest.wait_for(printed, GUEST_STEP).unwrap();
    let pids = forked_pids(&line);
    a.signal(libc::SIGINT);
    let e = a.end();
    assert!(e.status.success(), "{}: {}", e.status, e.stderr);
    (pids, e)
}
