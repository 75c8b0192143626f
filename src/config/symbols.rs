//! Where a traced run's symbols come from, in order (docs/usage.md,
//! "Finding symbols"): `--vmlinux`; the kernel itself when it is an ELF; for a
//! bzImage, the first vmlinux found beside it, at its build tree's root or
//! in the distribution's debug-symbol places for its release
//! (`tracer::kernel::vmlinux`); else kallsyms in the bzImage's own payload
//! (`tracer::kernel::bzimage`). A vmlinux that is found must match the kernel, else
//! the run is refused: a wrong vmlinux would only show as sites that never
//! become NOPs.

use std::path::Path;

use tracer::kernel::symbols::KernelImage;
use tracer::plan::Plan;
use tracer::session::TracerError;
use vmm::boot::BootError;

use super::run::check_vmlinux;
use super::KernelKind;
use crate::cli::RunArgs;
use crate::error::InputError;

/// The plan for this run, with `plan.image.source` saying where its symbols
/// came from.
pub(super) fn plan(args: &RunArgs, kernel: &Path, kind: KernelKind) -> Result<Plan, InputError> {
    let image = image(args.vmlinux.as_deref(), kernel, kind)?;
    Ok(Plan::from_image(image, &args.trace, &args.notrace)?)
}

/// The kernel's symbols and ftrace sites, found as described above (for a
/// traced run and `vmtrace list` alike), with `source` saying where from.
pub(super) fn image(
    vmlinux: Option<&Path>,
    kernel: &Path,
    kind: KernelKind,
) -> Result<KernelImage, InputError> {
    let load = |vmlinux: &Path, how: &str| -> Result<KernelImage, InputError> {
        let mut image = KernelImage::load(vmlinux).map_err(TracerError::from)?;
        check_vmlinux(kernel, kind, vmlinux, &image)?;
        image.source = format!("{} ({how})", vmlinux.display());
        Ok(image)
    };
    if let Some(vmlinux) = vmlinux {
        return load(vmlinux, "--vmlinux");
    }
    if kind != KernelKind::BzImage {
        return load(kernel, "the kernel itself");
    }
    let version = bzimage_version(kernel)?;
    let release = version
        .as_deref()
        .and_then(tracer::kernel::vmlinux::release);
    let candidates = tracer::kernel::vmlinux::candidates(kernel, release);
    if let Some(c) = candidates.iter().find(|c| c.path.is_file()) {
        return load(&c.path, c.place);
    }
    let tried = candidates
        .iter()
        .map(|c| c.path.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let (mut image, info) =
        tracer::kernel::bzimage::load(kernel).map_err(|source| InputError::NoSymbols {
            kernel: kernel.to_owned(),
            tried: tried.clone(),
            source: Box::new(source),
        })?;
    image.source = format!(
        "{} ({} symbols, {} layout; no vmlinux found)",
        image.source, info.kallsyms, info.layout
    );
    note!(
        "vmtrace: no vmlinux at {tried}; symbols from kallsyms in the bzImage ({} payload \
         decompressed in {} ms, {} symbols, {} sites)",
        info.compression,
        info.decompress_time.as_millis(),
        info.kallsyms,
        image.mcount_loc.len()
    );
    Ok(image)
}

/// The bzImage's version string ("6.1.192 (user@host) #1 SMP ..."), if it has one.
pub(super) fn bzimage_version(kernel: &Path) -> Result<Option<String>, BootError> {
    let (mut file, _) = vmm::boot::open_input(
        kernel,
        "kernel",
        vmm::boot::KERNEL_MAX_SIZE,
        "the largest guest memory",
    )?;
    Ok(vmm::boot::linux::bzimage_version(&mut file, kernel)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn run_args(args: &[&str]) -> RunArgs {
        let mut argv = vec!["vmtrace", "--trace", "*"];
        argv.extend_from_slice(args);
        crate::cli::Cli::parse_from(argv).run
    }

    /// The 6.1 guest laid out as a kernel build tree: its vmlinux is found
    /// at the tree's root (and matches).
    #[test]
    fn build_tree_layout_finds_the_vmlinux_at_its_root() {
        let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("guest/out");
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
        let a = run_args(&[]);
        let plan = plan(&a, &boot.join("bzImage"), KernelKind::BzImage);
        let _ = std::fs::remove_dir_all(&tree);
        let plan = plan.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            plan.image.source,
            format!("{} (the build tree's root)", tree.join("vmlinux").display())
        );
        assert!(plan.image.symbol("hrtimer_interrupt").is_some());
    }

    /// The 6.1 guest laid out as Debian's packages unpacked with `dpkg -x`
    /// into one folder: `boot/vmlinuz-<release>` from the image package,
    /// `usr/lib/debug/boot/vmlinux-<release>` from its -dbg package. The
    /// vmlinux is found there, not kallsyms used.
    #[test]
    fn dpkg_x_layout_finds_the_dbg_vmlinux_under_the_images_root() {
        let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("guest/out");
        let (bz, vmlinux) = (out.join("bzImage"), out.join("vmlinux"));
        if !bz.is_file() || !vmlinux.is_file() {
            eprintln!(
                "SKIPPED: {} is not built; run `bash guest/build.sh linux`",
                bz.display()
            );
            return;
        }
        let version = bzimage_version(&bz).unwrap().expect("a version string");
        let release = tracer::kernel::vmlinux::release(&version)
            .unwrap()
            .to_owned();
        let root = std::env::temp_dir().join(format!("vmtrace-dpkg-{}", std::process::id()));
        let debug = root.join("usr/lib/debug/boot");
        std::fs::create_dir_all(root.join("boot")).unwrap();
        std::fs::create_dir_all(&debug).unwrap();
        let kernel = root.join(format!("boot/vmlinuz-{release}"));
        let dbg = debug.join(format!("vmlinux-{release}"));
        std::fs::copy(&bz, &kernel).unwrap();
        std::fs::copy(&vmlinux, &dbg).unwrap();
        let plan = plan(&run_args(&[]), &kernel, KernelKind::BzImage);
        let _ = std::fs::remove_dir_all(&root);
        let plan = plan.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            plan.image.source,
            format!(
                "{} (the debug-symbol directory under the image's root)",
                dbg.display()
            )
        );
        assert!(plan.image.symbol("__start_mcount_loc").is_some());
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
        let a = run_args(&[]);
        let err = match plan(&a, &bz, KernelKind::BzImage) {
            Err(e) => e.to_string(),
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
        assert!(err.contains("--vmlinux"), "{err}");
    }
}
