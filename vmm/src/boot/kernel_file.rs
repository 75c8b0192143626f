//! The kernel file, opened, classified and checked once. Everything that
//! reads it later (the symbols of an ELF kernel, a bzImage's payload and
//! version, the loader) reads this one handle, never the path again: a file
//! replaced while vmtrace runs cannot make the plan and the guest disagree.

use std::fs::File;
use std::io::{Cursor, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use linux_loader::loader::bootparam::setup_header;

use super::{has_symbol, linux, open_input, read_input, BootError, KernelKind, KERNEL_MAX_SIZE};

/// What the kernel file holds, read when it was opened.
enum Content {
    /// An ELF kernel's bytes (its symbols, its segments and what is loaded
    /// all come from them), shared with whoever reads its symbols.
    Elf(Arc<Vec<u8>>),
    /// A bzImage: its checked setup header and version string; the file is
    /// read again (payload, loading) through the same open handle.
    BzImage {
        header: setup_header,
        version: Option<String>,
    },
}

/// A kernel file opened once (see the module doc).
pub struct KernelFile {
    path: PathBuf,
    kind: KernelKind,
    file: File,
    size: u64,
    content: Content,
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
    file: File,
    size: u64,
    /// An ELF kernel's bytes.
    elf: Option<Arc<Vec<u8>>>,
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
            mut file,
            size,
            elf,
        } = self;
        let content = match elf {
            Some(bytes) => Content::Elf(bytes),
            None => {
                let header = linux::check_bzimage(&mut file, &path)?;
                let version = linux::bzimage_version(&mut file, &path)?;
                Content::BzImage { header, version }
            }
        };
        Ok(KernelFile {
            path,
            kind,
            file,
            size,
            content,
        })
    }
}

impl KernelFile {
    /// Open and check the kernel at `path` (`classify`, then `check`).
    pub fn open(path: &Path) -> Result<KernelFile, BootError> {
        KernelFile::classify(path)?.check()
    }

    /// Open the kernel at `path`: a regular file no larger than the largest
    /// guest, an ELF file (read whole) or a bzImage (by its magic).
    pub fn classify(path: &Path) -> Result<Classified, BootError> {
        let io = |source| BootError::Open {
            path: path.to_owned(),
            source,
        };
        let (mut file, size) =
            open_input(path, "kernel", KERNEL_MAX_SIZE, "the largest guest memory")?;
        let mut magic = [0u8; 4];
        let is_elf = file.read_exact(&mut magic).is_ok() && magic == ELF_MAGIC;
        file.rewind().map_err(io)?;
        let (kind, elf) = if is_elf {
            let data = read_input(&file, size).map_err(io)?;
            let kind = match has_symbol(&data, LINUX_BANNER) {
                true => KernelKind::LinuxElf,
                false => KernelKind::Elf,
            };
            (kind, Some(Arc::new(data)))
        } else if linux::is_bzimage(&mut file).map_err(io)? {
            (KernelKind::BzImage, None)
        } else {
            return Err(BootError::UnknownFormat {
                path: path.to_owned(),
            });
        };
        Ok(Classified {
            path: path.to_owned(),
            kind,
            file,
            size,
            elf,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn kind(&self) -> KernelKind {
        self.kind
    }

    /// The file's size in bytes, as it was when opened.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// An ELF kernel's bytes; None for a bzImage.
    pub fn elf_bytes(&self) -> Option<&Arc<Vec<u8>>> {
        match &self.content {
            Content::Elf(bytes) => Some(bytes),
            Content::BzImage { .. } => None,
        }
    }

    /// A bzImage's setup header, checked; None for an ELF kernel.
    pub fn setup_header(&self) -> Option<&setup_header> {
        match &self.content {
            Content::BzImage { header, .. } => Some(header),
            Content::Elf(_) => None,
        }
    }

    /// A bzImage's version string ("6.1.192 (user@host) #1 SMP ..."), if
    /// its header points to one.
    pub fn version(&self) -> Option<&str> {
        match &self.content {
            Content::BzImage { version, .. } => version.as_deref(),
            Content::Elf(_) => None,
        }
    }

    /// The open file, positioned at `offset`, to read from. It shares the
    /// handle's file description (a duplicated descriptor, not a second
    /// open of the path).
    pub fn reader_at(&self, offset: u64) -> std::io::Result<File> {
        let mut f = self.file.try_clone()?;
        f.seek(SeekFrom::Start(offset))?;
        Ok(f)
    }

    /// An ELF kernel as the loader reads it.
    pub(super) fn elf_reader(&self) -> Option<Cursor<&[u8]>> {
        self.elf_bytes().map(|b| Cursor::new(b.as_slice()))
    }
}
