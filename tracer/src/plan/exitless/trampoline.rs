//! The guest code of exitless tracing: what a site calls to append a record
//! to the calling CPU's ring (the writer of the protocol in the module
//! comment of `exitless`).
//!
//! The code is assembled with iced-x86's `CodeAssembler` at `CODE_VA`, never
//! written as bytes by hand, in one of two shapes (`Shape`):
//!
//! - **Per-site bodies** (`Shape::PerSite`, whenever they fit the code page:
//!   about 112 bytes a site, up to about 16,000 sites): site k's 5-byte NOP
//!   becomes `call body_k`, and body k is the common part below with k + 1
//!   as immediates (`mov dword [r10 + rec + REC_COMMIT], k + 1`, and
//!   `lock inc qword [r10 + DROPS_OFF + 8 * k]`): 23 instructions a
//!   recorded call, 14 a dropped one. What ftrace does with per-ops
//!   trampolines, one step further: nothing in the body is looked up.
//! - **Shared** (`Shape::Shared`: more sites, and always with the function
//!   graph): site k calls a stub, which jumps to one shared body,
//!
//! ```text
//! stub_k: mov r11d, k + 1      ; the record's commit word, and its drop counter
//!         jmp common
//! ```
//!
//! At the body `[rsp]` is the site + 5 and `[rsp + 8]` the traced function's
//! own return address (the parent). The shared body (`rec` = `records_off`;
//! `head` and `limit` count bytes; `RING_TABLE_VA` the table of each CPU's
//! ring's address, a u64 each, at the start of the code page):
//!
//! ```text
//! common: push rax
//!         push rdx
//!         mov r10d, gs:[cpu_number]
//!         cmp r10d, cpus          ; a CPU without a ring (after the attach)
//!         jae no_ring
//!         mov r10, [r10 * 8 + RING_TABLE_VA]
//!         mov rax, [r10 + HEAD_OFF]
//! retry:  cmp rax, [r10 + LIMIT_OFF]
//!         jae full
//!         lea rdx, [rax + RECORD_LEN]
//!         lock cmpxchg [r10 + HEAD_OFF], rdx   ; lock: preemptible kernels
//!         jne retry
//!         and eax, cap * RECORD_LEN - 1
//!         add r10, rax
//!         mov rax, [rsp + 24]
//!         mov [r10 + rec + REC_PARENT], rax
//!         rdtsc
//!         mov [r10 + rec + REC_TSC], eax
//!         mov [r10 + rec + REC_TSC + 4], edx
//!         mov [r10 + rec + REC_COMMIT], r11d
//! out:    pop rdx
//!         pop rax
//!         ret                ; and int3, or as the kernel returns (`ret`)
//! no_ring: mov r10, [RING_TABLE_VA]   ; counted in ring 0's counter
//! full:   lock inc qword [r10 + DROPS_OFF - 8 + r11 * 8]
//!         jmp out
//! ```
//!
//! A recorded call (ring not full, no retry) executes
//! `SHARED_PATH_INSTRUCTIONS` = 25 instructions through a stub, stub and
//! `ret` included (a dropped call 16), and `COMMON_PATH_INSTRUCTIONS` = 23 in
//! a per-site body (dropped: 14, `DROP_PATH_INSTRUCTIONS`).
//!
//! Registers: at a function's entry r10 and r11 are free (Linux's own
//! `ftrace_caller` saves only rax, rcx, rdx, rsi, rdi, r8 and r9, the
//! argument and return registers: arch/x86/kernel/ftrace_64.S
//! `save_mcount_regs`); the trampoline saves the two of those it uses (rax
//! for `cmpxchg` and `rdtsc`, rdx for `rdtsc`) and touches no other. The ring
//! base lives in r10 rather than rcx (the register `smp_processor_id()`
//! happens to use): with rcx it would need a third push and pop. Flags are
//! clobbered, as by any call; DF is never touched. The kernel is built with
//! `-mno-red-zone`, so the pushes overwrite nothing live below rsp.
//!
//! Why it is this short (it was 28 through a stub; then issue 34 added 2):
//! - The commit is the site itself (k + 1, never 0) rather than a sequence
//!   number: the host zeroes a record's commit word when it reads it, before
//!   it frees the slot, so a non-zero word always belongs to this lap. No
//!   register holds a sequence number across `rdtsc`, and the site and the
//!   commit are one store.
//! - `head` and `limit` count bytes, so the reserved head becomes the slot's
//!   offset with one `and` (no shift).
//!
//! And two decisions that differ from the first draft of the protocol:
//! - On a preemptible kernel (`CONFIG_PREEMPTION`, dynamic preemption
//!   included: `TrampolineSpec::preemptible`) the reservation is `lock
//!   cmpxchg`: the task can be preempted after reading its CPU number and
//!   migrated, and finish its reservation on another CPU while the ring's
//!   own CPU writes it too. On a kernel that cannot preempt (the default
//!   guest's) it has no lock prefix, as the kernel's own ring buffer uses
//!   `local_t`: one instruction is atomic against this CPU's interrupts,
//!   and the lock (a full barrier on x86) would be most of the path's cost
//!   on hardware. The instruction count is the same either way.
//! - A reservation that finds the ring full counts the call per site in the
//!   guest, so records + drops = calls, exactly. A CPU number with no ring
//!   counts it in ring 0's counter (`body::emit_reserve`): the counters are
//!   always `lock`ed, off the recorded path.

use iced_x86::code_asm::{r11d, CodeAssembler, CodeLabel};
use iced_x86::{
    BlockEncoderOptions, Code, Decoder, DecoderOptions, Encoder, FlowControl, IcedError,
    Instruction, Mnemonic,
};

use super::body::{emit_entry, emit_site_body, Fields};
pub use super::body::{
    TaskCode, ARGS_INSTRUCTIONS, MAX_FILTER_PIDS, RETVAL_INSTRUCTIONS, TASK_INSTRUCTIONS,
};
use super::disasm::{check_paths, format_instruction, walk_common_path};
use super::displacements::{checked_fields, layout_error};
use super::graph_code;
use super::layout::{CODE_VA, RETURN_TRAP_OFF, RET_STUBS_OFF, RET_STUBS_VA};
use super::strcopy;

/// Instructions a recorded call executes in a site's own body (`Shape::
/// PerSite`), from its first to its `ret` (ring not full, no reservation
/// retry).
pub const COMMON_PATH_INSTRUCTIONS: usize = 23;
/// Instructions a call executes there when its ring is full (counted as
/// dropped).
pub const DROP_PATH_INSTRUCTIONS: usize = 14;
/// The same through a stub and the shared body (`Shape::Shared`): the
/// stub's two instructions more.
pub const SHARED_PATH_INSTRUCTIONS: usize = COMMON_PATH_INSTRUCTIONS + STUB_INSTRUCTIONS;
pub const SHARED_DROP_PATH_INSTRUCTIONS: usize = DROP_PATH_INSTRUCTIONS + STUB_INSTRUCTIONS;
/// Instructions of one stub: `mov r11d, k + 1` and `jmp common`.
pub const STUB_INSTRUCTIONS: usize = 2;
/// Function graph: instructions of a recorded and hooked entry, stub and
/// `ret` included (`graph_code`'s entry path).
pub const GRAPH_ENTRY_INSTRUCTIONS: usize = 43;
/// Function graph: instructions of a recorded return, from the frame's
/// return stub to the `ret` into the caller (`call; mov [rsp], rcx; ret`
/// at its end, as ftrace's return_to_handler).
pub const GRAPH_RETURN_INSTRUCTIONS: usize = 32;

/// How the sites reach the code that records them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Each site calls a body of its own, with the site's index as an
    /// immediate (`COMMON_PATH_INSTRUCTIONS`): what `generate` makes
    /// whenever the bodies fit the code page (up to about 16,000 sites).
    PerSite,
    /// Each site calls a stub that loads its index into r11 and jumps to one
    /// shared body (`SHARED_PATH_INSTRUCTIONS`): more sites than per-site
    /// bodies fit, and always with the function graph.
    Shared,
}

pub use super::error::TrampolineError;
pub use super::spec::TrampolineSpec;

/// Instructions a recorded call runs in site `k`'s own body.
fn body_instructions(spec: &TrampolineSpec, k: usize) -> usize {
    strcopy::path_instructions(spec.site_copies(k))
        + COMMON_PATH_INSTRUCTIONS
        + spec.ret.extra_instructions()
        + spec.task.map_or(0, |t| t.path_instructions())
        + if spec.stores_args(k) {
            ARGS_INSTRUCTIONS
        } else {
            0
        }
}

/// The generated code, to be copied to `CODE_GPA` and run at `CODE_VA`.
#[derive(Clone, Debug)]
pub struct Trampoline {
    /// The machine code, placed at `CODE_VA` (at most `CODE_LEN` bytes).
    pub code: Vec<u8>,
    /// Bytes of the rings' table at the start of `code` (`RING_TABLE_VA`),
    /// before the first instruction.
    pub table: u32,
    pub shape: Shape,
    /// Offset of the shared body in `code` (`Shape::Shared`; with per-site
    /// bodies, site 0's).
    common: u32,
    /// Offsets of the entry paths in `code`, ascending: the shared body's
    /// and (`Shape::Shared`) those of sites with words to copy.
    entries: Vec<u32>,
    /// Offset of what each site calls in `code` (its stub or its body), by
    /// site index.
    stubs: Vec<u32>,
    /// A recorded call's instructions (ring not full, no retry), decoded
    /// from `code` at their addresses, `ret` included: site 0's body, or the
    /// shared body (without the stub). (With `--args=GLOB` a per-site body
    /// stores the arguments or not: `site_path`.)
    pub common_path: Vec<Instruction>,
    /// Function graph: a recorded return's instructions, from frame 0's
    /// return stub to the `ret` (empty without the graph).
    pub return_path: Vec<Instruction>,
    /// The rings' reservation and drop counters are `lock`ed (a
    /// preemptible guest kernel; see `TrampolineSpec::preemptible`).
    pub locked: bool,
}

impl Trampoline {
    /// Guest-virtual address of what site `site_index` calls: its stub or
    /// its own body.
    ///
    /// # Panics
    /// If `site_index` is not below the layout's site count (the caller's
    /// site indices come from the same layout).
    pub fn stub_va(&self, site_index: u32) -> u64 {
        CODE_VA + u64::from(self.stubs[site_index as usize])
    }

    /// Guest-virtual address of the common part.
    pub fn common_va(&self) -> u64 {
        CODE_VA + u64::from(self.common)
    }

    /// Number of stubs (the layout's sites).
    pub fn sites(&self) -> usize {
        self.stubs.len()
    }

    /// Instructions a recorded call executes, `ret` included (and the
    /// stub's, for `Shape::Shared`).
    pub fn common_path_instructions(&self) -> usize {
        match self.shape {
            Shape::PerSite => self.common_path.len(),
            Shape::Shared => STUB_INSTRUCTIONS + self.common_path.len(),
        }
    }

    /// Where the traced site's return address (site + 5) is, as an offset
    /// from RSP, for a vCPU stopped at `rip` inside this code (before the
    /// instruction at `rip` runs); None outside it. What a stack walker (or
    /// a test accounting for calls in flight) needs: stubs push nothing, a
    /// body (the shared one, or any site's, read as site 0's) pushes and
    /// pops along its paths, found by following every branch of its decoded
    /// code.
    pub fn site_return_slot(&self, rip: u64) -> Option<u64> {
        let first_stub = u64::from(*self.stubs.iter().min()?);
        let off = rip.checked_sub(CODE_VA)?;
        if off >= self.code.len() as u64 {
            return None;
        }
        // The body to walk: the shared body, or the site's own.
        let (common, end) = match self.shape {
            Shape::Shared if off >= first_stub => return Some(0),
            // The entry path `off` is in (the shared one, or a site's own).
            Shape::Shared => {
                let at = self.entries.partition_point(|&e| u64::from(e) <= off);
                let entry = self.entries.get(at.checked_sub(1)?)?;
                (u64::from(*entry), first_stub)
            }
            // The body `off` is in: the bodies follow each other in site
            // order (with `--args=GLOB`, of two lengths).
            Shape::PerSite => {
                let k = self.stubs.partition_point(|&s| u64::from(s) <= off);
                let end = self
                    .stubs
                    .get(k)
                    .map_or(self.code.len() as u64, |&s| u64::from(s));
                (u64::from(self.stubs[k.checked_sub(1)?]), end)
            }
        };
        let rip = CODE_VA + off;
        let region = &self.code[common as usize..end as usize];
        let start = CODE_VA + common;
        let mut depth: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
        let mut work = vec![(start, 0u64)];
        while let Some((ip, d)) = work.pop() {
            if ip < start || ip >= start + region.len() as u64 || depth.insert(ip, d).is_some() {
                continue;
            }
            let at = (ip - start) as usize;
            let mut dec = Decoder::with_ip(64, &region[at..], ip, DecoderOptions::NONE);
            let insn = dec.decode();
            let after = match insn.mnemonic() {
                Mnemonic::Push => d + 8,
                Mnemonic::Pop => d.saturating_sub(8),
                _ => d,
            };
            match insn.flow_control() {
                FlowControl::Return => {}
                FlowControl::UnconditionalBranch => work.push((insn.near_branch_target(), after)),
                FlowControl::ConditionalBranch => {
                    work.push((insn.near_branch_target(), after));
                    work.push((insn.next_ip(), after));
                }
                _ => work.push((insn.next_ip(), after)),
            }
        }
        depth.get(&rip).copied()
    }

    /// A recorded call's instructions in site `k`'s own body (`Shape::
    /// PerSite`), or in the shared body (without the stub).
    pub fn site_path(&self, k: usize) -> Result<Vec<Instruction>, TrampolineError> {
        let start = match self.shape {
            Shape::PerSite => self.stubs[k],
            Shape::Shared => self.common,
        };
        Ok(walk_common_path(&self.code, CODE_VA + u64::from(start))?)
    }

    /// The common path in Intel syntax, one instruction a line with its
    /// address, after the stub of site 0 (if any): for reports and reviews.
    pub fn listing(&self) -> String {
        let mut lines = Vec::new();
        if self.shape == Shape::Shared && !self.stubs.is_empty() {
            let stub = &self.code[self.stubs[0] as usize..];
            let mut decoder = Decoder::with_ip(64, stub, self.stub_va(0), DecoderOptions::NONE);
            for _ in 0..STUB_INSTRUCTIONS {
                lines.push(format_instruction(&decoder.decode()));
            }
        }
        lines.extend(self.common_path.iter().map(format_instruction));
        lines.join("\n")
    }
}

/// Padding between the code and the return stubs: int3, never run.
pub const INT3: u8 = 0xcc;

/// Generates the trampoline for `spec`: a body per site when they fit
/// (`Shape::PerSite`), else the shared body at `CODE_VA` and one stub per
/// site; with the graph always the shared body, the return path, and the
/// frames' return stubs at `RET_STUBS_VA`.
pub fn generate(spec: &TrampolineSpec) -> Result<Trampoline, TrampolineError> {
    if spec.layout.graph || spec.layout.sites == 0 {
        return generate_shaped(spec, Shape::Shared);
    }
    match generate_shaped(spec, Shape::PerSite) {
        Err(TrampolineError::TooLong { .. }) => generate_shaped(spec, Shape::Shared),
        other => other,
    }
}

/// `generate` in the given shape (`Shape::PerSite` needs at least one site
/// and no graph).
pub fn generate_shaped(spec: &TrampolineSpec, shape: Shape) -> Result<Trampoline, TrampolineError> {
    let layout = &spec.layout;
    if shape == Shape::PerSite && (layout.graph || layout.sites == 0) {
        return Err(layout_error(
            layout,
            "per-site bodies need sites and no function graph",
        ));
    }
    let sites = layout.sites;
    let fields = checked_fields(spec)?;

    let assemble = |source| TrampolineError::Assemble { sites, source };
    let mut a = CodeAssembler::new(64).map_err(assemble)?;
    let mut common = a.create_label();
    let mut ret_common = a.create_label();
    let mut stubs: Vec<CodeLabel> = Vec::with_capacity(sites);
    a.dq(&layout.table()).map_err(assemble)?;

    emit_code(
        &mut a,
        &fields,
        shape,
        spec,
        [&mut common, &mut ret_common],
        &mut stubs,
    )
    .map_err(assemble)?;

    let result = a
        .assemble_options(CODE_VA, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)
        .map_err(assemble)?;
    // With the graph, the frames' return stubs fill the end of the page,
    // after trap mode's return trap; without, the page ends at the trap.
    if result.inner.code_buffer.len() as u64 > RETURN_TRAP_OFF.saturating_sub(spec.reserve) {
        return Err(TrampolineError::TooLong {
            sites,
            len: result.inner.code_buffer.len(),
        });
    }
    let offset_of = |label: &CodeLabel| -> Result<u32, TrampolineError> {
        let ip = result.label_ip(label).map_err(assemble)?;
        // The code is at most CODE_LEN (checked above) bytes from CODE_VA.
        Ok((ip - CODE_VA) as u32)
    };
    let stubs = stubs.iter().map(offset_of).collect::<Result<Vec<_>, _>>()?;
    let common = match shape {
        Shape::Shared => offset_of(&common)?,
        Shape::PerSite => stubs[0],
    };
    let ret_common = match layout.graph {
        true => Some(offset_of(&ret_common)?),
        false => None,
    };
    let mut code = result.inner.code_buffer;
    let entries = entry_offsets(&code, &stubs, shape, common);
    let common_path = walk_common_path(&code, CODE_VA + u64::from(common))?;
    if shape == Shape::PerSite {
        check_paths(&code, &stubs, |k| body_instructions(spec, k))?;
    }
    let return_path = match ret_common {
        Some(ret_common) => append_return_stubs(&mut code, ret_common, sites)?,
        None => Vec::new(),
    };
    Ok(Trampoline {
        code,
        table: (layout.cpus * 8) as u32,
        shape,
        common,
        entries,
        stubs,
        common_path,
        return_path,
        locked: spec.preemptible,
    })
}

/// Emits the code of `shape`: a body per site, or the shared body (and with
/// the graph the shared return path) and a stub per site. Labels the shared
/// entry and return (`common`), and each site's entry (`stubs`).
fn emit_code(
    a: &mut CodeAssembler,
    fields: &Fields,
    shape: Shape,
    spec: &TrampolineSpec,
    [common, ret_common]: [&mut CodeLabel; 2],
    stubs: &mut Vec<CodeLabel>,
) -> Result<(), IcedError> {
    let sites = spec.layout.sites;
    if shape == Shape::PerSite {
        for k in 0..sites {
            let mut body = a.create_label();
            // A site not selected by `--args=GLOB` stores no arguments: its
            // calls cost what they cost without `--args`.
            let f = match spec.stores_args(k) {
                true => *fields,
                false => Fields {
                    rec_args: None,
                    ..*fields
                },
            };
            emit_site_body(a, &f, &mut body, k as u32, spec.site_copies(k))?;
            stubs.push(body);
        }
        return Ok(());
    }
    let graph = spec.layout.graph;
    if graph {
        graph_code::emit_entry(a, fields, common, &[])?;
        graph_code::emit_return(a, fields, ret_common)?;
    } else {
        emit_entry(a, fields, common, &[])?;
    }
    // A site whose event has words or strings to copy (a syscall's
    // registers; a name that does not last past the event) gets the shared
    // entry path of its own, with its copies; so does the graph's site
    // whose return is never hooked (`TrampolineSpec::entry_only`).
    let mut entries = Vec::with_capacity(sites);
    for k in 0..sites {
        let copies = spec.site_copies(k);
        let copied = |c: &strcopy::StrCopy| c.is_word() || fields.copy.is_some();
        if !copies.iter().any(copied) && spec.entry_only != Some(k) {
            entries.push(*common);
            continue;
        }
        let mut own = a.create_label();
        match graph && spec.entry_only != Some(k) {
            true => graph_code::emit_entry(a, fields, &mut own, copies)?,
            // Recorded, its return not hooked (its record's slot 0).
            false => emit_entry(a, fields, &mut own, copies)?,
        }
        entries.push(own);
    }
    for (k, entry) in entries.into_iter().enumerate() {
        let mut stub = a.create_label();
        a.set_label(&mut stub)?;
        // r11d = this site's index + 1, its records' commit word (r11 is
        // scratch at a function entry).
        a.mov(r11d, k as u32 + 1)?;
        // Into the common part (or the site's own entry).
        a.jmp(entry)?;
        stubs.push(stub);
    }
    Ok(())
}

/// The entry paths' offsets in `code`, ascending: `common`, and in the
/// shared shape those the stubs jump to (sites with words of their own).
fn entry_offsets(code: &[u8], stubs: &[u32], shape: Shape, common: u32) -> Vec<u32> {
    let mut entries = vec![common];
    if shape == Shape::Shared {
        for &stub in stubs {
            let va = CODE_VA + u64::from(stub);
            let mut d = Decoder::with_ip(64, &code[stub as usize..], va, DecoderOptions::NONE);
            // `mov r11d, k + 1`, then `jmp ENTRY`.
            let jmp = [d.decode(), d.decode()][1];
            entries.push((jmp.near_branch_target() - CODE_VA) as u32);
        }
    }
    entries.sort_unstable();
    entries.dedup();
    entries
}

/// Appends the function graph's return trap and the frames' return stubs
/// (into the shared return path at `ret_common`) at the end of the page;
/// returns the return path's instructions.
fn append_return_stubs(
    code: &mut Vec<u8>,
    ret_common: u32,
    sites: usize,
) -> Result<Vec<Instruction>, TrampolineError> {
    let assemble = |source| TrampolineError::Assemble { sites, source };
    let ret_va = CODE_VA + u64::from(ret_common);
    let ret_stubs = graph_code::return_stubs(ret_va).map_err(assemble)?;
    code.resize(RETURN_TRAP_OFF as usize, INT3);
    code.extend_from_slice(&crate::plan::traps::RETURN_TRAP);
    code.resize(RET_STUBS_OFF as usize, INT3);
    code.extend_from_slice(&ret_stubs);
    Ok(walk_common_path(code, RET_STUBS_VA)?)
}

/// The 5 bytes that replace the NOP of the site at `site_va`: `call rel32`
/// to `target_va` (a stub), encoded by iced-x86.
pub fn call_bytes(site_va: u64, target_va: u64) -> Result<[u8; 5], TrampolineError> {
    let out_of_reach = TrampolineError::OutOfReach {
        site: site_va,
        target: target_va,
    };
    // rel32 is relative to the end of the 5-byte call.
    let rel = i128::from(target_va) - (i128::from(site_va) + 5);
    if i32::try_from(rel).is_err() {
        return Err(out_of_reach);
    }
    let encode_error = |source| TrampolineError::EncodeCall {
        site: site_va,
        target: target_va,
        source,
    };
    let call = Instruction::with_branch(Code::Call_rel32_64, target_va).map_err(encode_error)?;
    let mut encoder = Encoder::new(64);
    let len = encoder.encode(&call, site_va).map_err(encode_error)?;
    <[u8; 5]>::try_from(encoder.take_buffer().as_slice())
        .ok()
        .filter(|_| len == 5)
        .ok_or(out_of_reach)
}

#[cfg(test)]
mod tests {
    use super::super::layout::*;
    use super::super::layout::{
        DATA_GPA, DATA_LEN, DATA_VA, FRAMES, FRAMES_OFF, FRAME_BUSY, FRAME_LEN, REGION_GPA,
        REGION_LEN,
    };
    use super::super::ret::Return;
    use super::super::strcopy::{CopyFns, StrCopy};
    use super::*;
    use crate::session::exitless::ring::{self, Record, RingReader};
    use iced_x86::{OpKind, Register};
    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

    /// A per-CPU offset like Linux's (`cpu_number` is in the first pages of
    /// the per-CPU section).
    const CPU_NUMBER_OFF: i32 = 0x1c11c;

    fn spec(cpus: usize, sites: usize, cap: u64) -> TrampolineSpec {
        TrampolineSpec {
            layout: RingLayout::new(cpus, sites, Some(cap), false).unwrap(),
            cpu_number_disp: CPU_NUMBER_OFF,
            preemptible: true,
            ret: Return::default(),
            task: None,
            retval: false,
            arg_sites: None,
            reserve: 0,
            copies: None,
            copy_fns: None,
            entry_only: None,
        }
    }

    fn graph_spec(cpus: usize, sites: usize, cap: u64) -> TrampolineSpec {
        TrampolineSpec {
            layout: RingLayout::new(cpus, sites, Some(cap), true).unwrap(),
            cpu_number_disp: CPU_NUMBER_OFF,
            preemptible: true,
            ret: Return::default(),
            task: None,
            retval: false,
            arg_sites: None,
            reserve: 0,
            copies: None,
            copy_fns: None,
            entry_only: None,
        }
    }

    /// The shared-body shape (what more sites than fit per-site bodies get).
    fn shared(s: &TrampolineSpec) -> Trampoline {
        let t = generate_shaped(s, Shape::Shared).unwrap();
        assert_eq!(t.shape, Shape::Shared);
        t
    }

    /// Per-site bodies (what `generate` makes when they fit).
    fn per_site(s: &TrampolineSpec) -> Trampoline {
        let t = generate(s).unwrap();
        assert_eq!(t.shape, Shape::PerSite);
        t
    }

    #[test]
    fn the_sites_return_address_is_found_anywhere_in_the_trampoline() {
        for t in [shared(&spec(2, 3, 16)), per_site(&spec(2, 3, 16))] {
            let path = &t.common_path;
            let depth = |i: usize| t.site_return_slot(path[i].ip());
            // push rax, push rdx, then the body at 16 ...
            assert_eq!((depth(0), depth(1), depth(2)), (Some(0), Some(8), Some(16)));
            // ... pop rdx, pop rax, ret.
            let n = path.len();
            assert_eq!(
                (depth(n - 3), depth(n - 2), depth(n - 1)),
                (Some(16), Some(8), Some(0))
            );
            assert!(path[2..n - 2]
                .iter()
                .all(|i| t.site_return_slot(i.ip()) == Some(16)));
            // The drop path (the `jae` target): 16 as well.
            let jae = path.iter().find(|i| i.mnemonic() == Mnemonic::Jae).unwrap();
            let full = jae.near_branch_target();
            assert_eq!(t.site_return_slot(full), Some(16));
            assert_eq!(t.site_return_slot(CODE_VA + t.code.len() as u64), None);
            assert_eq!(t.site_return_slot(CODE_VA - 1), None);
            match t.shape {
                // Stubs push nothing.
                Shape::Shared => {
                    for k in 0..3 {
                        assert_eq!(t.site_return_slot(t.stub_va(k)), Some(0));
                        assert_eq!(t.site_return_slot(t.stub_va(k) + 6), Some(0));
                    }
                }
                // Every site's body is read as site 0's.
                Shape::PerSite => {
                    for k in 1..3 {
                        let body = walk_common_path(&t.code, t.stub_va(k)).unwrap();
                        for (i, insn) in body.iter().enumerate() {
                            assert_eq!(t.site_return_slot(insn.ip()), depth(i), "site {k}");
                        }
                    }
                }
            }
        }
    }

    /// The instructions of `code`, past the rings' table's `table` bytes.
    fn decode_all(code: &[u8], table: u32) -> Vec<Instruction> {
        let from = table as usize;
        let va = CODE_VA + u64::from(table);
        let mut decoder = Decoder::with_ip(64, &code[from..], va, DecoderOptions::NONE);
        decoder.iter().collect()
    }

    fn mnemonics(path: &[Instruction]) -> Vec<Mnemonic> {
        path.iter().map(|i| i.mnemonic()).collect()
    }

    /// The code decodes from its first byte to its last with no invalid
    /// instruction; returns the instruction boundaries.
    fn decodes_whole(t: &Trampoline) -> std::collections::HashSet<u64> {
        assert!(t.code.len() as u64 <= CODE_LEN);
        let all = decode_all(&t.code, t.table);
        assert!(
            all.iter().all(|i| !i.is_invalid()),
            "invalid instruction in the code"
        );
        // The decoder consumed every byte after the table, and instruction
        // boundaries tile the code exactly.
        let mut expect = CODE_VA + u64::from(t.table);
        for i in &all {
            assert_eq!(i.ip(), expect);
            expect = i.next_ip();
        }
        assert_eq!(expect, CODE_VA + t.code.len() as u64);
        all.iter().map(|i| i.ip()).collect()
    }

    #[test]
    fn every_byte_decodes_and_stubs_jump_to_the_shared_body() {
        let t = shared(&spec(4, 100, 64));
        let boundaries = decodes_whole(&t);
        assert!(boundaries.contains(&t.common_va()));
        assert_eq!(t.sites(), 100);
        for k in 0..100u32 {
            let va = t.stub_va(k);
            assert!(
                boundaries.contains(&va),
                "stub {k} is not on an instruction boundary"
            );
            let start = (va - CODE_VA) as usize;
            let mut d = Decoder::with_ip(64, &t.code[start..], va, DecoderOptions::NONE);
            let mov = d.decode();
            assert_eq!(
                mov.code(),
                Code::Mov_r32_imm32,
                "stub {k}: {}",
                format_instruction(&mov)
            );
            assert_eq!(
                (mov.op0_register(), mov.immediate32()),
                (Register::R11D, k + 1)
            );
            let jmp = d.decode();
            assert_eq!(jmp.mnemonic(), Mnemonic::Jmp, "stub {k}");
            assert_eq!(jmp.near_branch_target(), t.common_va(), "stub {k}");
        }
    }

    /// Each site's body is site 0's but for its own commit word (k + 1) and
    /// drop counter, and every path of it stays inside it.
    #[test]
    fn every_byte_decodes_and_each_site_has_its_own_body() {
        let s = spec(4, 100, 64);
        let t = per_site(&s);
        let boundaries = decodes_whole(&t);
        assert_eq!(t.sites(), 100);
        let drops = DROPS_OFF;
        let body0 = walk_common_path(&t.code, t.stub_va(0)).unwrap();
        for k in 0..100u32 {
            let va = t.stub_va(k);
            assert!(boundaries.contains(&va), "body {k}");
            let end = if k < 99 {
                t.stub_va(k + 1)
            } else {
                CODE_VA + t.code.len() as u64
            };
            let insns: Vec<Instruction> = decode_all(&t.code, t.table)
                .into_iter()
                .filter(|i| (va..end).contains(&i.ip()))
                .collect();
            // The commit: `mov dword [r10 + commit], k + 1`.
            let commit = insns
                .iter()
                .find(|i| i.code() == Code::Mov_rm32_imm32)
                .unwrap();
            assert_eq!(commit.immediate32(), k + 1, "body {k}");
            // The drop counter: drops[k], no index register.
            let inc = insns
                .iter()
                .find(|i| i.mnemonic() == Mnemonic::Inc)
                .unwrap();
            assert!(inc.has_lock_prefix());
            assert_eq!(
                (inc.memory_index(), inc.memory_displacement64()),
                (Register::None, drops + 8 * u64::from(k)),
                "body {k}"
            );
            // Branches stay in the body; the path is site 0's, shifted.
            for i in &insns {
                if i.flow_control() == FlowControl::ConditionalBranch
                    || i.flow_control() == FlowControl::UnconditionalBranch
                {
                    assert!((va..end).contains(&i.near_branch_target()), "body {k}");
                }
            }
            let path = walk_common_path(&t.code, va).unwrap();
            assert_eq!(mnemonics(&path), mnemonics(&body0), "body {k}");
            assert_eq!(path[0].ip() - body0[0].ip(), va - t.stub_va(0));
        }
    }

    /// Per-site bodies fill the code page up to about 16,000 sites; more
    /// get stubs and the shared body.
    #[test]
    fn more_sites_than_bodies_fit_get_stubs() {
        let fits = per_site(&spec(1, 10_000, 2));
        assert!(fits.code.len() as u64 <= RETURN_TRAP_OFF);
        let many = generate(&spec(1, 20_000, 2)).unwrap();
        assert_eq!(many.shape, Shape::Shared);
        assert_eq!(many.common_path_instructions(), SHARED_PATH_INSTRUCTIONS);
        // Graph code is always shared.
        assert_eq!(
            generate(&graph_spec(1, 3, 16)).unwrap().shape,
            Shape::Shared
        );
        assert!(generate_shaped(&graph_spec(1, 3, 16), Shape::PerSite).is_err());
    }

    #[test]
    fn a_recorded_call_is_23_instructions_in_the_documented_order() {
        use Mnemonic::*;
        let body = [
            Push, Push, Mov, Cmp, Jae, Mov, Mov, Cmp, Jae, Lea, Cmpxchg, Jne, And, Add, Mov, Mov,
            Rdtsc, Mov, Mov, Mov, Pop, Pop, Ret,
        ];
        let t = per_site(&spec(2, 3, 16));
        assert_eq!(mnemonics(&t.common_path), body);
        assert_eq!(t.common_path_instructions(), COMMON_PATH_INSTRUCTIONS);
        const {
            assert!(
                COMMON_PATH_INSTRUCTIONS <= 30 && SHARED_PATH_INSTRUCTIONS <= 30,
                "the issue's goal: <= 30 guest instructions"
            )
        };
        println!("{}", t.listing());
        // Shared: the stub's two instructions, then the same path.
        let t = shared(&spec(2, 3, 16));
        assert_eq!(mnemonics(&t.common_path), body);
        assert_eq!(t.common_path_instructions(), SHARED_PATH_INSTRUCTIONS);
        let from_stub = walk_common_path(&t.code, t.stub_va(2)).unwrap();
        assert_eq!(from_stub.len(), SHARED_PATH_INSTRUCTIONS);
        assert_eq!(mnemonics(&from_stub[..2]), [Mov, Jmp]);
        assert_eq!(mnemonics(&from_stub[2..]), body);
        // Registers: saved and restored in mirror order, and the only others
        // written are the scratch r10 and r11.
        let regs = |m: Mnemonic| -> Vec<Register> {
            t.common_path
                .iter()
                .filter(|i| i.mnemonic() == m)
                .map(|i| i.op0_register())
                .collect()
        };
        assert_eq!(regs(Push), [Register::RAX, Register::RDX]);
        assert_eq!(regs(Pop), [Register::RDX, Register::RAX]);
        println!("{}", t.listing());
    }

    #[test]
    fn the_drop_path_is_14_instructions_or_16_through_a_stub() {
        for (t, want) in [
            (per_site(&spec(1, 1, 2)), DROP_PATH_INSTRUCTIONS),
            (shared(&spec(1, 1, 2)), SHARED_DROP_PATH_INSTRUCTIONS),
        ] {
            // Take the `jae full` after the limit check (the second `jae`:
            // the first is the CPU's bound check) instead of falling through.
            let path = &t.common_path;
            let jae_full = path
                .iter()
                .filter(|i| i.mnemonic() == Mnemonic::Jae)
                .nth(1)
                .unwrap();
            let rest = walk_common_path(&t.code, jae_full.near_branch_target()).unwrap();
            let upto = path.iter().position(|i| i.ip() == jae_full.ip()).unwrap() + 1;
            let stub = t.common_path_instructions() - path.len();
            assert_eq!(stub + upto + rest.len(), want);
            use Mnemonic::*;
            assert_eq!(mnemonics(&rest), [Inc, Jmp, Pop, Pop, Ret]);
            assert!(rest[0].has_lock_prefix());
        }
    }

    /// Every memory operand based on r10 addresses one ring field at the
    /// displacement and width the layout gives it.
    #[test]
    fn ring_fields_use_the_layout_displacements() {
        let s = spec(3, 50, 1024);
        let l = s.layout;
        // Displacements from the ring's address (r10).
        let d = |off: u64| off;
        let rec = |f: u64| d(l.records_off + f);
        use Mnemonic::*;
        let n = Register::None;
        let fields = [
            (Mov, d(HEAD_OFF), 8, n, 1),
            (Cmp, d(LIMIT_OFF), 8, n, 1),
            (Cmpxchg, d(HEAD_OFF), 8, n, 1),
            (Mov, rec(REC_PARENT), 8, n, 1),
            (Mov, rec(REC_TSC), 4, n, 1),
            (Mov, rec(REC_TSC + 4), 4, n, 1),
            (Mov, rec(REC_COMMIT), 4, n, 1),
        ];
        for t in [shared(&s), per_site(&s)] {
            // The shared body (it ends at the first stub), or site 7's body.
            let (start, end, drop) = match t.shape {
                // drops[k] at DROPS_OFF + 8 * k, indexed by r11 = k + 1.
                Shape::Shared => (
                    t.common_va(),
                    t.stub_va(0),
                    (Inc, d(DROPS_OFF - 8), 8, Register::R11, 8),
                ),
                Shape::PerSite => (
                    t.stub_va(7),
                    t.stub_va(8),
                    (Inc, d(DROPS_OFF + 7 * 8), 8, n, 1),
                ),
            };
            let mut seen = Vec::new();
            for i in decode_all(&t.code, t.table)
                .iter()
                .filter(|i| i.ip() >= start && i.ip() < end)
            {
                for op in 0..i.op_count() {
                    if i.op_kind(op) != OpKind::Memory {
                        continue;
                    }
                    match i.memory_base() {
                        Register::R10 => seen.push((
                            i.mnemonic(),
                            i.memory_displacement64(),
                            i.memory_size().size(),
                            i.memory_index(),
                            i.memory_index_scale(),
                        )),
                        Register::RSP => {
                            // The parent, past the two pushes and the return address.
                            assert_eq!(
                                (i.memory_displacement64(), i.memory_size().size()),
                                (24, 8)
                            );
                        }
                        // The ring's address from the rings' table (ring
                        // 0's for a CPU without one).
                        Register::None if i.segment_prefix() != Register::GS => {
                            assert_eq!(i.memory_displacement64(), RING_TABLE_VA);
                            assert_eq!(i.memory_size().size(), 8);
                            assert!(matches!(
                                (i.memory_index(), i.memory_index_scale()),
                                (Register::R10, 8) | (Register::None, _)
                            ));
                        }
                        Register::None => {
                            assert_eq!(i.memory_displacement64(), CPU_NUMBER_OFF as u64);
                            assert_eq!(i.memory_size().size(), 4);
                        }
                        // Not a data access: lea rdx, [rax + RECORD_LEN].
                        Register::RAX => assert_eq!(i.mnemonic(), Mnemonic::Lea),
                        other => panic!("unexpected base {other:?} in {}", format_instruction(i)),
                    }
                }
            }
            let mut want = fields.to_vec();
            want.push(drop);
            assert_eq!(seen, want, "{:?}", t.shape);
            // Each of those displacements fits the sign-extended imm32 encoding.
            for (_, disp, ..) in &seen {
                assert_eq!(*disp as i64 as i32 as i64 as u64, *disp);
            }
        }
    }

    #[test]
    fn only_instructions_the_emulating_host_runs() {
        let t = generate(&spec(2, 10, 8)).unwrap();
        use Mnemonic::*;
        let allowed = [
            Push, Pop, Mov, Cmp, Jae, Jb, Jne, Jmp, Lea, Cmpxchg, And, Shl, Add, Rdtsc, Ret, Inc,
            Xor,
        ];
        let forbidden = [
            Rdtscp, Rdpid, Xgetbv, Int, Int1, Into, Cmpxchg16b, Cmpxchg8b, Vmcall, Cpuid, Hlt, Std,
            Cld, Ud2, Syscall, Sysret, Iretq,
        ];
        let all = decode_all(&t.code, t.table);
        // int3 (which the emulating host cannot run) only right after a
        // `ret`, where it never runs: it stops straight-line speculation.
        // And every `ret` has one.
        for w in all.windows(2) {
            assert_eq!(
                w[0].mnemonic() == Ret,
                w[1].mnemonic() == Int3,
                "{} then {}",
                format_instruction(&w[0]),
                format_instruction(&w[1])
            );
        }
        for i in all.iter().filter(|i| i.mnemonic() != Int3) {
            assert!(
                !forbidden.contains(&i.mnemonic()),
                "forbidden: {}",
                format_instruction(i)
            );
            assert!(
                allowed.contains(&i.mnemonic()),
                "not known to run: {}",
                format_instruction(i)
            );
            // Only the reservation and the drop counter are locked.
            if i.has_lock_prefix() {
                assert!(
                    matches!(i.mnemonic(), Cmpxchg | Inc),
                    "{}",
                    format_instruction(i)
                );
            }
        }
    }

    /// A kernel that cannot preempt a task inside the trampoline gets the
    /// rings' reservation without a lock prefix, in every shape; the drop
    /// counters (which a CPU without a ring shares with ring 0's CPU) and
    /// the graph's frame pool, shared by all CPUs, stay locked.
    #[test]
    fn an_unpreemptible_kernel_gets_unlocked_ring_instructions() {
        let unlocked = |s: TrampolineSpec| TrampolineSpec {
            preemptible: false,
            ..s
        };
        for t in [
            per_site(&unlocked(spec(2, 3, 16))),
            shared(&unlocked(spec(2, 3, 16))),
            generate(&unlocked(graph_spec(2, 3, 16))).unwrap(),
        ] {
            let end = (RETURN_TRAP_OFF as usize).min(t.code.len());
            let all = decode_all(&t.code[..end], t.table);
            let of = |m: Mnemonic| all.iter().filter(move |i| i.mnemonic() == m);
            // A reservation and a drop counter per body: three sites' own,
            // the shared one, the graph's entry and return.
            let bodies = match (t.shape, t.return_path.is_empty()) {
                (Shape::PerSite, _) => 3,
                (Shape::Shared, true) => 1,
                (Shape::Shared, false) => 2,
            };
            assert_eq!(of(Mnemonic::Cmpxchg).count(), bodies, "{:?}", t.shape);
            assert_eq!(of(Mnemonic::Inc).count(), bodies, "{:?}", t.shape);
            let plain = of(Mnemonic::Cmpxchg).all(|i| !i.has_lock_prefix());
            assert!(plain, "{:?}", t.shape);
            assert!(
                of(Mnemonic::Inc).all(|i| i.has_lock_prefix()),
                "{:?}",
                t.shape
            );
            for i in all.iter().filter(|i| i.mnemonic() == Mnemonic::Xadd) {
                assert!(i.has_lock_prefix(), "the frame ticket must stay locked");
            }
            // The same length and path as the locked code, one byte less
            // per locked instruction.
            assert_eq!(t.common_path_instructions(), {
                let locked = TrampolineSpec {
                    preemptible: true,
                    ..unlocked(if t.return_path.is_empty() {
                        spec(2, 3, 16)
                    } else {
                        graph_spec(2, 3, 16)
                    })
                };
                generate_shaped(&locked, t.shape)
                    .unwrap()
                    .common_path_instructions()
            });
        }
        // And it runs: every interrupt point of a call, as locked code does.
        let s = unlocked(spec(1, 2, 8));
        for t in [per_site(&s), shared(&s)] {
            nested_call_at_every_instruction(&s, &t);
        }
    }

    #[test]
    fn call_bytes_round_trip_and_refuse_far_targets() {
        let t = generate(&spec(1, 4, 2)).unwrap();
        // The kernel image's first and last text addresses reach the stubs.
        for site in [0xffff_ffff_8100_0000u64, 0xffff_ffff_bfff_fff0] {
            for k in 0..4 {
                let target = t.stub_va(k);
                let bytes = call_bytes(site, target).unwrap();
                assert_eq!(bytes[0], 0xe8);
                let call = Decoder::with_ip(64, &bytes, site, DecoderOptions::NONE).decode();
                assert_eq!(call.code(), Code::Call_rel32_64);
                assert_eq!((call.len(), call.near_branch64()), (5, target));
            }
        }
        // Backwards, and the edges of rel32 reach both ways.
        let site = 0xffff_ffff_0000_0000u64;
        assert!(call_bytes(site, site - 0x1000).is_ok());
        assert!(call_bytes(site, site + 5 + i32::MAX as u64).is_ok());
        assert!(matches!(
            call_bytes(site, site + 5 + i32::MAX as u64 + 1),
            Err(TrampolineError::OutOfReach { .. })
        ));
        assert!(call_bytes(site, (site + 5).wrapping_sub(1 << 31)).is_ok());
        assert!(matches!(
            call_bytes(site, (site + 5).wrapping_sub((1 << 31) + 1)),
            Err(TrampolineError::OutOfReach { .. })
        ));
        // A module far below the image cannot reach it.
        assert!(matches!(
            call_bytes(0xffff_c900_0000_0000, CODE_VA),
            Err(TrampolineError::OutOfReach { .. })
        ));
    }

    #[test]
    fn refuses_what_it_cannot_address_or_fit() {
        let mut s = spec(1, 1, 2);
        s.layout.cap = 3;
        assert!(matches!(generate(&s), Err(TrampolineError::Layout { .. })));
        // Each stub takes at least 7 bytes: 2 MiB of code holds < 300,000.
        let s = TrampolineSpec {
            layout: RingLayout {
                cpus: 1,
                sites: 300_000,
                graph: false,
                cap: 2,
                records_off: 0x1000,
                ring_bytes: 0x2000,
                args: false,
                strings: false,
                va: DATA_VA,
                gpa: DATA_GPA,
            },
            cpu_number_disp: 0,
            preemptible: true,
            ret: Return::default(),
            task: None,
            retval: false,
            arg_sites: None,
            reserve: 0,
            copies: None,
            copy_fns: None,
            entry_only: None,
        };
        let err = generate(&s).unwrap_err();
        assert!(
            matches!(err, TrampolineError::TooLong { sites: 300_000, .. }),
            "{err}"
        );
    }

    // ---- running the generated code --------------------------------------

    /// Guest RAM (identity-mapped in the emulator): per-CPU areas and stacks.
    const RAM_LEN: u64 = 1 << 20;
    fn gs_base(cpu: u32) -> u64 {
        0x1_0000 + u64::from(cpu) * 0x2_0000
    }
    fn stack_top(cpu: u32) -> u64 {
        0xc_0000 + u64::from(cpu) * 0x1_0000
    }
    /// The kernel's return thunks the emulator runs (`Emu::step`): a plain
    /// one, and call_depth_return_thunk, which shifts the per-CPU depth at
    /// `gs:[DEPTH_DISP]` left by 5; both count their runs at `THUNK_HITS`.
    const THUNK_VA: u64 = 0xffff_ffff_8200_1000;
    const DEPTH_THUNK_VA: u64 = 0xffff_ffff_8200_1040;
    const DEPTH_DISP: i32 = 0x1f3d8;
    const THUNK_HITS: u64 = 0xf_0000;
    /// The kernel's nofault copies the emulator runs (`Emu::kernel_copy`),
    /// and their error.
    const STRNCPY_VA: u64 = 0xffff_ffff_8200_2000;
    const COPY_VA: u64 = 0xffff_ffff_8200_2040;
    const EFAULT: u64 = -14i64 as u64;
    const SITE: u64 = 0xffff_ffff_8100_1230;
    const PARENT: u64 = 0xffff_ffff_8100_4560;

    fn memory(cpu_numbers: &[u32]) -> GuestMemoryMmap {
        let mem = GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), RAM_LEN as usize),
            (GuestAddress(REGION_GPA), REGION_LEN as usize),
        ])
        .unwrap();
        for (i, &n) in cpu_numbers.iter().enumerate() {
            mem.write_obj(n, GuestAddress(gs_base(i as u32) + CPU_NUMBER_OFF as u64))
                .unwrap();
        }
        mem
    }

    /// A vCPU's registers in the emulator.
    #[derive(Clone, Debug, PartialEq, Eq)]
    struct Regs {
        gpr: [u64; 16],
        rip: u64,
        gs_base: u64,
        /// CF and ZF as the last `cmp` or `cmpxchg` left them; `None` after
        /// an instruction whose flags the trampoline must not rely on.
        flags: Option<(bool, bool)>,
    }

    fn gpr_index(reg: Register) -> usize {
        reg.full_register() as usize - Register::RAX as usize
    }
    const RSP: usize = 4;
    const R10: usize = 10;
    const R11: usize = 11;

    /// A minimal x86-64 interpreter for exactly the instructions the
    /// trampoline uses, over guest memory with the trampoline's mapping
    /// (code at CODE_VA, rings at DATA_VA, RAM identity-mapped below 1 MiB).
    struct Emu<'a> {
        mem: &'a GuestMemoryMmap,
        code: &'a [u8],
        tsc: u64,
    }

    impl Emu<'_> {
        fn gpa(va: u64, len: usize) -> GuestAddress {
            let len = len as u64;
            if (DATA_VA..DATA_VA + DATA_LEN - len + 1).contains(&va) {
                GuestAddress(DATA_GPA + (va - DATA_VA))
            } else if (HIGH_RINGS_VA..HIGH_RINGS_VA + DATA_LEN - len + 1).contains(&va) {
                // Rings placed far from the code: the same memory.
                GuestAddress(DATA_GPA + (va - HIGH_RINGS_VA))
            } else if va + len <= RAM_LEN {
                GuestAddress(va)
            } else {
                panic!("page fault at {va:#x}");
            }
        }
        fn read(&self, va: u64, len: usize) -> u64 {
            let mut b = [0u8; 8];
            // The code page (its rings' table), read-only.
            let code = CODE_VA..CODE_VA + self.code.len() as u64;
            if code.contains(&va) && code.contains(&(va + len as u64 - 1)) {
                let off = (va - CODE_VA) as usize;
                b[..len].copy_from_slice(&self.code[off..off + len]);
                return u64::from_le_bytes(b);
            }
            self.mem
                .read_slice(&mut b[..len], Self::gpa(va, len))
                .unwrap();
            u64::from_le_bytes(b)
        }
        fn write(&self, va: u64, len: usize, v: u64) {
            self.mem
                .write_slice(&v.to_le_bytes()[..len], Self::gpa(va, len))
                .unwrap();
        }
        fn mask(len: usize) -> u64 {
            if len == 8 {
                u64::MAX
            } else {
                (1 << (len * 8)) - 1
            }
        }
        fn ea(r: &Regs, i: &Instruction) -> u64 {
            let mut ea = i.memory_displacement64();
            if i.memory_base() != Register::None {
                ea = ea.wrapping_add(r.gpr[gpr_index(i.memory_base())]);
            }
            if i.memory_index() != Register::None {
                let index = r.gpr[gpr_index(i.memory_index())];
                ea = ea.wrapping_add(index.wrapping_mul(u64::from(i.memory_index_scale())));
            }
            if i.segment_prefix() == Register::GS {
                ea = ea.wrapping_add(r.gs_base);
            }
            ea
        }
        fn size(i: &Instruction, op: u32) -> usize {
            match i.op_kind(op) {
                OpKind::Register => i.op_register(op).size(),
                OpKind::Memory => i.memory_size().size(),
                _ => panic!("no size for operand {op} of {}", format_instruction(i)),
            }
        }
        fn get(&self, r: &Regs, i: &Instruction, op: u32, len: usize) -> u64 {
            let v = match i.op_kind(op) {
                OpKind::Register => r.gpr[gpr_index(i.op_register(op))],
                OpKind::Memory => self.read(Self::ea(r, i), len),
                _ => i.immediate(op),
            };
            v & Self::mask(len)
        }
        fn set(&self, r: &mut Regs, i: &Instruction, op: u32, v: u64) {
            match i.op_kind(op) {
                // A 32-bit register write zero-extends, as on hardware.
                OpKind::Register => {
                    let reg = i.op_register(op);
                    assert!(reg.size() >= 4, "{}", format_instruction(i));
                    r.gpr[gpr_index(reg)] = v & Self::mask(reg.size());
                }
                OpKind::Memory => self.write(Self::ea(r, i), i.memory_size().size(), v),
                _ => panic!("write to an immediate in {}", format_instruction(i)),
            }
        }
        fn push(&self, r: &mut Regs, v: u64) {
            r.gpr[RSP] -= 8;
            self.write(r.gpr[RSP], 8, v);
        }
        fn pop(&self, r: &mut Regs) -> u64 {
            let v = self.read(r.gpr[RSP], 8);
            r.gpr[RSP] += 8;
            v
        }

        /// Executes one instruction; at a kernel return thunk, the whole
        /// thunk (counted in `THUNK_HITS`).
        fn step(&mut self, r: &mut Regs) {
            if r.rip == STRNCPY_VA || r.rip == COPY_VA {
                self.kernel_copy(r);
                return;
            }
            if r.rip == THUNK_VA || r.rip == DEPTH_THUNK_VA {
                if r.rip == DEPTH_THUNK_VA {
                    // call_depth_return_thunk: shl qword gs:[depth], 5.
                    let depth = r.gs_base.wrapping_add(DEPTH_DISP as u64);
                    self.write(depth, 8, self.read(depth, 8) << 5);
                }
                self.write(THUNK_HITS, 8, self.read(THUNK_HITS, 8) + 1);
                r.rip = self.pop(r);
                r.flags = None;
                return;
            }
            let off = (r.rip - CODE_VA) as usize;
            let i = Decoder::with_ip(64, &self.code[off..], r.rip, DecoderOptions::NONE).decode();
            assert!(!i.is_invalid(), "invalid instruction at {:#x}", r.rip);
            r.rip = i.next_ip();
            let flags = |r: &Regs| r.flags.expect("a branch on undefined flags");
            use Mnemonic::*;
            match i.mnemonic() {
                Push => {
                    let v = self.get(r, &i, 0, 8);
                    self.push(r, v);
                }
                Pop => {
                    let v = self.pop(r);
                    self.set(r, &i, 0, v);
                }
                Mov => {
                    let v = self.get(r, &i, 1, Self::size(&i, 0));
                    self.set(r, &i, 0, v);
                }
                Lea => {
                    let v = Self::ea(r, &i) & Self::mask(Self::size(&i, 0));
                    self.set(r, &i, 0, v);
                }
                Cmp => {
                    let len = Self::size(&i, 0);
                    let (a, b) = (self.get(r, &i, 0, len), self.get(r, &i, 1, len));
                    r.flags = Some((a < b, a == b));
                }
                Cmpxchg => {
                    let len = Self::size(&i, 0);
                    let dest = self.get(r, &i, 0, len);
                    let acc = r.gpr[0] & Self::mask(len);
                    if acc == dest {
                        let src = self.get(r, &i, 1, len);
                        self.set(r, &i, 0, src);
                    } else {
                        r.gpr[0] = dest;
                    }
                    r.flags = Some((acc < dest, acc == dest));
                }
                Imul | And | Shl | Sar | Add | Inc => {
                    let len = Self::size(&i, 0);
                    let a = self.get(r, &i, 0, len);
                    let b = if i.op_count() > 1 {
                        self.get(r, &i, 1, len)
                    } else {
                        0
                    };
                    let v = match i.mnemonic() {
                        // imul r, r/m, imm: op1 times the sign-extended imm.
                        Imul => b.wrapping_mul(i.immediate(2)),
                        And => a & b,
                        Shl => a << (b & 63),
                        // Only the depth accounting: a qword.
                        Sar => ((a as i64) >> (b & 63)) as u64,
                        Add => a.wrapping_add(b),
                        _ => a.wrapping_add(1),
                    };
                    self.set(r, &i, 0, v & Self::mask(len));
                    r.flags = None;
                }
                // The graph paths' frame claim.
                Xadd => {
                    let len = Self::size(&i, 0);
                    let (dest, src) = (self.get(r, &i, 0, len), self.get(r, &i, 1, len));
                    self.set(r, &i, 1, dest);
                    self.set(r, &i, 0, dest.wrapping_add(src) & Self::mask(len));
                    r.flags = None;
                }
                Xchg => {
                    let len = Self::size(&i, 0);
                    let (a, b) = (self.get(r, &i, 0, len), self.get(r, &i, 1, len));
                    self.set(r, &i, 0, b);
                    self.set(r, &i, 1, a);
                }
                Test => {
                    let len = Self::size(&i, 0);
                    let v = self.get(r, &i, 0, len) & self.get(r, &i, 1, len);
                    r.flags = Some((false, v == 0));
                }
                Jae => {
                    if !flags(r).0 {
                        r.rip = i.near_branch_target();
                    }
                }
                // The filtered counter's bound check.
                Jb => {
                    if flags(r).0 {
                        r.rip = i.near_branch_target();
                    }
                }
                // A CPU without a ring: r10d = 0 (xor reg, reg only).
                Xor => {
                    assert_eq!(i.op0_register(), i.op1_register());
                    self.set(r, &i, 0, 0);
                    r.flags = None;
                }
                Jne => {
                    if !flags(r).1 {
                        r.rip = i.near_branch_target();
                    }
                }
                // The pid filter's compares.
                Je => {
                    if flags(r).1 {
                        r.rip = i.near_branch_target();
                    }
                }
                Jmp => r.rip = i.near_branch_target(),
                Rdtsc => {
                    r.gpr[0] = self.tsc & 0xffff_ffff;
                    r.gpr[2] = self.tsc >> 32;
                    self.tsc += 0x1_0000_0001;
                }
                Ret => r.rip = self.pop(r),
                Call => {
                    self.push(r, i.next_ip());
                    r.rip = i.near_branch_target();
                }
                // Int3 (never to run) among them.
                other => panic!("the emulator does not run {other:?}"),
            }
        }

        /// The kernel's `strncpy_from_kernel_nofault(rdi, rsi, rdx)` (at
        /// `STRNCPY_VA`) or `copy_from_kernel_nofault` (`COPY_VA`), whole,
        /// as mm/maccess.c does them: a source outside the emulated RAM
        /// returns -EFAULT; then every register a C call may clobber is.
        fn kernel_copy(&mut self, r: &mut Regs) {
            let (dst, src, n) = (r.gpr[7], r.gpr[6], r.gpr[2]);
            let mapped = |va: u64| va < RAM_LEN;
            let ret = if r.rip == COPY_VA {
                match (0..n).all(|i| mapped(src + i)) {
                    true => {
                        for i in 0..n {
                            self.write(dst + i, 1, self.read(src + i, 1));
                        }
                        0
                    }
                    false => EFAULT,
                }
            } else {
                let mut i = 0;
                loop {
                    if !mapped(src + i) {
                        self.write(dst, 1, 0);
                        break EFAULT;
                    }
                    let c = self.read(src + i, 1);
                    self.write(dst + i, 1, c);
                    i += 1;
                    if c == 0 || i == n {
                        self.write(dst + i - 1, 1, 0);
                        break i;
                    }
                }
            };
            // rax, rcx, rdx, rsi, rdi, r8 to r11: the caller's to save.
            for g in [1, 2, 6, 7, 8, 9, 10, 11] {
                r.gpr[g] = 0xdead_0000_0000_0000 | g as u64;
            }
            r.gpr[0] = ret;
            r.flags = None;
            r.rip = self.pop(r);
        }

        /// The traced function at `SITE` is called from `parent` and its
        /// site calls stub `k`; runs until the trampoline returns to the
        /// site + 5. Before instruction n (0 = the stub's first), calls
        /// `interrupt(n, self, regs)`, which may run other calls (an
        /// interrupt: it cannot change this call's registers). Returns the
        /// number of instructions executed.
        fn call(
            &mut self,
            r: &mut Regs,
            k: u32,
            parent: u64,
            t: &Trampoline,
            interrupt: &mut dyn FnMut(usize, &mut Self, &Regs),
        ) -> usize {
            let entry_rsp = r.gpr[RSP];
            self.push(r, parent);
            self.push(r, SITE + 5);
            r.rip = t.stub_va(k);
            let mut steps = 0;
            while r.rip != SITE + 5 {
                interrupt(steps, self, r);
                self.step(r);
                steps += 1;
                assert!(steps < 1000, "runaway trampoline");
            }
            assert_eq!(r.gpr[RSP], entry_rsp - 8, "unbalanced stack");
            r.gpr[RSP] = entry_rsp;
            steps
        }
    }

    fn regs(cpu: u32) -> Regs {
        let mut gpr = [0u64; 16];
        for (i, g) in gpr.iter_mut().enumerate() {
            *g = 0x1111_1111_1111_1111u64.wrapping_mul(i as u64 + 1) ^ 0x8000_0000_0000_0000;
        }
        gpr[RSP] = stack_top(cpu);
        Regs {
            gpr,
            rip: 0,
            gs_base: gs_base(cpu),
            flags: None,
        }
    }

    fn no_interrupt(_: usize, _: &mut Emu, _: &Regs) {}

    fn drain(reader: &mut RingReader, mem: &GuestMemoryMmap) -> Vec<(usize, Record)> {
        let mut out = Vec::new();
        reader.drain(mem, |cpu, rec| out.push((cpu, rec))).unwrap();
        out
    }

    /// Rings anywhere in the address space (`RingLayout::placed`): the
    /// code reads each ring's address from its table, 64-bit, in as many
    /// instructions as with the rings beside the code.
    const HIGH_RINGS_VA: u64 = 0xffff_ffff_0000_0000;

    #[test]
    fn emulated_call_records_into_rings_placed_far_from_the_code() {
        for graph in [false, true] {
            let mut s = match graph {
                true => graph_spec(2, 3, 4),
                false => spec(2, 3, 4),
            };
            s.layout = s.layout.placed(HIGH_RINGS_VA, DATA_GPA);
            let t = generate(&s).unwrap();
            let table: Vec<u64> = t.code[..16]
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                .collect();
            assert_eq!(table, [HIGH_RINGS_VA, HIGH_RINGS_VA + s.layout.ring_bytes]);
            assert!(i32::try_from(HIGH_RINGS_VA as i64).is_err());
            let mem = memory(&[0, 1]);
            ring::init_rings(&mem, &s.layout).unwrap();
            let mut emu = Emu {
                mem: &mem,
                code: &t.code,
                tsc: 9,
            };
            let mut reader = RingReader::new(s.layout);
            let mut r = regs(1);
            let steps = emu.call(&mut r, 2, PARENT, &t, &mut no_interrupt);
            if !graph {
                // Unchanged: the table's load took the multiply's place.
                assert_eq!(steps, COMMON_PATH_INSTRUCTIONS);
            }
            let got = drain(&mut reader, &mem);
            assert_eq!(got.len(), 1, "graph {graph}");
            assert_eq!((got[0].0, got[0].1.site, got[0].1.parent), (1, 2, PARENT));
        }
    }

    #[test]
    fn emulated_call_records_and_preserves_registers() {
        let s = spec(2, 3, 4);
        let t = generate(&s).unwrap();
        let mem = memory(&[0, 1]);
        ring::init_rings(&mem, &s.layout).unwrap();
        let mut emu = Emu {
            mem: &mem,
            code: &t.code,
            tsc: 0x1234_5678_9abc_def0,
        };
        let mut reader = RingReader::new(s.layout);
        for (cpu, k) in [(1u32, 2u32), (0, 0), (1, 1)] {
            let mut r = regs(cpu);
            let before = r.clone();
            let tsc = emu.tsc;
            let steps = emu.call(&mut r, k, PARENT + u64::from(k), &t, &mut no_interrupt);
            assert_eq!(steps, COMMON_PATH_INSTRUCTIONS);
            // Everything but the scratch r10 and r11 (and rip, flags) as it was.
            for reg in 0..16 {
                if reg != R10 && reg != R11 {
                    assert_eq!(r.gpr[reg], before.gpr[reg], "register {reg} changed");
                }
            }
            let got = drain(&mut reader, &mem);
            let want = Record {
                tsc,
                parent: PARENT + u64::from(k),
                site: k,
                slot: 0,
                task: 0,
                pid: 0,
                ret: 0,
                args: None,
                strings: None,
            };
            assert_eq!(got, [(cpu as usize, want)]);
        }
        assert_eq!(ring::drops(&mem, &s.layout, 1).unwrap(), [0, 0, 0]);
    }

    // ---- tasks: the current task recorded, the pid filter ------------------

    /// The kernel's per-CPU current-task pointer, and each CPU's task
    /// struct (in emulated RAM), with its pid at `TASK_PID_OFF`.
    const CURRENT_OFF: i32 = 0x1ac00;
    const TASK_PID_OFF: u32 = 0x3c0;
    fn task_va(cpu: u32) -> u64 {
        0x8_0000 + u64::from(cpu) * 0x1000
    }

    fn with_task(mut s: TrampolineSpec, pids: &[u32]) -> TrampolineSpec {
        let mut code = TaskCode {
            current_disp: CURRENT_OFF,
            pid_off: TASK_PID_OFF,
            pids: [0; MAX_FILTER_PIDS],
            npids: pids.len(),
        };
        code.pids[..pids.len()].copy_from_slice(pids);
        s.task = Some(code);
        s
    }

    /// CPU `cpu` runs the task whose pid is `pid`.
    fn run_task(mem: &GuestMemoryMmap, cpu: u32, pid: u32) {
        let current = gs_base(cpu) + CURRENT_OFF as u64;
        mem.write_obj(task_va(cpu), GuestAddress(current)).unwrap();
        mem.write_obj(pid, GuestAddress(task_va(cpu) + u64::from(TASK_PID_OFF)))
            .unwrap();
    }

    #[test]
    fn emulated_calls_record_their_task_and_pid_in_both_shapes() {
        for shaped in [per_site, shared] {
            let s = with_task(spec(2, 3, 8), &[]);
            let t = shaped(&s);
            assert_eq!(
                t.common_path_instructions(),
                match t.shape {
                    Shape::PerSite => COMMON_PATH_INSTRUCTIONS,
                    Shape::Shared => SHARED_PATH_INSTRUCTIONS,
                } + TASK_INSTRUCTIONS
            );
            let mem = memory(&[0, 1]);
            ring::init_rings(&mem, &s.layout).unwrap();
            let mut emu = Emu {
                mem: &mem,
                code: &t.code,
                tsc: 5,
            };
            let mut reader = RingReader::new(s.layout);
            for (cpu, pid) in [(0u32, 0u32), (1, 4242), (0, 7)] {
                run_task(&mem, cpu, pid);
                let mut r = regs(cpu);
                let before = r.clone();
                let steps = emu.call(&mut r, 1, PARENT, &t, &mut no_interrupt);
                assert_eq!(steps, t.common_path_instructions());
                for reg in (0..16).filter(|&g| g != R10 && g != R11) {
                    assert_eq!(r.gpr[reg], before.gpr[reg], "register {reg} changed");
                }
                let got = drain(&mut reader, &mem);
                assert_eq!(got.len(), 1);
                assert_eq!((got[0].1.task, got[0].1.pid), (task_va(cpu), pid));
            }
        }
    }

    #[test]
    fn emulated_pid_filter_records_kept_pids_and_counts_the_others() {
        for pids in [&[9u32][..], &[7, 9, 11]] {
            let s = with_task(spec(1, 2, 8), pids);
            let t = per_site(&s);
            // Found by the last compare: 2 loads and every compare pair.
            assert_eq!(
                t.common_path_instructions(),
                COMMON_PATH_INSTRUCTIONS + TASK_INSTRUCTIONS + 2 + 2 * pids.len()
            );
            let mem = memory(&[0]);
            ring::init_rings(&mem, &s.layout).unwrap();
            let mut emu = Emu {
                mem: &mem,
                code: &t.code,
                tsc: 5,
            };
            let mut reader = RingReader::new(s.layout);
            run_task(&mem, 0, 9);
            let mut r = regs(0);
            emu.call(&mut r, 0, PARENT, &t, &mut no_interrupt);
            let got = drain(&mut reader, &mem);
            assert_eq!(got.len(), 1);
            assert_eq!(got[0].1.pid, 9);
            // A pid not kept: no record, one call counted as rejected, in
            // 14 instructions with one pid (two more per further pid):
            // issue 25's 12, and the CPU number's bound check (issue 34).
            run_task(&mem, 0, 8);
            let mut r = regs(0);
            let before = r.clone();
            let steps = emu.call(&mut r, 1, PARENT, &t, &mut no_interrupt);
            assert_eq!(steps, 12 + 2 * pids.len());
            for reg in (0..16).filter(|&g| g != R10 && g != R11) {
                assert_eq!(r.gpr[reg], before.gpr[reg], "register {reg} changed");
            }
            assert!(drain(&mut reader, &mem).is_empty());
            assert_eq!(ring::filtered(&mem, &s.layout, 0).unwrap(), 1);
            assert_eq!(ring::drops(&mem, &s.layout, 0).unwrap(), [0, 0]);
        }
    }

    #[test]
    fn emulated_graph_entry_of_a_rejected_pid_is_neither_recorded_nor_hooked() {
        let s = with_task(graph_spec(1, 2, 8), &[9]);
        let t = generate(&s).unwrap();
        let mem = memory(&[0]);
        ring::init_rings(&mem, &s.layout).unwrap();
        let mut emu = Emu {
            mem: &mem,
            code: &t.code,
            tsc: 5,
        };
        let mut reader = RingReader::new(s.layout);
        run_task(&mem, 0, 8);
        let mut r = regs(0);
        emu.call(&mut r, 0, PARENT, &t, &mut no_interrupt);
        // The function's return address is still its caller's.
        assert_eq!(emu.read(r.gpr[RSP] - 8, 8), PARENT);
        assert!(drain(&mut reader, &mem).is_empty());
        assert_eq!(ring::filtered(&mem, &s.layout, 0).unwrap(), 1);
        // A kept pid is recorded with its task, and hooked.
        run_task(&mem, 0, 9);
        let mut r = regs(0);
        emu.call(&mut r, 0, PARENT, &t, &mut no_interrupt);
        let got = drain(&mut reader, &mem);
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].1.task, got[0].1.pid), (task_va(0), 9));
        assert_ne!(got[0].1.slot, 0, "hooked");
    }

    #[test]
    fn emulated_calls_record_their_arguments_and_return_values() {
        for graph in [false, true] {
            let mut s = if graph {
                graph_spec(1, 2, 8)
            } else {
                spec(1, 2, 8)
            };
            s.layout = RingLayout::with_args(1, 2, Some(8), graph, true).unwrap();
            s.retval = graph;
            let s = with_task(s, &[]);
            let t = generate(&s).unwrap();
            if !graph {
                assert_eq!(
                    t.common_path_instructions(),
                    COMMON_PATH_INSTRUCTIONS + TASK_INSTRUCTIONS + ARGS_INSTRUCTIONS
                );
            } else {
                assert_eq!(
                    t.return_path.len(),
                    GRAPH_RETURN_INSTRUCTIONS + TASK_INSTRUCTIONS + RETVAL_INSTRUCTIONS
                );
            }
            let mem = memory(&[0]);
            ring::init_rings(&mem, &s.layout).unwrap();
            run_task(&mem, 0, 77);
            let mut emu = Emu {
                mem: &mem,
                code: &t.code,
                tsc: 5,
            };
            let mut reader = RingReader::new(s.layout);
            let mut r = regs(0);
            // RDI, RSI, RDX, RCX, R8, R9 (gpr indices in encoding order).
            let want = [7, 6, 2, 1, 8, 9].map(|g| r.gpr[g]);
            let before = r.clone();
            emu.call(&mut r, 1, PARENT, &t, &mut no_interrupt);
            for reg in (0..16).filter(|&g| g != R10 && g != R11) {
                assert_eq!(r.gpr[reg], before.gpr[reg], "register {reg} changed");
            }
            let got = drain(&mut reader, &mem);
            assert_eq!(got.len(), 1);
            assert_eq!(got[0].1.args, Some(want), "graph={graph}");
            if graph {
                // The function returns with RAX = its value, through the
                // hooked return address at its slot.
                r.gpr[RSP] = before.gpr[RSP] - 8;
                r.gpr[0] = 0xffff_ffff_ffff_fffe;
                let steps = emulated_return(&mut emu, &mut r, PARENT);
                assert_eq!(steps, t.return_path.len());
                let got = drain(&mut reader, &mem);
                assert_eq!(got.len(), 1);
                assert_eq!((got[0].1.ret, got[0].1.args), (0xffff_ffff_ffff_fffe, None));
                assert_eq!(r.gpr[0], 0xffff_ffff_ffff_fffe, "RAX kept");
            }
        }
    }

    /// `--args=GLOB` with per-site bodies: only a selected site's body
    /// stores the arguments; an unselected site's calls run exactly the
    /// instructions they run without `--args`, and record none. The shared
    /// body stores every call's (the drainer keeps the selected sites').
    #[test]
    fn only_selected_sites_bodies_store_arguments() {
        let mut s = with_task(spec(1, 3, 8), &[]);
        let no_args = generate(&s).unwrap();
        s.layout = RingLayout::with_args(1, 3, Some(8), false, true).unwrap();
        s.arg_sites = Some(vec![false, true, false].into());
        let t = per_site(&s);
        let plain = COMMON_PATH_INSTRUCTIONS + TASK_INSTRUCTIONS;
        assert_eq!(no_args.common_path_instructions(), plain);
        assert_eq!(t.common_path_instructions(), plain);
        let paths: Vec<usize> = (0..3).map(|k| t.site_path(k).unwrap().len()).collect();
        assert_eq!(paths, [plain, plain + ARGS_INSTRUCTIONS, plain]);
        assert_eq!(
            t.site_path(2).unwrap().len(),
            no_args.site_path(2).unwrap().len()
        );
        // The walker finds the site's return address in either kind of body.
        for k in 0..3 {
            let path = t.site_path(k).unwrap();
            let depth = |i: usize| t.site_return_slot(path[i].ip());
            let n = path.len();
            assert_eq!((depth(0), depth(1), depth(2)), (Some(0), Some(8), Some(16)));
            assert_eq!((depth(n - 2), depth(n - 1)), (Some(8), Some(0)), "site {k}");
        }
        let mem = memory(&[0]);
        ring::init_rings(&mem, &s.layout).unwrap();
        run_task(&mem, 0, 77);
        let mut emu = Emu {
            mem: &mem,
            code: &t.code,
            tsc: 5,
        };
        let mut reader = RingReader::new(s.layout);
        for k in [0, 1, 2] {
            let mut r = regs(0);
            let want = [7, 6, 2, 1, 8, 9].map(|g| r.gpr[g]);
            let steps = emu.call(&mut r, k, PARENT, &t, &mut no_interrupt);
            assert_eq!(steps, paths[k as usize], "site {k}");
            let got = drain(&mut reader, &mem);
            assert_eq!((got.len(), got[0].1.site), (1, k));
            // A fresh ring's unselected slot holds zeros, not the registers.
            let stored = if k == 1 { want } else { [0; 6] };
            assert_eq!(got[0].1.args, Some(stored), "site {k}");
        }
        let shared = shared(&s);
        assert_eq!(
            shared.site_path(0).unwrap().len(),
            COMMON_PATH_INSTRUCTIONS + TASK_INSTRUCTIONS + ARGS_INSTRUCTIONS
        );
    }

    #[test]
    fn emulated_full_ring_counts_drops_exactly() {
        let s = spec(1, 2, 4);
        let t = generate(&s).unwrap();
        let mem = memory(&[0]);
        ring::init_rings(&mem, &s.layout).unwrap();
        let mut emu = Emu {
            mem: &mem,
            code: &t.code,
            tsc: 1,
        };
        let mut reader = RingReader::new(s.layout);
        let mut r = regs(0);
        let mut records = 0;
        let mut calls = [0u64; 2];
        // Three laps of the 4-record ring, the host draining every 10 calls.
        for n in 0..30u32 {
            let k = n % 2;
            let steps = emu.call(&mut r, k, PARENT, &t, &mut no_interrupt);
            calls[k as usize] += 1;
            assert!(
                steps == COMMON_PATH_INSTRUCTIONS || steps == DROP_PATH_INSTRUCTIONS,
                "{steps} instructions"
            );
            if n % 10 == 9 {
                let got = drain(&mut reader, &mem);
                assert_eq!(got.len(), 4, "the ring filled up between drains");
                records += got.len();
            }
        }
        let drops = ring::drops(&mem, &s.layout, 0).unwrap();
        assert_eq!(drops.iter().sum::<u64>(), 30 - 12);
        assert_eq!(records, 12);
        // Per site: records + drops = calls (each drain saw sites 0,1,0,1).
        assert_eq!(drops[0] + 6, calls[0]);
        assert_eq!(drops[1] + 6, calls[1]);
    }

    /// A CPU whose number has no ring (brought up after the attach past the
    /// CPUs the rings were made for; or a number read wrong): its calls
    /// write nothing past the rings. Each is counted as dropped in ring 0's
    /// counter for its site, entry or return, in every shape and with the
    /// function graph (not hooked), its pid filter's rejections in ring 0's
    /// filtered counter; registers are preserved.
    #[test]
    fn emulated_cpu_without_a_ring_counts_its_calls_as_dropped() {
        // CPU 2 reads 2 with 2 rings; CPU 3 the freed template's 0xcccccccc.
        let numbers = [0, 1, 2, 0xcccc_cccc];
        let plain = spec(2, 3, 4);
        for (s, t) in [
            (plain.clone(), per_site(&plain)),
            (plain.clone(), shared(&plain)),
            (
                graph_spec(2, 3, 16),
                generate(&graph_spec(2, 3, 16)).unwrap(),
            ),
        ] {
            let mem = memory(&numbers);
            ring::init_rings(&mem, &s.layout).unwrap();
            let mut emu = Emu {
                mem: &mem,
                code: &t.code,
                tsc: 7,
            };
            let mut reader = RingReader::new(s.layout);
            for cpu in [2u32, 3] {
                let mut r = regs(cpu);
                let before = r.clone();
                let slot = r.gpr[RSP] - 8;
                let steps = emu.call(&mut r, 1, PARENT, &t, &mut no_interrupt);
                for reg in (0..16).filter(|&g| g != R10 && g != R11) {
                    assert_eq!(r.gpr[reg], before.gpr[reg], "register {reg} changed");
                }
                // Not hooked: the parent's return address is still there.
                assert_eq!(emu.read(slot, 8), PARENT, "{:?}", t.shape);
                // push, push, (graph: two more), mov, cmp, jae, xor, lock
                // inc, jmp, pops, ret: shorter than a full ring's drop.
                assert!(steps < t.common_path_instructions(), "{steps}");
            }
            assert!(drain(&mut reader, &mem).is_empty(), "{:?}", t.shape);
            assert_eq!(ring::drops(&mem, &s.layout, 0).unwrap(), [0, 2, 0]);
            assert_eq!(ring::drops(&mem, &s.layout, 1).unwrap(), [0, 0, 0]);
            // The CPUs with rings still record.
            let mut r = regs(1);
            emu.call(&mut r, 0, PARENT, &t, &mut no_interrupt);
            let got = drain(&mut reader, &mem);
            assert_eq!(got.len(), 1);
            assert_eq!(got[0].0, 1);
        }
        // A hooked call that returns on a CPU without a ring: its return is
        // counted as dropped, in ring 0's return counter, and it returns.
        let s = graph_spec(2, 3, 16);
        let t = generate(&s).unwrap();
        let mem = memory(&numbers);
        ring::init_rings(&mem, &s.layout).unwrap();
        let mut emu = Emu {
            mem: &mem,
            code: &t.code,
            tsc: 7,
        };
        let mut r = regs(1);
        let slot = r.gpr[RSP] - 8;
        emu.call(&mut r, 2, PARENT, &t, &mut no_interrupt);
        let hook = emu.read(slot, 8);
        assert!(hook >= RET_STUBS_VA, "hooked: {hook:#x}");
        // The function returns on CPU 2 (migrated), into the hook.
        let mut r2 = regs(2);
        r2.gpr[RSP] = slot + 8;
        r2.gpr[0] = 0x5eed;
        r2.rip = hook;
        let mut steps = 0;
        while r2.rip != PARENT {
            emu.step(&mut r2);
            steps += 1;
            assert!(steps < 1000, "runaway return");
        }
        assert_eq!(r2.gpr[0], 0x5eed, "the return value");
        assert_eq!(ring::ret_drops(&mem, &s.layout, 0).unwrap(), [0, 0, 1]);
        // The pid filter's rejections on a CPU without a ring: ring 0's.
        let s = with_task(spec(2, 3, 4), &[9]);
        let t = per_site(&s);
        let mem = memory(&numbers);
        ring::init_rings(&mem, &s.layout).unwrap();
        let mut emu = Emu {
            mem: &mem,
            code: &t.code,
            tsc: 7,
        };
        run_task(&mem, 3, 8);
        let mut r = regs(3);
        emu.call(&mut r, 0, PARENT, &t, &mut no_interrupt);
        assert_eq!(ring::filtered(&mem, &s.layout, 0).unwrap(), 1);
    }

    /// An interrupt before every instruction of a call runs a nested traced
    /// call on the same CPU (and a host drain): both calls are recorded
    /// exactly once, and the host never reads a record before its commit.
    #[test]
    fn emulated_nested_call_at_every_instruction() {
        let s = spec(1, 2, 8);
        for t in [per_site(&s), shared(&s)] {
            nested_call_at_every_instruction(&s, &t);
        }
    }

    fn nested_call_at_every_instruction(s: &TrampolineSpec, t: &Trampoline) {
        let stub = t.common_path_instructions() - t.common_path.len();
        for at in 0..t.common_path_instructions() {
            let mem = memory(&[0]);
            ring::init_rings(&mem, &s.layout).unwrap();
            let mut emu = Emu {
                mem: &mem,
                code: &t.code,
                tsc: 100,
            };
            let mut reader = RingReader::new(s.layout);
            let mut early = Vec::new();
            let mut r = regs(0);
            let before = r.clone();
            let steps = emu.call(&mut r, 0, PARENT, t, &mut |n, emu, outer| {
                if n != at {
                    return;
                }
                // The interrupt's own traced call, on the same stack below.
                let mut nested = regs(0);
                nested.gpr[RSP] = outer.gpr[RSP] - 256;
                let steps = emu.call(&mut nested, 1, PARENT + 1, t, &mut no_interrupt);
                assert_eq!(steps, t.common_path_instructions(), "nested call at {at}");
                reader
                    .drain(emu.mem, |cpu, rec| early.push((cpu, rec)))
                    .unwrap();
            });
            // The outer call retries its reservation exactly when the
            // interrupt came after its read of head (instruction 5, counting
            // the stub's from 0) and before its cmpxchg (8): one more round
            // of cmp, jae, lea, cmpxchg, jne.
            let head_read = stub
                + t.common_path
                    .iter()
                    .position(|i| i.mnemonic() == Mnemonic::Mov && i.memory_base() == Register::R10)
                    .unwrap()
                + 1;
            let cmpxchg = stub
                + t.common_path
                    .iter()
                    .position(|i| i.mnemonic() == Mnemonic::Cmpxchg)
                    .unwrap();
            let retried = (head_read..=cmpxchg).contains(&at);
            assert_eq!(
                steps,
                t.common_path_instructions() + if retried { 5 } else { 0 },
                "{:?}: interrupt at {at}",
                t.shape
            );
            for reg in (0..16).filter(|&g| g != R10 && g != R11) {
                assert_eq!(
                    r.gpr[reg], before.gpr[reg],
                    "register {reg}, interrupt at {at}"
                );
            }
            let late = drain(&mut reader, &mem);
            let all: Vec<(u32, u64)> = early
                .iter()
                .chain(&late)
                .map(|(_, rec)| (rec.site, rec.parent))
                .collect();
            assert_eq!(all.len(), 2, "interrupt at {at}: {all:?}");
            assert!(
                all.contains(&(0, PARENT)) && all.contains(&(1, PARENT + 1)),
                "at {at}"
            );
            // The early drain saw only committed records: the nested one
            // alone if it reserved first, nothing if the outer call held the
            // first slot uncommitted, both if the outer call had committed.
            let early_sites: Vec<u32> = early.iter().map(|(_, rec)| rec.site).collect();
            assert!(
                [vec![], vec![1], vec![0, 1]].contains(&early_sites),
                "interrupt at {at}: early drain saw {early_sites:?}"
            );
            assert_eq!(ring::drops(&mem, &s.layout, 0).unwrap(), [0, 0]);
        }
    }

    // ---- the function graph's paths ----------------------------------------

    /// A graph trampoline for `cpus` CPUs (CPU i has number i), its code,
    /// and guest memory with its rings set up.
    fn graph_setup(
        cpus: u32,
        sites: usize,
        cap: u64,
    ) -> (TrampolineSpec, Trampoline, GuestMemoryMmap) {
        let s = graph_spec(cpus as usize, sites, cap);
        let t = generate(&s).unwrap();
        let numbers: Vec<u32> = (0..cpus).collect();
        let mem = memory(&numbers);
        ring::init_rings(&mem, &s.layout).unwrap();
        (s, t, mem)
    }

    /// Runs a hooked function's return: RIP at the address its `ret` pops
    /// (the slot's content), until execution reaches `caller`. Returns the
    /// instructions executed.
    fn emulated_return(emu: &mut Emu, r: &mut Regs, caller: u64) -> usize {
        r.rip = emu.pop(r);
        let mut steps = 0;
        while r.rip != caller {
            emu.step(r);
            steps += 1;
            assert!(steps < 1000, "runaway return path");
        }
        steps
    }

    #[test]
    fn graph_paths_have_the_documented_length_and_touch_only_what_they_may() {
        let t = generate(&graph_spec(2, 3, 16)).unwrap();
        assert_eq!(t.code.len() as u64, CODE_LEN);
        assert_eq!(t.common_path_instructions(), GRAPH_ENTRY_INSTRUCTIONS);
        assert_eq!(t.return_path.len(), GRAPH_RETURN_INSTRUCTIONS);
        use Mnemonic::*;
        // The return path leaves through call + mov + ret (no indirect
        // jump; the call and the ret pair up in the return stack buffer).
        let tail: Vec<Mnemonic> = mnemonics(&t.return_path[t.return_path.len() - 5..]);
        assert_eq!(tail, [Pop, Pop, Call, Mov, Ret]);
        // Every return stub: mov r11d, j; jmp to the return path's start.
        let ret_common = t.return_path[2].ip();
        for j in [0u64, 1, FRAMES / 2, FRAMES - 1] {
            let va = RET_STUBS_VA + j * FRAME_LEN;
            let off = (va - CODE_VA) as usize;
            let mut d = Decoder::with_ip(64, &t.code[off..], va, DecoderOptions::NONE);
            let mov = d.decode();
            assert_eq!(
                (mov.op0_register(), u64::from(mov.immediate32())),
                (Register::R11D, j)
            );
            assert_eq!(d.decode().near_branch_target(), ret_common);
        }
        // Entry saves rax, rdx, rcx, rsi; the return only rax and rdx.
        let pushes = |p: &[Instruction]| -> Vec<Register> {
            p.iter()
                .filter(|i| i.mnemonic() == Push)
                .map(|i| i.op0_register())
                .collect()
        };
        assert_eq!(
            pushes(&t.common_path),
            [Register::RAX, Register::RDX, Register::RCX, Register::RSI]
        );
        assert_eq!(pushes(&t.return_path), [Register::RAX, Register::RDX]);
    }

    #[test]
    fn emulated_graph_call_hooks_the_return_and_returns_to_the_caller() {
        let (s, t, mem) = graph_setup(2, 3, 16);
        let mut emu = Emu {
            mem: &mem,
            code: &t.code,
            tsc: 0x10_0000,
        };
        let mut reader = RingReader::new(s.layout);
        for (round, (cpu, k)) in [(1u32, 2u32), (0, 0), (1, 1)].into_iter().enumerate() {
            let mut r = regs(cpu);
            let before = r.clone();
            let entry_rsp = r.gpr[RSP];
            let slot = entry_rsp - 8;
            let caller = PARENT + u64::from(k);
            let steps = emu.call(&mut r, k, caller, &t, &mut no_interrupt);
            assert_eq!(steps, GRAPH_ENTRY_INSTRUCTIONS);
            for reg in 0..16 {
                if reg != R10 && reg != R11 {
                    assert_eq!(r.gpr[reg], before.gpr[reg], "entry changed register {reg}");
                }
            }
            // The function's return address is now its frame's stub.
            let stub = emu.read(slot, 8);
            assert_eq!(stub, RET_STUBS_VA + round as u64 * FRAME_LEN);
            // The function returns a value in rax:rdx; its `ret` pops the stub.
            r.gpr[RSP] = slot;
            r.gpr[0] = 0xaaaa_0000 + round as u64;
            r.gpr[2] = 0xdddd_0000 + round as u64;
            let at_return = r.clone();
            let steps = emulated_return(&mut emu, &mut r, caller);
            assert_eq!(steps, GRAPH_RETURN_INSTRUCTIONS);
            assert_eq!(r.gpr[RSP], entry_rsp, "the caller's stack");
            // rax, rdx and the callee-saved registers survive the return.
            for reg in [0usize, 2, 3, 5, 12, 13, 14, 15] {
                assert_eq!(
                    r.gpr[reg], at_return.gpr[reg],
                    "return changed register {reg}"
                );
            }
            // The frame is free again.
            let frame = DATA_VA + FRAMES_OFF + round as u64 * FRAME_LEN;
            assert_eq!(emu.read(frame + FRAME_BUSY, 4), 0);
            let got = drain(&mut reader, &mem);
            assert_eq!(got.len(), 2);
            let (entry, ret) = (got[0].1, got[1].1);
            assert_eq!((got[0].0, got[1].0), (cpu as usize, cpu as usize));
            assert_eq!((entry.site, entry.slot, entry.parent), (k, slot, caller));
            assert_eq!((ret.site, ret.slot, ret.parent), (k, slot | 1, caller));
            assert!(ret.tsc > entry.tsc);
        }
        assert_eq!(ring::ret_drops(&mem, &s.layout, 1).unwrap(), [0, 0, 0]);
    }

    #[test]
    fn emulated_graph_tail_call_returns_through_both_frames() {
        let (s, t, mem) = graph_setup(1, 2, 16);
        let mut emu = Emu {
            mem: &mem,
            code: &t.code,
            tsc: 1,
        };
        let mut r = regs(0);
        let entry_rsp = r.gpr[RSP];
        let slot = entry_rsp - 8;
        // f0 is called from PARENT and hooked (frame 0) ...
        emu.call(&mut r, 0, PARENT, &t, &mut no_interrupt);
        let hook0 = emu.read(slot, 8);
        // ... and jumps to f1, whose entry finds frame 0's stub as its
        // return address: f1 is hooked on top (frame 1).
        r.gpr[RSP] = entry_rsp;
        emu.call(&mut r, 1, hook0, &t, &mut no_interrupt);
        assert_eq!(emu.read(slot, 8), RET_STUBS_VA + FRAME_LEN);
        // f1's ret goes through frame 1, then frame 0, then to PARENT.
        r.gpr[RSP] = slot;
        let steps = emulated_return(&mut emu, &mut r, PARENT);
        assert_eq!(steps, 2 * GRAPH_RETURN_INSTRUCTIONS);
        assert_eq!(r.gpr[RSP], entry_rsp);
        let mut reader = RingReader::new(s.layout);
        let got: Vec<(u32, u64, u64)> = drain(&mut reader, &mem)
            .iter()
            .map(|(_, rec)| (rec.site, rec.slot, rec.parent))
            .collect();
        assert_eq!(
            got,
            [
                (0, slot, PARENT),
                (1, slot, hook0),
                (1, slot | 1, hook0),
                (0, slot | 1, PARENT)
            ]
        );
    }

    #[test]
    fn emulated_graph_busy_frame_and_full_ring() {
        let (s, t, mem) = graph_setup(1, 2, 2);
        let mut emu = Emu {
            mem: &mem,
            code: &t.code,
            tsc: 1,
        };
        // Frame 0 is busy (a call that never returned): the next ticket,
        // 0, finds it so and the call is recorded unhooked.
        emu.write(DATA_VA + FRAMES_OFF + FRAME_BUSY, 4, 1);
        let mut r = regs(0);
        let slot = r.gpr[RSP] - 8;
        emu.call(&mut r, 1, PARENT, &t, &mut no_interrupt);
        assert_eq!(emu.read(slot, 8), PARENT, "not hooked");
        // Ring of 2: the second call is recorded and hooked (frame 1); a
        // third finds the ring full: counted, not hooked.
        let mut r = regs(0);
        emu.call(&mut r, 0, PARENT, &t, &mut no_interrupt);
        assert_eq!(emu.read(slot, 8), RET_STUBS_VA + FRAME_LEN);
        let mut r2 = regs(0);
        r2.gpr[RSP] -= 256;
        let slot2 = r2.gpr[RSP] - 8;
        emu.call(&mut r2, 0, PARENT, &t, &mut no_interrupt);
        assert_eq!(emu.read(slot2, 8), PARENT, "ring full: not hooked");
        assert_eq!(ring::drops(&mem, &s.layout, 0).unwrap(), [1, 0]);
        // The hooked call's return finds the ring still full: counted.
        r.gpr[RSP] = slot;
        emulated_return(&mut emu, &mut r, PARENT);
        assert_eq!(ring::ret_drops(&mem, &s.layout, 0).unwrap(), [1, 0]);
        let mut reader = RingReader::new(s.layout);
        let got: Vec<(u32, u64)> = drain(&mut reader, &mem)
            .iter()
            .map(|(_, rec)| (rec.site, rec.slot))
            .collect();
        assert_eq!(got, [(1, 0), (0, slot)]);
    }

    // ---- returning as the kernel does (`ret`) -------------------------------

    fn with_ret(s: TrampolineSpec, depth: bool) -> TrampolineSpec {
        TrampolineSpec {
            ret: Return {
                depth: depth.then_some(DEPTH_DISP),
                thunk: Some(if depth { DEPTH_THUNK_VA } else { THUNK_VA }),
            },
            ..s
        }
    }

    #[test]
    fn a_recorded_call_returns_through_the_kernels_thunk() {
        use Mnemonic::*;
        let body = [
            Push, Push, Mov, Cmp, Jae, Mov, Mov, Cmp, Jae, Lea, Cmpxchg, Jne, And, Add, Mov, Mov,
            Rdtsc, Mov, Mov, Mov, Pop, Pop,
        ];
        for depth in [false, true] {
            let s = with_ret(spec(2, 3, 16), depth);
            for t in [per_site(&s), shared(&s)] {
                let path = mnemonics(&t.common_path);
                let tail: &[Mnemonic] = if depth { &[Sar, Jmp] } else { &[Jmp] };
                assert_eq!(path, [&body[..], tail].concat(), "{:?}", t.shape);
                let jmp = t.common_path.last().unwrap();
                assert_eq!(jmp.code(), Code::Jmp_rel32_64);
                assert_eq!(jmp.near_branch_target(), s.ret.thunk.unwrap());
                if depth {
                    // CALL_DEPTH_ACCOUNT: sar qword gs:[__x86_call_depth], 5.
                    let sar = &t.common_path[t.common_path.len() - 2];
                    assert_eq!(sar.segment_prefix(), Register::GS);
                    assert_eq!(sar.memory_displacement64(), DEPTH_DISP as u64);
                    assert_eq!((sar.memory_size().size(), sar.immediate8()), (8, 5));
                }
                // One more instruction with depth tracking, none for the jmp.
                let base = match t.shape {
                    Shape::PerSite => COMMON_PATH_INSTRUCTIONS,
                    Shape::Shared => SHARED_PATH_INSTRUCTIONS,
                };
                assert_eq!(t.common_path_instructions(), base + usize::from(depth));
                // No bare ret is left anywhere in the code.
                assert!(decode_all(&t.code, t.table)
                    .iter()
                    .all(|i| i.mnemonic() != Ret));
            }
        }
        // Out of reach of a rel32 from the code page: refused, never an
        // indirect jump.
        let mut s = with_ret(spec(1, 1, 2), false);
        s.ret.thunk = Some(0xffff_ffff_0000_0000);
        assert!(matches!(
            generate(&s),
            Err(TrampolineError::ThunkOutOfReach(0xffff_ffff_0000_0000))
        ));
    }

    /// Runs calls through each shape with the kernel's thunk: each returns
    /// through it once, the depth count ends where it began, and the calls
    /// are recorded as with `ret`.
    #[test]
    fn emulated_calls_go_through_the_thunk_and_keep_the_depth_balanced() {
        for depth in [false, true] {
            let s = with_ret(spec(2, 3, 16), depth);
            for t in [per_site(&s), shared(&s)] {
                let mem = memory(&[0, 1]);
                ring::init_rings(&mem, &s.layout).unwrap();
                let start = 1u64 << 40;
                for cpu in 0..2 {
                    mem.write_obj(start, GuestAddress(gs_base(cpu) + DEPTH_DISP as u64))
                        .unwrap();
                }
                let mut emu = Emu {
                    mem: &mem,
                    code: &t.code,
                    tsc: 7,
                };
                let mut reader = RingReader::new(s.layout);
                for (n, (cpu, k)) in [(1u32, 2u32), (0, 0), (1, 1)].into_iter().enumerate() {
                    let mut r = regs(cpu);
                    let before = r.clone();
                    let steps = emu.call(&mut r, k, PARENT, &t, &mut no_interrupt);
                    // The path, then the thunk (one emulated step).
                    assert_eq!(steps, t.common_path_instructions() + 1);
                    assert_eq!(emu.read(THUNK_HITS, 8), n as u64 + 1);
                    let at = gs_base(cpu) + DEPTH_DISP as u64;
                    assert_eq!(emu.read(at, 8), start, "depth, {:?}", t.shape);
                    for reg in (0..16).filter(|&g| g != R10 && g != R11) {
                        assert_eq!(r.gpr[reg], before.gpr[reg], "register {reg}");
                    }
                    let got = drain(&mut reader, &mem);
                    assert_eq!(got.len(), 1);
                    assert_eq!((got[0].0, got[0].1.site), (cpu as usize, k));
                }
                mem.write_obj(0u64, GuestAddress(THUNK_HITS)).unwrap();
            }
        }
    }

    /// The graph's entry returns as a recorded call does; its return path
    /// goes back to the caller by `call; mov [rsp]; jmp thunk`, or, with
    /// call depth tracking, by `call; mov [rsp]; ret`, which the thunk
    /// never sees.
    #[test]
    fn emulated_graph_returns_as_ftraces_return_to_handler() {
        use Mnemonic::*;
        for depth in [false, true] {
            let s = with_ret(graph_spec(1, 2, 16), depth);
            let t = generate(&s).unwrap();
            let n = t.return_path.len();
            assert_eq!(n, GRAPH_RETURN_INSTRUCTIONS);
            let last = if depth { Ret } else { Jmp };
            assert_eq!(
                mnemonics(&t.return_path[n - 5..]),
                [Pop, Pop, Call, Mov, last]
            );
            let mem = memory(&[0]);
            ring::init_rings(&mem, &s.layout).unwrap();
            let start = 1u64 << 40;
            mem.write_obj(start, GuestAddress(gs_base(0) + DEPTH_DISP as u64))
                .unwrap();
            let mut emu = Emu {
                mem: &mem,
                code: &t.code,
                tsc: 7,
            };
            let mut r = regs(0);
            let entry_rsp = r.gpr[RSP];
            let slot = entry_rsp - 8;
            let steps = emu.call(&mut r, 1, PARENT, &t, &mut no_interrupt);
            assert_eq!(steps, t.common_path_instructions() + 1);
            assert_eq!(emu.read(THUNK_HITS, 8), 1);
            r.gpr[RSP] = slot;
            let steps = emulated_return(&mut emu, &mut r, PARENT);
            // With depth tracking the return pairs its own call and ret.
            let thunk = usize::from(!depth);
            assert_eq!(steps, n + thunk);
            assert_eq!(emu.read(THUNK_HITS, 8), 1 + thunk as u64);
            assert_eq!(r.gpr[RSP], entry_rsp);
            assert_eq!(emu.read(gs_base(0) + DEPTH_DISP as u64, 8), start);
            let mut reader = RingReader::new(s.layout);
            let got: Vec<(u32, u64)> = drain(&mut reader, &mem)
                .iter()
                .map(|(_, rec)| (rec.site, rec.slot))
                .collect();
            assert_eq!(got, [(1, slot), (1, slot | 1)]);
        }
    }

    // ---- an event's strings copied at the event ---------------------------

    fn event(name: &str, args: &[(&str, &str)]) -> crate::kernel::events::fields::EventFormat {
        use crate::kernel::events::KernelEvent;
        let system = if name == "task_rename" {
            "task"
        } else {
            "sched"
        };
        crate::kernel::events::fields::EventFormat::of(&KernelEvent::declared(
            system, name, args, None,
        ))
        .unwrap()
    }

    /// The structures' offsets the emulated events' copies use.
    fn field_offsets() -> crate::kernel::events::fields::FieldOffsets {
        crate::kernel::events::fields::FieldOffsets {
            comm: 0x10,
            pid: 0x20,
            tgid: 0x24,
            prio: 0x28,
            exit_state: 0x2c,
            cpu: None,
            signal: 0x38,
            oom_score_adj: 0x8,
            filename: 0x40,
        }
    }

    // An event's strings copied at the event.
    mod strings;
    // A syscall event's arguments copied at the event.
    mod words;
}
