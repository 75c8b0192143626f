//! Hostile input files, refused in seconds with one line and exit status 2,
//! before any guest boots: FIFOs and devices, files too large, truncated or
//! corrupt bzImages, ELF segments outside RAM, a vmlinux that is not the
//! kernel's, a selection with nothing to patch. (Issue 14, input side.)
//!
//! No Linux guest runs here: every Linux case is refused before the VM exists
//! (each command also carries `--timeout 5`, should that ever break).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

use common::*;

/// Far less than a Linux boot takes here (minutes), far more than checking
/// the inputs even on a loaded host: a guard that ends a hung run or a
/// booted guest, not a measured time (CI hosts are noisy).
const REFUSED_WITHIN: Duration = Duration::from_secs(60);

/// A fresh directory for one test.
fn scratch(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "inputs-{}-{name}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// guest/out/bzImage, built (from the cache when warm) if absent; never booted.
fn bzimage() -> PathBuf {
    static BUILD: Once = Once::new();
    let p = root().join("guest/out/bzImage");
    BUILD.call_once(|| {
        if !p.is_file() || !root().join("guest/out/vmlinux").is_file() {
            let st = Command::new("bash")
                .arg(root().join("guest/build.sh"))
                .arg("linux")
                .status()
                .expect("run guest/build.sh linux");
            assert!(st.success(), "guest/build.sh linux failed");
        }
    });
    p
}

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a NUL-terminated path that outlives the call; mkfifo
    // only reads it.
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(rc, 0, "mkfifo {}", std::io::Error::last_os_error());
}

/// Runs vmtrace, killing it if it has not ended in `REFUSED_WITHIN` (a hang
/// is a failure, not a stuck test); asserts a one-line input error with `needle`.
fn assert_refused(args: &[&str], needle: &str) -> String {
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_vmtrace"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run vmtrace");
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if started.elapsed() > REFUSED_WITHIN {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{args:?} still running after {REFUSED_WITHIN:?} (hung, or a guest booted): {}",
                stderr(&out)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("vmtrace: "), "{err}");
    assert!(err.contains(needle), "expected {needle:?} in {err}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

/// `--vmlinux /dev/zero` grew without bound (3.4 GB in 6 s); a FIFO as
/// `--vmlinux` or `report -i` blocked forever.
#[test]
fn devices_and_fifos_are_refused() {
    let mini = mini_elf();
    let mini = mini.to_str().unwrap();
    assert_refused(
        &[
            "--kernel",
            mini,
            "--vmlinux",
            "/dev/zero",
            "--trace",
            "do_idle",
        ],
        "vmlinux /dev/zero is a character device, not a regular file",
    );
    let dir = scratch("fifo");
    let fifo = dir.join("fifo");
    mkfifo(&fifo);
    let f = fifo.to_str().unwrap();
    assert_refused(
        &["--kernel", mini, "--vmlinux", f, "--trace", "do_idle"],
        "is a FIFO (named pipe), not a regular file",
    );
    assert_refused(&["report", "-i", f], "not a regular file");
    assert_refused(&["report", "-i", "/dev/zero"], "not a regular file");
    assert_refused(
        &[
            "--kernel",
            mini,
            "--vmlinux",
            dir.to_str().unwrap(),
            "--trace",
            "do_idle",
        ],
        "is a directory",
    );
}

/// A FIFO or an initrd larger than guest RAM, with the Linux bzImage.
#[test]
fn initrd_fifo_and_oversized_initrd_are_refused() {
    let bz = bzimage();
    let bz = bz.to_str().unwrap();
    let dir = scratch("initrd");
    let fifo = dir.join("fifo");
    mkfifo(&fifo);
    assert_refused(
        &[
            "--kernel",
            bz,
            "--initrd",
            fifo.to_str().unwrap(),
            "--timeout",
            "5",
        ],
        "not a regular file",
    );
    let big = dir.join("big.cpio");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    assert_refused(
        &[
            "--kernel",
            bz,
            "--initrd",
            big.to_str().unwrap(),
            "--mem",
            "32",
            "--timeout",
            "5",
        ],
        "more than 33554432",
    );
}

/// The mini guest's ELF as the bzImage's vmlinux waited 109 s for sites that
/// never became NOPs; now refused before the VM exists.
#[test]
fn wrong_vmlinux_for_the_bzimage_is_refused() {
    let bz = bzimage();
    let mini = mini_elf();
    let err = assert_refused(
        &[
            "--kernel",
            bz.to_str().unwrap(),
            "--vmlinux",
            mini.to_str().unwrap(),
            "--trace",
            "do_idle",
            "--timeout",
            "5",
        ],
        "does not match kernel",
    );
    assert!(err.contains("no linux_banner"), "{err}");
}

/// `--trace start_kernel` selects only init text: it booted and ended in
/// "before vmtrace could attach".
#[test]
fn selection_with_only_init_text_is_refused() {
    let bz = bzimage();
    let vmlinux = root().join("guest/out/vmlinux");
    assert_refused(
        &[
            "--kernel",
            bz.to_str().unwrap(),
            "--vmlinux",
            vmlinux.to_str().unwrap(),
            "--trace",
            "start_kernel",
            "--timeout",
            "5",
        ],
        "no patchable site",
    );
}

/// A truncated bzImage (its `syssize` says so) or a corrupt setup header
/// booted and triple-faulted or ran to the timeout.
#[test]
fn truncated_or_corrupt_bzimage_is_refused() {
    let bytes = std::fs::read(bzimage()).unwrap();
    let dir = scratch("bz");
    let cut = dir.join("bzImage.cut");
    std::fs::write(&cut, &bytes[..bytes.len() - 4096]).unwrap();
    assert_refused(
        &["--kernel", cut.to_str().unwrap(), "--timeout", "5"],
        "is truncated",
    );
    let mut bad = bytes.clone();
    bad[0x1fe] = 0; // boot_flag
    let p = dir.join("bzImage.flag");
    std::fs::write(&p, &bad).unwrap();
    assert_refused(
        &["--kernel", p.to_str().unwrap(), "--timeout", "5"],
        "corrupt setup header: `boot_flag`",
    );
    let mut bad = bytes;
    bad[0x1f4..0x1f8].copy_from_slice(&u32::MAX.to_le_bytes()); // syssize
    let p = dir.join("bzImage.syssize");
    std::fs::write(&p, &bad).unwrap();
    assert_refused(
        &["--kernel", p.to_str().unwrap(), "--timeout", "5"],
        "is truncated",
    );
}

/// An ELF kernel whose segment lies outside guest RAM was accepted.
#[test]
fn elf_segment_outside_ram_is_refused() {
    let mut elf = std::fs::read(mini_elf()).unwrap();
    // Move the first PT_LOAD's physical address to 2 GiB (ELF64 LE).
    let phoff = u64::from_le_bytes(elf[32..40].try_into().unwrap()) as usize;
    let phentsize = u16::from_le_bytes(elf[54..56].try_into().unwrap()) as usize;
    let phnum = u16::from_le_bytes(elf[56..58].try_into().unwrap()) as usize;
    let ph = (0..phnum)
        .map(|i| phoff + i * phentsize)
        .find(|&p| u32::from_le_bytes(elf[p..p + 4].try_into().unwrap()) == 1)
        .expect("a PT_LOAD");
    elf[ph + 24..ph + 32].copy_from_slice(&(2u64 << 30).to_le_bytes());
    let dir = scratch("elf");
    let p = dir.join("mini-high.elf");
    std::fs::write(&p, &elf).unwrap();
    assert_refused(
        &[
            "--kernel",
            p.to_str().unwrap(),
            "--mem",
            "64",
            "--timeout",
            "5",
        ],
        "outside guest RAM",
    );
}
