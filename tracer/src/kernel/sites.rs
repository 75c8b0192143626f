//! ftrace call sites: the `__mcount_loc` entries that sit at a function's
//! entry, and what the 5 bytes at a site currently hold.

use iced_x86::{Code, Decoder, DecoderOptions};

use crate::kernel::symbols::KernelImage;

/// Length of an ftrace call site: a `call rel32` or the NOP replacing it.
pub const SITE_LEN: usize = 5;
/// The kernel's ideal x86 5-byte NOP (`nopl 0x0(%rax,%rax,1)`, x86_nops[5]),
/// also what `gcc -mnop-mcount` and objtool put at a site in the file.
pub const NOP5: [u8; SITE_LEN] = [0x0f, 0x1f, 0x44, 0x00, 0x00];
/// The 5-byte NOP ftrace_init writes at a site before 5.13 on a CPU without
/// `nopl` in its ideal NOPs (`K8_NOP5_ATOMIC`, arch/x86/include/asm/nops.h
/// of 5.10: AMD family 0xf, as QEMU's default `qemu64` CPU says it is);
/// 5.13 made `NOP5` the only one (x86_nops).
pub const K8_NOP5: [u8; SITE_LEN] = [0x66, 0x66, 0x66, 0x66, 0x90];

/// Whether `bytes` are a 5-byte NOP the kernel writes at a disabled site.
pub fn is_kernel_nop5(bytes: &[u8]) -> bool {
    bytes == NOP5 || bytes == K8_NOP5
}

/// `endbr64`: with IBT (-fcf-protection) it precedes the site at a function's
/// entry, so the site is at function start + 4.
pub const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];
/// The symbol a site calls when enabled (gcc -mfentry).
pub const FENTRY: &str = "__fentry__";

/// Why the site table could not be built.
#[derive(Debug, thiserror::Error)]
pub enum SiteError {
    #[error("{}: none of its {entries} __mcount_loc entries is at a function entry; the symbol table does not match the table (pass the vmlinux the guest was built from)", path.display())]
    NoSites {
        path: std::path::PathBuf,
        entries: usize,
    },
    #[error(
        "{}: {rejected} of its {entries} __mcount_loc entries are not at a function entry \
         (e.g. {examples}); the symbol table does not match the site table, the vmlinux is \
         corrupt or not the one the kernel was built with",
        path.display()
    )]
    Mismatch {
        path: std::path::PathBuf,
        rejected: usize,
        entries: usize,
        examples: String,
    },
    #[error("{}: {count} functions is more than the tracer can index", path.display())]
    TooManyFunctions {
        path: std::path::PathBuf,
        count: usize,
    },
}

/// No input to name, no remedy but the message's own.
impl crate::advice::TracerAdvice for SiteError {
    fn problem(&self, _: &dyn crate::advice::TracerWords) -> String {
        self.to_string()
    }
}

/// What the bytes at a site hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SiteKind {
    /// Exactly `NOP5`: the site is disabled.
    Nop,
    /// `call rel32` to `__fentry__`: an unpatched `-mfentry` build.
    CallFentry,
    /// Anything else: not a site we recognise, never patch it.
    Other,
    /// A direct entry's first instructions, as the analysis saw them
    /// (`crate::session::direct`; `classify` never says so).
    Entry,
}

/// Classifies the bytes at `site_addr` (at least `SITE_LEN` of them).
/// `fentry_addr` is `__fentry__`'s address, if the image has one.
pub fn classify(bytes: &[u8], site_addr: u64, fentry_addr: Option<u64>) -> SiteKind {
    let Some(bytes) = bytes.get(..SITE_LEN) else {
        return SiteKind::Other;
    };
    let mut decoder = Decoder::with_ip(64, bytes, site_addr, DecoderOptions::NONE);
    let insn = decoder.decode();
    if insn.is_invalid() || insn.len() != SITE_LEN {
        return SiteKind::Other;
    }
    match insn.code() {
        // Other 5-byte NOP encodings exist; the kernel only ever writes these.
        _ if is_kernel_nop5(bytes) => SiteKind::Nop,
        Code::Call_rel32_64 if Some(insn.near_branch64()) == fentry_addr => SiteKind::CallFentry,
        _ => SiteKind::Other,
    }
}

/// One ftrace call site.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Site {
    pub addr: u64,
    /// Index into `KernelImage::functions`.
    pub func: u32,
    /// Inside the init text, which the kernel frees after boot.
    pub init: bool,
}

/// How many rejected entries `SiteTable` names.
pub const REJECTED_EXAMPLES: usize = 5;
/// A table with more than this share of rejected entries (in percent of its
/// non-zero entries) does not belong to this symbol table: refused (a real
/// vmlinux has a few stale ones, e.g. 72 of 9,657 in 6.1's: under 1%) ...
pub const MAX_REJECTED_PERCENT: usize = 10;
/// ... provided at least this many are rejected: in a tiny table one or two
/// stale entries (overridden weak functions) are no mismatch.
pub const MIN_MISMATCH_REJECTED: usize = 4;

/// An `__mcount_loc` entry that is not a usable site: not at a function's
/// entry, or its bytes in the file are neither `NOP5` nor `call __fentry__`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectedSite {
    pub addr: u64,
    /// The function containing `addr` and the offset into it, if any; none
    /// for a `weak` one.
    pub function: Option<(String, u64)>,
    /// Its bytes are a site's, but no function starts there: the code of an
    /// overridden `__weak` function, which the linker keeps but whose symbol
    /// it drops. The kernel's ftrace disables these too (`test_for_valid_rec`,
    /// kernel/trace/ftrace.c: a site more than `endbr64` past the symbol
    /// kallsyms finds). Not named after the symbol before it: with kallsyms'
    /// sizes (up to the next symbol) that is another function.
    pub weak: bool,
}

impl std::fmt::Display for RejectedSite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.function {
            _ if self.weak => write!(f, "{:#x} (overridden __weak)", self.addr),
            Some((name, 0)) => write!(f, "{name} ({:#x})", self.addr),
            Some((name, off)) => write!(f, "{name}+{off:#x} ({:#x})", self.addr),
            None => write!(f, "{:#x} (in no function)", self.addr),
        }
    }
}

/// The image's usable ftrace call sites, sorted by address.
#[derive(Debug, Clone)]
pub struct SiteTable {
    pub sites: Vec<Site>,
    /// Distinct non-zero `__mcount_loc` entries (zero entries are those the
    /// build blanked, e.g. of discarded weak functions: not counted).
    pub entries: usize,
    /// How many of them were left out: not at a function entry, or not
    /// holding a site's bytes (never patched, so never traced).
    pub rejected: usize,
    /// How many of them are the code of overridden `__weak` functions
    /// (`RejectedSite::weak`): normal in a Linux kernel, whose ftrace leaves
    /// them out too.
    pub weak: usize,
    /// The first `REJECTED_EXAMPLES` of them, by address.
    pub rejected_examples: Vec<RejectedSite>,
}

impl SiteTable {
    /// Maps each `__mcount_loc` entry to its function. A site is at the
    /// function's start, or at start + 4 behind `endbr64`, and its file bytes
    /// must be `NOP5` or a call to `__fentry__`. Other entries are stale (an
    /// overridden weak function, or zeroed by the build) and are left out,
    /// never patched.
    pub fn build(image: &KernelImage) -> Result<SiteTable, SiteError> {
        if u32::try_from(image.functions.len()).is_err() {
            return Err(SiteError::TooManyFunctions {
                path: image.path.clone(),
                count: image.functions.len(),
            });
        }
        let fentry = image.symbol(FENTRY).map(|s| s.addr);
        let mut entries = image.mcount_loc.clone();
        entries.sort_unstable();
        entries.dedup();
        entries.retain(|&a| a != 0);

        let mut sites = Vec::with_capacity(entries.len());
        let (mut rejected, mut weak) = (0, 0);
        let mut rejected_examples = Vec::new();
        for &addr in &entries {
            let is_site = image
                .file_bytes(addr, SITE_LEN)
                .is_some_and(|b| classify(b, addr, fentry) != SiteKind::Other);
            let func = site_function(image, addr).filter(|_| is_site);
            let Some(func) = func else {
                rejected += 1;
                // A site's bytes, no function's entry: see RejectedSite::weak.
                let is_weak = is_site;
                weak += usize::from(is_weak);
                if rejected_examples.len() < REJECTED_EXAMPLES {
                    rejected_examples.push(RejectedSite {
                        addr,
                        function: image
                            .function_at(addr)
                            .filter(|_| !is_weak)
                            .map(|f| (f.name.clone(), addr - f.addr)),
                        weak: is_weak,
                    });
                }
                continue;
            };
            let init = image
                .init_text
                .is_some_and(|(start, end)| (start..end).contains(&addr));
            // Fits: checked against functions.len() above.
            let func = func as u32;
            sites.push(Site { addr, func, init });
        }
        if sites.is_empty() {
            return Err(SiteError::NoSites {
                path: image.path.clone(),
                entries: entries.len(),
            });
        }
        let table = SiteTable {
            sites,
            entries: entries.len(),
            rejected,
            weak,
            rejected_examples,
        };
        if rejected >= MIN_MISMATCH_REJECTED
            && rejected.saturating_mul(100) > entries.len().saturating_mul(MAX_REJECTED_PERCENT)
        {
            return Err(SiteError::Mismatch {
                path: image.path.clone(),
                rejected,
                entries: entries.len(),
                examples: table.rejected_names(),
            });
        }
        Ok(table)
    }

    /// The rejected entries for a report, e.g. "3 sites not at a function
    /// entry: foo+0x1 (0xffffffff81000001), ..."; or, when all are code of
    /// overridden `__weak` functions, "72 sites in overridden __weak
    /// functions ...: 0xffffffff8100096c, ..."; None when there are none.
    pub fn rejected_summary(&self) -> Option<String> {
        let s = if self.rejected == 1 { "" } else { "s" };
        if self.rejected > 0 && self.rejected == self.weak {
            let mut addrs: Vec<String> = self
                .rejected_examples
                .iter()
                .map(|r| format!("{:#x}", r.addr))
                .collect();
            if self.rejected > self.rejected_examples.len() {
                addrs.push("...".into());
            }
            return Some(format!(
                "{} site{s} in overridden __weak functions (code without a symbol; \
                 the kernel's ftrace disables them too): {}",
                self.rejected,
                addrs.join(", ")
            ));
        }
        (self.rejected > 0).then(|| {
            format!(
                "{} site{s} not at a function entry: {}",
                self.rejected,
                self.rejected_names()
            )
        })
    }

    /// Whether some rejected entry is other than an overridden `__weak`
    /// function's (those are normal: `RejectedSite::weak`).
    pub fn rejected_unexpected(&self) -> bool {
        self.rejected > self.weak
    }

    /// The named examples, comma-separated, with "..." when there are more.
    fn rejected_names(&self) -> String {
        let mut names: Vec<String> = self
            .rejected_examples
            .iter()
            .map(ToString::to_string)
            .collect();
        if self.rejected > self.rejected_examples.len() {
            names.push("...".into());
        }
        names.join(", ")
    }

    pub fn len(&self) -> usize {
        self.sites.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sites.is_empty()
    }
}

/// The function whose entry site is at `addr`, if any.
pub(crate) fn site_function(image: &KernelImage, addr: u64) -> Option<usize> {
    let idx = image.function_index_at(addr)?;
    let start = image.functions[idx].addr;
    let at_entry = addr == start
        || (start.checked_add(ENDBR64.len() as u64) == Some(addr)
            && image.file_bytes(start, ENDBR64.len()) == Some(&ENDBR64[..]));
    at_entry.then_some(idx)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SITE: u64 = 0xffff_ffff_8100_0010;
    const FENTRY_ADDR: u64 = 0xffff_ffff_8100_0000;

    /// `call rel32` at SITE to `target`.
    fn call_to(target: u64) -> [u8; 5] {
        let rel = target.wrapping_sub(SITE + 5) as i64 as i32;
        let r = rel.to_le_bytes();
        [0xe8, r[0], r[1], r[2], r[3]]
    }

    #[test]
    fn nop5_is_nop() {
        assert_eq!(classify(&NOP5, SITE, None), SiteKind::Nop);
        assert_eq!(classify(&NOP5, SITE, Some(FENTRY_ADDR)), SiteKind::Nop);
    }

    /// 5.10's NOP on an AMD family 0xf CPU (QEMU's `qemu64`) is one too.
    #[test]
    fn k8_nop5_is_nop() {
        assert_eq!(classify(&K8_NOP5, SITE, Some(FENTRY_ADDR)), SiteKind::Nop);
        // Four NOPs of 66 90, 90 are not one 5-byte instruction.
        let split = [0x66, 0x90, 0x66, 0x90, 0x90];
        assert_eq!(classify(&split, SITE, None), SiteKind::Other);
    }

    #[test]
    fn call_to_fentry_is_call() {
        let call = call_to(FENTRY_ADDR);
        assert_eq!(
            classify(&call, SITE, Some(FENTRY_ADDR)),
            SiteKind::CallFentry
        );
        // Longer buffers are fine: only the first 5 bytes count.
        let mut long = call.to_vec();
        long.extend_from_slice(&[0x90, 0xc3]);
        assert_eq!(
            classify(&long, SITE, Some(FENTRY_ADDR)),
            SiteKind::CallFentry
        );
    }

    #[test]
    fn call_elsewhere_or_without_fentry_is_other() {
        let call = call_to(FENTRY_ADDR + 0x40);
        assert_eq!(classify(&call, SITE, Some(FENTRY_ADDR)), SiteKind::Other);
        assert_eq!(classify(&call_to(FENTRY_ADDR), SITE, None), SiteKind::Other);
    }

    #[test]
    fn breakpoint_and_other_nops_are_other() {
        let int3 = [0xcc, 0x90, 0x90, 0x90, 0x90];
        assert_eq!(classify(&int3, SITE, Some(FENTRY_ADDR)), SiteKind::Other);
        // nopw 0x0(%rax): a 5-byte NOP, but not the kernel's.
        let nopw = [0x66, 0x0f, 0x1f, 0x40, 0x00];
        assert_eq!(classify(&nopw, SITE, None), SiteKind::Other);
        // nopl 0x0(%rax) is 4 bytes: too short.
        assert_eq!(
            classify(&[0x0f, 0x1f, 0x40, 0x00, 0x90], SITE, None),
            SiteKind::Other
        );
        assert_eq!(classify(&NOP5[..4], SITE, None), SiteKind::Other);
        assert_eq!(classify(&[0xff; 5], SITE, None), SiteKind::Other);
    }
}
