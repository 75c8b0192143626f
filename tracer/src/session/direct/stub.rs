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
//! The displaced instructions are the running kernel's (decoded at their
//! running addresses), re-encoded by iced-x86's block encoder at the
//! stub's address: RIP-relative operands and branch targets keep their
//! absolute targets (a short branch is widened when it no longer
//! reaches). An ftrace site displaced as a NOP runs nothing in the stub.
//! Nothing in a stub pushes or pops before the record, so the recording
//! code finds the function's return address where an ftrace site would
//! leave it (`[rsp]` at the trap, `[rsp + 8]` in the called body).

use iced_x86::{BlockEncoder, BlockEncoderOptions, Code, IcedError, Instruction, InstructionBlock};

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
    insns.extend_from_slice(displaced);
    insns.push(Instruction::with_branch(Code::Jmp_rel32_64, site + len as u64).map_err(encode)?);
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

/// `jmp rel32` from `site` to `stub`: what a direct site holds while traced.
pub fn jump(site: u64, stub: u64) -> Option<[u8; 5]> {
    let rel = i32::try_from(i128::from(stub) - (i128::from(site) + 5)).ok()?;
    let r = rel.to_le_bytes();
    Some([0xe9, r[0], r[1], r[2], r[3]])
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions, Mnemonic};

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
}
