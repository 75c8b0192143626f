//! The mini guest's tasks, `args=1`, `stack=1` and `direct=1` functions
//! (guest/mini/README.md "Tasks", "args=1", "stack=1", "direct=1"), run without
//! tracing: its per-task counts add up to its per-CPU counts and are
//! exactly the README's formulas, its tasks are the README's, its argument
//! and return value sums are what the README's formulas give, its
//! stack_leaf calls per path are the README's counts and chains (each
//! checked by the guest against its own frame-pointer chain); and every
//! build of it carries BTF (a `.BTF` section) and
//! its per-CPU template in `.data..percpu`, where pahole looks for per-CPU
//! variables.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::*;
use object::{Object, ObjectSection, ObjectSymbol};
use vm_memory::{Bytes, GuestAddress};

/// The mini guest's builds.
const VARIANTS: [&str; 4] = ["mini", "mini-percpu-addr", "mini-rethunk", "mini-noftrace"];

/// The graph workload's functions that every iteration calls once.
const GRAPH_ONCE: [&str; 6] = [
    "graph_depth",
    "graph_depth2",
    "graph_depth3",
    "graph_leaf",
    "graph_tail_caller",
    "graph_tail_callee",
];

/// args=1's functions, each called once an iteration.
const ARGS_FUNCS: [&str; 5] = [
    "args_six",
    "args_errno",
    "args_void",
    "args_struct",
    "args_seven",
];

/// What a run's command line turns on (guest/mini/README.md).
#[derive(Clone, Copy)]
struct Workloads {
    graph: bool,
    args: bool,
    stack: bool,
    direct: bool,
}

impl Workloads {
    fn of(cmdline: &str) -> Self {
        let on = |w: &str| cmdline.split_whitespace().any(|t| t == w);
        Workloads {
            graph: on("graph=1"),
            args: on("args=1"),
            stack: on("stack=1"),
            direct: on("direct=1"),
        }
    }
}

/// stack=1's chains at stack_leaf's entry, by path (README "stack=1").
const STACK_CHAINS: [(&str, &str); 4] = [
    (
        "outer_a",
        "stack_leaf,stack_mid,stack_outer_a,mini_main,_start",
    ),
    ("outer_b", "stack_leaf,stack_outer_b,mini_main,_start"),
    ("direct", "stack_leaf,mini_main,_start"),
    (
        "recurse",
        "stack_leaf,stack_recurse,stack_recurse,stack_recurse,mini_main,_start",
    ),
];

/// args_errno(n)'s return value: ERRNO_PATTERN[n % 6].
const ERRNO_PATTERN: [i64; 6] = [0, -2, 1, -22, 4096, -11];

fn elf(variant: &str) -> std::path::PathBuf {
    if variant == "mini" {
        mini_elf()
    } else {
        mini_variant_elf(variant)
    }
}

/// Run a build through the CLI (no tracing); its console.
fn run(kernel: &Path, cpus: u32, cmdline: &str) -> String {
    let out = vmtrace(&[
        "--kernel",
        s(kernel),
        "--cpus",
        &cpus.to_string(),
        "--cmdline",
        cmdline,
        "--timeout",
        "120",
        "--console",
        "-",
    ]);
    let err = stderr(&out);
    assert!(out.status.success(), "exit {:?}: {err}", out.status);
    assert!(err.contains("guest powered off (status 0)"), "{err}");
    stdout(&out)
}

/// The iteration before whose calls mini-b renames itself: the first
/// i >= iters / 2 that it runs (i % 3 == 2).
fn rename_at(iters: u64) -> u64 {
    let half = iters / 2;
    half + (5 - half % 3) % 3
}

/// vCPU cpu's tasks in printed order: swapper/C, mini-a/C, mini-b/C and,
/// once renamed, mini-b2/C.
fn tasks_of(cpu: u32, renamed: bool) -> Vec<MiniTask> {
    let a = 1000 + 10 * cpu as i32 + 1;
    let mut t = vec![
        (cpu, 0, 0, format!("swapper/{cpu}")),
        (cpu, a, a, format!("mini-a/{cpu}")),
        (cpu, a + 1, a, format!("mini-b/{cpu}")),
    ];
    if renamed {
        t.push((cpu, a + 1, a, format!("mini-b2/{cpu}")));
    }
    t
}

/// The per-task counts the README's formulas give for `n` iterations on
/// each CPU (`rename` from the command line's iters), and the tasks.
fn expected_task_counts(
    cpus: u32,
    n: &BTreeMap<u32, u64>,
    rename: u64,
    on: Workloads,
) -> MiniTaskCounts {
    let mut want = BTreeMap::new();
    for cpu in 0..cpus {
        let tasks = tasks_of(cpu, true);
        let mut add = |task: &MiniTask, f: &str, k: u64| {
            if k > 0 {
                let (c, p, t, comm) = task.clone();
                *want.entry((c, p, t, comm, f.to_string())).or_insert(0) += k;
            }
        };
        for i in 0..n[&cpu] {
            let task = match i % 3 {
                0 => &tasks[0],
                1 => &tasks[1],
                _ if i >= rename => &tasks[3],
                _ => &tasks[2],
            };
            for f in MINI_FUNCS {
                let even = f != "hrtimer_try_to_cancel" || i % 2 == 0;
                add(task, f, u64::from(even));
            }
            if on.graph {
                for f in GRAPH_ONCE {
                    add(task, f, 1);
                }
                add(task, "graph_recurse", 6);
                add(task, "graph_abandon_outer", u64::from(i % 10 == 0));
                add(task, "graph_abandoned", u64::from(i % 10 == 0));
                add(task, "graph_long", u64::from(i % 50 == 0));
            }
            if on.args {
                for f in ARGS_FUNCS {
                    add(task, f, 1);
                }
            }
            if on.stack {
                let every = |k: u64| u64::from(i % k == 0);
                add(task, "stack_outer_a", 1);
                add(task, "stack_mid", 1);
                add(task, "stack_outer_b", every(2));
                add(task, "stack_recurse", 3 * every(8));
                add(task, "stack_leaf", 1 + every(2) + every(4) + every(8));
            }
            if on.direct {
                // The k-th every (k + 1)-th iteration (common's formula).
                for (k, f) in (1..).zip(MINI_DIRECT_FUNCS) {
                    add(task, f, u64::from(i % k == 0));
                }
            }
        }
        // Before the loop and after it, the idle task is current.
        add(&tasks[0], "mini_main", 1);
        add(&tasks[0], "mini_init_setup", u64::from(cpu == 0));
        add(
            &tasks[0],
            "graph_migrate",
            u64::from(on.graph && cpu == 0 && cpus >= 2),
        );
    }
    want
}

/// Check one console: tasks, per-task counts against the per-CPU ones and
/// the formulas. `iters`: the command line's (which sets the rename), and
/// in count mode the iterations; in loop mode each CPU's do_idle count is.
fn check_tasks(console: &str, cpus: u32, iters: u64, loop_mode: bool, on: Workloads) {
    let (printed, done) = parse_mini_console(console);
    assert_eq!(done, (0..cpus).collect::<Vec<_>>(), "{console}");
    let (counts, tasks) = parse_mini_task_counts(console);
    let n: BTreeMap<u32, u64> = (0..cpus)
        .map(|c| (c, printed[&(c, "do_idle".to_string())]))
        .collect();
    if loop_mode {
        assert!(n.values().all(|&k| k > 0), "every CPU iterated: {n:?}");
        println!("mode=loop: iterations per CPU {n:?}");
    } else {
        assert!(n.values().all(|&k| k == iters), "{n:?}");
    }
    let rename = rename_at(iters);

    // The tasks: each CPU's, in order, mini-b2 once renamed.
    for cpu in 0..cpus {
        let mine: Vec<MiniTask> = tasks.iter().filter(|t| t.0 == cpu).cloned().collect();
        assert_eq!(mine, tasks_of(cpu, n[&cpu] > rename), "{console}");
    }

    // Per-task counts add up to the per-CPU ones, exactly.
    for ((cpu, f), &total) in &printed {
        let sum: u64 = counts
            .iter()
            .filter(|((c, _, _, _, g), _)| c == cpu && g == f)
            .map(|(_, k)| k)
            .sum();
        assert_eq!(
            sum, total,
            "{f} on cpu {cpu}: tasks' {sum}, the CPU's {total}"
        );
    }

    // And each is its formula.
    assert_eq!(
        counts,
        expected_task_counts(cpus, &n, rename, on),
        "{console}"
    );
    check_stack(console, &n, on.stack);

    // Every function each iteration calls is called by all three tasks.
    let every_iteration = |f: &str| {
        MINI_FUNCS.contains(&f) && f != "hrtimer_try_to_cancel"
            || GRAPH_ONCE.contains(&f)
            || f == "graph_recurse"
            || ARGS_FUNCS.contains(&f)
    };
    for (cpu, f) in printed.keys() {
        if n[cpu] >= 3 && every_iteration(f) {
            let pids: std::collections::BTreeSet<i32> = counts
                .keys()
                .filter(|(c, _, _, _, g)| c == cpu && g == f)
                .map(|k| k.1)
                .collect();
            assert_eq!(pids.len(), 3, "{f} on cpu {cpu}: called by {pids:?}");
        }
    }
}

/// stack=1's lines: per CPU, each path's stack_leaf calls for its `n`
/// iterations and its chain; none without stack=1.
fn check_stack(console: &str, n: &BTreeMap<u32, u64>, stack: bool) {
    let mut want = BTreeMap::new();
    for (&cpu, &iters) in n.iter().filter(|_| stack) {
        for (path, chain) in STACK_CHAINS {
            let s = MiniStack {
                calls: mini_stack_expected(path, iters),
                chain: chain.split(',').map(str::to_string).collect(),
            };
            want.insert((cpu, path.to_string()), s);
        }
    }
    assert_eq!(parse_mini_stack(console), want, "{console}");
    assert_eq!(console.contains("mini: stack"), stack, "{console}");
}

#[test]
fn task_counts_add_up_to_the_per_cpu_counts_in_every_build() {
    for (variant, cpus, cmdline, iters) in [
        ("mini", 2, "iters=100", 100),
        ("mini", 3, "iters=101 graph=1 args=1", 101),
        ("mini", 2, "iters=37 stack=1", 37),
        ("mini-percpu-addr", 3, "iters=50 graph=1 args=1 stack=1", 50),
        ("mini-rethunk", 2, "iters=30 args=1 stack=1", 30),
        ("mini-noftrace", 1, "iters=10 graph=1 args=1 stack=1", 10),
        ("mini-noftrace", 2, "iters=61 direct=1", 61),
        ("mini-rethunk", 1, "iters=20 stack=1 direct=1", 20),
        ("mini", 2, "iters=30 graph=1 args=1 stack=1 direct=1", 30),
        // mini-b never runs (i = 0, 1), so it is not renamed either.
        ("mini", 1, "iters=2", 2),
    ] {
        let console = run(&elf(variant), cpus, cmdline);
        println!(
            "{variant} {cmdline}: {} task lines",
            console.matches("mini: task").count()
        );
        let on = Workloads::of(cmdline);
        check_tasks(&console, cpus, iters, false, on);
        // args lines come with args=1 only, direct=1's counts with it.
        assert_eq!(
            console.contains("mini: args"),
            on.args,
            "{variant} {cmdline}: {console}"
        );
        let (printed, _) = parse_mini_console(&console);
        for cpu in 0..cpus {
            for f in MINI_DIRECT_FUNCS {
                let want = on.direct.then(|| mini_direct_expected(f, iters));
                let got = printed.get(&(cpu, f.to_string())).copied();
                assert_eq!(got, want, "{variant} {cmdline}: {f} on cpu {cpu}");
            }
        }
    }
}

#[test]
fn task_counts_in_mode_loop_keep_every_formula() {
    const CPUS: u32 = 2;
    let kernel = mini_elf();
    let capture = Capture::default();
    // iters= sets only the rename in mode=loop (at iteration 101).
    let cfg = mini_config(
        &kernel,
        CPUS as u64,
        "mode=loop iters=200 graph=1 args=1 stack=1 direct=1",
        &capture,
    );
    let vm = vmm::Vm::create(cfg).unwrap();
    let running = vm.start(no_tracers(CPUS as usize), false).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let stop_gpa = vmm::layout::kernel_virt_to_phys(elf_symbol(&kernel, "mini_stop")).unwrap();
    running
        .memory()
        .write_obj(1u32, GuestAddress(stop_gpa))
        .unwrap();
    let reason = running.wait();
    running.finish();
    let console = capture.text();
    assert_eq!(reason, vmm::StopReason::PowerOff(0), "{console}");
    check_tasks(
        &console,
        CPUS,
        200,
        true,
        Workloads::of("graph=1 args=1 stack=1 direct=1"),
    );
    check_args(&console, &kernel, CPUS);
}

/// Sums of the values the README's formulas give each args=1 function on
/// vCPU `cpu` in `n` iterations, as the guest prints them.
fn expected_args(cpu: u64, n: u64, task_addr: &dyn Fn(u64) -> u64) -> BTreeMap<String, MiniArgs> {
    fn signed(v: u64) -> i128 {
        i128::from(v as i64)
    }
    let mut six = [0u64; 7]; // a, b, t, s, ch, e, ret
    let mut errno = [0u64; 2]; // n, ret
    let mut errno_rets = [0u64; 6];
    let mut void = 0u64;
    let mut pair = [0u64; 4]; // p.key, p.val, after, ret
    let mut seven = [0u64; 8]; // a1..a7, ret
    for i in 0..n {
        let b = (i % 7) as i64 - 3;
        let e = 0u64.wrapping_sub(100003 * i).wrapping_sub(cpu);
        let vals = [
            0xfedc_0000_0000_0000u64
                .wrapping_add(cpu << 32)
                .wrapping_add(i),
            b as u64,
            task_addr(i),
            [0u64, 1, 2, 64][(i % 4) as usize],
            200 + i % 50,
            e,
            e.wrapping_add(b as u64),
        ];
        for (s, v) in six.iter_mut().zip(vals) {
            *s = s.wrapping_add(v);
        }
        let ret = ERRNO_PATTERN[(i % 6) as usize];
        errno[0] += i & 0xffff_ffff;
        errno[1] = errno[1].wrapping_add(ret as u64);
        errno_rets[(i % 6) as usize] += 1;
        void += i;
        let after = -((i % 9) as i64) as u64;
        let (key, val) = (0x5000 + i, i % 100);
        for (s, v) in pair
            .iter_mut()
            .zip([key, val, after, (key + val).wrapping_add(after)])
        {
            *s = s.wrapping_add(v);
        }
        let a = [
            (i as i64 - 500) as u64,
            0u64.wrapping_sub(1000 * i),
            0x70_0000_0000 + i,
            -((i % 13) as i64) as u64,
            i << 20,
            !i,
            0u64.wrapping_sub(7 + i),
        ];
        let ret = a.iter().fold(0u64, |s, &v| s.wrapping_add(v));
        for (s, v) in seven.iter_mut().zip(a.iter().copied().chain([ret])) {
            *s = s.wrapping_add(v);
        }
    }
    let sums = |kv: &[(&str, i128)]| -> BTreeMap<String, i128> {
        kv.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    };
    let mut want = BTreeMap::new();
    let mut add = |f: &str, sums: BTreeMap<String, i128>| {
        want.insert(f.to_string(), MiniArgs { calls: n, sums });
    };
    add(
        "args_six",
        sums(&[
            ("a", six[0].into()),
            ("b", signed(six[1])),
            ("t", six[2].into()),
            ("s", six[3].into()),
            ("ch", six[4].into()),
            ("e", signed(six[5])),
            ("ret", signed(six[6])),
        ]),
    );
    let mut e = sums(&[("n", errno[0].into()), ("ret", signed(errno[1]))]);
    for (v, k) in ERRNO_PATTERN.iter().zip(errno_rets) {
        e.insert(format!("ret[{v}]"), k.into());
    }
    add("args_errno", e);
    add("args_void", sums(&[("n", void.into())]));
    add(
        "args_struct",
        sums(&[
            ("p.key", pair[0].into()),
            ("p.val", pair[1].into()),
            ("after", signed(pair[2])),
            ("ret", signed(pair[3])),
        ]),
    );
    let names = ["a1", "a2", "a3", "a4", "a5", "a6", "a7", "ret"];
    let unsigned = ["a3", "a6"];
    add(
        "args_seven",
        names
            .iter()
            .zip(seven)
            .map(|(k, v)| {
                let v = if unsigned.contains(k) {
                    v.into()
                } else {
                    signed(v)
                };
                (k.to_string(), v)
            })
            .collect(),
    );
    want
}

/// The symbol's address and size.
fn symbol(kernel: &Path, name: &str) -> (u64, u64) {
    let data = std::fs::read(kernel).unwrap();
    let obj = object::File::parse(&*data).unwrap();
    let sym = obj
        .symbols()
        .find(|s| s.name() == Ok(name))
        .unwrap_or_else(|| panic!("no symbol {name}"));
    (sym.address(), sym.size())
}

/// Every args=1 line is its formula (args_six's `t`, the current task, from
/// mini_tasks' address and size).
fn check_args(console: &str, kernel: &Path, cpus: u32) {
    let (printed, _) = parse_mini_console(console);
    let got = parse_mini_args(console);
    let (tasks, size) = symbol(kernel, "mini_tasks");
    let task_size = size / (64 * 3);
    assert_eq!(task_size * 64 * 3, size, "mini_tasks is [64][3]");
    for cpu in 0..cpus {
        let n = printed[&(cpu, "do_idle".to_string())];
        let cpu = u64::from(cpu);
        let task = |i: u64| tasks + (cpu * 3 + i % 3) * task_size;
        for (f, want) in expected_args(cpu, n, &task) {
            assert_eq!(got[&(cpu as u32, f.clone())], want, "{f} on cpu {cpu}");
        }
    }
    assert_eq!(got.len(), cpus as usize * ARGS_FUNCS.len(), "{got:?}");
}

#[test]
fn args_sums_are_the_readmes_formulas() {
    for (variant, cpus, iters) in [("mini", 2u32, 100u64), ("mini-percpu-addr", 3, 61)] {
        let kernel = elf(variant);
        let console = run(&kernel, cpus, &format!("iters={iters} args=1"));
        check_args(&console, &kernel, cpus);
        let got = parse_mini_args(&console);
        // A few by hand: the first CPU's args_errno after 100 iterations.
        if iters == 100 {
            let e = &got[&(0, "args_errno".to_string())];
            assert_eq!(e.sums["ret[-2]"], 17, "{e:?}");
            assert_eq!(e.sums["ret[4096]"], 16, "{e:?}");
            assert_eq!(e.sums["n"], 4950, "{e:?}");
        }
    }
}

/// The `.BTF` section: a BTF header (magic 0xeb9f, version 1) and the
/// string section's NUL-separated strings.
fn btf_strings(kernel: &Path) -> Vec<String> {
    let data = std::fs::read(kernel).unwrap();
    let obj = object::File::parse(&*data).unwrap();
    let btf = obj
        .section_by_name(".BTF")
        .unwrap_or_else(|| panic!("{}: no .BTF section", kernel.display()));
    let b = btf.data().unwrap();
    assert!(
        b.len() > 24,
        "{}: .BTF is {} bytes",
        kernel.display(),
        b.len()
    );
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap()) as usize;
    assert_eq!(u16::from_le_bytes([b[0], b[1]]), 0xeb9f, "BTF magic");
    assert_eq!(b[2], 1, "BTF version");
    let (hdr_len, str_off, str_len) = (u32_at(4), u32_at(16), u32_at(20));
    let strs = &b[hdr_len + str_off..hdr_len + str_off + str_len];
    strs.split(|&c| c == 0)
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

#[test]
fn every_build_has_btf_and_a_per_cpu_template() {
    for variant in VARIANTS {
        let kernel = elf(variant);
        let names = btf_strings(&kernel);
        let pcpu_hot = variant == "mini-percpu-addr";
        let mut want = vec![
            "task_struct",
            "pid_t",
            "pid",
            "tgid",
            "comm",
            ".data..percpu",
            "cpu_number",
            "current_task",
            "mini_state",
            "MINI_STATE_DEAD",
            "mini_pair",
            "do_idle",
            "mini_main",
        ];
        want.extend(ARGS_FUNCS);
        if pcpu_hot {
            want.extend(["pcpu_hot", "preempt_count"]);
        }
        for name in want {
            assert!(
                names.iter().any(|n| n == name),
                "{variant}: {name:?} not in its BTF"
            );
        }

        // The template: cpu_number first; the current task in its own
        // variable (up to 6.1's layout) or in pcpu_hot (6.2+'s).
        let data = std::fs::read(&kernel).unwrap();
        let obj = object::File::parse(&*data).unwrap();
        let sec = obj.section_by_name(".data..percpu").expect(".data..percpu");
        let (start, size) = (sec.address(), sec.size());
        let holder = if pcpu_hot { "pcpu_hot" } else { "current_task" };
        let (cpu_number, _) = symbol(&kernel, "cpu_number");
        let (var, var_size) = symbol(&kernel, holder);
        assert_eq!(cpu_number, start, "{variant}: cpu_number first");
        assert!(
            var >= start && var + var_size <= start + size,
            "{variant}: {holder} in .data..percpu"
        );
        assert_eq!(var_size, if pcpu_hot { 24 } else { 8 }, "{variant}");
        if pcpu_hot {
            assert!(
                start >= 0xffff_ffff_8000_0000,
                "{variant}: linked in the image"
            );
            assert!(
                obj.symbols().all(|s| s.name() != Ok("current_task")),
                "{variant}: no current_task variable"
            );
        } else {
            assert_eq!(start, 0, "{variant}: linked at 0, symbols are offsets");
        }
    }
}
