//! Direct entries in a live session: each traced function's first
//! instructions (`crate::kernel::direct::DirectSite`, proved safe from the
//! image) become `jmp` to a stub of its own in vmtrace's code page
//! (`stub`), which records the call and runs them relocated.
//!
//! At each attach, under the pause, before anything is written:
//! - the displaced bytes are read from the running kernel and decoded:
//!   they must be the instructions the analysis saw (the same opcodes and
//!   lengths; KASLR may have relocated an immediate, which the stub then
//!   runs as the kernel has it), else the site is left alone and counted;
//! - no guest context may be inside them past their first byte
//!   (`contexts`): a vCPU's RIP, or an interrupted context or return
//!   address on its stack. A site with one waits for a later pause.
//!
//! Stubs sit at the end of the code page, one `STUB_SLOT` each, site k's
//! at a fixed place; a later attach writes the same bytes there. They are
//! never freed or reused while the guest runs: a task interrupted in a
//! stub's relocated instructions returns into it after a detach too.

pub mod attach;
pub mod contexts;
#[cfg(test)]
mod kvm_tests;
pub mod stack_windows;
pub mod stub;
pub mod task_walk;

use iced_x86::{Decoder, DecoderOptions, Instruction};
use vm_memory::GuestAddress;
use vmm::gva::AddressSpace;
use vmm::GuestRam;

use crate::kernel::direct::DirectSite;
use crate::kernel::sites::{classify, is_kernel_nop5, SiteKind, SITE_LEN};
use crate::kernel::symbols::KernelImage;
use crate::plan::exitless::layout::{
    direct_stubs_len, CODE_GPA, CODE_VA, RETURN_TRAP_OFF, STUB_SLOT,
};
use crate::plan::Plan;
use crate::session::patch::{PatchError, Surveyed};
pub use stub::Head;

/// `int3`: what a spare stub slot holds until a module's load writes it.
const INT3: u8 = 0xcc;

/// Sites `DirectSites::in_place` looks at.
const IN_PLACE_SITES: usize = 8;

/// The direct sites of a session, in site-index order.
#[derive(Debug)]
pub struct DirectSites {
    /// Site k's analysis (link addresses).
    sites: Vec<DirectSite>,
    /// Offset of site 0's stub in the code page.
    area_off: u64,
    /// Spare stub slots after the sites' (`Plan::direct_spare_stubs`).
    spares: usize,
}

/// One site found ready under the pause.
#[derive(Debug)]
pub struct Ready {
    pub k: usize,
    /// Running address of the displaced bytes.
    pub addr: u64,
    pub len: usize,
    /// The running kernel's displaced instructions, at `addr`.
    pub live: Vec<Instruction>,
}

/// What the survey of the direct sites found.
#[derive(Debug)]
pub enum DirectSurvey {
    /// `ready` can be patched; `changed` sites hold other instructions
    /// than the analysis saw, and are left alone.
    Ready {
        surveyed: Surveyed,
        ready: Vec<Ready>,
        changed: usize,
    },
    /// ftrace sites displaced as NOPs still call `__fentry__`: the guest's
    /// ftrace_init has not converted them yet.
    CallSites { calls: usize, first: u64 },
}

impl DirectSites {
    /// The direct sites of `plan`'s index; None for an ftrace plan.
    pub fn of(plan: &Plan) -> Option<DirectSites> {
        let direct = plan.direct.as_ref()?;
        let sites: Vec<DirectSite> = plan
            .index
            .addrs
            .iter()
            .map(|a| direct.sites[a].clone())
            .collect();
        let spares = plan.direct_spare_stubs();
        let area_off = RETURN_TRAP_OFF - direct_stubs_len(sites.len() + spares);
        Some(DirectSites {
            sites,
            area_off,
            spares,
        })
    }

    pub fn len(&self) -> usize {
        self.sites.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sites.is_empty()
    }

    /// Where site k's stub runs.
    pub fn stub_va(&self, k: usize) -> u64 {
        CODE_VA + self.area_off + k as u64 * STUB_SLOT
    }

    /// Is the kernel in place in `mem` (`phys_of`: where a link address
    /// is in guest memory)? Direct entries wait for nothing else: one of
    /// the first sites holds the file's bytes, or the NOP the kernel's
    /// ftrace_init makes of an ftrace site.
    pub fn in_place(
        &self,
        mem: &dyn GuestRam,
        image: &KernelImage,
        phys_of: impl Fn(u64) -> Option<u64>,
    ) -> bool {
        self.sites.iter().take(IN_PLACE_SITES).any(|s| {
            let mut b = [0u8; SITE_LEN];
            let read = phys_of(s.addr)
                .is_some_and(|gpa| mem.read_slice(&mut b, GuestAddress(gpa)).is_ok());
            read && (image.file_bytes(s.addr, SITE_LEN) == Some(&b[..])
                || (s.ftrace_nop && is_kernel_nop5(&b)))
        })
    }

    /// Where each spare stub runs, by spare site (slot): those of the
    /// modules first loaded during the trace (`crate::qemu::module_follow`).
    pub fn spare_stub_vas(&self) -> Vec<u64> {
        let n = self.sites.len();
        (n..n + self.spares).map(|k| self.stub_va(k)).collect()
    }

    /// Fills the spare stub slots with `int3` through `mem` (in a QEMU's
    /// free pages, their pages are backed, and mapped with the rest): a
    /// module's load writes a stub there (`spare_stub_vas`).
    pub fn write_spares(&self, mem: &dyn GuestRam) -> Result<(), PatchError> {
        if self.spares == 0 {
            return Ok(());
        }
        let va = self.stub_va(self.sites.len());
        let gpa = CODE_GPA + (va - CODE_VA);
        let fill = vec![INT3; (self.spares as u64 * STUB_SLOT) as usize];
        mem.write_slice(&fill, GuestAddress(gpa))
            .map_err(|e| PatchError::Memory {
                addr: va,
                gpa,
                why: e.to_string(),
            })
    }

    /// Every stub's address, by site (`SiteIndex::set_stubs`).
    pub fn stub_vas(&self) -> Box<[u64]> {
        (0..self.sites.len()).map(|k| self.stub_va(k)).collect()
    }

    /// Each site's displaced range (running addresses `slide` from the
    /// link ones), by site.
    pub fn ranges(&self, slide: i64) -> Vec<(u64, u64)> {
        self.sites
            .iter()
            .map(|s| {
                let a = s.addr.wrapping_add_signed(slide);
                (a, a + s.len as u64)
            })
            .collect()
    }

    /// Reads every site's displaced bytes at `slide` and checks them
    /// against the analysis. `fentry`: `__fentry__`'s running address;
    /// `wait`: a displaced ftrace site still calling it means the guest's
    /// ftrace_init is not done (else it is patched as a NOP would be).
    pub fn survey(
        &self,
        space: &mut AddressSpace<'_>,
        slide: i64,
        fentry: Option<u64>,
        wait: bool,
    ) -> Result<DirectSurvey, PatchError> {
        let (mut ready, mut found, mut changed, mut skipped) = (vec![], vec![], 0, 0);
        let (mut calls, mut first) = (0, None);
        for (k, site) in self.sites.iter().enumerate() {
            let addr = site.addr.wrapping_add_signed(slide);
            let mut bytes = vec![0u8; site.len];
            let Ok(span) = space.span(addr, SITE_LEN) else {
                skipped += 1;
                continue;
            };
            if space.read(addr, &mut bytes).is_err() {
                skipped += 1;
                continue;
            }
            let live = match site.ftrace_nop {
                true => match classify(&bytes, addr, fentry) {
                    SiteKind::Nop => Some(Vec::new()),
                    SiteKind::CallFentry => {
                        calls += 1;
                        first.get_or_insert(addr);
                        (!wait).then(Vec::new)
                    }
                    _ => None,
                },
                false => same_instructions(site, &bytes, addr),
            };
            let Some(live) = live else {
                changed += 1;
                continue;
            };
            let original: [u8; SITE_LEN] = bytes[..SITE_LEN].try_into().expect("len >= 5");
            found.push((k, addr, span, original));
            let len = site.len;
            ready.push(Ready { k, addr, len, live });
        }
        if let (true, Some(first)) = (wait, first) {
            return Ok(DirectSurvey::CallSites { calls, first });
        }
        Ok(DirectSurvey::Ready {
            surveyed: Surveyed::entries(found, skipped),
            ready,
            changed,
        })
    }

    /// Writes the stub of every ready site (`head(k)`: how site k records)
    /// into the code page through `mem`, and returns the bytes each site
    /// gets (`jmp` to its stub) by site; a site whose stub cannot be made
    /// or reached gets none (it is skipped).
    pub fn write_stubs(
        &self,
        mem: &dyn GuestRam,
        ready: &[Ready],
        head: impl Fn(usize) -> Head,
    ) -> Result<Vec<Option<[u8; SITE_LEN]>>, PatchError> {
        let mut jumps = vec![None; self.sites.len()];
        for r in ready {
            let va = self.stub_va(r.k);
            let Ok(code) = stub::build(r.addr, r.len, &r.live, head(r.k), va) else {
                continue;
            };
            let Some(jump) = stub::jump(r.addr, va) else {
                continue;
            };
            let gpa = CODE_GPA + (va - CODE_VA);
            mem.write_slice(&code, GuestAddress(gpa))
                .map_err(|e| PatchError::Memory {
                    addr: va,
                    gpa,
                    why: e.to_string(),
                })?;
            jumps[r.k] = Some(jump);
        }
        Ok(jumps)
    }
}

/// The running kernel's displaced instructions at `addr`, if they are the
/// analysis's: the same opcodes and lengths (an immediate or displacement
/// may differ: KASLR relocates absolute addresses).
pub(crate) fn same_instructions(
    site: &DirectSite,
    bytes: &[u8],
    addr: u64,
) -> Option<Vec<Instruction>> {
    let mut d = Decoder::with_ip(64, bytes, addr, DecoderOptions::NONE);
    let mut live = Vec::with_capacity(site.insns.len());
    for want in &site.insns {
        let got = d.decode();
        if got.is_invalid() || got.code() != want.code() || got.len() != want.len() {
            return None;
        }
        live.push(got);
    }
    Some(live)
}

/// `patch::write`'s `with` for direct sites: each site's jump, or an error
/// for one whose stub was not made (`write` leaves nothing patched then).
pub fn jump_for(
    jumps: &[Option<[u8; SITE_LEN]>],
    k: usize,
    addr: u64,
) -> Result<[u8; SITE_LEN], PatchError> {
    jumps[k].ok_or_else(|| PatchError::Memory {
        addr,
        gpa: 0,
        why: "no stub could be made for this direct site".into(),
    })
}

/// Keep only the surveyed sites that got a jump.
pub fn keep_stubbed(surveyed: Surveyed, jumps: &[Option<[u8; SITE_LEN]>]) -> Surveyed {
    surveyed.retain(|k| jumps[k].is_some())
}
