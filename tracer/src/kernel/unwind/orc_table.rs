//! A kernel's ORC tables as objtool writes them into vmlinux: the sorted
//! address table `.orc_unwind_ip` and the entries `.orc_unwind`, read from
//! the image (a vmlinux, or a bzImage's payload, which keeps its section
//! headers) and looked up as `arch/x86/kernel/unwind_orc.c` does.

use std::path::PathBuf;

use object::{Object, ObjectSection};

use crate::kernel::btf::KernelBtf;
use crate::kernel::symbols::KernelImage;

/// objtool's sections (arch/x86/kernel/vmlinux.lds.S, ORC_UNWIND_TABLE in
/// include/asm-generic/vmlinux.lds.h).
pub const ORC_IP_SECTION: &str = ".orc_unwind_ip";
pub const ORC_SECTION: &str = ".orc_unwind";
/// Linux 6.4 added this section (a hash of orc_types.h, `ORC_HEADER` in
/// asm/orc_header.h) together with the new `orc_entry` bit layout.
pub const ORC_HEADER_SECTION: &str = ".orc_header";
/// `sizeof(struct orc_entry)`: two s16 offsets and 16 bits of flags, packed.
pub const ORC_ENTRY_SIZE: usize = 6;
/// `.orc_unwind_ip` holds one s32 per entry, relative to its own address.
const ORC_IP_SIZE: usize = 4;

/// The `ORC_REG_*` base registers of asm/orc_types.h (the same in 6.1 and
/// 6.12).
pub mod reg {
    pub const UNDEFINED: u8 = 0;
    pub const PREV_SP: u8 = 1;
    pub const DX: u8 = 2;
    pub const DI: u8 = 3;
    pub const BP: u8 = 4;
    pub const SP: u8 = 5;
    pub const R10: u8 = 6;
    pub const R13: u8 = 7;
    pub const BP_INDIRECT: u8 = 8;
    pub const SP_INDIRECT: u8 = 9;
}

/// The bit layout of `struct orc_entry`'s flags (asm/orc_types.h).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrcLayout {
    /// Linux 4.14 to 6.3: `sp_reg:4, bp_reg:4, type:2, end:1`; types CALL
    /// 0, REGS 1, REGS_PARTIAL 2 (include/linux/objtool.h
    /// UNWIND_HINT_TYPE_*); the stack's end is `sp_reg` UNDEFINED with
    /// `end` set.
    Old,
    /// Linux 6.4 on: `sp_reg:4, bp_reg:4, type:3, signal:1`; types
    /// UNDEFINED 0, END_OF_STACK 1, CALL 2, REGS 3, REGS_PARTIAL 4.
    New,
}

impl OrcLayout {
    pub fn name(self) -> &'static str {
        match self {
            OrcLayout::Old => "Linux 4.14-6.3 layout",
            OrcLayout::New => "Linux 6.4+ layout",
        }
    }

    /// The entry of the 6 bytes `raw`, in either layout's terms.
    pub fn decode(self, raw: [u8; ORC_ENTRY_SIZE]) -> OrcEntry {
        let flags = u16::from_le_bytes([raw[4], raw[5]]);
        let sp_reg = (flags & 0xf) as u8;
        let bp_reg = ((flags >> 4) & 0xf) as u8;
        let (kind, signal) = match self {
            OrcLayout::Old => {
                let end = flags >> 10 & 1 == 1;
                // 6.1 unwind_next_frame: sp_reg UNDEFINED is the end of the
                // stack with `end` set, an error without (a "weak"
                // section terminator).
                let kind = match (sp_reg, flags >> 8 & 3) {
                    (reg::UNDEFINED, _) if end => OrcType::EndOfStack,
                    (reg::UNDEFINED, _) => OrcType::Undefined,
                    (_, 0) => OrcType::Call,
                    (_, 1) => OrcType::Regs,
                    (_, 2) => OrcType::RegsPartial,
                    _ => OrcType::Undefined,
                };
                // 6.1 sets `state->signal` after a REGS or REGS_PARTIAL
                // step only.
                (kind, matches!(kind, OrcType::Regs | OrcType::RegsPartial))
            }
            OrcLayout::New => {
                let kind = match flags >> 8 & 7 {
                    1 => OrcType::EndOfStack,
                    2 => OrcType::Call,
                    3 => OrcType::Regs,
                    4 => OrcType::RegsPartial,
                    _ => OrcType::Undefined,
                };
                // 6.12 takes `state->signal` from every entry it follows.
                (kind, flags >> 11 & 1 == 1)
            }
        };
        OrcEntry {
            sp_offset: i16::from_le_bytes([raw[0], raw[1]]),
            bp_offset: i16::from_le_bytes([raw[2], raw[3]]),
            sp_reg,
            bp_reg,
            kind,
            signal,
        }
    }
}

/// What an entry says the frame at its addresses is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrcType {
    /// No information (a section terminator, or bad data): the unwind
    /// cannot go on.
    Undefined,
    /// The bottom of a stack (a kernel thread's first frame, the entry
    /// code before it has a frame).
    EndOfStack,
    /// A function's frame: the return address is just below the previous
    /// frame's stack pointer.
    Call,
    /// A full `struct pt_regs` at the previous stack pointer.
    Regs,
    /// Only the hardware's iret frame (the tail of `struct pt_regs`) at the
    /// previous stack pointer.
    RegsPartial,
}

/// One decoded `struct orc_entry`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OrcEntry {
    pub sp_offset: i16,
    pub bp_offset: i16,
    /// `reg::*`: how to find the previous frame's stack pointer.
    pub sp_reg: u8,
    /// `reg::*`: how to find the previous frame's base pointer.
    pub bp_reg: u8,
    pub kind: OrcType,
    /// After this frame, look up the next address exactly, not the byte
    /// before it: it was interrupted, not a return address.
    pub signal: bool,
}

/// Why an image's ORC tables could not be used.
#[derive(Debug, thiserror::Error)]
pub enum OrcError {
    #[error("{} has no ORC tables ({ORC_IP_SECTION}, {ORC_SECTION}): the kernel was not built with CONFIG_UNWINDER_ORC=y", path.display())]
    Missing { path: PathBuf },
    #[error("{} is not an ELF file with section headers ({source}), so its ORC tables cannot be found", path.display())]
    NotElf {
        path: PathBuf,
        source: object::Error,
    },
    #[error("{}: section {section} has no data in the file; is the file truncated?", path.display())]
    NoData {
        path: PathBuf,
        section: &'static str,
    },
    #[error("{}: section {section} is {size} bytes, not a whole number of {entry}-byte entries; the image is corrupt", path.display())]
    BadSize {
        path: PathBuf,
        section: &'static str,
        size: usize,
        entry: usize,
    },
    #[error("{}: {ORC_IP_SECTION} has {ips} entries but {ORC_SECTION} has {entries}; the image is corrupt", path.display())]
    Mismatch {
        path: PathBuf,
        ips: usize,
        entries: usize,
    },
}

/// A kernel's ORC tables, sorted by address (link addresses).
#[derive(Debug)]
pub struct OrcTable {
    ips: Vec<u64>,
    entries: Vec<OrcEntry>,
    layout: OrcLayout,
}

impl OrcTable {
    /// The tables of `image`, in the layout its BTF (else its sections)
    /// says.
    pub fn from_image(image: &KernelImage, btf: Option<&KernelBtf>) -> Result<OrcTable, OrcError> {
        let path = || image.path.clone();
        let file =
            object::File::parse(image.bytes.as_slice()).map_err(|source| OrcError::NotElf {
                path: path(),
                source,
            })?;
        let (Some(ip_sec), Some(orc_sec)) = (
            file.section_by_name(ORC_IP_SECTION),
            file.section_by_name(ORC_SECTION),
        ) else {
            return Err(OrcError::Missing { path: path() });
        };
        let (ip_data, orc_data) = (
            section_data(&ip_sec, ORC_IP_SECTION, image)?,
            section_data(&orc_sec, ORC_SECTION, image)?,
        );
        for (section, d, entry) in [
            (ORC_IP_SECTION, ip_data, ORC_IP_SIZE),
            (ORC_SECTION, orc_data, ORC_ENTRY_SIZE),
        ] {
            if d.len() % entry != 0 {
                return Err(OrcError::BadSize {
                    path: path(),
                    section,
                    size: d.len(),
                    entry,
                });
            }
        }
        let (ips, entries) = (ip_data.len() / ORC_IP_SIZE, orc_data.len() / ORC_ENTRY_SIZE);
        if ips != entries {
            return Err(OrcError::Mismatch {
                path: path(),
                ips,
                entries,
            });
        }
        if ips == 0 {
            return Err(OrcError::Missing { path: path() });
        }
        let layout = detect_layout(btf, file.section_by_name(ORC_HEADER_SECTION).is_some());
        let base = ip_sec.address();
        let pairs = ip_data
            .chunks_exact(ORC_IP_SIZE)
            .zip(orc_data.chunks_exact(ORC_ENTRY_SIZE))
            .enumerate()
            .map(|(i, (ip, orc))| {
                // unwind_orc.c orc_ip(): the entry's own address plus its
                // value.
                let rel = i32::from_le_bytes(ip.try_into().expect("4 bytes"));
                let at = base.wrapping_add((i * ORC_IP_SIZE) as u64);
                let raw: [u8; ORC_ENTRY_SIZE] = orc.try_into().expect("6 bytes");
                (at.wrapping_add_signed(i64::from(rel)), layout.decode(raw))
            })
            .collect();
        Ok(OrcTable::new(layout, pairs))
    }

    /// A table of `(link address, entry)` pairs in any order.
    pub fn new(layout: OrcLayout, mut pairs: Vec<(u64, OrcEntry)>) -> OrcTable {
        // As unwind_orc.c orc_sort_cmp: by address, and at one address the
        // "weak" terminators (UNDEFINED) first, so that the lookup, which
        // takes the last entry at or below an address, prefers the real
        // one. A stable sort keeps the file's order otherwise.
        pairs.sort_by_key(|(ip, e)| (*ip, e.kind != OrcType::Undefined));
        let (ips, entries) = pairs.into_iter().unzip();
        OrcTable {
            ips,
            entries,
            layout,
        }
    }

    /// This table and `extra` (link address, raw entry) pairs, decoded in
    /// its layout (a module's tables are in its kernel's).
    pub fn with_entries(
        self,
        extra: impl IntoIterator<Item = (u64, [u8; ORC_ENTRY_SIZE])>,
    ) -> OrcTable {
        let layout = self.layout;
        let mut extra = extra.into_iter().peekable();
        if extra.peek().is_none() {
            return self;
        }
        let mut pairs: Vec<(u64, OrcEntry)> = self.ips.into_iter().zip(self.entries).collect();
        pairs.extend(extra.map(|(ip, raw)| (ip, layout.decode(raw))));
        OrcTable::new(layout, pairs)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn layout(&self) -> OrcLayout {
        self.layout
    }

    pub fn layout_name(&self) -> &'static str {
        self.layout.name()
    }

    /// The entry that covers link address `ip`: the last at or below it
    /// (unwind_orc.c __orc_find); None below the first.
    pub fn find(&self, ip: u64) -> Option<&OrcEntry> {
        let n = self.ips.partition_point(|&a| a <= ip);
        n.checked_sub(1).map(|i| &self.entries[i])
    }

    /// The entries that start in `start..end` (link addresses), in order.
    pub fn entries_in(&self, start: u64, end: u64) -> impl Iterator<Item = (u64, &OrcEntry)> {
        let from = self.ips.partition_point(|&a| a < start);
        let to = self.ips.partition_point(|&a| a < end);
        self.ips[from..to]
            .iter()
            .copied()
            .zip(&self.entries[from..to])
    }
}

/// The ORC entries of a module the guest loaded during the trace, apart
/// from the kernel's table (which is fixed at the attach): its core text
/// and its entries there, at link addresses (`UnwindCtx::modules`).
#[derive(Debug)]
pub struct ModuleTable {
    /// `start..end`.
    pub text: (u64, u64),
    pub table: OrcTable,
}

impl ModuleTable {
    /// The module whose text is `text` (link addresses), its `entries`
    /// (link address, raw entry) in the kernel's `layout`.
    pub fn new(
        text: (u64, u64),
        layout: OrcLayout,
        entries: impl IntoIterator<Item = (u64, [u8; ORC_ENTRY_SIZE])>,
    ) -> ModuleTable {
        let pairs = entries
            .into_iter()
            .map(|(ip, raw)| (ip, layout.decode(raw)))
            .collect();
        ModuleTable {
            text,
            table: OrcTable::new(layout, pairs),
        }
    }

    /// Whether link address `addr` is in the module's text.
    pub fn covers(&self, addr: u64) -> bool {
        (self.text.0..self.text.1).contains(&addr)
    }
}

/// The bytes of `s`, all of them in the file.
fn section_data<'d>(
    s: &object::Section<'d, '_>,
    section: &'static str,
    image: &KernelImage,
) -> Result<&'d [u8], OrcError> {
    s.data()
        .ok()
        .filter(|d| d.len() as u64 == s.size())
        .ok_or_else(|| OrcError::NoData {
            path: image.path.clone(),
            section,
        })
}

/// The layout of a kernel's `struct orc_entry`: from its BTF when that
/// describes the struct (6.4 renamed `end` to `signal` and widened `type`
/// to 3 bits), else by `.orc_header`, which came with the new layout.
fn detect_layout(btf: Option<&KernelBtf>, has_header: bool) -> OrcLayout {
    const STRUCT: &str = "orc_entry";
    if let Some(btf) = btf.filter(|b| b.has_struct(STRUCT)) {
        let signal = btf.member(STRUCT, "signal").is_ok();
        let wide_type = matches!(btf.bitfield_bits(STRUCT, "type"), Ok(Some(3)));
        return if signal || wide_type {
            OrcLayout::New
        } else {
            OrcLayout::Old
        };
    }
    if has_header {
        OrcLayout::New
    } else {
        OrcLayout::Old
    }
}
