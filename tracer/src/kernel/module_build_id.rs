//! A loaded module's build id (`.note.gnu.build-id`), read from the guest's
//! memory, and a `.ko` file's, so that a module file given on the host can
//! be matched to the module the guest runs (issue 37's `--modules DIR`).
//!
//! The kernel keeps a module's ELF notes for sysfs
//! (/sys/module/NAME/notes/): `mod->notes_attrs` points at a
//! `struct module_notes_attrs` (kernel/module/sysfs.c, kernel/module.c
//! before 5.19): `notes` of `struct bin_attribute`, each named by its
//! section (`attr.name`) with the note's bytes at `private`, `size` long.

use std::path::{Path, PathBuf};

use object::Object;
use vmm::gva::AddressSpace;

use crate::kernel::btf::KernelBtf;
use crate::kernel::modules::{LoadedModule, ModuleError};

/// The section of the linker's build id note (`--build-id`).
pub const BUILD_ID_SECTION: &str = ".note.gnu.build-id";
/// `NT_GNU_BUILD_ID`.
const NT_GNU_BUILD_ID: u32 = 3;
/// More notes than a module has (a handful): a bigger count is not one.
const MAX_NOTES: u32 = 64;
/// Longest note read (a build id note is 36 bytes with a SHA-1).
const MAX_NOTE: u64 = 4096;

/// Where a module's notes are described, from the kernel's BTF.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NotesLayout {
    notes_attrs: u32,
    count: u32,
    attrs: u32,
    attr_size: u32,
    /// `bin_attribute.attr.name` (`struct attribute`'s first member).
    name: u32,
    size: u32,
    private: u32,
}

impl NotesLayout {
    /// None: the kernel keeps no notes for its modules (no sysfs or
    /// kallsyms), or its BTF does not describe them.
    pub fn find(btf: &KernelBtf) -> Option<NotesLayout> {
        let m = |ty: &str, f: &str| btf.member(ty, f).ok().map(|at| at.offset);
        Some(NotesLayout {
            notes_attrs: m("module", "notes_attrs")?,
            count: m("module_notes_attrs", "notes")?,
            attrs: m("module_notes_attrs", "attrs")?,
            attr_size: btf.struct_size("bin_attribute").ok()?,
            name: m("bin_attribute", "attr")? + m("attribute", "name")?,
            size: m("bin_attribute", "size")?,
            private: m("bin_attribute", "private")?,
        })
    }
}

/// The build id of the loaded module `m`, from its notes; None when it has
/// no build id note (or no notes).
pub fn loaded_build_id(
    space: &mut AddressSpace<'_>,
    l: &NotesLayout,
    m: &LoadedModule,
) -> Result<Option<Vec<u8>>, ModuleError> {
    let mut read = |addr: u64, buf: &mut [u8]| {
        space
            .read(addr, buf)
            .map_err(|source| ModuleError::Read { addr, source })
    };
    let mut w = [0u8; 8];
    read(m.addr + u64::from(l.notes_attrs), &mut w)?;
    let attrs = u64::from_le_bytes(w);
    if attrs == 0 {
        return Ok(None);
    }
    read(attrs + u64::from(l.count), &mut w[..4])?;
    let count = u32::from_le_bytes(w[..4].try_into().expect("4 bytes"));
    if count > MAX_NOTES {
        return Err(ModuleError::Implausible {
            name: m.name.clone(),
            addr: m.addr,
            what: "its note count",
            count: u64::from(count),
        });
    }
    for i in 0..u64::from(count) {
        let attr = attrs + u64::from(l.attrs) + i * u64::from(l.attr_size);
        read(attr + u64::from(l.name), &mut w)?;
        let mut name = [0u8; BUILD_ID_SECTION.len() + 1];
        read(u64::from_le_bytes(w), &mut name)?;
        if &name[..BUILD_ID_SECTION.len()] != BUILD_ID_SECTION.as_bytes()
            || name[name.len() - 1] != 0
        {
            continue;
        }
        read(attr + u64::from(l.size), &mut w)?;
        let size = u64::from_le_bytes(w).min(MAX_NOTE);
        read(attr + u64::from(l.private), &mut w)?;
        let mut note = vec![0u8; size as usize];
        read(u64::from_le_bytes(w), &mut note)?;
        return Ok(note_build_id(&note));
    }
    Ok(None)
}

/// Where a module's read-only data is (its `.note.gnu.build-id` is laid
/// out there: an allocated section neither executable nor writable), from
/// the kernel's BTF: read at a load hook, before the kernel sets
/// `notes_attrs` (`mod_sysfs_setup` comes after `prepare_coming_module`
/// in `load_module`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RodataAt {
    /// Linux 6.4+: `mem[MOD_RODATA]` (`base`, `size`).
    Memory { at: u32, base: u32, size: u32 },
    /// Before: `core_layout`, from `base + text_size` to `base + ro_size`.
    Layout {
        at: u32,
        base: u32,
        text_size: u32,
        ro_size: u32,
    },
}

/// Larger than a module's read-only data (a few MiB for the largest).
const MAX_RODATA: u64 = 64 << 20;
/// A build id note's header as the linker writes it: name size 4, then
/// the descriptor's size (`DESCSZ_AT`), type `NT_GNU_BUILD_ID`, "GNU".
const NOTE_HEAD: [u8; 16] = [4, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, b'G', b'N', b'U', 0];
const DESCSZ_AT: usize = 4;

impl RodataAt {
    /// None: BTF does not describe it.
    pub fn find(btf: &KernelBtf) -> Option<RodataAt> {
        let m = |ty: &str, f: &str| btf.member(ty, f).ok().map(|at| at.offset);
        if btf.has_struct("module_memory") {
            let index = btf
                .enum_declaring("MOD_RODATA")
                .and_then(|e| e.into_iter().find(|(n, _)| n == "MOD_RODATA"))?
                .1 as u32;
            return Some(RodataAt::Memory {
                at: m("module", "mem")? + index * btf.struct_size("module_memory").ok()?,
                base: m("module_memory", "base")?,
                size: m("module_memory", "size")?,
            });
        }
        Some(RodataAt::Layout {
            at: m("module", "core_layout")?,
            base: m("module_layout", "base")?,
            text_size: m("module_layout", "text_size")?,
            ro_size: m("module_layout", "ro_size")?,
        })
    }
}

/// The build id of the module whose `struct module` is at `module`, from
/// the note in its read-only data (None: no such note there).
pub fn rodata_build_id(
    space: &mut AddressSpace<'_>,
    r: &RodataAt,
    module: u64,
) -> Result<Option<Vec<u8>>, ModuleError> {
    let mut read = |addr: u64, buf: &mut [u8]| {
        space
            .read(addr, buf)
            .map_err(|source| ModuleError::Read { addr, source })
    };
    // A little-endian field of `n` bytes.
    let mut word = |at: u64, n: usize| -> Result<u64, ModuleError> {
        let mut w = [0u8; 8];
        read(at, &mut w[..n]).map(|()| u64::from_le_bytes(w))
    };
    let range = match *r {
        RodataAt::Memory { at, base, size } => {
            let mem = module + u64::from(at);
            let start = word(mem + u64::from(base), 8)?;
            start..start + word(mem + u64::from(size), 4)?
        }
        RodataAt::Layout {
            at,
            base,
            text_size,
            ro_size,
        } => {
            let lay = module + u64::from(at);
            let start = word(lay + u64::from(base), 8)?;
            let text = word(lay + u64::from(text_size), 4)?;
            start + text..start + word(lay + u64::from(ro_size), 4)?
        }
    };
    let len = range.end.saturating_sub(range.start);
    if len == 0 || len > MAX_RODATA {
        return Ok(None);
    }
    let mut data = vec![0u8; len as usize];
    space
        .read(range.start, &mut data)
        .map_err(|source| ModuleError::Read {
            addr: range.start,
            source,
        })?;
    Ok(find_note(&data))
}

/// The build id of the note in `data` (4-byte aligned, as notes are).
fn find_note(data: &[u8]) -> Option<Vec<u8>> {
    (0..data.len().saturating_sub(NOTE_HEAD.len()))
        .step_by(4)
        .filter(|&at| {
            let head = &data[at..at + NOTE_HEAD.len()];
            head[..DESCSZ_AT] == NOTE_HEAD[..DESCSZ_AT]
                && head[DESCSZ_AT + 4..] == NOTE_HEAD[DESCSZ_AT + 4..]
        })
        .find_map(|at| note_build_id(&data[at..]))
}

/// The descriptor of the first `NT_GNU_BUILD_ID` note named "GNU" in
/// `notes` (ELF notes: namesz, descsz, type, the name and the descriptor,
/// each padded to 4 bytes).
fn note_build_id(mut notes: &[u8]) -> Option<Vec<u8>> {
    let pad = |n: usize| n.div_ceil(4) * 4;
    while notes.len() >= 12 {
        let word = |at: usize| u32::from_le_bytes(notes[at..at + 4].try_into().expect("4"));
        let (namesz, descsz, kind) = (word(0) as usize, word(4) as usize, word(8));
        let desc_at = 12 + pad(namesz);
        let end = desc_at.checked_add(descsz)?;
        if end > notes.len() {
            return None;
        }
        if kind == NT_GNU_BUILD_ID && &notes[12..12 + namesz] == b"GNU\0" {
            return Some(notes[desc_at..end].to_vec());
        }
        notes = notes.get(desc_at + pad(descsz)..)?;
    }
    None
}

/// Why a `.ko` file's build id could not be read.
#[derive(Debug, thiserror::Error)]
pub enum KoError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is not an ELF file: {source}", path.display())]
    NotElf {
        path: PathBuf,
        source: object::Error,
    },
}

/// The build id of the module file at `path` (None: it has none).
pub fn ko_build_id(path: &Path) -> Result<Option<Vec<u8>>, KoError> {
    let bytes = std::fs::read(path).map_err(|source| KoError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let file = object::File::parse(bytes.as_slice()).map_err(|source| KoError::NotElf {
        path: path.to_path_buf(),
        source,
    })?;
    let id = file.build_id().map_err(|source| KoError::NotElf {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(id.map(<[u8]>::to_vec))
}

#[cfg(test)]
mod tests {
    use super::{find_note, note_build_id};

    #[test]
    fn the_build_id_note_among_others() {
        let mut notes = Vec::new();
        // A "Linux" note first (type 6), then GNU's build id (type 3).
        for (name, kind, desc) in [
            (&b"Linux\0"[..], 6u32, &[1u8, 2, 3][..]),
            (&b"GNU\0"[..], 3, &[0xab; 20][..]),
        ] {
            notes.extend((name.len() as u32).to_le_bytes());
            notes.extend((desc.len() as u32).to_le_bytes());
            notes.extend(kind.to_le_bytes());
            notes.extend(name);
            notes.resize(notes.len().div_ceil(4) * 4, 0);
            notes.extend(desc);
            notes.resize(notes.len().div_ceil(4) * 4, 0);
        }
        assert_eq!(note_build_id(&notes), Some(vec![0xab; 20]));
        // Found among other read-only data, at a 4-byte boundary.
        let mut rodata = b"some strings\0\0\0\0".to_vec();
        rodata.extend(&notes);
        rodata.extend([0u8; 8]);
        assert_eq!(find_note(&rodata), Some(vec![0xab; 20]));
        assert_eq!(find_note(&rodata[..16]), None);
        assert_eq!(note_build_id(&notes[..20]), None);
        assert_eq!(note_build_id(&[]), None);
    }
}
