//! The kernel's own type information, BTF (`CONFIG_DEBUG_INFO_BTF`): the
//! `.BTF` section of the image, which a bzImage's payload keeps too, so a
//! bzImage alone tells where a structure's members are. Parsed by btf-rs
//! (written for retis); this module answers the few questions vmtrace asks:
//! a member's byte offset (through anonymous structs and unions, as C
//! reaches them), a per-CPU variable's offset in the per-CPU area, and a
//! function's prototype as its argument registers hold it (`prototype`).

use std::path::{Path, PathBuf};

use btf_rs::{Btf, Type};
use object::{Object, ObjectSection};

use crate::kernel::prototype::{in_registers, Arg, Passed, Prototype, ValueKind};
use crate::kernel::symbols::KernelImage;

/// The ELF section pahole writes BTF into (and the kernel links into its
/// read-only data, between `__start_BTF` and `__stop_BTF`).
pub const BTF_SECTION: &str = ".BTF";
/// The section x86-64 Linux links per-CPU variables into; pahole describes
/// its variables in a BTF DATASEC of this name.
pub const PERCPU_SECTION: &str = ".data..percpu";

/// Why the kernel's types could not be read, or lack something.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error(
        "{} has no BTF ({BTF_SECTION} section): build the kernel with CONFIG_DEBUG_INFO_BTF=y \
         (needs pahole, Debian's dwarves)",
        path.display()
    )]
    Missing { path: PathBuf },
    #[error("the BTF of {} does not parse: {source}", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: btf_rs::Error,
    },
    #[error("the BTF of {} has no struct {name}", path.display())]
    NoStruct { path: PathBuf, name: String },
    #[error("the BTF of {}: struct {ty} has no member {member}", path.display())]
    NoMember {
        path: PathBuf,
        ty: String,
        member: String,
    },
    #[error("the BTF of {}: {what}", path.display())]
    Broken { path: PathBuf, what: String },
}

/// A kernel's BTF, with the file it came from (for messages).
pub struct KernelBtf {
    btf: Btf,
    path: PathBuf,
}

impl std::fmt::Debug for KernelBtf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelBtf")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// Where a member lies in its structure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberAt {
    /// Byte offset from the start of the outermost structure.
    pub offset: u32,
    /// Its size in bytes.
    pub size: u32,
}

impl KernelBtf {
    /// The BTF of a loaded kernel image (a vmlinux, or a bzImage's payload).
    pub fn from_image(image: &KernelImage) -> Result<KernelBtf, BtfError> {
        let bytes = &image.bytes;
        let missing = || BtfError::Missing {
            path: image.path.clone(),
        };
        let file = object::File::parse(bytes.as_slice()).map_err(|_| missing())?;
        let section = file.section_by_name(BTF_SECTION).ok_or_else(missing)?;
        let data = section.data().map_err(|_| missing())?;
        if data.is_empty() {
            return Err(missing());
        }
        KernelBtf::from_bytes(&image.path, data)
    }

    /// BTF from the raw bytes of a `.BTF` section of the file at `path`.
    pub fn from_bytes(path: &Path, data: &[u8]) -> Result<KernelBtf, BtfError> {
        KernelBtf::parsed(path, Btf::from_bytes(data))
    }

    /// `btf` parsed from the file at `path`, or why not.
    fn parsed(path: &Path, btf: btf_rs::Result<Btf>) -> Result<KernelBtf, BtfError> {
        let btf = btf.map_err(|source| BtfError::Parse {
            path: path.to_owned(),
            source,
        })?;
        Ok(KernelBtf {
            btf,
            path: path.to_owned(),
        })
    }

    /// A module's split BTF (its `.BTF` section, `data`, whose type ids
    /// and strings continue `base`'s: the vmlinux's), named `path` in
    /// messages.
    pub fn split_from_bytes(
        path: &Path,
        data: &[u8],
        base: &KernelBtf,
    ) -> Result<KernelBtf, BtfError> {
        KernelBtf::parsed(path, Btf::from_split_bytes(data, &base.btf))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The parsed types themselves, for readers of whole declarations
    /// (`crate::kernel::events::decl`).
    pub(crate) fn types(&self) -> &Btf {
        &self.btf
    }

    fn broken(&self, what: impl Into<String>) -> BtfError {
        BtfError::Broken {
            path: self.path.clone(),
            what: what.into(),
        }
    }

    /// The struct named `name` (the first complete one: BTF may also hold
    /// forward declarations of the same name).
    fn strukt(&self, name: &str) -> Result<btf_rs::Struct, BtfError> {
        let types = self.btf.resolve_types_by_name(name).unwrap_or_default();
        types
            .into_iter()
            .find_map(|t| match t {
                Type::Struct(s) => Some(s),
                _ => None,
            })
            .ok_or_else(|| BtfError::NoStruct {
                path: self.path.clone(),
                name: name.to_owned(),
            })
    }

    /// Skips typedefs and qualifiers to the type they name.
    fn strip(&self, mut t: Type) -> Result<Type, BtfError> {
        for _ in 0..32 {
            match t {
                Type::Typedef(_)
                | Type::Volatile(_)
                | Type::Const(_)
                | Type::Restrict(_)
                | Type::TypeTag(_) => {
                    let inner = t.as_btf_type().expect("these kinds refer to a type");
                    t = self
                        .btf
                        .resolve_chained_type(inner)
                        .map_err(|e| self.broken(format!("a typedef's type: {e}")))?;
                }
                _ => return Ok(t),
            }
        }
        Err(self.broken("a chain of typedefs 32 deep"))
    }

    /// The size in bytes of type `t`, where BTF states one.
    fn size_of(&self, t: Type) -> Option<u32> {
        let size = match self.strip(t).ok()? {
            Type::Int(i) => i.size(),
            Type::Ptr(_) => 8,
            Type::Struct(s) | Type::Union(s) => s.size(),
            Type::Enum(e) => e.size(),
            Type::Enum64(e) => e.size(),
            Type::Float(f) => f.size(),
            Type::Array(a) => {
                let elem = self.btf.resolve_chained_type(&a).ok()?;
                self.size_of(elem)? as usize * a.len()
            }
            _ => return None,
        };
        u32::try_from(size).ok()
    }

    /// Finds `member` in `s`, looking inside anonymous struct and union
    /// members as C does; the offset is from the start of `s`.
    fn find_member(&self, s: &btf_rs::Struct, member: &str, depth: u32) -> Option<MemberAt> {
        if depth > 8 {
            return None;
        }
        for m in &s.members {
            let name = self.btf.resolve_name(m).unwrap_or_default();
            let base = m.bit_offset() / 8;
            let ty = self.btf.resolve_chained_type(m).ok();
            if name == member {
                let size = ty.and_then(|t| self.size_of(t)).unwrap_or(0);
                return Some(MemberAt { offset: base, size });
            }
            if name.is_empty() {
                if let Some(Type::Struct(inner) | Type::Union(inner)) =
                    ty.and_then(|t| self.strip(t).ok())
                {
                    if let Some(found) = self.find_member(&inner, member, depth + 1) {
                        return Some(MemberAt {
                            offset: base + found.offset,
                            size: found.size,
                        });
                    }
                }
            }
        }
        None
    }

    /// Where `member` is in `struct ty`.
    pub fn member(&self, ty: &str, member: &str) -> Result<MemberAt, BtfError> {
        let s = self.strukt(ty)?;
        self.find_member(&s, member, 0)
            .ok_or_else(|| BtfError::NoMember {
                path: self.path.clone(),
                ty: ty.to_owned(),
                member: member.to_owned(),
            })
    }

    /// The width in bits of the direct member `member` of `struct ty` when
    /// it is a bitfield, None when it is not (how the ORC unwinder tells
    /// `struct orc_entry`'s layouts apart).
    pub fn bitfield_bits(&self, ty: &str, member: &str) -> Result<Option<u32>, BtfError> {
        let s = self.strukt(ty)?;
        let m = s
            .members
            .iter()
            .find(|m| self.btf.resolve_name(*m).is_ok_and(|n| n == member))
            .ok_or_else(|| BtfError::NoMember {
                path: self.path.clone(),
                ty: ty.to_owned(),
                member: member.to_owned(),
            })?;
        Ok(m.bitfield_size().filter(|&bits| bits != 0))
    }

    /// The size in bytes of `struct name` (e.g. to step through an array
    /// of them).
    pub fn struct_size(&self, name: &str) -> Result<u32, BtfError> {
        let s = self.strukt(name)?;
        u32::try_from(s.size()).map_err(|_| self.broken(format!("struct {name}'s size")))
    }

    /// Every enumerator, with its value, of the enum (named or not) that
    /// declares enumerator `name`: e.g. the kernel's anonymous `enum {
    /// FTRACE_FL_... }` as this build has it. Scans every type: call it
    /// before a guest stop, not in one.
    pub fn enum_declaring(&self, name: &str) -> Option<Vec<(String, u64)>> {
        let named = |n: &dyn btf_rs::BtfType| self.btf.resolve_name(n).unwrap_or_default();
        (1u32..)
            .map_while(|id| self.btf.resolve_type_by_id(id).ok())
            .map(|t| match t {
                Type::Enum(e) => e
                    .members
                    .iter()
                    .map(|m| (named(m), u64::from(m.val())))
                    .collect(),
                Type::Enum64(e) => e.members.iter().map(|m| (named(m), m.val())).collect(),
                _ => Vec::new(),
            })
            .find(|members| members.iter().any(|(n, _)| n == name))
    }

    /// Whether the BTF has a struct named `name`.
    pub fn has_struct(&self, name: &str) -> bool {
        self.strukt(name).is_ok()
    }

    /// The offset of per-CPU variable `name` in the per-CPU section (its
    /// symbol's value up to Linux 6.14, where the section is linked at 0),
    /// from the section's DATASEC; None if BTF does not describe it.
    pub fn percpu_offset(&self, name: &str) -> Option<u32> {
        let secs = self.btf.resolve_types_by_name(PERCPU_SECTION).ok()?;
        secs.into_iter().find_map(|t| {
            let Type::Datasec(d) = t else { return None };
            d.variables.iter().find_map(|v| {
                let var = self.btf.resolve_chained_type(v).ok()?;
                let Type::Var(var) = var else { return None };
                (self.btf.resolve_name(&var).ok()? == name).then(|| v.offset())
            })
        })
    }
}

impl KernelBtf {
    /// The prototype of function `function` as its argument registers hold
    /// it (the BTF `FUNC` of that name and its `FUNC_PROTO`): each
    /// parameter passed in one of the six argument registers, with the
    /// register (structs and unions by value take one register up to 8
    /// bytes and two up to 16, none beyond: those go on the stack, as do
    /// parameters past the sixth register), and the return type. What
    /// cannot be shown is said in `unshown`. None when BTF has no such
    /// function (a GCC clone such as `f.isra.0` has another calling
    /// convention and no BTF of its own), or has several of that name
    /// (static functions of several files) that differ.
    pub fn prototype(&self, function: &str) -> Option<Prototype> {
        let types = self.btf.resolve_types_by_name(function).ok()?;
        self.one_prototype(types)
    }

    /// `prototype`, from the `FUNC`s of a split BTF's own part only (a
    /// module's, `split_from_bytes`): never its base's, whose function of
    /// the same name is another (a vmlinux function a module's static
    /// function shares a name with). None for a BTF that is not split.
    pub fn own_prototype(&self, function: &str) -> Option<Prototype> {
        let own = self.btf.split()?.resolve_types_by_name(function).ok()?;
        self.one_prototype(own)
    }

    /// The one prototype of the `FUNC`s among `types` (see `prototype`).
    fn one_prototype(&self, types: Vec<Type>) -> Option<Prototype> {
        let mut found: Option<Prototype> = None;
        for t in types {
            let Type::Func(f) = t else { continue };
            let Ok(Type::FuncProto(fp)) = self.btf.resolve_chained_type(&f) else {
                continue;
            };
            let p = self.func_proto(&fp)?;
            match &found {
                Some(q) if *q != p => return None,
                Some(_) => {}
                None => found = Some(p),
            }
        }
        found
    }

    /// A `FUNC_PROTO` as registers hold it (see `prototype`).
    fn func_proto(&self, fp: &btf_rs::FuncProto) -> Option<Prototype> {
        let ret = match fp.return_type_id() {
            0 => Passed::Nothing,
            id => self.passed(self.btf.resolve_type_by_id(id).ok()?)?,
        };
        let mut args = Vec::new();
        for (i, p) in fp.parameters.iter().enumerate() {
            if p.is_variadic() {
                args.push(Arg::Variadic);
                break;
            }
            let name = match self.btf.resolve_name(p) {
                Ok(n) if !n.is_empty() => n,
                _ => format!("arg{}", i + 1),
            };
            let t = self.btf.resolve_chained_type(p).ok()?;
            args.push(Arg::Named(name, self.passed(t)?));
        }
        Some(in_registers(ret, args))
    }

    /// How a value of type `t` is passed (and returned); None for a type
    /// no value can have (a forward declaration, a function).
    fn passed(&self, t: Type) -> Option<Passed> {
        let t = self.strip(t).ok()?;
        let union = matches!(t, Type::Union(_));
        Some(match t {
            Type::Int(i) => {
                let size = i.size();
                if size == 16 {
                    return Some(Passed::Regs(2, "a 128-bit integer".into()));
                }
                let size = u8::try_from(size)
                    .ok()
                    .filter(|s| [1, 2, 4, 8].contains(s))?;
                let name = self.btf.resolve_name(&i).unwrap_or_default();
                Passed::Shown(if i.is_bool() {
                    ValueKind::Bool
                } else if i.is_char() || name == "char" {
                    ValueKind::Char
                } else if i.is_signed() {
                    ValueKind::Signed(size)
                } else {
                    ValueKind::Unsigned(size)
                })
            }
            Type::Ptr(_) => Passed::Shown(ValueKind::Pointer),
            Type::Enum(e) => {
                let signed = e.is_signed();
                let names = e
                    .members
                    .iter()
                    .map(|m| {
                        let v = match signed {
                            true => i64::from(m.val() as i32),
                            false => i64::from(m.val()),
                        };
                        (v, self.btf.resolve_name(m).unwrap_or_default())
                    })
                    .collect();
                Passed::Shown(ValueKind::Enum {
                    size: u8::try_from(e.size()).ok()?,
                    signed,
                    names,
                })
            }
            Type::Enum64(e) => {
                let names = e
                    .members
                    .iter()
                    .map(|m| (m.val() as i64, self.btf.resolve_name(m).unwrap_or_default()))
                    .collect();
                Passed::Shown(ValueKind::Enum {
                    size: u8::try_from(e.size()).ok()?,
                    signed: e.is_signed(),
                    names,
                })
            }
            Type::Struct(s) | Type::Union(s) => {
                let what = if union { "a union" } else { "a struct" };
                match s.size() {
                    0 => Passed::Nothing,
                    1..=8 => Passed::Regs(1, format!("{what} passed by value")),
                    9..=16 => Passed::Regs(2, format!("{what} passed by value")),
                    n => Passed::Memory(format!("{what} of {n} bytes passed by value")),
                }
            }
            Type::Float(f) => Passed::Sse(format!("a {}-byte floating-point value", f.size())),
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::prototype::Param;

    /// The mini guest's BTF (`guest/build.sh mini`), or None (skipped).
    fn mini() -> Option<KernelBtf> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest/out/mini.elf");
        if !path.is_file() {
            eprintln!(
                "SKIPPED: {} is not built; run `bash guest/build.sh mini`",
                path.display()
            );
            return None;
        }
        let image = KernelImage::load(&path).unwrap();
        Some(KernelBtf::from_image(&image).unwrap())
    }

    fn p(name: &str, kind: ValueKind, reg: u8) -> Param {
        Param {
            name: name.into(),
            kind,
            reg,
        }
    }

    #[test]
    fn the_btf_can_be_shared_between_threads() {
        fn shared<T: Send + Sync>() {}
        shared::<KernelBtf>();
    }

    /// The args=1 functions of guest/mini/workload.c, as their registers
    /// hold them.
    #[test]
    fn mini_prototypes_follow_the_calling_convention() {
        let Some(btf) = mini() else { return };
        let state = ValueKind::Enum {
            size: 4,
            signed: false,
            names: vec![
                (0, "MINI_STATE_IDLE".into()),
                (1, "MINI_STATE_RUNNING".into()),
                (2, "MINI_STATE_SLEEPING".into()),
                (64, "MINI_STATE_DEAD".into()),
            ],
        };
        assert_eq!(
            btf.prototype("args_six"),
            Some(Prototype {
                params: vec![
                    p("a", ValueKind::Unsigned(8), 0),
                    p("b", ValueKind::Signed(4), 1),
                    p("t", ValueKind::Pointer, 2),
                    p("s", state, 3),
                    p("ch", ValueKind::Unsigned(1), 4),
                    p("e", ValueKind::Signed(8), 5),
                ],
                ret: ValueKind::Signed(8),
                unshown: Vec::new(),
            })
        );
        assert_eq!(
            btf.prototype("args_errno"),
            Some(Prototype {
                params: vec![p("n", ValueKind::Unsigned(4), 0)],
                ret: ValueKind::Signed(4),
                unshown: Vec::new(),
            })
        );
        assert_eq!(
            btf.prototype("args_void"),
            Some(Prototype {
                params: vec![p("n", ValueKind::Unsigned(8), 0)],
                ret: ValueKind::Void,
                unshown: Vec::new(),
            })
        );
        // struct mini_pair (16 bytes) in RDI and RSI, `after` in RDX.
        assert_eq!(
            btf.prototype("args_struct"),
            Some(Prototype {
                params: vec![p("after", ValueKind::Signed(4), 2)],
                ret: ValueKind::Signed(8),
                unshown: vec!["p: a struct passed by value (RDI, RSI)".into()],
            })
        );
        // The seventh on the stack.
        let seven = btf.prototype("args_seven").unwrap();
        let names: Vec<(&str, u8)> = seven
            .params
            .iter()
            .map(|q| (q.name.as_str(), q.reg))
            .collect();
        assert_eq!(
            names,
            [
                ("a1", 0),
                ("a2", 1),
                ("a3", 2),
                ("a4", 3),
                ("a5", 4),
                ("a6", 5)
            ]
        );
        assert_eq!(seven.params[0].kind, ValueKind::Signed(4));
        assert_eq!(seven.params[5].kind, ValueKind::Unsigned(8));
        assert_eq!(seven.unshown, ["a7: not in a register (on the stack)"]);
        assert_eq!(seven.ret, ValueKind::Signed(8));
        // Not a function of the guest.
        assert_eq!(btf.prototype("no_such_function"), None);
        assert_eq!(btf.prototype("mini_pair"), None);
    }
}
