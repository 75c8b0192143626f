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
