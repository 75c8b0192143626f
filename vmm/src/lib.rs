//! vmtrace's VMM: a small KVM virtual machine monitor that boots an
//! instrumented guest kernel, runs its vCPUs, stops them all on request, and
//! gives the tracer access to guest memory by guest-virtual address.

pub mod acpi_pm;
pub mod advice;
pub mod assist;
pub mod boot;
pub mod devices;
pub mod exit;
pub mod gva;
pub mod host;
pub mod kvm_stats;
pub mod layout;
pub mod pause;
pub mod ram;
pub mod run;
pub mod stop;
pub mod stopped;
mod sys;
pub mod trap;
pub mod vcpu;
pub mod vm;

pub use ram::{GuestRam, RamError};
pub use run::{Paused, RunReport, Running};
pub use stop::{StopReason, VcpuError};
pub use stopped::{Stopped, VcpuSpace};
pub use trap::{NoTracer, Trap, TrapError, TrapHandler};
pub use vm::{Vm, VmConfig, VmError, VmSize};
