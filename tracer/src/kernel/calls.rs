//! The targets of the direct calls (`call rel32`) in a kernel image's
//! code: an address some instruction calls is entered with a return
//! address at `[rsp]`, which is what a function entry is
//! (`crate::kernel::direct::entries`).
//!
//! Every executable section is decoded once, linearly, restarting at each
//! function's start (a known instruction boundary), so that padding or
//! data between functions cannot shift the decoding of the next one.

use iced_x86::{Code, Decoder, DecoderOptions, Instruction};
use object::elf::{SHF_ALLOC, SHF_EXECINSTR};
use object::{Object, ObjectSection, SectionFlags};

use crate::kernel::symbols::KernelImage;

/// The first byte of `call rel32`: a cheap filter before decoding a chunk
/// (most chunks have calls, but this skips the padding between them).
const CALL_REL32: u8 = 0xe8;

/// Every address a `call rel32` in `image`'s executable sections targets,
/// sorted, once each. Empty when the image's bytes are no ELF file.
pub fn call_targets(image: &KernelImage) -> Vec<u64> {
    let Ok(file) = object::File::parse(image.bytes.as_slice()) else {
        return Vec::new();
    };
    let mut targets = Vec::new();
    for section in file.sections() {
        let SectionFlags::Elf { sh_flags } = section.flags() else {
            continue;
        };
        let code = u64::from(SHF_ALLOC | SHF_EXECINSTR);
        if sh_flags & code != code {
            continue;
        }
        let (start, size) = (section.address(), section.size());
        let Some(bytes) = usize::try_from(size)
            .ok()
            .and_then(|n| image.file_bytes(start, n))
        else {
            continue;
        };
        // Chunk boundaries: the section's start and every function in it.
        let first = image.functions.partition_point(|f| f.addr <= start);
        let mut bounds = vec![start];
        bounds.extend(
            image.functions[first..]
                .iter()
                .map(|f| f.addr)
                .take_while(|&a| a < start + size),
        );
        bounds.push(start + size);
        bounds.dedup();
        for w in bounds.windows(2) {
            let chunk = &bytes[(w[0] - start) as usize..(w[1] - start) as usize];
            scan(w[0], chunk, &mut targets);
        }
    }
    targets.sort_unstable();
    targets.dedup();
    targets
}

/// Adds the targets of the `call rel32`s in `code` (at `addr`) to `out`.
fn scan(addr: u64, code: &[u8], out: &mut Vec<u64>) {
    if !code.contains(&CALL_REL32) {
        return;
    }
    let mut d = Decoder::with_ip(64, code, addr, DecoderOptions::NONE);
    let mut i = Instruction::default();
    while d.can_decode() {
        d.decode_out(&mut i);
        if i.code() == Code::Call_rel32_64 {
            out.push(i.near_branch_target());
        }
    }
}
