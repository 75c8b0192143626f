//! Figure (i), vmtrace against the guest's own ftrace on the Linux guest's
//! boot: its goal, its lines of the table, its keys in the JSON `exitless`
//! object, its method.

use std::fmt::{self, Write as _};

use serde::Serialize;
use tracer::trace::report;

use super::super::measure::{
    BootConfig, FtraceFigures, BOOT_CONFIGS, FTRACE_CMDLINE, FTRACE_GLOB, FTRACE_SETUP_CMDLINE,
};
use super::{max, min, Goal};
use crate::bench::{fig, median};

/// (i) as measured: None, not asked for (`--linux-boots 0`); Err, failed.
pub type Measured = Option<Result<FtraceFigures, String>>;

/// How to ask for (i).
pub const HOW: &str = "run `vmtrace bench --linux-boots N` (5 x N boots of the Linux guest)";

/// (i)'s medians, in the JSON `exitless` object (null where not measured).
#[derive(Serialize)]
pub struct FtraceJson {
    /// Boots per configuration (0: not measured).
    pub linux_boots: usize,
    /// `kernfs_*` calls in one boot, as every vmtrace boot traced them.
    pub linux_boot_calls: Option<u64>,
    /// Guest instructions per call each tracer added to the boot, counted
    /// by KVM's emulator, median over the rounds.
    pub ftrace_guest_instructions_per_call: Option<f64>,
    /// The same less ftrace's setup (its boot tracing functions never called).
    pub ftrace_guest_instructions_per_call_less_setup: Option<f64>,
    /// ftrace's setup: its tracing-nothing boot less the untraced one, per
    /// call.
    pub ftrace_setup_guest_instructions_per_call: Option<f64>,
    pub exitless_guest_instructions_per_call_boot: Option<f64>,
    pub trap_guest_instructions_per_call_boot: Option<f64>,
    /// µs per call each added to the boot, median over the rounds.
    pub ftrace_us_per_call_boot: Option<f64>,
    pub exitless_us_per_call_boot: Option<f64>,
    pub trap_us_per_call_boot: Option<f64>,
    /// The untraced boots' instructions: median, and max - min.
    pub linux_boot_untraced_instructions: Option<f64>,
    pub linux_boot_untraced_instructions_spread: Option<f64>,
    /// Why (i) failed (absent unless it did).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub linux_boot_failed: Option<String>,
    /// Why the per-call instruction figures are null: the boots' own
    /// variation swamped what a tracer added (absent when measured).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub linux_boot_not_measured: Option<String>,
}

/// Why the per-call instruction figures cannot be given: a tracer that
/// added nothing or less than nothing to a boot (median over the rounds)
/// means the untraced boots' own variation swamped it; None when each is
/// positive.
pub fn swamped(f: &FtraceFigures) -> Option<String> {
    let lost: Vec<String> = [
        (
            "exitless",
            median(&f.added_instructions(BootConfig::Exitless)),
        ),
        ("trap", median(&f.added_instructions(BootConfig::Trap))),
        ("ftrace less its setup", median(&f.ftrace_less_setup())),
    ]
    .iter()
    .filter(|(_, v)| fig(*v).is_nan())
    .map(|(what, v)| format!("{what} {v:+.1}"))
    .collect();
    (!lost.is_empty()).then(|| {
        let (_, spread) = f.untraced_spread();
        format!(
            "a tracer added no instructions per call to the boot ({}): the boots' own \
             variation (untraced boots {:.1} per call apart over {} rounds) swamped it; raise \
             --linux-boots",
            lost.join(", "),
            spread / f.calls as f64,
            f.rounds
        )
    })
}

impl FtraceJson {
    pub fn new(m: &Measured, boots: usize) -> Self {
        let f = m.as_ref().and_then(|r| r.as_ref().ok());
        // Instructions per call are null where the boots' variation
        // swamped them (`swamped`); times are as measured.
        let per_call = |c, us: bool| {
            f.map(|f: &FtraceFigures| {
                if us {
                    median(&f.added_us(c))
                } else {
                    fig(median(&f.added_instructions(c)))
                }
            })
        };
        FtraceJson {
            linux_boots: boots,
            linux_boot_calls: f.map(|f| f.calls),
            ftrace_guest_instructions_per_call: per_call(BootConfig::Ftrace, false),
            ftrace_guest_instructions_per_call_less_setup: f
                .map(|f| fig(median(&f.ftrace_less_setup()))),
            ftrace_setup_guest_instructions_per_call: per_call(BootConfig::FtraceSetup, false),
            exitless_guest_instructions_per_call_boot: per_call(BootConfig::Exitless, false),
            trap_guest_instructions_per_call_boot: per_call(BootConfig::Trap, false),
            ftrace_us_per_call_boot: per_call(BootConfig::Ftrace, true),
            exitless_us_per_call_boot: per_call(BootConfig::Exitless, true),
            trap_us_per_call_boot: per_call(BootConfig::Trap, true),
            linux_boot_untraced_instructions: f.map(|f| f.untraced_spread().0),
            linux_boot_untraced_instructions_spread: f.map(|f| f.untraced_spread().1),
            linux_boot_failed: m.as_ref().and_then(|r| r.as_ref().err().cloned()),
            linux_boot_not_measured: f.and_then(swamped),
        }
    }
}

pub fn goal(m: &Measured) -> Goal {
    let name = "exitless costs fewer guest instructions per call than the guest's ftrace".into();
    match m {
        None => Goal {
            name,
            measured: "-".into(),
            pass: Err(format!("not measured: {HOW}")),
        },
        Some(Err(e)) => Goal {
            name,
            measured: "-".into(),
            pass: Err(format!("(i) failed: {e}")),
        },
        Some(Ok(f)) => {
            let ex = median(&f.added_instructions(BootConfig::Exitless));
            // The stricter comparison: ftrace less its setup.
            let ft = median(&f.ftrace_less_setup());
            Goal {
                name,
                measured: format!(
                    "exitless {ex:.1} vs. ftrace {ft:.1} (less its setup) per {FTRACE_GLOB} \
                     call, counted by KVM's emulator over the boot ({} boots each, {} calls)",
                    f.rounds,
                    report::thousands(f.calls)
                ),
                pass: match swamped(f) {
                    Some(why) => Err(format!("not measured: {why}")),
                    None => Ok(ex < ft),
                },
            }
        }
    }
}

/// `n` with thousands separators, from a count held as f64.
fn count(n: f64) -> String {
    report::thousands(n.round() as u64)
}

/// (i): each configuration's boots, then what each tracer added per call.
pub fn write(o: &mut String, m: &Measured) -> fmt::Result {
    let f = match m {
        None => {
            return writeln!(
                o,
                "(i) vmtrace vs. the guest's own ftrace, Linux boot: NOT MEASURED ({HOW}; each \
                 boot takes a minute or more where KVM emulates guest ring 0)"
            )
        }
        Some(Err(e)) => return writeln!(o, "(i) vmtrace vs. the guest's own ftrace: FAILED: {e}"),
        Some(Ok(f)) => f,
    };
    writeln!(
        o,
        "(i) vmtrace vs. the guest's own ftrace: the Linux guest's boot to its end (1 vCPU), {} \
         boots per configuration, interleaved; {FTRACE_GLOB}: {} calls per boot",
        f.rounds,
        report::thousands(f.calls)
    )?;
    writeln!(
        o,
        "  {:<22} {:>14}  {:<29} {:>8}  min .. max",
        "boot", "instructions", "min .. max", "seconds"
    )?;
    for c in BOOT_CONFIGS {
        let (i, s) = (f.instructions(c), f.seconds(c));
        writeln!(
            o,
            "  {:<22} {:>14}  {:<29} {:>8.1}  {:.1} .. {:.1}",
            c.name(),
            count(median(&i)),
            format!("{} .. {}", count(min(&i)), count(max(&i))),
            median(&s),
            min(&s),
            max(&s)
        )?;
    }
    writeln!(
        o,
        "  {:<22} {:>14}  {:<29} {:>8}  rounds min .. max",
        "added per call", "instructions", "rounds min .. max", "µs"
    )?;
    for c in &BOOT_CONFIGS[1..] {
        let (i, t) = (f.added_instructions(*c), f.added_us(*c));
        writeln!(
            o,
            "  {:<22} {:>14.1}  {:<29} {:>8.1}  {:.1} .. {:.1}",
            c.name(),
            median(&i),
            format!("{:.1} .. {:.1}", min(&i), max(&i)),
            median(&t),
            min(&t),
            max(&t)
        )?;
    }
    let net = f.ftrace_less_setup();
    writeln!(
        o,
        "  {:<22} {:>14.1}  {:<29}",
        "ftrace less its setup",
        median(&net),
        format!("{:.1} .. {:.1}", min(&net), max(&net)),
    )?;
    let (mid, spread) = f.untraced_spread();
    writeln!(
        o,
        "  untraced boots vary by {} instructions ({:.2} % of the median): {:.1} per call",
        count(spread),
        spread / mid * 100.0,
        spread / f.calls as f64
    )
}

/// How (i) is measured.
pub fn method() -> String {
    format!(
        "the default Linux guest (guest/out bzImage, initramfs, vmlinux) booted to its end \
         (1 vCPU, 96 MiB; on an emulating host the boot ends with the panic that follows \
         `Run /init`), --linux-boots times in each of five configurations, interleaved (the \
         order rotates each round): untraced; the guest's own function tracer (--cmdline \
         '{FTRACE_CMDLINE}'); the same tracer on functions the boot never calls (--cmdline \
         '{FTRACE_SETUP_CMDLINE}': its setup alone, which the line 'ftrace less its setup' \
         takes off); vmtrace --trace '{FTRACE_GLOB}' --mode trap; and --mode exitless. \
         Each boot is vmtrace itself run as a subprocess with --stats (the instructions KVM's \
         emulator ran, all vCPUs, and the run's time from the vCPUs' start to their stop) and, \
         traced, --format json (the calls, the trap exits); a boot whose console has `ftrace \
         bug`, `WARNING:` or `BUG:`, or that did not reach `Run /init`, fails the figure, as do \
         vmtrace boots that traced different numbers of calls (they are the same every boot: \
         vmtrace attaches right after the guest's ftrace_init). Added per call, per round: \
         (the boot's instructions - that round's untraced boot's) / calls, and the same for \
         time; medians over the rounds, with their range. The counts are KVM's (insn_emulation: \
         every guest instruction where KVM emulates guest ring 0; meaningless elsewhere). They \
         include whatever runs longer because a boot is slower (timer ticks), so the untraced \
         boots' own spread is printed: on the CI host 7 untraced boots, measured first, ran \
         80.9 M to 86.5 M instructions (6.6 %, up to ~300 per {FTRACE_GLOB} call), more the \
         longer the boot took (70 to 102 s, with other work on the host: ~160,000 instructions \
         per second of boot, and ± 0.75 M around that line), so a boot-level figure resolves \
         hundreds of instructions per call, not tens (the mini guest's phases, (f), count \
         those). ftrace's figure is per call vmtrace counted: its tracer starts \
         later in the boot (at its registration, after ftrace_init) and its cost includes \
         patching its sites and setting up its ring buffer"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::measure::ftrace::Boot;

    fn figures() -> FtraceFigures {
        figures_with(460_000)
    }

    /// Two rounds whose exitless boots added `exitless` instructions.
    fn figures_with(exitless: i64) -> FtraceFigures {
        let mut boots = Vec::new();
        for (r, base, t) in [(0, 80_000_000u64, 70.0), (1, 80_120_000, 71.0)] {
            for (c, add, dt) in [
                (BootConfig::Untraced, 0, 0.0),
                (BootConfig::Ftrace, 6_000_000, 8.0),
                (BootConfig::FtraceSetup, 2_000_000, 2.0),
                (BootConfig::Trap, 10_000, 0.2),
                (BootConfig::Exitless, exitless, 0.5),
            ] {
                boots.push(Boot {
                    config: c,
                    round: r,
                    instructions: base.checked_add_signed(add).unwrap(),
                    seconds: t + dt,
                    calls: matches!(c, BootConfig::Trap | BootConfig::Exitless).then_some(20_000),
                    trap_exits: match c {
                        BootConfig::Trap => Some(20_000),
                        BootConfig::Exitless => Some(0),
                        _ => None,
                    },
                });
            }
        }
        FtraceFigures::judge(boots, 2).unwrap()
    }

    fn t_of(m: &Measured) -> String {
        let mut t = String::new();
        write(&mut t, m).unwrap();
        t
    }

    fn line_in(t: &str, start: &str) -> String {
        t.lines()
            .find(|l| l.trim_start().starts_with(start))
            .unwrap_or_else(|| panic!("no {start:?} in\n{t}"))
            .to_string()
    }

    #[test]
    fn per_call_figures_goal_and_table() {
        let m: Measured = Some(Ok(figures()));
        let j = serde_json::to_value(FtraceJson::new(&m, 2)).unwrap();
        assert_eq!(j["linux_boots"], 2);
        assert_eq!(j["linux_boot_calls"], 20_000);
        assert_eq!(j["ftrace_guest_instructions_per_call"], 300.0);
        assert_eq!(j["ftrace_guest_instructions_per_call_less_setup"], 200.0);
        assert_eq!(j["ftrace_setup_guest_instructions_per_call"], 100.0);
        assert_eq!(j["exitless_guest_instructions_per_call_boot"], 23.0);
        assert_eq!(j["trap_guest_instructions_per_call_boot"], 0.5);
        assert_eq!(j["ftrace_us_per_call_boot"], 400.0);
        assert_eq!(j["linux_boot_untraced_instructions"], 80_000_000.0);
        assert_eq!(j["linux_boot_untraced_instructions_spread"], 120_000.0);
        assert!(j.get("linux_boot_failed").is_none());
        let g = goal(&m);
        assert_eq!(g.status(), "PASS");
        assert!(g
            .measured
            .starts_with("exitless 23.0 vs. ftrace 200.0 (less its setup) per kernfs_* call"));
        let t = t_of(&m);
        let line = |start: &str| line_in(&t, start);
        assert!(line("ftrace less its setup").contains("200.0"));
        assert!(
            t.starts_with("(i) vmtrace vs. the guest's own ftrace"),
            "{t}"
        );
        assert!(
            line("(i)").ends_with("kernfs_*: 20,000 calls per boot"),
            "{t}"
        );
        assert_eq!(
            line("untraced "),
            format!(
                "  {:<22} {:>14}  {:<29} {:>8.1}  70.0 .. 71.0",
                "untraced", "80,000,000", "80,000,000 .. 80,120,000", 70.0
            )
        );
        // Twice: a boot row and an added-per-call row.
        let exitless: Vec<&str> = t
            .lines()
            .filter(|l| l.trim_start().starts_with("vmtrace exitless"))
            .collect();
        assert_eq!(exitless.len(), 2, "{t}");
        assert_eq!(
            exitless[1],
            format!(
                "  {:<22} {:>14.1}  {:<29} {:>8.1}  25.0 .. 25.0",
                "vmtrace exitless", 23.0, "23.0 .. 23.0", 25.0
            )
        );
        assert!(
            line("untraced boots vary")
                .ends_with("120,000 instructions (0.15 % of the median): 6.0 per call"),
            "{t}"
        );
    }

    #[test]
    fn not_measured_or_failed_says_so() {
        let j = serde_json::to_value(FtraceJson::new(&None, 0)).unwrap();
        assert_eq!(j["linux_boots"], 0);
        assert!(j["ftrace_guest_instructions_per_call"].is_null());
        assert!(j["linux_boot_calls"].is_null());
        let g = goal(&None);
        assert_eq!(g.status(), "SKIP");
        assert!(g.pass.unwrap_err().contains("--linux-boots N"));
        let mut t = String::new();
        write(&mut t, &None).unwrap();
        assert!(
            t.contains("NOT MEASURED (run `vmtrace bench --linux-boots N`"),
            "{t}"
        );

        let failed: Measured = Some(Err("the guest complained: WARNING: x".into()));
        let j = serde_json::to_value(FtraceJson::new(&failed, 3)).unwrap();
        assert_eq!(j["linux_boot_failed"], "the guest complained: WARNING: x");
        assert!(j["exitless_us_per_call_boot"].is_null());
        let g = goal(&failed);
        assert_eq!(g.status(), "SKIP");
        assert_eq!(
            g.pass.unwrap_err(),
            "(i) failed: the guest complained: WARNING: x"
        );
        let mut t = String::new();
        write(&mut t, &failed).unwrap();
        assert!(t.contains("FAILED: the guest complained"), "{t}");

        // ftrace cheaper than exitless (10 less its setup against 23): missed.
        let mut f = figures();
        for b in f.boots.iter_mut() {
            if b.config == BootConfig::Ftrace {
                b.instructions -= 3_800_000;
            }
        }
        assert_eq!(goal(&Some(Ok(f))).status(), "MISS");
    }

    #[test]
    fn a_boot_figure_the_variation_swamped_is_not_measured() {
        // The exitless boots ran fewer instructions than the untraced ones:
        // the boots' own variation, not vmtrace's cost.
        let m: Measured = Some(Ok(figures_with(-4_000_000)));
        let j = serde_json::to_value(FtraceJson::new(&m, 2)).unwrap();
        assert!(
            j["exitless_guest_instructions_per_call_boot"].is_null(),
            "{j}"
        );
        assert_eq!(j["trap_guest_instructions_per_call_boot"], 0.5);
        assert_eq!(j["ftrace_guest_instructions_per_call_less_setup"], 200.0);
        let why = j["linux_boot_not_measured"].as_str().unwrap();
        assert!(
            why.contains("exitless -200.0") && why.contains("raise --linux-boots"),
            "{why}"
        );
        let g = goal(&m);
        assert_eq!(g.status(), "SKIP");
        assert!(format!("{:?}", g.pass).contains("not measured: a tracer added"));
        // Measured figures keep their verdict and carry no reason.
        let ok = serde_json::to_value(FtraceJson::new(&Some(Ok(figures())), 2)).unwrap();
        assert!(ok.get("linux_boot_not_measured").is_none());
    }
}
