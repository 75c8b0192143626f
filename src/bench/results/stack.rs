//! call/stack: its `stack_` figures in the JSON, its lines of the table,
//! its method. No goal: what a stack costs is for the reader to weigh.

use std::fmt::{self, Write as _};

use super::super::measure::{
    StackAlone, StackCosts, HANDLER_TRAPS, STACK_CMDLINE, STACK_FUNC, STACK_GLOB,
};
use super::super::{fig, median, swamped};
use super::exitless::{num, num_us};
use super::write_rows;
use crate::config::BenchConfig;

/// The headline figures, medians over the rounds; NaN where not measured
/// (`not_measured` says why).
pub struct StackFigures {
    /// µs per traced call without its stack, and per `stack_leaf` call
    /// with it; what the stack adds to one; with over without.
    pub without_us: f64,
    pub with_us: f64,
    pub extra_us: f64,
    pub ratio: f64,
    pub not_measured: Option<String>,
}

impl StackFigures {
    pub fn new(c: &StackCosts) -> StackFigures {
        let per_iter = |k: usize| median(&c.rounds.iter().map(|t| t[k] - t[0]).collect::<Vec<_>>());
        let over_trap = median(&c.rounds.iter().map(|t| t[2] - t[1]).collect::<Vec<_>>());
        let mut not_measured = swamped(&[("trap", per_iter(1)), ("stack", per_iter(2))]);
        if not_measured.is_none() && fig(over_trap).is_nan() {
            not_measured = Some(format!(
                "the stack phases were not slower than the trap phases (per iteration: \
                 {over_trap:+.2} µs): this host's noise swamped the difference; raise --iters \
                 or --rounds"
            ));
        }
        let without_us = fig(median(&c.without_us()));
        let extra_us = fig(median(&c.extra_us()));
        let both = !without_us.is_nan() && !extra_us.is_nan();
        let (with_us, ratio) = match both {
            true => (median(&c.with_us()), median(&c.ratios())),
            false => (f64::NAN, f64::NAN),
        };
        StackFigures {
            without_us,
            with_us,
            extra_us,
            ratio,
            not_measured,
        }
    }
}

/// The `stack_` figures, in the order printed.
pub fn figures(c: &StackCosts) -> Vec<(String, f64)> {
    let f = StackFigures::new(c);
    let it = c.iter_us();
    [
        ("stack_with_over_without", f.ratio),
        ("stack_with_us_per_call", f.with_us),
        ("stack_without_us_per_call", f.without_us),
        ("stack_extra_us_per_stack", f.extra_us),
        ("stack_frames_mean", c.frames_mean()),
        ("stack_exits_per_call", c.exits_per_call()),
        ("stack_calls_per_iter", c.calls_per_iter),
        ("stack_stacks_per_iter", c.stacks_per_iter),
        ("stack_stacks", c.stacks as f64),
        ("stack_distinct", c.distinct as f64),
        ("stack_iter_untraced_us", it[0]),
        ("stack_iter_trap_us", it[1]),
        ("stack_iter_stack_us", it[2]),
    ]
    .into_iter()
    .chain(alone(c.alone.as_ref()))
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// The recorders alone in process, ns per trap: without and with the
/// stack, and the stack's part.
fn alone(a: Option<&StackAlone>) -> Vec<(&'static str, f64)> {
    let Some(a) = a else {
        return Vec::new();
    };
    vec![
        ("stack_handler_recorder_ns", a.recorder_ns),
        ("stack_handler_recorder_stack_ns", a.recorder_stack_ns),
        (
            "stack_handler_stack_ns",
            a.recorder_stack_ns - a.recorder_ns,
        ),
        ("stack_handler_frames", a.frames as f64),
    ]
}

/// The figures not measured (NaN), by name, with why.
pub fn not_measured(c: &StackCosts) -> Vec<(String, String)> {
    let Some(why) = StackFigures::new(c).not_measured else {
        return Vec::new();
    };
    figures(c)
        .into_iter()
        .filter(|(_, v)| v.is_nan())
        .map(|(k, _)| (k, why.clone()))
        .collect()
}

/// The section: per figure its median and the rounds' range.
pub fn write(o: &mut String, c: &StackCosts, cfg: &BenchConfig) -> fmt::Result {
    writeln!(
        o,
        "call/stack: {} vCPU, mini guest `{STACK_CMDLINE}`, --trace '{STACK_GLOB}' --mode trap, \
         {} rounds of untraced / trap / trap --stack {STACK_FUNC} phases of {} iterations; \
         {:.2} traced calls and {:.3} stacks per iteration",
        cfg.cpus, cfg.rounds, cfg.iters, c.calls_per_iter, c.stacks_per_iter
    )?;
    writeln!(o, "  {:<44} {:>10}   rounds min .. max", "", "median")?;
    let f = StackFigures::new(c);
    let (without, with, extra, ratios) = (c.without_us(), c.with_us(), c.extra_us(), c.ratios());
    let range = |v: f64, rounds| (!v.is_nan()).then_some(rounds);
    let rows = [
        (
            "stack_leaf call with its stack / without",
            num(f.ratio, 3),
            range(f.ratio, &ratios[..]),
        ),
        (
            "    with its stack, per call",
            num_us(f.with_us, 2),
            range(f.with_us, &with[..]),
        ),
        (
            "    without (trap mode, no --stack)",
            num_us(f.without_us, 2),
            range(f.without_us, &without[..]),
        ),
        (
            "    the stack alone (unwind + intern)",
            num_us(f.extra_us, 2),
            range(f.extra_us, &extra[..]),
        ),
    ];
    write_rows(o, &rows)?;
    if let Some(why) = &f.not_measured {
        writeln!(o, "  times not measured: {why}")?;
    }
    writeln!(
        o,
        "  frames per stack: mean {:.3} over {} stacks ({} distinct); exits per call with \
         --stack: {:.4} ({} exits in {} calls)",
        c.frames_mean(),
        c.stacks,
        c.distinct,
        c.exits_per_call(),
        c.stack_exits,
        c.stack_calls
    )?;
    if let Some(a) = &c.alone {
        writeln!(
            o,
            "  recorder alone in process: {:.0} ns with a {}-frame stack, {:.0} ns without \
             (the stack: {:.0} ns)",
            a.recorder_stack_ns,
            a.frames,
            a.recorder_ns,
            a.recorder_stack_ns - a.recorder_ns
        )?;
    }
    let it = c.iter_us();
    writeln!(
        o,
        "  µs per guest iteration: untraced {:.1}, trap {:.1}, trap with stacks {:.1}",
        it[0], it[1], it[2]
    )
}

pub fn method() -> String {
    format!(
        "the mini guest with `{STACK_CMDLINE}` (stack_leaf called through four known chains of \
         2 to 5 frames, unwound by frame pointers), --trace '{STACK_GLOB}' in trap mode: \
         phases of --iters iterations untraced, trapping to a tracer planned without --stack, \
         and to one planned with --stack {STACK_FUNC}, in rotating order, --rounds rounds, as \
         (a)-(c); t = µs per iteration per vCPU, X = traced calls per iteration, L = \
         {STACK_FUNC} calls per iteration (each with its stack): without = (t_trap - \
         t_untraced) / X, the stack = (t_stack - t_trap) / L, with = without + the stack, and \
         with / without per round; medians over the rounds. Frames per stack: mean over every \
         recorded stack; exits per call: trace-port exits over calls in the stack phases (the \
         run fails unless every exit was one recorded call, and every {STACK_FUNC} call, and \
         only those, has its stack, unwound to the bottom). Cross-check: each tracer's \
         recorder timed alone in process, {HANDLER_TRAPS} traps at {STACK_FUNC}'s site on a Trap \
         over the mini guest's memory (not run) with a 4-frame chain written on its stack"
    )
}
