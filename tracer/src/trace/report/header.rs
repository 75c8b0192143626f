//! The `#` header of the text report: the facts of the run, what was lost
//! and why, and (function-graph traces) how the stored calls ended.

use std::fmt::Write as _;

use super::numbers::{format_cpu_list, thousands};
use super::{escape, GraphSummary, Report};
use crate::trace::cmdline::shell_line;
use crate::trace::model::TraceMeta;

/// The `#` header: the facts of the run.
pub(super) fn header(out: &mut String, report: &Report) {
    let m = &report.trace.meta;
    let mut lines = run_lines(report);
    if !m.symbols.is_empty() {
        // After the build id: what the names below were read from.
        lines.insert(2, ("symbols", escape(&m.symbols).into_owned()));
    }
    if !m.shown.is_empty() {
        // Right under the counts it restricts.
        let at = lines
            .iter()
            .position(|(k, _)| *k == "events")
            .map_or(0, |i| i + 1);
        lines.insert(at, ("filter", escape(&m.shown).into_owned()));
    }
    if let Some(t) = tasks_line(report) {
        lines.push(("tasks", t));
    }
    if let Some(v) = values_line(report) {
        lines.push(("values", v));
    }
    if let Some(s) = super::stacks::stacks_line(report) {
        lines.push(("stacks", s));
    }
    if let Some(g) = &report.graph_summary {
        graph_lines(&mut lines, g);
    }
    loss_lines(&mut lines, m);
    if report.filtered {
        lines.push(("--cpu", cpu_line(report)));
    }
    if !m.cmdline.is_empty() {
        // First, as perf's header has it: what recorded all that follows.
        lines.insert(0, ("cmdline", shell_line(&m.cmdline)));
    }
    let key_w = lines.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 1;
    out.push_str("# vmtrace report\n#\n");
    for (k, v) in lines {
        writeln!(out, "# {:<key_w$} {v}", format!("{k}:")).unwrap();
    }
    out.push_str("#\n");
}

/// The run's facts, always said.
fn run_lines(report: &Report) -> Vec<(&'static str, String)> {
    let trace = report.trace;
    let m = &trace.meta;
    let us = |ns: u64| format!("{:.1} µs", ns as f64 / 1e3);
    let duration = trace.duration_s();
    let guest = match m.vmm.is_empty() {
        true => Vec::new(),
        false => vec![("guest", format!("run by {}", escape(&m.vmm)))],
    };
    let rate = if duration > 0.0 {
        format!(
            "{} events/s",
            thousands((m.events_total as f64 / duration).round() as u64)
        )
    } else {
        "n/a (zero duration)".to_string()
    };
    guest
        .into_iter()
        .chain([
            ("kernel", escape(&m.kernel).into_owned()),
            (
                "build id",
                m.build_id
                    .as_deref()
                    .map_or_else(|| "none".into(), |b| escape(b).into_owned()),
            ),
            ("vCPUs", m.cpus.to_string()),
            ("duration", format!("{duration:.3} s (attach to detach)")),
            (
                "sites",
                format!(
                    "{} patched, {} skipped ({} in init text, {} other)",
                    thousands(m.sites_patched),
                    thousands(m.sites_skipped_init + m.sites_skipped_other),
                    thousands(m.sites_skipped_init),
                    thousands(m.sites_skipped_other)
                ),
            ),
            ("events", events_line(m, report.entries_stored)),
            ("rate", rate),
            ("mode", mode_line(m)),
            (
                "attach",
                format!(
                    "pause window {}, latency {}",
                    us(m.attach_window_ns),
                    us(m.attach_latency_ns)
                ),
            ),
            (
                "stopped",
                if m.stop_reason.is_empty() {
                    "unknown".to_string()
                } else {
                    // The label says it: "--duration reached", not
                    // "stopped: stopped: --duration reached".
                    let reason = m.stop_reason.strip_prefix("stopped: ");
                    escape(reason.unwrap_or(&m.stop_reason)).into_owned()
                },
            ),
        ])
        .collect()
}

/// The guest tasks the events name and where they came from (or why
/// there are none); None when the trace says nothing of tasks.
fn tasks_line(report: &Report) -> Option<String> {
    let trace = report.trace;
    let source = &trace.meta.tasks;
    let n = trace.tasks.len();
    if n == 0 && source.is_empty() {
        return None;
    }
    let mut s = match n {
        0 => "none known".to_string(),
        _ => counted(n as u64, "task", "tasks"),
    };
    if !source.is_empty() {
        write!(s, " ({})", escape(source)).unwrap();
    }
    if trace.meta.filtered > 0 {
        let calls = counted(trace.meta.filtered, "call", "calls");
        write!(s, "; {calls} of other tasks not traced").unwrap();
    }
    Some(s)
}

/// The values recorded (`--args`, `--retval`), and how many traced
/// functions BTF describes.
fn values_line(report: &Report) -> Option<String> {
    let trace = report.trace;
    let what = crate::trace::values::recorded(trace)?;
    let described = trace.prototypes.iter().flatten().count();
    Some(format!(
        "{what} recorded; {} of {} traced functions described by the kernel's BTF",
        thousands(described as u64),
        thousands(trace.functions.len() as u64)
    ))
}

/// Events: in all, stored, dropped and why.
/// The mode, with the exits at the trace port where vmtrace's own VMM ran
/// the guest: under another VMM (`vmtrace attach`) there is no such port,
/// and a count of 0 would claim what was never measured.
fn mode_line(m: &TraceMeta) -> String {
    let mode = if m.mode.is_empty() {
        "unknown".into()
    } else {
        escape(&m.mode)
    };
    if m.vmm.is_empty() {
        format!("{mode} ({} trap exits)", thousands(m.trap_exits))
    } else {
        mode.into_owned()
    }
}

fn events_line(m: &TraceMeta, stored: u64) -> String {
    format!(
        "{} total, {} stored, {} dropped{}",
        thousands(m.events_total),
        thousands(stored),
        thousands(m.events_dropped),
        if m.overwrite && m.events_dropped > 0 {
            " (the oldest, overwritten: --overwrite keeps the newest; counts stay exact)"
        } else if m.events_dropped > 0 {
            " (over --max-events, a full ring, or lost; counts stay exact)"
        } else {
            ""
        }
    )
}

/// Losses and facts said at the run, never only there.
fn loss_lines(lines: &mut Vec<(&str, String)>, m: &TraceMeta) {
    if let Some(why) = super::drops::drops_line(m) {
        lines.push(("drops", why));
    }
    if m.lost.iter().any(|&n| n > 0) {
        let per_cpu: Vec<String> = m.lost.iter().map(|&n| thousands(n)).collect();
        lines.push((
            "lost",
            format!(
                "{} events the data file's writer could not keep (per vCPU: {}); in the dropped counts",
                thousands(m.lost.iter().sum()),
                per_cpu.join(", ")
            ),
        ));
    }
    if m.unfinished > 0 {
        lines.push(("unfinished", unfinished_line(m)));
    }
    if m.incomplete {
        lines.push((
            "incomplete",
            "the data file was cut short: counts are those of its stored events".to_string(),
        ));
    }
    if !m.rejected_sites.is_empty() {
        lines.push(("rejected", escape(&m.rejected_sites).into_owned()));
    }
    if let Some((virt, phys)) = m.kernel_offset {
        lines.push((
            "KASLR",
            format!("virtual offset {virt:#x}, physical offset {phys:#x}"),
        ));
    }
    if m.parent_unreadable > 0 {
        let (n, were) = match m.parent_unreadable {
            1 => ("call's return address", "was"),
            _ => ("calls' return addresses", "were"),
        };
        lines.push((
            "callers",
            format!(
                "{} {n} {were} unreadable (shown as [unknown] 0x0)",
                thousands(m.parent_unreadable)
            ),
        ));
    }
}

/// Calls whose ring record was reserved and never committed.
fn unfinished_line(m: &TraceMeta) -> String {
    // With --graph the ring holds returns too: what an uncommitted
    // record was is unknown, so no total of calls can be given.
    match m.graph {
        false => format!(
            "{} calls reserved a record in vmtrace's rings that was never committed (the run \
             ended while their writer was between the two): their functions are unknown, so \
             they are not in the counts; {} calls in all",
            thousands(m.unfinished),
            thousands(m.events_total + m.unfinished)
        ),
        true => format!(
            "{} records (calls or returns) were reserved in vmtrace's rings and never \
             committed (the run ended while their writer was between the two): what they \
             were is unknown, so they are in no count",
            thousands(m.unfinished)
        ),
    }
}

/// The vCPUs a `--cpu` report is over, and those it ignored.
fn cpu_line(report: &Report) -> String {
    let (m, sel, missing) = (&report.trace.meta, &report.cpus, &report.missing);
    let mut s = if sel.is_empty() {
        "none of the requested vCPUs exist".to_string()
    } else {
        format!(
            "{} (counts and shares are over these vCPUs)",
            format_cpu_list(sel)
        )
    };
    if !missing.is_empty() {
        write!(
            s,
            "; ignored {}: not in this trace (vCPUs 0-{})",
            format_cpu_list(missing),
            m.cpus.saturating_sub(1)
        )
        .unwrap();
    }
    s
}

/// The function graph's header lines: returns always, the rest when nonzero.
fn graph_lines(lines: &mut Vec<(&str, String)>, g: &GraphSummary) {
    lines.push((
        "returns",
        format!(
            "{} total, {} stored, {} dropped{}",
            thousands(g.returns),
            thousands(g.returns_stored),
            thousands(g.returns_dropped),
            if g.returns_dropped > 0 {
                " (their calls' durations are unknown)"
            } else {
                ""
            }
        ),
    ));
    let not_returned = g.not_returned();
    if not_returned > 0 {
        let mut why = Vec::new();
        let running = if g.returns_dropped > 0 {
            "running at detach (or returned after the last stored event on their stack)"
        } else {
            "running at detach"
        };
        for (n, what) in [
            (
                g.lost,
                "lost (returned; the return counted, not stored: a full ring, --max-events or a full queue)",
            ),
            (g.abandoned, "abandoned (unwound without a return)"),
            (g.running, running),
            (g.unhooked_stored, "unhooked"),
        ] {
            if n > 0 {
                why.push(format!("{} {what}", thousands(n)));
            }
        }
        lines.push((
            "not returned",
            format!(
                "{} of {} stored calls: {}",
                thousands(not_returned),
                thousands(g.frames),
                why.join(", ")
            ),
        ));
    }
    if g.unhooked > 0 {
        lines.push((
            "unhooked",
            format!(
                "{} without a return hook (no free frame in the guest): durations unknown",
                counted(g.unhooked, "call", "calls")
            ),
        ));
    }
    if g.unmatched_returns > 0 || g.mismatched_returns > 0 {
        let mut s = format!(
            "{} without a stored entry",
            counted(g.unmatched_returns, "return", "returns")
        );
        if g.mismatched_returns > 0 {
            write!(
                s,
                ", {} of another function than its call's",
                counted(g.mismatched_returns, "return", "returns")
            )
            .unwrap();
        }
        lines.push(("unmatched", s));
    }
}

/// `1 call`, `2,000 calls`.
fn counted(n: u64, one: &str, many: &str) -> String {
    format!("{} {}", thousands(n), if n == 1 { one } else { many })
}

#[cfg(test)]
mod tests {
    use crate::trace::model::Trace;
    use crate::trace::report::{render, ReportOptions};

    /// The label says "stopped": the reason after it does not say it again.
    #[test]
    fn the_stopped_line_says_stopped_once() {
        let mut t = Trace::synthetic(10);
        t.meta.stop_reason = "stopped: the trace's duration reached".into();
        let text = render(&t, &ReportOptions::default());
        let line = text.lines().find(|l| l.starts_with("# stopped:")).unwrap();
        assert!(line.ends_with(" the trace's duration reached"), "{line}");
        assert_eq!(line.matches("stopped").count(), 1, "{line}");
        t.meta.stop_reason = "guest powered off (status 0)".into();
        let text = render(&t, &ReportOptions::default());
        assert!(text.contains(" guest powered off (status 0)\n"), "{text}");
    }
}
