//! Small host-side helpers the VMM's threads share: poison-tolerant locking
//! and signal handlers.

use std::sync::{LockResult, Mutex, MutexGuard, PoisonError};

/// The guard of a lock or condition-variable wait, poisoned or not. A poisoned
/// lock only means another thread panicked while holding it; the VMM's shared
/// state stays consistent field by field, and stopping the run and reporting
/// it must still work.
pub(crate) fn unpoison<G>(r: LockResult<G>) -> G {
    r.unwrap_or_else(PoisonError::into_inner)
}

/// Lock `m`, poisoned or not (see [`unpoison`]).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    unpoison(m.lock())
}

/// Is `sig` ignored (`nohup`, a background job of a non-interactive
/// shell)? Then it stays so: vmtrace does not catch it.
pub(crate) fn signal_ignored(sig: libc::c_int) -> std::io::Result<bool> {
    // SAFETY: a zeroed sigaction is a valid value to fill; a null `act`
    // only reads the current disposition.
    let (rc, old) = unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        let rc = libc::sigaction(sig, std::ptr::null(), &mut old);
        (rc, old)
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(old.sa_sigaction == libc::SIG_IGN)
}

/// Install `handler` for `sig`, with an empty mask and no `SA_RESTART`, so a
/// blocking call the signal interrupts (KVM_RUN) returns EINTR. Installing the
/// same handler again is harmless, so callers need no once-guard.
pub(crate) fn install_signal_handler(
    sig: libc::c_int,
    handler: extern "C" fn(libc::c_int),
) -> std::io::Result<()> {
    // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value;
    // `handler` is an `extern "C" fn(c_int)`, the signature sa_sigaction takes
    // without SA_SIGINFO, and callers pass only async-signal-safe handlers.
    let rc = unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(sig, &sa, std::ptr::null_mut())
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
