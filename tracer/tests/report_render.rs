//! The perf-style text report, on a synthetic trace (no KVM needed).

#[path = "report_fixture.rs"]
mod fixture;

use fixture::long_name;
use tracer::trace::model::Trace;
use tracer::trace::report::{
    format_cpu_list, parse_cpu_list, render, thousands, ReportOptions, Sort,
};

/// A table row: share (percent), count, symbol as printed.
#[derive(Debug, PartialEq)]
struct Row {
    share: f64,
    count: u64,
    symbol: String,
    line: String,
}

/// The function rows of a report (not the header, not the call graph).
fn rows(report: &str) -> Vec<Row> {
    report
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let mut tokens = l.split_whitespace();
            let share = tokens.next()?.strip_suffix('%')?.parse().ok()?;
            let count = tokens.next()?.replace(',', "").parse().ok()?;
            Some(Row {
                share,
                count,
                symbol: l.split_whitespace().last()?.to_string(),
                line: l.to_string(),
            })
        })
        .collect()
}

fn names(report: &str) -> Vec<String> {
    rows(report).into_iter().map(|r| r.symbol).collect()
}

fn opts(sort: Sort) -> ReportOptions {
    ReportOptions {
        sort,
        ..Default::default()
    }
}

fn with_cpus(cpus: &[u32]) -> ReportOptions {
    ReportOptions {
        cpus: Some(cpus.to_vec()),
        ..Default::default()
    }
}

/// The call-graph lines under the row of `symbol`, as (percent, name, count).
fn callers_of(report: &str, symbol: &str) -> Vec<(String, String, u64)> {
    let mut lines = report
        .lines()
        .skip_while(|l| !l.ends_with(&format!("  {symbol}")));
    lines.next().expect("row not found");
    lines
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| {
            let rest = l.trim_start().trim_start_matches('|').strip_prefix("--")?;
            let (pct, rest) = rest.split_once("--")?;
            let (name, count) = rest.rsplit_once(" (")?;
            let count = count.trim_end_matches(')').replace(',', "").parse().ok()?;
            Some((pct.to_string(), name.to_string(), count))
        })
        .collect()
}

#[test]
fn report_header_has_every_fact_of_the_run() {
    let out = render(&fixture::trace(), &ReportOptions::default());
    let header: Vec<&str> = out.lines().take_while(|l| l.starts_with('#')).collect();
    let has = |key: &str, value: &str| {
        assert!(
            header
                .iter()
                .any(|l| l.starts_with(&format!("# {key}:")) && l.contains(value)),
            "no '{key}: ...{value}...' in header:\n{}",
            header.join("\n")
        )
    };
    has("kernel", "/boot/vmlinuz-6.8-test");
    has("build id", "0123456789abcdef0123456789abcdef01234567");
    has("vCPUs", "4");
    has("duration", "2.500 s");
    has("sites", "12,345 patched");
    has("sites", "687 skipped (678 in init text, 9 other)");
    has("events", "1,239,686 total, 15 stored, 1,239,671 dropped");
    has("rate", "495,874 events/s");
    has("attach", "pause window 123.5 µs, latency 7.9 µs");
    has("stopped", "duration elapsed");
    has("callers", "1 call's return address was unreadable");
    assert!(
        out.contains("# 2 traced functions were not called: uncalled_a, uncalled_b\n"),
        "{out}"
    );

    let mut t = fixture::trace();
    t.meta.build_id = None;
    t.meta.detach_ns = t.meta.attach_ns;
    t.meta.parent_unreadable = 0;
    let out = render(&t, &ReportOptions::default());
    assert!(out.contains("# build id: none\n"), "{out}");
    assert!(out.contains("# rate:     n/a"), "{out}");
    assert!(!out.contains("unreadable"), "{out}");

    // Under another VMM (an attach) there is no trace port: no exit count.
    let mut t = fixture::trace();
    t.meta.vmm = "QEMU 7.2.0 (pid 4242, tcg; QMP /run/qemu.sock)".into();
    let out = render(&t, &ReportOptions::default());
    assert!(out.contains("# mode:     trap\n"), "{out}");
    assert!(!out.contains("trap exits"), "{out}");
}

#[test]
fn report_sorts_by_count_name_and_cpu() {
    let t = fixture::trace();
    let long = long_name();
    let cut = |n: &str| {
        if n.len() > 40 {
            "LONG".to_string()
        } else {
            n.to_string()
        }
    };
    let order = |sort| {
        names(&render(&t, &opts(sort)))
            .iter()
            .map(|n| cut(n))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        order(Sort::Count),
        [
            "LONG",
            "schedule",
            "do_idle",
            "hrtimer_interrupt",
            "only_cpu2"
        ]
    );
    // Byte order: "d" < "h" < "o" < "s" < "v".
    assert_eq!(
        order(Sort::Name),
        [
            "do_idle",
            "hrtimer_interrupt",
            "only_cpu2",
            "schedule",
            "LONG"
        ]
    );
    // Busiest vCPU's share: 100% (ties by count), 50%, 40%, ~25%.
    assert_eq!(
        order(Sort::Cpu),
        [
            "LONG",
            "only_cpu2",
            "do_idle",
            "hrtimer_interrupt",
            "schedule"
        ]
    );
    assert!(long.starts_with("very_long_"));

    // Equal counts are ordered by name, whatever the functions' order.
    let mut t = fixture::trace();
    t.counts[fixture::DO_IDLE as usize] = vec![100, 0, 0, 0];
    t.counts[fixture::HRTIMER as usize] = vec![0, 0, 0, 100];
    t.functions[fixture::DO_IDLE as usize].name = "zzz".into();
    t.functions[fixture::HRTIMER as usize].name = "aaa".into();
    for sort in [Sort::Count, Sort::Cpu] {
        let n = names(&render(&t, &opts(sort)));
        let (a, z) = (
            n.iter().position(|x| x == "aaa").unwrap(),
            n.iter().position(|x| x == "zzz").unwrap(),
        );
        assert_eq!(z, a + 1, "{sort:?}: {n:?}");
    }
}

#[test]
fn report_shares_sum_to_100_and_use_thousands_separators() {
    let out = render(&fixture::trace(), &ReportOptions::default());
    let table = rows(&out);
    let sum: f64 = table.iter().map(|r| r.share).sum();
    assert!((sum - 100.0).abs() < 0.05, "{sum}");
    let schedule = table.iter().find(|r| r.symbol == "schedule").unwrap();
    assert_eq!(schedule.count, 4012);
    assert!(schedule.line.contains("4,012"), "{}", schedule.line);
    assert!(
        schedule.line.contains("1,000 /   998 / 1,003 / 1,011"),
        "{}",
        schedule.line
    );
    assert!(out.contains("1,234,567"), "{out}");
    // Shares are of the shown rows: 4012 / 1239686.
    assert!((schedule.share - 0.32).abs() < 0.006, "{}", schedule.share);
    assert_eq!(thousands(0), "0");
    assert_eq!(thousands(999), "999");
    assert_eq!(thousands(1000), "1,000");
    assert_eq!(thousands(u64::MAX), "18,446,744,073,709,551,615");
}

#[test]
fn report_cpu_filter_changes_counts_and_shares() {
    let t = fixture::trace();
    let out = render(&t, &with_cpus(&[2]));
    let table = rows(&out);
    let got: Vec<(&str, u64)> = table.iter().map(|r| (r.symbol.as_str(), r.count)).collect();
    // The long name is not called on vCPU 2: it leaves the table.
    assert_eq!(
        got,
        [
            ("schedule", 1003),
            ("do_idle", 500),
            ("hrtimer_interrupt", 30),
            ("only_cpu2", 7)
        ]
    );
    let total = 1003.0 + 500.0 + 30.0 + 7.0;
    for r in &table {
        let want = 100.0 * r.count as f64 / total;
        assert!(
            (r.share - want).abs() < 0.006,
            "{} {} {want}",
            r.symbol,
            r.share
        );
    }
    assert!(out.contains("# --cpu:"), "{out}");
    assert!(
        out.contains("# 3 traced functions were not called on the selected vCPUs"),
        "{out}"
    );

    // 0,2-3: sums over three vCPUs; a vCPU beyond the trace is named and ignored.
    let out = render(&t, &with_cpus(&[3, 0, 2, 9]));
    let schedule = rows(&out)
        .into_iter()
        .find(|r| r.symbol == "schedule")
        .unwrap();
    assert_eq!(schedule.count, 1000 + 1003 + 1011);
    assert!(
        out.contains("0,2-3 (counts and shares are over these vCPUs)"),
        "{out}"
    );
    assert!(out.contains("ignored 9: not in this trace"), "{out}");
    assert!(
        schedule.line.contains("vCPU") || out.contains("vCPU0 / vCPU2 / vCPU3"),
        "{out}"
    );

    let out = render(&t, &with_cpus(&[7]));
    assert!(rows(&out).is_empty(), "{out}");
    assert!(
        out.contains("no traced function was called on the selected vCPUs"),
        "{out}"
    );
}

#[test]
fn report_callers_show_counts_and_percentages() {
    let t = fixture::trace();
    let g = ReportOptions {
        callers: true,
        ..Default::default()
    };
    let out = render(&t, &g);
    assert_eq!(
        callers_of(&out, "schedule"),
        [
            ("62.50%".to_string(), "worker_thread".to_string(), 5),
            ("25.00%".to_string(), "kthread".to_string(), 2),
            (
                "12.50%".to_string(),
                format!("[unknown] {:#x}", fixture::UNKNOWN_IP),
                1
            ),
        ]
    );
    // Ties by name: "[unknown]" sorts before "worker_thread".
    assert_eq!(
        callers_of(&out, "hrtimer_interrupt"),
        [
            ("50.00%".to_string(), "[unknown] 0x0".to_string(), 1),
            ("50.00%".to_string(), "worker_thread".to_string(), 1),
        ]
    );
    assert!(out.contains("8 of 4,012 calls stored"), "{out}");
    // Without -g: no call graph.
    assert!(!render(&t, &ReportOptions::default()).contains("--kthread"));

    // With --cpu 2, only the events on vCPU 2.
    let out = render(
        &t,
        &ReportOptions {
            cpus: Some(vec![2]),
            ..g.clone()
        },
    );
    assert_eq!(
        callers_of(&out, "schedule"),
        [
            ("66.67%".to_string(), "worker_thread".to_string(), 2),
            ("33.33%".to_string(), "kthread".to_string(), 1),
        ]
    );

    // A called function with no stored event says so.
    let mut t2 = t.clone();
    t2.events.retain(|e| e.func != fixture::DO_IDLE);
    let out = render(&t2, &g);
    assert!(out.contains("(no stored calls: callers unknown)"), "{out}");
}

#[test]
fn report_truncates_long_symbols_but_never_numbers() {
    let t = fixture::trace();
    for width in [100, 80, 60, 10] {
        let out = render(
            &t,
            &ReportOptions {
                width,
                callers: true,
                ..Default::default()
            },
        );
        let row = rows(&out)
            .into_iter()
            .find(|r| r.symbol.starts_with("very_long_"))
            .unwrap();
        assert!(row.symbol.ends_with('…'), "{}", row.line);
        assert!(row.symbol.chars().count() < 200);
        assert_eq!(row.count, 1_234_567);
        assert!(
            row.line.contains("1,234,567 /     0 /     0 /     0"),
            "{}",
            row.line
        );
        if width >= 80 {
            for l in out.lines().filter(|l| !l.starts_with('#')) {
                assert!(l.chars().count() <= width, "{width}: {l}");
            }
        }
    }
    // Wide enough: nothing is cut.
    let out = render(
        &t,
        &ReportOptions {
            width: 400,
            ..Default::default()
        },
    );
    assert!(out.contains(&long_name()), "{out}");
    assert!(!out.contains('…'));
}

#[test]
fn report_columns_are_aligned() {
    let out = render(&fixture::trace(), &ReportOptions::default());
    let lines: Vec<&str> = out
        .lines()
        .filter(|l| !l.starts_with('#') || l.contains("Symbol") || l.starts_with("# ...."))
        .filter(|l| !l.trim().is_empty())
        .collect();
    // Every row and the two header lines put the symbol at the same column.
    let col = |l: &str| l.chars().count() - l.split_whitespace().last().unwrap().chars().count();
    let first = col(lines[0]);
    for l in &lines {
        assert_eq!(col(l), first, "{l}\n{out}");
    }
}

#[test]
fn report_with_many_cpus_shows_min_avg_max() {
    let mut t = fixture::trace();
    t.meta.cpus = 8;
    for r in &mut t.counts {
        let c = r.clone();
        r.extend(c.iter().map(|n| n * 2));
    }
    let out = render(&t, &ReportOptions::default());
    assert!(out.contains("min /"), "{out}");
    assert!(out.contains("busiest"), "{out}");
    let row = rows(&out)
        .into_iter()
        .find(|r| r.symbol == "schedule")
        .unwrap();
    assert_eq!(row.count, 3 * 4012);
    // min 998, avg 1,505 (12,036 / 8, rounded), max 2,022 on vCPU 7.
    assert!(row.line.contains("998 /"), "{}", row.line);
    assert!(row.line.contains("1,505 /"), "{}", row.line);
    assert!(row.line.contains("2,022"), "{}", row.line);
    assert!(row.line.contains("vCPU7"), "{}", row.line);
}

#[test]
fn report_is_deterministic() {
    let t = fixture::trace();
    for sort in [Sort::Count, Sort::Name, Sort::Cpu] {
        for callers in [false, true] {
            let o = ReportOptions {
                sort,
                callers,
                ..Default::default()
            };
            let a = render(&t, &o);
            let b = render(&t.clone(), &o);
            assert_eq!(a, b);
        }
    }
    // Event order does not change the call graph.
    let mut shuffled = t.clone();
    shuffled.events.reverse();
    let g = ReportOptions {
        callers: true,
        ..Default::default()
    };
    assert_eq!(render(&t, &g), render(&shuffled, &g));
    assert_eq!(render(&Trace::default(), &g), render(&Trace::default(), &g));
    assert!(render(&Trace::default(), &g).contains("no traced function was called"));
}

#[test]
fn report_parse_cpu_list() {
    assert_eq!(parse_cpu_list("0,2-3"), Ok(vec![0, 2, 3]));
    assert_eq!(parse_cpu_list(" 3 , 1-2,1 "), Ok(vec![1, 2, 3]));
    assert_eq!(parse_cpu_list("5-5"), Ok(vec![5]));
    for (bad, part) in [
        ("", "empty"),
        ("0,,1", "empty entry"),
        ("0,x", "'x'"),
        ("1-", "''"),
        ("3-1", "'3-1'"),
        ("-1", "''"),
        ("0,2-y", "'y'"),
        ("99999", "99999"),
        ("0-4294967295", "4294967295"),
    ] {
        let e = parse_cpu_list(bad).unwrap_err();
        assert!(e.contains(part), "{bad:?}: {e}");
        assert!(!e.contains('\n'));
    }
    assert_eq!(format_cpu_list(&[0, 2, 3]), "0,2-3");
    assert_eq!(format_cpu_list(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
    assert_eq!(format_cpu_list(&[]), "");
}
