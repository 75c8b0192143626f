//! What an enabled call site runs on a kernel with static calls, where
//! `__DO_TRACE_CALL` (include/linux/tracepoint.h) loads `tp->funcs` and
//! calls `static_call(tp_func_NAME)` only when it is not NULL:
//!
//! ```text
//!     mov  R, [__tracepoint_NAME.funcs]
//!     test R, R
//!     je   out
//!     mov  rdi, [R+8]          ; __data = it_func_ptr->data
//!     ...                      ; the arguments
//!     call __SCT__tp_func_NAME ; -> __traceiter_NAME
//! ```
//!
//! With no probe registered, `funcs` is NULL and nothing is called. A trap
//! at the `test` that gives R the address 8 bytes before `tp->funcs` and
//! moves on past the `je` makes `__data` read `tp->funcs` (NULL, what a
//! kernel without static calls passes: `__traceiter_NAME(NULL, args)`) and
//! the call reach `__traceiter_NAME`, which walks no probe and returns.
//! Found by decoding, and refused unless the code is exactly that.

use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, OpKind, Register};

use crate::kernel::symbols::KernelImage;

/// Instructions decoded from the site's target before giving up.
const MAX_BEFORE_LOAD: usize = 8;
/// Instructions from the `je` to the call.
const MAX_TO_CALL: usize = 24;

/// Where the `tp->funcs` test of one enabled site is (link-time).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FuncsTest {
    /// The load of `tp->funcs` into R (`mov R, [rip + disp32]`), which
    /// exitless mode makes read another cell (`crate::qemu::funcs_loads`).
    pub load: u64,
    /// The `test R, R`.
    pub test: u64,
    /// The instruction after the `je`: where the call's arguments start.
    pub after_je: u64,
    /// R, as gdb's target description names it (`rax`).
    pub reg: String,
    /// What the call after it calls (None: an indirect call).
    pub callee: Option<u64>,
}

fn decode(image: &KernelImage, at: u64) -> Option<Instruction> {
    let bytes = image
        .file_bytes(at, 15)
        .or_else(|| image.file_bytes(at, 1))?;
    let insn = Decoder::with_ip(64, bytes, at, DecoderOptions::NONE).decode();
    (!insn.is_invalid()).then_some(insn)
}

/// The `tp->funcs` test after the jump label's `target`, if the code reads
/// as the module comment says (`funcs`: the link-time address of
/// `tp->funcs`).
pub fn funcs_test(image: &KernelImage, target: u64, funcs: u64) -> Option<FuncsTest> {
    let mut at = target;
    let mut load = None;
    let mut load_at = 0;
    for _ in 0..MAX_BEFORE_LOAD {
        let i = decode(image, at)?;
        at = i.next_ip();
        let reads_funcs = i.mnemonic() == Mnemonic::Mov
            && i.op_count() == 2
            && i.op0_kind() == OpKind::Register
            && i.op0_register().is_gpr64()
            && i.op1_kind() == OpKind::Memory
            && i.memory_index() == Register::None
            && matches!(i.memory_base(), Register::RIP | Register::None)
            && i.memory_displacement64() == funcs;
        if reads_funcs {
            load = Some(i.op0_register());
            load_at = i.ip();
            break;
        }
    }
    let reg = load?;
    let test = decode(image, at)?;
    let tests_reg = test.mnemonic() == Mnemonic::Test
        && test.op0_kind() == OpKind::Register
        && test.op1_kind() == OpKind::Register
        && test.op0_register() == reg
        && test.op1_register() == reg;
    let je = decode(image, test.next_ip())?;
    if !tests_reg || je.mnemonic() != Mnemonic::Je {
        return None;
    }
    let call = flags_dead_until_call(image, je.next_ip())?;
    Some(FuncsTest {
        load: load_at,
        test: test.ip(),
        after_je: je.next_ip(),
        reg: format!("{reg:?}").to_lowercase(),
        callee: (call.op0_kind() == OpKind::NearBranch64).then(|| call.near_branch_target()),
    })
}

/// From `at` to the first call, no instruction reads the flags before one
/// writes them (the trap skips the `test` that set them), and no branch
/// leaves the way; the call.
fn flags_dead_until_call(image: &KernelImage, mut at: u64) -> Option<Instruction> {
    let mut written = false;
    for _ in 0..MAX_TO_CALL {
        let i = decode(image, at)?;
        if i.mnemonic() == Mnemonic::Call {
            return Some(i);
        }
        if i.is_jcc_short_or_near() || i.is_jmp_short_or_near() || i.mnemonic() == Mnemonic::Ret {
            return None;
        }
        if i.rflags_read() != 0 && !written {
            return None;
        }
        written |= i.rflags_modified() != 0;
        at = i.next_ip();
    }
    None
}

/// The load at `ip` (its bytes `bytes`, at least the instruction) of the
/// qword at `from`, re-encoded to load the qword at `to` instead: the same
/// instruction and length, only its displacement changed (decoded back
/// and checked). Running addresses.
pub fn redirect_load(bytes: &[u8], ip: u64, from: u64, to: u64) -> Result<Vec<u8>, String> {
    let mut i = Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE).decode();
    let loads_from = !i.is_invalid()
        && i.mnemonic() == Mnemonic::Mov
        && i.op1_kind() == OpKind::Memory
        && i.memory_index() == Register::None
        && matches!(i.memory_base(), Register::RIP | Register::None)
        && i.memory_displacement64() == from;
    if !loads_from {
        let got = &bytes[..i.len().min(bytes.len())];
        return Err(format!("{got:02x?} ({i}), not a load of {from:#x}"));
    }
    let len = i.len();
    i.set_memory_displacement64(to);
    let mut enc = iced_x86::Encoder::new(64);
    let out = enc
        .encode(&i, ip)
        .map(|_| enc.take_buffer())
        .map_err(|e| format!("cannot re-encode the load at {ip:#x}: {e}"))?;
    let back = Decoder::with_ip(64, &out, ip, DecoderOptions::NONE).decode();
    match out.len() == len
        && back.memory_displacement64() == to
        && back.op0_register() == i.op0_register()
    {
        true => Ok(out),
        false => Err(format!("the load at {ip:#x} re-encodes as {back}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Debian 6.12's `mov rax, [rip + disp32]` of `tp->funcs` in
    /// `kernel_clone`, made to read a cell 0x18 bytes before, as 7 bytes.
    #[test]
    fn a_load_is_redirected_in_place() {
        let ip = 0xffff_ffff_8100_0000u64;
        let bytes = [0x48, 0x8b, 0x05, 0x00, 0x10, 0x00, 0x00];
        let from = ip + 7 + 0x1000;
        let out = redirect_load(&bytes, ip, from, from - 0x18).unwrap();
        assert_eq!(out, vec![0x48, 0x8b, 0x05, 0xe8, 0x0f, 0x00, 0x00]);
        // Another address than the one it loads: refused.
        assert!(redirect_load(&bytes, ip, from + 8, from).is_err());
        // Not a load.
        assert!(redirect_load(&[0x48, 0x85, 0xc0], ip, from, from).is_err());
    }
}
