//! The record-writing pieces every exitless path is made of: reserving a
//! record in the calling CPU's ring, dating and committing it, counting a
//! call that finds the ring full; and the two entry-only bodies built from
//! them, the shared one behind the stubs and a site's own
//! (`trampoline::Shape`). The function graph's paths (`graph_code`) use the
//! same pieces.

use iced_x86::code_asm::{
    dword_ptr, eax, edx, ptr, qword_ptr, r10, r10d, r11, r11d, r8, r9, rax, rcx, rdi, rdx, rsi,
    rsp, AsmMemoryOperand, AsmRegister32, CodeAssembler, CodeLabel,
};
use iced_x86::IcedError;

use super::ret::{emit_ret, Return};
use super::strcopy::{emit_copies, emit_strings, emit_words, CopyFns, StrCopy};

/// Displacements and immediates the paths use (computed and checked by
/// `trampoline::generate`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Fields {
    pub cpu_number_disp: i32,
    /// The rings: a CPU number at or past this has none (`emit_ring`).
    pub cpus: u32,
    /// How the code returns (`ret`).
    pub ret: Return,
    /// Lock the ring's reservation (`TrampolineSpec::preemptible`).
    pub locked: bool,
    /// Where the table of the rings' addresses is (`RING_TABLE_VA`: a
    /// sign-extended imm32), one u64 per CPU.
    pub ring_table: i64,
    /// `cap * RECORD_LEN - 1`: a byte head to its slot's offset.
    pub slot_mask: u32,
    pub head: i64,
    pub limit: i64,
    /// The drop counters, less 8: indexed by the commit word (site + 1).
    pub drops: i64,
    /// The return drop counters, less 8, likewise.
    pub ret_drops: i64,
    pub rec_commit: i64,
    pub rec_tsc: i64,
    pub rec_parent: i64,
    pub rec_slot: i64,
    /// Record the current task (and filter by pid); None: neither.
    pub task: Option<TaskFields>,
    /// Bytes per record (`RingLayout::record_len`).
    pub record_len: i32,
    /// Record an entry's six argument registers here; None: not.
    pub rec_args: Option<i64>,
    /// Record a return's RAX here (function graph); None: not.
    pub rec_ret: Option<i64>,
    /// The kernel's nofault copies, for the strings of events' sites
    /// (`strcopy`); None: no copies.
    pub copy: Option<CopyFns>,
    /// Where the copies go in a record (`REC_STRINGS`).
    pub rec_strings: i64,
}

/// Most pids the guest code itself filters on (`--pid`): each is a `cmp`
/// and a branch on every traced call.
pub const MAX_FILTER_PIDS: usize = 8;

/// What the code needs to record the current task and filter by pid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskCode {
    /// `gs:[current_disp]` reads the current task's address
    /// (`kernel::task::TaskLayout`, at the running kernel's offset).
    pub current_disp: i32,
    /// `task_struct.pid`'s offset.
    pub pid_off: u32,
    /// The pids kept, `pids[..npids]` (at most `MAX_FILTER_PIDS`); none:
    /// every call.
    pub pids: [u32; MAX_FILTER_PIDS],
    pub npids: usize,
}

/// Instructions the task adds to a recorded call: read `current`, store
/// it, read its pid, store that (`body::emit_task`).
pub const TASK_INSTRUCTIONS: usize = 4;
/// Instructions the arguments add to a recorded entry: five register
/// stores, and RDX (which the reservation clobbers) loaded from where the
/// path saved it and stored (`body::emit_args`).
pub const ARGS_INSTRUCTIONS: usize = 7;
/// Instructions the return value adds to a recorded return: RAX loaded
/// from where the return path saved it, and stored.
pub const RETVAL_INSTRUCTIONS: usize = 2;

impl TaskCode {
    /// Instructions this adds to a recorded call's path (as the walk of the
    /// common path counts it: a kept pid found by the last compare).
    pub fn path_instructions(&self) -> usize {
        TASK_INSTRUCTIONS
            + match self.npids {
                0 => 0,
                n => 2 + 2 * n,
            }
    }
}

/// What the paths need to record the current task and filter by pid.
#[derive(Clone, Copy, Debug)]
pub(super) struct TaskFields {
    /// `gs:[current_disp]` is the current task's `task_struct` address,
    /// as the kernel's own `current` reads it.
    pub current_disp: i32,
    /// `task_struct.pid`'s offset.
    pub pid_off: i32,
    pub rec_task: i64,
    pub rec_pid: i64,
    /// The pids kept (`pids[..npids]`); none: every call is kept.
    pub pids: [u32; MAX_FILTER_PIDS],
    pub npids: usize,
    /// This CPU's counter of calls the filter rejected, from the ring base.
    pub filtered: i64,
}

/// Record the current task in the record at r10: its `task_struct`
/// address and pid (clobbers rax). Nothing without `f.task`.
pub(super) fn emit_task(a: &mut CodeAssembler, f: &Fields) -> Result<(), IcedError> {
    let Some(t) = f.task else { return Ok(()) };
    // rax = current, the kernel's per-CPU current task.
    a.mov(rax, qword_ptr(t.current_disp).gs())?;
    // record.task = rax.
    a.mov(qword_ptr(r10 + t.rec_task), rax)?;
    // eax = current->pid; record.pid = eax.
    a.mov(eax, dword_ptr(rax + t.pid_off))?;
    a.mov(dword_ptr(r10 + t.rec_pid), eax)?;
    Ok(())
}

/// Record the argument registers in the record at r10, with `--args`
/// (clobbers rax). RDX was overwritten by the reservation: it is read back
/// from `[rsp + rdx_at]`, where the path saved it.
pub(super) fn emit_args(a: &mut CodeAssembler, f: &Fields, rdx_at: i32) -> Result<(), IcedError> {
    let Some(at) = f.rec_args else { return Ok(()) };
    // args[0, 1] = rdi, rsi.
    a.mov(qword_ptr(r10 + at), rdi)?;
    a.mov(qword_ptr(r10 + (at + 8)), rsi)?;
    // args[2] = rdx, as the path saved it.
    a.mov(rax, qword_ptr(rsp + rdx_at))?;
    a.mov(qword_ptr(r10 + (at + 16)), rax)?;
    // args[3, 4, 5] = rcx, r8, r9.
    a.mov(qword_ptr(r10 + (at + 24)), rcx)?;
    a.mov(qword_ptr(r10 + (at + 32)), r8)?;
    a.mov(qword_ptr(r10 + (at + 40)), r9)?;
    Ok(())
}

/// `emit_args`, then `copies`, a site's own entry path's: its words
/// (`strcopy::emit_words`: RDI and RSI are still the traced function's),
/// then its strings (`strcopy::emit_strings`, from the arguments just
/// stored), r11, the path's commit word, kept around their calls.
pub(super) fn emit_args_copies(
    a: &mut CodeAssembler,
    f: &Fields,
    rdx_at: i32,
    copies: &[StrCopy],
) -> Result<(), IcedError> {
    emit_args(a, f, rdx_at)?;
    if let Some(args) = f.rec_args {
        emit_words(a, f.rec_strings, f.task.map(|t| t.rec_task), copies)?;
        if let Some(fns) = f.copy {
            emit_strings(a, args, f.rec_strings, copies, fns, true)?;
        }
    }
    Ok(())
}

/// Record a return's RAX in the record at r10, with `--retval`: from
/// `[rsp + rax_at]`, where the return path saved it (clobbers rax).
pub(super) fn emit_retval(a: &mut CodeAssembler, f: &Fields, rax_at: i32) -> Result<(), IcedError> {
    let Some(at) = f.rec_ret else { return Ok(()) };
    a.mov(rax, qword_ptr(rsp + rax_at))?;
    a.mov(qword_ptr(r10 + at), rax)?;
    Ok(())
}

/// The pid filter: falls through when the current task's pid is one kept,
/// jumps to `rejected` otherwise (clobbers rax). Nothing without a filter.
pub(super) fn emit_filter(
    a: &mut CodeAssembler,
    f: &Fields,
    rejected: CodeLabel,
) -> Result<(), IcedError> {
    let Some(t) = f.task.filter(|t| t.npids > 0) else {
        return Ok(());
    };
    let mut keep = a.create_label();
    // eax = current->pid.
    a.mov(rax, qword_ptr(t.current_disp).gs())?;
    a.mov(eax, dword_ptr(rax + t.pid_off))?;
    // One compare per pid kept: the last one's miss is the rejection.
    for (i, &pid) in t.pids[..t.npids].iter().enumerate() {
        a.cmp(eax, pid)?;
        if i + 1 < t.npids {
            a.je(keep)?;
        } else {
            a.jne(rejected)?;
        }
    }
    a.set_label(&mut keep)?;
    Ok(())
}

/// Count a call the filter rejected in this CPU's ring (ring 0's for a
/// CPU without one: `emit_reserve`), clobbers r10.
pub(super) fn emit_count_filtered(a: &mut CodeAssembler, f: &Fields) -> Result<(), IcedError> {
    let Some(t) = f.task else { return Ok(()) };
    let mut ring = a.create_label();
    // r10 = this CPU's number.
    a.mov(r10d, dword_ptr(f.cpu_number_disp).gs())?;
    // Below the rings' count (unsigned): its own ring.
    a.cmp(r10d, f.cpus)?;
    a.jb(ring)?;
    // No ring: ring 0's counter (the lock makes it safe to share).
    a.xor(r10d, r10d)?;
    a.set_label(&mut ring)?;
    // r10 = the ring's address.
    a.mov(r10, qword_ptr(r10 * 8 + f.ring_table))?;
    emit_count(a, f, qword_ptr(r10 + t.filtered))
}

/// The rejected end of an entry-only body: count, restore, return.
fn emit_rejected(a: &mut CodeAssembler, f: &Fields, at: &mut CodeLabel) -> Result<(), IcedError> {
    if f.task.is_none_or(|t| t.npids == 0) {
        return Ok(());
    }
    a.set_label(at)?;
    emit_count_filtered(a, f)?;
    a.pop(rdx)?;
    a.pop(rax)?;
    emit_ret(a, f.ret)
}

/// Reserve a record in this CPU's ring: on success r10 = the record's
/// address less `records_off`; a full ring jumps to `full` with r10 = the
/// ring's address.
/// Uses r10, rax and rdx.
///
/// A CPU without a ring (its number at or past the rings' count: a CPU the
/// guest brought up after the attach beyond the CPUs it said it may have,
/// or a misread layout) jumps to `no_ring` instead, which the caller places
/// just before `full` (`emit_no_ring`): its call is counted as a full
/// ring's, in ring 0's counter for the site, which is why the counters are
/// always `lock`ed (another CPU than ring 0's may increment them). Two
/// instructions on every call (`cmp`, `jae`): the guard for what the guest
/// does after the attach. The attach reads the number where this code
/// does, through each kernel-mode vCPU's GS base and at each possible CPU's
/// `__per_cpu_offset`, and refuses to patch a site if one is not the CPU's
/// own number (`Exitless::check_cpu_numbers`); and the rings are made for
/// every CPU number the guest kernel may use (its `nr_cpu_ids`).
pub(super) fn emit_reserve(
    a: &mut CodeAssembler,
    f: &Fields,
    full: CodeLabel,
    no_ring: CodeLabel,
) -> Result<(), IcedError> {
    let mut retry = a.create_label();
    // r10 = this CPU's number, the kernel's own per-CPU `cpu_number`.
    a.mov(r10d, dword_ptr(f.cpu_number_disp).gs())?;
    // Not below the rings' count (unsigned): no ring of its own.
    a.cmp(r10d, f.cpus)?;
    a.jae(no_ring)?;
    // r10 = this CPU's ring's address, from the table: one load, as the
    // multiply it replaced was one instruction (rings anywhere in the
    // address space, not only a sign-extended imm32 from the code).
    a.mov(r10, qword_ptr(r10 * 8 + f.ring_table))?;
    // rax = head, the byte offset of the next record to reserve.
    a.mov(rax, qword_ptr(r10 + f.head))?;
    a.set_label(&mut retry)?;
    // Full: head has reached the first record the host has not freed.
    a.cmp(rax, qword_ptr(r10 + f.limit))?;
    a.jae(full)?;
    // rdx = the head past this record.
    a.lea(rdx, ptr(rax + f.record_len))?;
    // Reserve it: cmpxchg is one instruction, so an interrupt or NMI on
    // this CPU comes before or after it; locked on a preemptible kernel,
    // where a preempted task may finish this on another CPU.
    if f.locked {
        a.lock().cmpxchg(qword_ptr(r10 + f.head), rdx)?;
    } else {
        a.cmpxchg(qword_ptr(r10 + f.head), rdx)?;
    }
    // Lost the race: rax holds the current head; check it again.
    a.jne(retry)?;
    // eax = the slot's byte offset in the ring's records.
    a.and(eax, f.slot_mask)?;
    // r10 = ring offset + slot offset.
    a.add(r10, rax)?;
    Ok(())
}

/// `emit_reserve`'s `no_ring`, placed right before the caller's `full`
/// (it falls through into it): r10 = ring 0's address, whose counter for
/// the site counts the call.
pub(super) fn emit_no_ring(
    a: &mut CodeAssembler,
    f: &Fields,
    no_ring: &mut CodeLabel,
) -> Result<(), IcedError> {
    a.set_label(no_ring)?;
    a.mov(r10, qword_ptr(f.ring_table))
}

/// Count one call not recorded: `lock inc` of the counter at `counter`.
/// Always locked, unlike the reservation: a CPU without a ring counts in
/// ring 0's counters, which ring 0's CPU increments too (`emit_reserve`).
/// Off the recorded path, so the lock costs a recorded call nothing.
pub(super) fn emit_count(
    a: &mut CodeAssembler,
    _f: &Fields,
    counter: AsmMemoryOperand,
) -> Result<(), IcedError> {
    a.lock().inc(counter)
}

/// Store the guest TSC in the record at r10 (clobbers eax and edx).
pub(super) fn emit_tsc(a: &mut CodeAssembler, f: &Fields) -> Result<(), IcedError> {
    // edx:eax = the guest's TSC.
    a.rdtsc()?;
    a.mov(dword_ptr(r10 + f.rec_tsc), eax)?;
    a.mov(dword_ptr(r10 + (f.rec_tsc + 4)), edx)?;
    Ok(())
}

/// Store the guest TSC in the record at r10, then commit it by writing
/// `commit` (the site index + 1, never 0; not eax or edx, which rdtsc
/// overwrites) to its commit word.
pub(super) fn emit_commit(
    a: &mut CodeAssembler,
    f: &Fields,
    commit: AsmRegister32,
) -> Result<(), IcedError> {
    emit_tsc(a, f)?;
    // The commit, last: x86 keeps stores in program order, so a host that
    // reads it non-zero reads the fields above complete.
    a.mov(dword_ptr(r10 + f.rec_commit), commit)?;
    Ok(())
}

/// The entry-only path at `entry` (the sites' stubs jump there): see the
/// module comment. With `copies` (a site's own entry, `trampoline::
/// emit_code`), its event's words and strings copied once its arguments
/// are stored.
pub(super) fn emit_entry(
    a: &mut CodeAssembler,
    f: &Fields,
    entry: &mut CodeLabel,
    copies: &[StrCopy],
) -> Result<(), IcedError> {
    let mut out = a.create_label();
    let mut full = a.create_label();
    a.set_label(entry)?;
    // Entry: [rsp] = site + 5, [rsp + 8] = parent, r11d = k + 1.
    // Save the two argument/return registers the trampoline needs: rax
    // (cmpxchg's comparand, rdtsc's low half) and rdx (rdtsc's high half).
    a.push(rax)?;
    a.push(rdx)?;
    let mut rejected = a.create_label();
    emit_filter(a, f, rejected)?;
    // r10 = the record (or full, or no ring).
    let mut no_ring = a.create_label();
    emit_reserve(a, f, full, no_ring)?;
    emit_task(a, f)?;
    // rdx was pushed last: at [rsp].
    emit_args_copies(a, f, 0, copies)?;
    // rax = the parent: [rsp + 24] past the two pushes and the site's
    // return address.
    a.mov(rax, qword_ptr(rsp + 24))?;
    // record.parent = rax.
    a.mov(qword_ptr(r10 + f.rec_parent), rax)?;
    // The TSC, then the commit: k + 1, the stub's r11d.
    emit_commit(a, f, r11d)?;
    a.set_label(&mut out)?;
    // Restore the saved registers and return to the traced function.
    a.pop(rdx)?;
    a.pop(rax)?;
    emit_ret(a, f.ret)?;
    emit_no_ring(a, f, &mut no_ring)?;
    a.set_label(&mut full)?;
    // Ring full (or none): drops[k] += 1 (r11 = k + 1; f.drops is 8 below
    // drops[0]), locked; then leave without a record.
    emit_count(a, f, qword_ptr(r10 + r11 * 8 + f.drops))?;
    a.jmp(out)?;
    emit_rejected(a, f, &mut rejected)?;
    Ok(())
}

/// Site k's own body (`Shape::PerSite`), at `body`: the shared entry path
/// with k + 1 as immediates instead of r11 (see the module comment), and
/// an event's `copies` once its arguments are in the record.
pub(super) fn emit_site_body(
    a: &mut CodeAssembler,
    f: &Fields,
    body: &mut CodeLabel,
    k: u32,
    copies: &[StrCopy],
) -> Result<(), IcedError> {
    let mut out = a.create_label();
    let mut full = a.create_label();
    a.set_label(body)?;
    // Entry: [rsp] = site + 5, [rsp + 8] = parent. Save rax and rdx, as the
    // shared body does.
    a.push(rax)?;
    a.push(rdx)?;
    let mut rejected = a.create_label();
    emit_filter(a, f, rejected)?;
    // r10 = the record (or full, or no ring).
    let mut no_ring = a.create_label();
    emit_reserve(a, f, full, no_ring)?;
    emit_task(a, f)?;
    emit_args(a, f, 0)?;
    // The strings that do not last past the event, from the arguments
    // just stored, before the commit.
    if let (Some(fns), Some(args)) = (f.copy, f.rec_args) {
        let rec_task = f.task.map(|t| t.rec_task);
        emit_copies(a, [args, f.rec_strings], rec_task, copies, fns)?;
    }
    // rax = the parent, [rsp + 24]; record.parent = rax.
    a.mov(rax, qword_ptr(rsp + 24))?;
    a.mov(qword_ptr(r10 + f.rec_parent), rax)?;
    // The TSC, then the commit: k + 1, this body's own immediate.
    emit_tsc(a, f)?;
    a.mov(dword_ptr(r10 + f.rec_commit), k + 1)?;
    a.set_label(&mut out)?;
    a.pop(rdx)?;
    a.pop(rax)?;
    emit_ret(a, f.ret)?;
    emit_no_ring(a, f, &mut no_ring)?;
    a.set_label(&mut full)?;
    // Ring full (or none): drops[k] += 1 (f.drops is 8 below drops[0]),
    // locked; then leave without a record.
    emit_count(a, f, qword_ptr(r10 + (f.drops + 8 * (i64::from(k) + 1))))?;
    a.jmp(out)?;
    emit_rejected(a, f, &mut rejected)?;
    Ok(())
}
