//! The loaded modules of the kernel a QEMU runs, read before the attach
//! plans (the plan selects among their functions) while the guest runs,
//! through /proc/PID/mem, and confirmed in the attach's first stop: the
//! same modules at the same addresses, or the attach is refused (a
//! module unloaded in between would have its freed text patched).
//!
//! No vCPU's registers are at hand before the stub stops the guest, so the
//! walk uses the kernel's own top page table (`init_top_pgt`, whose
//! kernel half every task's tables share: modules and the image are
//! mapped there) at the physical KASLR offset the banner gives, and finds
//! the virtual offset and the paging mode (4- or 5-level: CR4 is not at
//! hand either) as the one 2 MiB step and mode that map `modules` there
//! (`crate::kernel::top_table`).

use std::sync::atomic::Ordering;

use vm_memory::GuestAddress;
use vmm::gva::{AddressSpace, PagingMode};
use vmm::{GuestRam, RamError};

use super::procmem::ProcRam;
use crate::kernel::btf::KernelBtf;
use crate::kernel::events::module_events::{self, ModuleEvent};
use crate::kernel::kaslr::{phys_candidates, KernelOffset, KASLR_ALIGN};
use crate::kernel::module_btf::{loaded_btf, BtfModulesLayout};
use crate::kernel::module_build_id::{loaded_build_id, NotesLayout};
use crate::kernel::module_orc::{read_orc, ModuleOrc};
use crate::kernel::modules::{
    loaded, still_loaded, LoadedModule, ModuleError, ModuleLayout, MODULES,
};
use crate::kernel::symbols::KernelImage;
use crate::kernel::top_table::{self, kernel_space, INIT_TOP_PGT, KERNEL_PAGING_MODES};

/// Virtual KASLR moves the image within its 1 GiB mapping.
const VIRT_STEPS: u64 = (1 << 30) / KASLR_ALIGN;

/// A QEMU's RAM through /proc/PID/mem, for reads only (a page-table walk
/// while the guest runs: nothing is written before the attach's stop).
pub struct ReadOnlyRam<'a>(pub &'a ProcRam);

impl GuestRam for ReadOnlyRam<'_> {
    fn read_bytes(&self, buf: &mut [u8], addr: GuestAddress) -> Result<(), RamError> {
        let len = buf.len();
        self.0
            .read(addr.0, buf)
            .map_err(|e| RamError::new(addr.0, len, e))
    }
    fn write_bytes(&self, data: &[u8], addr: GuestAddress) -> Result<(), RamError> {
        Err(RamError::new(addr.0, data.len(), "read-only"))
    }
    fn load_u32(&self, addr: GuestAddress, _: Ordering) -> Result<u32, RamError> {
        self.0
            .load_u32(addr.0)
            .map_err(|e| RamError::new(addr.0, 4, e))
    }
    fn load_u64(&self, addr: GuestAddress, _: Ordering) -> Result<u64, RamError> {
        self.0
            .load_u64(addr.0)
            .map_err(|e| RamError::new(addr.0, 8, e))
    }
    fn store_u32(&self, _: u32, addr: GuestAddress, _: Ordering) -> Result<(), RamError> {
        Err(RamError::new(addr.0, 4, "read-only"))
    }
    fn store_u64(&self, _: u64, addr: GuestAddress, _: Ordering) -> Result<(), RamError> {
        Err(RamError::new(addr.0, 8, "read-only"))
    }
    fn contains(&self, addr: GuestAddress, len: usize) -> bool {
        let end = addr.0.saturating_add(len as u64);
        self.0
            .ranges()
            .iter()
            .any(|r| addr.0 >= r.gpa && end <= r.gpa + r.len)
    }
}

/// The guest's modules, each with its text's bytes, and where the kernel
/// runs.
pub struct GuestModules {
    pub list: Vec<(LoadedModule, Vec<u8>)>,
    pub layout: ModuleLayout,
    pub offset: KernelOffset,
    /// Each module's ORC entries (its `struct module`'s address, running
    /// addresses), when the kernel keeps them.
    pub orc: Vec<(u64, ModuleOrc)>,
    /// Each module's own `.BTF` (its `struct module`'s address), from the
    /// kernel's `btf_modules` list, when the kernel keeps them.
    pub btf: Vec<(u64, Vec<u8>)>,
    /// Each module's build id (its `struct module`'s address), from the
    /// notes the kernel keeps for sysfs, when it keeps them: what matches
    /// a module file given on the host (`--modules DIR`).
    pub build_ids: Vec<(u64, Vec<u8>)>,
    /// The events the modules list (`list -e`).
    pub events: Vec<ModuleEvent>,
}

/// Where a kernel's module list is and how to walk it.
struct Walk {
    btf: KernelBtf,
    layout: ModuleLayout,
    root: u64,
    /// 4- or 5-level: found with the virtual offset (`read`).
    mode: PagingMode,
    /// The kernel's list of its modules' BTF, when it keeps one.
    btf_modules: Option<BtfModulesLayout>,
    /// Where a module's notes are (its build id), when it keeps them.
    notes: Option<NotesLayout>,
}

impl Walk {
    /// None: the kernel has no modules (`CONFIG_MODULES` off).
    fn of(image: &KernelImage, phys: i64) -> Result<Option<Walk>, ModuleError> {
        if image.symbol(MODULES).is_none() {
            return Ok(None);
        }
        let btf = KernelBtf::from_image(image)?;
        let layout = ModuleLayout::find(image, &btf)?;
        let root = top_table::root(image, phys)
            .ok_or_else(|| ModuleError::Unlocated(format!("{INIT_TOP_PGT} has no symbol")))?;
        let btf_modules = BtfModulesLayout::find(image, &btf);
        let notes = NotesLayout::find(&btf);
        Ok(Some(Walk {
            notes,
            btf,
            layout,
            root,
            mode: PagingMode::Level4,
            btf_modules,
        }))
    }

    fn space<'m>(&self, ram: &'m dyn GuestRam) -> AddressSpace<'m> {
        AddressSpace::new(ram, self.root, self.mode)
    }

    fn list(&self, ram: &dyn GuestRam, virt: i64) -> Result<Vec<LoadedModule>, ModuleError> {
        let head = self.layout.head.wrapping_add(virt as u64);
        loaded(&mut self.space(ram), &self.layout, head)
    }
}

/// The modules of the kernel `image` as the guest has them now, read
/// while it runs. None: a kernel without modules.
pub fn read(ram: &ProcRam, image: &KernelImage) -> Result<Option<GuestModules>, ModuleError> {
    if image.symbol(MODULES).is_none() {
        return Ok(None);
    }
    let ram = ReadOnlyRam(ram);
    let phys = match phys_candidates(&ram, image).as_deref() {
        Some([one]) => *one,
        Some([]) => return Err(ModuleError::OtherKernel),
        other => {
            return Err(ModuleError::Unlocated(format!(
                "the kernel's banner is at {} places in RAM",
                other.map_or(0, |o| o.len())
            )))
        }
    };
    let Some(mut walk) = Walk::of(image, phys)? else {
        return Ok(None);
    };
    let (mode, offset) = locate(&ram, &walk, phys)?;
    walk.mode = mode;
    let mut list = Vec::new();
    let mut orc = Vec::new();
    let mut build_ids = Vec::new();
    let modules = walk.list(&ram, offset.virt)?;
    // Values of the modules' functions (and their events' arguments) are
    // shown by it, when it can be read: without it they are shown raw (a
    // list that changed meanwhile, like the module list, is caught at the
    // attach's stop).
    let btf = (walk.btf_modules.as_ref())
        .and_then(|l| loaded_btf(&mut walk.space(&ram), l, offset.virt).ok())
        .unwrap_or_default();
    let events = module_events::read(&mut walk.space(&ram), &walk.btf, &modules, &btf)?;
    for m in modules {
        if let Some(l) = &walk.layout.orc {
            orc.push((m.addr, read_orc(&mut walk.space(&ram), l, &m)?));
        }
        // A module whose notes cannot be read matches no file: said then.
        if let Some(Ok(Some(id))) =
            (walk.notes.as_ref()).map(|l| loaded_build_id(&mut walk.space(&ram), l, &m))
        {
            build_ids.push((m.addr, id));
        }
        let mut text = vec![0u8; (m.text.end - m.text.start) as usize];
        walk.space(&ram)
            .read(m.text.start, &mut text)
            .map_err(|source| ModuleError::Read {
                addr: m.text.start,
                source,
            })?;
        list.push((m, text));
    }
    Ok(Some(GuestModules {
        list,
        layout: walk.layout,
        offset,
        orc,
        btf,
        build_ids,
        events,
    }))
}

/// The paging mode and the KASLR offsets at which `walk`'s top table maps
/// the module list where it is in RAM (the kernel at physical offset
/// `phys`): the one 2 MiB step, in one mode.
fn locate(
    ram: &dyn GuestRam,
    walk: &Walk,
    phys: i64,
) -> Result<(PagingMode, KernelOffset), ModuleError> {
    let head = walk.layout.head;
    let head_pa = vmm::layout::kernel_virt_to_phys(head).map(|p| p.wrapping_add(phys as u64));
    // Each paging mode's steps: a 5-level table read as 4-level (or the
    // reverse) maps nothing of the image.
    let found: Vec<(PagingMode, u64)> = KERNEL_PAGING_MODES
        .into_iter()
        .flat_map(|mode| {
            let space = AddressSpace::new(ram, walk.root, mode);
            (0..VIRT_STEPS)
                .filter(move |i| {
                    let va = head + i * KASLR_ALIGN;
                    space.translate(va).is_ok_and(|t| Some(t.gpa) == head_pa)
                })
                .map(move |i| (mode, i))
        })
        .collect();
    let [(mode, step)] = found[..] else {
        return Err(ModuleError::Unlocated(format!(
            "{MODULES} is mapped at {} places",
            found.len()
        )));
    };
    let offset = KernelOffset {
        virt: (step * KASLR_ALIGN) as i64,
        phys,
    };
    Ok((mode, offset))
}

/// In the attach's stop: the modules `image` holds are still loaded where
/// they were read, and the kernel runs at the `offset` they were read
/// with; else why not.
pub fn confirm(
    ram: &dyn GuestRam,
    image: &KernelImage,
    offset: KernelOffset,
) -> Result<(), String> {
    if image.modules.is_empty() {
        return Ok(());
    }
    if image
        .modules
        .iter()
        .any(|m| m.virt != offset.virt || m.phys != offset.phys)
    {
        return Err(
            "the kernel's KASLR offsets differ from those its modules were read with".into(),
        );
    }
    let loaded = still_loaded(ram, image).map_err(|e| e.to_string())?;
    if let Some(m) = image
        .modules
        .iter()
        .zip(loaded)
        .find_map(|(m, l)| (!l).then_some(m))
    {
        return Err(format!(
            "module {} was unloaded or reloaded while vmtrace read it; attach again",
            m.name
        ));
    }
    Ok(())
}

/// The guest-physical address of running address `va` in a module's text
/// (the image's own are at `offset.phys_of`).
pub fn module_phys(
    ram: &dyn GuestRam,
    image: &KernelImage,
    offset: KernelOffset,
    va: u64,
) -> Option<u64> {
    let space = kernel_space(ram, image, offset)?;
    space.translate(va).ok().map(|t| t.gpa)
}
