//! The trampoline's code decoded: the path a call runs, and instructions
//! as text for listings and error messages.

use iced_x86::{Decoder, DecoderOptions, FlowControl, Formatter, Instruction, IntelFormatter};

use super::layout::CODE_VA;

/// One instruction as `address  mnemonic operands`, Intel syntax, 0x hex.
pub fn format_instruction(instruction: &Instruction) -> String {
    let mut formatter = IntelFormatter::new();
    let options = formatter.options_mut();
    options.set_hex_prefix("0x");
    options.set_hex_suffix("");
    options.set_uppercase_hex(false);
    options.set_space_after_operand_separator(true);
    // Show ring displacements as the addresses they are (0xffff...), not as
    // negative offsets from r10.
    options.set_signed_memory_displacements(false);
    let mut text = String::new();
    formatter.format(instruction, &mut text);
    format!("{:016x}  {text}", instruction.ip())
}

/// Most instructions the common path may take before the walk that lists it
/// gives up (it is straight-line code; this only bounds a broken one).
const WALK_LIMIT: usize = 160;

/// Where the walk of a path went wrong, and why.
#[derive(Debug)]
pub struct BrokenPath {
    pub va: u64,
    pub why: String,
}

/// The instructions a recorded call executes from `start` in `code` (placed
/// at `CODE_VA`), decoded in execution order: every conditional branch falls
/// through (no retry, ring not full, CPU in range), unconditional jumps and
/// calls in the code are followed (calls of the kernel's return to the next
/// instruction), and the walk ends with the `ret`, or with
/// the jump out of the code to the kernel's return thunk (`ret`).
pub fn walk_common_path(code: &[u8], start: u64) -> Result<Vec<Instruction>, BrokenPath> {
    walk_path(code, start, 0)
}

/// The recorded paths from `starts` (`CODE_VA` offsets of the per-site
/// bodies) are `want(k)` instructions long: site 0's, and the first site's
/// whose `want` differs (`--args=GLOB`: the bodies differ only in storing
/// the arguments or not, and in immediates).
pub fn check_paths(
    code: &[u8],
    starts: &[u32],
    want: impl Fn(usize) -> usize,
) -> Result<(), BrokenPath> {
    let other = (1..starts.len()).find(|&k| want(k) != want(0));
    for k in std::iter::once(0).chain(other) {
        let va = CODE_VA + u64::from(starts[k]);
        let got = walk_common_path(code, va)?.len();
        if got != want(k) {
            return Err(BrokenPath {
                va,
                why: format!("{got} instructions, not {}", want(k)),
            });
        }
    }
    Ok(())
}

/// Like `walk_common_path`, but the first `taken` conditional branches are
/// taken (e.g. 1: the pid filter's rejection, the first branch of a body
/// with a one-pid filter).
pub fn walk_path(code: &[u8], start: u64, taken: usize) -> Result<Vec<Instruction>, BrokenPath> {
    let mut taken = taken;
    let broken = |va: u64, why: String| BrokenPath { va, why };
    let mut decoder = Decoder::with_ip(64, code, CODE_VA, DecoderOptions::NONE);
    let mut path = Vec::new();
    let mut ip = start;
    while path.len() < WALK_LIMIT {
        let position = ip
            .checked_sub(CODE_VA)
            .map(|p| p as usize)
            .filter(|&p| p < code.len())
            .ok_or_else(|| broken(ip, "the path leaves the code".into()))?;
        decoder
            .set_position(position)
            .map_err(|e| broken(ip, e.to_string()))?;
        decoder.set_ip(ip);
        let instruction = decoder.decode();
        if instruction.is_invalid() {
            return Err(broken(ip, "an invalid instruction".into()));
        }
        path.push(instruction);
        let inside = |va: u64| va >= CODE_VA && va < CODE_VA + code.len() as u64;
        ip = match instruction.flow_control() {
            FlowControl::Return => return Ok(path),
            FlowControl::UnconditionalBranch if !inside(instruction.near_branch_target()) => {
                return Ok(path)
            }
            // A call of the kernel's (an event's string copies) returns
            // to the next instruction.
            FlowControl::Call if !inside(instruction.near_branch_target()) => instruction.next_ip(),
            FlowControl::UnconditionalBranch | FlowControl::Call => {
                instruction.near_branch_target()
            }
            FlowControl::ConditionalBranch if taken > 0 => {
                taken -= 1;
                instruction.near_branch_target()
            }
            FlowControl::Next | FlowControl::ConditionalBranch => instruction.next_ip(),
            other => return Err(broken(ip, format!("unexpected control flow {other:?}"))),
        };
    }
    Err(broken(
        start,
        format!("no ret within {WALK_LIMIT} instructions"),
    ))
}
