//! Rewriting ftrace call sites in guest text, and putting them back.
//!
//! Every write happens while all vCPUs are parked (vmtrace's `stop_machine`),
//! so no vCPU can be executing, or half-way through, a site being changed; the
//! next VM entry is serializing, so each vCPU fetches the new bytes.
//!
//! The trap written over a site is `out TRACE_PORT, al` (2 bytes) followed by a
//! 3-byte NOP, five bytes like the NOP it replaces:
//! - not `int3`: KVM's instruction emulator (which runs guest ring 0 on hosts
//!   like our CI's) cannot execute it, so each hit would need a VMM assist
//!   costing several exits; and on bare metal it needs the guest's #BP path;
//! - not `vmcall`: KVM handles it in the kernel (no exit to vmtrace) and
//!   clobbers RAX with its return value;
//! - `out imm8, al` exits to userspace on every KVM, reads AL but writes no
//!   register, and costs one exit.
//!
//! The trap handler resumes the guest at site + 5, so the 3-byte NOP never runs
//! and no vCPU is ever left between the two instructions.

use iced_x86::{Decoder, DecoderOptions, OpKind};
use vm_memory::GuestAddress;
use vmm::gva::{AddressSpace, PhysSpan};
use vmm::GuestRam;

use crate::advice::{Plain, Remedy, TracerAdvice, TracerWords};
use crate::kernel::sites::{classify, is_kernel_nop5, SiteKind, SITE_LEN};

use crate::kernel::boot_patched::BootPatched;
use crate::kernel::symbols::KernelImage;

pub use crate::plan::traps::{RETURN_TRAP, TRAP};

/// Sites sampled to check that the vmlinux is the running kernel.
const VERIFY_SAMPLES: usize = 32;
/// Bytes after each sampled site compared with the file.
const VERIFY_BODY_LEN: usize = 11;

#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    #[error("no vCPU has paging enabled yet; cannot reach guest text by virtual address")]
    NoPaging,
    #[error(
        "no parked vCPU's page tables map both the kernel's text (at {text:#x}) and its data{}: \
         vmtrace writes only through the kernel's own tables; try again later in the guest's run",
        data.map(|d| format!(" (at {d:#x})")).unwrap_or_default()
    )]
    NoKernelTables { text: u64, data: Option<u64> },
    #[error("{}", self.say(&Plain))]
    Mismatch {
        path: String,
        bad: usize,
        sampled: usize,
        func: String,
        addr: u64,
        why: String,
    },
    #[error("guest memory at {addr:#x} (guest physical {gpa:#x}) cannot be accessed: {why}")]
    Memory { addr: u64, gpa: u64, why: String },
    /// Direct entries on a preemptible kernel: its tasks could not be
    /// walked at any attempt.
    #[error("{0}: direct entries cannot be proved safe from preempted tasks")]
    TaskWalk(String),
    #[error(
        "event {event}: its static key at {addr:#x} has an enabled count of {count}: the \
         guest traces the event itself, and vmtrace leaves its key to it"
    )]
    EventKeyEnabled {
        event: String,
        addr: u64,
        count: u32,
    },
    #[error(
        "site {addr:#x} (guest physical {gpa:#x}) read back {found} after restoring {original}"
    )]
    RestoreFailed {
        addr: u64,
        gpa: u64,
        found: String,
        original: String,
    },
}

impl TracerAdvice for PatchError {
    fn problem(&self, _: &dyn TracerWords) -> String {
        match self {
            PatchError::Mismatch {
                path,
                bad,
                sampled,
                func,
                addr,
                why,
            } => format!(
                "{path} does not match the running kernel: {bad} of {sampled} sampled sites \
                 differ (first: {func} at {addr:#x}: {why})"
            ),
            e => e.to_string(),
        }
    }

    fn remedy(&self) -> Option<Remedy> {
        match self {
            PatchError::Mismatch { .. } => Some(Remedy::SameBuildVmlinux),
            _ => None,
        }
    }
}

/// One site as written: where its bytes are in guest physical memory and
/// what they were.
#[derive(Clone, Debug)]
pub struct PatchedSite {
    pub addr: u64,
    /// Where its 5 bytes are in guest physical memory (a site may straddle
    /// pages); detach needs no vCPU and no walk.
    span: PhysSpan,
    pub original: [u8; SITE_LEN],
    /// What vmtrace wrote: the trap, or a call to the site's trampoline stub.
    pub written: [u8; SITE_LEN],
}

impl PatchedSite {
    /// Does the site hold its original bytes (a detach restored it)?
    pub fn holds_original(&self, mem: &dyn GuestRam) -> bool {
        read_span(mem, self.addr, &self.span).is_ok_and(|b| b == self.original)
    }
}

/// Outcome of one attach. Sites in init text are never tried: the plan
/// counts them (`Plan::skipped_init`).
#[derive(Clone, Debug, Default)]
pub struct AttachCounts {
    pub patched: usize,
    /// Held neither a NOP nor `call __fentry__`, or were unmapped.
    pub skipped_other: usize,
    /// Exitless mode: how vmtrace's region went into the guest's tables.
    pub exitless: Option<crate::session::exitless::map::Mapped>,
    /// Direct entries whose first instructions in the running kernel are
    /// not those the analysis saw: left alone.
    pub direct_changed: usize,
    /// Direct entries left out because a guest context stayed inside their
    /// displaced bytes at every try (`session::direct::contexts`).
    pub direct_busy: usize,
    /// Tasks whose stacks the direct attach checked (every task with a
    /// stack, on a preemptible kernel; the vCPUs' own are checked besides).
    pub direct_tasks: usize,
    /// What the attach did to keep the guest's own ftrace off the sites
    /// (`session::guest_ftrace`).
    pub guest_ftrace: crate::session::guest_ftrace::Guarded,
    /// `-e` on the own VMM: the `tp->funcs` tests trapped, and the keys
    /// whose counts were set (`session::event_keys`).
    pub event_tests: usize,
    pub event_keys: usize,
    /// The own VMM: its traps in the module loader
    /// (`crate::session::module_traps`).
    pub module_traps: usize,
}

/// Outcome of one detach.
#[derive(Clone, Debug, Default)]
pub struct DetachCounts {
    pub restored: usize,
    /// Sites whose trap had been overwritten by someone else: left alone.
    pub changed: usize,
    /// Sites of modules the guest unloaded during the trace: their text
    /// is freed, never written (`crate::kernel::modules::still_loaded`).
    pub module_gone: usize,
    /// Trap mode: how often a traced module went away (its breakpoints
    /// removed before its text was freed) and came back (traced again),
    /// and its sites not traced again (their code differed).
    pub module_unloads: usize,
    pub module_reloads: usize,
    pub module_untraced: usize,
    /// Exitless mode: sites of a module loaded again left untraced, the
    /// guest's own ftrace using them (or changing its records) then.
    pub module_in_use: usize,
    /// Exitless mode: sites given their bytes back at those unloads.
    pub module_restored: usize,
    /// Event call sites (and exitless mode's `tp->funcs` loads) of a
    /// traced module given back at its unloads, before its memory was
    /// freed.
    pub module_event_sites: usize,
    /// Event call sites (and loads) of a traced module unloaded where its
    /// unload was not followed, left alone at the detach: its memory is
    /// freed.
    pub module_event_sites_freed: usize,
    /// Its events traced again at its loads, and those left untraced
    /// (their code there differed from the attach's).
    pub module_events_again: usize,
    pub module_events_untraced: usize,
    /// Exitless mode: direct entries of a module loaded again elsewhere
    /// left untraced: each displaced other instructions than its ftrace
    /// NOP, which its stub runs relocated for the first address only.
    pub module_displaced: usize,
    /// Modules first loaded during the trace and traced (their unloads
    /// and later loads counted with the others'), and their functions'
    /// loads left untraced for want of a spare slot.
    pub module_first: usize,
    pub module_unslotted: usize,
    /// `--entry direct`: their functions the selection took that were
    /// refused a direct entry, by rule (`crate::session::module_direct`).
    pub module_refused: Option<String>,
    /// The own VMM: exits at its traps in the module loader
    /// (`crate::session::module_traps`).
    pub module_trap_exits: u64,
    /// The guest ftrace's records of the sites, given back to it or not.
    pub guest_ftrace: crate::kernel::ftrace_records::Reenabled,
    /// `-e` on the own VMM: the keys' counts set back to 0.
    pub event_keys: usize,
}

/// Check that guest text matches the file at a sample of sites: each site
/// holds a NOP or `call __fentry__`, and the bytes after it are the file's,
/// but for those the kernel rewrites itself (`patched`: alternatives,
/// paravirt, retpoline, return-thunk, call-depth and CFI sites, LOCK
/// prefixes, sealed `endbr64`s, jump labels, static calls and trampolines). Refuses when more than half the sample differs (a
/// few may differ where KASLR relocated an absolute address). `sites` are
/// running addresses, `slide` bytes from the file's (KASLR's virtual
/// offset); `direct`: they are direct entries (any instruction).
pub fn verify_image(
    space: &mut AddressSpace<'_>,
    image: &KernelImage,
    patched: &BootPatched,
    sites: &[u64],
    slide: i64,
    direct: bool,
) -> Result<(), PatchError> {
    let link = |addr: u64| addr.wrapping_sub(slide as u64);
    let fentry = image
        .symbol(crate::kernel::sites::FENTRY)
        .map(|s| s.addr.wrapping_add_signed(slide));
    let step = (sites.len() / VERIFY_SAMPLES).max(1);
    let sample: Vec<u64> = sites
        .iter()
        .step_by(step)
        .take(VERIFY_SAMPLES)
        .copied()
        .collect();
    let mut bad = Vec::new();
    for &addr in &sample {
        let why = match space.read_array::<{ SITE_LEN + VERIFY_BODY_LEN }>(addr) {
            Err(e) => Some(format!("unreadable ({e})")),
            Ok(bytes) => {
                let body = image.file_bytes(link(addr) + SITE_LEN as u64, VERIFY_BODY_LEN);
                // A direct site holds the function's own first
                // instructions (or vmtrace's jump): only its body is
                // compared.
                if !direct
                    && classify(&bytes[..SITE_LEN], addr, fentry) == SiteKind::Other
                    && bytes[..SITE_LEN] != TRAP
                {
                    Some(format!("site holds {}", hex(&bytes[..SITE_LEN])))
                } else if body.is_some_and(|b| {
                    let body_at = link(addr) + SITE_LEN as u64;
                    let relocated = relocatable(b, body_at);
                    b.iter()
                        .zip(&bytes[SITE_LEN..])
                        .enumerate()
                        .any(|(i, (f, r))| {
                            f != r && !relocated[i] && !patched.covers(body_at + i as u64)
                        })
                }) {
                    Some("function body differs from the file".to_string())
                } else {
                    None
                }
            }
        };
        if let Some(why) = why {
            bad.push((addr, why));
        }
    }
    if !sample.is_empty() && bad.len() * 2 > sample.len() {
        let (addr, why) = bad.swap_remove(0);
        let func = image
            .function_at(link(addr))
            .map(|s| s.name.clone())
            .unwrap_or_else(|| "?".into());
        return Err(PatchError::Mismatch {
            path: image.path.display().to_string(),
            bad: bad.len() + 1,
            sampled: sample.len(),
            func,
            addr,
            why,
        });
    }
    Ok(())
}

/// The kernel's own addresses start here when sign-extended from 32 bits
/// (`__START_KERNEL_map`): an operand at or above it is an absolute kernel
/// address, which KASLR relocates.
const KERNEL_ABS: u64 = 0xffff_ffff_8000_0000;

/// Which bytes of `code` (at link address `at`) KASLR may have changed:
/// displacements and immediates that hold kernel addresses (absolute, or
/// RIP-relative to per-CPU data, which KASLR's inverse relocations move).
/// Opcodes, registers and the other operands must match the file.
fn relocatable(code: &[u8], at: u64) -> Vec<bool> {
    let mut out = vec![false; code.len()];
    let mut d = Decoder::with_ip(64, code, at, DecoderOptions::NONE);
    while d.can_decode() {
        let start = (d.ip() - at) as usize;
        let insn = d.decode();
        if insn.is_invalid() {
            break;
        }
        let offs = d.get_constant_offsets(&insn);
        let mut mask = |off: usize, size: usize| {
            for b in out.iter_mut().skip(start + off).take(size) {
                *b = true;
            }
        };
        let kernel = |v: u64| v >= KERNEL_ABS;
        if offs.has_displacement()
            && (insn.is_ip_rel_memory_operand() || kernel(insn.memory_displacement64()))
        {
            mask(offs.displacement_offset(), offs.displacement_size());
        }
        let imm = (0..insn.op_count()).find(|&i| {
            matches!(
                insn.op_kind(i),
                OpKind::Immediate32 | OpKind::Immediate64 | OpKind::Immediate32to64
            )
        });
        if offs.has_immediate() && imm.is_some_and(|i| kernel(insn.immediate(i))) {
            mask(offs.immediate_offset(), offs.immediate_size());
        }
    }
    out
}

pub fn hex(b: &[u8]) -> String {
    b.iter()
        .map(|x| format!("{x:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whose job it is to turn `call __fentry__` into a NOP at boot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallSites {
    /// Nobody's (a guest built without ftrace, like the mini guest): a site
    /// that still calls `__fentry__` is patched like a NOP and restored as a call.
    Patch,
    /// The guest's own ftrace_init converts every site: one that still holds
    /// the call means it has not finished (it converts in address order and
    /// checks each site's old bytes first; finding vmtrace's trap there is its
    /// `ftrace_bug`). Write nothing; the caller resumes the guest and retries.
    Wait,
}

/// The outcome of one attach attempt (`attach`).
#[derive(Debug)]
pub enum Attempt {
    /// Every site that held a NOP (or a call, with `CallSites::Patch`) now
    /// holds the trap; `skipped` held something else or was unmapped.
    Patched {
        sites: Vec<PatchedSite>,
        skipped: usize,
    },
    /// Nothing was written: `calls` sites still hold `call __fentry__`, the
    /// first at `first`.
    GuestNotReady { calls: usize, first: u64 },
}

/// A selected site as found under the pause.
#[derive(Debug)]
struct Found {
    k: usize,
    addr: u64,
    span: PhysSpan,
    original: [u8; SITE_LEN],
    kind: SiteKind,
}

/// Every selected site read and classified, nothing written yet: what an
/// attach decides on before it changes anything in the guest (its text, or
/// vmtrace's own pages and page-table entries).
#[derive(Debug)]
pub enum Survey {
    /// The guest is ready: `write` patches what was found.
    Ready(Surveyed),
    /// `calls` sites still hold `call __fentry__`, the first at `first`.
    GuestNotReady { calls: usize, first: u64 },
}

/// The sites of a ready survey.
#[derive(Debug)]
pub struct Surveyed {
    found: Vec<Found>,
    /// Unmapped sites.
    skipped: usize,
}

impl Surveyed {
    /// Direct entries found ready: (site index, running address, its
    /// first 5 bytes' place, those bytes); `skipped` others.
    pub fn entries(found: Vec<(usize, u64, PhysSpan, [u8; SITE_LEN])>, skipped: usize) -> Surveyed {
        let found = found
            .into_iter()
            .map(|(k, addr, span, original)| Found {
                k,
                addr,
                span,
                original,
                kind: SiteKind::Entry,
            })
            .collect();
        Surveyed { found, skipped }
    }

    /// Only the sites `keep(k)` keeps; the others are counted as skipped.
    pub fn retain(mut self, keep: impl Fn(usize) -> bool) -> Surveyed {
        let before = self.found.len();
        self.found.retain(|f| keep(f.k));
        self.skipped += before - self.found.len();
        self
    }

    /// (site index, running address, would `write` write it: all but
    /// those holding something else) of every site found.
    pub fn sites(&self) -> Vec<(usize, u64, bool)> {
        self.found
            .iter()
            .map(|f| (f.k, f.addr, f.kind != SiteKind::Other))
            .collect()
    }

    /// The running addresses of the sites found holding the 5-byte NOP
    /// (where moving RIP 5 bytes on is what running the site does), and
    /// how many others were found (unmapped, or holding anything else).
    pub fn nops(&self) -> (Vec<u64>, usize) {
        let nops: Vec<u64> = self
            .found
            .iter()
            .filter(|f| f.kind == SiteKind::Nop)
            .map(|f| f.addr)
            .collect();
        let others = self.skipped + self.found.len() - nops.len();
        (nops, others)
    }
}

/// Read and classify every site in `sites` (running addresses); with
/// `CallSites::Wait`, one that still calls `__fentry__` makes the guest not
/// ready. Reads only. The caller holds every vCPU parked.
pub fn survey(
    space: &mut AddressSpace<'_>,
    fentry: Option<u64>,
    sites: &[u64],
    calls: CallSites,
) -> Result<Survey, PatchError> {
    let mut found = Vec::with_capacity(sites.len());
    let mut skipped = 0;
    let (mut ncalls, mut first_call) = (0, None);
    for (k, &addr) in sites.iter().enumerate() {
        let Ok(span) = space.span(addr, SITE_LEN) else {
            skipped += 1;
            continue;
        };
        let mem = space.memory();
        let original = read_span(mem, addr, &span)?;
        let kind = classify(&original, addr, fentry);
        if kind == SiteKind::CallFentry {
            ncalls += 1;
            first_call.get_or_insert(addr);
        }
        found.push(Found {
            k,
            addr,
            span,
            original,
            kind,
        });
    }
    if let (CallSites::Wait, Some(first)) = (calls, first_call) {
        return Ok(Survey::GuestNotReady {
            calls: ncalls,
            first,
        });
    }
    Ok(Survey::Ready(Surveyed { found, skipped }))
}

/// Write the trap over every site in `sites` that holds a NOP (or a call to
/// `__fentry__`, per `calls`), decoded first; skip and count anything else.
/// Every site is read and classified before the first byte is written, so an
/// attempt that finds the guest not ready leaves its text untouched. The
/// caller holds every vCPU parked.
pub fn attach(
    space: &mut AddressSpace<'_>,
    fentry: Option<u64>,
    sites: &[u64],
    calls: CallSites,
) -> Result<Attempt, PatchError> {
    attach_with(space, fentry, sites, calls, |_, _| Ok(TRAP))
}

/// `attach`, writing `with(k, addr)` over site k (at `addr`) instead of the
/// trap: e.g. a call to vmtrace's trampoline stub for that site.
pub fn attach_with(
    space: &mut AddressSpace<'_>,
    fentry: Option<u64>,
    sites: &[u64],
    calls: CallSites,
    with: impl Fn(usize, u64) -> Result<[u8; SITE_LEN], PatchError>,
) -> Result<Attempt, PatchError> {
    match survey(space, fentry, sites, calls)? {
        Survey::Ready(s) => {
            let (sites, skipped) = write(space.memory(), s, with)?;
            Ok(Attempt::Patched { sites, skipped })
        }
        Survey::GuestNotReady { calls, first } => Ok(Attempt::GuestNotReady { calls, first }),
    }
}

/// Write `with(k, addr)` over every site a ready survey found holding a NOP
/// (or a call, with `CallSites::Patch`); on an error, every site written so
/// far is restored first. Returns the sites written and how many were
/// skipped (unmapped, or holding something else).
pub fn write(
    mem: &dyn GuestRam,
    surveyed: Surveyed,
    with: impl Fn(usize, u64) -> Result<[u8; SITE_LEN], PatchError>,
) -> Result<(Vec<PatchedSite>, usize), PatchError> {
    let Surveyed { found, mut skipped } = surveyed;
    let mut patched = Vec::with_capacity(found.len());
    for f in found {
        if f.kind == SiteKind::Other {
            skipped += 1;
            continue;
        }
        let written = match with(f.k, f.addr)
            .and_then(|bytes| write_span(mem, f.addr, &f.span, &bytes).map(|()| bytes))
        {
            Ok(bytes) => bytes,
            Err(e) => {
                // Leave no site patched behind an error.
                detach(mem, &patched)?;
                return Err(e);
            }
        };
        patched.push(PatchedSite {
            addr: f.addr,
            span: f.span,
            original: f.original,
            written,
        });
    }
    Ok((patched, skipped))
}

/// Put back the original bytes of every patched site that still holds what
/// vmtrace wrote (read, compare, write, read back). Works on guest physical addresses
/// recorded at attach, so it needs no vCPU: it also runs after the guest has
/// stopped. The caller holds every vCPU parked or stopped.
pub fn detach(mem: &dyn GuestRam, patched: &[PatchedSite]) -> Result<DetachCounts, PatchError> {
    let mut counts = DetachCounts::default();
    for site in patched {
        let now = read_span(mem, site.addr, &site.span)?;
        if now != site.written {
            counts.changed += 1;
            continue;
        }
        write_span(mem, site.addr, &site.span, &site.original)?;
        let back = read_span(mem, site.addr, &site.span)?;
        if back != site.original {
            return Err(PatchError::RestoreFailed {
                addr: site.addr,
                gpa: site.span.start(),
                found: hex(&back),
                original: hex(&site.original),
            });
        }
        counts.restored += 1;
    }
    Ok(counts)
}

/// The 5 bytes of the site at `addr`, pinned at `span`.
fn read_span(mem: &dyn GuestRam, addr: u64, span: &PhysSpan) -> Result<[u8; SITE_LEN], PatchError> {
    let mut b = [0u8; SITE_LEN];
    span.read(mem, &mut b).map_err(|e| PatchError::Memory {
        addr,
        gpa: span.start(),
        why: e.to_string(),
    })?;
    Ok(b)
}

fn write_span(
    mem: &dyn GuestRam,
    addr: u64,
    span: &PhysSpan,
    bytes: &[u8; SITE_LEN],
) -> Result<(), PatchError> {
    span.write(mem, bytes).map_err(|e| PatchError::Memory {
        addr,
        gpa: span.start(),
        why: e.to_string(),
    })
}

/// Is the site at `addr` (read through guest physical memory at `gpa`) a
/// plain NOP yet? Used to wait for the guest's own ftrace_init.
pub fn is_nop(mem: &dyn GuestRam, gpa: u64) -> bool {
    let mut b = [0u8; SITE_LEN];
    mem.read_slice(&mut b, GuestAddress(gpa)).is_ok() && is_kernel_nop5(&b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::sites::NOP5;
    use iced_x86::{Decoder, DecoderOptions, Mnemonic};
    use vm_memory::{Bytes, GuestMemoryMmap};
    use vmm::gva::PagingMode;

    #[test]
    fn trap_is_out_then_three_byte_nop() {
        let mut d = Decoder::with_ip(64, &TRAP, 0, DecoderOptions::NONE);
        let out = d.decode();
        assert_eq!(out.mnemonic(), Mnemonic::Out);
        assert_eq!(out.len(), 2);
        assert_eq!(out.immediate8(), vmm::layout::TRACE_PORT as u8);
        let nop = d.decode();
        assert_eq!(nop.mnemonic(), Mnemonic::Nop);
        assert_eq!(nop.len(), 3);
    }

    fn mem_with_identity_tables() -> GuestMemoryMmap {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 64 << 20)]).unwrap();
        vmm::boot::regs::setup_page_tables(&mem).unwrap();
        mem
    }

    #[test]
    fn attach_writes_only_nops_and_detach_restores_bytes() {
        let mem = mem_with_identity_tables();
        let base = 0xffff_ffff_8100_0000u64;
        let phys = 0x100_0000u64;
        // Site 0: NOP5; site 1: something else; site 2: NOP5 straddling a page.
        mem.write_slice(&NOP5, GuestAddress(phys)).unwrap();
        mem.write_slice(&[0xcc, 0x90, 0x90, 0x90, 0x90], GuestAddress(phys + 0x100))
            .unwrap();
        mem.write_slice(&NOP5, GuestAddress(phys + 0xffe)).unwrap();
        let sites = [base, base + 0x100, base + 0xffe];
        let mut map = AddressSpace::new(&mem, vmm::layout::PML4_START, PagingMode::Level4);
        let Attempt::Patched {
            sites: patched,
            skipped,
        } = attach(&mut map, None, &sites, CallSites::Wait).unwrap()
        else {
            panic!("no call sites, yet not ready");
        };
        assert_eq!((patched.len(), skipped), (2, 1));
        let mut b = [0u8; 5];
        mem.read_slice(&mut b, GuestAddress(phys + 0xffe)).unwrap();
        assert_eq!(b, TRAP);
        mem.read_slice(&mut b, GuestAddress(phys + 0x100)).unwrap();
        assert_eq!(b, [0xcc, 0x90, 0x90, 0x90, 0x90]);
        // Someone rewrites site 0 behind our back: detach leaves it.
        mem.write_slice(&[0xe8, 1, 2, 3, 4], GuestAddress(phys))
            .unwrap();
        let c = detach(&mem, &patched).unwrap();
        assert_eq!((c.restored, c.changed), (1, 1));
        mem.read_slice(&mut b, GuestAddress(phys + 0xffe)).unwrap();
        assert_eq!(b, NOP5);
    }

    /// `call rel32` at `site` to `target`.
    fn call_to(site: u64, target: u64) -> [u8; SITE_LEN] {
        let rel = (target.wrapping_sub(site + SITE_LEN as u64) as i64) as i32;
        let r = rel.to_le_bytes();
        [0xe8, r[0], r[1], r[2], r[3]]
    }

    #[test]
    fn a_site_still_calling_fentry_makes_a_linux_attach_write_nothing() {
        // The guest's ftrace_init has converted the first site, not the last.
        let mem = mem_with_identity_tables();
        let base = 0xffff_ffff_8100_0000u64;
        let phys = 0x100_0000u64;
        let fentry = base + 0x8000;
        let call = call_to(base + 0x200, fentry);
        mem.write_slice(&NOP5, GuestAddress(phys)).unwrap();
        mem.write_slice(&call, GuestAddress(phys + 0x200)).unwrap();
        let sites = [base, base + 0x200];
        let mut map = AddressSpace::new(&mem, vmm::layout::PML4_START, PagingMode::Level4);
        match attach(&mut map, Some(fentry), &sites, CallSites::Wait).unwrap() {
            Attempt::GuestNotReady { calls, first } => {
                assert_eq!((calls, first), (1, base + 0x200))
            }
            other => panic!("attached while ftrace_init was converting: {other:?}"),
        }
        let mut b = [0u8; 5];
        mem.read_slice(&mut b, GuestAddress(phys)).unwrap();
        assert_eq!(
            b, NOP5,
            "the NOP site was written although the attach was refused"
        );
        mem.read_slice(&mut b, GuestAddress(phys + 0x200)).unwrap();
        assert_eq!(b, call);

        // A guest without ftrace_init (CallSites::Patch): both patched, and
        // the call comes back on detach.
        let Attempt::Patched { sites: p, skipped } =
            attach(&mut map, Some(fentry), &sites, CallSites::Patch).unwrap()
        else {
            panic!("CallSites::Patch never waits");
        };
        assert_eq!((p.len(), skipped), (2, 0));
        mem.read_slice(&mut b, GuestAddress(phys + 0x200)).unwrap();
        assert_eq!(b, TRAP);
        detach(&mem, &p).unwrap();
        mem.read_slice(&mut b, GuestAddress(phys + 0x200)).unwrap();
        assert_eq!(b, call);
    }
}
