//! A traced function's prototype as vmtrace shows its values: what the
//! kernel's BTF says of its arguments and return value, mapped onto the
//! x86-64 argument registers (`btf::KernelBtf::prototype`). Traces keep
//! it (`trace::model::Trace::prototypes`), so they print without the BTF.

/// Arguments passed in registers by the x86-64 calling convention.
pub const ARG_REGS: usize = 6;

/// How a note of `Prototype::unshown` about the return value starts.
pub const RETURN_NOTE: &str = "return value:";

/// How one C value (an argument, a return value) is shown, from the
/// kernel's BTF.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ValueKind {
    /// A signed integer of this many bytes (1, 2, 4, 8): decimal.
    Signed(u8),
    /// An unsigned integer of this many bytes: decimal.
    Unsigned(u8),
    Bool,
    Char,
    /// Any pointer: hex.
    Pointer,
    /// An enum of this many bytes: by name where one matches.
    Enum {
        size: u8,
        signed: bool,
        names: Vec<(i64, String)>,
    },
    /// No value (a `void` function's return).
    Void,
}

/// One argument a prototype shows: its name and kind, and which argument
/// register holds it (0 = RDI ... 5 = R9).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Param {
    pub name: String,
    pub kind: ValueKind,
    pub reg: u8,
}

/// A traced function's prototype, as far as registers show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prototype {
    /// The arguments held in the six argument registers, in order.
    pub params: Vec<Param>,
    pub ret: ValueKind,
    /// What cannot be shown, said once per function (e.g. "p: a struct
    /// passed by value", "a7: not in a register"; a note on the return
    /// value starts with `RETURN_NOTE`); empty: everything.
    pub unshown: Vec<String>,
}

/// The argument registers of the x86-64 calling convention, in order.
pub const ARG_REG_NAMES: [&str; ARG_REGS] = ["RDI", "RSI", "RDX", "RCX", "R8", "R9"];

/// How the x86-64 SysV calling convention passes one C type (the
/// kernel's: integers, pointers and small structs in general registers),
/// whichever debug format described it (BTF, DWARF).
pub(crate) enum Passed {
    /// In one general register, shown as this kind.
    Shown(ValueKind),
    /// In `n` general registers (a struct or union of up to 16 bytes, a
    /// 128-bit integer), not shown: what it is.
    Regs(u8, String),
    /// On the stack whatever registers are free (a struct of more than
    /// 16 bytes): what it is.
    Memory(String),
    /// In an SSE register (floating point): what it is.
    Sse(String),
    /// No register (an empty struct; a `void` return).
    Nothing,
}

/// One parameter of a prototype, as its debug format declares it.
pub(crate) enum Arg {
    Named(String, Passed),
    /// `...`: the last.
    Variadic,
}

/// A function returning `ret` and taking `args`, mapped onto the
/// argument registers as the calling convention assigns them.
pub(crate) fn in_registers(ret: Passed, args: Vec<Arg>) -> Prototype {
    let mut unshown = Vec::new();
    let mut next = 0u8;
    let ret = match ret {
        Passed::Shown(k) => k,
        Passed::Regs(_, what) => {
            unshown.push(format!("{RETURN_NOTE} {what} (RAX, RDX)"));
            ValueKind::Void
        }
        Passed::Memory(what) => {
            // The caller passes where to put it in RDI.
            unshown.push(format!(
                "{RETURN_NOTE} {what}, returned in memory (its address in RDI)"
            ));
            next = 1;
            ValueKind::Void
        }
        Passed::Sse(what) => {
            unshown.push(format!("{RETURN_NOTE} {what} (XMM0)"));
            ValueKind::Void
        }
        Passed::Nothing => ValueKind::Void,
    };
    let mut params = Vec::new();
    let regs = |from: u8, n: u8| ARG_REG_NAMES[from as usize..(from + n) as usize].join(", ");
    for arg in args {
        let (name, passed) = match arg {
            Arg::Named(name, passed) => (name, passed),
            Arg::Variadic => {
                unshown.push("...: variadic arguments".into());
                break;
            }
        };
        match passed {
            Passed::Shown(kind) if (next as usize) < ARG_REGS => {
                params.push(Param {
                    name,
                    kind,
                    reg: next,
                });
                next += 1;
            }
            Passed::Shown(_) => {
                unshown.push(format!("{name}: not in a register (on the stack)"));
            }
            Passed::Regs(n, what) if next as usize + n as usize <= ARG_REGS => {
                unshown.push(format!("{name}: {what} ({})", regs(next, n)));
                next += n;
            }
            Passed::Regs(_, what) | Passed::Memory(what) => {
                // A struct that does not fit the registers left goes
                // whole on the stack; later arguments still take them.
                unshown.push(format!("{name}: {what} (on the stack)"));
            }
            Passed::Sse(what) => unshown.push(format!("{name}: {what} (in an SSE register)")),
            Passed::Nothing => {}
        }
    }
    Prototype {
        params,
        ret,
        unshown,
    }
}
