//! Stop-the-world: vmtrace's host-side `stop_machine`.
//!
//! Each vCPU is Running, Parked (with a snapshot of its registers) or Exited
//! ([`VcpuState`]). The controller sets `requested` (a pause) or `stopping`,
//! then kicks every registered vCPU thread out of KVM_RUN: it stores 1 in the
//! run page's `immediate_exit` (a KVM_RUN that has not started returns at
//! once) and sends a signal (one inside the guest exits with EINTR). Each vCPU
//! parks on a condition variable; when none is Running the controller has
//! guest memory and vCPU state to itself until it resumes them.
//!
//! No kick is lost:
//! - A vCPU thread registers (publishes its `immediate_exit` and thread id)
//!   before it first reads the flags, so either the controller sees it
//!   registered and kicks it, or the thread reads the flag after it was set.
//! - `immediate_exit` is written by the controller and the vCPU thread and
//!   read by KVM: vmtrace touches it only through an atomic made from a raw
//!   pointer to the byte, never through a `&mut kvm_run` (kvm-ioctls forms
//!   one inside `VcpuFd::run` to decode an exit, but never touches the byte).
//! - The vCPU thread clears it at the top of every loop iteration, *before*
//!   it reads the flags, and both are SeqCst (so the flag load cannot be done
//!   ahead of the clear, which x86 allows for a plain store and a later
//!   load). A kick stores its flag before its 1; so if the clear erased the
//!   1, it came after that store, and the flag read after the clear sees the
//!   flag; and if the 1 came after the clear, the next KVM_RUN returns at
//!   once. The periodic re-kick (every 5 ms while a pause waits) is then
//!   only a safety net.
//!
//! Registration is a guard ([`Registration`]): dropping it, on return or while
//! a panicking vCPU thread unwinds, removes the kick target under the lock
//! `kick_all` holds and marks the vCPU Exited, so a kick never writes to an
//! unmapped run page or signals a dead thread, and no pause waits for a vCPU
//! that is gone.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use kvm_bindings::{kvm_regs, kvm_run, kvm_sregs};

use crate::sys::{install_signal_handler, lock, unpoison};

/// How often a pause re-kicks the vCPUs that have not parked yet.
const REKICK: Duration = Duration::from_millis(5);
/// `held_by` when no vCPU holds a pause.
const NO_VCPU: usize = usize::MAX;

/// The signal that kicks a vCPU thread out of KVM_RUN.
pub fn kick_signal() -> libc::c_int {
    libc::SIGRTMIN() + 1
}

/// Does nothing: the interrupted KVM_RUN returning EINTR is the whole point.
extern "C" fn noop_handler(_: libc::c_int) {}

/// Registers of a parked vCPU.
#[derive(Clone, Copy, Debug, Default)]
pub struct VcpuSnapshot {
    pub regs: kvm_regs,
    pub sregs: kvm_sregs,
    /// The guest's TSC against the host clock, when KVM could tell.
    pub clock: Option<GuestClock>,
    /// IA32_LSTAR, the kernel's 64-bit `syscall` entry, once the guest has
    /// set it (read by vCPU 0 only, with the TSC; see `tracer::kernel::kaslr`).
    pub syscall_entry: Option<u64>,
}

/// One reading of a vCPU's time-stamp counter (what `rdtsc` returns in the
/// guest) and the host's monotonic clock at that moment: enough to put guest
/// TSC stamps on the host clock trap-mode events use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestClock {
    pub tsc: u64,
    /// `Trap::now_ns()` right after the TSC was read.
    pub host_ns: u64,
    /// The vCPU's TSC frequency (KVM_GET_TSC_KHZ).
    pub tsc_khz: u32,
}

impl GuestClock {
    /// A clock whose rate is known but not where the guest's TSC stands on
    /// the host clock (a VMM that cannot read the TSC at a stop): the first
    /// TSC dated anchors it at the host time it is dated (`anchor_at`), so
    /// times are late by at most how long that record waited to be read.
    pub fn unanchored(tsc_khz: u32) -> GuestClock {
        GuestClock {
            tsc: 0,
            host_ns: 0,
            tsc_khz,
        }
    }

    /// Has it an anchor (see `unanchored`)?
    pub fn is_anchored(&self) -> bool {
        self.host_ns != 0
    }

    /// Anchor an unanchored clock: guest TSC `tsc` is host time `host_ns`.
    pub fn anchor_at(&mut self, tsc: u64, host_ns: u64) {
        if !self.is_anchored() {
            self.tsc = tsc;
            self.host_ns = host_ns.max(1);
        }
    }

    /// The host time of guest TSC value `tsc` (earlier or later).
    pub fn host_ns(&self, tsc: u64) -> u64 {
        let khz = i128::from(self.tsc_khz.max(1));
        let delta = i128::from(tsc) - i128::from(self.tsc);
        // ticks * 1e6 / kHz = nanoseconds; in 64 bits when it fits (the
        // same quotient: a 128-bit division is a library call, a few
        // percent of the exitless drain's time per record).
        let scaled = delta * 1_000_000;
        let quotient = match i64::try_from(scaled) {
            Ok(s) => i128::from(s / i64::from(self.tsc_khz.max(1))),
            Err(_) => scaled / khz,
        };
        let ns = i128::from(self.host_ns) + quotient;
        ns.clamp(0, i128::from(u64::MAX)) as u64
    }
}

/// Where a vCPU thread is, as the pause protocol sees it.
// The states live in one Vec allocated once; boxing the snapshot would
// allocate on every park instead.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug)]
pub enum VcpuState {
    /// In or around KVM_RUN (or not started yet).
    Running,
    /// Stopped by a pause, with its registers.
    Parked(VcpuSnapshot),
    /// Left its loop for good.
    Exited,
}

/// What the flags ask of a vCPU thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wanted {
    Run,
    Pause,
    Stop,
}

/// How to reach one vCPU thread while it is in its loop.
struct Kicker {
    immediate_exit: *const AtomicU8,
    thread: libc::pthread_t,
}

// SAFETY: the pointer is only dereferenced under the `kickers` lock while the
// vCPU thread is registered, which is while its run page is mapped.
unsafe impl Send for Kicker {}

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
    vcpus: Mutex<Vec<VcpuState>>,
    parked_cv: Condvar,
    resume_cv: Condvar,
    /// Registered vCPU threads (see [`Registration`]).
    kickers: Mutex<Vec<Option<Kicker>>>,
    stats: Mutex<PauseStats>,
    rekick: Duration,
    /// The vCPU whose trap handler holds the pause (`pause_others`), or
    /// `NO_VCPU`; changed under the `vcpus` lock only.
    held_by: AtomicUsize,
}

impl PauseControl {
    /// `start_paused`: the vCPUs park before their first instruction. Fails
    /// only if the kick signal's handler cannot be installed (without it a
    /// kick would kill the process).
    pub fn new(ncpus: usize, start_paused: bool) -> std::io::Result<Self> {
        install_signal_handler(kick_signal(), noop_handler)?;
        Ok(PauseControl {
            requested: AtomicBool::new(start_paused),
            stopping: AtomicBool::new(false),
            vcpus: Mutex::new(vec![VcpuState::Running; ncpus]),
            parked_cv: Condvar::new(),
            resume_cv: Condvar::new(),
            kickers: Mutex::new((0..ncpus).map(|_| None).collect()),
            stats: Mutex::new(PauseStats::default()),
            rekick: REKICK,
            held_by: AtomicUsize::new(NO_VCPU),
        })
    }

    // ---- vCPU side ----

    /// Register the calling thread as vCPU `cpu`, before its first look at
    /// the flags; the guard deregisters it.
    ///
    /// # Safety
    /// `run` must point to the vCPU's `kvm_run` page and the page must stay
    /// mapped until the returned guard is dropped.
    pub(crate) unsafe fn register(&self, cpu: usize, run: *mut kvm_run) -> Registration<'_> {
        // SAFETY: the caller keeps the page mapped while the guard lives; a
        // u8 needs no alignment; every access vmtrace makes to this byte goes
        // through an atomic (module comment), and KVM reads it only inside
        // KVM_RUN, which is how the kernel ABI has it shared.
        let immediate_exit =
            unsafe { AtomicU8::from_ptr(std::ptr::addr_of_mut!((*run).immediate_exit)) };
        // SAFETY: pthread_self has no preconditions.
        let thread = unsafe { libc::pthread_self() };
        lock(&self.kickers)[cpu] = Some(Kicker {
            immediate_exit,
            thread,
        });
        Registration {
            pause: self,
            cpu,
            immediate_exit,
        }
    }

    /// What the flags ask of the vCPUs now.
    #[inline]
    pub(crate) fn wanted(&self) -> Wanted {
        if self.stopping.load(Ordering::SeqCst) {
            Wanted::Stop
        } else if self.requested.load(Ordering::SeqCst) {
            Wanted::Pause
        } else {
            Wanted::Run
        }
    }

    // ---- controller side ----

    /// Kick every registered vCPU out of KVM_RUN. One that is not registered
    /// yet reads the flags before its first KVM_RUN; one that has exited needs
    /// no kick.
    fn kick_all(&self) {
        for k in lock(&self.kickers).iter().flatten() {
            // SAFETY: registered means the thread is alive and its run page
            // mapped: its guard deregisters under this lock before either ends.
            unsafe {
                (*k.immediate_exit).store(1, Ordering::SeqCst);
                libc::pthread_kill(k.thread, kick_signal());
            }
        }
    }

    /// Stop every vCPU; returns the pause latency. Waits until no vCPU is
    /// Running.
    pub fn pause_all(&self) -> Duration {
        let start = Instant::now();
        {
            // A vCPU's pause (`pause_others`) ends first.
            let mut st = lock(&self.vcpus);
            while self.held_by.load(Ordering::SeqCst) != NO_VCPU {
                st = unpoison(self.resume_cv.wait(st));
            }
            self.requested.store(true, Ordering::SeqCst);
        }
        self.wait_parked();
        let latency = start.elapsed();
        lock(&self.stats).latency_ns.push(latency.as_nanos() as u64);
        latency
    }

    /// Kick the vCPUs and wait until none is Running.
    fn wait_parked(&self) {
        self.kick_all();
        let running = |v: &Vec<VcpuState>| v.iter().any(|s| matches!(s, VcpuState::Running));
        let mut st = lock(&self.vcpus);
        while running(&st) {
            let (s, timeout) = unpoison(self.parked_cv.wait_timeout(st, self.rekick));
            st = s;
            if timeout.timed_out() && running(&st) {
                self.kick_all();
            }
        }
    }

    // ---- a vCPU's own pause ----

    /// vCPU `me`, inside a trap, stops every other vCPU: it first waits,
    /// parked with `snapshot` as any vCPU, while another pause holds them
    /// (the controller's, or another vCPU's); then it holds the pause,
    /// counted as parked, until `resume_others`. Returns once no other
    /// vCPU is Running.
    pub(crate) fn pause_others(&self, me: usize, snapshot: VcpuSnapshot) {
        {
            let mut st = lock(&self.vcpus);
            st[me] = VcpuState::Parked(snapshot);
            self.parked_cv.notify_all();
            while self.wanted() == Wanted::Pause {
                st = unpoison(self.resume_cv.wait(st));
            }
            // (Stopping: the others leave their loops; this one after.)
            self.held_by.store(me, Ordering::SeqCst);
            self.requested.store(true, Ordering::SeqCst);
        }
        self.wait_parked();
    }

    /// vCPU `me`'s pause ends: every vCPU runs again.
    pub(crate) fn resume_others(&self, me: usize) {
        let mut st = lock(&self.vcpus);
        st[me] = VcpuState::Running;
        self.held_by.store(NO_VCPU, Ordering::SeqCst);
        self.requested.store(false, Ordering::SeqCst);
        self.resume_cv.notify_all();
    }

    /// Let the vCPUs go; `window` is how long they were all parked.
    pub fn resume_all(&self, window: Duration) {
        let _st = lock(&self.vcpus);
        self.requested.store(false, Ordering::SeqCst);
        self.resume_cv.notify_all();
        lock(&self.stats).window_ns.push(window.as_nanos() as u64);
    }

    /// Registers of parked vCPU `cpu` (None if it is not parked).
    pub fn snapshot(&self, cpu: usize) -> Option<VcpuSnapshot> {
        match lock(&self.vcpus).get(cpu) {
            Some(VcpuState::Parked(s)) => Some(*s),
            _ => None,
        }
    }

    /// Ask every vCPU to leave its loop.
    pub fn stop_all(&self) {
        {
            let _st = lock(&self.vcpus);
            self.stopping.store(true, Ordering::SeqCst);
            self.resume_cv.notify_all();
        }
        self.kick_all();
    }

    pub fn stats(&self) -> PauseStats {
        lock(&self.stats).clone()
    }
}

/// A vCPU thread's registration: while it lives the controller may kick the
/// thread; dropping it deregisters the thread and marks the vCPU Exited.
pub(crate) struct Registration<'a> {
    pause: &'a PauseControl,
    cpu: usize,
    immediate_exit: &'a AtomicU8,
}

impl Registration<'_> {
    /// Clear this vCPU's `immediate_exit`; call it before reading the flags
    /// (module comment).
    #[inline]
    pub fn clear_kick(&self) {
        self.immediate_exit.store(0, Ordering::SeqCst);
    }

    /// Park until the pause ends; `snapshot` is taken only if a pause is
    /// really wanted.
    pub fn park(&self, snapshot: impl FnOnce() -> VcpuSnapshot) {
        let pause = self.pause;
        let mut st = lock(&pause.vcpus);
        // The flags change under this lock, so this check holds until the wait.
        if pause.wanted() != Wanted::Pause {
            return;
        }
        st[self.cpu] = VcpuState::Parked(snapshot());
        pause.parked_cv.notify_all();
        while pause.wanted() == Wanted::Pause {
            st = unpoison(pause.resume_cv.wait(st));
        }
        st[self.cpu] = VcpuState::Running;
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        lock(&self.pause.kickers)[self.cpu] = None;
        lock(&self.pause.vcpus)[self.cpu] = VcpuState::Exited;
        self.pause.parked_cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::sync::Arc;

    /// Run `f` on a thread; fail if it takes longer than `limit` (a hang).
    fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(limit)
            .expect("hung (a lost kick or a vCPU that never counted as gone)")
    }

    /// A vCPU thread's loop with KVM_RUN replaced by a wait for
    /// `immediate_exit`, so only that byte (not the signal) ends a "run".
    fn fake_vcpu(pause: Arc<PauseControl>, cpu: usize) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            let mut page = Box::new(kvm_run::default());
            // SAFETY: `page` outlives `reg` (declared first, dropped last).
            let reg = unsafe { pause.register(cpu, &mut *page) };
            loop {
                reg.clear_kick();
                match pause.wanted() {
                    Wanted::Run => {
                        while reg.immediate_exit.load(Ordering::SeqCst) == 0 {
                            std::hint::spin_loop();
                        }
                    }
                    Wanted::Pause => reg.park(VcpuSnapshot::default),
                    Wanted::Stop => break,
                }
            }
        })
    }

    #[test]
    fn a_panicking_vcpu_thread_deregisters_and_counts_as_gone() {
        let pause = Arc::new(PauseControl::new(2, false).unwrap());
        let p = Arc::clone(&pause);
        let dead = std::thread::spawn(move || {
            let mut page = Box::new(kvm_run::default());
            // SAFETY: `page` outlives `_reg`.
            let _reg = unsafe { p.register(0, &mut *page) };
            panic!("vCPU thread dies");
        });
        assert!(dead.join().is_err());
        assert!(lock(&pause.kickers)[0].is_none(), "still kickable");
        assert!(matches!(lock(&pause.vcpus)[0], VcpuState::Exited));
        let live = fake_vcpu(Arc::clone(&pause), 1);
        // Before the guard, the dead vCPU stayed live and this never returned.
        let p = Arc::clone(&pause);
        within(Duration::from_secs(300), move || {
            p.pause_all();
            assert!(p.snapshot(1).is_some());
            assert!(p.snapshot(0).is_none());
            p.resume_all(Duration::ZERO);
            p.stop_all();
        });
        live.join().unwrap();
    }

    #[test]
    fn back_to_back_pauses_never_need_a_rekick() {
        let mut pause = PauseControl::new(2, false).unwrap();
        // A lost kick hangs a pause for good (no rekick in a day), which
        // the guard catches. No bound on how long the 5000 pauses take:
        // on a busy 2-core host each waits for the vCPU threads to be
        // scheduled (before, 50 s against a 60 s rekick).
        pause.rekick = Duration::from_secs(86_400);
        let pause = Arc::new(pause);
        let vcpus: Vec<_> = (0..2).map(|c| fake_vcpu(Arc::clone(&pause), c)).collect();
        let p = Arc::clone(&pause);
        within(Duration::from_secs(900), move || {
            for _ in 0..5000 {
                p.pause_all();
                p.resume_all(Duration::ZERO);
            }
            p.stop_all();
        });
        for v in vcpus {
            v.join().unwrap();
        }
        assert_eq!(pause.stats().latency_ns.len(), 5000);
    }

    /// A vCPU's own pause (a trap handler's) parks the others, excludes
    /// the controller's and another vCPU's until it ends, and is excluded
    /// by them.
    #[test]
    fn a_vcpus_pause_and_the_controllers_never_overlap() {
        let pause = Arc::new(PauseControl::new(3, false).unwrap());
        let others: Vec<_> = (1..3).map(|c| fake_vcpu(Arc::clone(&pause), c)).collect();
        let inside = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicUsize::new(0));
        // vCPU 0 parks when asked, as any, and between its parks its trap
        // handler pauses the others, 200 times.
        let (p, inside0, done0) = (Arc::clone(&pause), Arc::clone(&inside), Arc::clone(&done));
        let vcpu0 = std::thread::spawn(move || {
            let mut page = Box::new(kvm_run::default());
            // SAFETY: `page` outlives `reg` (declared first, dropped last).
            let reg = unsafe { p.register(0, &mut *page) };
            loop {
                reg.clear_kick();
                match p.wanted() {
                    Wanted::Pause => reg.park(VcpuSnapshot::default),
                    Wanted::Stop => break,
                    Wanted::Run if done0.load(Ordering::SeqCst) < 200 => {
                        p.pause_others(0, VcpuSnapshot::default());
                        assert!(!inside0.swap(true, Ordering::SeqCst), "overlap");
                        assert!(p.snapshot(1).is_some() && p.snapshot(2).is_some());
                        inside0.store(false, Ordering::SeqCst);
                        p.resume_others(0);
                        done0.fetch_add(1, Ordering::SeqCst);
                    }
                    Wanted::Run => std::hint::spin_loop(),
                }
            }
        });
        let p = Arc::clone(&pause);
        within(Duration::from_secs(600), move || {
            for _ in 0..200 {
                p.pause_all();
                assert!(!inside.swap(true, Ordering::SeqCst), "overlap");
                inside.store(false, Ordering::SeqCst);
                p.resume_all(Duration::ZERO);
            }
            while done.load(Ordering::SeqCst) < 200 {
                std::thread::yield_now();
            }
            p.stop_all();
        });
        vcpu0.join().unwrap();
        for v in others {
            v.join().unwrap();
        }
    }

    #[test]
    fn start_paused_parks_before_running() {
        let pause = Arc::new(PauseControl::new(1, true).unwrap());
        let v = fake_vcpu(Arc::clone(&pause), 0);
        let p = Arc::clone(&pause);
        within(Duration::from_secs(300), move || {
            p.pause_all();
            assert!(p.snapshot(0).is_some());
            p.stop_all();
        });
        v.join().unwrap();
        assert!(matches!(lock(&pause.vcpus)[0], VcpuState::Exited));
    }
}
