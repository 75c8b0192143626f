//! `vmtrace list -e`: the project's 6.1 guest's events, the same from its
//! bzImage alone (kallsyms, BTF and a scan of the payload's .init.data)
//! and from its vmlinux; bad globs and kernels without events refused in
//! one line. No guest boots.

mod common;

use common::*;

const SCHED_SWITCH: &str = "sched:sched_switch (bool preempt, struct task_struct *prev, \
                            struct task_struct *next, unsigned int prev_state)\n";

#[test]
fn the_bzimage_alone_lists_the_events_its_vmlinux_does() {
    let (bz, vmlinux) = linux_61();
    let dir = std::env::temp_dir().join(format!("vmtrace-list-e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let alone = dir.join("bzImage");
    std::fs::copy(&bz, &alone).unwrap();
    let from_kallsyms = vmtrace(&["list", "-e", "--kernel", s(&alone)]);
    let switch = vmtrace(&["list", "-e", "*:*switch*", "--kernel", s(&alone)]);
    let _ = std::fs::remove_dir_all(&dir);
    let from_vmlinux = vmtrace(&["list", "--events", "--vmlinux", s(&vmlinux)]);
    for o in [&from_kallsyms, &from_vmlinux, &switch] {
        assert_eq!(o.status.code(), Some(0), "{}", stderr(o));
    }
    assert!(stderr(&from_kallsyms).contains("symbols from kallsyms in the bzImage"));
    assert_eq!(stdout(&from_kallsyms), stdout(&from_vmlinux));
    assert_eq!(stdout(&switch), SCHED_SWITCH);
    // Sorted, one per line, each SYSTEM:NAME; the ftrace system's formats
    // are not events the kernel lists.
    let lines: Vec<String> = stdout(&from_vmlinux).lines().map(str::to_owned).collect();
    let mut sorted = lines.clone();
    sorted.sort();
    assert_eq!(lines, sorted);
    assert!(lines
        .iter()
        .all(|l| l.split(' ').next().unwrap().contains(':')));
    assert!(!lines.iter().any(|l| l.starts_with("ftrace:")));
    assert!(stderr(&from_vmlinux).contains(&format!("{} events in ", lines.len())));
}

#[test]
fn bad_event_globs_and_kernels_without_events_are_refused() {
    let (bz, _) = linux_61();
    let k = s(&bz);
    assert_bad_input(
        &["list", "-e", "sched:sched_swich", "--kernel", k],
        "guest/out/vmlinux; closest: sched:sched_switch,",
    );
    assert_bad_input(&["list", "-e", "a:b:c", "--kernel", k], "more than one ':'");
    // A module's events by their module: only an attach (or `list
    // --qmp`) reads the guest's modules.
    assert_bad_input(
        &["list", "-e", "vmt_test:*:mod:vmt_test", "--kernel", k],
        "names a module's events (:mod:), which only an attach and a list of a running guest read",
    );
    assert_bad_input(
        &["list", "-e", "sched:*,", "--kernel", k],
        "empty event glob",
    );
    let mini = mini_elf();
    assert_bad_input(&["list", "-e", "--kernel", s(&mini)], "no event array");
    // Without BTF the structures' layouts are unknown: said, not guessed.
    let no_btf = std::env::temp_dir().join(format!("vmtrace-nobtf-{}.elf", std::process::id()));
    let st = std::process::Command::new("objcopy")
        .args(["--remove-section=.BTF", s(&mini), s(&no_btf)])
        .status()
        .unwrap();
    assert!(st.success());
    assert_bad_input(&["list", "-e", "--kernel", s(&no_btf)], "has no BTF");
    let _ = std::fs::remove_file(&no_btf);
}

/// `-e` on a run or `record` with an event the kernel does not have is
/// refused in one line, with the closest names, before anything boots;
/// so is `-e` with a kernel that has jump labels.
#[test]
fn unknown_events_on_a_run_or_record_are_refused_in_one_line() {
    let (bz, _) = linux_61();
    for cmd in [&[][..], &["record"][..]] {
        let args = [cmd, &["--kernel", s(&bz), "-e", "sched:sched_swich"][..]].concat();
        assert_bad_input(&args, "matches no event of");
        assert_bad_input(&args, "closest: sched:sched_switch");
    }
    // A kernel with jump labels (Debian's 6.12): the own VMM does not
    // enable its events yet (docs/events.md).
    let debian = qemu::debian_612();
    let out = vmtrace(&["--kernel", s(&debian), "-e", "sched:sched_switch"]);
    let err = stderr(&out);
    // (A note before it says where the symbols came from: a bzImage alone.)
    let last = err.lines().last().unwrap_or_default();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(last.contains("the kernel has jump labels"), "{err}");
}

/// The project's guests have no syscall metadata (tinyconfig): a
/// `syscalls:` event on the own VMM is refused in one line saying why and
/// naming the functions to trace instead; `raw_syscalls:*` (a flag in
/// every thread) is refused on any kernel, naming the syscall events.
#[test]
fn syscall_events_without_metadata_and_raw_syscalls_are_refused() {
    let (bz, _) = linux_61();
    assert_bad_input(
        &["--kernel", s(&bz), "-e", "syscalls:sys_enter_getpid"],
        "built without CONFIG_FTRACE_SYSCALLS",
    );
    assert_bad_input(
        &["--kernel", s(&bz), "-e", "syscalls:sys_exit_getpid"],
        "'__x64_sys_getpid'",
    );
    assert_bad_input(
        &["record", "--kernel", s(&bz), "-e", "raw_syscalls:sys_enter"],
        "trace 'syscalls:sys_enter_*' or 'syscalls:sys_exit_*' instead",
    );
}
