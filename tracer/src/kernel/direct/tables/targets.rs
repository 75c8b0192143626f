//! Branches from elsewhere that land near a function's entry: an
//! exception fixup, a jump label's target, a branch in an alternative's
//! replacement (where it lands once patched in), and every direct branch
//! of the kernel's code to another function than its own (GCC's `foo.cold`
//! jumping back into `foo`). A direct entry whose displaced bytes one of
//! them lands in, past their first, would send it into the middle of the
//! jump. The whole text is decoded once; the static call sites it finds
//! (calls and jumps to a trampoline, as objtool lists them) are added to
//! the tables, which a bzImage's kallsyms may not locate.

use std::collections::HashSet;

use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, OpKind};

use super::{KernelTable, SiteTables, TableLinks};
use crate::kernel::symbols::{function_index_at, KernelImage};

/// How far into a function its displaced bytes may reach: an ENDBR64 (4
/// bytes), then whole instructions until 5 bytes are covered, the last up
/// to 15 bytes long (x86's longest): 4 + 4 + 15. Branches landing further
/// in are not kept.
const SITE_REACH: u64 = 23;

/// The section of alternatives' replacement code, decoded as each
/// replacement lands (arch/x86/kernel/vmlinux.lds.S).
const REPLACEMENTS: &str = ".altinstr_replacement";

/// Where a branch from elsewhere comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BranchSource {
    /// `__ex_table`: where a faulting instruction resumes.
    ExFixup,
    /// `__jump_table`: where an enabled jump label jumps.
    JumpLabel,
    /// A branch in an `.altinstructions` replacement, once patched in.
    Alternative,
    /// A direct branch or call of another function, or of code outside
    /// any function (`.altinstr_aux`).
    Outside,
}

impl BranchSource {
    /// The summary's key for a refusal by this source.
    pub fn rule(self) -> &'static str {
        match self {
            BranchSource::ExFixup => "ex-table-fixup",
            BranchSource::JumpLabel => "jump-label-target",
            BranchSource::Alternative => "alternative-branch",
            BranchSource::Outside => "branch-from-outside",
        }
    }

    /// What lands, in refusals (followed by where it comes from).
    pub fn what(self) -> &'static str {
        match self {
            BranchSource::ExFixup => "the exception fixup of",
            BranchSource::JumpLabel => "the jump label at",
            BranchSource::Alternative => "a branch of the alternative at",
            BranchSource::Outside => "the branch at",
        }
    }
}

/// One branch from elsewhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignBranch {
    /// Where it lands (link address).
    pub target: u64,
    pub source: BranchSource,
    /// Where it comes from: `function+offset` (else the address).
    pub from: String,
}

/// The branches from elsewhere that land up to `SITE_REACH` bytes into a
/// function, past its first byte, sorted by target.
#[derive(Debug, Clone, Default)]
pub struct BranchTargets {
    branches: Vec<ForeignBranch>,
}

impl BranchTargets {
    /// The first branch landing in `start..end`.
    pub fn landing_in(&self, start: u64, end: u64) -> Option<&ForeignBranch> {
        let i = self.branches.partition_point(|b| b.target < start);
        self.branches.get(i).filter(|b| b.target < end)
    }

    /// From branches already known (tests).
    pub fn from_branches(mut branches: Vec<ForeignBranch>) -> BranchTargets {
        branches.sort_unstable_by_key(|b| b.target);
        BranchTargets { branches }
    }

    /// Every branch kept, sorted by target.
    pub fn branches(&self) -> &[ForeignBranch] {
        &self.branches
    }

    /// Every branch of `image` from elsewhere near a function's entry;
    /// static call sites it finds go to `tables`.
    pub(crate) fn collect(
        image: &KernelImage,
        links: &TableLinks,
        tables: &mut SiteTables,
    ) -> BranchTargets {
        let funcs = &image.functions;
        let near = |t: u64| {
            function_index_at(funcs, t)
                .is_some_and(|j| (1..=SITE_REACH).contains(&(t - funcs[j].addr)))
        };
        let mut raw: Vec<(u64, BranchSource, u64)> = Vec::new();
        let mut keep = |t: u64, source, from| {
            if near(t) {
                raw.push((t, source, from));
            }
        };
        for &(insn, fixup) in &links.fixups {
            keep(fixup, BranchSource::ExFixup, insn);
        }
        for &(site, target) in &links.jumps {
            keep(target, BranchSource::JumpLabel, site);
        }
        from_alternatives(image, links, &mut keep);
        let tramps = tables.trampolines();
        let known: HashSet<u64> = tables
            .sites
            .iter()
            .filter(|s| s.2 == KernelTable::StaticCall)
            .map(|s| s.0)
            .collect();
        let mut static_calls = Vec::new();
        let mut each = |own: std::ops::Range<u64>, i: &Instruction, t: u64| {
            if own.contains(&t) {
                return;
            }
            let jump = matches!(
                i.flow_control(),
                FlowControl::Call | FlowControl::UnconditionalBranch
            );
            if jump && tramps.binary_search(&t).is_ok() && !known.contains(&i.ip()) {
                static_calls.push(i.ip());
            }
            keep(t, BranchSource::Outside, i.ip());
        };
        for f in funcs {
            let own = f.addr..f.addr + f.size;
            let code = usize::try_from(f.size)
                .ok()
                .and_then(|n| image.file_bytes(f.addr, n));
            if let Some(code) = code {
                branches(f.addr, code, |i, t| each(own.clone(), i, t));
            }
        }
        for (start, end) in gaps(image, links) {
            if let Some(code) = image.file_bytes(start, (end - start) as usize) {
                branches(start, code, |i, t| each(0..0, i, t));
            }
        }
        for ip in static_calls {
            tables.sites.push((ip, ip + 1, KernelTable::StaticCall));
        }
        raw.sort_unstable();
        let name = |a: u64| match image.function_at(a) {
            Some(f) => format!("{}+{:#x}", f.name, a - f.addr),
            None => format!("{a:#x}"),
        };
        let branches = raw
            .into_iter()
            .map(|(target, source, from)| ForeignBranch {
                target,
                source,
                from: name(from),
            })
            .collect();
        BranchTargets { branches }
    }
}

/// Each branch in an alternative's replacement, given to `keep` as
/// `(target, source, the site it is patched into)`.
fn from_alternatives(
    image: &KernelImage,
    links: &TableLinks,
    keep: &mut dyn FnMut(u64, BranchSource, u64),
) {
    for &(site, _, repl, rlen) in &links.alts {
        let Some(code) = image.file_bytes(repl, usize::from(rlen)) else {
            continue;
        };
        // A branch inside the replacement lands where it is copied to;
        // one out of it keeps its target (6.12's apply_relocation, 6.1's
        // recompute_jump and call fixup).
        let inside = repl..repl + u64::from(rlen);
        branches(repl, code, |_, t| {
            let t = if inside.contains(&t) {
                site + (t - repl)
            } else {
                t
            };
            keep(t, BranchSource::Alternative, site);
        });
    }
}

/// The code of `links.code`'s sections that no function holds (e.g.
/// `.altinstr_aux`, whose static_cpu_has() tests jump back into their
/// functions), but the replacements.
fn gaps(image: &KernelImage, links: &TableLinks) -> Vec<(u64, u64)> {
    let funcs = &image.functions;
    let mut out = Vec::new();
    for (_, start, end) in links.code.iter().filter(|c| c.0 != REPLACEMENTS) {
        let mut at = *start;
        let first = funcs.partition_point(|f| f.addr < *start);
        for f in funcs[first..].iter().take_while(|f| f.addr < *end) {
            if f.addr > at {
                out.push((at, f.addr));
            }
            at = at.max(f.addr + f.size);
        }
        if at < *end {
            out.push((at, *end));
        }
    }
    out
}

/// Calls `each` with every direct branch or call of `code` at `addr` and
/// its target.
fn branches(addr: u64, code: &[u8], mut each: impl FnMut(&Instruction, u64)) {
    let mut d = Decoder::with_ip(64, code, addr, DecoderOptions::NONE);
    let mut i = Instruction::default();
    while d.can_decode() {
        d.decode_out(&mut i);
        if !i.is_invalid()
            && matches!(
                i.op0_kind(),
                OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
            )
        {
            each(&i, i.near_branch_target());
        }
    }
}
