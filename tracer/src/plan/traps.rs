//! The bytes trap mode writes into the guest: the trap over a site and
//! the function graph's return trap (why `out`: `crate::session::patch`).

use crate::kernel::sites::SITE_LEN;

/// `out imm8, al` (Intel SDM: E6 ib).
const OUT_IMM8_AL: u8 = 0xe6;
/// The 3-byte NOP `nop dword [rax]`.
const NOP3: [u8; 3] = [0x0f, 0x1f, 0x00];
/// What a patched site holds.
pub const TRAP: [u8; SITE_LEN] = [
    OUT_IMM8_AL,
    vmm::layout::TRACE_PORT as u8,
    NOP3[0],
    NOP3[1],
    NOP3[2],
];

/// `ud2` (Intel SDM: 0F 0B): never runs, see `RETURN_TRAP`.
const UD2: [u8; 2] = [0x0f, 0x0b];
/// The function graph's return trap in trap mode, at the start of vmtrace's
/// code page: a hooked function returns here, exits at the `out`, and the
/// handler resumes it at its real return address; the `ud2` after it would
/// stop a guest that ran on (none does: the handler always moves RIP).
pub const RETURN_TRAP: [u8; 4] = [OUT_IMM8_AL, vmm::layout::TRACE_PORT as u8, UD2[0], UD2[1]];
