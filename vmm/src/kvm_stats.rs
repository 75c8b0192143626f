//! KVM's own per-vCPU counters, read from its binary statistics
//! (`KVM_GET_STATS_FD`, Linux 5.14+, `KVM_CAP_BINARY_STATS_FD`):
//! `insn_emulation`, the instructions KVM's instruction emulator ran for the
//! vCPU, and `exits`, every exit KVM took (including those it handles
//! without vmtrace ever seeing them).
//!
//! What `insn_emulation` means depends on the host. Where KVM runs guest
//! ring 0 in its emulator (nested `kvm_pvm`, see docs/emulating-kvm.md), it
//! counts every guest kernel instruction exactly (a ring-0 loop of 1,000
//! `dec` + `jnz` after a `mov`, then `out` and `hlt`, counts 2,003). On
//! hardware-virtualized KVM it counts only the rare instructions KVM
//! emulates (MMIO, some port I/O): near 0, not the guest's instructions.
//! Whoever uses it must say "counted by KVM's emulator" and check the count
//! means something (`vmtrace bench` checks its calibration loop).
//!
//! Each vCPU's stats file is opened when the vCPU is created, before its fd
//! moves to its thread; the file is read with `pread` and so from any
//! thread, at any time (the values of a vCPU out of KVM_RUN are final).
//! The file holds its own reference to the VM: reading after the vCPU
//! threads ended is fine.
//!
//! The file's layout (Documentation/virt/kvm/api.rst, "KVM_GET_STATS_FD"):
//! a `kvm_stats_header` at 0; `num_desc` descriptors at `desc_offset`, each
//! a `kvm_stats_desc` followed by its NUL-terminated name in `name_size`
//! bytes; the values, u64s, at `data_offset` + the descriptor's `offset`
//! (bytes), `size` of them.

use std::fs::File;
use std::mem::{offset_of, size_of};
use std::os::fd::FromRawFd;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use kvm_bindings::{
    kvm_stats_desc, kvm_stats_header, KVMIO, KVM_CAP_BINARY_STATS_FD, KVM_STATS_TYPE_CUMULATIVE,
    KVM_STATS_TYPE_MASK,
};
use kvm_ioctls::{Kvm, VcpuFd};

vmm_sys_util::ioctl_io_nr!(KVM_GET_STATS_FD, KVMIO, 0xce);

/// The statistic counting the instructions KVM's emulator ran.
pub const INSN_EMULATION: &str = "insn_emulation";
/// The statistic counting every exit KVM took for the vCPU.
pub const EXITS: &str = "exits";

/// Bytes of the header and of a descriptor without its name.
const HEADER_LEN: usize = size_of::<kvm_stats_header>();
const DESC_LEN: usize = size_of::<kvm_stats_desc>();
/// More descriptors, or longer names, than any KVM has: a corrupt header.
const MAX_DESCS: u32 = 4096;
const MAX_NAME_SIZE: u32 = 4096;

#[derive(Debug, thiserror::Error)]
pub enum KvmStatsError {
    #[error("vCPU {cpu}: KVM_GET_STATS_FD failed: {source}")]
    Open { cpu: usize, source: std::io::Error },
    #[error("vCPU {cpu}: cannot read KVM's statistics ({what}): {source}")]
    Read {
        cpu: usize,
        what: &'static str,
        source: std::io::Error,
    },
    #[error("vCPU {cpu}: KVM's statistics file is not as documented: {detail}")]
    Malformed { cpu: usize, detail: String },
}

/// The fields of `kvm_stats_header` vmtrace uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Bytes of each descriptor's name, its NUL included.
    pub name_size: u32,
    pub num_desc: u32,
    pub desc_offset: u32,
    pub data_offset: u32,
}

/// One statistic's descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Descriptor {
    pub name: String,
    /// Type, unit and base (`KVM_STATS_*`).
    pub flags: u32,
    /// How many u64 values.
    pub size: u16,
    /// Bytes from the data block's start.
    pub offset: u32,
}

impl Descriptor {
    /// A single cumulative count (as `insn_emulation` and `exits` are).
    fn is_counter(&self) -> bool {
        self.flags & KVM_STATS_TYPE_MASK == KVM_STATS_TYPE_CUMULATIVE && self.size >= 1
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}

/// The header at the start of a stats file.
pub fn parse_header(b: &[u8]) -> Result<Header, String> {
    if b.len() < HEADER_LEN {
        return Err(format!("the header is {} bytes, not {HEADER_LEN}", b.len()));
    }
    let h = Header {
        name_size: u32_at(b, offset_of!(kvm_stats_header, name_size)),
        num_desc: u32_at(b, offset_of!(kvm_stats_header, num_desc)),
        desc_offset: u32_at(b, offset_of!(kvm_stats_header, desc_offset)),
        data_offset: u32_at(b, offset_of!(kvm_stats_header, data_offset)),
    };
    if h.name_size == 0 || h.name_size > MAX_NAME_SIZE {
        return Err(format!("name size {}", h.name_size));
    }
    if h.num_desc > MAX_DESCS {
        return Err(format!("{} descriptors", h.num_desc));
    }
    Ok(h)
}

/// Bytes of the descriptor block `h` describes.
fn descriptors_len(h: &Header) -> usize {
    (DESC_LEN + h.name_size as usize) * h.num_desc as usize
}

/// The descriptors of the block `b` (read at `h.desc_offset`).
pub fn parse_descriptors(b: &[u8], h: &Header) -> Result<Vec<Descriptor>, String> {
    let stride = DESC_LEN + h.name_size as usize;
    if b.len() < descriptors_len(h) {
        return Err(format!(
            "{} descriptors need {} bytes, the block has {}",
            h.num_desc,
            descriptors_len(h),
            b.len()
        ));
    }
    (0..h.num_desc as usize)
        .map(|i| {
            let d = &b[i * stride..(i + 1) * stride];
            let name = &d[DESC_LEN..];
            let end = name
                .iter()
                .position(|&c| c == 0)
                .ok_or_else(|| format!("descriptor {i}'s name has no NUL"))?;
            Ok(Descriptor {
                name: String::from_utf8_lossy(&name[..end]).into_owned(),
                flags: u32_at(d, offset_of!(kvm_stats_desc, flags)),
                size: u16_at(d, offset_of!(kvm_stats_desc, size)),
                offset: u32_at(d, offset_of!(kvm_stats_desc, offset)),
            })
        })
        .collect()
}

/// Where the counter `name` is in the data block (bytes), if the
/// descriptors have it as a cumulative count.
pub fn counter_offset(descs: &[Descriptor], name: &str) -> Option<u32> {
    descs
        .iter()
        .find(|d| d.name == name && d.is_counter())
        .map(|d| d.offset)
}

/// One vCPU's counts at one moment; None: KVM does not keep it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvmCounts {
    /// Instructions KVM's emulator ran (`insn_emulation`).
    pub insn_emulation: Option<u64>,
    /// Exits KVM took (`exits`).
    pub exits: Option<u64>,
}

/// Every vCPU's emulated instructions, or None unless each has the count.
pub fn instructions(counts: &[KvmCounts]) -> Option<Vec<u64>> {
    if counts.is_empty() {
        return None;
    }
    counts.iter().map(|c| c.insn_emulation).collect()
}

/// One vCPU's open stats file and where its counters are.
#[derive(Debug)]
pub struct VcpuKvmStats {
    cpu: usize,
    file: File,
    data_offset: u64,
    insn_emulation: Option<u32>,
    exits: Option<u32>,
}

impl VcpuKvmStats {
    /// Open vCPU `cpu`'s stats file: None if this KVM has none
    /// (no KVM_CAP_BINARY_STATS_FD) or keeps neither counter.
    pub fn open(kvm: &Kvm, vcpu: &VcpuFd, cpu: usize) -> Result<Option<Self>, KvmStatsError> {
        if kvm.check_extension_raw(libc::c_ulong::from(KVM_CAP_BINARY_STATS_FD)) <= 0 {
            return Ok(None);
        }
        // SAFETY: KVM_GET_STATS_FD takes no argument and only returns a new
        // file descriptor (or -1); `vcpu` is a live vCPU fd.
        let fd = unsafe { vmm_sys_util::ioctl::ioctl(vcpu, KVM_GET_STATS_FD()) };
        if fd < 0 {
            let source = std::io::Error::last_os_error();
            return match source.raw_os_error() {
                // A kernel without the ioctl for vCPUs.
                Some(libc::ENOTTY | libc::EINVAL) => Ok(None),
                _ => Err(KvmStatsError::Open { cpu, source }),
            };
        }
        // SAFETY: the kernel just returned `fd`, a new descriptor nothing
        // else owns; the File closes it.
        let file = unsafe { File::from_raw_fd(fd) };
        Self::from_file(file, cpu)
    }

    /// A stats file already open (the tests' are ordinary files).
    pub fn from_file(file: File, cpu: usize) -> Result<Option<Self>, KvmStatsError> {
        let read = |what, len: usize, at: u64| -> Result<Vec<u8>, KvmStatsError> {
            let mut b = vec![0u8; len];
            file.read_exact_at(&mut b, at)
                .map_err(|source| KvmStatsError::Read { cpu, what, source })?;
            Ok(b)
        };
        let malformed = |detail| KvmStatsError::Malformed { cpu, detail };
        let header = parse_header(&read("header", HEADER_LEN, 0)?).map_err(malformed)?;
        let block = read(
            "descriptors",
            descriptors_len(&header),
            u64::from(header.desc_offset),
        )?;
        let descs = parse_descriptors(&block, &header).map_err(malformed)?;
        let insn_emulation = counter_offset(&descs, INSN_EMULATION);
        let exits = counter_offset(&descs, EXITS);
        if insn_emulation.is_none() && exits.is_none() {
            return Ok(None);
        }
        let stats = VcpuKvmStats {
            cpu,
            file,
            data_offset: u64::from(header.data_offset),
            insn_emulation,
            exits,
        };
        // Once now: a file whose values cannot be read fails here, not later.
        stats.read()?;
        Ok(Some(stats))
    }

    /// The counts now: one `pread` of the data block up to the last of them.
    pub fn read(&self) -> Result<KvmCounts, KvmStatsError> {
        let offsets = [self.insn_emulation, self.exits];
        let len = offsets.iter().flatten().map(|&o| o as usize + 8).max();
        let Some(len) = len else {
            return Ok(KvmCounts::default());
        };
        let mut b = vec![0u8; len];
        self.file
            .read_exact_at(&mut b, self.data_offset)
            .map_err(|source| KvmStatsError::Read {
                cpu: self.cpu,
                what: "values",
                source,
            })?;
        let value = |o: Option<u32>| {
            o.map(|o| {
                let o = o as usize;
                u64::from_ne_bytes(b[o..o + 8].try_into().expect("8 bytes"))
            })
        };
        Ok(KvmCounts {
            insn_emulation: value(self.insn_emulation),
            exits: value(self.exits),
        })
    }
}

/// Every vCPU's stats file (None for a vCPU without one), shared: clone it
/// to read from another thread.
#[derive(Clone, Debug, Default)]
pub struct KvmStats(Arc<[Option<VcpuKvmStats>]>);

impl KvmStats {
    pub fn new(vcpus: Vec<Option<VcpuKvmStats>>) -> Self {
        KvmStats(vcpus.into())
    }

    /// Each vCPU's counts now, in vCPU order.
    pub fn read(&self) -> Result<Vec<KvmCounts>, KvmStatsError> {
        self.0
            .iter()
            .map(|s| s.as_ref().map_or(Ok(KvmCounts::default()), |s| s.read()))
            .collect()
    }

    /// Each vCPU's emulated instructions now; None unless KVM counts them
    /// for every vCPU.
    pub fn instructions(&self) -> Result<Option<Vec<u64>>, KvmStatsError> {
        Ok(instructions(&self.read()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_bindings::{KVM_STATS_TYPE_PEAK, KVM_STATS_UNIT_NONE};

    const NAME_SIZE: u32 = 48;

    /// A stats file as KVM lays it out: header, an id string, descriptors,
    /// then the values.
    fn stats_file(stats: &[(&str, u32, &[u64])]) -> Vec<u8> {
        let id_offset = HEADER_LEN as u32;
        let desc_offset = id_offset + NAME_SIZE;
        let stride = DESC_LEN + NAME_SIZE as usize;
        let data_offset = desc_offset + (stride * stats.len()) as u32;
        let mut b = Vec::new();
        for v in [
            0,
            NAME_SIZE,
            stats.len() as u32,
            id_offset,
            desc_offset,
            data_offset,
        ] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        b.resize(desc_offset as usize, 0);
        b[id_offset as usize..][..9].copy_from_slice(b"kvm-1/vc0");
        let mut offset = 0u32;
        for (name, flags, values) in stats {
            b.extend_from_slice(&flags.to_ne_bytes());
            b.extend_from_slice(&0i16.to_ne_bytes());
            b.extend_from_slice(&(values.len() as u16).to_ne_bytes());
            b.extend_from_slice(&offset.to_ne_bytes());
            b.extend_from_slice(&0u32.to_ne_bytes());
            let mut n = name.as_bytes().to_vec();
            n.resize(NAME_SIZE as usize, 0);
            b.extend_from_slice(&n);
            offset += 8 * values.len() as u32;
        }
        for (_, _, values) in stats {
            for v in *values {
                b.extend_from_slice(&v.to_ne_bytes());
            }
        }
        b
    }

    const COUNT: u32 = KVM_STATS_TYPE_CUMULATIVE | KVM_STATS_UNIT_NONE;

    fn typical() -> Vec<u8> {
        stats_file(&[
            ("halt_successful_poll", COUNT, &[7]),
            ("halt_poll_success_hist", 3, &[1, 2, 3, 4]),
            ("exits", COUNT, &[123_456]),
            ("insn_emulation", COUNT, &[2003]),
            ("guest_mode", KVM_STATS_TYPE_PEAK, &[1]),
        ])
    }

    #[test]
    fn descriptors_found_by_name() {
        let b = typical();
        let h = parse_header(&b).unwrap();
        assert_eq!(h.num_desc, 5);
        assert_eq!(h.name_size, NAME_SIZE);
        let descs = parse_descriptors(&b[h.desc_offset as usize..], &h).unwrap();
        let names: Vec<&str> = descs.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "halt_successful_poll",
                "halt_poll_success_hist",
                "exits",
                "insn_emulation",
                "guest_mode"
            ]
        );
        assert_eq!(descs[1].size, 4);
        // After the 1 + 4 values before them, in bytes.
        assert_eq!(counter_offset(&descs, EXITS), Some(40));
        assert_eq!(counter_offset(&descs, INSN_EMULATION), Some(48));
        assert_eq!(counter_offset(&descs, "nonexistent"), None);
        // Not a cumulative count: not a counter.
        assert_eq!(counter_offset(&descs, "guest_mode"), None);
        assert_eq!(counter_offset(&descs, "halt_poll_success_hist"), None);
        let at = |o: u32| {
            let o = h.data_offset as usize + o as usize;
            u64::from_ne_bytes(b[o..o + 8].try_into().unwrap())
        };
        assert_eq!(at(48), 2003);
        assert_eq!(at(40), 123_456);
    }

    #[test]
    fn malformed_headers_and_descriptors_are_refused() {
        let b = typical();
        assert!(parse_header(&b[..HEADER_LEN - 1])
            .unwrap_err()
            .contains("header is 23 bytes"));
        let mut bad = b.clone();
        bad[4..8].copy_from_slice(&0u32.to_ne_bytes());
        assert!(parse_header(&bad).unwrap_err().contains("name size 0"));
        let mut bad = b.clone();
        bad[8..12].copy_from_slice(&100_000u32.to_ne_bytes());
        assert!(parse_header(&bad)
            .unwrap_err()
            .contains("100000 descriptors"));
        let h = parse_header(&b).unwrap();
        let block = &b[h.desc_offset as usize..h.data_offset as usize];
        let e = parse_descriptors(&block[..block.len() - 1], &h).unwrap_err();
        assert!(e.contains("need 320 bytes, the block has 319"), "{e}");
        // A name filling its whole field, no NUL.
        let mut bad = block.to_vec();
        bad[DESC_LEN..DESC_LEN + NAME_SIZE as usize].fill(b'x');
        let e = parse_descriptors(&bad, &h).unwrap_err();
        assert!(e.contains("descriptor 0's name has no NUL"), "{e}");
    }

    fn file_of(bytes: &[u8], name: &str) -> File {
        let path =
            std::env::temp_dir().join(format!("vmm-kvm-stats-{name}-{}.bin", std::process::id()));
        std::fs::write(&path, bytes).unwrap();
        let f = File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        f
    }

    #[test]
    fn counts_read_from_a_file() {
        let s = VcpuKvmStats::from_file(file_of(&typical(), "typical"), 0)
            .unwrap()
            .unwrap();
        let c = s.read().unwrap();
        assert_eq!(c.insn_emulation, Some(2003));
        assert_eq!(c.exits, Some(123_456));
        let all = KvmStats::new(vec![Some(s), None]);
        let counts = all.read().unwrap();
        assert_eq!(counts[1], KvmCounts::default());
        // One vCPU without the count: no total.
        assert_eq!(all.instructions().unwrap(), None);
        assert_eq!(instructions(&counts[..1]), Some(vec![2003]));
        assert_eq!(instructions(&[]), None);
    }

    #[test]
    fn a_kvm_without_the_counters_has_none() {
        // Only exits: instructions unknown, not an error.
        let b = stats_file(&[("exits", COUNT, &[5])]);
        let s = VcpuKvmStats::from_file(file_of(&b, "exits"), 1)
            .unwrap()
            .unwrap();
        assert_eq!(
            s.read().unwrap(),
            KvmCounts {
                insn_emulation: None,
                exits: Some(5)
            }
        );
        // Neither: no stats for the vCPU.
        let b = stats_file(&[("halt_exits", COUNT, &[5])]);
        assert!(VcpuKvmStats::from_file(file_of(&b, "none"), 1)
            .unwrap()
            .is_none());
        // A file cut before its values is an error, said with the vCPU.
        let b = typical();
        // (insn_emulation's value is the last but one.)
        let cut = &b[..b.len() - 16];
        let e = VcpuKvmStats::from_file(file_of(cut, "cut"), 3).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("vCPU 3: cannot read KVM's statistics (values)"),
            "{e}"
        );
    }
}
