//! How often the ring drainer wakes, and at what priority: often enough
//! that no ring fills between two passes, and no more often than that.
//!
//! A ring in the guest's free low memory (64 records per vCPU with
//! `--graph` on 4 vCPUs) fills within a millisecond of a burst under TCG,
//! so a drainer that slept a fixed millisecond lost most of a burst; one
//! that polled every 50 µs after any record cost the own VMM's emulated
//! Linux boots a sixth of their time, since their rings of thousands of
//! records always held something, and every wake (real-time, at once)
//! took the CPU from a vCPU thread. The sleep now follows the rate the
//! last pass saw against the ring's size.

use std::time::{Duration, Instant};

/// The longest sleep: when the rings are idle, or fill slowly.
const IDLE: Duration = Duration::from_millis(1);
/// The shortest sleep, during a burst into small rings.
const BURST_IDLE: Duration = Duration::from_micros(50);
/// How long after the last record the drainer keeps its burst pace.
const BURST: Duration = Duration::from_millis(50);
/// The share of a ring that may fill between two passes at the last
/// pass's rate: a quarter leaves room for a faster burst and a late wake.
const FILL_SHARE: u32 = 4;
/// A ring that fills within this time at the rate the last pass saw
/// gets a real-time drainer (`run_soon`) until the burst is over: on a
/// busy host an ordinary thread may wait longer than that for a CPU after
/// its sleep. Rings that hold longer keep an ordinary thread, which does
/// not take the CPU from a vCPU thread at each wake.
const URGENT_FILL: Duration = Duration::from_millis(100);
/// The drainer's pace: when it last found records, and how long it may
/// sleep at the rate it saw then.
#[derive(Debug)]
pub struct Pace {
    /// Records per ring.
    cap: u64,
    /// When the last pass started, and when one last found records.
    last_pass: Instant,
    last_record: Option<Instant>,
    /// The sleep while records keep coming.
    busy: Duration,
    /// Whether the rings fill within `URGENT_FILL` while records keep coming.
    busy_urgent: bool,
}

/// What the drainer does after a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Next {
    /// How long it sleeps.
    pub sleep: Duration,
    /// Whether it runs as soon as it wakes (`run_soon`), or as any thread.
    pub urgent: bool,
}

impl Pace {
    pub fn new(cap: u64, now: Instant) -> Pace {
        Pace {
            cap,
            last_pass: now,
            last_record: None,
            busy: IDLE,
            busy_urgent: false,
        }
    }

    /// After a pass that started at `now` and consumed `records` (from all
    /// rings; taken as one ring's, which errs towards waking sooner): how
    /// long to sleep before the next, and how urgently.
    pub fn after_pass(&mut self, now: Instant, records: usize) -> Next {
        let since = now.saturating_duration_since(self.last_pass);
        self.last_pass = now;
        if records > 0 {
            self.last_record = Some(now);
            // The time the whole ring takes to fill at this rate.
            let fill = since.as_nanos() * u128::from(self.cap) / records as u128;
            let fill = Duration::from_nanos(fill.min(u128::from(u64::MAX)) as u64);
            self.busy = (fill / FILL_SHARE).clamp(BURST_IDLE, IDLE);
            self.busy_urgent = fill < URGENT_FILL;
        } else if !matches!(self.last_record, Some(t) if now.saturating_duration_since(t) < BURST) {
            return Next {
                sleep: IDLE,
                urgent: false,
            };
        }
        Next {
            sleep: self.busy,
            urgent: self.busy_urgent,
        }
    }
}

/// The drainer's nice value where it cannot be real-time (`run_soon`).
const DRAIN_NICE: libc::c_int = -10;

/// Let the calling thread (the drainer) run as soon as it wakes, or as any
/// other thread again. Urgent: `SCHED_RR` at the lowest real-time priority
/// where the host allows it (root, or CAP_SYS_NICE), else nice
/// `DRAIN_NICE`, else as it is (the drops that costs are counted and
/// said). On a busy host a CFS thread waited longer than a small ring
/// holds after its sleep, at nice -10 too (other sessions' autogroups
/// share the CPUs fairly): 500 calls into 64-record rings gave 17 to 404
/// drops in 5 of 6 runs beside a build, none in 4 of 4 as `SCHED_RR`. The
/// kernel's real-time throttling (`sched_rt_runtime_us`) keeps CPU time
/// for everything else.
pub fn run_soon(urgent: bool) {
    let (policy, priority, nice) = match urgent {
        true => (libc::SCHED_RR, 1, DRAIN_NICE),
        false => (libc::SCHED_OTHER, 0, 0),
    };
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: sched_setscheduler only reads `param` (pid 0: the calling
    // thread); gettid has no arguments; setpriority only reads its
    // arguments (PRIO_PROCESS with a thread id sets that thread's nice
    // value, setpriority(2) NOTES).
    unsafe {
        let tid = libc::gettid();
        if libc::sched_setscheduler(0, policy | libc::SCHED_RESET_ON_FORK, &param) != 0 || !urgent {
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn next(sleep: Duration, urgent: bool) -> Next {
        Next { sleep, urgent }
    }

    #[test]
    fn an_idle_drainer_sleeps_the_longest() {
        let t0 = Instant::now();
        let mut pace = Pace::new(64, t0);
        assert_eq!(pace.after_pass(t0 + MS, 0), next(IDLE, false));
    }

    #[test]
    fn a_small_ring_in_a_burst_is_polled_at_the_burst_pace() {
        let t0 = Instant::now();
        let mut pace = Pace::new(64, t0);
        // 64 records in a millisecond: a 64-record ring fills in one.
        let quarter = Duration::from_micros(250);
        assert_eq!(pace.after_pass(t0 + MS, 64), next(quarter, true));
        // Faster still: no shorter than BURST_IDLE.
        assert_eq!(
            pace.after_pass(t0 + MS + MS / 10, 64),
            next(BURST_IDLE, true)
        );
        // An empty pass within the burst keeps its pace; long after, idle.
        assert_eq!(pace.after_pass(t0 + 2 * MS, 0), next(BURST_IDLE, true));
        assert_eq!(pace.after_pass(t0 + 60 * MS, 0), next(IDLE, false));
    }

    #[test]
    fn a_large_ring_filling_slowly_is_not_polled_faster() {
        let t0 = Instant::now();
        // The own VMM's rings of thousands, a record every few microseconds:
        // 16,384 records fill in 55 ms, a quarter of it is over IDLE.
        let mut pace = Pace::new(16_384, t0);
        assert_eq!(pace.after_pass(t0 + MS, 300), next(IDLE, true));
        // Ten records a millisecond: no hurry.
        assert_eq!(pace.after_pass(t0 + 2 * MS, 10), next(IDLE, false));
        assert_eq!(pace.after_pass(t0 + 3 * MS, 0), next(IDLE, false));
    }
}
