//! A bzImage alone, booted: the Linux 6.12 guest's bzImage copied into an
//! empty directory (no vmlinux anywhere vmtrace looks) is traced with the
//! names and sites vmtrace reads from the kernel itself (kallsyms and
//! `__mcount_loc` in its payload), and they are its vmlinux's.

mod common;

use std::collections::BTreeSet;

use common::*;

#[test]
fn linux_6_12_bzimage_alone_traces_hrtimers_with_its_own_symbols() {
    let Some((bz, vmlinux)) = linux_612() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("vmtrace-alone-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let alone = dir.join("bzImage");
    std::fs::copy(&bz, &alone).unwrap();
    let console = dir.join("console.log");
    let out = vmtrace(&[
        "--kernel",
        alone.to_str().unwrap(),
        "--trace",
        "hrtimer_*",
        "--cpus",
        "2",
        "--mem",
        "96",
        // Linux 6.12 boots ~10x slower than 6.1 on the emulating CI host
        // (docs/guests.md): a minute of tracing after the attach (right
        // after ftrace_init) shows the timers without waiting for the end.
        "--duration",
        "60",
        "--timeout",
        "900",
        "--console",
        console.to_str().unwrap(),
        "--format",
        "json",
    ]);
    let err = stderr(&out);
    let text = std::fs::read_to_string(&console).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        err.contains("symbols from kallsyms in the bzImage (lz4 payload"),
        "{err}"
    );
    assert!(err.contains("vmtrace: attached:"), "{err}\n{text}");
    // Stopped by --duration (status 0), or the guest ended first.
    assert!(
        out.status.code() == Some(0) || out.status.code() == Some(1),
        "{err}"
    );
    assert!(text.contains("Linux version 6.12"), "{text}");
    for bad in ["ftrace bug", "WARNING:", "BUG:"] {
        assert!(!text.contains(bad), "the guest said {bad}:\n{text}\n{err}");
    }
    let v: serde_json::Value = serde_json::from_str(&stdout(&out))
        .unwrap_or_else(|e| panic!("{e}: {}\n{err}", stdout(&out)));

    // What the vmlinux says `hrtimer_*` selects: the same functions, by
    // name and address.
    let plan = tracer::plan::Plan::new(&vmlinux, &["hrtimer_*".to_string()], &[]).unwrap();
    let expected: BTreeSet<(String, String)> = plan
        .funcs
        .iter()
        .map(|&f| {
            let s = &plan.image.functions[f];
            (s.name.clone(), format!("{:#x}", s.addr))
        })
        .collect();
    let traced: BTreeSet<(String, String)> = v["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["name"].as_str().unwrap().to_string(),
                f["addr"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(traced, expected);
    assert!(traced.len() >= 10, "{traced:?}");
    // The boot ran timers, and their callers resolve to names too.
    let called: u64 = v["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["count"].as_u64().unwrap())
        .sum();
    assert!(called > 0, "{v}");
    assert_eq!(v["sites_skipped_other"].as_u64(), Some(0), "{err}");
}

/// `vmtrace list` of the 6.1 guest's bzImage alone (kallsyms) takes a
/// function by any of its names, as of its vmlinux: `__x64_sys_getpid` is
/// an alias of the static `__do_sys_getpid` (SYSCALL_DEFINE0); local labels
/// such as `.E_copy` (copy_user_64.S) are no functions. No guest is booted.
#[test]
fn list_of_a_bzimage_alone_names_aliases_as_its_vmlinux_does() {
    let (bz, vmlinux) = (
        root().join("guest/out/bzImage"),
        root().join("guest/out/vmlinux"),
    );
    if !bz.is_file() || !vmlinux.is_file() {
        eprintln!(
            "SKIPPED: {} is not built; run `bash guest/build.sh linux`",
            bz.display()
        );
        return;
    }
    let dir = std::env::temp_dir().join(format!("vmtrace-list-alone-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let alone = dir.join("bzImage");
    std::fs::copy(&bz, &alone).unwrap();
    let glob = "__x64_sys_getpid,__do_sys_getpid,.E_copy*,copy_user_generic_unrolled";
    let from_kallsyms = vmtrace(&["list", "--kernel", alone.to_str().unwrap(), glob]);
    let from_vmlinux = vmtrace(&["list", "--vmlinux", vmlinux.to_str().unwrap(), glob]);
    let _ = std::fs::remove_dir_all(&dir);
    // `.E_copy*` matches nothing: refused, naming it, in both.
    for o in [&from_kallsyms, &from_vmlinux] {
        assert_eq!(o.status.code(), Some(2), "{}", stderr(o));
        assert!(
            stderr(o).contains("list '.E_copy*' matches no function"),
            "{}",
            stderr(o)
        );
    }
    let glob = "__x64_sys_getpid,__do_sys_getpid,copy_user_generic_unrolled";
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(&bz, &alone).unwrap();
    let from_kallsyms = vmtrace(&["list", "--kernel", alone.to_str().unwrap(), glob]);
    let from_vmlinux = vmtrace(&["list", "--vmlinux", vmlinux.to_str().unwrap(), glob]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(stderr(&from_kallsyms).contains("symbols from kallsyms in the bzImage"));
    let expected = "__do_sys_getpid\n__x64_sys_getpid\ncopy_user_generic_unrolled [notrace]\n";
    assert_eq!(
        stdout(&from_kallsyms),
        expected,
        "{}",
        stderr(&from_kallsyms)
    );
    assert_eq!(stdout(&from_vmlinux), expected, "{}", stderr(&from_vmlinux));
}
