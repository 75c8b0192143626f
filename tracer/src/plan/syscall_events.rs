//! The syscall events to trace (`-e syscalls:sys_enter_openat`): each is
//! recorded at its syscall's own function in the syscall table,
//! `__x64_sys_NAME`, which the plan traces like a function with its
//! arguments: `sys_enter_NAME` at its entry (the user's registers read
//! from the `struct pt_regs *` it is given), `sys_exit_NAME` at its return
//! (the function graph's hook, with its return value). Nothing is written
//! in the guest besides that function's ftrace site
//! (`crate::kernel::events::syscall_format`; docs/events.md says why not
//! ftrace's own way, `raw_syscalls:sys_enter` and a flag in every thread).

use std::path::PathBuf;

use crate::kernel::btf::{BtfError, KernelBtf};
use crate::kernel::events::fields::EventFormat;
use crate::kernel::events::fork_child::{self, ForkRegs};
use crate::kernel::events::syscall_format::{self, PtRegs, Side};
use crate::kernel::events::{EventGlobs, EventKind, EventTable, KernelEvent};
use crate::kernel::symbols::KernelImage;

/// The system of the tracepoints that carry every syscall
/// (`raw_syscalls:sys_enter`, `sys_exit`), which the kernel calls only for
/// threads flagged `SYSCALL_WORK_SYSCALL_TRACEPOINT`.
pub const RAW_SYSTEM: &str = "raw_syscalls";

/// Why a syscall event (or a raw_syscalls one) cannot be traced.
#[derive(Debug, thiserror::Error)]
pub enum SyscallEventError {
    #[error(
        "{}: {event} is called only in threads the guest's kernel flags when a probe of \
         its own registers (its regfunc), and vmtrace writes no thread; trace \
         'syscalls:sys_enter_*' or 'syscalls:sys_exit_*' instead",
        path.display()
    )]
    RawSyscalls { path: PathBuf, event: String },
    #[error(
        "{}: {event}'s syscall function is not known (the image does not name its \
         sys_call_table, or the function); pass the kernel's vmlinux",
        path.display()
    )]
    NoFunction { path: PathBuf, event: String },
    #[error(
        "{}: the kernel has no syscall events (built without CONFIG_FTRACE_SYSCALLS: no \
         syscall metadata names their arguments); trace the syscalls' own functions \
         instead ('__x64_sys_{glob}', with the function graph for their return values)",
        path.display()
    )]
    NoEvents { path: PathBuf, glob: String },
    #[error("{0}")]
    Btf(#[from] BtfError),
}

/// One syscall event to trace.
#[derive(Clone, Debug)]
pub struct PlannedSyscall {
    /// `syscalls`, `sys_enter_openat`.
    pub system: String,
    pub name: String,
    /// `__x64_sys_openat`: the function traced for it.
    pub func: String,
    pub side: Side,
    /// Its number in the syscall table (`__syscall_nr`).
    pub nr: u32,
    /// Its fields and ftrace format (None: its arguments are unknown).
    pub format: Option<EventFormat>,
    /// `call->event.type` (link-time address): the guest's id of the
    /// event, read at the attach (`crate::qemu::event_ids`).
    pub id_cell: Option<u64>,
}

impl PlannedSyscall {
    /// Syscall event `e` (a listed one) planned, `id_at` the offset of
    /// its id in its `trace_event_call`; None for a tracepoint vmtrace
    /// enables; an error for one it refuses (`raw_syscalls:*`, a
    /// tracepoint with a `regfunc`, which the guest's kernel calls only in
    /// threads its registering flagged) or a syscall without its function.
    pub(super) fn of(
        image: &KernelImage,
        btf: &KernelBtf,
        e: &KernelEvent,
        id_at: Option<u64>,
    ) -> Result<Option<PlannedSyscall>, SyscallEventError> {
        let full = e.full_name();
        if e.kind == EventKind::Tracepoint && e.system == RAW_SYSTEM {
            return Err(SyscallEventError::RawSyscalls {
                path: image.path.clone(),
                event: full,
            });
        }
        if e.kind != EventKind::Syscall {
            return Ok(None);
        }
        let no_function = || SyscallEventError::NoFunction {
            path: image.path.clone(),
            event: full.clone(),
        };
        let side = Side::of(&full).ok_or_else(no_function)?;
        let func = syscall_format::function(e).ok_or_else(no_function)?;
        if image.symbol(func).is_none() {
            return Err(no_function());
        }
        let regs = PtRegs::find(btf)?;
        let nr = e.syscall.as_ref().map_or(0, |t| t.nr);
        Ok(Some(PlannedSyscall {
            system: e.system.clone(),
            name: e.name.clone(),
            func: func.to_string(),
            side,
            nr,
            format: syscall_format::format(e, &regs),
            id_cell: id_at.map(|at| e.call + at),
        }))
    }

    pub fn full_name(&self) -> String {
        format!("{}:{}", self.system, self.name)
    }
}

/// The children's exits of the forking syscalls traced
/// (`kernel::events::fork_child`): a new task's `sys_exit_fork` (clone,
/// vfork, clone3) is recorded at its `ret_from_fork`, not at the
/// syscall's function, which it never returns through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChildExits {
    /// Where the child's syscall number and return value are.
    pub regs: ForkRegs,
    /// (number, `__x64_sys_NAME`) of each forking syscall whose exit is
    /// traced: a child's event is recorded as that function's return.
    pub exits: Vec<(u32, String)>,
}

impl ChildExits {
    /// The children's exits of `syscalls`; None when none of them is a
    /// forking syscall's exit, or the kernel's `ret_from_fork` is no C
    /// function with a site (before Linux 6.5: docs/events.md).
    pub(super) fn of(
        image: &KernelImage,
        btf: &KernelBtf,
        syscalls: &[PlannedSyscall],
    ) -> Option<ChildExits> {
        let exits: Vec<(u32, String)> = syscalls
            .iter()
            .filter(|s| s.side == Side::Exit && fork_child::is_forking_exit(&s.full_name()))
            .map(|s| (s.nr, s.func.clone()))
            .collect();
        if exits.is_empty() {
            return None;
        }
        let regs = ForkRegs::find(image, btf)?;
        Some(ChildExits { regs, exits })
    }
}

/// `ChildExits` by site of the plan's index: what a trap recorder
/// needs at `ret_from_fork`'s site.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChildExitSites {
    /// `ret_from_fork`'s site.
    pub site: usize,
    pub regs: ForkRegs,
    /// (syscall number, site of its `__x64_sys_NAME`): a child's event is
    /// that site's return.
    pub exits: Vec<(u64, usize)>,
}

impl ChildExitSites {
    /// The sites of `exits`, `site_of` naming the site of a function
    /// (None when it has none in the plan: then no child's exit).
    pub fn of(planned: &ChildExits, site_of: impl Fn(&str) -> Option<usize>) -> Option<Self> {
        let site = site_of(fork_child::RET_FROM_FORK)?;
        let each = planned.exits.iter();
        let exits = each.filter_map(|(nr, f)| Some((u64::from(*nr), site_of(f)?)));
        Some(ChildExitSites {
            site,
            regs: planned.regs,
            exits: exits.collect(),
        })
    }
}

/// A glob of the `syscalls` system on a kernel without syscall events: why
/// there are none, rather than the closest names of other systems.
pub(super) fn check_table(
    image: &KernelImage,
    table: &EventTable,
    globs: &EventGlobs,
) -> Result<(), SyscallEventError> {
    let has = table.events.iter().any(|e| e.kind == EventKind::Syscall);
    let prefix = format!("{}:", syscall_format::SYSTEM);
    match globs.positive_texts().find(|g| g.starts_with(&prefix)) {
        Some(g) if !has => {
            let name = g[prefix.len()..].trim_start_matches("sys_");
            let name = name
                .trim_start_matches("enter_")
                .trim_start_matches("exit_");
            Err(SyscallEventError::NoEvents {
                path: image.path.clone(),
                glob: name.to_string(),
            })
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child's exit is the return of its syscall's function's site;
    /// a function without a site has none, and without `ret_from_fork`'s
    /// site there is nothing to record.
    #[test]
    fn child_exits_find_their_sites() {
        let planned = ChildExits {
            regs: ForkRegs {
                orig_ax: 120,
                ax: 80,
            },
            exits: vec![
                (57, "__x64_sys_fork".into()),
                (56, "__x64_sys_clone".into()),
            ],
        };
        let sites = ["__x64_sys_fork", "ret_from_fork"];
        let site_of = |f: &str| sites.iter().position(|s| *s == f);
        let c = ChildExitSites::of(&planned, site_of).unwrap();
        assert_eq!((c.site, c.exits), (1, vec![(57, 0)]));
        let no_start = |f: &str| (f == "__x64_sys_fork").then_some(0);
        assert_eq!(ChildExitSites::of(&planned, no_start), None);
    }
}
