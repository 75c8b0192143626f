//! Putting a guest kernel into memory and the vCPUs into their entry state.
//!
//! Two boot protocols:
//! - Linux's 64-bit boot protocol, for a bzImage or a Linux vmlinux ELF: the
//!   boot vCPU starts at the 64-bit entry with RSI = the zero page; the others
//!   wait for INIT/SIPI from the kernel (the in-kernel LAPIC handles them) and
//!   find each other through the MP table or the ACPI MADT (both are given).
//! - vmtrace's direct boot, for any other ELF (the mini guest): every vCPU
//!   starts at the ELF entry in long mode with RDI = vCPU index, RSI = command
//!   line, RDX = vCPU count.

pub mod acpi;
pub mod cmdline;
pub mod cpuid;
mod kernel_file;
pub mod linux;
pub mod mptable;
pub mod regs;

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use linux_loader::loader::{elf::Elf, KernelLoader};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::advice::{Advice, Input, Plain, Words};
use crate::layout;

pub use kernel_file::{Classified, KernelFile};

/// The largest vmlinux vmtrace reads (a debug-info Linux vmlinux is a few
/// hundred MiB).
pub const VMLINUX_MAX_SIZE: u64 = 2 << 30;
/// The largest kernel file: no kernel can be larger than the largest guest.
pub const KERNEL_MAX_SIZE: u64 = layout::MAX_MEM_MIB << 20;

/// Why an input file cannot be read: every file vmtrace reads is a regular
/// file of bounded size, checked before any byte is read.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot open {what} {}: {source}", path.display())]
    Open {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what} {} is {kind}, not a regular file; pass a file", path.display())]
    NotRegular {
        what: &'static str,
        path: PathBuf,
        kind: &'static str,
    },
    #[error("{}", self.say(&Plain))]
    TooLarge {
        what: &'static str,
        path: PathBuf,
        size: u64,
        limit: u64,
        why: &'static str,
        /// The input that sets `limit`, if the user gives it.
        set_by: Option<Input>,
    },
}

impl Advice for FileError {
    fn problem(&self, w: &dyn Words) -> String {
        match self {
            FileError::TooLarge {
                what,
                path,
                size,
                limit,
                why,
                set_by,
            } => {
                let input = set_by.map(|i| format!(", {}", w.input(i)));
                format!(
                    "{what} {} is {size} bytes, more than {limit} ({why}{})",
                    path.display(),
                    input.unwrap_or_default()
                )
            }
            e => e.to_string(),
        }
    }
}

/// Open `path` (a `what`, named in errors) for reading: refuse anything but a
/// regular file (a FIFO is opened without blocking, then refused) and a file
/// larger than `limit` bytes (`why` says where the limit comes from).
/// Returns the file and its size.
pub fn open_input(
    path: &Path,
    what: &'static str,
    limit: u64,
    why: &'static str,
) -> Result<(File, u64), FileError> {
    let open = |source| FileError::Open {
        what,
        path: path.to_owned(),
        source,
    };
    // O_NONBLOCK: opening a FIFO for reading would wait for a writer. It
    // changes nothing for the regular files that pass the check below.
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(open)?;
    let meta = file.metadata().map_err(open)?;
    let t = meta.file_type();
    let kind = if t.is_file() {
        None
    } else if t.is_dir() {
        Some("a directory")
    } else if t.is_fifo() {
        Some("a FIFO (named pipe)")
    } else if t.is_char_device() {
        Some("a character device")
    } else if t.is_block_device() {
        Some("a block device")
    } else if t.is_socket() {
        Some("a socket")
    } else {
        Some("not a regular file")
    };
    if let Some(kind) = kind {
        return Err(FileError::NotRegular {
            what,
            path: path.to_owned(),
            kind,
        });
    }
    let size = meta.len();
    if size > limit {
        return Err(FileError::TooLarge {
            what,
            path: path.to_owned(),
            size,
            limit,
            why,
            set_by: None,
        });
    }
    Ok((file, size))
}

/// Read all of a file opened by `open_input` (`size` bytes as it said),
/// never more than `size + 1` bytes even if the file grows meanwhile.
pub fn read_input(mut file: &File, size: u64) -> std::io::Result<Vec<u8>> {
    let mut data = Vec::with_capacity(size as usize);
    (&mut file).take(size + 1).read_to_end(&mut data)?;
    Ok(data)
}

/// A PT_LOAD segment of an ELF kernel that does not fit in guest RAM.
#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    #[error("{}: malformed ELF program headers ({why}); is the file truncated?", path.display())]
    Malformed { path: PathBuf, why: String },
    #[error("{}", self.say(&Plain))]
    OutsideRam {
        path: PathBuf,
        index: usize,
        start: u64,
        end: u64,
        low: u64,
        mem_size: u64,
    },
    #[error("{}: segment {index}'s {filesz} bytes at file offset {offset:#x} run past the end of the file ({file_len} bytes); is the file truncated?", path.display())]
    PastFile {
        path: PathBuf,
        index: usize,
        offset: u64,
        filesz: u64,
        file_len: u64,
    },
    #[error("{}: segment {index} has {filesz} bytes in the file but {memsz} in memory; the file is corrupt", path.display())]
    FileLargerThanMemory {
        path: PathBuf,
        index: usize,
        filesz: u64,
        memsz: u64,
    },
    #[error("{}: no loadable segment; not a kernel", path.display())]
    NoSegment { path: PathBuf },
}

impl Advice for SegmentError {
    fn problem(&self, w: &dyn Words) -> String {
        match self {
            SegmentError::OutsideRam {
                path,
                index,
                start,
                end,
                low,
                mem_size,
            } => format!(
                "{}: segment {index} occupies guest-physical {start:#x}..{end:#x}, outside guest \
                 RAM {low:#x}..{mem_size:#x}; the kernel does not fit this guest (try a larger \
                 {}) or is corrupt",
                path.display(),
                w.input(Input::Mem)
            ),
            e => e.to_string(),
        }
    }
}

/// Check an ELF kernel's loadable segments (as the loader places them: at
/// their physical addresses) against the file and guest RAM
/// `[1 MiB, mem_size)`, bss included.
pub fn check_elf_segments(elf: &[u8], path: &Path, mem_size: u64) -> Result<(), SegmentError> {
    use object::elf::{FileHeader64, PT_LOAD};
    use object::read::elf::{FileHeader, ProgramHeader};
    use object::LittleEndian;
    let malformed = |why: String| SegmentError::Malformed {
        path: path.to_owned(),
        why,
    };
    let hdr = FileHeader64::<LittleEndian>::parse(elf).map_err(|e| malformed(e.to_string()))?;
    let endian = hdr.endian().map_err(|e| malformed(e.to_string()))?;
    let phdrs = hdr
        .program_headers(endian, elf)
        .map_err(|e| malformed(e.to_string()))?;
    let file_len = elf.len() as u64;
    let mut loads = 0;
    for (index, ph) in phdrs.iter().enumerate() {
        if ph.p_type(endian) != PT_LOAD {
            continue;
        }
        loads += 1;
        let (offset, filesz) = (ph.p_offset(endian), ph.p_filesz(endian));
        let (start, memsz) = (ph.p_paddr(endian), ph.p_memsz(endian));
        if offset.checked_add(filesz).is_none_or(|end| end > file_len) {
            return Err(SegmentError::PastFile {
                path: path.to_owned(),
                index,
                offset,
                filesz,
                file_len,
            });
        }
        if filesz > memsz {
            return Err(SegmentError::FileLargerThanMemory {
                path: path.to_owned(),
                index,
                filesz,
                memsz,
            });
        }
        let end = start.saturating_add(memsz);
        if start < layout::HIGH_MEM_START || end > mem_size || start.checked_add(memsz).is_none() {
            return Err(SegmentError::OutsideRam {
                path: path.to_owned(),
                index,
                start,
                end,
                low: layout::HIGH_MEM_START,
                mem_size,
            });
        }
    }
    if loads == 0 {
        return Err(SegmentError::NoSegment {
            path: path.to_owned(),
        });
    }
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error("{}", self.say(&Plain))]
    File(#[from] FileError),
    #[error("{}", self.say(&Plain))]
    Segments(#[from] SegmentError),
    #[error("cannot read kernel {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is neither an ELF kernel nor a bzImage; pass a vmlinux or bzImage")]
    UnknownFormat { path: PathBuf },
    #[error("cannot load ELF kernel {path}: {source}")]
    Elf {
        path: PathBuf,
        source: linux_loader::loader::Error,
    },
    #[error("cannot open initrd {path}: {source}")]
    OpenInitrd {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}", self.say(&Plain))]
    InitrdWithElf { path: PathBuf },
    #[error("command line is {len} bytes; the limit is {max}")]
    CmdlineTooLong { len: usize, max: usize },
    #[error("cannot write the command line: {0}")]
    Cmdline(vm_memory::GuestMemoryError),
    #[error(transparent)]
    Linux(#[from] linux::LinuxBootError),
    #[error(transparent)]
    MpTable(#[from] mptable::MpTableError),
    #[error(transparent)]
    Acpi(#[from] acpi::AcpiError),
    #[error(transparent)]
    Regs(#[from] regs::RegsError),
}

impl Advice for BootError {
    fn problem(&self, w: &dyn Words) -> String {
        match self {
            BootError::File(e) => e.problem(w),
            BootError::Segments(e) => e.problem(w),
            BootError::InitrdWithElf { path } => format!(
                "{} needs a Linux kernel, and {} is not one",
                w.input(Input::Initrd),
                path.display()
            ),
            e => e.to_string(),
        }
    }
}

/// How the vCPUs enter the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// Linux 64-bit boot protocol: boot vCPU only, RSI = zero page.
    Linux { zero_page: u64 },
    /// vmtrace direct boot: all vCPUs at the entry.
    Direct,
}

/// Where and how the loaded kernel starts.
#[derive(Clone, Copy, Debug)]
pub struct BootPlan {
    pub entry: u64,
    pub protocol: Protocol,
}

/// What the kernel file is, which decides its boot protocol. Found once,
/// when the file is opened (`KernelFile::open`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelKind {
    /// A bzImage: Linux 64-bit boot protocol; its symbols are elsewhere.
    BzImage,
    /// A Linux vmlinux (it carries `linux_banner`): Linux's protocol.
    LinuxElf,
    /// Any other ELF: vmtrace's direct protocol.
    Elf,
}

impl KernelKind {
    /// Does it boot with Linux's protocol (and rewrite its own ftrace sites
    /// at boot)?
    pub fn is_linux(self) -> bool {
        self != KernelKind::Elf
    }
}

fn has_symbol(elf: &[u8], name: &str) -> bool {
    use object::{Object, ObjectSymbol};
    object::File::parse(elf).is_ok_and(|obj| obj.symbols().any(|s| s.name() == Ok(name)))
}

/// Load the kernel (and initrd), write the command line and the tables the
/// protocol needs. The page tables and GDT are common to both protocols.
pub fn load_kernel(
    mem: &GuestMemoryMmap,
    kernel: &KernelFile,
    initrd_path: Option<&Path>,
    cmdline: &str,
    mem_size: u64,
    ncpus: u8,
) -> Result<BootPlan, BootError> {
    if cmdline.len() + 1 > layout::CMDLINE_MAX_SIZE {
        return Err(BootError::CmdlineTooLong {
            len: cmdline.len(),
            max: layout::CMDLINE_MAX_SIZE - 1,
        });
    }
    let kernel_path = kernel.path();
    let kind = kernel.kind();
    regs::setup_page_tables(mem)?;
    regs::setup_gdt(mem)?;
    let plan = match kind {
        KernelKind::BzImage => {
            let mut initrd = match initrd_path {
                Some(p) => Some((open_initrd(p, mem_size)?, p)),
                None => None,
            };
            let boot = linux::load_bzimage(
                mem,
                &mut kernel.reader(),
                kernel_path,
                initrd.as_mut().map(|(f, p)| (f, *p)),
                cmdline,
                mem_size,
            )?;
            mptable::setup_mptable(mem, ncpus)?;
            acpi::setup_acpi(mem, ncpus)?;
            BootPlan {
                entry: boot.entry,
                protocol: Protocol::Linux {
                    zero_page: boot.zero_page,
                },
            }
        }
        KernelKind::LinuxElf | KernelKind::Elf => {
            let loaded = load_elf(mem, kernel, mem_size)?;
            let entry = loaded.kernel_load.0;
            if kind == KernelKind::LinuxElf {
                let initrd = initrd_path
                    .map(|p| load_initrd_after(mem, p, loaded.kernel_end, mem_size))
                    .transpose()?;
                let zero_page = linux::write_zero_page(mem, None, cmdline, initrd, mem_size)?;
                mptable::setup_mptable(mem, ncpus)?;
                acpi::setup_acpi(mem, ncpus)?;
                BootPlan {
                    entry,
                    protocol: Protocol::Linux { zero_page },
                }
            } else {
                if initrd_path.is_some() {
                    return Err(BootError::InitrdWithElf {
                        path: kernel_path.to_owned(),
                    });
                }
                write_cmdline(mem, cmdline)?;
                BootPlan {
                    entry,
                    protocol: Protocol::Direct,
                }
            }
        }
    };
    Ok(plan)
}

/// Loads an ELF kernel at its physical addresses, once its segments are
/// checked to fit guest RAM.
fn load_elf(
    mem: &GuestMemoryMmap,
    kernel: &KernelFile,
    mem_size: u64,
) -> Result<linux_loader::loader::KernelLoaderResult, BootError> {
    let kernel_path = kernel.path();
    let mut elf = kernel.elf_reader().expect("an ELF kernel has its bytes");
    check_elf_segments(elf.get_ref(), kernel_path, mem_size)?;
    Elf::load(
        mem,
        None,
        &mut elf,
        Some(GuestAddress(layout::HIGH_MEM_START)),
    )
    .map_err(|source| BootError::Elf {
        path: kernel_path.to_owned(),
        source,
    })
}

/// Loads the initrd at `path` above the kernel, which ends at `kernel_end`.
fn load_initrd_after(
    mem: &GuestMemoryMmap,
    path: &Path,
    kernel_end: u64,
    mem_size: u64,
) -> Result<(u64, u64), BootError> {
    let mut f = open_initrd(path, mem_size)?;
    Ok(linux::load_initrd(
        mem, &mut f, path, None, kernel_end, mem_size,
    )?)
}

/// The initrd, a regular file no larger than guest RAM.
pub fn open_initrd(path: &Path, mem_size: u64) -> Result<File, FileError> {
    match open_input(path, "initrd", mem_size, "the guest's memory") {
        Ok((file, _)) => Ok(file),
        Err(FileError::TooLarge {
            what,
            path,
            size,
            limit,
            why,
            ..
        }) => Err(FileError::TooLarge {
            what,
            path,
            size,
            limit,
            why,
            set_by: Some(Input::Mem),
        }),
        Err(e) => Err(e),
    }
}

/// The NUL-terminated command line at its fixed address (direct boot).
fn write_cmdline(mem: &GuestMemoryMmap, cmdline: &str) -> Result<(), BootError> {
    let mut bytes = cmdline.as_bytes().to_vec();
    bytes.push(0);
    mem.write_slice(&bytes, GuestAddress(layout::CMDLINE_START))
        .map_err(BootError::Cmdline)
}
