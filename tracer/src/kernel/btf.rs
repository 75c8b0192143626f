//! The kernel's own type information, BTF (`CONFIG_DEBUG_INFO_BTF`): the
//! `.BTF` section of the image, which a bzImage's payload keeps too, so a
//! bzImage alone tells where a structure's members are. Parsed by btf-rs
//! (written for retis); this module answers the few questions vmtrace asks:
//! a member's byte offset (through anonymous structs and unions, as C
//! reaches them), and a per-CPU variable's offset in the per-CPU area.

use std::path::{Path, PathBuf};

use btf_rs::{Btf, Type};
use object::{Object, ObjectSection};

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
        let btf = Btf::from_bytes(data).map_err(|source| BtfError::Parse {
            path: path.to_owned(),
            source,
        })?;
        Ok(KernelBtf {
            btf,
            path: path.to_owned(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
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
