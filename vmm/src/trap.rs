//! The hook through which a patched call site reaches the tracer.
//!
//! A patched site executes `out TRACE_PORT, al`; the vCPU thread that took the
//! exit calls its own `TrapHandler` with the registers from the run page
//! (KVM_CAP_SYNC_REGS, no ioctl) and guest memory. One handler per vCPU, owned
//! by its thread, so the trap path takes no lock.

use kvm_bindings::{kvm_regs, kvm_sregs};
use vm_memory::GuestMemoryMmap;

use crate::gva::PagingMode;

/// One exit on the trace port.
pub struct Trap<'a> {
    pub cpu: usize,
    /// RIP as KVM left it: at the `out` (bare-metal fast PIO path) or just
    /// past it (this CI host's emulator completes it first). Handlers must
    /// accept both.
    pub rip: u64,
    pub rsp: u64,
    pub cr3: u64,
    pub paging: PagingMode,
    pub mem: &'a GuestMemoryMmap,
    new_rip: Option<u64>,
}

impl<'a> Trap<'a> {
    pub(crate) fn new(
        cpu: usize,
        regs: &kvm_regs,
        sregs: &kvm_sregs,
        mem: &'a GuestMemoryMmap,
    ) -> Self {
        Trap {
            cpu,
            rip: regs.rip,
            rsp: regs.rsp,
            cr3: sregs.cr3,
            paging: PagingMode::from_cr4(sregs.cr4),
            mem,
            new_rip: None,
        }
    }

    /// A trap built from plain register values, for benchmarks of trap
    /// handlers outside a vCPU thread (`benches/trap_path.rs`).
    #[doc(hidden)]
    pub fn for_bench(
        cpu: usize,
        rip: u64,
        rsp: u64,
        cr3: u64,
        paging: PagingMode,
        mem: &'a GuestMemoryMmap,
    ) -> Self {
        Trap {
            cpu,
            rip,
            rsp,
            cr3,
            paging,
            mem,
            new_rip: None,
        }
    }

    /// Resume the guest at `rip` instead of where KVM would.
    pub fn set_rip(&mut self, rip: u64) {
        self.new_rip = Some(rip);
    }

    pub(crate) fn new_rip(&self) -> Option<u64> {
        self.new_rip
    }

    /// Host monotonic time in nanoseconds, the clock events are stamped with.
    pub fn now_ns() -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes only into `ts`, a valid timespec.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }
}

/// What the vCPU thread calls on each trap.
pub trait TrapHandler: Send {
    /// Handle one trap; an error stops the run with that message.
    fn on_trap(&mut self, trap: &mut Trap<'_>) -> Result<(), String>;
    /// Hand buffered work to whoever collects it; called before the vCPU parks
    /// and when it leaves its loop.
    fn flush(&mut self) {}
}

/// Without a tracer nothing should write the trace port.
pub struct NoTracer;

impl TrapHandler for NoTracer {
    fn on_trap(&mut self, trap: &mut Trap<'_>) -> Result<(), String> {
        Err(format!(
            "vCPU {} wrote the trace port at {:#x} with no tracer attached",
            trap.cpu, trap.rip
        ))
    }
}
