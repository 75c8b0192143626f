//! The kernel's data as the image holds it, by link-time address: words,
//! C strings, and where the event array lies. A vmlinux names the array's
//! bounds; a bzImage's kallsyms do not (they hold data symbols only with
//! CONFIG_KALLSYMS_ALL), so there the array is found in `.init.data`, where
//! the linker script puts it (FTRACE_EVENTS in INIT_DATA,
//! include/asm-generic/vmlinux.lds.h), as the longest run of words each of
//! which points to a readable event.

use object::{Object, ObjectSection};

use crate::kernel::symbols::KernelImage;

/// First pointer of the event array (`struct trace_event_call *`).
pub(crate) const EVENTS_START: &str = "__start_ftrace_events";
/// End (exclusive) of the event array.
pub(crate) const EVENTS_STOP: &str = "__stop_ftrace_events";
/// The section holding the array.
const EVENTS_SECTION: &str = ".init.data";
/// Longest C string read (names of systems, events, syscall types).
const MAX_STRING: usize = 256;

/// Where an event's structures are read: the image's file at link-time
/// addresses, or a running guest's memory (a module's events:
/// `super::module_events`).
pub(crate) trait EventData {
    fn word(&self, vaddr: u64) -> Option<u64>;
    fn word32(&self, vaddr: u64) -> Option<u32>;
    fn c_string(&self, vaddr: u64) -> Option<String>;
    /// The NUL-terminated string at `vaddr` of at most `max` bytes.
    fn c_string_max(&self, vaddr: u64, max: usize) -> Option<String>;
}

impl EventData for KernelImage {
    fn word(&self, vaddr: u64) -> Option<u64> {
        word(self, vaddr)
    }
    fn word32(&self, vaddr: u64) -> Option<u32> {
        word32(self, vaddr)
    }
    fn c_string(&self, vaddr: u64) -> Option<String> {
        c_string(self, vaddr)
    }
    fn c_string_max(&self, vaddr: u64, max: usize) -> Option<String> {
        c_string_max(self, vaddr, max)
    }
}

/// The 8-byte word at `vaddr`.
pub(crate) fn word(image: &KernelImage, vaddr: u64) -> Option<u64> {
    let b = image.file_bytes(vaddr, 8)?;
    Some(u64::from_le_bytes(b.try_into().ok()?))
}

/// The 4-byte word at `vaddr`.
pub(crate) fn word32(image: &KernelImage, vaddr: u64) -> Option<u32> {
    let b = image.file_bytes(vaddr, 4)?;
    Some(u32::from_le_bytes(b.try_into().ok()?))
}

/// The NUL-terminated string at `vaddr`, if the file holds it whole within
/// `MAX_STRING` bytes and it is UTF-8.
pub(crate) fn c_string(image: &KernelImage, vaddr: u64) -> Option<String> {
    c_string_max(image, vaddr, MAX_STRING)
}

/// [`c_string`] of at most `max` bytes.
pub(crate) fn c_string_max(image: &KernelImage, vaddr: u64, max: usize) -> Option<String> {
    let i = image
        .sections
        .partition_point(|s| s.vaddr <= vaddr)
        .checked_sub(1)?;
    let s = image.sections[i];
    let rel = vaddr.checked_sub(s.vaddr)?;
    let left = usize::try_from(s.size.checked_sub(rel)?).ok()?;
    let bytes = image.file_bytes(vaddr, left.min(max))?;
    let end = bytes.iter().position(|&b| b == 0)?;
    String::from_utf8(bytes[..end].to_vec()).ok()
}

/// The event array's bounds from the symbol table, if it names them.
pub(crate) fn array_by_symbols(image: &KernelImage) -> Option<(u64, u64)> {
    let start = image.symbol(EVENTS_START)?.addr;
    let stop = image.symbol(EVENTS_STOP)?.addr;
    (start <= stop).then_some((start, stop))
}

/// The longest run of aligned words in `.init.data` for which `is_event`
/// holds, as (start, stop) addresses; None when there is none.
pub(crate) fn array_by_scan(
    image: &KernelImage,
    is_event: impl Fn(u64) -> bool,
) -> Option<(u64, u64)> {
    let file = object::File::parse(image.bytes.as_slice()).ok()?;
    let section = file.section_by_name(EVENTS_SECTION)?;
    let (base, size) = (section.address(), section.size());
    drop(file);
    let mut best = (0u64, 0u64);
    let mut run_start = None;
    let mut at = base.next_multiple_of(8);
    while at + 8 <= base + size {
        let hit = word(image, at).is_some_and(&is_event);
        match (hit, run_start) {
            (true, None) => run_start = Some(at),
            (false, Some(s)) => {
                if at - s > best.1 - best.0 {
                    best = (s, at);
                }
                run_start = None;
            }
            _ => {}
        }
        at += 8;
    }
    if let Some(s) = run_start {
        if at - s > best.1 - best.0 {
            best = (s, at);
        }
    }
    (best.1 > best.0).then_some(best)
}
