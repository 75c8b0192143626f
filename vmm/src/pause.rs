//! Stop-the-world: vmtrace's host-side `stop_machine`.
//!
//! The controller sets `requested`, then kicks every vCPU out of KVM_RUN:
//! `immediate_exit = 1` in its run page (so a KVM_RUN that has not started yet
//! returns at once) and then a signal (so one already inside the guest exits).
//! The flag is set before either, and each vCPU thread publishes its run page
//! and thread id before it first reads the flag, so no kick can be lost: either
//! the controller sees the thread registered and kicks it, or the thread reads
//! the flag after it was set. Each vCPU parks on a condition variable with a
//! snapshot of its registers; when all live vCPUs are parked the controller has
//! guest memory and vCPU state to itself until it resumes them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, Once};
use std::time::{Duration, Instant};

use kvm_bindings::{kvm_regs, kvm_run, kvm_sregs};

/// The signal that kicks a vCPU thread out of KVM_RUN. Its handler does
/// nothing: the interrupted ioctl returning EINTR is the whole point.
pub fn kick_signal() -> libc::c_int {
    libc::SIGRTMIN() + 1
}

extern "C" fn noop_handler(_: libc::c_int) {}

/// Install the kick signal's handler once per process (without SA_RESTART, so
/// KVM_RUN returns EINTR instead of being restarted).
pub fn install_kick_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value;
        // the handler is an `extern "C"` function that touches nothing, which
        // is async-signal-safe.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = noop_handler as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(kick_signal(), &sa, std::ptr::null_mut());
        }
    });
}

/// Registers of a parked vCPU.
#[derive(Clone, Copy, Debug, Default)]
pub struct VcpuSnapshot {
    pub regs: kvm_regs,
    pub sregs: kvm_sregs,
}

/// How to reach one vCPU thread while it is in its loop.
#[derive(Clone, Copy)]
struct Kicker {
    run: *mut kvm_run,
    thread: libc::pthread_t,
}

// SAFETY: the pointer is only dereferenced under the `kickers` lock while the
// vCPU thread is registered, which is while its fd (and so the mapping) lives.
unsafe impl Send for Kicker {}

struct State {
    /// vCPU threads still running their loop.
    live: usize,
    parked: usize,
    snapshots: Vec<Option<VcpuSnapshot>>,
}

/// Latency and window of every pause, in nanoseconds.
#[derive(Clone, Debug, Default)]
pub struct PauseStats {
    /// From the request to the last vCPU parked.
    pub latency_ns: Vec<u64>,
    /// From all parked to the resume.
    pub window_ns: Vec<u64>,
}

pub struct PauseControl {
    requested: AtomicBool,
    stopping: AtomicBool,
    state: Mutex<State>,
    parked_cv: Condvar,
    resume_cv: Condvar,
    /// Registered vCPU threads; a thread deregisters before it gives up its
    /// fd, so a kick never touches an unmapped run page or a dead thread.
    kickers: Mutex<Vec<Option<Kicker>>>,
    stats: Mutex<PauseStats>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl PauseControl {
    /// `start_paused`: the vCPUs park before their first instruction.
    pub fn new(ncpus: usize, start_paused: bool) -> Self {
        install_kick_handler();
        PauseControl {
            requested: AtomicBool::new(start_paused),
            stopping: AtomicBool::new(false),
            state: Mutex::new(State {
                live: ncpus,
                parked: 0,
                snapshots: vec![None; ncpus],
            }),
            parked_cv: Condvar::new(),
            resume_cv: Condvar::new(),
            kickers: Mutex::new(vec![None; ncpus]),
            stats: Mutex::new(PauseStats::default()),
        }
    }

    // ---- vCPU side ----

    /// Called by vCPU thread `cpu` before its first KVM_RUN.
    pub(crate) fn register(&self, cpu: usize, run: *mut kvm_run) {
        // SAFETY: pthread_self has no preconditions.
        let thread = unsafe { libc::pthread_self() };
        lock(&self.kickers)[cpu] = Some(Kicker { run, thread });
    }

    /// Should the vCPU leave the guest (a pause or a stop is wanted)?
    #[inline]
    pub fn should_exit(&self) -> bool {
        self.requested.load(Ordering::SeqCst) || self.stopping.load(Ordering::SeqCst)
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Park vCPU `cpu` until the pause ends; `snapshot` is taken only if a pause
    /// is really wanted. Clears the vCPU's `immediate_exit` before returning.
    pub(crate) fn park(
        &self,
        cpu: usize,
        run: *mut kvm_run,
        snapshot: impl FnOnce() -> VcpuSnapshot,
    ) {
        let mut st = lock(&self.state);
        if self.requested.load(Ordering::SeqCst) && !self.is_stopping() {
            st.snapshots[cpu] = Some(snapshot());
            st.parked += 1;
            self.parked_cv.notify_all();
            while self.requested.load(Ordering::SeqCst) && !self.is_stopping() {
                st = self.resume_cv.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            st.parked -= 1;
            st.snapshots[cpu] = None;
        }
        // SAFETY: `run` is this thread's own mapped kvm_run page; the only other
        // writer is `kick`, which only ever stores 1 while a pause or stop is
        // requested, and we clear it after that request has been served.
        unsafe { std::ptr::write_volatile(&mut (*run).immediate_exit, 0) };
    }

    /// Called by vCPU thread `cpu` as it leaves its loop for good, before it
    /// gives up its fd.
    pub fn exited(&self, cpu: usize) {
        lock(&self.kickers)[cpu] = None;
        let mut st = lock(&self.state);
        st.live -= 1;
        self.parked_cv.notify_all();
    }

    // ---- controller side ----

    /// Kick every registered vCPU out of KVM_RUN. One that is not registered
    /// yet reads the flags before its first KVM_RUN; one that has exited needs
    /// no kick.
    fn kick_all(&self) {
        for k in lock(&self.kickers).iter().flatten() {
            // SAFETY: registered means the thread is alive and its run page
            // mapped (it deregisters under this lock before either ends); a
            // volatile byte store is how KVM expects `immediate_exit` to be set
            // from another thread.
            unsafe {
                std::ptr::write_volatile(&mut (*k.run).immediate_exit, 1);
                libc::pthread_kill(k.thread, kick_signal());
            }
        }
    }

    /// Stop every vCPU; returns the pause latency. Waits until every live
    /// vCPU is parked.
    pub fn pause_all(&self) -> Duration {
        let start = Instant::now();
        self.requested.store(true, Ordering::SeqCst);
        self.kick_all();
        let mut st = lock(&self.state);
        while st.parked < st.live {
            // Re-kick periodically: a vCPU blocked in a host syscall that was
            // not KVM_RUN when the signal came would otherwise wait for its
            // next exit.
            let (s, timeout) = self
                .parked_cv
                .wait_timeout(st, Duration::from_millis(5))
                .unwrap_or_else(|e| e.into_inner());
            st = s;
            if timeout.timed_out() && st.parked < st.live {
                self.kick_all();
            }
        }
        let latency = start.elapsed();
        lock(&self.stats).latency_ns.push(latency.as_nanos() as u64);
        latency
    }

    /// Let the vCPUs go; `window` is how long they were all parked.
    pub fn resume_all(&self, window: Duration) {
        let _st = lock(&self.state);
        self.requested.store(false, Ordering::SeqCst);
        self.resume_cv.notify_all();
        lock(&self.stats).window_ns.push(window.as_nanos() as u64);
    }

    /// Registers of parked vCPU `cpu` (None if it has exited).
    pub fn snapshot(&self, cpu: usize) -> Option<VcpuSnapshot> {
        lock(&self.state).snapshots.get(cpu).copied().flatten()
    }

    /// Ask every vCPU to leave its loop.
    pub fn stop_all(&self) {
        {
            let _st = lock(&self.state);
            self.stopping.store(true, Ordering::SeqCst);
            self.resume_cv.notify_all();
        }
        self.kick_all();
    }

    pub fn stats(&self) -> PauseStats {
        lock(&self.stats).clone()
    }
}
