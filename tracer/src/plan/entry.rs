//! How traced functions are entered (`--entry`): through their ftrace
//! call sites, or directly, by displacing their first instructions
//! (`crate::kernel::direct`). A direct plan is a `SiteTable` like
//! ftrace's, one site per function proved safe, so that selection,
//! listing and the session's site index work alike; the functions refused
//! keep their reason.

use std::collections::HashMap;

use crate::kernel::direct::{DirectSite, Refusal, SiteTables, TableError};
use crate::kernel::filter::FilterError;
use crate::kernel::sites::{Site, SiteError, SiteTable};
use crate::kernel::symbols::KernelImage;

/// The most direct sites one session patches: each has a 64-byte stub in
/// vmtrace's 2 MiB code page, below the function graph's 256 KiB of
/// return stubs (`session::direct` checks the two agree).
pub const MAX_DIRECT_SITES: usize = 28_000;

/// `--entry`, as asked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EntryChoice {
    /// ftrace's call sites only.
    Ftrace,
    /// Direct entries, on any kernel.
    Direct,
    /// ftrace's call sites on a kernel that has them, else direct entries.
    #[default]
    Auto,
}

impl EntryChoice {
    /// The entry `self` gives on `image`.
    pub fn resolve(self, image: &KernelImage) -> EntryKind {
        match self {
            EntryChoice::Ftrace => EntryKind::Ftrace,
            EntryChoice::Direct => EntryKind::Direct,
            EntryChoice::Auto if image.mcount_loc.is_empty() => EntryKind::Direct,
            EntryChoice::Auto => EntryKind::Ftrace,
        }
    }
}

/// How a plan's functions are entered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    Ftrace,
    Direct,
}

impl EntryKind {
    pub fn name(self) -> &'static str {
        match self {
            EntryKind::Ftrace => "ftrace",
            EntryKind::Direct => "direct",
        }
    }
}

/// Why direct sites could not be planned.
#[derive(Debug, thiserror::Error)]
pub enum DirectPlanError {
    #[error(transparent)]
    Tables(#[from] TableError),
    #[error("{} has no function whose entry can be displaced safely ({refused} refused)", path.display())]
    NoneSafe {
        path: std::path::PathBuf,
        refused: usize,
    },
    #[error(transparent)]
    Sites(#[from] SiteError),
}

impl crate::advice::TracerAdvice for DirectPlanError {
    fn problem(&self, w: &dyn crate::advice::TracerWords) -> String {
        match self {
            DirectPlanError::Sites(e) => e.problem(w),
            e => e.to_string(),
        }
    }

    fn remedy(&self) -> Option<crate::advice::Remedy> {
        match self {
            DirectPlanError::NoneSafe { .. } => Some(crate::advice::Remedy::FtraceEntries),
            DirectPlanError::Tables(TableError::NotFound { .. }) => {
                Some(crate::advice::Remedy::UnstrippedKernelVmlinux)
            }
            _ => None,
        }
    }
}

/// Every function's direct site, or why it has none.
#[derive(Clone, Debug, Default)]
pub struct DirectPlan {
    /// By the site's link address (`SiteIndex::addrs`).
    pub sites: HashMap<u64, DirectSite>,
    /// Functions refused, by function index, with why.
    pub refused: HashMap<usize, Refusal>,
    /// Refusals by rule (`Refusal::rule`), for the run's summary line.
    pub by_rule: std::collections::BTreeMap<&'static str, usize>,
    /// On a preemptible kernel, its task list: the stacks of preempted
    /// tasks are checked at each attach (`session::direct::contexts`).
    pub preempted: Option<crate::kernel::task_list::TaskList>,
    /// What the kernel's tables say of its thunks and static call
    /// trampolines: the functions of a module first loaded during the
    /// trace are judged with them (`crate::kernel::direct::module`).
    pub kernel_links: crate::kernel::direct::module::KernelLinks,
}

impl DirectPlan {
    /// Analyzes every function of `image`; the `SiteTable` of the safe ones.
    pub fn build(image: &KernelImage) -> Result<(DirectPlan, SiteTable), DirectPlanError> {
        let tables = SiteTables::read(image)?;
        let mut plan = DirectPlan {
            kernel_links: crate::kernel::direct::module::KernelLinks::of(&tables),
            ..DirectPlan::default()
        };
        let mut sites = Vec::new();
        if u32::try_from(image.functions.len()).is_err() {
            return Err(SiteError::TooManyFunctions {
                path: image.path.clone(),
                count: image.functions.len(),
            }
            .into());
        }
        for func in 0..image.functions.len() {
            match DirectSite::analyze(image, &tables, func) {
                Ok(site) => {
                    let init = image
                        .init_text
                        .is_some_and(|(s, e)| (s..e).contains(&site.addr));
                    sites.push(Site {
                        addr: site.addr,
                        // Fits: checked above.
                        func: func as u32,
                        init,
                    });
                    plan.sites.insert(site.addr, site);
                }
                Err(r) => {
                    *plan.by_rule.entry(r.rule()).or_default() += 1;
                    plan.refused.insert(func, r);
                }
            }
        }
        if sites.is_empty() {
            return Err(DirectPlanError::NoneSafe {
                path: image.path.clone(),
                refused: plan.refused.len(),
            });
        }
        sites.sort_unstable_by_key(|s| s.addr);
        sites.dedup_by_key(|s| s.addr);
        let table = SiteTable {
            entries: sites.len(),
            sites,
            rejected: 0,
            weak: 0,
            rejected_examples: Vec::new(),
        };
        Ok((plan, table))
    }

    /// `e`, a glob that matched no function with a direct site, with why
    /// each function it matched was refused one.
    pub fn name_refusals(&self, image: &KernelImage, e: FilterError) -> FilterError {
        let FilterError::NoMatch {
            input,
            glob,
            untraceable,
            closest,
            ..
        } = e
        else {
            return e;
        };
        let why = |name: &String| {
            let f = image
                .symbol(name)
                .and_then(|s| image.function_index_at(s.addr));
            f.and_then(|f| self.refused.get(&f))
                .map_or_else(|| "no direct site".to_string(), |r| r.to_string())
        };
        FilterError::NoMatch {
            input,
            glob,
            refused: untraceable.iter().map(why).collect(),
            untraceable,
            closest,
        }
    }

    /// "N functions refused a direct entry: rule N, ..." (most first);
    /// None when none was.
    pub fn summary(&self) -> Option<String> {
        let total: usize = self.by_rule.values().sum();
        if total == 0 {
            return None;
        }
        let mut by: Vec<_> = self.by_rule.iter().collect();
        by.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let rules: Vec<String> = by.iter().map(|(r, n)| format!("{r} {n}")).collect();
        Some(format!(
            "{} function(s) safe for a direct entry, {total} refused ({})",
            self.sites.len(),
            rules.join(", ")
        ))
    }
}
