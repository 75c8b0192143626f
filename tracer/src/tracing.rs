//! One tracing session over a running guest: choose the sites, attach (patch
//! under a pause), detach (restore), and turn what was recorded into a Trace.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use vm_memory::GuestMemoryMmap;
use vmm::gva::PagingMode;
use vmm::{Paused, TrapHandler};

use crate::filter::{Filter, FilterError};
use crate::patch::{self, AttachCounts, DetachCounts, PatchError, PatchedSite, TextMap};
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

/// Sites polled to see whether the guest has run its own ftrace_init yet.
const READY_SAMPLES: usize = 16;
/// CR0.PG: paging enabled.
const CR0_PG: u64 = 1 << 31;

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
        Ok(Plan {
            image,
            sites,
            funcs,
            targets,
            skipped_init,
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

    /// Has the guest turned its sites into NOPs (its own ftrace_init)? Polled
    /// without a pause through the kernel's fixed physical mapping; only a
    /// hint: `attach` checks every site again under the pause.
    pub fn guest_ready(&self, mem: &GuestMemoryMmap) -> bool {
        let step = (self.index.addrs.len() / READY_SAMPLES).max(1);
        self.index
            .addrs
            .iter()
            .step_by(step)
            .take(READY_SAMPLES)
            .all(|&a| {
                vmm::layout::kernel_virt_to_phys(a).is_some_and(|gpa| patch::is_nop(mem, gpa))
            })
    }

    /// Patch every target site. The guest is paused by the caller; all writes
    /// happen in this one window.
    pub fn attach(
        &mut self,
        paused: &Paused<'_>,
        ncpus: usize,
    ) -> Result<&AttachCounts, TracerError> {
        let snap = (0..ncpus)
            .filter_map(|c| paused.snapshot(c))
            .find(|s| s.sregs.cr0 & CR0_PG != 0)
            .ok_or(PatchError::NoPaging)?;
        let mut map = TextMap::new(
            paused.memory(),
            snap.sregs.cr3,
            PagingMode::from_cr4(snap.sregs.cr4),
        );
        let addrs = &self.index.addrs;
        patch::verify_image(&mut map, &self.plan.image, addrs)?;
        let fentry = self.plan.image.symbol(crate::sites::FENTRY).map(|s| s.addr);
        let (patched, skipped) = patch::attach(&mut map, fentry, addrs)?;
        self.attach_counts = AttachCounts {
            patched: patched.len(),
            skipped_init: self.plan.skipped_init,
            skipped_other: skipped,
        };
        self.patched = patched;
        self.attach_ns = vmm::Trap::now_ns();
        self.attach_window = paused.window();
        self.attach_latency = paused.latency();
        Ok(&self.attach_counts)
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
