//! The default Linux guest with KASLR on (vmtrace's default command line has
//! no `nokaslr`, and the guest is built relocatable with RANDOMIZE_BASE):
//! three traced boots, each reporting where the kernel went, each traced
//! exactly at the slid addresses.
//!
//! Entropy: the decompressor picks the virtual offset among ~490 2 MiB
//! slots of the kernel's 1 GiB image area and the physical one among the
//! ~30 slots a 96 MiB guest leaves above 16 MiB (RDRAND and RDTSC mixed,
//! both offered by vmtrace's CPUID). Three boots with one virtual offset
//! would happen about once in 240,000 runs; the test asserts no more than
//! that the three are not all the same.

mod common;

use std::path::PathBuf;
use std::sync::Once;

use common::*;

fn linux() -> (PathBuf, PathBuf) {
    static BUILD: Once = Once::new();
    BUILD.call_once(|| {
        let st = std::process::Command::new("bash")
            .arg(root().join("guest/build.sh"))
            .arg("linux")
            .status()
            .expect("run guest/build.sh linux");
        assert!(st.success(), "guest/build.sh linux failed");
    });
    (
        root().join("guest/out/bzImage"),
        root().join("guest/out/initramfs.cpio.gz"),
    )
}

/// KASLR's step on x86-64 (CONFIG_PHYSICAL_ALIGN).
const KASLR_ALIGN: i64 = 2 << 20;

/// `+0x3b800000` / `-0x200000`.
fn parse_signed_hex(s: &str) -> i64 {
    let (sign, digits) = match s.strip_prefix('-') {
        Some(d) => (-1, d),
        None => (1, s.trim_start_matches('+')),
    };
    sign * i64::from_str_radix(digits.trim_start_matches("0x"), 16).unwrap()
}

/// The offsets vmtrace reported: `vmtrace: kernel offset: virtual +0x..,
/// physical +0x.. (KASLR)`.
fn reported_offsets(err: &str) -> (i64, i64) {
    let line = err
        .lines()
        .find(|l| l.starts_with("vmtrace: kernel offset: "))
        .unwrap_or_else(|| panic!("no offset line: {err}"));
    let field = |name: &str| {
        let at = line.find(name).unwrap() + name.len();
        parse_signed_hex(line[at..].split([',', ' ']).next().unwrap())
    };
    (field("virtual "), field("physical "))
}

/// One boot of the default guest with 1 vCPU, traced for 20 s after
/// attaching (the timer tick starts during that time).
fn traced_boot(n: usize) -> (i64, i64) {
    let (kernel, initrd) = linux();
    let console = std::env::temp_dir().join(format!("vmtrace-kaslr{n}-{}.log", std::process::id()));
    let out = vmtrace(&[
        "--kernel",
        kernel.to_str().unwrap(),
        "--initrd",
        initrd.to_str().unwrap(),
        "--cpus",
        "1",
        "--mem",
        "96",
        "--timeout",
        "300",
        // Attached right after ftrace_init; the timer tick starts a few
        // seconds of emulated boot later.
        "--duration",
        "20",
        "--console",
        console.to_str().unwrap(),
        "--trace",
        "hrtimer_run_queues,update_process_times",
        "--format",
        "json",
    ]);
    let text = std::fs::read_to_string(&console).unwrap_or_default();
    let _ = std::fs::remove_file(&console);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!text.contains("nokaslr"), "{text}");
    for bad in ["ftrace bug", "WARNING:", "BUG:"] {
        assert!(!text.contains(bad), "{bad}:\n{text}\nvmtrace said: {err}");
    }
    let (virt, phys) = reported_offsets(&err);
    assert!(err.contains("(KASLR)") || (virt, phys) == (0, 0), "{err}");
    assert_eq!(virt % KASLR_ALIGN, 0, "{err}");
    assert_eq!(phys % KASLR_ALIGN, 0, "{err}");

    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let func = |name: &str| {
        v["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {v}"))
            .clone()
    };
    // Sites found at their slid addresses: the tick ran while traced (in
    // periodic and in high-resolution mode alike, every tick calls
    // update_process_times, which calls hrtimer_run_queues once through the
    // inlined run_local_timers).
    let queues = func("hrtimer_run_queues");
    let local = func("update_process_times");
    assert!(queues["count"].as_u64().unwrap() > 0, "{v}");
    // Both counts exact: one hrtimer_run_queues per update_process_times, give
    // or take the one call in flight at attach or detach.
    let (q, l) = (
        queues["count"].as_i64().unwrap(),
        local["count"].as_i64().unwrap(),
    );
    assert!((q - l).abs() <= 1, "{q} vs {l}: {v}");
    // Callers read at their slid addresses resolve to the vmlinux's names.
    let callers = |f: &serde_json::Value| -> Vec<String> {
        f["callers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(callers(&queues), ["update_process_times"], "{v}");
    assert!(!callers(&local).is_empty(), "{v}");
    assert_eq!(v["parent_unreadable"].as_u64(), Some(0), "{v}");
    // Trap mode: one exit per call, so the counts are every call.
    if v["mode"] == "trap" {
        assert_eq!(v["trap_exits"], v["events"], "{v}");
    }
    assert_eq!(v["events_stored"], v["events"], "{v}");
    (virt, phys)
}

#[test]
fn kaslr_three_boots_are_traced_at_their_own_offsets() {
    let offsets: Vec<(i64, i64)> = (0..3).map(traced_boot).collect();
    eprintln!("kernel offsets (virtual, physical): {offsets:#x?}");
    let virts: std::collections::BTreeSet<i64> = offsets.iter().map(|o| o.0).collect();
    assert!(
        virts.len() > 1,
        "KASLR put the kernel at one virtual offset three times: {offsets:#x?}"
    );
    assert!(offsets.iter().any(|o| o.0 != 0), "{offsets:#x?}");
}
