//! Reading a data file (format versions 5 to 14, see the parent module):
//! blocks up to `END`, or up to the last complete block of a file whose
//! writer was killed.

use std::io::Read;

use super::added::{read_funcs_block, TAG_FUNCS};
use super::body::{check_new_events, decode, read_body, Body, Named};
use super::fields::{read_fields_block, TAG_FIELDS};
use super::reader::Reader;
use super::stream::{
    ARGS_HEADER, ARGS_SIZE, MAX_BLOCK, TAG_ARGS, TAG_END, TAG_EVENTS, TAG_FOOT, TAG_HEAD,
    TAG_STACKS, TAG_TASKS, TASK_FIXED,
};
use super::{
    check_callers, Section, TraceFileError, EVENT_CHUNK, EVENT_SIZE, EVENT_SIZE_V8, EVENT_SIZE_V9,
    VERSION_12, VERSION_14, VERSION_8, VERSION_9,
};
use crate::kernel::unwind::{StackEnd, MAX_FRAMES};
use crate::plan::exitless::layout::{CODE_LEN, CODE_VA};
use crate::trace::model::{caller_index, Event, Stack, Task, Trace, ARG_REGS};

/// Reads the blocks after the preamble (`declared`: its `file_len`, 0) of
/// a file of `version` (5 to 9).
// Long: one arm per block tag, each a few lines; the order rules between
// blocks (what may follow what) read best in one match.
pub(super) fn load<R: Read>(
    mut r: Reader<'_, R>,
    declared: u64,
    version: u32,
) -> Result<Trace, TraceFileError> {
    if declared != 0 {
        return Err(r.corrupt(format!(
            "a version {version} file has file_len 0, not {declared}"
        )));
    }
    // Lengths are checked against the file as it is.
    r.declared = r.actual;
    let mut head: Option<Body> = None;
    let mut foot: Option<Body> = None;
    let mut ended = false;
    let mut blocks = 0u64;
    let mut events: Vec<Event> = Vec::new();
    let mut named = Named::default();
    let event_size = match version {
        VERSION_9.. => EVENT_SIZE_V9,
        VERSION_8 => EVENT_SIZE_V8,
        _ => EVENT_SIZE,
    };
    loop {
        r.section = Section::Block;
        if ended {
            break;
        }
        let Some((tag, payload)) = next_block(&mut r, blocks)? else {
            break;
        };
        blocks += 1;
        match tag {
            TAG_HEAD if head.is_none() => head = Some(body(&r, &payload, version)?),
            TAG_EVENTS => {
                let Some(h) = head.as_ref().filter(|_| foot.is_none()) else {
                    return Err(r.corrupt("events outside HEAD .. FOOT".into()));
                };
                r.section = Section::Events;
                read_events(&r, &payload, h, event_size, &named, &mut events)?;
            }
            TAG_TASKS if version >= VERSION_8 && head.is_some() && foot.is_none() => {
                read_tasks(&r, &payload, &mut named.tasks)?;
            }
            TAG_ARGS if version >= VERSION_8 && head.is_some() && foot.is_none() => {
                read_args(&r, &payload, &mut named.args)?;
            }
            TAG_FUNCS if version >= VERSION_14 && foot.is_none() => {
                let Some(h) = head.as_mut() else {
                    return Err(r.corrupt("functions added before HEAD".into()));
                };
                read_funcs_block(&r, &payload, &mut h.functions)?;
                if !h.prototypes.is_empty() {
                    // An added function has no prototype: its values raw.
                    h.prototypes.resize(h.functions.len(), None);
                }
            }
            TAG_STACKS if version >= VERSION_9 && head.is_some() && foot.is_none() => {
                read_stacks(&r, &payload, &mut named.stacks)?;
            }
            TAG_FIELDS if version >= VERSION_12 && head.is_some() && foot.is_none() => {
                let args = named.args.len();
                read_fields_block(&r, &payload, args, &mut named.fields)?;
            }
            TAG_FOOT if head.is_some() && foot.is_none() => {
                foot = Some(body(&r, &payload, version)?)
            }
            TAG_END if foot.is_some() && payload.is_empty() => ended = true,
            _ => {
                return Err(r.corrupt(format!(
                    "unexpected block {:?} (block {blocks})",
                    String::from_utf8_lossy(&tag)
                )))
            }
        }
    }
    if ended && r.pos != r.actual {
        return Err(r.corrupt(format!("{} bytes after the END block", r.actual - r.pos)));
    }
    let Some(head) = head else {
        r.section = Section::Header;
        return Err(r.truncated());
    };
    // Recorded per vCPU in batches: in time order per vCPU only.
    events.sort_by_key(|e| (e.ts_ns, e.cpu));
    let graph = head.meta.graph;
    if graph {
        // Tail callees found vmtrace's return hook as their caller.
        crate::trace::model::unhook_callers(&mut events, CODE_VA..CODE_VA + CODE_LEN);
    }
    let trace = match foot.filter(|_| ended) {
        Some(foot) => {
            r.section = Section::Header;
            if foot.functions != head.functions || foot.meta.cpus != head.meta.cpus {
                return Err(r.corrupt("FOOT and HEAD name different functions or vCPUs".into()));
            }
            foot.with_events(events, named).map_err(|d| r.corrupt(d))?
        }
        None => cut_short(head, events, named, blocks),
    };
    Ok(trace)
}

/// A block's tag and payload.
type Block = ([u8; 4], Vec<u8>);

/// The next block's tag and payload, checked against its checksum; None
/// where the blocks end: at the end of the file, or at a last block cut
/// short (the writer was stopped mid-write).
fn next_block<R: Read>(
    r: &mut Reader<'_, R>,
    blocks: u64,
) -> Result<Option<Block>, TraceFileError> {
    let left = r.actual - r.pos;
    if left == 0 {
        return Ok(None);
    }
    if left < 8 {
        // A block header cut short: the writer was stopped mid-write.
        return Ok(None);
    }
    let tag = r.u32()?.to_le_bytes();
    let len = r.u32()?;
    if len > MAX_BLOCK {
        return Err(r.corrupt(format!(
            "block {blocks} claims {len} bytes (at most {MAX_BLOCK})"
        )));
    }
    if u64::from(len) + 4 > r.actual - r.pos {
        // The last block, cut short.
        return Ok(None);
    }
    let mut payload = vec![0u8; len as usize];
    r.bytes(&mut payload)?;
    let crc = r.u32()?;
    let mut framed = crc32fast::Hasher::new();
    framed.update(&tag);
    framed.update(&len.to_le_bytes());
    framed.update(&payload);
    if framed.finalize() != crc {
        if r.pos == r.actual {
            // The last block, its bytes not all written.
            return Ok(None);
        }
        return Err(r.corrupt(format!("block {blocks} fails its checksum")));
    }
    Ok(Some((tag, payload)))
}

/// A `HEAD` or `FOOT` block's body.
fn body<R: Read>(r: &Reader<'_, R>, payload: &[u8], version: u32) -> Result<Body, TraceFileError> {
    let mut sub = Reader::block(r, payload, Section::Header);
    let b = read_body(&mut sub, version)?;
    if sub.pos != sub.actual {
        return Err(sub.corrupt(format!("{} bytes after the callers", sub.actual - sub.pos)));
    }
    Ok(b)
}

/// An `EVTS` block's events (records of `size` bytes, naming at most the
/// tasks and arguments saved before), appended to `events`.
fn read_events<R: Read>(
    r: &Reader<'_, R>,
    payload: &[u8],
    head: &Body,
    size: usize,
    named: &Named,
    events: &mut Vec<Event>,
) -> Result<(), TraceFileError> {
    let n = payload
        .get(..4)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()) as usize);
    let records = &payload[4.min(payload.len())..];
    if n.is_none_or(|n| n * size != records.len()) {
        return Err(r.corrupt(format!(
            "an event block of {} bytes does not hold whole records",
            payload.len()
        )));
    }
    for chunk in records.chunks(EVENT_CHUNK * size) {
        let first = events.len();
        events.extend(chunk.chunks_exact(size).map(|b| decode(b, size)));
        check_new_events(events, first, head, named).map_err(|d| r.corrupt(d))?;
    }
    Ok(())
}

/// The reader of a `TASK` or `STAK` block's payload and its entry count,
/// checked: it starts where the `have` entries before it end, and the
/// entries stay numbered by u32 ids (`Event::task`, `Event::stack`).
fn table_block<'a, R: Read>(
    r: &Reader<'a, R>,
    payload: &'a [u8],
    section: Section,
    have: usize,
    what: &str,
) -> Result<(Reader<'a, &'a [u8]>, u32), TraceFileError> {
    let mut sub = Reader::block(r, payload, section);
    let first = sub.u32()? as usize;
    if first != have {
        return Err(sub.corrupt(format!(
            "a {what} block starts at {what} {} but {have} {what}s came before it",
            first + 1
        )));
    }
    let n = sub.u32()?;
    if u32::try_from(have + n as usize).is_err() {
        return Err(sub.corrupt(format!(
            "{} {what}s in all (max {})",
            have as u64 + u64::from(n),
            u32::MAX
        )));
    }
    Ok((sub, n))
}

/// A `TASK` block's tasks, appended to `tasks` (those before it).
fn read_tasks<R: Read>(
    r: &Reader<'_, R>,
    payload: &[u8],
    tasks: &mut Vec<Task>,
) -> Result<(), TraceFileError> {
    let (mut sub, n) = table_block(r, payload, Section::Tasks, tasks.len(), "task")?;
    sub.need(u64::from(n) * TASK_FIXED as u64, &format!("{n} tasks"))?;
    tasks.reserve(n as usize);
    for _ in 0..n {
        let pid = sub.u32()?;
        let tgid = sub.u32()?;
        let comm = sub.string("a task's comm")?;
        tasks.push(Task { pid, tgid, comm });
    }
    if sub.pos != sub.actual {
        return Err(sub.corrupt(format!("{} bytes after the tasks", sub.actual - sub.pos)));
    }
    Ok(())
}

/// An `ARGS` block's arguments, appended to `args` (those before it).
fn read_args<R: Read>(
    r: &Reader<'_, R>,
    payload: &[u8],
    args: &mut Vec<[u64; ARG_REGS]>,
) -> Result<(), TraceFileError> {
    let corrupt = |detail: String| TraceFileError::Corrupt {
        path: r.path.to_path_buf(),
        section: Section::Args,
        detail,
    };
    let (Some(first), Some(n)) = (payload.get(..8), payload.get(8..ARGS_HEADER)) else {
        return Err(corrupt(format!(
            "an argument block of {} bytes",
            payload.len()
        )));
    };
    let first = u64::from_le_bytes(first.try_into().unwrap());
    let n = u32::from_le_bytes(n.try_into().unwrap()) as usize;
    if first != args.len() as u64 {
        return Err(corrupt(format!(
            "an argument block starts at call {} but {} calls' arguments came before it",
            first.saturating_add(1),
            args.len()
        )));
    }
    let records = &payload[ARGS_HEADER..];
    if n.checked_mul(ARGS_SIZE) != Some(records.len()) {
        return Err(corrupt(format!(
            "an argument block of {} bytes does not hold {n} calls' arguments",
            payload.len()
        )));
    }
    args.reserve(n);
    for rec in records.chunks_exact(ARGS_SIZE) {
        let mut a = [0u64; ARG_REGS];
        for (v, b) in a.iter_mut().zip(rec.chunks_exact(8)) {
            *v = u64::from_le_bytes(b.try_into().unwrap());
        }
        args.push(a);
    }
    Ok(())
}

/// A `STAK` block's stacks, appended to `stacks` (those before it).
fn read_stacks<R: Read>(
    r: &Reader<'_, R>,
    payload: &[u8],
    stacks: &mut Vec<Stack>,
) -> Result<(), TraceFileError> {
    let (mut sub, n) = table_block(r, payload, Section::Stacks, stacks.len(), "stack")?;
    // Each stack is at least its end code, frame count and exact mask.
    sub.need(
        u64::from(n) * super::stream::STACK_FIXED as u64,
        &format!("{n} stacks"),
    )?;
    for _ in 0..n {
        let code = sub.u8()?;
        let end = StackEnd::from_u8(code).ok_or_else(|| {
            sub.corrupt(format!("stack {} ends with code {code}", stacks.len() + 1))
        })?;
        let nframes = sub.u32()? as usize;
        if nframes > MAX_FRAMES {
            return Err(sub.corrupt(format!(
                "stack {} has {nframes} frames (at most {MAX_FRAMES})",
                stacks.len() + 1
            )));
        }
        let exact = sub.u64()?;
        if nframes < 64 && exact >> nframes != 0 {
            return Err(sub.corrupt(format!(
                "stack {} marks exact frames past its {nframes}",
                stacks.len() + 1
            )));
        }
        let frames = (0..nframes)
            .map(|_| sub.u64())
            .collect::<Result<Vec<_>, _>>()?;
        stacks.push(Stack { frames, end, exact });
    }
    if sub.pos != sub.actual {
        return Err(sub.corrupt(format!("{} bytes after the stacks", sub.actual - sub.pos)));
    }
    Ok(())
}

/// The trace of a file whose writer was killed: the run's facts as known
/// at the start, counts from the stored events (exact as far as they go),
/// the callers those events use.
fn cut_short(head: Body, events: Vec<Event>, named: Named, blocks: u64) -> Trace {
    let cpus = head.meta.cpus as usize;
    let nfunc = head.functions.len();
    let mut counts = vec![vec![0u64; cpus]; nfunc];
    let mut returns = if head.meta.graph {
        vec![vec![0u64; cpus]; nfunc]
    } else {
        Vec::new()
    };
    for e in &events {
        // Indices were checked as the events were read.
        let m = if e.is_return() {
            &mut returns
        } else {
            &mut counts
        };
        m[e.func as usize][e.cpu as usize] += 1;
    }
    let mut meta = head.meta;
    meta.events_total = counts.iter().flatten().sum();
    meta.events_dropped = 0;
    meta.returns_dropped = 0;
    meta.incomplete = true;
    meta.stop_reason =
        format!("the recording was cut short (the data file ends after {blocks} complete blocks)");
    if let (Some(first), Some(last)) = (events.first(), events.last()) {
        // HEAD was written before the attach: its times are not known.
        if meta.attach_ns == 0 || meta.attach_ns > first.ts_ns {
            meta.attach_ns = first.ts_ns;
        }
        meta.detach_ns = last.ts_ns;
    }
    // HEAD lists every kernel function as a possible caller: keep those
    // used, by events and by the stacks' frames (a return address names
    // the function of the call before it).
    let mut used = vec![false; head.callers.len()];
    let frames = named
        .stacks
        .iter()
        .flat_map(|s| (0..s.frames.len()).map(|i| s.lookup_addr(i)));
    let addrs = events.iter().map(|e| e.parent);
    for a in addrs.chain(frames) {
        if let Some(i) = caller_index(&head.callers, a) {
            used[i] = true;
        }
    }
    let callers = head
        .callers
        .into_iter()
        .zip(used)
        .filter_map(|(s, u)| u.then_some(s))
        .collect::<Vec<_>>();
    debug_assert!(check_callers(&callers).is_ok());
    Trace {
        meta,
        functions: head.functions,
        counts,
        returns,
        callers,
        events,
        tasks: named.tasks,
        args: named.args,
        prototypes: head.prototypes,
        stacks: named.stacks,
        fields: crate::trace::model::EventFields {
            formats: head.formats,
            values: named.fields,
            return_formats: head.return_formats,
        },
    }
}
