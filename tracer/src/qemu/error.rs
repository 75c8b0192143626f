//! What can go wrong attaching to, tracing and detaching from a QEMU.

use std::path::PathBuf;

use crate::advice::{Plain, Remedy, TracerAdvice, TracerWords};

use super::breakpoints;
use super::gdb::GdbError;
use super::qmp::QmpError;
use crate::error::TracerError;
use crate::kernel::lowmem::LowMemError;
use crate::plan::attach_mode::AttachModeError;
use crate::session::watch::WatchError;

#[derive(Debug, thiserror::Error)]
pub enum QemuError {
    #[error(transparent)]
    Qmp(#[from] QmpError),
    #[error(transparent)]
    Gdb(#[from] GdbError),
    #[error(transparent)]
    Ram(#[from] super::procmem::ProcMemError),
    #[error(transparent)]
    Stub(#[from] super::stub::GdbStubError),
    #[error(transparent)]
    Libvirt(#[from] super::libvirt::LibvirtError),
    #[error("the guest of the QEMU at {qmp} is not running (its status is {status}): vmtrace attaches to running guests only, and would leave this one running; continue it first (QMP cont)")]
    NotRunning { qmp: PathBuf, status: String },
    #[error("the QEMU at {qmp} has no vCPU the gdbstub lists")]
    NoVcpus { qmp: PathBuf },
    #[error("cannot find the running kernel in the guest: {0}")]
    NotTraceable(String),
    #[error("the guest's modules changed before the attach: {0}")]
    ModulesChanged(String),
    #[error("the guest runs another kernel than {path}: its banner ({banner:?}) is nowhere in the guest kernel's mapping; give the running kernel's vmlinux or bzImage")]
    OtherKernel { path: PathBuf, banner: String },
    #[error("no guest memory is free for vmtrace's code and rings: {0}")]
    NoRoom(#[from] LowMemError),
    #[error("the guest kernel's tsc_khz is {0}: its TSC rate is unknown, so exitless events cannot be dated")]
    NoTscRate(u32),
    #[error("the page-directory entries vmtrace maps its code with are in use, by the guest or by an earlier vmtrace attach that left its code there for function-graph calls that had not returned (it stays until the guest reboots): no exitless attach is possible")]
    RegionLeft,
    #[error(transparent)]
    Journal(#[from] super::journal::JournalError),
    #[error("vmtrace's ring device: {0}")]
    RingDevice(#[from] super::ivshmem::IvshmemError),
    #[error("vmtrace pid {vmtrace} is attached to the QEMU at {qmp}: one vmtrace at a time")]
    InUse { qmp: PathBuf, vmtrace: u32 },
    /// A front end names its repair command (the CLI: `vmtrace detach`).
    #[error("vmtrace left {what} in the QEMU at {qmp} (killed, or unable to take everything out at its detach): repair it first", qmp = .qmp.display())]
    Leftover { qmp: PathBuf, what: String },
    #[error("the guest has enabled event {event} itself (its static key's count is {count}): vmtrace would write over the kernel's own jumps; disable it in the guest (perf, ftrace) or trace it there")]
    EventEnabled { event: String, count: i32 },
    #[error("a call site of event {event} at {va:#x} holds {found}, not the NOP the image has: the guest changed it; nothing was written")]
    EventSite {
        event: String,
        va: u64,
        found: String,
    },
    #[error("the tp->funcs load of event {event} at {va:#x} is {why}: the running kernel's code is not the image's; nothing was written (trap mode passes the event's test with a breakpoint)")]
    EventLoad { event: String, va: u64, why: String },
    #[error("the guest was never ready to attach ({0})")]
    NotReady(String),
    /// The mode this guest allows does not trace what was asked; said
    /// with its remedy (`Advice`): the CLI names `--mode trap`.
    #[error("{}", self.say(&Plain))]
    Mode(#[from] AttachModeError),
    #[error(transparent)]
    Watch(#[from] WatchError),
    #[error(transparent)]
    Hit(#[from] breakpoints::HitError),
    /// Said in the front end's words (`Advice`), as outside a QEMU.
    #[error("{}", self.say(&Plain))]
    Tracer(#[from] TracerError),
}

/// A front end words the remedies and inputs these errors name
/// (`crate::advice`); the others' messages are their `Display`.
impl TracerAdvice for QemuError {
    fn problem(&self, w: &dyn TracerWords) -> String {
        match self {
            QemuError::Mode(e) => e.problem(w),
            QemuError::Tracer(e) => e.problem(w),
            other => other.to_string(),
        }
    }

    fn remedy(&self) -> Option<Remedy> {
        match self {
            QemuError::Mode(e) => e.remedy(),
            QemuError::Tracer(e) => e.remedy(),
            _ => None,
        }
    }

    fn say(&self, w: &dyn TracerWords) -> String {
        match self {
            QemuError::Tracer(e) => e.say(w),
            other => crate::advice::join(other.problem(w), other.remedy(), w),
        }
    }
}
