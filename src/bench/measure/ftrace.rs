//! Figure (i): vmtrace against the guest's own ftrace, side by side on the
//! default Linux guest's boot. Each boot is the vmtrace binary itself run as
//! a subprocess (`std::env::current_exe()`), so every configuration boots
//! exactly as a user's run does: `--stats` for the instructions KVM's
//! emulator ran and the run's time, `--format json` for the calls traced,
//! the console to a file that is checked for the guest's complaints.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::bench::median;
use crate::stats::{STATS_INSTRUCTIONS_ROW, STATS_RUN_LINE};

/// The functions both tracers trace: called a fixed number of times in the
/// default guest's boot (sysfs and the initramfs' directories).
pub const FTRACE_GLOB: &str = "kernfs_*";
/// The guest's own function tracer, from its command line: the boot-time
/// tracer and its filter (Documentation/admin-guide/kernel-parameters.txt).
pub const FTRACE_CMDLINE: &str = "ftrace=function ftrace_filter=kernfs_*";
/// The same tracer on functions the boot never calls (the system calls'
/// handlers: user space never runs on an emulating host, and a kernel
/// thread does not make system calls): its setup alone (the tracer's
/// registration, its ring buffer, the filter's pass over every function,
/// patching a few hundred sites), so that ftrace's cost per call can be
/// told from it. Not `ftrace_notrace=*`: a notrace list of every function
/// costs the boot more than the tracing does (241 M instructions against
/// 86 M untraced and 124 M with `kernfs_*` traced, one boot each).
pub const FTRACE_SETUP_CMDLINE: &str = "ftrace=function ftrace_filter=__x64_sys_*";
/// What the guest prints when its boot-time tracer starts.
const FTRACE_STARTED: &str = "Starting tracer 'function'";
/// As tests/linux_guest.rs boots it: 1 vCPU, 96 MiB, a generous timeout.
const BOOT_MEM_MIB: &str = "96";
const BOOT_TIMEOUT_S: &str = "300";
/// The end of the boot: the guest then runs its init, which (user space
/// cannot run on an emulating host) dies, and the kernel panics.
const END_OF_BOOT: &str = "Run /init as init process";
/// What no boot may make the guest say (as tests/linux_guest.rs).
pub const GUEST_COMPLAINTS: [&str; 3] = ["ftrace bug", "WARNING:", "BUG:"];

/// The five ways the guest boots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BootConfig {
    /// No tracer.
    Untraced,
    /// The guest's own function tracer on `kernfs_*` (`FTRACE_CMDLINE`).
    Ftrace,
    /// The guest's function tracer on functions never called
    /// (`FTRACE_SETUP_CMDLINE`).
    FtraceSetup,
    /// vmtrace `--trace 'kernfs_*' --mode trap`.
    Trap,
    /// vmtrace `--trace 'kernfs_*' --mode exitless`.
    Exitless,
}

pub const BOOT_CONFIGS: [BootConfig; 5] = [
    BootConfig::Untraced,
    BootConfig::Ftrace,
    BootConfig::FtraceSetup,
    BootConfig::Trap,
    BootConfig::Exitless,
];

impl BootConfig {
    pub fn name(self) -> &'static str {
        match self {
            BootConfig::Untraced => "untraced",
            BootConfig::Ftrace => "ftrace (the guest's)",
            BootConfig::FtraceSetup => "ftrace, nothing called",
            BootConfig::Trap => "vmtrace trap",
            BootConfig::Exitless => "vmtrace exitless",
        }
    }

    /// Traced by vmtrace: its JSON report on stdout.
    fn vmtrace(self) -> bool {
        matches!(self, BootConfig::Trap | BootConfig::Exitless)
    }

    /// What the configuration adds to the common arguments.
    fn args(self, vmlinux: &Path) -> Vec<String> {
        let traced = |mode: &str| {
            vec![
                "--vmlinux".to_string(),
                vmlinux.display().to_string(),
                "--trace".into(),
                FTRACE_GLOB.into(),
                "--mode".into(),
                mode.into(),
                "--format".into(),
                "json".into(),
            ]
        };
        match self {
            BootConfig::Untraced => Vec::new(),
            BootConfig::Ftrace => vec!["--cmdline".into(), FTRACE_CMDLINE.into()],
            BootConfig::FtraceSetup => vec!["--cmdline".into(), FTRACE_SETUP_CMDLINE.into()],
            BootConfig::Trap => traced("trap"),
            BootConfig::Exitless => traced("exitless"),
        }
    }
}

/// The default Linux guest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinuxGuest {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub vmlinux: PathBuf,
}

/// One boot, to its end.
#[derive(Clone, Debug, PartialEq)]
pub struct Boot {
    pub config: BootConfig,
    pub round: usize,
    /// Guest instructions KVM's emulator ran, all vCPUs.
    pub instructions: u64,
    /// From the vCPUs' start to their stop, seconds.
    pub seconds: f64,
    /// vmtrace's boots: the calls it traced and the exits at its trace port.
    pub calls: Option<u64>,
    pub trap_exits: Option<u64>,
}

/// (i) as measured: every boot, `rounds` of each configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct FtraceFigures {
    pub boots: Vec<Boot>,
    pub rounds: usize,
    /// `kernfs_*` calls in a boot: the same in every vmtrace boot.
    pub calls: u64,
}

impl FtraceFigures {
    /// The boot of `config` in round `r`.
    fn boot(&self, config: BootConfig, r: usize) -> &Boot {
        self.boots
            .iter()
            .find(|b| b.config == config && b.round == r)
            .expect("judged: every round has every configuration")
    }

    /// Every boot of `config`, in round order.
    pub fn of(&self, config: BootConfig) -> Vec<&Boot> {
        (0..self.rounds).map(|r| self.boot(config, r)).collect()
    }

    /// The instructions of each boot of `config`.
    pub fn instructions(&self, config: BootConfig) -> Vec<f64> {
        self.of(config)
            .iter()
            .map(|b| b.instructions as f64)
            .collect()
    }

    /// The seconds of each boot of `config`.
    pub fn seconds(&self, config: BootConfig) -> Vec<f64> {
        self.of(config).iter().map(|b| b.seconds).collect()
    }

    /// Guest instructions `config` added per traced call, per round:
    /// (its boot's - that round's untraced boot's) / calls.
    pub fn added_instructions(&self, config: BootConfig) -> Vec<f64> {
        (0..self.rounds)
            .map(|r| {
                let (c, u) = (self.boot(config, r), self.boot(BootConfig::Untraced, r));
                (c.instructions as f64 - u.instructions as f64) / self.calls as f64
            })
            .collect()
    }

    /// Guest instructions ftrace added per call less its setup, per round:
    /// (the ftrace boot's - that round's tracing-nothing ftrace boot's) /
    /// calls.
    pub fn ftrace_less_setup(&self) -> Vec<f64> {
        (0..self.rounds)
            .map(|r| {
                let (f, s) = (
                    self.boot(BootConfig::Ftrace, r),
                    self.boot(BootConfig::FtraceSetup, r),
                );
                (f.instructions as f64 - s.instructions as f64) / self.calls as f64
            })
            .collect()
    }

    /// µs `config` added per traced call, per round, the same way.
    pub fn added_us(&self, config: BootConfig) -> Vec<f64> {
        (0..self.rounds)
            .map(|r| {
                let (c, u) = (self.boot(config, r), self.boot(BootConfig::Untraced, r));
                (c.seconds - u.seconds) * 1e6 / self.calls as f64
            })
            .collect()
    }

    /// The untraced boots' instructions: median, and max - min.
    pub fn untraced_spread(&self) -> (f64, f64) {
        let v = self.instructions(BootConfig::Untraced);
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (median(&v), hi - lo)
    }

    /// From every boot: each round must have one boot of each
    /// configuration, every vmtrace boot the same calls (none is lost, in
    /// either mode), one trap exit per call in trap mode and none in
    /// exitless mode.
    pub fn judge(boots: Vec<Boot>, rounds: usize) -> Result<FtraceFigures, String> {
        if rounds == 0 {
            return Err("no boot".into());
        }
        for r in 0..rounds {
            for c in BOOT_CONFIGS {
                let n = boots
                    .iter()
                    .filter(|b| b.config == c && b.round == r)
                    .count();
                if n != 1 {
                    return Err(format!("round {r} has {n} {} boots, not 1", c.name()));
                }
            }
        }
        let traced: Vec<&Boot> = boots.iter().filter(|b| b.config.vmtrace()).collect();
        let calls: Vec<u64> = traced.iter().map(|b| b.calls.unwrap_or(0)).collect();
        let first = calls[0];
        if first == 0 || calls.iter().any(|&c| c != first) {
            let said: Vec<String> = traced
                .iter()
                .map(|b| format!("{} {}", b.config.name(), b.calls.unwrap_or(0)))
                .collect();
            return Err(format!(
                "the vmtrace boots traced different numbers of {FTRACE_GLOB} calls: {}",
                said.join(", ")
            ));
        }
        for b in &traced {
            let want = if b.config == BootConfig::Trap {
                first
            } else {
                0
            };
            if b.trap_exits != Some(want) {
                return Err(format!(
                    "a {} boot took {:?} trace-port exits for {first} calls, not {want}",
                    b.config.name(),
                    b.trap_exits
                ));
            }
        }
        Ok(FtraceFigures {
            boots,
            rounds,
            calls: first,
        })
    }
}

/// What one boot's subprocess said: its stderr (`--stats`), its stdout
/// (the JSON report of a vmtrace boot), and the guest's console.
pub struct BootOutput<'a> {
    pub stderr: &'a str,
    pub stdout: &'a str,
    pub console: &'a str,
}

/// A boot's figures from what its subprocess said; Err: the boot is not
/// usable, and why.
pub fn parse_boot(config: BootConfig, round: usize, out: &BootOutput<'_>) -> Result<Boot, String> {
    for line in out.console.lines() {
        if GUEST_COMPLAINTS.iter().any(|c| line.contains(c)) {
            return Err(format!("the guest complained: {}", line.trim()));
        }
    }
    if !out.console.contains(END_OF_BOOT) {
        return Err(format!("the boot did not reach `{END_OF_BOOT}`"));
    }
    if matches!(config, BootConfig::Ftrace | BootConfig::FtraceSetup)
        && !out.console.contains(FTRACE_STARTED)
    {
        return Err(format!(
            "the guest's function tracer did not start (no `{FTRACE_STARTED}`)"
        ));
    }
    if !(out.stderr.contains("guest panicked") || out.stderr.contains("guest powered off")) {
        return Err(
            "the guest did not stop at the end of its boot (a panic or a power-off)".into(),
        );
    }
    let row = out
        .stderr
        .lines()
        .find(|l| l.trim_start().starts_with(STATS_INSTRUCTIONS_ROW))
        .ok_or("KVM gave no instruction count (`--stats` has no instructions row)")?;
    let instructions: u64 = row
        .split_whitespace()
        .last()
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| format!("no total in `{}`", row.trim()))?;
    let seconds: f64 = out
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix(STATS_RUN_LINE))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|t| t.parse().ok())
        .ok_or("`--stats` has no run time")?;
    let (calls, trap_exits) = if config.vmtrace() {
        let v: serde_json::Value = serde_json::from_str(out.stdout)
            .map_err(|e| format!("the JSON report does not parse: {e}"))?;
        let num = |k: &str| {
            v[k].as_u64()
                .ok_or_else(|| format!("the JSON report has no {k}"))
        };
        let reported = v["guest_instructions_emulated"]["total"].as_u64();
        if reported != Some(instructions) {
            return Err(format!(
                "the JSON report's guest_instructions_emulated ({reported:?}) is not \
                 --stats' {instructions}"
            ));
        }
        if num("dropped")? != 0 {
            return Err(format!("{} events dropped", num("dropped")?));
        }
        (Some(num("events")?), Some(num("trap_exits")?))
    } else {
        (None, None)
    };
    Ok(Boot {
        config,
        round,
        instructions,
        seconds,
        calls,
        trap_exits,
    })
}

/// One boot of `guest` in `config`, to its end.
fn boot_once(
    guest: &LinuxGuest,
    config: BootConfig,
    round: usize,
    n: usize,
) -> Result<Boot, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find vmtrace itself: {e}"))?;
    let console =
        std::env::temp_dir().join(format!("vmtrace-bench-i-{}-{n}.log", std::process::id()));
    let mut args: Vec<String> = vec![
        "--kernel".into(),
        guest.kernel.display().to_string(),
        "--initrd".into(),
        guest.initrd.display().to_string(),
        "--cpus".into(),
        "1".into(),
        "--mem".into(),
        BOOT_MEM_MIB.into(),
        "--timeout".into(),
        BOOT_TIMEOUT_S.into(),
        "--console".into(),
        console.display().to_string(),
        "--stats".into(),
    ];
    args.extend(config.args(&guest.vmlinux));
    let out = Command::new(&exe).args(&args).output();
    let text = std::fs::read_to_string(&console).unwrap_or_default();
    let _ = std::fs::remove_file(&console);
    let out = out.map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    parse_boot(
        config,
        round,
        &BootOutput {
            stderr: &stderr,
            stdout: &stdout,
            console: &text,
        },
    )
    .map_err(|why| {
        let said: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("vmtrace:"))
            .collect();
        format!(
            "{} boot (round {}): {why}; vmtrace {} said: {}",
            config.name(),
            round + 1,
            args.join(" "),
            said.join(" | ")
        )
    })
}

/// Figure (i): `rounds` boots of each configuration, interleaved (the
/// order rotates every round), judged.
pub fn ftrace_figures(guest: &LinuxGuest, rounds: usize) -> Result<FtraceFigures, String> {
    let mut boots = Vec::new();
    let total = rounds * BOOT_CONFIGS.len();
    for r in 0..rounds {
        for k in 0..BOOT_CONFIGS.len() {
            let config = BOOT_CONFIGS[(k + r) % BOOT_CONFIGS.len()];
            let n = boots.len();
            let b = boot_once(guest, config, r, n)?;
            note!(
                "vmtrace bench: (i) boot {}/{total}, {}: {} instructions, {:.1} s{}",
                n + 1,
                config.name(),
                tracer::trace::report::thousands(b.instructions),
                b.seconds,
                b.calls.map_or(String::new(), |c| format!(
                    ", {} calls",
                    tracer::trace::report::thousands(c)
                ))
            );
            boots.push(b);
        }
    }
    FtraceFigures::judge(boots, rounds)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn boot(config: BootConfig, round: usize, instructions: u64, seconds: f64) -> Boot {
        let vmtrace = config.vmtrace();
        Boot {
            config,
            round,
            instructions,
            seconds,
            calls: vmtrace.then_some(1000),
            trap_exits: match config {
                BootConfig::Trap => Some(1000),
                BootConfig::Exitless => Some(0),
                _ => None,
            },
        }
    }

    /// Two rounds; per call: ftrace 300 instructions and 400 µs, trap 1
    /// instruction and 10 µs, exitless 23 instructions and 30 µs; the
    /// untraced boots 10,000 instructions apart.
    fn boots() -> Vec<Boot> {
        let mut v = Vec::new();
        for (r, base) in [(0, 100_000_000u64), (1, 100_010_000)] {
            let t = 60.0 + r as f64;
            v.push(boot(BootConfig::Untraced, r, base, t));
            v.push(boot(BootConfig::Ftrace, r, base + 300_000, t + 0.4));
            v.push(boot(BootConfig::FtraceSetup, r, base + 100_000, t + 0.1));
            v.push(boot(BootConfig::Trap, r, base + 1_000, t + 0.01));
            v.push(boot(BootConfig::Exitless, r, base + 23_000, t + 0.03));
        }
        v
    }

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6)
    }

    #[test]
    fn added_per_call_against_the_same_rounds_untraced_boot() {
        let f = FtraceFigures::judge(boots(), 2).unwrap();
        assert_eq!(f.calls, 1000);
        assert_eq!(f.added_instructions(BootConfig::Ftrace), [300.0, 300.0]);
        assert_eq!(
            f.added_instructions(BootConfig::FtraceSetup),
            [100.0, 100.0]
        );
        assert_eq!(f.ftrace_less_setup(), [200.0, 200.0]);
        assert_eq!(f.added_instructions(BootConfig::Trap), [1.0, 1.0]);
        assert_eq!(f.added_instructions(BootConfig::Exitless), [23.0, 23.0]);
        assert!(close(&f.added_us(BootConfig::Ftrace), &[400.0, 400.0]));
        assert!(close(&f.added_us(BootConfig::Trap), &[10.0, 10.0]));
        assert!(close(&f.added_us(BootConfig::Exitless), &[30.0, 30.0]));
        // The lower of two medians (nearest rank), and max - min.
        assert_eq!(f.untraced_spread(), (100_000_000.0, 10_000.0));
        assert_eq!(f.seconds(BootConfig::Untraced), [60.0, 61.0]);
    }

    #[test]
    fn boots_that_disagree_are_refused() {
        // A round without its exitless boot.
        let mut v = boots();
        v.pop();
        let e = FtraceFigures::judge(v, 2).unwrap_err();
        assert_eq!(e, "round 1 has 0 vmtrace exitless boots, not 1");
        // Trap and exitless saw different calls.
        let mut v = boots();
        v[4].calls = Some(999);
        let e = FtraceFigures::judge(v, 2).unwrap_err();
        assert!(e.contains("different numbers of kernfs_* calls"), "{e}");
        assert!(e.contains("vmtrace exitless 999"), "{e}");
        // An exit in exitless mode; a trap call without its exit.
        let mut v = boots();
        v[4].trap_exits = Some(2);
        let e = FtraceFigures::judge(v, 2).unwrap_err();
        assert!(e.contains("vmtrace exitless boot took Some(2)"), "{e}");
        let mut v = boots();
        v[3].trap_exits = Some(999);
        assert!(FtraceFigures::judge(v, 2).is_err());
        // Nothing traced.
        let mut v = boots();
        for b in v.iter_mut().filter(|b| b.config.vmtrace()) {
            b.calls = Some(0);
        }
        assert!(FtraceFigures::judge(v, 2).is_err());
    }

    const STATS: &str = "\
vmtrace: guest panicked: Kernel panic - not syncing: Attempted to kill init! after 94.79 s
exits per vCPU:
  kind                       cpu0
  pio-out                    7760
KVM's own counts per vCPU (its binary statistics):
                                cpu0         total
  instructions emulated    123456789     123456789
  exits (all kinds)            20000         20000
  (instructions emulated: counted by KVM's instruction emulator, ...)
run: 94.791 s from the vCPUs' start to their stop
";
    const CONSOLE: &str = "\
[    0.000000] Linux version 6.1
[    1.000000] Starting tracer 'function'
[   60.000000] Run /init as init process
[   60.100000] Kernel panic - not syncing: Attempted to kill init!
";

    #[test]
    fn a_boot_parsed_from_what_vmtrace_said() {
        let out = BootOutput {
            stderr: STATS,
            stdout: "",
            console: CONSOLE,
        };
        let b = parse_boot(BootConfig::Ftrace, 2, &out).unwrap();
        assert_eq!(b.instructions, 123_456_789);
        assert_eq!(b.seconds, 94.791);
        assert_eq!((b.round, b.calls, b.trap_exits), (2, None, None));
        let json = r#"{"events": 19124, "dropped": 0, "trap_exits": 19124,
            "guest_instructions_emulated": {"total": 123456789, "per_cpu": {"0": 123456789}}}"#;
        let out = BootOutput {
            stdout: json,
            ..out
        };
        let b = parse_boot(BootConfig::Trap, 0, &out).unwrap();
        assert_eq!((b.calls, b.trap_exits), (Some(19124), Some(19124)));
    }

    #[test]
    fn an_unusable_boot_says_why() {
        let ok = BootOutput {
            stderr: STATS,
            stdout: "",
            console: CONSOLE,
        };
        let err = |o: &BootOutput<'_>, c| parse_boot(c, 0, o).unwrap_err();
        let warned = format!("{CONSOLE}[   61.0] WARNING: CPU: 0 PID: 1 at kernel/x.c:1\n");
        let e = err(
            &BootOutput {
                console: &warned,
                ..ok
            },
            BootConfig::Untraced,
        );
        assert_eq!(
            e,
            "the guest complained: [   61.0] WARNING: CPU: 0 PID: 1 at kernel/x.c:1"
        );
        let bug = "[ 1.0] ftrace bug: ftrace faulted\nRun /init as init process\n";
        let e = err(&BootOutput { console: bug, ..ok }, BootConfig::Trap);
        assert!(e.contains("ftrace bug"), "{e}");
        let short = "[ 1.0] Linux version 6.1\n";
        let e = err(
            &BootOutput {
                console: short,
                ..ok
            },
            BootConfig::Untraced,
        );
        assert!(
            e.contains("did not reach `Run /init as init process`"),
            "{e}"
        );
        let no_ftrace = CONSOLE.replace("Starting tracer 'function'", "");
        let e = err(
            &BootOutput {
                console: &no_ftrace,
                ..ok
            },
            BootConfig::Ftrace,
        );
        assert!(e.contains("function tracer did not start"), "{e}");
        // Stopped by its timeout; KVM without counts.
        let timeout = STATS.replace("guest panicked", "timeout after 300 s");
        let e = err(
            &BootOutput {
                stderr: &timeout,
                ..ok
            },
            BootConfig::Untraced,
        );
        assert!(e.contains("did not stop at the end of its boot"), "{e}");
        let no_kvm = "vmtrace: guest panicked: x after 1 s\n\
                      KVM's own counts: not available (no stats)\nrun: 1.000 s\n";
        let e = err(
            &BootOutput {
                stderr: no_kvm,
                ..ok
            },
            BootConfig::Untraced,
        );
        assert!(e.contains("KVM gave no instruction count"), "{e}");
        // A vmtrace boot whose JSON disagrees with --stats, or dropped calls.
        let json = r#"{"events": 5, "dropped": 0, "trap_exits": 5,
            "guest_instructions_emulated": {"total": 1, "per_cpu": {"0": 1}}}"#;
        let e = err(&BootOutput { stdout: json, ..ok }, BootConfig::Trap);
        assert!(e.contains("is not --stats' 123456789"), "{e}");
        let json = r#"{"events": 5, "dropped": 2, "trap_exits": 5,
            "guest_instructions_emulated": {"total": 123456789, "per_cpu": {"0": 123456789}}}"#;
        let e = err(&BootOutput { stdout: json, ..ok }, BootConfig::Exitless);
        assert_eq!(e, "2 events dropped");
    }

    #[test]
    fn configurations_boot_as_a_user_would() {
        let v = Path::new("/g/vmlinux");
        assert!(BootConfig::Untraced.args(v).is_empty());
        assert_eq!(
            BootConfig::Ftrace.args(v),
            ["--cmdline", "ftrace=function ftrace_filter=kernfs_*"]
        );
        assert_eq!(
            BootConfig::Exitless.args(v),
            [
                "--vmlinux",
                "/g/vmlinux",
                "--trace",
                "kernfs_*",
                "--mode",
                "exitless",
                "--format",
                "json"
            ]
        );
    }
}
