//! The events of a running guest's loaded modules (`list -e --qmp`): each
//! module's `trace_events` array (`crate::kernel::modules`) points to its
//! `struct trace_event_call`s, read from the guest's memory as the image's
//! are read from the file (`super::read`). Their arguments are not looked
//! up: their `btf_trace_NAME` types are in the module's BTF, not the
//! kernel's.

use std::cell::RefCell;

use vmm::gva::AddressSpace;

use crate::kernel::btf::{BtfError, KernelBtf};
use crate::kernel::events::image_data::EventData;
use crate::kernel::events::layout::EventLayout;
use crate::kernel::events::read::read_call;
use crate::kernel::events::{EventKind, KernelEvent};
use crate::kernel::modules::LoadedModule;

/// Longest C string read from the guest (names of systems and events).
const MAX_STRING: usize = 256;

/// A loaded module's event.
#[derive(Clone, Debug)]
pub struct ModuleEvent {
    /// The module's name (`kyber_iosched`).
    pub module: String,
    pub event: KernelEvent,
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
    /// Read a byte at a time: the string may end just before an
    /// unmapped page.
    fn c_string(&self, vaddr: u64) -> Option<String> {
        let mut out = Vec::new();
        for at in vaddr..vaddr + MAX_STRING as u64 {
            match self.bytes::<1>(at)?[0] {
                0 => return String::from_utf8(out).ok(),
                b => out.push(b),
            }
        }
        None
    }
}

/// The events `modules` list (as tracefs' `available_events` does: not
/// those it hides), read through `space`, `btf` the kernel's. An event
/// that does not read as one is left out.
pub fn read(
    space: &mut AddressSpace<'_>,
    btf: &KernelBtf,
    modules: &[LoadedModule],
) -> Result<Vec<ModuleEvent>, BtfError> {
    let l = EventLayout::from_btf(btf)?;
    let mem = GuestData(RefCell::new(space));
    let mut out = Vec::new();
    for m in modules {
        for &call in &m.events {
            let Ok(e) = read_call(&mem, &l, None, call) else {
                continue;
            };
            if e.hidden || e.kind != EventKind::Tracepoint {
                continue;
            }
            out.push(ModuleEvent {
                module: m.name.clone(),
                event: KernelEvent {
                    system: e.system,
                    name: e.name,
                    kind: e.kind,
                    call,
                    tracepoint: e.tracepoint,
                    key: None,
                    iterator: None,
                    args: None,
                    listed: true,
                    syscall: None,
                },
            });
        }
    }
    Ok(out)
}
