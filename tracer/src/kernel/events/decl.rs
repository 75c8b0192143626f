//! An event's arguments as C declares them (`struct task_struct *prev`),
//! from the BTF function prototype its tracepoint is called with: the
//! function `__traceiter_NAME` (include/linux/tracepoint.h), else the
//! typedef `btf_trace_NAME` (include/trace/bpf_probe.h, with
//! CONFIG_BPF_EVENTS). Both take `void *__data` first, which is
//! the probe's own data, not the event's: it is left out.

use btf_rs::{Btf, BtfType, Type};

use crate::kernel::btf::KernelBtf;
use crate::kernel::events::EventArg;

/// Typedefs, pointers and qualifiers deeper than this are not followed.
const MAX_DEPTH: u32 = 16;

/// The arguments of tracepoint `name` after the first `void *`, or None
/// when BTF has neither prototype.
pub(crate) fn tracepoint_args(btf: &KernelBtf, name: &str) -> Option<Vec<EventArg>> {
    let types = btf.types();
    // The function names its parameters; the typedef's are nameless.
    let proto = func_proto(types, &format!("__traceiter_{name}"))
        .or_else(|| typedef_proto(types, &format!("btf_trace_{name}")))?;
    let args = proto
        .parameters
        .iter()
        .skip(1)
        .enumerate()
        .map(|(i, p)| {
            let name = match types.resolve_name(p) {
                Ok(n) if !n.is_empty() => n,
                _ => format!("arg{}", i + 1),
            };
            let ty = types
                .resolve_chained_type(p)
                .map(|t| c_type(types, t, 0))
                .unwrap_or_else(|_| "?".into());
            EventArg { ty, name }
        })
        .collect();
    Some(args)
}

/// `typedef void (*NAME)(...)`'s prototype.
fn typedef_proto(types: &Btf, name: &str) -> Option<btf_rs::FuncProto> {
    types
        .resolve_types_by_name(name)
        .ok()?
        .into_iter()
        .find_map(|t| {
            let Type::Typedef(td) = t else { return None };
            let Type::Ptr(p) = types.resolve_chained_type(&td).ok()? else {
                return None;
            };
            match types.resolve_chained_type(&p).ok()? {
                Type::FuncProto(fp) => Some(fp),
                _ => None,
            }
        })
}

/// Function `NAME`'s prototype.
fn func_proto(types: &Btf, name: &str) -> Option<btf_rs::FuncProto> {
    types
        .resolve_types_by_name(name)
        .ok()?
        .into_iter()
        .find_map(|t| {
            let Type::Func(f) = t else { return None };
            match types.resolve_chained_type(&f).ok()? {
                Type::FuncProto(fp) => Some(fp),
                _ => None,
            }
        })
}

/// The name BTF gives a type (empty for anonymous ones).
fn named(types: &Btf, t: &dyn BtfType) -> String {
    types.resolve_name(t).unwrap_or_default()
}

/// Type `t` as C writes it before a declarator: `unsigned int`, `struct
/// task_struct *`, `const char *`.
fn c_type(types: &Btf, t: Type, depth: u32) -> String {
    if depth > MAX_DEPTH {
        return "?".into();
    }
    let inner = |t: &dyn BtfType| {
        types
            .resolve_chained_type(t)
            .map(|i| c_type(types, i, depth + 1))
            .unwrap_or_else(|_| "void".into())
    };
    let tagged = |kw: &str, name: String| match name.is_empty() {
        true => format!("{kw} (anonymous)"),
        false => format!("{kw} {name}"),
    };
    match t {
        Type::Void => "void".into(),
        Type::Int(i) => named(types, &i),
        Type::Float(f) => named(types, &f),
        Type::Typedef(td) => named(types, &td),
        Type::Struct(s) => tagged("struct", named(types, &s)),
        Type::Union(u) => tagged("union", named(types, &u)),
        Type::Enum(e) => tagged("enum", named(types, &e)),
        Type::Enum64(e) => tagged("enum", named(types, &e)),
        Type::Fwd(f) => tagged(
            if f.is_union() { "union" } else { "struct" },
            named(types, &f),
        ),
        Type::Ptr(p) => {
            let to = types.resolve_chained_type(&p);
            match to {
                Ok(Type::FuncProto(_)) => "void (*)(void)".into(),
                _ => {
                    let base = inner(&p);
                    match base.ends_with('*') {
                        true => format!("{base}*"),
                        false => format!("{base} *"),
                    }
                }
            }
        }
        Type::Const(c) => format!("const {}", inner(&c)),
        Type::Volatile(v) => format!("volatile {}", inner(&v)),
        Type::Restrict(r) => inner(&r),
        Type::TypeTag(t) => inner(&t),
        Type::Array(a) => format!("{}[{}]", inner(&a), a.len()),
        _ => "?".into(),
    }
}
