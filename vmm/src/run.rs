//! The controller's view of a running guest: wait for it to stop, stop it,
//! pause it, and collect what the vCPUs did.

use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vm_memory::GuestMemoryMmap;

use crate::devices::Devices;
use crate::exit::VcpuStats;
use crate::kvm_stats::{self, KvmCounts, KvmStats, KvmStatsError};
use crate::pause::{PauseControl, PauseStats, VcpuSnapshot};
use crate::ram::GuestRam;
use crate::stop::{panic_message, StopReason, VcpuError};
use crate::stopped::Stopped;
use crate::sys::{install_signal_handler, lock, signal_ignored, unpoison};

/// State every vCPU thread and the controller share.
pub struct Shared {
    pub mem: GuestMemoryMmap,
    /// The same memory as the tracer reaches any guest's.
    pub ram: Arc<dyn GuestRam>,
    pub devices: Devices,
    pub pause: PauseControl,
    stop: Mutex<Option<StopReason>>,
    stop_cv: Condvar,
    /// Registers of each vCPU when a timeout stopped the guest.
    last_regs: Mutex<Vec<Option<VcpuSnapshot>>>,
}

impl Shared {
    pub(crate) fn new(mem: GuestMemoryMmap, devices: Devices, pause: PauseControl) -> Self {
        Shared {
            ram: Arc::new(mem.clone()),
            mem,
            devices,
            pause,
            stop: Mutex::new(None),
            stop_cv: Condvar::new(),
            last_regs: Mutex::new(Vec::new()),
        }
    }

    /// Record why the run ends (the first reason wins) and stop every vCPU.
    pub fn stop(&self, reason: StopReason) {
        {
            let mut s = lock(&self.stop);
            if s.is_none() {
                *s = Some(reason);
            }
            self.stop_cv.notify_all();
        }
        self.pause.stop_all();
    }

    fn stop_reason(&self) -> Option<StopReason> {
        lock(&self.stop).clone()
    }
}

static SIGNAL: AtomicI32 = AtomicI32::new(0);
/// Termination signals received since the handlers were installed.
static SIGNALS: AtomicU32 = AtomicU32::new(0);

/// Said (with write(2), async-signal-safe) on every termination signal
/// after the first: the run is stopping already and finishes as after the
/// first one (every site restored, the data file completed).
const ALREADY_STOPPING: &[u8] = b"vmtrace: already stopping: restoring the guest's text and \
completing the data file (SIGKILL would leave it incomplete)\n";

extern "C" fn on_terminate(sig: libc::c_int) {
    if SIGNALS.fetch_add(1, Ordering::SeqCst) > 0 {
        // SAFETY: write(2) is async-signal-safe; the buffer is a static
        // byte string of that length. A failed write (a terminal gone,
        // EIO) loses only this line.
        unsafe {
            libc::write(
                libc::STDERR_FILENO,
                ALREADY_STOPPING.as_ptr().cast(),
                ALREADY_STOPPING.len(),
            )
        };
        return;
    }
    SIGNAL.store(sig, Ordering::SeqCst);
}

/// The signals that stop a run cleanly: Ctrl-C, SIGTERM, and SIGHUP (the
/// terminal went away: the same as SIGTERM).
pub const TERMINATE_SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Turn SIGINT, SIGTERM and SIGHUP into a clean stop: the handler only
/// records the signal (an atomic store, async-signal-safe); the controller
/// notices within one wait step. Later ones while it stops are said and
/// otherwise ignored (see `on_terminate`). SIGHUP ignored by the parent
/// (`nohup`) stays ignored; SIGINT and SIGTERM are caught whatever their
/// disposition (a shell script's background job has SIGINT ignored, and
/// `kill -INT` of it must still stop the run).
pub fn install_terminate_handlers() -> std::io::Result<()> {
    SIGNALS.store(0, Ordering::SeqCst);
    for sig in TERMINATE_SIGNALS {
        if sig == libc::SIGHUP && signal_ignored(sig)? {
            continue;
        }
        install_signal_handler(sig, on_terminate)?;
    }
    Ok(())
}

/// The termination signal received since `install_terminate_handlers`, if
/// any (taken: the next call says None until another comes). For callers
/// that run no VM of this VMM (a QEMU attach) and poll for themselves.
pub fn take_terminate_signal() -> Option<libc::c_int> {
    match SIGNAL.swap(0, Ordering::SeqCst) {
        0 => None,
        sig => Some(sig),
    }
}

/// Files to remove if a termination signal ends vmtrace after its run
/// (`end_on_terminate`): a one-shot run's temporary data file, the data
/// file's lock. Set once per run (leaked C strings, never freed: a handler
/// may be reading them).
static REMOVE_ON_TERMINATE: [AtomicPtr<libc::c_char>; 2] = [
    AtomicPtr::new(std::ptr::null_mut()),
    AtomicPtr::new(std::ptr::null_mut()),
];

extern "C" fn on_terminate_after_run(sig: libc::c_int) {
    for p in &REMOVE_ON_TERMINATE {
        let path = p.load(Ordering::SeqCst);
        if !path.is_null() {
            // SAFETY: unlink(2) is async-signal-safe; `path` is a
            // NUL-terminated string that is never freed.
            unsafe { libc::unlink(path) };
        }
    }
    // SAFETY: signal(2) and raise(3) are async-signal-safe. Ended by the
    // signal itself, as any program on Ctrl-C: the shell sees it (status
    // 128 + sig), a script's loop stops.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

/// Once the guest is stopped, its text restored and the data file complete,
/// nothing is left that a signal could spoil: SIGINT, SIGTERM and SIGHUP end
/// vmtrace at once again (a long report or export, a device being copied
/// into), removing the files in `remove` first. Until then they stopped the
/// run cleanly (`install_terminate_handlers`); a signal ignored when vmtrace
/// started (`nohup`) stays ignored.
pub fn end_on_terminate(remove: [Option<&std::path::Path>; 2]) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    for (slot, path) in REMOVE_ON_TERMINATE.iter().zip(remove) {
        let c = match path {
            Some(p) => std::ffi::CString::new(p.as_os_str().as_bytes())?.into_raw(),
            None => std::ptr::null_mut(),
        };
        slot.store(c, Ordering::SeqCst);
    }
    for sig in TERMINATE_SIGNALS {
        if signal_ignored(sig)? {
            continue;
        }
        install_signal_handler(sig, on_terminate_after_run)?;
    }
    Ok(())
}

/// Everything measured in one run.
#[derive(Clone, Debug)]
pub struct RunReport {
    pub reason: StopReason,
    pub elapsed: Duration,
    pub vcpus: Vec<VcpuStats>,
    pub pause: PauseStats,
    /// The last console lines, for error messages.
    pub console_tail: Vec<String>,
    /// Where each vCPU was when a timeout or a signal stopped it (empty
    /// otherwise).
    pub last_regs: Vec<Option<VcpuSnapshot>>,
    /// KVM's own counters of each vCPU at the end (see kvm_stats: what
    /// `insn_emulation` counts depends on the host); all None where KVM
    /// keeps no statistics.
    pub kvm: Vec<KvmCounts>,
    /// Why `kvm` could not be read, if it could not (it is then all None).
    pub kvm_error: Option<String>,
}

impl RunReport {
    /// Instructions KVM's emulator ran per vCPU (every guest instruction
    /// only where KVM emulates guest ring 0); None unless KVM counted them
    /// for every vCPU.
    pub fn guest_instructions_emulated(&self) -> Option<Vec<u64>> {
        kvm_stats::instructions(&self.kvm)
    }
}

/// A running guest.
pub struct Running {
    pub(crate) shared: Arc<Shared>,
    pub(crate) threads: Vec<JoinHandle<VcpuStats>>,
    pub(crate) started: Instant,
    pub(crate) deadline: Option<Instant>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) kvm_stats: KvmStats,
    /// KVM and the VM fd, closed after the vCPU fds.
    pub(crate) _vm: (kvm_ioctls::Kvm, kvm_ioctls::VmFd),
}

/// All vCPUs parked: guest memory and vCPU state belong to the holder.
/// Dropping it resumes the guest.
pub struct Paused<'a> {
    run: &'a Running,
    since: Instant,
    latency: Duration,
}

impl Paused<'_> {
    /// This VMM's own memory, mapped here.
    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.run.shared.mem
    }
}

impl Stopped for Paused<'_> {
    fn ram(&self) -> &Arc<dyn GuestRam> {
        &self.run.shared.ram
    }
    fn cpus(&self) -> usize {
        self.run.cpus()
    }
    fn snapshot(&self, cpu: usize) -> Option<VcpuSnapshot> {
        self.run.shared.pause.snapshot(cpu)
    }
    fn latency(&self) -> Duration {
        self.latency
    }
    fn window(&self) -> Duration {
        self.since.elapsed()
    }
}

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        self.run.shared.pause.resume_all(self.since.elapsed());
    }
}

impl Running {
    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.shared.mem
    }

    /// Guest memory as the tracer reaches any guest's.
    pub fn ram(&self) -> &Arc<dyn GuestRam> {
        &self.shared.ram
    }

    pub fn cpus(&self) -> usize {
        self.threads.len()
    }

    /// KVM's own counters of the vCPUs: a handle any thread can read at
    /// any time (see kvm_stats).
    pub fn kvm_stats(&self) -> KvmStats {
        self.kvm_stats.clone()
    }

    /// Each vCPU's KVM counters now (all None where KVM keeps no statistics).
    pub fn kvm_counts(&self) -> Result<Vec<KvmCounts>, KvmStatsError> {
        self.kvm_stats.read()
    }

    /// Instructions KVM's emulator has run per vCPU so far; None unless it
    /// counts them for every vCPU.
    pub fn guest_instructions_emulated(&self) -> Result<Option<Vec<u64>>, KvmStatsError> {
        self.kvm_stats.instructions()
    }

    /// Stop the world (see pause.rs).
    pub fn pause_all(&self) -> Paused<'_> {
        let latency = self.shared.pause.pause_all();
        Paused {
            run: self,
            since: Instant::now(),
            latency,
        }
    }

    /// Ask the guest to stop (its vCPUs leave their loops).
    pub fn request_stop(&self, reason: StopReason) {
        self.shared.stop(reason);
    }

    /// Has the run ended? Waits up to `step`, and turns a pending signal or
    /// an expired `--timeout` into the stop reason.
    pub fn wait_stop(&self, step: Duration) -> Option<StopReason> {
        let sig = SIGNAL.swap(0, Ordering::SeqCst);
        if sig != 0 && self.shared.stop_reason().is_none() {
            // Where each vCPU was: `--stats` says it.
            self.snapshot_all();
            self.shared.stop(StopReason::Signal(sig));
        }
        if let (Some(d), Some(t)) = (self.deadline, self.timeout) {
            if Instant::now() >= d && self.shared.stop_reason().is_none() {
                // Where was each vCPU? Worth saying when a guest hangs.
                self.snapshot_all();
                self.shared.stop(StopReason::Timeout(t));
            }
        }
        let s = lock(&self.shared.stop);
        let (s, _) = unpoison(
            self.shared
                .stop_cv
                .wait_timeout_while(s, step, |r| r.is_none()),
        );
        s.clone()
    }

    /// Every vCPU's registers now, under a pause, kept for the report.
    fn snapshot_all(&self) {
        let regs = {
            let p = self.pause_all();
            (0..self.cpus()).map(|c| p.snapshot(c)).collect()
        };
        *lock(&self.shared.last_regs) = regs;
    }

    /// Run until the guest stops, for whatever reason.
    pub fn wait(&self) -> StopReason {
        loop {
            if let Some(r) = self.wait_stop(Duration::from_millis(50)) {
                return r;
            }
        }
    }

    /// Stop (if not stopped), join the vCPU threads, and report.
    pub fn finish(self) -> RunReport {
        self.shared.stop(StopReason::Requested);
        let mut vcpus = Vec::new();
        let mut died = None;
        for (cpu, t) in self.threads.into_iter().enumerate() {
            match t.join() {
                Ok(stats) => vcpus.push(stats),
                Err(payload) => {
                    // A panic the thread did not catch itself (vcpu.rs catches
                    // its loop's): its counts are lost, the run is broken.
                    let message = panic_message(&*payload);
                    died.get_or_insert(VcpuError::Panicked { cpu, message });
                    vcpus.push(VcpuStats::default());
                }
            }
        }
        let mut reason = match died {
            Some(e) => StopReason::Error(e),
            None => self.shared.stop_reason().unwrap_or(StopReason::Requested),
        };
        let (panic, tail) = self.shared.devices.with_console(|c| {
            let _ = std::io::Write::flush(c);
            (
                c.panic_message().map(str::to_owned),
                c.tail().map(str::to_owned).collect(),
            )
        });
        if let Some(msg) = panic {
            if matches!(
                reason,
                StopReason::Reset | StopReason::TripleFault { .. } | StopReason::Crash { .. }
            ) {
                reason = StopReason::Panic(msg);
            }
        }
        let elapsed = self.started.elapsed();
        // Every vCPU thread has left KVM_RUN: the counts are final.
        let (kvm, kvm_error) = match self.kvm_stats.read() {
            Ok(k) => (k, None),
            Err(e) => (vec![KvmCounts::default(); vcpus.len()], Some(e.to_string())),
        };
        RunReport {
            reason,
            elapsed,
            vcpus,
            pause: self.shared.pause.stats(),
            console_tail: tail,
            last_regs: lock(&self.shared.last_regs).clone(),
            kvm,
            kvm_error,
        }
    }
}
