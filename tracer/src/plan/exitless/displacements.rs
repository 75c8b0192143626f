//! The displacements and immediates the trampoline's code uses
//! (`body::Fields`), each checked to fit the instruction that holds it for
//! a spec's ring layout, kernel and copies.

use super::body::MAX_FILTER_PIDS;
use super::body::{Fields, TaskFields};
use super::error::TrampolineError;
use super::layout::{
    RingLayout, CODE_LEN, CODE_VA, DROPS_OFF, FILTERED_OFF, HEAD_OFF, LIMIT_OFF, RECORD_LEN,
    RECORD_LEN_ARGS, REC_ARGS, REC_COMMIT, REC_PARENT, REC_PID, REC_RET, REC_SLOT, REC_STRINGS,
    REC_TASK, REC_TSC, RING_TABLE_VA,
};
use super::spec::TrampolineSpec;

/// A displacement from r10 (the ring's address, then the slot's less
/// `records_off`) to a field at `off` in the ring: a sign-extended imm32.
pub(super) fn ring_disp(layout: &RingLayout, off: u64) -> Result<i64, TrampolineError> {
    let far = |_| layout_error(layout, "a field is not an imm32 away from its ring");
    i32::try_from(off).map(i64::from).map_err(far)
}

pub(super) fn layout_error(layout: &RingLayout, why: &'static str) -> TrampolineError {
    TrampolineError::Layout {
        cpus: layout.cpus,
        cap: layout.cap,
        ring_bytes: layout.ring_bytes,
        records_off: layout.records_off,
        why,
    }
}

/// The displacements and immediates the code uses, once `spec`'s layout is
/// checked to fit them.
pub(super) fn checked_fields(spec: &TrampolineSpec) -> Result<Fields, TrampolineError> {
    let layout = &spec.layout;
    let sites = layout.sites;
    // `jmp rel32` to the kernel's return thunk, from anywhere in the code
    // (iced would turn a jump beyond rel32 into an indirect one).
    if let Some(thunk) = spec.ret.thunk {
        let reach = |va: u64| i32::try_from(thunk.wrapping_sub(va) as i64).is_ok();
        if !reach(CODE_VA) || !reach(CODE_VA + CODE_LEN) {
            return Err(TrampolineError::ThunkOutOfReach(thunk));
        }
    }
    // `call rel32` to the kernel's copy functions, likewise.
    if let Some(fns) = spec.copy_fns {
        for f in [fns.strncpy, fns.copy] {
            let reach = |va: u64| i32::try_from(f.wrapping_sub(va) as i64).is_ok();
            if !reach(CODE_VA) || !reach(CODE_VA + CODE_LEN) {
                return Err(TrampolineError::OutOfReach {
                    site: CODE_VA,
                    target: f,
                });
            }
        }
    }
    // `and eax, cap * RECORD_LEN - 1` wraps the byte head: a power of two
    // below 2^31.
    if !layout.cap.is_power_of_two() {
        return Err(layout_error(
            layout,
            "a capacity that is not a power of two",
        ));
    }
    const _: () = assert!(RECORD_LEN.is_power_of_two() && RECORD_LEN_ARGS.is_power_of_two());
    let slot_mask = layout
        .cap
        .checked_mul(layout.record_len())
        .and_then(|b| u32::try_from(b - 1).ok())
        .filter(|&m| i32::try_from(m).is_ok())
        .ok_or_else(|| layout_error(layout, "records spanning 2 GiB or more"))?;
    // The stubs' `mov r11d, k + 1` and the drop counters' index.
    if u32::try_from(sites).is_err() {
        return Err(layout_error(layout, "more sites than a u32"));
    }
    let rec = |field: u64| ring_disp(layout, layout.records_off + field);
    let task = task_fields(spec)?;
    let cpus = i32::try_from(layout.cpus).map_err(|_| layout_error(layout, "CPUs past imm32"))?;
    Ok(Fields {
        cpu_number_disp: spec.cpu_number_disp,
        // `cmp r10d, imm32`: checked above.
        cpus: cpus as u32,
        ret: spec.ret,
        locked: spec.preemptible,
        // `[r10 * 8 + disp32]`: CODE_VA is a sign-extended imm32.
        ring_table: RING_TABLE_VA as i64,
        slot_mask,
        head: ring_disp(layout, HEAD_OFF)?,
        limit: ring_disp(layout, LIMIT_OFF)?,
        // Indexed by k + 1: 8 below the first counter.
        drops: ring_disp(layout, DROPS_OFF - 8)?,
        ret_drops: ring_disp(layout, layout.ret_drops_off() - 8)?,
        rec_commit: rec(REC_COMMIT)?,
        rec_tsc: rec(REC_TSC)?,
        rec_parent: rec(REC_PARENT)?,
        rec_slot: rec(REC_SLOT)?,
        task,
        record_len: layout.record_len() as i32,
        rec_args: if layout.args {
            Some(rec(REC_ARGS)?)
        } else {
            None
        },
        rec_ret: if spec.retval {
            Some(rec(REC_RET)?)
        } else {
            None
        },
        copy: spec.copy_fns.filter(|_| layout.strings),
        rec_strings: rec(REC_STRINGS)?,
    })
}

/// The task fields of `spec`'s code, its layout checked to hold them.
fn task_fields(spec: &TrampolineSpec) -> Result<Option<TaskFields>, TrampolineError> {
    let layout = &spec.layout;
    let rec = |field: u64| ring_disp(layout, layout.records_off + field);
    Ok(match spec.task {
        None => None,
        Some(t) => {
            if t.npids > MAX_FILTER_PIDS {
                return Err(layout_error(
                    layout,
                    "more pids to filter than the code holds",
                ));
            }
            Some(TaskFields {
                current_disp: t.current_disp,
                pid_off: i32::try_from(t.pid_off)
                    .map_err(|_| layout_error(layout, "task_struct.pid past 2 GiB"))?,
                rec_task: rec(REC_TASK)?,
                rec_pid: rec(REC_PID)?,
                pids: t.pids,
                npids: t.npids,
                filtered: ring_disp(layout, FILTERED_OFF)?,
            })
        }
    })
}
