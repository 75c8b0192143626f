//! Command-line interface: what the user can ask for.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "vmtrace",
    version,
    about = "Trace a Linux guest kernel's function calls from the KVM hypervisor",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print the report of a trace saved with `-o FILE`.
    Report(ReportArgs),
    /// Measure the cost of tracing on the mini guest.
    Bench(BenchArgs),
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
    /// Write the guest console to FILE instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub console: Option<PathBuf>,
    /// Print exit counts per vCPU, emulation assists and pause figures.
    #[arg(long)]
    pub stats: bool,

    /// Trace functions matching GLOB (ftrace glob: * ? [...]); repeatable, comma lists.
    #[arg(long, value_name = "GLOB")]
    pub trace: Vec<String>,
    /// Do not trace functions matching GLOB; repeatable, comma lists.
    #[arg(long, value_name = "GLOB")]
    pub notrace: Vec<String>,
    /// Trace for this many seconds after attaching, then stop the guest.
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Patch before the first guest instruction (only for kernels that do not patch their own sites).
    #[arg(long)]
    pub from_boot: bool,
    /// Keep at most this many events in memory (counts stay exact beyond it).
    #[arg(long, default_value_t = 50_000_000, value_name = "N")]
    pub max_events: u64,
    /// How a traced call reaches vmtrace: an exit per call (trap), vmtrace's
    /// trampoline in the guest appending to rings (exitless), or the cheaper
    /// on this host (auto: trap where KVM emulates guest ring 0, else exitless).
    #[arg(long, value_enum, default_value_t = ModeArg::Auto)]
    pub mode: ModeArg,
    /// Records per vCPU ring in exitless mode (a power of two; default: as
    /// many as fit). Calls beyond a full ring are counted, not recorded.
    #[arg(long, value_name = "N")]
    pub ring_events: Option<u64>,
    /// Function graph (ftrace's function_graph): hook every traced call's
    /// return too, for durations, call trees and flame graphs.
    #[arg(long)]
    pub graph: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// How the trace is shown or saved.
#[derive(Args, Debug, Clone)]
pub struct OutputArgs {
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Write the output (or, with the text format, the binary trace) to FILE.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Sort the report.
    #[arg(long, value_enum, default_value_t = SortKey::Count)]
    pub sort: SortKey,
    /// Only these vCPUs (e.g. 0,2-3).
    #[arg(long, value_name = "LIST")]
    pub cpu: Option<String>,
    /// Show each function's callers.
    #[arg(short = 'g', long = "callers")]
    pub callers: bool,
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
    /// No live status line.
    #[arg(short, long)]
    pub quiet: bool,
}

#[derive(Args, Debug, Clone)]
pub struct ReportArgs {
    /// A trace saved with `vmtrace ... -o FILE`.
    #[arg(short = 'i', long = "input", value_name = "FILE")]
    pub input: PathBuf,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// The mini guest (default: guest/out/mini.elf, built if missing).
    #[arg(long, value_name = "PATH")]
    pub kernel: Option<PathBuf>,
    /// Workload iterations per vCPU in each measured phase of (a) and (b).
    #[arg(long, default_value_t = 2000)]
    pub iters: u64,
    /// Write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// vCPUs for the per-call figures (a) and (b); keep at most the host's cores.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub cpus: u64,
    /// Rounds of the untraced / resume-only / recorder phases for (a) and (b);
    /// medians over the rounds are reported.
    #[arg(long, default_value_t = 25, value_name = "N")]
    pub rounds: usize,
    /// Pause/resume cycles per vCPU count for (d).
    #[arg(long, default_value_t = 50, value_name = "N")]
    pub cycles: usize,
    /// Linux vmlinux for the attach-scaling (e) and loading figures
    /// (default: guest/out/vmlinux; skipped with a message if absent).
    #[arg(long, value_name = "PATH")]
    pub vmlinux: Option<PathBuf>,
    /// Events in the synthetic trace whose report is timed.
    #[arg(long, default_value_t = 10_000_000, value_name = "N")]
    pub report_events: u64,
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
