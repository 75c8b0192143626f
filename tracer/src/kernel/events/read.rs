//! Reading the event array entry by entry (see the module above).

use crate::kernel::btf::KernelBtf;
use crate::kernel::events::image_data::{self, word, EventData};
use crate::kernel::events::layout::EventLayout;
use crate::kernel::events::{
    decl, syscalls, EventArg, EventError, EventKind, EventTable, KernelEvent, MAX_EVENTS,
    SYSCALL_EXIT_ARG, SYSCALL_RAW_INIT,
};
use crate::kernel::symbols::KernelImage;

/// What the array points to (a kernel without event tracing has none).
const TRACE_EVENT_CALL: &str = "trace_event_call";

/// An event as the array gives it, before its arguments are looked up.
pub(super) struct RawEvent {
    pub(super) system: String,
    pub(super) name: String,
    pub(super) kind: EventKind,
    pub(super) tracepoint: Option<u64>,
    /// `call->data`: a syscall event's metadata.
    data: u64,
    /// TRACE_EVENT_FL_IGNORE_ENABLE, or no `class->reg`.
    pub(super) hidden: bool,
}

/// Whether a system or event name is one ftrace could print.
fn is_name(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// The event whose `struct trace_event_call` is at `call` in `mem`, or
/// why not.
pub(super) fn read_call(
    mem: &dyn EventData,
    l: &EventLayout,
    syscall_init: Option<u64>,
    call: u64,
) -> Result<RawEvent, &'static str> {
    let at = |off: u32| call.wrapping_add(u64::from(off));
    let class = mem.word(at(l.call_class)).ok_or("no class pointer")?;
    let system = mem
        .word(class.wrapping_add(u64::from(l.class_system)))
        .and_then(|s| mem.c_string(s))
        .filter(|s| is_name(s))
        .ok_or("no system name")?;
    let flags = mem.word32(at(l.call_flags)).ok_or("no flags")?;
    let name_ptr = mem.word(at(l.call_name)).ok_or("no name pointer")?;
    let tracepoint = (flags & l.fl_tracepoint != 0).then_some(name_ptr);
    let name = match tracepoint {
        Some(tp) => mem
            .word(tp.wrapping_add(u64::from(l.tp_name)))
            .and_then(|n| mem.c_string(n)),
        None => mem.c_string(name_ptr),
    }
    .filter(|s| is_name(s))
    .ok_or("no event name")?;
    let reg = mem
        .word(class.wrapping_add(u64::from(l.class_reg)))
        .ok_or("no class reg")?;
    let raw_init = mem
        .word(class.wrapping_add(u64::from(l.class_raw_init)))
        .ok_or("no raw_init")?;
    let kind = match (tracepoint, syscall_init) {
        (Some(_), _) => EventKind::Tracepoint,
        (None, Some(init)) if raw_init == init => EventKind::Syscall,
        _ => EventKind::Other,
    };
    Ok(RawEvent {
        system,
        name,
        kind,
        tracepoint,
        data: mem.word(at(l.call_data)).unwrap_or(0),
        hidden: flags & l.fl_ignore_enable != 0 || reg == 0,
    })
}

impl EventTable {
    /// Every event of the kernel `image`, with `btf` its types.
    pub fn read(image: &KernelImage, btf: &KernelBtf) -> Result<EventTable, EventError> {
        if !btf.has_struct(TRACE_EVENT_CALL) {
            return Err(EventError::NoArray {
                path: image.path.clone(),
            });
        }
        let l = EventLayout::from_btf(btf)?;
        let syscall_init = image.symbol(SYSCALL_RAW_INIT).map(|s| s.addr);
        let path = || image.path.clone();
        let (array, scanned) = match image_data::array_by_symbols(image) {
            Some(a) => (a, false),
            None => {
                let is_event = |p: u64| read_call(image, &l, syscall_init, p).is_ok();
                let a = image_data::array_by_scan(image, is_event)
                    .ok_or(EventError::NoArray { path: path() })?;
                (a, true)
            }
        };
        let (start, stop) = array;
        let bad = || EventError::BadArray {
            path: path(),
            start,
            stop,
        };
        if (stop - start) % 8 != 0 || (stop - start) / 8 > MAX_EVENTS {
            return Err(bad());
        }
        let mut raw = Vec::new();
        for (index, at) in (start..stop).step_by(8).enumerate() {
            let call = word(image, at).ok_or_else(bad)?;
            let e =
                read_call(image, &l, syscall_init, call).map_err(|what| EventError::BadEvent {
                    path: path(),
                    index,
                    call,
                    what,
                })?;
            raw.push((call, e));
        }
        let metas = syscall_metas(image, &l, &raw);
        let names: Vec<&str> = metas.iter().flatten().map(|m| m.name.as_str()).collect();
        let mapped = syscalls::mapped(image, &names);
        let events = raw
            .into_iter()
            .zip(&metas)
            .map(|((call, e), meta)| {
                let entry = match (&mapped, meta) {
                    (Some(map), Some(m)) => map.get(&m.name).cloned(),
                    _ => None,
                };
                let listed = !e.hidden
                    && match (e.kind, &mapped) {
                        (EventKind::Syscall, Some(_)) => entry.is_some(),
                        _ => true,
                    };
                let mut event = finish(image, btf, &l, call, e, meta.as_ref(), listed);
                event.syscall = entry.filter(|_| event.kind == EventKind::Syscall);
                event
            })
            .collect();
        Ok(EventTable {
            path: path(),
            events,
            array,
            scanned,
            syscalls_checked: mapped.is_some(),
        })
    }
}

/// Each syscall event's metadata (None for other events).
fn syscall_metas(
    image: &KernelImage,
    l: &EventLayout,
    raw: &[(u64, RawEvent)],
) -> Vec<Option<syscalls::SyscallMeta>> {
    raw.iter()
        .map(|(_, e)| match (e.kind, &l.meta) {
            (EventKind::Syscall, Some(m)) => syscalls::read_meta(image, m, e.data),
            _ => None,
        })
        .collect()
}

/// The event with its tracepoint's key and iterator, and its arguments.
fn finish(
    image: &KernelImage,
    btf: &KernelBtf,
    l: &EventLayout,
    call: u64,
    e: RawEvent,
    meta: Option<&syscalls::SyscallMeta>,
    listed: bool,
) -> KernelEvent {
    let args = match e.kind {
        EventKind::Tracepoint => decl::tracepoint_args(btf, &e.name),
        EventKind::Syscall if e.name.starts_with("sys_exit") => Some(vec![EventArg {
            ty: SYSCALL_EXIT_ARG.0.into(),
            name: SYSCALL_EXIT_ARG.1.into(),
        }]),
        EventKind::Syscall => meta.map(|m| m.args.clone()),
        EventKind::Other => None,
    };
    KernelEvent {
        system: e.system,
        name: e.name,
        kind: e.kind,
        call,
        tracepoint: e.tracepoint,
        key: e.tracepoint.map(|tp| tp.wrapping_add(u64::from(l.tp_key))),
        iterator: e
            .tracepoint
            .and_then(|tp| word(image, tp.wrapping_add(u64::from(l.tp_iterator)))),
        args,
        listed,
        syscall: None,
    }
}

impl EventTable {
    /// The listed events (those tracefs `available_events` names).
    pub fn listed(&self) -> impl Iterator<Item = &KernelEvent> {
        self.events.iter().filter(|e| e.listed)
    }
}
