//! A loaded module's identity (its `struct module`'s address, its name,
//! its text), kept where no kernel image is at hand (a journal), and the
//! guest's module list walked again to tell whether that very module is
//! still loaded: one unloaded since has its memory freed, and nothing may
//! be written there. The walk reads no more than the identities: the list
//! links, each module's state, name and text (kernel/module/main.c
//! `modules`; include/linux/module.h `struct module`).

use std::ops::Range;

use serde::{Deserialize, Serialize};
use vmm::gva::AddressSpace;

use crate::kernel::image_module::{ImageModule, TextAt};
use crate::kernel::modules::{
    ModuleError, MAX_MODULES, MODULE_NAME_LEN, MODULE_STATE_GOING, MODULE_STATE_UNFORMED,
};

/// How to walk the module list again: the running address of its head
/// (`modules`), and the offsets in `struct module` of its list link, its
/// state, its name, and its text's start (a pointer) and size (a u32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModuleWalk {
    pub head: u64,
    pub list: u32,
    pub state: u32,
    pub name: u32,
    pub text_base: u32,
    pub text_size: u32,
}

/// One module as loaded: its `struct module`'s address, name and text
/// (running addresses), with the walk that finds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModuleId {
    pub addr: u64,
    pub name: String,
    pub text: Range<u64>,
    pub walk: ModuleWalk,
}

impl ModuleId {
    /// A module of the kernel image, as it was read.
    pub fn of(m: &ImageModule) -> ModuleId {
        let l = &m.layout;
        let (text_base, text_size) = match l.text {
            TextAt::Memory { at, base, size } => (at + base, at + size),
            TextAt::Layout {
                at,
                base,
                text_size,
            } => (at + base, at + text_size),
        };
        ModuleId {
            addr: m.addr,
            name: m.name.clone(),
            text: m.text.clone(),
            walk: ModuleWalk {
                head: l.head.wrapping_add(m.virt as u64),
                list: l.list,
                state: l.state,
                name: l.name,
                text_base,
                text_size,
            },
        }
    }

    /// The same module loaded again: its new `struct module` and text.
    pub fn again(&self, addr: u64, text: Range<u64>) -> ModuleId {
        ModuleId {
            addr,
            text,
            ..self.clone()
        }
    }
}

impl ModuleWalk {
    /// The modules on the list now (read through `space`, the kernel's
    /// page tables), but those still being set up or going away (their
    /// memory about to be freed: never a module to write in).
    pub fn loaded(&self, space: &mut AddressSpace<'_>) -> Result<Vec<ModuleId>, ModuleError> {
        let mut out = Vec::new();
        let mut link = u64::from_le_bytes(read(space, self.head)?);
        while link != self.head {
            if out.len() >= MAX_MODULES {
                return Err(ModuleError::TooLong { head: self.head });
            }
            let module = link.wrapping_sub(u64::from(self.list));
            let at = |off: u32| module + u64::from(off);
            let state = u32::from_le_bytes(read(space, at(self.state))?);
            if state != MODULE_STATE_UNFORMED && state != MODULE_STATE_GOING {
                let name: [u8; MODULE_NAME_LEN] = read(space, at(self.name))?;
                let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
                let start = u64::from_le_bytes(read(space, at(self.text_base))?);
                let size = u32::from_le_bytes(read(space, at(self.text_size))?);
                out.push(ModuleId {
                    addr: module,
                    name: String::from_utf8_lossy(&name[..end]).into_owned(),
                    text: start..start + u64::from(size),
                    walk: *self,
                });
            }
            link = u64::from_le_bytes(read(space, link)?);
        }
        Ok(out)
    }
}

/// `N` bytes at `addr`.
fn read<const N: usize>(space: &mut AddressSpace<'_>, addr: u64) -> Result<[u8; N], ModuleError> {
    space
        .read_array::<N>(addr)
        .map_err(|source| ModuleError::Read { addr, source })
}

#[cfg(test)]
mod tests {
    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
    use vmm::gva::PagingMode;

    use super::*;

    /// The kernel map of the boot page tables: virtual `KMAP` + physical.
    const KMAP: u64 = 0xffff_ffff_8000_0000;
    const WALK: ModuleWalk = ModuleWalk {
        head: KMAP + 0x1000,
        list: 8,
        state: 0,
        name: 0x18,
        text_base: 0x100,
        text_size: 0x108,
    };

    /// A `struct module` at physical `at`, as `WALK` reads it, linked to
    /// `next` (a list link's address).
    fn module(mem: &GuestMemoryMmap, at: u64, (name, state, text): (&str, u32, u64), next: u64) {
        mem.write_obj(state, GuestAddress(at)).unwrap();
        mem.write_obj(next, GuestAddress(at + 8)).unwrap();
        mem.write_slice(name.as_bytes(), GuestAddress(at + 0x18))
            .unwrap();
        mem.write_obj(text, GuestAddress(at + 0x100)).unwrap();
        mem.write_obj(0x2000u32, GuestAddress(at + 0x108)).unwrap();
    }

    /// The list walked from its head: each module's address, name and
    /// text, but one going away (`MODULE_STATE_GOING`).
    #[test]
    fn the_module_list_names_each_live_module_as_loaded() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 8 << 20)]).unwrap();
        vmm::boot::regs::setup_page_tables(&mem).unwrap();
        let (a, b, c) = (0x10_0000u64, 0x11_0000u64, 0x12_0000u64);
        let link = |m: u64| KMAP + m + 8;
        mem.write_obj(link(a), GuestAddress(0x1000)).unwrap();
        module(&mem, a, ("vmt_test", 0, KMAP + 0x40_0000), link(b));
        module(
            &mem,
            b,
            ("going", MODULE_STATE_GOING, KMAP + 0x50_0000),
            link(c),
        );
        module(&mem, c, ("binfmt_misc", 0, KMAP + 0x60_0000), WALK.head);
        let mut space = AddressSpace::new(&mem, vmm::layout::PML4_START, PagingMode::Level4);
        let id = |m: u64, name: &str, text: u64| ModuleId {
            addr: KMAP + m,
            name: name.into(),
            text: text..text + 0x2000,
            walk: WALK,
        };
        let want = [
            id(a, "vmt_test", KMAP + 0x40_0000),
            id(c, "binfmt_misc", KMAP + 0x60_0000),
        ];
        assert_eq!(WALK.loaded(&mut space).unwrap(), want);
        // A list that leads off the mapped memory is an error.
        mem.write_obj(0xffff_ffff_c000_0008u64, GuestAddress(c + 8))
            .unwrap();
        assert!(WALK.loaded(&mut space).is_err());
    }
}
