//! A session: from the command line to a booted (and traced) guest and its report.

use std::fs::File;
use std::io::{LineWriter, Write};
use std::path::Path;
use std::time::Duration;

use vmm::{StopReason, Vm, VmConfig};

use crate::cli::{Cli, Command, RunArgs};

/// A failure, sorted by whose it is.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The user's input is wrong (exit status 2).
    #[error("{0}")]
    Input(String),
    /// Something failed while running (exit status 1).
    #[error("{0}")]
    Runtime(String),
}

pub enum Outcome {
    Clean,
    GuestFailed,
}

/// Linux command line: serial console, reboot through the keyboard controller
/// (the run then ends), reboot at once on panic, no KASLR (sites are patched at
/// the addresses the vmlinux gives).
const LINUX_CMDLINE: &str = "console=ttyS0 reboot=k panic=-1 nokaslr";
/// What a host whose KVM runs guest ring 0 in its instruction emulator cannot
/// run (see shared/KVM-HOST.md): XSAVE, CMPXCHG16B, POPCNT, SMAP's clac/stac.
const EMULATOR_HOST_CMDLINE: &str = "noxsave clearcpuid=cx16,popcnt,smap";
/// Present when the host's KVM is the pagetable-based nested one (kvm_pvm).
const EMULATOR_HOST_MARKER: &str = "/sys/module/kvm_pvm";

/// Does this host's KVM run guest ring 0 in its instruction emulator?
pub fn emulator_host() -> bool {
    Path::new(EMULATOR_HOST_MARKER).exists()
}

pub fn main(cli: Cli) -> Result<Outcome, Error> {
    match cli.command {
        Some(Command::Report(r)) => crate::output::report_command(&r),
        Some(Command::Bench(b)) => crate::bench::run(&b),
        None => run(&cli.run),
    }
}

/// The kernel command line for this kernel and these flags.
fn cmdline(args: &RunArgs, kernel: &Path) -> Result<String, Error> {
    if let Some(s) = &args.cmdline_replace {
        return Ok(s.clone());
    }
    let linux = vmm::boot::is_linux_kernel(kernel).map_err(|e| Error::Input(e.to_string()))?;
    let mut words: Vec<String> = Vec::new();
    if linux {
        words.extend(LINUX_CMDLINE.split(' ').map(str::to_owned));
        if emulator_host() {
            words.extend(EMULATOR_HOST_CMDLINE.split(' ').map(str::to_owned));
        }
    }
    for w in args.cmdline.iter().flat_map(|c| c.split_whitespace()) {
        merge_word(&mut words, w);
    }
    Ok(words.join(" "))
}

/// Append a command-line word. Linux honours only the last `clearcpuid=`, so
/// a user's list is merged into ours instead of silently replacing it.
fn merge_word(words: &mut Vec<String>, word: &str) {
    const CLEARCPUID: &str = "clearcpuid=";
    if let Some(list) = word.strip_prefix(CLEARCPUID) {
        if let Some(ours) = words.iter_mut().find(|w| w.starts_with(CLEARCPUID)) {
            ours.push(',');
            ours.push_str(list);
            return;
        }
    }
    words.push(word.to_owned());
}

pub fn secs(v: Option<f64>, flag: &str) -> Result<Option<Duration>, Error> {
    match v {
        None => Ok(None),
        Some(s) if s.is_finite() && s > 0.0 => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => Err(Error::Input(format!(
            "{flag} {s} is not a positive number of seconds"
        ))),
    }
}

pub fn vm_config(args: &RunArgs) -> Result<VmConfig, Error> {
    let kernel = args.kernel.clone().ok_or_else(|| {
        Error::Input("--kernel PATH is required (a bzImage, vmlinux or ELF guest)".into())
    })?;
    if !kernel.is_file() {
        return Err(Error::Input(format!(
            "kernel {} does not exist or is not a file; pass --kernel PATH",
            kernel.display()
        )));
    }
    let console: Box<dyn Write + Send> = match &args.console {
        Some(p) => Box::new(LineWriter::new(File::create(p).map_err(|e| {
            Error::Input(format!("cannot create console file {}: {e}", p.display()))
        })?)),
        None => Box::new(LineWriter::new(std::io::stdout())),
    };
    Ok(VmConfig {
        cmdline: cmdline(args, &kernel)?,
        kernel,
        initrd: args.initrd.clone(),
        cpus: args.cpus,
        mem_mib: args.mem,
        console,
        timeout: secs(args.timeout, "--timeout")?,
        hide_hypercalls: emulator_host(),
    })
}

fn run(args: &RunArgs) -> Result<Outcome, Error> {
    let cfg = vm_config(args)?;
    if args.trace.is_empty() && args.notrace.is_empty() {
        if args.duration.is_some() || args.from_boot {
            return Err(Error::Input(
                "--duration and --from-boot need --trace GLOB".into(),
            ));
        }
        return run_untraced(args, cfg);
    }
    crate::trace::run_traced(args, cfg)
}

fn run_untraced(args: &RunArgs, cfg: VmConfig) -> Result<Outcome, Error> {
    let vm = Vm::create(cfg).map_err(|e| Error::Input(e.to_string()))?;
    let handlers = (0..vm.cpus())
        .map(|_| Box::new(vmm::NoTracer) as Box<dyn vmm::TrapHandler>)
        .collect();
    let running = vm
        .start(handlers, false)
        .map_err(|e| Error::Runtime(e.to_string()))?;
    running.wait();
    let report = running.finish();
    eprintln!(
        "vmtrace: {} after {:.2} s",
        report.reason,
        report.elapsed.as_secs_f64()
    );
    if args.stats {
        print_stats(&report);
    }
    Ok(outcome(&report.reason))
}

pub fn outcome(reason: &StopReason) -> Outcome {
    match reason {
        StopReason::PowerOff(0) | StopReason::Requested | StopReason::Signal(_) => Outcome::Clean,
        _ => Outcome::GuestFailed,
    }
}

/// `--stats`: exits per vCPU and kind, assists, pauses.
pub fn print_stats(report: &vmm::RunReport) {
    use vmm::exit::ExitKind;
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "exits per vCPU:");
    let _ = write!(err, "  {:<18}", "kind");
    for cpu in 0..report.vcpus.len() {
        let _ = write!(err, " {:>12}", format!("cpu{cpu}"));
    }
    let _ = writeln!(err);
    for kind in ExitKind::ALL {
        if report.vcpus.iter().all(|v| v.get(kind) == 0) {
            continue;
        }
        let _ = write!(err, "  {:<18}", kind.name());
        for v in &report.vcpus {
            let _ = write!(err, " {:>12}", v.get(kind));
        }
        let _ = writeln!(err);
    }
    for (cpu, v) in report.vcpus.iter().enumerate() {
        for (insn, n) in &v.assists {
            let _ = writeln!(err, "  cpu{cpu}: emulation assist `{insn}` x{n}");
        }
    }
    for (cpu, r) in report.last_regs.iter().enumerate() {
        match r {
            Some(s) => {
                let _ = writeln!(
                    err,
                    "  cpu{cpu} stopped at rip {:#x} (cs {:#x} base {:#x}), rsp {:#x}, cr0 {:#x}, cr3 {:#x}",
                    s.regs.rip, s.sregs.cs.selector, s.sregs.cs.base, s.regs.rsp, s.sregs.cr0, s.sregs.cr3
                );
            }
            None => {
                let _ = writeln!(err, "  cpu{cpu} had already stopped");
            }
        }
    }
    let p = &report.pause;
    if !p.latency_ns.is_empty() {
        let _ = writeln!(
            err,
            "pauses: {}, latency p50 {} us, window p50 {} us",
            p.latency_ns.len(),
            crate::stats::percentile(&p.latency_ns, 50.0).unwrap_or(0) / 1000,
            crate::stats::percentile(&p.window_ns, 50.0).unwrap_or(0) / 1000
        );
    }
}

#[cfg(test)]
mod tests {
    use super::merge_word;

    #[test]
    fn clearcpuid_lists_are_merged() {
        let mut w = vec![
            "console=ttyS0".to_string(),
            "clearcpuid=cx16,smap".to_string(),
        ];
        merge_word(&mut w, "clearcpuid=erms");
        merge_word(&mut w, "quiet");
        assert_eq!(w, ["console=ttyS0", "clearcpuid=cx16,smap,erms", "quiet"]);
        let mut w = Vec::new();
        merge_word(&mut w, "clearcpuid=erms");
        assert_eq!(w, ["clearcpuid=erms"]);
    }

    #[test]
    fn a_guest_crash_is_a_guest_failure() {
        use super::{outcome, Outcome};
        use vmm::StopReason;
        let failed = |r| matches!(outcome(&r), Outcome::GuestFailed);
        assert!(failed(StopReason::Crash { cpu: 0 }));
        assert!(failed(StopReason::Reset));
        assert!(!failed(StopReason::PowerOff(0)));
    }
}
