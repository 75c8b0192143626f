//! `vmtrace list --entry direct` on distribution kernels names the rule
//! that refused each function (issue 35), on real symbols of Debian's own
//! cloud kernels (guest/build.sh debian-6.12 and debian-6.1; each vmlinuz
//! alone, symbols from its kallsyms). No guest is booted.
//!
//! One of the examples has none on either kernel: a short
//! displaced indirect call (a retpoline kernel calls through
//! `__x86_indirect_thunk_*`, 5 bytes); the project's own kernel without
//! ftrace has two (tracer/src/kernel/direct/real_tests.rs). 6.12 has no
//! `.parainstructions` (6.8 made paravirt sites alternatives), so the
//! paravirt example is 6.1's.

mod common;

use std::path::Path;

use common::qemu::{debian_61, debian_612};
use common::{s, stderr, stdout, vmtrace};

/// Functions of Debian's 6.12 cloud kernel and the rule that must refuse
/// each, with why.
const REFUSED_612: [(&str, &str); 4] = [
    // The assembly entry a new task starts at (`copy_thread` makes it the
    // return address; nothing calls it): 6.12's `ret_from_fork`, which
    // became a C function called from here.
    ("ret_from_fork_asm", "not-entry"),
    // The padding before `schedule` (CONFIG_FUNCTION_PADDING_ALIGNMENT:
    // call depth tracking's thunk), a symbol kallsyms lists but no code
    // enters at.
    ("__pfx_schedule", "not-entry"),
    // A static call's trampoline: `static_call_update` rewrites its jump.
    ("__SCT__preempt_schedule", "static-call-trampoline"),
    // Begins with a paravirt call (`call *pv_ops.mmu.pmd_val`), in 6.12 an
    // alternative the kernel patches at boot (`mov rax, rdi` natively).
    ("pmd_val", "alternative"),
];

/// The same on Debian's 6.1 cloud kernel (bookworm's own).
const REFUSED_61: [(&str, &str); 3] = [
    // 6.1's assembly `ret_from_fork`: begins `mov rdi, rax; call
    // schedule_tail`, and no call targets it.
    ("ret_from_fork", "not-entry"),
    // GCC's cold part of `name_to_dev_t`, jumped to from its function.
    ("name_to_dev_t.cold", "not-entry"),
    // Begins with a `.parainstructions` site (PARAVIRT_XXL's
    // `call *pv_ops.cpu.cpuid`, which the kernel patches at boot).
    ("__cpuid", "paravirt"),
];

/// `list --entry direct` of `kernel` marks each of `refused` with its rule.
fn lists_the_rules(kernel: &Path, refused: &[(&str, &str)]) {
    let names: Vec<&str> = refused.iter().map(|r| r.0).collect();
    let glob = names.join(",");
    let out = vmtrace(&["list", "--entry", "direct", "--kernel", s(kernel), &glob]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for &(name, rule) in refused {
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.split_whitespace().next() == Some(name))
            .collect();
        assert!(!lines.is_empty(), "{name} not listed:\n{text}");
        for l in lines {
            assert!(
                l.contains(&format!("[refused ({rule}): ")),
                "{name}: want rule {rule}: {l}"
            );
        }
    }
}

#[test]
fn list_names_the_rule_that_refused_each_function() {
    lists_the_rules(&debian_612(), &REFUSED_612);
    lists_the_rules(&debian_61(), &REFUSED_61);
}
