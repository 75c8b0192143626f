//! bzImage payloads: every compression the kernel offers, decompressed from
//! what the kernel's own build commands write (scripts/Makefile.lib's
//! cmd_gzip, cmd_bzip2, cmd_lzma, cmd_xzkern, cmd_lzo, cmd_lz4, cmd_zstd22,
//! each followed by `size_append` where the kernel adds it), applied to the
//! real 6.1 guest's payload.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use tracer::kernel::payload::{extract, extract_from, Compression, PAYLOAD_MAX_SIZE};

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

/// A bzImage (boot protocol 2.15, 4 setup sectors) whose header points to
/// `version` and whose payload is `elf` gzipped as the kernel does.
fn gzip_bzimage(version: &[u8], elf: &[u8]) -> Vec<u8> {
    use linux_loader::loader::bootparam::{setup_header, LOADED_HIGH, XLF_KERNEL_64};
    use vm_memory::ByteValued;
    let (cmd, append) = kernel_compressor(Compression::Gzip);
    let mut payload = compress(cmd, elf, append);
    let setup_len = 5 * 512;
    payload.resize(payload.len().next_multiple_of(16), 0);
    let hdr = setup_header {
        setup_sects: 4,
        boot_flag: 0xaa55,
        header: 0x5372_6448,
        version: 0x020f,
        loadflags: LOADED_HIGH,
        xloadflags: XLF_KERNEL_64,
        kernel_version: 0x300,
        syssize: (payload.len() / 16) as u32,
        payload_offset: 0,
        payload_length: payload.len() as u32,
        ..Default::default()
    };
    let mut image = vec![0u8; setup_len];
    image[0x1f1..0x1f1 + size_of::<setup_header>()].copy_from_slice(hdr.as_slice());
    image[0x500..0x500 + version.len()].copy_from_slice(version);
    image.extend_from_slice(&payload);
    image
}

#[test]
fn a_bzimage_rewritten_in_place_after_open_extracts_as_opened() {
    use vmm::boot::linux::bzimage_version;
    use vmm::boot::KernelFile;
    let path = std::env::temp_dir().join(format!("vmtrace-payload-rewrite-{}", std::process::id()));
    let old_elf = [b"\x7fELF old".as_slice(), &[1; 4000]].concat();
    let new_elf = [b"\x7fELF new".as_slice(), &[2; 5000]].concat();
    std::fs::write(&path, gzip_bzimage(b"6.1.0 (old) #1\0", &old_elf)).unwrap();
    let kernel = KernelFile::open(&path).unwrap();
    // `make install` or cp into the same inode, after planning.
    std::fs::write(&path, gzip_bzimage(b"6.9.9 (new) #2\0", &new_elf)).unwrap();
    assert_eq!(
        extract(&path).unwrap().elf,
        new_elf,
        "the file was rewritten"
    );

    let payload = extract_from(&kernel).unwrap();
    assert_eq!(payload.compression, Compression::Gzip);
    assert_eq!(payload.elf, old_elf);
    assert_eq!(kernel.version(), Some("6.1.0 (old) #1"));
    let mut bytes = std::io::Cursor::new(kernel.bytes().as_slice());
    let version = bzimage_version(&mut bytes, &path).unwrap();
    assert_eq!(version.as_deref(), Some("6.1.0 (old) #1"));

    // Emptied, too: the kernel file does not read the file again.
    std::fs::write(&path, b"").unwrap();
    assert_eq!(extract_from(&kernel).unwrap().elf, old_elf);
    std::fs::remove_file(&path).unwrap();
}
