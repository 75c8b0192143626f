//! One tracing session over a running guest: choose the sites, attach (patch
//! under a pause), detach (restore), and turn what was recorded into a Trace.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm::gva::PagingMode;
use vmm::pause::VcpuSnapshot;
use vmm::{Paused, TrapHandler};

use crate::filter::{Filter, FilterError};
use crate::patch::{
    self, AttachCounts, Attached, CallSites, DetachCounts, PatchError, PatchedSite, TextMap,
};
use crate::record::{self, SiteIndex};
use crate::sites::{SiteError, SiteTable};
use crate::symbols::{KernelImage, SymbolError};
use crate::trace::{Event, FuncSym, Trace, TraceMeta};

#[derive(Debug, thiserror::Error)]
pub enum TracerError {
    #[error(transparent)]
    Symbols(#[from] SymbolError),
    #[error(transparent)]
    Sites(#[from] SiteError),
    #[error(transparent)]
    Filter(#[from] FilterError),
    #[error(transparent)]
    Patch(#[from] PatchError),
}

/// CR0.PG: paging enabled.
const CR0_PG: u64 = 1 << 31;
/// With page-table isolation, Linux gives each process a pair of top-level
/// tables 8 KiB aligned, the user one 4 KiB above the kernel one, and flips
/// this CR3 bit on every kernel entry and exit (PTI_PGTABLE_SWITCH_BIT in
/// arch/x86/entry/calling.h). The user table maps no kernel text.
const PTI_USER_PGTABLE_BIT: u64 = 1 << 12;
/// Selector bits 1:0 of CS: the privilege level a vCPU runs at.
const CS_RPL_MASK: u16 = 3;
/// The kernel's flag that its ftrace_init has converted every site
/// (`ftrace_enabled`, set to 1 at the end of ftrace_init in kernel/trace/ftrace.c).
pub const FTRACE_ENABLED: &str = "ftrace_enabled";

/// Why an attach attempt wrote nothing; the guest is resumed and the attach
/// retried.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    /// The guest's `ftrace_enabled` is still 0: its ftrace_init is running.
    #[error("the guest's ftrace_init has not finished (ftrace_enabled is 0)")]
    FtraceInitRunning,
    /// `calls` selected sites still hold `call __fentry__` (the first at `first`).
    #[error("{calls} selected sites still call __fentry__ (the first at {first:#x}): the guest's ftrace_init has not converted them yet")]
    CallSites { calls: usize, first: u64 },
}

/// One attach attempt.
#[derive(Debug)]
pub enum Attach<'a> {
    Attached(&'a AttachCounts),
    NotReady(NotReady),
}

impl<'a> Attach<'a> {
    /// The counts of an attach that happened; for callers that cannot wait.
    pub fn attached(self) -> Result<&'a AttachCounts, NotReady> {
        match self {
            Attach::Attached(c) => Ok(c),
            Attach::NotReady(why) => Err(why),
        }
    }
}

/// What to trace, resolved against the vmlinux before the guest boots.
pub struct Plan {
    pub image: KernelImage,
    pub sites: SiteTable,
    /// Traced functions (indices into `image.functions`), in trace order.
    pub funcs: Vec<usize>,
    /// Patchable sites: (address, index into `funcs`); init-text sites are
    /// never patched (the guest frees and reuses that memory).
    pub targets: Vec<(u64, u32)>,
    pub skipped_init: usize,
    /// Address of the guest's `ftrace_enabled`: the guest converts its own
    /// sites at boot, and vmtrace must not write one before it has finished.
    pub ftrace_enabled: Option<u64>,
}

impl Plan {
    pub fn new(vmlinux: &Path, trace: &[String], notrace: &[String]) -> Result<Plan, TracerError> {
        let image = KernelImage::load(vmlinux)?;
        let sites = SiteTable::build(&image)?;
        let selected = Filter::new(trace, notrace)?.select(&image, &sites)?;
        let mut funcs: Vec<usize> = Vec::new();
        let mut func_slot = std::collections::HashMap::new();
        let mut targets = Vec::new();
        let mut skipped_init = 0;
        for i in selected {
            let site = sites.sites[i];
            if site.init {
                skipped_init += 1;
                continue;
            }
            let slot = *func_slot.entry(site.func as usize).or_insert_with(|| {
                funcs.push(site.func as usize);
                funcs.len() as u32 - 1
            });
            targets.push((site.addr, slot));
        }
        let ftrace_enabled = image.symbol(FTRACE_ENABLED).map(|s| s.addr);
        Ok(Plan {
            image,
            sites,
            funcs,
            targets,
            skipped_init,
            ftrace_enabled,
        })
    }
}

/// A tracing session.
pub struct Tracer {
    plan: Plan,
    index: Arc<SiteIndex>,
    shared: Arc<record::Shared>,
    collector: Option<JoinHandle<Vec<Event>>>,
    patched: Vec<PatchedSite>,
    pub attach_counts: AttachCounts,
    /// All detaches of this session, added up.
    pub detached: DetachCounts,
    attach_ns: u64,
    detach_ns: u64,
    attach_window: Duration,
    attach_latency: Duration,
    ncpus: usize,
}

impl Tracer {
    /// The tracer and one trap handler per vCPU.
    pub fn new(plan: Plan, ncpus: usize, max_events: u64) -> (Tracer, Vec<Box<dyn TrapHandler>>) {
        let index = Arc::new(SiteIndex::new(plan.targets.clone()));
        let (shared, recs, collector) = record::recorders(Arc::clone(&index), ncpus, max_events);
        let handlers = recs
            .into_iter()
            .map(|r| Box::new(r) as Box<dyn TrapHandler>)
            .collect();
        let t = Tracer {
            plan,
            index,
            shared,
            collector: Some(collector),
            patched: Vec::new(),
            attach_counts: AttachCounts::default(),
            detached: DetachCounts::default(),
            attach_ns: 0,
            detach_ns: 0,
            attach_window: Duration::ZERO,
            attach_latency: Duration::ZERO,
            ncpus,
        };
        (t, handlers)
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    pub fn is_attached(&self) -> bool {
        !self.patched.is_empty()
    }

    /// Has the guest finished its own ftrace_init? Polled without a pause
    /// through the kernel's fixed physical mapping; only a hint: `attach`
    /// checks again, and every selected site, under the pause. With the
    /// kernel's `ftrace_enabled` known, that flag (set once every site is a
    /// NOP); without it, every selected site must hold a NOP.
    pub fn guest_ready(&self, mem: &GuestMemoryMmap) -> bool {
        let phys = vmm::layout::kernel_virt_to_phys;
        match self.plan.ftrace_enabled {
            Some(va) => phys(va)
                .and_then(|gpa| mem.read_obj::<u32>(GuestAddress(gpa)).ok())
                .is_some_and(|v| v != 0),
            None => self
                .index
                .addrs
                .iter()
                .all(|&a| phys(a).is_some_and(|gpa| patch::is_nop(mem, gpa))),
        }
    }

    /// Patch every target site, if the guest is ready. The guest is paused
    /// by the caller; all writes happen in this one window. When the guest's
    /// own ftrace_init has not finished (its `ftrace_enabled` is 0, or any
    /// selected site still calls `__fentry__`), nothing is written and the
    /// caller should resume the guest and try again.
    pub fn attach(&mut self, paused: &Paused<'_>) -> Result<Attach<'_>, TracerError> {
        let snaps: Vec<VcpuSnapshot> = (0..self.ncpus).filter_map(|c| paused.snapshot(c)).collect();
        let probe = self.index.addrs.first().copied();
        let (cr3, mode) = text_root(paused.memory(), &snaps, probe).ok_or(PatchError::NoPaging)?;
        let mut map = TextMap::new(paused.memory(), cr3, mode);
        if let Some(va) = self.plan.ftrace_enabled {
            if map.read::<4>(va).map(u32::from_le_bytes) == Ok(0) {
                return Ok(Attach::NotReady(NotReady::FtraceInitRunning));
            }
        }
        let addrs = &self.index.addrs;
        patch::verify_image(&mut map, &self.plan.image, addrs)?;
        let fentry = self.plan.image.symbol(crate::sites::FENTRY).map(|s| s.addr);
        let calls = match self.plan.ftrace_enabled {
            Some(_) => CallSites::Wait,
            None => CallSites::Patch,
        };
        let (patched, skipped) = match patch::attach(&mut map, fentry, addrs, calls)? {
            Attached::Patched { sites, skipped } => (sites, skipped),
            Attached::GuestNotReady { calls, first } => {
                return Ok(Attach::NotReady(NotReady::CallSites { calls, first }))
            }
        };
        self.attach_counts = AttachCounts {
            patched: patched.len(),
            skipped_init: self.plan.skipped_init,
            skipped_other: skipped,
        };
        self.patched = patched;
        self.attach_ns = vmm::Trap::now_ns();
        self.attach_window = paused.window();
        self.attach_latency = paused.latency();
        Ok(Attach::Attached(&self.attach_counts))
    }

    /// Restore every patched site. The guest is paused or stopped.
    /// Returns what this detach did; `detached` adds up all of them.
    pub fn detach(&mut self, mem: &GuestMemoryMmap) -> Result<DetachCounts, TracerError> {
        let c = patch::detach(mem, &self.patched)?;
        self.patched.clear();
        self.detached.restored += c.restored;
        self.detached.changed += c.changed;
        self.detach_ns = vmm::Trap::now_ns();
        Ok(c)
    }

    /// Exact calls so far, per traced function and vCPU.
    pub fn counts(&self) -> Vec<Vec<u64>> {
        let mut counts = vec![vec![0u64; self.ncpus]; self.plan.funcs.len()];
        for (cpu, per_site) in self.shared.counts.iter().enumerate() {
            for (i, c) in per_site.iter().enumerate() {
                counts[self.index.funcs[i] as usize][cpu] += c.load(Ordering::Relaxed);
            }
        }
        counts
    }

    /// Everything recorded, once the vCPU threads (and so the recorders) are
    /// gone.
    pub fn finish(mut self, kernel: &Path, stop_reason: String) -> Trace {
        let events = self
            .collector
            .take()
            .map(|c| c.join().unwrap_or_default())
            .unwrap_or_default();
        let image = &self.plan.image;
        let functions: Vec<FuncSym> = self
            .plan
            .funcs
            .iter()
            .map(|&f| {
                let s = &image.functions[f];
                FuncSym {
                    name: s.name.clone(),
                    addr: s.addr,
                    size: s.size,
                }
            })
            .collect();
        let mut callers: Vec<FuncSym> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for e in &events {
            if let Some(i) = image.function_index_at(e.parent) {
                if seen.insert(i) {
                    let s = &image.functions[i];
                    callers.push(FuncSym {
                        name: s.name.clone(),
                        addr: s.addr,
                        size: s.size,
                    });
                }
            }
        }
        callers.sort_by_key(|s| s.addr);
        let counts = self.counts();
        let total: u64 = counts.iter().flatten().sum();
        let detach_ns = if self.detach_ns == 0 {
            vmm::Trap::now_ns()
        } else {
            self.detach_ns
        };
        let meta = TraceMeta {
            kernel: kernel.display().to_string(),
            build_id: image
                .build_id
                .as_ref()
                .map(|b| patch::hex(b).replace(' ', "")),
            cpus: self.ncpus as u32,
            attach_ns: self.attach_ns,
            detach_ns,
            sites_patched: self.attach_counts.patched as u64,
            sites_skipped_init: self.attach_counts.skipped_init as u64,
            sites_skipped_other: self.attach_counts.skipped_other as u64,
            attach_window_ns: self.attach_window.as_nanos() as u64,
            attach_latency_ns: self.attach_latency.as_nanos() as u64,
            events_total: total,
            events_dropped: self.shared.dropped.load(Ordering::Relaxed),
            parent_unreadable: self.shared.parent_unreadable.load(Ordering::Relaxed),
            stop_reason,
        };
        Trace {
            meta,
            functions,
            counts,
            callers,
            events,
        }
    }
}

/// The page tables to reach kernel text through: those of a vCPU with paging
/// on, kernel-mode vCPUs first; with page-table isolation a vCPU in user mode
/// (or on the entry path) has the user table loaded, so its kernel partner
/// (`PTI_USER_PGTABLE_BIT` clear) is tried as well. The first root under
/// which `probe` (a kernel text address) is mapped wins; without a probe,
/// the first paged vCPU's.
fn text_root(
    mem: &GuestMemoryMmap,
    snaps: &[VcpuSnapshot],
    probe: Option<u64>,
) -> Option<(u64, PagingMode)> {
    let mut paged: Vec<&VcpuSnapshot> = snaps.iter().filter(|s| s.sregs.cr0 & CR0_PG != 0).collect();
    // Stable: kernel mode (CPL 0) first, otherwise in vCPU order.
    paged.sort_by_key(|s| s.sregs.cs.selector & CS_RPL_MASK != 0);
    let candidates = paged.iter().flat_map(|s| {
        let mode = PagingMode::from_cr4(s.sregs.cr4);
        [s.sregs.cr3, s.sregs.cr3 & !PTI_USER_PGTABLE_BIT].map(|cr3| (cr3, mode))
    });
    let Some(probe) = probe else {
        return paged.first().map(|s| (s.sregs.cr3, PagingMode::from_cr4(s.sregs.cr4)));
    };
    candidates
        .into_iter()
        .find(|&(cr3, mode)| vmm::gva::translate(mem, cr3, mode, probe).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::Bytes;

    /// A paused vCPU at privilege level `cpl` with `cr3` loaded.
    fn snap(cr3: u64, cpl: u16) -> VcpuSnapshot {
        let mut s = VcpuSnapshot::default();
        s.sregs.cr0 = CR0_PG | 1;
        s.sregs.cr3 = cr3;
        s.sregs.cs.selector = 0x10 | cpl;
        s
    }

    #[test]
    fn attach_reaches_kernel_text_past_a_user_mode_vcpu_under_pti() {
        let mem = vm_memory::GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 64 << 20)]).unwrap();
        vmm::boot::regs::setup_page_tables(&mem).unwrap();
        // A PTI pair: the kernel table (a copy of the boot PML4) 8 KiB
        // aligned, the user table above it, empty, so no kernel text in it.
        let kernel = 0x20_0000u64;
        let user = kernel | PTI_USER_PGTABLE_BIT;
        let mut pml4 = [0u8; 4096];
        mem.read_slice(&mut pml4, GuestAddress(vmm::layout::PML4_START)).unwrap();
        mem.write_slice(&pml4, GuestAddress(kernel)).unwrap();
        mem.write_slice(&[0u8; 4096], GuestAddress(user)).unwrap();
        let text = 0xffff_ffff_8100_0000u64;
        let pcid = 0x5;
        // vCPU 0 in user mode with the user table; vCPU 1 not paged yet.
        let mut unpaged = snap(0, 0);
        unpaged.sregs.cr0 = 0;
        let snaps = [snap(user | pcid, 3), unpaged];
        let (cr3, _) = text_root(&mem, &snaps, Some(text)).expect("a root mapping text");
        assert_eq!(cr3, kernel | pcid);
        // A kernel-mode vCPU is preferred whatever its position.
        let snaps = [snap(user, 3), snap(kernel, 0)];
        assert_eq!(text_root(&mem, &snaps, Some(text)).unwrap().0, kernel);
        // No paged vCPU: no root.
        assert!(text_root(&mem, &[unpaged], Some(text)).is_none());
    }
}
