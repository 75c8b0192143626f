//! The rate of a QEMU guest's TSC when its kernel does not know it.
//!
//! QEMU gives its guests the host's TSC, offset: under TCG `rdtsc` reads
//! the host's TSC plus an offset (target/i386 `helper_rdtsc`, through
//! `cpu_get_ticks`), and under KVM the guest's TSC runs at the host's rate
//! unless QEMU was told another (`-cpu ...,tsc-frequency=`, which a kernel
//! then calibrates to). A kernel that found no usable TSC (TCG's is not
//! invariant) leaves its `tsc_khz` at 0: the host's rate is the guest's.

use std::time::{Duration, Instant};

/// How long the host's TSC is timed against the monotonic clock: long
/// enough for a rate within 0.1%, short enough to go unnoticed.
const SPAN: Duration = Duration::from_millis(20);

fn rdtsc() -> u64 {
    // SAFETY: `rdtsc` reads the time-stamp counter; it has no memory
    // effects and every x86-64 CPU has it.
    unsafe { std::arch::x86_64::_rdtsc() }
}

/// The host's TSC rate in kHz, timed over `SPAN`.
pub fn host_tsc_khz() -> u32 {
    let (t0, c0) = (Instant::now(), rdtsc());
    while t0.elapsed() < SPAN {
        std::hint::spin_loop();
    }
    let (ns, ticks) = (t0.elapsed().as_nanos(), rdtsc().wrapping_sub(c0));
    // ticks per ns * 1e6 = kHz.
    (u128::from(ticks) * 1_000_000 / ns.max(1)).min(u128::from(u32::MAX)) as u32
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_host_tsc_ticks_at_a_plausible_rate() {
        // Any x86-64 host since 2005: 0.5 to 10 GHz.
        let khz = super::host_tsc_khz();
        assert!((500_000..10_000_000).contains(&khz), "{khz} kHz");
    }
}
