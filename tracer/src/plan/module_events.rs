//! The events of the guest's loaded modules that `-e` selects as the
//! image's (`super::events`): read at the attach with the modules
//! (`crate::kernel::events::module_events`, given in the request), here
//! at link addresses (the
//! image's convention for a module: its running addresses less KASLR's
//! virtual offset, `crate::kernel::module_image`), so that the session's
//! one offset gives them back. Their call sites are the module's own
//! `__jump_table` entries of the event's key, read with its tables
//! (`crate::kernel::module_tables`), checked as the image's are.

use crate::kernel::events::ftrace_format::FtraceFormat;
use crate::kernel::events::jump_sites::{self, JumpEntry, JumpSite, JumpSiteError};
use crate::kernel::events::module_events::ModuleEvent;
use crate::kernel::events::KernelEvent;
use crate::kernel::module_image::module_function_name;
use crate::kernel::symbols::KernelImage;

/// A module's event, at link addresses.
#[derive(Clone, Debug)]
pub(super) struct LinkedEvent {
    pub(super) event: KernelEvent,
    /// The module's name (`vmt_test`).
    pub(super) module: String,
    pub(super) format: Option<FtraceFormat>,
    /// The module's `__jump_table` entries (its core text's).
    entries: Vec<JumpEntry>,
}

/// The modules' `events` at link addresses, each with its module's jump
/// table (as `image` holds the module: one it does not hold has none).
pub(super) fn linked(image: &KernelImage, events: &[ModuleEvent]) -> Vec<LinkedEvent> {
    let mut out = Vec::new();
    for e in events {
        let Some(m) = image.modules.iter().find(|m| m.addr == e.module_addr) else {
            continue;
        };
        let link = |a: u64| a.wrapping_sub(m.virt as u64);
        let entries: Vec<JumpEntry> = (m.tables.jumps.iter())
            .filter_map(|&(code, target)| {
                let key = m.tables.keys.iter().find(|(c, _)| *c == code)?.1;
                Some(JumpEntry {
                    at: 0,
                    code: link(code),
                    target: link(target),
                    // The flag bits stay: the key is 4-byte aligned.
                    key: link(key & !3) | key & 3,
                })
            })
            .collect();
        let mut event = e.event.clone();
        event.call = link(event.call);
        event.tracepoint = event.tracepoint.map(link);
        event.key = event.key.map(link);
        event.iterator = event.iterator.map(link);
        out.push(LinkedEvent {
            event,
            module: m.name.clone(),
            format: e.format.clone(),
            entries,
        });
    }
    out
}

impl LinkedEvent {
    /// Its call sites, checked as the image's (`jump_sites::event_sites`:
    /// each the kernel's NOP, the branch unlikely).
    pub(super) fn sites(
        &self,
        image: &KernelImage,
        key: u64,
    ) -> Result<Vec<JumpSite>, JumpSiteError> {
        jump_sites::event_sites(image, &self.entries, &self.event.full_name(), key)
    }

    /// Its static call's trampoline, `__SCT__tp_func_NAME` in the module
    /// (link address), when the module's symbols name it.
    pub(super) fn tramp(&self, image: &KernelImage) -> Option<u64> {
        let name =
            module_function_name(&format!("__SCT__tp_func_{}", self.event.name), &self.module);
        image
            .functions
            .iter()
            .find(|f| f.name == name)
            .map(|f| f.addr)
    }
}
