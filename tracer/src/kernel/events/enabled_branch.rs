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
