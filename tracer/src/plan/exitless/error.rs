//! Why exitless mode's guest code cannot be made for a kernel, and what
//! the user can do about it (`crate::advice`).

use crate::advice::{Plain, Remedy, TracerAdvice, TracerWords};

use super::body::MAX_FILTER_PIDS;
use super::disasm::BrokenPath;
use super::layout::{LayoutError, CODE_LEN};
use super::ret::ReturnError;
use super::symbols::{ALTERNATIVES_PATCHED, CPU_NUMBER, PCPU_HOT};
use iced_x86::IcedError;

/// Why the code cannot be planned for this kernel (or, at the first
/// attach, for the kernel found running).
#[derive(Debug, thiserror::Error)]
pub enum ExitlessPlanError {
    #[error("{}", self.say(&Plain))]
    NoCpuNumber(std::path::PathBuf),
    #[error("{}", self.say(&Plain))]
    BadCpuNumber { path: std::path::PathBuf, off: u64 },
    #[error("{}", self.say(&Plain))]
    CpuNumberOutOfReach { link: u64, runtime: u64 },
    #[error("{}", self.say(&Plain))]
    AlternativesUnknown { place: String },
    #[error("{}", self.say(&Plain))]
    Layout(#[from] LayoutError),
    #[error("{}", self.say(&Plain))]
    Trampoline(#[from] TrampolineError),
    #[error("{}", self.say(&Plain))]
    Return(#[from] ReturnError),
    #[error("the trampoline ({len} bytes) does not fit its {CODE_LEN}-byte page")]
    CodeTooBig { len: usize },
    #[error("{}", self.say(&Plain))]
    TooManyPids(usize),
}

/// Its errors say when the trampoline cannot work with this kernel: traps
/// can.
impl TracerAdvice for ExitlessPlanError {
    fn problem(&self, w: &dyn TracerWords) -> String {
        match self {
            ExitlessPlanError::NoCpuNumber(path) => format!(
                "{}: no `{CPU_NUMBER}` or `{PCPU_HOT}` symbol, so vmtrace's trampoline cannot \
                 tell which CPU it runs on",
                path.display()
            ),
            ExitlessPlanError::BadCpuNumber { path, off } => format!(
                "{}: `{CPU_NUMBER}` is at {off:#x}, neither a per-CPU offset (Linux up to 6.14) \
                 nor a kernel address (6.15+)",
                path.display()
            ),
            ExitlessPlanError::CpuNumberOutOfReach { link, runtime } => format!(
                "the guest's `{CPU_NUMBER}` at {link:#x} runs at {runtime:#x} (KASLR), out of \
                 reach of a gs:[disp32]"
            ),
            ExitlessPlanError::AlternativesUnknown { place } => format!(
                "{place}: the kernel has return thunks but no `{ALTERNATIVES_PATCHED}` symbol \
                 (kallsyms without CONFIG_KALLSYMS_ALL?), so vmtrace cannot tell whether it has \
                 rewritten its returns yet"
            ),
            ExitlessPlanError::TooManyPids(n) => {
                format!("{n} pids to keep; exitless mode's code compares at most {MAX_FILTER_PIDS}")
            }
            ExitlessPlanError::Layout(e) => e.problem(w),
            ExitlessPlanError::Trampoline(e) => e.problem(w),
            ExitlessPlanError::Return(e) => e.problem(w),
            e => e.to_string(),
        }
    }

    fn remedy(&self) -> Option<Remedy> {
        match self {
            ExitlessPlanError::NoCpuNumber(_)
            | ExitlessPlanError::BadCpuNumber { .. }
            | ExitlessPlanError::CpuNumberOutOfReach { .. }
            | ExitlessPlanError::TooManyPids(_) => Some(Remedy::TrapMode),
            ExitlessPlanError::AlternativesUnknown { .. } => Some(Remedy::TrapModeOrVmlinux),
            ExitlessPlanError::Layout(e) => e.remedy(),
            ExitlessPlanError::Trampoline(e) => e.remedy(),
            ExitlessPlanError::Return(e) => e.remedy(),
            ExitlessPlanError::CodeTooBig { .. } => None,
        }
    }
}

/// Why the trampoline cannot be made or a site cannot call it.
#[derive(Debug, thiserror::Error)]
pub enum TrampolineError {
    #[error(
        "the ring layout ({cpus} CPUs, {cap} records, {ring_bytes:#x} bytes per ring, records at {records_off:#x}) cannot be addressed by the trampoline: {why}"
    )]
    Layout {
        cpus: usize,
        cap: u64,
        ring_bytes: u64,
        records_off: u64,
        why: &'static str,
    },
    #[error("assembling the trampoline for {sites} sites")]
    Assemble {
        sites: usize,
        #[source]
        source: IcedError,
    },
    #[error(
        "the trampoline for {sites} sites is {len} bytes, more than its {} KiB of code memory; trace fewer functions",
        CODE_LEN >> 10
    )]
    TooLong { sites: usize, len: usize },
    #[error("{}", self.say(&Plain))]
    ThunkOutOfReach(u64),
    #[error("the trampoline's common path at {va:#x} is broken: {why}")]
    BrokenPath { va: u64, why: String },
    #[error("a call from the site at {site:#x} cannot reach {target:#x}: more than 2 GiB away")]
    OutOfReach { site: u64, target: u64 },
    #[error("encoding the call from the site at {site:#x} to {target:#x}")]
    EncodeCall {
        site: u64,
        target: u64,
        #[source]
        source: IcedError,
    },
}

impl From<BrokenPath> for TrampolineError {
    fn from(BrokenPath { va, why }: BrokenPath) -> Self {
        TrampolineError::BrokenPath { va, why }
    }
}

impl TracerAdvice for TrampolineError {
    fn problem(&self, _: &dyn TracerWords) -> String {
        match self {
            TrampolineError::ThunkOutOfReach(va) => {
                format!(
                    "the guest's return thunk at {va:#x} is more than 2 GiB from vmtrace's code"
                )
            }
            e => e.to_string(),
        }
    }

    fn remedy(&self) -> Option<Remedy> {
        matches!(self, TrampolineError::ThunkOutOfReach(_)).then_some(Remedy::TrapMode)
    }
}
