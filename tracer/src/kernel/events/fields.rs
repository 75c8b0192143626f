//! An event's fields by name, as ftrace prints them: for the common events
//! (`covered`), the fields their `TP_fast_assign` computes, from the
//! arguments and the structures they point to (task_struct offsets from
//! BTF), read on the host while the event is valid; for every other
//! tracepoint, its arguments by name and type (BTF's `btf_trace_NAME`), as
//! raw values. Formats and states follow include/trace/events/sched.h and
//! task.h of Linux 6.12.

use crate::kernel::btf::{BtfError, KernelBtf};

use super::{EventArg, KernelEvent};

/// `TASK_COMM_LEN` (include/linux/sched.h).
pub(super) const COMM_LEN: usize = 16;
/// Longest string field read (a `bprm->filename`): ftrace's `__string`
/// copies the whole name; vmtrace bounds it.
pub(super) const MAX_STR: usize = 256;

/// Where the covered events' fields are in the kernel's structures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldOffsets {
    /// In `struct task_struct`.
    pub comm: u32,
    pub pid: u32,
    pub tgid: u32,
    pub prio: u32,
    pub exit_state: u32,
    /// `thread_info.cpu` (task_cpu() with CONFIG_THREAD_INFO_IN_TASK).
    pub cpu: Option<u32>,
    /// `task_struct.signal`, and `signal_struct.oom_score_adj` in it.
    pub signal: u32,
    pub oom_score_adj: u32,
    /// `linux_binprm.filename`.
    pub filename: u32,
}

impl FieldOffsets {
    /// The offsets the kernel's BTF gives.
    pub fn find(btf: &KernelBtf) -> Result<FieldOffsets, BtfError> {
        let task = |m: &str| btf.member("task_struct", m).map(|a| a.offset);
        let cpu = match (
            btf.member("task_struct", "thread_info"),
            btf.member("thread_info", "cpu"),
        ) {
            (Ok(t), Ok(c)) => Some(t.offset + c.offset),
            _ => None,
        };
        Ok(FieldOffsets {
            comm: task("comm")?,
            pid: task("pid")?,
            tgid: task("tgid")?,
            prio: task("prio")?,
            exit_state: task("exit_state")?,
            cpu,
            signal: task("signal")?,
            oom_score_adj: btf.member("signal_struct", "oom_score_adj")?.offset,
            filename: btf.member("linux_binprm", "filename")?.offset,
        })
    }
}

/// What of a task a field holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskField {
    Comm,
    Pid,
    Tgid,
    Prio,
    Cpu,
    /// `task->signal->oom_score_adj`.
    OomScoreAdj,
}

/// Where a field's value comes from; `usize`s index the event's arguments
/// (after the probe's `void *__data`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The argument itself.
    Arg(usize),
    /// A member of the task the argument points to.
    Task(usize, TaskField),
    /// The NUL-terminated string the argument points to.
    Str(usize),
    /// `bprm->filename` of the `struct linux_binprm *` argument.
    Filename(usize),
    /// sched_switch's `prev_state` (sched.h `__trace_sched_switch_state`):
    /// from `preempt`, `prev_state` and `prev->exit_state`.
    SwitchState {
        preempt: usize,
        state: usize,
        prev: usize,
    },
    /// A value the plan knows: a syscall event's number.
    Const(i64),
    /// The `unsigned long` at this offset of the `struct pt_regs` the
    /// traced function's first argument points to: a syscall's user
    /// register (`syscall_format`).
    Regs(u32),
    /// The traced function's return value (RAX at its return): a
    /// `sys_exit_*` event's `ret`.
    Ret,
}

/// How a field is printed (the event's `TP_printk`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Print {
    /// Signed decimal of the low 32 bits (`int`, `pid_t`, `short`).
    Int,
    /// Signed decimal of 64 bits (`long`).
    Long,
    /// Unsigned decimal.
    Unsigned,
    /// Hex with `0x` (pointers).
    Hex,
    /// Hex without `0x` (`%lx`: task_newtask's `clone_flags`).
    BareHex,
    /// `true` / `false`.
    Bool,
    /// `%03d` (`target_cpu`).
    Cpu,
    /// A string.
    Str,
    /// A task state letter (`S`, `D`, `R+`...).
    State,
    /// `0x%08lx`: a syscall's argument (kernel/trace/trace_syscalls.c).
    Word,
}

/// One field: its name, its C type (as ftrace's format names it), where
/// it comes from and how it is printed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    /// What `TP_printk` prints before its `=`: the name, but for
    /// sched_process_fork's parent (`comm=`, `pid=`).
    pub label: String,
    pub ty: String,
    pub source: Source,
    pub print: Print,
}

/// An event's fields, in ftrace's order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventFormat {
    /// `sched:sched_switch`.
    pub event: String,
    pub fields: Vec<Field>,
    /// The fields are ftrace's (`covered`); else the arguments, raw.
    pub covered: bool,
    /// The event's record as the kernel's tracefs `format` lays it out,
    /// when the image holds it (trace.dat writes it).
    pub ftrace: Option<super::ftrace_format::FtraceFormat>,
}

/// Where a string field is at the event, from its arguments: what the
/// guest code copies into the record (`EventFormat::copied_at`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StrAt {
    /// The event's argument (after the probe's `__data`) it starts from.
    pub arg: usize,
    /// The string's address is a pointer at this offset from the argument
    /// (`bprm->filename`); None: it is at the argument plus `add`.
    pub deref: Option<u32>,
    pub add: u32,
    /// ftrace's own bound, NUL included, as its `TP_fast_assign` copies it
    /// (`char[16]` comms, truncated as `strscpy` does); None: ftrace keeps
    /// it whole (a `__data_loc` string), and a copy's bound truncates it.
    pub len: Option<u32>,
}

/// Where a field that does not last past the event is at the event: what
/// the guest code copies into the record then (`EventFormat::copied_at`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyAt {
    /// A string, from the event's arguments.
    Str(StrAt),
    /// The 8 bytes at this offset of a structure at the call: a
    /// syscall's argument register in the `struct pt_regs` of
    /// `__x64_sys_NAME(regs)` (`Source::Regs`); a new task's syscall
    /// number and return value in `ret_from_fork(prev, regs, ...)`'s, and
    /// its name in its `task_struct` (`fork_child`).
    Word(WordBase, u32),
}

/// Where a copied word's structure is at the call: at the traced
/// function's first argument (RDI) or its second (RSI), the registers the
/// guest code still holds as the function got them where it copies; or
/// the current task's `task_struct` (the record's task).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WordBase {
    First,
    Second,
    Current,
}

/// A field's value as read at the event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FieldValue {
    Int(i64),
    Str(String),
    /// Its memory could not be read (not mapped, or past the bound).
    Unread,
}

/// A field labelled by its name.
pub(super) fn field(name: &str, ty: &str, source: Source, print: Print) -> Field {
    Field {
        name: name.into(),
        label: name.into(),
        ty: ty.into(),
        source,
        print,
    }
}

/// `PREFIXcomm`, `PREFIXpid` (and `PREFIXprio`) of the task argument `arg`.
fn task_fields(arg: usize, prefix: &str, prio: bool) -> Vec<Field> {
    let mut f = vec![
        field(
            &format!("{prefix}comm"),
            "char[16]",
            Source::Task(arg, TaskField::Comm),
            Print::Str,
        ),
        field(
            &format!("{prefix}pid"),
            "pid_t",
            Source::Task(arg, TaskField::Pid),
            Print::Int,
        ),
    ];
    if prio {
        f.push(field(
            &format!("{prefix}prio"),
            "int",
            Source::Task(arg, TaskField::Prio),
            Print::Int,
        ));
    }
    f
}

/// The covered events' fields, as sched.h and task.h assign and print them
/// (by the event's name and its arguments' names, so that a kernel whose
/// prototype differs falls back to the raw arguments).
fn covered(name: &str, args: &[&str]) -> Option<Vec<Field>> {
    use Source::*;
    use TaskField::*;
    Some(match (name, args) {
        ("sched_switch", ["preempt", "prev", "next", "prev_state"]) => {
            let mut f = task_fields(1, "prev_", true);
            f.push(field(
                "prev_state",
                "long",
                SwitchState {
                    preempt: 0,
                    state: 3,
                    prev: 1,
                },
                Print::State,
            ));
            f.extend(task_fields(2, "next_", true));
            f
        }
        ("sched_wakeup" | "sched_waking" | "sched_wakeup_new", ["p"]) => {
            let mut f = task_fields(0, "", true);
            f.push(field("target_cpu", "int", Task(0, Cpu), Print::Cpu));
            f
        }
        ("sched_process_exit" | "sched_process_free" | "sched_wait_task", ["p"]) => {
            task_fields(0, "", true)
        }
        ("sched_process_fork", ["parent", "child"]) => {
            // TP_printk("comm=%s pid=%d child_comm=%s child_pid=%d").
            let mut f = task_fields(0, "parent_", false);
            for p in &mut f {
                p.label = p.name.trim_start_matches("parent_").into();
            }
            f.extend(task_fields(1, "child_", false));
            f
        }
        ("sched_process_exec", ["p", "old_pid", "bprm"]) => vec![
            field("filename", "__data_loc char[]", Filename(2), Print::Str),
            field("pid", "pid_t", Task(0, Pid), Print::Int),
            field("old_pid", "pid_t", Arg(1), Print::Int),
        ],
        ("task_newtask", ["task", "clone_flags"]) => vec![
            field("pid", "pid_t", Task(0, Pid), Print::Int),
            field("comm", "char[16]", Task(0, Comm), Print::Str),
            // `%lx`: no `0x`.
            field("clone_flags", "unsigned long", Arg(1), Print::BareHex),
            field("oom_score_adj", "short", Task(0, OomScoreAdj), Print::Int),
        ],
        ("task_rename", ["task", "comm"]) => vec![
            field("pid", "pid_t", Task(0, Pid), Print::Int),
            field("oldcomm", "char[16]", Task(0, Comm), Print::Str),
            field("newcomm", "char[16]", Str(1), Print::Str),
            field("oom_score_adj", "short", Task(0, OomScoreAdj), Print::Int),
        ],
        _ => return None,
    })
}

/// How an argument of C type `ty` prints raw.
fn raw_print(ty: &str) -> Print {
    let t = ty.trim_start_matches("const ");
    if t.ends_with('*') {
        return Print::Hex;
    }
    match t {
        "bool" | "_Bool" => Print::Bool,
        "long" | "long int" | "s64" | "ssize_t" | "loff_t" | "long long" => Print::Long,
        "int" | "short" | "char" | "s32" | "s16" | "s8" | "pid_t" | "signed char" => Print::Int,
        _ => Print::Unsigned,
    }
}

impl EventFormat {
    /// The format of `event` (None: its arguments are unknown).
    pub fn of(event: &KernelEvent) -> Option<EventFormat> {
        let args: &[EventArg] = event.args.as_deref()?;
        let names: Vec<&str> = args.iter().map(|a| a.name.as_str()).collect();
        let (fields, covered) = match covered(&event.name, &names) {
            Some(f) => (f, true),
            None => {
                let raw = args.iter().enumerate();
                let f = raw.map(|(i, a)| field(&a.name, &a.ty, Source::Arg(i), raw_print(&a.ty)));
                (f.collect(), false)
            }
        };
        Some(EventFormat {
            event: event.full_name(),
            fields,
            covered,
            ftrace: None,
        })
    }

    /// Whether field `i` can still be read after the event, from the host
    /// while the guest runs on (exitless mode's drain): not a string the
    /// event's caller points to (a buffer on its stack, or freed once the
    /// event's work is done), nor task_rename's `oldcomm` (the kernel
    /// copies the new name over it right after the event,
    /// fs/exec.c `__set_task_comm`). Task members read later show the
    /// task as it is then (a name, a priority changed since).
    pub fn lasts(&self, i: usize) -> bool {
        let Some(f) = self.fields.get(i) else {
            return false;
        };
        let renamed = self.name() == "task_rename" && f.name == "oldcomm";
        // A syscall's registers: the task's next syscall or interrupt
        // from user mode saves others there.
        let regs = matches!(f.source, Source::Regs(_));
        !renamed && !regs && !matches!(f.source, Source::Str(_) | Source::Filename(_))
    }

    /// Where field `i` is at the event when it does not last past it
    /// (`lasts`: a string, a syscall's register), for the guest code to
    /// copy it then (exitless mode, `plan::exitless::strcopy`); None for
    /// any other field.
    pub fn copied_at(&self, i: usize, off: &FieldOffsets) -> Option<CopyAt> {
        if self.lasts(i) {
            return None;
        }
        let comm = Some(COMM_LEN as u32);
        Some(CopyAt::Str(match self.fields.get(i)?.source {
            Source::Str(arg) => StrAt {
                arg,
                deref: None,
                add: 0,
                len: comm,
            },
            Source::Task(arg, TaskField::Comm) => StrAt {
                arg,
                deref: None,
                add: off.comm,
                len: comm,
            },
            Source::Filename(arg) => StrAt {
                arg,
                deref: Some(off.filename),
                add: 0,
                len: None,
            },
            Source::Regs(at) => return Some(CopyAt::Word(WordBase::First, at)),
            _ => return None,
        }))
    }

    /// The event's name alone (`sched_switch`).
    pub fn name(&self) -> &str {
        self.event.split_once(':').map_or(&self.event, |(_, n)| n)
    }
}

#[cfg(test)]
#[path = "fields_tests.rs"]
mod tests;
