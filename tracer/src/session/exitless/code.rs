//! Writing vmtrace's code into the guest: page by page, so that in guest
//! pages (`backing`) the padding between its parts takes no page.

use vm_memory::GuestAddress;
use vmm::{GuestRam, RamError};

use crate::plan::exitless::layout::CODE_GPA;
use crate::plan::exitless::trampoline::Trampoline;
use crate::plan::exitless::{padding, CODE_PAGE};

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
