//! Which functions of a module loaded during the trace the selection
//! takes, as ftrace enables a coming module's functions that
//! `set_ftrace_filter` names (`:mod:` included): by ftrace site
//! (`selected_functions`), or any function by its names (`selects`,
//! `crate::session::module_direct`'s direct entries).

use crate::kernel::filter::Filter;
use crate::kernel::module_image::module_function_name;
use crate::kernel::modules::LoadedModule;

/// A traced function of a module first loaded during the trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddedFunction {
    /// `function [module]`.
    pub name: String,
    /// Running address and size.
    pub addr: u64,
    pub size: u64,
    /// Its site (running address): its ftrace site, or its direct
    /// entry's first byte (`crate::session::module_direct`).
    pub site: u64,
}

/// The functions of `module` with an ftrace site that `filter` selects
/// (by `function [module]` or the bare name), in address order.
pub fn selected_functions(module: &LoadedModule, filter: &Filter) -> Vec<AddedFunction> {
    let mut out: Vec<AddedFunction> = Vec::new();
    for &site in &module.sites {
        let Some(f) = module.function_at(site) else {
            continue;
        };
        // One site per function: a second would count its calls twice.
        if out.last().is_some_and(|a| a.addr == f.addr) {
            continue;
        }
        let name = module_function_name(&f.name, &module.name);
        if selects(filter, &[&name, &f.name]) {
            out.push(AddedFunction {
                name,
                addr: f.addr,
                size: f.size,
                site,
            });
        }
    }
    out
}

/// Whether a function known by `names` (`function [module]` and its bare
/// name) is selected, as `Filter::select` judges a site's function at the
/// attach: by any name, removed (`!glob`, `--notrace`) by any.
pub fn selects(filter: &Filter, names: &[&str]) -> bool {
    let (trace, mut hits) = (filter.trace(), Vec::new());
    let positive = trace.is_empty()
        || names.iter().any(|n| {
            // Sets `hits` to the positive globs it matches, removed or not.
            trace.matches_into(n, &mut hits);
            !hits.is_empty()
        });
    positive && !names.iter().any(|n| filter.removes(n))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::kernel::modules::ModuleFunction;

    fn function(name: &str, addr: u64) -> ModuleFunction {
        ModuleFunction {
            name: name.into(),
            addr,
            size: 0x40,
        }
    }

    /// vmt_test loaded at `at`: vmt_batch, vmt_hit and vmt_write with
    /// sites, and any `more` functions without one (not traceable).
    pub(in crate::session::module_added) fn vmt_test(
        at: u64,
        more: &[(&str, u64)],
    ) -> LoadedModule {
        let mut functions = vec![
            function("vmt_batch", at),
            function("vmt_hit", at + 0x40),
            function("vmt_write", at + 0x80),
        ];
        functions.extend(more.iter().map(|&(n, off)| function(n, at + off)));
        LoadedModule {
            name: "vmt_test".into(),
            addr: at + 0x1000,
            text: at..at + 0x200,
            functions,
            sites: vec![at + 4, at + 0x44, at + 0x84],
            events: Vec::new(),
            tables: Default::default(),
        }
    }

    #[test]
    fn a_first_loaded_modules_functions_are_chosen_by_the_selection() {
        let base = 0xffff_ffff_c000_0000;
        let module = vmt_test(base, &[("vmt_notrace", 0xc0)]);
        let names = |trace: &[&str]| {
            let trace: Vec<String> = trace.iter().map(|s| s.to_string()).collect();
            let f = Filter::new(&trace, &[]).unwrap();
            selected_functions(&module, &f)
                .into_iter()
                .map(|a| (a.name, a.site - base))
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&["vmt_hit"]), [("vmt_hit [vmt_test]".into(), 0x44)]);
        assert_eq!(names(&["*:mod:vmt_test"]).len(), 3);
        assert_eq!(names(&["vmt_*,!vmt_batch"]).len(), 2);
        assert!(names(&["*:mod:other"]).is_empty());
        assert!(names(&["vmt_notrace"]).is_empty());
        assert!(names(&["hrtimer_*"]).is_empty());
    }

    /// Judged as the attach judges a site's function: by its full or bare
    /// name, `!glob` and `--notrace` by either.
    #[test]
    fn a_function_added_during_the_trace_is_selected_as_at_the_attach() {
        let f = |trace: &[&str], notrace: &[&str]| {
            let v = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
            Filter::new(&v(trace), &v(notrace)).unwrap()
        };
        let names = ["vmt_hit [vmt_test]", "vmt_hit"];
        assert!(selects(&f(&["vmt_*"], &[]), &names));
        assert!(selects(&f(&["*:mod:vmt_test"], &[]), &names));
        assert!(!selects(&f(&["*:mod:other"], &[]), &names));
        assert!(!selects(&f(&["vmt_*,!vmt_hit"], &[]), &names));
        assert!(!selects(&f(&["*:mod:vmt_test,!vmt_hit"], &[]), &names));
        assert!(!selects(&f(&["*:mod:vmt_test"], &["vmt_hit"]), &names));
    }
}
