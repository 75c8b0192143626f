//! The CPUs a running Linux kernel has, read from its own variables: how
//! many CPU numbers it may ever use (`nr_cpu_ids`) and which of them are
//! possible and online (`__cpu_possible_mask`, `__cpu_online_mask`).
//!
//! Not the hypervisor's vCPU count: a guest booted with `nosmp`,
//! `maxcpus=`, `nr_cpus=` or `possible_cpus=`, one with a CPU taken
//! offline, or one that finds fewer CPUs than QEMU runs, uses other numbers.
//! Every CPU number the kernel gives a running CPU is a possible CPU's, and
//! below `nr_cpu_ids` (include/linux/cpumask.h; x86 sets both from its MP
//! table or ACPI MADT, counting hot-pluggable CPUs as possible:
//! arch/x86/kernel/smpboot.c `prefill_possible_map`). The per-CPU areas are
//! set up for the possible CPUs only (`setup_per_cpu_areas`); another CPU's
//! `__per_cpu_offset` entry points at the boot-time template, which the
//! kernel frees after boot (it then reads 0xcc bytes, `free_initmem`).

use vmm::gva::{AddressSpace, GvaError};

use super::kaslr::KernelOffset;
use super::symbols::KernelImage;

/// `unsigned int nr_cpu_ids` (kernel/smp.c; a constant 1 in a kernel
/// built with `NR_CPUS=1`, which has no symbol).
pub const NR_CPU_IDS: &str = "nr_cpu_ids";
/// `struct cpumask __cpu_possible_mask` (kernel/cpu.c): a bitmap of
/// `NR_CPUS` bits in longs, its size the symbol's.
pub const POSSIBLE_MASK: &str = "__cpu_possible_mask";
pub const ONLINE_MASK: &str = "__cpu_online_mask";
/// Most CPUs read from a mask: x86's `NR_CPUS` is at most 8192
/// (arch/x86/Kconfig `NR_CPUS_RANGE_END` with MAXSMP).
pub const MOST_CPUS: usize = 8192;

#[derive(Debug, thiserror::Error)]
pub enum CpusError {
    #[error("cannot read the guest's {what} at {va:#x}: {source}")]
    Read {
        what: &'static str,
        va: u64,
        source: GvaError,
    },
    #[error("the guest's nr_cpu_ids reads {ids} (its CPU masks hold {bits} CPUs): the symbols do not describe this kernel; pass the vmlinux of this very build")]
    BadCount { ids: u32, bits: usize },
    #[error("the guest's possible CPUs ({possible}) are not within its nr_cpu_ids ({ids}), or lack CPU 0: the symbols do not describe this kernel; pass the vmlinux of this very build")]
    BadMask { possible: String, ids: usize },
}

/// The guest kernel's CPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestCpus {
    /// CPU numbers are below this.
    pub nr_cpu_ids: usize,
    possible: Vec<bool>,
    online: Vec<bool>,
}

impl GuestCpus {
    /// From the kernel's variables: `nr_cpu_ids` and the two masks, one
    /// bool per CPU number.
    pub fn new(nr_cpu_ids: usize, possible: Vec<bool>, online: Vec<bool>) -> GuestCpus {
        GuestCpus {
            nr_cpu_ids,
            possible,
            online,
        }
    }

    /// Read from the kernel running at `off`, through `space`; None when
    /// the symbols lack one of the variables (then nothing is known beyond
    /// the hypervisor's vCPUs). Refused when what it reads cannot be this
    /// kernel's (a count beyond its masks, a possible CPU past it, no CPU 0).
    pub fn read(
        space: &mut AddressSpace<'_>,
        image: &KernelImage,
        off: KernelOffset,
    ) -> Result<Option<GuestCpus>, CpusError> {
        let (Some(ids), Some(possible), Some(online)) = (
            image.symbol(NR_CPU_IDS),
            image.symbol(POSSIBLE_MASK),
            image.symbol(ONLINE_MASK),
        ) else {
            return Ok(None);
        };
        let va = off.runtime(ids.addr);
        let ids = space
            .read_array::<4>(va)
            .map(u32::from_le_bytes)
            .map_err(|source| CpusError::Read {
                what: NR_CPU_IDS,
                va,
                source,
            })?;
        let possible = read_mask(
            space,
            off.runtime(possible.addr),
            possible.size,
            POSSIBLE_MASK,
        )?;
        let online = read_mask(space, off.runtime(online.addr), online.size, ONLINE_MASK)?;
        let bits = possible.len().min(online.len());
        if ids == 0 || ids as usize > bits {
            return Err(CpusError::BadCount { ids, bits });
        }
        let cpus = GuestCpus::new(ids as usize, possible, online);
        let beyond = cpus.possible.iter().skip(cpus.nr_cpu_ids).any(|&p| p);
        if beyond || !cpus.possible(0) {
            return Err(CpusError::BadMask {
                possible: cpus.list(&cpus.possible),
                ids: cpus.nr_cpu_ids,
            });
        }
        Ok(Some(cpus))
    }

    /// Can CPU `cpu` ever run this kernel (its per-CPU area is set up)?
    pub fn possible(&self, cpu: usize) -> bool {
        cpu < self.nr_cpu_ids && self.possible.get(cpu) == Some(&true)
    }

    /// Does CPU `cpu` run the kernel now?
    pub fn online(&self, cpu: usize) -> bool {
        self.possible(cpu) && self.online.get(cpu) == Some(&true)
    }

    /// The possible CPUs, as the kernel prints a CPU list ("0-1,4").
    pub fn possible_list(&self) -> String {
        self.list(&self.possible)
    }

    /// The online CPUs, likewise.
    pub fn online_list(&self) -> String {
        self.list(&self.online)
    }

    fn list(&self, mask: &[bool]) -> String {
        let mut out: Vec<String> = Vec::new();
        let mut i = 0;
        while i < mask.len() {
            if !mask[i] {
                i += 1;
                continue;
            }
            let start = i;
            while i + 1 < mask.len() && mask[i + 1] {
                i += 1;
            }
            out.push(match start == i {
                true => start.to_string(),
                false => format!("{start}-{i}"),
            });
            i += 1;
        }
        match out.is_empty() {
            true => "none".into(),
            false => out.join(","),
        }
    }
}

/// A `struct cpumask` of `size` bytes at `va`: one bool per CPU (at most
/// `MOST_CPUS`), bit i of the little-endian longs for CPU i.
fn read_mask(
    space: &mut AddressSpace<'_>,
    va: u64,
    size: u64,
    what: &'static str,
) -> Result<Vec<bool>, CpusError> {
    // A symbol without a size (kallsyms) is one long: NR_CPUS <= 64.
    let len = match size {
        0 => 8,
        n => (n as usize).min(MOST_CPUS / 8),
    };
    let mut bytes = vec![0u8; len];
    space
        .read(va, &mut bytes)
        .map_err(|source| CpusError::Read { what, va, source })?;
    Ok((0..len * 8)
        .map(|i| bytes[i / 8] & (1 << (i % 8)) != 0)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mask(bits: &[usize], n: usize) -> Vec<bool> {
        (0..n).map(|i| bits.contains(&i)).collect()
    }

    #[test]
    fn cpus_are_the_kernels_possible_and_online_ones() {
        // `-smp 2` and `maxcpus=1`: both possible, CPU 1 offline.
        let c = GuestCpus::new(2, mask(&[0, 1], 64), mask(&[0], 64));
        assert!(c.possible(1) && !c.online(1) && c.online(0));
        assert!(!c.possible(2));
        assert_eq!(
            (c.possible_list(), c.online_list()),
            ("0-1".into(), "0".into())
        );
        // `nosmp`: one CPU number.
        let c = GuestCpus::new(1, mask(&[0], 64), mask(&[0], 64));
        assert!(!c.possible(1));
        let c = GuestCpus::new(8, mask(&[0, 1, 2, 5, 6, 7], 64), mask(&[], 64));
        assert_eq!(c.possible_list(), "0-2,5-7");
        assert_eq!(c.online_list(), "none");
    }
}
