//! The Chrome export's tracks: which process (`pid`) and thread (`tid`)
//! each call is drawn on, and the metadata events that name them.
//!
//! A trace without guest tasks has one process (pid 1, `vmtrace: KERNEL`)
//! and a thread per vCPU (tid = vCPU + 1, `vCPU N`). A trace with tasks
//! (`Trace::tasks`) has the guest's own: one process per thread group (pid
//! = tgid, named by its leader's comm) and one thread per task (tid = pid,
//! named by its comm; a task renamed by exec keeps one thread, named by its
//! latest comm). Linux gives every CPU's idle task pid 0: each is a thread
//! of its own in process 0 (`swapper`), tid [`IDLE_TID`] + vCPU, so that
//! two vCPUs idling at once do not share a track. Calls whose task is not
//! known go to a `vmtrace: KERNEL` process of pid [`UNKNOWN_PID`], a thread
//! per vCPU (tid `UNKNOWN_PID` + 1 + vCPU), which also carries the label
//! of dropped events. No Linux pid reaches these ids.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write};

use super::json_str;
use crate::trace::model::{Task, Trace, TraceMeta};

/// Linux's PID_MAX_LIMIT on 64-bit: no pid or tgid reaches it.
pub const PID_LIMIT: u64 = 4 << 20;
/// Traces with tasks: the process of the calls whose task is unknown.
pub const UNKNOWN_PID: u64 = PID_LIMIT;
/// Traces with tasks: the thread of vCPU N's idle task is `IDLE_TID + N`
/// (past `UNKNOWN_PID`'s threads for up to 8,192 vCPUs).
pub const IDLE_TID: u64 = PID_LIMIT + 1 + 8192;

/// Where a trace's calls go.
pub(super) struct Tracks<'t> {
    trace: &'t Trace,
    /// The trace has tasks: tracks are the guest's.
    by_task: bool,
}

impl<'t> Tracks<'t> {
    pub(super) fn new(trace: &'t Trace) -> Self {
        Tracks {
            trace,
            by_task: !trace.tasks.is_empty(),
        }
    }

    fn task(&self, id: u32) -> Option<&'t Task> {
        (id as usize)
            .checked_sub(1)
            .and_then(|i| self.trace.tasks.get(i))
    }

    /// The (pid, tid) of a call of task `id` (`Event::task`) on `cpu`.
    pub(super) fn of(&self, id: u32, cpu: u32) -> (u64, u64) {
        let cpu = u64::from(cpu);
        if !self.by_task {
            return (1, cpu + 1);
        }
        match self.task(id) {
            Some(t) if t.pid == 0 => (0, IDLE_TID + cpu),
            Some(t) => (u64::from(t.tgid), u64::from(t.pid)),
            None => (UNKNOWN_PID, UNKNOWN_PID + 1 + cpu),
        }
    }

    /// The metadata events (each after `,\n` but the first), from the
    /// document's opening on.
    pub(super) fn metadata(&self, w: &mut impl Write) -> io::Result<()> {
        let m = &self.trace.meta;
        w.write_all(b"{\"traceEvents\":[\n")?;
        if !self.by_task {
            kernel_process(w, m, 1)?;
            for cpu in 0..m.cpus {
                vcpu_thread(w, 1, u64::from(cpu) + 1, cpu)?;
            }
            return Ok(());
        }
        // Processes by pid, their threads by tid, each named by its latest
        // task (ids grow with time), a process by its leader (pid = tgid).
        let mut threads: BTreeMap<(u64, u64), u32> = BTreeMap::new();
        let mut leaders: BTreeMap<u64, u32> = BTreeMap::new();
        let mut unknown = BTreeSet::new();
        let rank = |id: u32| (self.task(id).is_some_and(|t| t.pid == t.tgid), id);
        for e in self.trace.events.iter().filter(|e| !e.is_return()) {
            if self.task(e.task).is_none() {
                unknown.insert(e.cpu);
                continue;
            }
            let (pid, tid) = self.of(e.task, e.cpu);
            let thread = threads.entry((pid, tid)).or_insert(e.task);
            *thread = (*thread).max(e.task);
            let leader = leaders.entry(pid).or_insert(e.task);
            if rank(e.task) > rank(*leader) {
                *leader = e.task;
            }
        }
        kernel_process(w, m, UNKNOWN_PID)?;
        for cpu in unknown {
            vcpu_thread(w, UNKNOWN_PID, UNKNOWN_PID + 1 + u64::from(cpu), cpu)?;
        }
        let comm = |id: u32| self.task(id).map_or("", |t| t.comm.as_str());
        for (&pid, &leader) in &leaders {
            let name = if pid == 0 { "swapper" } else { comm(leader) };
            write!(
                w,
                ",\n{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":0,\"args\":{{\"name\":{}}}}}",
                json_str(name)
            )?;
            for (&(_, tid), &id) in threads.range((pid, 0)..=(pid, u64::MAX)) {
                write!(
                    w,
                    ",\n{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"name\":{}}}}}",
                    json_str(comm(id))
                )?;
            }
        }
        Ok(())
    }
}

/// The `vmtrace: KERNEL` process (pid `pid`), with a label when some
/// events were dropped; the first event of the document.
fn kernel_process(w: &mut impl Write, m: &TraceMeta, pid: u64) -> io::Result<()> {
    write!(
        w,
        "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":0,\"args\":{{\"name\":{}}}}}",
        json_str(&format!("vmtrace: {}", m.kernel))
    )?;
    if m.events_dropped > 0 {
        // Shown beside the process name in Perfetto and chrome://tracing.
        write!(
            w,
            ",\n{{\"name\":\"process_labels\",\"ph\":\"M\",\"pid\":{pid},\"tid\":0,\"args\":{{\"labels\":\"{} of {} events dropped (not stored)\"}}}}",
            m.events_dropped, m.events_total
        )?;
    }
    Ok(())
}

/// vCPU `cpu`'s thread `tid` of process `pid`, named and sorted by vCPU.
fn vcpu_thread(w: &mut impl Write, pid: u64, tid: u64, cpu: u32) -> io::Result<()> {
    write!(
        w,
        ",\n{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"name\":\"vCPU {cpu}\"}}}}\
         ,\n{{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"sort_index\":{cpu}}}}}"
    )
}
