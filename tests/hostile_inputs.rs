//! Inputs and outputs users get wrong by accident (issue 22, item 14),
//! each refused before any guest boots: one line naming the problem, exit
//! status 2, never a hang on a FIFO or a device, nothing written. Most were
//! right already; these tests keep them so for every command that reads.

mod common;

use std::path::{Path, PathBuf};
use std::time::Instant;

use common::*;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vmtrace-hinputs-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(s(p)).unwrap();
    // SAFETY: `c` is a NUL-terminated path that outlives the call; mkfifo
    // only reads it.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

/// Refused in one line with exit 2, quickly (`assert_bad_input`), run in
/// `dir` (where `record` would write vmtrace.data).
fn refused_in(dir: &Path, args: &[&str], needle: &str) {
    let started = Instant::now();
    let o = vmtrace_in(dir, args);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert!(started.elapsed() < REFUSED_WITHIN, "{args:?}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    assert!(
        err.starts_with("vmtrace: ") && err.contains(needle),
        "{args:?}: expected {needle:?} in {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// `report` and `script` of a FIFO, a directory and a character device,
/// as FILE and as `-i FILE`; `list --kernel` and `--vmlinux` of them.
#[test]
fn report_script_and_list_of_a_fifo_a_directory_or_a_device() {
    let dir = scratch("special");
    let fifo = dir.join("fifo");
    mkfifo(&fifo);
    let sub = dir.join("sub");
    std::fs::create_dir(&sub).unwrap();
    for (path, says) in [
        (s(&fifo), "it is a FIFO (named pipe), not a regular file"),
        (s(&sub), "it is a directory, not a regular file"),
        ("/dev/zero", "it is a character device, not a regular file"),
        ("/dev/null", "it is a character device, not a regular file"),
    ] {
        for cmd in ["report", "script"] {
            refused_in(&dir, &[cmd, path], says);
            refused_in(&dir, &[cmd, "-i", path], says);
        }
        refused_in(&dir, &["report", path, "--export", "trace.dat=t.dat"], says);
        assert!(!dir.join("t.dat").exists());
    }
    for path in [s(&fifo), s(&sub), "/dev/zero"] {
        refused_in(&dir, &["list", "--kernel", path], "is not a file");
        refused_in(&dir, &["list", "--vmlinux", path], "not a regular file");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Truncated, empty and non-kernel images, to the run, `record` and `list`.
/// Before: `list` of a truncated x86-64 ELF said "it is big-endian or
/// 32-bit".
#[test]
fn truncated_empty_and_non_kernel_images() {
    let dir = scratch("images");
    let elf = std::fs::read(mini_elf()).unwrap();
    let cut = dir.join("cut.elf");
    std::fs::write(&cut, &elf[..elf.len() / 2]).unwrap();
    let headers_only = dir.join("headers.elf");
    std::fs::write(&headers_only, &elf[..200]).unwrap();
    let empty = dir.join("empty");
    std::fs::write(&empty, b"").unwrap();
    let text = dir.join("notes.txt");
    std::fs::write(&text, b"not a kernel, just some text\n").unwrap();
    for (kernel, says) in [
        (&cut, "truncated"),
        (&empty, "is neither an ELF kernel nor a bzImage"),
        (&text, "is neither an ELF kernel nor a bzImage"),
    ] {
        let k = s(kernel);
        refused_in(&dir, &["--kernel", k, "--trace", "*"], says);
        refused_in(&dir, &["record", "--kernel", k, "--trace", "*"], says);
        refused_in(&dir, &["list", "--kernel", k], says);
    }
    refused_in(
        &dir,
        &["list", "--vmlinux", s(&headers_only)],
        "is the file truncated or damaged? pass an intact vmlinux",
    );
    refused_in(&dir, &["list", "--vmlinux", s(&empty)], "the file is empty");
    refused_in(
        &dir,
        &["list", "--vmlinux", s(&text)],
        "pass the kernel's vmlinux",
    );
    assert!(
        !dir.join("vmtrace.data").exists(),
        "a refused record wrote a file"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `-o` a directory, a FIFO, a read-only file (refused even as root, who
/// could write it): each left as it was, nothing else written.
#[test]
fn record_o_a_directory_a_fifo_or_a_read_only_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("outputs");
    let k = mini_elf();
    let fifo = dir.join("fifo");
    mkfifo(&fifo);
    let sub = dir.join("sub");
    std::fs::create_dir(&sub).unwrap();
    let ro = dir.join("ro.data");
    std::fs::write(&ro, b"keep").unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o444)).unwrap();
    for (path, says) in [
        (&sub, "it is a directory"),
        (&fifo, "it is a FIFO"),
        (
            &ro,
            "it is a read-only file; make it writable (chmod u+w) or choose another path",
        ),
    ] {
        for form in [&["record"][..], &[][..]] {
            let mut args = form.to_vec();
            args.extend(["--kernel", s(&k), "--trace", "*", "-o", s(path)]);
            refused_in(&dir, &args, says);
        }
    }
    assert_eq!(std::fs::read(&ro).unwrap(), b"keep");
    let mut left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(left, ["fifo", "ro.data", "sub"]);
    let _ = std::fs::remove_dir_all(&dir);
}
