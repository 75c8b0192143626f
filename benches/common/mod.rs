//! Shared by the benches: guest memory images and the synthetic trace.
#![allow(dead_code)]

use std::path::PathBuf;

use object::read::elf::{ElfFile64, ProgramHeader};
use tracer::trace::model::Trace;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// Where the kernel's text is linked (Linux `__START_KERNEL_map` + 16 MiB).
pub const TEXT: u64 = 0xffff_ffff_8100_0000;

/// guest/out/vmlinux, if it has been built.
pub fn vmlinux() -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("guest/out/vmlinux");
    if p.is_file() {
        Some(p)
    } else {
        eprintln!(
            "skipped: {} is absent (build it with `bash guest/build.sh linux`)",
            p.display()
        );
        None
    }
}

/// `mib` MiB of guest memory with vmtrace's boot page tables: the first
/// 4 GiB identity-mapped, 0xffffffff80000000 mapped to physical 0.
pub fn memory(mib: usize) -> GuestMemoryMmap {
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), mib << 20)]).unwrap();
    vmm::boot::regs::setup_page_tables(&mem).unwrap();
    mem
}

/// Guest memory holding an ELF file's PT_LOAD segments at their physical
/// addresses (p_paddr), as a loader puts them; the rest stays zero.
pub fn load_elf(path: &std::path::Path, mib: usize) -> GuestMemoryMmap {
    let mem = memory(mib);
    let data = std::fs::read(path).unwrap();
    let elf = ElfFile64::<object::Endianness>::parse(&*data).unwrap();
    let endian = elf.endian();
    for ph in elf.elf_program_headers() {
        if ph.p_type(endian) != object::elf::PT_LOAD {
            continue;
        }
        let bytes = ph.data(endian, &*data).unwrap();
        mem.write_slice(bytes, GuestAddress(ph.p_paddr(endian)))
            .unwrap();
    }
    mem
}

/// The synthetic trace the report figures use.
pub fn synthetic_trace(events: u64) -> Trace {
    Trace::synthetic(events)
}
