//! Functions whose return `--graph` must not hook.
//!
//! `--graph` replaces a traced call's return address on the guest stack
//! with an address in vmtrace's code page, outside the kernel's text. The
//! guest's unwinders cannot map it back (they know only ftrace's
//! `return_to_handler` and kretprobes' trampoline: `ftrace_graph_ret_addr`,
//! `kretprobe_find_ret_addr`, which read the guest task's own shadow
//! stacks), so an ORC or frame-pointer unwind stops at such a frame:
//! `unwind_get_return_address` returns 0 there. That only degrades stack
//! traces, except where the kernel acts on the unwind. BPF exceptions do
//! (Linux 6.7 and later): `bpf_throw` walks the stack from its own frame
//! (`arch_bpf_stack_walk`, which starts in `__unwind_start`) up to the BPF
//! program that called it, and dereferences what it found; a hooked
//! return on the way leaves it with no program, and the guest oopses. So
//! the functions on that walk are left out of `--graph`, by name.

use std::sync::Arc;

use crate::plan::site_index::SiteIndex;
use crate::plan::Plan;

/// The functions left out of `--graph`, and why (one line).
pub const UNHOOKABLE: &[(&str, &str)] = &[
    (
        "bpf_throw",
        "BPF exceptions walk the stack from it to the BPF program",
    ),
    (
        "arch_bpf_stack_walk",
        "bpf_throw's stack walk passes through it",
    ),
    (
        "__unwind_start",
        "every ORC unwind of the current task starts in it, bpf_throw's too",
    ),
];

/// Why `--graph` must not hook the return of function `name` (None: it may).
pub fn unhookable(name: &str) -> Option<&'static str> {
    UNHOOKABLE
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, why)| *why)
}

/// Sets `plan` to hook returns (`Plan::graph`), leaving out of it the
/// traced functions whose return must not be hooked; returns their names,
/// in trace order (empty: none).
pub fn hook_returns(plan: &mut Plan) -> Vec<String> {
    plan.graph = true;
    let names: Vec<&str> = plan
        .funcs
        .iter()
        .map(|&f| plan.image.functions[f].name.as_str())
        .collect();
    // By any of a function's names: the one it is reported by may be an
    // alias of the name listed here.
    let keep: Vec<bool> = plan
        .funcs
        .iter()
        .map(|&f| plan.image.names(f).all(|n| unhookable(n).is_none()))
        .collect();
    let left_out: Vec<String> = names
        .iter()
        .zip(&keep)
        .filter(|(_, &k)| !k)
        .map(|(n, _)| n.to_string())
        .collect();
    if left_out.is_empty() {
        return left_out;
    }
    // Renumber the kept functions; their sites keep their addresses.
    let mut slot = vec![None; keep.len()];
    let mut funcs = Vec::new();
    for (i, &f) in plan.funcs.iter().enumerate() {
        if keep[i] {
            slot[i] = Some(funcs.len() as u32);
            funcs.push(f);
        }
    }
    let targets = plan
        .index
        .sites()
        .filter_map(|(addr, f)| slot[f as usize].map(|s| (addr, s)))
        .collect();
    plan.funcs = funcs;
    plan.index = Arc::new(SiteIndex::new(targets));
    left_out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_exact() {
        assert!(unhookable("bpf_throw").is_some());
        assert!(unhookable("__unwind_start").is_some());
        assert_eq!(unhookable("bpf_throw_x"), None);
        assert_eq!(unhookable("unwind_next_frame"), None);
    }
}
