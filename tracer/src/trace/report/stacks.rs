//! The kernel stacks of `--stack` functions in the report, as perf's
//! `report -g caller` shows call chains: per stack function, its distinct
//! stacks, most calls first, each with its share of the function's calls
//! that carry a stack, its frames from the outermost down to the function.

use std::fmt::Write as _;

use super::numbers::thousands;
use super::{escape, Report};
use crate::kernel::symbols::Symbol;
use crate::trace::model::{Stack, Trace};
use crate::trace::stacks::StackFrame;

/// Stacks the text report shows per function; the rest are summed up.
pub const STACKS_SHOWN: usize = 10;

/// One `--stack` function's stacks.
#[derive(Debug)]
pub struct FuncStacks<'t> {
    /// Index into `Trace::functions`.
    pub index: usize,
    pub func: &'t Symbol,
    /// Its stored entries (on the counted vCPUs) that carry a stack.
    pub calls: u64,
    /// (stack id, entries), most entries first, then by id.
    pub stacks: Vec<(u32, u64)>,
}

/// The `--stack` functions (`TraceMeta::stack_funcs`, in that order) and
/// their stacks, counting the entries on `cpus` (all: None).
pub fn func_stacks<'t>(trace: &'t Trace, cpus: Option<&[u32]>) -> Vec<FuncStacks<'t>> {
    let mut per: Vec<std::collections::HashMap<u32, u64>> =
        vec![Default::default(); trace.functions.len()];
    let counted = |c: u32| cpus.is_none_or(|s| s.contains(&c));
    for e in &trace.events {
        if e.stack != 0 && !e.is_return() && counted(e.cpu) {
            if let Some(m) = per.get_mut(e.func as usize) {
                *m.entry(e.stack).or_default() += 1;
            }
        }
    }
    let mut seen = vec![false; trace.functions.len()];
    trace
        .meta
        .stack_funcs
        .iter()
        .filter_map(|&f| {
            let i = f as usize;
            let func = trace.functions.get(i)?;
            // Listed once (a corrupt list could repeat one).
            if std::mem::replace(&mut seen[i], true) {
                return None;
            }
            let mut stacks: Vec<(u32, u64)> = per[i].iter().map(|(&id, &n)| (id, n)).collect();
            stacks.sort_by_key(|&(id, n)| (std::cmp::Reverse(n), id));
            Some(FuncStacks {
                index: i,
                func,
                calls: stacks.iter().map(|&(_, n)| n).sum(),
                stacks,
            })
        })
        .collect()
}

/// The header's line: how stacks were unwound and how many stored entries
/// carry one; None when the trace has no stacks and says nothing of them.
pub(super) fn stacks_line(report: &Report) -> Option<String> {
    let trace = report.trace;
    let note = &trace.meta.stacks;
    if note.is_empty() && trace.stacks.is_empty() {
        return None;
    }
    let with = crate::trace::stacks::entries_with_stacks(trace);
    let how = if note.is_empty() {
        "unwinder unknown".into()
    } else {
        escape(note)
    };
    Some(format!(
        "{how}; {} of {} stored calls carry one, {} distinct",
        thousands(with),
        thousands(report.entries_stored),
        thousands(trace.stacks.len() as u64)
    ))
}

/// The stacks section (nothing without `--stack` functions).
pub(super) fn write_stacks(out: &mut String, report: &Report) {
    let cpus = report.filtered.then_some(&report.cpus[..]);
    let funcs = func_stacks(report.trace, cpus);
    if funcs.is_empty() {
        return;
    }
    out.push_str("#\n# kernel stacks, caller first (perf report -g caller):\n#\n");
    for f in &funcs {
        let name = escape(&f.func.name);
        if f.calls == 0 {
            writeln!(out, "{name}: no stored call with a stack").unwrap();
            continue;
        }
        writeln!(
            out,
            "{name}: {} with a stack, {} distinct",
            counted(f.calls, "call", "calls"),
            thousands(f.stacks.len() as u64)
        )
        .unwrap();
        for &(id, n) in f.stacks.iter().take(STACKS_SHOWN) {
            let Some(stack) = report.trace.stacks.get(id as usize - 1) else {
                continue;
            };
            let share = 100.0 * n as f64 / f.calls as f64;
            writeln!(out, "  {share:6.2}%  {}", counted(n, "call", "calls")).unwrap();
            write_chain(out, report.trace, stack, &name);
        }
        if f.stacks.len() > STACKS_SHOWN {
            let rest = &f.stacks[STACKS_SHOWN..];
            let calls: u64 = rest.iter().map(|&(_, n)| n).sum();
            writeln!(
                out,
                "  ... {} more {} ({})",
                thousands(rest.len() as u64),
                if rest.len() == 1 { "stack" } else { "stacks" },
                counted(calls, "call", "calls")
            )
            .unwrap();
        }
    }
}

/// One stack, outermost frame first, down to the function `name`; a cut
/// stack starts with why.
fn write_chain(out: &mut String, trace: &Trace, stack: &Stack, name: &str) {
    const INDENT: &str = "            ";
    if !stack.end.is_complete() {
        writeln!(out, "{INDENT}... (cut: {})", stack.end.describe()).unwrap();
    }
    for i in (0..stack.frames.len()).rev() {
        writeln!(out, "{INDENT}{}", StackFrame::of(trace, stack, i).label()).unwrap();
    }
    writeln!(out, "{INDENT}{name}").unwrap();
}

fn counted(n: u64, one: &str, many: &str) -> String {
    format!("{} {}", thousands(n), if n == 1 { one } else { many })
}
