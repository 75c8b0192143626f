//! Figure (h), recording to disk: its goals, its lines of the table, its
//! `h_` figures in the JSON, its method.

use std::fmt::{self, Write as _};

use tracer::session::record::BATCH;
use tracer::trace::model::SYNTH_CPUS;
use tracer::trace::report;

use super::super::measure::{RecordFigures, PEAK_SLACK};
use super::Goal;

/// Goal: events stored per second, whatever the producers lose.
pub const GOAL_STORED_PER_S: f64 = 10e6;

/// Bytes in a MiB, as the buffer and peak memory are given.
const MIB: f64 = (1u64 << 20) as f64;

/// The `h_` figures, in the order printed.
pub fn figures(r: &RecordFigures) -> Vec<(String, f64)> {
    [
        ("h_record_events_per_s", r.stored_per_s()),
        ("h_record_mb_per_s", r.mb_per_s()),
        ("h_record_peak_mib", r.peak_mib()),
        ("h_record_lost", r.lost as f64),
        ("h_record_lost_fraction", r.lost_fraction()),
        ("h_record_sent", r.sent as f64),
        ("h_record_sent_per_s", r.sent_per_s()),
        ("h_record_stored", r.stored as f64),
        ("h_record_bytes", r.bytes as f64),
        ("h_record_s", r.seconds),
        ("h_record_sync_s", r.sync_seconds),
        ("h_record_synced_mb_per_s", r.synced_mb_per_s()),
        ("h_record_buffer_mib", r.buffer as f64 / MIB),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// The names of (h)'s two goals.
pub fn goal_names() -> [String; 2] {
    [
        format!(
            "recording to disk >= {} M events/s stored",
            GOAL_STORED_PER_S / 1e6
        ),
        format!(
            "recording: peak memory growth <= buffer + {} MiB",
            PEAK_SLACK >> 20
        ),
    ]
}

pub fn goals(r: &RecordFigures) -> [Goal; 2] {
    let bound = r.peak_bound();
    let [stored, peak] = goal_names();
    [
        Goal {
            name: stored,
            measured: format!(
                "{:.2} M/s ({:.0} MB/s; {} of {} events lost, {:.1} %)",
                r.stored_per_s() / 1e6,
                r.mb_per_s(),
                report::thousands(r.lost),
                report::thousands(r.sent),
                r.lost_fraction() * 100.0
            ),
            pass: Ok(r.stored_per_s() >= GOAL_STORED_PER_S),
        },
        Goal {
            name: peak,
            measured: match &r.peak_growth {
                Ok(_) => format!(
                    "{:.1} MiB (buffer {:.0} MiB, bound {:.0} MiB; the file {:.0} MiB)",
                    r.peak_mib(),
                    r.buffer as f64 / MIB,
                    bound as f64 / MIB,
                    r.bytes as f64 / MIB
                ),
                Err(_) => "-".into(),
            },
            pass: match &r.peak_growth {
                Ok(g) => Ok(*g <= bound),
                Err(why) => Err(why.clone()),
            },
        },
    ]
}

/// (h): throughput, losses and peak memory.
pub fn write(o: &mut String, r: &RecordFigures) -> fmt::Result {
    writeln!(
        o,
        "(h) recording to disk: {SYNTH_CPUS} producers send {} events in batches of {BATCH} \
         through the store (buffer {:.0} MiB) to a data file",
        report::thousands(r.sent),
        r.buffer as f64 / MIB
    )?;
    writeln!(
        o,
        "  stored {:.2} M events/s, {:.0} MB/s to the file's end ({:.2} s; then fsync {:.2} s: \
         {:.0} MB/s on disk)",
        r.stored_per_s() / 1e6,
        r.mb_per_s(),
        r.seconds,
        r.sync_seconds,
        r.synced_mb_per_s()
    )?;
    writeln!(
        o,
        "  sent {:.2} M events/s; stored {}, lost {}{}; file {:.0} MiB",
        r.sent_per_s() / 1e6,
        report::thousands(r.stored),
        report::thousands(r.lost),
        if r.lost > 0 {
            format!(" ({:.1} %: the store was gone)", r.lost_fraction() * 100.0)
        } else {
            String::new()
        },
        r.bytes as f64 / MIB
    )?;
    match &r.peak_growth {
        Ok(_) => writeln!(
            o,
            "  peak memory: {:.1} MiB over the RSS before (peak RSS reset, then VmHWM)",
            r.peak_mib()
        ),
        Err(why) => writeln!(o, "  peak memory: NOT MEASURED, {why}"),
    }
}

/// How (h) is measured.
pub fn method() -> String {
    format!(
        "{SYNTH_CPUS} producer threads standing in for vCPUs' recorders send batches of {BATCH} \
         synthetic events (one batch per thread, resent) through the store thread \
         (Storage::Stream, record::recorders) to a data file in the temporary directory, each \
         an emptied batch the store handed back, waiting for room in the queue as the \
         exitless drainer does (the disk sets the pace); --record-events events in all, every \
         one stored. Events and MB per second = stored events and the \
         file's bytes / time from the first send to the file's end (FOOT and END written); \
         fsync timed after. Peak memory = VmHWM after - VmRSS before (read after \
         malloc_trim, so freed memory the allocator kept is not reused unseen), the peak reset \
         by writing 5 to /proc/self/clear_refs (Linux >= 4.0); the goal: at most the buffer + \
         {} MiB, whatever the trace's size",
        PEAK_SLACK >> 20
    )
}
