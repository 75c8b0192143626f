//! `-e sched:sched_switch,sched:sched_wakeup` on the own VMM's Linux
//! boots (tests/linux_guest.rs, 6.1 without jump labels; tests/linux_612.rs,
//! 6.12 with them): what the run says and the records it keeps.

/// The number before `after` in `text` (`attached: 5 sites patched`).
pub fn count_before(text: &str, after: &str) -> usize {
    let head = &text[..text
        .find(after)
        .unwrap_or_else(|| panic!("no {after:?}: {text}"))];
    let n = head.rsplit(|c: char| !c.is_ascii_digit()).next().unwrap();
    n.parse()
        .unwrap_or_else(|_| panic!("no count before {after:?}: {text}"))
}

/// Both events' records in the JSON report `v` (`trace_events`), with
/// their tasks and fields: each `sched_switch` made by its `prev_pid`,
/// `prev_state` one of ftrace's letters, its `next_pid` the task of the
/// next event recorded on its vCPU (more than 10 so checked), and some
/// `sched_wakeup`. Returns how many of each were recorded.
pub fn check_records(v: &serde_json::Value) -> (usize, usize) {
    let events = v["trace_events"].as_array().expect("trace_events");
    let of = |name: &str| -> Vec<serde_json::Value> {
        let e = events.iter().find(|e| e["event"] == name).expect(name);
        e["records"].as_array().unwrap().clone()
    };
    let (switches, wakeups) = (of("sched:sched_switch"), of("sched:sched_wakeup"));
    // Both events' records, by vCPU, in time order.
    let mut all: Vec<(u64, u64, bool, &serde_json::Value)> = switches
        .iter()
        .map(|r| {
            (
                r["cpu"].as_u64().unwrap(),
                r["ts_ns"].as_u64().unwrap(),
                true,
                r,
            )
        })
        .chain(wakeups.iter().map(|r| {
            (
                r["cpu"].as_u64().unwrap(),
                r["ts_ns"].as_u64().unwrap(),
                false,
                r,
            )
        }))
        .collect();
    all.sort_by_key(|e| (e.0, e.1));
    let mut checked = 0;
    for (i, (cpu, _, switch, r)) in all.iter().enumerate() {
        if !switch {
            continue;
        }
        let f = &r["fields"];
        assert_eq!(r["pid"], f["prev_pid"], "{r}");
        let state = f["prev_state"].as_str().unwrap_or_default();
        assert!(
            !state.is_empty() && state.chars().all(|c| "RSDTtXZPIN|+".contains(c)),
            "prev_state {state}: {r}"
        );
        if let Some(next) = all.get(i + 1).filter(|n| n.0 == *cpu) {
            assert_eq!(next.3["pid"], f["next_pid"], "after {r}: {}", next.3);
            checked += 1;
        }
    }
    assert!(checked > 10 && !wakeups.is_empty(), "{checked}: {v}");
    (switches.len(), wakeups.len())
}
