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

/// `--args=GLOB` globs must name traced functions, and select some; the
/// mini guest's `args_*` functions are traced, `hrtimer_*` are not.
#[test]
fn argument_globs_must_select_traced_functions() {
    let k = mini_elf();
    let base = ["--kernel", k.to_str().unwrap(), "--trace", "args_*"];
    let with = |extra: &[&'static str]| [&base[..], extra].concat();
    assert_bad_input(
        &with(&["--args=hrtimer_*"]),
        "vmtrace: --args=hrtimer_* matches none of the traced functions; \
         give --args globs of functions --trace selects",
    );
    assert_bad_input(
        &with(&["--args=!args_six"]),
        "--args '!args_six' only removes functions; add what to args, \
         e.g. --args='*,!args_six'",
    );
    assert_bad_input(
        &with(&["--args=args_[x"]),
        "--args glob 'args_[x' is invalid",
    );
    assert_bad_input(
        &["--kernel", k.to_str().unwrap(), "--args=args_six"],
        "--args needs --trace GLOB",
    );
}

/// `--pid` and `--comm` need the kernel's task layout: a bad glob, a kernel
/// without BTF (the mini guest with its `.BTF` section removed) and more
/// pids than exitless code compares are refused before the guest boots.
#[test]
fn task_filters_are_checked_before_the_guest_boots() {
    let k = mini_elf();
    let base = |kernel: &std::path::Path| {
        vec![
            "--kernel".to_string(),
            kernel.to_str().unwrap().to_string(),
            "--timeout".into(),
            "30".into(),
            "--trace".into(),
            "hrtimer_*".into(),
        ]
    };
    let run = |kernel: &std::path::Path, extra: &[&str]| {
        let mut a = base(kernel);
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let args = run(&k, &["--comm", "[a"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_bad_input(&args, "--comm: the comm glob \"[a\" is not valid");
    let pids = "1,2,3,4,5,6,7,8,9";
    let args = run(&k, &["--pid", pids, "--mode", "exitless"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_bad_input(
        &args,
        "9 pids to keep; exitless mode's code compares at most 8",
    );
    // Neither BTF nor DWARF (from either, vmtrace finds the tasks).
    let stripped = scratch().join("mini-no-btf.elf");
    let st = std::process::Command::new("objcopy")
        .args(["--remove-section", ".BTF", "--strip-debug"])
        .arg(&k)
        .arg(&stripped)
        .status()
        .unwrap();
    assert!(st.success());
    let args = run(&stripped, &["--pid", "7"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_bad_input(
        &args,
        "--pid and --comm need the guest's tasks, and this kernel's are unknown: none: ",
    );
    let o = vmtrace(&args);
    assert!(
        stderr(&o).contains("has no BTF (.BTF section) nor DWARF (.debug_info)"),
        "{}",
        stderr(&o)
    );
    let _ = std::fs::remove_file(&stripped);
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
        "vmtrace report takes no -o (it prints to stdout); to write a file use --export FMT=FILE",
    );
    assert_bad_input(
        &["report", "-i", "/nonexistent.vmt", "--cpu", "1,,2"],
        "--cpu: empty entry",
    );
    assert_bad_input(
        &["report", "/nonexistent.vmt", "--time", "3,1"],
        "--time: time window '3,1' ends at 1 s but starts at 3 s",
    );
    assert_bad_input(
        &["script", "/nonexistent.vmt", "--time", "soon,"],
        "--time: start 'soon' in time window 'soon,' is not a time",
    );
    assert_bad_input(
        &["report", "/nonexistent.vmt", "--percent-limit", "101"],
        "--percent-limit 101 is not a percentage",
    );
}

/// `base` then `extra`.
fn with<'a>(base: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
    [base, extra].concat()
}

/// An option that would do nothing is refused, in one line naming it:
/// the text report's options with another format, output options on an
/// untraced run, view options on `record` (which prints no report), `-q`
/// where there is no live status line.
#[test]
fn options_that_do_not_apply_are_refused() {
    let k = mini_elf();
    let k = k.to_str().unwrap();
    let traced = [
        "--kernel",
        k,
        "--cmdline",
        "mode=loop",
        "--timeout",
        "30",
        "--trace",
        "hrtimer_*",
    ];
    for (extra, flag) in [
        (&["--sort", "name"][..], "--sort"),
        (&["-g"][..], "-g"),
        (&["--percent-limit", "5"][..], "--percent-limit"),
    ] {
        for format in ["json", "csv", "chrome"] {
            let mut args = with(&traced, extra);
            args.extend(["--format", format]);
            assert_bad_input(
                &args,
                &format!("{flag} applies to the text report, not to --format {format}"),
            );
            // The same for `vmtrace report`.
            let mut args = vec!["report", "/nonexistent.vmt", "--format", format];
            args.extend_from_slice(extra);
            assert_bad_input(&args, &format!("{flag} applies to the text report"));
        }
    }
    assert_bad_input(
        &with(&traced, &["--tree", "--graph", "--format", "csv"]),
        "--tree prints the call tree as text; drop --format csv or --tree",
    );
    assert_bad_input(&with(&traced, &["--depth", "2"]), "--depth needs --tree");
    assert_bad_input(
        &with(&traced, &["--graph", "--tree", "--sort", "total"]),
        "--sort applies to the text report, which --tree replaces",
    );

    // No --trace: nothing to show, save or export.
    let untraced = ["--kernel", k, "--cmdline", "mode=loop", "--timeout", "30"];
    for (extra, flag) in [
        (&["-o", "/tmp/vmtrace-never.data"][..], "-o"),
        (&["--format", "json"][..], "--format"),
        (
            &["--export", "json=/tmp/vmtrace-never.json"][..],
            "--export",
        ),
        (&["--sort", "name"][..], "--sort"),
        (&["--cpu", "0"][..], "--cpu"),
        (&["-g"][..], "-g"),
        (&["--tree"][..], "--tree"),
        (&["--time", "1,2"][..], "--time"),
        (&["--percent-limit", "5"][..], "--percent-limit"),
        (&["-q"][..], "-q"),
    ] {
        assert_bad_input(
            &with(&untraced, extra),
            &format!("{flag} needs --trace GLOB (it only applies to a traced run)"),
        );
    }
    assert!(!std::path::Path::new("/tmp/vmtrace-never.data").exists());

    // record prints no report.
    let mut record = vec!["record"];
    record.extend(&traced);
    for (extra, flag) in [
        (&["--format", "json"][..], "--format"),
        (&["--sort", "name"][..], "--sort"),
        (&["-g"][..], "-g"),
        (&["--tree"][..], "--tree"),
        (&["--time", "0,1"][..], "--time"),
        (&["--cpu", "0"][..], "--cpu"),
        (&["--percent-limit", "1"][..], "--percent-limit"),
    ] {
        assert_bad_input(
            &with(&record, extra),
            &format!("{flag}: record prints no report; use `vmtrace report` afterwards"),
        );
    }
    assert_bad_input(
        &["record", "--kernel", k, "--cmdline", "mode=loop"],
        "vmtrace record needs --trace GLOB",
    );

    // No live status line to quieten: clap refuses the flag.
    for args in [
        &["report", "/nonexistent.vmt", "-q"][..],
        &["script", "/nonexistent.vmt", "--quiet"][..],
        &["list", "--kernel", k, "-q"][..],
    ] {
        assert_bad_input(args, "unexpected argument '-");
    }
    // JSON on stdout stays JSON.
    assert_bad_input(
        &with(&traced, &["--format", "json", "--console", "-"]),
        "--console - would mix the guest console into the json output on stdout",
    );
}

/// Two outputs of one command never name the same file (the second write
/// would replace the first), checked before the guest boots.
#[test]
fn one_file_for_two_outputs_is_refused() {
    let k = mini_elf();
    let k = k.to_str().unwrap();
    let dir = scratch().join("same");
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("out");
    let f = f.to_str().unwrap();
    let dot = format!("{}/./out", dir.display());
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
    let json = format!("json={f}");
    let csv = format!("csv={dot}");
    for (extra, says) in [
        (
            vec!["--export", &json, "--export", &csv],
            "--export json and --export csv both name",
        ),
        (
            vec!["-o", f, "--export", &csv],
            "-o and --export csv both name",
        ),
        (
            vec!["--console", f, "--export", &json],
            "--export json and --console both name",
        ),
    ] {
        let mut args = base.to_vec();
        args.extend(extra.iter().copied());
        assert_bad_input(&args, says);
        let mut record = vec!["record"];
        record.extend(&args);
        assert_bad_input(&record, says);
    }
    // Converting a trace never writes over it.
    assert_bad_input(
        &["report", f, "--export", &csv],
        "the input and --export csv both name",
    );
    assert!(!std::path::Path::new(f).exists(), "nothing was written");
}

/// clap's own errors keep what says what is wrong, in one line: the
/// argument it did not know and the one meant, the possible values, the
/// arguments missing.
#[test]
fn clap_errors_keep_their_hints_in_one_line() {
    let k = mini_elf();
    let k = k.to_str().unwrap();
    assert_bad_input(
        &["--kernel", k, "--trac", "hrtimer_*"],
        "unexpected argument '--trac' found; tip: a similar argument exists: '--trace'",
    );
    assert_bad_input(
        &["--kernel", k, "--trace", "x", "--format", "xml"],
        "invalid value 'xml' for '--format <FORMAT>' [possible values: text, json, csv, chrome, folded]",
    );
    assert_bad_input(
        &["list", "hrtimer_*"],
        "the following required arguments were not provided: <--kernel <PATH>|--vmlinux <PATH>>",
    );
    assert_bad_input(
        &["--kernel", k, "--trace", "x", "--export", "xml=out.xml"],
        "unknown format 'xml'; use one of json, csv, chrome, folded, trace.dat",
    );
    assert_bad_input(
        &["report", "--mode", "trap"],
        "unexpected argument '--mode' found",
    );
    for args in [&["--kernel", k, "--trac", "x"][..], &["list"][..]] {
        let err = stderr(&vmtrace(args));
        assert!(err.ends_with(" (see vmtrace --help)\n"), "{err}");
        assert!(
            !err.contains("Usage") && !err.contains("For more information"),
            "{err}"
        );
    }
}

#[test]
fn bench_counts_must_be_positive() {
    for flag in ["--iters", "--rounds", "--cycles", "--report-events"] {
        assert_bad_input(&["bench", flag, "0"], &format!("{flag} must be at least 1"));
    }
    assert_bad_input(&["bench", "--cpus", "65"], "--cpus 65 is out of range");
}

/// The 6.1 guest's bzImage alone in a fresh directory (no vmlinux anywhere
/// vmtrace looks), after `edit` changed its bytes (given the payload's offset).
fn lone_bzimage(name: &str, edit: impl FnOnce(&mut Vec<u8>, usize)) -> PathBuf {
    let (bz, _) = linux_61();
    let mut bytes = std::fs::read(bz).unwrap();
    let payload = payload_offset(&bytes);
    edit(&mut bytes, payload);
    let dir = scratch().join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bzImage");
    std::fs::write(&path, bytes).unwrap();
    path
}

/// A bzImage alone whose payload cannot give symbols: one line that names
/// the problem and the vmlinux places tried, and says to pass --vmlinux.
fn assert_no_symbols(bz: &std::path::Path, needle: &str) {
    let args = ["--kernel", bz.to_str().unwrap(), "--trace", "hrtimer_*"];
    assert_bad_input(&args, needle);
    let err = stderr(&vmtrace(&args));
    let beside = bz.with_file_name("vmlinux");
    assert!(
        err.contains(&format!("no vmlinux at {}", beside.display())),
        "{err}"
    );
    assert!(err.contains("--vmlinux"), "{err}");
}

#[test]
fn bzimage_alone_with_a_corrupt_payload() {
    // The first LZ4 block claims more bytes than the payload has.
    let bz = lone_bzimage("corrupt-payload", |b, p| {
        b[p + 4..p + 8].copy_from_slice(&0x7fff_fff0u32.to_le_bytes());
    });
    assert_no_symbols(&bz, "corrupt lz4 payload");
}

#[test]
fn bzimage_alone_with_an_unknown_compression() {
    let bz = lone_bzimage("unknown-compression", |b, p| {
        b[p..p + 4].copy_from_slice(b"JUNK");
    });
    assert_no_symbols(&bz, "unknown payload compression (first bytes 4a 55 4e 4b");
}

/// A kernel without kallsyms: the 6.1 payload with its token table's "0".."9"
/// run broken, recompressed with gzip as the kernel's Makefile does
/// (CONFIG_KERNEL_GZIP), in a bzImage whose header says so.
#[test]
fn bzimage_alone_without_kallsyms() {
    let (bz, _) = linux_61();
    let mut elf = tracer::kernel::payload::extract(&bz).unwrap().elf;
    let digits = b"0\x001\x002\x003\x004\x005\x006\x007\x008\x009\x00";
    let mut broken = 0;
    while let Some(at) = elf.windows(digits.len()).position(|w| w == digits) {
        elf[at + 10] = b'x';
        broken += 1;
    }
    assert!(broken >= 1, "no token table in the 6.1 payload?");
    let mut gzip = std::process::Command::new("gzip")
        .args(["-n", "-9"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run gzip");
    let mut stdin = gzip.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        stdin.write_all(&elf)
    });
    let gz = gzip.wait_with_output().unwrap().stdout;
    writer.join().unwrap().unwrap();
    let path = lone_bzimage("no-kallsyms", |b, p| {
        let old_len = u32::from_le_bytes(b[0x24c..0x250].try_into().unwrap()) as usize;
        let rest = b.split_off(p + old_len);
        b.truncate(p);
        b.extend_from_slice(&gz);
        b.extend_from_slice(&rest);
        b[0x24c..0x250].copy_from_slice(&(gz.len() as u32).to_le_bytes());
        // syssize: the protected-mode part, in 16-byte units.
        let setup = (usize::from(b[0x1f1]) + 1) * 512;
        let sys = ((b.len() - setup) / 16) as u32;
        b[0x1f4..0x1f8].copy_from_slice(&sys.to_le_bytes());
    });
    assert_no_symbols(&path, "no kallsyms in its gzip payload");
}

/// A vmlinux found automatically (here at the build tree's root) that is
/// another kernel's is refused, as one given with --vmlinux is.
#[test]
fn mismatched_vmlinux_at_the_build_tree_root_is_refused() {
    let (bz, _) = linux_61();
    let tree = scratch().join("tree");
    let boot = tree.join("arch/x86/boot");
    std::fs::create_dir_all(&boot).unwrap();
    std::fs::copy(&bz, boot.join("bzImage")).unwrap();
    // The 6.12 guest's vmlinux when built, else the mini guest (no banner).
    let (other, why) = match linux_612() {
        Some((_, v)) => (v, "the vmlinux \"Linux version 6.12"),
        None => (mini_elf(), "no linux_banner"),
    };
    std::fs::copy(other, tree.join("vmlinux")).unwrap();
    let bz = boot.join("bzImage");
    let args = ["--kernel", bz.to_str().unwrap(), "--trace", "hrtimer_*"];
    assert_bad_input(&args, "does not match kernel");
    let err = stderr(&vmtrace(&args));
    assert!(
        err.contains(&tree.join("vmlinux").display().to_string()),
        "{err}"
    );
    assert!(err.contains(why), "{err}");
}

#[test]
fn tree_options_are_checked() {
    let golden = root().join("tracer/tests/golden");
    let graph = golden.join("graph.vmtrace");
    let graph = graph.to_str().unwrap();
    let plain = golden.join("fixture.vmtrace");
    let plain = plain.to_str().unwrap();
    let report = |more: &[&'static str]| {
        let mut a = vec!["report", "-i", graph];
        a.extend_from_slice(more);
        a
    };
    assert_bad_input(
        &report(&["--tree", "--threshold", "10xs"]),
        "--threshold: unknown unit 'xs' in '10xs'; use ns, us, ms or s",
    );
    assert_bad_input(
        &report(&["--tree", "--threshold", "fast"]),
        "--threshold: 'fast' is not a duration",
    );
    assert_bad_input(
        &report(&["--tree", "--threshold=-1us"]),
        "--threshold: '-1us' is not a duration",
    );
    assert_bad_input(
        &report(&["--tree", "--depth", "0"]),
        "invalid value '0' for '--depth <N>'",
    );
    assert_bad_input(
        &report(&["--tree", "--depth", "deep"]),
        "invalid value 'deep' for '--depth <N>'",
    );
    assert_bad_input(&report(&["--depth", "2"]), "--depth needs --tree");
    assert_bad_input(&report(&["--threshold", "1us"]), "--threshold needs --tree");
    assert_bad_input(
        &report(&["--tree", "--format", "json"]),
        "--tree prints the call tree as text; drop --format json or --tree",
    );
    // Checked before the trace is read.
    assert_bad_input(
        &[
            "report",
            "-i",
            "/nonexistent.vmt",
            "--tree",
            "--threshold",
            "1 parsec",
        ],
        "--threshold: unknown unit 'parsec'",
    );
    // A trace without returns has no tree or flame graph.
    assert_bad_input(
        &["report", "-i", plain, "--tree"],
        "--tree needs a function-graph trace (traced with --graph)",
    );
    assert_bad_input(
        &["report", "-i", plain, "--format", "folded"],
        "--format folded needs a function-graph trace",
    );
    // The run takes the same output options, checked before any guest boots.
    let k = mini_elf();
    assert_bad_input(
        &[
            "--kernel",
            k.to_str().unwrap(),
            "--tree",
            "--threshold",
            "3 fortnights",
        ],
        "--threshold: unknown unit 'fortnights'",
    );
    // A run's graph views need the returns: --graph, checked before boot.
    for view in [&["--tree"][..], &["--format", "folded"][..]] {
        let mut a = vec!["--kernel", k.to_str().unwrap(), "--trace", "do_idle"];
        a.extend_from_slice(view);
        assert_bad_input(
            &a,
            "shows returns and durations: add --graph to record them",
        );
    }
    assert_bad_input(
        &["--kernel", k.to_str().unwrap(), "--graph"],
        "--graph needs --trace GLOB",
    );
}

#[test]
fn bench_json_follows_the_output_rules() {
    let kernel = mini_elf();
    let k = kernel.to_str().unwrap();
    let dir = std::env::temp_dir().join(format!("vmtrace-benchjson-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // A directory, and a FIFO (opening it would block the run): refused
    // before anything is measured.
    let d = dir.to_str().unwrap();
    assert_bad_input(&["bench", "--kernel", k, "--json", d], "a directory");
    let fifo = dir.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a NUL-terminated path that outlives the call; mkfifo
    // only reads it.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    assert_bad_input(
        &["bench", "--kernel", k, "--json", fifo.to_str().unwrap()],
        "FIFO",
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_elf_kernel_with_another_elfs_symbols_is_refused_by_build_id() {
    let kernel = mini_elf();
    let elf = std::fs::read(&kernel).unwrap();
    // The same ELF with another build id: its GNU build-id note's descriptor
    // (after "GNU\0") changed, as another build of the same source would be.
    let at = elf
        .windows(4)
        .position(|w| w == b"GNU\0")
        .expect("a GNU note")
        + 4;
    let mut other = elf.clone();
    other[at] ^= 0xff;
    let dir = std::env::temp_dir().join(format!("vmtrace-buildid-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let vmlinux = dir.join("other.elf");
    std::fs::write(&vmlinux, &other).unwrap();
    assert_bad_input(
        &[
            "--kernel",
            kernel.to_str().unwrap(),
            "--vmlinux",
            vmlinux.to_str().unwrap(),
            "--trace",
            "do_idle",
        ],
        "build id",
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_notrace_glob_matching_nothing_is_refused() {
    let kernel = mini_elf();
    assert_bad_input(
        &[
            "--kernel",
            kernel.to_str().unwrap(),
            "--trace",
            "hrtimer_*",
            "--notrace",
            "nomatch_*",
        ],
        "--notrace 'nomatch_*' matches no traceable function",
    );
}

/// `vmtrace attach` takes a run's tracing flags; those it cannot honour yet
/// are refused before anything else is checked or opened (neither the
/// vmlinux nor the QMP socket here exists), and the others get that far.
#[test]
fn attach_refuses_the_tracing_flags_it_cannot_honour() {
    let base = [
        "attach",
        "--qmp",
        "/nonexistent/qmp.sock",
        "--vmlinux",
        "/nonexistent/vmlinux",
        "--trace",
        "x",
        "--duration",
        "0",
    ];
    assert_bad_input(
        &with(&base, &["--ring-events", "1024"]),
        "vmtrace: --ring-events: vmtrace attach sizes its rings itself: a ring device as large as \
         --buffer (16M to 1G) where the guest takes a hot-plugged PCI device, else the guest's \
         unused low memory; drop --ring-events; for larger rings give --buffer (e.g. --buffer \
         256M)",
    );
    // Every entry kind is taken (issue 35: direct entries under attach).
    for entry in ["auto", "ftrace", "direct"] {
        assert_bad_input(&with(&base, &["--entry", entry]), "--duration 0");
    }
    // `--buffer` sizes the ring device, whose rings one 1 GiB entry maps.
    let five = base.map(|a| if a == "0" { "5" } else { a });
    assert_bad_input(
        &with(&five, &["--buffer", "2G"]),
        "--buffer \"2G\": more than 1G, the most vmtrace attach maps for its rings",
    );
    assert_bad_input(&with(&five, &["--buffer", "1G"]), "/nonexistent");
}

/// `--modules DIR` (`attach`, and the own VMM's run and `record`): a DIR
/// that is not a directory, or holds no module file at any depth, is
/// refused in one line naming it, before the kernel is read or any QEMU
/// touched, or any VMM made (no QEMU, no vmlinux exists here; the own
/// VMM's kernel is not one).
#[test]
fn module_files_dir_must_hold_modules() {
    let kernel = scratch().join("modules-not-a-kernel");
    std::fs::write(&kernel, b"not a kernel").unwrap();
    let kernel = kernel.to_str().unwrap();
    let attach = [
        "attach",
        "--qmp",
        "/nonexistent/qmp.sock",
        "--vmlinux",
        "/nonexistent/vmlinux",
        "--trace",
        "x",
        "--modules",
    ];
    let run = ["--kernel", kernel, "--trace", "x", "--modules"];
    let record = ["record", "--kernel", kernel, "--trace", "x", "--modules"];
    let forms: [(&[&str], &str); 3] = [
        (&attach, "/nonexistent/vmlinux"),
        (&run, kernel),
        (&record, kernel),
    ];
    for (base, read) in forms {
        dir_must_hold_modules(base, read);
    }
    // Only a traced run reads module files.
    assert_bad_input(
        &["--kernel", kernel, "--modules", "/nonexistent/modules"],
        "vmtrace: --modules needs --trace GLOB (it only applies to a traced run)",
    );
    // A kernel without modules (the 6.1 guest) uses none, said before the
    // plan (here refused after it, so that nothing boots).
    let dir = scratch().join("modules-unused");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("x.ko"), b"not an ELF").unwrap();
    let (bz, vmlinux) = linux_61();
    let out = vmtrace(&[
        "--kernel",
        bz.to_str().unwrap(),
        "--trace",
        "hrtimer_run_queues",
        "--args=nothing_traced",
        "--modules",
        dir.to_str().unwrap(),
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let unused = format!(
        "vmtrace: --modules: {} has no modules (no `modules` in its symbols): no module file is used",
        vmlinux.display()
    );
    assert!(err.contains(&unused), "{err}");
    assert!(err.contains("--args=nothing_traced matches none"), "{err}");
}

/// `base` (ending in `--modules`) refused with each bad DIR; with a DIR
/// holding a module, it gets as far as reading `read`.
fn dir_must_hold_modules(base: &[&str], read: &str) {
    let remedy = "; give the directory that holds the guest's module files (its \
                  /lib/modules/VERSION, or a build's)";
    assert_bad_input(
        &with(base, &["/nonexistent/modules"]),
        &format!("vmtrace: --modules: /nonexistent/modules is not a directory{remedy}"),
    );
    let dir = scratch().join("no-modules");
    std::fs::create_dir_all(dir.join("kernel/fs")).unwrap();
    std::fs::write(dir.join("kernel/fs/modules.dep"), b"").unwrap();
    std::fs::write(dir.join("kernel/fs/x.ko.bz2"), b"").unwrap();
    let file = dir.join("kernel/fs/modules.dep");
    assert_bad_input(
        &with(base, &[file.to_str().unwrap()]),
        &format!(
            "vmtrace: --modules: {} is not a directory{remedy}",
            file.display()
        ),
    );
    assert_bad_input(
        &with(base, &[dir.to_str().unwrap()]),
        &format!(
            "vmtrace: --modules: {} holds no module file (*.ko, *.ko.gz, *.ko.xz, *.ko.zst), nor \
             do its subdirectories{remedy}",
            dir.display()
        ),
    );
    // A DIR with a module gets as far as the kernel.
    std::fs::write(dir.join("kernel/fs/x.ko"), b"not an ELF").unwrap();
    assert_bad_input(&with(base, &[dir.to_str().unwrap()]), read);
    let _ = std::fs::remove_file(dir.join("kernel/fs/x.ko"));
}

/// With `--entry direct` the own VMM follows the guest's modules at the
/// ftrace sites of the module notifier's two calls, which a direct entry
/// of either function would displace: a `:mod:` glob that would wait
/// with one of them traced is refused in one line before the guest
/// boots (docs/attach.md, modules in the own VMM). (`--timeout 1`: a
/// run not refused ends at once.)
#[test]
fn a_waiting_module_glob_with_the_loaders_trap_displaced_is_refused_by_the_own_vmm() {
    let Some((bz, vmlinux)) = linux_612() else {
        return;
    };
    let (bz, vmlinux) = (bz.to_str().unwrap(), vmlinux.to_str().unwrap());
    for (trace, name) in [
        (
            "blocking_notifier_call_chain,*:mod:vmt_test",
            "blocking_notifier_call_chain",
        ),
        (
            "hrtimer_*,blocking_notifier_call_chain_robust,vmt_*:mod:vmt_test",
            "blocking_notifier_call_chain_robust",
        ),
    ] {
        let args = [
            "--kernel",
            bz,
            "--vmlinux",
            vmlinux,
            "--trace",
            trace,
            "--entry",
            "direct",
            "--timeout",
            "1",
        ];
        let why = format!(
            "waits for a module, but the guest's modules cannot be followed (`{name}` is traced \
             by a direct entry, which displaces the ftrace site where vmtrace traps the module \
             loader)"
        );
        assert_bad_input(&args, &why);
    }
}
