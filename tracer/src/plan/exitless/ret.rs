//! How vmtrace's guest code returns: as the guest kernel's own ftrace code
//! returns, for the return mitigations the guest has enabled.
//!
//! A site's `call` into vmtrace replaces the `call __fentry__` the compiler
//! put there, so vmtrace's code returns the way the kernel's `__fentry__`
//! does (arch/x86/kernel/ftrace_64.S: `CALL_DEPTH_ACCOUNT; RET`), as read
//! from the running kernel at attach (`Return::from_fentry`):
//!
//! - `RET` is `ret; int3` (the `int3` stops straight-line speculation past
//!   the `ret`, `CONFIG_MITIGATION_SLS`; it never runs), or, when the kernel
//!   uses return thunks (`X86_FEATURE_RETHUNK`: retbleed's unret, SRSO,
//!   call depth tracking, ITS), `jmp x86_return_thunk`: the kernel rewrote
//!   every return site (`.return_sites`, `apply_returns`) to one of these at
//!   boot, so `__fentry__`'s own return says which, and where the thunk is.
//!   ftrace's dynamic trampolines end the same way (`create_trampoline`).
//!   With ITS's thunk (`its_return_thunk`) the kernel keeps a plain `ret`
//!   where a return's address allows it (bit 5 clear,
//!   `cpu_wants_rethunk_at`), so a plain `ret` in `__fentry__` at an
//!   address with bit 5 set may be a return ITS rewrote there, not one the
//!   kernel keeps everywhere: vmtrace's returns, at other addresses, then
//!   jump to `its_return_thunk` (safe at any address; if the kernel has
//!   no return thunks at all it only costs a jump).
//! - `CALL_DEPTH_ACCOUNT` (`sar qword gs:[__x86_call_depth], 5`, patched in
//!   only with `X86_FEATURE_CALL_DEPTH`) accounts for the site's call, which
//!   no call thunk saw: the return thunk then `shl`s the depth back, and the
//!   count the kernel keeps of the return stack buffer stays balanced.
//!
//! The function graph's return (vmtrace's return stubs, reached by the
//! traced function's own return) goes back to the caller as ftrace's
//! `return_to_handler` does, always: `call 1f; int3; 1: mov [rsp], rcx;
//! RET`, whose call and return pair up in the return stack buffer, which
//! the caller's own return then still predicts. With call depth tracking
//! that RET is a plain `ret; int3`, leaving the depth count alone (the
//! function's own return already went through the thunk).
//!
//! Costs per recorded call, counted in vmtrace's code: none for `int3`
//! (never runs) and none for `jmp` to a thunk (it replaces the `ret`; the
//! thunk's own instructions are the kernel's, as after every kernel
//! function); one (`sar`) with call depth tracking (not on the graph's
//! return path, whose `call` is counted in its length).

use iced_x86::code_asm::{qword_ptr, rcx, rsp, CodeAssembler};
use iced_x86::{Decoder, DecoderOptions, FlowControl, IcedError, Mnemonic, OpKind, Register};

use crate::advice::{Plain, Remedy, TracerAdvice, TracerWords};

use super::disasm::format_instruction;

/// How vmtrace's code returns to the traced function.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Return {
    /// Call depth tracking: the `gs:[disp32]` displacement of the kernel's
    /// `__x86_call_depth`, shifted right by 5 before returning.
    pub depth: Option<i32>,
    /// The kernel's return thunk (`x86_return_thunk`'s target), jumped to
    /// instead of `ret`.
    pub thunk: Option<u64>,
}

/// Why the guest's `__fentry__` does not say how to return.
#[derive(Debug, thiserror::Error)]
pub enum ReturnError {
    #[error("{}", self.say(&Plain))]
    Unknown { va: u64, insn: String },
}

impl TracerAdvice for ReturnError {
    fn problem(&self, _: &dyn TracerWords) -> String {
        let ReturnError::Unknown { va, insn } = self;
        format!(
            "the guest's __fentry__ at {va:#x} does not end as vmtrace knows (`{insn}`), so it \
             cannot tell which return mitigations the kernel uses"
        )
    }

    fn remedy(&self) -> Option<Remedy> {
        Some(Remedy::TrapMode)
    }
}

/// Instructions other than NOPs `Return::from_fentry` reads before giving
/// up. NOPs are not counted: before the kernel applies its alternatives,
/// `CALL_DEPTH_ACCOUNT` is ten one-byte NOPs (its `.skip` padding), more
/// instructions than any real form has; they are bounded by the bytes read.
const FENTRY_INSTRUCTIONS: usize = 8;
/// The address bit that makes a `ret` safe from ITS (Indirect Target
/// Selection), where the kernel keeps it plain
/// (arch/x86/kernel/alternative.c: cpu_wants_rethunk_at).
const ITS_SAFE_BIT: u64 = 0x20;
/// `CALL_DEPTH_ACCOUNT`'s shift (arch/x86/include/asm/nospec-branch.h:
/// RET_DEPTH_SHIFT).
const DEPTH_SHIFT: u32 = 5;

impl Return {
    /// How the kernel's `__fentry__`, whose running code is `code` at `va`,
    /// returns: ENDBR and NOPs (an alternative not patched in) skipped, its
    /// depth accounting if any, then `ret` or `jmp` to the return thunk.
    /// `its_thunk`: the running `its_return_thunk`, if the kernel has one
    /// (see the module comment).
    pub fn from_fentry(
        code: &[u8],
        va: u64,
        its_thunk: Option<u64>,
    ) -> Result<Return, ReturnError> {
        let mut decoder = Decoder::with_ip(64, code, va, DecoderOptions::NONE);
        let mut ret = Return::default();
        let mut counted = 0;
        while counted < FENTRY_INSTRUCTIONS && decoder.can_decode() {
            let i = decoder.decode();
            let unknown = || ReturnError::Unknown {
                va,
                insn: format_instruction(&i),
            };
            match i.mnemonic() {
                Mnemonic::Nop => continue,
                Mnemonic::Endbr64 => {}
                Mnemonic::Sar => ret.depth = Some(depth_disp(&i).ok_or_else(unknown)?),
                Mnemonic::Ret if i.op_count() == 0 => {
                    // `cpu_wants_rethunk_at`: ITS leaves a plain `ret` only
                    // where bit 5 of its address is set.
                    if i.ip() & ITS_SAFE_BIT != 0 {
                        ret.thunk = its_thunk;
                    }
                    return Ok(ret);
                }
                Mnemonic::Jmp if i.flow_control() == FlowControl::UnconditionalBranch => {
                    ret.thunk = Some(i.near_branch_target());
                    return Ok(ret);
                }
                _ => return Err(unknown()),
            }
            counted += 1;
        }
        Err(ReturnError::Unknown {
            va,
            insn: format!(
                "no return in {} bytes, {counted} instructions besides NOPs",
                decoder.position()
            ),
        })
    }

    /// Instructions this return adds to a recorded call's path, and to the
    /// graph's return path, over `ret`.
    pub fn extra_instructions(self) -> usize {
        usize::from(self.depth.is_some())
    }
}

/// The displacement of `sar qword gs:[...], 5` (absolute, or RIP-relative
/// as Linux 6.15+ writes per-CPU accesses), as a `gs:[disp32]`.
fn depth_disp(i: &iced_x86::Instruction) -> Option<i32> {
    let shape = i.op_count() == 2
        && i.op0_kind() == OpKind::Memory
        && i.segment_prefix() == Register::GS
        && i.memory_size().size() == 8
        && i.memory_index() == Register::None
        && i.immediate8() as u32 == DEPTH_SHIFT;
    if !shape {
        return None;
    }
    let addr = match i.memory_base() {
        Register::None => i.memory_displacement64(),
        Register::RIP => i.ip_rel_memory_address(),
        _ => return None,
    };
    i32::try_from(addr as i64).ok()
}

/// Leave vmtrace's code for the traced function (its return address on top
/// of the stack), as `__fentry__` does.
pub(super) fn emit_ret(a: &mut CodeAssembler, r: Return) -> Result<(), IcedError> {
    if let Some(depth) = r.depth {
        // CALL_DEPTH_ACCOUNT: the site's call, which no call thunk counted
        // (flags are dead at a function's entry).
        a.sar(qword_ptr(depth).gs(), DEPTH_SHIFT)?;
    }
    match r.thunk {
        // RET with return thunks: the kernel's thunk returns for us (a
        // direct jump: nothing to speculate past).
        Some(thunk) => a.jmp(thunk),
        None => {
            a.ret()?;
            // Straight-line speculation stops here; never runs.
            a.int3()
        }
    }
}

/// The graph's return path's end: rcx = the caller's address, rsp at the
/// slot the traced function's `ret` popped (see the module comment).
pub(super) fn emit_graph_ret(a: &mut CodeAssembler, r: Return) -> Result<(), IcedError> {
    // return_to_handler: a call the return below pairs with in the return
    // stack buffer (a `push; ret` would take the caller's caller's entry
    // there, and every return up the stack would be mispredicted).
    let mut rop = a.create_label();
    a.call(rop)?;
    // Never runs (the call's return address is overwritten).
    a.int3()?;
    a.set_label(&mut rop)?;
    // The caller's address in the call's return slot, the function's.
    a.mov(qword_ptr(rsp), rcx)?;
    if r.depth.is_none() {
        // RET: through the return thunk if the kernel has one.
        return emit_ret(a, r);
    }
    // With call depth tracking a plain `ret` (ANNOTATE_UNRET_SAFE): the
    // call above was not counted in the depth, so neither is this return.
    a.ret()?;
    a.int3()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FENTRY: u64 = 0xffff_ffff_8100_2040;

    fn fentry(code: &[u8]) -> Result<Return, ReturnError> {
        Return::from_fentry(code, FENTRY, None)
    }

    #[test]
    fn a_plain_ret_that_its_may_have_left_is_replaced_by_its_thunk() {
        let its = 0xffff_ffff_8200_2000;
        // `ret; int3` at an address with bit 5 clear: the kernel would have
        // rewritten it to the thunk if it used one; plain `ret` is right.
        assert_eq!(
            Return::from_fentry(&[0xc3, 0xcc], FENTRY, Some(its)).unwrap(),
            Return::default()
        );
        // Bit 5 set (after ENDBR at 0x...2040 the `ret` is at 0x...2044,
        // so start at 0x...2060): ITS may have left it there only; vmtrace
        // returns through its thunk at any address.
        for (code, va) in [
            (&[0xc3, 0xcc][..], FENTRY + 0x20),
            (&[0xf3, 0x0f, 0x1e, 0xfa, 0xc3, 0xcc][..], FENTRY + 0x1c),
        ] {
            assert_eq!(
                Return::from_fentry(code, va, Some(its)).unwrap(),
                Return {
                    depth: None,
                    thunk: Some(its)
                },
                "{va:#x}"
            );
            // No ITS thunk in the kernel: plain `ret` as read.
            assert_eq!(
                Return::from_fentry(code, va, None).unwrap(),
                Return::default()
            );
        }
    }

    /// `jmp rel32` at `at` (in `FENTRY`'s code) to `target`.
    fn jmp(at: u64, target: u64) -> Vec<u8> {
        let rel = (target as i64 - (at as i64 + 5)) as i32;
        let mut b = vec![0xe9];
        b.extend_from_slice(&rel.to_le_bytes());
        b
    }

    #[test]
    fn the_kernels_fentry_forms_are_read() {
        // No return thunks: `ret; int3` (also with ENDBR first, IBT).
        assert_eq!(fentry(&[0xc3, 0xcc]).unwrap(), Return::default());
        assert_eq!(
            fentry(&[0xf3, 0x0f, 0x1e, 0xfa, 0xc3, 0xcc]).unwrap(),
            Return::default()
        );
        // Return thunks: `jmp x86_return_thunk`, after the 9 bytes of NOPs
        // CALL_DEPTH_ACCOUNT leaves when call depth tracking is off.
        let thunk = 0xffff_ffff_8200_1000;
        let mut code = vec![0x66, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00];
        code.extend(jmp(FENTRY + 9, thunk));
        assert_eq!(
            fentry(&code).unwrap(),
            Return {
                depth: None,
                thunk: Some(thunk)
            }
        );
        // Call depth tracking, per-CPU offset layout (up to 6.14):
        // `sar qword gs:[0x1f3d8], 5`.
        let mut code = vec![0x65, 0x48, 0xc1, 0x3c, 0x25, 0xd8, 0xf3, 0x01, 0x00, 0x05];
        code.extend(jmp(FENTRY + 10, thunk));
        assert_eq!(
            fentry(&code).unwrap(),
            Return {
                depth: Some(0x1f3d8),
                thunk: Some(thunk)
            }
        );
        // 6.15+: `sar qword gs:[rip + rel], 5`, the variable's address.
        let depth_va: u64 = 0xffff_ffff_8300_0040;
        let rel = (depth_va as i64 - (FENTRY as i64 + 9)) as i32;
        let mut code = vec![0x65, 0x48, 0xc1, 0x3d];
        code.extend_from_slice(&rel.to_le_bytes());
        code.push(0x05);
        code.extend(jmp(FENTRY + 9, thunk));
        assert_eq!(fentry(&code).unwrap().depth, Some(depth_va as i64 as i32));
        // Before alternatives with call depth tracking built in (6.2+):
        // CALL_DEPTH_ACCOUNT's padding, ten one-byte NOPs, then the thunk.
        let mut code = vec![0x90; 10];
        code.extend(jmp(FENTRY + 10, thunk));
        assert_eq!(
            fentry(&code).unwrap(),
            Return {
                depth: None,
                thunk: Some(thunk)
            }
        );
    }

    #[test]
    fn anything_else_is_refused_by_name() {
        // An indirect jump, a call, a sar of something else.
        for code in [
            &[0xff, 0xe0][..],
            &[0xe8, 0, 0, 0, 0][..],
            &[0x48, 0xc1, 0xf8, 0x05, 0xc3][..],
            &[0x90; 16][..],
        ] {
            let err = fentry(code).unwrap_err();
            assert_eq!(err.remedy(), Some(Remedy::TrapMode));
            let err = err.to_string();
            assert!(
                err.starts_with(
                    "the guest's __fentry__ at 0xffffffff81002040 does not end as vmtrace knows"
                ),
                "{err}"
            );
            assert!(err.ends_with("; trace in trap mode"), "{err}");
        }
    }
}
