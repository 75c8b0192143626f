//! The kernel file, opened, classified and checked once, and read whole
//! then. Everything that reads it later (the symbols of an ELF kernel, a
//! bzImage's payload and version, the loader) reads those bytes, never the
//! path or the file again: a file replaced, or rewritten in place, while
//! vmtrace runs cannot make the plan and the guest disagree; and readers do
//! not share a file offset.

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use linux_loader::loader::bootparam::setup_header;

use super::{has_symbol, linux, open_input, read_input, BootError, KernelKind, KERNEL_MAX_SIZE};

/// What a bzImage's header says, checked when it was opened.
struct BzImageInfo {
    header: setup_header,
    version: Option<String>,
}

/// A kernel file opened once (see the module doc).
pub struct KernelFile {
    path: PathBuf,
    kind: KernelKind,
    size: u64,
    /// The file's bytes (an ELF kernel's symbols and segments, a bzImage's
    /// header, version, payload and what is loaded all come from them),
    /// shared with whoever reads its symbols or payload.
    bytes: Arc<Vec<u8>>,
    /// A bzImage's header; None for an ELF kernel.
    bzimage: Option<BzImageInfo>,
}

impl std::fmt::Debug for KernelFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelFile")
            .field("path", &self.path)
            .field("kind", &self.kind)
            .field("size", &self.size)
            .finish()
    }
}

const ELF_MAGIC: [u8; 4] = *b"\x7fELF";
/// The symbol only a Linux vmlinux has ("Linux version ...").
const LINUX_BANNER: &str = "linux_banner";

/// A kernel file opened and classified, its bzImage header not yet checked
/// (`check` does that): what a caller needs to refuse options that do not
/// fit the kind of kernel before it says anything about the file's content.
pub struct Classified {
    path: PathBuf,
    kind: KernelKind,
    size: u64,
    /// The file's bytes, read whole.
    bytes: Arc<Vec<u8>>,
}

impl Classified {
    pub fn kind(&self) -> KernelKind {
        self.kind
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A bzImage's setup header must be consistent with the file (a
    /// truncated or corrupt image is refused now, not after a boot that
    /// triple-faults).
    pub fn check(self) -> Result<KernelFile, BootError> {
        let Classified {
            path,
            kind,
            size,
            bytes,
        } = self;
        let bzimage = match kind {
            KernelKind::BzImage => {
                let mut r = Cursor::new(bytes.as_slice());
                let header = linux::check_bzimage(&mut r, &path)?;
                let version = linux::bzimage_version(&mut r, &path)?;
                Some(BzImageInfo { header, version })
            }
            KernelKind::LinuxElf | KernelKind::Elf => None,
        };
        Ok(KernelFile {
            path,
            kind,
            size,
            bytes,
            bzimage,
        })
    }
}

impl KernelFile {
    /// Open and check the kernel at `path` (`classify`, then `check`).
    pub fn open(path: &Path) -> Result<KernelFile, BootError> {
        KernelFile::classify(path)?.check()
    }

    /// Open the kernel at `path` and read it whole: a regular file no larger
    /// than the largest guest, an ELF file or a bzImage (by its magic).
    pub fn classify(path: &Path) -> Result<Classified, BootError> {
        let io = |source| BootError::Open {
            path: path.to_owned(),
            source,
        };
        let (file, size) = open_input(path, "kernel", KERNEL_MAX_SIZE, "the largest guest memory")?;
        let bytes = read_input(&file, size).map_err(io)?;
        let kind = if bytes.starts_with(&ELF_MAGIC) {
            match has_symbol(&bytes, LINUX_BANNER) {
                true => KernelKind::LinuxElf,
                false => KernelKind::Elf,
            }
        } else if linux::is_bzimage(&mut Cursor::new(bytes.as_slice())).map_err(io)? {
            KernelKind::BzImage
        } else {
            return Err(BootError::UnknownFormat {
                path: path.to_owned(),
            });
        };
        Ok(Classified {
            path: path.to_owned(),
            kind,
            // What every later reader sees (the file may have changed since
            // its size was taken).
            size: bytes.len() as u64,
            bytes: Arc::new(bytes),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn kind(&self) -> KernelKind {
        self.kind
    }

    /// The kernel's size in bytes: of what was read when it was opened.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The file's bytes as read when it was opened, whatever its kind.
    pub fn bytes(&self) -> &Arc<Vec<u8>> {
        &self.bytes
    }

    /// An ELF kernel's bytes; None for a bzImage.
    pub fn elf_bytes(&self) -> Option<&Arc<Vec<u8>>> {
        match self.bzimage {
            None => Some(&self.bytes),
            Some(_) => None,
        }
    }

    /// A bzImage's setup header, checked; None for an ELF kernel.
    pub fn setup_header(&self) -> Option<&setup_header> {
        self.bzimage.as_ref().map(|b| &b.header)
    }

    /// A bzImage's version string ("6.1.192 (user@host) #1 SMP ..."), if
    /// its header points to one.
    pub fn version(&self) -> Option<&str> {
        self.bzimage.as_ref().and_then(|b| b.version.as_deref())
    }

    /// The kernel's bytes as the loader reads them: each call its own
    /// reader, at offset 0.
    pub(super) fn reader(&self) -> Cursor<&[u8]> {
        Cursor::new(self.bytes.as_slice())
    }

    /// An ELF kernel as the loader reads it.
    pub(super) fn elf_reader(&self) -> Option<Cursor<&[u8]>> {
        self.elf_bytes().map(|b| Cursor::new(b.as_slice()))
    }
}
