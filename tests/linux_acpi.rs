//! The ACPI variant of the default guest (`guest/build.sh linux-acpi`: ACPI
//! on, MP-table parsing off) on real KVM: it must find every vCPU in
//! vmtrace's MADT and power off through the DSDT's `\_S5`.
//!
//! One boot, 4 vCPUs traced (every guest instruction is emulated on the CI
//! host, and 4 vCPUs on its 2 cores take minutes). It ends in the guest's own
//! power-off request (its built-in refscale run ends with
//! `kernel_power_off()`, see guest/linux/config-acpi.fragment), so it checks
//! the S5 path end to end:
//! the guest writes SLP_TYP|SLP_EN to PM1a_CNT, the VMM stops, vmtrace exits 0.

mod common;

use std::path::PathBuf;
use std::sync::{Mutex, Once};

use common::*;

/// guest/out/linux-acpi/{bzImage,vmlinux,initramfs.cpio.gz}, built (or
/// copied from the cache) once per test binary.
fn linux_acpi() -> (PathBuf, PathBuf) {
    static BUILD: Once = Once::new();
    BUILD.call_once(|| {
        let st = std::process::Command::new("bash")
            .arg(root().join("guest/build.sh"))
            .arg("linux-acpi")
            .status()
            .expect("run guest/build.sh linux-acpi");
        assert!(st.success(), "guest/build.sh linux-acpi failed");
    });
    let dir = root().join("guest/out/linux-acpi");
    (dir.join("bzImage"), dir.join("initramfs.cpio.gz"))
}

/// One guest at a time (see tests/linux_guest.rs).
static ONE_GUEST: Mutex<()> = Mutex::new(());

/// The shortest refscale run: it starts at once, times one loop of one
/// reader, and powers the guest off.
const REFSCALE_SHORT: &str =
    "refscale.holdoff=0 refscale.nruns=1 refscale.loops=1 refscale.nreaders=1";

fn boot(cpus: u32, extra: &[&str]) -> (std::process::Output, String) {
    let (kernel, initrd) = linux_acpi();
    let _one = ONE_GUEST.lock().unwrap_or_else(|e| e.into_inner());
    let console =
        std::env::temp_dir().join(format!("vmtrace-acpi{cpus}-{}.log", std::process::id()));
    let cpus_s = cpus.to_string();
    let mut args = vec![
        "--kernel",
        kernel.to_str().unwrap(),
        "--initrd",
        initrd.to_str().unwrap(),
        "--cpus",
        &cpus_s,
        "--mem",
        "96",
        "--timeout",
        "900",
        "--console",
        console.to_str().unwrap(),
        "--cmdline",
        REFSCALE_SHORT,
    ];
    args.extend_from_slice(extra);
    let out = vmtrace(&args);
    let text = std::fs::read_to_string(&console).unwrap_or_default();
    let _ = std::fs::remove_file(&console);
    (out, text)
}

/// The console of an ACPI boot: the tables as Linux lists them, the CPUs
/// from the MADT (no MP table: this kernel cannot parse one), all of them
/// up, no complaint, and the power-off.
fn check_acpi_console(text: &str, err: &str, cpus: u32) {
    for line in text.lines() {
        assert!(
            ![
                "WARNING:",
                "BUG:",
                "ACPI Error",
                "ACPI BIOS Error",
                "ftrace bug"
            ]
            .iter()
            .any(|c| line.contains(c)),
            "the guest complained: {line}\n{text}\nvmtrace said: {err}"
        );
    }
    for want in [
        "ACPI: RSDP 0x00000000000E0000",
        "ACPI: FACP",
        "ACPI: DSDT",
        "ACPI: APIC",
        "ACPI: Using ACPI (MADT) for SMP configuration information",
        &format!("smp: Brought up 1 node, {cpus} CPUs"),
        "ACPI: Interpreter enabled",
        "ACPI: PM: (supports S0 S5)",
        "ACPI: PM: Preparing to enter system sleep state S5",
    ] {
        assert!(text.contains(want), "{want}:\n{text}\nvmtrace said: {err}");
    }
    // "reboot: Power down" is printed just before the S5 write, and may
    // still sit in the kernel's console buffer when the VM stops on it: the
    // S5 write itself is checked (vmtrace's stop reason) instead.
    // One "Local APIC" line per vCPU, as Linux lists the MADT.
    let lapics = text
        .lines()
        .filter(|l| l.contains("ACPI: LAPIC (acpi_id["))
        .count();
    assert!(
        lapics == 0 || lapics == cpus as usize,
        "{lapics} LAPIC lines:\n{text}"
    );
    assert!(!text.contains("MP-table"), "{text}");
}

/// vmtrace saw the S5 write and calls it a clean end.
fn check_s5(out: &std::process::Output, err: &str) {
    assert!(
        err.contains("guest powered off (ACPI S5)"),
        "the VMM saw the S5 write: {err}"
    );
    assert_eq!(out.status.code(), Some(0), "{err}");
}

/// Four vCPUs, traced (one boot for both checks: Linux boots are most of
/// CI's time): the MADT's CPUs all up, the hrtimers traced while the kernel
/// boots, and the power-off ends the trace cleanly.
#[test]
fn acpi_guest_brings_up_four_vcpus_traced_and_powers_off_through_s5() {
    let (out, text) = boot(4, &["--stats", "--trace", "hrtimer_*", "--format", "json"]);
    let err = stderr(&out);
    check_acpi_console(&text, &err, 4);
    check_s5(&out, &err);
    assert!(err.contains("vmtrace: attached:"), "{err}");
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["stop_reason"], "guest powered off (ACPI S5)");
    let interrupts = v["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "hrtimer_interrupt")
        .map_or(0, |f| f["count"].as_u64().unwrap());
    assert!(interrupts > 0, "{v}");
    // Trap mode counts every call as one exit: nothing lost, nothing extra.
    if v["mode"] == "trap" {
        assert_eq!(v["trap_exits"], v["events"], "{v}");
    }
}
