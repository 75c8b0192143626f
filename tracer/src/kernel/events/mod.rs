//! The kernel's static events as ftrace names them (`sched:sched_switch`),
//! read from the image's own event array: `__start_ftrace_events ..
//! __stop_ftrace_events`, pointers to `struct trace_event_call`, each
//! with its class (whose `system` is the event's subsystem) and its name:
//! its tracepoint's (`call->tp->name`) when the call carries
//! TRACE_EVENT_FL_TRACEPOINT, else `call->name` (include/linux/trace_events.h).
//! Structure layouts come from the kernel's BTF; pointers are link-time
//! addresses. Each event keeps where its tracepoint, static key and
//! `__traceiter_NAME` are, and its arguments as C declares them.

pub mod counted;
mod decl;
pub mod enabled_branch;
pub mod field_values;
pub mod fields;
pub mod fork_child;
pub mod ftrace_format;
mod image_data;
pub mod jump_sites;
mod layout;
pub mod module_events;
pub mod module_globs;
pub mod path_cost;
mod read;
mod select;
pub mod syscall_format;
mod syscalls;

use std::path::PathBuf;

use crate::kernel::btf::BtfError;

pub use select::{EventGlobError, EventGlobs};
pub use syscalls::TableEntry;

/// The raw_init of syscall events' classes (kernel/trace/trace_syscalls.c).
const SYSCALL_RAW_INIT: &str = "init_syscall_trace";
/// What a syscall exit event carries (`syscall_exit_fields_array`,
/// kernel/trace/trace_syscalls.c).
const SYSCALL_EXIT_ARG: (&str, &str) = ("long", "ret");
/// Longest event array read (distribution kernels have ~2,000 events).
const MAX_EVENTS: u64 = 100_000;

/// Why a kernel's events could not be read.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    #[error("{0}")]
    Btf(#[from] BtfError),
    #[error(
        "{}: no event array ({}..{} in the symbols, nor in .init.data): the kernel was \
         built without CONFIG_EVENT_TRACING",
        path.display(), image_data::EVENTS_START, image_data::EVENTS_STOP
    )]
    NoArray { path: PathBuf },
    #[error(
        "{}: the event array {start:#x}..{stop:#x} is not a whole number of pointers in \
         the file's data; the image is corrupt",
        path.display()
    )]
    BadArray {
        path: PathBuf,
        start: u64,
        stop: u64,
    },
    #[error("event glob '{glob}' matches no event of {}{}", path.display(), closest_detail(closest))]
    NoMatch {
        glob: String,
        path: PathBuf,
        /// Event names close to the glob.
        closest: Vec<String>,
    },
    #[error("{}: event {index} of the array (at {call:#x}) cannot be read: {what}", path.display())]
    BadEvent {
        path: PathBuf,
        index: usize,
        call: u64,
        what: &'static str,
    },
}

/// "; closest: a, b", or nothing.
fn closest_detail(closest: &[String]) -> String {
    match closest.is_empty() {
        true => String::new(),
        false => format!("; closest: {}", closest.join(", ")),
    }
}

/// What kind of event, by how the kernel defines it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// TRACE_EVENT / DEFINE_EVENT: a tracepoint (`call->tp`).
    Tracepoint,
    /// `syscalls:sys_enter_*` / `sys_exit_*` (the class's raw_init is
    /// `init_syscall_trace`), called from the raw_syscalls tracepoints.
    Syscall,
    /// Any other named event (the `ftrace` system's, which tracefs only
    /// shows the format of).
    Other,
}

/// One argument of an event, as C declares it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventArg {
    /// `struct task_struct *`, `unsigned int`.
    pub ty: String,
    pub name: String,
}

impl std::fmt::Display for EventArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.ty.ends_with('*') {
            true => write!(f, "{}{}", self.ty, self.name),
            false => write!(f, "{} {}", self.ty, self.name),
        }
    }
}

/// One event of the kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelEvent {
    /// The trace system: `sched`.
    pub system: String,
    /// `sched_switch`.
    pub name: String,
    pub kind: EventKind,
    /// Its `struct trace_event_call`.
    pub call: u64,
    /// Its `struct tracepoint`, its static key, and `__traceiter_NAME`
    /// (tracepoint events only).
    pub tracepoint: Option<u64>,
    pub key: Option<u64>,
    pub iterator: Option<u64>,
    /// Its arguments (tracepoints: from BTF; syscalls: from their
    /// metadata); None when the kernel does not say.
    pub args: Option<Vec<EventArg>>,
    /// Whether the kernel lists it (tracefs `available_events`): not the
    /// `ftrace` system's, nor a syscall the kernel leaves unmapped.
    pub listed: bool,
    /// A syscall event's entry in the syscall table (its number and
    /// `__x64_sys_NAME`); None for other events, or when the image does
    /// not name its table.
    pub syscall: Option<TableEntry>,
}

impl KernelEvent {
    /// An event known by its names and C arguments alone, at no address of
    /// an image: a tracepoint's, or with `syscall` a syscall event's (what
    /// a trace built in code, as the tests' are, describes).
    pub fn declared(
        system: &str,
        name: &str,
        args: &[(&str, &str)],
        syscall: Option<TableEntry>,
    ) -> KernelEvent {
        let args = args.iter().map(|&(ty, name)| EventArg {
            ty: ty.into(),
            name: name.into(),
        });
        KernelEvent {
            system: system.into(),
            name: name.into(),
            kind: match syscall {
                Some(_) => EventKind::Syscall,
                None => EventKind::Tracepoint,
            },
            call: 0,
            tracepoint: None,
            key: None,
            iterator: None,
            args: Some(args.collect()),
            listed: true,
            syscall,
        }
    }

    /// `sched:sched_switch`.
    pub fn full_name(&self) -> String {
        format!("{}:{}", self.system, self.name)
    }

    /// `(bool preempt, struct task_struct *prev, ...)`, or "" when the
    /// arguments are unknown.
    pub fn signature(&self) -> String {
        match &self.args {
            Some(args) => {
                let args: Vec<String> = args.iter().map(ToString::to_string).collect();
                format!("({})", args.join(", "))
            }
            None => String::new(),
        }
    }
}

/// Every event of a kernel, in the array's order.
#[derive(Clone, Debug)]
pub struct EventTable {
    /// The kernel image it was read from.
    pub path: PathBuf,
    pub events: Vec<KernelEvent>,
    /// Where the array lies (link-time addresses).
    pub array: (u64, u64),
    /// Whether the array's bounds came from a scan (no symbols name them).
    pub scanned: bool,
    /// Whether the syscall events the kernel leaves unmapped are known
    /// (the image names its syscall table).
    pub syscalls_checked: bool,
}

#[cfg(test)]
mod tests;
