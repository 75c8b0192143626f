//! `-e` globs that name a module's events by the module, as `--trace`'s
//! `GLOB:mod:MODULE` names its functions (ftrace's `set_ftrace_filter`
//! syntax): `SYSTEM:EVENT:mod:MODULE` (`vmt_test:*:mod:vmt_test`),
//! `EVENT:mod:MODULE`, or `:mod:MODULE` (every event of the module). The
//! part before `:mod:` is read as `set_event` reads a glob
//! (`super::select`; empty: every event), MODULE as a glob of module
//! names. A module's events are named by their system, which need not be
//! the module's name: `:mod:` is how a glob says whose events it means.
//!
//! Resolved against the events of the modules loaded at an attach
//! (`super::module_events`): a glob whose MODULE names a loaded module
//! becomes the full names of the events it selects there (none: refused
//! with the closest of that module's names); one whose MODULE names no
//! loaded module waits for it (the caller says what it does with it).

use globset::{GlobBuilder, GlobMatcher};

use crate::kernel::events::module_events::ModuleEvent;
pub use crate::kernel::events::select::MOD;
use crate::kernel::events::select::{EventGlobError, EventGlobs};
use crate::kernel::filter::closest_names;

/// Why `-e` globs naming a module cannot be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ModuleGlobError {
    #[error(transparent)]
    Glob(#[from] EventGlobError),
    #[error("bad module glob {module:?} in event glob {glob:?}: {reason}")]
    BadModule {
        glob: String,
        module: String,
        reason: String,
    },
    #[error(
        "event glob '{glob}' matches no event of the loaded module{} {module}{}",
        if *.modules > 1 { "s" } else { "" },
        closest_detail(closest)
    )]
    NoMatch {
        glob: String,
        module: String,
        /// How many loaded modules MODULE matches.
        modules: usize,
        /// The names of those modules' events closest to the glob.
        closest: Vec<String>,
    },
}

fn closest_detail(closest: &[String]) -> String {
    match closest.is_empty() {
        true => "; it has no event".into(),
        false => format!("; closest: {}", closest.join(", ")),
    }
}

/// `-e` globs with their `:mod:` globs resolved.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ModuleGlobs {
    /// The globs to select events with: those without `:mod:` as given,
    /// each of a loaded module made its events' full names.
    pub globs: Vec<String>,
    /// The `:mod:` globs whose module is not loaded, as given.
    pub waiting: Vec<String>,
}

/// Whether `arg` (one `-e` argument, comma-separated globs) names a
/// module with `:mod:`.
pub fn names_a_module(arg: &str) -> bool {
    arg.split(',').any(|g| g.contains(MOD))
}

/// `args` (the `-e` arguments) resolved against `events`, the events of
/// the modules `loaded` (every module loaded at the attach, with or
/// without events).
pub fn resolve(
    args: &[String],
    events: &[ModuleEvent],
    loaded: &[String],
) -> Result<ModuleGlobs, ModuleGlobError> {
    let mut out = ModuleGlobs::default();
    for arg in args {
        if !names_a_module(arg) {
            out.globs.push(arg.clone());
            continue;
        }
        for part in arg.split(',').map(str::trim) {
            if part.is_empty() {
                return Err(EventGlobError::Empty { arg: arg.clone() }.into());
            }
            let Some((glob, module)) = part.split_once(MOD) else {
                out.globs.push(part.to_string());
                continue;
            };
            let (negated, glob) = match glob.strip_prefix('!') {
                Some(rest) => (true, rest.trim()),
                None => (false, glob),
            };
            let m = module_matcher(part, module)?;
            let modules = loaded.iter().filter(|l| m.is_match(l.as_str())).count();
            if modules == 0 {
                // A module not loaded: nothing to leave out yet.
                if !negated {
                    out.waiting.push(part.to_string());
                }
                continue;
            }
            let select = EventGlobs::parse(&[match glob.is_empty() {
                true => "*:*".to_string(),
                false => glob.to_string(),
            }])?;
            let theirs: Vec<&ModuleEvent> =
                (events.iter()).filter(|e| m.is_match(&e.module)).collect();
            let names: Vec<String> = (theirs.iter())
                .filter(|e| select.is_match(&e.event))
                .map(|e| e.event.full_name())
                .collect();
            if names.is_empty() && !negated {
                let all: Vec<String> = theirs.iter().map(|e| e.event.full_name()).collect();
                let all: Vec<&str> = all.iter().map(String::as_str).collect();
                return Err(ModuleGlobError::NoMatch {
                    glob: part.to_string(),
                    module: module.to_string(),
                    modules,
                    closest: closest_names(glob, &all),
                });
            }
            let bang = if negated { "!" } else { "" };
            out.globs
                .extend(names.into_iter().map(|n| format!("{bang}{n}")));
        }
    }
    Ok(out)
}

/// MODULE of `part` as a glob of module names.
fn module_matcher(part: &str, module: &str) -> Result<GlobMatcher, ModuleGlobError> {
    let bad = |reason: String| ModuleGlobError::BadModule {
        glob: part.to_string(),
        module: module.to_string(),
        reason,
    };
    if module.is_empty() || module.contains(':') {
        return Err(bad("it is GLOB:mod:MODULE, MODULE a module's name".into()));
    }
    let g = GlobBuilder::new(module)
        .literal_separator(false)
        .build()
        .map_err(|e| bad(e.kind().to_string()))?;
    Ok(g.compile_matcher())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::events::KernelEvent;

    fn event(module: &str, system: &str, name: &str) -> ModuleEvent {
        ModuleEvent {
            module: module.into(),
            module_addr: 0,
            event: KernelEvent::declared(system, name, &[], None),
            format: None,
        }
    }

    fn events() -> Vec<ModuleEvent> {
        vec![
            event("vmt_test", "vmt_test", "vmt_event"),
            event("vmt_test", "vmt_test", "vmt_other"),
            event("kvm", "kvm", "kvm_exit"),
        ]
    }

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    fn loaded() -> Vec<String> {
        args(&["vmt_test", "kvm", "binfmt_misc"])
    }

    #[test]
    fn a_loaded_modules_glob_becomes_its_events_names_and_others_stay() {
        let r = resolve(
            &args(&["sched:sched_switch", "vmt_test:*:mod:vmt_test,irq:*"]),
            &events(),
            &loaded(),
        )
        .unwrap();
        assert_eq!(
            r.globs,
            args(&[
                "sched:sched_switch",
                "vmt_test:vmt_event",
                "vmt_test:vmt_other",
                "irq:*"
            ])
        );
        assert!(r.waiting.is_empty());
        // `:mod:MODULE` alone: every event of the module; `EVENT:mod:`
        // by name; a module glob.
        let r = resolve(
            &args(&[":mod:vmt_*", "kvm_exit:mod:kvm"]),
            &events(),
            &loaded(),
        );
        assert_eq!(
            r.unwrap().globs,
            args(&["vmt_test:vmt_event", "vmt_test:vmt_other", "kvm:kvm_exit"])
        );
        // Negated: its events left out by name.
        let r = resolve(&args(&["!vmt_other:mod:vmt_test"]), &events(), &loaded());
        assert_eq!(r.unwrap().globs, args(&["!vmt_test:vmt_other"]));
    }

    #[test]
    fn a_module_not_loaded_waits_and_a_glob_matching_none_of_a_loaded_ones_is_refused() {
        let r = resolve(
            &args(&["vmt_test:vmt_event:mod:vmt_gone", "!x:mod:nope"]),
            &events(),
            &loaded(),
        )
        .unwrap();
        assert!(r.globs.is_empty());
        assert_eq!(r.waiting, args(&["vmt_test:vmt_event:mod:vmt_gone"]));
        let e = resolve(
            &args(&["vmt_test:vmt_evnt:mod:vmt_test"]),
            &events(),
            &loaded(),
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "event glob 'vmt_test:vmt_evnt:mod:vmt_test' matches no event of the loaded \
             module vmt_test; closest: vmt_test:vmt_event, vmt_test:vmt_other"
        );
        let e = resolve(&args(&[":mod:binfmt_misc"]), &events(), &loaded()).unwrap_err();
        assert!(
            e.to_string().ends_with("binfmt_misc; it has no event"),
            "{e}"
        );
        let e = resolve(&args(&["x:mod:"]), &events(), &loaded()).unwrap_err();
        assert!(matches!(e, ModuleGlobError::BadModule { .. }), "{e}");
    }

    /// Where the guest's modules are not read (the own VMM, `list -e`), a
    /// `:mod:` glob is refused as such, not as a glob of two colons.
    #[test]
    fn a_module_glob_without_the_guests_modules_is_refused_as_such() {
        let e = EventGlobs::parse(&args(&["sched:*", "vmt_test:*:mod:vmt_test"])).unwrap_err();
        assert!(
            matches!(e, EventGlobError::Module { ref glob } if glob == "vmt_test:*:mod:vmt_test"),
            "{e}"
        );
    }
}
