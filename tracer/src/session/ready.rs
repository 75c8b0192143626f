//! What an attach attempt gives: attached, or why not yet (the guest is
//! resumed as it was and the attach tried again).

use vm_memory::GuestAddress;
use vmm::GuestRam;

use crate::kernel::kaslr::{self, KernelOffset};
use crate::session::exitless::child_starts::ChildStarts;
use crate::session::patch::{self, AttachCounts};
use crate::session::Tracer;

/// Why an attach attempt wrote nothing; the guest is resumed and the attach
/// retried.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    /// The guest's `ftrace_enabled` is still 0: its ftrace_init is running.
    #[error("the guest's ftrace_init has not finished (ftrace_enabled is 0)")]
    FtraceInitRunning,
    /// The guest kernel has not set its syscall entry yet (IA32_LSTAR is
    /// 0) and its banner is not mapped yet, so where KASLR put it is
    /// unknown (`kaslr`).
    #[error("the guest kernel has not set its syscall entry nor mapped its banner yet: its KASLR offset is unknown")]
    KernelOffsetUnknown,
    /// The guest kernel has not applied its alternatives yet: how its
    /// returns will go (return thunks) is not settled (`exitless::state::
    /// Resolved`), and it may still rewrite the text of direct sites.
    #[error("the guest kernel has not applied its alternatives yet (alternatives_patched is 0): it may still rewrite its text and choose its return thunk")]
    AlternativesPending,
    /// `calls` selected sites still hold `call __fentry__` (the first at `first`).
    #[error("{calls} selected sites still call __fentry__ (the first at {first:#x}): the guest's ftrace_init has not converted them yet")]
    CallSites { calls: usize, first: u64 },
    /// A guest context is inside the displaced bytes of `sites` direct
    /// sites (the first found on vCPU `cpu`, at `at`).
    #[error("a guest context is inside the first instructions of {sites} direct site(s) ({who} at {at:#x})")]
    DirectBusy { sites: usize, who: String, at: u64 },
    /// The guest holds `lock` (`ftrace_lock` or `text_mutex`): it is
    /// changing its ftrace records or its text (`guest_ftrace`).
    #[error("the guest holds its {lock}: it is changing its ftrace or its text")]
    GuestFtraceBusy { lock: &'static str },
    /// A page of a stack that `who` is on could not be read (at `at`): a
    /// context inside a direct site cannot be ruled out.
    #[error("a guest stack page cannot be read ({who} at {at:#x}): a context inside a direct site cannot be ruled out")]
    DirectStackUnreadable { who: String, at: u64 },
    /// The task list of a preemptible kernel could not be walked (yet).
    #[error("{why}")]
    DirectTasks { why: String },
}

impl NotReady {
    /// What the attach waited for, once it no longer waits for it: "the
    /// guest's ftrace_init", said after "attached after".
    pub fn waited_for(&self) -> String {
        match self {
            NotReady::FtraceInitRunning | NotReady::CallSites { .. } => {
                "the guest's ftrace_init".into()
            }
            NotReady::KernelOffsetUnknown => {
                "the guest kernel's syscall entry (its KASLR offset)".into()
            }
            NotReady::AlternativesPending => "the guest kernel's alternatives".into(),
            NotReady::DirectBusy { .. } => "no guest context inside a direct site".into(),
            NotReady::GuestFtraceBusy { lock } => format!("the guest's {lock}"),
            NotReady::DirectStackUnreadable { .. } => "readable guest stacks".into(),
            NotReady::DirectTasks { .. } => "the guest's task list".into(),
        }
    }
}

/// One attach attempt.
#[derive(Debug)]
pub enum Attach<'a> {
    Attached(&'a AttachCounts),
    NotReady(NotReady),
}

impl<'a> Attach<'a> {
    /// The counts of an attach that happened; for callers that cannot wait.
    pub fn attached(self) -> Result<&'a AttachCounts, NotReady> {
        match self {
            Attach::Attached(c) => Ok(c),
            Attach::NotReady(why) => Err(why),
        }
    }
}

impl Tracer {
    /// Has the guest finished its own ftrace_init? Polled without a pause
    /// through the kernel's fixed physical mapping; only a hint: `attach`
    /// checks again, and every selected site, under the pause. With the
    /// kernel's `ftrace_enabled` known, that flag (set once every site is a
    /// NOP); without it, every selected site must hold a NOP.
    pub fn guest_ready(&self, mem: &dyn GuestRam) -> bool {
        // Where the kernel image is in guest RAM: known after the first
        // attach attempt, looked for before it (KASLR moves it; kaslr.rs).
        let deltas = match self.offset {
            Some(o) => vec![o.phys],
            None => match kaslr::phys_candidates(mem, &self.plan.image) {
                Some(found) => found,
                // Nothing to find the image by: let the pause tell.
                None => return true,
            },
        };
        deltas.into_iter().any(|phys| {
            let o = KernelOffset { virt: 0, phys };
            if let Some(direct) = &self.direct {
                return direct
                    .sites
                    .in_place(mem, &self.plan.image, |a| o.phys_of(a));
            }
            match self.plan.ftrace_enabled {
                Some(va) => o
                    .phys_of(va)
                    .and_then(|gpa| mem.read_obj::<u32>(GuestAddress(gpa)).ok())
                    .is_some_and(|v| v != 0),
                None => self
                    .plan
                    .index
                    .addrs
                    .iter()
                    .all(|&a| o.phys_of(a).is_some_and(|gpa| patch::is_nop(mem, gpa))),
            }
        })
    }
}

impl Tracer {
    /// Are the new tasks' exits of the forking syscalls traced recorded:
    /// in trap mode at `ret_from_fork`'s trap, in exitless mode when its
    /// code copies its words (`ChildStarts::of`)? False when none is
    /// traced, or the kernel's `ret_from_fork` has no site (before 6.5).
    pub fn records_child_exits(&self) -> bool {
        match self.reach.exitless() {
            Some(ex) => ChildStarts::of(ex.plan().child_exits()).is_some(),
            None => self.plan.child_exit_sites().is_some(),
        }
    }
}
