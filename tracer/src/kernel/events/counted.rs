//! Where a kernel without jump labels (no `CONFIG_JUMP_LABEL`: the
//! project's tinyconfig guests) calls its tracepoints. There
//! `static_key_false(&__tracepoint_NAME.key)` reads the key's `enabled`
//! count (include/linux/jump_label.h, the `!CONFIG_JUMP_LABEL` half), so
//! no `__jump_table` names the call sites, and the only way to them is
//! the code: each inlined `trace_NAME()` loads `tp->funcs` RIP-relative
//! before its `test`/`je` (`enabled_branch`). This module finds those
//! loads by their displacement, then decodes each as `enabled_branch`
//! does, keeping only those whose call goes to the event's static call
//! (or its `__traceiter_NAME`): `__traceiter_NAME` itself loads
//! `tp->funcs` too, to walk the probes, and must never be made to pass.

use std::collections::HashMap;

use super::enabled_branch::{self, FuncsTest};
use crate::kernel::symbols::KernelImage;

/// `mov r64, [rip+disp32]`: REX.W (R any), 8B, ModRM mod 00 rm 101.
const LOAD_LEN: u64 = 7;

/// One event to look for: its `tp->funcs` and what its call may reach.
pub struct CountedEvent {
    pub funcs: u64,
    /// `__SCT__tp_func_NAME` and `__traceiter_NAME` (link-time).
    pub callees: Vec<u64>,
}

/// Each wanted event's `tp->funcs` tests in the kernel's text (outside
/// init text), in `wanted`'s order.
pub fn funcs_tests(image: &KernelImage, wanted: &[CountedEvent]) -> Vec<Vec<FuncsTest>> {
    let mut out = vec![Vec::new(); wanted.len()];
    let Some((start, end)) = image.text else {
        return out;
    };
    let Some(text) = usize::try_from(end.saturating_sub(start))
        .ok()
        .and_then(|len| image.file_bytes(start, len))
    else {
        return out;
    };
    let by_funcs: HashMap<u64, usize> = wanted
        .iter()
        .enumerate()
        .map(|(i, w)| (w.funcs, i))
        .collect();
    for p in 0..text.len().saturating_sub(LOAD_LEN as usize) {
        let b = &text[p..p + LOAD_LEN as usize];
        if b[0] & 0xfb != 0x48 || b[1] != 0x8b || b[2] & 0xc7 != 0x05 {
            continue;
        }
        let disp = i32::from_le_bytes([b[3], b[4], b[5], b[6]]) as i64 as u64;
        let at = start + p as u64;
        let Some(&i) = by_funcs.get(&(at + LOAD_LEN).wrapping_add(disp)) else {
            continue;
        };
        let Some(t) = enabled_branch::funcs_test(image, at, wanted[i].funcs) else {
            continue;
        };
        if t.callee.is_some_and(|c| wanted[i].callees.contains(&c)) {
            out[i].push(t);
        }
    }
    out
}
