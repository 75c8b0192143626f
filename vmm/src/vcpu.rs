//! One thread per vCPU: KVM_RUN, handle the exit, repeat.
//!
//! The thread's states are the pause protocol's (pause.rs, `VcpuState`):
//! Running (inside or around KVM_RUN), Parked (stopped by `pause_all`),
//! Exited (it left the loop and said why). Registers at an exit come from the
//! run page (KVM_CAP_SYNC_REGS); ioctls are used only on rare paths (park,
//! assist). What an exit means is decided by the pure `exit::handle_exit`;
//! this file carries out what needs the vCPU fd.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use kvm_bindings::{kvm_msr_entry, kvm_run, Msrs, KVM_SYNC_X86_REGS};
use kvm_ioctls::{SyncReg, VcpuExit, VcpuFd};

use crate::assist::{self, Assist, AssistError};
use crate::exit::{self, Action, VcpuStats};
use crate::gva::{AddressSpace, PagingMode};
use crate::pause::{GuestClock, Registration, VcpuSnapshot, Wanted};
use crate::run::Shared;
use crate::stop::{panic_message, StopReason, VcpuError};
use crate::trap::{Trap, TrapHandler};

/// Everything a vCPU thread owns.
pub(crate) struct VcpuThread {
    pub cpu: usize,
    pub fd: VcpuFd,
    pub shared: Arc<Shared>,
    pub handler: Box<dyn TrapHandler>,
    pub stats: VcpuStats,
}

impl VcpuThread {
    /// The thread's body. A panic in the loop is caught here and ends the run
    /// with the panic as its reason, so the controller hears of it at once.
    pub fn run(mut self) -> VcpuStats {
        self.fd.set_sync_valid_reg(SyncReg::Register);
        self.fd.set_sync_valid_reg(SyncReg::SystemRegister);
        let shared = Arc::clone(&self.shared);
        let run_page: *mut kvm_run = self.fd.get_kvm_run();
        // SAFETY: the run page is mapped while `self.fd` lives, and `kick` is
        // dropped before `self` both on return (explicitly below) and while
        // unwinding (locals drop before parameters).
        let kick = unsafe { shared.pause.register(self.cpu, run_page) };
        let looped = std::panic::catch_unwind(AssertUnwindSafe(|| self.run_loop(&kick, run_page)));
        if let Err(payload) = looped {
            let message = panic_message(&*payload);
            shared.stop(
                VcpuError::Panicked {
                    cpu: self.cpu,
                    message,
                }
                .into(),
            );
        }
        drop(kick);
        std::mem::take(&mut self.stats)
    }

    fn run_loop(&mut self, kick: &Registration<'_>, run_page: *const kvm_run) {
        let shared = Arc::clone(&self.shared);
        // The guest's clock (for exitless stamps) and its syscall entry (for
        // KASLR) are read by vCPU 0 alone: one TSC is enough, every CPU has
        // the same entry, and the other vCPUs' pauses stay as short as
        // before. The TSC rate does not change: read once.
        let first = self.cpu == 0;
        let tsc_khz = if first {
            self.fd.get_tsc_khz().ok()
        } else {
            None
        };
        loop {
            // Clear, then read the flags: the order no kick is lost by (pause.rs).
            kick.clear_kick();
            match shared.pause.wanted() {
                Wanted::Run => {
                    if let Err(reason) = self.run_once(run_page) {
                        shared.stop(reason);
                        break;
                    }
                }
                Wanted::Pause => {
                    self.handler.flush();
                    kick.park(|| snapshot(&mut self.fd, first, tsc_khz));
                }
                Wanted::Stop => break,
            }
        }
        self.handler.flush();
    }

    /// One KVM_RUN and its exit.
    fn run_once(&mut self, run_page: *const kvm_run) -> Result<(), StopReason> {
        let cpu = self.cpu;
        let exit = self.fd.run();
        let io_size = match exit {
            // SAFETY: `run_page` is this vCPU's mapped run page and the exit
            // is KVM_EXIT_IO, so the `io` member is the live one. The exit
            // borrows only the data at `io.data_offset`, a page past the
            // header, so this one-byte read aliases nothing it holds.
            Ok(VcpuExit::IoIn(..) | VcpuExit::IoOut(..)) => unsafe {
                std::ptr::addr_of!((*run_page).__bindgen_anon_1.io.size).read()
            },
            _ => 0,
        };
        let (kind, action) = exit::handle_exit(cpu, exit, io_size, &self.shared.devices);
        self.stats.count(kind);
        match action {
            Action::Resume => Ok(()),
            Action::Trap => self.trap().map_err(|e| VcpuError::Trap(e).into()),
            Action::Assist => self
                .emulation_assist()
                .map_err(|e| VcpuError::Assist(e).into()),
            Action::TripleFault => Err(StopReason::TripleFault {
                cpu,
                rip: self.fd.sync_regs().regs.rip,
            }),
            Action::Stop(reason) => Err(reason),
        }
    }

    /// A patched site fired: hand it to this vCPU's handler.
    fn trap(&mut self) -> Result<(), crate::trap::TrapError> {
        let sync = self.fd.sync_regs_mut();
        let mut trap = Trap::new(self.cpu, &sync.regs, &sync.sregs, &self.shared.mem);
        self.handler.on_trap(&mut trap)?;
        if trap.wants_world() {
            // Parked as a pause would find it: at the trap (its registers
            // from the run page; no clock read).
            let here = VcpuSnapshot {
                regs: sync.regs,
                sregs: sync.sregs,
                ..VcpuSnapshot::default()
            };
            self.shared.pause.pause_others(self.cpu, here);
            let done = self.handler.on_world(&mut trap);
            self.shared.pause.resume_others(self.cpu);
            done?;
        }
        if let Some((n, value)) = trap.new_gpr() {
            let r = &mut sync.regs;
            let gpr = [
                &mut r.rax, &mut r.rcx, &mut r.rdx, &mut r.rbx, &mut r.rsp, &mut r.rbp, &mut r.rsi,
                &mut r.rdi, &mut r.r8, &mut r.r9, &mut r.r10, &mut r.r11, &mut r.r12, &mut r.r13,
                &mut r.r14, &mut r.r15,
            ];
            if let Some(g) = gpr.into_iter().nth(n) {
                *g = value;
            }
        }
        if let Some(rip) = trap.new_rip() {
            sync.regs.rip = rip;
        }
        if trap.new_rip().is_some() || trap.new_gpr().is_some() {
            // KVM copies the run page's registers in at the next KVM_RUN,
            // before it completes the `out`; with RIP changed it does not
            // advance RIP again (complete_fast_pio_out checks the linear RIP).
            self.fd.set_sync_dirty_reg(SyncReg::Register);
        }
        Ok(())
    }

    /// KVM's emulator gave up: carry out `int3` or `fwait`, or stop with the
    /// instruction.
    fn emulation_assist(&mut self) -> Result<(), AssistError> {
        let cpu = self.cpu;
        let sync = self.fd.sync_regs();
        let (rip, cr3, cr4) = (sync.regs.rip, sync.sregs.cr3, sync.sregs.cr4);
        let bytes = match assist::failure_bytes(self.fd.get_kvm_run()) {
            Ok(b) if !b.is_empty() => b,
            Ok(_) => assist::fetch_insn(
                &mut AddressSpace::new(&self.shared.mem, cr3, PagingMode::from_cr4(cr4)),
                rip,
            ),
            Err(suberror) => return Err(AssistError::Internal { cpu, suberror, rip }),
        };
        let what = assist::choose(cpu, rip, &bytes)?;
        let ioctl = |source| AssistError::Ioctl {
            cpu,
            assist: assist::name(what),
            source,
        };
        let fsw = match what {
            Assist::Fwait(_) => self.fd.get_fpu().map_err(ioctl)?.fsw,
            Assist::Int3 => 0,
        };
        let effect = assist::effect(what, rip, fsw);
        if let Some(rip) = effect.rip {
            self.fd.sync_regs_mut().regs.rip = rip;
            self.fd.set_sync_dirty_reg(SyncReg::Register);
        }
        if let Some(vector) = effect.inject {
            inject_exception(&self.fd, vector).map_err(ioctl)?;
        }
        *self.stats.assists.entry(assist::name(what)).or_default() += 1;
        Ok(())
    }
}

/// Deliver exception `vector` (one without an error code) to the guest at the
/// next KVM_RUN.
fn inject_exception(fd: &VcpuFd, vector: u8) -> Result<(), kvm_ioctls::Error> {
    let mut events = fd.get_vcpu_events()?;
    events.exception.injected = 1;
    events.exception.nr = vector;
    events.exception.has_error_code = 0;
    events.flags = 0;
    fd.set_vcpu_events(&events)
}

/// Registers for a parked vCPU (and, for the `first` vCPU, its clock when
/// `tsc_khz` is given, and its syscall entry). Pending run-page changes are
/// pushed into KVM first so the ioctls read what the guest will resume with.
fn snapshot(fd: &mut VcpuFd, first: bool, tsc_khz: Option<u32>) -> VcpuSnapshot {
    if fd.get_kvm_run().kvm_dirty_regs & u64::from(KVM_SYNC_X86_REGS) != 0 {
        let regs = fd.sync_regs().regs;
        if fd.set_regs(&regs).is_ok() {
            fd.clear_sync_dirty_reg(SyncReg::Register);
        }
    }
    let (clock, syscall_entry) = if first {
        first_vcpu_msrs(fd, tsc_khz)
    } else {
        (None, None)
    };
    VcpuSnapshot {
        regs: fd.get_regs().unwrap_or_default(),
        sregs: fd.get_sregs().unwrap_or_default(),
        clock,
        syscall_entry,
    }
}

/// IA32_TIME_STAMP_COUNTER: the TSC as the guest reads it.
const MSR_IA32_TSC: u32 = 0x10;
/// IA32_LSTAR: RIP of the 64-bit `syscall` entry (Intel SDM vol. 4; Linux's
/// `syscall_init` writes `entry_SYSCALL_64` there on every CPU).
const MSR_IA32_LSTAR: u32 = 0xc000_0082;

/// One KVM_GET_MSRS for both (KVM reads entries in order and stops at the
/// first it cannot read): the vCPU's TSC now with the host clock, for
/// converting guest stamps (when `tsc_khz` is known), and its syscall entry
/// (None while the guest has not set it).
fn first_vcpu_msrs(fd: &VcpuFd, tsc_khz: Option<u32>) -> (Option<GuestClock>, Option<u64>) {
    let entry = |index| kvm_msr_entry {
        index,
        ..Default::default()
    };
    let Ok(mut msrs) = Msrs::from_entries(&[entry(MSR_IA32_TSC), entry(MSR_IA32_LSTAR)]) else {
        return (None, None);
    };
    let read = fd.get_msrs(&mut msrs).unwrap_or(0);
    let host_ns = Trap::now_ns();
    let got = msrs.as_slice();
    let clock = match tsc_khz {
        Some(tsc_khz) if read >= 1 => Some(GuestClock {
            tsc: got[0].data,
            host_ns,
            tsc_khz,
        }),
        _ => None,
    };
    let lstar = (read >= 2 && got[1].data != 0).then(|| got[1].data);
    (clock, lstar)
}
