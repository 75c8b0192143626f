//! Filters after recording, as perf report's and perf script's `--comm`,
//! `--pid`, `--tid` and `--symbols`: which stored events of a saved trace
//! every view shows. The filter is applied to the trace once, before any
//! report or export is built, so that the report (by function, by task,
//! the call tree, JSON...) and the script see the same events.
//!
//! A filtered trace is a trace of its own, as a window is
//! (`crate::trace::window`): its stored events that pass, its counts and
//! returns recomputed from them (so counts are of stored events), the
//! tasks and stacks those events name and no others. `TraceMeta::shown`
//! says what was kept and of how many stored calls, and what the whole
//! trace did not store, so that no header claims the calls left out were
//! not made.
//!
//! The globs are those of the recording's filters: a comm glob as the
//! task filter compiles it (`crate::plan::tasks`), function globs as the
//! trace globs (`crate::kernel::filter::Globs`: comma lists, `{a,b}`,
//! `!glob`). Every filter given must match (AND); the comm globs among
//! themselves, and the ids of a kind, are alternatives (OR).

use globset::GlobMatcher;

use crate::kernel::filter::{FilterError, Globs};
use crate::plan::tasks::{comm_glob, CommGlobError};
use crate::trace::model::{Event, Task, Trace};
use crate::trace::report::thousands;
use crate::trace::window::recount;

/// Which events to keep (nothing given: all).
#[derive(Clone, Debug, Default)]
pub struct TraceFilter {
    /// Comm globs, as given and compiled; a task matches any.
    comms: Vec<(String, GlobMatcher)>,
    /// Thread group (process) ids: `Task::tgid`, perf's `--pid`.
    tgids: Vec<u32>,
    /// Thread ids: `Task::pid`, perf's `--tid`.
    pids: Vec<u32>,
    /// The traced functions to keep.
    functions: Option<Globs>,
}

/// Why a filter could not be built or applied.
#[derive(Debug, thiserror::Error)]
pub enum TraceFilterError {
    #[error(transparent)]
    Comm(#[from] CommGlobError),
    #[error(transparent)]
    Functions(#[from] FilterError),
    /// A task filter of a trace whose events name no task.
    #[error("the trace names no guest task ({why}), so it cannot be filtered by task")]
    NoTasks {
        /// Where its tasks would have come from, or why there are none.
        why: String,
    },
}

impl TraceFilter {
    /// Comm globs (one each), thread group ids, thread ids and function
    /// globs (each a comma list, as the trace globs).
    pub fn new(
        comms: &[String],
        tgids: &[u32],
        pids: &[u32],
        functions: &[String],
    ) -> Result<TraceFilter, TraceFilterError> {
        let comms = comms
            .iter()
            .map(|g| comm_glob(g).map(|m| (g.clone(), m)))
            .collect::<Result<_, _>>()?;
        let functions = match functions.is_empty() {
            true => None,
            false => Some(Globs::for_symbols(functions)?),
        };
        Ok(TraceFilter {
            comms,
            tgids: tgids.to_vec(),
            pids: pids.to_vec(),
            functions,
        })
    }

    /// Any filter given.
    pub fn is_active(&self) -> bool {
        self.by_task() || self.functions.is_some()
    }

    /// A filter that needs the events' tasks.
    pub fn by_task(&self) -> bool {
        !self.comms.is_empty() || !self.tgids.is_empty() || !self.pids.is_empty()
    }

    /// `comm mini-a/*; tgid 1001; pid 1002; function hrtimer_*`: what is
    /// kept, in the trace's words (a front end may say it with its own).
    pub fn describe(&self) -> String {
        let ids = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        let mut parts = Vec::new();
        if !self.comms.is_empty() {
            let globs: Vec<&str> = self.comms.iter().map(|(g, _)| g.as_str()).collect();
            parts.push(format!("comm {}", globs.join(" or ")));
        }
        if !self.tgids.is_empty() {
            parts.push(format!("tgid {}", ids(&self.tgids)));
        }
        if !self.pids.is_empty() {
            parts.push(format!("pid {}", ids(&self.pids)));
        }
        if let Some(f) = &self.functions {
            let mut globs: Vec<String> = f.positive().to_vec();
            globs.extend(f.negative().iter().map(|g| format!("!{g}")));
            parts.push(format!("function {}", globs.join(",")));
        }
        parts.join("; ")
    }

    /// Whether the calls of task `t` are kept (by the task filters).
    fn keeps_task(&self, t: &Task) -> bool {
        (self.comms.is_empty() || self.comms.iter().any(|(_, m)| m.is_match(&t.comm)))
            && (self.tgids.is_empty() || self.tgids.contains(&t.tgid))
            && (self.pids.is_empty() || self.pids.contains(&t.pid))
    }

    /// The part of `trace` this filter keeps (the module's documentation);
    /// `label` says the filter in `TraceMeta::shown` (`describe()`, or a
    /// front end's words). No filter: the trace unchanged. A task filter
    /// of a trace without tasks is refused.
    pub fn apply(&self, trace: &Trace, label: &str) -> Result<Trace, TraceFilterError> {
        if !self.is_active() {
            return Ok(trace.clone());
        }
        if self.by_task() && trace.tasks.is_empty() {
            let why = match trace.meta.tasks.as_str() {
                "" => "it was recorded without them".to_string(),
                note => format!("tasks: {note}"),
            };
            return Err(TraceFilterError::NoTasks { why });
        }
        // Each glob once per function and task, not once per event.
        let func_kept: Vec<bool> = trace
            .functions
            .iter()
            .map(|f| self.functions.as_ref().is_none_or(|g| g.is_match(&f.name)))
            .collect();
        let task_kept: Vec<bool> = trace.tasks.iter().map(|t| self.keeps_task(t)).collect();
        let kept = |table: &[bool], i: Option<usize>| i.and_then(|i| table.get(i)) == Some(&true);
        let events: Vec<Event> = trace
            .events
            .iter()
            .filter(|e| {
                kept(&func_kept, Some(e.func as usize))
                    && (!self.by_task() || kept(&task_kept, (e.task as usize).checked_sub(1)))
            })
            .copied()
            .collect();
        let mut part = recount(trace, events);
        part.tasks = compact(&trace.tasks, part.events.iter_mut().map(|e| &mut e.task));
        part.stacks = compact(&trace.stacks, part.events.iter_mut().map(|e| &mut e.stack));
        part.meta.shown = shown_note(trace, part.meta.events_total, label);
        Ok(part)
    }
}

/// `LABEL (12 of 1,800 stored calls shown; ...)`: what the filter kept
/// (calls: entries, as the `events:` line counts them; a call's return
/// goes with it), and what the whole trace counted but did not store.
fn shown_note(trace: &Trace, kept: u64, label: &str) -> String {
    let m = &trace.meta;
    let stored = trace.events.iter().filter(|e| !e.is_return()).count();
    let mut note = format!(
        "{label} ({} of {} stored calls shown; counts are of those",
        thousands(kept),
        thousands(stored as u64)
    );
    if m.events_dropped > 0 {
        note.push_str(&format!(
            "; the whole trace counted {} calls, {} of them not stored",
            thousands(m.events_total),
            thousands(m.events_dropped)
        ));
    }
    note.push(')');
    note
}

/// The items of `all` that `ids` (1-based, 0: none) name, in their order,
/// with `ids` renumbered into the result.
fn compact<'e, T: Clone>(all: &[T], ids: impl Iterator<Item = &'e mut u32>) -> Vec<T> {
    let mut new_id = vec![0u32; all.len()];
    let mut kept = Vec::new();
    let mut ids: Vec<&mut u32> = ids.collect();
    for id in ids.iter_mut() {
        let Some(i) = (**id as usize).checked_sub(1).filter(|&i| i < all.len()) else {
            continue;
        };
        if new_id[i] == 0 {
            kept.push(i);
            new_id[i] = kept.len() as u32;
        }
    }
    // Keep the original order, so that ids stay in the table's order.
    kept.sort_unstable();
    for (n, &i) in kept.iter().enumerate() {
        new_id[i] = n as u32 + 1;
    }
    for id in ids {
        // An id past the table (a corrupt trace) names nothing.
        *id = (*id as usize)
            .checked_sub(1)
            .and_then(|i| new_id.get(i).copied())
            .unwrap_or(0);
    }
    kept.into_iter().map(|i| all[i].clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::symbols::Symbol;
    use crate::trace::model::{TraceMeta, RETURN_BIT};
    use crate::trace::report::{render, ReportOptions};

    fn sym(name: &str, addr: u64) -> Symbol {
        Symbol {
            name: name.into(),
            addr,
            size: 0x100,
        }
    }

    fn task(pid: u32, tgid: u32, comm: &str) -> Task {
        Task {
            pid,
            tgid,
            comm: comm.into(),
        }
    }

    /// Two vCPUs; tasks: 1 swapper/0 (0), 2 sh (57), 3 gdbus (60 of 57),
    /// 4 ls (70); a graph trace with one stack. (ts, func, cpu, task, ret)
    fn trace() -> Trace {
        let spec: [(u64, u32, u32, u32, bool); 9] = [
            (1, 0, 0, 1, false),
            (2, 1, 0, 2, false),
            (3, 1, 0, 2, true),
            (4, 0, 1, 3, false),
            (5, 2, 1, 3, false),
            (6, 2, 1, 3, true),
            (7, 0, 1, 4, false),
            (8, 1, 0, 4, false),
            (9, 0, 0, 0, false),
        ];
        let events = spec
            .iter()
            .map(|&(ts, func, cpu, task, ret)| Event {
                ts_ns: 1_000 + ts,
                parent: 0x9010,
                slot: 0x100 | (u64::from(ret) * RETURN_BIT),
                func,
                cpu,
                task,
                stack: u32::from(ts == 7),
                data: 0,
            })
            .collect();
        Trace {
            meta: TraceMeta {
                cpus: 2,
                attach_ns: 1_000,
                detach_ns: 2_000,
                events_total: 7,
                graph: true,
                tasks: "from the BTF of k".into(),
                ..TraceMeta::default()
            },
            functions: vec![
                sym("hrtimer_interrupt", 0x1000),
                sym("schedule", 0x2000),
                sym("tick_sched_timer", 0x3000),
            ],
            counts: vec![vec![2, 2], vec![2, 0], vec![0, 1]],
            returns: vec![vec![0, 0], vec![1, 0], vec![0, 1]],
            callers: vec![sym("caller", 0x9000)],
            events,
            tasks: vec![
                task(0, 0, "swapper/0"),
                task(57, 57, "sh"),
                task(60, 57, "gdbus"),
                task(70, 70, "ls"),
            ],
            args: Vec::new(),
            prototypes: Vec::new(),
            stacks: vec![crate::trace::model::Stack {
                frames: vec![0x9010],
                end: crate::trace::model::StackEnd::Bottom,
                exact: 0,
            }],
            fields: Default::default(),
        }
    }

    fn filter(comm: &[&str], tgid: &[u32], pid: &[u32], sym: &[&str]) -> TraceFilter {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        TraceFilter::new(&s(comm), tgid, pid, &s(sym)).unwrap()
    }

    /// (ts - 1000) of the kept events.
    fn kept(t: &Trace) -> Vec<u64> {
        t.events.iter().map(|e| e.ts_ns - 1_000).collect()
    }

    fn sum(t: &[Vec<u64>]) -> u64 {
        t.iter().flatten().sum()
    }

    #[test]
    fn each_filter_keeps_its_events_and_recounts() {
        let t = trace();
        let none = filter(&[], &[], &[], &[]);
        assert!(!none.is_active());
        assert_eq!(none.apply(&t, "x").unwrap(), t);

        let by_comm = filter(&["g*", "l?"], &[], &[], &[]).apply(&t, "c").unwrap();
        assert_eq!(kept(&by_comm), [4, 5, 6, 7, 8]);
        assert_eq!(by_comm.counts, [vec![0, 2], vec![1, 0], vec![0, 1]]);
        assert_eq!(sum(&by_comm.returns), 1);
        assert_eq!(by_comm.meta.events_total, 4);

        // perf's --pid is the process: sh and its thread gdbus.
        let by_tgid = filter(&[], &[57], &[], &[]).apply(&t, "p").unwrap();
        assert_eq!(kept(&by_tgid), [2, 3, 4, 5, 6]);
        let by_pid = filter(&[], &[], &[60, 70], &[]).apply(&t, "t").unwrap();
        assert_eq!(kept(&by_pid), [4, 5, 6, 7, 8]);

        // Functions by the trace globs' syntax, returns included; the
        // event of no known task stays.
        let by_sym = filter(&[], &[], &[], &["sched*,tick_*"]).apply(&t, "s");
        assert_eq!(kept(&by_sym.unwrap()), [2, 3, 5, 6, 8]);
        let not = filter(&[], &[], &[], &["*,!schedule"])
            .apply(&t, "s")
            .unwrap();
        assert_eq!(kept(&not), [1, 4, 5, 6, 7, 9]);
        assert_eq!(not.counts[1], [0, 0]);
    }

    #[test]
    fn filters_combine_with_and() {
        let t = trace();
        let f = filter(&["*"], &[57], &[60], &["tick_*"]);
        assert_eq!(f.describe(), "comm *; tgid 57; pid 60; function tick_*");
        let r = f.apply(&t, &f.describe()).unwrap();
        assert_eq!(kept(&r), [5, 6]);
        assert_eq!(sum(&r.counts), 1);
        // Nothing matches: an empty trace, said so.
        let r = filter(&["sh"], &[], &[70], &[]).apply(&t, "none").unwrap();
        assert!(r.events.is_empty() && r.tasks.is_empty());
        assert_eq!(
            r.meta.shown,
            "none (0 of 7 stored calls shown; counts are of those)"
        );
    }

    #[test]
    fn tasks_and_stacks_are_those_of_the_kept_events() {
        let t = trace();
        let r = filter(&["ls", "gdbus"], &[], &[], &[])
            .apply(&t, "c")
            .unwrap();
        assert_eq!(r.tasks, [task(60, 57, "gdbus"), task(70, 70, "ls")]);
        let names: Vec<&str> = r
            .events
            .iter()
            .map(|e| r.task_of(e).unwrap().comm.as_str())
            .collect();
        assert_eq!(names, ["gdbus", "gdbus", "gdbus", "ls", "ls"]);
        assert_eq!(r.stacks.len(), 1);
        assert_eq!(r.events[3].stack, 1);
        let r = filter(&["sh"], &[], &[], &[]).apply(&t, "c").unwrap();
        assert!(r.stacks.is_empty() && r.events.iter().all(|e| e.stack == 0));
    }

    #[test]
    fn the_header_says_what_was_shown_and_what_was_not_stored() {
        let mut t = trace();
        t.meta.events_total = 1_207;
        t.meta.events_dropped = 1_200;
        let r = filter(&[], &[57], &[], &[]).apply(&t, "tgid 57").unwrap();
        let want = "tgid 57 (3 of 7 stored calls shown; counts are of those; the whole trace \
                    counted 1,207 calls, 1,200 of them not stored)";
        assert_eq!(r.meta.shown, want);
        assert_eq!((r.meta.events_total, r.meta.events_dropped), (3, 0));
        let out = render(&r, &ReportOptions::default());
        let lines: Vec<&str> = out.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.starts_with("# events:"))
            .unwrap();
        assert!(lines[at + 1].starts_with("# filter:"), "{out}");
        assert!(lines[at + 1].ends_with(want), "{out}");
    }

    #[test]
    fn bad_globs_and_traces_without_tasks_are_refused() {
        let e = TraceFilter::new(&["[a".into()], &[], &[], &[]).unwrap_err();
        assert!(matches!(e, TraceFilterError::Comm(_)), "{e}");
        let e = TraceFilter::new(&[], &[], &[], &["!x".into()]).unwrap_err();
        assert!(matches!(e, TraceFilterError::Functions(_)), "{e}");
        let mut t = trace();
        t.tasks.clear();
        let e = filter(&[], &[], &[1], &[]).apply(&t, "t").unwrap_err();
        assert_eq!(
            e.to_string(),
            "the trace names no guest task (tasks: from the BTF of k), so it cannot be \
             filtered by task"
        );
        // A function filter needs no task.
        assert!(filter(&[], &[], &[], &["*"]).apply(&t, "s").is_ok());
    }
}
