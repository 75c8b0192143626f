//! The JSON report's kernel stacks (`--stack`): the top-level `stacks`
//! (every distinct stack, `id` 1-based as entries name them) and
//! `stacks_source` (how they were unwound), and per `--stack` function the
//! ids of its stacks with their stored calls.

use serde_json::{json, Value};

use crate::kernel::unwind::StackEnd;
use crate::trace::model::Trace;
use crate::trace::report::stacks::FuncStacks;
use crate::trace::stacks::StackFrame;

/// `end` as the JSON report spells it.
pub fn end_name(end: StackEnd) -> &'static str {
    match end {
        StackEnd::Bottom => "bottom",
        StackEnd::User => "user",
        StackEnd::Unreadable => "unreadable",
        StackEnd::NoUnwindInfo => "no_unwind_info",
        StackEnd::NotText => "not_text",
        StackEnd::TooDeep => "too_deep",
        StackEnd::NotMoving => "not_moving",
    }
}

/// `stacks_source` and `stacks`, when the trace has stacks or says how
/// they were (to be) unwound.
pub(super) fn stacks_json(doc: &mut Value, trace: &Trace) {
    if trace.meta.stacks.is_empty() && trace.stacks.is_empty() {
        return;
    }
    doc["stacks_source"] = json!(trace.meta.stacks);
    let stacks: Vec<Value> = trace
        .stacks
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let frames: Vec<Value> = (0..s.frames.len())
                .map(|k| {
                    let f = StackFrame::of(trace, s, k);
                    let a = f.addr;
                    json!({
                        "addr": format!("{a:#x}"),
                        "function": f.function.map(|s| &s.name),
                        "offset": f.function.map(|_| f.offset()),
                    })
                })
                .collect();
            json!({
                "id": i + 1,
                "frames": frames,
                "end": end_name(s.end),
                "complete": s.end.is_complete(),
            })
        })
        .collect();
    doc["stacks"] = Value::Array(stacks);
}

/// A `--stack` function's `stacks`: its stacks' ids and stored calls,
/// most first.
pub(super) fn function_stacks(v: &mut Value, funcs: &[FuncStacks], index: usize) {
    if let Some(f) = funcs.iter().find(|f| f.index == index) {
        let list: Vec<Value> = f
            .stacks
            .iter()
            .map(|&(id, n)| json!({ "id": id, "count": n }))
            .collect();
        v["stacks"] = Value::Array(list);
    }
}
