//! What can go wrong, whose fault it is, and the exit status that says so.
//! A leaf: every other module reports through these types.

use std::path::PathBuf;

use tracer::advice::{Remedy, TraceInput, TracerAdvice, TracerWords};
use tracer::error::TracerError;
use tracer::session::NotReady;
use tracer::trace::datafile::TraceFileError;
use vmm::advice::{Advice, Input, Words};
use vmm::boot::BootError;
use vmm::{StopReason, VmError};

/// A number of seconds as the user would write it: `1e300`, not 301 digits.
pub fn show_secs(v: f64) -> String {
    if v.is_finite() && v.abs() >= 1e9 {
        format!("{v:e}")
    } else {
        v.to_string()
    }
}

/// Exit status when the guest did not end cleanly, or vmtrace failed while running.
pub const EXIT_GUEST_FAILED: u8 = 1;
/// Exit status for bad input (usage, files, configuration).
pub const EXIT_BAD_INPUT: u8 = 2;

/// How a command ended when vmtrace itself did not fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Clean,
    GuestFailed,
}

impl Outcome {
    /// Powering off cleanly and being stopped on request are clean ends;
    /// anything else (panic, triple fault, timeout) is the guest's failure.
    pub fn of(reason: &StopReason) -> Outcome {
        match reason {
            StopReason::PowerOff(0)
            | StopReason::AcpiPowerOff
            | StopReason::Requested
            | StopReason::DurationReached
            | StopReason::Signal(_) => Outcome::Clean,
            _ => Outcome::GuestFailed,
        }
    }

    pub fn exit_status(self) -> u8 {
        match self {
            Outcome::Clean => 0,
            Outcome::GuestFailed => EXIT_GUEST_FAILED,
        }
    }
}

/// A failure, sorted by whose it is.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The user's input is wrong (exit status 2).
    #[error(transparent)]
    Input(#[from] InputError),
    /// Something failed while running (exit status 1).
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

impl Error {
    pub fn exit_status(&self) -> u8 {
        match self {
            Error::Input(_) => EXIT_BAD_INPUT,
            Error::Runtime(_) => EXIT_GUEST_FAILED,
        }
    }
}

/// Input errors convert straight into `Error`, so `?` works on the types
/// the commands meet most.
macro_rules! input_from {
    ($($t:ty),*) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Error {
                Error::Input(e.into())
            }
        }
    )*};
}
input_from!(VmError, BootError, TracerError, TraceFileError, NotReady);

/// The library says what is wrong; the CLI adds which flag to change.
impl From<tracer::kernel::find::FindError> for InputError {
    fn from(e: tracer::kernel::find::FindError) -> InputError {
        use tracer::kernel::find::FindError;
        match e {
            FindError::Mismatch {
                vmlinux,
                kernel,
                why,
            } => InputError::VmlinuxMismatch {
                vmlinux,
                kernel,
                why,
            },
            FindError::Symbols(e) => InputError::Tracer(e.into()),
            e => InputError::Find(e),
        }
    }
}

impl From<tracer::plan::PlanError> for InputError {
    fn from(e: tracer::plan::PlanError) -> InputError {
        use tracer::plan::PlanError;
        match e {
            PlanError::Tracer(e) => InputError::Tracer(e),
            PlanError::GraphUnhookable { names } => InputError::GraphUnhookable { names },
            PlanError::CommGlob(e) => InputError::CommGlob { why: e.to_string() },
            PlanError::NoTasks { why } => InputError::NoTasks { why },
            PlanError::RetvalNeedsGraph => InputError::RetvalNeedsGraph,
            PlanError::Stack(tracer::plan::stacks::StackPlanError::NoneTraced { globs }) => {
                InputError::StackNoneTraced { globs }
            }
            // Worded with the flags, as --trace's are.
            PlanError::Stack(tracer::plan::stacks::StackPlanError::Filter(e)) => {
                InputError::Tracer(e.into())
            }
            PlanError::Args(tracer::plan::args::ArgPlanError::NoneTraced { globs }) => {
                InputError::ArgsNoneTraced { globs }
            }
            PlanError::Args(tracer::plan::args::ArgPlanError::Filter(e)) => {
                InputError::Tracer(e.into())
            }
            PlanError::StackGraphExitless => InputError::StackGraphExitless,
            PlanError::DirectPreemptible { path, why } => {
                InputError::DirectPreemptible { path, why }
            }
            e => InputError::Plan(e),
        }
    }
}

/// Bad input: every message is one line naming the problem and what to do.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("--modules: {0}; give the directory that holds the guest's module files (its /lib/modules/VERSION, or a build's)")]
    ModuleFiles(#[from] tracer::kernel::module_files::ModuleFilesError),
    #[error("--kernel PATH is required (a bzImage, vmlinux or ELF guest)")]
    NoKernel,
    #[error("kernel {} does not exist or is not a file; pass --kernel PATH", .0.display())]
    KernelMissing(PathBuf),
    #[error("initrd {} does not exist or is not a file; pass --initrd PATH", .0.display())]
    InitrdMissing(PathBuf),
    #[error("{flag} needs --trace GLOB (it only applies to a traced run)")]
    NeedsTrace { flag: &'static str },
    #[error(
        "--graph cannot hook the return of {names}: the guest's unwinder would stop at vmtrace's hook; trace without --graph"
    )]
    GraphUnhookable { names: String },
    #[error("{view} shows returns and durations: add --graph to record them")]
    NeedsGraph { view: &'static str },
    #[error("--retval needs --graph: return values are read at returns, which only the function graph hooks; add --graph")]
    RetvalNeedsGraph,
    #[error("--stack {globs} matches none of the traced functions; give --stack globs of functions --trace selects")]
    StackNoneTraced { globs: String },
    #[error("--args={globs} matches none of the traced functions; give --args globs of functions --trace selects")]
    ArgsNoneTraced { globs: String },
    #[error("--trace selects {name}, where vmtrace follows the guest's modules through their unloads and loads, with modules' functions; leave it out (--trace '!{name}') or trace it alone")]
    ModuleHookTraced { name: String },
    #[error("--args with '{globs}', a module not loaded yet: the functions of a module the guest loads during the trace record arguments in trap mode only (exitless mode's spare sites hold none); add --mode trap, load it before the attach, or trace without --args")]
    ArgsModuleWaiting { globs: String },
    #[error("-e '{globs}': no such module loaded yet, and the events of a module the guest loads during the trace are not traced yet (its functions are: --trace 'GLOB:mod:MODULE'); load the module before the attach")]
    EventsModuleWaiting { globs: String },
    #[error("-e '{globs}': no such module loaded in the guest; load it, or list the events without :mod:")]
    EventsModuleNotLoaded { globs: String },
    #[error("{0}; vmtrace list -e --qmp SOCKET --kernel BZIMAGE lists the loaded modules' events")]
    EventModuleGlob(#[from] tracer::kernel::events::module_globs::ModuleGlobError),
    #[error("'{globs}' waits for a module, but the guest's modules cannot be followed ({why}); trace the module's functions by name once it is loaded (vmtrace attach)")]
    ModulesUnfollowed { globs: String, why: String },
    #[error("--stack with --graph records stacks in trap mode only (the unwinder cannot see through exitless return hooks); use --mode trap")]
    StackGraphExitless,
    #[error("--entry direct into a preemptible kernel needs its task list, to find the tasks it preempted, and {path}'s is unknown ({why}); use --entry ftrace")]
    DirectPreemptible { path: String, why: String },
    #[error("{flag} {value} is not a positive number of seconds")]
    Seconds { flag: &'static str, value: f64 },
    #[error(
        "{flag} {} is too long; use at most {max} seconds (365 days)",
        show_secs(*.value)
    )]
    SecondsTooLong {
        flag: &'static str,
        value: f64,
        max: u64,
    },
    #[error("{flag} {value:?}: {why}; use a size such as 64M, 512K or 1G")]
    Size {
        flag: &'static str,
        value: String,
        why: String,
    },
    /// An output path that vmtrace will not or cannot write (checked before
    /// any guest boots).
    #[error("cannot write {flag} {}: {source}", path.display())]
    Output {
        flag: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "--from-boot is not possible with Linux ({}): the kernel rewrites its own call sites in \
         ftrace_init and would find vmtrace's trap instead of `call __fentry__`; drop --from-boot, \
         vmtrace attaches right after ftrace_init",
        .0.display()
    )]
    FromBootLinux(PathBuf),
    #[error("cannot write the console to {}: {source}; pass a file or a terminal with --console", path.display())]
    Console {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("--cpu: {0}")]
    CpuList(String),
    #[error("--time: {0}")]
    Time(String),
    #[error("--percent-limit {0} is not a percentage; use a number from 0 to 100")]
    PercentLimit(f64),
    /// `report -o`: the report goes to stdout; files are exports.
    #[error(
        "vmtrace report takes no -o (it prints to stdout); to write a file use --export FMT=FILE \
         (FMT: json, csv, chrome, folded, trace.dat)"
    )]
    ReportOutput,
    #[error("vmtrace record needs --trace GLOB (what to record)")]
    RecordNeedsTrace,
    /// A view option given to `record`.
    #[error("{flag}: record prints no report; use `vmtrace report` afterwards")]
    RecordView { flag: &'static str },
    /// An option of the text report given with another `--format`.
    #[error("{flag} applies to the text report, not to --format {format}; drop one of them")]
    TextOnly {
        flag: &'static str,
        format: &'static str,
    },
    /// An option of the text report given with `--tree`.
    #[error("{flag} applies to the text report, which --tree replaces; drop one of them")]
    NotWithTree { flag: &'static str },
    /// An option of the report by function given with `--by task`.
    #[error("{flag} applies to the report by function; with --by task use --sort count or --sort name, without -g")]
    NotByTask { flag: &'static str },
    #[error(
        "--console - would mix the guest console into the {format} output on stdout; \
         send it to a file (--console FILE) or leave it on stderr"
    )]
    ConsoleOnStdout { format: &'static str },
    /// Two outputs of one command that would write the same file.
    #[error("{first} and {second} both name {}; give each output its own file", path.display())]
    SameOutput {
        first: String,
        second: String,
        path: PathBuf,
    },
    /// `record`'s previous data file cannot become FILE.old.
    #[error(
        "cannot keep the previous {} as {}: {why}; move it away or pass -o FILE",
        path.display(),
        old.display()
    )]
    KeepOld {
        path: PathBuf,
        old: PathBuf,
        why: String,
    },
    /// Another vmtrace run holds the data file's lock (`datafile::lock`).
    #[error(
        "{} is being written by another vmtrace run; wait for it to end or pass -o ANOTHER_FILE",
        .0.display()
    )]
    DataFileBusy(PathBuf),
    /// The lock beside the data file could not be made (`datalock`).
    #[error(
        "cannot lock {data} for this run: {lock}: {source}; write the data file where you can create files (-o)",
        data = .data.display(),
        lock = .lock.display()
    )]
    DataFileLock {
        lock: PathBuf,
        data: PathBuf,
        source: std::io::Error,
    },
    /// `report`/`script` without a file, and no vmtrace.data here.
    #[error("no {} here; record one with `vmtrace record ...` or name a file", .0.display())]
    NoDataFile(PathBuf),
    #[error("--threshold: {0}")]
    Threshold(String),
    /// A tracing flag `vmtrace attach` cannot honour yet.
    #[error("{flag}: vmtrace attach {why}; drop {flag}{instead}")]
    NotOnAttach {
        flag: &'static str,
        why: &'static str,
        /// What to give instead, after the drop.
        instead: &'static str,
    },
    /// `vmtrace attach --qmp` given libvirt's own monitor of a domain.
    #[error(
        "{} is libvirt's monitor of domain {domain}, which libvirtd holds for the domain's \
         whole life; attach with --domain {domain} (and --connect URI for another libvirt)",
        .path.display()
    )]
    LibvirtMonitor { path: PathBuf, domain: String },
    /// `vmtrace attach`: the QEMU, its sockets or its guest refused.
    #[error("{}", qemu_says(.0))]
    Qemu(tracer::qemu::session::QemuError),
    /// `--depth` or `--threshold` without `--tree`.
    #[error("{flag} needs --tree (it limits the call tree)")]
    NeedsTree { flag: &'static str },
    #[error("--tree prints the call tree as text; drop --format {format} or --tree")]
    TreeFormat { format: &'static str },
    /// A view of durations asked of a trace without returns.
    #[error("{what} needs a function-graph trace (traced with --graph); {} has entries only", .path.display())]
    NoGraph { what: &'static str, path: PathBuf },
    /// `--iters`, `--rounds`, ... of `vmtrace bench`.
    #[error("{flag} must be at least 1")]
    Zero { flag: &'static str },
    #[error("kernel {} does not exist; build the mini guest with `bash guest/build.sh mini` or pass --kernel PATH", .0.display())]
    MiniMissing(PathBuf),
    #[error("cannot run guest/build.sh mini: {0}; build the mini guest or pass --kernel PATH")]
    BuildRun(std::io::Error),
    #[error("`bash guest/build.sh mini` failed; build the mini guest or pass --kernel PATH")]
    BuildFailed,
    #[error("vmlinux {} does not exist; build it with `bash guest/build.sh linux`", .0.display())]
    VmlinuxMissing(PathBuf),
    /// A name `vmtrace bench` does not know.
    #[error(
        "no bench `{name}`; the benches: {names} (`vmtrace bench list` says what each measures)"
    )]
    UnknownBench { name: String, names: String },
    #[error("--counts-only chooses the benches itself (call/exitless, call/graph); name benches or give --counts-only, not both")]
    CountsOnlyNamed,
    #[error("bench {bench} needs a Linux vmlinux, and {} does not exist; build it with `bash guest/build.sh linux`, or pass --vmlinux PATH", .path.display())]
    BenchNeedsVmlinux { bench: &'static str, path: PathBuf },
    #[error("`bash guest/build.sh mini-noftrace` failed (call/direct's guest, {})", .0.display())]
    NoftraceBuildFailed(PathBuf),
    #[error("--distro-kernel {} does not exist", .0.display())]
    DistroKernelMissing(PathBuf),
    #[error("bench boot/ftrace boots the Linux guest N times in each of 5 configurations: give --linux-boots N")]
    BenchNeedsBoots,
    /// `vmtrace bench --linux-boots N` without the Linux guest to boot.
    #[error("--linux-boots boots the Linux guest: its {what} {} does not exist; build it with `bash guest/build.sh linux`", path.display())]
    LinuxGuestMissing { what: &'static str, path: PathBuf },
    /// The bench's kernel is not the mini guest it measures.
    #[error("{} is not the mini guest: {why}; pass guest/out/mini.elf with --kernel", path.display())]
    NotMini { path: PathBuf, why: String },
    /// The vmlinux is not the kernel's (found before boot).
    #[error("{} does not match kernel {}: {why}; pass the vmlinux this kernel was built with (--vmlinux PATH)", vmlinux.display(), kernel.display())]
    VmlinuxMismatch {
        vmlinux: PathBuf,
        kernel: PathBuf,
        why: String,
    },
    #[error("{}", .0.say(&Flags))]
    Vm(#[from] VmError),
    #[error("{}", .0.say(&Flags))]
    Boot(#[from] BootError),
    #[error("{}", .0.say(&Flags))]
    Tracer(#[from] TracerError),
    #[error("{}", .0.say(&Flags))]
    Find(tracer::kernel::find::FindError),
    #[error(transparent)]
    Plan(tracer::plan::PlanError),
    #[error("--comm: {why}; use *, ? and [...] as in --trace")]
    CommGlob { why: String },
    /// `report`/`script` `--comm`, `--pid`, `--tid` of a trace without tasks.
    #[error(
        "{flags}: {} names no guest task ({why}); filter it with --sym, or record it again \
         from a kernel with BTF, whose events name their tasks",
        path.display()
    )]
    ShownNoTasks {
        flags: String,
        path: PathBuf,
        why: String,
    },
    /// `script -F FIELD` of a trace recorded without what it shows.
    #[error(
        "-F {field}: {} {}; drop {field} from -F, or record {}",
        path.display(),
        field_lacks(*missing).0,
        field_lacks(*missing).1
    )]
    FieldMissing {
        field: String,
        path: PathBuf,
        missing: tracer::trace::export::script_fields::FieldMissing,
    },
    #[error("--pid and --comm need the guest's tasks, and this kernel's are unknown: {why}")]
    NoTasks { why: String },
    #[error(transparent)]
    TraceFile(#[from] TraceFileError),
    #[error("cannot attach: {0}")]
    NotReady(#[from] NotReady),
    #[error("{}", .0.say(&Flags))]
    List(#[from] tracer::plan::list::ListError),
    #[error(transparent)]
    Events(#[from] tracer::kernel::events::EventError),
    #[error("{0}; write SYSTEM:EVENT globs such as sched:* or *:*switch*")]
    EventGlob(#[from] tracer::kernel::events::EventGlobError),
}

/// What a trace lacks for a `-F` field, and how to record it.
fn field_lacks(
    missing: tracer::trace::export::script_fields::FieldMissing,
) -> (&'static str, &'static str) {
    use tracer::trace::export::script_fields::FieldMissing as M;
    match missing {
        M::Tasks => (
            "names no guest task (its kernel has no BTF)",
            "from a kernel with BTF (CONFIG_DEBUG_INFO_BTF=y)",
        ),
        M::Args => ("has no arguments (recorded without --args)", "with --args"),
        M::Retval => (
            "has no return values (recorded without --retval)",
            "with --graph --retval",
        ),
        M::Stacks => (
            "has no kernel stacks (recorded without --stack)",
            "with --stack GLOB",
        ),
    }
}

impl InputError {
    /// A filter after recording that failed, worded with its flags.
    pub fn shown(
        e: tracer::trace::filter::TraceFilterError,
        task_flags: &[&str],
        path: &std::path::Path,
    ) -> InputError {
        use tracer::trace::filter::TraceFilterError as E;
        match e {
            E::Comm(e) => InputError::CommGlob { why: e.to_string() },
            E::Functions(e) => InputError::Tracer(e.into()),
            E::NoTasks { why } => InputError::ShownNoTasks {
                flags: task_flags.join(", "),
                path: path.to_path_buf(),
                why,
            },
        }
    }
}

/// The CLI's words for what library errors name (`vmm::advice`,
/// `tracer::advice`): the flag that gives each input, and each remedy as the
/// flags to use.
pub struct Flags;

impl Words for Flags {
    fn input(&self, input: Input) -> &'static str {
        match input {
            Input::Kernel => "--kernel",
            Input::Initrd => "--initrd",
            Input::Cpus => "--cpus",
            Input::Mem => "--mem",
            Input::CmdlineReplace => "--cmdline-replace",
            Input::Duration => "--duration",
        }
    }
}

impl TracerWords for Flags {
    fn trace_input(&self, input: TraceInput) -> &'static str {
        match input {
            TraceInput::Trace => "--trace",
            TraceInput::Notrace => "--notrace",
            // `vmtrace list GLOB...`: positional, named by the command.
            TraceInput::List => "list",
            TraceInput::Stack => "--stack",
            TraceInput::Args => "--args",
            TraceInput::Symbols => "--sym",
        }
    }

    fn remedy(&self, remedy: Remedy) -> &'static str {
        match remedy {
            Remedy::TrapMode => "use --mode trap",
            Remedy::FewerFunctionsOrTrapMode => "trace fewer functions, or use --mode trap",
            Remedy::TrapModeOrVmlinux => "use --mode trap, or give its vmlinux (--vmlinux)",
            Remedy::KernelVmlinux => "pass the kernel's vmlinux with --vmlinux",
            Remedy::UnstrippedKernelVmlinux => {
                "pass the kernel's unstripped vmlinux with --vmlinux PATH"
            }
            Remedy::UnstrippedVmlinux => "pass the unstripped vmlinux with --vmlinux",
            Remedy::OwnVmlinux => "pass its own vmlinux with --vmlinux",
            Remedy::SameBuildVmlinux => "pass the vmlinux of this very build with --vmlinux",
            Remedy::FredOffOrVmlinux => {
                "boot it with `--cmdline fred=off`, or pass the vmlinux of this very build (with \
                 its data symbols) with --vmlinux"
            }
            Remedy::VmlinuxNotBzImage => {
                "pass the uncompressed vmlinux (or no --vmlinux: vmtrace reads a bzImage's own \
                 symbols)"
            }
            Remedy::DirectEntries => "trace it with --entry direct, or rebuild it with them",
            Remedy::FtraceEntries => "trace it with --entry ftrace",
            Remedy::ExitlessModeOrFtraceEntries => "use --mode exitless, or --entry ftrace",
        }
    }
}

/// A failure while running: the guest, guest memory, or writing results.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The VM was created but its vCPU threads could not start.
    #[error("{}", .0.say(&Flags))]
    Start(VmError),
    #[error("restoring guest text failed: {}", .0.say(&Flags))]
    Restore(TracerError),
    #[error("exitless events were lost: {}", .0.say(&Flags))]
    Drain(TracerError),
    #[error("cannot catch SIGINT/SIGTERM/SIGHUP: {0}")]
    Signals(std::io::Error),
    /// `vmtrace attach`: the guest's text could not be restored.
    #[error("detaching from the QEMU failed: {0}; its guest may still hold vmtrace's sites")]
    Detach(String),
    #[error("the guest stopped ({}) before vmtrace could attach; nothing was traced", .0.say(&Flags))]
    NothingTraced(StopReason),
    #[error("cannot save the trace: {0}")]
    Save(TraceFileError),
    /// The previous data file could not be renamed to FILE.old.
    #[error(
        "cannot keep the previous {} as {}: {source}; the trace was not saved ({} is as it was)",
        path.display(),
        old.display(),
        path.display()
    )]
    KeepOld {
        path: PathBuf,
        old: PathBuf,
        source: std::io::Error,
    },
    /// An output could not be written after a run; `note` says what was
    /// left at `path` and where the report went instead.
    #[error("cannot write the {what} to {}: {source}; {note}", path.display())]
    Lost {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
        note: String,
    },
    /// Standard output failed (other than a closed pipe, which ends quietly).
    #[error("cannot write the {what} to standard output: {source}")]
    Stdout {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write the {format} output: {source}")]
    Export {
        format: String,
        source: std::io::Error,
    },
    #[error("a trap handler failed: {0}")]
    Trap(vmm::TrapError),
    #[error("cannot write the bench's JSON: {0}")]
    BenchJson(serde_json::Error),
    #[error("cannot write the bench's Markdown table: {0}")]
    BenchMarkdown(crate::bench::results::markdown::MarkdownError),
    #[error("the {what} stopped: {}", reason.say(&Flags))]
    GuestStopped {
        what: &'static str,
        reason: StopReason,
    },
    /// A bench measurement came out unusable; the message says which and why.
    #[error("{0}")]
    Measure(String),
}

/// A QEMU's refusal in the CLI's words: what a vmtrace left names the
/// command that repairs it.
fn qemu_says(e: &tracer::qemu::session::QemuError) -> String {
    use tracer::qemu::session::QemuError;
    match e {
        QemuError::Leftover { qmp, .. } => match tracer::qemu::libvirt_monitor::domain_of(qmp) {
            Some(domain) => format!("{e} with `vmtrace detach --domain {domain}`"),
            None => format!("{e} with `vmtrace detach --qmp {}`", qmp.display()),
        },
        e => e.say(&Flags),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer::plan::exitless::error::ExitlessPlanError;
    use tracer::session::exitless::state::ExitlessError;

    #[test]
    fn a_guest_crash_is_a_guest_failure() {
        let failed = |r| Outcome::of(&r) == Outcome::GuestFailed;
        assert!(failed(StopReason::Crash { cpu: 0 }));
        assert!(failed(StopReason::Reset));
        assert!(!failed(StopReason::PowerOff(0)));
        assert!(!failed(StopReason::AcpiPowerOff));
        assert!(!failed(StopReason::Requested));
    }

    /// The libraries name no flag (`vmm::advice`, `tracer::advice`): an
    /// input's name and a remedy are data, which the CLI words with its
    /// flags, so users see the messages they always did.
    #[test]
    fn library_errors_are_said_with_the_cli_flags() {
        // An input, named.
        let e = VmError::Cpus(65);
        assert_eq!(e.to_string(), "vCPU count 65 is out of range; use 1 to 64");
        assert_eq!(
            Error::from(e).to_string(),
            "--cpus 65 is out of range; use 1 to 64"
        );
        let e = tracer::kernel::filter::Filter::new(&["!x".into()], &[]).expect_err("negated");
        let e = TracerError::from(e);
        assert_eq!(
            e.to_string(),
            "trace filter '!x' only removes functions; add what to trace, e.g. trace filter '*,!x'"
        );
        assert_eq!(
            Error::from(e).to_string(),
            "--trace '!x' only removes functions; add what to trace, e.g. --trace '*,!x'"
        );
        // A remedy, through two wrappers.
        let e = TracerError::from(ExitlessError::from(
            ExitlessPlanError::CpuNumberOutOfReach {
                link: 0x10,
                runtime: 0x20,
            },
        ));
        assert_eq!(e.remedy(), Some(Remedy::TrapMode));
        let problem = "the guest's `cpu_number` at 0x10 runs at 0x20 (KASLR), out of reach of a \
                       gs:[disp32]";
        assert_eq!(e.to_string(), format!("{problem}; trace in trap mode"));
        assert_eq!(
            Error::from(RuntimeError::Drain(e)).to_string(),
            format!("exitless events were lost: {problem}; use --mode trap")
        );
        // A remedy inside the sentence.
        let e = tracer::kernel::kaslr::KaslrError::Fred { why: "no".into() };
        assert!(
            e.to_string().ends_with(
                "and no: boot it with `fred=off` on its command line, or pass the \
                            vmlinux of this very build (with its data symbols)"
            ),
            "{e}"
        );
        let e = Error::from(TracerError::from(e)).to_string();
        assert!(
            e.ends_with(
                "and no: boot it with `--cmdline fred=off`, or pass the vmlinux of this \
                         very build (with its data symbols) with --vmlinux"
            ),
            "{e}"
        );
    }

    /// An emulation hint names the flag that drops the default command
    /// line, in every CLI message that says the stop.
    #[test]
    fn a_stop_reason_is_said_with_the_cli_flags() {
        let e = vmm::assist::choose(1, 0x1000, &[0x0f, 0xae, 0x28]).expect_err("xrstor");
        let reason = StopReason::Error(vmm::VcpuError::Assist(e));
        let lib = "unless a replacement command line drops it)";
        let cli = "(the default command line does, unless --cmdline-replace drops it), or run";
        assert!(reason.to_string().contains(lib), "{reason}");
        let e = RuntimeError::NothingTraced(reason.clone()).to_string();
        assert!(e.contains(cli), "{e}");
        let e = RuntimeError::GuestStopped {
            what: "guest",
            reason,
        };
        assert!(e.to_string().contains(cli), "{e}");
    }

    /// `--mode auto`'s note: the library's reason, then its remedy in flags.
    #[test]
    fn a_note_s_remedy_is_said_with_the_cli_flags() {
        let why = "no `cpu_number`".to_string();
        assert_eq!(
            tracer::advice::join(why, Some(Remedy::TrapModeOrVmlinux), &Flags),
            "no `cpu_number`; use --mode trap, or give its vmlinux (--vmlinux)"
        );
    }

    /// Every remedy the CLI says names the flag that carries it out; the
    /// library's own words never do.
    #[test]
    fn every_remedy_is_said_with_a_flag() {
        use Remedy::*;
        for r in [
            TrapMode,
            FewerFunctionsOrTrapMode,
            TrapModeOrVmlinux,
            KernelVmlinux,
            UnstrippedKernelVmlinux,
            UnstrippedVmlinux,
            OwnVmlinux,
            SameBuildVmlinux,
            FredOffOrVmlinux,
            VmlinuxNotBzImage,
        ] {
            let cli = Flags.remedy(r);
            assert!(cli.contains(" --"), "{r:?}: {cli}");
            let lib = tracer::advice::Plain.remedy(r);
            assert!(!lib.contains("--"), "{r:?}: {lib}");
        }
    }

    #[test]
    fn input_is_status_2_and_runtime_status_1() {
        let e: Error = InputError::NoKernel.into();
        assert_eq!(e.exit_status(), EXIT_BAD_INPUT);
        let e: Error = RuntimeError::Measure("x".into()).into();
        assert_eq!(e.exit_status(), EXIT_GUEST_FAILED);
        let e: Error = VmError::Cpus(0).into();
        assert_eq!(e.exit_status(), EXIT_BAD_INPUT);
    }

    /// `attach --mode exitless --stack`: bad input, one line naming the
    /// flag that records stacks; the library says it without flags.
    #[test]
    fn stacks_in_exitless_attach_name_trap_mode() {
        use tracer::plan::attach_mode::AttachModeError;
        use tracer::qemu::session::QemuError;
        let stacks = || QemuError::Mode(AttachModeError::StacksNeedTrap);
        let problem = "kernel stacks are unwound while a breakpoint holds the guest, and \
                       exitless calls never stop it";
        assert_eq!(
            stacks().to_string(),
            format!("{problem}; trace in trap mode")
        );
        let e: Error = InputError::Qemu(stacks()).into();
        assert_eq!(e.exit_status(), EXIT_BAD_INPUT);
        assert_eq!(e.to_string(), format!("{problem}; use --mode trap"));
    }

    /// The plan's refusal of return values without the graph, worded with
    /// the flags: bad input, one line naming the fix.
    #[test]
    fn retval_without_graph_names_the_flags() {
        let e: Error = InputError::from(tracer::plan::PlanError::RetvalNeedsGraph).into();
        assert_eq!(e.exit_status(), EXIT_BAD_INPUT);
        assert_eq!(
            e.to_string(),
            "--retval needs --graph: return values are read at returns, which only the \
             function graph hooks; add --graph"
        );
    }
}
