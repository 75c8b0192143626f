//! `vmtrace list`, checked: the kernel image whose functions to list, its
//! symbols found exactly as a traced run finds them (`tracer::kernel::find`),
//! and the globs.

use std::path::Path;

use tracer::error::TracerError;
use tracer::kernel::symbols::KernelImage;

use tracer::kernel::find::{self, Given};
use vmm::boot::KernelFile;

use crate::cli::ListArgs;
use crate::error::InputError;

/// `vmtrace list`, checked: the symbols loaded.
pub struct ListConfig {
    pub image: KernelImage,
    pub globs: Vec<String>,
    /// `--entry`: which functions count as traceable.
    pub entry: tracer::plan::entry::EntryChoice,
    /// `-e`: list events, not functions.
    pub events: bool,
}

impl ListConfig {
    pub fn check(args: &ListArgs) -> Result<ListConfig, InputError> {
        let image = image(args.kernel.as_deref(), args.vmlinux.as_deref())?;
        Ok(ListConfig {
            image,
            globs: args.globs.clone(),
            entry: args.entry.choice(),
            events: args.events,
        })
    }
}

/// The kernel's symbols from `--kernel` and/or `--vmlinux`, found exactly
/// as a traced run finds them (said if from kallsyms).
pub fn image(kernel: Option<&Path>, vmlinux: Option<&Path>) -> Result<KernelImage, InputError> {
    Ok(match (kernel, vmlinux) {
        (Some(kernel), vmlinux) => {
            if !kernel.is_file() {
                return Err(InputError::KernelMissing(kernel.to_owned()));
            }
            let kernel = KernelFile::open(kernel)?;
            let given = match vmlinux {
                Some(path) => Given::Vmlinux {
                    path,
                    how: "--vmlinux",
                },
                None => Given::Nothing,
            };
            let found = find::kernel_image(&kernel, given)?;
            if let Some(n) = &found.note {
                note!("vmtrace: {n}");
            }
            found.image
        }
        (None, Some(vmlinux)) => {
            let mut image = KernelImage::load_without_sites(vmlinux).map_err(TracerError::from)?;
            image.source = format!("{} (--vmlinux)", vmlinux.display());
            image
        }
        // clap requires one of them; say so anyway rather than panic.
        (None, None) => return Err(InputError::NoKernel),
    })
}
