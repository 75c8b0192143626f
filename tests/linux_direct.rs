//! Direct entries on Linux (docs/direct.md): the default 6.1 guest built
//! without FUNCTION_TRACER (`guest/build.sh linux-noftrace`, no
//! `__mcount_loc`) traced through its functions' first instructions, in
//! both modes on 2 vCPUs; and the ftrace build traced by direct entries on
//! the functions its ftrace sites trace. Slow on
//! emulating hosts: one guest at a time, each boot ends at init's death.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use common::*;

/// The hrtimers and a scheduler set.
const SET: &str = "hrtimer_*,schedule,pick_next_task_fair,update_curr,\
                   try_to_wake_up,enqueue_task_fair,dequeue_task_fair";

/// A function among this many most called in one build's boot is called
/// in the other's too (calls of rarer ones depend on when the attach
/// came; how many calls a boot makes depends on the host's speed, so
/// the busiest are taken by rank, not by a count).
const BUSIEST: usize = 6;

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
        "--cmdline".into(),
        TEST_BOOT_CMDLINE.into(),
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

/// The [`BUSIEST`] functions of `a` are called in `b`, and the other way,
/// of the functions both traced (two builds inline differently: the
/// ftrace build has `hrtimer_active` out of line, the other inlines it).
fn same_busy_functions(a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>) {
    let mut both = 0;
    for (x, y) in [(a, b), (b, a)] {
        for (f, n) in busiest(x).into_iter().filter(|&(_, n)| n > 0) {
            let Some(&m) = y.get(f) else { continue };
            assert!(m > 0, "{f}: {n} calls, then none\n{a:?}\n{b:?}");
            both += 1;
        }
    }
    assert!(both >= 4, "{a:?}\n{b:?}");
}

/// The [`BUSIEST`] functions of `x` by their calls, most called first.
fn busiest(x: &BTreeMap<String, u64>) -> Vec<(&String, u64)> {
    let mut v: Vec<(&String, u64)> = x.iter().map(|(f, &n)| (f, n)).collect();
    v.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
    v.truncate(BUSIEST);
    v
}

/// The ftrace build through direct entries in trap mode with stacks, on
/// the functions its ftrace sites trace (its plan with `--entry ftrace`):
/// the same functions, and `sched_clock_cpu`, `notrace`, traced too; then
/// the build without ftrace through direct entries in trap mode (by hand,
/// with the function graph, arguments and stacks, the whole kernel text
/// compared byte for byte: `by_hand`) and in exitless mode (with the
/// function graph and arguments): the timers and the scheduler traced (the
/// timer interrupt from the APIC vector), the same busy functions as the
/// ftrace build's boot counts, nothing dropped. (One test: each boot is a
/// minute or two of CI, and the first serves both comparisons; the ftrace
/// sites' own boot is linux_guest.rs's.)
#[test]
fn direct_entries_trace_linux_with_and_without_ftrace() {
    let planned = ftrace_plan(SET);
    let mut set = planned.join(",");
    set.push_str(",sched_clock_cpu");
    let extra = ["--mode", "trap", "--entry", "direct", "--stack", STACK];
    let (err, _, direct) = traced("linux", &set, &extra);
    check_direct_run(&err, &direct, "trap");
    check_stacks(&direct);
    let mut ftrace_build = counts(&direct);
    let clock = ftrace_build.remove("sched_clock_cpu");
    assert!(clock.is_some_and(|n| n > 0), "{ftrace_build:?}");
    let traced_names: Vec<String> = ftrace_build.keys().cloned().collect();
    assert_eq!(traced_names, planned);
    let trap = by_hand("linux-noftrace", SET);
    same_busy_functions(&ftrace_build, &trap);
    let args = format!("--args={ARGS}");
    let extra = ["--mode", "exitless", "--graph", &args];
    let (err, _, v) = traced("linux-noftrace", SET, &extra);
    check_direct_run(&err, &v, "exitless");
    check_graph_and_args(&v);
    same_busy_functions(&ftrace_build, &counts(&v));
}

/// The functions the ftrace build's sites trace of `set` (the plan a run
/// with `--entry ftrace` makes), by name, sorted.
fn ftrace_plan(set: &str) -> Vec<String> {
    guest("linux");
    let vmlinux = root().join("guest/out/vmlinux");
    let plan = tracer::plan::Plan::new(&vmlinux, &[set.to_string()], &[]).unwrap();
    let names: std::collections::BTreeSet<String> = plan
        .funcs
        .iter()
        .map(|&f| plan.image.functions[f].name.clone())
        .collect();
    names.into_iter().collect()
}

/// Traced with `--args`: a function of `SET` with a prototype in BTF.
const ARGS: &str = "hrtimer_start_range_ns";
/// Traced with `--stack`.
const STACK: &str = "schedule";

/// With `--graph` and `--args ARGS`: returns hooked (every function's
/// durations; hrtimer_interrupt's calls all return), nothing lost, ARGS
/// has its prototype (the JSON says what of it cannot be shown, if any).
fn check_graph_and_args(v: &serde_json::Value) {
    let graph = &v["graph"];
    assert!(graph["returns"].as_u64().is_some_and(|n| n > 0), "{graph}");
    assert_eq!(graph["returns_dropped"].as_u64(), Some(0), "{graph}");
    assert_eq!(v["values"]["args"], true, "{v}");
    let f = function(v, "hrtimer_interrupt");
    assert!(f["returns"].as_u64().is_some_and(|n| n > 0), "{f}");
    assert!(f["total_ns"].as_u64().is_some(), "{f}");
}

/// With `--stack STACK`: STACK's calls have stacks, each named from its
/// caller (the innermost frame) outwards, some unwound to the bottom of
/// their stack.
fn check_stacks(v: &serde_json::Value) {
    let f = function(v, STACK);
    let ids = f["stacks"].as_array().unwrap_or_else(|| panic!("{f}"));
    let stacks = v["stacks"].as_array().unwrap();
    let of = |id: &serde_json::Value| &stacks[id["id"].as_u64().unwrap() as usize - 1];
    let first = of(ids.first().unwrap_or_else(|| panic!("{f}")));
    let frames = first["frames"].as_array().unwrap();
    assert!(frames.len() >= 2, "{first}");
    assert!(frames.iter().all(|f| f["function"].is_string()), "{first}");
    assert!(ids.iter().any(|id| of(id)["complete"] == true), "{f}");
}

/// Function `name` of a JSON report.
fn function<'a>(v: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    v["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == name)
        .unwrap_or_else(|| panic!("no {name}"))
}

/// What every direct run of `SET` must show: the summary and attach lines,
/// the task list walked, the mode, nothing dropped, the timers and the
/// scheduler called, the timer interrupt from the APIC vector.
fn check_direct_run(err: &str, v: &serde_json::Value, mode: &str) {
    assert!(err.contains("vmtrace: direct entries: "), "{err}");
    assert!(err.contains("direct sites patched"), "{err}");
    // The kernel's task list was walked at the attach: at least init_task
    // (the boot CPU's idle task) has a stack.
    let checked: u64 = err
        .split(" tasks' stacks checked")
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
    let hrtimer = function(v, "hrtimer_interrupt");
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

/// Boot `name` on 2 vCPUs and trace `trace` by direct entries in trap mode
/// with the function graph, `--args ARGS` and `--stack STACK`, through the
/// library: attached as a run attaches (`guest_ready` polled, the attach
/// retried at each pause that finds the guest not ready), but with the
/// kernel's whole text read under the very pause that patches it. After the
/// guest's end and the detach, every byte of that text is as it was then.
/// Checks what `check_direct_run` checks; returns the calls per function.
fn by_hand(name: &str, trace: &str) -> BTreeMap<String, u64> {
    use std::time::Duration;
    use tracer::kernel::find::{kernel_image, Given};
    use tracer::kernel::kaslr::{detect, Detected};
    use tracer::plan::entry::EntryChoice;
    use tracer::plan::{ModeChoice, Request, TracePlan};
    use tracer::session::{Attach, Recording, Tracer};
    use vm_memory::{Bytes, GuestAddress};
    use vmm::boot::cmdline::{kernel_cmdline, Cmdline};

    let (kernel, initrd) = guest(name);
    let _one = ONE_GUEST.lock().unwrap_or_else(|e| e.into_inner());
    let file = vmm::boot::KernelFile::open(&kernel).unwrap();
    let emulator_host = vmm::host::emulates_ring0();
    let cmdline = kernel_cmdline(
        file.kind(),
        emulator_host,
        Cmdline::Append(&[TEST_BOOT_CMDLINE.to_string()]),
    )
    .unwrap();
    let image = kernel_image(&file, Given::Nothing).unwrap().image;
    let req = Request {
        trace: trace.split(',').map(str::to_string).collect(),
        notrace: Vec::new(),
        graph: true,
        mode: ModeChoice::Trap,
        ring_events: None,
        cpus: 2,
        emulator_host,
        linux: true,
        pids: Vec::new(),
        comm: None,
        args: vec![ARGS.to_string()],
        retval: false,
        stack: vec![STACK.to_string()],
        entry: EntryChoice::Auto,
        events: Vec::new(),
        module_events: Vec::new(),
    };
    let plan = TracePlan::build(image, &req).unwrap();
    let sym = |n: &str| plan.plan.image.symbol(n).unwrap().addr;
    let text = (sym("_stext"), sym("_etext"));
    let console = Capture::default();
    let vm = vmm::Vm::create(vmm::VmConfig {
        kernel: file,
        initrd: Some(initrd),
        size: vmm::VmSize::new(2, 96).unwrap(),
        cmdline,
        console: Box::new(console.clone()),
        timeout: Some(Duration::from_secs(900)),
        hide_hypercalls: emulator_host,
    })
    .unwrap();
    let rec = Recording::memory(50_000_000);
    let (mut tracer, handlers) = Tracer::create(plan.plan, 2, plan.mode, rec).unwrap();
    let running = vm.start(handlers, false).unwrap();
    let mem = running.memory().clone();
    let read_text = |gpa: u64| {
        let mut b = vec![0u8; (text.1 - text.0) as usize];
        mem.read_slice(&mut b, GuestAddress(gpa)).unwrap();
        b
    };
    let (before, text_gpa) = loop {
        if let Some(stop) = running.wait_stop(Duration::from_millis(50)) {
            panic!(
                "the guest ended before the attach: {stop}\n{}",
                console.text()
            );
        }
        if !tracer.guest_ready(&**running.ram()) {
            continue;
        }
        let paused = running.pause_all();
        let Ok(Detected::Offset(o)) = detect(&paused, &tracer.plan().image) else {
            continue;
        };
        let gpa = o.phys_of(text.0).unwrap();
        let before = read_text(gpa);
        if let Attach::Attached(_) = tracer.attach(&paused).unwrap() {
            break (before, gpa);
        }
    };
    let patched = tracer.attach_counts.patched;
    assert!(patched > 0);
    let stop = running.wait();
    running.finish();
    let detached = tracer.detach(&mem).unwrap();
    assert_eq!((detached.restored, detached.changed), (patched, 0));
    let after = read_text(text_gpa);
    let differ: Vec<String> = before
        .iter()
        .zip(&after)
        .enumerate()
        .filter(|(_, (a, b))| a != b)
        .map(|(i, (a, b))| format!("{:#x}: {a:#04x} -> {b:#04x}", text.0 + i as u64))
        .collect();
    eprintln!(
        "linux_direct: {patched} sites patched; {} bytes of text compared after the detach",
        before.len()
    );
    assert!(
        differ.is_empty(),
        "{} bytes of the kernel text differ after the detach: {:?}",
        differ.len(),
        &differ[..differ.len().min(16)]
    );
    let text_out = console.text();
    for bad in [
        "WARNING:",
        "BUG:",
        "Oops",
        "general protection",
        "invalid opcode",
    ] {
        assert!(!text_out.contains(bad), "the guest complained:\n{text_out}");
    }
    assert!(text_out.contains("Run /init as init process"), "{text_out}");
    let trace = tracer.finish(&kernel, stop.to_string());
    assert_eq!(trace.meta.events_dropped, 0);
    let index = |f: &str| trace.functions.iter().position(|x| x.name == f);
    let calls = |f: &str| index(f).map_or(0, |i| trace.counts[i].iter().sum::<u64>());
    for f in [
        "hrtimer_interrupt",
        "schedule",
        "try_to_wake_up",
        ARGS,
        STACK,
    ] {
        assert!(calls(f) > 0, "{f}");
    }
    // Every function's returns hooked; the timer interrupt's all return.
    let hrtimer = index("hrtimer_interrupt").unwrap();
    assert!(trace.returns[hrtimer].iter().sum::<u64>() > 0);
    // ARGS's entries carry its arguments, STACK's their stacks, unwound
    // past their caller; no other function's do.
    let (args, stack) = (index(ARGS).unwrap() as u32, index(STACK).unwrap() as u32);
    let entries = trace.events.iter().filter(|e| e.slot & 1 == 0);
    for e in entries {
        assert_eq!(trace.args_of(e).is_some(), e.func == args, "{e:?}");
        if e.func != stack {
            assert_eq!(e.stack, 0, "{e:?}");
        }
    }
    let stacks: Vec<_> = trace
        .events
        .iter()
        .filter(|e| e.func == stack && e.slot & 1 == 0)
        .filter_map(|e| trace.stack_of(e))
        .collect();
    assert!(!stacks.is_empty());
    assert!(stacks.iter().any(|s| s.frames.len() >= 2), "{stacks:?}");
    trace
        .functions
        .iter()
        .zip(&trace.counts)
        .map(|(f, c)| (f.name.clone(), c.iter().sum()))
        .collect()
}
