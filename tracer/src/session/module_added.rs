//! A module the guest first loads during the trace (issue 37): which of
//! its functions the selection traces, as ftrace enables a coming
//! module's functions that `set_ftrace_filter` names (`:mod:` included).
//! Read at the load hook (`vmtrace attach`'s
//! `crate::qemu::module_hooks::LOAD_HOOK`, the own VMM's
//! `crate::session::module_traps`), each becomes a function added to the
//! trace (`crate::plan::added_sites`), named `function [module]` as the
//! attach's modules are, its site written before any of the module's code
//! runs.

use std::ops::Range;
use std::sync::Arc;

use vmm::gva::AddressSpace;

use crate::kernel::btf::KernelBtf;
use crate::kernel::filter::Filter;
use crate::kernel::module_btf::{module_btf, read_btf_data, ModuleBtfLayout};
use crate::kernel::module_orc::{read_orc, ModuleOrc};
use crate::kernel::modules::{LoadedModule, ModuleLayout};
use crate::kernel::symbols::Symbol;
use crate::plan::site_index::SiteIndex;
use crate::plan::ComingModules;
use crate::session::module_protos::{LoadFiles, ModulePrototypes};
pub use select::{selected_functions, AddedFunction};

pub mod select;

/// The modules first loaded during the trace, and their traced sites.
#[derive(Debug)]
pub struct FirstLoads {
    /// The selection as given (`:mod:` globs of modules not loaded at the
    /// attach included).
    filter: Filter,
    index: Arc<SiteIndex>,
    /// How to walk the guest's module list, and the kernel's physical
    /// KASLR offset (its page table's place).
    walk: (ModuleLayout, i64),
    modules: Vec<Coming>,
    /// Slots this session's code has (exitless mode's spare sites may be
    /// fewer than those reserved: `crate::plan::Plan::exitless_added`).
    limit: usize,
    /// Traced functions that found no spare slot (more than reserved).
    pub unslotted: usize,
    /// Loads of these modules after their first, and their unloads.
    pub again: usize,
    pub gone: usize,
    /// Read each load's ORC tables (`--stack`).
    orc: bool,
    /// The `--args` globs: the added functions they select record their
    /// arguments.
    args: Option<crate::kernel::filter::Globs>,
    /// With `--args` or `--retval`: the vmlinux's BTF, on which each
    /// load's own BTF is read (`module_btf`) for its functions'
    /// prototypes.
    prototypes: Option<(Arc<KernelBtf>, ModuleBtfLayout)>,
    /// `--modules DIR`: the files of the modules loaded, for the symbols
    /// their kallsyms lacks, and the prototypes of those loaded without
    /// BTF.
    files: Option<LoadFiles>,
    /// `--entry direct`: their functions by their direct entries
    /// (`super::module_direct`); None: by their ftrace sites.
    pub direct: Option<super::module_direct::DirectLoads>,
}

/// A module first loaded during the trace.
#[derive(Debug)]
struct Coming {
    name: String,
    /// Each traced function's slot (`AddedSites`) and name.
    slots: Vec<(usize, String)>,
    /// Its `struct module` while loaded.
    now: Option<u64>,
    /// Its text and ORC entries (running addresses) while loaded, when
    /// `--stack` wants them and they could be read: its first load's
    /// when it is `moved`.
    orc: Option<(Range<u64>, ModuleOrc)>,
    /// Its first load, as `--stack` read it.
    first: Option<FirstImage>,
    /// Loaded again elsewhere with its first load's code: its text now
    /// and its first load's start (`StackSource::set_moved`), so that its
    /// frames read as the first load's, whose functions the trace names.
    moved: Option<(Range<u64>, u64)>,
}

/// A first-loaded module's first load: its text, its functions (name,
/// offset in the text, size) and its ORC entries (running addresses).
#[derive(Debug)]
struct FirstImage {
    text: Range<u64>,
    functions: Vec<(String, u64, u64)>,
    orc: ModuleOrc,
}

/// `m`'s functions by name, offset in its text and size.
fn shape(m: &LoadedModule) -> Vec<(String, u64, u64)> {
    let f = |f: &crate::kernel::modules::ModuleFunction| {
        (f.name.clone(), f.addr - m.text.start, f.size)
    };
    m.functions.iter().map(f).collect()
}

impl FirstLoads {
    pub fn new(coming: &ComingModules, index: Arc<SiteIndex>) -> FirstLoads {
        FirstLoads {
            filter: coming.selection.clone(),
            index,
            walk: (coming.layout, coming.phys),
            modules: Vec::new(),
            limit: usize::MAX,
            unslotted: 0,
            again: 0,
            gone: 0,
            orc: false,
            args: coming.args.clone(),
            prototypes: None,
            files: None,
            direct: None,
        }
    }

    /// Give the functions of the modules loaded direct entries, judged
    /// with the kernel's `links` (`crate::plan::entry::DirectPlan`);
    /// `stubs`: an entry that displaces instructions can have a stub (else
    /// only those that displace their ftrace NOP are taken).
    pub fn want_direct(&mut self, links: crate::kernel::direct::module::KernelLinks, stubs: bool) {
        let d = super::module_direct::DirectLoads::new(links, self.walk.0, stubs);
        self.direct = Some(d);
    }

    /// `loading`, the functions selected by their direct entries when
    /// `want_direct` asked for them (the text read through `space`).
    pub fn loading_from(
        &mut self,
        space: &mut AddressSpace<'_>,
        read: &LoadedModule,
        module: u64,
        btf: Option<&ModulePrototypes>,
    ) -> Vec<u64> {
        let slide = self.index.slide();
        let selected = match self.direct.as_mut() {
            Some(d) => d.select(space, read, &self.filter, slide),
            None => selected_functions(read, &self.filter),
        };
        self.add(read, module, btf, selected)
    }

    /// The modules first loaded during `plan`'s trace, as `coming` says
    /// (its `--modules DIR` files read on the kernel's BTF), with their
    /// functions' prototypes when `plan` records values.
    pub fn of_plan(coming: &ComingModules, plan: &crate::plan::Plan) -> FirstLoads {
        let mut f = FirstLoads::new(coming, Arc::clone(&plan.index));
        f.files = (coming.files.clone().zip(plan.btf.as_ref()))
            .and_then(|(files, b)| LoadFiles::new(files, b, coming.said.clone()));
        f.want_prototypes(plan.value_btf());
        f
    }

    /// Give the added functions their prototypes from their module's own
    /// BTF, split on `base` (the vmlinux's; None: values not recorded).
    pub fn want_prototypes(&mut self, base: Option<Arc<KernelBtf>>) {
        self.prototypes = base.and_then(|b| Some((Arc::clone(&b), ModuleBtfLayout::find(&b)?)));
    }

    /// `read`, loading at `module`, completed from its own file
    /// (`--modules DIR`: the symbols its kallsyms lacks), and the
    /// prototypes of its functions when they are wanted: its BTF read
    /// through `space` from its `struct module` (`crate::kernel::module_btf`),
    /// else its file's; None when neither can be had (its values then
    /// shown raw).
    pub fn module_btf(
        &mut self,
        space: &mut AddressSpace<'_>,
        read: &mut LoadedModule,
        module: u64,
    ) -> Option<ModulePrototypes> {
        let btf = self.prototypes.as_ref().and_then(|(base, layout)| {
            let data = read_btf_data(space, layout, module, &read.name).ok()??;
            module_btf(&read.name, "guest memory", &data, base).ok()
        });
        // The file's prototypes only where the guest's memory has none.
        let base = (self.prototypes.as_ref())
            .filter(|_| btf.is_none())
            .map(|(b, _)| Arc::clone(b));
        let from_file =
            (self.files.as_mut()).and_then(|f| f.take(space, read, module, base.as_deref()));
        btf.map(ModulePrototypes::Btf).or(from_file)
    }

    /// Read each load's ORC tables, for `--stack` (`read_orc`).
    pub fn want_orc(&mut self) {
        self.orc = true;
    }

    /// Give at most `n` slots (the spare sites of exitless mode's code).
    pub fn limit_to(&mut self, n: usize) {
        self.limit = n;
    }

    /// The slot of the added site at running address `addr`.
    pub fn slot_of(&self, addr: u64) -> Option<usize> {
        self.index.added().find(addr)
    }

    /// The guest loads `read` (a module the attach did not find), its
    /// `struct module` at `module`: the sites of its selected functions,
    /// each given a slot (the same again when it comes back), before any
    /// is written in the guest; `btf`: its own (`module_btf`), which
    /// gives each function added its prototype.
    pub fn loading(
        &mut self,
        read: &LoadedModule,
        module: u64,
        btf: Option<&ModulePrototypes>,
    ) -> Vec<u64> {
        let selected = selected_functions(read, &self.filter);
        self.add(read, module, btf, selected)
    }

    /// `loading` of the functions `selected`.
    fn add(
        &mut self,
        read: &LoadedModule,
        module: u64,
        btf: Option<&ModulePrototypes>,
        selected: Vec<AddedFunction>,
    ) -> Vec<u64> {
        let added = self.index.added();
        let c = match self.modules.iter().position(|c| c.name == read.name) {
            // The load of a module loaded at `module` and not freed since,
            // seen a second time (its hook's stop served twice): its sites
            // are set already; counted once.
            Some(i) if self.modules[i].now == Some(module) => return Vec::new(),
            Some(i) => {
                self.again += 1;
                &mut self.modules[i]
            }
            // A module the selection takes nothing of is not followed.
            None if selected.is_empty() => return Vec::new(),
            None => {
                self.modules.push(Coming {
                    name: read.name.clone(),
                    slots: Vec::new(),
                    now: None,
                    orc: None,
                    first: None,
                    moved: None,
                });
                self.modules.last_mut().expect("just pushed")
            }
        };
        let mut sites = Vec::new();
        for f in selected {
            let slot = match c.slots.iter().find(|(_, n)| *n == f.name) {
                Some(&(k, _)) => {
                    added.set(k, f.site);
                    Some(k)
                }
                None if added.used() >= self.limit => None,
                None => {
                    // At a link address, as the attach's modules' functions
                    // (their running address less the KASLR offset).
                    let sym = Symbol {
                        name: f.name.clone(),
                        addr: f.addr.wrapping_sub(self.index.slide() as u64),
                        size: f.size,
                    };
                    // By `function [module]` or the bare name.
                    let bare = f.name.split_once(" [").map_or(f.name.as_str(), |b| b.0);
                    let names = [f.name.as_str(), bare];
                    let args = self.args.as_ref().is_some_and(|g| g.is_match_any(&names));
                    let prototype = btf.and_then(|b| b.of(bare));
                    let k = added.add_with(f.site, sym, args, prototype);
                    if let Some(k) = k {
                        c.slots.push((k, f.name));
                    }
                    k
                }
            };
            match slot {
                Some(_) => sites.push(f.site),
                None => self.unslotted += 1,
            }
        }
        c.now = Some(module);
        sites
    }

    /// The guest frees the module at `module`: the sites to take out
    /// before its text goes, if it is one first loaded during the trace.
    pub fn freeing(&mut self, module: u64) -> Vec<u64> {
        let Some(c) = self.modules.iter_mut().find(|c| c.now == Some(module)) else {
            return Vec::new();
        };
        c.now = None;
        c.orc = None;
        c.moved = None;
        self.gone += 1;
        let added = self.index.added();
        let mut sites = Vec::new();
        for &(k, _) in &c.slots {
            let a = added.addr(k);
            if a != 0 {
                sites.push(a);
                added.set(k, 0);
            }
        }
        sites
    }

    /// `read`, loaded at `module` and followed (`loading`), gets its ORC
    /// entries read through `space` (where the kernel keeps them, and when
    /// `--stack` wants them), as the attach reads a loaded module's: its
    /// stacks unwind through its frames until it is freed. Loaded again
    /// elsewhere with the same functions at the same offsets and the same
    /// entries, it is taken as its first load moved (its frames named by
    /// the functions the trace has); else by its own entries where it is.
    /// Unread (the tables unreadable), its stacks end at its frames.
    pub fn read_orc(&mut self, space: &mut AddressSpace<'_>, read: &LoadedModule, module: u64) {
        let Some(layout) = self.walk.0.orc.filter(|_| self.orc) else {
            return;
        };
        let Some(c) = self.modules.iter_mut().find(|c| c.now == Some(module)) else {
            return;
        };
        if c.orc.is_some() {
            // The same load seen again.
            return;
        }
        let Ok(now) = read_orc(space, &layout, read) else {
            return;
        };
        let first = c.first.get_or_insert_with(|| FirstImage {
            text: read.text.clone(),
            functions: shape(read),
            orc: now.clone(),
        });
        let delta = read.text.start.wrapping_sub(first.text.start);
        let same_code = first.functions == shape(read)
            && first.orc.len() == now.len()
            && (first.orc.iter().zip(&now))
                .all(|(a, b)| a.0.wrapping_add(delta) == b.0 && a.1 == b.1);
        (c.orc, c.moved) = match same_code {
            true if delta != 0 => (
                Some((first.text.clone(), first.orc.clone())),
                Some((read.text.clone(), first.text.start)),
            ),
            _ => (Some((read.text.clone(), now)), None),
        };
    }

    /// Modules first loaded and loaded again elsewhere with their first
    /// load's code, now: each one's text and its first load's start.
    pub fn moved(&self) -> Vec<(Range<u64>, u64)> {
        self.modules
            .iter()
            .filter_map(|c| c.moved.clone())
            .collect()
    }

    /// Each module first loaded and loaded now: its text and ORC entries
    /// (running addresses).
    pub fn loaded_orc(&self) -> Vec<(Range<u64>, &ModuleOrc)> {
        (self.modules.iter())
            .filter_map(|c| c.orc.as_ref().map(|(t, o)| (t.clone(), o)))
            .collect()
    }

    /// Tell `--stack` of the functions added so far and of the modules
    /// loaded now (`StackSource::set_added`).
    pub fn tell_stacks(&self, stacks: &crate::session::stacks::StackSource) {
        let names: Vec<String> = (self.index.added().functions().into_iter())
            .map(|f| f.name)
            .collect();
        stacks.set_added(&names, &self.loaded_orc());
    }

    /// How to walk the guest's module list, and the kernel's physical
    /// KASLR offset.
    pub fn walk(&self) -> (ModuleLayout, i64) {
        self.walk
    }

    /// Modules first loaded during the trace (each name once).
    pub fn modules(&self) -> usize {
        self.modules.len()
    }
}

#[cfg(test)]
mod tests {
    use super::select::tests::vmt_test;
    use super::*;

    fn coming_vmt_test(args: Option<crate::kernel::filter::Globs>) -> ComingModules {
        ComingModules {
            selection: Filter::new(&["*:mod:vmt_test".to_string()], &[]).unwrap(),
            layout: crate::kernel::modules::ModuleLayout::unused(),
            phys: 0,
            notify: None,
            args,
            files: None,
            said: Default::default(),
        }
    }

    /// Slots are given up to the limit (exitless mode's spare sites), the
    /// rest counted; the functions are named at link addresses; a
    /// module's later loads keep its slots, and its loads and unloads
    /// are counted.
    #[test]
    fn a_first_loaded_module_gets_slots_up_to_the_limit_and_is_counted() {
        let base = 0xffff_ffff_c000_0000;
        let slide = 0x2000_0000;
        let index = SiteIndex::new(vec![(0xffff_ffff_8100_0000, 0)]).with_added(8, 1);
        index.set_slide(slide);
        let index = Arc::new(index);
        let coming = coming_vmt_test(None);
        let mut first = FirstLoads::new(&coming, Arc::clone(&index));
        first.limit_to(2);
        let module = |at: u64| vmt_test(at, &[]);
        let m = module(base);
        assert_eq!(first.loading(&m, m.addr, None), [base + 4, base + 0x44]);
        assert_eq!(first.unslotted, 1);
        assert_eq!(first.slot_of(base + 0x44), Some(1));
        let named = index.added().functions();
        assert_eq!(named[0].addr, base.wrapping_sub(slide as u64));
        assert_eq!(first.freeing(m.addr), [base + 4, base + 0x44]);
        let again = module(base + 0x10000);
        let sites = first.loading(&again, again.addr, None);
        assert_eq!(sites, [base + 0x10004, base + 0x10044]);
        assert_eq!(first.slot_of(base + 0x10004), Some(0));
        assert_eq!((first.again, first.gone, first.modules()), (1, 1, 1));
        // The same load seen twice (not freed in between): counted once,
        // its sites not given again.
        assert!(first.loading(&again, again.addr, None).is_empty());
        assert_eq!((first.again, first.gone, first.modules()), (1, 1, 1));
        // A module the selection takes nothing of is not followed.
        let other = LoadedModule {
            name: "other".into(),
            ..module(base + 0x20000)
        };
        assert!(first.loading(&other, other.addr, None).is_empty());
        assert!(first.freeing(other.addr).is_empty());
        assert_eq!((first.again, first.gone, first.modules()), (1, 1, 1));
    }

    /// `--args=GLOB` marks the slots of the functions it selects, by
    /// either name; without `--args` none.
    #[test]
    fn the_args_globs_mark_the_slots_whose_calls_record_arguments() {
        let base = 0xffff_ffff_c000_0000;
        for (args, want) in [
            (Some("vmt_hit"), [false, true, false]),
            (Some("*:mod:vmt_test,!vmt_batch"), [false, true, true]),
            (None, [false; 3]),
        ] {
            let index = SiteIndex::new(vec![(0xffff_ffff_8100_0000, 0)]).with_added(8, 1);
            let index = Arc::new(index);
            let globs = args.map(|a| crate::kernel::filter::Globs::for_args(&[a.into()]).unwrap());
            let coming = coming_vmt_test(globs);
            let mut first = FirstLoads::new(&coming, Arc::clone(&index));
            let m = vmt_test(base, &[]);
            assert_eq!(first.loading(&m, m.addr, None).len(), 3);
            let got: Vec<bool> = (0..3).map(|k| index.added().records_args(k)).collect();
            assert_eq!(got, want, "{args:?}");
            assert!(!index.added().records_args(3));
        }
    }
}
