//! Bad input: a one-line error naming the problem, exit status 2, no panic.

mod common;

use common::*;

fn assert_bad_input(args: &[&str], needle: &str) {
    let out = vmtrace(args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "args {args:?}: stderr {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "one line for {args:?}: {err}"
    );
    assert!(err.starts_with("vmtrace: "), "{err}");
    assert!(err.contains(needle), "expected {needle:?} in {err}");
    assert!(
        !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
        "{err}"
    );
}

#[test]
fn missing_kernel_file() {
    assert_bad_input(
        &["--kernel", "/nonexistent/bzImage"],
        "/nonexistent/bzImage",
    );
    assert_bad_input(&[], "--kernel");
}

#[test]
fn kernel_that_is_neither_elf_nor_bzimage() {
    let dir = std::env::temp_dir().join(format!("vmtrace-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let junk = dir.join("junk.bin");
    std::fs::write(&junk, vec![0x42u8; 8192]).unwrap();
    assert_bad_input(
        &["--kernel", junk.to_str().unwrap()],
        "neither an ELF kernel nor a bzImage",
    );
    let empty = dir.join("empty");
    std::fs::write(&empty, b"").unwrap();
    assert_bad_input(
        &["--kernel", empty.to_str().unwrap()],
        "neither an ELF kernel nor a bzImage",
    );
}

#[test]
fn cpu_count_out_of_range() {
    let k = mini_elf();
    assert_bad_input(
        &["--kernel", k.to_str().unwrap(), "--cpus", "0"],
        "--cpus 0",
    );
    assert_bad_input(
        &["--kernel", k.to_str().unwrap(), "--cpus", "65"],
        "--cpus 65",
    );
    assert_bad_input(&["--kernel", k.to_str().unwrap(), "--cpus", "many"], "many");
}

#[test]
fn too_little_or_too_much_memory() {
    let k = mini_elf();
    assert_bad_input(
        &["--kernel", k.to_str().unwrap(), "--mem", "1"],
        "--mem 1 MiB",
    );
    assert_bad_input(
        &["--kernel", k.to_str().unwrap(), "--mem", "99999"],
        "--mem 99999 MiB",
    );
}

#[test]
fn bad_timeout_and_unknown_flag() {
    let k = mini_elf();
    assert_bad_input(
        &["--kernel", k.to_str().unwrap(), "--timeout=-3"],
        "--timeout",
    );
    assert_bad_input(
        &["--kernel", k.to_str().unwrap(), "--frobnicate"],
        "--frobnicate",
    );
}

#[test]
fn no_access_to_dev_kvm() {
    // Run as an unprivileged user when we are root, so /dev/kvm (0600 root
    // or 0660 kvm) is out of reach; otherwise we already lack access or have it.
    let k = mini_elf();
    let bin = env!("CARGO_BIN_EXE_vmtrace");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let out = std::process::Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                bin,
                "--kernel",
            ])
            .arg(&k)
            .output()
            .expect("setpriv (util-linux) runs");
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains("/dev/kvm"), "{err}");
    } else {
        let out = vmtrace(&["--kernel", k.to_str().unwrap(), "--cmdline", "iters=1"]);
        if out.status.code() == Some(2) {
            assert!(stderr(&out).contains("/dev/kvm"));
        }
    }
}
