//! qemu/drain, the exitless drainer's own ceiling: its goals, its lines of
//! the table, its `drain_` figures in the JSON, its method.

use std::fmt::{self, Write as _};

use tracer::trace::report;

use super::super::measure::{DrainFigures, DrainMemory, DrainRun, DRAIN_CPUS};
use super::Goal;

/// Goal: events drained to the data file per second, in each VMM's memory
/// (issue 40: as the own VMM records to disk).
pub const GOAL_DRAINED_PER_S: f64 = 10e6;

/// The run of `memory`, if measured.
fn run(f: &DrainFigures, memory: DrainMemory) -> Option<&DrainRun> {
    f.runs.iter().find(|r| r.memory == memory)
}

/// The headline key of `memory`'s drain.
pub fn rate_key(memory: DrainMemory) -> String {
    format!("drain_{}_events_per_s", memory.key())
}

/// The `drain_` figures, in the order printed.
pub fn figures(f: &DrainFigures) -> Vec<(String, f64)> {
    let mut v = Vec::new();
    for r in &f.runs {
        let k = |what: &str| format!("drain_{}_{what}", r.memory.key());
        v.push((rate_key(r.memory), r.stored_per_s()));
        v.push((k("records_per_ring"), r.cap as f64));
        v.push((k("events"), r.stored as f64));
        v.push((k("s"), r.seconds));
        v.push((k("mb_per_s"), r.bytes as f64 / 1e6 / r.seconds));
        v.push((k("full_waits"), r.full_waits as f64));
    }
    if let (Some(d), Some(o)) = (run(f, DrainMemory::RingDevice), run(f, DrainMemory::OwnVmm)) {
        v.push((
            "drain_ring_device_over_own_vmm".into(),
            d.stored_per_s() / o.stored_per_s(),
        ));
    }
    v
}

/// The name of `memory`'s goal.
pub fn goal_name(memory: DrainMemory) -> String {
    format!(
        "drain, {}: >= {} M events/s to the data file",
        match memory {
            DrainMemory::RingDevice => "QEMU's ring device",
            DrainMemory::OwnVmm => "own VMM",
        },
        GOAL_DRAINED_PER_S / 1e6
    )
}

pub fn goals(f: &DrainFigures) -> Vec<Goal> {
    f.runs
        .iter()
        .map(|r| Goal {
            name: goal_name(r.memory),
            measured: format!(
                "{:.2} M/s ({} events in {:.2} s, {} rings of {} records; every event stored)",
                r.stored_per_s() / 1e6,
                report::thousands(r.stored),
                r.seconds,
                DRAIN_CPUS,
                report::thousands(r.cap)
            ),
            pass: Ok(r.stored_per_s() >= GOAL_DRAINED_PER_S),
        })
        .collect()
}

/// qemu/drain: each memory's rate.
pub fn write(o: &mut String, f: &DrainFigures) -> fmt::Result {
    writeln!(
        o,
        "qemu/drain: the exitless drainer from {DRAIN_CPUS} rings filled at memory speed to a \
         data file"
    )?;
    for r in &f.runs {
        writeln!(
            o,
            "  {}: {:.2} M events/s drained and stored ({} events, {:.2} s, {:.0} MB/s to the \
             file; rings of {} records, full {} times)",
            r.memory.describe(),
            r.stored_per_s() / 1e6,
            report::thousands(r.stored),
            r.seconds,
            r.bytes as f64 / 1e6 / r.seconds,
            report::thousands(r.cap),
            report::thousands(r.full_waits)
        )?;
    }
    Ok(())
}

pub fn method() -> String {
    format!(
        "per memory, {DRAIN_CPUS} host threads stand in for the guest's trampoline, one per \
         ring, appending records as it does (head, fields, the commit word last) and waiting \
         when their ring is full, so the drain sets the pace; the one exitless drainer \
         (Drainer::start, as either VMM's session starts it, its own pacing and priority) \
         drains them into the store (Storage::Stream, as vmtrace record) and a data file in \
         the temporary directory; --drain-events events in all, each counted and stored, none \
         dropped (checked). The memories: a QEMU's ring device, a 64 MiB file in /dev/shm \
         mapped at its BAR's address as vmtrace attach maps it, read through the session's \
         view (Backed), its rings past the region as entry 508 maps them; and vmtrace's own \
         VMM's guest memory with its private slot, the rings at their default size. Events \
         per second = events stored / time from the producers' start to the file's end; no \
         tasks named (no guest to read them from)"
    )
}
