//! One thread per vCPU: KVM_RUN, handle the exit, repeat.
//!
//! The thread's states are explicit: Running (inside or around KVM_RUN),
//! Parked (stopped by `pause_all`, see pause.rs), Exited (it left the loop and
//! said why). Registers at an exit come from the run page (KVM_CAP_SYNC_REGS);
//! ioctls are used only on rare paths (park, assist).

use std::collections::BTreeMap;
use std::sync::Arc;

use kvm_bindings::KVM_SYNC_X86_REGS;
use kvm_ioctls::{SyncReg, VcpuExit, VcpuFd};

use crate::assist::{self, Assist};
use crate::devices::MachineRequest;
use crate::pause::VcpuSnapshot;
use crate::run::{Shared, StopReason};
use crate::trap::{Trap, TrapHandler};

/// Exit kinds counted for `--stats`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ExitKind {
    Trap,
    PioOut,
    PioIn,
    MmioRead,
    MmioWrite,
    Kick,
    Assist,
    Hlt,
    Shutdown,
    Other,
}

impl ExitKind {
    pub const ALL: [ExitKind; 10] = [
        ExitKind::Trap,
        ExitKind::PioOut,
        ExitKind::PioIn,
        ExitKind::MmioRead,
        ExitKind::MmioWrite,
        ExitKind::Kick,
        ExitKind::Assist,
        ExitKind::Hlt,
        ExitKind::Shutdown,
        ExitKind::Other,
    ];
    pub fn name(self) -> &'static str {
        match self {
            ExitKind::Trap => "trace-trap",
            ExitKind::PioOut => "pio-out",
            ExitKind::PioIn => "pio-in",
            ExitKind::MmioRead => "mmio-read",
            ExitKind::MmioWrite => "mmio-write",
            ExitKind::Kick => "kick (EINTR)",
            ExitKind::Assist => "emulation-assist",
            ExitKind::Hlt => "hlt",
            ExitKind::Shutdown => "shutdown",
            ExitKind::Other => "other",
        }
    }
}

/// What one vCPU did.
#[derive(Clone, Debug, Default)]
pub struct VcpuStats {
    pub exits: [u64; ExitKind::ALL.len()],
    /// Emulation assists by instruction.
    pub assists: BTreeMap<&'static str, u64>,
}

impl VcpuStats {
    fn count(&mut self, k: ExitKind) {
        self.exits[k as usize] += 1;
    }
    pub fn get(&self, k: ExitKind) -> u64 {
        self.exits[k as usize]
    }
}

/// Everything a vCPU thread owns.
pub(crate) struct VcpuThread {
    pub cpu: usize,
    pub fd: VcpuFd,
    pub shared: Arc<Shared>,
    pub handler: Box<dyn TrapHandler>,
    pub stats: VcpuStats,
}

/// Longest data of one port access (`outl`).
const MAX_PIO_LEN: usize = 4;

impl VcpuThread {
    /// The loop. Returns the fd so it is unmapped only after the controller
    /// can no longer kick this thread (it joins first).
    pub fn run(mut self) -> (VcpuFd, VcpuStats) {
        self.fd.set_sync_valid_reg(SyncReg::Register);
        self.fd.set_sync_valid_reg(SyncReg::SystemRegister);
        let run_ptr = self.fd.get_kvm_run() as *mut _;
        let shared = Arc::clone(&self.shared);
        let pause = &shared.pause;
        pause.register(self.cpu, run_ptr);
        loop {
            if pause.should_exit() {
                self.handler.flush();
                if pause.is_stopping() {
                    break;
                }
                let snapshot = snapshot(&mut self.fd);
                pause.park(self.cpu, run_ptr, || snapshot);
                continue;
            }
            if let Err(reason) = self.run_once() {
                self.shared.stop(reason);
                break;
            }
        }
        self.handler.flush();
        pause.exited(self.cpu);
        (self.fd, self.stats)
    }

    /// One KVM_RUN and its exit.
    fn run_once(&mut self) -> Result<(), StopReason> {
        let cpu = self.cpu;
        let shared = &self.shared;
        let exit = match self.fd.run() {
            Ok(exit) => exit,
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                self.stats.count(ExitKind::Kick);
                return Ok(());
            }
            Err(e) => {
                return Err(StopReason::Error(format!(
                    "KVM_RUN failed on vCPU {cpu}: {e}"
                )))
            }
        };
        // Copy what the exit says, so the run page can be borrowed again.
        let (port, data, len) = match exit {
            VcpuExit::IoOut(port, data) => {
                let mut buf = [0u8; MAX_PIO_LEN];
                let len = data.len().min(MAX_PIO_LEN);
                buf[..len].copy_from_slice(&data[..len]);
                (port, buf, len)
            }
            VcpuExit::IoIn(port, data) => {
                shared.devices.pio_in(port, data);
                self.stats.count(ExitKind::PioIn);
                return Ok(());
            }
            VcpuExit::MmioRead(_, data) => {
                data.fill(0xff); // nothing is mapped there
                self.stats.count(ExitKind::MmioRead);
                return Ok(());
            }
            VcpuExit::MmioWrite(..) => {
                self.stats.count(ExitKind::MmioWrite);
                return Ok(());
            }
            VcpuExit::Shutdown => {
                self.stats.count(ExitKind::Shutdown);
                let rip = self.fd.sync_regs().regs.rip;
                return Err(StopReason::TripleFault { cpu, rip });
            }
            VcpuExit::Hlt => {
                // With the in-kernel irqchip HLT stays in KVM; an exit means the
                // guest halted for good.
                self.stats.count(ExitKind::Hlt);
                return Err(StopReason::Error(format!(
                    "vCPU {cpu} halted with no way to wake"
                )));
            }
            VcpuExit::InternalError => return self.emulation_assist(),
            VcpuExit::SystemEvent(kind, _) => {
                return Err(match kind {
                    kvm_bindings::KVM_SYSTEM_EVENT_RESET => StopReason::Reset,
                    _ => StopReason::PowerOff(0),
                })
            }
            VcpuExit::FailEntry(reason, _) => {
                return Err(StopReason::Error(format!(
                    "vCPU {cpu} failed to enter the guest (hardware reason {reason:#x})"
                )))
            }
            other => {
                self.stats.count(ExitKind::Other);
                return Err(StopReason::Error(format!(
                    "vCPU {cpu}: unexpected exit {other:?}"
                )));
            }
        };
        if port == crate::layout::TRACE_PORT {
            self.stats.count(ExitKind::Trap);
            return self.trap();
        }
        self.stats.count(ExitKind::PioOut);
        match shared.devices.pio_out(port, &data[..len]) {
            None => Ok(()),
            Some(MachineRequest::PowerOff(status)) => Err(StopReason::PowerOff(status)),
            Some(MachineRequest::Reset) => Err(StopReason::Reset),
        }
    }

    /// A patched site fired: hand it to this vCPU's handler.
    fn trap(&mut self) -> Result<(), StopReason> {
        let sync = self.fd.sync_regs_mut();
        let mut trap = Trap::new(self.cpu, &sync.regs, &sync.sregs, &self.shared.mem);
        self.handler.on_trap(&mut trap).map_err(StopReason::Error)?;
        if let Some(rip) = trap.new_rip() {
            sync.regs.rip = rip;
            // KVM copies the run page's registers in at the next KVM_RUN,
            // before it completes the `out`; with RIP changed it does not
            // advance RIP again (complete_fast_pio_out checks the linear RIP).
            self.fd.set_sync_dirty_reg(SyncReg::Register);
        }
        Ok(())
    }

    /// KVM's emulator gave up: carry out `int3` or `fwait`, or stop with the
    /// instruction.
    fn emulation_assist(&mut self) -> Result<(), StopReason> {
        let cpu = self.cpu;
        let rip = self.fd.sync_regs().regs.rip;
        let bytes = match assist::failure_bytes(self.fd.get_kvm_run()) {
            Ok(b) if !b.is_empty() => b,
            Ok(_) => self.fetch_insn(rip),
            Err(suberror) => {
                return Err(StopReason::Error(
                    assist::AssistError::Internal { cpu, suberror, rip }.to_string(),
                ))
            }
        };
        let what =
            assist::choose(cpu, rip, &bytes).map_err(|e| StopReason::Error(e.to_string()))?;
        match what {
            Assist::Int3 => {
                let sync = self.fd.sync_regs_mut();
                sync.regs.rip = rip + 1;
                self.fd.set_sync_dirty_reg(SyncReg::Register);
                let err = |e: kvm_ioctls::Error| {
                    StopReason::Error(format!("int3 assist on vCPU {cpu}: {e}"))
                };
                let mut events = self.fd.get_vcpu_events().map_err(err)?;
                events.exception.injected = 1;
                events.exception.nr = assist::BP_VECTOR;
                events.exception.has_error_code = 0;
                events.flags = 0;
                self.fd.set_vcpu_events(&events).map_err(err)?;
            }
            Assist::Fwait(len) => {
                let err = |e: kvm_ioctls::Error| {
                    StopReason::Error(format!("fwait assist on vCPU {cpu}: {e}"))
                };
                if self.fd.get_fpu().map_err(err)?.fsw & assist::FSW_ES == 0 {
                    let sync = self.fd.sync_regs_mut();
                    sync.regs.rip = rip + u64::from(len);
                    self.fd.set_sync_dirty_reg(SyncReg::Register);
                } else {
                    // #MF is a fault: reported at the fwait, RIP unchanged.
                    let mut events = self.fd.get_vcpu_events().map_err(err)?;
                    events.exception.injected = 1;
                    events.exception.nr = assist::MF_VECTOR;
                    events.exception.has_error_code = 0;
                    events.flags = 0;
                    self.fd.set_vcpu_events(&events).map_err(err)?;
                }
            }
        }
        self.stats.count(ExitKind::Assist);
        *self.stats.assists.entry(assist::name(what)).or_default() += 1;
        Ok(())
    }

    /// The instruction at RIP, read through the guest's page tables, when KVM
    /// did not include its bytes.
    fn fetch_insn(&self, rip: u64) -> Vec<u8> {
        let sregs = self.fd.sync_regs().sregs;
        let mut buf = [0u8; 15];
        let mode = crate::gva::PagingMode::from_cr4(sregs.cr4);
        match crate::gva::read(&self.shared.mem, sregs.cr3, mode, rip, &mut buf) {
            Ok(()) => buf.to_vec(),
            Err(_) => Vec::new(),
        }
    }
}

/// Registers for a parked vCPU. Pending run-page changes are pushed into KVM
/// first so the ioctls read what the guest will resume with.
fn snapshot(fd: &mut VcpuFd) -> VcpuSnapshot {
    if fd.get_kvm_run().kvm_dirty_regs & u64::from(KVM_SYNC_X86_REGS) != 0 {
        let regs = fd.sync_regs().regs;
        if fd.set_regs(&regs).is_ok() {
            fd.clear_sync_dirty_reg(SyncReg::Register);
        }
    }
    VcpuSnapshot {
        regs: fd.get_regs().unwrap_or_default(),
        sregs: fd.get_sregs().unwrap_or_default(),
    }
}
