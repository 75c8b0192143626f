//! Where the kernel is when its IA32_LSTAR is never set (a FRED kernel,
//! Linux 6.9+: `syscall_init` skips it): the mini guest, which never
//! writes IA32_LSTAR, traced with symbols that make it look like Linux
//! to vmtrace's KASLR detection (an `entry_SYSCALL_64` and a
//! `linux_banner`, renamed from the mini guest's own symbols by objcopy).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// A copy of the mini guest with `renames` (old=new) applied to its symbols.
fn renamed(name: &str, renames: &[&str]) -> PathBuf {
    let out = std::env::temp_dir().join(format!("vmtrace-{name}-{}.elf", std::process::id()));
    let mut cmd = Command::new("objcopy");
    for r in renames {
        cmd.args(["--redefine-sym", r]);
    }
    let st = cmd
        .arg(mini_elf())
        .arg(&out)
        .status()
        .expect("run objcopy (binutils)");
    assert!(st.success(), "objcopy failed");
    out
}

fn run(vmlinux: &Path) -> std::process::Output {
    let mini = mini_elf();
    vmtrace(&[
        "--kernel",
        mini.to_str().unwrap(),
        "--vmlinux",
        vmlinux.to_str().unwrap(),
        "--trace",
        "*",
        "--mode",
        "trap",
        "--duration",
        "0.3",
        "--timeout",
        "20",
        "--console",
        "none",
        "--format",
        "json",
    ])
}

/// The banner found in the kernel's mapping gives the offset: before, the
/// attach waited for IA32_LSTAR for ever (here, until --timeout, with
/// nothing traced).
#[test]
fn without_a_syscall_entry_the_banner_in_the_kernel_map_gives_the_offset() {
    let vmlinux = renamed(
        "nolstar",
        &[
            "mini_account=entry_SYSCALL_64",
            // 64 bytes of .rodata (a table of the workload's names).
            "fn_names=linux_banner",
        ],
    );
    let out = run(&vmlinux);
    let _ = std::fs::remove_file(&vmlinux);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("vmtrace: attached: 30 sites patched"), "{err}");
    // The attach line says when, plainly (no "attempts ... not ready").
    let line = err
        .lines()
        .find(|l| l.starts_with("vmtrace: attached: "))
        .unwrap();
    assert!(line.contains(" s after boot"), "{line}");
    assert!(!line.contains("attempts"), "{line}");
    assert!(
        err.lines()
            .any(|l| l == "vmtrace: kernel offset: virtual +0x0, physical +0x0 (no KASLR)"),
        "{err}"
    );
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["sites_patched"], 30, "{v}");
    // Every traced call trapped and was recorded.
    assert!(v["events"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["events"], v["trap_exits"], "{v}");
}
