//! Direct entries: whether a function's first instructions can be
//! displaced by a 5-byte jump to a stub, proved from the whole function's
//! code and the kernel's tables of special sites, or the rule that refuses
//! it. Nothing here writes to the guest (`crate::session::direct` does).
//! See docs/direct.md.

pub mod entries;
pub mod module;
#[cfg(test)]
mod real_tests;
pub mod tables;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;

use iced_x86::{
    Code, Decoder, DecoderError, DecoderOptions, FlowControl, Formatter, Instruction,
    IntelFormatter, Mnemonic, OpKind,
};

use crate::kernel::symbols::KernelImage;
pub use entries::NotEntry;
pub use tables::{BranchSource, KernelTable, SiteTables, TableError};

/// Bytes of the jump written at a direct site (`jmp rel32`).
pub const JUMP_LEN: usize = 5;

/// Why a function gets no direct entry. Offsets (`at`, `from`, `to`) are
/// from the function's start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Its size is unknown or its bytes are not in the file.
    NoCode,
    /// Fewer than `JUMP_LEN` bytes of instructions after the entry.
    TooShort { len: usize },
    /// Bytes that are no instruction.
    Undecodable { at: u64 },
    /// The last instruction reaches past the function's end.
    RunsPastEnd { at: u64 },
    /// In `.entry.text`: runs before the kernel's state is set up.
    EntryText,
    /// In `.noinstr.text`: must not be instrumented.
    NoinstrText,
    /// vmtrace's own guest code runs it (a return thunk, `__fentry__`):
    /// tracing it would recurse.
    Recursion,
    /// A site of a kernel table is among the displaced bytes.
    Overlaps { table: KernelTable, at: u64 },
    /// A displaced instruction that cannot run elsewhere.
    Unrelocatable { at: u64, insn: String },
    /// A branch lands inside the displaced bytes, past their first.
    JumpIntoSite { from: u64, to: u64 },
    /// A jump through a register or memory (a jump table), whose targets
    /// cannot be checked.
    IndirectJump { at: u64 },
    /// A displaced instruction's RIP-relative operand or branch target
    /// that a stub in vmtrace's code page (the top 8 MiB of the address
    /// space) cannot reach with a 32-bit displacement, even by wrapping
    /// past 0 (`stub_reaches`).
    OutOfReach { at: u64, target: u64 },
    // Issue 35 (tables).
    /// A branch from elsewhere (a table's, another function's) lands
    /// inside the displaced bytes, past their first: `from` names it.
    BranchInto {
        source: BranchSource,
        from: String,
        to: u64,
    },
    // Issue 35 (entries): what is entered, and calls among the displaced.
    /// Not a function entry (`entries`): no return address at `[rsp]`.
    NotEntry { why: NotEntry },
    /// A displaced call (2 to 4 bytes when indirect) followed by another
    /// displaced instruction: its return address would be inside the jump.
    CallNotLast { at: u64 },
}

impl Refusal {
    /// The rule's short name, the summary's key.
    pub fn rule(&self) -> &'static str {
        match self {
            Refusal::NoCode => "no-code",
            Refusal::TooShort { .. } => "too-short",
            Refusal::Undecodable { .. } => "undecodable",
            Refusal::RunsPastEnd { .. } => "runs-past-end",
            Refusal::EntryText => "entry-text",
            Refusal::NoinstrText => "noinstr-text",
            Refusal::Recursion => "recursion",
            Refusal::Overlaps { table, .. } => table.rule(),
            Refusal::Unrelocatable { .. } => "unrelocatable",
            Refusal::JumpIntoSite { .. } => "jump-into-site",
            Refusal::IndirectJump { .. } => "indirect-jump",
            Refusal::OutOfReach { .. } => "out-of-reach",
            Refusal::BranchInto { source, .. } => source.rule(),
            Refusal::NotEntry { .. } => "not-entry",
            Refusal::CallNotLast { .. } => "call-not-last",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::NoCode => write!(f, "its code is not in the file"),
            Refusal::TooShort { len } => write!(
                f,
                "too short: {len} bytes of instructions, the jump needs {JUMP_LEN}"
            ),
            Refusal::Undecodable { at } => write!(f, "no valid instruction at +{at:#x}"),
            Refusal::RunsPastEnd { at } => {
                write!(
                    f,
                    "the instruction at +{at:#x} runs past the function's end"
                )
            }
            Refusal::EntryText => write!(f, "in entry text"),
            Refusal::NoinstrText => write!(f, "in noinstr text"),
            Refusal::Recursion => write!(f, "vmtrace's own code runs it: tracing it would recurse"),
            Refusal::Overlaps { table, at } => {
                write!(f, "{} at +{at:#x} in the displaced bytes", table.site())
            }
            Refusal::Unrelocatable { at, insn } => {
                write!(f, "`{insn}` at +{at:#x} cannot be relocated")
            }
            Refusal::JumpIntoSite { from, to } => write!(
                f,
                "the branch at +{from:#x} lands at +{to:#x}, inside the displaced bytes"
            ),
            Refusal::OutOfReach { at, target } => write!(
                f,
                "the instruction at +{at:#x} reaches {target:#x}, too far from vmtrace's stubs"
            ),
            Refusal::IndirectJump { at } => {
                write!(
                    f,
                    "indirect jump at +{at:#x}: its targets cannot be checked"
                )
            }
            Refusal::BranchInto { source, from, to } => write!(
                f,
                "{} {from} lands at +{to:#x}, inside the displaced bytes",
                source.what()
            ),
            Refusal::NotEntry { why } => write!(f, "not a function entry: {why}"),
            Refusal::CallNotLast { at } => write!(
                f,
                "the call at +{at:#x} is not the last displaced instruction: \
                 it would return into the jump"
            ),
        }
    }
}

/// A function's direct entry site, proved safe.
#[derive(Debug, Clone)]
pub struct DirectSite {
    /// Where the jump goes: the function's start, or after its ENDBR64.
    pub addr: u64,
    /// Bytes displaced: whole instructions, at least `JUMP_LEN`.
    pub len: usize,
    /// The displaced instructions, at their link addresses.
    pub insns: Vec<Instruction>,
    /// Some displaced instruction has a RIP-relative memory operand, to be
    /// rebased where the stub runs it.
    pub rip_relative: bool,
    /// The displaced bytes are the function's ftrace site (`call
    /// __fentry__` in the file, the 5-byte NOP the kernel's ftrace_init
    /// makes of it): the stub runs nothing in their place, and `insns` is
    /// empty.
    pub ftrace_nop: bool,
}

impl DirectSite {
    /// Function `func` of `image`'s direct site, or why it has none.
    pub fn analyze(
        image: &KernelImage,
        tables: &SiteTables,
        func: usize,
    ) -> Result<DirectSite, Refusal> {
        let f = &image.functions[func];
        let within = |r: Option<(u64, u64)>| r.is_some_and(|(s, e)| (s..e).contains(&f.addr));
        if within(tables.entry_text) {
            return Err(Refusal::EntryText);
        }
        let module_noinstr = tables.module_noinstr.iter().copied().map(Some);
        if within(tables.noinstr_text) || module_noinstr.into_iter().any(within) {
            return Err(Refusal::NoinstrText);
        }
        if image.names(func).any(runs_vmtrace) {
            return Err(Refusal::Recursion);
        }
        if let Some(why) = image.not_entry(func) {
            return Err(Refusal::NotEntry { why });
        }
        let code = usize::try_from(image.entry_extent(func))
            .ok()
            .filter(|&n| n > 0)
            .and_then(|n| image.file_bytes(f.addr, n))
            .ok_or(Refusal::NoCode)?;
        let own = usize::try_from(f.size).unwrap_or(usize::MAX);
        DirectSite::analyze_within(f.addr, code, own, tables)
    }

    /// The direct site of the function whose code is `code` at `addr`.
    pub fn analyze_code(
        addr: u64,
        code: &[u8],
        tables: &SiteTables,
    ) -> Result<DirectSite, Refusal> {
        DirectSite::analyze_within(addr, code, code.len(), tables)
    }

    /// `analyze_code` of a function whose own bytes are the first `own` of
    /// `code`, the rest read for its branches only (`entry_extent`): the
    /// displaced bytes never reach past its own into the next symbol's,
    /// which other code may enter (a label jumped to, padding that
    /// call-depth tracking or FineIBT runs before a function).
    fn analyze_within(
        addr: u64,
        code: &[u8],
        own: usize,
        tables: &SiteTables,
    ) -> Result<DirectSite, Refusal> {
        let insns = decode(addr, code)?;
        let first = usize::from(insns.first().map(Instruction::code) == Some(Code::Endbr64));
        let own_end = addr.saturating_add(own as u64);
        let mut len = 0;
        let displaced: Vec<Instruction> = insns[first..]
            .iter()
            .take_while(|i| {
                let more = len < JUMP_LEN && i.next_ip() <= own_end;
                len += i.len();
                more
            })
            .copied()
            .collect();
        let len: usize = displaced.iter().map(Instruction::len).sum();
        if len < JUMP_LEN {
            return Err(Refusal::TooShort { len });
        }
        let site = DirectSite::displacing(displaced, len, tables);
        let (len, off) = (site.len, |a: u64| a - addr);
        let end = site.addr + len as u64;
        let ftrace = site.ftrace_nop.then_some(KernelTable::Ftrace);
        let other = tables.overlap_except(site.addr, end, ftrace);
        if let Some((table, at)) = other {
            return Err(Refusal::Overlaps {
                table,
                at: at.wrapping_sub(addr),
            });
        }
        let last = site.insns.last().map(Instruction::ip);
        for i in &site.insns {
            // A `call` (not `syscall`, which iced counts as one too).
            if i.mnemonic() == Mnemonic::Call && Some(i.ip()) != last {
                return Err(Refusal::CallNotLast { at: off(i.ip()) });
            }
            if !relocatable(i, site.addr..end) {
                let insn = format_insn(i);
                return Err(Refusal::Unrelocatable {
                    at: off(i.ip()),
                    insn,
                });
            }
            if let Some(target) = rip_target(i).filter(|&t| !stub_reaches(t)) {
                let at = off(i.ip());
                return Err(Refusal::OutOfReach { at, target });
            }
        }
        for i in &insns {
            let target = near_target(i);
            if let Some(to) = target.filter(|t| (site.addr + 1..end).contains(t)) {
                return Err(Refusal::JumpIntoSite {
                    from: off(i.ip()),
                    to: off(to),
                });
            }
            let to_thunk = i.flow_control() != FlowControl::Call
                && target.is_some_and(|t| {
                    tables
                        .indirect_thunks
                        .iter()
                        .any(|r| (r.0..r.1).contains(&t))
                });
            if i.flow_control() == FlowControl::IndirectBranch || to_thunk {
                return Err(Refusal::IndirectJump { at: off(i.ip()) });
            }
        }
        if let Some(b) = tables.targets.landing_in(site.addr + 1, end) {
            return Err(Refusal::BranchInto {
                source: b.source,
                from: b.from.clone(),
                to: off(b.target),
            });
        }
        Ok(site)
    }
}

/// What vmtrace's guest code runs, or the kernel's own function entry
/// does before it: the return thunks its code returns through (as the
/// kernel's `__fentry__` does), the retpoline and call-depth thunks, and
/// `__fentry__` itself. A direct entry in one would call vmtrace again
/// from vmtrace.
fn runs_vmtrace(name: &str) -> bool {
    const NAMES: [&str; 4] = [
        "__fentry__",
        "__x86_return_thunk",
        "__x86_return_skl",
        "zen_untrain_ret",
    ];
    const PREFIXES: [&str; 5] = [
        "__x86_indirect_",
        "srso_",
        "retbleed_",
        "entry_untrain_ret",
        "call_depth_",
    ];
    NAMES.contains(&name)
        || PREFIXES.iter().any(|p| name.starts_with(p))
        || name.ends_with("_return_thunk")
}

impl DirectSite {
    /// The site displacing `displaced` (`len` bytes). An ftrace site first
    /// (at the entry, or after ENDBR64, as the compiler puts it) is
    /// displaced alone: a NOP once the kernel has converted it, nothing to
    /// run elsewhere.
    fn displacing(displaced: Vec<Instruction>, len: usize, tables: &SiteTables) -> DirectSite {
        let addr = displaced[0].ip();
        if displaced[0].len() == JUMP_LEN && tables.ftrace_at(addr) {
            return DirectSite {
                addr,
                len: JUMP_LEN,
                rip_relative: false,
                insns: Vec::new(),
                ftrace_nop: true,
            };
        }
        DirectSite {
            addr,
            len,
            rip_relative: displaced.iter().any(Instruction::is_ip_rel_memory_operand),
            insns: displaced,
            ftrace_nop: false,
        }
    }
}

/// Every instruction of the function `code` at `addr`.
fn decode(addr: u64, code: &[u8]) -> Result<Vec<Instruction>, Refusal> {
    let mut d = Decoder::with_ip(64, code, addr, DecoderOptions::NONE);
    let mut insns = Vec::new();
    while d.can_decode() {
        let i = d.decode();
        if i.is_invalid() {
            let at = i.ip() - addr;
            return Err(match d.last_error() {
                DecoderError::NoMoreBytes => Refusal::RunsPastEnd { at },
                _ => Refusal::Undecodable { at },
            });
        }
        insns.push(i);
    }
    Ok(insns)
}

/// Where vmtrace's stubs are: its code page, in the top 8 MiB of the
/// address space (the plan's `CODE_VA`, which checks it is).
pub const STUBS_FROM: u64 = 0u64.wrapping_sub(8 << 20);

/// The farthest forward a 32-bit displacement reaches from the end of
/// an instruction: 2 GiB - 1.
const REL32_REACH: u64 = i32::MAX as u64;

/// The lowest address at the top of the address space that a stub
/// reaches with a 32-bit displacement: the kernel's top 2 GiB (where the
/// kernel image is linked; KASLR only moves it up from there).
pub const STUB_REACH: u64 = 0xffff_ffff_8000_0000;

/// Whether a stub reaches `target` with a RIP-relative 32-bit
/// displacement. The displacement is added modulo 2^64, so from the top
/// 8 MiB a stub also reaches the bottom of the address space by wrapping
/// past 0: a per-CPU variable's operand `gs:[rip + var]`, whose target is
/// the variable's small offset in the per-CPU area, is one.
pub fn stub_reaches(target: u64) -> bool {
    // From the lowest stub, the farthest a wrapped target can be.
    let wrapped = target.wrapping_sub(STUBS_FROM);
    target >= STUB_REACH || wrapped <= REL32_REACH
}

/// The address a displaced instruction reaches relative to RIP: its
/// RIP-relative memory operand, or its branch target.
fn rip_target(i: &Instruction) -> Option<u64> {
    if i.is_ip_rel_memory_operand() {
        return Some(i.ip_rel_memory_address());
    }
    near_target(i)
}

/// The target of a direct near branch or call.
fn near_target(i: &Instruction) -> Option<u64> {
    matches!(
        i.op0_kind(),
        OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
    )
    .then(|| i.near_branch_target())
}

/// Whether a displaced instruction can run in a stub: anything that
/// continues to the next instruction (RIP-relative operands rebased),
/// returns, or jumps and calls indirectly; a `jmp`, `jcc` or `call` to
/// outside the displaced bytes `site` (re-encoded to reach); nothing else
/// (`loop`, `jrcxz`, `xbegin`, traps, interrupts, system calls).
fn relocatable(i: &Instruction, site: std::ops::Range<u64>) -> bool {
    match i.flow_control() {
        FlowControl::Next | FlowControl::Return => true,
        FlowControl::IndirectBranch => true,
        // A near `call r/m64` only (`crate::session::direct::stub` turns it
        // into a `jmp r/m64`), never a far call.
        FlowControl::IndirectCall => i.code() == Code::Call_rm64,
        FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch | FlowControl::Call => {
            let plain =
                matches!(i.mnemonic(), Mnemonic::Jmp | Mnemonic::Call) || i.is_jcc_short_or_near();
            plain && near_target(i).is_some_and(|t| !site.contains(&t))
        }
        _ => false,
    }
}

/// `i` in Intel syntax, for refusals.
fn format_insn(i: &Instruction) -> String {
    let mut s = String::new();
    IntelFormatter::new().format(i, &mut s);
    s
}

/// Direct sites over all functions of an image: how many are safe, and
/// how many each rule refuses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    pub functions: usize,
    pub safe: usize,
    /// Of the safe ones, those with RIP-relative displaced operands.
    pub rip_relative: usize,
    /// Refusals by `Refusal::rule`.
    pub refused: BTreeMap<&'static str, usize>,
}

impl Summary {
    /// Analyzes every function of `image`.
    pub fn of(image: &KernelImage, tables: &SiteTables) -> Summary {
        let mut s = Summary {
            functions: image.functions.len(),
            ..Summary::default()
        };
        for func in 0..image.functions.len() {
            match DirectSite::analyze(image, tables, func) {
                Ok(site) => {
                    s.safe += 1;
                    s.rip_relative += usize::from(site.rip_relative);
                }
                Err(r) => *s.refused.entry(r.rule()).or_default() += 1,
            }
        }
        s
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} functions: {} direct sites safe ({} with RIP-relative operands)",
            self.functions, self.safe, self.rip_relative
        )?;
        let refused: usize = self.refused.values().sum();
        write!(f, ", {refused} refused")?;
        let mut by: Vec<_> = self.refused.iter().collect();
        by.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        for (i, (rule, n)) in by.into_iter().enumerate() {
            write!(f, "{} {rule} {n}", if i == 0 { ":" } else { "," })?;
        }
        Ok(())
    }
}
