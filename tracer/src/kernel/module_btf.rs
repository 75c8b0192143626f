//! A module's own BTF, so that `--args` and `--retval` show its functions'
//! values by name and type as a vmlinux function's: the module's `.BTF`
//! section, split BTF on top of the vmlinux's (pahole writes only the
//! types the vmlinux lacks; type ids and strings continue the base's).
//!
//! Read from the guest's memory at a module's load: the module loader
//! points `mod->btf_data` (`btf_data_size` bytes) at the `.BTF` section of
//! its copy of the `.ko` (kernel/module/main.c `find_module_sections`,
//! with `CONFIG_DEBUG_INFO_BTF_MODULES`). The copy lives until the end of
//! `load_module`, and `do_init_module` clears the pointer once the
//! module's init has run: so it is valid at both of vmtrace's load hooks,
//! `ftrace_module_enable` and the `MODULE_STATE_COMING` notifier call,
//! which `prepare_coming_module` makes before the module's parameters and
//! init (and before `free_copy`). Reading it writes nothing and stops
//! nothing more: the guest is stopped at the hook already.
//!
//! A module whose split BTF is on a distilled base (`mod->btf_base_data`,
//! Linux 6.11+ for modules built out of tree with `--btf_features=distilled_base`)
//! needs the kernel's relocation to the vmlinux's ids: not read.

use std::path::{Path, PathBuf};

use vmm::gva::AddressSpace;

use crate::kernel::btf::KernelBtf;
use crate::kernel::modules::ModuleError;
use crate::kernel::symbols::KernelImage;

/// Larger than a module's BTF (the largest drivers' are a few MiB): a
/// bigger size is not one.
const MAX_BTF: u64 = 64 << 20;

/// Where `struct module` describes its BTF, from the kernel's BTF.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModuleBtfLayout {
    btf_data: u32,
    btf_data_size: u32,
    /// `btf_base_data` (Linux 6.11+): a distilled base, not read.
    btf_base_data: Option<u32>,
}

impl ModuleBtfLayout {
    /// None: the kernel keeps no BTF for its modules (built without
    /// `CONFIG_DEBUG_INFO_BTF_MODULES`).
    pub fn find(btf: &KernelBtf) -> Option<ModuleBtfLayout> {
        let m = |f: &str| btf.member("module", f).ok().map(|at| at.offset);
        Some(ModuleBtfLayout {
            btf_data: m("btf_data")?,
            btf_data_size: m("btf_data_size")?,
            btf_base_data: m("btf_base_data"),
        })
    }
}

/// The `.BTF` bytes of the module whose `struct module` is at `module`
/// (named `name`), while it loads (see the module's doc); None when it
/// has none (built without BTF, its init done, or on a distilled base).
pub fn read_btf_data(
    space: &mut AddressSpace<'_>,
    layout: &ModuleBtfLayout,
    module: u64,
    name: &str,
) -> Result<Option<Vec<u8>>, ModuleError> {
    if let Some(at) = layout.btf_base_data {
        if word(space, module + u64::from(at))? != 0 {
            return Ok(None);
        }
    }
    let data = word(space, module + u64::from(layout.btf_data))?;
    let mut size = [0u8; 4];
    read_at(space, module + u64::from(layout.btf_data_size), &mut size)?;
    let size = u64::from(u32::from_le_bytes(size));
    if data == 0 || size == 0 {
        return Ok(None);
    }
    if size > MAX_BTF {
        return Err(ModuleError::Implausible {
            name: name.to_owned(),
            addr: module,
            what: "its BTF's size",
            count: size,
        });
    }
    let mut bytes = vec![0u8; size as usize];
    read_at(space, data, &mut bytes)?;
    Ok(Some(bytes))
}

/// The kernel's list of the modules whose BTF it parsed
/// (kernel/bpf/btf.c: `static LIST_HEAD(btf_modules)`, kept by its
/// module notifier from each module's `MODULE_STATE_COMING` to its
/// `GOING`), with `CONFIG_DEBUG_INFO_BTF_MODULES`.
pub const BTF_MODULES: &str = "btf_modules";

/// How to walk `btf_modules`: `struct btf_module` (`list`, `module`,
/// `btf`) and the parsed `struct btf`'s copy of the module's `.BTF`
/// (`data`, `data_size`: the raw bytes, which the kernel keeps with the
/// types it parsed from them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BtfModulesLayout {
    /// `btf_modules`' link address.
    head: u64,
    list: u32,
    module: u32,
    btf: u32,
    data: u32,
    data_size: u32,
}

impl BtfModulesLayout {
    /// None: the kernel parses no module's BTF, or its symbols or BTF do
    /// not describe the list.
    pub fn find(image: &KernelImage, btf: &KernelBtf) -> Option<BtfModulesLayout> {
        let m = |ty: &str, f: &str| btf.member(ty, f).ok().map(|at| at.offset);
        Some(BtfModulesLayout {
            head: image.symbol(BTF_MODULES)?.addr,
            list: m("btf_module", "list")?,
            module: m("btf_module", "module")?,
            btf: m("btf_module", "btf")?,
            data: m("btf", "data")?,
            data_size: m("btf", "data_size")?,
        })
    }
}

/// More entries than `btf_modules` has (one per loaded module): a longer
/// walk is not the list.
const MAX_BTF_MODULES: usize = 4096;

/// The `.BTF` bytes of each module in the kernel's `btf_modules` list, by
/// its `struct module`'s address: the modules loaded before an attach,
/// whose `mod->btf_data` is gone. `virt`: the kernel's virtual KASLR
/// offset. Read only, while the guest runs or stopped: a list changing
/// meanwhile gives a read error or bytes that do not parse (the module's
/// values then shown raw), never a write.
pub fn loaded_btf(
    space: &mut AddressSpace<'_>,
    layout: &BtfModulesLayout,
    virt: i64,
) -> Result<Vec<(u64, Vec<u8>)>, ModuleError> {
    let head = layout.head.wrapping_add(virt as u64);
    let mut out = Vec::new();
    let mut next = word(space, head)?;
    while next != head {
        if out.len() >= MAX_BTF_MODULES {
            return Err(ModuleError::TooLong { head });
        }
        let entry = next.wrapping_sub(u64::from(layout.list));
        let module = word(space, entry + u64::from(layout.module))?;
        let btf = word(space, entry + u64::from(layout.btf))?;
        next = word(space, next)?;
        if module == 0 || btf == 0 {
            continue;
        }
        let data = word(space, btf + u64::from(layout.data))?;
        let mut size = [0u8; 4];
        read_at(space, btf + u64::from(layout.data_size), &mut size)?;
        let size = u64::from(u32::from_le_bytes(size));
        if data == 0 || size == 0 || size > MAX_BTF {
            continue;
        }
        let mut bytes = vec![0u8; size as usize];
        read_at(space, data, &mut bytes)?;
        out.push((module, bytes));
    }
    Ok(out)
}

/// `buf.len()` bytes at `addr`, a failure naming it.
fn read_at(space: &mut AddressSpace<'_>, addr: u64, buf: &mut [u8]) -> Result<(), ModuleError> {
    space
        .read(addr, buf)
        .map_err(|source| ModuleError::Read { addr, source })
}

/// The 64-bit word at `addr`.
fn word(space: &mut AddressSpace<'_>, addr: u64) -> Result<u64, ModuleError> {
    let mut w = [0u8; 8];
    read_at(space, addr, &mut w).map(|()| u64::from_le_bytes(w))
}

/// Module `name`'s BTF from its `.BTF` bytes `data`, split on `base`
/// (the vmlinux's); `from` says where the bytes came from, for messages.
pub fn module_btf(
    name: &str,
    from: &str,
    data: &[u8],
    base: &KernelBtf,
) -> Result<KernelBtf, crate::kernel::btf::BtfError> {
    let path = PathBuf::from(format!("{name} ({from})"));
    KernelBtf::split_from_bytes(&path, data, base)
}

/// The `.BTF` section of the module file at `path` (a `.ko`); None when
/// it has none.
pub fn ko_btf_data(path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    use object::{Object, ObjectSection};
    let bytes = std::fs::read(path)?;
    let bad = |e: object::Error| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
    let file = object::File::parse(bytes.as_slice()).map_err(bad)?;
    let Some(section) = file.section_by_name(crate::kernel::btf::BTF_SECTION) else {
        return Ok(None);
    };
    let data = section.data().map_err(bad)?;
    Ok((!data.is_empty()).then(|| data.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::prototype::{Param, Prototype, ValueKind};

    /// Debian 6.12's BTF (its vmlinuz's payload) and the test module's
    /// `.BTF`, or None (skipped) when `guest/build.sh debian-6.12` and
    /// `vmt-test` have not run.
    fn debian_612() -> Option<(KernelBtf, Vec<u8>)> {
        let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest/out/debian-6.12");
        let (kernel, ko) = (out.join("vmlinuz"), out.join("vmt_test.ko"));
        if !kernel.is_file() || !ko.is_file() {
            eprintln!("SKIPPED: run `bash guest/build.sh debian-6.12`");
            return None;
        }
        let (image, _) = crate::kernel::bzimage::load(&kernel).unwrap();
        let base = KernelBtf::from_image(&image).unwrap();
        let data = ko_btf_data(&ko)
            .unwrap()
            .expect("vmt_test.ko has a .BTF section");
        Some((base, data))
    }

    /// vmt_test.ko's split BTF gives `vmt_hit(unsigned long i)` and
    /// `vmt_batch`'s, as guest/linux/vmt_test/vmt_test.c declares them.
    #[test]
    fn a_modules_split_btf_gives_its_functions_prototypes() {
        let Some((base, data)) = debian_612() else {
            return;
        };
        let btf = module_btf("vmt_test", "vmt_test.ko", &data, &base).unwrap();
        let i = Param {
            name: "i".into(),
            kind: ValueKind::Unsigned(8),
            reg: 0,
        };
        assert_eq!(
            btf.own_prototype("vmt_hit"),
            Some(Prototype {
                params: vec![i],
                ret: ValueKind::Void,
                unshown: Vec::new(),
            })
        );
        let batch = btf.own_prototype("vmt_batch").unwrap();
        assert_eq!(batch.params[0].name, "k");
        assert_eq!(batch.ret, ValueKind::Unsigned(8));
        // vmt_write's `struct file *` and `loff_t *`: pointers to the
        // vmlinux's types, resolved through the base.
        let write = btf.own_prototype("vmt_write").unwrap();
        let names: Vec<&str> = write.params.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["f", "buf", "len", "pos"]);
        assert!(write.params.iter().all(|p| p.kind != ValueKind::Void));
        assert_eq!(write.ret, ValueKind::Signed(8));
    }

    /// A module's function is never given a vmlinux function's prototype:
    /// the module's own part alone is asked, so a vmlinux name (or a name
    /// the module shares with one) the module does not define has none.
    #[test]
    fn a_module_never_takes_a_vmlinux_prototype() {
        let Some((base, data)) = debian_612() else {
            return;
        };
        let btf = module_btf("vmt_test", "vmt_test.ko", &data, &base).unwrap();
        assert!(base.prototype("vfs_write").is_some());
        assert_eq!(btf.own_prototype("vfs_write"), None);
        assert_eq!(base.own_prototype("vfs_write"), None, "not split");
        assert_eq!(base.prototype("vmt_hit"), None);
    }
}
