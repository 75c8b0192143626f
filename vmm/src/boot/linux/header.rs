//! The bzImage's setup header (Documentation/arch/x86/boot.rst): finding
//! it, reading it, and checking it against the file before anything is
//! loaded.

use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

use linux_loader::loader::bootparam::{setup_header, LOADED_HIGH, XLF_KERNEL_64};
use vm_memory::ByteValued;

use super::error::{LinuxBootError, Result};

/// Offset of the setup header in a bzImage (and in `boot_params`).
pub(super) const SETUP_HEADER_OFFSET: u64 = 0x1f1;
/// Offset of the "HdrS" magic in a bzImage.
pub(super) const HDRS_OFFSET: u64 = 0x202;
/// "HdrS", little-endian.
pub(super) const HDRS_MAGIC: u32 = 0x5372_6448;
/// First boot protocol with the 64-bit entry point described by `xloadflags`.
pub(super) const MIN_BOOT_PROTOCOL: u16 = 0x020c;
/// `boot_flag` of a valid header.
pub(super) const BOOT_FLAG: u16 = 0xaa55;

/// Is this file (or its bytes) a bzImage? (the "HdrS" magic at 0x202). The
/// position is restored. A file too short to hold the magic is not a bzImage.
pub fn is_bzimage<R: Read + Seek>(file: &mut R) -> io::Result<bool> {
    let pos = file.stream_position()?;
    file.seek(SeekFrom::Start(HDRS_OFFSET))?;
    let mut magic = [0u8; 4];
    let found = match file.read_exact(&mut magic) {
        Ok(()) => u32::from_le_bytes(magic) == HDRS_MAGIC,
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => false,
        Err(e) => return Err(e),
    };
    file.seek(SeekFrom::Start(pos))?;
    Ok(found)
}

/// Read the setup header at 0x1f1 of a bzImage, checking the "HdrS" magic.
pub(super) fn read_setup_header<R: Read + Seek>(file: &mut R, path: &Path) -> Result<setup_header> {
    let read_err = |source| LinuxBootError::Read {
        path: path.to_owned(),
        what: "the setup header",
        source,
    };
    let not_bzimage = |file: &mut R| {
        let mut magic = [0u8; 4];
        let is_elf = file.seek(SeekFrom::Start(0)).is_ok()
            && file.read_exact(&mut magic).is_ok()
            && magic == *b"\x7fELF";
        LinuxBootError::NotBzImage {
            path: path.to_owned(),
            hint: if is_elf {
                "; it is an ELF file (a vmlinux?)"
            } else {
                ""
            },
        }
    };
    let mut hdr = setup_header::default();
    file.seek(SeekFrom::Start(SETUP_HEADER_OFFSET))
        .map_err(read_err)?;
    match file.read_exact(hdr.as_mut_slice()) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            // The magic may be there with the header cut short after it.
            return Err(match is_bzimage(file) {
                Ok(true) => LinuxBootError::HeaderCut {
                    path: path.to_owned(),
                    len: file_len(file, path)?,
                },
                _ => not_bzimage(file),
            });
        }
        Err(e) => return Err(read_err(e)),
    }
    if hdr.header != HDRS_MAGIC {
        return Err(not_bzimage(file));
    }
    Ok(hdr)
}

/// Read a bzImage's setup header and check it against the file: the magic,
/// `boot_flag`, the setup sectors and `syssize` (the protected-mode kernel's
/// size) inside the file, a 64-bit boot protocol. Returns the header.
pub fn check_bzimage<R: Read + Seek>(file: &mut R, path: &Path) -> Result<setup_header> {
    let hdr = read_setup_header(file, path)?;
    let file_len = file_len(file, path)?;
    let corrupt = |field, value: u64, why| LinuxBootError::CorruptHeader {
        path: path.to_owned(),
        field,
        value,
        why,
    };
    if hdr.boot_flag != BOOT_FLAG {
        return Err(corrupt("boot_flag", hdr.boot_flag.into(), "not 0xaa55"));
    }
    let setup_len = setup_len(&hdr);
    if setup_len > file_len {
        return Err(LinuxBootError::Truncated {
            path: path.to_owned(),
            what: "setup_sects",
            expected: setup_len,
            actual: file_len,
        });
    }
    let syssize = u64::from(hdr.syssize);
    if syssize == 0 {
        return Err(corrupt("syssize", 0, "an empty protected-mode kernel"));
    }
    // `syssize` counts 16-byte paragraphs; a u32 times 16 cannot overflow.
    if setup_len + syssize * 16 > file_len {
        return Err(LinuxBootError::Truncated {
            path: path.to_owned(),
            what: "setup sectors + syssize",
            expected: setup_len + syssize * 16,
            actual: file_len,
        });
    }
    check_boot_protocol(&hdr, path)?;
    if hdr.kernel_version != 0 && u64::from(hdr.kernel_version) + 0x200 >= setup_len {
        return Err(corrupt(
            "kernel_version",
            hdr.kernel_version.into(),
            "points past the setup code",
        ));
    }
    Ok(hdr)
}

/// The setup code's length in the file, boot sector included.
pub(super) fn setup_len(hdr: &setup_header) -> u64 {
    // A u8 widened to u64: (255 + 1) * 512 cannot overflow.
    let sects = match hdr.setup_sects {
        0 => 4,
        n => u64::from(n),
    };
    (sects + 1) * 512
}

/// Longest kernel version string read (the kernel's is well under 200 bytes).
pub(super) const VERSION_MAX: usize = 512;

/// The bzImage's kernel version string (the setup header's `kernel_version`
/// points to it, e.g. "6.1.192 (user@host) #1 SMP ..."), if it has one. The
/// header is checked first (`check_bzimage`).
pub fn bzimage_version<R: Read + Seek>(file: &mut R, path: &Path) -> Result<Option<String>> {
    let hdr = check_bzimage(file, path)?;
    if hdr.kernel_version == 0 {
        return Ok(None);
    }
    let read_err = |source| LinuxBootError::Read {
        path: path.to_owned(),
        what: "the kernel version",
        source,
    };
    file.seek(SeekFrom::Start(u64::from(hdr.kernel_version) + 0x200))
        .map_err(read_err)?;
    let mut buf = Vec::with_capacity(VERSION_MAX);
    file.by_ref()
        .take(VERSION_MAX as u64)
        .read_to_end(&mut buf)
        .map_err(read_err)?;
    let Some(end) = buf.iter().position(|&b| b == 0) else {
        return Ok(None);
    };
    Ok(Some(String::from_utf8_lossy(&buf[..end]).into_owned()))
}

/// The kernel must speak boot protocol 2.12+ with a 64-bit entry point and be
/// a bzImage (loaded high).
pub(super) fn check_boot_protocol(hdr: &setup_header, path: &Path) -> Result<()> {
    let unsupported = |field, value: u64, why| {
        Err(LinuxBootError::UnsupportedKernel {
            path: path.to_owned(),
            field,
            value,
            why,
        })
    };
    if hdr.version < MIN_BOOT_PROTOCOL {
        return unsupported(
            "version",
            hdr.version.into(),
            "boot protocol older than 2.12, no 64-bit entry point",
        );
    }
    if hdr.xloadflags & XLF_KERNEL_64 == 0 {
        return unsupported(
            "xloadflags",
            hdr.xloadflags.into(),
            "XLF_KERNEL_64 not set: no 64-bit entry point",
        );
    }
    if hdr.loadflags & LOADED_HIGH == 0 {
        return unsupported(
            "loadflags",
            hdr.loadflags.into(),
            "LOADED_HIGH not set: a zImage, not a bzImage",
        );
    }
    Ok(())
}

/// The kernel's size, for checking header fields against it: the length of
/// what `file` reads (a file's or the bytes read from it), its position
/// restored.
pub(super) fn file_len<R: Seek>(file: &mut R, path: &Path) -> Result<u64> {
    let read_err = |source| LinuxBootError::Read {
        path: path.to_owned(),
        what: "the size",
        source,
    };
    let pos = file.stream_position().map_err(read_err)?;
    let len = file.seek(SeekFrom::End(0)).map_err(read_err)?;
    file.seek(SeekFrom::Start(pos)).map_err(read_err)?;
    Ok(len)
}
