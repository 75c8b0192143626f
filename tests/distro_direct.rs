//! `vmtrace list --entry direct` on a distribution kernel names the rule
//! that refused each function (issue 35), on real symbols of Debian's 6.12
//! cloud kernel (guest/build.sh debian-6.12; its vmlinuz alone, symbols
//! from its kallsyms). No guest is booted.
//!
//! Two of the examples have none on this kernel: a `.cold`
//! fragment (its kallsyms names none: such code counts in the function
//! before it) and a short displaced indirect call (a retpoline kernel calls
//! through `__x86_indirect_thunk_*`, 5 bytes, in its file).

mod common;

use common::qemu::debian_612;
use common::{s, stderr, stdout, vmtrace};

/// Functions of Debian's 6.12 cloud kernel and the rule that must refuse
/// each, with why.
const REFUSED: [(&str, &str); 4] = [
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
    // Begins with a paravirt call (`call *pv_ops.mmu.pmd_val`, in 6.12 an
    // alternative the kernel patches at boot: `mov rax, rdi` natively).
    ("pmd_val", "paravirt"),
];

#[test]
fn list_names_the_rule_that_refused_each_function() {
    let bz = debian_612();
    let names: Vec<&str> = REFUSED.iter().map(|r| r.0).collect();
    let glob = names.join(",");
    let out = vmtrace(&["list", "--entry", "direct", "--kernel", s(&bz), &glob]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for (name, rule) in REFUSED {
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.split_whitespace().next() == Some(name))
            .collect();
        assert!(!lines.is_empty(), "{name} not listed:\n{text}");
        for l in lines {
            assert!(
                l.contains("[refused: ") && l.contains(rule),
                "{name}: want rule {rule}: {l}"
            );
        }
    }
}
