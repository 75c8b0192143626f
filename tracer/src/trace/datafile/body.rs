//! A trace's body, everything but its events (see [`Body`]), read and
//! checked; and the checks of its events against it. Shared by the readers
//! of every version (`read`, `read_v5`).

use std::io::Read;

use super::cmdline::read_cmdline;
use super::protos::read_prototypes;
use super::reader::Reader;
use super::{
    check_callers, check_events, Counted, Section, TraceFileError, EVENT_SIZE, EVENT_SIZE_V8,
    EVENT_SIZE_V9, VERSION, VERSION_1, VERSION_10, VERSION_11, VERSION_12, VERSION_3, VERSION_5,
    VERSION_6, VERSION_7, VERSION_8, VERSION_9,
};
use crate::kernel::symbols::Symbol;
use crate::trace::fields::{EventFormat, FieldValue};
use crate::trace::model::{
    DropCauses, Event, EventFields, Prototype, Stack, Task, Trace, TraceMeta, ARG_REGS,
};

/// One event record of `size` bytes (`EVENT_SIZE_V9`; `EVENT_SIZE_V8`
/// without the stack; `EVENT_SIZE` without the task and data either;
/// `EVENT_SIZE_V2` without the slot either).
pub(super) fn decode(b: &[u8], size: usize) -> Event {
    let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    if size == EVENT_SIZE_V9 {
        Event {
            ts_ns: u64_at(0),
            parent: u64_at(8),
            slot: u64_at(16),
            func: u32_at(24),
            cpu: u32_at(28),
            task: u32_at(32),
            stack: u32_at(36),
            data: u64_at(40),
        }
    } else if size >= EVENT_SIZE {
        Event {
            ts_ns: u64_at(0),
            parent: u64_at(8),
            slot: u64_at(16),
            func: u32_at(24),
            cpu: u32_at(28),
            task: if size == EVENT_SIZE_V8 { u32_at(32) } else { 0 },
            stack: 0,
            data: if size == EVENT_SIZE_V8 { u64_at(36) } else { 0 },
        }
    } else {
        Event {
            ts_ns: u64_at(0),
            parent: u64_at(8),
            slot: 0,
            func: u32_at(16),
            cpu: u32_at(20),
            task: 0,
            stack: 0,
            data: 0,
        }
    }
}

/// The events from `first` on index the body's functions and vCPUs and
/// the tasks, arguments and stacks read before them (`named`), and carry a
/// slot only in a function-graph trace.
pub(super) fn check_new_events(
    events: &[Event],
    first: usize,
    body: &Body,
    named: &Named,
) -> Result<(), String> {
    let meta = &body.meta;
    let counted = Counted {
        nfunc: body.functions.len(),
        cpus: meta.cpus as usize,
        tasks: named.tasks.len(),
        args: named.args.len(),
        stacks: named.stacks.len(),
    };
    check_events(&events[first..], first, &counted)?;
    if !meta.graph {
        if let Some(i) = events[first..].iter().position(|e| e.slot != 0) {
            return Err(format!(
                "event {} has a stack slot but the trace has no function graph",
                first + i
            ));
        }
    }
    Ok(())
}

/// Everything of a trace but its events: the header (the run's facts), the
/// functions, the exact counts, the callers. In versions 1 to 4 it comes
/// between the preamble and the events; in versions 5 to 8 a data file holds it
/// twice, as known at attach (`HEAD`) and at the end (`FOOT`).
pub(super) struct Body {
    pub meta: TraceMeta,
    pub functions: Vec<Symbol>,
    pub counts: Vec<Vec<u64>>,
    pub returns: Vec<Vec<u64>>,
    /// The sum of `returns` (checked not to overflow).
    pub returns_total: u64,
    pub callers: Vec<Symbol>,
    /// The traced functions' prototypes (version 8; empty: none saved).
    pub prototypes: Vec<Option<Prototype>>,
    /// The traced events' formats by function (version 12; empty: none).
    pub formats: Vec<Option<EventFormat>>,
    /// Those recorded at returns (version 15; empty: none).
    pub return_formats: Vec<Option<EventFormat>>,
}

/// What a data file holds besides its bodies and events: the guest tasks
/// and the entries' arguments (version 8), the kernel stacks (version 9).
#[derive(Default)]
pub(super) struct Named {
    pub tasks: Vec<Task>,
    pub args: Vec<[u64; ARG_REGS]>,
    pub stacks: Vec<Stack>,
    /// Event entries' fields by arguments id (version 12, `FLDS` blocks).
    pub fields: std::collections::BTreeMap<u64, Vec<FieldValue>>,
}

impl Body {
    /// The trace, once its stored events are checked against the counts
    /// (their tasks and arguments were checked as they were read).
    pub(super) fn with_events(self, events: Vec<Event>, named: Named) -> Result<Trace, String> {
        let meta = &self.meta;
        let entries: Vec<Event> = events.iter().filter(|e| !e.is_return()).copied().collect();
        if entries.len() as u64 + meta.events_dropped != meta.events_total {
            return Err(format!(
                "{} entries stored and {} dropped, but {} in all",
                entries.len(),
                meta.events_dropped,
                meta.events_total
            ));
        }
        check_against_counts(&entries, &self.counts, meta.events_dropped == 0)?;
        if meta.graph {
            let rets: Vec<Event> = events.iter().filter(|e| e.is_return()).copied().collect();
            if rets.len() as u64 + meta.returns_dropped != self.returns_total {
                return Err(format!(
                    "{} returns stored and {} dropped, but {} in all",
                    rets.len(),
                    meta.returns_dropped,
                    self.returns_total
                ));
            }
            check_against_counts(&rets, &self.returns, meta.returns_dropped == 0)
                .map_err(|d| format!("returns: {d}"))?;
        }
        Ok(Trace {
            meta: self.meta,
            functions: self.functions,
            counts: self.counts,
            returns: self.returns,
            callers: self.callers,
            events,
            tasks: named.tasks,
            args: named.args,
            prototypes: self.prototypes,
            stacks: named.stacks,
            fields: EventFields {
                formats: self.formats,
                values: named.fields,
                return_formats: self.return_formats,
            },
        })
    }
}

/// The body (see [`Body`]) of a file of `version`.
pub(super) fn read_body<R: Read>(
    r: &mut Reader<'_, R>,
    version: u32,
) -> Result<Body, TraceFileError> {
    let meta = read_header(r, version)?;

    r.section = Section::Functions;
    let functions = r.syms("functions")?;

    let Counts {
        counts,
        returns,
        returns_total,
    } = read_counts(r, &meta, functions.len(), version)?;

    r.section = Section::Callers;
    let callers = r.syms("callers")?;
    check_callers(&callers).map_err(|d| r.corrupt(d))?;

    let prototypes = if version >= VERSION_8 {
        r.section = Section::Prototypes;
        read_prototypes(r, functions.len())?
    } else {
        Vec::new()
    };
    if let Some(&f) = meta
        .stack_funcs
        .iter()
        .find(|&&f| f as usize >= functions.len())
    {
        r.section = Section::Header;
        return Err(r.corrupt(format!(
            "stack function {f} but there are {} functions",
            functions.len()
        )));
    }

    let formats = match version >= VERSION_12 {
        true => super::fields::read_formats(r, functions.len(), version)?,
        false => Vec::new(),
    };
    let return_formats = match version >= super::VERSION_15 {
        true => super::fields::read_formats(r, functions.len(), version)?,
        false => Vec::new(),
    };
    Ok(Body {
        meta,
        functions,
        counts,
        returns,
        returns_total,
        callers,
        prototypes,
        formats,
        return_formats,
    })
}

/// The header: the run's facts, as far as the file's `version` has them.
// Long: one field a line, in the file's order (the format table in the
// module doc); the version-dependent tails are functions of their own.
fn read_header<R: Read>(r: &mut Reader<'_, R>, version: u32) -> Result<TraceMeta, TraceFileError> {
    r.section = Section::Header;
    let kernel = r.string("kernel")?;
    let build_id = match r.u8()? {
        0 => None,
        1 => Some(r.string("build id")?),
        b => return Err(r.corrupt(format!("has_build_id is {b}, not 0 or 1"))),
    };
    let cpus = r.u32()?;
    let mut v = [0u64; 10];
    for x in &mut v {
        *x = r.u64()?;
    }
    let stop_reason = r.string("stop reason")?;
    // Version 1 traces came from trap mode only: every call was an exit.
    let (mode, trap_exits) = if version == VERSION_1 {
        ("trap".to_string(), v[7])
    } else {
        (r.string("mode")?, r.u64()?)
    };
    // Versions 1 and 2 had no function graph.
    let (graph, returns_dropped, unhooked, tsc_khz) = if version >= VERSION_3 {
        read_graph_fields(r)?
    } else {
        (false, 0, 0, 0)
    };
    // Version 3 and older did not say where the symbols came from.
    let symbols = if version >= VERSION {
        r.string("symbols")?
    } else {
        String::new()
    };
    // Version 5 added what the recording lost, the flight recorder, the
    // rejected sites and the kernel's offsets.
    let v5 = if version >= VERSION_5 {
        read_v5_fields(r, cpus)?
    } else {
        V5Fields::default()
    };
    let Late {
        unfinished,
        vmm,
        tasks,
        filtered,
        args,
        retval,
        stacks,
        stack_funcs,
    } = read_late_fields(r, version)?;
    let drops = if version >= VERSION_10 {
        read_drop_causes(r, cpus)?
    } else {
        DropCauses::default()
    };
    let cmdline = match version >= VERSION_11 {
        true => read_cmdline(r)?,
        false => Vec::new(),
    };
    check_header_counts(r, &v)?;
    let meta = TraceMeta {
        kernel,
        build_id,
        cpus,
        attach_ns: v[0],
        detach_ns: v[1],
        sites_patched: v[2],
        sites_skipped_init: v[3],
        sites_skipped_other: v[4],
        attach_window_ns: v[5],
        attach_latency_ns: v[6],
        events_total: v[7],
        events_dropped: v[8],
        parent_unreadable: v[9],
        stop_reason,
        mode,
        trap_exits,
        graph,
        returns_dropped,
        unhooked,
        tsc_khz,
        symbols,
        lost: v5.lost,
        overwrite: v5.overwrite,
        rejected_sites: v5.rejected_sites,
        kernel_offset: v5.kernel_offset,
        incomplete: false,
        // Not in the file: the run's alone.
        guest_instructions_emulated: None,
        unfinished,
        vmm,
        tasks,
        filtered,
        shown: String::new(),
        args,
        retval,
        stacks,
        stack_funcs,
        drops,
        cmdline,
    };
    Ok(meta)
}

/// Version 10's `DropCauses`: n is 0 or `cpus`.
fn read_drop_causes<R: Read>(
    r: &mut Reader<'_, R>,
    cpus: u32,
) -> Result<DropCauses, TraceFileError> {
    let n = r.u32()?;
    if n != 0 && n != cpus {
        return Err(r.corrupt(format!(
            "ring-full drops for {n} vCPUs in a trace of {cpus}"
        )));
    }
    r.need(u64::from(n) * 8 + 5 * 8, "the drop causes")?;
    let ring_full = (0..n).map(|_| r.u64()).collect::<Result<Vec<_>, _>>()?;
    let mut next = || r.u64();
    Ok(DropCauses {
        ring_full,
        held: next()?,
        ring_asked: next()?,
        ring_given: next()?,
        over_budget: next()?,
        overwritten: next()?,
    })
}

/// The header's fields after version 5's (see `TraceMeta`).
struct Late {
    unfinished: u64,
    vmm: String,
    tasks: String,
    filtered: u64,
    args: bool,
    retval: bool,
    stacks: String,
    stack_funcs: Vec<u32>,
}

/// `values`' bits: arguments recorded, return values recorded.
pub(super) const VALUES_ARGS: u8 = 1;
pub(super) const VALUES_RETVAL: u8 = 2;

/// The fields after version 5's: the exitless calls whose record was never
/// committed (version 6), who ran the guest (version 7), where the guest
/// tasks came from, the calls the task filter rejected and the values
/// recorded (version 8), how stacks were unwound and at which functions
/// (version 9).
fn read_late_fields<R: Read>(r: &mut Reader<'_, R>, version: u32) -> Result<Late, TraceFileError> {
    let unfinished = if version >= VERSION_6 { r.u64()? } else { 0 };
    let mut string = |since: u32, what: &str| {
        if version >= since {
            r.string(what)
        } else {
            Ok(String::new())
        }
    };
    let vmm = string(VERSION_7, "vmm")?;
    let tasks = string(VERSION_8, "tasks")?;
    let filtered = if version >= VERSION_8 { r.u64()? } else { 0 };
    let values = if version >= VERSION_8 { r.u8()? } else { 0 };
    if values & !(VALUES_ARGS | VALUES_RETVAL) != 0 {
        return Err(r.corrupt(format!(
            "values is {values:#x}: only bits 0 and 1 are known"
        )));
    }
    let (stacks, stack_funcs) = if version >= VERSION_9 {
        let note = r.string("stacks")?;
        let n = r.u32()?;
        r.need(u64::from(n) * 4, "the stack functions")?;
        let funcs = (0..n).map(|_| r.u32()).collect::<Result<Vec<_>, _>>()?;
        (note, funcs)
    } else {
        (String::new(), Vec::new())
    };
    Ok(Late {
        unfinished,
        vmm,
        tasks,
        filtered,
        args: values & VALUES_ARGS != 0,
        retval: values & VALUES_RETVAL != 0,
        stacks,
        stack_funcs,
    })
}

/// Version 3's function-graph fields: (graph, returns dropped, unhooked,
/// TSC kHz).
fn read_graph_fields<R: Read>(
    r: &mut Reader<'_, R>,
) -> Result<(bool, u64, u64, u64), TraceFileError> {
    let graph = match r.u8()? {
        0 => false,
        1 => true,
        b => return Err(r.corrupt(format!("graph is {b}, not 0 or 1"))),
    };
    Ok((graph, r.u64()?, r.u64()?, r.u64()?))
}

/// Version 5's fields of the header (see `TraceMeta`).
#[derive(Default)]
struct V5Fields {
    lost: Vec<u64>,
    overwrite: bool,
    rejected_sites: String,
    kernel_offset: Option<(i64, i64)>,
}

/// Version 5's fields: the losses per vCPU, the flight recorder, the
/// rejected sites and the kernel's offsets.
fn read_v5_fields<R: Read>(r: &mut Reader<'_, R>, cpus: u32) -> Result<V5Fields, TraceFileError> {
    let n = r.u32()?;
    if n != 0 && n != cpus {
        return Err(r.corrupt(format!("losses for {n} vCPUs but the trace has {cpus}")));
    }
    r.need(u64::from(n) * 8, "the losses per vCPU")?;
    let mut lost = Vec::with_capacity(n as usize);
    for _ in 0..n {
        lost.push(r.u64()?);
    }
    let overwrite = match r.u8()? {
        0 => false,
        1 => true,
        b => return Err(r.corrupt(format!("overwrite is {b}, not 0 or 1"))),
    };
    let rejected = r.string("rejected sites")?;
    let offset = match r.u8()? {
        0 => None,
        1 => Some((r.u64()? as i64, r.u64()? as i64)),
        b => return Err(r.corrupt(format!("has_offset is {b}, not 0 or 1"))),
    };
    Ok(V5Fields {
        lost,
        overwrite,
        rejected_sites: rejected,
        kernel_offset: offset,
    })
}

/// The header's numbers `v` (attach, detach, ..., events, dropped, caller
/// unreadable) agree with each other.
fn check_header_counts<R: Read>(r: &Reader<'_, R>, v: &[u64; 10]) -> Result<(), TraceFileError> {
    if v[0] > v[1] {
        return Err(r.corrupt(format!(
            "detach ({} ns) is before attach ({} ns)",
            v[1], v[0]
        )));
    }
    if v[8] > v[7] {
        return Err(r.corrupt(format!("{} events dropped of {} in all", v[8], v[7])));
    }
    if v[9] > v[7] {
        return Err(r.corrupt(format!(
            "{} events with an unreadable caller of {} in all",
            v[9], v[7]
        )));
    }
    Ok(())
}

/// The calls and returns per function and vCPU, and the returns' total.
struct Counts {
    counts: Vec<Vec<u64>>,
    returns: Vec<Vec<u64>>,
    returns_total: u64,
}

/// The counts and returns per function and vCPU, checked against the
/// header.
fn read_counts<R: Read>(
    r: &mut Reader<'_, R>,
    meta: &TraceMeta,
    nfunctions: usize,
    version: u32,
) -> Result<Counts, TraceFileError> {
    r.section = Section::Counts;
    let counts = r.matrix(nfunctions, meta.cpus as usize, "counts")?;
    let mut total = 0u64;
    for row in &counts {
        for &c in row {
            total = total
                .checked_add(c)
                .ok_or_else(|| r.corrupt("the counts add up past 2^64".into()))?;
        }
    }
    if total != meta.events_total {
        return Err(r.corrupt(format!(
            "the counts add up to {total} but the header says {} events in all",
            meta.events_total
        )));
    }
    let returns = if version >= VERSION_3 {
        r.section = Section::Returns;
        let (rows, cols) = if meta.graph {
            (nfunctions, meta.cpus as usize)
        } else {
            (0, 0)
        };
        r.matrix(rows, cols, "returns")?
    } else {
        Vec::new()
    };

    let mut returns_total = 0u64;
    for &c in returns.iter().flatten() {
        returns_total = returns_total
            .checked_add(c)
            .ok_or_else(|| r.corrupt("the returns add up past 2^64".into()))?;
    }
    if meta.returns_dropped > returns_total {
        return Err(r.corrupt(format!(
            "{} returns dropped of {returns_total} in all",
            meta.returns_dropped
        )));
    }
    Ok(Counts {
        counts,
        returns,
        returns_total,
    })
}

/// Stored events per vCPU and per function cannot exceed the counts; with
/// nothing dropped (`exact`) they equal them.
fn check_against_counts(events: &[Event], counts: &[Vec<u64>], exact: bool) -> Result<(), String> {
    let cpus = counts.first().map_or(0, Vec::len);
    let mut per_cpu = vec![0u64; cpus];
    let mut per_func = vec![0u64; counts.len()];
    for e in events {
        // Indices were checked as the events were read.
        per_cpu[e.cpu as usize] += 1;
        per_func[e.func as usize] += 1;
    }
    for (c, &stored) in per_cpu.iter().enumerate() {
        // No overflow: the total of all counts fits a u64.
        let counted: u64 = counts.iter().map(|row| row[c]).sum();
        if stored > counted || (exact && stored != counted) {
            return Err(format!(
                "{stored} events stored on vCPU {c} but the counts say {counted}"
            ));
        }
    }
    for (f, &stored) in per_func.iter().enumerate() {
        let counted: u64 = counts[f].iter().sum();
        if stored > counted || (exact && stored != counted) {
            return Err(format!(
                "{stored} events stored for function {f} but the counts say {counted}"
            ));
        }
    }
    Ok(())
}
