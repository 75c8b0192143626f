//! A running QEMU guest as vmtrace's tracer drives it: guest RAM through
//! /proc/PID/mem (and, while it is stopped, writes through the gdbstub, so
//! that QEMU drops translations of code it changes), and stops of every
//! vCPU through the gdbstub's all-stop, each with the vCPUs' registers.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kvm_bindings::{kvm_regs, kvm_sregs};
use vm_memory::GuestAddress;
use vmm::pause::{GuestClock, VcpuSnapshot};
use vmm::{GuestRam, RamError, Stopped};

use super::gdb::{Gdb, GdbError, ThreadId};
use super::procmem::ProcRam;
use super::regs::X86Regs;
use super::trap::StopReply;

/// Guest RAM of a QEMU: reads (and writes while the guest runs: the rings'
/// host words) through /proc/PID/mem; writes while it is stopped through
/// the gdbstub in physical mode, QEMU's own write path, which invalidates
/// what TCG translated from the bytes written (a write from outside would
/// leave the old code running).
pub struct QemuRam {
    mem: ProcRam,
    stub: Arc<Mutex<Gdb>>,
    stopped: AtomicBool,
    /// The guest was reset (or shut down): its memory is no longer the
    /// traced kernel's, and vmtrace writes nothing more to it.
    sealed: AtomicBool,
}

impl QemuRam {
    pub fn new(mem: ProcRam, stub: Arc<Mutex<Gdb>>) -> QemuRam {
        QemuRam {
            mem,
            stub,
            stopped: AtomicBool::new(false),
            sealed: AtomicBool::new(false),
        }
    }

    fn stub(&self) -> MutexGuard<'_, Gdb> {
        self.stub.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }
}

fn ram_error(gpa: u64, len: usize) -> impl FnOnce(super::procmem::ProcMemError) -> RamError {
    move |e| RamError::new(gpa, len, e)
}

fn stub_error(gpa: u64, len: usize) -> impl FnOnce(GdbError) -> RamError {
    move |e| RamError::new(gpa, len, e)
}

impl GuestRam for QemuRam {
    fn read_bytes(&self, buf: &mut [u8], addr: GuestAddress) -> Result<(), RamError> {
        let len = buf.len();
        self.mem.read(addr.0, buf).map_err(ram_error(addr.0, len))
    }
    fn write_bytes(&self, data: &[u8], addr: GuestAddress) -> Result<(), RamError> {
        if self.sealed.load(Ordering::Acquire) {
            return Err(RamError::new(
                addr.0,
                data.len(),
                "the guest was reset: vmtrace writes nothing more to its memory",
            ));
        }
        // Under the stub's lock: stops and resumes change `stopped` under
        // it too, so a write that sees the guest stopped reaches the stub
        // before anyone resumes it (a running stub refuses writes).
        let mut stub = self.stub();
        match self.stopped() {
            true => stub
                .write(addr.0, data)
                .map_err(stub_error(addr.0, data.len())),
            false => {
                drop(stub);
                self.mem
                    .write(addr.0, data)
                    .map_err(ram_error(addr.0, data.len()))
            }
        }
    }
    fn load_u32(&self, addr: GuestAddress, _: Ordering) -> Result<u32, RamError> {
        self.mem.load_u32(addr.0).map_err(ram_error(addr.0, 4))
    }
    fn load_u64(&self, addr: GuestAddress, _: Ordering) -> Result<u64, RamError> {
        self.mem.load_u64(addr.0).map_err(ram_error(addr.0, 8))
    }
    fn store_u32(&self, v: u32, addr: GuestAddress, _: Ordering) -> Result<(), RamError> {
        // (One aligned word: the stub writes it whole, /proc/PID/mem too.)
        self.write_bytes(&v.to_le_bytes(), addr)
    }
    fn store_u64(&self, v: u64, addr: GuestAddress, _: Ordering) -> Result<(), RamError> {
        self.write_bytes(&v.to_le_bytes(), addr)
    }
    fn store_data_u64(&self, v: u64, addr: GuestAddress) -> Result<(), RamError> {
        // Straight to QEMU's memory, not through the stub even while it
        // holds the guest stopped: no code is translated from data, so TCG
        // has nothing to invalidate, and the stub's round trip per word was
        // most of an attach's pause on every site's ftrace record.
        if self.sealed.load(Ordering::Acquire) {
            return Err(RamError::new(
                addr.0,
                8,
                "the guest was reset: vmtrace writes nothing more to its memory",
            ));
        }
        self.mem
            .write(addr.0, &v.to_le_bytes())
            .map_err(ram_error(addr.0, 8))
    }
    fn contains(&self, addr: GuestAddress, len: usize) -> bool {
        let end = addr.0.saturating_add(len as u64);
        self.mem
            .ranges()
            .iter()
            .any(|r| addr.0 >= r.gpa && end <= r.gpa + r.len)
    }
}

/// The guest's TSC rate and how events are dated (see `snapshot`).
#[derive(Clone, Copy, Debug)]
pub struct ClockSource {
    /// The guest kernel's `tsc_khz`.
    pub tsc_khz: u32,
}

/// A file that exists while vmtrace holds the VM stopped itself (its
/// stub connecting, an interrupt), beside the attach's journal: QEMU's
/// status says `paused` both after a user's `stop` and after an attach
/// killed inside a stop of its own, and only the second is the repair's
/// to resume. Someone else's stop (`held`) is never marked. A few stops per
/// attach (trap mode's breakpoint hits are not among them: QEMU says
/// `debug` for those), each an open and an unlink.
pub struct StopMark(pub PathBuf);

impl StopMark {
    /// vmtrace stops the VM (`true`) or lets it run again. A mark that
    /// cannot be made only leaves the repair to take the stop for a user's
    /// (the VM left paused, said).
    pub fn set(&self, stopped: bool) {
        let _ = match stopped {
            true => std::fs::File::create(&self.0).map(drop),
            false => std::fs::remove_file(&self.0),
        };
    }
}

/// The QEMU's vCPUs as the stub names them, and its RAM.
pub struct QemuGuest {
    stub: Arc<Mutex<Gdb>>,
    ram: Arc<QemuRam>,
    /// What the tracer reaches guest memory through (the QEMU's RAM, or it
    /// with vmtrace's region in free guest pages).
    view: Arc<dyn GuestRam>,
    threads: Vec<ThreadId>,
    clock: Option<ClockSource>,
    /// An attach's (`StopMark`); a repair's guest has none.
    stop_mark: Option<StopMark>,
}

/// Every vCPU of a QEMU stopped by its gdbstub; dropping it resumes them.
pub struct QemuStop<'a> {
    guest: &'a QemuGuest,
    snaps: Vec<Option<VcpuSnapshot>>,
    since: Instant,
    latency: Duration,
    resumed: bool,
    /// Someone else's stop (a user's `stop`, an I/O error, S3) that
    /// vmtrace works inside: never resumed by vmtrace.
    held: bool,
}

/// kvm_regs/kvm_sregs are the tracer's register files (`VcpuSnapshot`):
/// filled from the stub's registers, the fields vmtrace reads.
fn snapshot(r: &X86Regs, clock: Option<GuestClock>) -> VcpuSnapshot {
    let regs = kvm_regs {
        rax: r.rax,
        rbx: r.rbx,
        rcx: r.rcx,
        rdx: r.rdx,
        rsi: r.rsi,
        rdi: r.rdi,
        rsp: r.rsp,
        rbp: r.rbp,
        r8: r.r8,
        r9: r.r9,
        r10: r.r10,
        r11: r.r11,
        r12: r.r12,
        r13: r.r13,
        r14: r.r14,
        r15: r.r15,
        rip: r.rip,
        rflags: r.rflags,
    };
    let mut sregs = kvm_sregs {
        cr0: r.cr0,
        cr2: r.cr2,
        cr3: r.cr3,
        cr4: r.cr4,
        cr8: r.cr8,
        efer: r.efer,
        ..Default::default()
    };
    sregs.cs.selector = r.cs as u16;
    sregs.ss.selector = r.ss as u16;
    sregs.fs.base = r.fs_base;
    sregs.gs.base = r.gs_base;
    VcpuSnapshot {
        regs,
        sregs,
        clock,
        // IA32_LSTAR is not among the stub's registers: the kernel is
        // found by its banner instead (kernel::kaslr).
        syscall_entry: None,
    }
}

impl QemuGuest {
    /// `stub` connected (QEMU stops the guest when a debugger connects).
    pub fn new(stub: Gdb, mem: ProcRam) -> Result<QemuGuest, GdbError> {
        let stub = Arc::new(Mutex::new(stub));
        let threads = {
            let mut s = stub.lock().unwrap_or_else(|e| e.into_inner());
            s.phys_mode(true)?;
            s.threads()?
        };
        let ram = Arc::new(QemuRam::new(mem, Arc::clone(&stub)));
        Ok(QemuGuest {
            view: Arc::clone(&ram) as Arc<dyn GuestRam>,
            stub,
            ram,
            threads,
            clock: None,
            stop_mark: None,
        })
    }

    pub fn cpus(&self) -> usize {
        self.threads.len()
    }

    /// The QEMU's RAM itself (no region).
    pub fn ram(&self) -> Arc<dyn GuestRam> {
        Arc::clone(&self.ram) as Arc<dyn GuestRam>
    }

    /// Reach guest memory through `view` from now on (the RAM with
    /// vmtrace's region in free guest pages).
    pub fn set_view(&mut self, view: Arc<dyn GuestRam>) {
        self.view = view;
    }

    /// What the tracer reaches guest memory through.
    pub fn view(&self) -> &Arc<dyn GuestRam> {
        &self.view
    }

    /// Date exitless events by the guest's TSC at `tsc_khz`.
    /// Mark vmtrace's own stops of this guest at `mark` (`StopMark`).
    pub fn set_stop_mark(&mut self, mark: StopMark) {
        self.stop_mark = Some(mark);
    }

    fn own_stop(&self, stopped: bool) {
        if let Some(m) = &self.stop_mark {
            m.set(stopped);
        }
    }

    pub fn set_clock(&mut self, c: ClockSource) {
        self.clock = Some(c);
    }

    pub(super) fn stub(&self) -> MutexGuard<'_, Gdb> {
        self.stub.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stop every vCPU (already stopped right after the stub connected)
    /// and read their registers.
    pub fn stop(&self, already: bool) -> Result<QemuStop<'_>, GdbError> {
        self.stop_with(already, false, &mut || false)
    }

    /// Stop every vCPU (`already`: the stub stopped them as it connected);
    /// `held`: the VM is stopped by someone else, and this stop never
    /// resumes it.
    pub fn stop_in(&self, already: bool, held: bool) -> Result<QemuStop<'_>, GdbError> {
        self.stop_with(already, held, &mut || false)
    }

    /// Stop every vCPU, waiting for the stub's answer for as long as
    /// `wait_on` says (a stalled QEMU answers late, and a second interrupt
    /// would leave a second answer behind); `held`: the VM is stopped by
    /// someone else, and this stop never resumes it.
    pub fn stop_patient(
        &self,
        held: bool,
        wait_on: &mut dyn FnMut() -> bool,
    ) -> Result<QemuStop<'_>, GdbError> {
        self.stop_with(false, held, wait_on)
    }

    fn stop_with(
        &self,
        already: bool,
        held: bool,
        wait_on: &mut dyn FnMut() -> bool,
    ) -> Result<QemuStop<'_>, GdbError> {
        let start = Instant::now();
        if !held {
            // Before the interrupt: a kill after it is never missed.
            self.own_stop(true);
        }
        {
            let mut stub = self.stub();
            if !already {
                stub.stop_waiting(wait_on)?;
            }
            self.ram.stopped.store(true, Ordering::Release);
        }
        let latency = start.elapsed();
        let mut stop = QemuStop {
            guest: self,
            snaps: Vec::new(),
            since: Instant::now(),
            latency,
            resumed: false,
            held,
        };
        // The TSC is not among the stub's registers: the rate from the
        // guest kernel, the anchor from the first record drained
        // (`GuestClock::unanchored`).
        let clock = self.clock.map(|c| GuestClock::unanchored(c.tsc_khz));
        for &t in &self.threads {
            let r = self.stub().regs(t)?;
            stop.snaps.push(Some(snapshot(&r, clock)));
        }
        Ok(stop)
    }
}

/// The VM stopped at a breakpoint (all-stop: every vCPU); dropping it
/// resumes the VM.
pub struct Hit<'a> {
    pub(super) guest: &'a QemuGuest,
    /// The stop reply.
    pub reply: StopReply,
    /// The vCPU the reply names (its index in the stub's thread list).
    pub cpu: Option<usize>,
    resumed: bool,
}

impl QemuGuest {
    /// Waits up to `timeout` for the running VM to stop (a breakpoint,
    /// or anyone's stop): None if it still runs.
    pub fn wait_hit(&self, timeout: Duration) -> Result<Option<Hit<'_>>, GdbError> {
        let mut stub = self.stub();
        let Some(reply) = stub.wait_stop(timeout)? else {
            return Ok(None);
        };
        self.ram.stopped.store(true, Ordering::Release);
        let cpu = reply
            .thread
            .and_then(|t| self.threads.iter().position(|&x| x == t));
        Ok(Some(Hit {
            guest: self,
            reply,
            cpu,
            resumed: false,
        }))
    }

    /// The vCPUs' thread ids, in vCPU order.
    pub(super) fn thread(&self, cpu: usize) -> Result<ThreadId, GdbError> {
        self.threads
            .get(cpu)
            .copied()
            .ok_or_else(|| GdbError::Target {
                addr: self.stub().addr().to_string(),
                what: format!("no vCPU {cpu}"),
            })
    }

    /// vCPU `cpu`'s registers (the guest stopped).
    fn vcpu_snapshot(&self, cpu: usize) -> Result<VcpuSnapshot, GdbError> {
        let t = self.thread(cpu)?;
        let r = self.stub().regs(t)?;
        Ok(snapshot(&r, None))
    }

    /// The stop reply the last stop brought (e.g. a breakpoint's, hit
    /// just before vmtrace's own stop), taken.
    pub fn take_last_stop(&self) -> Option<StopReply> {
        let text = self.stub().last_stop.take()?;
        StopReply::parse(&text)
    }

    /// Position of thread `t` in vCPU order.
    pub fn cpu_of(&self, t: ThreadId) -> Option<usize> {
        self.threads.iter().position(|&x| x == t)
    }
}

impl Hit<'_> {
    /// The stopping vCPU's registers.
    pub fn snapshot(&self, cpu: usize) -> Result<VcpuSnapshot, GdbError> {
        self.guest.vcpu_snapshot(cpu)
    }

    /// Guest memory, as the tracer reads it.
    pub fn ram(&self) -> &Arc<dyn GuestRam> {
        &self.guest.view
    }

    /// Leave the VM stopped: the stop was not vmtrace's (a user's `stop`,
    /// an I/O error), and is not vmtrace's to undo.
    pub fn hold(mut self) {
        self.resumed = true;
        self.guest.ram.stopped.store(false, Ordering::Release);
    }

    /// Let the VM run again; with `pc`, the stopping vCPU from there.
    pub fn resume(mut self, pc: Option<u64>) -> Result<(), GdbError> {
        self.resumed = true;
        let mut s = self.guest.stub();
        self.guest.ram.stopped.store(false, Ordering::Release);
        match pc {
            Some(pc) => s.resume_at(pc),
            None => s.resume(),
        }
    }
}

impl Drop for Hit<'_> {
    fn drop(&mut self) {
        if !self.resumed {
            let mut s = self.guest.stub();
            self.guest.ram.stopped.store(false, Ordering::Release);
            let _ = s.resume();
        }
    }
}

impl QemuGuest {
    /// Hand a running guest back to QEMU: stop it, detach the stub (which
    /// resumes it).
    pub fn release(&self) -> Result<(), GdbError> {
        self.stop(false)?.detach()
    }

    /// Write nothing more to guest memory (the guest was reset).
    pub fn seal(&self) {
        self.ram.sealed.store(true, Ordering::Release);
    }

    /// Someone else resumed the VM after a stop vmtrace held (a user's
    /// `cont`): the stub's next stop reply is the next stop.
    pub fn runs_again(&self) {
        self.stub().runs_again();
    }
}

impl QemuStop<'_> {
    /// Hand the guest back to QEMU from this stop: the stub leaves physical
    /// addressing (its state for the next debugger) and detaches, and QEMU
    /// resumes the guest. (A running guest's stub answers nothing but an
    /// interrupt, so this is done stopped.)
    pub fn detach(mut self) -> Result<(), GdbError> {
        self.resumed = true;
        let mut s = self.guest.stub();
        self.guest.ram.stopped.store(false, Ordering::Release);
        s.phys_mode(false)?;
        match self.held {
            // QEMU's `D` resumes the VM (gdb_continue): inside someone
            // else's stop the stub is left by closing it instead.
            true => {
                s.leave_stopped();
                Ok(())
            }
            false => {
                s.detach()?;
                self.guest.own_stop(false);
                Ok(())
            }
        }
    }

    /// Let the guest run again (inside someone else's stop: leave it).
    pub fn resume(mut self) -> Result<(), GdbError> {
        self.resumed = true;
        let mut s = self.guest.stub();
        self.guest.ram.stopped.store(false, Ordering::Release);
        match self.held {
            true => Ok(()),
            false => {
                s.resume()?;
                self.guest.own_stop(false);
                Ok(())
            }
        }
    }

    /// Sets vCPU `cpu`'s register `name` (gdb's name) in this stop.
    pub(super) fn set_vcpu_reg(&self, cpu: usize, name: &str, value: u64) -> Result<(), GdbError> {
        let t = self.guest.thread(cpu)?;
        self.guest.stub().set_reg(t, name, value)
    }

    /// Someone else's stop, which vmtrace never resumes.
    pub fn is_held(&self) -> bool {
        self.held
    }

    /// A breakpoint at guest-virtual `addr`, QEMU's own (guest memory
    /// unwritten under TCG).
    pub fn set_breakpoint(&self, addr: u64) -> Result<(), GdbError> {
        self.guest.stub().set_breakpoint(addr)
    }

    /// Removes the breakpoint at `addr`.
    pub fn clear_breakpoint(&self, addr: u64) -> Result<(), GdbError> {
        self.guest.stub().clear_breakpoint(addr)
    }
}

impl Drop for QemuStop<'_> {
    fn drop(&mut self) {
        if !self.resumed && !self.held {
            let mut s = self.guest.stub();
            self.guest.ram.stopped.store(false, Ordering::Release);
            // A stub that cannot resume the guest is gone with its QEMU.
            if s.resume().is_ok() {
                self.guest.own_stop(false);
            }
        }
    }
}

impl Stopped for QemuStop<'_> {
    fn ram(&self) -> &Arc<dyn GuestRam> {
        &self.guest.view
    }
    fn cpus(&self) -> usize {
        self.snaps.len()
    }
    fn snapshot(&self, cpu: usize) -> Option<VcpuSnapshot> {
        self.snaps.get(cpu).copied().flatten()
    }
    fn latency(&self) -> Duration {
        self.latency
    }
    fn window(&self) -> Duration {
        self.since.elapsed()
    }
}
