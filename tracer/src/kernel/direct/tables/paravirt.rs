//! `.parainstructions`: the paravirt call sites `apply_paravirt` patches
//! at boot (Linux up to 6.7; 6.8 made them alternatives, which
//! `.altinstructions` lists). Its entries, unlike the other tables',
//! hold absolute addresses: 6.1's arch/x86/include/asm/paravirt_types.h
//! `struct paravirt_patch_site { u8 *instr; u8 type; u8 len; }`, emitted
//! by `_paravirt_alt` as `_ASM_PTR 771b; .byte type; .byte len; .short
//! clobbers`, 8-byte aligned.

use crate::kernel::symbols::KernelImage;

use super::TableError;

/// The output section (6.1's arch/x86/kernel/vmlinux.lds.S).
pub const SECTION: &str = ".parainstructions";
/// Its linker-script bounds.
pub const BOUNDS: (&str, &str) = ("__parainstructions", "__parainstructions_end");
/// One entry: the pointer, type, length and clobbers, padded to 8.
const ENTRY: usize = 16;
/// Where the site's length is in an entry (after the pointer and type).
const LEN_AT: usize = 9;
/// Entry sizes, for the error.
const SIZES: &[usize] = &[ENTRY];

/// Each site of the table at `addr..end`: `(address, length)`.
pub fn read(
    image: &KernelImage,
    code: &[(u64, u64)],
    addr: u64,
    end: u64,
) -> Result<Vec<(u64, u64)>, TableError> {
    let len = (end - addr) as usize;
    let malformed = || TableError::Malformed {
        path: image.path.clone(),
        section: SECTION,
        addr,
        len,
        sizes: SIZES,
    };
    let data = image.file_bytes(addr, len).ok_or_else(malformed)?;
    if !len.is_multiple_of(ENTRY) {
        return Err(malformed());
    }
    data.chunks_exact(ENTRY)
        .map(|e| {
            let site = u64::from_le_bytes(e[..8].try_into().expect("8 bytes"));
            let n = u64::from(e[LEN_AT]);
            (n > 0 && super::in_code(image, code, site))
                .then_some((site, n))
                .ok_or_else(malformed)
        })
        .collect()
}
