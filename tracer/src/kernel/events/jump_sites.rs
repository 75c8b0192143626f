//! Where an event's tracepoint is called from: the `__jump_table` entries
//! of its static key, each a NOP while the event is disabled, and the jump
//! that enables it, made as the kernel makes it.
//!
//! `trace_NAME()` is `if (static_key_false(&__tracepoint_NAME.key))
//! static_call(tp_func_NAME)(...)` (include/linux/tracepoint.h): an
//! `asm goto` NOP whose `struct jump_entry { s32 code; s32 target; long
//! key; }` (each relative to its own field, the key's low bits flags:
//! bit 0 the branch's default, bit 1 objtool's "NOP this" or, once booted,
//! "init", arch/x86/include/asm/jump_label.h, kernel/jump_label.c) names
//! the key. The kernel enables a site by writing `JMP target` over the
//! NOP, 2 or 5 bytes as decoded (arch/x86/kernel/jump_label.c
//! `__jump_label_patch`), and BUGs if it finds anything but the NOP it
//! expects: which is why vmtrace refuses a key the guest has enabled.
//! With no probe registered the static call still points to
//! `__traceiter_NAME` (`DEFINE_STATIC_CALL(tp_func_NAME,
//! __traceiter_NAME)`; kernel/tracepoint.c `tracepoint_update_call` sets
//! it back to `tp->iterator` when the last probe goes), which walks an
//! empty `tp->funcs` and returns: an enabled site costs a call.

use iced_x86::{Code, Decoder, DecoderOptions};
use object::{Object, ObjectSection};

use super::image_data::word;
use crate::kernel::symbols::KernelImage;

/// The table's bounds, as the linker script names them.
const START: &str = "__start___jump_table";
const STOP: &str = "__stop___jump_table";
const SECTION: &str = "__jump_table";
/// `sizeof(struct jump_entry)` on x86-64.
const ENTRY: u64 = 16;
/// The kernel's NOPs (arch/x86/include/asm/nops.h `BYTES_NOP2`, `BYTES_NOP5`).
pub const NOP2: [u8; 2] = [0x66, 0x90];
pub const NOP5: [u8; 5] = [0x0f, 0x1f, 0x44, 0x00, 0x00];

/// Why an event's call sites cannot be enabled.
#[derive(Debug, thiserror::Error)]
pub enum JumpSiteError {
    #[error(
        "{}: the kernel has jump labels but the image does not say where its __jump_table \
         is ({START}/{STOP}: kallsyms names data only with CONFIG_KALLSYMS_ALL)",
        path.display()
    )]
    NoTable { path: std::path::PathBuf },
    #[error(
        "{}: the jump label of event {event} at {code:#x} is {found}, not the NOP the \
         kernel leaves at a disabled site",
        path.display()
    )]
    NotNop {
        path: std::path::PathBuf,
        event: String,
        code: u64,
        found: String,
    },
    #[error(
        "{}: the jump label of event {event} at {code:#x} defaults to its jump (a likely \
         branch); vmtrace enables only the kernel's tracepoint NOPs",
        path.display()
    )]
    Likely {
        path: std::path::PathBuf,
        event: String,
        code: u64,
    },
    #[error(
        "{}: the kernel has no jump labels (built without CONFIG_JUMP_LABEL): its \
         tracepoints test their keys' counts, which only vmtrace's own VMM sets (it owns \
         the guest), never an attach",
        path.display()
    )]
    NoJumpLabels { path: std::path::PathBuf },
    #[error("{}: event {event} has no jump label for its key {key:#x}: nothing calls it", path.display())]
    NoSite {
        path: std::path::PathBuf,
        event: String,
        key: u64,
    },
}

/// One `struct jump_entry`, resolved (link-time addresses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JumpEntry {
    /// Where the entry itself is in the image (the kernel sorts its table
    /// at boot: a running entry is known by the code it names).
    pub at: u64,
    pub code: u64,
    pub target: u64,
    /// The key's address with its flag bits.
    pub key: u64,
}

/// One call site of an event: link-time addresses, and the bytes there
/// while disabled and once enabled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JumpSite {
    pub code: u64,
    pub target: u64,
    /// The NOP the image holds (2 or 5 bytes).
    pub nop: Vec<u8>,
    /// `JMP target` of the same length.
    pub jump: Vec<u8>,
}

/// Every `__jump_table` entry; empty when the kernel has no jump labels.
pub fn entries(image: &KernelImage) -> Result<Vec<JumpEntry>, JumpSiteError> {
    let bounds = match (image.symbol(START), image.symbol(STOP)) {
        (Some(s), Some(e)) if s.addr <= e.addr => Some((s.addr, e.addr)),
        _ => object::File::parse(image.bytes.as_slice())
            .ok()
            .and_then(|f| {
                f.section_by_name(SECTION)
                    .map(|s| (s.address(), s.address() + s.size()))
            }),
    };
    let Some((start, stop)) = bounds else {
        return match image.symbol("jump_label_init") {
            Some(_) => Err(JumpSiteError::NoTable {
                path: image.path.clone(),
            }),
            None => Ok(Vec::new()),
        };
    };
    let mut out = Vec::with_capacity(((stop - start) / ENTRY) as usize);
    let mut at = start;
    while at + ENTRY <= stop {
        let (Some(w0), Some(key)) = (word(image, at), word(image, at + 8)) else {
            break;
        };
        let code = at.wrapping_add(w0 as u32 as i32 as i64 as u64);
        let target = (at + 4).wrapping_add((w0 >> 32) as u32 as i32 as i64 as u64);
        out.push(JumpEntry {
            at,
            code,
            target,
            key: (at + 8).wrapping_add(key),
        });
        at += ENTRY;
    }
    Ok(out)
}

/// The call sites of `event` (its key `key`), checked: each a NOP of the
/// kernel's, the branch unlikely, none in init text (freed after boot).
pub fn event_sites(
    image: &KernelImage,
    table: &[JumpEntry],
    event: &str,
    key: u64,
) -> Result<Vec<JumpSite>, JumpSiteError> {
    if table.is_empty() {
        return Err(JumpSiteError::NoJumpLabels {
            path: image.path.clone(),
        });
    }
    let mut sites = Vec::new();
    for e in table.iter().filter(|e| e.key & !3 == key) {
        let (code, target, flagged) = (e.code, e.target, e.key);
        if image.init_text.is_some_and(|(s, e)| (s..e).contains(&code)) {
            continue;
        }
        if flagged & 1 != 0 {
            return Err(JumpSiteError::Likely {
                path: image.path.clone(),
                event: event.to_string(),
                code,
            });
        }
        let not_nop = |found: String| JumpSiteError::NotNop {
            path: image.path.clone(),
            event: event.to_string(),
            code,
            found,
        };
        let bytes = image
            .file_bytes(code, NOP5.len())
            .or_else(|| image.file_bytes(code, NOP2.len()))
            .ok_or_else(|| not_nop("outside the image's text".into()))?;
        let nop = nop_at(bytes, code).map_err(not_nop)?;
        let jump = jump_bytes(code, target, nop.len()).map_err(not_nop)?;
        sites.push(JumpSite {
            code,
            target,
            nop,
            jump,
        });
    }
    match sites.is_empty() {
        true => Err(JumpSiteError::NoSite {
            path: image.path.clone(),
            event: event.to_string(),
            key,
        }),
        false => Ok(sites),
    }
}

/// The kernel's NOP at the start of `bytes` (decoded, then compared with
/// the kernel's own), or what is there instead.
pub fn nop_at(bytes: &[u8], ip: u64) -> Result<Vec<u8>, String> {
    let mut d = Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE);
    let insn = d.decode();
    let len = insn.len();
    let got = &bytes[..len.min(bytes.len())];
    let is_nop = matches!(insn.code(), Code::Nopd | Code::Nopw | Code::Nop_rm32);
    match (is_nop, len) {
        (true, 2) if got == NOP2 => Ok(got.to_vec()),
        (true, 5) if got == NOP5 => Ok(got.to_vec()),
        _ => Err(format!("{got:02x?} ({insn})")),
    }
}

/// `JMP target` from `code` in `len` bytes (EB rel8 or E9 rel32, as
/// `text_gen_insn` makes them), decoded back and checked.
pub fn jump_bytes(code: u64, target: u64, len: usize) -> Result<Vec<u8>, String> {
    let rel = target.wrapping_sub(code + len as u64) as i64;
    let bytes = match len {
        2 => {
            let r = i8::try_from(rel)
                .map_err(|_| format!("a 2-byte site {rel} bytes from its target"))?;
            vec![0xeb, r as u8]
        }
        5 => {
            let r =
                i32::try_from(rel).map_err(|_| format!("a site {rel} bytes from its target"))?;
            let mut b = vec![0xe9];
            b.extend_from_slice(&r.to_le_bytes());
            b
        }
        _ => return Err(format!("a {len}-byte site")),
    };
    let insn = Decoder::with_ip(64, &bytes, code, DecoderOptions::NONE).decode();
    match insn.len() == len && insn.near_branch_target() == target {
        true => Ok(bytes),
        false => Err(format!("a jump that decodes as {insn}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jumps_decode_to_their_targets() {
        assert_eq!(jump_bytes(0x1000, 0x1010, 2).unwrap(), vec![0xeb, 0x0e]);
        assert_eq!(
            jump_bytes(0x1000, 0x0f00, 5).unwrap(),
            vec![0xe9, 0xfb, 0xfe, 0xff, 0xff]
        );
        assert!(jump_bytes(0x1000, 0x2000, 2).is_err());
    }

    #[test]
    fn only_the_kernels_nops_are_nops() {
        assert_eq!(nop_at(&NOP5, 0).unwrap(), NOP5.to_vec());
        assert_eq!(nop_at(&[0x66, 0x90, 0xcc], 0).unwrap(), NOP2.to_vec());
        // A JMP (an enabled site) and another 5-byte NOP are not.
        assert!(nop_at(&[0xe9, 0, 0, 0, 0], 0).is_err());
        assert!(nop_at(&[0x0f, 0x1f, 0x44, 0x00, 0x01], 0).is_err());
    }
}
