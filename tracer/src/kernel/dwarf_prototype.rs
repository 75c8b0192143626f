//! Functions' prototypes from DWARF, for a module without BTF whose `.ko`
//! (built with `-g`) is given with `--modules DIR`: each named
//! `DW_TAG_subprogram` and its `DW_TAG_formal_parameter`s, mapped onto the
//! argument registers as a BTF `FUNC_PROTO` is
//! (`crate::kernel::prototype::in_registers`), so `--args` and `--retval`
//! show the same values either way.

use std::collections::HashMap;

use gimli::{AttributeValue, UnitOffset};

use crate::kernel::dwarf::{strip, type_ref, type_size, DwarfError, KernelDwarf, Unit, R};
use crate::kernel::prototype::{in_registers, Arg, Passed, Prototype, ValueKind};

/// Every function the DWARF describes, by name (a name whose several
/// descriptions differ, static functions of several files, has none).
pub fn prototypes(dwarf: &KernelDwarf<'_>) -> Result<HashMap<String, Prototype>, DwarfError> {
    let d = dwarf.sections();
    let mut found: HashMap<String, Option<Prototype>> = HashMap::new();
    let mut units = d.units();
    while let Some(header) = units.next().map_err(|e| dwarf.parse(e))? {
        let unit = d.unit(header).map_err(|e| dwarf.parse(e))?;
        let mut entries = unit.entries();
        while let Some(e) = entries.next_dfs().map_err(|e| dwarf.parse(e))? {
            if e.tag() != gimli::DW_TAG_subprogram
                || matches!(
                    e.attr_value(gimli::DW_AT_declaration),
                    Some(AttributeValue::Flag(true))
                )
            {
                continue;
            }
            let Some(n) = e.attr_value(gimli::DW_AT_name) else {
                continue;
            };
            let name = d.attr_string(&unit, n).map_err(|e| dwarf.parse(e))?;
            let name = String::from_utf8_lossy(name.slice()).into_owned();
            let at = e.offset();
            let p = subprogram(&d, &unit, at).map_err(|e| dwarf.parse(e))?;
            match found.get(&name) {
                Some(q) if *q != p => {
                    found.insert(name, None);
                }
                Some(_) => {}
                None => {
                    found.insert(name, p);
                }
            }
        }
    }
    Ok(found
        .into_iter()
        .filter_map(|(n, p)| Some((n, p?)))
        .collect())
}

/// The prototype of the subprogram at `at`; None when a type of it is
/// none a value can have.
fn subprogram(
    d: &gimli::Dwarf<R<'_>>,
    unit: &Unit<'_>,
    at: UnitOffset,
) -> gimli::Result<Option<Prototype>> {
    let e = unit.entry(at)?;
    let ret = match e
        .attr_value(gimli::DW_AT_type)
        .and_then(|v| type_ref(unit, v))
    {
        None => Passed::Nothing,
        Some(t) => match passed(d, unit, t)? {
            Some(p) => p,
            None => return Ok(None),
        },
    };
    let mut args = Vec::new();
    let mut tree = unit.entries_tree(Some(at))?;
    let mut children = tree.root()?.children();
    while let Some(child) = children.next()? {
        let p = child.entry();
        if p.tag() == gimli::DW_TAG_unspecified_parameters {
            args.push(Arg::Variadic);
            break;
        }
        if p.tag() != gimli::DW_TAG_formal_parameter {
            continue;
        }
        let name = match p.attr_value(gimli::DW_AT_name) {
            Some(n) => String::from_utf8_lossy(d.attr_string(unit, n)?.slice()).into_owned(),
            None => String::new(),
        };
        let name = match name.is_empty() {
            true => format!("arg{}", args.len() + 1),
            false => name,
        };
        let Some(t) = p
            .attr_value(gimli::DW_AT_type)
            .and_then(|v| type_ref(unit, v))
        else {
            return Ok(None);
        };
        match passed(d, unit, t)? {
            Some(passed) => args.push(Arg::Named(name, passed)),
            None => return Ok(None),
        }
    }
    Ok(Some(in_registers(ret, args)))
}

/// How a value of the type at `at` is passed, as `KernelBtf`'s own
/// `passed` says of the same C type.
fn passed(
    d: &gimli::Dwarf<R<'_>>,
    unit: &Unit<'_>,
    at: UnitOffset,
) -> gimli::Result<Option<Passed>> {
    let (tag, at) = strip(unit, at, 0)?;
    let e = unit.entry(at)?;
    let size = type_size(unit, at, 0)?;
    let name = match e.attr_value(gimli::DW_AT_name) {
        Some(n) => String::from_utf8_lossy(d.attr_string(unit, n)?.slice()).into_owned(),
        None => String::new(),
    };
    let small = |s: u64| u8::try_from(s).ok().filter(|s| [1, 2, 4, 8].contains(s));
    Ok(Some(match tag {
        gimli::DW_TAG_pointer_type
        | gimli::DW_TAG_reference_type
        | gimli::DW_TAG_rvalue_reference_type => Passed::Shown(ValueKind::Pointer),
        gimli::DW_TAG_base_type => {
            let Some(size) = size else { return Ok(None) };
            let encoding = match e.attr_value(gimli::DW_AT_encoding) {
                Some(AttributeValue::Encoding(x)) => x,
                _ => return Ok(None),
            };
            if encoding == gimli::DW_ATE_float {
                return Ok(Some(Passed::Sse(format!(
                    "a {size}-byte floating-point value"
                ))));
            }
            if size == 16 {
                return Ok(Some(Passed::Regs(2, "a 128-bit integer".into())));
            }
            let Some(size) = small(size) else {
                return Ok(None);
            };
            Passed::Shown(match encoding {
                gimli::DW_ATE_boolean => ValueKind::Bool,
                _ if name == "char" => ValueKind::Char,
                gimli::DW_ATE_signed | gimli::DW_ATE_signed_char => ValueKind::Signed(size),
                _ => ValueKind::Unsigned(size),
            })
        }
        gimli::DW_TAG_enumeration_type => {
            let Some(size) = size.and_then(small) else {
                return Ok(None);
            };
            let (signed, names) = enumerators(d, unit, at, size)?;
            Passed::Shown(ValueKind::Enum {
                size,
                signed,
                names,
            })
        }
        gimli::DW_TAG_structure_type | gimli::DW_TAG_union_type | gimli::DW_TAG_class_type => {
            let what = match tag == gimli::DW_TAG_union_type {
                true => "a union",
                false => "a struct",
            };
            match size {
                // A declaration only: no value has that type.
                None => return Ok(None),
                Some(0) => Passed::Nothing,
                Some(1..=8) => Passed::Regs(1, format!("{what} passed by value")),
                Some(9..=16) => Passed::Regs(2, format!("{what} passed by value")),
                Some(n) => Passed::Memory(format!("{what} of {n} bytes passed by value")),
            }
        }
        _ => return Ok(None),
    }))
}

/// An enum's signedness (its underlying type's, else whether a value is
/// negative) and its values' names, each value read at the enum's `size`.
fn enumerators(
    d: &gimli::Dwarf<R<'_>>,
    unit: &Unit<'_>,
    at: UnitOffset,
    size: u8,
) -> gimli::Result<(bool, Vec<(i64, String)>)> {
    let e = unit.entry(at)?;
    let mut signed = match e
        .attr_value(gimli::DW_AT_type)
        .and_then(|v| type_ref(unit, v))
    {
        Some(t) => {
            let (_, t) = strip(unit, t, 0)?;
            matches!(
                unit.entry(t)?.attr_value(gimli::DW_AT_encoding),
                Some(AttributeValue::Encoding(gimli::DW_ATE_signed))
            )
        }
        None => false,
    };
    let mut raw = Vec::new();
    let mut tree = unit.entries_tree(Some(at))?;
    let mut children = tree.root()?.children();
    while let Some(child) = children.next()? {
        let m = child.entry();
        if m.tag() != gimli::DW_TAG_enumerator {
            continue;
        }
        let name = match m.attr_value(gimli::DW_AT_name) {
            Some(n) => String::from_utf8_lossy(d.attr_string(unit, n)?.slice()).into_owned(),
            None => continue,
        };
        let v = match m.attr_value(gimli::DW_AT_const_value) {
            Some(AttributeValue::Sdata(v)) => {
                signed |= v < 0;
                v
            }
            Some(v) => v.udata_value().unwrap_or(0) as i64,
            None => continue,
        };
        raw.push((v, name));
    }
    // A value as the enum's bytes hold it: sign-extended if signed.
    let bits = u32::from(size) * 8;
    let names = raw
        .into_iter()
        .map(|(v, n)| match (signed, bits < 64) {
            (true, true) => ((v << (64 - bits)) >> (64 - bits), n),
            (false, true) => ((v as u64 & ((1u64 << bits) - 1)) as i64, n),
            _ => (v, n),
        })
        .collect();
    Ok((signed, names))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::btf::KernelBtf;
    use crate::kernel::module_btf::{ko_btf_data, module_btf};
    use std::path::Path;

    /// The test module's DWARF gives each of its functions the prototype
    /// its BTF gives (vmt_hit's `unsigned long i`, vmt_write's pointers
    /// to the vmlinux's types, ...): `--args` shows the same either way.
    #[test]
    fn a_modules_dwarf_gives_its_btfs_prototypes() {
        let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest/out/debian-6.12");
        let (kernel, ko) = (out.join("vmlinuz"), out.join("vmt_test.ko"));
        if !kernel.is_file() || !ko.is_file() {
            eprintln!("SKIPPED: run `bash guest/build.sh vmt-test`");
            return;
        }
        let bytes = std::fs::read(&ko).unwrap();
        let dwarf = KernelDwarf::from_relocatable(&ko, &bytes).unwrap();
        let by_dwarf = prototypes(&dwarf).unwrap();
        let (image, _) = crate::kernel::bzimage::load(&kernel).unwrap();
        let base = KernelBtf::from_image(&image).unwrap();
        let data = ko_btf_data(&ko).unwrap().unwrap();
        let btf = module_btf("vmt_test", "vmt_test.ko", &data, &base).unwrap();
        for f in ["vmt_hit", "vmt_batch", "vmt_write"] {
            let want = btf.own_prototype(f).unwrap();
            assert_eq!(by_dwarf.get(f), Some(&want), "{f}");
        }
        assert_eq!(by_dwarf["vmt_hit"].params[0].name, "i");
        // Only the module's own functions: none of the kernel's.
        assert!(!by_dwarf.contains_key("vfs_write"));
    }

    /// An object without DWARF is said to have none.
    #[test]
    fn a_file_without_dwarf_is_said_so() {
        let ko =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest/out/debian-6.12/binfmt_misc.ko");
        if !ko.is_file() {
            eprintln!("SKIPPED: run `bash guest/build.sh debian-6.12`");
            return;
        }
        let bytes = std::fs::read(&ko).unwrap();
        let e = KernelDwarf::from_relocatable(&ko, &bytes).unwrap_err();
        assert!(matches!(e, DwarfError::Missing { .. }), "{e}");
    }
}
