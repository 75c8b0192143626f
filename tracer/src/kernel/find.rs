//! Where a kernel's symbols come from, in order (docs/usage.md, "Finding
//! symbols"): a vmlinux named by the caller; the kernel itself when it is an
//! ELF file; for a bzImage, the first vmlinux found beside it, at its build
//! tree's root or in the distribution's debug-symbol places for its release
//! (`vmlinux`); else kallsyms in the bzImage's own payload (`bzimage`). A
//! vmlinux that is found must match the kernel, else it is refused: a wrong
//! vmlinux would only show as sites that never become NOPs.

use std::path::{Path, PathBuf};

use vmm::boot::{KernelFile, KernelKind};

use super::bzimage::{self, PayloadSymbolError};
use super::symbols::{KernelImage, SymbolError};
use super::vmlinux;
use crate::advice::{Plain, Remedy, TracerAdvice, TracerWords};

/// Why the kernel has no usable symbols.
#[derive(Debug, thiserror::Error)]
pub enum FindError {
    #[error("{}", self.say(&Plain))]
    Symbols(#[from] SymbolError),
    /// The vmlinux is not the kernel's.
    #[error("{} does not match kernel {}: {why}", vmlinux.display(), kernel.display())]
    Mismatch {
        vmlinux: PathBuf,
        kernel: PathBuf,
        why: String,
    },
    /// No vmlinux anywhere looked, and the bzImage alone gave no symbols.
    #[error("{}", self.say(&Plain))]
    NoSymbols {
        kernel: PathBuf,
        tried: String,
        source: Box<PayloadSymbolError>,
    },
}

/// `NoSymbols` ends with what the bzImage said, remedy included.
impl TracerAdvice for FindError {
    fn problem(&self, w: &dyn TracerWords) -> String {
        match self {
            FindError::Symbols(e) => e.problem(w),
            FindError::NoSymbols { source, .. } => self.no_symbols(source.problem(w)),
            e => e.to_string(),
        }
    }

    fn remedy(&self) -> Option<Remedy> {
        match self {
            FindError::Symbols(e) => e.remedy(),
            FindError::NoSymbols { source, .. } => source.remedy(),
            FindError::Mismatch { .. } => None,
        }
    }

    fn say(&self, w: &dyn TracerWords) -> String {
        match self {
            FindError::Symbols(e) => e.say(w),
            FindError::NoSymbols { source, .. } => self.no_symbols(source.say(w)),
            e => e.to_string(),
        }
    }
}

impl FindError {
    /// `NoSymbols` saying `payload` of why the bzImage alone did not do.
    fn no_symbols(&self, payload: String) -> String {
        match self {
            FindError::NoSymbols { kernel, tried, .. } => format!(
                "no symbols for {}: no vmlinux at {tried}, and {payload}",
                kernel.display()
            ),
            e => e.to_string(),
        }
    }
}

/// Where a vmlinux given by the caller came from, for `KernelImage::source`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Given<'a> {
    /// Nothing given: look for it.
    Nothing,
    /// A vmlinux the user named (`how` says how, e.g. "--vmlinux").
    Vmlinux { path: &'a Path, how: &'a str },
}

/// The kernel's symbols and ftrace sites, with `image.source` saying where
/// they came from, and what to tell the user about it (None: nothing).
pub struct Found {
    pub image: KernelImage,
    pub note: Option<String>,
}

/// Find the symbols of `kernel` as the module doc says.
pub fn kernel_image(kernel: &KernelFile, given: Given<'_>) -> Result<Found, FindError> {
    let found = |image| Found { image, note: None };
    if let Given::Vmlinux { path, how } = given {
        return load_checked(kernel, path, how).map(found);
    }
    if let Some(bytes) = kernel.elf_bytes() {
        let mut image = KernelImage::from_bytes_without_sites(kernel.path(), bytes.clone())?;
        image.source = format!("{} (the kernel itself)", kernel.path().display());
        return Ok(found(image));
    }
    let release = kernel.version().and_then(vmlinux::release);
    let candidates = vmlinux::candidates(kernel.path(), release);
    if let Some(c) = candidates.iter().find(|c| c.path.is_file()) {
        return load_checked(kernel, &c.path, c.place).map(found);
    }
    let tried = candidates
        .iter()
        .map(|c| c.path.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let (mut image, info) = bzimage::load_from(kernel).map_err(|source| FindError::NoSymbols {
        kernel: kernel.path().to_owned(),
        tried: tried.clone(),
        source: Box::new(source),
    })?;
    image.source = format!(
        "{} ({} symbols, {} layout; no vmlinux found)",
        image.source, info.kallsyms, info.layout
    );
    let note = format!(
        "no vmlinux at {tried}; symbols from kallsyms in the bzImage ({} payload decompressed \
         in {} ms, {} symbols, {} sites)",
        info.compression,
        info.decompress_time.as_millis(),
        info.kallsyms,
        image.mcount_loc.len()
    );
    Ok(Found {
        image,
        note: Some(note),
    })
}

/// The vmlinux at `path`, checked against the kernel (`how`: where it was
/// found, for `source`).
fn load_checked(kernel: &KernelFile, path: &Path, how: &str) -> Result<KernelImage, FindError> {
    let mut image = KernelImage::load_without_sites(path)?;
    check_vmlinux(kernel, path, &image)?;
    image.source = format!("{} ({how})", path.display());
    Ok(image)
}

/// The symbol holding "Linux version ..." in a vmlinux.
const LINUX_BANNER: &str = "linux_banner";

/// The vmlinux must be the kernel's, found now rather than after a boot that
/// waits for sites that never come: a bzImage's version string (its setup
/// header's `kernel_version`, "6.1.192 (user@host) #1 SMP ...") against the
/// vmlinux's `linux_banner` ("Linux version 6.1.192 (user@host) (gcc ...) #1
/// SMP ..."); two ELF files by their build ids.
fn check_vmlinux(
    kernel: &KernelFile,
    vmlinux: &Path,
    image: &KernelImage,
) -> Result<(), FindError> {
    let mismatch = |why: String| FindError::Mismatch {
        vmlinux: vmlinux.to_owned(),
        kernel: kernel.path().to_owned(),
        why,
    };
    match kernel.kind() {
        KernelKind::BzImage => {
            let Some(banner) = banner(image) else {
                return Err(mismatch(format!(
                    "it is not a Linux vmlinux (no {LINUX_BANNER}) but the kernel is a bzImage"
                )));
            };
            if let Some(version) = kernel.version() {
                if !banner_matches(&banner, version) {
                    return Err(mismatch(format!(
                        "the kernel is {version:?}, the vmlinux {banner:?}"
                    )));
                }
            }
        }
        KernelKind::LinuxElf | KernelKind::Elf => {
            let Some(bytes) = kernel.elf_bytes() else {
                return Ok(());
            };
            if vmlinux == kernel.path() {
                return Ok(());
            }
            let kernel_image = KernelImage::from_bytes_without_sites(kernel.path(), bytes.clone())?;
            match (hex(&kernel_image.build_id), hex(&image.build_id)) {
                (Some(k), Some(v)) if k != v => {
                    return Err(mismatch(format!("build id {v} is not the kernel's {k}")));
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// The vmlinux's `linux_banner` string, if it has one.
fn banner(image: &KernelImage) -> Option<String> {
    let s = image.symbol(LINUX_BANNER)?;
    let len = usize::try_from(s.size)
        .ok()
        .filter(|&n| n > 0 && n <= 4096)?;
    let bytes = image.file_bytes(s.addr, len)?;
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    Some(String::from_utf8_lossy(&bytes[..end]).trim_end().to_owned())
}

fn hex(b: &Option<Vec<u8>>) -> Option<String> {
    b.as_ref()
        .map(|b| b.iter().map(|x| format!("{x:02x}")).collect::<String>())
}

/// Does a vmlinux's banner ("Linux version R (B@H) (compiler) V") describe the
/// bzImage version `version` ("R (B@H) V")?
pub fn banner_matches(banner: &str, version: &str) -> bool {
    let Some(banner) = banner.strip_prefix("Linux version ") else {
        return false;
    };
    // "R (B@H)" starts both; UTS_VERSION ("#1 SMP ...", with the build
    // time) ends both.
    let (head, uts) = match version.split_once(") ") {
        Some((h, u)) => (format!("{h})"), u),
        None => (version.to_owned(), ""),
    };
    banner.starts_with(&head) && banner.ends_with(uts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guest_out() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest/out")
    }

    /// What a traced run finds for `kernel` when nothing is given.
    fn found(kernel: &Path) -> Result<KernelImage, FindError> {
        let kernel = KernelFile::open(kernel).expect("a kernel file");
        kernel_image(&kernel, Given::Nothing).map(|f| f.image)
    }

    /// The 6.1 guest laid out as a kernel build tree: its vmlinux is found
    /// at the tree's root (and matches).
    #[test]
    fn build_tree_layout_finds_the_vmlinux_at_its_root() {
        let out = guest_out();
        let (bz, vmlinux) = (out.join("bzImage"), out.join("vmlinux"));
        if !bz.is_file() || !vmlinux.is_file() {
            eprintln!(
                "SKIPPED: {} is not built; run `bash guest/build.sh linux`",
                bz.display()
            );
            return;
        }
        let tree = std::env::temp_dir().join(format!("vmtrace-tree-{}", std::process::id()));
        let boot = tree.join("arch/x86/boot");
        std::fs::create_dir_all(&boot).unwrap();
        std::fs::copy(&bz, boot.join("bzImage")).unwrap();
        std::fs::copy(&vmlinux, tree.join("vmlinux")).unwrap();
        let image = found(&boot.join("bzImage"));
        let _ = std::fs::remove_dir_all(&tree);
        let image = image.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            image.source,
            format!("{} (the build tree's root)", tree.join("vmlinux").display())
        );
        assert!(image.symbol("hrtimer_interrupt").is_some());
    }

    /// The 6.1 guest laid out as Debian's packages unpacked with `dpkg -x`
    /// into one folder: `boot/vmlinuz-<release>` from the image package,
    /// `usr/lib/debug/boot/vmlinux-<release>` from its -dbg package. The
    /// vmlinux is found there, not kallsyms used.
    #[test]
    fn dpkg_x_layout_finds_the_dbg_vmlinux_under_the_images_root() {
        let out = guest_out();
        let (bz, vmlinux) = (out.join("bzImage"), out.join("vmlinux"));
        if !bz.is_file() || !vmlinux.is_file() {
            eprintln!(
                "SKIPPED: {} is not built; run `bash guest/build.sh linux`",
                bz.display()
            );
            return;
        }
        let bz_file = KernelFile::open(&bz).unwrap();
        let version = bz_file.version().expect("a version string");
        let release = vmlinux::release(version).unwrap().to_owned();
        let root = std::env::temp_dir().join(format!("vmtrace-dpkg-{}", std::process::id()));
        let debug = root.join("usr/lib/debug/boot");
        std::fs::create_dir_all(root.join("boot")).unwrap();
        std::fs::create_dir_all(&debug).unwrap();
        let kernel = root.join(format!("boot/vmlinuz-{release}"));
        let dbg = debug.join(format!("vmlinux-{release}"));
        std::fs::copy(&bz, &kernel).unwrap();
        std::fs::copy(&vmlinux, &dbg).unwrap();
        let image = found(&kernel);
        let _ = std::fs::remove_dir_all(&root);
        let image = image.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            image.source,
            format!(
                "{} (the debug-symbol directory under the image's root)",
                dbg.display()
            )
        );
        assert!(image.symbol("__start_mcount_loc").is_some());
    }

    #[test]
    fn nothing_found_says_what_was_tried_and_to_pass_vmlinux() {
        let dir = std::env::temp_dir().join(format!("vmtrace-symbols-{}", std::process::id()));
        let tree = dir.join("arch/x86/boot");
        std::fs::create_dir_all(&tree).unwrap();
        // A bzImage header with no payload: nothing to decompress.
        let bz = tree.join("bzImage");
        let mut b = vec![0u8; 0x4000];
        b[0x1f1] = 4;
        b[0x1fe..0x200].copy_from_slice(&0xaa55u16.to_le_bytes());
        b[0x202..0x206].copy_from_slice(b"HdrS");
        b[0x206..0x208].copy_from_slice(&0x020fu16.to_le_bytes());
        b[0x211] = 1; // LOADED_HIGH
        b[0x1f4..0x1f8].copy_from_slice(&0x100u32.to_le_bytes()); // syssize
        b[0x236..0x238].copy_from_slice(&1u16.to_le_bytes()); // XLF_KERNEL_64
        std::fs::write(&bz, &b).unwrap();
        let err = match found(&bz) {
            Err(e) => {
                assert_eq!(e.remedy(), Some(Remedy::KernelVmlinux));
                e.to_string()
            }
            Ok(_) => panic!("symbols from nothing"),
        };
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            err.contains(&format!("{}", tree.join("vmlinux").display())),
            "{err}"
        );
        assert!(
            err.contains(&format!("{}", dir.join("vmlinux").display())),
            "{err}"
        );
        assert!(err.ends_with("; pass the kernel's vmlinux"), "{err}");
    }
}
