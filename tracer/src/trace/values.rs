//! Arguments and return values as printed (`--args`, `--retval`), in
//! ftrace's forms:
//!
//! - arguments as the function tracer's `func-args` option prints them,
//!   `(name=value, name=value)`: signed integers in decimal, unsigned ones
//!   in decimal, pointers in hex (`0xffff888003a1c000`, NULL `0x0`), enums
//!   by the name of their value when one has it (else decimal), `_Bool` as
//!   `true`/`false`, `char` quoted (`'A'`, `'\x07'`);
//! - return values as `funcgraph-retval` prints them, in decimal, but by
//!   the function's type: a signed (or pointer) return from -1 to -4095 is
//!   an error code (the kernel's `IS_ERR_VALUE`) and is also named,
//!   `-2 (-ENOENT)`; other pointers are hex; a `void` function's return
//!   prints nothing.
//!
//! Each value is cut to its type's size first: an `int` is the low 32 bits
//! of its register, sign-extended (the upper half of RAX after `return -2`
//! from an `int` function is 0, not the sign).
//!
//! Names (parameters, enum values) come from the guest's BTF and are
//! printed through `report::escape`.

use std::borrow::Cow;
use std::collections::HashMap;

use crate::kernel::names::escape;
use crate::trace::model::{Event, Prototype, Trace, ValueKind, ARG_REGS};

pub use crate::kernel::prototype::RETURN_NOTE;

/// The largest error code a return value can be (the kernel's
/// `MAX_ERRNO`: `IS_ERR_VALUE` is -4095..=-1).
pub const MAX_ERRNO: u64 = 4095;

/// Linux's error names: asm-generic/errno-base.h and errno.h (1..=133),
/// and the kernel-internal ones of include/linux/errno.h (512..=530),
/// which never reach user space but are what kernel functions return.
// Long: a table, one name a line.
pub fn errno_name(n: u64) -> Option<&'static str> {
    const USER: [&str; 133] = [
        "EPERM",
        "ENOENT",
        "ESRCH",
        "EINTR",
        "EIO",
        "ENXIO",
        "E2BIG",
        "ENOEXEC",
        "EBADF",
        "ECHILD",
        "EAGAIN",
        "ENOMEM",
        "EACCES",
        "EFAULT",
        "ENOTBLK",
        "EBUSY",
        "EEXIST",
        "EXDEV",
        "ENODEV",
        "ENOTDIR",
        "EISDIR",
        "EINVAL",
        "ENFILE",
        "EMFILE",
        "ENOTTY",
        "ETXTBSY",
        "EFBIG",
        "ENOSPC",
        "ESPIPE",
        "EROFS",
        "EMLINK",
        "EPIPE",
        "EDOM",
        "ERANGE",
        "EDEADLK",
        "ENAMETOOLONG",
        "ENOLCK",
        "ENOSYS",
        "ENOTEMPTY",
        "ELOOP",
        "", // 41: unused (EWOULDBLOCK is EAGAIN)
        "ENOMSG",
        "EIDRM",
        "ECHRNG",
        "EL2NSYNC",
        "EL3HLT",
        "EL3RST",
        "ELNRNG",
        "EUNATCH",
        "ENOCSI",
        "EL2HLT",
        "EBADE",
        "EBADR",
        "EXFULL",
        "ENOANO",
        "EBADRQC",
        "EBADSLT",
        "", // 58: unused (EDEADLOCK is EDEADLK)
        "EBFONT",
        "ENOSTR",
        "ENODATA",
        "ETIME",
        "ENOSR",
        "ENONET",
        "ENOPKG",
        "EREMOTE",
        "ENOLINK",
        "EADV",
        "ESRMNT",
        "ECOMM",
        "EPROTO",
        "EMULTIHOP",
        "EDOTDOT",
        "EBADMSG",
        "EOVERFLOW",
        "ENOTUNIQ",
        "EBADFD",
        "EREMCHG",
        "ELIBACC",
        "ELIBBAD",
        "ELIBSCN",
        "ELIBMAX",
        "ELIBEXEC",
        "EILSEQ",
        "ERESTART",
        "ESTRPIPE",
        "EUSERS",
        "ENOTSOCK",
        "EDESTADDRREQ",
        "EMSGSIZE",
        "EPROTOTYPE",
        "ENOPROTOOPT",
        "EPROTONOSUPPORT",
        "ESOCKTNOSUPPORT",
        "EOPNOTSUPP",
        "EPFNOSUPPORT",
        "EAFNOSUPPORT",
        "EADDRINUSE",
        "EADDRNOTAVAIL",
        "ENETDOWN",
        "ENETUNREACH",
        "ENETRESET",
        "ECONNABORTED",
        "ECONNRESET",
        "ENOBUFS",
        "EISCONN",
        "ENOTCONN",
        "ESHUTDOWN",
        "ETOOMANYREFS",
        "ETIMEDOUT",
        "ECONNREFUSED",
        "EHOSTDOWN",
        "EHOSTUNREACH",
        "EALREADY",
        "EINPROGRESS",
        "ESTALE",
        "EUCLEAN",
        "ENOTNAM",
        "ENAVAIL",
        "EISNAM",
        "EREMOTEIO",
        "EDQUOT",
        "ENOMEDIUM",
        "EMEDIUMTYPE",
        "ECANCELED",
        "ENOKEY",
        "EKEYEXPIRED",
        "EKEYREVOKED",
        "EKEYREJECTED",
        "EOWNERDEAD",
        "ENOTRECOVERABLE",
        "ERFKILL",
        "EHWPOISON",
    ];
    const KERNEL: [&str; 19] = [
        "ERESTARTSYS",
        "ERESTARTNOINTR",
        "ERESTARTNOHAND",
        "ENOIOCTLCMD",
        "ERESTART_RESTARTBLOCK",
        "EPROBE_DEFER",
        "EOPENSTALE",
        "ENOPARAM",
        "", // 520: unused
        "EBADHANDLE",
        "ENOTSYNC",
        "EBADCOOKIE",
        "ENOTSUPP",
        "ETOOSMALL",
        "ESERVERFAULT",
        "EBADTYPE",
        "EJUKEBOX",
        "EIOCBQUEUED",
        "ERECALLCONFLICT",
    ];
    let name = match n {
        1..=133 => USER[n as usize - 1],
        512..=530 => KERNEL[n as usize - 512],
        _ => return None,
    };
    (!name.is_empty()).then_some(name)
}

/// `raw` cut to `size` bytes and sign-extended.
fn signed(raw: u64, size: u8) -> i64 {
    match size {
        1 => raw as i8 as i64,
        2 => raw as i16 as i64,
        4 => raw as i32 as i64,
        _ => raw as i64,
    }
}

/// `raw` cut to `size` bytes.
fn unsigned(raw: u64, size: u8) -> u64 {
    match size {
        1 => raw & 0xff,
        2 => raw & 0xffff,
        4 => raw & 0xffff_ffff,
        _ => raw,
    }
}

/// An enum's value as its names are kept (`ValueKind::Enum::names`):
/// cut to its size, sign-extended if the enum is signed.
pub fn enum_value(raw: u64, size: u8, is_signed: bool) -> i64 {
    if is_signed {
        signed(raw, size)
    } else {
        unsigned(raw, size) as i64
    }
}

/// A `char`: quoted, `'A'`, or its byte in hex when not printable ASCII
/// (`'\x07'`), a quote and a backslash escaped.
fn char_text(b: u8) -> String {
    match b {
        b'\'' => "'\\''".into(),
        b'\\' => "'\\\\'".into(),
        0x20..=0x7e => format!("'{}'", b as char),
        _ => format!("'\\x{b:02x}'"),
    }
}

/// One argument (or any value) of `kind` held in a register as `raw`.
pub fn format_value(kind: &ValueKind, raw: u64) -> String {
    match kind {
        ValueKind::Signed(size) => signed(raw, *size).to_string(),
        ValueKind::Unsigned(size) => unsigned(raw, *size).to_string(),
        ValueKind::Bool => (raw & 0xff != 0).to_string(),
        ValueKind::Char => char_text(raw as u8),
        ValueKind::Pointer => format!("{raw:#x}"),
        ValueKind::Enum {
            size,
            signed: is_signed,
            names,
        } => {
            let v = enum_value(raw, *size, *is_signed);
            match names.iter().find(|(n, _)| *n == v) {
                Some((_, name)) => escape(name).into_owned(),
                None if *is_signed => v.to_string(),
                None => (v as u64).to_string(),
            }
        }
        // No value: the register holds nothing of the function's.
        ValueKind::Void => String::new(),
    }
}

/// `v` with its error name, `-2 (-ENOENT)`, when it is an error code
/// (-1..=-4095) with a name; else decimal.
fn errno_text(v: i64) -> String {
    match errno_name(v.unsigned_abs()).filter(|_| (-(MAX_ERRNO as i64)..0).contains(&v)) {
        Some(name) => format!("{v} (-{name})"),
        None => v.to_string(),
    }
}

/// A return value of `kind` left in RAX as `raw`; None for `void`.
pub fn format_return(kind: &ValueKind, raw: u64) -> Option<String> {
    Some(match kind {
        ValueKind::Void => return None,
        ValueKind::Signed(size) => errno_text(signed(raw, *size)),
        // ERR_PTR(-ENOMEM) is a pointer return holding -12.
        ValueKind::Pointer if raw >= MAX_ERRNO.wrapping_neg() => errno_text(raw as i64),
        _ => format_value(kind, raw),
    })
}

/// The arguments `prototype` shows from the six argument registers,
/// ftrace's `(name=value, ...)`.
pub fn format_args(prototype: &Prototype, regs: &[u64; ARG_REGS]) -> String {
    let mut s = String::from("(");
    for (i, p) in prototype.params.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        let raw = regs.get(p.reg as usize).copied().unwrap_or(0);
        s.push_str(&escape(&p.name));
        s.push('=');
        s.push_str(&format_value(&p.kind, raw));
    }
    s.push(')');
    s
}

/// The prototype of traced function `func`, when the trace has one.
pub fn prototype(trace: &Trace, func: u32) -> Option<&Prototype> {
    trace.prototypes.get(func as usize)?.as_ref()
}

/// An entry's arguments as printed, `(a=1, b=-2)`: None when the entry
/// has none recorded or its function has no prototype.
pub fn entry_args(trace: &Trace, e: &Event) -> Option<String> {
    let regs = trace.args_of(e)?;
    Some(format_args(prototype(trace, e.func)?, regs))
}

/// The arguments `id` (an entry's `Event::data`, a frame's `args`) of a
/// call of traced function `func`, as `entry_args` prints them.
pub fn args_by_id(trace: &Trace, func: u32, id: u64) -> Option<String> {
    let regs = trace.args.get((id as usize).checked_sub(1)?)?;
    Some(format_args(prototype(trace, func)?, regs))
}

/// The return value `raw` of traced function `func` as printed: by its
/// prototype's return type (None for `void`), or in hex when the
/// function has no prototype (its type unknown). None when the trace did
/// not record return values.
pub fn return_value(trace: &Trace, func: u32, raw: u64) -> Option<String> {
    if !trace.meta.retval {
        return None;
    }
    match prototype(trace, func) {
        Some(p) => format_return(&p.ret, raw),
        None => Some(format!("{raw:#x}")),
    }
}

/// What of traced function `func`'s arguments and return value the
/// trace cannot show, once per function: its prototype's `unshown`, or
/// that BTF does not describe it. Empty when everything is shown, or
/// when the trace recorded no values.
pub fn unshown(trace: &Trace, func: u32) -> Vec<Cow<'_, str>> {
    if !trace.meta.args && !trace.meta.retval {
        return Vec::new();
    }
    match prototype(trace, func) {
        // Only about what was recorded.
        Some(p) => p
            .unshown
            .iter()
            .filter(|u| match u.starts_with(RETURN_NOTE) {
                true => trace.meta.retval,
                false => trace.meta.args,
            })
            .map(|u| escape(u))
            .collect(),
        None => vec![Cow::Borrowed(match (trace.meta.args, trace.meta.retval) {
            (true, true) => {
                "no prototype in the kernel's BTF: arguments not shown, return value in hex"
            }
            (true, false) => "no prototype in the kernel's BTF: arguments not shown",
            _ => "no prototype in the kernel's BTF: return value in hex",
        })],
    }
}

/// What the trace recorded, for headers: "arguments and return values";
/// None when neither.
pub fn recorded(trace: &Trace) -> Option<&'static str> {
    match (trace.meta.args, trace.meta.retval) {
        (false, false) => None,
        (true, false) => Some("arguments"),
        (false, true) => Some("return values"),
        (true, true) => Some("arguments and return values"),
    }
}

/// One line per traced function whose values cannot all be shown
/// (`unshown`), for those `include` keeps: `FUNCTION: what; what`.
pub fn unshown_lines(trace: &Trace, include: impl Fn(usize) -> bool) -> Vec<String> {
    (0..trace.functions.len())
        .filter(|&f| include(f))
        .filter_map(|f| {
            let notes = unshown(trace, f as u32);
            (!notes.is_empty())
                .then(|| format!("{}: {}", escape(&trace.functions[f].name), notes.join("; ")))
        })
        .collect()
}

/// How many of each return value a function's stored returns had.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReturnCount {
    /// As printed (`return_value`).
    pub value: String,
    pub count: u64,
}

/// The values each traced function returned most (at most `top` per
/// function), most frequent first, then by value as printed; per
/// function (parallel to `Trace::functions`). Empty when the trace did
/// not record return values.
pub fn return_counts(trace: &Trace, top: usize) -> Vec<Vec<ReturnCount>> {
    if !trace.meta.retval {
        return Vec::new();
    }
    let mut per: Vec<HashMap<u64, u64>> = vec![HashMap::new(); trace.functions.len()];
    for e in trace.events.iter().filter(|e| e.is_return()) {
        if let Some(m) = per.get_mut(e.func as usize) {
            *m.entry(e.data).or_default() += 1;
        }
    }
    per.into_iter()
        .enumerate()
        .map(|(f, m)| {
            // Registers that differ above the type's size are one value.
            let mut by_text: HashMap<String, u64> = HashMap::new();
            for (raw, n) in m {
                if let Some(v) = return_value(trace, f as u32, raw) {
                    *by_text.entry(v).or_default() += n;
                }
            }
            let mut v: Vec<ReturnCount> = by_text
                .into_iter()
                .map(|(value, count)| ReturnCount { value, count })
                .collect();
            v.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.value.cmp(&b.value)));
            v.truncate(top);
            v
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::model::Param;

    fn mini_state() -> ValueKind {
        ValueKind::Enum {
            size: 4,
            signed: false,
            names: vec![
                (0, "MINI_STATE_IDLE".into()),
                (1, "MINI_STATE_RUNNING".into()),
                (2, "MINI_STATE_SLEEPING".into()),
                (64, "MINI_STATE_DEAD".into()),
            ],
        }
    }

    fn param(name: &str, kind: ValueKind, reg: u8) -> Param {
        Param {
            name: name.into(),
            kind,
            reg,
        }
    }

    #[test]
    fn errno_names_cover_linux_and_the_kernels_own() {
        assert_eq!(errno_name(1), Some("EPERM"));
        assert_eq!(errno_name(2), Some("ENOENT"));
        assert_eq!(errno_name(22), Some("EINVAL"));
        assert_eq!(errno_name(40), Some("ELOOP"));
        assert_eq!(errno_name(41), None);
        assert_eq!(errno_name(42), Some("ENOMSG"));
        assert_eq!(errno_name(58), None);
        assert_eq!(errno_name(59), Some("EBFONT"));
        assert_eq!(errno_name(95), Some("EOPNOTSUPP"));
        assert_eq!(errno_name(110), Some("ETIMEDOUT"));
        assert_eq!(errno_name(133), Some("EHWPOISON"));
        assert_eq!(errno_name(134), None);
        assert_eq!(errno_name(512), Some("ERESTARTSYS"));
        assert_eq!(errno_name(516), Some("ERESTART_RESTARTBLOCK"));
        assert_eq!(errno_name(517), Some("EPROBE_DEFER"));
        assert_eq!(errno_name(520), None);
        assert_eq!(errno_name(524), Some("ENOTSUPP"));
        assert_eq!(errno_name(530), Some("ERECALLCONFLICT"));
        assert_eq!(errno_name(531), None);
        assert_eq!(errno_name(0), None);
    }

    #[test]
    fn values_are_cut_to_their_type() {
        // int b = -3 in ESI, the upper half not its sign.
        assert_eq!(format_value(&ValueKind::Signed(4), 0xffff_fffd), "-3");
        assert_eq!(format_value(&ValueKind::Signed(4), 0x1234_0000_0005), "5");
        assert_eq!(format_value(&ValueKind::Signed(8), u64::MAX), "-1");
        assert_eq!(format_value(&ValueKind::Signed(1), 0x180), "-128");
        assert_eq!(format_value(&ValueKind::Signed(2), 0xffff), "-1");
        assert_eq!(format_value(&ValueKind::Unsigned(1), 0x1c8), "200");
        assert_eq!(
            format_value(&ValueKind::Unsigned(4), u64::MAX),
            "4294967295"
        );
        assert_eq!(
            format_value(&ValueKind::Unsigned(8), u64::MAX),
            "18446744073709551615"
        );
        assert_eq!(format_value(&ValueKind::Bool, 0x100), "false");
        assert_eq!(format_value(&ValueKind::Bool, 1), "true");
        assert_eq!(format_value(&ValueKind::Char, 0x41), "'A'");
        assert_eq!(format_value(&ValueKind::Char, 7), "'\\x07'");
        assert_eq!(format_value(&ValueKind::Char, 0x27), "'\\''");
        assert_eq!(format_value(&ValueKind::Pointer, 0), "0x0");
        assert_eq!(
            format_value(&ValueKind::Pointer, 0xffff_8880_03a1_c000),
            "0xffff888003a1c000"
        );
        assert_eq!(format_value(&mini_state(), 64), "MINI_STATE_DEAD");
        assert_eq!(
            format_value(&mini_state(), 0xdead_0000_0001),
            "MINI_STATE_RUNNING"
        );
        assert_eq!(format_value(&mini_state(), 3), "3");
        let signed = ValueKind::Enum {
            size: 4,
            signed: true,
            names: vec![(-1, "NEG".into())],
        };
        assert_eq!(format_value(&signed, 0xffff_ffff), "NEG");
        assert_eq!(format_value(&signed, 0xffff_fffe), "-2");
        let bad = ValueKind::Enum {
            size: 4,
            signed: false,
            names: vec![(7, "A\nB".into())],
        };
        assert_eq!(format_value(&bad, 7), "A\\x0aB");
    }

    #[test]
    fn returns_name_error_codes() {
        let int = ValueKind::Signed(4);
        // args_errno returning -2: RAX = 0x00000000fffffffe.
        assert_eq!(
            format_return(&int, 0xffff_fffe).as_deref(),
            Some("-2 (-ENOENT)")
        );
        assert_eq!(
            format_return(&int, 0xffff_ffea).as_deref(),
            Some("-22 (-EINVAL)")
        );
        assert_eq!(format_return(&int, 4096).as_deref(), Some("4096"));
        assert_eq!(format_return(&int, 0).as_deref(), Some("0"));
        // An error code without a name, and one past MAX_ERRNO.
        assert_eq!(
            format_return(&int, (-200i64) as u64).as_deref(),
            Some("-200")
        );
        let long = ValueKind::Signed(8);
        assert_eq!(
            format_return(&long, (-4095i64) as u64).as_deref(),
            Some("-4095")
        );
        assert_eq!(
            format_return(&long, (-512i64) as u64).as_deref(),
            Some("-512 (-ERESTARTSYS)")
        );
        assert_eq!(
            format_return(&long, (-4096i64) as u64).as_deref(),
            Some("-4096")
        );
        // ERR_PTR(-ENOMEM), a real pointer, NULL.
        let ptr = ValueKind::Pointer;
        assert_eq!(
            format_return(&ptr, (-12i64) as u64).as_deref(),
            Some("-12 (-ENOMEM)")
        );
        assert_eq!(
            format_return(&ptr, 0xffff_8880_0000_1000).as_deref(),
            Some("0xffff888000001000")
        );
        assert_eq!(format_return(&ptr, 0).as_deref(), Some("0x0"));
        // Unsigned values are never error codes.
        assert_eq!(
            format_return(&ValueKind::Unsigned(4), 0xffff_fffe).as_deref(),
            Some("4294967294")
        );
        assert_eq!(format_return(&ValueKind::Void, 5), None);
        assert_eq!(format_return(&ValueKind::Bool, 1).as_deref(), Some("true"));
    }

    #[test]
    fn args_are_ftraces_func_args() {
        // args_six(u64 a, int b, struct task_struct *t, enum mini_state s, u8 ch, long e)
        let p = Prototype {
            params: vec![
                param("a", ValueKind::Unsigned(8), 0),
                param("b", ValueKind::Signed(4), 1),
                param("t", ValueKind::Pointer, 2),
                param("s", mini_state(), 3),
                param("ch", ValueKind::Unsigned(1), 4),
                param("e", ValueKind::Signed(8), 5),
            ],
            ret: ValueKind::Signed(8),
            unshown: Vec::new(),
        };
        let regs = [
            0xfedc_0001_0000_0005,
            0xffff_fffd,
            0xffff_ffff_8100_8000,
            2,
            0x1cd,
            (-500_016i64) as u64,
        ];
        assert_eq!(
            format_args(&p, &regs),
            "(a=18364553384805007365, b=-3, t=0xffffffff81008000, s=MINI_STATE_SLEEPING, \
             ch=205, e=-500016)"
        );
        // args_struct(struct mini_pair p, int after): `after` in RDX.
        let s = Prototype {
            params: vec![param("after", ValueKind::Signed(4), 2)],
            ret: ValueKind::Signed(8),
            unshown: vec!["p: a struct passed by value (RDI, RSI)".into()],
        };
        assert_eq!(
            format_args(&s, &[0x5003, 3, 0xffff_fffd, 0, 0, 0]),
            "(after=-3)"
        );
        let none = Prototype {
            params: Vec::new(),
            ret: ValueKind::Void,
            unshown: Vec::new(),
        };
        assert_eq!(format_args(&none, &[0; ARG_REGS]), "()");
    }

    use crate::trace::model::TraceMeta;

    fn trace() -> Trace {
        use crate::kernel::symbols::Symbol;
        use crate::trace::model::RETURN_BIT;
        let ret = |func, data| Event {
            func,
            slot: 0x100 | RETURN_BIT,
            data,
            ..Event::default()
        };
        Trace {
            meta: TraceMeta {
                retval: true,
                graph: true,
                ..TraceMeta::default()
            },
            functions: vec![
                Symbol {
                    name: "args_errno".into(),
                    addr: 0x1000,
                    size: 0x10,
                },
                Symbol {
                    name: "mystery".into(),
                    addr: 0x2000,
                    size: 0x10,
                },
            ],
            events: vec![
                ret(0, 0xffff_fffe),
                ret(0, 0x1_ffff_fffe),
                ret(0, 0),
                ret(0, 0xffff_ffea),
                ret(1, 0x2a),
            ],
            prototypes: vec![
                Some(Prototype {
                    params: vec![param("n", ValueKind::Unsigned(4), 0)],
                    ret: ValueKind::Signed(4),
                    unshown: Vec::new(),
                }),
                None,
            ],
            ..Trace::default()
        }
    }

    #[test]
    fn return_counts_group_values_as_printed() {
        let t = trace();
        let c = return_counts(&t, 2);
        let rc = |value: &str, count| ReturnCount {
            value: value.into(),
            count,
        };
        // The two -2s differ above the int's 32 bits: one value.
        assert_eq!(c[0], [rc("-2 (-ENOENT)", 2), rc("-22 (-EINVAL)", 1)]);
        assert_eq!(c[1], [rc("0x2a", 1)]);
        assert_eq!(
            unshown(&t, 1),
            ["no prototype in the kernel's BTF: return value in hex"]
        );
        assert!(unshown(&t, 0).is_empty());
        let mut off = t;
        off.meta.retval = false;
        assert!(return_counts(&off, 8).is_empty());
        assert_eq!(return_value(&off, 0, 0), None);
        assert!(unshown(&off, 1).is_empty());
    }

    /// A note about the return value is said only with return values,
    /// one about an argument only with arguments.
    #[test]
    fn notes_are_only_of_what_was_recorded() {
        let mut t = trace();
        t.prototypes[0] = Some(Prototype {
            params: Vec::new(),
            ret: ValueKind::Void,
            unshown: vec![
                "p: a struct passed by value (RDI, RSI)".into(),
                format!("{RETURN_NOTE} a struct passed by value (RAX, RDX)"),
            ],
        });
        t.meta.args = true;
        assert_eq!(unshown(&t, 0).len(), 2);
        t.meta.retval = false;
        assert_eq!(unshown(&t, 0), ["p: a struct passed by value (RDI, RSI)"]);
        assert_eq!(
            unshown(&t, 1),
            ["no prototype in the kernel's BTF: arguments not shown"]
        );
        t.meta = TraceMeta {
            retval: true,
            ..TraceMeta::default()
        };
        assert_eq!(
            unshown(&t, 0),
            ["return value: a struct passed by value (RAX, RDX)"]
        );
        assert_eq!(
            unshown(&t, 1),
            ["no prototype in the kernel's BTF: return value in hex"]
        );
        assert_eq!(
            unshown_lines(&t, |f| f == 0),
            ["args_errno: return value: a struct passed by value (RAX, RDX)"]
        );
        assert_eq!(recorded(&t), Some("return values"));
    }
}
