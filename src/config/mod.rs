//! Every option checked once, before any VM exists: each command's arguments
//! become one checked configuration (`RunConfig`, `ReportConfig`,
//! `ScriptConfig`, `ListConfig`, `BenchConfig`), or a one-line error. The
//! commands only carry them out.

mod bench;
mod list;
mod modules;
mod output;
mod report;
mod run;
mod trace;

use std::time::Duration;

use vmm::VmSize;

use crate::error::InputError;

pub use bench::BenchConfig;
pub use list::{image as kernel_image, ListConfig};
pub(crate) use modules::{say_unread, take_waiting};
pub use output::{Export, Output, View};
pub use report::{ReportConfig, ScriptConfig};
pub use run::{Form, RunConfig, TraceConfig};

/// `--cpus`, for the run and the bench alike.
pub fn check_cpus(n: u64) -> Result<u64, InputError> {
    Ok(VmSize::check_cpus(n)?)
}

/// The longest `--timeout` or `--duration`: 365 days. Far beyond any
/// trace, far below what `Duration` and `Instant` arithmetic can hold.
pub const MAX_SECS: u64 = 365 * 24 * 3600;

/// A positive, finite number of seconds given with `flag`, at most [`MAX_SECS`].
pub fn secs(v: Option<f64>, flag: &'static str) -> Result<Option<Duration>, InputError> {
    match v {
        None => Ok(None),
        Some(value) if value.is_finite() && value > MAX_SECS as f64 => {
            Err(InputError::SecondsTooLong {
                flag,
                value,
                max: MAX_SECS,
            })
        }
        Some(s) if s.is_finite() && s > 0.0 => Ok(Some(Duration::from_secs_f64(s))),
        Some(value) => Err(InputError::Seconds { flag, value }),
    }
}

/// A size in bytes as `--buffer` and `--overwrite` take it: a number with
/// an optional binary suffix K, M, G (KiB, MiB, GiB; `B` allowed after
/// it), at least `min` bytes and at most 1 TiB.
pub fn size(value: &str, flag: &'static str, min: u64) -> Result<u64, InputError> {
    const MAX: u64 = 1 << 40;
    let err = |why: String| InputError::Size {
        flag,
        value: value.to_string(),
        why,
    };
    let t = value.trim();
    let t = t
        .strip_suffix(['B', 'b'])
        .filter(|r| r.ends_with(|c: char| c.is_ascii_alphabetic()))
        .unwrap_or(t);
    let (digits, shift) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 10),
        Some((i, 'm' | 'M')) => (&t[..i], 20),
        Some((i, 'g' | 'G')) => (&t[..i], 30),
        _ => (t, 0),
    };
    let n: u64 = digits.parse().map_err(|_| err("not a size".to_string()))?;
    let bytes = n
        .checked_mul(1 << shift)
        .filter(|&b| b <= MAX)
        .ok_or_else(|| err("more than 1 TiB".to_string()))?;
    if bytes < min {
        return Err(err(format!("less than {min} bytes")));
    }
    Ok(bytes)
}

/// A count that must be at least 1.
pub fn at_least_one<T: Copy + Default + PartialEq>(
    v: T,
    flag: &'static str,
) -> Result<T, InputError> {
    if v == T::default() {
        return Err(InputError::Zero { flag });
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_must_be_positive_and_finite() {
        assert_eq!(
            secs(Some(1.5), "--timeout").unwrap(),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(secs(None, "--timeout").unwrap(), None);
        for bad in [0.0, -3.0, f64::NAN, f64::INFINITY] {
            let e = secs(Some(bad), "--duration").unwrap_err().to_string();
            assert!(e.starts_with("--duration "), "{e}");
        }
        // Too long for Duration (1e20, 1e300) or for Instant arithmetic (1e19).
        for big in [1e300, 1e20, 1e19, MAX_SECS as f64 + 1.0] {
            let e = secs(Some(big), "--timeout").unwrap_err().to_string();
            assert!(e.starts_with("--timeout "), "{e}");
            assert!(e.contains("at most 31536000 seconds"), "{e}");
        }
        assert_eq!(
            secs(Some(1e300), "--timeout").unwrap_err().to_string(),
            "--timeout 1e300 is too long; use at most 31536000 seconds (365 days)"
        );
        assert_eq!(
            secs(Some(MAX_SECS as f64), "--duration").unwrap(),
            Some(Duration::from_secs(MAX_SECS))
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(size("64M", "--buffer", 1).unwrap(), 64 << 20);
        assert_eq!(size("512k", "--buffer", 1).unwrap(), 512 << 10);
        assert_eq!(size("1GB", "--buffer", 1).unwrap(), 1 << 30);
        assert_eq!(size("4096", "--buffer", 1).unwrap(), 4096);
        for bad in ["", "M", "x1", "-1M", "1.5M", "2T", "2000G"] {
            let e = size(bad, "--overwrite", 1).unwrap_err().to_string();
            assert!(e.starts_with("--overwrite "), "{e}");
            assert!(e.contains("64M"), "{e}");
        }
        assert!(size("16", "--overwrite", 32)
            .unwrap_err()
            .to_string()
            .contains("less than 32"));
    }

    #[test]
    fn cpu_and_memory_ranges() {
        assert!(check_cpus(1).is_ok() && check_cpus(64).is_ok());
        assert_eq!(
            check_cpus(65).unwrap_err().to_string(),
            "--cpus 65 is out of range; use 1 to 64"
        );
        assert!(check_cpus(0).is_err());
        assert!(
            VmSize::check_mem(32).is_ok()
                && VmSize::check_mem(31).is_err()
                && VmSize::check_mem(99_999).is_err()
        );
        assert_eq!(at_least_one(3u64, "--iters").unwrap(), 3);
        assert_eq!(
            at_least_one(0usize, "--rounds").unwrap_err().to_string(),
            "--rounds must be at least 1"
        );
    }
}
