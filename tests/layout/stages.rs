//! Rule (e): the tracer crate's stages depend on earlier stages only.
//!
//! The pipeline is kernel → plan → session → trace: `kernel/` reads the
//! guest kernel (symbols, sites, filters) and uses no other stage; `plan/`
//! decides what to trace from the kernel's facts and uses `kernel/` only;
//! `session/` runs the plan in a VM and uses `kernel/`, `plan/` and, of
//! `trace/`, the model and the data file it produces (a session produces a
//! Trace); `trace/` reads, reports and exports traces and may use every
//! earlier stage. Files outside the stage folders (lib.rs, error.rs…) are
//! shared by all and not checked.

use std::collections::BTreeSet;

use crate::loops::{modules_of, uses_of};
use crate::source::*;
use crate::Problem;

/// The stages in pipeline order.
pub const STAGES: &[&str] = &["kernel", "plan", "session", "trace"];

/// Later-stage modules a stage may use anyway: session writes a Trace.
const LATER_ALLOWED: &[(&str, &[&str])] = &[("session", &["trace::model", "trace::datafile"])];

/// Uses of a later stage, keyed `from-file -> to-file`, each with the path
/// naming it.
pub fn stage_problems(files: &[File]) -> Vec<Problem> {
    let krate = "tracer";
    let home = modules_of(files, krate);
    let stage = |m: &[String]| m.first().and_then(|s| STAGES.iter().position(|x| x == s));
    let mut seen = BTreeSet::new();
    let mut problems = Vec::new();
    for (n, target, path) in uses_of(files, krate) {
        let f = &files[n];
        let (Some(from), Some(to)) = (stage(&f.module), stage(&target)) else {
            continue;
        };
        if to <= from {
            continue;
        }
        let allowed = LATER_ALLOWED.iter().any(|(s, ms)| {
            *s == STAGES[from]
                && ms.iter().any(|m| {
                    let m: Vec<&str> = m.split("::").collect();
                    target.len() >= m.len() && target.iter().zip(&m).all(|(a, b)| a == b)
                })
        });
        let to_file = home[&target];
        let key = format!("{} -> {to_file}", f.path);
        if allowed || !seen.insert(key.clone()) {
            continue;
        }
        problems.push(Problem {
            msg: format!(
                "stage order: {} ({}) uses {} of a later stage ({}) through `{}`",
                f.path,
                STAGES[from],
                to_file,
                STAGES[to],
                path.join("::")
            ),
            key,
        });
    }
    problems
}
