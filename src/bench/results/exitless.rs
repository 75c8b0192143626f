//! Figure set (f), exitless against trap per traced call: its goals, its
//! rows of the table, its `exitless` object in the JSON, its method.

use std::fmt::{self, Write as _};

use serde::Serialize;
use tracer::trace::report;

use super::super::measure::{ExitlessCosts, SPIN, SPIN_COUNT_TOLERANCE, TRACE_GLOB};
use super::{write_rows, Goal};
use crate::bench::{fig, median, swamped};
use crate::config::BenchConfig;

/// Goals: trace-port exits per traced call in exitless mode, and guest
/// instructions per traced call (measured).
pub const GOAL_EXITS_PER_CALL: f64 = 0.01;
pub const GOAL_INSTRUCTIONS: f64 = 30.0;

/// (f)'s medians over the rounds, and the exact counts; also the JSON
/// `exitless` object, whose keys keep this order.
#[derive(Serialize)]
pub struct ExitlessFigures {
    /// Trace-port traps per traced call in the exitless phases.
    pub exits_per_call: f64,
    /// Exitless µs per call / µs per calibration instruction (null: not
    /// measured, `timing_not_measured` says why; so for every time below).
    pub guest_instructions_per_call: f64,
    /// The trampoline's instructions on a recorded call, counted in its code.
    pub guest_instructions_per_call_static: usize,
    /// The same code without the task recorded (null: this kernel has no
    /// task layout, so the two are the same).
    pub guest_instructions_per_call_static_without_task: Option<usize>,
    /// A call that a one-pid `--pid` filter rejects (null likewise).
    pub guest_instructions_per_rejected_call_static: Option<usize>,
    /// Guest instructions per exitless call counted by KVM's emulator (its
    /// `insn_emulation`), median over the rounds; null where not available.
    pub guest_instructions_per_call_counted: Option<f64>,
    /// Instructions KVM counted per spin iteration over those per untraced
    /// one (the calibration: `2 * spin` where its emulator runs every guest
    /// instruction), median over the rounds; null where KVM gives no count.
    pub spin_instructions_counted: Option<f64>,
    /// Why `guest_instructions_per_call_counted` is null (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest_instructions_counted_not_available: Option<String>,
    pub trap_us_per_call: f64,
    pub exitless_us_per_call: f64,
    /// Exitless / trap per call.
    pub exitless_vs_trap: f64,
    pub us_per_guest_instruction: f64,
    pub calls_per_iter: f64,
    pub exitless_calls: u64,
    pub exitless_trace_port_traps: u64,
    /// `mini_spin` in the spin phases (2x that many instructions more).
    pub spin: u32,
    /// Median µs per guest iteration per vCPU, by phase.
    pub iter_untraced_us: f64,
    pub iter_spin_us: f64,
    pub iter_trap_us: f64,
    pub iter_exitless_us: f64,
    /// Why the figures from differences of the phases' times are null: the
    /// host's noise swamped them (absent when they were measured).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timing_not_measured: Option<String>,
}

impl ExitlessFigures {
    pub fn new(c: &ExitlessCosts) -> Self {
        let [untraced, spin, trap, exitless] = c.iter_us();
        let counted = c.counted_instructions();
        // Each a difference of two phases' times: not measured unless
        // positive.
        let (t_insn, t_trap, t_ex) = (
            median(&c.us_per_insn()),
            median(&c.trap_us()),
            median(&c.exitless_us()),
        );
        let timing_not_measured = swamped(&[
            ("spin", t_insn * 2.0 * f64::from(SPIN)),
            ("trap", t_trap * c.calls_per_iter),
            ("exitless", t_ex * c.calls_per_iter),
        ]);
        let ok = |v: f64| v.is_finite() && v > 0.0;
        let both = |a: f64, b: f64, v: f64| if ok(a) && ok(b) { v } else { f64::NAN };
        ExitlessFigures {
            exits_per_call: c.exits_per_call(),
            guest_instructions_per_call: both(t_insn, t_ex, median(&c.instructions())),
            guest_instructions_per_call_static: c.static_instructions,
            guest_instructions_per_call_static_without_task: c.task_variants.map(|v| v.0),
            guest_instructions_per_rejected_call_static: c.task_variants.map(|v| v.1),
            guest_instructions_per_call_counted: counted.as_ref().ok().map(|v| median(v)),
            spin_instructions_counted: c.spin_counted().map(|v| median(&v)),
            guest_instructions_counted_not_available: counted.err(),
            trap_us_per_call: fig(t_trap),
            exitless_us_per_call: fig(t_ex),
            exitless_vs_trap: both(t_trap, t_ex, median(&c.ratios())),
            us_per_guest_instruction: fig(t_insn),
            calls_per_iter: c.calls_per_iter,
            exitless_calls: c.exitless_calls,
            exitless_trace_port_traps: c.exitless_traps,
            spin: SPIN,
            iter_untraced_us: untraced,
            iter_spin_us: spin,
            iter_trap_us: trap,
            iter_exitless_us: exitless,
            timing_not_measured,
        }
    }
}

pub fn goals(c: &ExitlessCosts) -> [Goal; 2] {
    let f = ExitlessFigures::new(c);
    [
        Goal {
            name: format!("exits per traced call, exitless <= {GOAL_EXITS_PER_CALL}"),
            measured: format!(
                "{:.4} ({} trace-port traps in {} calls)",
                f.exits_per_call,
                report::thousands(f.exitless_trace_port_traps),
                report::thousands(f.exitless_calls)
            ),
            pass: Ok(f.exits_per_call <= GOAL_EXITS_PER_CALL),
        },
        Goal {
            name: format!("guest instructions per traced call <= {GOAL_INSTRUCTIONS}"),
            measured: format!(
                "{}; {}static {}{}",
                if f.guest_instructions_per_call.is_nan() {
                    "not measured".to_string()
                } else {
                    format!(
                        "{:.1} measured ({:.2} µs / {:.3} µs per instruction)",
                        f.guest_instructions_per_call,
                        f.exitless_us_per_call,
                        f.us_per_guest_instruction
                    )
                },
                f.guest_instructions_per_call_counted
                    .map_or(String::new(), |n| format!(
                        "{n:.1} counted by KVM's emulator; "
                    )),
                f.guest_instructions_per_call_static,
                match (
                    f.guest_instructions_per_call_static_without_task,
                    f.guest_instructions_per_rejected_call_static
                ) {
                    (Some(without), Some(rejected)) => format!(
                        " with the task recorded ({without} without; a call --pid rejects: \
                         {rejected})"
                    ),
                    _ => String::new(),
                }
            ),
            pass: match &f.timing_not_measured {
                Some(why) if f.guest_instructions_per_call.is_nan() => {
                    Err(format!("not measured: {why}"))
                }
                _ => Ok(f.guest_instructions_per_call <= GOAL_INSTRUCTIONS),
            },
        },
    ]
}

/// `v` with `decimals` decimals, or "not measured" (NaN: see
/// `timing_not_measured`).
pub(super) fn num(v: f64, decimals: usize) -> String {
    if v.is_nan() {
        "not measured".into()
    } else {
        format!("{v:.decimals$}")
    }
}

/// `num` in µs.
pub(super) fn num_us(v: f64, decimals: usize) -> String {
    if v.is_nan() {
        num(v, decimals)
    } else {
        format!("{v:.decimals$} µs")
    }
}

/// The per-round values of a figure for the table's range, unless its
/// median was not measured.
fn range(median: f64, v: &[f64]) -> Option<&[f64]> {
    (!median.is_nan()).then_some(v)
}

/// (f): one row per figure, its median and, given the per-round values,
/// their range.
pub fn write(o: &mut String, c: &ExitlessCosts, cfg: &BenchConfig) -> fmt::Result {
    let f = ExitlessFigures::new(c);
    writeln!(
        o,
        "(f) exitless vs. trap per traced call: {} vCPU, mode=loop, {} rounds of untraced / \
         spin {SPIN} / trap / exitless phases of {} iterations; {:.2} calls per iteration",
        cfg.cpus, cfg.rounds, cfg.iters, f.calls_per_iter
    )?;
    let (insn, trap, exitless, ratios, instructions) = (
        c.us_per_insn(),
        c.trap_us(),
        c.exitless_us(),
        c.ratios(),
        c.instructions(),
    );
    let (counted, spin) = (
        c.counted_instructions().unwrap_or_default(),
        c.spin_counted().unwrap_or_default(),
    );
    let na = |v: Option<f64>| v.map_or("n/a".to_string(), |n| format!("{n:.1}"));
    let us = num_us;
    write_rows(
        o,
        &[
            (
                "    µs per guest instruction (spin)",
                us(f.us_per_guest_instruction, 3),
                range(f.us_per_guest_instruction, &insn),
            ),
            (
                "trap: cost per traced call (recorder)",
                us(f.trap_us_per_call, 2),
                range(f.trap_us_per_call, &trap),
            ),
            (
                "exitless: cost per traced call",
                us(f.exitless_us_per_call, 2),
                range(f.exitless_us_per_call, &exitless),
            ),
            (
                "    exitless / trap",
                num(f.exitless_vs_trap, 3),
                range(f.exitless_vs_trap, &ratios),
            ),
            (
                "guest instructions per call, measured",
                num(f.guest_instructions_per_call, 1),
                range(f.guest_instructions_per_call, &instructions),
            ),
            (
                "guest instructions per call, counted (KVM)",
                na(f.guest_instructions_per_call_counted),
                (!counted.is_empty()).then_some(&counted[..]),
            ),
            (
                "    spin: instructions counted per iteration",
                na(f.spin_instructions_counted),
                (!spin.is_empty()).then_some(&spin[..]),
            ),
            (
                "guest instructions per call, static",
                f.guest_instructions_per_call_static.to_string(),
                None,
            ),
        ],
    )?;
    write_notes(o, &f)
}

/// (f)'s lines under its rows: what was not measured and why, the exits,
/// the phases' times.
fn write_notes(o: &mut String, f: &ExitlessFigures) -> fmt::Result {
    if let Some(why) = &f.timing_not_measured {
        writeln!(o, "  times not measured: {why}")?;
    }
    if let Some(why) = &f.guest_instructions_counted_not_available {
        writeln!(o, "  instructions counted by KVM: not available: {why}")?;
    }
    writeln!(
        o,
        "  exits per traced call, exitless: {:.4} ({} trace-port traps in {} calls)",
        f.exits_per_call,
        report::thousands(f.exitless_trace_port_traps),
        report::thousands(f.exitless_calls)
    )?;
    writeln!(
        o,
        "  µs per guest iteration: untraced {:.1}, spin {SPIN} {:.1}, trap {:.1}, exitless {:.1}",
        f.iter_untraced_us, f.iter_spin_us, f.iter_trap_us, f.iter_exitless_us
    )
}

/// (g)'s figures, with (f)'s for the same calls without return hooks: the
/// JSON `graph` object, whose keys keep this order.
#[derive(Serialize)]
pub struct GraphFigures {
    /// Trace-port exits per traced call in trap mode: with return hooks,
    /// and without (f).
    pub trap_exits_per_call: f64,
    pub trap_exits_per_call_entry_only: f64,
    pub trap_us_per_call: f64,
    pub trap_us_per_call_entry_only: f64,
    /// Exitless guest instructions per call (entry and return), measured
    /// and counted in the code; and (f)'s entry-only ones.
    pub guest_instructions_per_call: f64,
    pub guest_instructions_per_call_static: usize,
    pub guest_instructions_per_call_entry_only: f64,
    pub guest_instructions_per_call_entry_only_static: Option<usize>,
    /// The same counted by KVM's emulator (null where not available).
    pub guest_instructions_per_call_counted: Option<f64>,
    pub guest_instructions_per_call_entry_only_counted: Option<f64>,
    pub exitless_us_per_call: f64,
    pub exits_per_call_exitless: f64,
    pub us_per_guest_instruction: f64,
    pub calls_per_iter: f64,
    /// Why the time figures (and those measured against the spin) are null.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timing_not_measured: Option<String>,
}

impl GraphFigures {
    /// (g)'s figures, beside (f)'s if it was run (else those are null).
    pub fn new(g: &ExitlessCosts, f: Option<&ExitlessCosts>) -> Self {
        let gf = ExitlessFigures::new(g);
        let ff = f.map(ExitlessFigures::new);
        let entry = |v: fn(&ExitlessFigures) -> f64| ff.as_ref().map_or(f64::NAN, v);
        GraphFigures {
            trap_exits_per_call: g.trap_exits_per_call,
            trap_exits_per_call_entry_only: f.map_or(f64::NAN, |f| f.trap_exits_per_call),
            trap_us_per_call: gf.trap_us_per_call,
            trap_us_per_call_entry_only: entry(|f| f.trap_us_per_call),
            guest_instructions_per_call: gf.guest_instructions_per_call,
            guest_instructions_per_call_static: gf.guest_instructions_per_call_static,
            guest_instructions_per_call_entry_only: entry(|f| f.guest_instructions_per_call),
            guest_instructions_per_call_entry_only_static: f.map(|f| f.static_instructions),
            guest_instructions_per_call_counted: gf.guest_instructions_per_call_counted,
            guest_instructions_per_call_entry_only_counted: ff
                .as_ref()
                .and_then(|f| f.guest_instructions_per_call_counted),
            exitless_us_per_call: gf.exitless_us_per_call,
            exits_per_call_exitless: gf.exits_per_call,
            us_per_guest_instruction: gf.us_per_guest_instruction,
            calls_per_iter: gf.calls_per_iter,
            timing_not_measured: gf.timing_not_measured,
        }
    }
}

/// (g): the return hooks' cost, beside (f)'s entry-only figures. Trap
/// costs are in µs of this host (a VM of its own: compare within the
/// row); exitless costs also in guest instructions, which carry over.
pub fn write_graph(
    o: &mut String,
    g: &ExitlessCosts,
    f: Option<&ExitlessCosts>,
    cfg: &BenchConfig,
) -> fmt::Result {
    let x = GraphFigures::new(g, f);
    writeln!(
        o,
        "(g) function graph (--graph, returns hooked) vs. entry only (f): {} vCPU, mode=loop, \
         {} rounds of untraced / spin {SPIN} / trap / exitless phases of {} iterations",
        cfg.cpus, cfg.rounds, cfg.iters
    )?;
    let (trap, instructions) = (g.trap_us(), g.instructions());
    let counted = g.counted_instructions();
    let na = |v: Option<f64>| v.map_or("n/a".to_string(), |n| format!("{n:.1}"));
    // (f)'s figure beside, if (f) was run.
    let beside = |v: String, entry_only: String| match f {
        Some(_) => format!("{v} (entry only {entry_only})"),
        None => v,
    };
    write_rows(
        o,
        &[
            (
                "trap: exits per traced call",
                beside(
                    format!("{:.3}", x.trap_exits_per_call),
                    format!("{:.3}", x.trap_exits_per_call_entry_only),
                ),
                None,
            ),
            (
                "trap: cost per traced call",
                beside(
                    num_us(x.trap_us_per_call, 2),
                    num_us(x.trap_us_per_call_entry_only, 2),
                ),
                range(x.trap_us_per_call, &trap),
            ),
            (
                "exitless: instructions per call, measured",
                beside(
                    num(x.guest_instructions_per_call, 1),
                    num(x.guest_instructions_per_call_entry_only, 1),
                ),
                range(x.guest_instructions_per_call, &instructions),
            ),
            (
                "exitless: instructions per call, counted",
                beside(
                    na(x.guest_instructions_per_call_counted),
                    na(x.guest_instructions_per_call_entry_only_counted),
                ),
                counted.as_deref().ok(),
            ),
            (
                "exitless: instructions per call, static",
                beside(
                    x.guest_instructions_per_call_static.to_string(),
                    x.guest_instructions_per_call_entry_only_static
                        .map_or("n/a".into(), |n| n.to_string()),
                ),
                None,
            ),
            (
                "exitless: exits per traced call",
                format!("{:.4}", x.exits_per_call_exitless),
                None,
            ),
        ],
    )?;
    if let Some(why) = &x.timing_not_measured {
        writeln!(o, "  times not measured: {why}")?;
    }
    if let Err(why) = counted {
        writeln!(o, "  instructions counted by KVM: not available: {why}")?;
    }
    Ok(())
}

/// How (f) is measured.
pub fn method() -> String {
    format!(
        "a second mini guest in mode=loop, phases in rotating order, --rounds rounds of \
         --iters iterations: untraced, untraced with the calibration spin (mini_spin = {SPIN}: \
         {} guest instructions more per iteration), trap (Tracer::new's recorder on the \
         {TRACE_GLOB} sites) and exitless (Tracer::exitless on the same sites); t_insn = \
         (t_spin - t_untraced) / {}; per call: (t_trap - t_untraced) / calls and (t_exitless \
         - t_untraced) / calls, calls per iteration from the trap phases' traps; guest \
         instructions per call = exitless µs per call / t_insn (static: the trampoline's \
         code); counted: KVM's own count of the instructions its emulator ran \
         (insn_emulation, read under the pauses that switch phases; every guest instruction \
         where KVM emulates guest ring 0), per round (instructions per exitless iteration - \
         per untraced iteration) / calls per iteration, i.e. the exitless phase's instructions \
         minus the untraced phase's per iteration times its iterations, over its calls; used \
         only if the spin phase counted 2 x {SPIN} = {} more per iteration than untraced (± \
         {:.0} %: not so on hardware-virtualized KVM, whose emulator runs almost none); \
         exits per call = trace-port traps at sites in the exitless phases / calls in them; \
         medians over the rounds. Phases switch only where no vCPU is between a traced site \
         and the guest's own count of the call (mini_cpus[cpu].count[f]), so the calls of each \
         phase are exact, and the run fails unless the trap tracer counted exactly the trap \
         phases' calls, the exitless tracer exactly the exitless phases' calls, and no site \
         trapped in an exitless phase. A time figure that is not positive (the phases' \
         difference lost in this host's noise) is reported not measured, with why",
        2 * SPIN,
        2 * SPIN,
        2 * SPIN,
        SPIN_COUNT_TOLERANCE * 100.0,
    )
}

/// How (g) is measured.
pub fn graph_method() -> String {
    "(f) again in a third mini guest, with both tracers hooking returns (Tracer::new and \
     Tracer::exitless of a plan with graph): calls per iteration from the trap tracer's counted \
     calls; trap exits per call = the trap phases' trace-port traps / those calls (an entry \
     and a return each); guest instructions per exitless call (entry and return) measured \
     against the calibration spin, counted by KVM's emulator as in (f), and static = the \
     generated code's hooked-entry path plus return path"
        .to_string()
}
