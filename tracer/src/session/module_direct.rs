//! `--entry direct` for a module the guest first loads during a trace
//! (issue 37): its functions the selection takes get direct entries, not
//! ftrace sites, as the modules found at the attach do. At its load hook
//! (its text final, none of its code run) its core text is read and its
//! functions judged by the rules of `crate::kernel::direct::module`; each
//! safe one the selection takes becomes a function added to the trace
//! (`super::module_added`), its site the direct entry's first byte.
//! Each function refused is counted by rule, once per module.

use std::collections::{BTreeMap, HashMap, HashSet};

use vmm::gva::AddressSpace;

use super::module_added::select::{selects, AddedFunction};
use crate::kernel::direct::module::{module_entries, KernelLinks};
use crate::kernel::direct::DirectSite;
use crate::kernel::filter::Filter;
use crate::kernel::module_image::module_function_name;
use crate::kernel::modules::{LoadedModule, ModuleLayout};

/// The rule said of an entry refused for want of a stub: exitless mode
/// with the function graph has no spare stub slots
/// (`crate::plan::exitless::layout::direct_spares`).
const NO_STUB: &str = "no-spare-stub";

/// More bytes of core text than a module has (a size beyond is no size).
const MAX_TEXT: u64 = 64 << 20;

/// Direct entries for the modules first loaded during a trace.
#[derive(Debug)]
pub struct DirectLoads {
    kernel: KernelLinks,
    layout: ModuleLayout,
    /// An entry that displaces instructions can have a stub (exitless
    /// mode's spare stub slots, trap mode's breakpoints need none).
    stubs: bool,
    /// The modules judged (their refusals counted once).
    judged: HashSet<String>,
    /// Functions the selection took that were refused, by rule.
    pub refused: BTreeMap<&'static str, usize>,
    /// The direct entry of each site given at the last loads, by its
    /// running address: what a stub relocates (exitless mode).
    pub sites: HashMap<u64, DirectSite>,
}

impl DirectLoads {
    /// Direct entries judged with the kernel's `kernel` links, the
    /// guest's modules walked by `layout`; without `stubs`, an entry that
    /// displaces other instructions than its ftrace NOP is refused
    /// (`NO_STUB`).
    pub fn new(kernel: KernelLinks, layout: ModuleLayout, stubs: bool) -> DirectLoads {
        DirectLoads {
            kernel,
            layout,
            stubs,
            judged: HashSet::new(),
            refused: BTreeMap::new(),
            sites: HashMap::new(),
        }
    }

    /// The functions of `read` (its text read through `space`) with a
    /// direct entry that `filter` selects (by any of their names), in
    /// address order, the kernel `slide` bytes above its link addresses.
    /// A text that cannot be read or judged gives none (counted as
    /// `no-code`).
    pub fn select(
        &mut self,
        space: &mut AddressSpace<'_>,
        read: &LoadedModule,
        filter: &Filter,
        slide: i64,
    ) -> Vec<AddedFunction> {
        // A module the selection takes nothing of is not read, nor judged.
        let named = |f: &crate::kernel::modules::ModuleFunction| {
            let full = module_function_name(&f.name, &read.name);
            selects(filter, &[&full, &f.name])
        };
        if !read.functions.iter().any(named) {
            return Vec::new();
        }
        let first = self.judged.insert(read.name.clone());
        let len = read.text.end.saturating_sub(read.text.start);
        let mut text = vec![0u8; len.min(MAX_TEXT) as usize];
        let read_text = len <= MAX_TEXT && space.read(read.text.start, &mut text).is_ok();
        let entries = read_text
            .then(|| module_entries(read, &text, self.layout, &self.kernel, slide).ok())
            .flatten();
        let Some(entries) = entries else {
            if first {
                *self.refused.entry("no-code").or_default() += 1;
            }
            return Vec::new();
        };
        let mut out = Vec::new();
        for e in entries {
            let names: Vec<&str> = e.names.iter().map(String::as_str).collect();
            if !selects(filter, &names) {
                continue;
            }
            match e.site {
                Ok(site) if !site.ftrace_nop && !self.stubs => {
                    if first {
                        *self.refused.entry(NO_STUB).or_default() += 1;
                    }
                }
                Ok(site) => {
                    out.push(AddedFunction {
                        name: e.names[0].clone(),
                        addr: e.addr,
                        size: e.size,
                        site: site.addr,
                    });
                    self.sites.insert(site.addr, site);
                }
                Err(r) if first => *self.refused.entry(r.rule()).or_default() += 1,
                Err(_) => {}
            }
        }
        out
    }

    /// "N refused a direct entry (rule N, ...)", most first; None when
    /// none was.
    pub fn refusals(&self) -> Option<String> {
        let total: usize = self.refused.values().sum();
        if total == 0 {
            return None;
        }
        let mut by: Vec<_> = self.refused.iter().collect();
        by.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let rules: Vec<String> = by.iter().map(|(r, n)| format!("{r} {n}")).collect();
        Some(format!(
            "{total} of their functions refused a direct entry ({})",
            rules.join(", ")
        ))
    }
}

/// The kernel's links for the direct entries of the modules `plan`'s
/// trace first loads: None unless its functions are entered directly.
pub fn direct_links(plan: &crate::plan::Plan) -> Option<KernelLinks> {
    let direct = plan.entry == crate::plan::entry::EntryKind::Direct;
    plan.direct
        .as_ref()
        .filter(|_| direct)
        .map(|d| d.kernel_links.clone())
}
