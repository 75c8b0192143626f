//! Direct entries' benches: call/direct, attach/direct and sites/direct,
//! their figures (`direct_` in the JSON's `figures`), goals, sections of
//! the table and methods.

use std::fmt::{self, Write as _};

use tracer::trace::report;

use super::super::measure::{
    DirectAttach, DirectSiteCounts, ExitlessCosts, DIRECT_SITES, E_REPS, SPIN, TRACE_GLOB,
};
use super::exitless::{num, ExitlessFigures};
use super::{max, Goal, Results};
use crate::bench::median;
use crate::config::BenchConfig;

/// Goal: an exitless direct-entry call runs at most this many guest
/// instructions more than an ftrace site's, its relocated ones aside.
pub const GOAL_MORE_INSTRUCTIONS: f64 = 5.0;
/// Goals: attach/direct's worst window, µs, by site count.
pub const GOAL_WINDOW_US: [f64; 2] = [1_000.0, 10_000.0];

/// call/direct beside call/exitless's ftrace sites (`ftrace`, if run):
/// instructions per call more, counted by KVM if it counted both, else in
/// the code; and how.
pub fn more(d: &ExitlessCosts, ftrace: Option<&ExitlessCosts>) -> (f64, &'static str) {
    let counted = |c: &ExitlessCosts| c.counted_instructions().ok().map(|v| median(&v));
    if let Some((dc, fc)) = counted(d).zip(ftrace.and_then(counted)) {
        return (dc - fc, "counted by KVM");
    }
    let stat = match ftrace {
        Some(f) => d.static_instructions as f64 - f.static_instructions as f64,
        None => d.stubs.as_ref().map_or(f64::NAN, |s| s.around as f64),
    };
    (stat, "static")
}

/// call/direct's figures, in the order printed.
pub fn call_figures(d: &ExitlessCosts, ftrace: Option<&ExitlessCosts>) -> Vec<(String, f64)> {
    let f = ExitlessFigures::new(d);
    let counted = f.guest_instructions_per_call_counted.unwrap_or(f64::NAN);
    let (more_by, _) = more(d, ftrace);
    let mut v = vec![
        ("direct_call_more_than_ftrace", more_by),
        (
            "direct_call_instructions_static",
            d.static_instructions as f64,
        ),
        ("direct_call_instructions_counted", counted),
        (
            "direct_call_instructions_measured",
            f.guest_instructions_per_call,
        ),
    ];
    if let Some(s) = &d.stubs {
        v.push(("direct_call_around_body_static", s.around as f64));
        v.push(("direct_call_relocated_per_site", s.relocated_mean()));
        v.push(("direct_call_sites", s.sites as f64));
    }
    if let Some(fc) = ftrace {
        let c = fc.counted_instructions().map_or(f64::NAN, |v| median(&v));
        v.push((
            "direct_call_ftrace_instructions_static",
            fc.static_instructions as f64,
        ));
        v.push(("direct_call_ftrace_instructions_counted", c));
    }
    v.extend([
        ("direct_call_exits_per_call", f.exits_per_call),
        ("direct_call_calls", d.exitless_calls as f64),
        ("direct_call_trap_exits_per_call", d.trap_exits_per_call),
        ("direct_call_trap_us", f.trap_us_per_call),
        ("direct_call_exitless_us", f.exitless_us_per_call),
    ]);
    v.into_iter().map(|(k, x)| (k.to_string(), x)).collect()
}

/// call/direct's figures not measured (null), with why.
pub fn not_measured(r: &Results) -> Vec<(String, String)> {
    let Some(d) = &r.direct else {
        return Vec::new();
    };
    let f = ExitlessFigures::new(d);
    let why = |k: &str| -> Option<String> {
        match k {
            "direct_call_instructions_counted" => {
                f.guest_instructions_counted_not_available.clone()
            }
            "direct_call_ftrace_instructions_counted" => r
                .exitless
                .as_ref()
                .and_then(|c| c.counted_instructions().err()),
            _ => f.timing_not_measured.clone(),
        }
    };
    call_figures(d, r.exitless.as_ref())
        .into_iter()
        .filter(|(_, v)| v.is_nan())
        .filter_map(|(k, _)| why(&k).map(|w| (k, w)))
        .collect()
}

pub fn goal_name() -> String {
    format!(
        "direct-entry call <= {GOAL_MORE_INSTRUCTIONS} guest instructions more than an ftrace \
         site's"
    )
}

/// call/direct's goal: instructions per call more than an ftrace site's.
pub fn goal(d: &ExitlessCosts, ftrace: Option<&ExitlessCosts>) -> Goal {
    let (more_by, how) = more(d, ftrace);
    let beside = match ftrace {
        Some(_) => "call/exitless's ftrace sites, same run",
        None => "the trampoline's path, call/exitless not run",
    };
    Goal {
        name: goal_name(),
        measured: format!(
            "{} more, {how} ({beside}; relocated instructions aside); {} exits per call",
            num(more_by, 1),
            num(ExitlessFigures::new(d).exits_per_call, 4)
        ),
        pass: if more_by.is_nan() {
            Err("no static count (not direct entries)".into())
        } else {
            Ok(more_by <= GOAL_MORE_INSTRUCTIONS)
        },
    }
}

/// Instructions per call counted by KVM, median, or "n/a".
fn counted(c: &ExitlessCosts) -> String {
    match c.counted_instructions() {
        Ok(v) => format!("{:.1}", median(&v)),
        Err(_) => "n/a".into(),
    }
}

/// call/direct's section.
pub fn write_call(
    o: &mut String,
    d: &ExitlessCosts,
    ftrace: Option<&ExitlessCosts>,
    cfg: &BenchConfig,
) -> fmt::Result {
    let f = ExitlessFigures::new(d);
    let guest = cfg
        .mini_noftrace
        .as_ref()
        .map_or_else(String::new, |k| k.display().to_string());
    let Some(s) = &d.stubs else {
        return writeln!(
            o,
            "call/direct: NOT MEASURED, the sites were not direct entries"
        );
    };
    writeln!(
        o,
        "call/direct: {guest}, {} direct sites ({TRACE_GLOB}), {} rounds of untraced / spin {SPIN} \
         / trap / exitless phases of {} iterations",
        s.sites, cfg.rounds, cfg.iters
    )?;
    writeln!(
        o,
        "  guest instructions per exitless call, static   {} (site jmp, stub call, jump back: {}; \
         body {}; relocated {:.2} per site, aside)",
        d.static_instructions,
        s.around,
        d.static_instructions - s.around,
        s.relocated_mean()
    )?;
    writeln!(
        o,
        "  guest instructions per exitless call, counted  {} (KVM)",
        counted(d)
    )?;
    if let Some(why) = &f.guest_instructions_counted_not_available {
        writeln!(o, "    instructions counted by KVM: not available: {why}")?;
    }
    writeln!(
        o,
        "  guest instructions per exitless call, measured {} (calibrated by the spin)",
        num(f.guest_instructions_per_call, 1)
    )?;
    write_beside(o, d, ftrace, &f)
}

/// call/direct's rows beside the ftrace site's, and its exits and times.
fn write_beside(
    o: &mut String,
    d: &ExitlessCosts,
    ftrace: Option<&ExitlessCosts>,
    f: &ExitlessFigures,
) -> fmt::Result {
    match ftrace {
        Some(fc) => writeln!(
            o,
            "  ftrace site (call/exitless, this run): static {}, counted {}",
            fc.static_instructions,
            counted(fc)
        )?,
        None => writeln!(
            o,
            "  ftrace site: call/exitless not run (`vmtrace bench call/exitless call/direct` \
             puts them side by side)"
        )?,
    }
    let (more_by, how) = more(d, ftrace);
    writeln!(o, "  more than an ftrace site: {} ({how})", num(more_by, 1))?;
    writeln!(
        o,
        "  exits per call: exitless {:.4} ({} trace-port traps in {} calls), trap {:.3}",
        f.exits_per_call,
        d.exitless_traps,
        report::thousands(d.exitless_calls),
        d.trap_exits_per_call
    )?;
    writeln!(
        o,
        "  µs per call: trap {}, exitless {}",
        num(f.trap_us_per_call, 2),
        num(f.exitless_us_per_call, 2)
    )?;
    if let Some(why) = &f.timing_not_measured {
        writeln!(o, "  times not measured: {why}")?;
    }
    Ok(())
}

/// attach/direct's figures, in the order printed.
pub fn attach_figures(a: &DirectAttach) -> Vec<(String, f64)> {
    let mut f = Vec::new();
    for w in &a.attach {
        let n = w.sites;
        f.push((format!("direct_attach_{n}_first_us"), w.attach[0]));
        f.push((format!("direct_attach_{n}_p50_us"), median(&w.attach)));
        f.push((format!("direct_attach_{n}_max_us"), max(&w.attach)));
        f.push((
            format!("direct_attach_{n}_detach_p50_us"),
            median(&w.detach),
        ));
    }
    f.push(("direct_attach_safe_sites".into(), a.safe as f64));
    f
}

/// attach/direct's goals, judged on the worst attach; none when not run.
pub fn attach_goals(a: &DirectAttach) -> Vec<Goal> {
    DIRECT_SITES
        .iter()
        .zip(GOAL_WINDOW_US)
        .map(|(&n, limit)| {
            let name = format!(
                "pause window for {} direct sites <= {} ms",
                report::thousands(n as u64),
                limit / 1e3
            );
            match a.attach.iter().find(|w| w.sites == n) {
                Some(w) => Goal {
                    name,
                    measured: format!(
                        "worst {:.1} µs of {E_REPS} attaches (first {:.1}, p50 {:.1})",
                        max(&w.attach),
                        w.attach[0],
                        median(&w.attach)
                    ),
                    pass: Ok(max(&w.attach) <= limit),
                },
                None => Goal {
                    name,
                    measured: "-".into(),
                    pass: Err(format!("the vmlinux has {} direct sites", a.safe)),
                },
            }
        })
        .collect()
}

/// attach/direct's section.
pub fn write_attach(o: &mut String, a: &DirectAttach) -> fmt::Result {
    writeln!(
        o,
        "attach/direct: {} ({} direct sites) loaded into a paused VM, never booted; trap mode, \
         {E_REPS} attaches each",
        a.vmlinux.display(),
        report::thousands(a.safe as u64)
    )?;
    writeln!(
        o,
        "  {:<14} {:>11} {:>11} {:>11} {:>12}",
        "sites", "first", "p50", "max", "detach p50"
    )?;
    for w in &a.attach {
        writeln!(
            o,
            "  {:<14} {:>11} {:>11} {:>11} {:>12}",
            report::thousands(w.sites as u64),
            format!("{:.1} µs", w.attach[0]),
            format!("{:.1} µs", median(&w.attach)),
            format!("{:.1} µs", max(&w.attach)),
            format!("{:.1} µs", median(&w.detach))
        )?;
    }
    Ok(())
}

/// The key of a kernel of sites/direct in the JSON.
fn kernel_key(s: &DirectSiteCounts) -> &'static str {
    if s.label.starts_with("distro") {
        "distro"
    } else {
        "vmlinux"
    }
}

/// sites/direct's figures, by kernel, in the order printed.
pub fn sites_figures(sites: &[DirectSiteCounts]) -> Vec<(String, f64)> {
    let mut f = Vec::new();
    for s in sites {
        let k = kernel_key(s);
        f.push((format!("direct_sites_{k}_functions"), s.functions as f64));
        f.push((format!("direct_sites_{k}_safe"), s.safe as f64));
        f.push((format!("direct_sites_{k}_refused"), s.refused as f64));
        if let Some(n) = s.ftrace_sites {
            f.push((format!("direct_sites_{k}_ftrace_sites"), n as f64));
        }
        for (rule, n) in &s.by_rule {
            let rule = rule.replace('-', "_");
            f.push((format!("direct_sites_{k}_refused_{rule}"), *n as f64));
        }
        f.push((format!("direct_sites_{k}_analyze_ms"), s.analyze_ms));
    }
    f
}

/// sites/direct's section.
pub fn write_sites(o: &mut String, sites: &[DirectSiteCounts], cfg: &BenchConfig) -> fmt::Result {
    writeln!(
        o,
        "sites/direct: every function analyzed for a direct entry (DirectPlan::build)"
    )?;
    for s in sites {
        let pct = |n: usize| 100.0 * n as f64 / s.functions.max(1) as f64;
        writeln!(
            o,
            "  {}: {}: {} functions, {} safe ({:.1} %), {} refused ({:.1} %); {} ftrace sites; \
             {:.0} ms",
            s.label,
            s.path.display(),
            report::thousands(s.functions as u64),
            report::thousands(s.safe as u64),
            pct(s.safe),
            report::thousands(s.refused as u64),
            pct(s.refused),
            s.ftrace_sites
                .map_or_else(|| "no".into(), |n| report::thousands(n as u64)),
            s.analyze_ms
        )?;
        let rules: Vec<String> = s
            .by_rule
            .iter()
            .map(|(r, n)| format!("{r} {}", report::thousands(*n as u64)))
            .collect();
        writeln!(o, "    refused by rule: {}", rules.join(", "))?;
    }
    if cfg.distro_kernel.is_none() {
        writeln!(
            o,
            "  distro kernel: not measured: no distro kernel given (--distro-kernel PATH)"
        )?;
    }
    Ok(())
}

pub fn call_method() -> String {
    format!(
        "call/exitless's phases (untraced, spin {SPIN}, trap, exitless; --iters, --rounds) on \
         the mini guest built without ftrace (guest/out/mini-noftrace.elf), its {TRACE_GLOB} \
         functions entered directly (Plan::with_entry(.., EntryChoice::Direct)): the site's \
         first instructions replaced by `jmp` to a stub that calls the trampoline, runs them \
         relocated and jumps back. Static: each stub built as the attach builds it \
         (session::direct::stub::build) and decoded, less its relocated instructions, plus \
         the site's jmp, plus the trampoline's path (common_path_instructions); counted: KVM's \
         insn_emulation as call/exitless counts it. Goal: the direct call's instructions less \
         call/exitless's ftrace site's (counted if KVM counted both, else static), the \
         relocated instructions aside (they run untraced too); exits per call must be 0"
    )
}

pub fn attach_method() -> String {
    format!(
        "as (e): the Linux vmlinux (linux-noftrace/vmlinux beside --vmlinux if built, else \
         the vmlinux itself with --entry direct) loaded into a VM at its physical addresses, \
         started paused and never booted (its vCPU at the kernel's entry, whose registers and \
         stack the attach checks); Tracer::attach of {} of its direct sites (spread evenly \
         over those `--trace '*'` gets), trap mode, {E_REPS} times each with a detach \
         between: the survey (each site's displaced bytes read and decoded), the vCPU \
         context check, the stubs and the jumps; goals judged on the worst attach",
        DIRECT_SITES
            .map(|n| report::thousands(n as u64))
            .join(" and ")
    )
}

pub fn sites_method() -> String {
    "DirectPlan::build (DirectSite::analyze of every function) over the 6.1 default guest's \
     vmlinux (--vmlinux) and, given --distro-kernel PATH, a distribution's kernel (a bzImage: \
     symbols from its kallsyms, tracer::kernel::bzimage::load): functions with a safe direct \
     site, and those refused by rule (Refusal::rule); ftrace sites (SiteTable::build) beside"
        .into()
}

#[cfg(test)]
mod tests {
    use super::super::super::measure::{AttachFigures, StubCount};
    use super::*;

    /// 3.5 calls per iteration of `per_call` guest instructions, counted by
    /// KVM (60 per untraced iteration, the spin's 400 more), 1 µs each.
    fn costs(per_call: f64, static_instructions: usize, stubs: Option<StubCount>) -> ExitlessCosts {
        let ex = 60.0 + 3.5 * per_call;
        ExitlessCosts {
            rounds: vec![[10.0, 410.0, 45.0, 10.0 + 3.5 * per_call]],
            calls_per_iter: 3.5,
            exitless_calls: 700,
            exitless_traps: 0,
            static_instructions,
            task_variants: None,
            trap_exits_per_call: 1.0,
            counted: Some(vec![[60.0, 460.0, 60.0, ex]]),
            stubs,
        }
    }

    fn direct(per_call: f64) -> ExitlessCosts {
        let stubs = StubCount {
            sites: 4,
            around: 3,
            relocated: vec![1, 1, 2, 1],
        };
        costs(per_call, 28, Some(stubs))
    }

    fn find(f: &[(String, f64)], k: &str) -> f64 {
        f.iter().find(|(x, _)| x == k).map(|(_, v)| *v).unwrap()
    }

    #[test]
    fn a_direct_call_beside_an_ftrace_site() {
        let ftrace = costs(25.0, 25, None);
        // Counted by KVM in both: 28 - 25.
        let d = direct(28.0);
        assert_eq!(more(&d, Some(&ftrace)), (3.0, "counted by KVM"));
        let f = call_figures(&d, Some(&ftrace));
        assert_eq!(find(&f, "direct_call_more_than_ftrace"), 3.0);
        assert_eq!(find(&f, "direct_call_instructions_static"), 28.0);
        assert_eq!(find(&f, "direct_call_instructions_counted"), 28.0);
        assert_eq!(find(&f, "direct_call_around_body_static"), 3.0);
        assert_eq!(find(&f, "direct_call_relocated_per_site"), 1.25);
        assert_eq!(find(&f, "direct_call_ftrace_instructions_static"), 25.0);
        assert_eq!(find(&f, "direct_call_exits_per_call"), 0.0);
        let g = goal(&d, Some(&ftrace));
        assert_eq!(g.pass, Ok(true));
        assert!(
            g.measured.starts_with("3.0 more, counted by KVM"),
            "{}",
            g.measured
        );
        // Six more: missed.
        assert_eq!(goal(&direct(31.0), Some(&ftrace)).pass, Ok(false));

        // KVM does not count (the spin not counted): the static figures.
        let mut d = direct(28.0);
        d.counted = Some(vec![[0.0, 0.0, 0.0, 1.0]]);
        assert_eq!(more(&d, Some(&ftrace)), (3.0, "static"));
        let f = call_figures(&d, Some(&ftrace));
        assert!(find(&f, "direct_call_instructions_counted").is_nan());
        // call/exitless not run: the stubs' own count around the body.
        assert_eq!(more(&d, None), (3.0, "static"));
        assert!(!call_figures(&d, None)
            .iter()
            .any(|(k, _)| k.starts_with("direct_call_ftrace")));
    }

    #[test]
    fn attach_goals_on_the_worst_attach() {
        let w = |n, attach: Vec<f64>| AttachFigures {
            label: format!("{n}"),
            sites: n,
            attach,
            detach: vec![100.0],
        };
        let a = DirectAttach {
            vmlinux: "vmlinux".into(),
            safe: 11_029,
            attach: vec![w(100, vec![1200.0, 700.0]), w(1000, vec![6000.0, 5000.0])],
        };
        let g = attach_goals(&a);
        let pass: Vec<_> = g.iter().map(|g| g.pass.clone()).collect();
        assert_eq!(pass, [Ok(false), Ok(true)]);
        assert!(
            g[0].measured.starts_with("worst 1200.0 µs of 5"),
            "{}",
            g[0].measured
        );
        let f = attach_figures(&a);
        assert_eq!(find(&f, "direct_attach_1000_max_us"), 6000.0);
        assert_eq!(find(&f, "direct_attach_safe_sites"), 11_029.0);
        // Fewer direct sites than 1,000: that goal not judged.
        let a = DirectAttach {
            attach: vec![w(100, vec![500.0])],
            safe: 400,
            ..a
        };
        let g = attach_goals(&a);
        assert_eq!(g[0].pass, Ok(true));
        assert_eq!(g[1].pass, Err("the vmlinux has 400 direct sites".into()));
    }

    #[test]
    fn sites_by_kernel_and_rule() {
        let s = |label, safe| DirectSiteCounts {
            label,
            path: "k".into(),
            functions: 1000,
            safe,
            refused: 1000 - safe,
            by_rule: vec![("indirect-jump", 30), ("too-short", 20)],
            ftrace_sites: Some(700),
            analyze_ms: 5.0,
        };
        let f = sites_figures(&[s("vmlinux", 950), s("distro kernel", 960)]);
        assert_eq!(find(&f, "direct_sites_vmlinux_safe"), 950.0);
        assert_eq!(find(&f, "direct_sites_distro_refused"), 40.0);
        assert_eq!(find(&f, "direct_sites_distro_refused_indirect_jump"), 30.0);
        assert_eq!(find(&f, "direct_sites_vmlinux_ftrace_sites"), 700.0);
        let mut cfg = super::super::tests::cfg(1000, false);
        let mut o = String::new();
        write_sites(&mut o, &[s("vmlinux", 950)], &cfg).unwrap();
        assert!(
            o.contains("1,000 functions, 950 safe (95.0 %), 50 refused (5.0 %); 700 ftrace sites"),
            "{o}"
        );
        assert!(
            o.contains("    refused by rule: indirect-jump 30, too-short 20\n"),
            "{o}"
        );
        assert!(
            o.contains("distro kernel: not measured: no distro kernel given"),
            "{o}"
        );
        cfg.distro_kernel = Some("vmlinuz".into());
        let mut o = String::new();
        write_sites(&mut o, &[s("vmlinux", 950)], &cfg).unwrap();
        assert!(!o.contains("not measured"), "{o}");
    }
}
