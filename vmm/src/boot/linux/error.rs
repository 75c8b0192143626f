//! What can go wrong booting Linux, with the file and the field.

use std::io;
use std::path::PathBuf;

use vm_memory::GuestMemoryError;

#[derive(Debug, thiserror::Error)]
pub enum LinuxBootError {
    #[error("cannot read {what} of {path}: {source}")]
    Read {
        path: PathBuf,
        what: &'static str,
        source: io::Error,
    },
    #[error("{path} is not a bzImage (no \"HdrS\" magic at offset 0x202){hint}")]
    NotBzImage { path: PathBuf, hint: &'static str },
    #[error("{path} is truncated: it has a bzImage's \"HdrS\" magic but ends at byte {len}, inside its setup header; copy the bzImage again")]
    HeaderCut { path: PathBuf, len: u64 },
    #[error("{path}: setup header field `{field}` is {value:#x}: {why}")]
    UnsupportedKernel {
        path: PathBuf,
        field: &'static str,
        value: u64,
        why: &'static str,
    },
    #[error(
        "{path}: setup header field `{field}` is {value:#x}: adding {addend_what} \
         ({addend:#x}) overflows a 64-bit address"
    )]
    HeaderOverflow {
        path: PathBuf,
        field: &'static str,
        value: u64,
        addend_what: &'static str,
        addend: u64,
    },
    #[error(
        "{path} needs guest memory up to {needed:#x} (load address + init_size), \
         but the guest has {mem_size:#x} bytes"
    )]
    KernelTooBig {
        path: PathBuf,
        needed: u64,
        mem_size: u64,
    },
    #[error("cannot load bzImage {path}: {source}")]
    Load {
        path: PathBuf,
        source: linux_loader::loader::Error,
    },
    #[error(
        "{path} is truncated: its setup header says {expected} bytes ({what}) but the file \
         has {actual}; copy the bzImage again"
    )]
    Truncated {
        path: PathBuf,
        what: &'static str,
        expected: u64,
        actual: u64,
    },
    #[error(
        "{path}: corrupt setup header: `{field}` is {value:#x}, {why}; the bzImage is damaged"
    )]
    CorruptHeader {
        path: PathBuf,
        field: &'static str,
        value: u64,
        why: &'static str,
    },
    #[error("initrd {path} is empty")]
    InitrdEmpty { path: PathBuf },
    #[error(
        "initrd {path} ({size} bytes) does not fit in guest memory between the kernel \
         (ends at {kernel_end:#x}) and {top:#x} (top of RAM below 4 GiB and the kernel's \
         initrd_addr_max)"
    )]
    InitrdTooLarge {
        path: PathBuf,
        size: u64,
        kernel_end: u64,
        top: u64,
    },
    #[error("cannot copy initrd {path} into guest memory at {addr:#x}: {source}")]
    InitrdCopy {
        path: PathBuf,
        addr: u64,
        source: GuestMemoryError,
    },
    #[error("kernel command line is {len} bytes; the limit is {max}")]
    CmdlineTooLong { len: usize, max: usize },
    #[error("invalid kernel command line: {0}")]
    Cmdline(linux_loader::cmdline::Error),
    #[error("cannot write the kernel command line at {addr:#x}: {source}")]
    WriteCmdline {
        addr: u64,
        source: linux_loader::loader::Error,
    },
    #[error("guest memory size {mem_size:#x}: {why}")]
    BadMemSize { mem_size: u64, why: &'static str },
    #[error("cannot write the zero page at {addr:#x}: {source}")]
    WriteZeroPage { addr: u64, source: GuestMemoryError },
}

pub(super) type Result<T> = std::result::Result<T, LinuxBootError>;
