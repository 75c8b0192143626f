//! Why a run ended, and what can go wrong in a vCPU thread.

use std::fmt;
use std::time::Duration;

use kvm_bindings::{
    KVM_SYSTEM_EVENT_CRASH, KVM_SYSTEM_EVENT_RESET, KVM_SYSTEM_EVENT_SEV_TERM,
    KVM_SYSTEM_EVENT_SHUTDOWN, KVM_SYSTEM_EVENT_SUSPEND, KVM_SYSTEM_EVENT_WAKEUP,
};

use crate::advice::{Advice, Input, Plain, Words};
use crate::assist::AssistError;
use crate::trap::TrapError;

/// Why a run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The guest powered itself off with this status.
    PowerOff(u8),
    /// The guest powered itself off through ACPI S5 (PM1a_CNT.SLP_EN).
    AcpiPowerOff,
    /// The guest asked for a reset (Linux `reboot=k`, or after a panic).
    Reset,
    /// The guest kernel panicked (the console line).
    Panic(String),
    /// A vCPU triple-faulted.
    TripleFault { cpu: usize, rip: u64 },
    /// The guest reported a crash to the hypervisor (KVM_SYSTEM_EVENT_CRASH).
    Crash { cpu: usize },
    /// `--timeout` elapsed.
    Timeout(Duration),
    /// SIGINT, SIGTERM or SIGHUP.
    Signal(i32),
    /// The host side asked the guest to stop.
    Requested,
    /// The trace's duration ran out, and the host stopped the guest.
    DurationReached,
    /// A vCPU could not go on.
    Error(VcpuError),
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopReason::PowerOff(s) => write!(f, "guest powered off (status {s})"),
            StopReason::AcpiPowerOff => write!(f, "guest powered off (ACPI S5)"),
            StopReason::Reset => write!(f, "guest requested a reset"),
            StopReason::Panic(m) => write!(f, "guest panicked: {m}"),
            StopReason::TripleFault { cpu, rip } => {
                write!(f, "vCPU {cpu} triple-faulted (shutdown) at {rip:#x}")
            }
            StopReason::Crash { cpu } => write!(
                f,
                "guest crashed: vCPU {cpu} reported a crash to the hypervisor (KVM_SYSTEM_EVENT_CRASH)"
            ),
            StopReason::Timeout(d) => write!(f, "timeout after {} s", d.as_secs_f64()),
            StopReason::Signal(s) => write!(
                f,
                "stopped by {}",
                match *s {
                    libc::SIGINT => "Ctrl-C (SIGINT)",
                    libc::SIGHUP => "SIGHUP (the terminal went away)",
                    _ => "SIGTERM",
                }
            ),
            StopReason::Requested => write!(f, "stopped on request"),
            StopReason::DurationReached => f.write_str(&self.problem(&Plain)),
            StopReason::Error(e) => write!(f, "{e}"),
        }
    }
}

impl StopReason {
    /// The guest address the run stopped at, when the stop names one (a
    /// triple fault, an instruction KVM could not emulate).
    pub fn rip(&self) -> Option<u64> {
        match self {
            StopReason::TripleFault { rip, .. } => Some(*rip),
            StopReason::Error(VcpuError::Assist(
                AssistError::Unsupported { rip, .. } | AssistError::Internal { rip, .. },
            )) => Some(*rip),
            _ => None,
        }
    }
}

/// A stop says an emulation hint in a front end's words (`crate::advice`).
impl Advice for StopReason {
    fn problem(&self, w: &dyn Words) -> String {
        match self {
            StopReason::Error(e) => e.problem(w),
            StopReason::DurationReached => {
                format!("stopped: {} reached", w.input(Input::Duration))
            }
            r => r.to_string(),
        }
    }
}

impl Advice for VcpuError {
    fn problem(&self, w: &dyn Words) -> String {
        match self {
            VcpuError::Assist(e) => e.problem(w),
            e => e.to_string(),
        }
    }
}

impl From<VcpuError> for StopReason {
    fn from(e: VcpuError) -> Self {
        StopReason::Error(e)
    }
}

/// What stops a vCPU other than the guest's own doing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VcpuError {
    #[error("KVM_RUN failed on vCPU {cpu}: {source}")]
    KvmRun {
        cpu: usize,
        source: kvm_ioctls::Error,
    },
    #[error("vCPU {cpu} failed to enter the guest (hardware reason {reason:#x})")]
    FailEntry { cpu: usize, reason: u64 },
    #[error("vCPU {cpu}: unexpected exit {exit}")]
    UnexpectedExit { cpu: usize, exit: String },
    #[error(
        "vCPU {cpu}: unexpected KVM system event {kind} ({name}); vmtrace handles shutdown, reset and crash",
        name = system_event_name(*kind)
    )]
    SystemEvent { cpu: usize, kind: u32 },
    /// With the in-kernel irqchip HLT stays in KVM; an exit means the guest
    /// halted for good.
    #[error("vCPU {cpu} halted with no way to wake")]
    Halted { cpu: usize },
    #[error(transparent)]
    Trap(#[from] TrapError),
    #[error(transparent)]
    Assist(#[from] AssistError),
    #[error("the thread of vCPU {cpu} panicked: {message}")]
    Panicked { cpu: usize, message: String },
}

/// KVM's name of a system event type (include/uapi/linux/kvm.h).
fn system_event_name(kind: u32) -> &'static str {
    match kind {
        KVM_SYSTEM_EVENT_SHUTDOWN => "shutdown",
        KVM_SYSTEM_EVENT_RESET => "reset",
        KVM_SYSTEM_EVENT_CRASH => "crash",
        KVM_SYSTEM_EVENT_WAKEUP => "wakeup",
        KVM_SYSTEM_EVENT_SUSPEND => "suspend",
        KVM_SYSTEM_EVENT_SEV_TERM => "SEV termination",
        _ => "unknown type",
    }
}

/// The message a panic was raised with (`panic!` gives a `&str` or a `String`).
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_vcpu_and_the_cause() {
        let cases: [(StopReason, &str); 6] = [
            (
                VcpuError::SystemEvent { cpu: 1, kind: 5 }.into(),
                "vCPU 1: unexpected KVM system event 5 (suspend)",
            ),
            (StopReason::Crash { cpu: 2 }, "vCPU 2 reported a crash"),
            (
                VcpuError::FailEntry {
                    cpu: 0,
                    reason: 0x21,
                }
                .into(),
                "vCPU 0 failed to enter the guest (hardware reason 0x21)",
            ),
            (
                VcpuError::KvmRun {
                    cpu: 3,
                    source: kvm_ioctls::Error::new(libc::EFAULT),
                }
                .into(),
                "KVM_RUN failed on vCPU 3: ",
            ),
            (
                VcpuError::Trap(TrapError::NoTracer { cpu: 1, rip: 0x10 }).into(),
                "vCPU 1 wrote the trace port at 0x10 with no tracer attached",
            ),
            (
                VcpuError::Panicked {
                    cpu: 0,
                    message: "boom".into(),
                }
                .into(),
                "the thread of vCPU 0 panicked: boom",
            ),
        ];
        for (reason, says) in cases {
            assert!(reason.to_string().contains(says), "{reason}");
        }
    }

    #[test]
    fn panic_messages_are_recovered() {
        let p = std::panic::catch_unwind(|| panic!("static")).unwrap_err();
        assert_eq!(panic_message(&*p), "static");
        let p = std::panic::catch_unwind(|| panic!("formatted {}", 1)).unwrap_err();
        assert_eq!(panic_message(&*p), "formatted 1");
    }
}
