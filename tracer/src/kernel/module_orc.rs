//! A loaded module's ORC tables (`--stack` through a module's functions),
//! read from the guest's memory as the kernel's unwinder finds them:
//! `mod->arch.orc_unwind_ip`, `orc_unwind` and `num_orcs`
//! (arch/x86/include/asm/module.h `struct mod_arch_specific`, filled by
//! arch/x86/kernel/module.c module_finalize and sorted in place by
//! unwind_orc.c unwind_module_init). Each `orc_unwind_ip` entry is an s32
//! relative to its own address, as in vmlinux. Only the entries in the
//! module's core text are kept: its init text is freed after the load
//! and its addresses may be another module's by now.

use vmm::gva::AddressSpace;

use crate::kernel::btf::KernelBtf;
pub use crate::kernel::image_module::ModuleOrcLayout;
use crate::kernel::modules::{LoadedModule, ModuleError};
use crate::kernel::unwind::orc_table::ORC_ENTRY_SIZE;

/// More ORC entries than one module has (amdgpu, the largest, has about
/// 300 000 instructions' worth of entries in far fewer).
const MAX_ORCS: u64 = 1 << 22;

impl ModuleOrcLayout {
    /// None: the kernel keeps no ORC tables for modules (built without
    /// `CONFIG_UNWINDER_ORC`, or without BTF for `mod_arch_specific`).
    pub fn find(btf: &KernelBtf) -> Option<ModuleOrcLayout> {
        const ARCH: &str = "mod_arch_specific";
        let arch = btf.member("module", "arch").ok()?.offset;
        let at = |f: &str| btf.member(ARCH, f).ok().map(|m| arch + m.offset);
        Some(ModuleOrcLayout {
            num_orcs: at("num_orcs")?,
            orc_unwind_ip: at("orc_unwind_ip")?,
            orc_unwind: at("orc_unwind")?,
        })
    }
}

/// One module's ORC entries in its core `text`: (running address, the
/// raw 6-byte `struct orc_entry`), in table order.
pub type ModuleOrc = Vec<(u64, [u8; ORC_ENTRY_SIZE])>;

/// The ORC entries of `m` in its core text (the terminator just past its
/// end kept too).
pub fn read_orc(
    space: &mut AddressSpace<'_>,
    layout: &ModuleOrcLayout,
    m: &LoadedModule,
) -> Result<ModuleOrc, ModuleError> {
    let (module, text) = (m.addr, &m.text);
    let mut read = |addr: u64, buf: &mut [u8]| {
        space
            .read(addr, buf)
            .map_err(|source| ModuleError::Read { addr, source })
    };
    let mut word = [0u8; 8];
    read(module + u64::from(layout.num_orcs), &mut word[..4])?;
    let n = u64::from(u32::from_le_bytes(word[..4].try_into().expect("4 bytes")));
    if n > MAX_ORCS {
        return Err(ModuleError::Implausible {
            name: m.name.clone(),
            addr: module,
            what: "its ORC entry count",
            count: n,
        });
    }
    if n == 0 {
        return Ok(Vec::new());
    }
    read(module + u64::from(layout.orc_unwind_ip), &mut word)?;
    let ip_at = u64::from_le_bytes(word);
    read(module + u64::from(layout.orc_unwind), &mut word)?;
    let orc_at = u64::from_le_bytes(word);
    let mut ips = vec![0u8; (n * 4) as usize];
    read(ip_at, &mut ips)?;
    let mut orcs = vec![0u8; (n as usize) * ORC_ENTRY_SIZE];
    read(orc_at, &mut orcs)?;
    let covered = text.start..=text.end;
    Ok(ips
        .chunks_exact(4)
        .zip(orcs.chunks_exact(ORC_ENTRY_SIZE))
        .enumerate()
        .filter_map(|(i, (ip, orc))| {
            // unwind_orc.c orc_ip(): the entry's own address plus its value.
            let rel = i32::from_le_bytes(ip.try_into().expect("4 bytes"));
            let ip = (ip_at + 4 * i as u64).wrapping_add_signed(i64::from(rel));
            let raw: [u8; ORC_ENTRY_SIZE] = orc.try_into().expect("6 bytes");
            covered.contains(&ip).then_some((ip, raw))
        })
        .collect())
}
