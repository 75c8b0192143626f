//! events/cost: an exitless event's guest instructions, beside a traced
//! function entry's (`event_` in the JSON's `figures`), its section of the
//! table and its method.

use std::fmt::{self, Write as _};

use super::super::measure::{EventCosts, COSTED_EVENTS, TRACE_GLOB};
use crate::config::BenchConfig;

/// events/cost's figures, in the order printed: the entry's instructions,
/// then per event its path beyond the entry and the two together.
pub fn figures(c: &EventCosts) -> Vec<(String, f64)> {
    let mut f = vec![("event_entry_guest_insns".to_string(), c.entry as f64)];
    for (name, p, copy) in &c.events {
        f.push((format!("event_{name}_path_insns"), p.total() as f64));
        if copy.calls > 0 {
            f.push((format!("event_{name}_copy_insns"), copy.insns as f64));
            f.push((format!("event_{name}_copy_calls"), copy.calls as f64));
        }
        f.push((
            format!("event_{name}_guest_insns"),
            (c.entry + p.total() + copy.insns) as f64,
        ));
    }
    f
}

/// events/cost's section.
pub fn write(o: &mut String, c: &EventCosts, cfg: &BenchConfig) -> fmt::Result {
    let vmlinux = cfg
        .vmlinux
        .as_deref()
        .map_or_else(String::new, |v| format!(" of {}", v.display()));
    writeln!(
        o,
        "events/cost: guest instructions per exitless event, counted in the code{vmlinux}"
    )?;
    writeln!(
        o,
        "  a function entry (vmtrace's trampoline, as call/exitless counts it): {}",
        c.entry
    )?;
    for (name, p, copy) in &c.events {
        let copies = match copy.calls {
            0 => String::new(),
            n => format!(
                " + its strings' copies {} (and {n} calls of the kernel's nofault copies, \
                 not counted)",
                copy.insns
            ),
        };
        writeln!(
            o,
            "  {name}: {} = the entry's {} + its path's {} (enabled branch {}, static call's \
             trampoline {}, __traceiter_{name} {}){copies}",
            c.entry + p.total() + copy.insns,
            c.entry,
            p.total(),
            p.branch,
            p.trampoline,
            p.iterator
        )?;
    }
    Ok(())
}

pub fn method() -> String {
    format!(
        "counted, never run: the 6.1 default guest's vmlinux (--vmlinux) planned as \
         `--trace '{TRACE_GLOB}' -e {COSTED_EVENTS}` would be. A function entry: the exitless \
         trampoline built for that kernel, its recorded call's instructions (Trampoline::\
         common_path_instructions, as call/exitless's static figure). An event's path beyond \
         it (tracer::kernel::events::path_cost), decoded in the kernel's text: its enabled \
         branch from the redirected tp->funcs load to the static call's call, the static \
         call's trampoline jmp where calls are not inline, __traceiter_NAME to its ret with no \
         probe of the guest's, its ftrace site aside (the entry's); the longest of the event's \
         call sites. An event whose strings do not last past it (task_rename's names): the \
         instructions of vmtrace's code that copies them at the event (tracer::plan::exitless::\
         strcopy::path_instructions), and how many calls of the kernel's \
         strncpy_from_kernel_nofault / copy_from_kernel_nofault it makes, whose own \
         instructions (a loop per byte) are not counted. An event's figure: the entry's, its \
         path's and its copies' together"
    )
}
