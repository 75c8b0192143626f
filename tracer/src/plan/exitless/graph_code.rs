//! The guest code of exitless function-graph tracing: the entry path that
//! records a call and hooks its return, the return path, and one return stub
//! per frame of vmtrace's frame pool (see `layout`: `FRAMES`, `RET_STUBS_VA`).
//!
//! Entry (a site's stub jumps here with r11d = k + 1; `[rsp]` = site + 5,
//! `[rsp + 8]` = the function's return address O, at slot S = rsp + 8):
//!
//! ```text
//! gentry: push rax; push rdx; push rcx; push rsi   ; S = rsp + 40
//!         <reserve a record, as the entry-only path; r10 = record>
//!         mov rax, [rsp + 40]               ; O
//!         mov [r10 + rec.parent], rax
//!         mov ecx, 1
//!         lock xadd [FRAME_NEXT], ecx       ; a ticket: frame j = ticket mod FRAMES
//!         and ecx, FRAMES - 1
//!         shl ecx, 4                        ; rcx = j * FRAME_LEN
//!         mov esi, 1
//!         xchg [rcx + frames.busy], esi     ; claim j (xchg with memory is locked)
//!         test esi, esi
//!         jnz nohook                        ; j still in use: leave the return alone
//!         mov [rcx + frames.site], r11d     ; k + 1
//!         mov [rcx + frames.ret], rax       ; O, for the return
//!         lea rax, [rsp + 40]
//!         mov [r10 + rec.slot], rax         ; S: the entry is hooked
//!         lea rax, [rcx + RET_STUBS_VA]     ; stub j (stubs are FRAME_LEN apart, like frames)
//!         mov [rsp + 40], rax               ; the function now returns to stub j
//! commit: rdtsc; <store tsc>; mov [r10 + rec.commit], r11d
//! out:    pop rsi; pop rcx; pop rdx; pop rax; ret; int3   ; or as `ret`
//! no_ring: mov r10, [RING_TABLE_VA]        ; a CPU without a ring: ring 0's counter
//! full:   lock inc qword [r10 + r11 * 8 + drops - 8]; jmp out
//! nohook: mov qword [r10 + rec.slot], 0; jmp commit
//! ```
//!
//! Return (the function's `ret` popped stub j's address, so rsp = S + 8):
//!
//! ```text
//! stub_j: mov r11d, j; jmp greturn
//! greturn: push rax; push rdx                ; the return value; S = rsp + 8
//!         shl r11d, 4                        ; r11 = j * FRAME_LEN
//!         mov rcx, [r11 + frames.ret]        ; O
//!         mov esi, [r11 + frames.site]       ; k + 1
//!         mov dword [r11 + frames.busy], 0   ; free j: O and k are in registers
//!         <reserve a record; r10 = record>
//!         mov [r10 + rec.parent], rcx
//!         lea rax, [rsp + 9]                 ; S | 1: a return
//!         mov [r10 + rec.slot], rax
//!         rdtsc; <store tsc>; mov [r10 + rec.commit], esi
//! rout:   pop rdx; pop rax
//!         call rop; int3                     ; a return stack buffer entry for the ret
//! rop:    mov [rsp], rcx                     ; O in its slot
//!         ret; int3                          ; back to the caller, as if never hooked
//!                                            ; (or as `ret::emit_graph_ret`)
//! rno_ring: mov r10, [RING_TABLE_VA]
//! rfull:  lock inc qword [r10 + rsi * 8 + ret_drops - 8]; jmp rout
//! ```
//!
//! Registers: at a function's entry only r10 and r11 are free, so the entry
//! saves the four others it uses. At a return every caller-saved register
//! but rax and rdx (the return value) is dead: ftrace's own
//! `return_to_handler` calls a C function there, which clobbers them all
//! (arch/x86/kernel/ftrace_64.S); the return path saves rax and rdx only.
//! The return goes back with `call; mov [rsp]; ret`, not an indirect `jmp`, so no
//! indirect-branch target check (IBT) applies to the caller's return
//! address.
//!
//! Frames are claimed by ticket, not from a free list (no ABA problem, no
//! 16-byte compare-and-swap, which this CI host's emulator cannot run): a
//! ticket whose frame is still busy (a long-sleeping call, or one abandoned
//! by its stack) leaves that call unhooked, recorded with slot 0.

use iced_x86::code_asm::{
    dword_ptr, ecx, esi, ptr, qword_ptr, r10, r11, r11d, rax, rcx, rdx, rsi, rsp, CodeAssembler,
    CodeLabel,
};
use iced_x86::IcedError;

use super::body::{
    emit_args_copies, emit_commit, emit_count, emit_count_filtered, emit_filter, emit_no_ring,
    emit_reserve, emit_retval, emit_task, Fields,
};
use super::layout::{
    DATA_VA, FRAMES, FRAMES_OFF, FRAME_BUSY, FRAME_LEN, FRAME_NEXT_OFF, FRAME_RET, FRAME_SITE,
    RET_STUBS_VA,
};
use super::ret::{emit_graph_ret, emit_ret};
use super::strcopy::StrCopy;

/// The graph entry path, at `entry` (the sites' stubs jump there). With
/// `copies` (a site's own entry, `trampoline::emit_code`), its event's
/// words and strings copied once its arguments are stored (before the
/// frame is claimed: the copies' calls return to the entry path, not
/// through a hook).
pub(super) fn emit_entry(
    a: &mut CodeAssembler,
    f: &Fields,
    entry: &mut CodeLabel,
    copies: &[StrCopy],
) -> Result<(), IcedError> {
    let frames = (DATA_VA + FRAMES_OFF) as i64;
    let frame_next = (DATA_VA + FRAME_NEXT_OFF) as i64;
    let mut out = a.create_label();
    let mut full = a.create_label();
    let mut commit = a.create_label();
    let mut nohook = a.create_label();
    a.set_label(entry)?;
    // Save the argument registers used below; the slot S is then rsp + 40.
    a.push(rax)?;
    a.push(rdx)?;
    a.push(rcx)?;
    a.push(rsi)?;
    // A call the pid filter rejects is neither recorded nor hooked.
    let mut rejected = a.create_label();
    emit_filter(a, f, rejected)?;
    let mut no_ring = a.create_label();
    emit_reserve(a, f, full, no_ring)?;
    emit_task(a, f)?;
    // rdx was pushed second of four: at [rsp + 16]; rcx and rsi are still
    // the caller's (the frame claim below takes them).
    emit_args_copies(a, f, 16, copies)?;
    // rax = O, the function's return address, and record.parent = O.
    a.mov(rax, qword_ptr(rsp + 40))?;
    a.mov(qword_ptr(r10 + f.rec_parent), rax)?;
    // ecx = a ticket; frame j = ticket mod FRAMES.
    a.mov(ecx, 1u32)?;
    a.lock().xadd(dword_ptr(frame_next), ecx)?;
    a.and(ecx, (FRAMES - 1) as u32)?;
    // rcx = j * FRAME_LEN, the frame's offset (the 32-bit ops zero-extend).
    a.shl(ecx, FRAME_LEN.trailing_zeros())?;
    // Claim frame j: busy = 1, the old value in esi.
    a.mov(esi, 1u32)?;
    a.xchg(dword_ptr(rcx + (frames + FRAME_BUSY as i64)), esi)?;
    a.test(esi, esi)?;
    // Still busy: record the call, do not hook its return.
    a.jnz(nohook)?;
    // frame.site = k + 1 (the return's commit word), frame.ret = O.
    a.mov(dword_ptr(rcx + (frames + FRAME_SITE as i64)), r11d)?;
    a.mov(qword_ptr(rcx + (frames + FRAME_RET as i64)), rax)?;
    // record.slot = S.
    a.lea(rax, ptr(rsp + 40))?;
    a.mov(qword_ptr(r10 + f.rec_slot), rax)?;
    // [S] = stub j: the function returns through vmtrace.
    a.lea(rax, ptr(rcx + RET_STUBS_VA as i64))?;
    a.mov(qword_ptr(rsp + 40), rax)?;
    a.set_label(&mut commit)?;
    // The TSC, then commit with k + 1 (the stub's r11d).
    emit_commit(a, f, r11d)?;
    a.set_label(&mut out)?;
    a.pop(rsi)?;
    a.pop(rcx)?;
    a.pop(rdx)?;
    a.pop(rax)?;
    emit_ret(a, f.ret)?;
    emit_no_ring(a, f, &mut no_ring)?;
    a.set_label(&mut full)?;
    // Ring full: drops[k] += 1 (r11 = k + 1, f.drops 8 below drops[0]);
    // no record, no hook.
    emit_count(a, f, qword_ptr(r10 + r11 * 8 + f.drops))?;
    a.jmp(out)?;
    a.set_label(&mut nohook)?;
    // No frame: an unhooked entry has slot 0.
    a.mov(qword_ptr(r10 + f.rec_slot), 0)?;
    a.jmp(commit)?;
    if f.task.is_some_and(|t| t.npids > 0) {
        a.set_label(&mut rejected)?;
        emit_count_filtered(a, f)?;
        a.jmp(out)?;
    }
    Ok(())
}

/// The graph return path, at `ret_entry` (the frames' stubs jump there).
pub(super) fn emit_return(
    a: &mut CodeAssembler,
    f: &Fields,
    ret_entry: &mut CodeLabel,
) -> Result<(), IcedError> {
    let frames = (DATA_VA + FRAMES_OFF) as i64;
    let mut out = a.create_label();
    let mut full = a.create_label();
    a.set_label(ret_entry)?;
    // Save the return value; the slot S is then rsp + 8.
    a.push(rax)?;
    a.push(rdx)?;
    // r11 = j * FRAME_LEN (the stub left j in r11d).
    a.shl(r11d, FRAME_LEN.trailing_zeros())?;
    // rcx = O, esi = k + 1, then free the frame.
    a.mov(rcx, qword_ptr(r11 + (frames + FRAME_RET as i64)))?;
    a.mov(esi, dword_ptr(r11 + (frames + FRAME_SITE as i64)))?;
    a.mov(dword_ptr(r11 + (frames + FRAME_BUSY as i64)), 0u32)?;
    let mut no_ring = a.create_label();
    emit_reserve(a, f, full, no_ring)?;
    // The task returning is the one that called (its entry passed any
    // filter).
    emit_task(a, f)?;
    // The return value, pushed first: at [rsp + 8].
    emit_retval(a, f, 8)?;
    a.mov(qword_ptr(r10 + f.rec_parent), rcx)?;
    // record.slot = S | 1: a return.
    a.lea(rax, ptr(rsp + 9))?;
    a.mov(qword_ptr(r10 + f.rec_slot), rax)?;
    // The TSC, then commit with k + 1.
    emit_commit(a, f, esi)?;
    a.set_label(&mut out)?;
    a.pop(rdx)?;
    a.pop(rax)?;
    // Back to O, as ftrace's return_to_handler goes (`ret::emit_graph_ret`).
    emit_graph_ret(a, f.ret)?;
    emit_no_ring(a, f, &mut no_ring)?;
    a.set_label(&mut full)?;
    // Ring full: ret_drops[k] += 1 (rsi = k + 1, f.ret_drops 8 below).
    emit_count(a, f, qword_ptr(r10 + rsi * 8 + f.ret_drops))?;
    a.jmp(out)?;
    Ok(())
}

/// The frames' return stubs, assembled at `RET_STUBS_VA`, each `FRAME_LEN`
/// bytes (padded with int3, never run), jumping to `ret_entry_va`.
pub(super) fn return_stubs(ret_entry_va: u64) -> Result<Vec<u8>, IcedError> {
    let mut a = CodeAssembler::new(64)?;
    let mut stubs = Vec::with_capacity((FRAMES * FRAME_LEN) as usize);
    for j in 0..FRAMES {
        // Each stub on its own: fixed length, so stub j is at j * FRAME_LEN.
        a.reset();
        let va = RET_STUBS_VA + j * FRAME_LEN;
        // r11d = j (r11 is dead at a function's return).
        a.mov(r11d, j as u32)?;
        a.jmp(ret_entry_va)?;
        let mut code = a.assemble(va)?;
        debug_assert!(code.len() as u64 <= FRAME_LEN);
        code.resize(FRAME_LEN as usize, 0xcc);
        stubs.extend_from_slice(&code);
    }
    Ok(stubs)
}
