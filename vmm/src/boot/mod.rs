//! Putting a guest kernel into memory and the vCPUs into their entry state.
//!
//! Two boot protocols:
//! - Linux's 64-bit boot protocol, for a bzImage or a Linux vmlinux ELF: the
//!   boot vCPU starts at the 64-bit entry with RSI = the zero page; the others
//!   wait for INIT/SIPI from the kernel (the in-kernel LAPIC handles them) and
//!   find each other through the MP table.
//! - vmtrace's direct boot, for any other ELF (the mini guest): every vCPU
//!   starts at the ELF entry in long mode with RDI = vCPU index, RSI = command
//!   line, RDX = vCPU count.

pub mod cpuid;
pub mod linux;
pub mod mptable;
pub mod regs;

use std::fs::File;
use std::io::{Read, Seek};
use std::path::{Path, PathBuf};

use linux_loader::loader::{elf::Elf, KernelLoader};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::layout;

#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error("cannot open kernel {path}: {source}")]
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
    #[error("--initrd needs a Linux kernel, and {path} is not one")]
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
    Regs(#[from] regs::RegsError),
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

/// What the kernel file is, which decides its boot protocol. Detected once
/// (by whoever builds the `VmConfig`), then carried along.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelKind {
    /// A bzImage: Linux 64-bit boot protocol; its symbols are elsewhere.
    BzImage,
    /// A Linux vmlinux (it carries `linux_banner`): Linux's protocol.
    LinuxElf,
    /// Any other ELF: vmtrace's direct protocol.
    Elf,
}

const ELF_MAGIC: [u8; 4] = *b"\x7fELF";
/// The symbol only a Linux vmlinux has ("Linux version ...").
const LINUX_BANNER: &str = "linux_banner";

impl KernelKind {
    /// Classify the kernel file at `path` by its magic (and, for an ELF,
    /// its symbols), reading it once.
    pub fn detect(path: &Path) -> Result<KernelKind, BootError> {
        let io = |source| BootError::Open {
            path: path.to_owned(),
            source,
        };
        let mut file = File::open(path).map_err(io)?;
        let mut magic = [0u8; 4];
        if file.read_exact(&mut magic).is_ok() && magic == ELF_MAGIC {
            let mut data = magic.to_vec();
            file.read_to_end(&mut data).map_err(io)?;
            return Ok(if has_symbol(&data, LINUX_BANNER) {
                KernelKind::LinuxElf
            } else {
                KernelKind::Elf
            });
        }
        file.rewind().map_err(io)?;
        if linux::is_bzimage(&mut file).map_err(io)? {
            return Ok(KernelKind::BzImage);
        }
        Err(BootError::UnknownFormat {
            path: path.to_owned(),
        })
    }

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
    kind: KernelKind,
    kernel_path: &Path,
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
    let mut file = File::open(kernel_path).map_err(|source| BootError::Open {
        path: kernel_path.to_owned(),
        source,
    })?;
    regs::setup_page_tables(mem)?;
    regs::setup_gdt(mem)?;
    let plan = match kind {
        KernelKind::BzImage => {
            let mut initrd = match initrd_path {
                Some(p) => Some((
                    File::open(p).map_err(|source| BootError::OpenInitrd {
                        path: p.to_owned(),
                        source,
                    })?,
                    p,
                )),
                None => None,
            };
            let boot = linux::load_bzimage(
                mem,
                &mut file,
                kernel_path,
                initrd.as_mut().map(|(f, p)| (f, *p)),
                cmdline,
                mem_size,
            )?;
            mptable::setup_mptable(mem, ncpus)?;
            BootPlan {
                entry: boot.entry,
                protocol: Protocol::Linux {
                    zero_page: boot.zero_page,
                },
            }
        }
        KernelKind::LinuxElf | KernelKind::Elf => {
            let loaded = Elf::load(
                mem,
                None,
                &mut file,
                Some(GuestAddress(layout::HIGH_MEM_START)),
            )
            .map_err(|source| BootError::Elf {
                path: kernel_path.to_owned(),
                source,
            })?;
            let entry = loaded.kernel_load.0;
            if kind == KernelKind::LinuxElf {
                let initrd = match initrd_path {
                    Some(p) => {
                        let mut f = File::open(p).map_err(|source| BootError::OpenInitrd {
                            path: p.to_owned(),
                            source,
                        })?;
                        Some(linux::load_initrd(
                            mem,
                            &mut f,
                            p,
                            None,
                            loaded.kernel_end,
                            mem_size,
                        )?)
                    }
                    None => None,
                };
                let zero_page = linux::write_zero_page(mem, None, cmdline, initrd, mem_size)?;
                mptable::setup_mptable(mem, ncpus)?;
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

/// The NUL-terminated command line at its fixed address (direct boot).
fn write_cmdline(mem: &GuestMemoryMmap, cmdline: &str) -> Result<(), BootError> {
    let mut bytes = cmdline.as_bytes().to_vec();
    bytes.push(0);
    mem.write_slice(&bytes, GuestAddress(layout::CMDLINE_START))
        .map_err(BootError::Cmdline)
}
