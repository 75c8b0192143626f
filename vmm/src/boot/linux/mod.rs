//! Linux's x86 boot protocol (Documentation/arch/x86/boot.rst), 64-bit entry:
//! the kernel, the initrd, the command line and the zero page
//! (`struct boot_params`) that the boot vCPU is handed in RSI.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::mem::size_of;
use std::path::Path;

use linux_loader::cmdline::Cmdline;
use linux_loader::loader::bootparam::{
    boot_e820_entry, boot_params, setup_header, CAN_USE_HEAP, E820_MAX_ENTRIES_ZEROPAGE,
    LOADED_HIGH,
};
use linux_loader::loader::{bzimage::BzImage, load_cmdline, KernelLoader};
use vm_memory::{
    Address, ByteValued, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, ReadVolatile,
};

use crate::boot::mptable::MPTABLE_START;
use crate::layout::{
    ACPI_SIZE, ACPI_START, CMDLINE_MAX_SIZE, CMDLINE_START, HIGH_MEM_START, MAX_MEM_MIB,
    ZERO_PAGE_START,
};

mod error;
mod header;

pub use error::LinuxBootError;
use error::Result;
pub use header::{bzimage_version, check_bzimage, is_bzimage};
use header::{file_len, setup_len};
use header::{BOOT_FLAG, HDRS_MAGIC, HDRS_OFFSET, SETUP_HEADER_OFFSET};

// TODO(layout): the constants below could move to layout.rs.

/// The 64-bit entry point is this far into the protected-mode kernel.
const ENTRY_64_OFFSET: u64 = 0x200;
/// First boot protocol whose header has `cmdline_size`.
const CMDLINE_SIZE_PROTOCOL: u16 = 0x0206;
/// `type_of_loader` for a boot loader without an assigned id.
const UNDEFINED_LOADER: u8 = 0xff;
/// `vid_mode` "normal" (80x25 text, no prompt).
const VID_MODE_NORMAL: u16 = 0xffff;
/// `heap_end_ptr`: end of the setup heap minus 0x200, as in boot.rst's sample
/// loader (heap ends at 0xe000). The 64-bit entry does not use the heap.
const HEAP_END_PTR: u16 = 0xe000 - 0x200;
/// `initrd_addr_max` of kernels that leave it 0 (boot protocol < 2.03).
const DEFAULT_INITRD_ADDR_MAX: u64 = 0x37ff_ffff;
/// Initrd placement granularity.
const PAGE_SIZE: u64 = 0x1000;
/// `kernel_alignment` given to a vmlinux ELF without a setup header (16 MiB,
/// Firecracker's value and Linux's default CONFIG_PHYSICAL_ALIGN upper bound).
const ELF_KERNEL_ALIGNMENT: u32 = 0x100_0000;

const E820_RAM: u32 = 1;
/// e820 type 3, "ACPI reclaimable": the ACPI tables (`boot::acpi`).
const E820_ACPI: u32 = 3;

/// A loaded Linux kernel, ready for the 64-bit entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinuxBoot {
    /// Guest-physical address of the 64-bit entry point.
    pub entry: u64,
    /// Guest-physical address of the zero page (`boot_params`), for RSI.
    pub zero_page: u64,
}

/// Load `kernel` (a bzImage: the file or, as `vmm::boot` does, a `Cursor`
/// over the bytes read once) and the optional initrd into `mem`, write
/// the command line and the zero page.
///
/// The protected-mode kernel goes to the header's `code32_start` (1 MiB);
/// the initrd, page-aligned, to the top of RAM below 4 GiB and below the
/// kernel's `initrd_addr_max`, above the memory the kernel needs to
/// decompress itself.
pub fn load_bzimage<K: Read + ReadVolatile + Seek>(
    mem: &GuestMemoryMmap,
    kernel: &mut K,
    kernel_path: &Path,
    initrd: Option<(&mut File, &Path)>,
    cmdline: &str,
    mem_size: u64,
) -> Result<LinuxBoot> {
    check_mem_size(mem, mem_size)?;
    let hdr = check_bzimage(kernel, kernel_path)?;
    // Fail on a bad command line before copying anything.
    let cmdline = build_cmdline(cmdline, Some(&hdr))?;
    let kernel_end = check_kernel_fits(kernel, kernel_path, &hdr, mem_size)?;
    let (load_addr, hdr) = load_kernel(mem, kernel, kernel_path)?;
    let initrd = match initrd {
        Some((file, path)) => Some(load_initrd(
            mem,
            file,
            path,
            Some(&hdr),
            kernel_end,
            mem_size,
        )?),
        None => None,
    };
    let zero_page = write_boot_params(mem, Some(hdr), &cmdline, initrd, mem_size)?;
    Ok(LinuxBoot {
        // `load_addr` is the u32 `code32_start`, and check_kernel_fits put it
        // below `mem_size`: no overflow.
        entry: load_addr + ENTRY_64_OFFSET,
        zero_page,
    })
}

/// Write the zero page for a kernel loaded some other way (vmlinux ELF): e820
/// map, command line and the setup header (`setup_header`, or boot protocol
/// defaults if `None`). `initrd` is `(guest address, size)` of an initrd the
/// caller already placed (see [`load_initrd`]). Returns the zero page's
/// address.
pub fn write_zero_page(
    mem: &GuestMemoryMmap,
    setup_header: Option<setup_header>,
    cmdline: &str,
    initrd: Option<(u64, u64)>,
    mem_size: u64,
) -> Result<u64> {
    check_mem_size(mem, mem_size)?;
    let cmdline = build_cmdline(cmdline, setup_header.as_ref())?;
    write_boot_params(mem, setup_header, &cmdline, initrd, mem_size)
}

/// Copy the initrd in `file` to the highest page-aligned address where it
/// fits: below `mem_size`, below 4 GiB and below the kernel's
/// `initrd_addr_max` (from `hdr`, if any), and not below `lowest` (the end of
/// the memory the kernel uses). Returns `(guest address, size)`.
pub fn load_initrd(
    mem: &GuestMemoryMmap,
    file: &mut File,
    path: &Path,
    hdr: Option<&setup_header>,
    lowest: u64,
    mem_size: u64,
) -> Result<(u64, u64)> {
    let read_err = |source| LinuxBootError::Read {
        path: path.to_owned(),
        what: "initrd",
        source,
    };
    let size = file.metadata().map_err(read_err)?.len();
    if size == 0 {
        return Err(LinuxBootError::InitrdEmpty {
            path: path.to_owned(),
        });
    }
    let top = initrd_top(hdr, mem_size);
    let too_large = || LinuxBootError::InitrdTooLarge {
        path: path.to_owned(),
        size,
        kernel_end: lowest,
        top,
    };
    let addr = top.checked_sub(size).ok_or_else(too_large)? & !(PAGE_SIZE - 1);
    if addr < lowest {
        return Err(too_large());
    }
    file.seek(SeekFrom::Start(0)).map_err(read_err)?;
    mem.read_exact_volatile_from(GuestAddress(addr), file, size as usize)
        .map_err(|source| LinuxBootError::InitrdCopy {
            path: path.to_owned(),
            addr,
            source,
        })?;
    Ok((addr, size))
}

/// One past the highest byte the initrd may occupy.
fn initrd_top(hdr: Option<&setup_header>, mem_size: u64) -> u64 {
    let addr_max = match hdr.map(|h| h.initrd_addr_max) {
        Some(0) | None => DEFAULT_INITRD_ADDR_MAX,
        Some(max) => u64::from(max),
    };
    // `initrd_addr_max` is the last byte the initrd may occupy (a u32 widened
    // to u64, so + 1 cannot overflow).
    mem_size.min(1 << 32).min(addr_max + 1)
}

/// RAM must run from 0 to `mem_size`, which must leave room above 1 MiB for
/// a kernel and stay below the 32-bit MMIO hole.
fn check_mem_size(mem: &GuestMemoryMmap, mem_size: u64) -> Result<()> {
    let bad = |why| Err(LinuxBootError::BadMemSize { mem_size, why });
    if mem_size <= HIGH_MEM_START {
        return bad("no RAM above 1 MiB for the kernel");
    }
    if mem_size > MAX_MEM_MIB << 20 {
        return bad("larger than the largest supported guest");
    }
    if !mem.address_in_range(GuestAddress(mem_size - 1)) {
        return bad("larger than the guest memory that was mapped");
    }
    Ok(())
}

/// Check the kernel fits in RAM, including the memory its decompressor uses;
/// return the end of that memory.
///
/// From the 64-bit entry, a relocatable kernel moves itself up to
/// `pref_address` (CONFIG_PHYSICAL_START) when loaded lower, and needs
/// `init_size` bytes from there.
fn check_kernel_fits<K: Seek>(
    file: &mut K,
    path: &Path,
    hdr: &setup_header,
    mem_size: u64,
) -> Result<u64> {
    let file_len = file_len(file, path)?;
    let payload = file_len.saturating_sub(setup_len(hdr));
    let load = u64::from(hdr.code32_start);
    // `pref_address` is a whole u64 from the file: a hostile or corrupt
    // header must get an error, not a wrapped end that passes the check below.
    let (run, run_field) = if hdr.pref_address > load {
        (hdr.pref_address, "pref_address")
    } else {
        (load, "code32_start")
    };
    let overflow = |field, value, addend_what, addend| LinuxBootError::HeaderOverflow {
        path: path.to_owned(),
        field,
        value,
        addend_what,
        addend,
    };
    let load_end = load.checked_add(payload).ok_or_else(|| {
        overflow(
            "code32_start",
            load,
            "the protected-mode kernel's size",
            payload,
        )
    })?;
    let init_size = u64::from(hdr.init_size);
    let run_end = run
        .checked_add(init_size)
        .ok_or_else(|| overflow(run_field, run, "init_size", init_size))?;
    let needed = load_end.max(run_end);
    if needed > mem_size {
        return Err(LinuxBootError::KernelTooBig {
            path: path.to_owned(),
            needed,
            mem_size,
        });
    }
    Ok(needed)
}

/// Copy the protected-mode kernel to `code32_start`; return the load address
/// and the setup header, trimmed to the length the header declares.
fn load_kernel<K: Read + ReadVolatile + Seek>(
    mem: &GuestMemoryMmap,
    file: &mut K,
    path: &Path,
) -> Result<(u64, setup_header)> {
    let loaded =
        BzImage::load(mem, None, file, Some(GuestAddress(HIGH_MEM_START))).map_err(|source| {
            LinuxBootError::Load {
                path: path.to_owned(),
                source,
            }
        })?;
    // BzImage::load always returns the header for a bzImage.
    let mut hdr = loaded.setup_header.unwrap_or_default();
    trim_setup_header(&mut hdr);
    Ok((loaded.kernel_load.raw_value(), hdr))
}

/// The setup header ends at 0x202 + the byte at 0x201 (the operand of the
/// jump at 0x200); bytes read past that are code, not header fields, on
/// kernels older than our `setup_header` struct. Zero them. (Left alone if
/// 0x200 is not a short jump, which no real bzImage has.)
fn trim_setup_header(hdr: &mut setup_header) {
    const JMP_SHORT: u16 = 0xeb;
    if hdr.jump & 0xff != JMP_SHORT {
        return;
    }
    // The header's length: a constant plus a byte from the file, no overflow.
    let len = (HDRS_OFFSET - SETUP_HEADER_OFFSET) as usize + usize::from(hdr.jump >> 8);
    if let Some(tail) = hdr.as_mut_slice().get_mut(len..) {
        tail.fill(0);
    }
}

/// Validate the command line against our limit and the kernel's.
fn build_cmdline(cmdline: &str, hdr: Option<&setup_header>) -> Result<Cmdline> {
    let mut max = CMDLINE_MAX_SIZE - 1;
    if let Some(h) = hdr {
        if h.version >= CMDLINE_SIZE_PROTOCOL && h.cmdline_size != 0 {
            max = max.min(h.cmdline_size as usize);
        }
    }
    if cmdline.len() > max {
        return Err(LinuxBootError::CmdlineTooLong {
            len: cmdline.len(),
            max,
        });
    }
    Cmdline::try_from(cmdline, CMDLINE_MAX_SIZE).map_err(LinuxBootError::Cmdline)
}

/// The e820 map: low RAM up to the MP table, the ACPI tables, then RAM from
/// 1 MiB to `mem_size`. The rest of `[MPTABLE_START, 1 MiB)` (the MP table,
/// the EBDA and the legacy VGA/BIOS area) is left out (Linux treats holes
/// as reserved).
fn e820_map(mem_size: u64) -> Vec<boot_e820_entry> {
    let entry = |addr: u64, end: u64, r#type| boot_e820_entry {
        addr,
        size: end - addr,
        r#type,
    };
    vec![
        entry(0, MPTABLE_START, E820_RAM),
        entry(ACPI_START, ACPI_START + ACPI_SIZE, E820_ACPI),
        entry(HIGH_MEM_START, mem_size, E820_RAM),
    ]
}

/// The setup header for a kernel without one (vmlinux ELF): only what the
/// kernel checks for.
fn default_setup_header() -> setup_header {
    setup_header {
        boot_flag: BOOT_FLAG,
        header: HDRS_MAGIC,
        kernel_alignment: ELF_KERNEL_ALIGNMENT,
        loadflags: LOADED_HIGH,
        ..Default::default()
    }
}

/// The zero page for `hdr` (or defaults), `cmdline` at [`CMDLINE_START`], the
/// initrd at `initrd`, and `mem_size` bytes of RAM.
fn boot_params_for(
    hdr: Option<setup_header>,
    cmdline_len: usize,
    initrd: Option<(u64, u64)>,
    mem_size: u64,
) -> boot_params {
    let mut params = boot_params {
        hdr: hdr.unwrap_or_else(default_setup_header),
        ..Default::default()
    };
    let h = &mut params.hdr;
    h.type_of_loader = UNDEFINED_LOADER;
    h.ext_loader_ver = 0;
    h.ext_loader_type = 0;
    h.loadflags |= CAN_USE_HEAP;
    h.heap_end_ptr = HEAP_END_PTR;
    h.vid_mode = VID_MODE_NORMAL;
    h.cmd_line_ptr = CMDLINE_START as u32;
    // Without the NUL, like the kernel's own `cmdline_size`.
    h.cmdline_size = cmdline_len as u32;
    let (addr, size) = initrd.unwrap_or((0, 0));
    h.ramdisk_image = addr as u32;
    h.ramdisk_size = size as u32;
    params.ext_ramdisk_image = (addr >> 32) as u32;
    params.ext_ramdisk_size = (size >> 32) as u32;
    params.ext_cmd_line_ptr = (CMDLINE_START >> 32) as u32;
    // Where boot::acpi puts the RSDP (Linux also finds it by scanning).
    params.acpi_rsdp_addr = ACPI_START;

    let e820 = e820_map(mem_size);
    debug_assert!(e820.len() <= E820_MAX_ENTRIES_ZEROPAGE);
    params.e820_entries = e820.len() as u8;
    params.e820_table[..e820.len()].copy_from_slice(&e820);
    params
}

/// Write the command line and the zero page; return the zero page's address.
fn write_boot_params(
    mem: &GuestMemoryMmap,
    hdr: Option<setup_header>,
    cmdline: &Cmdline,
    initrd: Option<(u64, u64)>,
    mem_size: u64,
) -> Result<u64> {
    load_cmdline(mem, GuestAddress(CMDLINE_START), cmdline).map_err(|source| {
        LinuxBootError::WriteCmdline {
            addr: CMDLINE_START,
            source,
        }
    })?;
    let cmdline_len = cmdline
        .as_cstring()
        .map_err(LinuxBootError::Cmdline)?
        .as_bytes()
        .len();
    let params = boot_params_for(hdr, cmdline_len, initrd, mem_size);
    debug_assert_eq!(size_of::<boot_params>(), 4096);
    mem.write_obj(params, GuestAddress(ZERO_PAGE_START))
        .map_err(|source| LinuxBootError::WriteZeroPage {
            addr: ZERO_PAGE_START,
            source,
        })?;
    Ok(ZERO_PAGE_START)
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use linux_loader::loader::bootparam::XLF_KERNEL_64;
    use std::path::PathBuf;

    const MEM_SIZE: u64 = 64 << 20;
    const SETUP_SECTS: u8 = 2;
    const PAYLOAD_OFFSET: usize = (SETUP_SECTS as usize + 1) * 512;
    const INIT_SIZE: u32 = 4 << 20;
    const PREF_ADDRESS: u64 = 0x100_0000;

    /// A file in the temp directory, removed on drop.
    struct TempFile {
        path: PathBuf,
        file: File,
    }

    impl TempFile {
        fn new(bytes: &[u8]) -> TempFile {
            static N: AtomicU32 = AtomicU32::new(0);
            let path = std::env::temp_dir().join(format!(
                "vmtrace-linux-test-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let mut file = File::options()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)
                .unwrap();
            file.write_all(bytes).unwrap();
            file.rewind().unwrap();
            TempFile { path, file }
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.path);
        }
    }

    fn test_header() -> setup_header {
        setup_header {
            setup_sects: SETUP_SECTS,
            boot_flag: BOOT_FLAG,
            // jmp short over the whole (2.15) header: ends at 0x26c.
            jump: 0x6aeb,
            header: HDRS_MAGIC,
            version: 0x020f,
            loadflags: LOADED_HIGH,
            code32_start: HIGH_MEM_START as u32,
            initrd_addr_max: 0x7fff_ffff,
            kernel_alignment: 0x20_0000,
            relocatable_kernel: 1,
            xloadflags: XLF_KERNEL_64,
            cmdline_size: 2047,
            pref_address: PREF_ADDRESS,
            init_size: INIT_SIZE,
            syssize: 3000 / 16,
            ..Default::default()
        }
    }

    fn payload() -> Vec<u8> {
        (0..3000u32).map(|i| (i * 7 + 3) as u8).collect()
    }

    /// A minimal bzImage: boot sector and setup sectors (zero but for the
    /// header) followed by a small "protected-mode kernel".
    fn fake_bzimage(hdr: setup_header) -> Vec<u8> {
        let mut image = vec![0u8; PAYLOAD_OFFSET];
        let off = SETUP_HEADER_OFFSET as usize;
        image[off..off + size_of::<setup_header>()].copy_from_slice(hdr.as_slice());
        image.extend_from_slice(&payload());
        image
    }

    fn guest_mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE as usize)]).unwrap()
    }

    fn read_bytes(mem: &GuestMemoryMmap, addr: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        mem.read_slice(&mut buf, GuestAddress(addr)).unwrap();
        buf
    }

    fn zero_page(mem: &GuestMemoryMmap) -> boot_params {
        mem.read_obj(GuestAddress(ZERO_PAGE_START)).unwrap()
    }

    fn load(
        mem: &GuestMemoryMmap,
        kernel: &mut TempFile,
        initrd: Option<&mut TempFile>,
        cmdline: &str,
    ) -> Result<LinuxBoot> {
        load_bzimage(
            mem,
            &mut kernel.file,
            &kernel.path,
            initrd.map(|t| (&mut t.file, t.path.as_path())),
            cmdline,
            MEM_SIZE,
        )
    }

    /// What loading a fake bzImage with `hdr` (no initrd, empty command
    /// line) fails with.
    fn load_err(mem: &GuestMemoryMmap, hdr: setup_header) -> LinuxBootError {
        let mut kernel = TempFile::new(&fake_bzimage(hdr));
        load(mem, &mut kernel, None, "").unwrap_err()
    }

    fn e820(params: &boot_params) -> Vec<(u64, u64, u32)> {
        let table = params.e820_table;
        table[..usize::from(params.e820_entries)]
            .iter()
            .map(|e| (e.addr, e.size, e.r#type))
            .collect()
    }

    #[test]
    fn loads_kernel_cmdline_and_zero_page() {
        let mem = guest_mem();
        let mut kernel = TempFile::new(&fake_bzimage(test_header()));
        let cmdline = "console=ttyS0 reboot=k panic=-1";
        let boot = load(&mem, &mut kernel, None, cmdline).unwrap();

        assert_eq!(boot.entry, HIGH_MEM_START + 0x200);
        assert_eq!(boot.zero_page, ZERO_PAGE_START);
        assert_eq!(read_bytes(&mem, HIGH_MEM_START, 3000), payload());

        let mut expected = cmdline.as_bytes().to_vec();
        expected.push(0);
        assert_eq!(read_bytes(&mem, CMDLINE_START, expected.len()), expected);

        let p = zero_page(&mem);
        let h = p.hdr;
        assert_eq!(h.type_of_loader, 0xff);
        assert_eq!(
            h.loadflags & (LOADED_HIGH | CAN_USE_HEAP),
            LOADED_HIGH | CAN_USE_HEAP
        );
        assert_eq!({ h.heap_end_ptr }, HEAP_END_PTR);
        assert_eq!({ h.cmd_line_ptr }, CMDLINE_START as u32);
        assert_eq!({ h.cmdline_size }, cmdline.len() as u32);
        assert_eq!(h.ext_loader_ver, 0);
        assert_eq!({ h.vid_mode }, 0xffff);
        assert_eq!({ h.ramdisk_image }, 0);
        assert_eq!({ h.ramdisk_size }, 0);
        // Copied from the file.
        assert_eq!({ h.header }, HDRS_MAGIC);
        assert_eq!({ h.version }, 0x020f);
        assert_eq!({ h.xloadflags }, XLF_KERNEL_64);
        assert_eq!({ h.init_size }, INIT_SIZE);
        assert_eq!({ h.code32_start }, HIGH_MEM_START as u32);

        assert_eq!(
            e820(&p),
            vec![
                (0, MPTABLE_START, E820_RAM),
                (ACPI_START, ACPI_SIZE, E820_ACPI),
                (HIGH_MEM_START, MEM_SIZE - HIGH_MEM_START, E820_RAM),
            ]
        );
        assert_eq!({ p.acpi_rsdp_addr }, ACPI_START);
    }

    #[test]
    fn initrd_at_top_of_ram_page_aligned() {
        let mem = guest_mem();
        let mut kernel = TempFile::new(&fake_bzimage(test_header()));
        // Odd size, so the end is not page-aligned.
        let initrd_bytes: Vec<u8> = (0..10_001u32).map(|i| (i % 251) as u8).collect();
        let mut initrd = TempFile::new(&initrd_bytes);
        load(&mem, &mut kernel, Some(&mut initrd), "console=ttyS0").unwrap();

        let h = zero_page(&mem).hdr;
        let (image, size) = (u64::from(h.ramdisk_image), u64::from(h.ramdisk_size));
        assert_eq!(size, initrd_bytes.len() as u64);
        assert_eq!(image % PAGE_SIZE, 0);
        assert!(image + size <= MEM_SIZE);
        assert!(MEM_SIZE - (image + size) < PAGE_SIZE, "at the top of RAM");
        assert_eq!(read_bytes(&mem, image, initrd_bytes.len()), initrd_bytes);
    }

    #[test]
    fn initrd_respects_initrd_addr_max() {
        let mem = guest_mem();
        let mut hdr = test_header();
        hdr.initrd_addr_max = (32 << 20) - 1;
        let mut kernel = TempFile::new(&fake_bzimage(hdr));
        let mut initrd = TempFile::new(&[0x5a; 5000]);
        load(&mem, &mut kernel, Some(&mut initrd), "").unwrap();

        let h = zero_page(&mem).hdr;
        let image = u64::from(h.ramdisk_image);
        assert_eq!(image, (32 << 20) - 2 * PAGE_SIZE);
        assert_eq!(read_bytes(&mem, image, 5000), vec![0x5a; 5000]);
    }

    #[test]
    fn initrd_too_large() {
        let mem = guest_mem();
        let mut kernel = TempFile::new(&fake_bzimage(test_header()));
        // The kernel needs [1 MiB, 16 MiB + 4 MiB); 64 MiB - 20 MiB is left.
        let mut initrd = TempFile::new(&vec![1u8; (MEM_SIZE - (20 << 20) + 1) as usize]);
        let err = load(&mem, &mut kernel, Some(&mut initrd), "").unwrap_err();
        assert!(
            matches!(err, LinuxBootError::InitrdTooLarge { kernel_end, top, .. }
                if kernel_end == PREF_ADDRESS + u64::from(INIT_SIZE) && top == MEM_SIZE),
            "{err}"
        );
        // One byte less fits, exactly from the end of the kernel.
        let mut initrd = TempFile::new(&vec![1u8; (MEM_SIZE - (20 << 20)) as usize]);
        load(&mem, &mut kernel, Some(&mut initrd), "").unwrap();
        let h = zero_page(&mem).hdr;
        assert_eq!(u64::from(h.ramdisk_image), 20 << 20);
    }

    #[test]
    fn empty_initrd_is_an_error() {
        let mem = guest_mem();
        let mut kernel = TempFile::new(&fake_bzimage(test_header()));
        let mut initrd = TempFile::new(&[]);
        let err = load(&mem, &mut kernel, Some(&mut initrd), "").unwrap_err();
        assert!(matches!(err, LinuxBootError::InitrdEmpty { .. }), "{err}");
    }

    #[test]
    fn cmdline_too_long() {
        let mem = guest_mem();
        let mut kernel = TempFile::new(&fake_bzimage(test_header()));
        let long = "a".repeat(CMDLINE_MAX_SIZE);
        let err = load(&mem, &mut kernel, None, &long).unwrap_err();
        assert!(
            matches!(err, LinuxBootError::CmdlineTooLong { len, max }
                if len == CMDLINE_MAX_SIZE && max == CMDLINE_MAX_SIZE - 1),
            "{err}"
        );
        // The longest accepted one, NUL included, fills CMDLINE_MAX_SIZE.
        let longest = "a".repeat(CMDLINE_MAX_SIZE - 1);
        load(&mem, &mut kernel, None, &longest).unwrap();
        assert_eq!(read_bytes(&mem, CMDLINE_START + 2047, 1), [0]);
    }

    #[test]
    fn cmdline_limited_by_kernel_header() {
        let mem = guest_mem();
        let mut hdr = test_header();
        hdr.cmdline_size = 255;
        let mut kernel = TempFile::new(&fake_bzimage(hdr));
        let err = load(&mem, &mut kernel, None, &"b".repeat(256)).unwrap_err();
        assert!(
            matches!(err, LinuxBootError::CmdlineTooLong { max: 255, .. }),
            "{err}"
        );
    }

    #[test]
    fn not_a_bzimage() {
        let mem = guest_mem();
        let mut elf = vec![0u8; 4096];
        elf[..4].copy_from_slice(b"\x7fELF");
        let mut kernel = TempFile::new(&elf);
        assert!(!is_bzimage(&mut kernel.file).unwrap());
        let err = load(&mem, &mut kernel, None, "").unwrap_err();
        assert!(matches!(err, LinuxBootError::NotBzImage { .. }), "{err}");
        assert!(err.to_string().contains("ELF"), "{err}");

        let mut tiny = TempFile::new(b"MZ");
        assert!(!is_bzimage(&mut tiny.file).unwrap());
        let err = load(&mem, &mut tiny, None, "").unwrap_err();
        assert!(matches!(err, LinuxBootError::NotBzImage { .. }), "{err}");
    }

    #[test]
    fn a_header_cut_after_its_magic_is_called_truncated() {
        let mem = guest_mem();
        let mut cut = vec![0u8; 0x258];
        cut[0x202..0x206].copy_from_slice(b"HdrS");
        let mut kernel = TempFile::new(&cut);
        let err = load(&mem, &mut kernel, None, "").unwrap_err();
        assert!(
            matches!(err, LinuxBootError::HeaderCut { len: 0x258, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("truncated"), "{err}");
        assert!(!err.to_string().contains("no \"HdrS\""), "{err}");
    }

    #[test]
    fn is_bzimage_keeps_the_file_position() {
        let mut kernel = TempFile::new(&fake_bzimage(test_header()));
        kernel.file.seek(SeekFrom::Start(17)).unwrap();
        assert!(is_bzimage(&mut kernel.file).unwrap());
        assert_eq!(kernel.file.stream_position().unwrap(), 17);
    }

    #[test]
    fn old_or_32_bit_kernels_are_rejected() {
        let mem = guest_mem();
        let mut hdr = test_header();
        hdr.version = 0x020b;
        let err = load_err(&mem, hdr);
        assert!(
            matches!(
                err,
                LinuxBootError::UnsupportedKernel {
                    field: "version",
                    value: 0x20b,
                    ..
                }
            ),
            "{err}"
        );

        let mut hdr = test_header();
        hdr.xloadflags = 0;
        let mut kernel = TempFile::new(&fake_bzimage(hdr));
        let err = load(&mem, &mut kernel, None, "").unwrap_err();
        assert!(
            matches!(
                err,
                LinuxBootError::UnsupportedKernel {
                    field: "xloadflags",
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains(&kernel.path.display().to_string()));
    }

    #[test]
    fn kernel_too_big_for_memory() {
        let mem = guest_mem();
        let mut hdr = test_header();
        hdr.init_size = 60 << 20;
        let err = load_err(&mem, hdr);
        assert!(matches!(err, LinuxBootError::KernelTooBig { .. }), "{err}");
    }

    /// `pref_address` + `init_size` past 2^64: before these were checked, a
    /// debug build panicked ("attempt to add with overflow") and a release
    /// build wrapped, e.g. to 0x1ff000 below, which passed the fit check.
    #[test]
    fn header_addresses_that_overflow_are_an_error() {
        let mem = guest_mem();
        let pref = u64::MAX - 0xfff;
        for init_size in [u32::MAX, 0x20_0000] {
            let mut hdr = test_header();
            hdr.pref_address = pref;
            hdr.init_size = init_size;
            let err = load_err(&mem, hdr);
            assert!(
                matches!(
                    err,
                    LinuxBootError::HeaderOverflow {
                        field: "pref_address",
                        value,
                        addend_what: "init_size",
                        addend,
                        ..
                    } if value == pref && addend == u64::from(init_size)
                ),
                "{err}"
            );
            let msg = err.to_string();
            assert!(
                msg.contains("`pref_address` is 0xfffffffffffff000")
                    && msg.contains(&format!("init_size ({init_size:#x})")),
                "{msg}"
            );
        }
        // Far above RAM but no overflow: too big, with the true end.
        let mut hdr = test_header();
        hdr.pref_address = 1 << 40;
        let err = load_err(&mem, hdr);
        assert!(
            matches!(err, LinuxBootError::KernelTooBig { needed, .. }
                if needed == (1 << 40) + u64::from(INIT_SIZE)),
            "{err}"
        );
    }

    #[test]
    fn short_header_tail_is_zeroed() {
        let mem = guest_mem();
        let mut hdr = test_header();
        // A 2.12-era header ends after handover_offset (0x268); what follows
        // in the file is code.
        hdr.jump = 0x66eb;
        hdr.kernel_info_offset = 0xdead_beef;
        let mut kernel = TempFile::new(&fake_bzimage(hdr));
        load(&mem, &mut kernel, None, "").unwrap();
        let h = zero_page(&mem).hdr;
        assert_eq!({ h.kernel_info_offset }, 0);
        assert_eq!({ h.init_size }, INIT_SIZE);
    }

    #[test]
    fn memory_size_must_match_guest_memory() {
        let mem = guest_mem();
        let mut kernel = TempFile::new(&fake_bzimage(test_header()));
        let err = load_bzimage(
            &mem,
            &mut kernel.file,
            &kernel.path,
            None,
            "",
            MEM_SIZE + 4096,
        )
        .unwrap_err();
        assert!(matches!(err, LinuxBootError::BadMemSize { .. }), "{err}");
    }

    #[test]
    fn zero_page_for_elf_kernel() {
        let mem = guest_mem();
        let addr = write_zero_page(
            &mem,
            None,
            "console=ttyS0",
            Some((0x200_0000, 1234)),
            MEM_SIZE,
        )
        .unwrap();
        assert_eq!(addr, ZERO_PAGE_START);
        let p = zero_page(&mem);
        let h = p.hdr;
        assert_eq!({ h.boot_flag }, BOOT_FLAG);
        assert_eq!({ h.header }, HDRS_MAGIC);
        assert_eq!({ h.kernel_alignment }, ELF_KERNEL_ALIGNMENT);
        assert_eq!(h.type_of_loader, 0xff);
        assert_eq!({ h.cmd_line_ptr }, CMDLINE_START as u32);
        assert_eq!({ h.cmdline_size }, 13);
        assert_eq!({ h.ramdisk_image }, 0x200_0000);
        assert_eq!({ h.ramdisk_size }, 1234);
        assert_eq!(e820(&p).len(), 3);
        assert_eq!(read_bytes(&mem, CMDLINE_START, 14), b"console=ttyS0\0");

        let err = write_zero_page(&mem, None, &"x".repeat(4096), None, MEM_SIZE).unwrap_err();
        assert!(
            matches!(err, LinuxBootError::CmdlineTooLong { .. }),
            "{err}"
        );
    }

    #[test]
    fn zero_page_with_given_header() {
        let mem = guest_mem();
        let addr = write_zero_page(&mem, Some(test_header()), "quiet", None, MEM_SIZE).unwrap();
        let h = zero_page(&mem).hdr;
        assert_eq!(addr, ZERO_PAGE_START);
        assert_eq!({ h.version }, 0x020f);
        assert_eq!({ h.pref_address }, PREF_ADDRESS);
        assert_eq!(h.loadflags & CAN_USE_HEAP, CAN_USE_HEAP);
    }

    /// A bzImage cut short (its `syssize` says more than the file has) was
    /// loaded and booted into a triple fault; now it is refused.
    #[test]
    fn truncated_bzimage_is_refused() {
        let mem = guest_mem();
        let mut image = fake_bzimage(test_header());
        image.truncate(image.len() - 100);
        let mut kernel = TempFile::new(&image);
        let err = load(&mem, &mut kernel, None, "").unwrap_err();
        assert!(
            matches!(
                err,
                LinuxBootError::Truncated {
                    what: "setup sectors + syssize",
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("truncated"), "{err}");
        // Cut inside the setup sectors.
        let mut kernel = TempFile::new(&fake_bzimage(test_header())[..700]);
        let err = load(&mem, &mut kernel, None, "").unwrap_err();
        assert!(
            matches!(
                err,
                LinuxBootError::Truncated {
                    what: "setup_sects",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn corrupt_setup_header_is_refused() {
        let mem = guest_mem();
        let mut hdr = test_header();
        hdr.boot_flag = 0x1234;
        let err = load_err(&mem, hdr);
        assert!(
            matches!(
                err,
                LinuxBootError::CorruptHeader {
                    field: "boot_flag",
                    ..
                }
            ),
            "{err}"
        );
        let mut hdr = test_header();
        hdr.syssize = 0;
        let err = load_err(&mem, hdr);
        assert!(
            matches!(
                err,
                LinuxBootError::CorruptHeader {
                    field: "syssize",
                    ..
                }
            ),
            "{err}"
        );
        let mut hdr = test_header();
        hdr.kernel_version = 0x7000;
        let err = load_err(&mem, hdr);
        assert!(
            matches!(
                err,
                LinuxBootError::CorruptHeader {
                    field: "kernel_version",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn version_string_from_the_header() {
        let mut hdr = test_header();
        hdr.kernel_version = 0x300;
        let mut image = fake_bzimage(hdr);
        let v = b"6.1.0 (a@b) #1 SMP\0";
        image[0x500..0x500 + v.len()].copy_from_slice(v);
        let mut kernel = TempFile::new(&image);
        assert_eq!(
            bzimage_version(&mut kernel.file, &kernel.path)
                .unwrap()
                .as_deref(),
            Some("6.1.0 (a@b) #1 SMP")
        );
        let mut kernel = TempFile::new(&fake_bzimage(test_header()));
        assert_eq!(
            bzimage_version(&mut kernel.file, &kernel.path).unwrap(),
            None
        );
    }

    /// A fake bzImage whose header points to `version` and whose
    /// protected-mode kernel is `body` (3000 bytes, as `test_header` says).
    fn versioned_bzimage(version: &[u8], body: &[u8]) -> Vec<u8> {
        let mut hdr = test_header();
        hdr.kernel_version = 0x300;
        let mut image = fake_bzimage(hdr);
        image[0x500..0x500 + version.len()].copy_from_slice(version);
        image[PAYLOAD_OFFSET..].copy_from_slice(body);
        image
    }

    #[test]
    fn a_bzimage_rewritten_in_place_after_open_loads_as_opened() {
        let old = payload();
        let new: Vec<u8> = old.iter().rev().copied().collect();
        let mut file = TempFile::new(&versioned_bzimage(b"6.1.0 (old) #1\0", &old));
        let kernel = crate::boot::KernelFile::open(&file.path).unwrap();
        // `make install` or cp into the same inode, after planning.
        std::fs::write(&file.path, versioned_bzimage(b"6.9.9 (new) #2\0", &new)).unwrap();
        assert_eq!(
            bzimage_version(&mut file.file, &file.path)
                .unwrap()
                .as_deref(),
            Some("6.9.9 (new) #2"),
            "the file itself was rewritten"
        );

        assert_eq!(kernel.version(), Some("6.1.0 (old) #1"));
        assert_eq!(
            bzimage_version(&mut kernel.reader(), kernel.path())
                .unwrap()
                .as_deref(),
            Some("6.1.0 (old) #1")
        );
        let mem = guest_mem();
        crate::boot::load_kernel(&mem, &kernel, None, "", MEM_SIZE, 1).unwrap();
        assert_eq!(read_bytes(&mem, HIGH_MEM_START, old.len()), old);

        // Even emptied, the file opened is what loads.
        std::fs::write(&file.path, b"").unwrap();
        let mem = guest_mem();
        crate::boot::load_kernel(&mem, &kernel, None, "", MEM_SIZE, 1).unwrap();
        assert_eq!(read_bytes(&mem, HIGH_MEM_START, old.len()), old);
    }

    #[test]
    fn a_bzimage_kernel_file_has_no_shared_offset() {
        let image = versioned_bzimage(b"6.1.0 (a@b) #1\0", &payload());
        let file = TempFile::new(&image);
        let kernel = crate::boot::KernelFile::open(&file.path).unwrap();
        assert_eq!(kernel.size(), image.len() as u64);
        // A reader left anywhere moves no other.
        let mut left = kernel.reader();
        left.seek(SeekFrom::End(-5)).unwrap();
        let version = bzimage_version(&mut kernel.reader(), kernel.path()).unwrap();
        assert_eq!(version.as_deref(), Some("6.1.0 (a@b) #1"));
        assert_eq!(left.position(), image.len() as u64 - 5);
        // Loaders on two threads at once each read the whole image.
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for _ in 0..4 {
                        let mem = guest_mem();
                        crate::boot::load_kernel(&mem, &kernel, None, "", MEM_SIZE, 1).unwrap();
                        assert_eq!(read_bytes(&mem, HIGH_MEM_START, 3000), payload());
                        assert_eq!({ zero_page(&mem).hdr.header }, HDRS_MAGIC);
                    }
                });
            }
        });
        assert_eq!(left.position(), image.len() as u64 - 5);
    }
}
