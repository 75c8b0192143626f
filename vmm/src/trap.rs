//! The hook through which a patched call site reaches the tracer.
//!
//! A patched site executes `out TRACE_PORT, al`; the vCPU thread that took the
//! exit calls its own `TrapHandler` with the registers from the run page
//! (KVM_CAP_SYNC_REGS, no ioctl) and guest memory. One handler per vCPU, owned
//! by its thread, so the trap path takes no lock.

use kvm_bindings::{kvm_regs, kvm_sregs};
use vm_memory::GuestMemoryMmap;

use crate::gva::{AddressSpace, PagingMode};
use crate::GuestRam;

/// One exit on the trace port.
pub struct Trap<'a> {
    pub cpu: usize,
    /// RIP as KVM left it: at the `out` (bare-metal fast PIO path) or just
    /// past it (this CI host's emulator completes it first). Handlers must
    /// accept both.
    pub rip: u64,
    pub rsp: u64,
    /// RBP: with frame pointers, the caller's frame at a function's entry
    /// (where a frame-pointer unwind starts).
    pub rbp: u64,
    /// The GS base (in kernel mode: this CPU's per-CPU area, through which
    /// the kernel reads its current task).
    pub gs_base: u64,
    /// The argument registers at the trap (RDI, RSI, RDX, RCX, R8, R9): a
    /// traced function's arguments at its entry.
    pub args: [u64; 6],
    /// RAX: a function's return value at its return.
    pub rax: u64,
    /// The 16 general-purpose registers in the x86 encoding's order (RAX,
    /// RCX, RDX, RBX, RSP, RBP, RSI, RDI, R8 ... R15): what an instruction's
    /// register number names.
    pub gprs: [u64; 16],
    /// Guest memory as this vCPU sees it now. Built afresh for each trap:
    /// the guest runs between traps and may remap any page, so no
    /// translation outlives the exit it was made for.
    space: AddressSpace<'a>,
    new_rip: Option<u64>,
    /// A register to set (its number in `gprs`) and its value.
    new_gpr: Option<(usize, u64)>,
    /// The handler asked for every other vCPU paused (`stop_world`).
    world: bool,
}

impl<'a> Trap<'a> {
    /// A trap at `regs.rip` on `cpu`, its memory `mem` (this VMM's, or a
    /// VM's reached another way: a QEMU's breakpoint stops).
    pub fn new(cpu: usize, regs: &kvm_regs, sregs: &kvm_sregs, mem: &'a dyn GuestRam) -> Self {
        Trap {
            cpu,
            rip: regs.rip,
            rsp: regs.rsp,
            rbp: regs.rbp,
            gs_base: sregs.gs.base,
            args: [regs.rdi, regs.rsi, regs.rdx, regs.rcx, regs.r8, regs.r9],
            rax: regs.rax,
            gprs: [
                regs.rax, regs.rcx, regs.rdx, regs.rbx, regs.rsp, regs.rbp, regs.rsi, regs.rdi,
                regs.r8, regs.r9, regs.r10, regs.r11, regs.r12, regs.r13, regs.r14, regs.r15,
            ],
            space: AddressSpace::new(mem, sregs.cr3, PagingMode::from_cr4(sregs.cr4)),
            new_rip: None,
            new_gpr: None,
            world: false,
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
            rbp: 0,
            gs_base: 0,
            args: [0; 6],
            rax: 0,
            gprs: [0; 16],
            space: AddressSpace::new(mem, cr3, paging),
            new_rip: None,
            new_gpr: None,
            world: false,
        }
    }

    /// Guest memory by virtual address, through this vCPU's page tables.
    pub fn space(&mut self) -> &mut AddressSpace<'a> {
        &mut self.space
    }

    /// Resume the guest at `rip` instead of where KVM would.
    pub fn set_rip(&mut self, rip: u64) {
        self.new_rip = Some(rip);
    }

    /// Where the handler moved RIP, if it did.
    pub fn new_rip(&self) -> Option<u64> {
        self.new_rip
    }

    /// Resume the guest with general-purpose register `n` (its number in
    /// `gprs`; 16 and over are ignored) set to `value` (an event's
    /// `tp->funcs` test passed for vmtrace:
    /// `tracer::kernel::events::enabled_branch`).
    pub fn set_gpr(&mut self, n: usize, value: u64) {
        if n < self.gprs.len() {
            self.new_gpr = Some((n, value));
        }
    }

    /// Call the handler again (`TrapHandler::on_world`) with every other
    /// vCPU paused, before this one resumes: for writes no other vCPU may
    /// see half done (vmtrace's own VMM only).
    pub fn stop_world(&mut self) {
        self.world = true;
    }

    /// Whether the handler asked for every other vCPU paused.
    pub fn wants_world(&self) -> bool {
        self.world
    }

    /// The register the handler set and its value, if it did.
    pub fn new_gpr(&self) -> Option<(usize, u64)> {
        self.new_gpr
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

/// Why a trap handler stopped the run.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TrapError {
    /// The trace port was written with no tracer attached.
    #[error("vCPU {cpu} wrote the trace port at {rip:#x} with no tracer attached")]
    NoTracer { cpu: usize, rip: u64 },
    /// RIP is at no patched site (nor just past one).
    #[error(
        "vCPU {cpu} trapped at {rip:#x}, which is not a patched site (guest text changed under vmtrace?)"
    )]
    UnknownSite { cpu: usize, rip: u64 },
    /// A hooked return came back with no frame at its slot: vmtrace does not
    /// know where the function was to return to.
    #[error(
        "vCPU {cpu} returned through vmtrace's return hook with no hooked frame at stack slot {slot:#x} (guest stack changed under vmtrace?)"
    )]
    UnknownReturn { cpu: usize, slot: u64 },
}

/// What the vCPU thread calls on each trap.
pub trait TrapHandler: Send {
    /// Handle one trap; an error stops the run with it as the reason.
    fn on_trap(&mut self, trap: &mut Trap<'_>) -> Result<(), TrapError>;
    /// Called after `on_trap` asked for it (`Trap::stop_world`), every
    /// other vCPU paused; an error stops the run.
    fn on_world(&mut self, _trap: &mut Trap<'_>) -> Result<(), TrapError> {
        Ok(())
    }
    /// Hand buffered work to whoever collects it; called before the vCPU parks
    /// and when it leaves its loop.
    fn flush(&mut self) {}
}

/// Without a tracer nothing should write the trace port.
pub struct NoTracer;

impl TrapHandler for NoTracer {
    fn on_trap(&mut self, trap: &mut Trap<'_>) -> Result<(), TrapError> {
        Err(TrapError::NoTracer {
            cpu: trap.cpu,
            rip: trap.rip,
        })
    }
}
