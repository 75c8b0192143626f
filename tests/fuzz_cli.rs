//! Mutated inputs through the binary, every command that reads one
//! (issue 22, item 14): `report` (with `--tree`, `-g` and every `--export`
//! format, the trace.dat writer included), `script`, and `list` of a
//! mutated ELF kernel and bzImage. Fixed seeds, bounded cases: each run
//! ends with status 0, 1 or 2 (never a panic's 101 or a signal), within
//! `HANG`, and an error is one line (`vmtrace: ...`). The library-level
//! fuzzing, thousands of cases without a process each, is in
//! tracer/tests/fuzz.rs.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::*;

/// Longer than any of these runs takes; a run still going is hung.
const HANG: Duration = Duration::from_secs(60);

fn scratch(name: &str) -> PathBuf {
    scratch_in("fuzzcli", name)
}

/// xorshift64*: the same mutations on every run and host.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One to three mutations of `seed`: a bit flipped, a word written, the
/// file cut short, bytes appended; `hot` (a byte range) gets half of them
/// (the headers, where a flip changes what is read rather than a value).
fn mutate(rng: &mut Rng, seed: &[u8], hot: std::ops::Range<usize>) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..1 + rng.below(3) {
        if b.is_empty() {
            break;
        }
        let at = if rng.next() & 1 == 0 && hot.end <= b.len() && !hot.is_empty() {
            hot.start + rng.below(hot.len())
        } else {
            rng.below(b.len())
        };
        match rng.below(8) {
            0..=3 => b[at] ^= 1 << rng.below(8),
            4 | 5 => {
                let values = [0, 1, u32::MAX as u64, u64::MAX, 1 << 31, rng.next()];
                let v = values[rng.below(values.len())].to_le_bytes();
                let w = if rng.next() & 1 == 0 { 4 } else { 8 };
                let at = at.min(b.len().saturating_sub(w));
                let end = (at + w).min(b.len());
                b[at..end].copy_from_slice(&v[..end - at]);
            }
            6 => b.truncate(at),
            _ => b.extend(std::iter::repeat_n(rng.next() as u8, rng.below(64))),
        }
    }
    b
}

/// Run vmtrace in `dir`, killed if it hangs.
fn run(dir: &Path, args: &[&str]) -> Output {
    let child = Command::new(env!("CARGO_BIN_EXE_vmtrace"))
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run vmtrace");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(HANG) {
        Ok(o) => o.unwrap(),
        Err(_) => {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!("vmtrace {args:?} hung");
        }
    }
}

/// No panic, no signal, an exit status vmtrace gives, and an error said in
/// one line (bad input: only that line; a failed export may follow notes).
fn check(o: &Output, args: &[&str], case: usize) -> usize {
    let err = stderr(o);
    assert!(
        !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
        "case {case} {args:?}: {err}"
    );
    let code = o.status.code();
    assert!(
        matches!(code, Some(0..=2)),
        "case {case} {args:?}: {} {err}",
        o.status
    );
    for line in err.lines() {
        assert!(line.starts_with("vmtrace: "), "case {case} {args:?}: {err}");
    }
    if code == Some(2) {
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "case {case} {args:?}: {err}"
        );
    }
    code.unwrap() as usize
}

/// Both ends were reached: some mutated inputs read, some refused.
fn check_tally(tally: [usize; 3], what: &str) {
    println!("{what}: exit statuses 0/1/2: {tally:?}");
    assert!(tally[0] > 0 && tally[2] > 0, "{what}: {tally:?}");
}

/// A small function-graph data file of the mini guest, recorded.
fn seed_data(dir: &Path) -> Vec<u8> {
    let k = mini_elf();
    let data = dir.join("seed.data");
    let o = run(
        dir,
        &[
            "record",
            "--kernel",
            s(&k),
            "--cpus",
            "2",
            "--graph",
            "--cmdline",
            "graph=1 iters=10",
            "--trace",
            "*",
            "--console",
            "none",
            "-q",
            "-o",
            s(&data),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::read(&data).unwrap()
}

/// Mutated data files through `report` (text, `-g`, `--tree`, JSON, every
/// export) and `script`, some filtered after recording (`--pid`, `--comm`,
/// `--sym`, `-F`).
#[test]
fn report_script_and_every_export_of_mutated_data_files() {
    let dir = scratch("data");
    let seed = seed_data(&dir);
    let f = dir.join("m.data");
    let x = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let exports = [
        format!("json={}", x("o.json")),
        format!("csv={}", x("o.csv")),
        format!("chrome={}", x("o.chrome")),
        format!("folded={}", x("o.folded")),
        format!("trace.dat={}", x("o.dat")),
    ];
    let mut rng = Rng(0x005e_ed0f_da7a);
    let mut tally = [0; 3];
    for case in 0..60 {
        // The first block (HEAD: symbols, options) is where a flip is read.
        let m = mutate(&mut rng, &seed, 0..4096.min(seed.len()));
        std::fs::write(&f, &m).unwrap();
        let fs = s(&f);
        let mut all = vec!["report", fs];
        for e in &exports {
            all.extend(["--export", e.as_str()]);
        }
        for args in [
            &["report", fs][..],
            &["report", fs, "-g", "--sort", "total", "--pid", "0,1001"][..],
            &["report", fs, "--tree", "--depth", "3"][..],
            &["report", fs, "--format", "json"][..],
            &all[..],
            &[
                "script",
                fs,
                "--cpu",
                "1",
                "--comm",
                "mini-*",
                "--sym",
                "*,!do_idle",
                "-F",
                "comm,tid,func,caller",
            ][..],
            &["script", fs][..],
        ] {
            tally[check(&run(&dir, args), args, case)] += 1;
        }
    }
    // Some mutations leave a readable file (cut short, a value changed):
    // the views ran on them.
    check_tally(tally, "data files");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Mutated ELF kernels through `list` (symbols, `__mcount_loc`, sites).
#[test]
fn list_of_mutated_elf_kernels() {
    let dir = scratch("elf");
    let seed = std::fs::read(mini_elf()).unwrap();
    let f = dir.join("m.elf");
    let mut rng = Rng(0x00e1_f00d);
    let mut tally = [0; 3];
    for case in 0..100 {
        // The ELF and program headers.
        let m = mutate(&mut rng, &seed, 0..0x200);
        std::fs::write(&f, &m).unwrap();
        for args in [
            &["list", "--kernel", s(&f)][..],
            &["list", "hrtimer_*", "--vmlinux", s(&f)][..],
        ] {
            tally[check(&run(&dir, args), args, case)] += 1;
        }
    }
    check_tally(tally, "ELF kernels");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A mutated bzImage of the default Linux guest through `list` (no vmlinux
/// beside it: the setup header, the payload's decompression, kallsyms and
/// `__mcount_loc` from the payload).
#[test]
fn list_of_mutated_bzimages() {
    let (bz, _) = linux_61();
    let seed = std::fs::read(&bz).unwrap();
    let dir = scratch("bz");
    let f = dir.join("bzImage");
    // The setup header, and the payload's first bytes (its compression
    // header): where a flip changes what is read.
    let payload = payload_offset(&seed);
    let mut rng = Rng(0x0b21_a9e0);
    let mut tally = [0; 3];
    for case in 0..40 {
        let hot = if case % 2 == 0 {
            0x1f0..0x280
        } else {
            payload..payload + 64
        };
        let m = mutate(&mut rng, &seed, hot);
        std::fs::write(&f, &m).unwrap();
        let args = ["list", "--kernel", s(&f), "hrtimer_*"];
        tally[check(&run(&dir, &args), &args, case)] += 1;
    }
    check_tally(tally, "bzImages");
    let _ = std::fs::remove_dir_all(&dir);
}
