//! `vmtrace --kernel ...` and `vmtrace record`, checked: the flags mapped
//! to what the libraries plan (the kernel file opened once, the guest's
//! configuration, the trace plan), and where the results go.

use std::fs::File;
use std::io::{LineWriter, Write};
use std::path::Path;
use std::time::Duration;

use tracer::kernel::find::{self, Given};
use tracer::plan::{Note, TracePlan};
use vmm::boot::cmdline::{kernel_cmdline, Cmdline};
use vmm::boot::{BootError, KernelFile};
use vmm::{VmConfig, VmSize};

use super::output::{self, format_name};
use super::{secs, Output};
use crate::cli::{Format, OutputArgs, RunArgs};
use crate::console::Checked;
use crate::error::InputError;

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
    /// `--stats`.
    pub stats: bool,
    /// With `--trace`/`--notrace`.
    pub trace: Option<TraceConfig>,
}

/// What to trace, planned against the kernel, and what to do with it.
pub struct TraceConfig {
    pub plan: TracePlan,
    pub duration: Option<Duration>,
    /// `--max-events` (u64::MAX: no limit).
    pub max_events: u64,
    /// `--buffer`, bytes.
    pub buffer: u64,
    /// `--overwrite`: the newest events kept per vCPU (flight recorder).
    pub overwrite: Option<u64>,
    pub output: Output,
}

impl RunConfig {
    /// Check every option, cheapest first; open the kernel, find its symbols
    /// and plan the trace last but one, and create the console file last,
    /// so a bad option costs nothing and leaves nothing behind.
    pub fn check(args: &RunArgs, out: &OutputArgs, form: Form) -> Result<RunConfig, InputError> {
        let kernel = args.kernel.clone().ok_or(InputError::NoKernel)?;
        if !kernel.is_file() {
            return Err(InputError::KernelMissing(kernel));
        }
        let t = &args.tracing;
        let traced = !t.trace.is_empty() || !t.notrace.is_empty() || !t.event.is_empty();
        check_flags(args, form, traced)?;
        let size = VmSize::new(args.cpus, args.mem)?;
        let (cpus, mem_mib) = (size.cpus(), size.mem_mib());
        let timeout = secs(args.timeout, "--timeout")?;
        let duration = secs(t.duration, "--duration")?;
        let output = outputs(args, out, form, traced)?;
        let console = Console::of(args.console.as_deref());
        check_console(&console, output.as_ref())?;
        // Before the kernel is read: a wrong DIR is bad input.
        let files = (args.modules.as_deref())
            .map(tracer::kernel::module_files::ModuleFiles::scan)
            .transpose()?
            .map(std::sync::Arc::new);

        let kernel = KernelFile::classify(&kernel)?;
        let kind = kernel.kind();
        if args.from_boot && kind.is_linux() {
            return Err(InputError::FromBootLinux(kernel.path().to_owned()));
        }
        let kernel = kernel.check()?;
        let mem_size = mem_mib << 20;
        check_initrd(args, &kernel, mem_size)?;
        if let Some(elf) = kernel.elf_bytes() {
            // Its loadable segments must lie in guest RAM (bss included).
            vmm::boot::check_elf_segments(elf, kernel.path(), mem_size).map_err(BootError::from)?;
        }
        let emulator_host = vmm::host::emulates_ring0();
        let words = match &args.cmdline_replace {
            Some(line) => Cmdline::Replace(line),
            None => Cmdline::Append(args.cmdline.as_slice()),
        };
        let cmdline = kernel_cmdline(kind, emulator_host, words)?;

        let buffer = super::size(&t.buffer, "--buffer", MIN_BUFFER)?;
        let overwrite = match &args.overwrite {
            Some(v) => Some(super::size(v, "--overwrite", EVENT_BYTES)? / EVENT_BYTES),
            None => None,
        };
        let trace = match output {
            Some(output) => Some(TraceConfig {
                plan: plan(args, &kernel, cpus as usize, emulator_host, files)?,
                duration,
                max_events: t.max_events.unwrap_or(u64::MAX),
                buffer,
                overwrite,
                output,
            }),
            None => None,
        };
        Ok(RunConfig {
            vm: VmConfig {
                kernel,
                initrd: args.initrd.clone(),
                size,
                cmdline,
                console: open_console_writer(console)?,
                timeout,
                hide_hypercalls: emulator_host,
            },
            stats: args.stats,
            trace,
        })
    }
}

/// Options that only apply to a traced run, without `--trace`.
fn check_flags(args: &RunArgs, form: Form, traced: bool) -> Result<(), InputError> {
    if form == Form::Record && !traced {
        return Err(InputError::RecordNeedsTrace);
    }
    let t = &args.tracing;
    if traced {
        return Ok(());
    }
    let needs_trace = [
        (t.graph, "--graph"),
        (!t.args.is_empty(), "--args"),
        (t.retval, "--retval"),
        (!t.stack.is_empty(), "--stack"),
        (!t.pid.is_empty(), "--pid"),
        (t.comm.is_some(), "--comm"),
        (t.duration.is_some(), "--duration"),
        (args.overwrite.is_some(), "--overwrite"),
        (t.max_events.is_some(), "--max-events"),
        (args.from_boot, "--from-boot"),
        (args.modules.is_some(), "--modules"),
    ];
    match needs_trace.iter().find(|(given, _)| *given) {
        Some(&(_, flag)) => Err(InputError::NeedsTrace { flag }),
        None => Ok(()),
    }
}

/// Where a traced run's results go (None: an untraced run).
fn outputs(
    args: &RunArgs,
    out: &OutputArgs,
    form: Form,
    traced: bool,
) -> Result<Option<Output>, InputError> {
    let output = match form {
        Form::OneShot => Output::for_run(out, traced)?,
        Form::Record => Some(Output::for_record(out)?),
    };
    if let Some(view) = output
        .as_ref()
        .and_then(Output::graph_view)
        .filter(|_| !args.tracing.graph)
    {
        return Err(InputError::NeedsGraph { view });
    }
    Ok(output)
}

/// The console must not mix into a machine-readable stdout, nor share a
/// file with another output.
fn check_console(console: &Console<'_>, output: Option<&Output>) -> Result<(), InputError> {
    let Some(o) = output else {
        return Ok(());
    };
    let stdout_format = o.view.as_ref().map_or(Format::Text, |v| v.format);
    if *console == Console::Stdout && stdout_format != Format::Text {
        return Err(InputError::ConsoleOnStdout {
            format: format_name(stdout_format),
        });
    }
    let mut files = o.files();
    if let Console::File(path) = console {
        files.push(("--console".to_string(), path));
    }
    output::distinct(&files)?;
    Ok(())
}

/// `--initrd`: a regular file no larger than the guest's RAM, for Linux.
fn check_initrd(args: &RunArgs, kernel: &KernelFile, mem_size: u64) -> Result<(), InputError> {
    let Some(initrd) = &args.initrd else {
        return Ok(());
    };
    if !initrd.exists() {
        return Err(InputError::InitrdMissing(initrd.clone()));
    }
    if !kernel.kind().is_linux() {
        return Err(BootError::InitrdWithElf {
            path: kernel.path().to_owned(),
        }
        .into());
    }
    vmm::boot::open_initrd(initrd, mem_size).map_err(BootError::from)?;
    Ok(())
}

/// The trace plan: the kernel's symbols found (said if from kallsyms), the
/// selection, `--graph`'s hooks, the mode; `files`: `--modules DIR`'s,
/// for the modules the guest loads. What the plan says about itself
/// is said now, except `--graph`'s notes: said once nothing can refuse the
/// run (`TracePlan::notes`, printed by the run).
fn plan(
    args: &RunArgs,
    kernel: &KernelFile,
    cpus: usize,
    emulator_host: bool,
    files: Option<super::modules::Files>,
) -> Result<TracePlan, InputError> {
    let given = match &args.vmlinux {
        Some(path) => Given::Vmlinux {
            path,
            how: "--vmlinux",
        },
        None => Given::Nothing,
    };
    let found = find::kernel_image(kernel, given)?;
    if let Some(n) = &found.note {
        note!("vmtrace: {n}");
    }
    let mut request = args
        .tracing
        .request(cpus, emulator_host, kernel.kind().is_linux());
    let waiting = super::modules::waiting(&mut request, &found.image, files);
    let mut plan = super::modules::plan(found.image, &request, waiting)?;
    plan.plan
        .events
        .on_own_vmm(&plan.plan.image.path)
        .map_err(tracer::plan::PlanError::from)?;
    plan.notes.retain(|n| match n {
        Note::AutoTrap { why, remedy } => {
            let why = tracer::advice::join(why.clone(), *remedy, &crate::error::Flags);
            note!("vmtrace: --mode auto: tracing with traps: {why}");
            false
        }
        _ => true,
    });
    Ok(plan)
}

/// Every console but `none` through `console::Checked`: a failed write is
/// said at the end of the run.
fn open_console_writer(console: Console<'_>) -> Result<Box<dyn Write + Send>, InputError> {
    Ok(match console {
        // Whole lines: status::ConsoleOnStderr holds the unfinished one.
        Console::Stderr => Box::new(Checked::new(crate::status::ConsoleOnStderr, "stderr")),
        Console::Stdout => Box::new(Checked::new(crate::status::ConsoleOnStdout, "stdout")),
        Console::None => Box::new(std::io::sink()),
        Console::File(path) => Box::new(Checked::new(
            LineWriter::new(open_console(path)?),
            path.display().to_string(),
        )),
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
