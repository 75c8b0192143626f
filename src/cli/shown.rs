//! The options of `report` and `script` that choose what of a saved trace
//! is shown: the filters after recording (perf report's and perf
//! script's `--comm`, `--pid`, `--tid`, `--symbols`) and `script -F`.

use clap::{Args, ValueEnum};

/// Which events of a saved trace `report` and `script` show, as perf
/// report's and perf script's filters: each given must match.
#[derive(Args, Debug, Clone, Default)]
#[command(next_help_heading = "Filters")]
pub struct ShownArgs {
    /// Only the events of guest tasks whose comm matches GLOB (*, ?,
    /// [...], {a,b}, as record's --comm); repeatable: any of them.
    #[arg(long, value_name = "GLOB")]
    pub comm: Vec<String>,
    /// Only the events of these processes: the task's tgid, as perf's
    /// --pid (record's --pid takes thread ids: --tid here); comma lists,
    /// repeatable.
    #[arg(long, value_name = "PID", value_delimiter = ',')]
    pub pid: Vec<u32>,
    /// Only the events of these threads: the task's pid in kernel terms,
    /// as perf's --tid and record's --pid; comma lists, repeatable.
    #[arg(long, value_name = "TID", value_delimiter = ',')]
    pub tid: Vec<u32>,
    /// Only the events of the traced functions matching GLOB (the syntax
    /// of --trace, `!GLOB` included; perf's --symbols); comma lists,
    /// repeatable.
    #[arg(long, value_name = "GLOB")]
    pub sym: Vec<String>,
}

/// `report --help`'s examples.
pub const REPORT_EXAMPLES: &str = "Examples:
  vmtrace report --by task
  vmtrace report --comm 'kworker/*' --sym 'hrtimer_*'
  vmtrace report --pid 57 --tree";

/// `script --help`'s examples.
pub const SCRIPT_EXAMPLES: &str = "Examples:
  vmtrace script | head
  vmtrace script --tid 1002 -F time,cpu,func,caller
  vmtrace script --sym 'do_sys_*' -F comm,tid,func,args";

/// `script -F`.
#[derive(Args, Debug, Clone, Default)]
pub struct FieldsArgs {
    /// Print only these fields of each event, in this order, as perf
    /// script -F (a field the trace did not record is refused); comma
    /// lists, repeatable.
    #[arg(
        short = 'F',
        long = "fields",
        value_name = "FIELD",
        value_enum,
        value_delimiter = ',',
        help_heading = "Output"
    )]
    pub fields: Vec<FieldArg>,
}

/// A field of `script -F`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldArg {
    /// The task's name.
    Comm,
    /// Its process id (tgid).
    Pid,
    /// Its thread id (the kernel's pid).
    Tid,
    /// The vCPU, `[001]`.
    Cpu,
    /// The host's CLOCK_MONOTONIC, `1234.567890:`.
    Time,
    /// The function (a return's: `FUNCTION returned`).
    Func,
    /// Where it was called from (`<-CALLER`; a return's `to CALLER`).
    Caller,
    /// The arguments (recorded with --args).
    Args,
    /// A return's value (recorded with --graph --retval).
    Retval,
    /// The kernel stack, below the line (recorded with --stack).
    Stack,
}

impl FieldArg {
    pub fn field(self) -> tracer::trace::export::script_fields::ScriptField {
        use tracer::trace::export::script_fields::ScriptField as F;
        match self {
            FieldArg::Comm => F::Comm,
            FieldArg::Pid => F::Pid,
            FieldArg::Tid => F::Tid,
            FieldArg::Cpu => F::Cpu,
            FieldArg::Time => F::Time,
            FieldArg::Func => F::Func,
            FieldArg::Caller => F::Caller,
            FieldArg::Args => F::Args,
            FieldArg::Retval => F::Retval,
            FieldArg::Stack => F::Stack,
        }
    }

    /// As typed after -F.
    pub fn name(self) -> String {
        self.to_possible_value()
            .map_or_else(String::new, |v| v.get_name().to_string())
    }
}
