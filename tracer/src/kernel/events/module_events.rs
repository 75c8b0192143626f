//! The events of a running guest's loaded modules (`list -e --qmp`, and
//! `attach -e`): each module's `trace_events` array
//! (`crate::kernel::modules`) points to its `struct trace_event_call`s,
//! read from the guest's memory as the image's are read from the file
//! (`super::read`), with what enabling one needs: its tracepoint's static
//! key and `__traceiter_NAME` (`tp->iterator`), its arguments from the
//! module's own BTF (`btf_trace_NAME` is declared there, not in the
//! kernel's), and its ftrace format (`super::ftrace_format`, the record
//! struct `trace_event_raw_NAME` in the module's BTF too).

use std::cell::RefCell;

use vmm::gva::AddressSpace;

use crate::kernel::btf::{BtfError, KernelBtf};
use crate::kernel::events::ftrace_format::{self, FtraceFormat};
use crate::kernel::events::image_data::EventData;
use crate::kernel::events::layout::EventLayout;
use crate::kernel::events::read::read_call;
use crate::kernel::events::{decl, EventKind, KernelEvent};
use crate::kernel::module_btf::module_btf;
use crate::kernel::modules::LoadedModule;

/// Longest C string read from the guest (names of systems and events).
const MAX_STRING: usize = 256;
/// A string is read up to its page's end at a time (the next page may be
/// unmapped).
const PAGE: u64 = 4096;

/// A loaded module's event (running addresses).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleEvent {
    /// The module's name (`kyber_iosched`).
    pub module: String,
    /// Its `struct module` (running address).
    pub module_addr: u64,
    pub event: KernelEvent,
    /// Its format as tracefs shows it (None: not readable).
    pub format: Option<FtraceFormat>,
}

/// The guest's kernel-half memory, read through its page tables.
struct GuestData<'a, 'm>(RefCell<&'a mut AddressSpace<'m>>);

impl GuestData<'_, '_> {
    fn bytes<const N: usize>(&self, vaddr: u64) -> Option<[u8; N]> {
        let mut b = [0u8; N];
        self.0.borrow_mut().read(vaddr, &mut b).ok()?;
        Some(b)
    }
}

impl EventData for GuestData<'_, '_> {
    fn word(&self, vaddr: u64) -> Option<u64> {
        self.bytes(vaddr).map(u64::from_le_bytes)
    }
    fn word32(&self, vaddr: u64) -> Option<u32> {
        self.bytes(vaddr).map(u32::from_le_bytes)
    }
    fn c_string(&self, vaddr: u64) -> Option<String> {
        self.c_string_max(vaddr, MAX_STRING)
    }
    /// Read up to each page's end at a time: the string may end just
    /// before an unmapped page.
    fn c_string_max(&self, vaddr: u64, max: usize) -> Option<String> {
        let mut out = Vec::new();
        let mut at = vaddr;
        while out.len() < max {
            let chunk = ((at | (PAGE - 1)) + 1 - at).min((max - out.len()) as u64);
            let mut b = vec![0u8; chunk as usize];
            self.0.borrow_mut().read(at, &mut b).ok()?;
            match b.iter().position(|&c| c == 0) {
                Some(end) => {
                    out.extend_from_slice(&b[..end]);
                    return String::from_utf8(out).ok();
                }
                None => out.extend_from_slice(&b),
            }
            at += chunk;
        }
        None
    }
}

/// The events `modules` list (as tracefs' `available_events` does: not
/// those it hides), read through `space`, `btf` the kernel's; `own_btf`
/// each module's `.BTF` (by its `struct module`'s address), which gives
/// its events' arguments and checks their formats. An event that does not
/// read as one is left out.
pub fn read(
    space: &mut AddressSpace<'_>,
    btf: &KernelBtf,
    modules: &[LoadedModule],
    own_btf: &[(u64, Vec<u8>)],
) -> Result<Vec<ModuleEvent>, BtfError> {
    let l = EventLayout::from_btf(btf)?;
    let mem = GuestData(RefCell::new(space));
    let mut out = Vec::new();
    for m in modules {
        if m.events.is_empty() {
            continue;
        }
        // Without its own BTF the kernel's checks the formats (it declares
        // no module's record struct) and the arguments are unknown.
        let own = (own_btf.iter())
            .find(|(addr, _)| *addr == m.addr)
            .and_then(|(_, data)| module_btf(&m.name, "its BTF in the guest", data, btf).ok());
        for &call in &m.events {
            let Ok(e) = read_call(&mem, &l, None, call) else {
                continue;
            };
            if e.hidden || e.kind != EventKind::Tracepoint {
                continue;
            }
            let tp = e.tracepoint;
            let mut event = KernelEvent {
                args: own.as_ref().and_then(|b| decl::tracepoint_args(b, &e.name)),
                system: e.system,
                name: e.name,
                kind: e.kind,
                call,
                tracepoint: tp,
                key: tp.map(|tp| tp.wrapping_add(u64::from(l.tp_key))),
                iterator: tp.and_then(|tp| mem.word(tp.wrapping_add(u64::from(l.tp_iterator)))),
                listed: true,
                syscall: None,
            };
            let format = ftrace_format::read_in(&mem, btf, own.as_ref().unwrap_or(btf), &event);
            if event.iterator == Some(0) {
                event.iterator = None;
            }
            out.push(ModuleEvent {
                module: m.name.clone(),
                module_addr: m.addr,
                event,
                format,
            });
        }
    }
    Ok(out)
}
