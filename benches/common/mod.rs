//! Shared by the benches: guest memory images and the synthetic trace.
#![allow(dead_code)]

use std::path::PathBuf;

use object::read::elf::{ElfFile64, ProgramHeader};
use tracer::trace::{Event, FuncSym, Trace, TraceMeta};
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

/// A deterministic synthetic trace: `events` calls of 500 functions from 200
/// callers on 4 vCPUs, skewed (a few hot functions), 1 in 1,000 return
/// addresses in no known function. (`vmtrace bench` times the same shape.)
pub fn synthetic_trace(events: u64) -> Trace {
    const FUNCS: usize = 500;
    const CALLERS: usize = 200;
    const CPUS: u32 = 4;
    const CALLER_TEXT: u64 = 0xffff_ffff_8200_0000;
    let functions: Vec<FuncSym> = (0..FUNCS)
        .map(|i| FuncSym {
            name: format!("subsys{}_function_{i}", i % 17),
            addr: TEXT + i as u64 * 0x400,
            size: 0x300,
        })
        .collect();
    let callers: Vec<FuncSym> = (0..CALLERS)
        .map(|i| FuncSym {
            name: format!("caller_{i}"),
            addr: CALLER_TEXT + i as u64 * 0x200,
            size: 0x200,
        })
        .collect();
    let mut counts = vec![vec![0u64; CPUS as usize]; FUNCS];
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut ev = Vec::with_capacity(events as usize);
    for i in 0..events {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let r = state.wrapping_mul(0x2545_f491_4f6c_dd1d);
        let func = ((r % 1000) * ((r >> 10) % 1000) / 2000) as usize % FUNCS;
        let cpu = (i % u64::from(CPUS)) as u32;
        let parent = if (r >> 20).is_multiple_of(1000) {
            0xffff_ffff_8300_0000 + (r >> 32) % 0x1000
        } else {
            let c = (func * 7 + ((r >> 30) % 3) as usize) % CALLERS;
            CALLER_TEXT + c as u64 * 0x200 + 0x10 + (r >> 40) % 0x100
        };
        counts[func][cpu as usize] += 1;
        ev.push(Event {
            ts_ns: 1_000_000 + i * 100,
            parent,
            func: func as u32,
            cpu,
        });
    }
    Trace {
        meta: TraceMeta {
            kernel: "synthetic".into(),
            cpus: CPUS,
            attach_ns: 1_000_000,
            detach_ns: 1_000_000 + events * 100,
            sites_patched: FUNCS as u64,
            events_total: events,
            stop_reason: "synthetic".into(),
            ..TraceMeta::default()
        },
        functions,
        counts,
        callers,
        events: ev,
    }
}
