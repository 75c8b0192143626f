//! Direct entries on Linux (docs/direct.md): the default 6.1 guest built
//! without FUNCTION_TRACER (`guest/build.sh linux-noftrace`, no
//! `__mcount_loc`) traced through its functions' first instructions, in
//! both modes on 2 vCPUs; and the ftrace build traced both ways. Slow on
//! emulating hosts: one guest at a time, each boot ends at init's death.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use common::*;

/// The hrtimers and a scheduler set.
const SET: &str = "hrtimer_*,schedule,pick_next_task_fair,update_curr,\
                   try_to_wake_up,enqueue_task_fair,dequeue_task_fair";

/// A function called this often in one build's boot is called in the
/// other's too (calls of rarer ones depend on when the attach came).
const OFTEN: u64 = 1000;

/// (bzImage, initramfs) of `guest/build.sh NAME`, built (or copied from
/// the cache) on first use.
fn guest(name: &str) -> (PathBuf, PathBuf) {
    static BUILT: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if !built.iter().any(|n| n == name) {
        let st = std::process::Command::new("bash")
            .arg(root().join("guest/build.sh"))
            .arg(name)
            .status()
            .unwrap();
        assert!(st.success(), "guest/build.sh {name} failed");
        built.push(name.to_string());
    }
    let dir = match name {
        "linux" => root().join("guest/out"),
        n => root().join("guest/out").join(n),
    };
    (dir.join("bzImage"), dir.join("initramfs.cpio.gz"))
}

/// One guest at a time (two starve each other's ticks on a 2-core host).
static ONE_GUEST: Mutex<()> = Mutex::new(());

/// Boot `name` on 2 vCPUs tracing `trace` with `extra` options; what
/// vmtrace said, the console, and the JSON report.
fn traced(name: &str, trace: &str, extra: &[&str]) -> (String, String, serde_json::Value) {
    let (kernel, initrd) = guest(name);
    let _one = ONE_GUEST.lock().unwrap_or_else(|e| e.into_inner());
    let tag = format!("{}-{name}", std::process::id());
    let console = std::env::temp_dir().join(format!("vmtrace-direct-{tag}.log"));
    let json = std::env::temp_dir().join(format!("vmtrace-direct-{tag}.json"));
    let mut args = vec![
        "--kernel".to_string(),
        kernel.display().to_string(),
        "--initrd".to_string(),
        initrd.display().to_string(),
        "--cpus".into(),
        "2".into(),
        "--mem".into(),
        "96".into(),
        "--timeout".into(),
        "900".into(),
        "--console".into(),
        console.display().to_string(),
        "--trace".into(),
        trace.to_string(),
        "--export".into(),
        format!("json={}", json.display()),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = vmtrace(&args);
    let err = stderr(&out);
    let text = std::fs::read_to_string(&console).unwrap_or_default();
    let _ = std::fs::remove_file(&console);
    let v: serde_json::Value = std::fs::read_to_string(&json)
        .ok()
        .and_then(|j| serde_json::from_str(&j).ok())
        .unwrap_or_else(|| panic!("no JSON report: {err}"));
    let _ = std::fs::remove_file(&json);
    for line in text.lines() {
        for bad in [
            "WARNING:",
            "BUG:",
            "Oops",
            "general protection",
            "invalid opcode",
        ] {
            assert!(
                !line.contains(bad),
                "the guest complained: {line}\n{text}\n{err}"
            );
        }
    }
    assert!(text.contains("Run /init as init process"), "{text}\n{err}");
    // Every site written was put back (the text is the file's again).
    let patched = v["sites_patched"].as_u64().unwrap();
    assert!(
        err.contains(&format!("detached: {patched} sites restored")),
        "{err}"
    );
    (err, text, v)
}

/// Calls per function of a JSON report.
fn counts(v: &serde_json::Value) -> BTreeMap<String, u64> {
    v["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["name"].as_str().unwrap().to_string(),
                f["count"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Functions called `OFTEN` in `a` are called in `b`, and the other way,
/// of the functions both traced (two builds inline differently: the
/// ftrace build has `hrtimer_active` out of line, the other inlines it).
fn same_busy_functions(a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>) {
    let mut both = 0;
    for (x, y) in [(a, b), (b, a)] {
        for (f, &n) in x.iter().filter(|(_, &n)| n >= OFTEN) {
            let Some(&m) = y.get(f) else { continue };
            assert!(m > 0, "{f}: {n} calls, then none\n{a:?}\n{b:?}");
            both += 1;
        }
    }
    assert!(both >= 4, "{a:?}\n{b:?}");
}

/// The ftrace build traced through its ftrace sites, then the build
/// without ftrace through direct entries in trap and exitless modes: the
/// timers and the scheduler traced (the timer interrupt from the APIC
/// vector), the same busy functions as the ftrace build's boot counts,
/// nothing dropped; then the ftrace build again through direct entries,
/// on the functions its ftrace sites traced: the same functions, and
/// `sched_clock_cpu`, `notrace`, traced too. (One test: each boot is a
/// minute of CI, and the first serves both comparisons.)
#[test]
fn direct_entries_trace_linux_with_and_without_ftrace() {
    let (_, _, ftrace) = traced("linux", SET, &["--mode", "trap", "--entry", "ftrace"]);
    for mode in ["trap", "exitless"] {
        let (err, _, v) = traced("linux-noftrace", SET, &["--mode", mode]);
        check_direct_run(&err, &v, mode);
        same_busy_functions(&counts(&ftrace), &counts(&v));
    }
    let planned: Vec<String> = counts(&ftrace).into_keys().collect();
    let mut set = planned.join(",");
    set.push_str(",sched_clock_cpu");
    let (err, _, direct) = traced("linux", &set, &["--mode", "trap", "--entry", "direct"]);
    check_direct_run(&err, &direct, "trap");
    let mut c = counts(&direct);
    assert!(c.remove("sched_clock_cpu").is_some_and(|n| n > 0), "{c:?}");
    assert_eq!(c.keys().cloned().collect::<Vec<_>>(), planned);
    same_busy_functions(&counts(&ftrace), &c);
}

/// What every direct run of `SET` must show: the summary and attach lines,
/// the task list walked, the mode, nothing dropped, the timers and the
/// scheduler called, the timer interrupt from the APIC vector.
fn check_direct_run(err: &str, v: &serde_json::Value, mode: &str) {
    assert!(err.contains("vmtrace: direct entries: "), "{err}");
    assert!(err.contains("direct sites patched"), "{err}");
    // The kernel's task list was walked at the attach: at least init_task
    // (the boot CPU's idle task) is always runnable.
    let checked: u64 = err
        .split(" runnable tasks' stacks checked")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{err}"));
    assert!(checked >= 1, "{err}");
    assert_eq!(v["mode"], mode);
    assert_eq!(v["dropped"].as_u64(), Some(0));
    if mode == "exitless" {
        assert_eq!(v["trap_exits"].as_u64(), Some(0));
    }
    let c = counts(v);
    for f in ["hrtimer_interrupt", "schedule", "try_to_wake_up"] {
        assert!(c.get(f).is_some_and(|&n| n > 0), "{f}: {c:?}");
    }
    let hrtimer = v["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "hrtimer_interrupt")
        .unwrap();
    let callers = hrtimer["callers"].as_array().unwrap();
    assert!(
        callers
            .iter()
            .any(|c| c["name"].as_str().unwrap().contains("apic_timer_interrupt")),
        "{hrtimer}"
    );
}

/// `list` on the kernel without ftrace: from its bzImage alone (kallsyms
/// gives the functions' ranges) the functions traceable by direct entry
/// are those traceable with its vmlinux, less those kallsyms cannot prove
/// function entries (no call targets them: it has no symbol types, and
/// this kernel no ftrace sites; `hrtimer_wakeup`, a timer's function, is
/// one), which are refused as such; `--entry ftrace` is refused in one
/// line.
#[test]
fn a_kernel_without_ftrace_lists_from_its_bzimage_alone() {
    let (kernel, _) = guest("linux-noftrace");
    let alone = std::env::temp_dir().join(format!("vmtrace-direct-alone-{}", std::process::id()));
    std::fs::create_dir_all(&alone).unwrap();
    let copy = alone.join("bzImage");
    std::fs::copy(&kernel, &copy).unwrap();
    let list = |kernel: &std::path::Path| {
        let out = vmtrace(&["list", "--kernel", kernel.to_str().unwrap(), "hrtimer_*"]);
        assert!(out.status.success(), "{}", stderr(&out));
        (stdout(&out), stderr(&out))
    };
    let traceable = |out: &str| -> Vec<String> {
        let names = out.lines().filter(|l| !l.contains('['));
        names.map(str::to_string).collect()
    };
    let (with_vmlinux, _) = list(&kernel);
    let with_vmlinux = traceable(&with_vmlinux);
    let (alone_out, err) = list(&copy);
    let from_kallsyms = traceable(&alone_out);
    assert!(err.contains("traceable by direct entry"), "{err}");
    assert!(err.contains("kallsyms"), "{err}");
    assert!(from_kallsyms.len() > 10, "{from_kallsyms:?}");
    let not_entry = |name: &str| {
        alone_out.lines().any(|l| {
            l.strip_prefix(name).is_some_and(|r| {
                r.starts_with(" [refused (not-entry): not a function entry: no call targets it")
            })
        })
    };
    for name in &with_vmlinux {
        assert!(
            from_kallsyms.contains(name) || not_entry(name),
            "{name}:\n{alone_out}"
        );
    }
    assert!(from_kallsyms.iter().all(|n| with_vmlinux.contains(n)));
    assert!(with_vmlinux.iter().any(|n| n == "hrtimer_wakeup"));
    assert!(not_entry("hrtimer_wakeup"), "{alone_out}");
    let out = vmtrace(&[
        "--kernel",
        copy.to_str().unwrap(),
        "--entry",
        "ftrace",
        "--trace",
        "hrtimer_*",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("has no __mcount_loc table") && err.contains("--entry direct"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&alone);
}
