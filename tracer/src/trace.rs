//! A recorded trace: everything a report, a saved file or an export needs,
//! self-contained (no vmlinux needed to read it back).

/// One traced function entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Event {
    /// Host CLOCK_MONOTONIC, nanoseconds.
    pub ts_ns: u64,
    /// Return address at [RSP] on entry: where in the caller the call came from.
    pub parent: u64,
    /// Index into `Trace::functions`.
    pub func: u32,
    /// vCPU that made the call.
    pub cpu: u32,
}

/// A function symbol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FuncSym {
    pub name: String,
    pub addr: u64,
    pub size: u64,
}

/// Facts about the run, for the report header.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TraceMeta {
    /// The kernel file the guest booted.
    pub kernel: String,
    /// GNU build id of the vmlinux the symbols came from (hex), if it has one.
    pub build_id: Option<String>,
    pub cpus: u32,
    /// Host monotonic time of the attach and of the detach, ns.
    pub attach_ns: u64,
    pub detach_ns: u64,
    /// Sites written with the trap.
    pub sites_patched: u64,
    /// Selected sites left alone: in init text (freed by the guest after boot)
    /// or not holding a NOP / `call __fentry__` when checked.
    pub sites_skipped_init: u64,
    pub sites_skipped_other: u64,
    /// The attach's stop-the-world window and latency, ns.
    pub attach_window_ns: u64,
    pub attach_latency_ns: u64,
    /// Events counted (exact), and how many of them were not stored (over
    /// `--max-events`); counts include the unstored ones.
    pub events_total: u64,
    pub events_dropped: u64,
    /// Traps whose caller could not be read from the guest stack.
    pub parent_unreadable: u64,
    /// Why the guest stopped.
    pub stop_reason: String,
}

/// The whole trace.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    pub meta: TraceMeta,
    /// The traced functions (those with a patched site).
    pub functions: Vec<FuncSym>,
    /// Exact call counts, `counts[func][cpu]`.
    pub counts: Vec<Vec<u64>>,
    /// The functions that callers' return addresses fall in, sorted by address.
    pub callers: Vec<FuncSym>,
    /// Stored events, sorted by time.
    pub events: Vec<Event>,
}

impl Trace {
    /// The caller function containing return address `ip`.
    pub fn caller_of(&self, ip: u64) -> Option<&FuncSym> {
        let i = self.callers.partition_point(|s| s.addr <= ip);
        let s = self.callers.get(i.checked_sub(1)?)?;
        (ip < s.addr + s.size.max(1)).then_some(s)
    }

    /// Seconds between attach and detach.
    pub fn duration_s(&self) -> f64 {
        self.meta.detach_ns.saturating_sub(self.meta.attach_ns) as f64 / 1e9
    }

    /// Total of the exact counts of one function.
    pub fn total(&self, func: usize) -> u64 {
        self.counts.get(func).map(|c| c.iter().sum()).unwrap_or(0)
    }
}
