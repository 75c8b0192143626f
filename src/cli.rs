//! Command-line interface: what the user can ask for.
//!
//! The shape is perf's and trace-cmd's: `vmtrace [RUN OPTIONS]` boots,
//! traces and prints the report in one go; `vmtrace record` saves the trace
//! to a data file (`vmtrace.data`) and prints nothing; `vmtrace report`,
//! `script` read it back; `vmtrace list` shows what can be traced.

use std::path::PathBuf;

use clap::{ArgGroup, Args, Parser, Subcommand, ValueEnum};

mod examples;
mod export_arg;
mod shown;
mod vms;

use export_arg::parse_export;
pub use export_arg::{ExportArg, ExportFormat};
pub use shown::{FieldArg, FieldsArgs, ShownArgs};
pub use vms::{VmsArgs, VmsFormat};

/// The data file `record` writes and `report`/`script` read by default.
pub const DEFAULT_DATA: &str = "vmtrace.data";

#[derive(Parser, Debug)]
#[command(
    name = "vmtrace",
    version,
    about = "Trace a Linux guest kernel's function calls from the KVM hypervisor",
    long_about = "Trace a Linux guest kernel's function calls from the KVM hypervisor.\n\n\
        Without a command: boot the guest and, with --trace, record and print the report \
        (-o FILE also saves the trace). `vmtrace record` saves the trace to vmtrace.data \
        for `vmtrace report` and `vmtrace script`.",
    args_conflicts_with_subcommands = true,
    after_help = examples::RUN
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: RunArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Boot the guest, trace it and save the trace to a data file
    /// (vmtrace.data, the previous one kept as vmtrace.data.old); no report.
    #[command(after_help = examples::RECORD)]
    Record(Box<RecordArgs>),
    /// Print the report of a saved trace (default: vmtrace.data), or export it.
    Report(ReportArgs),
    /// Print every event of a saved trace (default: vmtrace.data), one line each.
    Script(ScriptArgs),
    /// List the traceable functions of a kernel (no guest is booted).
    #[command(after_help = examples::LIST)]
    List(ListArgs),
    /// Measure the cost of tracing (`vmtrace bench list`: the benches).
    #[command(after_help = examples::BENCH)]
    Bench(BenchArgs),
    /// Trace a QEMU guest that is already running, through its QMP socket
    /// or its libvirt domain (and its gdbstub, opened on demand); it runs
    /// on when vmtrace detaches. Needs root, or QEMU's user with access to
    /// its sockets and /proc/PID/mem (ptrace).
    #[command(after_help = examples::ATTACH)]
    Attach(Box<AttachArgs>),
    /// Take out what a vmtrace that did not detach (killed, crashed) left
    /// in a QEMU: its sites, code and rings, breakpoints and gdbstub.
    #[command(after_help = examples::DETACH)]
    Detach(DetachArgs),
    /// List the VMs on this host vmtrace can attach to (libvirt domains,
    /// QEMUs with a QMP socket), each with the command that attaches to it.
    #[command(after_help = examples::VMS)]
    Vms(VmsArgs),
    /// (Internal) The guardian an attach starts: repairs the VM when that
    /// attach dies without detaching.
    #[command(hide = true)]
    Guard(GuardArgs),
}

/// Boot a guest and (optionally) trace it.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Guest kernel: a bzImage, a Linux vmlinux, or any ELF booted with vmtrace's direct protocol.
    #[arg(long, value_name = "PATH")]
    pub kernel: Option<PathBuf>,
    /// Unstripped vmlinux with symbols (default: the kernel if it is an ELF, else `vmlinux` beside it).
    #[arg(long, value_name = "PATH")]
    pub vmlinux: Option<PathBuf>,
    /// Initial ramdisk (bzImage only).
    #[arg(long, value_name = "PATH")]
    pub initrd: Option<PathBuf>,
    /// Number of vCPUs (1..=64).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub cpus: u64,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 128, value_name = "MiB")]
    pub mem: u64,
    /// Appended to the default kernel command line.
    #[arg(long, value_name = "STR")]
    pub cmdline: Option<String>,
    /// Replaces the default kernel command line.
    #[arg(long, value_name = "STR", conflicts_with = "cmdline")]
    pub cmdline_replace: Option<String>,
    /// Stop the guest after this many seconds.
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
    /// Where the guest console goes: FILE, `-` (stdout) or `none` (default:
    /// stderr, so that stdout holds only vmtrace's output).
    #[arg(long, value_name = "FILE|-|none")]
    pub console: Option<PathBuf>,
    /// Print exit counts per vCPU, emulation assists, pause figures, and
    /// KVM's own counts (the instructions its emulator ran, all its exits).
    #[arg(long)]
    pub stats: bool,
    /// The guest's module files (*.ko, .ko.gz, .ko.xz, .ko.zst) under DIR:
    /// each module the guest loads whose build id a file has takes from it
    /// what the guest's memory lacks (symbols, BTF, DWARF for --args/--retval).
    #[arg(long, value_name = "DIR")]
    pub modules: Option<PathBuf>,

    #[command(flatten)]
    pub tracing: TraceArgs,
    /// Patch before the first guest instruction (only for kernels that do not patch their own sites).
    #[arg(long, help_heading = "Tracing")]
    pub from_boot: bool,
    /// Flight recorder: keep only the newest SIZE of events per vCPU (e.g.
    /// 16M: 524,288 events), in memory, written when the run stops however
    /// it stops; older ones are counted, not stored (ftrace's overwrite mode).
    #[arg(long, value_name = "SIZE", help_heading = "Tracing")]
    pub overwrite: Option<String>,
}

/// The tracing flags, one set for `vmtrace`, `record` and `attach`: what
/// to trace, how, and how much to keep. A flag one command cannot honour
/// yet is refused by it (`config::trace`), never ignored.
#[derive(Args, Debug, Clone)]
pub struct TraceArgs {
    /// Trace functions matching GLOB (ftrace glob: * ? [...]); repeatable, comma lists.
    #[arg(long, value_name = "GLOB", help_heading = "Tracing")]
    pub trace: Vec<String>,
    /// Do not trace functions matching GLOB; repeatable, comma lists.
    #[arg(long, value_name = "GLOB", help_heading = "Tracing")]
    pub notrace: Vec<String>,
    /// Keep only the calls of these guest tasks (thread ids, as ftrace's
    /// set_ftrace_pid and trace-cmd -P); comma lists, repeatable. Needs the
    /// kernel's BTF.
    #[arg(
        long,
        value_name = "PID",
        value_delimiter = ',',
        help_heading = "Tracing"
    )]
    pub pid: Vec<u32>,
    /// Keep only the calls of guest tasks whose comm matches GLOB. Needs
    /// the kernel's BTF.
    #[arg(long, value_name = "GLOB", help_heading = "Tracing")]
    pub comm: Option<String>,
    /// Trace for this many seconds after attaching, then stop: a run stops
    /// the guest, attach detaches and leaves it running (attach's default:
    /// until Ctrl-C or SIGTERM).
    #[arg(long, value_name = "SECS", help_heading = "Tracing")]
    pub duration: Option<f64>,
    /// Store at most this many events (default: as many as the disk takes);
    /// counts stay exact beyond it.
    #[arg(long, value_name = "N", help_heading = "Tracing")]
    pub max_events: Option<u64>,
    /// Memory for events on their way to the data file (e.g. 64M, 1G):
    /// events are written while the guest runs; if the disk falls this far
    /// behind, calls are counted, not stored, and the loss is reported.
    #[arg(
        long,
        value_name = "SIZE",
        default_value = "64M",
        help_heading = "Tracing"
    )]
    pub buffer: String,
    /// How a traced call reaches vmtrace: a stop per call (trap: a VM exit;
    /// under attach a gdbstub breakpoint, slow but needing nothing of the
    /// guest), or vmtrace's trampoline in the guest appending to rings
    /// (exitless; under attach in memory the guest never uses). auto: a run
    /// traps where KVM emulates guest ring 0, else goes exitless; attach
    /// goes exitless where the guest has such memory, else traps.
    #[arg(long, value_enum, default_value_t = ModeArg::Auto, help_heading = "Tracing")]
    pub mode: ModeArg,
    /// Records per vCPU ring in exitless mode (a power of two; default: as
    /// many as fit). Calls beyond a full ring are counted, not recorded.
    /// Refused by attach, which sizes its rings by --buffer (a ring device,
    /// 16M to 1G) or fits them to the guest's unused low memory.
    #[arg(long, value_name = "N", help_heading = "Tracing")]
    pub ring_events: Option<u64>,
    /// Function graph (ftrace's function_graph): hook every traced call's
    /// return too, for durations, call trees and flame graphs.
    #[arg(long, help_heading = "Tracing")]
    pub graph: bool,
    /// Record each traced call's arguments (the six argument registers),
    /// shown by name from the kernel's BTF: `func(a=1, b=0x...)`; with
    /// =GLOB (comma-separated, repeatable; `!GLOB` leaves out) only at calls
    /// of the traced functions matching.
    #[arg(
        long,
        value_name = "GLOB",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "*",
        help_heading = "Tracing"
    )]
    pub args: Vec<String>,
    /// With --graph: record each return's value (RAX), shown as
    /// funcgraph-retval does, errnos by name: `ret=-2 (-ENOENT)`.
    #[arg(long, help_heading = "Tracing")]
    pub retval: bool,
    /// Record the guest's kernel stack at each call of the traced functions
    /// matching GLOB (comma-separated, repeatable; ftrace's func_stack_trace):
    /// those calls trap, and vmtrace unwinds the stack with the kernel's ORC
    /// tables (else frame pointers).
    #[arg(long, value_name = "GLOB", help_heading = "Tracing")]
    pub stack: Vec<String>,
    /// How traced functions are entered: through their ftrace call sites,
    /// or directly (their first instructions displaced by a jump to a stub:
    /// any function, any kernel); auto: ftrace's sites on kernels that have
    /// them, else direct. Under attach in trap mode, a direct entry is a
    /// breakpoint at the function itself (nothing written).
    #[arg(long, value_enum, default_value_t = EntryArg::Auto, help_heading = "Tracing")]
    pub entry: EntryArg,
    /// Trace the kernel's events matching SYSTEM:NAME (ftrace's set_event
    /// globs: `sched:*`; `vmtrace list -e` lists them), alone or beside
    /// --trace; repeatable, comma lists (docs/events.md).
    #[arg(
        short = 'e',
        long = "event",
        value_name = "EVENT",
        help_heading = "Tracing"
    )]
    pub event: Vec<String>,
}

/// Where a traced run's results go: the data file, exports, and (through
/// `view`) what is printed.
#[derive(Args, Debug, Clone, Default)]
#[command(next_help_heading = "Output")]
pub struct OutputArgs {
    /// Save the trace to FILE, vmtrace's binary data file (`vmtrace record`:
    /// vmtrace.data by default); read it with `vmtrace report FILE`.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Also write the trace as FMT to FILE; FMT: json, csv, chrome, folded,
    /// trace.dat. Repeatable.
    #[arg(long, value_name = "FMT=FILE", value_parser = parse_export)]
    pub export: Vec<ExportArg>,
    /// No live status line.
    #[arg(short, long)]
    pub quiet: bool,
    #[command(flatten)]
    pub view: ViewArgs,
}

/// How the trace is shown on stdout.
#[derive(Args, Debug, Clone, Default)]
#[command(next_help_heading = "Report")]
pub struct ViewArgs {
    /// What is printed on stdout (default: text, the report).
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// Sort the report (default: count).
    #[arg(long, value_enum)]
    pub sort: Option<SortKey>,
    /// Rows of the text report: one per traced function (default) or one
    /// per guest task, comm-pid, with the functions it called (perf's
    /// --sort comm,pid; traces of a Linux guest with BTF).
    #[arg(long, value_enum, value_name = "ROWS")]
    pub by: Option<ByKey>,
    /// Show each function's callers.
    #[arg(short = 'g', long = "callers")]
    pub callers: bool,
    /// Hide functions below PCT percent of the calls in the text report.
    #[arg(long, value_name = "PCT")]
    pub percent_limit: Option<f64>,
    /// Print the call tree instead of the report, as ftrace's function_graph
    /// does (function-graph traces).
    #[arg(long)]
    pub tree: bool,
    /// With --tree: show calls less than N levels deep (1: the outermost only).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub depth: Option<u32>,
    /// With --tree: hide calls shorter than DUR (e.g. 10us; units ns, us, ms, s).
    #[arg(long, value_name = "DUR")]
    pub threshold: Option<String>,
    #[command(flatten)]
    pub window: WindowArgs,
}

/// Which part of the trace is shown.
#[derive(Args, Debug, Clone, Default)]
pub struct WindowArgs {
    /// Only events from START to END after the attach, in seconds or with a
    /// unit (1.5,3 or 1500ms,3s; `2,` and `,0.5` leave one end open).
    #[arg(long, value_name = "START,END")]
    pub time: Option<String>,
    /// Only these vCPUs (e.g. 0,2-3).
    #[arg(long, value_name = "LIST")]
    pub cpu: Option<String>,
}

/// `vmtrace record`: the run options, the data file and exports, no view.
#[derive(Args, Debug, Clone)]
pub struct RecordArgs {
    #[command(flatten)]
    pub run: RunArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// The saved trace a command reads: `FILE` or `-i FILE`.
#[derive(Args, Debug, Clone, Default)]
pub struct InputArgs {
    /// A trace saved by `vmtrace record` or `vmtrace -o FILE` (default: vmtrace.data).
    #[arg(value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// The same as FILE.
    #[arg(
        short = 'i',
        long = "input",
        value_name = "FILE",
        conflicts_with = "file"
    )]
    pub input: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
#[command(after_help = shown::REPORT_EXAMPLES)]
pub struct ReportArgs {
    #[command(flatten)]
    pub input: InputArgs,
    /// Refused: the report goes to stdout, files are written with --export.
    #[arg(short = 'o', long = "output", value_name = "FILE", hide = true)]
    pub output: Option<PathBuf>,
    /// Also write the trace as FMT to FILE; FMT: json, csv, chrome, folded,
    /// trace.dat. Repeatable.
    #[arg(long, value_name = "FMT=FILE", value_parser = parse_export)]
    pub export: Vec<ExportArg>,
    #[command(flatten)]
    pub view: ViewArgs,
    #[command(flatten)]
    pub shown: ShownArgs,
}

#[derive(Args, Debug, Clone)]
#[command(after_help = shown::SCRIPT_EXAMPLES)]
pub struct ScriptArgs {
    #[command(flatten)]
    pub input: InputArgs,
    #[command(flatten)]
    pub window: WindowArgs,
    #[command(flatten)]
    pub shown: ShownArgs,
    #[command(flatten)]
    pub fields: FieldsArgs,
}

/// `vmtrace attach`: a running QEMU, what to trace in it, where results go.
#[derive(Args, Debug, Clone)]
#[command(group(
    ArgGroup::new("symbols")
        .required(true)
        .multiple(true)
        .args(["kernel", "vmlinux"])
))]
// A run without --trace boots untraced; an attach would do nothing.
#[command(mut_arg("trace", |a| a.required_unless_present("event")))]
pub struct AttachArgs {
    /// The libvirt domain to trace, by name (`virsh list`): vmtrace talks to
    /// its QEMU through libvirt.
    #[arg(long, value_name = "NAME", required_unless_present = "qmp")]
    pub domain: Option<String>,
    /// libvirt's connection URI for --domain.
    #[arg(long, value_name = "URI", requires = "domain", default_value = tracer::qemu::libvirt::DEFAULT_URI)]
    pub connect: String,
    /// The QMP socket of a QEMU started by hand (`-qmp
    /// unix:PATH,server=on,wait=off`; for a libvirt domain use --domain:
    /// libvirtd holds its monitor.sock).
    #[arg(long, value_name = "SOCKET", conflicts_with = "domain")]
    pub qmp: Option<PathBuf>,
    /// Use the QEMU's gdbstub at SOCKET or HOST:PORT (default: vmtrace opens
    /// one through QMP and closes it when it detaches).
    #[arg(long, value_name = "SOCKET|HOST:PORT")]
    pub gdb: Option<String>,
    /// The kernel the guest runs: its bzImage or vmlinux.
    #[arg(long, value_name = "PATH")]
    pub kernel: Option<PathBuf>,
    /// Unstripped vmlinux with symbols.
    #[arg(long, value_name = "PATH")]
    pub vmlinux: Option<PathBuf>,
    /// The guest's module files (*.ko, .ko.gz, .ko.xz, .ko.zst) under DIR:
    /// each loaded module whose build id a file has takes from it what the
    /// guest's memory lacks (symbols, BTF, DWARF for --args/--retval).
    #[arg(long, value_name = "DIR")]
    pub modules: Option<PathBuf>,
    #[command(flatten)]
    pub tracing: TraceArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `vmtrace detach`: the QEMU to repair.
#[derive(Args, Debug, Clone)]
pub struct DetachArgs {
    /// The QEMU's QMP socket, as given to `vmtrace attach`.
    #[arg(long, value_name = "SOCKET", required_unless_present = "domain")]
    pub qmp: Option<PathBuf>,
    /// The libvirt domain, as given to `vmtrace attach`.
    #[arg(long, value_name = "NAME", conflicts_with = "qmp")]
    pub domain: Option<String>,
    /// libvirt's connection URI for --domain.
    #[arg(long, value_name = "URI", requires = "domain", default_value = tracer::qemu::libvirt::DEFAULT_URI)]
    pub connect: String,
}

/// The guardian of an attach (`cmd::guard`).
#[derive(Args, Debug, Clone)]
pub struct GuardArgs {
    #[arg(long)]
    pub qmp: Option<PathBuf>,
    #[arg(long)]
    pub domain: Option<String>,
    #[arg(long, default_value = tracer::qemu::libvirt::DEFAULT_URI)]
    pub connect: String,
    #[arg(long)]
    pub qemu_pid: u32,
    #[arg(long)]
    pub attach_pid: u32,
}

#[derive(Args, Debug, Clone)]
#[command(group(
    ArgGroup::new("symbols")
        .required(true)
        .multiple(true)
        .args(["kernel", "vmlinux"])
))]
pub struct ListArgs {
    /// Only functions matching GLOB (ftrace glob: * ? [...] {a,b}; !GLOB leaves out).
    #[arg(value_name = "GLOB")]
    pub globs: Vec<String>,
    /// The kernel whose functions to list; its symbols are found as a traced run finds them.
    #[arg(long, value_name = "PATH")]
    pub kernel: Option<PathBuf>,
    /// Unstripped vmlinux with symbols.
    #[arg(long, value_name = "PATH")]
    pub vmlinux: Option<PathBuf>,
    /// Which functions count as traceable: those with an ftrace call site,
    /// or those whose entry can be displaced safely (direct; each refused
    /// one is marked with why); auto: ftrace's on kernels that have them.
    #[arg(long, value_enum, default_value_t = EntryArg::Auto)]
    pub entry: EntryArg,
    /// List the kernel's events (tracepoints, as ftrace names them:
    /// SUBSYS:NAME, with their arguments) instead of its functions; GLOBs
    /// as ftrace's set_event reads them (sched:*, *:*switch*, sched_switch).
    #[arg(short = 'e', long = "events", conflicts_with = "entry")]
    pub events: bool,
    /// Also list the functions (FUNCTION [MODULE]) of the modules loaded in this QMP socket's guest;
    /// with -e, their events (SUBSYS:NAME [MODULE]).
    #[arg(long, value_name = "PATH")]
    pub qmp: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Benches to run: a name (`call/trap`), a collection (`call`: all its
    /// benches) or an old letter (`a`); none, or `all`: every bench but
    /// boot/ftrace (which runs with --linux-boots N) and qemu/* (only when
    /// named: `all qemu` runs them too). `list [BENCH]...` lists them.
    #[arg(value_name = "BENCH")]
    pub names: Vec<String>,
    /// List the benches (those named, or all) rather than run them: name,
    /// goal, figure and unit, what each needs.
    #[arg(long)]
    pub list: bool,
    /// The mini guest (default: guest/out/mini.elf, built if missing).
    #[arg(long, value_name = "PATH")]
    pub kernel: Option<PathBuf>,
    /// Workload iterations per vCPU in each measured phase of call/trap,
    /// call/exitless and call/graph.
    #[arg(long, default_value_t = 2000)]
    pub iters: u64,
    /// Write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write the figures as a Markdown table to FILE: each bench's headline
    /// figures, the goals' verdicts, what was not measured, and the command,
    /// host and date. A FILE that has a figures block (docs/benchmarks.md)
    /// gets only that block replaced.
    #[arg(long, value_name = "FILE")]
    pub markdown: Option<PathBuf>,
    /// vCPUs for call/trap, call/exitless, call/graph and attach/modes;
    /// keep at most the host's cores.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub cpus: u64,
    /// Rounds of phases for call/trap, call/exitless and call/graph (medians
    /// over the rounds are reported), and fresh guests for attach/modes.
    #[arg(long, default_value_t = 25, value_name = "N")]
    pub rounds: usize,
    /// Pauses, and attach/detach cycles, per vCPU count for attach/pause.
    #[arg(long, default_value_t = 50, value_name = "N")]
    pub cycles: usize,
    /// Linux vmlinux for attach/scaling, sites/direct and events/cost, and attach/direct
    /// unless linux-noftrace/vmlinux is beside it (default:
    /// guest/out/vmlinux; left out of the default set, with a message, if
    /// absent); boot/ftrace boots the bzImage and initramfs beside it.
    #[arg(long, value_name = "PATH")]
    pub vmlinux: Option<PathBuf>,
    /// A distribution's kernel (a bzImage, e.g. Debian's
    /// /boot/vmlinuz-6.1.0-NN-amd64, or a vmlinux) whose functions
    /// sites/direct analyzes beside the vmlinux's; without it that figure
    /// is said not measured.
    #[arg(long, value_name = "PATH")]
    pub distro_kernel: Option<PathBuf>,
    /// Boots of the default Linux guest per configuration (untraced, the
    /// guest's own ftrace, vmtrace trap, vmtrace exitless) for boot/ftrace,
    /// vmtrace against ftrace; 0 leaves it out (each boot takes a minute or
    /// more where KVM emulates guest ring 0).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub linux_boots: usize,
    /// Events in the synthetic trace whose report report/render times.
    #[arg(long, default_value_t = 10_000_000, value_name = "N")]
    pub report_events: u64,
    /// Events record/throughput streams to a data file in the temporary
    /// directory.
    #[arg(long, default_value_t = 100_000_000, value_name = "N")]
    pub record_events: u64,
    /// Events qemu/drain drains from its rings to a data file in the
    /// temporary directory, in each VMM's memory.
    #[arg(long, default_value_t = 20_000_000, value_name = "N")]
    pub drain_events: u64,
    /// Measure only call/exitless and call/graph (f, g), whose instruction
    /// and call counts do not depend on the host's timing (and boot/ftrace
    /// with --linux-boots); the other benches are said not measured.
    #[arg(long)]
    pub counts_only: bool,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
    Csv,
    Chrome,
    /// Folded stacks of a function-graph trace (flamegraph.pl, inferno, speedscope).
    Folded,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModeArg {
    Trap,
    Exitless,
    Auto,
}

impl ModeArg {
    pub fn choice(self) -> tracer::plan::ModeChoice {
        use tracer::plan::ModeChoice;
        match self {
            ModeArg::Trap => ModeChoice::Trap,
            ModeArg::Exitless => ModeChoice::Exitless,
            ModeArg::Auto => ModeChoice::Auto,
        }
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryArg {
    Ftrace,
    Direct,
    Auto,
}

impl EntryArg {
    pub fn choice(self) -> tracer::plan::entry::EntryChoice {
        use tracer::plan::entry::EntryChoice;
        match self {
            EntryArg::Ftrace => EntryChoice::Ftrace,
            EntryArg::Direct => EntryChoice::Direct,
            EntryArg::Auto => EntryChoice::Auto,
        }
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ByKey {
    Function,
    /// The guest task (comm-pid) that made each call.
    Task,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortKey {
    Count,
    Name,
    Cpu,
    /// Function-graph traces: most inclusive time first.
    Total,
    /// Function-graph traces: most self time first.
    #[value(name = "self")]
    SelfTime,
    /// Function-graph traces: longest average call first.
    Avg,
    /// Function-graph traces: longest call first.
    Max,
}

#[cfg(test)]
mod tests {
    use clap::{Args, CommandFactory};

    use super::*;

    /// Each tracing flag as `--help` shows it: name, heading, value name,
    /// defaults and help text.
    fn shown(cmd: &clap::Command, long: &str) -> Option<String> {
        let a = cmd.get_arguments().find(|a| a.get_long() == Some(long))?;
        Some(format!(
            "{long} {:?} {:?} {:?} {:?} {:?}",
            a.get_help_heading(),
            a.get_value_names(),
            a.get_default_values(),
            a.get_num_args(),
            a.get_help().map(ToString::to_string),
        ))
    }

    /// A run, `record` and `attach` take every tracing flag alike.
    #[test]
    fn run_record_and_attach_share_the_tracing_flags() {
        let mut tracing = TraceArgs::augment_args(clap::Command::new("t"));
        // (Before clap adds --help.)
        let longs: Vec<String> = tracing
            .get_arguments()
            .filter_map(|a| a.get_long().map(str::to_string))
            .collect();
        tracing.build();
        assert!(longs.len() >= 14, "{longs:?}");
        let mut cli = Cli::command();
        cli.build();
        let commands = [
            cli.clone(),
            cli.find_subcommand("record").unwrap().clone(),
            cli.find_subcommand("attach").unwrap().clone(),
        ];
        for long in &longs {
            let want = shown(&tracing, long);
            assert_eq!(want.as_deref().map(|s| s.contains("Tracing")), Some(true));
            for cmd in &commands {
                assert_eq!(shown(cmd, long), want, "{} --{long}", cmd.get_name());
            }
        }
    }

    /// Every help text parses (clap's own checks of the definitions), and
    /// attach, unlike a run, still needs --trace.
    #[test]
    fn help_texts_parse() {
        Cli::command().debug_assert();
        let e = Cli::try_parse_from(["vmtrace", "attach", "--qmp", "q", "--kernel", "k"]);
        assert_eq!(
            e.unwrap_err().kind(),
            clap::error::ErrorKind::MissingRequiredArgument
        );
        assert!(Cli::try_parse_from(["vmtrace", "--kernel", "k"]).is_ok());
        let events = [
            "vmtrace", "attach", "--qmp", "q", "--kernel", "k", "-e", "sched:*",
        ];
        assert!(Cli::try_parse_from(events).is_ok());
    }
}
