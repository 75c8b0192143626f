//! Which events a list of globs names, as ftrace's `set_event` reads them
//! (kernel/trace/trace_events.c, `ftrace_event_match`): `SYSTEM:EVENT`
//! against both parts (`sched:*`, `block:block_rq_*`, `*:*switch*`), and
//! a glob without ':' against the event's name or its system. `!GLOB`
//! leaves out.

use globset::{Glob, GlobBuilder, GlobMatcher};

use crate::kernel::events::{EventError, EventTable, KernelEvent};
use crate::kernel::filter::closest_names;

/// What separates a glob from its module (`GLOB:mod:MODULE`, as in
/// `--trace` globs): only an attach resolves it (`super::module_globs`).
pub const MOD: &str = ":mod:";

/// Why event globs could not be compiled.
#[derive(Debug, thiserror::Error)]
pub enum EventGlobError {
    #[error("bad event glob {glob:?}: {reason}")]
    Bad { glob: String, reason: String },
    #[error("empty event glob in {arg:?}")]
    Empty { arg: String },
    #[error("event glob {glob:?} has more than one ':' (it is SYSTEM:EVENT)")]
    TwoColons { glob: String },
    /// `GLOB:mod:MODULE` reached a plan without the guest's modules: only
    /// an attach and `list --qmp` read them (`super::module_globs`).
    #[error(
        "event glob {glob:?} names a module's events (:mod:), which only an attach and a list \
         of a running guest read"
    )]
    Module { glob: String },
}

/// One glob, split at its ':'.
#[derive(Debug, Clone)]
struct EventGlob {
    /// As written.
    text: String,
    system: Option<GlobMatcher>,
    name: GlobMatcher,
}

impl EventGlob {
    fn is_match(&self, e: &KernelEvent) -> bool {
        match &self.system {
            Some(s) => s.is_match(&e.system) && self.name.is_match(&e.name),
            None => self.name.is_match(&e.name) || self.name.is_match(&e.system),
        }
    }
}

/// The event globs of a command line: none selects every event.
#[derive(Debug, Clone, Default)]
pub struct EventGlobs {
    positive: Vec<EventGlob>,
    negative: Vec<EventGlob>,
}

fn compile(glob: &str) -> Result<GlobMatcher, EventGlobError> {
    let g: Glob = GlobBuilder::new(glob)
        .literal_separator(false)
        .empty_alternates(true)
        .build()
        .map_err(|e| EventGlobError::Bad {
            glob: glob.to_owned(),
            reason: e.kind().to_string(),
        })?;
    Ok(g.compile_matcher())
}

impl EventGlobs {
    /// The globs of `args`, each a comma-separated list.
    pub fn parse(args: &[String]) -> Result<EventGlobs, EventGlobError> {
        let mut globs = EventGlobs::default();
        for arg in args {
            for part in arg.split(',') {
                let part = part.trim();
                let (negated, text) = match part.strip_prefix('!') {
                    Some(rest) => (true, rest.trim()),
                    None => (false, part),
                };
                if text.is_empty() {
                    return Err(EventGlobError::Empty { arg: arg.clone() });
                }
                if text.contains(MOD) {
                    return Err(EventGlobError::Module {
                        glob: text.to_owned(),
                    });
                }
                let glob = match text.split_once(':') {
                    Some((_, n)) if n.contains(':') => {
                        return Err(EventGlobError::TwoColons {
                            glob: text.to_owned(),
                        })
                    }
                    Some((s, n)) => EventGlob {
                        text: text.to_owned(),
                        system: Some(compile(if s.is_empty() { "*" } else { s })?),
                        name: compile(if n.is_empty() { "*" } else { n })?,
                    },
                    None => EventGlob {
                        text: text.to_owned(),
                        system: None,
                        name: compile(text)?,
                    },
                };
                match negated {
                    true => globs.negative.push(glob),
                    false => globs.positive.push(glob),
                }
            }
        }
        Ok(globs)
    }

    /// The globs that select (not the `!` ones), as given.
    pub fn positive_texts(&self) -> impl Iterator<Item = &str> {
        self.positive.iter().map(|g| g.text.as_str())
    }

    /// Whether event `e` is selected.
    pub fn is_match(&self, e: &KernelEvent) -> bool {
        (self.positive.is_empty() || self.positive.iter().any(|g| g.is_match(e)))
            && !self.negative.iter().any(|g| g.is_match(e))
    }
}

impl EventTable {
    /// The listed events `globs` select, in the array's order; an error
    /// names the first glob that selects none, with the closest names.
    pub fn select(&self, globs: &EventGlobs) -> Result<Vec<&KernelEvent>, EventError> {
        for g in &globs.positive {
            if !self.listed().any(|e| g.is_match(e)) {
                let names: Vec<String> = self.listed().map(KernelEvent::full_name).collect();
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                return Err(EventError::NoMatch {
                    glob: g.text.clone(),
                    path: self.path.clone(),
                    closest: closest_names(&g.text, &names),
                });
            }
        }
        Ok(self.listed().filter(|e| globs.is_match(e)).collect())
    }
}
