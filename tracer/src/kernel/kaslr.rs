//! Where a KASLR kernel really is: its virtual and physical offsets from the
//! addresses its vmlinux was linked at.
//!
//! A relocatable Linux kernel built with `CONFIG_RANDOMIZE_BASE` moves its
//! image at boot (arch/x86/boot/compressed/kaslr.c): to a random physical
//! slot, and to a random virtual address in the kernel's high mapping, both
//! in steps of `CONFIG_PHYSICAL_ALIGN` (2 MiB or a multiple). Every text and
//! data address then differs from the vmlinux by the virtual offset, and
//! every kernel-image byte from its link-time physical address
//! (`va - __START_KERNEL_map`) by the physical offset. Per-CPU symbols
//! (zero-based offsets on x86-64) do not move.
//!
//! Found under a pause, from the host alone:
//! - virtual: IA32_LSTAR (vCPU 0's `syscall` entry, which Linux's
//!   `syscall_init` sets to `entry_SYSCALL_64` early in `start_kernel`,
//!   before its `ftrace_init`) minus `entry_SYSCALL_64`'s link address;
//! - confirmed by reading `linux_banner` at its slid address through the
//!   guest's page tables and comparing it with the vmlinux's bytes;
//! - physical: where that walk ends, minus the banner's link-time physical
//!   address.
//!
//! A kernel that takes its events through FRED (Linux 6.9+, `CONFIG_X86_FRED`,
//! on by default from 6.12 where the CPU has it) never writes IA32_LSTAR
//! (`syscall_init` skips it: `syscall` enters through the FRED entry
//! point). While IA32_LSTAR is 0, the kernel's high mapping is searched
//! instead: `linux_banner` read at every 2 MiB step of the kernel image's
//! virtual area; the one step where the vmlinux's bytes are found is the
//! virtual offset, and the walk gives the physical one. With FRED on
//! (CR4.FRED) and no banner found, the attach fails with a message: the
//! offset would never become known.
//!
//! Without a pause (polling for the guest's `ftrace_init`), the physical
//! offset is guessed by looking for the banner's bytes in guest RAM at every
//! 2 MiB-aligned offset: a hint only, which the pause then checks.

use std::fmt;
use vmm::GuestRam;

use vm_memory::GuestAddress;
use vmm::gva::AddressSpace;
use vmm::Stopped;

use crate::advice::{join, Plain, Remedy, TracerAdvice, TracerWords};
use crate::kernel::symbols::KernelImage;

/// The kernel's 64-bit syscall entry (arch/x86/entry/entry_64.S), the
/// address Linux writes to IA32_LSTAR.
pub const SYSCALL_ENTRY: &str = "entry_SYSCALL_64";
/// "Linux version ..." (init/version.c): read back to confirm an offset.
pub const BANNER: &str = "linux_banner";
/// Bytes of the banner compared (it is longer; these already hold the
/// version, the builder and the build number).
const BANNER_CHECK_LEN: usize = 64;
/// Smallest step KASLR moves the kernel by on x86-64 (CONFIG_PHYSICAL_ALIGN
/// is 2 MiB or a multiple of it).
pub const KASLR_ALIGN: u64 = 2 << 20;
/// The end of the kernel image's virtual area: `__START_KERNEL_map` +
/// `KERNEL_IMAGE_SIZE` (1 GiB with KASLR; arch/x86/include/asm/page_64_types.h).
const KERNEL_IMAGE_END: u64 = 0xffff_ffff_c000_0000;
/// CR4.FRED (bit 32): the kernel takes its events through FRED, and so
/// never sets IA32_LSTAR.
const CR4_FRED: u64 = 1 << 32;
/// With page-table isolation the user half of a CR3 pair (bit 12 set) maps
/// no kernel data; its kernel partner is tried as well (see session.rs).
const PTI_USER_PGTABLE_BIT: u64 = 1 << 12;

/// How far the running kernel is from its link-time addresses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffset {
    /// Runtime virtual address minus link virtual address.
    pub virt: i64,
    /// Runtime physical address minus link physical address
    /// (`va - __START_KERNEL_map`).
    pub phys: i64,
}

impl KernelOffset {
    /// Where the vmlinux says: no KASLR, or `nokaslr`.
    pub const NONE: KernelOffset = KernelOffset { virt: 0, phys: 0 };

    /// The running address of link address `va`.
    pub fn runtime(self, va: u64) -> u64 {
        va.wrapping_add_signed(self.virt)
    }

    /// The link address of running address `va`.
    pub fn link(self, va: u64) -> u64 {
        va.wrapping_sub(self.virt as u64)
    }

    /// Guest-physical address of the kernel-image byte at link address `va`.
    pub fn phys_of(self, va: u64) -> Option<u64> {
        vmm::layout::kernel_virt_to_phys(va)?.checked_add_signed(self.phys)
    }

    pub fn is_none(self) -> bool {
        self == KernelOffset::NONE
    }
}

/// `+0x2c000000` / `-0x200000`: offsets read best signed.
fn signed_hex(v: i64) -> String {
    if v < 0 {
        format!("-{:#x}", v.unsigned_abs())
    } else {
        format!("+{v:#x}")
    }
}

impl fmt::Display for KernelOffset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "virtual {}, physical {}",
            signed_hex(self.virt),
            signed_hex(self.phys)
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum KaslrError {
    #[error("{}", self.say(&Plain))]
    BadEntry {
        lstar: u64,
        entry: u64,
        path: String,
        why: &'static str,
    },
    #[error("{}", self.say(&Plain))]
    BannerMismatch {
        path: String,
        offset: KernelOffset,
        va: u64,
        found: String,
        expected: String,
    },
    #[error("{BANNER} at {va:#x} is not mapped in any vCPU's page tables ({why})")]
    BannerUnmapped { va: u64, why: String },
    #[error("{}", self.say(&Plain))]
    Fred { why: String },
}

impl TracerAdvice for KaslrError {
    fn problem(&self, _: &dyn TracerWords) -> String {
        match self {
            KaslrError::BadEntry {
                lstar,
                entry,
                path,
                why,
            } => format!(
                "the guest's syscall entry (IA32_LSTAR) is {lstar:#x}, {why} than {SYSCALL_ENTRY} \
                 ({entry:#x}) in {path}: the symbols are not this kernel's"
            ),
            KaslrError::BannerMismatch {
                path,
                offset,
                va,
                found,
                expected,
            } => format!(
                "{path} does not match the running kernel: with the kernel's offset from its \
                 syscall entry ({offset}), {BANNER} at {va:#x} reads {found:?}, the file has \
                 {expected:?}"
            ),
            KaslrError::Fred { why } => format!(
                "the guest kernel uses FRED (CR4.FRED is set), so it never sets IA32_LSTAR, where \
                 vmtrace reads its KASLR offset, and {why}"
            ),
            e => e.to_string(),
        }
    }

    fn remedy(&self) -> Option<Remedy> {
        match self {
            KaslrError::BadEntry { .. } => Some(Remedy::OwnVmlinux),
            KaslrError::BannerMismatch { .. } => Some(Remedy::SameBuildVmlinux),
            KaslrError::Fred { .. } => Some(Remedy::FredOffOrVmlinux),
            KaslrError::BannerUnmapped { .. } => None,
        }
    }

    /// `Fred`'s remedy follows after ": ".
    fn say(&self, w: &dyn TracerWords) -> String {
        match self {
            KaslrError::Fred { .. } => {
                format!(
                    "{}: {}",
                    self.problem(w),
                    w.remedy(Remedy::FredOffOrVmlinux)
                )
            }
            e => join(e.problem(w), e.remedy(), w),
        }
    }
}

/// What a pause found out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detected {
    Offset(KernelOffset),
    /// The guest has not set its syscall entry yet (early boot): try at a
    /// later pause.
    NotYet,
}

fn banner_bytes(image: &KernelImage) -> Option<(u64, &[u8])> {
    let b = image.symbol(BANNER)?;
    let len = usize::try_from(b.size).ok()?.clamp(1, BANNER_CHECK_LEN);
    Some((b.addr, image.file_bytes(b.addr, len)?))
}

/// The kernel's offsets, read under `paused`. A kernel without a syscall
/// entry symbol (not Linux: vmtrace's mini guest) is where it was linked.
pub fn detect(paused: &dyn Stopped, image: &KernelImage) -> Result<Detected, KaslrError> {
    let Some(entry) = image.symbol(SYSCALL_ENTRY).map(|s| s.addr) else {
        return Ok(Detected::Offset(KernelOffset::NONE));
    };
    let Some(lstar) = paused.syscall_entry() else {
        return without_syscall_entry(paused, image);
    };
    let bad = |why| KaslrError::BadEntry {
        lstar,
        entry,
        path: image.path.display().to_string(),
        why,
    };
    // KASLR only moves the kernel up (it starts at the lowest slot), and
    // never by a fraction of a page.
    let virt = lstar.checked_sub(entry).ok_or_else(|| bad("lower"))?;
    let virt = i64::try_from(virt).map_err(|_| bad("further"))?;
    if !(virt as u64).is_multiple_of(vmm::gva::PAGE_SIZE_4K) {
        return Err(bad("not a whole number of pages further"));
    }
    // Confirm with the banner; without one (kallsyms has no data symbols),
    // the entry itself gives the physical offset, unconfirmed.
    let (banner, expected) = banner_bytes(image).unwrap_or((entry, &[]));
    let va = banner.wrapping_add_signed(virt);
    let mut found = vec![0u8; expected.len()];
    let mut last_err = String::from("no vCPU has paging on");
    let mut gpa = None;
    'spaces: for v in paused.vcpu_spaces() {
        let root = v.space.root();
        for r in [root, root & !PTI_USER_PGTABLE_BIT] {
            let mut space: AddressSpace<'_> = v.space.with_root(r);
            match space.read(va, &mut found).and_then(|()| space.gpa(va)) {
                Ok(pa) => {
                    gpa = Some(pa);
                    break 'spaces;
                }
                Err(e) => last_err = e.to_string(),
            }
        }
    }
    let gpa = gpa.ok_or(KaslrError::BannerUnmapped { va, why: last_err })?;
    let phys_link = vmm::layout::kernel_virt_to_phys(banner).unwrap_or(0);
    let offset = KernelOffset {
        virt,
        phys: gpa.wrapping_sub(phys_link) as i64,
    };
    if found != expected {
        return Err(KaslrError::BannerMismatch {
            path: image.path.display().to_string(),
            offset,
            va,
            found: String::from_utf8_lossy(&found).into_owned(),
            expected: String::from_utf8_lossy(expected).into_owned(),
        });
    }
    Ok(Detected::Offset(offset))
}

/// IA32_LSTAR is still 0: early boot, or a FRED kernel, which never sets
/// it. The banner found in the kernel's mapping gives the offsets; not
/// found, a FRED kernel is an error (it would never become known), any
/// other is asked again at a later pause.
fn without_syscall_entry(
    paused: &dyn Stopped,
    image: &KernelImage,
) -> Result<Detected, KaslrError> {
    let banner = banner_bytes(image);
    let found = banner.and_then(|(va, expected)| search(paused, va, expected));
    let fred = paused
        .vcpu_spaces()
        .iter()
        .filter_map(|v| paused.snapshot(v.cpu))
        .any(|s| s.sregs.cr4 & CR4_FRED != 0);
    verdict(found, banner.is_some(), fred, image)
}

/// `without_syscall_entry`'s decision, from what the search `found`,
/// whether there was a banner to search for, and whether a vCPU has FRED on.
fn verdict(
    found: Option<KernelOffset>,
    banner: bool,
    fred: bool,
    image: &KernelImage,
) -> Result<Detected, KaslrError> {
    if let Some(o) = found {
        return Ok(Detected::Offset(o));
    }
    if !fred {
        return Ok(Detected::NotYet);
    }
    let path = image.path.display();
    Err(KaslrError::Fred {
        why: if banner {
            format!("{BANNER} of {path} is nowhere in the kernel's mapping (not this kernel's vmlinux?)")
        } else {
            format!("{path} has no {BANNER} to find the kernel by")
        },
    })
}

/// The offsets at which the kernel's mapping holds the banner (`expected`,
/// linked at `banner`): every 2 MiB step of the kernel image's virtual area
/// is read through each paged vCPU's tables (the kernel table of a PTI pair
/// first) until one has it; None unless exactly one step does. Another
/// step maps other physical memory, which holds the banner only if a copy
/// of it is there.
fn search(paused: &dyn Stopped, banner: u64, expected: &[u8]) -> Option<KernelOffset> {
    let link_pa = vmm::layout::kernel_virt_to_phys(banner)?;
    let mut found = vec![0u8; expected.len()];
    for v in paused.vcpu_spaces() {
        let root = v.space.root();
        for r in [root & !PTI_USER_PGTABLE_BIT, root] {
            let mut space = v.space.with_root(r);
            let mut hits = Vec::new();
            let mut virt = 0u64;
            while let Some(va) = banner
                .checked_add(virt)
                .filter(|va| va.saturating_add(expected.len() as u64) <= KERNEL_IMAGE_END)
            {
                if space.read(va, &mut found).is_ok() && found == expected {
                    hits.extend(space.gpa(va).ok().map(|gpa| (virt, gpa)));
                }
                virt += KASLR_ALIGN;
            }
            match hits[..] {
                [] => continue,
                [(virt, gpa)] => {
                    return Some(KernelOffset {
                        virt: virt as i64,
                        phys: gpa.wrapping_sub(link_pa) as i64,
                    })
                }
                _ => return None,
            }
        }
    }
    None
}

/// Physical offsets at which guest RAM holds the vmlinux's banner, found
/// without stopping the guest: every multiple of [`KASLR_ALIGN`] that puts
/// the banner inside RAM, lowest first. Empty while the kernel is still
/// compressed; usually one. None when the symbols have no banner to look
/// for (e.g. kallsyms without data symbols): only a pause can tell then.
/// A hint: [`detect`] decides under a pause.
pub fn phys_candidates(mem: &dyn GuestRam, image: &KernelImage) -> Option<Vec<i64>> {
    let (banner, expected) = banner_bytes(image)?;
    let link_pa = vmm::layout::kernel_virt_to_phys(banner)?;
    let mut found = vec![0u8; expected.len()];
    // The banner's place within its 2 MiB slot does not move.
    let mut pa = link_pa % KASLR_ALIGN;
    let mut out = Vec::new();
    while mem.read_slice(&mut found, GuestAddress(pa)).is_ok() {
        if found == expected {
            out.push(pa.wrapping_sub(link_pa) as i64);
        }
        pa += KASLR_ALIGN;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// guest/out/mini.elf (built by guest/build.sh mini), for a real image.
    fn mini_image() -> KernelImage {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let st = std::process::Command::new("bash")
            .args(["guest/build.sh", "mini"])
            .current_dir(&root)
            .status()
            .expect("run guest/build.sh mini");
        assert!(st.success());
        KernelImage::load(&root.join("guest/out/mini.elf")).unwrap()
    }

    #[test]
    fn a_fred_kernel_whose_banner_is_not_found_is_an_error_not_a_wait() {
        // (This host's CPUs have no FRED, and KVM refuses CR4.FRED without
        // it: the decision is tested alone.)
        let image = mini_image();
        let o = KernelOffset {
            virt: 0x20_0000,
            phys: 0,
        };
        // Found: whatever CR4 says.
        for fred in [false, true] {
            assert_eq!(
                verdict(Some(o), true, fred, &image).unwrap(),
                Detected::Offset(o)
            );
        }
        // Not found without FRED: early boot, asked again later.
        assert_eq!(
            verdict(None, true, false, &image).unwrap(),
            Detected::NotYet
        );
        // Not found with FRED on: IA32_LSTAR will never be set.
        let err = verdict(None, true, true, &image).unwrap_err();
        assert_eq!(err.remedy(), Some(Remedy::FredOffOrVmlinux));
        let err = err.to_string();
        assert!(
            err.starts_with("the guest kernel uses FRED (CR4.FRED is set)"),
            "{err}"
        );
        assert!(
            err.contains("linux_banner of ") && err.contains(": boot it with `fred=off` on its"),
            "{err}"
        );
        assert!(!err.contains('\n'), "one line: {err}");
        let err = verdict(None, false, true, &image).unwrap_err().to_string();
        assert!(
            err.contains("has no linux_banner to find the kernel by"),
            "{err}"
        );
    }

    #[test]
    fn offsets_slide_and_unslide() {
        let o = KernelOffset {
            virt: 0x2a00_0000,
            phys: 0x0360_0000,
        };
        let link = 0xffff_ffff_8100_1234;
        assert_eq!(o.runtime(link), 0xffff_ffff_ab00_1234);
        assert_eq!(o.link(o.runtime(link)), link);
        assert_eq!(o.phys_of(link), Some(0x0100_1234 + 0x0360_0000));
        assert_eq!(KernelOffset::NONE.phys_of(link), Some(0x0100_1234));
        // Below the kernel map: no physical address.
        assert_eq!(o.phys_of(0xffff_8880_0000_0000), None);
        assert_eq!(o.to_string(), "virtual +0x2a000000, physical +0x3600000");
        let down = KernelOffset {
            virt: 0,
            phys: -0x20_0000,
        };
        assert_eq!(down.to_string(), "virtual +0x0, physical -0x200000");
        assert_eq!(down.phys_of(link), Some(0x0100_1234 - 0x20_0000));
        assert!(KernelOffset::NONE.is_none() && !o.is_none());
    }
}
