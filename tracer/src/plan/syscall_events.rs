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
        Ok(Some(PlannedSyscall {
            system: e.system.clone(),
            name: e.name.clone(),
            func: func.to_string(),
            side,
            format: syscall_format::format(e, &regs),
            id_cell: id_at.map(|at| e.call + at),
        }))
    }

    pub fn full_name(&self) -> String {
        format!("{}:{}", self.system, self.name)
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
