//! The traced functions' prototypes in a version-8 body (`--args`,
//! `--retval`; see the parent module): written after the callers, read
//! back and checked. Enums, which many functions share (and some have
//! hundreds of values), are saved once, in a table the kinds index.

use std::collections::HashMap;
use std::io::{self, Read, Write};

use super::encode::put_str;
use super::reader::Reader;
use super::TraceFileError;
use crate::trace::model::{Param, Prototype, ValueKind, ARG_REGS};

/// A kind's tag (`ValueKind`).
const VOID: u8 = 0;
const SIGNED: u8 = 1;
const UNSIGNED: u8 = 2;
const BOOL: u8 = 3;
const CHAR: u8 = 4;
const POINTER: u8 = 5;
const ENUM: u8 = 6;

/// Sizes an integer or enum kind may have.
const SIZES: [u8; 4] = [1, 2, 4, 8];

/// Smallest encoded enum value: `u64` value, empty `str` name.
const MIN_ENUM_VALUE: u64 = 8 + 4;
/// Smallest encoded prototype entry: `u8` has.
const MIN_PROTOTYPE: u64 = 1;

/// An enum as the table keeps it: size, signedness, values.
type EnumKey<'a> = (u8, bool, &'a [(i64, String)]);
/// An enum of the table as read.
type Enum = (u8, bool, Vec<(i64, String)>);

/// What is wrong with `p`, if it cannot be saved (or was read so).
pub(super) fn check_prototype(p: &Prototype) -> Result<(), String> {
    if p.params.len() > ARG_REGS {
        return Err(format!(
            "{} parameters in registers (max {ARG_REGS})",
            p.params.len()
        ));
    }
    if let Some(q) = p.params.iter().find(|q| q.reg as usize >= ARG_REGS) {
        return Err(format!(
            "parameter {:?} in register {} (max {})",
            q.name,
            q.reg,
            ARG_REGS - 1
        ));
    }
    for k in p.params.iter().map(|q| &q.kind).chain([&p.ret]) {
        if let ValueKind::Signed(s) | ValueKind::Unsigned(s) | ValueKind::Enum { size: s, .. } = k {
            if !SIZES.contains(s) {
                return Err(format!("a value of {s} bytes (1, 2, 4 or 8)"));
            }
        }
    }
    if p.params.iter().any(|q| q.kind == ValueKind::Void) {
        return Err("a void parameter".into());
    }
    Ok(())
}

/// `prototypes` (empty, or one per function) into `w`.
// Long: the encoding field by field, in the order `read_prototypes` reads
// it back; kept in one piece so the two can be read side by side.
pub(super) fn put_prototypes(w: &mut Vec<u8>, prototypes: &[Option<Prototype>]) -> io::Result<()> {
    let too_many =
        |what: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("over 2^32 {what}"));
    // The enum table: each distinct enum once, in order of first use.
    let mut enums: Vec<EnumKey> = Vec::new();
    let mut index: HashMap<EnumKey, u32> = HashMap::new();
    let kinds = prototypes
        .iter()
        .flatten()
        .flat_map(|p| p.params.iter().map(|q| &q.kind).chain([&p.ret]));
    for k in kinds {
        if let ValueKind::Enum {
            size,
            signed,
            names,
        } = k
        {
            let key = (*size, *signed, names.as_slice());
            if let std::collections::hash_map::Entry::Vacant(v) = index.entry(key) {
                v.insert(u32::try_from(enums.len()).map_err(|_| too_many("enums"))?);
                enums.push(key);
            }
        }
    }
    w.write_all(
        &u32::try_from(prototypes.len())
            .map_err(|_| too_many("functions"))?
            .to_le_bytes(),
    )?;
    w.write_all(&(enums.len() as u32).to_le_bytes())?;
    for (size, signed, names) in &enums {
        w.write_all(&[*size, u8::from(*signed)])?;
        w.write_all(
            &u32::try_from(names.len())
                .map_err(|_| too_many("enum values"))?
                .to_le_bytes(),
        )?;
        for (v, name) in *names {
            w.write_all(&v.to_le_bytes())?;
            put_str(w, name)?;
        }
    }
    let put_kind = |w: &mut Vec<u8>, k: &ValueKind| -> io::Result<()> {
        match k {
            ValueKind::Void => w.write_all(&[VOID]),
            ValueKind::Signed(s) => w.write_all(&[SIGNED, *s]),
            ValueKind::Unsigned(s) => w.write_all(&[UNSIGNED, *s]),
            ValueKind::Bool => w.write_all(&[BOOL]),
            ValueKind::Char => w.write_all(&[CHAR]),
            ValueKind::Pointer => w.write_all(&[POINTER]),
            ValueKind::Enum {
                size,
                signed,
                names,
            } => {
                w.write_all(&[ENUM])?;
                w.write_all(&index[&(*size, *signed, names.as_slice())].to_le_bytes())
            }
        }
    };
    for p in prototypes {
        let Some(p) = p else {
            w.write_all(&[0])?;
            continue;
        };
        check_prototype(p).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        w.write_all(&[1])?;
        put_kind(w, &p.ret)?;
        w.write_all(&[p.params.len() as u8])?;
        for q in &p.params {
            put_str(w, &q.name)?;
            w.write_all(&[q.reg])?;
            put_kind(w, &q.kind)?;
        }
        w.write_all(
            &u32::try_from(p.unshown.len())
                .map_err(|_| too_many("notes"))?
                .to_le_bytes(),
        )?;
        for u in &p.unshown {
            put_str(w, u)?;
        }
    }
    Ok(())
}

/// The prototypes of a body with `nfunc` functions (none, or one each).
pub(super) fn read_prototypes<R: Read>(
    r: &mut Reader<'_, R>,
    nfunc: usize,
) -> Result<Vec<Option<Prototype>>, TraceFileError> {
    let n = r.u32()? as usize;
    if n != 0 && n != nfunc {
        return Err(r.corrupt(format!("{n} prototypes for {nfunc} functions")));
    }
    let nenums = r.u32()?;
    r.need(u64::from(nenums) * (2 + 4), &format!("{nenums} enums"))?;
    let mut enums: Vec<Enum> = Vec::new();
    for _ in 0..nenums {
        let size = r.u8()?;
        if !SIZES.contains(&size) {
            return Err(r.corrupt(format!("an enum of {size} bytes (1, 2, 4 or 8)")));
        }
        let signed = match r.u8()? {
            0 => false,
            1 => true,
            b => return Err(r.corrupt(format!("an enum's signed is {b}, not 0 or 1"))),
        };
        let count = r.u32()?;
        r.need(
            u64::from(count) * MIN_ENUM_VALUE,
            &format!("{count} enum values"),
        )?;
        let mut names = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let v = r.u64()? as i64;
            names.push((v, r.string("an enum value's name")?));
        }
        enums.push((size, signed, names));
    }
    r.need(n as u64 * MIN_PROTOTYPE, &format!("{n} prototypes"))?;
    let mut out = Vec::with_capacity(n);
    for f in 0..n {
        let p = match r.u8()? {
            0 => None,
            1 => Some(read_prototype(r, &enums).map_err(|e| match e {
                TraceFileError::Corrupt {
                    path,
                    section,
                    detail,
                } => TraceFileError::Corrupt {
                    path,
                    section,
                    detail: format!("function {f}'s prototype: {detail}"),
                },
                e => e,
            })?),
            b => return Err(r.corrupt(format!("function {f}'s has_prototype is {b}, not 0 or 1"))),
        };
        out.push(p);
    }
    Ok(out)
}

/// One prototype (after its `has` byte).
fn read_prototype<R: Read>(
    r: &mut Reader<'_, R>,
    enums: &[Enum],
) -> Result<Prototype, TraceFileError> {
    let ret = read_kind(r, enums)?;
    let nparams = r.u8()?;
    let mut params = Vec::new();
    for _ in 0..nparams {
        let name = r.string("a parameter's name")?;
        let reg = r.u8()?;
        let kind = read_kind(r, enums)?;
        params.push(Param { name, kind, reg });
    }
    let nunshown = r.u32()?;
    r.need(u64::from(nunshown) * 4, &format!("{nunshown} notes"))?;
    let mut unshown = Vec::new();
    for _ in 0..nunshown {
        unshown.push(r.string("a note of what is not shown")?);
    }
    let p = Prototype {
        params,
        ret,
        unshown,
    };
    check_prototype(&p).map_err(|d| r.corrupt(d))?;
    Ok(p)
}

fn read_kind<R: Read>(r: &mut Reader<'_, R>, enums: &[Enum]) -> Result<ValueKind, TraceFileError> {
    Ok(match r.u8()? {
        VOID => ValueKind::Void,
        SIGNED => ValueKind::Signed(r.u8()?),
        UNSIGNED => ValueKind::Unsigned(r.u8()?),
        BOOL => ValueKind::Bool,
        CHAR => ValueKind::Char,
        POINTER => ValueKind::Pointer,
        ENUM => {
            let i = r.u32()?;
            let (size, signed, names) = enums
                .get(i as usize)
                .ok_or_else(|| r.corrupt(format!("enum {i} of {}", enums.len())))?;
            ValueKind::Enum {
                size: *size,
                signed: *signed,
                names: names.clone(),
            }
        }
        t => return Err(r.corrupt(format!("a value of kind {t} (0 to {ENUM})"))),
    })
}
