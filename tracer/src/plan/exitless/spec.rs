//! What the trampoline is generated for (`TrampolineSpec`), and what it
//! tells of each site's own body.

use super::body::TaskCode;
use super::layout::RingLayout;
use super::ret::Return;
use super::strcopy::{CopyFns, StrCopy};

/// What the trampoline is generated for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrampolineSpec {
    pub layout: RingLayout,
    /// The displacement at which `gs:[disp32]` reads the guest kernel's
    /// `cpu_number`, as `smp_processor_id()` does: its offset in the per-CPU
    /// area up to Linux 6.14, its (sign-extended) running address from 6.15
    /// (`percpu::PerCpuVar::gs_disp`).
    pub cpu_number_disp: i32,
    /// Can a task be preempted, and so moved to another CPU, inside the
    /// trampoline (a kernel with `CONFIG_PREEMPTION`)? Then the ring's
    /// reservation and drop counters are `lock`ed; otherwise only the CPU
    /// itself (its interrupts and NMIs) touches its ring, and the
    /// instructions need no lock, as the kernel's own ring buffer uses
    /// `local_t` (no lock prefix) for the same reason.
    pub preemptible: bool,
    /// How the code returns: `ret; int3`, or as the kernel's `__fentry__`
    /// with its return thunk and call depth tracking (`ret`).
    pub ret: Return,
    /// Record each call's task, and keep only some pids; None: no task.
    pub task: Option<TaskCode>,
    /// Function graph: record each return's RAX (`--retval`). (Arguments
    /// go with the layout: `RingLayout::args`.)
    pub retval: bool,
    /// With `layout.args`, the sites whose calls record their arguments
    /// (`--args=GLOB`); None: every site's. Only per-site bodies store
    /// them at some sites: the shared body stores every call's (the
    /// drainer keeps the selected sites').
    pub arg_sites: Option<std::sync::Arc<[bool]>>,
    /// Bytes at the end of the code (before the return trap) left for
    /// direct entries' stubs (`crate::session::direct`).
    pub reserve: u64,
    /// Per site, the strings its own body copies into its records
    /// (`strcopy`: an event's fields that do not last past it), with
    /// `layout.strings`; None: none.
    pub copies: Option<std::sync::Arc<[Vec<StrCopy>]>>,
    /// The kernel's nofault copies the bodies call (None: no copies).
    pub copy_fns: Option<CopyFns>,
    /// Function graph: a site whose calls are recorded by the entry-only
    /// path, their returns never hooked: `ret_from_fork`'s, whose call
    /// the trace does not show, only the new task's exit its words make
    /// (`strcopy::fork_words`; a kernel thread's never returns).
    pub entry_only: Option<usize>,
}

impl TrampolineSpec {
    /// Does site `k`'s own body store its calls' arguments?
    pub(super) fn stores_args(&self, k: usize) -> bool {
        self.layout.args
            && self
                .arg_sites
                .as_ref()
                .is_none_or(|s| s.get(k) == Some(&true))
    }

    /// The strings site `k`'s own body copies (none without arguments
    /// stored, or without the kernel's copy functions).
    pub fn site_copies(&self, k: usize) -> &[StrCopy] {
        let copies = match (&self.copies, self.copy_fns) {
            (Some(c), Some(_)) if self.layout.strings && self.stores_args(k) => c.get(k),
            _ => None,
        };
        copies.map_or(&[], |c| c.as_slice())
    }
}
