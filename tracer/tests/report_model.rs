//! The report model (`report::Report`) on its own, apart from any rendering:
//! the order of each sort key, the `--cpu` filter, callers and events.

#[path = "report_fixture.rs"]
mod fixture;

use fixture::{DO_IDLE, HRTIMER, KTHREAD, LONG, ONLY_CPU2, SCHEDULE, UNCALLED_A, UNCALLED_B};
use tracer::trace::model::Trace;
use tracer::trace::report::{Caller, Report, ReportOptions, Sort};

fn opts(sort: Sort, cpus: Option<&[u32]>, callers: bool) -> ReportOptions {
    ReportOptions {
        sort,
        cpus: cpus.map(<[u32]>::to_vec),
        callers,
        ..ReportOptions::default()
    }
}

/// The rows' function indices, in report order.
fn order(r: &Report) -> Vec<u32> {
    r.rows.iter().map(|row| row.index as u32).collect()
}

fn uncalled(r: &Report) -> Vec<u32> {
    r.uncalled.iter().map(|row| row.index as u32).collect()
}

/// (caller name or `[unknown] 0x…`, count) of function `func`'s row.
fn callers(r: &Report, func: u32) -> Vec<(String, u64)> {
    let row = r.functions().find(|row| row.index == func as usize);
    row.expect("no row for the function")
        .callers
        .iter()
        .map(|c| (c.caller.label(), c.count))
        .collect()
}

#[test]
fn report_model_orders_rows_by_each_sort_key() {
    let t = fixture::trace();
    let by = |sort| order(&Report::new(&t, &opts(sort, None, false)));
    assert_eq!(
        by(Sort::Count),
        [LONG, SCHEDULE, DO_IDLE, HRTIMER, ONLY_CPU2]
    );
    // Byte order of the names: do_idle, hrtimer_…, only_cpu2, schedule, very_long_….
    assert_eq!(
        by(Sort::Name),
        [DO_IDLE, HRTIMER, ONLY_CPU2, SCHEDULE, LONG]
    );
    // The busiest vCPU's share: 100% (ties: most calls first), 50%, 40%, ~25%.
    assert_eq!(by(Sort::Cpu), [LONG, ONLY_CPU2, DO_IDLE, HRTIMER, SCHEDULE]);
    // Uncalled functions are kept apart, by name, whatever the sort.
    for sort in [Sort::Count, Sort::Name, Sort::Cpu] {
        let r = Report::new(&t, &opts(sort, None, false));
        assert_eq!(uncalled(&r), [UNCALLED_A, UNCALLED_B], "{sort:?}");
        assert_eq!(r.functions().count(), t.functions.len());
    }
}

#[test]
fn report_model_breaks_ties_by_name_then_address() {
    let mut t = fixture::trace();
    // do_idle and hrtimer_interrupt: the same calls, all on one vCPU, and
    // the same name; hrtimer_interrupt (index 2) has the lower address.
    t.counts[DO_IDLE as usize] = vec![100, 0, 0, 0];
    t.counts[HRTIMER as usize] = vec![0, 0, 0, 100];
    t.functions[DO_IDLE as usize].name = "same".into();
    t.functions[HRTIMER as usize].name = "same".into();
    t.functions[HRTIMER as usize].addr = t.functions[DO_IDLE as usize].addr - 1;
    for sort in [Sort::Count, Sort::Name, Sort::Cpu] {
        let o = order(&Report::new(&t, &opts(sort, None, false)));
        let at = |f| o.iter().position(|&x| x == f).unwrap();
        assert_eq!(at(DO_IDLE), at(HRTIMER) + 1, "{sort:?}: {o:?}");
    }
}

#[test]
fn report_model_counts_only_the_selected_cpus() {
    let t = fixture::trace();
    // Unsorted, repeated, and one vCPU the trace does not have.
    let r = Report::new(&t, &opts(Sort::Count, Some(&[9, 2, 0, 2]), false));
    assert_eq!(r.cpus, [0, 2]);
    assert_eq!(r.missing, [9]);
    assert!(r.filtered);
    let totals: Vec<(u32, Vec<u64>, u64)> = r
        .rows
        .iter()
        .map(|row| (row.index as u32, row.per_cpu.clone(), row.total))
        .collect();
    assert_eq!(
        totals,
        [
            (LONG, vec![1_234_567, 0], 1_234_567),
            (SCHEDULE, vec![1000, 1003], 2003),
            (DO_IDLE, vec![500, 500], 1000),
            (HRTIMER, vec![10, 30], 40),
            (ONLY_CPU2, vec![0, 7], 7),
        ]
    );
    assert_eq!(r.total(), 1_234_567 + 2003 + 1000 + 40 + 7);
    // The busiest vCPU, as an index into `per_cpu`; the lower one on ties.
    let busiest: Vec<usize> = r.rows.iter().map(|row| row.busiest).collect();
    assert_eq!(busiest, [0, 1, 0, 1, 1]);

    // A function called only elsewhere becomes uncalled.
    let r = Report::new(&t, &opts(Sort::Count, Some(&[1]), false));
    assert_eq!(order(&r), [SCHEDULE, HRTIMER]);
    // By name: do_idle, only_cpu2, uncalled_a, uncalled_b, very_long_….
    assert_eq!(
        uncalled(&r),
        [DO_IDLE, ONLY_CPU2, UNCALLED_A, UNCALLED_B, LONG]
    );

    // None of the requested vCPUs exists: nothing is counted.
    let r = Report::new(&t, &opts(Sort::Cpu, Some(&[7]), true));
    assert!(r.cpus.is_empty());
    assert!(r.rows.is_empty());
    assert_eq!(r.uncalled.len(), t.functions.len());
    assert_eq!(r.events().count(), 0);

    // Without --cpu: every vCPU, not filtered.
    let r = Report::new(&t, &opts(Sort::Count, None, false));
    assert_eq!((r.cpus.as_slice(), r.filtered), (&[0, 1, 2, 3][..], false));
    assert!(r.missing.is_empty());
}

#[test]
fn report_model_resolves_callers_once_per_function() {
    let t = fixture::trace();
    let r = Report::new(&t, &opts(Sort::Name, None, true));
    assert!(r.with_callers);
    let unknown = format!("[unknown] {:#x}", fixture::UNKNOWN_IP);
    assert_eq!(
        callers(&r, SCHEDULE),
        [
            ("worker_thread".to_string(), 5),
            ("kthread".to_string(), 2),
            (unknown, 1),
        ]
    );
    // Equal counts by name: "[unknown]" sorts before "worker_thread".
    assert_eq!(
        callers(&r, HRTIMER),
        [
            ("[unknown] 0x0".to_string(), 1),
            ("worker_thread".to_string(), 1)
        ]
    );
    // A return address exactly at a caller's start is in it.
    assert_eq!(callers(&r, LONG), [("kthread".to_string(), 1)]);
    // Every function's callers add up to its stored events.
    for row in r.functions() {
        let stored = t
            .events
            .iter()
            .filter(|e| e.func as usize == row.index)
            .count();
        let sum: u64 = row.callers.iter().map(|c| c.count).sum();
        assert_eq!(sum, stored as u64, "{}", row.func.name);
    }
    assert!(callers(&r, UNCALLED_A).is_empty());

    // With --cpu 2: only the events made on vCPU 2.
    let r = Report::new(&t, &opts(Sort::Count, Some(&[2]), true));
    assert_eq!(
        callers(&r, SCHEDULE),
        [("worker_thread".to_string(), 2), ("kthread".to_string(), 1)]
    );
    assert_eq!(callers(&r, DO_IDLE), [("kthread".to_string(), 2)]);

    // Without -g: no callers are computed.
    let r = Report::new(&t, &opts(Sort::Count, None, false));
    assert!(!r.with_callers);
    assert!(r.functions().all(|row| row.callers.is_empty()));
}

#[test]
fn report_model_events_resolve_function_and_caller_on_the_selected_cpus() {
    let t = fixture::trace();
    let all = Report::new(&t, &ReportOptions::default());
    let events: Vec<_> = all.events().collect();
    assert_eq!(events.len(), t.events.len());
    for (row, e) in events.iter().zip(&t.events) {
        assert_eq!(row.event, e);
        assert_eq!(row.func, &t.functions[e.func as usize]);
    }
    assert_eq!(events[5].caller, Caller::Known(&t.callers[1]));
    assert_eq!(events[5].caller.label(), "kthread");
    assert_eq!(t.callers[1].addr, KTHREAD);
    assert_eq!(events[7].caller, Caller::Unknown(fixture::UNKNOWN_IP));

    let cpu2 = Report::new(&t, &opts(Sort::Count, Some(&[2]), false));
    let on2: Vec<_> = cpu2.events().map(|row| *row.event).collect();
    let want: Vec<_> = t.events.iter().filter(|e| e.cpu == 2).copied().collect();
    assert_eq!(on2, want);

    // An event naming no traced function is left out.
    let mut bad = t.clone();
    bad.events[0].func = 99;
    let r = Report::new(&bad, &ReportOptions::default());
    assert_eq!(r.events().count(), t.events.len() - 1);
}

#[test]
fn report_model_of_an_empty_trace_has_no_rows() {
    let t = Trace::default();
    let r = Report::new(&t, &ReportOptions::whole_trace());
    assert!(r.rows.is_empty() && r.uncalled.is_empty() && r.cpus.is_empty());
    assert_eq!((r.total(), r.events().count()), (0, 0));
}
