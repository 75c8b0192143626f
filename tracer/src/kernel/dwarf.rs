//! Structure layouts from a kernel's DWARF (`.debug_info`), for kernels
//! built without BTF: where a member of a named struct lies and how big it
//! is, as `KernelBtf::member` answers it. Only what the task layout asks:
//! the first complete (non-declaration) struct of the name at the top of a
//! compilation unit, its members, anonymous struct and union members
//! followed. Units are read one at a time and the search stops at the
//! first match: `struct task_struct` is in one of a vmlinux's first units
//! (nearly every file includes `<linux/sched.h>`), so a 100 MB vmlinux
//! answers in milliseconds.

use std::borrow::Cow;
use std::path::PathBuf;

use gimli::{AttributeValue, EndianSlice, LittleEndian, Reader as _, UnitOffset};
use object::{Object, ObjectSection};

use crate::kernel::btf::MemberAt;
use crate::kernel::symbols::KernelImage;

pub(crate) type R<'a> = EndianSlice<'a, LittleEndian>;
pub(crate) type Unit<'a> = gimli::Unit<R<'a>>;

/// The section whose absence means the kernel has no DWARF.
pub const DWARF_SECTION: &str = ".debug_info";

/// How deep anonymous members and type chains are followed.
const MAX_DEPTH: u32 = 16;

/// Why the kernel's DWARF could not be read, or lacks something.
#[derive(Debug, thiserror::Error)]
pub enum DwarfError {
    #[error(
        "{} has no DWARF ({DWARF_SECTION} section): build the kernel with CONFIG_DEBUG_INFO=y",
        path.display()
    )]
    Missing { path: PathBuf },
    #[error("the DWARF of {} does not parse: {source}", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: gimli::Error,
    },
    #[error("the DWARF of {} has no struct {name}", path.display())]
    NoStruct { path: PathBuf, name: String },
    #[error("the DWARF of {}: struct {ty} has no member {member}", path.display())]
    NoMember {
        path: PathBuf,
        ty: String,
        member: String,
    },
    #[error("the DWARF of {}: {what}", path.display())]
    Broken { path: PathBuf, what: String },
}

/// A kernel's DWARF sections (borrowed from the image unless compressed),
/// with the file they came from (for messages).
pub struct KernelDwarf<'a> {
    sections: gimli::DwarfSections<Cow<'a, [u8]>>,
    path: PathBuf,
}

impl std::fmt::Debug for KernelDwarf<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelDwarf")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl<'a> KernelDwarf<'a> {
    /// The DWARF of a loaded kernel image (a vmlinux built with
    /// CONFIG_DEBUG_INFO, or any ELF built with `-g`).
    pub fn from_image(image: &'a KernelImage) -> Result<KernelDwarf<'a>, DwarfError> {
        let path = image.path.clone();
        let missing = || DwarfError::Missing { path: path.clone() };
        let file = object::File::parse(image.bytes.as_slice()).map_err(|_| missing())?;
        match file.section_by_name(DWARF_SECTION) {
            Some(s) if s.size() > 0 => {}
            _ => return Err(missing()),
        }
        let sections = gimli::DwarfSections::load(|id| {
            let Some(s) = file.section_by_name(id.name()) else {
                return Ok(Cow::Borrowed(&[][..]));
            };
            s.uncompressed_data().map_err(|e| DwarfError::Broken {
                path: path.clone(),
                what: format!("section {}: {e}", id.name()),
            })
        })?;
        Ok(KernelDwarf { sections, path })
    }

    /// The DWARF of a relocatable object (a module's `.ko`, built with
    /// `-g`), its relocations applied: in such a file each reference to
    /// another debug section (`DW_FORM_strp`, the abbreviations' offset)
    /// is 0 plus an addend in `.rela.debug_*`.
    pub fn from_relocatable(path: &std::path::Path, bytes: &'a [u8]) -> Result<Self, DwarfError> {
        let path = path.to_path_buf();
        let missing = || DwarfError::Missing { path: path.clone() };
        let file = object::File::parse(bytes).map_err(|_| missing())?;
        match file.section_by_name(DWARF_SECTION) {
            Some(s) if s.size() > 0 => {}
            _ => return Err(missing()),
        }
        let broken = |what: String| DwarfError::Broken {
            path: path.clone(),
            what,
        };
        let sections = gimli::DwarfSections::load(|id| {
            let Some(s) = file.section_by_name(id.name()) else {
                return Ok(Cow::Borrowed(&[][..]));
            };
            let data = s
                .uncompressed_data()
                .map_err(|e| broken(format!("section {}: {e}", id.name())))?;
            let map = s
                .relocation_map()
                .map_err(|e| broken(format!("section {}'s relocations: {e}", id.name())))?;
            let mut data = data.into_owned();
            for (at, r) in s.relocations() {
                let (at, width) = (at as usize, usize::from(r.size() / 8));
                let Some(field) = data.get_mut(at..at + width).filter(|_| width <= 8) else {
                    return Err(broken(format!("a relocation at {at:#x} of {}", id.name())));
                };
                let mut word = [0u8; 8];
                word[..width].copy_from_slice(field);
                let value = map.relocate(at as u64, u64::from_le_bytes(word));
                field.copy_from_slice(&value.to_le_bytes()[..width]);
            }
            Ok(Cow::Owned(data))
        })?;
        Ok(KernelDwarf { sections, path })
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// The sections, for readers of other entries than structs
    /// (`crate::kernel::dwarf_prototype`).
    pub(crate) fn sections(&self) -> gimli::Dwarf<R<'_>> {
        self.sections.borrow(|s| EndianSlice::new(s, LittleEndian))
    }

    pub(crate) fn parse(&self, source: gimli::Error) -> DwarfError {
        DwarfError::Parse {
            path: self.path.clone(),
            source,
        }
    }

    /// Where `member` is in `struct ty`: the first complete `struct ty`.
    pub fn member(&self, ty: &str, member: &str) -> Result<MemberAt, DwarfError> {
        let dwarf = self.sections.borrow(|s| EndianSlice::new(s, LittleEndian));
        let (unit, at) = self.strukt(&dwarf, ty)?;
        let found = find_member(&dwarf, &unit, at, member, 0).map_err(|e| self.parse(e))?;
        let (offset, ty_at) = found.ok_or_else(|| DwarfError::NoMember {
            path: self.path.clone(),
            ty: ty.to_owned(),
            member: member.to_owned(),
        })?;
        let size = type_size(&unit, ty_at, 0)
            .map_err(|e| self.parse(e))?
            .ok_or_else(|| DwarfError::Broken {
                path: self.path.clone(),
                what: format!("struct {ty}: member {member} has no size"),
            })?;
        Ok(MemberAt {
            offset: u32::try_from(offset).map_err(|_| DwarfError::Broken {
                path: self.path.clone(),
                what: format!("struct {ty}: member {member} at offset {offset}"),
            })?,
            size: u32::try_from(size).unwrap_or(u32::MAX),
        })
    }

    /// The unit holding the first complete `struct name`, and its entry.
    fn strukt<'d>(
        &self,
        dwarf: &gimli::Dwarf<R<'d>>,
        name: &str,
    ) -> Result<(Unit<'d>, UnitOffset), DwarfError> {
        let mut units = dwarf.units();
        while let Some(header) = units.next().map_err(|e| self.parse(e))? {
            let unit = dwarf.unit(header).map_err(|e| self.parse(e))?;
            if let Some(at) = find_struct(dwarf, &unit, name).map_err(|e| self.parse(e))? {
                return Ok((unit, at));
            }
        }
        Err(DwarfError::NoStruct {
            path: self.path.clone(),
            name: name.to_owned(),
        })
    }
}

/// The first complete `struct name` among the unit's top-level entries.
fn find_struct(
    dwarf: &gimli::Dwarf<R<'_>>,
    unit: &Unit<'_>,
    name: &str,
) -> gimli::Result<Option<UnitOffset>> {
    let mut tree = unit.entries_tree(None)?;
    let mut children = tree.root()?.children();
    while let Some(child) = children.next()? {
        let e = child.entry();
        if e.tag() != gimli::DW_TAG_structure_type
            || matches!(
                e.attr_value(gimli::DW_AT_declaration),
                Some(AttributeValue::Flag(true))
            )
        {
            continue;
        }
        if let Some(n) = e.attr_value(gimli::DW_AT_name) {
            if dwarf.attr_string(unit, n)?.slice() == name.as_bytes() {
                return Ok(Some(e.offset()));
            }
        }
    }
    Ok(None)
}

/// `member` of the struct or union at `at`: its offset from `at`'s start
/// and its type's entry, looking into anonymous struct and union members.
fn find_member(
    dwarf: &gimli::Dwarf<R<'_>>,
    unit: &Unit<'_>,
    at: UnitOffset,
    member: &str,
    depth: u32,
) -> gimli::Result<Option<(u64, UnitOffset)>> {
    if depth > MAX_DEPTH {
        return Ok(None);
    }
    let mut tree = unit.entries_tree(Some(at))?;
    let mut children = tree.root()?.children();
    while let Some(child) = children.next()? {
        let e = child.entry();
        if e.tag() != gimli::DW_TAG_member {
            continue;
        }
        let Some(ty) = e
            .attr_value(gimli::DW_AT_type)
            .and_then(|v| type_ref(unit, v))
        else {
            continue;
        };
        // Union members have no location: they start at 0.
        let base = match e.attr_value(gimli::DW_AT_data_member_location) {
            Some(v) => location(v)?,
            None => 0,
        };
        match e.attr_value(gimli::DW_AT_name) {
            Some(n) => {
                if dwarf.attr_string(unit, n)?.slice() == member.as_bytes() {
                    return Ok(Some((base, ty)));
                }
            }
            None => {
                let (tag, inner) = strip(unit, ty, depth)?;
                if tag == gimli::DW_TAG_structure_type || tag == gimli::DW_TAG_union_type {
                    if let Some((off, t)) = find_member(dwarf, unit, inner, member, depth + 1)? {
                        return Ok(Some((base + off, t)));
                    }
                }
            }
        }
    }
    Ok(None)
}

/// A member's byte offset: a constant, or (DWARF 2) `DW_OP_plus_uconst N`.
fn location(v: AttributeValue<R<'_>>) -> gimli::Result<u64> {
    if let AttributeValue::Exprloc(expr) = v {
        let mut r = expr.0;
        if r.read_u8()? == gimli::DW_OP_plus_uconst.0 {
            return r.read_uleb128();
        }
        return Err(gimli::Error::UnsupportedEvaluation);
    }
    v.udata_value().ok_or(gimli::Error::TypeMismatch)
}

/// A type reference within the unit.
pub(crate) fn type_ref(unit: &Unit<'_>, v: AttributeValue<R<'_>>) -> Option<UnitOffset> {
    match v {
        AttributeValue::UnitRef(o) => Some(o),
        AttributeValue::DebugInfoRef(o) => o.to_unit_offset(&unit.header),
        _ => None,
    }
}

/// Whether `tag` names a type qualifier or alias, not a type of its own.
fn is_alias(tag: gimli::DwTag) -> bool {
    [
        gimli::DW_TAG_typedef,
        gimli::DW_TAG_const_type,
        gimli::DW_TAG_volatile_type,
        gimli::DW_TAG_restrict_type,
        gimli::DW_TAG_atomic_type,
    ]
    .contains(&tag)
}

/// The type at `at` with typedefs and qualifiers removed: its tag and entry.
pub(crate) fn strip(
    unit: &Unit<'_>,
    mut at: UnitOffset,
    depth: u32,
) -> gimli::Result<(gimli::DwTag, UnitOffset)> {
    for _ in depth..MAX_DEPTH {
        let e = unit.entry(at)?;
        if !is_alias(e.tag()) {
            return Ok((e.tag(), at));
        }
        match e
            .attr_value(gimli::DW_AT_type)
            .and_then(|v| type_ref(unit, v))
        {
            Some(next) => at = next,
            // `const void`.
            None => return Ok((gimli::DW_TAG_unspecified_type, at)),
        }
    }
    Err(gimli::Error::UnsupportedTypeOperation)
}

/// The size in bytes of the type at `at` (an array's: its element's times
/// its counts); None for `void` and incomplete types.
pub(crate) fn type_size(unit: &Unit<'_>, at: UnitOffset, depth: u32) -> gimli::Result<Option<u64>> {
    let (tag, at) = strip(unit, at, depth)?;
    let e = unit.entry(at)?;
    if let Some(size) = e
        .attr_value(gimli::DW_AT_byte_size)
        .and_then(|v| v.udata_value())
    {
        return Ok(Some(size));
    }
    if tag == gimli::DW_TAG_pointer_type {
        return Ok(Some(u64::from(unit.header.address_size())));
    }
    if tag != gimli::DW_TAG_array_type || depth >= MAX_DEPTH {
        return Ok(None);
    }
    let Some(elem) = e
        .attr_value(gimli::DW_AT_type)
        .and_then(|v| type_ref(unit, v))
    else {
        return Ok(None);
    };
    let Some(mut size) = type_size(unit, elem, depth + 1)? else {
        return Ok(None);
    };
    let mut tree = unit.entries_tree(Some(at))?;
    let mut dims = tree.root()?.children();
    while let Some(dim) = dims.next()? {
        let d = dim.entry();
        if d.tag() != gimli::DW_TAG_subrange_type {
            continue;
        }
        let udata = |a| d.attr_value(a).and_then(|v| v.udata_value());
        let count = match (udata(gimli::DW_AT_count), udata(gimli::DW_AT_upper_bound)) {
            (Some(c), _) => c,
            (None, Some(upper)) => {
                let lower = udata(gimli::DW_AT_lower_bound).unwrap_or(0);
                (upper + 1).saturating_sub(lower)
            }
            // A flexible array member.
            (None, None) => 0,
        };
        size = size.saturating_mul(count);
    }
    Ok(Some(size))
}
