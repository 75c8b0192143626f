//! Why exitless tracing cannot be attached or read, and what the user can
//! do about it (`crate::advice`).

use crate::advice::{Plain, Remedy, TracerAdvice, TracerWords};

use super::collect::DrainError;
use super::map::MapError;
use super::ring::RingError;
use crate::plan::exitless::error::ExitlessPlanError;

#[derive(Debug, thiserror::Error)]
pub enum ExitlessError {
    /// The code cannot be fitted to the kernel found running.
    #[error("{}", self.say(&Plain))]
    Plan(#[from] ExitlessPlanError),
    #[error("{}", self.say(&Plain))]
    CpuNumberMismatch {
        cpu: usize,
        value: u32,
        off: u64,
        cpus: usize,
    },
    #[error("{}", self.say(&Plain))]
    NotATask {
        cpu: usize,
        off: u64,
        task: u64,
        why: String,
    },
    #[error("{}", self.say(&Plain))]
    Map(#[from] MapError),
    #[error("{}", self.say(&Plain))]
    CopyTraced {
        name: &'static str,
        at: u64,
        bytes: Option<[u8; 5]>,
    },
    #[error(transparent)]
    Cpus(#[from] crate::kernel::cpus::CpusError),
    #[error(transparent)]
    Ring(#[from] RingError),
    #[error(transparent)]
    Drain(#[from] DrainError),
    #[error("cannot start the thread that drains vmtrace's rings: {0}")]
    Thread(std::io::Error),
    #[error("writing vmtrace's trampoline into guest memory: {0}")]
    Memory(String),
    #[error("KVM did not give the guest's TSC at the pause; cannot date exitless events")]
    NoClock,
    #[error(
        "{0} records in vmtrace's rings named no traced site or vCPU (the guest wrote over them); \
         their calls are not in the counts"
    )]
    BadRecords(u64),
}

/// Its own errors say when the trampoline cannot work with this kernel:
/// traps can.
impl TracerAdvice for ExitlessError {
    fn problem(&self, w: &dyn TracerWords) -> String {
        match self {
            ExitlessError::CpuNumberMismatch {
                cpu,
                value,
                off,
                cpus,
            } => format!(
                "CPU {cpu}'s per-CPU CPU number reads {value} at per-CPU offset {off:#x} \
                 (vmtrace has rings for {cpus} CPUs): the symbols do not describe this \
                 kernel's per-CPU layout"
            ),
            ExitlessError::NotATask {
                cpu,
                off,
                task,
                why,
            } => format!(
                "CPU {cpu}'s current task at per-CPU offset {off:#x} reads {task:#x}, which is \
                 not a task ({why}): the symbols do not describe this kernel's task layout, \
                 which vmtrace's code would read at every traced call"
            ),
            ExitlessError::CopyTraced { name, at, bytes } => {
                let held = match bytes {
                    Some(b) => format!("holds {b:02x?}, not the kernel's NOP"),
                    None => "cannot be read".into(),
                };
                format!(
                    "the ftrace site of the guest's `{name}` at {at:#x} {held}: the guest's \
                     own ftrace traces it, and vmtrace's code calls it to copy events' strings"
                )
            }
            ExitlessError::Plan(e) => e.problem(w),
            ExitlessError::Map(e) => e.problem(w),
            e => e.to_string(),
        }
    }

    fn remedy(&self) -> Option<Remedy> {
        match self {
            ExitlessError::CpuNumberMismatch { .. }
            | ExitlessError::NotATask { .. }
            | ExitlessError::CopyTraced { .. } => Some(Remedy::TrapMode),
            ExitlessError::Plan(e) => e.remedy(),
            ExitlessError::Map(e) => e.remedy(),
            _ => None,
        }
    }
}
