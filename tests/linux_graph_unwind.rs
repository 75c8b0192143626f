//! `--graph` and the guest's own stack unwinder (issue 22): what a guest
//! stack trace shows while a hooked return is on the stack, and the
//! functions `--graph` leaves out because the guest unwinds through their
//! return address (`tracer::plan::hookable`).

mod common;

use common::*;

/// `--graph` on nothing but a function the guest unwinds through: refused
/// before the guest boots, in one line naming it.
#[test]
fn graph_refuses_a_function_the_guest_unwinds_through() {
    let (bz, _) = linux_61();
    assert_bad_input(
        &[
            "--kernel",
            bz.to_str().unwrap(),
            "--trace",
            "__unwind_start",
            "--graph",
        ],
        "--graph cannot hook the return of __unwind_start (every ORC unwind of the current task starts in it, bpf_throw's too)",
    );
}

/// With others, it is left out of the plan (and said), the others kept.
#[test]
fn graph_leaves_out_the_functions_the_guest_unwinds_through() {
    let (_, vmlinux) = linux_61();
    let globs = ["__unwind_start,unwind_next_frame,hrtimer_interrupt".to_string()];
    let mut plan = tracer::plan::Plan::new(&vmlinux, &globs, &[]).unwrap();
    let sites = plan.index.addrs.len();
    let name = |p: &tracer::plan::Plan, f: usize| p.image.functions[f].name.clone();
    let mut before: Vec<String> = plan.funcs.iter().map(|&f| name(&plan, f)).collect();
    before.sort();
    assert_eq!(
        before,
        ["__unwind_start", "hrtimer_interrupt", "unwind_next_frame"]
    );
    let left_out = tracer::plan::hookable::hook_returns(&mut plan);
    assert!(plan.graph);
    assert_eq!(left_out, ["__unwind_start"]);
    let mut after: Vec<String> = plan.funcs.iter().map(|&f| name(&plan, f)).collect();
    after.sort();
    assert_eq!(after, ["hrtimer_interrupt", "unwind_next_frame"]);
    // One site each; every kept site maps to a kept function.
    assert_eq!(plan.index.addrs.len(), sites - 1);
    for (_, f) in plan.index.sites() {
        assert!((f as usize) < plan.funcs.len());
    }
}

/// A function is left out by any of its names: one reported by another
/// name whose alias is on the list is left out too.
#[test]
fn graph_leaves_out_a_function_by_any_of_its_names() {
    let (_, vmlinux) = linux_61();
    let globs = ["unwind_next_frame,hrtimer_interrupt".to_string()];
    let mut plan = tracer::plan::Plan::new(&vmlinux, &globs, &[]).unwrap();
    let next = plan
        .funcs
        .iter()
        .copied()
        .find(|&f| plan.image.functions[f].name == "unwind_next_frame")
        .unwrap();
    // As if the kernel had `bpf_throw` at the same address.
    plan.image.aliases.push((next, "bpf_throw".into()));
    plan.image.aliases.sort();
    let left_out = tracer::plan::hookable::hook_returns(&mut plan);
    assert_eq!(left_out, ["unwind_next_frame"]);
    let kept: Vec<&str> = plan
        .funcs
        .iter()
        .map(|&f| plan.image.functions[f].name.as_str())
        .collect();
    assert_eq!(kept, ["hrtimer_interrupt"]);
}

/// `vmtrace list` marks it.
#[test]
fn list_marks_the_functions_graph_leaves_out() {
    let (_, vmlinux) = linux_61();
    let o = vmtrace(&[
        "list",
        "--kernel",
        vmlinux.to_str().unwrap(),
        "__unwind_start,unwind_next_frame",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "__unwind_start [no --graph]\nunwind_next_frame\n"
    );
}

/// What the guest's own stack traces show while hooked returns are on its
/// stacks, on the default 6.1 guest (its unwinder: `CONFIG_UNWINDER_ORC`,
/// which prints its frames plain and the other kernel text addresses on
/// the stack as `? `, and stops at a return address outside kernel text).
/// `--trace kthread,__unwind_start --graph` hooks the return of
/// `kthread()` (into `ret_from_fork`) in every kernel thread, and leaves
/// `__unwind_start` out, saying so; `rdinit=` naming no file makes
/// the kernel panic once it has booted, and `panic_print=1` then prints
/// every task's stack. Each kernel thread's trace ends at `kthread` (then
/// at most a stale `? ` word) without `ret_from_fork`: that stack word is
/// vmtrace's hook, outside kernel text, so ORC stops there and the printer
/// skips it. The two tasks not started by `kthread()`
/// (init's `kernel_init` and `kthreadd`) still show `ret_from_fork`.
#[test]
fn linux_graph_stack_traces_leave_out_the_hooked_callers() {
    let (bz, _) = linux_61();
    let initrd = root().join("guest/out/initramfs.cpio.gz");
    let console = std::env::temp_dir().join(format!("vmtrace-unwind-{}.log", std::process::id()));
    let saved = std::env::temp_dir().join(format!("vmtrace-unwind-{}.vmtrace", std::process::id()));
    let cmdline = format!("panic_print=1 rdinit=/nonexistent {TEST_BOOT_CMDLINE}");
    let o = vmtrace(&[
        "--kernel",
        bz.to_str().unwrap(),
        "--initrd",
        initrd.to_str().unwrap(),
        "--cpus",
        "1",
        "--mem",
        "96",
        "--timeout",
        "600",
        "--cmdline",
        &cmdline,
        "--console",
        console.to_str().unwrap(),
        "--trace",
        "kthread,__unwind_start",
        "--graph",
        "-o",
        saved.to_str().unwrap(),
    ]);
    let err = stderr(&o);
    let text = std::fs::read_to_string(&console).unwrap_or_default();
    let _ = std::fs::remove_file(&console);
    assert!(
        err.contains("guest panicked: Kernel panic - not syncing: No working init found"),
        "{err}\n{text}"
    );
    assert!(
        err.contains(
            "--graph: the guest's own stack traces leave out the caller of each hooked call"
        ),
        "{err}"
    );
    assert!(
        err.contains("vmtrace: --graph: left out __unwind_start (every ORC unwind of the current task starts in it"),
        "{err}"
    );
    let t = tracer::trace::datafile::load(&saved).unwrap();
    let names: Vec<&str> = t.functions.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["kthread"]);
    let _ = std::fs::remove_file(&saved);
    // Every kthread() call is still running (hooked) at the panic.
    let g = tracer::trace::graph::Graph::build(&t);
    let calls: u64 = t.counts[0].iter().sum();
    assert!(calls > 5, "{calls} kernel threads");
    assert_eq!(g.frames.len() as u64, calls);
    assert!(g
        .frames
        .iter()
        .all(|f| f.end == tracer::trace::graph::End::Running));
    // The panic's task dump, one block per task (from `task:` on).
    let dump = &text[text.find("Kernel panic - not syncing").unwrap()..];
    let blocks: Vec<&str> = dump.split("task:").skip(1).collect();
    let (mut hooked, mut others) = (0, Vec::new());
    for b in &blocks {
        let lines: Vec<&str> = b
            .lines()
            .map(|l| l.trim_start_matches(|c| c != ']'))
            .collect();
        let at = |s: &str| lines.iter().position(|l| l.contains(s));
        match at(" kthread+0x") {
            Some(k) => {
                hooked += 1;
                // kthread's own line, then at most a stale word, then the end.
                assert!(at("ret_from_fork").is_none(), "task:{b}");
                let end = at("</TASK>").unwrap_or_else(|| panic!("task:{b}"));
                assert!(end > k && end <= k + 2, "task:{b}");
            }
            None => {
                assert!(at("ret_from_fork+0x").is_some(), "task:{b}");
                others.push(b.split_whitespace().next().unwrap_or(""));
            }
        }
    }
    assert_eq!(hooked, calls, "{dump}");
    assert_eq!(others, ["swapper/0", "kthreadd"], "{dump}");
}
