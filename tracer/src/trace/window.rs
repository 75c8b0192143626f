//! Windows of a trace: a time range (`--time START,END`, as `perf report
//! --time`: seconds since the attach) and a set of vCPUs, cut out of a
//! trace as a trace of its own that every report and export can render.
//!
//! A window keeps the stored events inside it, and its counts are
//! recomputed from them: **window counts are of stored events**, while a
//! whole trace's counts are exact (they include the events counted but not
//! stored, over `--max-events` or a full ring). A window therefore reports
//! no dropped events of its own; its `stop_reason` says it is a window, of
//! what, and how many events the whole trace did not store, so that the
//! loss is still said wherever the trace is shown or saved.
//!
//! In a function-graph trace, a call entered before the window whose
//! return is inside shows as an unmatched return, and a call inside whose
//! return is after it as running at detach.

use crate::trace::model::{Event, Trace, TraceMeta};
use crate::trace::report::{duration, format_cpu_list};

/// What to keep of a trace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Window {
    /// `--time`: ns since the attach, start inclusive, end exclusive (as
    /// `parse_time` returns them); `None`: all the time.
    pub time: Option<(Option<u64>, Option<u64>)>,
    /// Only these vCPUs' events; `None`: all. The trace keeps its vCPU
    /// count and numbering: the others are there, without calls.
    pub cpus: Option<Vec<u32>>,
}

impl Window {
    /// Keeps everything.
    pub fn is_whole(&self) -> bool {
        self.time.is_none_or(|t| t == (None, None)) && self.cpus.is_none()
    }

    /// `1.5 s to 3 s after the attach, vCPUs 0,2`, for messages.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        match self.time {
            Some((Some(a), Some(b))) => {
                parts.push(format!("{} to {} after the attach", secs(a), secs(b)))
            }
            Some((Some(a), None)) => parts.push(format!("from {} after the attach", secs(a))),
            Some((None, Some(b))) => parts.push(format!("up to {} after the attach", secs(b))),
            _ => {}
        }
        if let Some(c) = &self.cpus {
            let mut c = c.clone();
            c.sort_unstable();
            c.dedup();
            parts.push(if c.is_empty() {
                "no vCPU".to_string()
            } else {
                format!("vCPUs {}", format_cpu_list(&c))
            });
        }
        if parts.is_empty() {
            "the whole trace".to_string()
        } else {
            parts.join(", ")
        }
    }
}

/// `1.5 s`: ns as seconds, without trailing zeros.
fn secs(ns: u64) -> String {
    let s = format!("{}.{:09}", ns / 1_000_000_000, ns % 1_000_000_000);
    format!("{} s", s.trim_end_matches('0').trim_end_matches('.'))
}

/// Parses perf's `--time START,END` (`1.5,3`, `,2`, `2,`): seconds since
/// the attach, or a number with a unit (`1500ms`, `20us`; see
/// `report::duration::parse`). Returns (start, end) in ns, start inclusive,
/// end exclusive. The error names the part that is wrong, in one line.
pub fn parse_time(s: &str) -> Result<(Option<u64>, Option<u64>), String> {
    let Some((a, b)) = s.split_once(',') else {
        return Err(format!(
            "time window '{s}' has no comma; expected START,END in seconds since the attach, \
             e.g. 1.5,3 or ,2 or 2,"
        ));
    };
    let part = |p: &str, what: &str| -> Result<Option<u64>, String> {
        let p = p.trim();
        if p.is_empty() {
            return Ok(None);
        }
        // A bare number is seconds, as in perf (`duration::parse` reads ns).
        let plain = p.bytes().all(|b| b.is_ascii_digit() || b == b'.');
        let parsed = if plain {
            duration::parse(&format!("{p}s"))
        } else {
            duration::parse(p)
        };
        parsed.map(Some).map_err(|e| {
            if e.contains("too long") {
                format!("{what} '{p}' in time window '{s}' is too large")
            } else {
                format!(
                    "{what} '{p}' in time window '{s}' is not a time; use seconds since the \
                     attach (e.g. 1.5) or a number with ns, us, ms or s (e.g. 1500ms)"
                )
            }
        })
    };
    let (start, end) = (part(a, "start")?, part(b, "end")?);
    match (start, end) {
        (None, None) => Err(format!(
            "time window '{s}' sets neither a start nor an end; e.g. 1.5,3"
        )),
        (Some(a), Some(b)) if b <= a => Err(format!(
            "time window '{s}' ends at {} but starts at {}; the end must be after the start",
            secs(b),
            secs(a)
        )),
        t => Ok(t),
    }
}

/// The stored events of `trace` inside `window`, of known functions.
fn events_inside(trace: &Trace, window: &Window) -> Vec<Event> {
    let m = &trace.meta;
    let (start, end) = window.time.unwrap_or((None, None));
    let cpus = window.cpus.as_ref().map(|c| {
        let mut c = c.clone();
        c.sort_unstable();
        c.dedup();
        c
    });
    // Relative to the attach; an event before it (there is none in a trace
    // vmtrace wrote) is before any start.
    let inside = |ts: u64| {
        let rel = i128::from(ts) - i128::from(m.attach_ns);
        start.is_none_or(|s| rel >= i128::from(s)) && end.is_none_or(|e| rel < i128::from(e))
    };
    let on_cpu = |cpu: u32| cpus.as_ref().is_none_or(|c| c.binary_search(&cpu).is_ok());
    let nfunc = trace.functions.len();
    let events: Vec<_> = trace
        .events
        .iter()
        .filter(|e| (e.func as usize) < nfunc && on_cpu(e.cpu) && inside(e.ts_ns))
        .copied()
        .collect();
    events
}

/// What the restricted trace's stop reason adds: the window, and what the
/// whole trace did not store.
fn window_note(window: &Window, m: &TraceMeta) -> String {
    let mut note = format!(
        "window: {}; counts are of its stored events",
        window.describe()
    );
    if m.events_dropped > 0 || m.returns_dropped > 0 {
        note.push_str(&format!(
            " (the whole trace did not store {} of its {} entries",
            m.events_dropped, m.events_total
        ));
        if m.returns_dropped > 0 {
            note.push_str(&format!(" and {} returns", m.returns_dropped));
        }
        note.push(')');
    }
    note
}

/// The part of `trace` inside `window` (see the module's documentation):
/// its stored events, counts and returns recomputed from them, no dropped
/// events, and attach / detach narrowed to the window. The facts of the run
/// (sites, attach pause, mode, trap exits, TSC rate) are kept as they were.
/// A whole window returns the trace unchanged.
pub fn restrict(trace: &Trace, window: &Window) -> Trace {
    if window.is_whole() {
        return trace.clone();
    }
    let m = &trace.meta;
    let (start, end) = window.time.unwrap_or((None, None));
    let mut part = recount(trace, events_inside(trace, window));
    let duration = m.detach_ns.saturating_sub(m.attach_ns);
    let from = start.map_or(0, |s| s.min(duration));
    let to = end.map_or(duration, |e| e.min(duration)).max(from);
    let note = window_note(window, m);
    part.meta.attach_ns = m.attach_ns.saturating_add(from);
    part.meta.detach_ns = m.attach_ns.saturating_add(to);
    part.meta.stop_reason = if m.stop_reason.is_empty() {
        note
    } else {
        format!("{}; {note}", m.stop_reason)
    };
    part
}

/// `trace` with only `events` (some of its stored events, of known
/// functions), its counts and returns recomputed from them: exact for
/// those events, none dropped. The run's facts are kept as they were; a
/// window and a filter (`crate::trace::filter`) each say what they cut.
pub(crate) fn recount(trace: &Trace, events: Vec<Event>) -> Trace {
    let m = &trace.meta;
    let nfunc = trace.functions.len();
    let with_returns = m.graph || !trace.returns.is_empty();
    let ncpus = m.cpus as usize;
    let mut counts = vec![vec![0u64; ncpus]; nfunc];
    let mut returns = if with_returns {
        vec![vec![0u64; ncpus]; nfunc]
    } else {
        Vec::new()
    };
    let (mut entries, mut unreadable, mut unhooked) = (0u64, 0u64, 0u64);
    for e in &events {
        let table = if e.is_return() {
            &mut returns
        } else {
            entries += 1;
            unreadable += u64::from(e.parent == 0);
            unhooked += u64::from(m.graph && e.stack_slot() == 0);
            &mut counts
        };
        if let Some(row) = table.get_mut(e.func as usize) {
            // A vCPU beyond the trace's count (a corrupt trace): grow the row.
            let cpu = e.cpu as usize;
            if row.len() <= cpu {
                row.resize(cpu + 1, 0);
            }
            row[cpu] += 1;
        }
    }
    let mut meta = m.clone();
    meta.events_total = entries;
    meta.events_dropped = 0;
    meta.returns_dropped = 0;
    // Part of the dropped events (per vCPU), which the part has none of.
    meta.lost.clear();
    meta.drops = Default::default();
    meta.parent_unreadable = unreadable;
    meta.unhooked = if m.graph { unhooked } else { m.unhooked };
    Trace {
        meta,
        functions: trace.functions.clone(),
        counts,
        returns,
        callers: trace.callers.clone(),
        events,
        tasks: trace.tasks.clone(),
        args: trace.args.clone(),
        prototypes: trace.prototypes.clone(),
        stacks: trace.stacks.clone(),
        fields: trace.fields.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::model::{Event, RETURN_BIT};

    const S: u64 = 1_000_000_000;

    #[test]
    fn parse_time_forms() {
        assert_eq!(parse_time("1.5,3"), Ok((Some(S * 3 / 2), Some(3 * S))));
        assert_eq!(parse_time(",2"), Ok((None, Some(2 * S))));
        assert_eq!(parse_time("2,"), Ok((Some(2 * S), None)));
        assert_eq!(parse_time(" 0.25 , 1 "), Ok((Some(S / 4), Some(S))));
        assert_eq!(parse_time("1500ms,2s"), Ok((Some(S * 3 / 2), Some(2 * S))));
        assert_eq!(parse_time("20us,"), Ok((Some(20_000), None)));
    }

    #[test]
    fn parse_time_errors_name_the_part() {
        let e = parse_time("1.5").unwrap_err();
        assert!(e.starts_with("time window '1.5' has no comma"), "{e}");
        let e = parse_time("x,3").unwrap_err();
        assert!(
            e.starts_with("start 'x' in time window 'x,3' is not a time"),
            "{e}"
        );
        let e = parse_time("1,-3").unwrap_err();
        assert!(
            e.starts_with("end '-3' in time window '1,-3' is not a time"),
            "{e}"
        );
        let e = parse_time("1,2,3").unwrap_err();
        assert!(e.starts_with("end '2,3'"), "{e}");
        let e = parse_time("1.2.3,").unwrap_err();
        assert!(e.starts_with("start '1.2.3'"), "{e}");
        let e = parse_time("3,1.5").unwrap_err();
        assert_eq!(
            e,
            "time window '3,1.5' ends at 1.5 s but starts at 3 s; the end must be after the start"
        );
        assert!(parse_time("2,2").is_err());
        let e = parse_time(",").unwrap_err();
        assert!(e.contains("sets neither a start nor an end"), "{e}");
        let e = parse_time("99999999999999,").unwrap_err();
        assert!(e.ends_with("is too large"), "{e}");
        for e in [parse_time("x,3"), parse_time("3,1")] {
            assert!(!e.unwrap_err().contains('\n'));
        }
    }

    #[test]
    fn describe_says_what_is_kept() {
        let w = Window {
            time: Some((Some(S * 3 / 2), Some(3 * S))),
            cpus: Some(vec![2, 0, 3]),
        };
        assert_eq!(w.describe(), "1.5 s to 3 s after the attach, vCPUs 0,2-3");
        assert_eq!(Window::default().describe(), "the whole trace");
        assert!(Window::default().is_whole());
    }

    /// Sums a count table.
    fn sum(t: &[Vec<u64>]) -> u64 {
        t.iter().flatten().sum()
    }

    #[test]
    fn time_window_keeps_events_inside_and_recounts() {
        // 1,000 events 100 ns apart from the attach, 4 vCPUs, some dropped.
        let mut t = Trace::synthetic(1000);
        t.meta.events_total += 50;
        t.meta.events_dropped = 50;
        t.meta.stop_reason = "duration elapsed".into();
        let w = Window {
            time: Some((Some(10_000), Some(20_000))),
            cpus: None,
        };
        let r = restrict(&t, &w);
        assert_eq!(r.events.len(), 100);
        assert!(r
            .events
            .iter()
            .all(|e| (t.meta.attach_ns + 10_000..t.meta.attach_ns + 20_000).contains(&e.ts_ns)));
        assert_eq!(sum(&r.counts), 100);
        assert_eq!(r.meta.events_total, 100);
        assert_eq!(r.meta.events_dropped, 0);
        assert_eq!(r.meta.attach_ns, t.meta.attach_ns + 10_000);
        assert_eq!(r.meta.detach_ns, t.meta.attach_ns + 20_000);
        assert_eq!(
            r.meta.stop_reason,
            "duration elapsed; window: 0.00001 s to 0.00002 s after the attach; counts are of \
             its stored events (the whole trace did not store 50 of its 1050 entries)"
        );
        // Counts match the kept events exactly.
        for (f, row) in r.counts.iter().enumerate() {
            for (c, &n) in row.iter().enumerate() {
                let kept = r
                    .events
                    .iter()
                    .filter(|e| e.func as usize == f && e.cpu as usize == c)
                    .count() as u64;
                assert_eq!(n, kept);
            }
        }
        // An end past the detach is cut to it; an open start is the attach.
        let r = restrict(
            &t,
            &Window {
                time: Some((None, Some(10 * S))),
                cpus: None,
            },
        );
        assert_eq!(r.events.len(), 1000);
        assert_eq!(
            (r.meta.attach_ns, r.meta.detach_ns),
            (t.meta.attach_ns, t.meta.detach_ns)
        );
    }

    #[test]
    fn cpu_window_keeps_the_numbering() {
        let t = Trace::synthetic(1000);
        let r = restrict(
            &t,
            &Window {
                time: None,
                cpus: Some(vec![1, 3]),
            },
        );
        assert_eq!(r.meta.cpus, 4);
        assert_eq!(r.events.len(), 500);
        assert!(r.events.iter().all(|e| e.cpu == 1 || e.cpu == 3));
        assert!(r.counts.iter().all(|row| row[0] == 0 && row[2] == 0));
        assert_eq!(sum(&r.counts), 500);
        assert_eq!(
            (r.meta.attach_ns, r.meta.detach_ns),
            (t.meta.attach_ns, t.meta.detach_ns)
        );
        // The whole window: the trace itself, exact counts and all.
        assert_eq!(restrict(&t, &Window::default()), t);
    }

    #[test]
    fn graph_window_recounts_returns() {
        let mut t = Trace::synthetic(0);
        t.meta.graph = true;
        t.meta.cpus = 2;
        t.meta.attach_ns = 1_000;
        t.meta.detach_ns = 10_000;
        let ev = |ts_ns, func, cpu, slot| Event {
            ts_ns,
            parent: 0xffff_ffff_8200_0010,
            slot,
            func,
            cpu,
            task: 0,
            stack: 0,
            data: 0,
        };
        t.events = vec![
            ev(1_100, 0, 0, 0x1000),
            ev(2_100, 1, 1, 0),
            ev(3_100, 0, 0, 0x1000 | RETURN_BIT),
            ev(5_100, 2, 1, 0x2000),
            ev(6_100, 2, 1, 0x2000 | RETURN_BIT),
        ];
        let r = restrict(
            &t,
            &Window {
                time: Some((Some(1_000), Some(4_500))),
                cpus: None,
            },
        );
        assert_eq!(r.events.len(), 3);
        assert_eq!(r.meta.events_total, 2);
        assert_eq!(sum(&r.counts), 2);
        assert_eq!(sum(&r.returns), 1);
        assert_eq!(r.returns[0][0], 1);
        // The kept entry of function 1 had no return hook.
        assert_eq!(r.meta.unhooked, 1);
        // The report of a window renders.
        let out = crate::trace::report::render(&r, &crate::trace::report::ReportOptions::default());
        assert!(out.contains("window: 0.000001 s to 0.0000045 s"), "{out}");
    }
}
