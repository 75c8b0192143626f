//! qemu/drain: what the exitless drainer itself sustains, from rings
//! filled at memory speed to a data file, in the memory of each VMM: a
//! QEMU's ring device (a file in /dev/shm mapped as `vmtrace attach` maps
//! it, behind the `Backed` view its session drains through) and vmtrace's
//! own VMM's private memory slot. Both are drained by the one drainer
//! (`Drainer::start`, as `ExitlessState` starts it for either VMM) into
//! the store `vmtrace record` streams through; the guest's trampoline is
//! stood in for by a host thread per ring (`producer`), so the figure is
//! the drain's and the store's, not a guest's.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tracer::plan::exitless::layout::{
    RecordKind, RingLayout, HIGH_RINGS_VA, MAX_RECORDS, MIN_RECORDS,
};
use tracer::qemu::ring_device::{self, DEFAULT_SIZED, RINGS_OFF};
use tracer::session::exitless::backing::Backed;
use tracer::session::exitless::collect::{self, DrainStart, DrainValues, Drainer, Sink};
use tracer::session::exitless::ring::init_rings;
use tracer::session::record::{self, Counters, SiteIndex};
use tracer::session::store::{Storage, Store, Stored};
use tracer::trace::datafile::stream::DataFile;
use tracer::trace::model::Trace;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap};
use vmm::pause::GuestClock;
use vmm::GuestRam;

use super::drain_producer::{produce, Produced, RingPtrs};
use super::record::{templates, TempFile, RECORD_BUFFER};
use crate::error::{Error, RuntimeError};

/// Rings (and producers): one per vCPU of `qemu/attach`'s guest.
pub const DRAIN_CPUS: usize = 2;
/// Where the ring device's memory appears to the guest (Debian 6.12's
/// BAR under QEMU's `pc` machine); the drain reads it there.
const DEVICE_GPA: u64 = 0x1_0000_0000;
/// Guest RAM of the own VMM's memory (the default Linux guest's `--mem`),
/// and of the view around the ring device: mapped, never touched.
const RAM_MIB: u64 = 96;
/// The TSC rate the records' stamps are dated at (the drainer converts
/// them to the host clock as a QEMU guest's).
const TSC_KHZ: u32 = 1_000_000;

/// The memory a drain ran in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainMemory {
    /// A QEMU's ring device, sized by `--buffer`'s default (64 MiB).
    RingDevice,
    /// vmtrace's own VMM: its private slot, the rings' default 4 MiB.
    OwnVmm,
}

impl DrainMemory {
    pub const ALL: [DrainMemory; 2] = [DrainMemory::RingDevice, DrainMemory::OwnVmm];

    /// Its part of the figures' keys.
    pub fn key(self) -> &'static str {
        match self {
            DrainMemory::RingDevice => "ring_device",
            DrainMemory::OwnVmm => "own_vmm",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            DrainMemory::RingDevice => {
                "a QEMU's ring device (64 MiB file in /dev/shm, mapped as vmtrace attach maps it)"
            }
            DrainMemory::OwnVmm => "vmtrace's own VMM (its private memory slot)",
        }
    }
}

/// One memory's drain.
#[derive(Clone, Debug)]
pub struct DrainRun {
    pub memory: DrainMemory,
    /// Records per ring.
    pub cap: u64,
    /// Records the file stored: every one the producers wrote and the
    /// drainer counted (the run fails otherwise).
    pub stored: u64,
    /// From the producers' start to the file's end.
    pub seconds: f64,
    /// Times a producer found its ring full and waited for the drain.
    pub full_waits: u64,
    /// The data file's bytes.
    pub bytes: u64,
}

impl DrainRun {
    pub fn stored_per_s(&self) -> f64 {
        self.stored as f64 / self.seconds
    }
}

/// qemu/drain's figures: the ring device's drain, then the own VMM's.
#[derive(Clone, Debug, Default)]
pub struct DrainFigures {
    pub runs: Vec<DrainRun>,
}

/// qemu/drain: `events` records through each memory's rings.
pub fn drain_figures(events: u64) -> Result<DrainFigures, Error> {
    let mut f = DrainFigures::default();
    for memory in DrainMemory::ALL {
        f.runs.push(drain_run(memory, events)?);
    }
    Ok(f)
}

fn measure_error(what: impl std::fmt::Display) -> Error {
    RuntimeError::Measure(format!("qemu/drain: {what}")).into()
}

/// A name in `dir` of this process's and this call's own.
fn unique(dir: &Path, what: &str) -> std::path::PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    dir.join(format!(
        "vmtrace-bench-{what}-{}-{nanos}",
        std::process::id()
    ))
}

/// The memory the drainer reads, the mapping the producers write (the
/// same pages), and the rings' layout in it.
struct Memory {
    view: Arc<dyn GuestRam>,
    rings: GuestMemoryMmap,
    layout: RingLayout,
    /// The ring device's file, removed at the end.
    _file: Option<TempFile>,
}

/// The ring device as an attach sets it up (`ring_device::sized_pages`,
/// `Backed::with_own`): the file mapped at the BAR's address, the rings
/// past the region at `HIGH_RINGS_VA`.
fn ring_device_memory(sites: usize) -> Result<Memory, Error> {
    let path = TempFile(unique(Path::new("/dev/shm"), "drain-rings"));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path.0)
        .map_err(|e| measure_error(format!("{}: {e}", path.0.display())))?;
    file.set_len(DEFAULT_SIZED).map_err(measure_error)?;
    let rings = GuestMemoryMmap::from_ranges_with_files([(
        GuestAddress(DEVICE_GPA),
        DEFAULT_SIZED as usize,
        Some(FileOffset::new(file, 0)),
    )])
    .map_err(measure_error)?;
    let ram = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), (RAM_MIB << 20) as usize)])
        .map_err(measure_error)?;
    let at = ring_device::Placed {
        gpa: DEVICE_GPA,
        size: DEFAULT_SIZED,
        nx: true,
        efi: None,
    };
    let pages = ring_device::sized_pages(Vec::new(), at, false);
    let area = ring_device::ring_area(DEFAULT_SIZED);
    let fits = |cap| {
        RingLayout::high(DRAIN_CPUS, sites, cap, false, RecordKind::Call, area)
            .is_ok_and(|l| l.ring_bytes <= area / DRAIN_CPUS as u64)
    };
    // As many records as fit, as the attach gives them.
    let mut cap = MIN_RECORDS;
    while cap < MAX_RECORDS && fits(cap * 2) {
        cap *= 2;
    }
    let layout = RingLayout::high(DRAIN_CPUS, sites, cap, false, RecordKind::Call, area)
        .map_err(measure_error)?
        .placed(HIGH_RINGS_VA, DEVICE_GPA + RINGS_OFF);
    let view = Backed::with_own(
        Arc::new(ram),
        Arc::new(Mutex::new(pages)),
        Arc::new(rings.clone()),
    );
    Ok(Memory {
        view: Arc::new(view),
        rings,
        layout,
        _file: Some(path),
    })
}

/// vmtrace's own VMM's memory as `vmm::Vm` makes it (guest RAM, then the
/// private slot at `PRIVATE_START`), the rings at their default size.
fn own_vmm_memory(sites: usize) -> Result<Memory, Error> {
    let mem = GuestMemoryMmap::from_ranges(&[
        (GuestAddress(0), (RAM_MIB << 20) as usize),
        (
            GuestAddress(vmm::layout::PRIVATE_START),
            vmm::layout::PRIVATE_SIZE as usize,
        ),
    ])
    .map_err(measure_error)?;
    let layout = RingLayout::new(DRAIN_CPUS, sites, None, false).map_err(measure_error)?;
    Ok(Memory {
        view: Arc::new(mem.clone()),
        rings: mem,
        layout,
        _file: None,
    })
}

/// A store's counters, the sender the drainer hands batches to, the store.
type Streaming = (Arc<Counters>, Sink, Store);

/// The store `vmtrace record` streams through, to a data file at `path`.
fn store_to(
    index: &Arc<SiteIndex>,
    functions: Vec<tracer::kernel::symbols::Symbol>,
    path: &Path,
) -> Result<Streaming, Error> {
    let file = DataFile::create(path).map_err(RuntimeError::Save)?;
    let storage = Storage::Stream {
        file,
        buffer: RECORD_BUFFER,
    };
    let (counters, recs, mut store) = record::recorders(
        Arc::clone(index),
        DRAIN_CPUS,
        u64::MAX,
        storage,
        Arc::new(functions),
    );
    let tx = recs
        .first()
        .map(record::Recorder::sink)
        .ok_or_else(|| measure_error("no recorder"))?;
    let sink = Sink {
        tx,
        free: Some(store.free.clone()),
    };
    drop(recs);
    if let Some(head) = store.head.take() {
        let _ = head.send(Trace::synthetic(0));
    }
    Ok((counters, sink, store))
}

/// Each producer on its ring, `shares[i]` records from `per_ring[i]`, all
/// at once; what each did.
fn produce_all(
    rings: &[RingPtrs<'_>],
    per_ring: &[Vec<(u32, u64)>],
    shares: &[u64],
) -> Result<Vec<Produced>, Error> {
    let produced: Vec<std::io::Result<Produced>> = std::thread::scope(|s| {
        let handles: Vec<_> = (rings.iter().zip(per_ring).zip(shares).enumerate())
            .map(|(cpu, ((ring, records), &share))| {
                std::thread::Builder::new()
                    .name(format!("producer{cpu}"))
                    .spawn_scoped(s, move || produce(ring, records, share))
            })
            .collect();
        let joined = |h: std::thread::ScopedJoinHandle<'_, Produced>| {
            h.join()
                .map_err(|_| std::io::Error::other("a producer panicked"))
        };
        handles.into_iter().map(|h| h.and_then(joined)).collect()
    });
    produced
        .into_iter()
        .collect::<std::io::Result<Vec<Produced>>>()
        .map_err(measure_error)
}

/// One memory's drain of `events` records to a data file.
fn drain_run(memory: DrainMemory, events: u64) -> Result<DrainRun, Error> {
    let (templates, functions) = templates(DRAIN_CPUS);
    // A site per synthetic function, at its address: site k is function k
    // (their addresses ascend with k).
    let shape = Trace::synthetic(0);
    let sites = shape.functions.iter().enumerate();
    let index = Arc::new(SiteIndex::new(
        sites.map(|(i, f)| (f.addr, i as u32)).collect(),
    ));
    let mem = match memory {
        DrainMemory::RingDevice => ring_device_memory(index.addrs.len())?,
        DrainMemory::OwnVmm => own_vmm_memory(index.addrs.len())?,
    };
    init_rings(&*mem.view, &mem.layout).map_err(measure_error)?;
    let path = TempFile(unique(&std::env::temp_dir(), "drain").with_extension("vmt"));
    let (counters, sink, store) = store_to(&index, functions, &path.0)?;
    // Each ring's records: the synthetic events of its vCPU, as (site,
    // caller).
    let per_ring: Vec<Vec<(u32, u64)>> = (templates.iter().take(DRAIN_CPUS))
        .map(|t| t.iter().map(|e| (e.func, e.parent)).collect())
        .collect();
    let n = DRAIN_CPUS as u64;
    let shares: Vec<u64> = (0..n)
        .map(|c| events / n + u64::from(c < events % n))
        .collect();
    let rings: Vec<RingPtrs> = (0..DRAIN_CPUS)
        .map(|cpu| RingPtrs::new(&mem.rings, &mem.layout, cpu))
        .collect::<Result<_, _>>()
        .map_err(measure_error)?;

    let start = Instant::now();
    let go = DrainStart {
        clock: GuestClock::unanchored(TSC_KHZ),
        counters: Arc::clone(&counters),
        index: Arc::clone(&index),
        tasks: None,
        values: DrainValues::default(),
    };
    let drainer = Drainer::start(Arc::clone(&mem.view), mem.layout, sink, go);
    let produced = produce_all(&rings, &per_ring, &shares);
    // The last pass reads what is left; its sender goes with it.
    drainer.finish().map_err(measure_error)?;
    let produced = produced?;
    let Ok(Stored::File(mut stored)) = store.thread.join() else {
        return Err(measure_error("the store thread failed"));
    };
    let write_err = |source| RuntimeError::Write {
        path: path.0.clone(),
        source,
    };
    if let Some(e) = stored.error {
        return Err(write_err(e).into());
    }
    stored
        .file
        .finish(&footer(&counters, events))
        .map_err(write_err)?;
    let run = DrainRun {
        memory,
        cap: mem.layout.cap,
        stored: stored.file.events(),
        seconds: start.elapsed().as_secs_f64(),
        full_waits: produced.iter().map(|p| p.full_waits).sum(),
        bytes: stored.file.bytes(),
    };
    let written: u64 = produced.iter().map(|p| p.records).sum();
    check(&run, &mem, &counters, written, events)?;
    Ok(run)
}

/// Every record written is counted and stored: the producers wait for
/// room, so nothing may be dropped or lost.
fn check(
    run: &DrainRun,
    mem: &Memory,
    counters: &Counters,
    written: u64,
    events: u64,
) -> Result<(), Error> {
    let counted: u64 = (counters.counts.iter().flat_map(|row| row.iter()))
        .map(|c| c.load(Ordering::Relaxed))
        .sum();
    let dropped: u64 = collect::drops(&*mem.view, &mem.layout)
        .map_err(measure_error)?
        .iter()
        .flatten()
        .sum();
    if written != events || counted != events || run.stored != events || dropped != 0 {
        return Err(measure_error(format!(
            "{}: {events} records asked, {written} written, {counted} counted, {} stored, \
             {dropped} dropped",
            run.memory.key(),
            run.stored
        )));
    }
    Ok(())
}

/// The `FOOT`: the synthetic trace's head with the counts the drainer
/// kept (per site and vCPU: site k is function k).
fn footer(counters: &Counters, events: u64) -> Trace {
    let mut foot = Trace::synthetic(0);
    for (cpu, row) in counters.counts.iter().enumerate() {
        for (site, c) in row.iter().enumerate() {
            if let Some(f) = foot.counts.get_mut(site).and_then(|r| r.get_mut(cpu)) {
                *f += c.load(Ordering::Relaxed);
            }
        }
    }
    foot.meta.events_total = events;
    foot.meta.lost = counters
        .lost
        .iter()
        .map(|l| l.load(Ordering::Relaxed))
        .collect();
    foot
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small drain through each memory: every record written is counted
    /// and stored, none dropped (the run checks it), the files removed.
    #[test]
    fn every_record_is_drained_to_the_file_in_both_memories() {
        for memory in DrainMemory::ALL {
            let r = drain_run(memory, 300_001).unwrap();
            assert_eq!(r.stored, 300_001, "{r:?}");
            assert!(r.bytes > 0 && r.seconds > 0.0, "{r:?}");
        }
        let left = std::fs::read_dir("/dev/shm")
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| {
                e.file_name().to_string_lossy().starts_with(&format!(
                    "vmtrace-bench-drain-rings-{}-",
                    std::process::id()
                ))
            })
            .count();
        assert_eq!(left, 0);
    }
}
