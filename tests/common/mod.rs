//! Shared by the integration tests: the workspace, the guests, the binary.
#![allow(dead_code)]

// The QEMU guests of the attach tests; the allow above covers it too, so the
// test binaries that boot no QEMU compile it without warnings.
pub mod console;
pub mod libvirt;
pub mod qemu;
pub mod qemu_vm;
// The `vmtrace attach` runs of the QEMU tests (covered by the same allow).
pub mod attach;
pub mod guard;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// guest/out/mini.elf, built once per test binary.
pub fn mini_elf() -> PathBuf {
    static BUILD: Once = Once::new();
    BUILD.call_once(|| {
        let st = Command::new("bash")
            .arg(root().join("guest/build.sh"))
            .arg("mini")
            .status()
            .expect("run guest/build.sh mini");
        assert!(st.success(), "guest/build.sh mini failed");
    });
    root().join("guest/out/mini.elf")
}

/// guest/out/NAME.elf for a variant of the mini guest (`bash guest/build.sh
/// NAME`, e.g. mini-percpu-addr), built once per test binary and name.
pub fn mini_variant_elf(name: &str) -> PathBuf {
    static BUILT: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if !built.iter().any(|n| n == name) {
        let st = Command::new("bash")
            .arg(root().join("guest/build.sh"))
            .arg(name)
            .status()
            .expect("run guest/build.sh");
        assert!(st.success(), "guest/build.sh {name} failed");
        built.push(name.to_string());
    }
    root().join(format!("guest/out/{name}.elf"))
}

/// Run the vmtrace binary.
pub fn vmtrace(args: &[&str]) -> Output {
    let o = Command::new(env!("CARGO_BIN_EXE_vmtrace"))
        .args(args)
        .output()
        .expect("run vmtrace");
    read_back(&stderr(&o));
    o
}

/// A run's data file, which vmtrace wrote itself, must read back: when it
/// does not, `run` and `attach` go on with the counts alone and say so on
/// stderr, a fault of vmtrace's whatever the test asserts next (an event
/// entry's fields once reached the file before its arguments).
pub fn read_back(stderr: &str) {
    assert!(
        !stderr.contains("the report has the counts only"),
        "vmtrace could not read back its own data file:\n{stderr}"
    );
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The workload functions in the order the mini guest prints them.
pub const MINI_FUNCS: [&str; 8] = [
    "do_idle",
    "schedule",
    "hrtimer_start_range_ns",
    "hrtimer_try_to_cancel",
    "hrtimer_interrupt",
    "__hrtimer_run_queues",
    "hrtimer_wakeup",
    "tick_sched_timer",
];

/// What the mini guest's workload arithmetic says each CPU calls in N iterations.
pub fn mini_expected(func: &str, iters: u64) -> u64 {
    match func {
        "hrtimer_try_to_cancel" => iters.div_ceil(2),
        _ => iters,
    }
}

/// The mini guest's `direct=1` functions (guest/mini/direct.S, README
/// "direct=1") in the order it prints them: the k-th (from 0) is called in
/// iterations i with i % (k + 1) == 0. The first three are safe direct
/// sites; the others are refused (jump-into-site, indirect-jump, ex-table).
pub const MINI_DIRECT_FUNCS: [&str; 6] = [
    "direct_riprel",
    "direct_endbr",
    "direct_jcc",
    "direct_jump_into",
    "direct_table",
    "direct_extable",
];

/// A `direct=1` function's calls on one CPU in `iters` iterations:
/// ceil(iters / (k + 1)) for the k-th of [`MINI_DIRECT_FUNCS`].
pub fn mini_direct_expected(func: &str, iters: u64) -> u64 {
    let k = MINI_DIRECT_FUNCS
        .iter()
        .position(|f| *f == func)
        .unwrap_or_else(|| panic!("no direct=1 function {func:?}"));
    iters.div_ceil(k as u64 + 1)
}

/// (cpu, function) -> count, from `mini: cpu C FUNC N` lines; plus the CPUs that said `done`.
pub fn parse_mini_console(text: &str) -> (BTreeMap<(u32, String), u64>, Vec<u32>) {
    let mut counts = BTreeMap::new();
    let mut done = Vec::new();
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["mini:", "cpu", c, "done"] => done.push(c.parse().unwrap()),
            ["mini:", "cpu", c, f, n] => {
                counts.insert((c.parse().unwrap(), f.to_string()), n.parse().unwrap());
            }
            _ => {}
        }
    }
    done.sort_unstable();
    (counts, done)
}

/// (cpu, name) -> value, from the mini guest's `mini: stat cpu C NAME N` lines
/// (measurements such as `graph_long_ticks_sum`, not call counts, so
/// [`parse_mini_console`] leaves them out).
pub fn parse_mini_stats(text: &str) -> BTreeMap<(u32, String), u64> {
    let mut stats = BTreeMap::new();
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        if let ["mini:", "stat", "cpu", c, name, n] = w.as_slice() {
            stats.insert((c.parse().unwrap(), name.to_string()), n.parse().unwrap());
        }
    }
    stats
}

/// A task of the mini guest, as its `mini: task` lines name it: (cpu, pid,
/// tgid, comm). mini-b is named twice, before and after its rename.
pub type MiniTask = (u32, i32, i32, String);

/// (cpu, pid, tgid, comm, function) -> calls.
pub type MiniTaskCounts = BTreeMap<(u32, i32, i32, String, String), u64>;

/// (cpu, pid, tgid, comm, function) -> calls, from the mini guest's `mini:
/// task cpu C pid P tgid T comm NAME calls F=N ...` lines (guest/mini/README.md
/// "Tasks"; a function a task never called is absent), and the tasks in the
/// order printed (those with no calls too).
pub fn parse_mini_task_counts(text: &str) -> (MiniTaskCounts, Vec<MiniTask>) {
    let mut counts = BTreeMap::new();
    let mut tasks = Vec::new();
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        let ["mini:", "task", "cpu", c, "pid", p, "tgid", t, "comm", comm, "calls", calls @ ..] =
            w.as_slice()
        else {
            continue;
        };
        let num = |v: &str| -> i64 {
            v.parse()
                .unwrap_or_else(|e| panic!("{v:?} in {line:?}: {e}"))
        };
        let task: MiniTask = (
            num(c) as u32,
            num(p) as i32,
            num(t) as i32,
            comm.to_string(),
        );
        for call in calls {
            let (f, n) = call
                .split_once('=')
                .unwrap_or_else(|| panic!("{call:?} in {line:?} is not FUNCTION=CALLS"));
            let key = (task.0, task.1, task.2, task.3.clone(), f.to_string());
            let old = counts.insert(key, num(n) as u64);
            assert!(old.is_none(), "{f} twice for {task:?}: {line:?}");
        }
        tasks.push(task);
    }
    (counts, tasks)
}

/// What an `args=1` function of the mini guest received and returned on
/// one CPU: its calls, and the sums (wrapping, of the values as their C
/// types hold them) of its return values (`ret`), of each parameter (by
/// name) and, for args_errno, the calls that returned each value
/// (`ret[-2]`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MiniArgs {
    pub calls: u64,
    pub sums: BTreeMap<String, i128>,
}

/// (cpu, function) -> [`MiniArgs`], from the mini guest's `mini: args cpu C
/// FUNC calls N KEY=VALUE ...` lines (guest/mini/README.md "args=1").
pub fn parse_mini_args(text: &str) -> BTreeMap<(u32, String), MiniArgs> {
    let mut all = BTreeMap::new();
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        let ["mini:", "args", "cpu", c, f, "calls", n, sums @ ..] = w.as_slice() else {
            continue;
        };
        let bad = |what: &str| -> ! { panic!("{what} in {line:?}") };
        let mut args = MiniArgs {
            calls: n.parse().unwrap_or_else(|_| bad("calls")),
            sums: BTreeMap::new(),
        };
        for kv in sums {
            let (k, v) = kv.split_once('=').unwrap_or_else(|| bad(kv));
            let v: i128 = v.parse().unwrap_or_else(|_| bad(kv));
            assert!(
                args.sums.insert(k.to_string(), v).is_none(),
                "{k} twice in {line:?}"
            );
        }
        let cpu: u32 = c.parse().unwrap_or_else(|_| bad("cpu"));
        assert!(
            all.insert((cpu, f.to_string()), args).is_none(),
            "{f} twice on cpu {cpu}"
        );
    }
    all
}

/// The paths by which the mini guest's `stack=1` workload calls stack_leaf,
/// in the order its `mini: stack` lines print them (guest/mini/README.md
/// "stack=1").
pub const MINI_STACK_PATHS: [&str; 4] = ["outer_a", "outer_b", "direct", "recurse"];

/// stack_leaf's calls through `path` on one CPU in `iters` iterations of
/// the `stack=1` workload: outer_a every iteration, outer_b every 2nd,
/// direct every 4th, recurse every 8th (from iteration 0).
pub fn mini_stack_expected(path: &str, iters: u64) -> u64 {
    match path {
        "outer_a" => iters,
        "outer_b" => iters.div_ceil(2),
        "direct" => iters.div_ceil(4),
        "recurse" => iters.div_ceil(8),
        _ => panic!("no stack=1 path {path:?}"),
    }
}

/// One `stack=1` path on one CPU: stack_leaf's calls through it, and its
/// chain at stack_leaf's entry, innermost first (stack_leaf, its callers,
/// ..., mini_main, _start).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MiniStack {
    pub calls: u64,
    pub chain: Vec<String>,
}

/// (cpu, path) -> [`MiniStack`], from the mini guest's `mini: stack cpu C
/// PATH N CHAIN` lines (CHAIN comma-separated; guest/mini/README.md
/// "stack=1").
pub fn parse_mini_stack(text: &str) -> BTreeMap<(u32, String), MiniStack> {
    let mut all = BTreeMap::new();
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        let ["mini:", "stack", "cpu", c, path, n, chain] = w.as_slice() else {
            continue;
        };
        let bad = |what: &str| -> ! { panic!("{what} in {line:?}") };
        let cpu: u32 = c.parse().unwrap_or_else(|_| bad("cpu"));
        let stack = MiniStack {
            calls: n.parse().unwrap_or_else(|_| bad("calls")),
            chain: chain.split(',').map(str::to_string).collect(),
        };
        assert!(
            all.insert((cpu, path.to_string()), stack).is_none(),
            "{path} twice on cpu {cpu}"
        );
    }
    all
}

/// A console sink the tests can read.
#[derive(Clone, Default)]
pub struct Capture(pub Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Capture {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// The address of a symbol in an ELF file.
pub fn elf_symbol(path: &Path, name: &str) -> u64 {
    let data = std::fs::read(path).unwrap();
    let obj = object::File::parse(&*data).unwrap();
    use object::{Object, ObjectSymbol};
    obj.symbols()
        .find(|s| s.name() == Ok(name))
        .map(|s| s.address())
        .unwrap_or_else(|| panic!("no symbol {name}"))
}

/// A VM configuration for the mini guest with its console captured.
pub fn mini_config(kernel: &Path, cpus: u64, cmdline: &str, console: &Capture) -> vmm::VmConfig {
    vmm::VmConfig {
        kernel: vmm::boot::KernelFile::open(kernel).unwrap(),
        initrd: None,
        size: vmm::VmSize::new(cpus, 64).unwrap(),
        cmdline: cmdline.into(),
        console: Box::new(console.clone()),
        timeout: Some(std::time::Duration::from_secs(300)),
        hide_hypercalls: false,
    }
}

/// One do-nothing trap handler per vCPU, for runs without a tracer.
pub fn no_tracers(cpus: usize) -> Vec<Box<dyn vmm::TrapHandler>> {
    (0..cpus)
        .map(|_| Box::new(vmm::NoTracer) as Box<dyn vmm::TrapHandler>)
        .collect()
}

/// A hang guard only: a refusal takes well under a second, but on a shared
/// noisy host a process can wait long for a CPU, so no bound by time is
/// asserted. That no guest ran is shown by stderr's single line (a guest's
/// console goes to stderr).
pub const REFUSED_WITHIN: Duration = Duration::from_secs(300);

pub fn assert_bad_input(args: &[&str], needle: &str) {
    let started = std::time::Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_vmtrace"))
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run vmtrace");
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > REFUSED_WITHIN {
            let _ = child.kill();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "args {args:?}: stderr {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "one line for {args:?}: {err}"
    );
    assert!(err.starts_with("vmtrace: "), "{err}");
    assert!(err.contains(needle), "expected {needle:?} in {err}");
    assert!(
        !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
        "{err}"
    );
}

/// Run the vmtrace binary in `dir` (where `record` writes vmtrace.data).
pub fn vmtrace_in(dir: &Path, args: &[&str]) -> Output {
    let o = Command::new(env!("CARGO_BIN_EXE_vmtrace"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run vmtrace");
    read_back(&stderr(&o));
    o
}

/// Run vmtrace with `--export json=FILE` added; its output (the guest
/// console is on its stderr, the text report on its stdout) and the JSON
/// report (the file is removed).
pub fn run_json(args: &[&str]) -> (Output, serde_json::Value) {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let json = std::env::temp_dir().join(format!("vmtrace-json-{}-{n}.json", std::process::id()));
    let export = format!("json={}", json.display());
    let mut all = args.to_vec();
    all.extend(["--export", &export]);
    let out = vmtrace(&all);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    let v = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    (out, v)
}

/// The default 6.1 guest's guest/out/{bzImage,vmlinux}, built (copied from
/// the cache when warm) if absent; for tests that read it without booting.
pub fn linux_61() -> (PathBuf, PathBuf) {
    static BUILD: Once = Once::new();
    let (bz, vmlinux) = (
        root().join("guest/out/bzImage"),
        root().join("guest/out/vmlinux"),
    );
    BUILD.call_once(|| {
        if !bz.is_file() || !vmlinux.is_file() {
            let st = Command::new("bash")
                .arg(root().join("guest/build.sh"))
                .arg("linux")
                .status()
                .expect("run guest/build.sh linux");
            assert!(st.success(), "guest/build.sh linux failed");
        }
    });
    (bz, vmlinux)
}

/// The Linux 6.12 guest's guest/out/linux-6.12/{bzImage,vmlinux}, or None
/// (saying so) when it is not built: `bash guest/build.sh linux-6.12`
/// (.ci/run does) takes minutes, more than a test should start on its own.
pub fn linux_612() -> Option<(PathBuf, PathBuf)> {
    let dir = root().join("guest/out/linux-6.12");
    let (bz, vmlinux) = (dir.join("bzImage"), dir.join("vmlinux"));
    if bz.is_file() && vmlinux.is_file() {
        Some((bz, vmlinux))
    } else {
        eprintln!(
            "SKIPPED: {} is not built; run `bash guest/build.sh linux-6.12`",
            bz.display()
        );
        None
    }
}

/// Offset of a bzImage's payload in the file: after the setup sectors, at
/// the setup header's `payload_offset`.
pub fn payload_offset(bzimage: &[u8]) -> usize {
    let sects = match bzimage[0x1f1] {
        0 => 4,
        n => usize::from(n),
    };
    let off = u32::from_le_bytes(bzimage[0x248..0x24c].try_into().unwrap());
    (sects + 1) * 512 + off as usize
}

/// A fresh directory for one test: `vmtrace-PREFIX-PID-NAME` in the
/// temporary directory, emptied if a previous run left it.
pub fn scratch_in(prefix: &str, name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vmtrace-{prefix}-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A path as the `&str` an argument list takes.
pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Send `sig` to `child`.
pub fn kill(child: &Child, sig: libc::c_int) {
    // SAFETY: kill(2) on our own child's pid (not yet waited for).
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
}

/// Wait for `child`, killing it if it hangs (a guard against a hang, far
/// above any run's time: no test asserts a time).
pub fn wait_bounded(child: Child) -> Output {
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(o) => {
            let o = o.unwrap();
            read_back(&stderr(&o));
            o
        }
        Err(_) => {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!("vmtrace hung after the signal");
        }
    }
}

/// Appended to the command line of the own VMM's Linux test boots
/// (`--cmdline`): work of the guest's boot that nothing the tests check
/// needs, skipped (every guest instruction is emulated on emulating hosts;
/// docs/benchmarks.md, CI's Linux lane, has the figures):
/// - `ftrace_check_for_weak_functions` queues a scan of every ftrace
///   record, a kallsyms lookup each, under `ftrace_lock`
///   (kernel/trace/ftrace.c): it disables the records of overridden
///   `__weak` functions for the guest's own ftrace, which no test uses,
///   and vmtrace leaves those sites out itself (`tracer::kernel::sites`).
///   On one vCPU it held the CPU for a third of the boot, and the next
///   initcall (`oom_init`'s `kthread_run`) waited behind it;
/// - `kfunc_init` (a late initcall), the BPF kfunc registration, parses the
///   kernel's whole BTF;
/// - `trace_eval_init` queues the rewrite of every event's print format
///   (its enum names made numbers) and `tracer_init_tracefs` the guest's
///   tracefs files (kernel/trace/trace.c): vmtrace reads event formats from
///   the kernel image and needs no tracefs (without the first the second
///   runs inline: both are skipped);
/// - `rodata=off`: no `mark_rodata_ro` (the page attributes of the
///   kernel's text and data, set just before init); vmtrace writes the
///   text through guest-physical memory, which they do not guard.
pub const TEST_BOOT_CMDLINE: &str = "initcall_blacklist=ftrace_check_for_weak_functions,\
     kfunc_init,trace_eval_init,tracer_init_tracefs rodata=off";

/// `vmt_hit [vmt_test]`'s index in `trace` and its calls (entries), in
/// time order.
pub fn vmt_hit_calls(
    trace: &tracer::trace::model::Trace,
) -> (usize, Vec<&tracer::trace::model::Event>) {
    let hit = (trace.functions.iter())
        .position(|f| f.name == "vmt_hit [vmt_test]")
        .unwrap_or_else(|| panic!("{:?}", trace.functions));
    let mut calls: Vec<_> = (trace.events.iter())
        .filter(|e| e.func as usize == hit && !e.is_return())
        .collect();
    calls.sort_by_key(|e| e.ts_ns);
    (hit, calls)
}

/// A module's file of `--modules DIR` (`file`, of `vmt_test` first loaded
/// during the trace) named where the symbols came from, at the end of the
/// kernel's source: in the run's JSON report `json`, and in its data file
/// `data` (its `FOOT`: its `HEAD` was written before the load).
pub fn module_file_named(json: &serde_json::Value, data: &Path, file: &Path) {
    let want = format!(
        "; modules' files by build id: vmt_test from {}",
        file.display()
    );
    let symbols = json["symbols"].as_str().unwrap_or_default();
    assert!(symbols.ends_with(&want), "{symbols}\n{want}");
    let saved = tracer::trace::datafile::load(data).unwrap();
    assert_eq!(saved.meta.symbols, symbols);
}
