//! (h) recording to disk: how fast the store thread turns recorders'
//! batches into the data file, and how much memory that takes.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{Receiver, Sender};
use tracer::kernel::symbols::Symbol;
use tracer::session::record::{self, Counters, SiteIndex, BATCH};
use tracer::session::store::{Storage, Stored};
use tracer::trace::datafile::stream::DataFile;
use tracer::trace::model::{Event, Trace, SYNTH_CPUS};

use crate::error::{Error, RuntimeError};

/// The store's queue: the default of `vmtrace record`'s streaming buffer.
pub const RECORD_BUFFER: u64 = 64 << 20;
/// How far the peak RSS may grow beyond the buffer: the batches being
/// built and written (a few 128 KiB each), thread stacks, the allocator's
/// slack. The goal is that memory follows the buffer, not the trace.
pub const PEAK_SLACK: u64 = 64 << 20;

/// Where the kernel keeps this process's peak RSS and resets it.
const STATUS: &str = "/proc/self/status";
const CLEAR_REFS: &str = "/proc/self/clear_refs";
/// Written to `clear_refs`: reset the peak RSS to the current RSS
/// (Linux >= 4.0).
const RESET_PEAK: &str = "5";
/// A reset peak may exceed the RSS read just before by this much (pages
/// touched in between) and still count as reset.
const RESET_SLACK_KIB: u64 = 1024;

/// (h)'s figures.
pub struct RecordFigures {
    /// Events the producers sent, the file stored, and the store's queue
    /// refused (counted as lost, as a recorder does).
    pub sent: u64,
    pub stored: u64,
    pub lost: u64,
    /// The data file's size at its end.
    pub bytes: u64,
    /// From the first send to the file's end (`FOOT` and `END` written).
    pub seconds: f64,
    /// Then `fsync` of the file: until the page cache's copy is on the disk.
    pub sync_seconds: f64,
    /// The store's queue, bytes.
    pub buffer: u64,
    /// The peak RSS's growth over the RSS before, bytes; Err: not
    /// measured, and why.
    pub peak_growth: Result<u64, String>,
}

impl RecordFigures {
    /// Events stored per second: the goal's figure.
    pub fn stored_per_s(&self) -> f64 {
        self.stored as f64 / self.seconds
    }

    /// Events the producers offered per second.
    pub fn sent_per_s(&self) -> f64 {
        self.sent as f64 / self.seconds
    }

    /// MB (10^6 bytes) written per second, to the file's end.
    pub fn mb_per_s(&self) -> f64 {
        self.bytes as f64 / 1e6 / self.seconds
    }

    /// MB per second until the file is on the disk.
    pub fn synced_mb_per_s(&self) -> f64 {
        self.bytes as f64 / 1e6 / (self.seconds + self.sync_seconds)
    }

    pub fn lost_fraction(&self) -> f64 {
        self.lost as f64 / self.sent as f64
    }

    /// The peak RSS's growth, MiB; NaN if not measured (null in the JSON).
    pub fn peak_mib(&self) -> f64 {
        match self.peak_growth {
            Ok(b) => b as f64 / f64::from(1 << 20),
            Err(_) => f64::NAN,
        }
    }

    /// The goal's bound on the peak RSS's growth, bytes.
    pub fn peak_bound(&self) -> u64 {
        self.buffer + PEAK_SLACK
    }
}

/// The data file, deleted however the measurement ends.
pub(super) struct TempFile(pub(super) PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// (h): `SYNTH_CPUS` producers stream `events` events in all through the
/// store to a data file in the temporary directory, with the peak RSS reset
/// before.
pub fn record_figures(events: u64) -> Result<RecordFigures, Error> {
    // Unique per process and call: a concurrent bench must not share it.
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let file = TempFile(std::env::temp_dir().join(format!(
        "vmtrace-bench-record-{}-{nanos}.vmt",
        std::process::id()
    )));
    let before = reset_peak();
    let s = stream(&file.0, events, RECORD_BUFFER)?;
    let peak_growth = before.and_then(|rss| Ok(status_kib("VmHWM")?.saturating_sub(rss) << 10));
    Ok(RecordFigures {
        sent: events,
        stored: s.stored,
        lost: s.lost,
        bytes: s.bytes,
        seconds: s.seconds,
        sync_seconds: s.sync_seconds,
        buffer: RECORD_BUFFER,
        peak_growth,
    })
}

/// Reset the peak RSS to the current RSS; returns that RSS, KiB, or why
/// the peak cannot be measured.
fn reset_peak() -> Result<u64, String> {
    release_free_memory();
    let rss = status_kib("VmRSS")?;
    std::fs::write(CLEAR_REFS, RESET_PEAK)
        .map_err(|e| format!("cannot reset the peak RSS ({CLEAR_REFS}): {e}"))?;
    let hwm = status_kib("VmHWM")?;
    if hwm > rss + RESET_SLACK_KIB {
        return Err(format!(
            "the peak RSS did not reset ({CLEAR_REFS}: VmHWM {hwm} kB, VmRSS {rss} kB; Linux \
             >= 4.0 needed)"
        ));
    }
    Ok(rss)
}

/// Hand the memory earlier figures freed back to the kernel: the allocator
/// keeps it, counted in the RSS, and would hand it to (h) again without the
/// RSS growing, hiding what (h) takes.
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory of the allocator's
    // arenas to the kernel; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// `key` of this process's status, KiB.
fn status_kib(key: &str) -> Result<u64, String> {
    let status =
        std::fs::read_to_string(STATUS).map_err(|e| format!("cannot read {STATUS}: {e}"))?;
    parse_kib(&status, key).ok_or_else(|| format!("no {key} in {STATUS}"))
}

/// The value of a `Key:   123 kB` line of a /proc status file.
fn parse_kib(status: &str, key: &str) -> Option<u64> {
    status.lines().find_map(|l| {
        let v = l.strip_prefix(key)?.strip_prefix(':')?;
        v.trim().strip_suffix("kB")?.trim().parse().ok()
    })
}

/// What one streaming run stored.
struct Streamed {
    stored: u64,
    lost: u64,
    bytes: u64,
    seconds: f64,
    sync_seconds: f64,
}

/// Stream `events` events through the store to a data file at `path` with a
/// queue of `buffer` bytes; the file is left complete (`FOOT`, `END`).
/// Seconds to `fsync` the file at `path`.
fn sync(path: &Path) -> std::io::Result<f64> {
    let t = Instant::now();
    std::fs::File::open(path)?.sync_all()?;
    Ok(t.elapsed().as_secs_f64())
}

/// One batch per producer, from the synthetic trace (its events alternate
/// between the vCPUs): resent, so making events costs nothing; and the
/// functions the store moves each caller to, as in a run (the synthetic
/// callers stand in for the kernel's functions).
pub(super) fn templates(ncpus: usize) -> (Vec<Vec<Event>>, Vec<Symbol>) {
    let shape = Trace::synthetic((BATCH * ncpus) as u64);
    let templates: Vec<Vec<Event>> = (0..SYNTH_CPUS)
        .map(|cpu| {
            shape
                .events
                .iter()
                .filter(|e| e.cpu == cpu)
                .copied()
                .collect()
        })
        .collect();
    let mut functions = shape.functions.clone();
    functions.extend(shape.callers.iter().cloned());
    functions.sort_by_key(|f| f.addr);
    (templates, functions)
}

fn stream(path: &Path, events: u64, buffer: u64) -> Result<Streamed, Error> {
    let ncpus = SYNTH_CPUS as usize;
    let (templates, functions) = templates(ncpus);
    let file = DataFile::create(path).map_err(RuntimeError::Save)?;
    let (counters, recs, mut store) = record::recorders(
        Arc::new(SiteIndex::new(Vec::new())),
        ncpus,
        u64::MAX,
        Storage::Stream { file, buffer },
        Arc::new(functions),
    );
    // Only the recorders' sender is used: `Counters` comes from them.
    let sink = recs
        .first()
        .map(record::Recorder::sink)
        .ok_or_else(|| RuntimeError::Measure("(h): no recorder".into()))?;
    drop(recs);
    // The store writes nothing before the HEAD; a failed send means the
    // thread is gone, which joining it tells.
    if let Some(head) = store.head.take() {
        let _ = head.send(Trace::synthetic(0));
    }

    // Each producer's events: `events` spread evenly.
    let n = ncpus as u64;
    let shares: Vec<u64> = (0..n)
        .map(|c| events / n + u64::from(c < events % n))
        .collect();

    let start = Instant::now();
    let spawned: Vec<std::io::Result<()>> = std::thread::scope(|s| {
        (0..ncpus)
            .map(|cpu| {
                let (tx, counters, template) = (sink.clone(), &counters, &templates[cpu]);
                let free = store.free.clone();
                let share = shares[cpu];
                std::thread::Builder::new()
                    .name(format!("producer{cpu}"))
                    .spawn_scoped(s, move || produce(&tx, &free, counters, template, share))
                    .map(drop)
            })
            .collect()
    });
    // Every sender gone: the store ends once it has written the queue.
    drop(sink);
    let stored = store.thread.join();
    spawned
        .into_iter()
        .collect::<std::io::Result<()>>()
        .map_err(|e| RuntimeError::Measure(format!("(h): cannot start a producer: {e}")))?;
    let Ok(Stored::File(mut stored)) = stored else {
        return Err(RuntimeError::Measure("(h): the store thread failed".into()).into());
    };
    let write_err = |source| RuntimeError::Write {
        path: path.to_path_buf(),
        source,
    };
    if let Some(e) = stored.error {
        return Err(write_err(e).into());
    }
    let foot = footer(&templates, &shares, &counters);
    stored.file.finish(&foot).map_err(write_err)?;
    let seconds = start.elapsed().as_secs_f64();
    let sync_seconds = sync(path).map_err(write_err)?;

    let (stored_events, lost) = (stored.file.events(), foot.meta.lost.iter().sum::<u64>());
    if stored_events + lost != events {
        return Err(RuntimeError::Measure(format!(
            "(h): {events} events sent, {stored_events} stored and {lost} lost"
        ))
        .into());
    }
    Ok(Streamed {
        stored: stored_events,
        lost,
        bytes: stored.file.bytes(),
        seconds,
        sync_seconds,
    })
}

/// The `FOOT`: the synthetic trace's head with the exact counts of what the
/// producers sent (`produce`'s batches of their `template`s) and what was
/// lost, so that the file reads back.
fn footer(templates: &[Vec<Event>], shares: &[u64], counters: &Counters) -> Trace {
    let mut foot = Trace::synthetic(0);
    for (cpu, (template, &share)) in templates.iter().zip(shares).enumerate() {
        let len = template.len().max(1) as u64;
        let (full, rest) = (share / len, (share % len) as usize);
        for (i, e) in template.iter().enumerate() {
            if let Some(c) = foot
                .counts
                .get_mut(e.func as usize)
                .and_then(|row| row.get_mut(cpu))
            {
                *c += full + u64::from(i < rest);
            }
        }
    }
    foot.meta.events_total = shares.iter().sum();
    foot.meta.events_dropped = counters.dropped.load(Ordering::Relaxed);
    foot.meta.lost = counters
        .lost
        .iter()
        .map(|l| l.load(Ordering::Relaxed))
        .collect();
    foot
}

/// One producer: `events` events in batches of `template` (the last cut
/// short), each filled into an emptied batch the store handed back (as
/// `Recorder::flush` takes them) and handed over waiting for room in the
/// queue, as the exitless drainer does: the disk sets the pace, so the
/// figure is the sustained rate and every event is stored. (A trap-mode
/// recorder never waits; when the queue is full it counts the batch as
/// lost: `Counters::lose`, used if the store is gone.)
fn produce(
    tx: &Sender<Vec<Event>>,
    free: &Receiver<Vec<Event>>,
    counters: &Counters,
    template: &[Event],
    mut events: u64,
) {
    if template.is_empty() {
        return;
    }
    while events > 0 {
        let n = events.min(template.len() as u64) as usize;
        let mut batch = free
            .try_recv()
            .unwrap_or_else(|_| Vec::with_capacity(BATCH));
        batch.extend_from_slice(&template[..n]);
        if let Err(e) = tx.send(batch) {
            counters.lose(&e.into_inner());
        }
        events -= n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_values_in_kib() {
        let status = "Name:\tvmtrace\nVmPeak:\t  900 kB\nVmHWM:\t   13532 kB\nVmRSS:\t    8 kB\n\
                      Threads:\t5\n";
        assert_eq!(parse_kib(status, "VmHWM"), Some(13532));
        assert_eq!(parse_kib(status, "VmRSS"), Some(8));
        // A prefix of another key is not that key; a value without kB is none.
        assert_eq!(parse_kib(status, "VmH"), None);
        assert_eq!(parse_kib(status, "Threads"), None);
        assert_eq!(parse_kib("VmHWM:\t junk kB\n", "VmHWM"), None);
    }

    #[test]
    fn this_process_status_has_the_peak() {
        let rss = status_kib("VmRSS").unwrap();
        let hwm = status_kib("VmHWM").unwrap();
        assert!(rss > 0 && hwm >= rss, "VmRSS {rss} kB, VmHWM {hwm} kB");
    }

    #[test]
    fn every_event_is_stored_or_counted_lost_and_the_file_reads_back() {
        let dir = std::env::temp_dir();
        let file = TempFile(dir.join(format!("vmtrace-bench-test-{}.vmt", std::process::id())));
        // Not a multiple of the batch or of the producers; a queue of two
        // batches, so some are likely lost.
        let events = 10 * BATCH as u64 * 4 + 7;
        let s = stream(&file.0, events, 0).unwrap();
        assert_eq!(s.stored + s.lost, events);
        assert!(s.stored > 0 && s.seconds > 0.0);
        let trace = tracer::trace::datafile::load(&file.0).unwrap();
        assert_eq!(trace.events.len() as u64, s.stored);
        assert_eq!(trace.meta.lost.iter().sum::<u64>(), s.lost);
        assert!(!trace.meta.incomplete);
        assert_eq!(std::fs::metadata(&file.0).unwrap().len(), s.bytes);
        assert!(trace.events.iter().all(|e| e.cpu < SYNTH_CPUS));
    }

    #[test]
    fn the_figures_delete_their_file() {
        let before = temp_files();
        let f = record_figures(3 * BATCH as u64).unwrap();
        assert_eq!(f.sent, 3 * BATCH as u64);
        assert!(f.stored_per_s() > 0.0 && f.mb_per_s() > 0.0);
        assert_eq!(temp_files(), before);
    }

    /// The bench's data files in the temporary directory.
    fn temp_files() -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(std::env::temp_dir())
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                    n.starts_with(&format!("vmtrace-bench-record-{}-", std::process::id()))
                })
            })
            .collect();
        v.sort();
        v
    }
}
