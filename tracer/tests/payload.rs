//! bzImage payloads: every compression the kernel offers, decompressed from
//! what the kernel's own build commands write (scripts/Makefile.lib's
//! cmd_gzip, cmd_bzip2, cmd_lzma, cmd_xzkern, cmd_lzo, cmd_lz4, cmd_zstd22,
//! each followed by `size_append` where the kernel adds it), applied to the
//! real 6.1 guest's payload.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use tracer::kernel::payload::{extract, Compression, PAYLOAD_MAX_SIZE};

fn guest_out() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../guest/out")
}

/// The 6.1 guest's decompressed payload, or None with a message.
fn payload_61() -> Option<Vec<u8>> {
    let bz = guest_out().join("bzImage");
    if !bz.is_file() {
        eprintln!(
            "SKIPPED: {} is not built; run `bash guest/build.sh linux`",
            bz.display()
        );
        return None;
    }
    Some(extract(&bz).unwrap().elf)
}

/// `cmd` (the kernel Makefile's compressor) run on `input`, plus the 4-byte
/// little-endian size when the kernel appends it.
fn compress(cmd: &[&str], input: &[u8], size_append: bool) -> Vec<u8> {
    let mut child = Command::new(cmd[0])
        .args(&cmd[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run {} ({e}); .ci/run installs it: apt-get install gzip bzip2 xz-utils lzop lz4 zstd", cmd[0])
        });
    let mut stdin = child.stdin.take().unwrap();
    let data = input.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&data));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "{cmd:?} failed");
    let mut v = out.stdout;
    if size_append {
        v.extend_from_slice(&(input.len() as u32).to_le_bytes());
    }
    v
}

/// The kernel's commands for each compression (Linux 6.1-6.12).
fn kernel_compressor(c: Compression) -> (&'static [&'static str], bool) {
    match c {
        Compression::Gzip => (&["gzip", "-n", "-f", "-9"], false),
        Compression::Bzip2 => (&["bzip2", "-9"], true),
        Compression::Lzma => (&["lzma", "-9"], true),
        // scripts/xz_wrap.sh for x86.
        Compression::Xz => (
            &["xz", "--check=crc32", "--x86", "--lzma2=,dict=32MiB"],
            true,
        ),
        Compression::Lzo => (&["lzop", "-9"], true),
        Compression::Lz4 => (&["lz4", "-l", "-c1"], true),
        Compression::Zstd => (&["zstd", "-22", "--ultra"], true),
    }
}

#[test]
fn every_kernel_compression_of_a_real_payload_decompresses() {
    let Some(elf) = payload_61() else { return };
    // 2 MiB of the real kernel's text (it starts 2 MiB into the file, after
    // the ELF headers and zero padding): real data, and quick with the
    // decoders built unoptimised and zstd -22 compressing.
    let input = &elf[2 << 20..(4 << 20).min(elf.len())];
    for c in Compression::ALL {
        let (cmd, size_append) = kernel_compressor(c);
        let stream = compress(cmd, input, size_append);
        assert_eq!(Compression::detect(&stream), Some(c), "{c}: magic");
        let t = Instant::now();
        let out = c
            .decompress(&stream, PAYLOAD_MAX_SIZE)
            .unwrap_or_else(|e| panic!("{c}: {e}"));
        eprintln!(
            "{c}: {} -> {} bytes in {:?}",
            stream.len(),
            out.len(),
            t.elapsed()
        );
        assert!(out == input, "{c}: decompressed bytes differ");
        // A limit below the size is an error, not a truncated result.
        assert!(
            c.decompress(&stream, input.len() as u64 - 1).is_err(),
            "{c}: limit"
        );
        // A truncated stream is an error (never a panic).
        let cut = &stream[..stream.len() / 2];
        assert!(
            c.decompress(cut, PAYLOAD_MAX_SIZE).is_err(),
            "{c}: truncated"
        );
    }
}

#[test]
fn unknown_magic_is_no_compression() {
    assert_eq!(Compression::detect(b"\x7fELF\x02\x01"), None);
    assert_eq!(Compression::detect(b""), None);
    assert_eq!(Compression::detect(&[0x1f]), None);
}
