//! What every text view does with a crafted trace (names holding control
//! characters cannot forge a line), `--percent-limit`, the ftrace-style
//! script and time / vCPU windows, on the synthetic fixture traces.

#[path = "report_fixture.rs"]
mod fixture;

use tracer::trace::export::script::write_script;
use tracer::trace::export::{write_csv, write_folded};
use tracer::trace::model::Trace;
use tracer::trace::report::{render, render_tree, ReportOptions, TreeOptions};
use tracer::trace::window::{parse_time, restrict, Window};

/// Names that would end a line, return the cursor, or clear a terminal.
const CRAFTED: [&str; 3] = [
    "evil\n  99.99%  1,000,000  forged_row",
    "evil\rforged",
    "evil\x1b[2J\u{9b}31m",
];

/// `t` with its functions, callers and kernel named by `name(i)`.
fn renamed(mut t: Trace, name: impl Fn(usize) -> String) -> Trace {
    for (i, f) in t.functions.iter_mut().enumerate() {
        f.name = name(i);
    }
    for (i, c) in t.callers.iter_mut().enumerate() {
        c.name = name(i + 100);
    }
    t.meta.kernel = name(200);
    t.meta.stop_reason = name(201);
    t
}

fn crafted(t: Trace) -> Trace {
    renamed(t, |i| format!("{}{i}", CRAFTED[i % CRAFTED.len()]))
}

fn plain(t: Trace) -> Trace {
    renamed(t, |i| format!("plain{i}"))
}

/// Every text view of `t`.
fn views(t: &Trace) -> Vec<(&'static str, String)> {
    let bytes = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut out = Vec::new();
        f(&mut out);
        String::from_utf8(out).expect("utf-8")
    };
    let with_callers = ReportOptions {
        callers: true,
        ..ReportOptions::default()
    };
    vec![
        ("report", render(t, &ReportOptions::default())),
        ("report -g", render(t, &with_callers)),
        ("tree", render_tree(t, &TreeOptions::default())),
        ("csv", bytes(&|o| write_csv(t, o).expect("csv"))),
        ("folded", bytes(&|o| write_folded(t, o).expect("folded"))),
        ("script", bytes(&|o| write_script(t, o).expect("script"))),
    ]
}

#[test]
fn crafted_names_cannot_forge_a_line() {
    for t in [fixture::trace(), fixture::graph_trace()] {
        let evil = views(&crafted(t.clone()));
        let good = views(&plain(t));
        for ((view, e), (_, g)) in evil.iter().zip(&good) {
            assert!(
                !e.contains(|c: char| c.is_control() && c != '\n'),
                "{view}: a control character got through:\n{e}"
            );
            // As many lines as with harmless names: none was forged.
            assert_eq!(e.lines().count(), g.lines().count(), "{view}:\n{e}");
            assert!(!e.contains("\n  99.99%"), "{view}:\n{e}");
        }
        // What a reader sees instead.
        let report = &evil[1].1;
        assert!(report.contains("evil\\x0a  99.99%"), "{report}");
        assert!(report.contains("evil\\x0dforged"), "{report}");
        assert!(report.contains("evil\\x1b[2J\\x9b31m"), "{report}");
    }
}

#[test]
fn percent_limit_hides_small_functions_and_says_so() {
    let t = fixture::trace();
    let all = render(&t, &ReportOptions::default());
    let limited = render(
        &t,
        &ReportOptions {
            percent_limit: Some(0.1),
            ..ReportOptions::default()
        },
    );
    let rows = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| l.starts_with("  ") && l.contains('%'))
            .map(str::to_string)
            .collect()
    };
    // Five called functions: the 200-character one (99.59%) and schedule
    // (0.32%) are at or over 0.1%; do_idle, hrtimer_interrupt and only_cpu2
    // are under.
    assert_eq!(rows(&all).len(), 5, "{all}");
    let shown = rows(&limited);
    assert_eq!(shown.len(), 2, "{limited}");
    // Shares are still of all the calls.
    assert!(shown[0].trim_start().starts_with("99.59%"), "{limited}");
    assert!(shown[1].trim_start().starts_with("0.32%"), "{limited}");
    assert!(shown[1].ends_with("  schedule"), "{limited}");
    assert!(
        limited.contains(
            "\n#\n# 3 called functions were hidden: under 0.1% of the calls (--percent-limit)\n"
        ),
        "{limited}"
    );
    // The uncalled ones are still counted apart.
    assert!(limited.contains("# 2 traced functions were not called: "));
    // No limit, or one nothing is under: no such line.
    let zero = ReportOptions {
        percent_limit: Some(0.0),
        ..ReportOptions::default()
    };
    assert_eq!(render(&t, &zero), all);
    assert!(!all.contains("--percent-limit"));
    // A limit over everything hides every row, and says so.
    let over = render(
        &t,
        &ReportOptions {
            percent_limit: Some(100.0),
            ..ReportOptions::default()
        },
    );
    assert!(over.contains("# 5 called functions were hidden"), "{over}");
}

#[test]
fn script_of_a_window_has_its_events_only() {
    let t = fixture::trace();
    // The fixture's 15 events are 1.23 ms apart from the attach.
    let (start, end) = parse_time("0.005,10ms").expect("time");
    let w = Window {
        time: Some((start, end)),
        cpus: Some(vec![0, 2]),
    };
    let r = restrict(&t, &w);
    let inside =
        |ts: u64| (fixture::ATTACH_NS + 5_000_000..fixture::ATTACH_NS + 10_000_000).contains(&ts);
    let want = t
        .events
        .iter()
        .filter(|e| inside(e.ts_ns) && (e.cpu == 0 || e.cpu == 2))
        .count();
    assert!(want > 0 && want < t.events.len());
    assert_eq!(r.events.len(), want);
    assert_eq!(r.meta.events_total, want as u64);

    let mut out = Vec::new();
    write_script(&r, &mut out).expect("script");
    let out = String::from_utf8(out).expect("utf-8");
    let lines: Vec<&str> = out.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(lines.len(), want, "{out}");
    assert!(lines
        .iter()
        .all(|l| l.contains("[000]") || l.contains("[002]")));
    // The window has lost nothing of its own; the whole trace's loss is
    // said in the report's header.
    assert!(!out.contains("lost"), "{out}");
    let report = render(&r, &ReportOptions::default());
    assert!(
        report.contains("window: 0.005 s to 0.01 s after the attach, vCPUs 0,2; counts are of its stored events (the whole trace did not store"),
        "{report}"
    );
    // The whole trace's script says what it lost.
    let mut whole = Vec::new();
    write_script(&t, &mut whole).expect("script");
    let whole = String::from_utf8(whole).expect("utf-8");
    assert!(
        whole.contains(&format!(
            "# {} entries lost: counted but not stored",
            t.meta.events_dropped
        )),
        "{whole}"
    );
}
