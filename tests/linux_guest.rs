//! The default Linux guest on real KVM: boot with 1 and 2 vCPUs, and trace
//! its timers while it boots. Slow on emulating hosts (every guest
//! instruction is emulated), so each boot stops right after `Run /init`.

mod common;

use std::path::PathBuf;
use std::sync::{Mutex, Once};

use common::*;

/// guest/out/{bzImage,vmlinux,initramfs.cpio.gz}, built (or copied from the
/// cache) once per test binary.
fn linux() -> (PathBuf, PathBuf) {
    static BUILD: Once = Once::new();
    BUILD.call_once(|| {
        let st = std::process::Command::new("bash")
            .arg(root().join("guest/build.sh"))
            .arg("linux")
            .status()
            .expect("run guest/build.sh linux");
        assert!(st.success(), "guest/build.sh linux failed");
    });
    (
        root().join("guest/out/bzImage"),
        root().join("guest/out/initramfs.cpio.gz"),
    )
}

fn console_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("vmtrace-{name}-{}.log", std::process::id()))
}

/// One guest at a time: on a 2-core emulating host, two guests side by side
/// starve each other's timer ticks until the kernel livelocks in them.
static ONE_GUEST: Mutex<()> = Mutex::new(());

/// Boot and stop at the init failure (guest user space cannot run on
/// emulating hosts; on others the tiny init powers off).
fn boot(cpus: u32, extra: &[&str]) -> (std::process::Output, String) {
    let (kernel, _) = linux();
    let extra = [&["--cmdline", TEST_BOOT_CMDLINE], extra].concat();
    boot_kernel(&kernel, cpus, &extra)
}

fn boot_kernel(
    kernel: &std::path::Path,
    cpus: u32,
    extra: &[&str],
) -> (std::process::Output, String) {
    let (_, initrd) = linux();
    let _one = ONE_GUEST.lock().unwrap_or_else(|e| e.into_inner());
    let console = console_path(&format!("linux{cpus}"));
    let cpus_s = cpus.to_string();
    let mut args = vec![
        "--kernel",
        kernel.to_str().unwrap(),
        "--initrd",
        initrd.to_str().unwrap(),
        "--cpus",
        &cpus_s,
        "--mem",
        "96",
        // A hang guard only: a loaded CI host slows these boots a lot (the
        // every-function boot on 4 vCPUs takes 100 s alone, and ran out of
        // 900 s at 50 s of guest time beside builds and QEMU tests).
        "--timeout",
        "1800",
        "--console",
        console.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let out = vmtrace(&args);
    let text = std::fs::read_to_string(&console).unwrap_or_default();
    let _ = std::fs::remove_file(&console);
    (out, text)
}

/// What vmtrace must never make the guest say: `ftrace bug` (an attach that
/// raced the guest's own ftrace_init, which then kills its ftrace), or a
/// kernel `WARNING:` / `BUG:` line.
const GUEST_COMPLAINTS: [&str; 3] = ["ftrace bug", "WARNING:", "BUG:"];

fn check_no_complaints(text: &str, err: &str) {
    for line in text.lines() {
        assert!(
            !GUEST_COMPLAINTS.iter().any(|c| line.contains(c)),
            "the guest complained: {line}\n{text}\nvmtrace said: {err}"
        );
    }
    // The guest's ftrace came up (and vmtrace then attached after it).
    assert!(
        text.contains("ftrace: allocated"),
        "ftrace_init ran:\n{text}"
    );
}

fn check_boot_console(text: &str, err: &str, cpus: u32) {
    check_no_complaints(text, err);
    assert!(
        text.contains("Linux version 6.1"),
        "kernel version line:\n{text}\nvmtrace said: {err}"
    );
    let up = if cpus == 1 {
        "Brought up 1 node, 1 CPU".to_string()
    } else {
        format!("Brought up 1 node, {cpus} CPUs")
    };
    assert!(text.contains(&up), "{up}:\n{text}\nvmtrace said: {err}");
    assert!(
        text.contains("Switched to clocksource"),
        "a clocksource for high-res timers:\n{text}\nvmtrace said: {err}"
    );
    assert!(
        !text.contains("Could not switch to high resolution mode"),
        "{text}\nvmtrace said: {err}"
    );
    assert!(
        text.contains("Run /init as init process"),
        "reached init:\n{text}\nvmtrace said: {err}"
    );
}

/// How a boot run with `--stats` ends, on any vCPU count: with the init's
/// power-off, or with the panic that follows init's death on hosts where
/// user space cannot run; and, where the host emulates guest ring 0, the
/// kernel's alternatives self-test's int3 carried by the assist. The 1-, 2-
/// and 4-vCPU boots of the traced tests below check it (one boot serves
/// both checks: Linux boots are most of CI's time).
fn check_run_end(err: &str) {
    assert!(
        err.contains("guest powered off")
            || err.contains("guest panicked")
            || err.contains("reset"),
        "{err}"
    );
    if std::path::Path::new("/sys/module/kvm_pvm").exists() {
        assert!(err.contains("emulation assist `int3`"), "{err}");
    }
}

/// The README's main job (`--cpus 2 --mem 96 --console FILE --trace
/// 'hrtimer_*' -g`, plus `-o` to keep the trace): the report on stdout, the
/// guest's console clean, and the saved trace read back as JSON.
#[test]
fn linux_readme_main_job_traces_hrtimers_during_boot() {
    let saved = std::env::temp_dir().join(format!("vmtrace-linux-{}.vmtrace", std::process::id()));
    // The README's flags only (no `TEST_BOOT_CMDLINE`).
    let (kernel, _) = linux();
    let (out, text) = boot_kernel(
        &kernel,
        2,
        &["--trace", "hrtimer_*", "-g", "-o", saved.to_str().unwrap()],
    );
    let err = stderr(&out);
    assert!(err.contains("vmtrace: attached:"), "{err}");
    assert!(err.contains("sites restored"), "{err}");
    check_boot_console(&text, &err, 2);
    let report = stdout(&out);
    assert!(report.contains("# vmtrace report"), "{report}");
    assert!(report.contains("hrtimer_interrupt"), "{report}");
    let json = vmtrace(&["report", "-i", saved.to_str().unwrap(), "--format", "json"]);
    let _ = std::fs::remove_file(&saved);
    assert!(json.status.success(), "{}", stderr(&json));
    let v: serde_json::Value = serde_json::from_str(&stdout(&json)).unwrap();
    check_hrtimer_callers(&v);
    // -g: the callers are in the text report too.
    assert!(report.contains("apic_timer_interrupt"), "{report}");
    // --mode auto: traps where KVM emulates guest ring 0, else exitless.
    let emulating = std::path::Path::new("/sys/module/kvm_pvm").exists();
    assert_eq!(v["mode"], if emulating { "trap" } else { "exitless" });
}

/// What a traced boot must show of the hrtimers, in either mode: timer
/// interrupts traced, from the APIC timer vector; timers started by the tick
/// code; enough sites; nothing dropped.
fn check_hrtimer_callers(v: &serde_json::Value) {
    let funcs = v["functions"].as_array().unwrap();
    let get = |name: &str| {
        funcs
            .iter()
            .find(|f| f["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {v}"))
    };
    let count = |name: &str| get(name)["count"].as_u64().unwrap();
    // __hrtimer_run_queues is inlined into hrtimer_interrupt in this build
    // (no site), so hrtimer_interrupt stands for both.
    let run_queues = funcs
        .iter()
        .find(|f| f["name"] == "__hrtimer_run_queues")
        .map_or(0, |f| f["count"].as_u64().unwrap());
    assert!(
        count("hrtimer_interrupt") + run_queues > 0,
        "timer interrupts traced"
    );
    assert!(count("hrtimer_start_range_ns") > 0);
    // hrtimer_interrupt only runs in high-resolution (one-shot) mode: proof
    // that high-res timers are active. Its caller is the APIC timer vector.
    let callers = |name: &str| -> Vec<String> {
        get(name)["callers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let c = callers("hrtimer_interrupt");
    assert!(
        c.iter().any(|c| c.contains("apic_timer_interrupt")),
        "{c:?}"
    );
    let c = callers("hrtimer_start_range_ns");
    assert!(
        c.iter()
            .any(|c| c.starts_with("tick_") || c.starts_with("hrtimer_")),
        "{c:?}"
    );
    assert!(v["sites_patched"].as_u64().unwrap() > 10);
    assert_eq!(v["dropped"].as_u64(), Some(0));
}

/// Exitless mode: vmtrace's trampoline in the guest's fixmap entries (found
/// empty), the hrtimers traced during boot with the same callers as in trap
/// mode, and not one exit at the trace port.
#[test]
fn linux_exitless_traces_hrtimers_with_no_trap_exit() {
    let json = std::env::temp_dir().join(format!("vmtrace-linux-ex-{}.json", std::process::id()));
    let (out, text) = boot(
        2,
        &[
            "--trace",
            "hrtimer_*",
            "-e",
            "sched:sched_switch,sched:sched_wakeup",
            "--mode",
            "exitless",
            "--stats",
            "--export",
            &format!("json={}", json.display()),
        ],
    );
    let err = stderr(&out);
    check_boot_console(&text, &err, 2);
    check_run_end(&err);
    assert!(
        err.contains("page-directory entries 508-510, found empty"),
        "the slot was checked empty: {err}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    check_hrtimer_callers(&v);
    assert_eq!(v["mode"], "exitless");
    assert_eq!(v["trap_exits"].as_u64(), Some(0));
    check_exitless_sched_events(&v, &err);
    assert_eq!(v["events_stored"], v["events"]);
    // The trampoline recorded each call's task: every one known, and the
    // timers of the idle loop run as each vCPU's idle task.
    assert!(
        v["tasks_source"]
            .as_str()
            .unwrap()
            .starts_with("from the BTF of "),
        "{v}"
    );
    assert_eq!(
        v.get("tasks_unknown").map_or(0, |n| n.as_u64().unwrap()),
        0,
        "{v}"
    );
    let tasks = v["tasks"].as_array().unwrap();
    for cpu in 0..2 {
        let comm = format!("swapper/{cpu}");
        assert!(
            tasks
                .iter()
                .any(|t| t["pid"] == 0 && t["comm"] == comm.as_str()),
            "{comm}: {tasks:?}"
        );
    }
}

/// Trap mode with the graph, return values, stacks and events, in one
/// boot (Linux boots are most of CI's time): each call's task
/// (`check_tasks`), the kernel stacks unwound with ORC (`check_stacks`), and
/// `-e sched:sched_switch,sched:sched_wakeup` (`check_sched_events`).
#[test]
fn linux_trap_mode_names_tasks_and_unwinds_stacks() {
    let dir = std::env::temp_dir().join(format!("vmtrace-linux-trap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (csv, data, dat, json) = (
        dir.join("t.csv"),
        dir.join("t.data"),
        dir.join("t.dat"),
        dir.join("t.json"),
    );
    let (out, text) = boot(
        2,
        &[
            "--trace",
            "schedule,tick_nohz_idle_enter,kernel_clone,hrtimer_interrupt,__sysvec_apic_timer_interrupt",
            "--stack",
            "hrtimer_interrupt,kernel_clone",
            "-e",
            "sched:sched_switch,sched:sched_wakeup",
            "--mode",
            "trap",
            "--graph",
            "--retval",
            "-o",
            data.to_str().unwrap(),
            "--export",
            &format!("csv={}", csv.display()),
            "--export",
            &format!("trace.dat={}", dat.display()),
            "--export",
            &format!("json={}", json.display()),
        ],
    );
    let err = stderr(&out);
    check_boot_console(&text, &err, 2);
    let shown = trace_cmd_report(&dat);
    check_tasks(&csv, &data, &shown, &err);
    check_stacks(&json, &shown);
    check_event_ids(&dat);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The events' ids in trace.dat are the ones this kernel gives them at
/// boot (the own VMM reads them at the run's end: its attach comes before
/// the kernel numbers its events): the same kernel booted under QEMU/TCG,
/// where its user space runs, shows them in its tracefs.
fn check_event_ids(dat: &std::path::Path) {
    let guest = common::qemu::QemuGuest::boot(common::qemu::QemuOpts::linux());
    guest.wait_ready().unwrap();
    let events = ["sched:sched_switch", "sched:sched_wakeup"];
    common::qemu::check_guest_ids(&guest, dat, &events);
}

/// Debian's `trace-cmd report` of a trace.dat export.
fn trace_cmd_report(dat: &std::path::Path) -> String {
    let report = std::process::Command::new("trace-cmd")
        .arg("report")
        .arg(dat)
        .output()
        .expect("trace-cmd (Debian's trace-cmd package) must be installed");
    assert!(
        report.status.success(),
        "{}",
        String::from_utf8_lossy(&report.stderr)
    );
    String::from_utf8_lossy(&report.stdout).into_owned()
}

/// Each call's task in trap mode, read at the trap: the idle loop's
/// `tick_nohz_idle_enter` runs only as vCPU N's idle task (pid 0,
/// `swapper/N`); kthreadd is pid 2 by its name; pid 1 runs first as the boot
/// CPU's task (`swapper/0`) and, once it has exec'd, as `init` (whether it
/// makes a traced call before the boot ends is timing). With `--graph --retval`
/// `kernel_clone` returns the new tasks' pids, which then run as tasks of
/// the trace. The same names come back from the saved data file through
/// `script`, and from the trace.dat export through Debian's `trace-cmd
/// report`.
fn check_tasks(csv: &std::path::Path, data: &std::path::Path, shown: &str, err: &str) {
    let rows = std::fs::read_to_string(csv).unwrap();
    let mut lines = rows.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .unwrap_or_else(|| panic!("no {name} column in {header:?}"))
    };
    let (c_cpu, c_func, c_kind, c_pid, c_tgid, c_comm, c_ret) = (
        col("cpu"),
        col("function"),
        col("kind"),
        col("pid"),
        col("tgid"),
        col("comm"),
        col("ret"),
    );
    let (mut idle, mut kthreadd, mut init) = (0, 0, 0);
    let mut pids = std::collections::HashSet::new();
    let mut cloned = Vec::new();
    for line in lines {
        let f: Vec<&str> = line.split(',').collect();
        let (cpu, func, pid, tgid, comm) = (f[c_cpu], f[c_func], f[c_pid], f[c_tgid], f[c_comm]);
        assert!(
            !pid.is_empty() && !comm.is_empty(),
            "a task unknown: {line}"
        );
        pids.insert(pid.to_string());
        if f[c_kind] == "return" {
            if func == "kernel_clone" {
                cloned.push(f[c_ret].to_string());
            }
            continue;
        }
        if func == "tick_nohz_idle_enter" {
            assert_eq!((pid, tgid), ("0", "0"), "{line}");
            assert_eq!(comm, format!("swapper/{cpu}"), "{line}");
            idle += 1;
        }
        if pid == "2" {
            assert_eq!(comm, "kthreadd", "{line}");
            kthreadd += 1;
        }
        if pid == "1" {
            // Named as rest_init's thread until it execs /init (the boot
            // may end before init runs a traced call).
            assert!(comm == "swapper/0" || comm == "init", "{line}");
            init += 1;
        }
    }
    assert!(
        idle > 0 && kthreadd > 0 && init > 0,
        "{idle} {kthreadd} {init}: {rows}"
    );
    // Every new task but the last one cloned ran (the last may have been
    // created as the run ended): its pid is a task of the trace.
    assert!(cloned.len() > 1, "{cloned:?}");
    for ret in &cloned[..cloned.len() - 1] {
        let pid: u32 = ret
            .parse()
            .unwrap_or_else(|_| panic!("kernel_clone returned {ret}"));
        assert!(
            pid > 0 && pids.contains(ret),
            "pid {pid} never ran: {pids:?}"
        );
    }
    let script = vmtrace(&["script", data.to_str().unwrap()]);
    let lines = stdout(&script);
    check_sched_events(&lines, err);
    assert!(lines.contains("<idle>-0"), "{lines}");
    assert!(lines.contains("kthreadd-2 "), "{lines}");
    // trace-cmd's sched plugin names a pid by the comm its first
    // sched_switch record gives it: kthreadd's first switch comes before
    // it renamed itself (`swapper/0`); its later records say `kthreadd:2`.
    let early = shown.contains("swapper/0-2 ") && shown.contains(" kthreadd:2 [");
    assert!(shown.contains("kthreadd-2 ") || early, "{shown}");
    assert!(shown.contains("<idle>-0 "), "{shown}");
}

/// Every traceable function (`--trace '*'`): thousands of sites patched
/// right after the guest's ftrace_init without disturbing it, on four vCPUs
/// (more than the CI host's two cores; this boot is also the 4-vCPU boot
/// check). guest/linux/soak.sh soaks 4 vCPUs longer with a release build.
#[test]
fn linux_every_function_traced_during_boot() {
    let json = std::env::temp_dir().join(format!("vmtrace-linux-all-{}.json", std::process::id()));
    let (out, text) = boot(
        4,
        &[
            "--trace",
            "*",
            "--stats",
            "--export",
            &format!("json={}", json.display()),
        ],
    );
    let err = stderr(&out);
    check_boot_console(&text, &err, 4);
    check_run_end(&err);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    let patched = v["sites_patched"].as_u64().unwrap();
    assert!(patched > 5000, "{patched} sites patched; {err}");
    assert_eq!(v["sites_skipped_other"].as_u64(), Some(0), "{err}");
    assert!(
        err.contains(&format!("detached: {patched} sites restored")),
        "{err}"
    );
    let called = v["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["count"].as_u64() > Some(0))
        .count();
    assert!(called > 200, "{called} functions called while Linux booted");
    assert_eq!(v["dropped"].as_u64(), Some(0));
}

/// The function graph on Linux (`--graph`, trap mode on this host), on the
/// vmlinux ELF booted with the 64-bit protocol on one vCPU: the timer path's
/// returns hooked during boot. Each returned call nests where
/// the kernel calls it, returns match calls but for the few in flight when
/// the guest stopped, and the guest boots on untroubled. This boot is also
/// the 64-bit protocol's and the one-vCPU boot check (one boot for all:
/// Linux boots are most of CI's time).
#[test]
fn linux_graph_times_the_timer_path_during_boot() {
    use tracer::trace::graph::{End, Graph};
    let path = std::env::temp_dir().join(format!(
        "vmtrace-linux-graph-{}.vmtrace",
        std::process::id()
    ));
    linux();
    let vmlinux = root().join("guest/out/vmlinux");
    let (out, text) = boot_kernel(
        &vmlinux,
        1,
        &[
            "--cmdline",
            TEST_BOOT_CMDLINE,
            "--trace",
            "hrtimer_interrupt,__hrtimer_run_queues,tick_sched_timer",
            "--graph",
            "--stats",
            "-o",
            path.to_str().unwrap(),
        ],
    );
    let err = stderr(&out);
    check_boot_console(&text, &err, 1);
    check_run_end(&err);
    let t = tracer::trace::datafile::load(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(t.meta.graph);
    assert_eq!((t.meta.events_dropped, t.meta.returns_dropped), (0, 0));
    let g = Graph::build(&t);
    assert_eq!((g.unmatched_returns, g.mismatched_returns), (0, 0), "{err}");
    assert_eq!(g.abandoned, 0, "{err}");
    let name = |i: u32| t.functions[i as usize].name.as_str();
    let mut returned = 0;
    for f in &g.frames {
        match f.end {
            End::Returned { .. } => returned += 1,
            // Still running when the guest stopped: at most one timer
            // path (one vCPU).
            End::Running => {}
            e => panic!("{} ended {e:?}", name(f.func)),
        }
        let parent = f.parent.map(|p| name(g.frames[p as usize].func));
        let ok = match name(f.func) {
            "tick_sched_timer" => parent == Some("__hrtimer_run_queues"),
            "__hrtimer_run_queues" => matches!(parent, None | Some("hrtimer_interrupt")),
            _ => parent.is_none(),
        };
        assert!(ok, "{} nested in {parent:?}", name(f.func));
        if let (Some(total), Some(own)) = (f.total_ns(), f.self_ns()) {
            assert!(own <= total && f.child_ns <= total);
        }
    }
    let running = g.frames.len() - returned;
    assert!(running <= 3, "{running} calls never returned");
    let tick = t
        .functions
        .iter()
        .position(|f| f.name == "tick_sched_timer")
        .unwrap();
    let calls: u64 = t.counts[tick].iter().sum();
    assert!(calls > 0, "high-resolution ticks traced: {err}");
    let rets: u64 = t.returns[tick].iter().sum();
    assert!(calls - rets <= 2, "{calls} calls, {rets} returns");
}

/// The functions of a JSON stack's frames, innermost first; each frame
/// must be named (all symbolized) and the stack complete.
fn stack_functions(stack: &serde_json::Value) -> Vec<String> {
    assert_eq!(stack["complete"], true, "{stack}");
    stack["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            f["function"]
                .as_str()
                .unwrap_or_else(|| panic!("a frame not symbolized: {stack}"))
                .to_string()
        })
        .collect()
}

/// `--stack` on the 6.1 guest, unwound with its ORC tables: every stack of
/// `hrtimer_interrupt` comes through the timer interrupt's entry
/// (`__sysvec_apic_timer_interrupt`, `sysvec_apic_timer_interrupt`,
/// `asm_sysvec_apic_timer_interrupt`, innermost first) and then the
/// interrupted kernel context (none when the interrupt came from user
/// mode: the stack ends there), complete (to the bottom of the stack, or user
/// mode) with every frame symbolized; `__sysvec_apic_timer_interrupt`
/// traced with `--graph` has its return hooked while hrtimer_interrupt
/// runs, and the unwinder reads it as the real return. `kernel_clone`'s
/// stacks are exactly the kernel's three ways to start a task at boot:
/// rest_init starting init and kthreadd, kthreadd starting every kernel
/// thread. trace-cmd shows the stacks from the trace.dat export.
fn check_stacks(json: &std::path::Path, shown: &str) {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    assert!(
        v["stacks_source"].as_str().unwrap().starts_with("ORC ("),
        "{}",
        v["stacks_source"]
    );
    let stacks = v["stacks"].as_array().unwrap();
    let by_id = |id: &serde_json::Value| {
        let id = id.as_u64().unwrap() as usize;
        stack_functions(&stacks[id - 1])
    };
    let func = |name: &str| {
        v["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == name)
            .unwrap_or_else(|| panic!("{name} traced: {v}"))
            .clone()
    };
    let timer = func("hrtimer_interrupt");
    let with_stack: u64 = timer["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["count"].as_u64().unwrap())
        .sum();
    assert_eq!(with_stack, timer["count"].as_u64().unwrap());
    for s in timer["stacks"].as_array().unwrap() {
        let f = by_id(&s["id"]);
        let id = s["id"].as_u64().unwrap() as usize;
        let from_user = stacks[id - 1]["end"] == "user";
        assert_eq!(
            f[..3],
            [
                "__sysvec_apic_timer_interrupt",
                "sysvec_apic_timer_interrupt",
                "asm_sysvec_apic_timer_interrupt"
            ],
            "{f:?}"
        );
        // Then the interrupted kernel context, unless the interrupt came
        // from user mode (the stack ends at the entry's pt_regs).
        assert!(f.len() > 3 || from_user, "the interrupted context: {f:?}");
    }
    let clone = func("kernel_clone");
    let mut chains: Vec<Vec<String>> = clone["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| by_id(&s["id"]))
        .collect();
    chains.sort();
    let boot_chain = [
        "rest_init",
        "arch_call_rest_init",
        "start_kernel",
        "secondary_startup_64",
    ];
    let want: Vec<Vec<String>> = [
        vec!["kernel_thread", "kthreadd", "ret_from_fork"],
        [&["kernel_thread"][..], &boot_chain].concat(),
        [&["user_mode_thread"][..], &boot_chain].concat(),
    ]
    .iter()
    .map(|c| c.iter().map(|s| s.to_string()).collect())
    .collect();
    assert_eq!(chains, want);
    let traces = shown.matches("<stack trace >").count() as u64;
    let all_with_stack: u64 = with_stack + clone["count"].as_u64().unwrap();
    assert_eq!(traces, all_with_stack, "{shown}");
    assert!(
        shown.contains("=> asm_sysvec_apic_timer_interrupt ("),
        "{shown}"
    );
}

/// The number before `after` in `text` (`attached: 5 sites patched`).
fn count_before(text: &str, after: &str) -> usize {
    let head = &text[..text
        .find(after)
        .unwrap_or_else(|| panic!("no {after:?}: {text}"))];
    let n = head.rsplit(|c: char| !c.is_ascii_digit()).next().unwrap();
    n.parse()
        .unwrap_or_else(|_| panic!("no count before {after:?}: {text}"))
}

/// `-e sched:sched_switch,sched:sched_wakeup` on the own VMM in exitless
/// mode: the `tp->funcs` loads made to read `tp->iterator` (no exit per
/// event: the run's trap exits are 0), both events recorded by the
/// trampoline with their tasks and fields (JSON `trace_events`): each
/// `sched_switch` made by its `prev_pid`, `prev_state` one of ftrace's
/// letters, its `next_pid` the task of the next event on its vCPU; every
/// site and key given back at the detach.
fn check_exitless_sched_events(v: &serde_json::Value, err: &str) {
    let keys = count_before(err, " enabled (their keys' counts set to 1)");
    let loads = count_before(err, " tp->funcs loads made to read tp->iterator");
    assert_eq!(keys, 2, "{err}");
    assert!(loads >= 2, "{err}");
    let patched = count_before(err, " sites patched");
    assert_eq!(
        count_before(err, " sites restored"),
        patched + loads,
        "{err}"
    );
    assert_eq!(
        count_before(err, " event keys' counts set back"),
        2,
        "{err}"
    );
    let events = v["trace_events"].as_array().expect("trace_events");
    let of = |name: &str| -> Vec<serde_json::Value> {
        let e = events.iter().find(|e| e["event"] == name).expect(name);
        e["records"].as_array().unwrap().clone()
    };
    let (switches, wakeups) = (of("sched:sched_switch"), of("sched:sched_wakeup"));
    // Both events' records, by vCPU, in time order.
    let mut all: Vec<(u64, u64, bool, &serde_json::Value)> = switches
        .iter()
        .map(|r| {
            (
                r["cpu"].as_u64().unwrap(),
                r["ts_ns"].as_u64().unwrap(),
                true,
                r,
            )
        })
        .chain(wakeups.iter().map(|r| {
            (
                r["cpu"].as_u64().unwrap(),
                r["ts_ns"].as_u64().unwrap(),
                false,
                r,
            )
        }))
        .collect();
    all.sort_by_key(|e| (e.0, e.1));
    let mut checked = 0;
    for (i, (cpu, _, switch, r)) in all.iter().enumerate() {
        if !switch {
            continue;
        }
        let f = &r["fields"];
        assert_eq!(r["pid"], f["prev_pid"], "{r}");
        let state = f["prev_state"].as_str().unwrap_or_default();
        assert!(
            !state.is_empty() && state.chars().all(|c| "RSDTtXZPIN|+".contains(c)),
            "prev_state {state}: {r}"
        );
        if let Some(next) = all.get(i + 1).filter(|n| n.0 == *cpu) {
            assert_eq!(next.3["pid"], f["next_pid"], "after {r}: {}", next.3);
            checked += 1;
        }
    }
    assert!(checked > 10 && !wakeups.is_empty(), "{checked}: {v}");
}

/// `-e sched:sched_switch,sched:sched_wakeup` on the own VMM (a kernel
/// without jump labels: docs/events.md), printed by `script` as ftrace
/// prints them: both events recorded; each `sched_switch` made by its
/// `prev_pid`, with a `prev_state` of ftrace's letters, and its
/// `next_pid` the task of the next event on its vCPU (past the iterator's
/// own return); and the detach gave back every site (the tests with the
/// ftrace sites, each read back) and every key's count.
fn check_sched_events(script: &str, err: &str) {
    let keys = count_before(err, " enabled (their keys' counts set to 1)");
    let tests = count_before(err, " tp->funcs tests trapped");
    let patched = count_before(err, " sites patched");
    assert_eq!((keys, tests), (2, 2), "{err}");
    assert_eq!(
        count_before(err, " sites restored"),
        patched + tests,
        "{err}"
    );
    assert_eq!(
        count_before(err, " event keys' counts set back"),
        2,
        "{err}"
    );
    // (cpu, pid, what) of each line, in order.
    let events: Vec<(&str, &str, &str)> = script
        .lines()
        .filter_map(|l| {
            let (head, rest) = l.split_once(") [")?;
            let task = head.split('(').next()?.trim();
            let pid = task.rsplit_once('-')?.1;
            let (cpu, rest) = rest.split_once(']')?;
            Some((cpu, pid, rest.split_once(": ")?.1))
        })
        .collect();
    let field = |what: &str, name: &str| -> String {
        let at = what
            .find(&format!(" {name}="))
            .unwrap_or_else(|| panic!("no {name}: {what}"));
        what[at + name.len() + 2..]
            .split(' ')
            .next()
            .unwrap()
            .to_string()
    };
    let wakeups = events
        .iter()
        .filter(|e| e.2.starts_with("sched_wakeup: "))
        .count();
    let mut checked = 0;
    for (i, (cpu, pid, what)) in events.iter().enumerate() {
        let Some(fields) = what.strip_prefix("sched_switch:") else {
            continue;
        };
        assert_eq!(field(fields, "prev_pid"), *pid, "{what}");
        let state = field(fields, "prev_state");
        assert!(
            !state.is_empty() && state.chars().all(|c| "RSDTtXZPIN|+".contains(c)),
            "prev_state {state}: {what}"
        );
        assert!(!field(fields, "next_comm").is_empty(), "{what}");
        let next = events[i + 1..]
            .iter()
            .filter(|e| e.0 == *cpu)
            .find(|e| !e.2.starts_with("__traceiter_sched_switch returned"));
        if let Some(next) = next {
            assert_eq!(
                next.1,
                field(fields, "next_pid"),
                "after {what} on vCPU {cpu}: {next:?}"
            );
            checked += 1;
        }
    }
    assert!(checked > 10 && wakeups > 0, "{checked} {wakeups}: {script}");
}
