//! The controller's view of a running guest: wait for it to stop, stop it,
//! pause it, and collect what the vCPUs did.

use std::fmt;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Condvar, Mutex, Once};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvm_ioctls::VcpuFd;
use vm_memory::GuestMemoryMmap;

use crate::devices::Devices;
use crate::pause::{PauseControl, PauseStats, VcpuSnapshot};
use crate::vcpu::VcpuStats;

/// Why a run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The guest powered itself off with this status.
    PowerOff(u8),
    /// The guest asked for a reset (Linux `reboot=k`, or after a panic).
    Reset,
    /// The guest kernel panicked (the console line).
    Panic(String),
    /// A vCPU triple-faulted.
    TripleFault { cpu: usize, rip: u64 },
    /// `--timeout` elapsed.
    Timeout(Duration),
    /// SIGINT or SIGTERM.
    Signal(i32),
    /// The host side asked the guest to stop (e.g. `--duration`).
    Requested,
    /// Something went wrong; the message says what.
    Error(String),
}

impl StopReason {
    /// Did the guest end on its own terms?
    pub fn is_clean(&self) -> bool {
        matches!(self, StopReason::PowerOff(0))
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopReason::PowerOff(s) => write!(f, "guest powered off (status {s})"),
            StopReason::Reset => write!(f, "guest requested a reset"),
            StopReason::Panic(m) => write!(f, "guest panicked: {m}"),
            StopReason::TripleFault { cpu, rip } => {
                write!(f, "vCPU {cpu} triple-faulted (shutdown) at {rip:#x}")
            }
            StopReason::Timeout(d) => write!(f, "timeout after {} s", d.as_secs_f64()),
            StopReason::Signal(s) => write!(
                f,
                "stopped by {}",
                if *s == libc::SIGINT {
                    "Ctrl-C (SIGINT)"
                } else {
                    "SIGTERM"
                }
            ),
            StopReason::Requested => write!(f, "stopped on request"),
            StopReason::Error(m) => write!(f, "{m}"),
        }
    }
}

/// State every vCPU thread and the controller share.
pub struct Shared {
    pub mem: GuestMemoryMmap,
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
            let mut s = self.stop.lock().unwrap_or_else(|e| e.into_inner());
            if s.is_none() {
                *s = Some(reason);
            }
            self.stop_cv.notify_all();
        }
        self.pause.stop_all();
    }

    fn stop_reason(&self) -> Option<StopReason> {
        self.stop.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_terminate(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::SeqCst);
}

/// Turn SIGINT and SIGTERM into a clean stop: the handler only records the
/// signal; the controller notices within one wait step.
pub fn install_terminate_handlers() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for sig in [libc::SIGINT, libc::SIGTERM] {
            // SAFETY: zeroed sigaction = no flags, empty mask; the handler only
            // stores to an atomic, which is async-signal-safe.
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = on_terminate as *const () as usize;
                libc::sigemptyset(&mut sa.sa_mask);
                libc::sigaction(sig, &sa, std::ptr::null_mut());
            }
        }
    });
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
    /// Where each vCPU was when a timeout stopped it (empty otherwise).
    pub last_regs: Vec<Option<VcpuSnapshot>>,
}

/// A running guest.
pub struct Running {
    pub(crate) shared: Arc<Shared>,
    pub(crate) threads: Vec<JoinHandle<(VcpuFd, VcpuStats)>>,
    pub(crate) started: Instant,
    pub(crate) deadline: Option<Instant>,
    pub(crate) timeout: Option<Duration>,
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
    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.run.shared.mem
    }
    /// Registers of a parked vCPU; None if it has already exited.
    pub fn snapshot(&self, cpu: usize) -> Option<VcpuSnapshot> {
        self.run.shared.pause.snapshot(cpu)
    }
    /// From the request to all parked.
    pub fn latency(&self) -> Duration {
        self.latency
    }
    /// How long the guest has been stopped so far.
    pub fn window(&self) -> Duration {
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

    pub fn cpus(&self) -> usize {
        self.threads.len()
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
        if sig != 0 {
            self.shared.stop(StopReason::Signal(sig));
        }
        if let (Some(d), Some(t)) = (self.deadline, self.timeout) {
            if Instant::now() >= d && self.shared.stop_reason().is_none() {
                // Where was each vCPU? Worth saying when a guest hangs.
                let regs = {
                    let p = self.pause_all();
                    (0..self.cpus()).map(|c| p.snapshot(c)).collect()
                };
                *self
                    .shared
                    .last_regs
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = regs;
                self.shared.stop(StopReason::Timeout(t));
            }
        }
        let s = self.shared.stop.lock().unwrap_or_else(|e| e.into_inner());
        let (s, _) = self
            .shared
            .stop_cv
            .wait_timeout_while(s, step, |r| r.is_none())
            .unwrap_or_else(|e| e.into_inner());
        s.clone()
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
        for t in self.threads {
            match t.join() {
                Ok((_fd, stats)) => vcpus.push(stats),
                Err(_) => vcpus.push(VcpuStats::default()),
            }
        }
        let mut reason = self.shared.stop_reason().unwrap_or(StopReason::Requested);
        let (panic, tail) = self.shared.devices.with_console(|c| {
            let _ = std::io::Write::flush(c);
            (
                c.panic_message().map(str::to_owned),
                c.tail().map(str::to_owned).collect(),
            )
        });
        if let Some(msg) = panic {
            if matches!(reason, StopReason::Reset | StopReason::TripleFault { .. }) {
                reason = StopReason::Panic(msg);
            }
        }
        RunReport {
            reason,
            elapsed: self.started.elapsed(),
            vcpus,
            pause: self.shared.pause.stats(),
            console_tail: tail,
            last_regs: self
                .shared
                .last_regs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        }
    }
}
