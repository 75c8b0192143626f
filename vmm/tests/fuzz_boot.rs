//! Fuzz-style property tests (proptest) of the boot loaders' parsers: the
//! bzImage setup header (checked, its version string read, the kernel loaded
//! into guest memory) and an ELF kernel's program headers, on thousands of
//! mutated inputs: errors, never a panic or a hang.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use proptest::test_runner::Config;
use vm_memory::{GuestAddress, GuestMemoryMmap};

use vmm::boot::linux::{bzimage_version, check_bzimage, load_bzimage};

const CASES: u32 = 3000;
const MEM_SIZE: u64 = 64 << 20;

fn config() -> Config {
    Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("fuzz-boot-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

fn put(b: &mut [u8], at: usize, v: &[u8]) {
    b[at..at + v.len()].copy_from_slice(v);
}

/// A small valid bzImage: 2 setup sectors and a 3000-byte payload, boot
/// protocol 2.15, 64-bit, with a version string.
fn seed_bzimage() -> Vec<u8> {
    let mut b = vec![0u8; 3 * 512];
    b[0x1f1] = 2; // setup_sects
    put(&mut b, 0x1f4, &(3000u32 / 16).to_le_bytes()); // syssize
    put(&mut b, 0x1fe, &0xaa55u16.to_le_bytes()); // boot_flag
    put(&mut b, 0x200, &[0xeb, 0x6a]); // jump
    put(&mut b, 0x202, b"HdrS");
    put(&mut b, 0x206, &0x020fu16.to_le_bytes()); // version
    put(&mut b, 0x20e, &0x300u16.to_le_bytes()); // kernel_version
    b[0x211] = 1; // loadflags: LOADED_HIGH
    put(&mut b, 0x214, &0x10_0000u32.to_le_bytes()); // code32_start
    put(&mut b, 0x218, &0u32.to_le_bytes());
    put(&mut b, 0x22c, &0x7fff_ffffu32.to_le_bytes()); // initrd_addr_max
    put(&mut b, 0x230, &0x20_0000u32.to_le_bytes()); // kernel_alignment
    b[0x234] = 1; // relocatable_kernel
    put(&mut b, 0x236, &1u16.to_le_bytes()); // xloadflags: XLF_KERNEL_64
    put(&mut b, 0x238, &2047u32.to_le_bytes()); // cmdline_size
    put(&mut b, 0x258, &0x100_0000u64.to_le_bytes()); // pref_address
    put(&mut b, 0x260, &(4u32 << 20).to_le_bytes()); // init_size
    put(&mut b, 0x500, b"6.1.0 (a@b) #1 SMP\0");
    b.extend((0..3000u32).map(|i| (i * 7 + 3) as u8));
    b
}

/// A mutation: (offset, value, width) writes, bit flips, a truncation.
fn mutations(len: usize) -> impl Strategy<Value = (Vec<(usize, u64, usize)>, Option<usize>)> {
    // Most mutations hit the header, where the parser reads.
    let at = prop_oneof![3 => 0x1f0usize..0x270, 1 => 0..len];
    let value = prop_oneof![
        Just(0u64),
        Just(u64::MAX),
        Just(u64::from(u32::MAX)),
        0u64..0x1_0000,
        any::<u64>()
    ];
    (
        prop::collection::vec(
            (
                at,
                value,
                prop_oneof![Just(1usize), Just(2), Just(4), Just(8)],
            ),
            1..4,
        ),
        prop::option::weighted(0.2, 0..len + 1),
    )
}

fn mutate(seed: &[u8], writes: &[(usize, u64, usize)], cut: Option<usize>) -> Vec<u8> {
    let mut b = seed.to_vec();
    for &(at, v, w) in writes {
        if at + w <= b.len() {
            put(&mut b, at, &v.to_le_bytes()[..w]);
        }
    }
    if let Some(c) = cut {
        b.truncate(c);
    }
    b
}

#[test]
fn fuzz_bzimage_header() {
    let seed = seed_bzimage();
    let dir = scratch("bz");
    let p = dir.join("bzImage");
    // The seed itself is valid.
    fs::write(&p, &seed).unwrap();
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE as usize)]).unwrap();
    let mut f = File::open(&p).unwrap();
    assert_eq!(
        bzimage_version(&mut f, &p).unwrap().as_deref(),
        Some("6.1.0 (a@b) #1 SMP")
    );
    load_bzimage(&mem, &mut f, &p, None, "console=ttyS0", MEM_SIZE).unwrap();

    proptest!(config(), |((writes, cut) in mutations(seed.len()))| {
        let b = mutate(&seed, &writes, cut);
        fs::write(&p, &b).unwrap();
        let mut f = File::open(&p).unwrap();
        let checked = check_bzimage(&mut f, &p);
        let _ = bzimage_version(&mut f, &p);
        let loaded = load_bzimage(&mem, &mut f, &p, None, "console=ttyS0", MEM_SIZE);
        // Whatever loads passed the header checks.
        prop_assert!(loaded.is_err() || checked.is_ok());
        if let Err(e) = loaded {
            prop_assert!(!e.to_string().contains('\n'));
        }
    });
    fs::remove_dir_all(&dir).unwrap();
}

/// A minimal ELF64 header with two PT_LOAD program headers.
fn seed_elf() -> Vec<u8> {
    let mut b = vec![0u8; 0x1000];
    put(&mut b, 0, b"\x7fELF\x02\x01\x01");
    put(&mut b, 16, &2u16.to_le_bytes()); // ET_EXEC
    put(&mut b, 18, &62u16.to_le_bytes()); // x86-64
    put(&mut b, 20, &1u32.to_le_bytes());
    put(&mut b, 24, &0x10_0000u64.to_le_bytes()); // entry
    put(&mut b, 32, &64u64.to_le_bytes()); // phoff
    put(&mut b, 52, &64u16.to_le_bytes()); // ehsize
    put(&mut b, 54, &56u16.to_le_bytes()); // phentsize
    put(&mut b, 56, &2u16.to_le_bytes()); // phnum
    for (i, paddr) in [0x10_0000u64, 0x20_0000].into_iter().enumerate() {
        let ph = 64 + i * 56;
        put(&mut b, ph, &1u32.to_le_bytes()); // PT_LOAD
        put(&mut b, ph + 8, &0x200u64.to_le_bytes()); // offset
        put(&mut b, ph + 16, &paddr.to_le_bytes()); // vaddr
        put(&mut b, ph + 24, &paddr.to_le_bytes()); // paddr
        put(&mut b, ph + 32, &0x100u64.to_le_bytes()); // filesz
        put(&mut b, ph + 40, &0x2000u64.to_le_bytes()); // memsz
    }
    b
}

#[test]
fn fuzz_elf_segments() {
    let seed = seed_elf();
    let p = Path::new("kernel.elf");
    vmm::boot::check_elf_segments(&seed, p, MEM_SIZE).unwrap();
    let strategy = (
        prop::collection::vec(
            (
                prop_oneof![3 => 0usize..200, 1 => 0..seed.len()],
                prop_oneof![Just(0u64), Just(u64::MAX), 0u64..0x1000_0000, any::<u64>()],
                prop_oneof![Just(1usize), Just(2), Just(4), Just(8)],
            ),
            1..4,
        ),
        prop::option::weighted(0.2, 0..seed.len() + 1),
    );
    proptest!(config(), |((writes, cut) in strategy)| {
        let b = mutate(&seed, &writes, cut);
        if vmm::boot::check_elf_segments(&b, p, MEM_SIZE).is_ok() {
            // Accepted: every PT_LOAD is inside the file and RAM.
            let phoff = u64::from_le_bytes(b[32..40].try_into().unwrap()) as usize;
            let phnum = u16::from_le_bytes(b[56..58].try_into().unwrap()) as usize;
            for i in 0..phnum {
                let ph = phoff + i * 56;
                if u32::from_le_bytes(b[ph..ph + 4].try_into().unwrap()) != 1 {
                    continue;
                }
                let word = |o: usize| u64::from_le_bytes(b[ph + o..ph + o + 8].try_into().unwrap());
                prop_assert!(word(24) >= 0x10_0000 && word(24) + word(40) <= MEM_SIZE);
                prop_assert!(word(8) + word(32) <= b.len() as u64);
            }
        }
    });
}
