//! The attach's check of the kernel functions events' string copies call
//! (`crate::plan::exitless::strcopy`): the guest's own ftrace must not be
//! on them. The copies run inside vmtrace's trampoline, at every recorded
//! event: a callback of the guest's there (its function tracer, a BPF
//! program on the function) would see calls the guest never made, one or
//! two per event, and run inside vmtrace's code. (vmtrace itself never
//! traces them while it copies: the plan makes no copy then.)

use vmm::gva::AddressSpace;

use super::error::ExitlessError;
use crate::kernel::kaslr::KernelOffset;
use crate::kernel::sites::{is_kernel_nop5, SITE_LEN};
use crate::plan::exitless::strcopy::{COPY_NOFAULT, STRNCPY_NOFAULT};
use crate::plan::Plan;

/// Each copy function's ftrace site, where it has one, holds the kernel's
/// NOP in the running guest (at `off`): else the guest traces it.
pub fn check(
    plan: &Plan,
    space: &mut AddressSpace<'_>,
    off: KernelOffset,
) -> Result<(), ExitlessError> {
    for name in [STRNCPY_NOFAULT, COPY_NOFAULT] {
        let named = |func: u32| plan.image.names(func as usize).any(|n| n == name);
        let Some(site) = plan.sites.sites.iter().find(|s| named(s.func)) else {
            continue;
        };
        let at = off.runtime(site.addr);
        let mut bytes = [0u8; SITE_LEN];
        let read = space.read(at, &mut bytes).is_ok();
        if !read || !is_kernel_nop5(&bytes) {
            return Err(ExitlessError::CopyTraced {
                name,
                at,
                bytes: read.then_some(bytes),
            });
        }
    }
    Ok(())
}
