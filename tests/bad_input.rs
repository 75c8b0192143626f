//! Bad input: a one-line error naming the problem, exit status 2, no panic,
//! and refused before any guest boots.

mod common;

use std::path::PathBuf;

use common::*;

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
    let dir = scratch();
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

/// A scratch directory for this test process.
fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vmtrace-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A file vmtrace classifies as a bzImage (the "HdrS" magic at 0x202) but
/// that no loader could boot: a refusal that names it proves nothing booted.
fn fake_bzimage() -> PathBuf {
    let mut bytes = vec![0u8; 8192];
    bytes[0x202..0x206].copy_from_slice(b"HdrS");
    let path = scratch().join("bzImage");
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn from_boot_with_a_linux_kernel_is_refused_before_the_vm_exists() {
    let bz = fake_bzimage();
    assert_bad_input(
        &[
            "--kernel",
            bz.to_str().unwrap(),
            "--vmlinux",
            mini_elf().to_str().unwrap(),
            "--trace",
            "*",
            "--from-boot",
        ],
        "--from-boot is not possible with Linux",
    );
    // Before the vmlinux is even looked for (there is none beside it).
    assert_bad_input(
        &[
            "--kernel",
            bz.to_str().unwrap(),
            "--trace",
            "*",
            "--from-boot",
        ],
        "--from-boot is not possible with Linux",
    );
}

#[test]
fn duration_and_from_boot_need_trace() {
    let k = mini_elf();
    let k = k.to_str().unwrap();
    // mode=loop never ends by itself: a run that got this far would time out.
    let base = ["--kernel", k, "--cmdline", "mode=loop", "--timeout", "30"];
    let with = |extra: &[&'static str]| [&base[..], extra].concat();
    assert_bad_input(&with(&["--duration", "1"]), "--duration needs --trace");
    assert_bad_input(&with(&["--from-boot"]), "--from-boot needs --trace");
    let bz = fake_bzimage();
    assert_bad_input(
        &["--kernel", bz.to_str().unwrap(), "--from-boot"],
        "--from-boot needs --trace",
    );
}

#[test]
fn bad_trace_options_are_refused_before_the_guest_boots() {
    let k = mini_elf();
    let k = k.to_str().unwrap();
    let base = [
        "--kernel",
        k,
        "--cmdline",
        "mode=loop",
        "--timeout",
        "30",
        "--trace",
        "hrtimer_*",
    ];
    let with = |extra: &[&'static str]| [&base[..], extra].concat();
    assert_bad_input(&with(&["--duration=-1"]), "--duration -1");
    assert_bad_input(&with(&["--duration", "0"]), "--duration 0");
    assert_bad_input(&with(&["--cpu", "3-1"]), "--cpu: bad CPU range '3-1'");
    assert_bad_input(&with(&["--trace", "no_such_fn_*"]), "no_such_fn_*");
    assert_bad_input(&with(&["--cpus", "0"]), "--cpus 0");
    // Output options are checked for an untraced run too.
    assert_bad_input(
        &[
            "--kernel",
            k,
            "--cmdline",
            "mode=loop",
            "--timeout",
            "30",
            "--cpu",
            "x",
        ],
        "--cpu: bad CPU number 'x'",
    );
}

#[test]
fn initrd_and_command_line_are_checked_before_the_vm_exists() {
    let k = mini_elf();
    let k = k.to_str().unwrap();
    assert_bad_input(
        &["--kernel", k, "--initrd", "/nonexistent/initrd.gz"],
        "initrd /nonexistent/initrd.gz does not exist",
    );
    let initrd = scratch().join("initrd");
    std::fs::write(&initrd, b"070701").unwrap();
    assert_bad_input(
        &["--kernel", k, "--initrd", initrd.to_str().unwrap()],
        "--initrd needs a Linux kernel",
    );
    let long = "x".repeat(3000);
    assert_bad_input(
        &["--kernel", k, "--cmdline", &long],
        "command line is 3000 bytes; the limit is 2047",
    );
    let console = "/nonexistent/dir/console.log";
    assert_bad_input(
        &["--kernel", k, "--console", console],
        "cannot write the console to /nonexistent/dir/console.log: directory /nonexistent/dir does not exist",
    );
}

#[test]
fn report_options_are_checked_before_the_trace_is_read() {
    // The input does not exist: the option error comes first.
    assert_bad_input(
        &["report", "-i", "/nonexistent.vmt", "-o", "/tmp/out.txt"],
        "vmtrace report -o needs --format json, csv or chrome",
    );
    assert_bad_input(
        &["report", "-i", "/nonexistent.vmt", "--cpu", "1,,2"],
        "--cpu: empty entry",
    );
}

#[test]
fn bench_counts_must_be_positive() {
    for flag in ["--iters", "--rounds", "--cycles", "--report-events"] {
        assert_bad_input(&["bench", flag, "0"], &format!("{flag} must be at least 1"));
    }
    assert_bad_input(&["bench", "--cpus", "65"], "--cpus 65 is out of range");
}
