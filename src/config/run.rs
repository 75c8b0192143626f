//! `vmtrace --kernel ...` and `vmtrace record`, checked: the VM to create
//! and, with `--trace`, what to trace and where the results go.

use std::fs::File;
use std::io::{LineWriter, Write};
use std::path::Path;
use std::time::Duration;

use tracer::plan::Plan;
use tracer::session::exitless::state::Exitless;
use tracer::session::{Mode, TracerError};
use vmm::boot::BootError;
use vmm::VmConfig;

use super::output::{self, format_name};
use super::{check_cpus, check_mem, emulator_host, secs, KernelKind, Output};
use crate::cli::{Format, ModeArg, OutputArgs, RunArgs};
use crate::console::Checked;
use crate::error::InputError;

/// Linux command line: serial console, reboot through the keyboard controller
/// (the run then ends), reboot at once on panic. KASLR stays on: the tracer
/// finds the kernel's offsets at attach (tracer::kernel::kaslr).
const LINUX_CMDLINE: &str = "console=ttyS0 reboot=k panic=-1";
/// What a host whose KVM runs guest ring 0 in its instruction emulator cannot
/// run (see docs/emulating-kvm.md): XSAVE, CMPXCHG16B, POPCNT, SMAP's clac/stac,
/// and `lsl`, which Linux's NMI entry (`paranoid_entry`) runs to find its
/// per-CPU base when FSGSBASE is on: an NMI (an RCU stall's backtrace on
/// this slow host) would stop the guest. Without FSGSBASE it reads the GS
/// base MSR instead.
const EMULATOR_HOST_CMDLINE: &str = "noxsave nofsgsbase clearcpuid=cx16,popcnt,smap";

/// Which command boots the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// `vmtrace --kernel ...`: the report on stdout, `-o` saves the trace.
    OneShot,
    /// `vmtrace record`: the trace saved, no report.
    Record,
}

/// The smallest `--buffer`: two batches of a recorder (`tracer::session::record::BATCH`).
const MIN_BUFFER: u64 =
    2 * (tracer::session::record::BATCH * tracer::trace::datafile::EVENT_SIZE) as u64;
/// Bytes of one stored event (the data file's record).
const EVENT_BYTES: u64 = tracer::trace::datafile::EVENT_SIZE as u64;

/// A run, checked.
pub struct RunConfig {
    /// What `Vm::create` gets: every field already checked.
    pub vm: VmConfig,
    pub kind: KernelKind,
    /// `--stats`.
    pub stats: bool,
    /// With `--trace`/`--notrace`.
    pub trace: Option<TraceConfig>,
}

/// What to trace, resolved against the vmlinux, and what to do with it.
pub struct TraceConfig {
    pub plan: Plan,
    pub mode: Mode,
    /// Records per exitless ring (None: as many as fit).
    pub ring_events: Option<u64>,
    pub duration: Option<Duration>,
    /// `--max-events` (u64::MAX: no limit).
    pub max_events: u64,
    /// `--buffer`, bytes.
    pub buffer: u64,
    /// `--overwrite`: the newest events kept per vCPU (flight recorder).
    pub overwrite: Option<u64>,
    pub output: Output,
    /// Lines to say once the run is set (`--graph`: what it left out, and
    /// what the guest's stack traces show).
    pub notes: Vec<String>,
}

impl RunConfig {
    /// Check every option, cheapest first; load the vmlinux and resolve the
    /// filters last but one, and create the console file last, so a bad
    /// option costs nothing and leaves nothing behind.
    pub fn check(args: &RunArgs, out: &OutputArgs, form: Form) -> Result<RunConfig, InputError> {
        let kernel = args.kernel.clone().ok_or(InputError::NoKernel)?;
        if !kernel.is_file() {
            return Err(InputError::KernelMissing(kernel));
        }
        let traced = !args.trace.is_empty() || !args.notrace.is_empty();
        if form == Form::Record && !traced {
            return Err(InputError::RecordNeedsTrace);
        }
        if !traced {
            if args.graph {
                return Err(InputError::NeedsTrace { flag: "--graph" });
            }
            if args.duration.is_some() {
                return Err(InputError::NeedsTrace { flag: "--duration" });
            }
            if args.overwrite.is_some() {
                return Err(InputError::NeedsTrace {
                    flag: "--overwrite",
                });
            }
            if args.max_events.is_some() {
                return Err(InputError::NeedsTrace {
                    flag: "--max-events",
                });
            }
            if args.from_boot {
                return Err(InputError::NeedsTrace {
                    flag: "--from-boot",
                });
            }
        }
        let cpus = check_cpus(args.cpus)?;
        let mem_mib = check_mem(args.mem)?;
        let timeout = secs(args.timeout, "--timeout")?;
        let duration = secs(args.duration, "--duration")?;
        let output = match form {
            Form::OneShot => Output::for_run(out, traced)?,
            Form::Record => Some(Output::for_record(out)?),
        };
        if let Some(view) = output
            .as_ref()
            .and_then(Output::graph_view)
            .filter(|_| !args.graph)
        {
            return Err(InputError::NeedsGraph { view });
        }
        let console = Console::of(args.console.as_deref());
        if let Some(o) = &output {
            let stdout_format = o.view.as_ref().map_or(Format::Text, |v| v.format);
            if console == Console::Stdout && stdout_format != Format::Text {
                return Err(InputError::ConsoleOnStdout {
                    format: format_name(stdout_format),
                });
            }
            let mut files = o.files();
            if let Console::File(path) = console {
                files.push(("--console".to_string(), path));
            }
            output::distinct(&files)?;
        }

        let kind = KernelKind::detect(&kernel)?;
        if args.from_boot && kind.is_linux() {
            return Err(InputError::FromBootLinux(kernel));
        }
        let mem_size = mem_mib << 20;
        if kind == KernelKind::BzImage {
            // Its setup header against the file: truncated or corrupt images
            // are refused now, not after a boot that triple-faults.
            let (mut file, _) = vmm::boot::open_input(
                &kernel,
                "kernel",
                vmm::boot::KERNEL_MAX_SIZE,
                "the largest guest memory",
            )
            .map_err(BootError::from)?;
            vmm::boot::linux::check_bzimage(&mut file, &kernel).map_err(BootError::from)?;
        }
        if let Some(initrd) = &args.initrd {
            if !initrd.exists() {
                return Err(InputError::InitrdMissing(initrd.clone()));
            }
            if !kind.is_linux() {
                return Err(BootError::InitrdWithElf { path: kernel }.into());
            }
            // A regular file, no larger than the guest's RAM.
            vmm::boot::open_initrd(initrd, mem_size).map_err(BootError::from)?;
        }
        if kind != KernelKind::BzImage {
            check_elf_kernel(&kernel, mem_size)?;
        }
        let emulator_host = emulator_host();
        let cmdline = cmdline(args, kind, emulator_host)?;

        let buffer = super::size(&args.buffer, "--buffer", MIN_BUFFER)?;
        let overwrite = match &args.overwrite {
            Some(v) => Some(super::size(v, "--overwrite", EVENT_BYTES)? / EVENT_BYTES),
            None => None,
        };
        let trace = if let Some(output) = output {
            let mut plan = super::symbols::plan(args, &kernel, kind)?;
            let notes = if args.graph {
                graph_plan(&mut plan, kind)?
            } else {
                Vec::new()
            };
            check_patchable(&plan, args)?;
            let mode = choose_mode(args, &plan, cpus as usize, emulator_host)?;
            Some(TraceConfig {
                plan,
                mode,
                ring_events: args.ring_events,
                duration,
                max_events: args.max_events.unwrap_or(u64::MAX),
                buffer,
                overwrite,
                output,
                notes,
            })
        } else {
            None
        };

        // Every console but `none` through `console::Checked`: a failed
        // write is said at the end of the run.
        let console: Box<dyn Write + Send> = match console {
            Console::Stderr => Box::new(Checked::new(
                LineWriter::new(crate::status::ConsoleOnStderr),
                "stderr",
            )),
            Console::Stdout => Box::new(Checked::new(LineWriter::new(std::io::stdout()), "stdout")),
            Console::None => Box::new(std::io::sink()),
            Console::File(path) => Box::new(Checked::new(
                LineWriter::new(open_console(path)?),
                path.display().to_string(),
            )),
        };
        Ok(RunConfig {
            vm: VmConfig {
                kernel,
                kind,
                initrd: args.initrd.clone(),
                cpus,
                mem_mib,
                cmdline,
                console,
                timeout,
                hide_hypercalls: emulator_host,
            },
            kind,
            stats: args.stats,
            trace,
        })
    }
}

/// An ELF kernel's loadable segments must lie in guest RAM (bss included).
fn check_elf_kernel(kernel: &Path, mem_size: u64) -> Result<(), InputError> {
    let (file, size) = vmm::boot::open_input(
        kernel,
        "kernel",
        vmm::boot::KERNEL_MAX_SIZE,
        "the largest guest memory",
    )
    .map_err(BootError::from)?;
    let elf = vmm::boot::read_input(&file, size).map_err(|source| BootError::Open {
        path: kernel.to_owned(),
        source,
    })?;
    vmm::boot::check_elf_segments(&elf, kernel, mem_size).map_err(BootError::from)?;
    Ok(())
}

/// The symbol holding "Linux version ..." in a vmlinux.
const LINUX_BANNER: &str = "linux_banner";

/// The vmlinux must be the kernel's, found now rather than after a boot that
/// waits for sites that never come: a bzImage's version string (its setup
/// header's `kernel_version`, "6.1.192 (user@host) #1 SMP ...") against the
/// vmlinux's `linux_banner` ("Linux version 6.1.192 (user@host) (gcc ...) #1
/// SMP ..."); two ELF files by their build ids.
pub(super) fn check_vmlinux(
    kernel: &Path,
    kind: KernelKind,
    vmlinux: &Path,
    image: &tracer::kernel::symbols::KernelImage,
) -> Result<(), InputError> {
    let mismatch = |why: String| InputError::VmlinuxMismatch {
        vmlinux: vmlinux.to_owned(),
        kernel: kernel.to_owned(),
        why,
    };
    let banner = image.symbol(LINUX_BANNER).and_then(|s| {
        let len = usize::try_from(s.size)
            .ok()
            .filter(|&n| n > 0 && n <= 4096)?;
        let bytes = image.file_bytes(s.addr, len)?;
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        Some(String::from_utf8_lossy(&bytes[..end]).trim_end().to_owned())
    });
    match kind {
        KernelKind::BzImage => {
            let Some(banner) = banner else {
                return Err(mismatch(format!(
                    "it is not a Linux vmlinux (no {LINUX_BANNER}) but the kernel is a bzImage"
                )));
            };
            let (mut file, _) = vmm::boot::open_input(
                kernel,
                "kernel",
                vmm::boot::KERNEL_MAX_SIZE,
                "the largest guest memory",
            )
            .map_err(BootError::from)?;
            let version =
                vmm::boot::linux::bzimage_version(&mut file, kernel).map_err(BootError::from)?;
            if let Some(version) = version {
                if !banner_matches(&banner, &version) {
                    return Err(mismatch(format!(
                        "the kernel is {version:?}, the vmlinux {banner:?}"
                    )));
                }
            }
        }
        KernelKind::LinuxElf | KernelKind::Elf => {
            if vmlinux == kernel {
                return Ok(());
            }
            let kernel_image =
                tracer::kernel::symbols::KernelImage::load(kernel).map_err(TracerError::from)?;
            let hex = |b: &Option<Vec<u8>>| {
                b.as_ref()
                    .map(|b| b.iter().map(|x| format!("{x:02x}")).collect::<String>())
            };
            match (hex(&kernel_image.build_id), hex(&image.build_id)) {
                (Some(k), Some(v)) if k != v => {
                    return Err(mismatch(format!("build id {v} is not the kernel's {k}")));
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// Does a vmlinux's banner ("Linux version R (B@H) (compiler) V") describe the
/// bzImage version `version` ("R (B@H) V")?
fn banner_matches(banner: &str, version: &str) -> bool {
    let Some(banner) = banner.strip_prefix("Linux version ") else {
        return false;
    };
    // "R (B@H)" starts both; UTS_VERSION ("#1 SMP ...", with the build
    // time) ends both.
    let (head, uts) = match version.split_once(") ") {
        Some((h, u)) => (format!("{h})"), u),
        None => (version.to_owned(), ""),
    };
    banner.starts_with(&head) && banner.ends_with(uts)
}

/// A selection whose every site is in init text would boot and trace nothing.
/// `--graph`: hook returns, leaving out (and naming) the functions whose
/// return must not be hooked (`tracer::plan::hookable`); refused if nothing else
/// is left to trace. The notes to say: what it left out, and on Linux what
/// the guest's own stack traces show meanwhile (docs/how-it-works.md,
/// "Function graph: how returns are hooked").
fn graph_plan(plan: &mut Plan, kind: KernelKind) -> Result<Vec<String>, InputError> {
    let had_sites = !plan.index.addrs.is_empty();
    let left_out = tracer::plan::hookable::hook_returns(plan);
    let why = |n: &String| {
        format!(
            "{n} ({})",
            tracer::plan::hookable::unhookable(n).unwrap_or_default()
        )
    };
    let names = left_out.iter().map(why).collect::<Vec<_>>().join("; ");
    if had_sites && plan.index.addrs.is_empty() {
        return Err(InputError::GraphUnhookable { names });
    }
    let mut notes = Vec::new();
    if !left_out.is_empty() {
        notes.push(format!(
            "vmtrace: --graph: left out {names}: the guest's unwinder would stop at vmtrace's hook"
        ));
    }
    if kind.is_linux() {
        notes.push(
            "vmtrace: --graph: the guest's own stack traces leave out the caller of each hooked call \
             (its return address is vmtrace's, outside kernel text); ORC and frame-pointer unwinders \
             mark the frames beyond it unreliable ('?')"
                .to_string(),
        );
    }
    Ok(notes)
}

fn check_patchable(plan: &Plan, args: &RunArgs) -> Result<(), InputError> {
    if !plan.index.addrs.is_empty() || plan.skipped_init == 0 {
        return Ok(());
    }
    // Name a few: the selection again (cheap, and it succeeded once).
    let selected = tracer::kernel::filter::Filter::new(&args.trace, &args.notrace)
        .and_then(|f| f.select(&plan.image, &plan.sites))
        .unwrap_or_default();
    let mut names: Vec<&str> = selected
        .iter()
        .map(|&i| {
            plan.image.functions[plan.sites.sites[i].func as usize]
                .name
                .as_str()
        })
        .take(3)
        .collect();
    if selected.len() > names.len() {
        names.push("...");
    }
    Err(InputError::NoPatchableSite {
        skipped: plan.skipped_init,
        examples: names.join(", "),
    })
}

/// Where `--console` sends the guest console.
#[derive(Debug, PartialEq, Eq)]
enum Console<'a> {
    /// The default: stdout is vmtrace's own (`--format json | jq`).
    Stderr,
    /// `--console -`.
    Stdout,
    /// `--console none`: discarded.
    None,
    File(&'a Path),
}

impl<'a> Console<'a> {
    fn of(arg: Option<&'a Path>) -> Console<'a> {
        match arg {
            None => Console::Stderr,
            Some(p) if p == Path::new("-") => Console::Stdout,
            // (A file named `none` is `./none`.)
            Some(p) if p == Path::new("none") => Console::None,
            Some(p) => Console::File(p),
        }
    }
}

/// `--console FILE`: the guest's console streams there as it runs, so it
/// is written in place, not replaced atomically. The output rules still
/// hold: a regular file (created or truncated; a symlink to one followed) or
/// a character device (written into); a directory, FIFO (it would block the
/// run until someone reads it), socket or block device is refused.
fn open_console(path: &Path) -> Result<File, InputError> {
    use tracer::trace::output_path::{target, Target};
    let err = |source| InputError::Console {
        path: path.to_path_buf(),
        source,
    };
    match target(path).map_err(err)? {
        Target::File { path: file, .. } => File::create(file).map_err(err),
        Target::Device(dev) => std::fs::OpenOptions::new()
            .write(true)
            .open(dev)
            .map_err(err),
    }
}

/// `--mode`: the one asked for, checked now (rings that fit, a kernel whose
/// per-CPU `cpu_number` the trampoline can read); or, for `auto`, trap on a
/// host whose KVM emulates guest ring 0 (there a guest instruction costs
/// ~0.85 µs, so the trampoline's 28 cost ~31 µs against ~5 µs for a trapped
/// call: `vmtrace bench` (f)), else exitless where it can be planned, else trap.
fn choose_mode(
    args: &RunArgs,
    plan: &Plan,
    cpus: usize,
    emulator_host: bool,
) -> Result<Mode, InputError> {
    let check = || {
        Exitless::check(
            &plan.image,
            cpus,
            plan.index.addrs.len(),
            args.ring_events,
            plan.graph,
        )
    };
    match args.mode {
        ModeArg::Trap => Ok(Mode::Trap),
        ModeArg::Exitless => {
            check().map_err(TracerError::from)?;
            Ok(Mode::Exitless)
        }
        ModeArg::Auto if emulator_host => Ok(Mode::Trap),
        ModeArg::Auto => match check() {
            Ok(()) => Ok(Mode::Exitless),
            Err(e) => {
                let e = vmm::advice::Advice::say(&e, &crate::error::Flags);
                note!("vmtrace: --mode auto: tracing with traps: {e}");
                Ok(Mode::Trap)
            }
        },
    }
}

/// The kernel command line for this kernel and these flags, checked against
/// the space the boot protocols give it.
fn cmdline(args: &RunArgs, kind: KernelKind, emulator_host: bool) -> Result<String, BootError> {
    let line = match &args.cmdline_replace {
        Some(s) => s.clone(),
        None => {
            let mut words: Vec<String> = Vec::new();
            if kind.is_linux() {
                words.extend(LINUX_CMDLINE.split(' ').map(str::to_owned));
                if emulator_host {
                    words.extend(EMULATOR_HOST_CMDLINE.split(' ').map(str::to_owned));
                }
            }
            for w in args.cmdline.iter().flat_map(|c| c.split_whitespace()) {
                merge_word(&mut words, w);
            }
            words.join(" ")
        }
    };
    // The loader stores it NUL-terminated.
    let max = vmm::layout::CMDLINE_MAX_SIZE - 1;
    if line.len() > max {
        return Err(BootError::CmdlineTooLong {
            len: line.len(),
            max,
        });
    }
    Ok(line)
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

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

    fn run_args(args: &[&str]) -> RunArgs {
        let mut argv = vec!["vmtrace"];
        argv.extend_from_slice(args);
        crate::cli::Cli::parse_from(argv).run
    }

    #[test]
    fn console_destinations() {
        assert_eq!(Console::of(None), Console::Stderr);
        assert_eq!(Console::of(Some(Path::new("-"))), Console::Stdout);
        assert_eq!(Console::of(Some(Path::new("none"))), Console::None);
        assert_eq!(
            Console::of(Some(Path::new("./none"))),
            Console::File(Path::new("./none"))
        );
    }

    #[test]
    fn command_line_by_kind() {
        let a = run_args(&["--cmdline", "quiet clearcpuid=erms"]);
        assert_eq!(
            cmdline(&a, KernelKind::LinuxElf, true).unwrap(),
            format!("{LINUX_CMDLINE} noxsave nofsgsbase clearcpuid=cx16,popcnt,smap,erms quiet")
        );
        assert_eq!(
            cmdline(&a, KernelKind::BzImage, false).unwrap(),
            format!("{LINUX_CMDLINE} quiet clearcpuid=erms")
        );
        assert_eq!(
            cmdline(&a, KernelKind::Elf, true).unwrap(),
            "quiet clearcpuid=erms"
        );
        let a = run_args(&["--cmdline-replace", "root=/dev/vda"]);
        assert_eq!(
            cmdline(&a, KernelKind::BzImage, true).unwrap(),
            "root=/dev/vda"
        );
        let long = "x".repeat(vmm::layout::CMDLINE_MAX_SIZE);
        let a = run_args(&["--cmdline", &long]);
        assert!(matches!(
            cmdline(&a, KernelKind::Elf, false),
            Err(BootError::CmdlineTooLong { .. })
        ));
    }
}
