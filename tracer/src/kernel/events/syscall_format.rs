//! The syscall events' fields (`syscalls:sys_enter_NAME`, `sys_exit_NAME`)
//! as the kernel's ftrace records and prints them
//! (kernel/trace/trace_syscalls.c): `sys_enter_NAME` holds the syscall's
//! number and each argument as an `unsigned long` (`syscall_get_arguments`,
//! arch/x86/include/asm/syscall.h: RDI RSI RDX R10 R8 R9 of the user's
//! `struct pt_regs`), printed `dfd: 0x%08lx, ...`; `sys_exit_NAME` the
//! number and `long ret`, printed `0x%lx`.
//!
//! vmtrace records `sys_enter_NAME` at the entry of the syscall's own
//! function in the syscall table, `__x64_sys_NAME(const struct pt_regs
//! *regs)` (an ftrace site), reading the arguments from `regs`, and
//! `sys_exit_NAME` at that function's return, its RAX: nothing is written
//! in the guest's threads (ftrace's own way, `raw_syscalls:sys_enter`,
//! needs a flag in every thread: docs/events.md).

use crate::kernel::btf::{BtfError, KernelBtf};
use crate::kernel::events::fields::{field, EventFormat, Print, Source};
use crate::kernel::events::ftrace_format::{FtraceField, FtraceFormat};
use crate::kernel::events::KernelEvent;

/// The syscall events' system, and their names' prefixes.
pub const SYSTEM: &str = "syscalls";
pub const ENTER: &str = "sys_enter_";
pub const EXIT: &str = "sys_exit_";
/// `struct pt_regs`' members holding a syscall's arguments, in
/// `syscall_get_arguments`' order.
const ARG_REGS: [&str; 6] = ["di", "si", "dx", "r10", "r8", "r9"];
/// `struct trace_entry`'s size where BTF does not give it: the events'
/// own fields start after it.
const TRACE_ENTRY: u32 = 8;
/// An argument's and `ret`'s size in the record (`unsigned long`, `long`).
const WORD: u32 = 8;
/// `__syscall_nr`'s (`int`).
const NR_SIZE: u32 = 4;
/// The field holding the syscall's number (`SYSCALL_FIELD(int,
/// __syscall_nr)`).
pub const NR_FIELD: &str = "__syscall_nr";
/// `sys_exit_*`'s print format (`set_syscall_print_fmt`).
const EXIT_PRINT_FMT: &str = "\"0x%lx\", REC->ret";

/// Which of a syscall's two events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// `sys_enter_NAME`: the function's entry.
    Enter,
    /// `sys_exit_NAME`: its return.
    Exit,
}

impl Side {
    /// The side of event `full` (`syscalls:sys_enter_openat`), if it is a
    /// syscall event's.
    pub fn of(full: &str) -> Option<Side> {
        let name = full.strip_prefix(SYSTEM)?.strip_prefix(':')?;
        match (name.starts_with(ENTER), name.starts_with(EXIT)) {
            (true, _) => Some(Side::Enter),
            (_, true) => Some(Side::Exit),
            _ => None,
        }
    }
}

impl EventFormat {
    /// A syscall event's side (`sys_enter_*`, `sys_exit_*`), or None.
    pub fn syscall(&self) -> Option<Side> {
        Side::of(&self.event)
    }
}

/// Where the syscall's arguments are in `struct pt_regs`, and where the
/// events' fields start in their records, from the kernel's BTF.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PtRegs {
    /// Byte offsets of `di`, `si`, `dx`, `r10`, `r8`, `r9`.
    pub args: [u32; 6],
    /// `sizeof(struct trace_entry)`.
    pub entry: u32,
}

impl PtRegs {
    pub fn find(btf: &KernelBtf) -> Result<PtRegs, BtfError> {
        let mut args = [0; 6];
        for (a, reg) in args.iter_mut().zip(ARG_REGS) {
            *a = btf.member("pt_regs", reg)?.offset;
        }
        let entry = btf.struct_size("trace_entry").unwrap_or(TRACE_ENTRY);
        Ok(PtRegs { args, entry })
    }

    /// `__syscall_nr`'s offset in a record, and the first argument's (or
    /// `ret`'s): `struct syscall_trace_enter`/`_exit` (kernel/trace/trace.h).
    fn offsets(&self) -> (u32, u32) {
        (self.entry, (self.entry + NR_SIZE).next_multiple_of(WORD))
    }
}

fn ftrace_field(ty: &str, name: &str, offset: u32, size: u32, signed: bool) -> FtraceField {
    FtraceField {
        ty: ty.into(),
        name: name.into(),
        offset,
        size,
        signed,
    }
}

/// The format of syscall event `event` (None: not a syscall event the
/// table maps, or its arguments unknown), its `__syscall_nr` the table's.
pub fn format(event: &KernelEvent, regs: &PtRegs) -> Option<EventFormat> {
    let nr = i64::from(event.syscall.as_ref()?.nr);
    let (nr_at, args_at) = regs.offsets();
    let nr_field = field(NR_FIELD, "int", Source::Const(nr), Print::Int);
    let nr_ftrace = ftrace_field("int", NR_FIELD, nr_at, NR_SIZE, true);
    let (fields, ftrace, print_fmt) = match Side::of(&event.full_name())? {
        Side::Exit => (
            vec![nr_field, field("ret", "long", Source::Ret, Print::Hex)],
            vec![nr_ftrace, ftrace_field("long", "ret", args_at, WORD, true)],
            EXIT_PRINT_FMT.to_string(),
        ),
        Side::Enter => {
            let args = event.args.as_ref()?;
            let (mut fields, mut ftrace) = (vec![nr_field], vec![nr_ftrace]);
            for (i, (a, reg)) in args.iter().zip(regs.args).enumerate() {
                fields.push(field(&a.name, &a.ty, Source::Regs(reg), Print::Word));
                let at = args_at + WORD * i as u32;
                ftrace.push(ftrace_field(&a.ty, &a.name, at, WORD, false));
            }
            let names: Vec<&str> = args.iter().map(|a| a.name.as_str()).collect();
            (fields, ftrace, enter_print_fmt(&names))
        }
    };
    Some(EventFormat {
        event: event.full_name(),
        fields,
        covered: true,
        ftrace: Some(FtraceFormat {
            id: 0,
            fields: ftrace,
            print_fmt,
        }),
    })
}

/// `sys_enter_*`'s print format, as `__set_enter_print_fmt` makes it:
/// `"dfd: 0x%08lx, ...", ((unsigned long)(REC->dfd)), ...`.
fn enter_print_fmt(args: &[&str]) -> String {
    let text: Vec<String> = args.iter().map(|a| format!("{a}: 0x%08lx")).collect();
    let mut s = format!("\"{}\"", text.join(", "));
    for a in args {
        s.push_str(&format!(", ((unsigned long)(REC->{a}))"));
    }
    s
}

/// The function whose entry and return record syscall event `event`:
/// its table's `__x64_sys_NAME`.
pub fn function(event: &KernelEvent) -> Option<&str> {
    event.syscall.as_ref().map(|t| t.func.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::events::TableEntry;

    fn openat(name: &str, args: &[(&str, &str)]) -> KernelEvent {
        let table = TableEntry {
            nr: 257,
            func: "__x64_sys_openat".into(),
        };
        KernelEvent::declared(SYSTEM, name, args, Some(table))
    }

    const REGS: PtRegs = PtRegs {
        args: [112, 104, 96, 56, 72, 64],
        entry: 8,
    };

    /// As Linux 6.12's tracefs shows `syscalls/sys_enter_openat/format`
    /// and `sys_exit_openat/format`.
    #[test]
    fn the_formats_are_ftraces() {
        let args = [
            ("int", "dfd"),
            ("const char *", "filename"),
            ("int", "flags"),
            ("umode_t", "mode"),
        ];
        let f = format(&openat("sys_enter_openat", &args), &REGS).unwrap();
        let t = f.ftrace.as_ref().unwrap();
        assert_eq!(
            t.print_fmt,
            "\"dfd: 0x%08lx, filename: 0x%08lx, flags: 0x%08lx, mode: 0x%08lx\", \
             ((unsigned long)(REC->dfd)), ((unsigned long)(REC->filename)), \
             ((unsigned long)(REC->flags)), ((unsigned long)(REC->mode))"
        );
        let at: Vec<(&str, u32, u32, bool)> = t
            .fields
            .iter()
            .map(|f| (f.name.as_str(), f.offset, f.size, f.signed))
            .collect();
        assert_eq!(
            at,
            [
                ("__syscall_nr", 8, 4, true),
                ("dfd", 16, 8, false),
                ("filename", 24, 8, false),
                ("flags", 32, 8, false),
                ("mode", 40, 8, false)
            ]
        );
        assert_eq!(f.fields[0].source, Source::Const(257));
        assert_eq!(f.fields[2].source, Source::Regs(104));
        assert_eq!(f.syscall(), Some(Side::Enter));
        assert!(!f.lasts(1) && f.lasts(0));
        let f = format(&openat("sys_exit_openat", &[("long", "ret")]), &REGS).unwrap();
        let t = f.ftrace.unwrap();
        assert_eq!(t.print_fmt, "\"0x%lx\", REC->ret");
        assert_eq!((t.fields[1].offset, t.fields[1].size), (16, 8));
        assert_eq!(f.fields[1].source, Source::Ret);
        assert_eq!(Side::of("syscalls:sys_exit_openat"), Some(Side::Exit));
        assert_eq!(Side::of("raw_syscalls:sys_enter"), None);
        assert_eq!(enter_print_fmt(&[]), "\"\"");
    }
}
