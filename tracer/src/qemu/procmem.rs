//! A running QEMU's guest RAM, read and written through /proc/PID/mem at
//! the host addresses the monitor gave (`layout::RamRange`), while the guest
//! runs: no stop, no gdbstub round trip.
//!
//! pread/pwrite on one open file: no shared state, so a `ProcRam` is used
//! from several threads at once. Writes here bypass QEMU: under TCG a write
//! to guest code leaves stale translations, so code goes through the
//! gdbstub; this is for data (rings).

use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use super::layout::RamRange;

/// An error of guest RAM access, naming the process and the address.
#[derive(Debug, thiserror::Error)]
pub enum ProcMemError {
    #[error(
        "cannot open {path}: permission denied (reading another process's memory needs root \
         or CAP_SYS_PTRACE{scope})"
    )]
    Permission { path: PathBuf, scope: String },
    #[error("cannot open {path}: no such process (QEMU has exited)")]
    NoProcess { path: PathBuf },
    #[error("cannot open {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: the process has exited (QEMU is gone)")]
    Gone { path: PathBuf },
    #[error("guest-physical address {gpa:#x} is not in guest RAM")]
    Unmapped { gpa: u64 },
    #[error("guest-physical address {gpa:#x} is not {align}-byte aligned")]
    Unaligned { gpa: u64, align: u64 },
    #[error("{op} of {len} bytes at guest-physical {gpa:#x} (host {hva:#x}) in {path}: {source}")]
    Access {
        op: &'static str,
        len: usize,
        gpa: u64,
        hva: u64,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Guest RAM of a QEMU process through /proc/PID/mem.
pub struct ProcRam {
    pid: u32,
    path: PathBuf,
    file: File,
    ranges: Vec<RamRange>,
}

impl ProcRam {
    /// Opens /proc/`pid`/mem for reading and writing over `ranges`.
    pub fn open(pid: u32, ranges: &[RamRange]) -> Result<ProcRam, ProcMemError> {
        let path = PathBuf::from(format!("/proc/{pid}/mem"));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|source| match source.kind() {
                ErrorKind::PermissionDenied => ProcMemError::Permission {
                    path: path.clone(),
                    scope: ptrace_scope(),
                },
                ErrorKind::NotFound => ProcMemError::NoProcess { path: path.clone() },
                _ => ProcMemError::Open {
                    path: path.clone(),
                    source,
                },
            })?;
        let mut ranges = ranges.to_vec();
        ranges.sort_by_key(|r| r.gpa);
        Ok(ProcRam {
            pid,
            path,
            file,
            ranges,
        })
    }

    /// The QEMU process's id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The guest RAM ranges, by address.
    pub fn ranges(&self) -> &[RamRange] {
        &self.ranges
    }

    /// The range holding `gpa`, and the host address of `gpa`.
    fn find(&self, gpa: u64) -> Result<(&RamRange, u64), ProcMemError> {
        self.ranges
            .iter()
            .find_map(|r| r.hva_of(gpa).map(|h| (r, h)))
            .ok_or(ProcMemError::Unmapped { gpa })
    }

    /// Splits `[gpa, gpa + len)` over the ranges: (offset in the buffer,
    /// host address, length) for each piece.
    fn pieces(&self, gpa: u64, len: usize) -> Result<Vec<(usize, u64, usize)>, ProcMemError> {
        let mut out = Vec::new();
        let mut done = 0usize;
        while done < len {
            let at = gpa + done as u64;
            let (r, hva) = self.find(at)?;
            let left = (r.gpa + r.len - at).min((len - done) as u64) as usize;
            out.push((done, hva, left));
            done += left;
        }
        Ok(out)
    }

    fn access_error(
        &self,
        op: &'static str,
        len: usize,
        gpa: u64,
        hva: u64,
    ) -> impl Fn(std::io::Error) -> ProcMemError + '_ {
        move |source| {
            // A dead process's memory reads as end of file, or ESRCH.
            if source.kind() == ErrorKind::UnexpectedEof
                || source.raw_os_error() == Some(libc::ESRCH)
            {
                return ProcMemError::Gone {
                    path: self.path.clone(),
                };
            }
            ProcMemError::Access {
                op,
                len,
                gpa,
                hva,
                path: self.path.clone(),
                source,
            }
        }
    }

    /// Reads guest-physical `[gpa, gpa + buf.len())`.
    pub fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), ProcMemError> {
        for (off, hva, len) in self.pieces(gpa, buf.len())? {
            let at = gpa + off as u64;
            self.file
                .read_exact_at(&mut buf[off..off + len], hva)
                .map_err(self.access_error("read", len, at, hva))?;
        }
        Ok(())
    }

    /// Writes `data` at guest-physical `gpa`.
    pub fn write(&self, gpa: u64, data: &[u8]) -> Result<(), ProcMemError> {
        for (off, hva, len) in self.pieces(gpa, data.len())? {
            let at = gpa + off as u64;
            self.file
                .write_all_at(&data[off..off + len], hva)
                .map_err(self.access_error("write", len, at, hva))?;
        }
        Ok(())
    }

    /// One aligned pread of `N` bytes.
    fn load<const N: usize>(&self, gpa: u64) -> Result<[u8; N], ProcMemError> {
        let hva = self.aligned(gpa, N)?;
        let mut b = [0u8; N];
        let n = self
            .file
            .read_at(&mut b, hva)
            .map_err(self.access_error("read", N, gpa, hva))?;
        if n != N {
            return Err(self.access_error("read", N, gpa, hva)(short_io()));
        }
        Ok(b)
    }

    /// One aligned pwrite of `N` bytes.
    fn store<const N: usize>(&self, gpa: u64, b: [u8; N]) -> Result<(), ProcMemError> {
        let hva = self.aligned(gpa, N)?;
        let n = self
            .file
            .write_at(&b, hva)
            .map_err(self.access_error("write", N, gpa, hva))?;
        if n != N {
            return Err(self.access_error("write", N, gpa, hva)(short_io()));
        }
        Ok(())
    }

    fn aligned(&self, gpa: u64, n: usize) -> Result<u64, ProcMemError> {
        if !gpa.is_multiple_of(n as u64) {
            return Err(ProcMemError::Unaligned {
                gpa,
                align: n as u64,
            });
        }
        // Aligned and inside one range: ranges are page-granular.
        Ok(self.find(gpa)?.1)
    }

    pub fn load_u64(&self, gpa: u64) -> Result<u64, ProcMemError> {
        self.load::<8>(gpa).map(u64::from_le_bytes)
    }

    pub fn load_u32(&self, gpa: u64) -> Result<u32, ProcMemError> {
        self.load::<4>(gpa).map(u32::from_le_bytes)
    }

    pub fn store_u64(&self, gpa: u64, v: u64) -> Result<(), ProcMemError> {
        self.store(gpa, v.to_le_bytes())
    }

    pub fn store_u32(&self, gpa: u64, v: u32) -> Result<(), ProcMemError> {
        self.store(gpa, v.to_le_bytes())
    }
}

fn short_io() -> std::io::Error {
    std::io::Error::new(ErrorKind::UnexpectedEof, "short transfer")
}

/// What Yama adds to the permission needed.
fn ptrace_scope() -> String {
    match std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope") {
        // 1 and 2 yield to CAP_SYS_PTRACE; 3 to nothing until reboot.
        Ok(s) if s.trim() == "3" => {
            "; kernel.yama.ptrace_scope is 3, which forbids it even to root until reboot".into()
        }
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This process's own memory stands in for QEMU's.
    #[test]
    fn reads_and_writes_split_across_ranges() {
        let mut a = vec![0u8; 0x2000];
        let mut b = vec![0u8; 0x1000];
        let ranges = [
            RamRange {
                gpa: 0x1000,
                len: 0x2000,
                hva: a.as_mut_ptr() as u64,
                name: "a".into(),
            },
            RamRange {
                gpa: 0x3000,
                len: 0x1000,
                hva: b.as_mut_ptr() as u64,
                name: "b".into(),
            },
        ];
        let ram = ProcRam::open(std::process::id(), &ranges).unwrap();
        let data: Vec<u8> = (0..0x20u8).collect();
        ram.write(0x2ff0, &data).unwrap();
        let mut back = vec![0u8; 0x20];
        ram.read(0x2ff0, &mut back).unwrap();
        assert_eq!(back, data);
        ram.store_u64(0x3008, 0x1122_3344_5566_7788).unwrap();
        assert_eq!(ram.load_u64(0x3008).unwrap(), 0x1122_3344_5566_7788);
        assert_eq!(ram.load_u32(0x300c).unwrap(), 0x1122_3344);
        // SAFETY: volatile reads of our own buffers, which the writes above
        // changed behind the compiler's back through /proc/self/mem.
        let (last_a, first_b) = unsafe {
            (
                std::ptr::read_volatile(a.as_ptr().add(0x1fff)),
                std::ptr::read_volatile(b.as_ptr()),
            )
        };
        assert_eq!((last_a, first_b), (0x0f, 0x10));
        assert!(matches!(
            ram.read(0x3ff0, &mut back),
            Err(ProcMemError::Unmapped { gpa: 0x4000 })
        ));
        assert!(matches!(
            ram.load_u64(0x3004),
            Err(ProcMemError::Unaligned { gpa: 0x3004, .. })
        ));
        let e = ram.read(0x10, &mut back).unwrap_err().to_string();
        assert_eq!(e, "guest-physical address 0x10 is not in guest RAM");
    }

    #[test]
    fn is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<ProcRam>();
    }
}
