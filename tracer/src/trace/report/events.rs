//! The text report's traced events (`-e`): each event's exact count and
//! its stored records per guest task, most first.

use std::collections::HashMap;
use std::fmt::Write as _;

use super::numbers::thousands;
use super::{escape, Report};

/// The events section (nothing without events' fields).
pub(super) fn write_events(out: &mut String, report: &Report) {
    let trace = report.trace;
    let events: Vec<(usize, bool, &str)> = trace
        .fields
        .all_formats()
        .map(|(f, ret, e)| (f, ret, e.event.as_str()))
        .collect();
    if events.is_empty() {
        return;
    }
    out.push_str("#\n# events (-e): exact count, stored records by task\n#\n");
    for (func, ret, name) in events {
        // A syscall's exit: its function's returns.
        let counts = match ret {
            true => &trace.returns,
            false => &trace.counts,
        };
        let count: u64 = counts.get(func).map_or(0, |c| c.iter().sum());
        let mut by_task: HashMap<u32, u64> = HashMap::new();
        let stored = trace
            .events
            .iter()
            .filter(|e| e.func as usize == func && e.is_return() == ret);
        for e in stored {
            *by_task.entry(e.task).or_default() += 1;
        }
        let n: u64 = by_task.values().sum();
        writeln!(
            out,
            "{}  {} ({} stored)",
            escape(name),
            thousands(count),
            thousands(n)
        )
        .unwrap();
        let mut rows: Vec<(u32, u64)> = by_task.into_iter().collect();
        rows.sort_by_key(|&(task, n)| (std::cmp::Reverse(n), task));
        for (task, n) in rows {
            let who = match (task as usize)
                .checked_sub(1)
                .and_then(|i| trace.tasks.get(i))
            {
                Some(t) if t.pid == 0 => "<idle>-0".to_string(),
                Some(t) => format!("{}-{}", escape(&t.comm), t.pid),
                None => "task unknown".to_string(),
            };
            writeln!(out, "    {:>10}  {who}", thousands(n)).unwrap();
        }
    }
}
