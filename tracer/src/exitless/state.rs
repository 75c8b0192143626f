//! One session's exitless machinery: the generated trampoline, the ring
//! layout, whether they are in the guest yet, and the drainer.

use std::sync::Arc;

use crossbeam_channel::Sender;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm::gva::AddressSpace;
use vmm::pause::GuestClock;

use super::collect::{self, DrainError, Drainer};
use super::layout::{
    LayoutError, RingLayout, CODE_GPA, CODE_LEN, DATA_GPA, DATA_LEN, FRAME_NEXT_OFF,
};
use super::map::{self, MapError, Mapped};
use super::ring::{self, RingError};
use super::trampoline::{self, Trampoline, TrampolineError, TrampolineSpec};
use crate::model::Event;
use crate::record::{Counters, SiteIndex};
use crate::sites::SITE_LEN;
use crate::symbols::KernelImage;

/// The kernel's per-CPU CPU number (`smp_processor_id()`); its symbol's value
/// is its offset in each CPU's per-CPU area, which GS points at in the kernel.
pub const CPU_NUMBER: &str = "cpu_number";
/// Linux 6.2 to 6.14 keep it in the per-CPU `struct pcpu_hot`
/// (arch/x86/include/asm/current.h): after `current_task` (8 bytes) and
/// `preempt_count` (4), so at offset 12; `smp_processor_id()` there reads
/// `gs:pcpu_hot+0xc` (checked in the 6.12 guest's code).
pub const PCPU_HOT: &str = "pcpu_hot";
pub const PCPU_HOT_CPU_NUMBER: u64 = 12;

#[derive(Debug, thiserror::Error)]
pub enum ExitlessError {
    #[error(
        "{path}: no `{CPU_NUMBER}` or `{PCPU_HOT}` symbol, so vmtrace's trampoline cannot tell which CPU it runs on; use --mode trap",
        path = .0.display()
    )]
    NoCpuNumber(std::path::PathBuf),
    #[error("{path}: `{CPU_NUMBER}` is at {off:#x}, not a per-CPU offset; use --mode trap", path = .path.display())]
    BadCpuNumber { path: std::path::PathBuf, off: u64 },
    #[error(
        "vCPU {cpu}'s per-CPU CPU number reads {value} at gs:{off:#x} (the kernel has {cpus} vCPUs): \
         the symbols do not describe this kernel's per-CPU layout; use --mode trap"
    )]
    CpuNumberMismatch {
        cpu: usize,
        value: u32,
        off: u32,
        cpus: usize,
    },
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error(transparent)]
    Trampoline(#[from] TrampolineError),
    #[error(transparent)]
    Map(#[from] MapError),
    #[error(transparent)]
    Ring(#[from] RingError),
    #[error(transparent)]
    Drain(#[from] DrainError),
    #[error("the trampoline ({len} bytes) does not fit its {CODE_LEN}-byte page")]
    CodeTooBig { len: usize },
    #[error("writing vmtrace's trampoline into guest memory: {0}")]
    Memory(String),
    #[error("KVM did not give the guest's TSC at the pause; cannot date exitless events")]
    NoClock,
    #[error(
        "{0} records in vmtrace's rings named no traced site or vCPU (the guest wrote over them); \
         their calls are not in the counts"
    )]
    BadRecords(u64),
}

/// Exitless state of one tracing session.
pub struct Exitless {
    pub layout: RingLayout,
    pub trampoline: Trampoline,
    /// Where in each CPU's per-CPU area the trampoline reads its CPU number.
    cpu_number_off: u32,
    /// Code written and rings initialised: later attaches reuse them (a task
    /// may still be inside the trampoline from an earlier attach).
    installed: bool,
    /// The events' way to the collector, until the drainer takes it.
    sink: Option<Sender<Vec<Event>>>,
    drainer: Option<Drainer>,
    mem: Option<GuestMemoryMmap>,
}

/// The rings and the code for this image, CPU count and site count.
fn plan(
    image: &KernelImage,
    cpus: usize,
    sites: usize,
    ring_records: Option<u64>,
    graph: bool,
) -> Result<(RingLayout, Trampoline, u32), ExitlessError> {
    let addr = match (image.symbol(CPU_NUMBER), image.symbol(PCPU_HOT)) {
        (Some(s), _) => s.addr,
        (None, Some(hot)) => hot.addr.saturating_add(PCPU_HOT_CPU_NUMBER),
        (None, None) => return Err(ExitlessError::NoCpuNumber(image.path.clone())),
    };
    // A per-CPU offset is small: gs:[disp32] with a positive displacement.
    let cpu_number_off = u32::try_from(addr)
        .ok()
        .filter(|&o| o < i32::MAX as u32)
        .ok_or_else(|| ExitlessError::BadCpuNumber {
            path: image.path.clone(),
            off: addr,
        })?;
    let layout = RingLayout::new(cpus, sites, ring_records, graph)?;
    let trampoline = trampoline::generate(&TrampolineSpec {
        layout,
        cpu_number_off,
    })?;
    if trampoline.code.len() as u64 > CODE_LEN {
        return Err(ExitlessError::CodeTooBig {
            len: trampoline.code.len(),
        });
    }
    Ok((layout, trampoline, cpu_number_off))
}

impl Exitless {
    /// Can exitless tracing be planned for this image, CPU and site count
    /// (checked before the guest exists)?
    pub fn check(
        image: &KernelImage,
        cpus: usize,
        sites: usize,
        ring_records: Option<u64>,
        graph: bool,
    ) -> Result<(), ExitlessError> {
        plan(image, cpus, sites, ring_records, graph).map(|_| ())
    }

    /// Plan the rings and generate the code, before the guest runs.
    pub fn prepare(
        image: &KernelImage,
        cpus: usize,
        sites: usize,
        ring_records: Option<u64>,
        graph: bool,
        sink: Sender<Vec<Event>>,
    ) -> Result<Exitless, ExitlessError> {
        let (layout, trampoline, cpu_number_off) = plan(image, cpus, sites, ring_records, graph)?;
        Ok(Exitless {
            layout,
            trampoline,
            cpu_number_off,
            installed: false,
            sink: Some(sink),
            drainer: None,
            mem: None,
        })
    }

    /// Map the region and, the first time, write the code and reset the
    /// rings. The guest is paused. Nothing is written when the mapping is
    /// refused.
    pub fn install(&mut self, space: &mut AddressSpace<'_>) -> Result<Mapped, ExitlessError> {
        let mapped = map::map(space)?;
        if !self.installed {
            let mem = space.memory();
            mem.write_slice(&self.trampoline.code, GuestAddress(CODE_GPA))
                .map_err(|e| ExitlessError::Memory(e.to_string()))?;
            ring::init_rings(mem, &self.layout)?;
            if self.layout.graph {
                // Every frame free, the ticket counter at 0.
                let pool = vec![0u8; (DATA_LEN - FRAME_NEXT_OFF) as usize];
                mem.write_slice(&pool, GuestAddress(DATA_GPA + FRAME_NEXT_OFF))
                    .map_err(|e| ExitlessError::Memory(e.to_string()))?;
            }
            self.installed = true;
            self.mem = Some(mem.clone());
        }
        Ok(mapped)
    }

    /// Do the parked vCPUs' per-CPU CPU numbers read as CPU numbers where
    /// the trampoline will read them (`gs_bases`: (vCPU, GS base) of those
    /// at CPL 0)? A wrong offset would make every call on that CPU neither
    /// recorded nor counted. A GS base whose area is not mapped (a vCPU on
    /// the entry path, before `swapgs`) tells nothing and is skipped.
    pub fn check_cpu_numbers(
        &self,
        space: &mut AddressSpace<'_>,
        gs_bases: &[(usize, u64)],
    ) -> Result<(), ExitlessError> {
        let off = self.cpu_number_off;
        for &(cpu, base) in gs_bases {
            if base == 0 {
                continue;
            }
            let Ok(b) = space.read_array::<4>(base.wrapping_add(u64::from(off))) else {
                continue;
            };
            let value = u32::from_le_bytes(b);
            if value as usize >= self.layout.cpus {
                return Err(ExitlessError::CpuNumberMismatch {
                    cpu,
                    value,
                    off,
                    cpus: self.layout.cpus,
                });
            }
        }
        Ok(())
    }

    /// The bytes site `k` at `addr` becomes: a call to its stub.
    pub fn site_bytes(&self, k: usize, addr: u64) -> Result<[u8; SITE_LEN], TrampolineError> {
        trampoline::call_bytes(addr, self.trampoline.stub_va(k as u32))
    }

    /// Start draining (once): events dated by `clock`, counted in `counters`.
    pub fn start_drainer(
        &mut self,
        clock: GuestClock,
        counters: Arc<Counters>,
        index: Arc<SiteIndex>,
    ) {
        let (Some(mem), Some(sink)) = (self.mem.clone(), self.sink.take()) else {
            return;
        };
        self.drainer = Some(Drainer::start(
            mem,
            self.layout,
            clock,
            counters,
            index,
            sink,
        ));
    }

    /// Calls counted in the guest but not recorded (full rings), per CPU and
    /// site; empty before the first install.
    pub fn drops(&self) -> Result<Vec<Vec<u64>>, ExitlessError> {
        match &self.mem {
            Some(mem) => Ok(collect::drops(mem, &self.layout)?),
            None => Ok(Vec::new()),
        }
    }

    /// Returns counted in the guest but not recorded (full rings), per CPU
    /// and site; empty before the first install.
    pub fn ret_drops(&self) -> Result<Vec<Vec<u64>>, ExitlessError> {
        match &self.mem {
            Some(mem) => Ok(collect::ret_drops(mem, &self.layout)?),
            None => Ok(Vec::new()),
        }
    }

    /// Drain the rest and stop the drainer (the guest has stopped); drops
    /// the event sender either way, so the collector can finish.
    /// Records skipped as out of range are an error too: never silent.
    pub fn finish(&mut self) -> Result<(), ExitlessError> {
        self.sink = None;
        let Some(d) = self.drainer.take() else {
            return Ok(());
        };
        let stats = std::sync::Arc::clone(&d.stats);
        d.finish()?;
        match stats.bad_records.load(std::sync::atomic::Ordering::Relaxed) {
            0 => Ok(()),
            n => Err(ExitlessError::BadRecords(n)),
        }
    }
}
