//! A bzImage's payload: the compressed kernel that the bzImage's own
//! decompressor unpacks at boot (arch/x86/boot/compressed). On x86 it is the
//! kernel's vmlinux after `objcopy -R .comment -S`: still an ELF file, with
//! its sections, `__mcount_loc` and kallsyms, but no symbol table.
//!
//! The setup header's `payload_offset`/`payload_length` (boot protocol 2.08+)
//! locate it; its first bytes say how it is compressed, as the kernel's own
//! lib/decompress.c decides.

mod lz4;
mod lzo;

use std::io::{Read, Seek};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use linux_loader::loader::bootparam::setup_header;
use vmm::advice::Advice;
use vmm::boot::linux::{check_bzimage, LinuxBootError};
use vmm::boot::KernelFile;
use vmm::boot::{open_input, read_input, FileError, KERNEL_MAX_SIZE, VMLINUX_MAX_SIZE};

use crate::advice::{Plain, Remedy, TracerAdvice, TracerWords};

/// First boot protocol whose header has `payload_offset`/`payload_length`.
const PAYLOAD_PROTOCOL: u16 = 0x0208;
/// Where `payload_offset` counts from: the protected-mode code follows the
/// setup sectors.
const SECTOR: u64 = 512;
/// The decompressed payload is a vmlinux: at most as large as one vmtrace
/// reads at all.
pub const PAYLOAD_MAX_SIZE: u64 = VMLINUX_MAX_SIZE;

/// How a bzImage's payload is compressed: every `CONFIG_KERNEL_*` choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    Gzip,
    Bzip2,
    Lzma,
    Xz,
    Lzo,
    Lz4,
    Zstd,
}

impl Compression {
    /// Every compression, for messages and tests.
    pub const ALL: [Compression; 7] = [
        Compression::Gzip,
        Compression::Bzip2,
        Compression::Lzma,
        Compression::Xz,
        Compression::Lzo,
        Compression::Lz4,
        Compression::Zstd,
    ];

    /// Recognise a compressed stream by its first bytes (the magic numbers of
    /// lib/decompress.c's table).
    pub fn detect(data: &[u8]) -> Option<Compression> {
        const MAGIC: [(&[u8], Compression); 8] = [
            (&[0x1f, 0x8b], Compression::Gzip),
            (&[0x1f, 0x9e], Compression::Gzip),
            (b"BZh", Compression::Bzip2),
            (&[0x5d, 0x00, 0x00], Compression::Lzma),
            (&[0xfd, b'7', b'z', b'X', b'Z', 0x00], Compression::Xz),
            (&[0x89, b'L', b'Z', b'O'], Compression::Lzo),
            (&[0x02, 0x21, 0x4c, 0x18], Compression::Lz4),
            (&[0x28, 0xb5, 0x2f, 0xfd], Compression::Zstd),
        ];
        MAGIC
            .iter()
            .find(|(magic, _)| data.starts_with(magic))
            .map(|&(_, c)| c)
    }

    pub fn name(self) -> &'static str {
        match self {
            Compression::Gzip => "gzip",
            Compression::Bzip2 => "bzip2",
            Compression::Lzma => "lzma",
            Compression::Xz => "xz",
            Compression::Lzo => "lzo",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        }
    }

    /// Decompress a whole stream as the kernel's Makefile wrote it (some
    /// formats followed by the 4-byte size that `size_append` adds), to at
    /// most `limit` bytes.
    pub fn decompress(self, data: &[u8], limit: u64) -> Result<Vec<u8>, String> {
        let bounded = |r: &mut dyn Read| -> Result<Vec<u8>, String> {
            let mut out = Vec::new();
            r.take(limit + 1)
                .read_to_end(&mut out)
                .map_err(|e| e.to_string())?;
            if out.len() as u64 > limit {
                return Err(format!("it decompresses to more than {limit} bytes"));
            }
            Ok(out)
        };
        match self {
            Compression::Gzip => bounded(&mut flate2::read::GzDecoder::new(data)),
            // One stream: the 4 size bytes after it are not a second one.
            Compression::Bzip2 => bounded(&mut bzip2::read::BzDecoder::new(data)),
            Compression::Lzma => {
                let mut r = lzma_rust2::LzmaReader::new_mem_limit(data, u32::MAX, None)
                    .map_err(|e| e.to_string())?;
                bounded(&mut r)
            }
            // scripts/xz_wrap.sh adds the x86 BCJ filter, which this reader
            // undoes; one stream, no padding.
            Compression::Xz => bounded(&mut lzma_rust2::XzReader::new(data, false)),
            Compression::Lzo => lzo::decompress_lzop(data, limit),
            Compression::Lz4 => lz4::decompress_legacy(data, limit),
            Compression::Zstd => {
                // One frame: the 4 size bytes after it are not a second one.
                let mut r =
                    ruzstd::decoding::StreamingDecoder::new(data).map_err(|e| e.to_string())?;
                bounded(&mut r)
            }
        }
    }
}

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a bzImage's payload could not be had.
#[derive(Debug, thiserror::Error)]
pub enum PayloadError {
    #[error("{}", self.say(&Plain))]
    File(#[from] FileError),
    #[error(transparent)]
    Header(#[from] LinuxBootError),
    #[error("{} is not a bzImage: it has no payload", path.display())]
    NotBzImage { path: PathBuf },
    #[error("cannot read bzImage {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}", self.say(&Plain))]
    OldProtocol { path: PathBuf, version: u16 },
    #[error("{}", self.say(&Plain))]
    OutOfFile {
        path: PathBuf,
        offset: u64,
        len: u64,
        file_len: u64,
    },
    #[error("{}", self.say(&Plain))]
    UnknownCompression {
        path: PathBuf,
        offset: u64,
        magic: String,
    },
    #[error("{}", self.say(&Plain))]
    Corrupt {
        path: PathBuf,
        compression: Compression,
        offset: u64,
        why: String,
    },
    #[error("{}", self.say(&Plain))]
    NotElf {
        path: PathBuf,
        compression: Compression,
        magic: String,
    },
}

/// Every payload error but a file's says to pass the vmlinux instead.
impl TracerAdvice for PayloadError {
    fn problem(&self, w: &dyn TracerWords) -> String {
        match self {
            // The VMM's error, in the VMM's part of the words.
            PayloadError::File(e) => e.problem(w),
            PayloadError::OldProtocol { path, version } => format!(
                "{}: boot protocol {version:#06x} has no payload fields (2.08+ needed)",
                path.display()
            ),
            PayloadError::OutOfFile {
                path,
                offset,
                len,
                file_len,
            } => format!(
                "{}: payload at {offset:#x}+{len:#x} lies outside the file ({file_len:#x} bytes); \
                 the bzImage is corrupt or truncated",
                path.display()
            ),
            PayloadError::UnknownCompression {
                path,
                offset,
                magic,
            } => format!(
                "{}: unknown payload compression (first bytes {magic} at file offset {offset:#x}; \
                 known: gzip, bzip2, lzma, xz, lzo, lz4, zstd)",
                path.display()
            ),
            PayloadError::Corrupt {
                path,
                compression,
                offset,
                why,
            } => format!(
                "{}: corrupt {compression} payload at file offset {offset:#x} ({why})",
                path.display()
            ),
            PayloadError::NotElf {
                path,
                compression,
                magic,
            } => format!(
                "{}: the decompressed {compression} payload is not an ELF file (it starts {magic})",
                path.display()
            ),
            e => e.to_string(),
        }
    }

    fn remedy(&self) -> Option<Remedy> {
        match self {
            PayloadError::OldProtocol { .. }
            | PayloadError::OutOfFile { .. }
            | PayloadError::UnknownCompression { .. }
            | PayloadError::Corrupt { .. }
            | PayloadError::NotElf { .. } => Some(Remedy::KernelVmlinux),
            PayloadError::File(_)
            | PayloadError::Header(_)
            | PayloadError::NotBzImage { .. }
            | PayloadError::Read { .. } => None,
        }
    }
}

/// A bzImage's payload, decompressed.
#[derive(Debug)]
pub struct Payload {
    pub compression: Compression,
    /// The stripped vmlinux ELF (possibly followed by relocation data, which
    /// an ELF reader ignores).
    pub elf: Vec<u8>,
    /// How long decompression took.
    pub elapsed: Duration,
}

/// Read and decompress the payload of the bzImage at `path`.
pub fn extract(path: &Path) -> Result<Payload, PayloadError> {
    let (mut file, size) = open_input(path, "kernel", KERNEL_MAX_SIZE, "the largest guest memory")?;
    let hdr = check_bzimage(&mut file, path)?;
    let read_err = |source| PayloadError::Read {
        path: path.to_owned(),
        source,
    };
    // The header checks left the position inside the file.
    file.rewind().map_err(read_err)?;
    let bytes = read_input(&file, size).map_err(read_err)?;
    extract_body(&bytes, &hdr, path)
}

/// The payload of a bzImage opened once (its header checked then), from the
/// bytes read then: the file is not read again.
pub fn extract_from(kernel: &KernelFile) -> Result<Payload, PayloadError> {
    let path = kernel.path();
    let Some(hdr) = kernel.setup_header() else {
        return Err(PayloadError::NotBzImage {
            path: path.to_owned(),
        });
    };
    extract_body(kernel.bytes(), hdr, path)
}

/// The payload of the bzImage whose bytes are `bytes` (header `hdr`).
fn extract_body(bytes: &[u8], hdr: &setup_header, path: &Path) -> Result<Payload, PayloadError> {
    if hdr.version < PAYLOAD_PROTOCOL {
        return Err(PayloadError::OldProtocol {
            path: path.to_owned(),
            version: hdr.version,
        });
    }
    let sects = match hdr.setup_sects {
        0 => 4,
        n => u64::from(n),
    };
    let offset = (sects + 1) * SECTOR + u64::from(hdr.payload_offset);
    let len = u64::from(hdr.payload_length);
    let file_len = bytes.len() as u64;
    let data = offset
        .checked_add(len)
        .filter(|&end| len > 0 && end <= file_len)
        .map(|end| &bytes[offset as usize..end as usize])
        .ok_or_else(|| PayloadError::OutOfFile {
            path: path.to_owned(),
            offset,
            len,
            file_len,
        })?;
    let Some(compression) = Compression::detect(data) else {
        return Err(PayloadError::UnknownCompression {
            path: path.to_owned(),
            offset,
            magic: hex(&data[..data.len().min(6)]),
        });
    };
    let start = Instant::now();
    let elf = compression
        .decompress(data, PAYLOAD_MAX_SIZE)
        .map_err(|why| PayloadError::Corrupt {
            path: path.to_owned(),
            compression,
            offset,
            why,
        })?;
    let elapsed = start.elapsed();
    if !elf.starts_with(b"\x7fELF") {
        return Err(PayloadError::NotElf {
            path: path.to_owned(),
            compression,
            magic: hex(&elf[..elf.len().min(4)]),
        });
    }
    Ok(Payload {
        compression,
        elf,
        elapsed,
    })
}

/// "1f 8b 08" for messages.
fn hex(bytes: &[u8]) -> String {
    let words: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    if words.is_empty() {
        "(none)".into()
    } else {
        words.join(" ")
    }
}
