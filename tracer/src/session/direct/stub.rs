//! A direct entry's stub: the code a function's first instructions jump
//! to, in vmtrace's code page. Per site, in a slot of its own:
//!
//! ```text
//! stub:   out 0xe5, al ; nop3     (trap mode, and `--stack` sites: the trap,
//!                                  resumed at stub + 5)
//!    or   call <site's body>      (exitless mode: what an ftrace site calls)
//!         <displaced instructions, relocated>
//!         jmp  site + len         (back to the function's first instruction
//!                                  not displaced)
//! ```
//!
//! A displaced `call` (always the last displaced instruction: the
//! analysis refuses others, `call-not-last`) becomes `push site + len`
//! and a `jmp` to its target, direct or through its own operand: the
//! called function returns into the kernel's own code right after the
//! displaced bytes, where the call would have returned in place, so no
//! return address on a guest stack points into vmtrace's page (the
//! guest's ORC unwinder, `_RET_IP_` and livepatch's reliable stack check
//! read them). Nothing follows it in the stub.
//!
//! The displaced instructions are the running kernel's (decoded at their
//! running addresses), re-encoded by iced-x86's block encoder at the
//! stub's address: RIP-relative operands and branch targets keep their
//! absolute targets (a short branch is widened when it no longer
//! reaches). An ftrace site displaced as a NOP runs nothing in the stub.
//! Nothing in a stub pushes or pops before the record, so the recording
//! code finds the function's return address where an ftrace site would
//! leave it (`[rsp]` at the trap, `[rsp + 8]` in the called body).

use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, IcedError, Instruction, InstructionBlock, Mnemonic,
    OpKind, Register,
};

use crate::plan::exitless::layout::STUB_SLOT;
use crate::plan::traps::TRAP;

/// How a stub records its call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Head {
    /// The trap (`out` to the trace port, then a 3-byte NOP never run).
    Trap,
    /// `call` to the exitless code for the site at this address.
    Call(u64),
}

/// Why a stub could not be made.
#[derive(Debug, thiserror::Error)]
pub enum StubError {
    #[error("the stub for {site:#x} cannot be encoded at {stub:#x}: {source}")]
    Encode {
        site: u64,
        stub: u64,
        source: IcedError,
    },
    #[error("the stub for {site:#x} needs {len} bytes, more than a slot's {STUB_SLOT}")]
    TooLong { site: u64, len: usize },
    #[error(
        "the stub for {site:#x} cannot push the return address {ret:#x}: \
         `push imm32` reaches only the top 2 GiB, where the kernel is"
    )]
    ReturnOutOfReach { site: u64, ret: u64 },
    #[error(
        "the stub for {site:#x} cannot relocate its displaced call `{insn}`: \
         its operand depends on the stack slot the return address takes"
    )]
    CallOperand { site: u64, insn: String },
}

/// The stub of the site at `site` (running address) whose displaced
/// instructions, `len` bytes, are `displaced` (decoded at their running
/// addresses; empty for an ftrace NOP), placed at `stub`.
pub fn build(
    site: u64,
    len: usize,
    displaced: &[Instruction],
    head: Head,
    stub: u64,
) -> Result<Vec<u8>, StubError> {
    let encode = |source| StubError::Encode { site, stub, source };
    let mut insns = Vec::with_capacity(displaced.len() + 2);
    insns.push(match head {
        Head::Trap => Instruction::with_declare_byte_5(TRAP[0], TRAP[1], TRAP[2], TRAP[3], TRAP[4]),
        Head::Call(target) => {
            Instruction::with_branch(Code::Call_rel32_64, target).map_err(encode)?
        }
    });
    let ret = site + len as u64;
    match displaced.split_last() {
        Some((call, before)) if is_call(call) => {
            insns.extend_from_slice(before);
            insns.extend(call_in_place(site, stub, ret, call)?);
        }
        _ => {
            insns.extend_from_slice(displaced);
            // Back to the function's first instruction not displaced.
            insns.push(Instruction::with_branch(Code::Jmp_rel32_64, ret).map_err(encode)?);
        }
    }
    let block = InstructionBlock::new(&insns, stub);
    let code = BlockEncoder::encode(64, block, BlockEncoderOptions::NONE)
        .map_err(encode)?
        .code_buffer;
    if code.len() as u64 > STUB_SLOT {
        return Err(StubError::TooLong {
            site,
            len: code.len(),
        });
    }
    Ok(code)
}

/// A call, direct or through a register or memory (the analysis admits
/// near ones only); not `syscall`, which iced's flow control counts too.
fn is_call(i: &Instruction) -> bool {
    i.mnemonic() == Mnemonic::Call
}

/// The lowest address `push imm32` pushes: its immediate is sign-extended
/// to 64 bits, so it gives any address of the top 2 GiB, where the kernel
/// text is linked and KASLR keeps it (Documentation/arch/x86/x86_64/mm.rst:
/// kernel text mapping from 0xffffffff80000000).
const PUSH_IMM32_FROM: u64 = 0xffff_ffff_8000_0000;

/// The displaced `call` of the site at `site` as the stub runs it: the
/// return address it would have pushed in place (`ret`, right after the
/// displaced bytes) pushed, then a jump to its target.
fn call_in_place(
    site: u64,
    stub: u64,
    ret: u64,
    call: &Instruction,
) -> Result<[Instruction; 2], StubError> {
    if ret < PUSH_IMM32_FROM {
        return Err(StubError::ReturnOutOfReach { site, ret });
    }
    let encode = |source| StubError::Encode { site, stub, source };
    let bad_operand = || StubError::CallOperand {
        site,
        insn: call.to_string(),
    };
    // push imm32: the low 32 bits of `ret`, sign-extended back to it.
    let push = Instruction::with1(Code::Pushq_imm32, ret as u32 as i32).map_err(encode)?;
    let jmp = match call.op0_kind() {
        // call rel32 -> jmp rel32 to the same target (the block encoder
        // re-encodes it to reach from the stub).
        OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64 => {
            Instruction::with_branch(Code::Jmp_rel32_64, call.near_branch_target())
                .map_err(encode)?
        }
        // call reg -> jmp reg: the push changes no register but RSP.
        OpKind::Register if call.op0_register() != Register::RSP => {
            let mut j = *call;
            j.set_code(Code::Jmp_rm64);
            j
        }
        // call [mem] -> jmp [mem]: the same memory, read after the push.
        // The push writes only below the stack pointer, where the kernel
        // keeps nothing (it has no red zone, -mno-red-zone), and moves RSP
        // down 8: an RSP-based operand is moved up 8 to read what the call
        // would have read. RIP-relative operands keep their absolute
        // target (the block encoder rebases them).
        OpKind::Memory => {
            let mut j = *call;
            j.set_code(Code::Jmp_rm64);
            if j.memory_index() == Register::RSP {
                return Err(bad_operand());
            }
            if j.memory_base() == Register::RSP {
                let disp = j.memory_displacement64() as i64;
                // [rsp - 8, rsp): the slot the push takes.
                if (-8..0).contains(&disp) {
                    return Err(bad_operand());
                }
                let moved = disp.checked_add(8).filter(|d| i32::try_from(*d).is_ok());
                let moved = moved.ok_or_else(bad_operand)?;
                j.set_memory_displacement64(moved as u64);
                j.set_memory_displ_size(if i8::try_from(moved).is_ok() { 1 } else { 4 });
            }
            j
        }
        _ => return Err(bad_operand()),
    };
    Ok([push, jmp])
}

/// `jmp rel32` from `site` to `stub`: what a direct site holds while traced.
pub fn jump(site: u64, stub: u64) -> Option<[u8; 5]> {
    let rel = i32::try_from(i128::from(stub) - (i128::from(site) + 5)).ok()?;
    let r = rel.to_le_bytes();
    Some([0xe9, r[0], r[1], r[2], r[3]])
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions};

    const SITE: u64 = 0xffff_ffff_8100_1000;
    const STUB: u64 = 0xffff_ffff_ff9f_0000;

    fn decode_at(code: &[u8], ip: u64) -> Vec<Instruction> {
        let mut d = Decoder::with_ip(64, code, ip, DecoderOptions::NONE);
        let mut v = Vec::new();
        while d.can_decode() {
            v.push(d.decode());
        }
        v
    }

    #[test]
    fn a_trap_stub_relocates_a_rip_relative_load_and_jumps_back() {
        // mov rax, [rip + 0x100]  (7 bytes): reads SITE + 7 + 0x100.
        let bytes = [0x48, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00];
        let displaced = decode_at(&bytes, SITE);
        let code = build(SITE, 7, &displaced, Head::Trap, STUB).unwrap();
        assert_eq!(&code[..5], &TRAP);
        let insns = decode_at(&code[5..], STUB + 5);
        assert_eq!(insns.len(), 2);
        assert_eq!(insns[0].mnemonic(), Mnemonic::Mov);
        assert!(insns[0].is_ip_rel_memory_operand());
        assert_eq!(insns[0].ip_rel_memory_address(), SITE + 7 + 0x100);
        assert_eq!(insns[1].mnemonic(), Mnemonic::Jmp);
        assert_eq!(insns[1].near_branch_target(), SITE + 7);
    }

    #[test]
    fn an_exitless_stub_calls_the_body_and_widens_a_short_branch() {
        // test edi, edi ; je +0x20 (short)  : 4 bytes ; push rbp : 5 bytes.
        let bytes = [0x85, 0xff, 0x74, 0x20, 0x55];
        let displaced = decode_at(&bytes, SITE);
        let body = 0xffff_ffff_ff80_0040;
        let code = build(SITE, 5, &displaced, Head::Call(body), STUB).unwrap();
        let insns = decode_at(&code, STUB);
        let m: Vec<Mnemonic> = insns.iter().map(|i| i.mnemonic()).collect();
        assert_eq!(
            m,
            [
                Mnemonic::Call,
                Mnemonic::Test,
                Mnemonic::Je,
                Mnemonic::Push,
                Mnemonic::Jmp
            ]
        );
        assert_eq!(insns[0].near_branch_target(), body);
        assert_eq!(insns[2].near_branch_target(), SITE + 4 + 0x20);
        assert_eq!(insns[2].len(), 6, "the short je is widened to reach");
        assert_eq!(insns[4].near_branch_target(), SITE + 5);
    }

    #[test]
    fn an_ftrace_nop_stub_only_records_and_jumps_back() {
        let code = build(SITE, 5, &[], Head::Trap, STUB).unwrap();
        let insns = decode_at(&code[5..], STUB + 5);
        assert_eq!(insns.len(), 1);
        assert_eq!(insns[0].near_branch_target(), SITE + 5);
    }

    #[test]
    fn the_site_jump_reaches_the_stub() {
        let j = jump(SITE, STUB).unwrap();
        let i = decode_at(&j, SITE);
        assert_eq!(i[0].mnemonic(), Mnemonic::Jmp);
        assert_eq!(i[0].near_branch_target(), STUB);
        assert_eq!(jump(0x1000, 0xffff_ffff_ff80_0000), None);
    }

    /// The value a `push imm32` pushes (its immediate, sign-extended).
    fn pushed(i: &Instruction) -> u64 {
        assert_eq!(i.code(), Code::Pushq_imm32, "{i}");
        i.immediate32to64() as u64
    }

    #[test]
    fn a_displaced_direct_call_pushes_the_kernels_return_address() {
        // push rbp ; call rel32 (to SITE + 0x1000): 6 bytes, the call last.
        let bytes = [0x55, 0xe8, 0xfa, 0x0f, 0x00, 0x00];
        let displaced = decode_at(&bytes, SITE);
        assert_eq!(displaced[1].near_branch_target(), SITE + 0x1000);
        let code = build(SITE, 6, &displaced, Head::Trap, STUB).unwrap();
        let insns = decode_at(&code[5..], STUB + 5);
        let m: Vec<Mnemonic> = insns.iter().map(|i| i.mnemonic()).collect();
        // push rbp ; push SITE + 6 ; jmp target: nothing after it.
        assert_eq!(m, [Mnemonic::Push, Mnemonic::Push, Mnemonic::Jmp]);
        assert_eq!(pushed(&insns[1]), SITE + 6);
        assert_eq!(insns[2].near_branch_target(), SITE + 0x1000);
    }

    #[test]
    fn a_displaced_indirect_call_jumps_through_the_same_operand() {
        // push rbp ; call [rsp + 0x10]: the operand read as in place, the
        // pushed return address taking 8 bytes of stack first.
        let bytes = [0x55, 0xff, 0x54, 0x24, 0x10];
        let code = build(SITE, 5, &decode_at(&bytes, SITE), Head::Trap, STUB).unwrap();
        let insns = decode_at(&code[5..], STUB + 5);
        assert_eq!(insns.len(), 3);
        assert_eq!(pushed(&insns[1]), SITE + 5);
        assert_eq!(insns[2].code(), Code::Jmp_rm64);
        assert_eq!(insns[2].memory_base(), Register::RSP);
        assert_eq!(insns[2].memory_displacement64(), 0x18);
        // call [rip + 0x100] (6 bytes): the same absolute slot.
        let bytes = [0xff, 0x15, 0x00, 0x01, 0x00, 0x00];
        let code = build(SITE, 6, &decode_at(&bytes, SITE), Head::Trap, STUB).unwrap();
        let insns = decode_at(&code[5..], STUB + 5);
        assert_eq!(pushed(&insns[0]), SITE + 6);
        assert_eq!(insns[1].code(), Code::Jmp_rm64);
        assert_eq!(insns[1].ip_rel_memory_address(), SITE + 6 + 0x100);
        // xor eax,eax ; nop ; call rax (2 + 1 + 2 bytes).
        let bytes = [0x31, 0xc0, 0x90, 0xff, 0xd0];
        let code = build(SITE, 5, &decode_at(&bytes, SITE), Head::Trap, STUB).unwrap();
        let insns = decode_at(&code[5..], STUB + 5);
        assert_eq!(insns.len(), 4);
        assert_eq!(pushed(&insns[2]), SITE + 5);
        assert_eq!(insns[3].code(), Code::Jmp_rm64);
        assert_eq!(insns[3].op0_register(), Register::RAX);
    }

    #[test]
    fn a_call_whose_return_address_cannot_be_pushed_is_refused() {
        // Below the top 2 GiB, `push imm32` cannot give the address.
        let low = 0xffff_ffff_7000_0000;
        let bytes = [0x55, 0xe8, 0xfa, 0x0f, 0x00, 0x00];
        let r = build(low, 6, &decode_at(&bytes, low), Head::Trap, STUB);
        assert!(
            matches!(r, Err(StubError::ReturnOutOfReach { .. })),
            "{r:?}"
        );
        // call [rsp - 8]: the slot the push takes.
        let bytes = [0x55, 0xff, 0x54, 0x24, 0xf8];
        let r = build(SITE, 5, &decode_at(&bytes, SITE), Head::Trap, STUB);
        assert!(matches!(r, Err(StubError::CallOperand { .. })), "{r:?}");
    }

    #[test]
    fn a_per_cpu_operand_reaches_its_offset_by_wrapping() {
        // mov rax, gs:[rip + disp32] whose target is 0x35000, a per-CPU
        // variable's offset: the displacement wraps past 0.
        let target = 0x35000u64;
        let disp = target.wrapping_sub(SITE + 8) as u32;
        let d = disp.to_le_bytes();
        let bytes = [0x65, 0x48, 0x8b, 0x05, d[0], d[1], d[2], d[3], 0x55];
        let displaced = decode_at(&bytes, SITE);
        assert_eq!(displaced[0].ip_rel_memory_address(), target);
        let code = build(SITE, 9, &displaced, Head::Trap, STUB).unwrap();
        let insns = decode_at(&code[5..], STUB + 5);
        assert_eq!(insns[0].segment_prefix(), Register::GS);
        assert_eq!(insns[0].ip_rel_memory_address(), target);
        assert_eq!(insns[2].near_branch_target(), SITE + 9);
    }
}
