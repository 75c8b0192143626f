//! A guest with every vCPU stopped, whoever stopped it: this VMM's own
//! pause (`run::Paused`) or another VMM's (a QEMU stopped through its
//! gdbstub). What an attach or a detach needs of it: guest RAM and each
//! vCPU's registers, read once at the stop.

use std::sync::Arc;
use std::time::Duration;

use crate::gva::AddressSpace;
use crate::pause::{GuestClock, VcpuSnapshot};
use crate::ram::GuestRam;

/// The address space of one stopped vCPU.
pub struct VcpuSpace<'m> {
    pub cpu: usize,
    /// It was running at CPL 3 (user code, or the kernel's entry path still
    /// on the user's page tables).
    pub user_mode: bool,
    pub space: AddressSpace<'m>,
    /// Its GS base when it runs at CPL 0: in a Linux kernel past its entry
    /// code, the CPU's per-CPU area (None at CPL 3, where GS is the user's).
    pub gs_base: Option<u64>,
}

/// Selector bits 1:0 of CS: the privilege level the vCPU runs at.
const CS_RPL_MASK: u16 = 3;

/// Every vCPU stopped; guest memory and vCPU state belong to the holder
/// until it is dropped (which resumes the guest).
pub trait Stopped {
    /// Guest RAM, shareable with a thread that reads it while the guest
    /// runs (a ring drainer).
    fn ram(&self) -> &Arc<dyn GuestRam>;
    /// vCPUs in the guest, stopped or exited.
    fn cpus(&self) -> usize;
    /// Registers of a stopped vCPU; None if it has exited.
    fn snapshot(&self, cpu: usize) -> Option<VcpuSnapshot>;
    /// From the request to every vCPU stopped.
    fn latency(&self) -> Duration;
    /// How long the guest has been stopped so far.
    fn window(&self) -> Duration;

    /// The guest's TSC against the host clock, as the first vCPU that could
    /// tell read it at this stop.
    fn guest_clock(&self) -> Option<GuestClock> {
        (0..self.cpus()).find_map(|cpu| self.snapshot(cpu)?.clock)
    }

    /// The address spaces of the stopped vCPUs that run with paging on, in
    /// vCPU order.
    fn vcpu_spaces(&self) -> Vec<VcpuSpace<'_>> {
        let ram: &dyn GuestRam = &**self.ram();
        (0..self.cpus())
            .filter_map(|cpu| {
                let s = self.snapshot(cpu)?;
                let space = AddressSpace::of_vcpu(ram, &s.sregs)?;
                let user_mode = s.sregs.cs.selector & CS_RPL_MASK != 0;
                Some(VcpuSpace {
                    cpu,
                    user_mode,
                    space,
                    gs_base: (!user_mode).then_some(s.sregs.gs.base),
                })
            })
            .collect()
    }

    /// The guest kernel's `syscall` entry point (IA32_LSTAR of vCPU 0), once
    /// it has set one and when the stopper could read it.
    fn syscall_entry(&self) -> Option<u64> {
        self.snapshot(0)?.syscall_entry
    }
}
