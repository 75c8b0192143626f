//! Trap mode's breakpoints in the guest kernel's module load and free
//! paths (issue 37): a module traced at the attach that the guest unloads
//! has its breakpoints removed before its text is freed, and loaded again
//! it is traced again, from before its init runs, at its new address.
//!
//! The load hook is `ftrace_module_enable` (kernel/trace/ftrace.c), which
//! `prepare_coming_module` (kernel/module/main.c) calls once the module's
//! text is final (read-only, its ftrace sites NOPs since
//! `ftrace_module_init`), before its init runs: where ftrace itself
//! enables a coming module's sites. The free hook is `ftrace_release_mod`,
//! called by `delete_module` (and a failed load) before `free_module`
//! frees the text. Both take the `struct module *` in RDI.
//!
//! A module reloaded is traced again only when its code is the attach's:
//! each traced function by name and size, its site at the same offset
//! with the same bytes. Its hits are recorded as the attach-time site's
//! (the plan's functions are fixed at the attach); a module the plan
//! never saw is not traced (nothing in the plan to count it in).

use std::collections::HashSet;

use vmm::gva::{AddressSpace, PagingMode};
use vmm::GuestRam;

use crate::kernel::kaslr::KernelOffset;
use crate::kernel::modules::{module_at, LoadedModule, ModuleError};
use crate::kernel::sites::SITE_LEN;
use crate::kernel::symbols::KernelImage;
use crate::kernel::top_table;

/// Where the kernel's module loader has the module's code final and its
/// init not run yet.
pub const LOAD_HOOK: &str = "ftrace_module_enable";
/// Where a module goes away, its text still there.
pub const FREE_HOOK: &str = "ftrace_release_mod";

/// The hook the plan traces, if it also traces a module's function:
/// vmtrace's breakpoint there would be the site's (or its jump's), and
/// the modules' unloads and loads would go unseen.
pub fn traced_hook(plan: &crate::plan::Plan) -> Option<String> {
    let image = &plan.image;
    // (A site's function is a slot of the plan's `funcs`.)
    let name = |slot: u32| {
        let f = *plan.funcs.get(slot as usize)?;
        image.functions.get(f).map(|s| s.name.as_str())
    };
    // (Link addresses: a module's are `virt` below its running ones.)
    let module_traced = image.modules.iter().any(|m| {
        let text = m.text.start.wrapping_sub(m.virt as u64)..m.text.end.wrapping_sub(m.virt as u64);
        plan.index.addrs.iter().any(|a| text.contains(a))
    });
    let hook = plan
        .index
        .funcs
        .iter()
        .filter_map(|&f| name(f))
        .find(|&n| n == LOAD_HOOK || n == FREE_HOOK)?;
    // A module waited for (`:mod:` of one not loaded) is followed too.
    (module_traced || plan.coming.is_some()).then(|| hook.to_string())
}

/// Why a module at a hook could not be read, or the hooks not set.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("reading the module at {addr:#x} in the kernel's load path: {source}")]
    Read {
        addr: u64,
        #[source]
        source: ModuleError,
    },
    #[error("the kernel's page table (`init_top_pgt`) is not in its symbols, or does not map the kernel")]
    NoPageTable,
    #[error("the kernel's module path `{0}` is not in its symbols")]
    NoHook(&'static str),
    #[error("the kernel's module path `{0}` is traced itself")]
    HookTraced(&'static str),
}

/// One traced site of a module, as found at the attach.
#[derive(Clone, Debug)]
struct AttachSite {
    function: String,
    size: u64,
    /// From the function's start.
    offset: u64,
    /// Its running address at the attach (the plan's).
    addr: u64,
    bytes: [u8; SITE_LEN],
    /// It is one of the module's ftrace sites; else a direct entry's
    /// first instructions (`--entry direct`), found again at a load only
    /// by its function and offset.
    ftrace: bool,
}

/// A module with traced sites, and where it is loaded now.
#[derive(Debug)]
struct Traced {
    name: String,
    sites: Vec<AttachSite>,
    /// Its text at the attach (running addresses), and now, loaded again
    /// elsewhere (None while unloaded, or not yet reloaded).
    text: std::ops::Range<u64>,
    moved_to: Option<std::ops::Range<u64>>,
    /// Its `struct module` now, and its sites there, each with the
    /// attach-time site it stands for; None while unloaded.
    now: Option<(u64, Vec<(u64, u64)>)>,
}

/// A traced module loaded again: its name, its text at the attach and
/// now (running addresses), and its jump label entries now (`(site,
/// target)`, `(site, key with flag bits)`), where its events are found
/// again (`super::event_reload`).
#[derive(Debug)]
pub struct Reloaded {
    pub name: String,
    /// Its `struct module` now.
    pub module: u64,
    pub was: std::ops::Range<u64>,
    pub text: std::ops::Range<u64>,
    pub jumps: Vec<(u64, u64)>,
    pub keys: Vec<(u64, u64)>,
}

/// The load and free hooks' addresses, and the traced modules.
#[derive(Debug)]
pub struct ModuleHooks {
    pub load: u64,
    pub free: u64,
    /// The kernel's top page table (`init_top_pgt`), guest-physical.
    root: u64,
    /// The paging mode the kernel runs in (4- or 5-level).
    mode: PagingMode,
    traced: Vec<Traced>,
    image_layout: crate::kernel::modules::ModuleLayout,
    /// Traced modules the guest unloaded, and loaded again.
    pub unloads: usize,
    pub loads: usize,
    /// Sites of a module loaded again that were not traced: its code
    /// differs from the attach's there.
    pub untraced: usize,
    /// Modules first loaded during the trace, traced by the selection
    /// (`crate::session::module_added`); None: their functions are not traced.
    pub first: Option<crate::session::module_added::FirstLoads>,
    /// The traced module the last load hook found loaded again, for its
    /// events (taken by the caller).
    pub reloaded: Option<Reloaded>,
}

impl ModuleHooks {
    /// The hooks for the modules of `image` that hold some of `sites`
    /// (running addresses), read from `ram` in the attach's stop, and
    /// with `coming`, the modules first loaded during the trace. None: no
    /// module site is traced and none may come; an error: some is or may,
    /// and the hooks cannot be set (the kernel lacks one, or it is traced).
    pub fn new(
        image: &KernelImage,
        virt: i64,
        ram: &dyn GuestRam,
        sites: &HashSet<u64>,
        coming: Option<crate::session::module_added::FirstLoads>,
    ) -> Result<Option<ModuleHooks>, HookError> {
        // How to walk the module list: as a module found at the attach
        // was read, or as the attach would have (none loaded then).
        let walk = image.modules.first().map(|m| (m.layout, m.phys));
        let walk = walk.or_else(|| coming.as_ref().map(|c| c.walk()));
        // (A module's text range is its running one, as `sites`.)
        let module_site = |t: &std::ops::Range<u64>| sites.iter().any(|s| t.contains(s));
        let follows = coming.is_some() || image.modules.iter().any(|m| module_site(&m.text));
        let Some((layout, phys)) = walk.filter(|_| follows) else {
            return Ok(None);
        };
        let hook = |name| hook_at(image, virt, sites, name);
        let (load, free) = (hook(LOAD_HOOK)?, hook(FREE_HOOK)?);
        let mut space = top_table::kernel_space(ram, image, KernelOffset { virt, phys })
            .ok_or(HookError::NoPageTable)?;
        let (root, mode) = (space.root(), space.mode());
        let mut traced = Vec::new();
        for m in &image.modules {
            let read =
                module_at(&mut space, &m.layout, m.addr).map_err(|source| HookError::Read {
                    addr: m.addr,
                    source,
                })?;
            let at_attach = attach_sites(&read, sites, &mut space);
            if !at_attach.is_empty() {
                let now = at_attach.iter().map(|s| (s.addr, s.addr)).collect();
                traced.push(Traced {
                    name: read.name,
                    sites: at_attach,
                    text: read.text,
                    moved_to: None,
                    now: Some((m.addr, now)),
                });
            }
        }
        if traced.is_empty() && coming.is_none() {
            return Ok(None);
        }
        Ok(Some(ModuleHooks {
            load,
            free,
            root,
            mode,
            traced,
            image_layout: layout,
            unloads: 0,
            loads: 0,
            untraced: 0,
            first: coming,
            reloaded: None,
        }))
    }

    /// Traced modules the guest unloaded, and loaded again (those first
    /// loaded during the trace included, their first load aside); sites
    /// of those loaded again left untraced (their code changed).
    pub fn cycles(&self) -> (usize, usize, usize) {
        let f = self.first.as_ref();
        (
            self.unloads + f.map_or(0, |f| f.gone),
            self.loads + f.map_or(0, |f| f.again),
            self.untraced,
        )
    }

    /// Modules first loaded during the trace and traced, and their
    /// functions' loads left untraced for want of a slot.
    pub fn first_loaded(&self) -> (usize, usize) {
        let f = self.first.as_ref();
        f.map_or((0, 0), |f| (f.modules(), f.unslotted))
    }

    /// The functions of the modules first loaded refused a direct entry
    /// (`--entry direct`), said by rule; None: none.
    pub fn first_refused(&self) -> Option<String> {
        self.first.as_ref()?.direct.as_ref()?.refusals()
    }

    /// Traced modules loaded again during the trace, now: each one's text
    /// (running addresses) and where it started at the attach (or at its
    /// first load, one first loaded during the trace), for the
    /// unwinder (`crate::session::stacks::StackSource::set_moved`).
    pub fn moved(&self) -> Vec<(std::ops::Range<u64>, u64)> {
        let now = |t: &Traced| Some((t.moved_to.clone()?, t.text.start));
        let first = self.first.as_ref().map(|f| f.moved()).unwrap_or_default();
        self.traced.iter().filter_map(now).chain(first).collect()
    }

    /// The kernel's own address space (its top page table, in its paging
    /// mode): module text is reached through it.
    pub fn space<'m>(&self, ram: &'m dyn GuestRam) -> AddressSpace<'m> {
        AddressSpace::new(ram, self.root, self.mode)
    }

    /// Each traced module site as found at the attach (running address),
    /// with the bytes it held then, and whether it is an ftrace site.
    pub fn attach_sites(&self) -> Vec<(u64, [u8; SITE_LEN], bool)> {
        self.traced
            .iter()
            .flat_map(|t| t.sites.iter().map(|s| (s.addr, s.bytes, s.ftrace)))
            .collect()
    }

    /// The guest loads the module at `module` (the load hook's RDI): if it
    /// is a traced one, now unloaded, its sites at their new addresses,
    /// each with the attach-time site it stands for, checked as the
    /// attach's (same function, same offset, same bytes).
    pub fn loading(
        &mut self,
        ram: &dyn GuestRam,
        module: u64,
    ) -> Result<Vec<(u64, u64)>, HookError> {
        let mut space = self.space(ram);
        let mut read = module_at(&mut space, &self.image_layout, module).map_err(|source| {
            HookError::Read {
                addr: module,
                source,
            }
        })?;
        let Some(t) = self
            .traced
            .iter_mut()
            .find(|t| t.name == read.name && t.now.is_none())
        else {
            if self.traced.iter().any(|t| t.name == read.name) {
                return Ok(Vec::new());
            }
            // Each site stands for itself: its own slot in the index.
            let Some(first) = self.first.as_mut() else {
                return Ok(Vec::new());
            };
            // Completed from its file, if one has its build id.
            let btf = first.module_btf(&mut space, &mut read, module);
            let sites = first.loading_from(&mut space, &read, module, btf.as_ref());
            first.read_orc(&mut space, &read, module);
            return Ok(sites.into_iter().map(|s| (s, s)).collect());
        };
        let mut pairs = Vec::new();
        for s in &t.sites {
            match same_site(&read, s, &mut |a, b| space.read(a, b).is_ok()) {
                Some(new) => pairs.push((new, s.addr)),
                None => self.untraced += 1,
            }
        }
        t.now = Some((module, pairs.clone()));
        self.reloaded = Some(Reloaded {
            name: t.name.clone(),
            module,
            was: t.text.clone(),
            text: read.text.clone(),
            jumps: read.tables.jumps.clone(),
            keys: read.tables.keys.clone(),
        });
        t.moved_to = Some(read.text);
        self.loads += 1;
        Ok(pairs)
    }

    /// The attach-time site the site at `new` of a traced module loaded
    /// again stands for.
    pub fn attach_site_of(&self, new: u64) -> Option<u64> {
        let now = self.traced.iter().filter_map(|t| t.now.as_ref());
        let mut pairs = now.flat_map(|n| n.1.iter());
        pairs.find(|p| p.0 == new).map(|p| p.1)
    }

    /// The text of the traced module at `module` (the free hook's RDI),
    /// as the attach found it or loaded again since: where its events'
    /// call sites are (`crate::plan::events`, `super::event_reload`).
    pub fn traced_text(&self, module: u64) -> Option<std::ops::Range<u64>> {
        let t = (self.traced.iter()).find(|t| t.now.as_ref().is_some_and(|n| n.0 == module))?;
        Some(t.moved_to.clone().unwrap_or_else(|| t.text.clone()))
    }

    /// The guest frees the module at `module` (the free hook's RDI): the
    /// breakpoints of its sites to remove, if it is a traced one.
    pub fn freeing(&mut self, module: u64) -> Vec<u64> {
        let Some(t) = self
            .traced
            .iter_mut()
            .find(|t| t.now.as_ref().is_some_and(|n| n.0 == module))
        else {
            let first = self.first.as_mut();
            return first.map(|f| f.freeing(module)).unwrap_or_default();
        };
        self.unloads += 1;
        t.moved_to = None;
        let (_, pairs) = t.now.take().expect("found above");
        pairs.into_iter().map(|p| p.0).collect()
    }
}

/// The traced sites of the module `read` as found at the attach (read
/// through `space`): its ftrace sites among `sites`, and with `--entry
/// direct` its functions' direct entries (any of their first
/// instructions).
fn attach_sites(
    read: &LoadedModule,
    sites: &HashSet<u64>,
    space: &mut AddressSpace<'_>,
) -> Vec<AttachSite> {
    let mut ours: Vec<u64> = sites
        .iter()
        .copied()
        .filter(|s| read.text.contains(s))
        .collect();
    ours.sort_unstable();
    let mut at_attach = Vec::new();
    for s in ours {
        let Some(f) = read.function_at(s) else {
            continue;
        };
        let mut bytes = [0u8; SITE_LEN];
        if space.read(s, &mut bytes).is_err() {
            continue;
        }
        at_attach.push(AttachSite {
            function: f.name.clone(),
            size: f.size,
            offset: s - f.addr,
            addr: s,
            bytes,
            ftrace: read.sites.binary_search(&s).is_ok(),
        });
    }
    at_attach
}

/// The running address of the hook `name` of `image` (slid by `virt`),
/// where none of `sites` is: its own breakpoint would be the site's.
fn hook_at(
    image: &KernelImage,
    virt: i64,
    sites: &HashSet<u64>,
    name: &'static str,
) -> Result<u64, HookError> {
    let s = image.symbol(name).ok_or(HookError::NoHook(name))?;
    let at = s.addr.wrapping_add(virt as u64);
    match sites.contains(&at) {
        true => Err(HookError::HookTraced(name)),
        false => Ok(at),
    }
}

/// Where `site` is in the module `read`, if its function is there with
/// the same size and the site holds the same bytes (`read_at` reads the
/// guest); an ftrace site must be one of `read`'s again.
fn same_site(
    read: &LoadedModule,
    site: &AttachSite,
    read_at: &mut dyn FnMut(u64, &mut [u8]) -> bool,
) -> Option<u64> {
    let f = read
        .functions
        .iter()
        .find(|f| f.name == site.function && f.size == site.size)?;
    let at = f.addr + site.offset;
    if site.ftrace && read.sites.binary_search(&at).is_err() {
        return None;
    }
    let mut bytes = [0u8; SITE_LEN];
    (read_at(at, &mut bytes) && bytes == site.bytes).then_some(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::modules::ModuleFunction;

    fn module(base: u64) -> LoadedModule {
        LoadedModule {
            name: "vmt_test".into(),
            addr: 0xffff_ffff_c000_0000,
            text: base..base + 0x100,
            functions: vec![ModuleFunction {
                name: "vmt_hit".into(),
                addr: base + 0x10,
                size: 0x20,
            }],
            sites: vec![base + 0x14],
            events: Vec::new(),
            tables: Default::default(),
        }
    }

    #[test]
    fn a_reloaded_site_is_found_at_its_offset_only_with_the_same_bytes() {
        let site = AttachSite {
            function: "vmt_hit".into(),
            size: 0x20,
            offset: 4,
            addr: 0x1014,
            bytes: [0x0f, 0x1f, 0x44, 0x00, 0x00],
            ftrace: true,
        };
        let nop = &mut |_: u64, b: &mut [u8]| {
            b.copy_from_slice(&[0x0f, 0x1f, 0x44, 0x00, 0x00]);
            true
        };
        assert_eq!(same_site(&module(0x5000), &site, nop), Some(0x5014));
        let call = &mut |_: u64, b: &mut [u8]| {
            b.copy_from_slice(&[0xe8, 0, 0, 0, 0]);
            true
        };
        assert_eq!(same_site(&module(0x5000), &site, call), None);
        let mut bigger = module(0x5000);
        bigger.functions[0].size = 0x30;
        assert_eq!(same_site(&bigger, &site, nop), None);
    }
}
