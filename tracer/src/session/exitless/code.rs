//! Writing vmtrace's code into the guest: page by page, so that in guest
//! pages (`backing`) the padding between its parts takes no page.

use vm_memory::GuestAddress;
use vmm::{GuestRam, RamError};

use super::layout::CODE_GPA;
use super::trampoline::{self, Trampoline};

/// The code, page by page. `sparse` (the region in the guest's own pages,
/// `backing`): a page of nothing but padding (the gap before the graph's
/// return stubs, never run) is not written, so it takes no guest page and
/// is not mapped.
pub fn write_code(mem: &dyn GuestRam, t: &Trampoline, sparse: bool) -> Result<(), RamError> {
    for (i, chunk) in t.code.chunks(CODE_PAGE).enumerate() {
        if sparse && padding(chunk) {
            continue;
        }
        mem.write_slice(chunk, GuestAddress(CODE_GPA + (i * CODE_PAGE) as u64))?;
    }
    Ok(())
}

/// A page of the code that holds only the padding between its parts.
pub fn padding(page: &[u8]) -> bool {
    page.iter().all(|&b| b == trampoline::INT3)
}

/// `write_code`'s unit.
pub const CODE_PAGE: usize = 4096;
