//! Figure set (f), exitless against trap per traced call: its goals, its
//! rows of the table, its `exitless` object in the JSON, its method.

use std::fmt::{self, Write as _};

use serde::Serialize;
use tracer::report;

use super::super::measure::{ExitlessCosts, MAX_EXITLESS_TRAP_SHARE, SPIN, TRACE_GLOB};
use super::{write_rows, Goal};
use crate::bench::median;
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
    /// Exitless µs per call / µs per calibration instruction.
    pub guest_instructions_per_call: f64,
    /// The trampoline's instructions on a recorded call, counted in its code.
    pub guest_instructions_per_call_static: usize,
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
}

impl ExitlessFigures {
    pub fn new(c: &ExitlessCosts) -> Self {
        let [untraced, spin, trap, exitless] = c.iter_us();
        ExitlessFigures {
            exits_per_call: c.exits_per_call(),
            guest_instructions_per_call: median(&c.instructions()),
            guest_instructions_per_call_static: c.static_instructions,
            trap_us_per_call: median(&c.trap_us()),
            exitless_us_per_call: median(&c.exitless_us()),
            exitless_vs_trap: median(&c.ratios()),
            us_per_guest_instruction: median(&c.us_per_insn()),
            calls_per_iter: c.calls_per_iter,
            exitless_calls: c.exitless_calls,
            exitless_trace_port_traps: c.exitless_traps,
            spin: SPIN,
            iter_untraced_us: untraced,
            iter_spin_us: spin,
            iter_trap_us: trap,
            iter_exitless_us: exitless,
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
                "{:.1} measured ({:.2} µs / {:.3} µs per instruction); static {}",
                f.guest_instructions_per_call,
                f.exitless_us_per_call,
                f.us_per_guest_instruction,
                f.guest_instructions_per_call_static
            ),
            pass: Ok(f.guest_instructions_per_call <= GOAL_INSTRUCTIONS),
        },
    ]
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
    write_rows(
        o,
        &[
            (
                "    µs per guest instruction (spin)",
                format!("{:.3} µs", f.us_per_guest_instruction),
                Some(&insn),
            ),
            (
                "trap: cost per traced call (recorder)",
                format!("{:.2} µs", f.trap_us_per_call),
                Some(&trap),
            ),
            (
                "exitless: cost per traced call",
                format!("{:.2} µs", f.exitless_us_per_call),
                Some(&exitless),
            ),
            (
                "    exitless / trap",
                format!("{:.3}", f.exitless_vs_trap),
                Some(&ratios),
            ),
            (
                "guest instructions per call, measured",
                format!("{:.1}", f.guest_instructions_per_call),
                Some(&instructions),
            ),
            (
                "guest instructions per call, static",
                f.guest_instructions_per_call_static.to_string(),
                None,
            ),
        ],
    )?;
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
         code); exits per call = trace-port traps in the exitless phases / calls in them (any \
         phase over {:.0} % fails the run); medians over the rounds",
        2 * SPIN,
        2 * SPIN,
        MAX_EXITLESS_TRAP_SHARE * 100.0
    )
}
