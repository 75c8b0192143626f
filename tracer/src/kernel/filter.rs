//! ftrace-style function filters: `--trace` and `--notrace` globs, as in
//! `set_ftrace_filter` / `set_ftrace_notrace`.
//!
//! The syntax is ftrace's, for what vmtrace can trace:
//!
//! - globs with `*`, `?`, `[...]` and `{a,b}` alternation (`{,_locked}`, an
//!   empty alternative, is allowed); a comma separates globs, except inside
//!   `{...}` and `[...]`: `hrtimer_{start,cancel}*,tick_*` is two globs;
//! - `!glob` in `--trace` removes what it matches from what the other
//!   `--trace` globs select (`--trace 'hrtimer_*,!hrtimer_wakeup'`). Unlike
//!   a sequence of writes to set_ftrace_filter, the order does not matter: a
//!   `!glob` always wins. A `--trace` of `!glob`s alone is refused (ftrace
//!   would remove them from an empty set: nothing to trace), and so is `!` in
//!   `--notrace`;
//! - ftrace's module syntax: `glob:mod:NAME` selects the functions of
//!   module NAME (a glob too) that glob matches, `:mod:NAME` all of them.
//!   A module's function is named `function [module]`, as ftrace lists it
//!   (`crate::kernel::module_image`), with its bare name as an alias, so a
//!   plain glob selects it too. Function commands (`func:traceon`, ...) are
//!   refused by name.
//!
//! `Globs` is one such list (also what `vmtrace list` takes, see
//! `crate::plan::list`); `Filter` is `--trace` and `--notrace` together.

use globset::{Glob, GlobBuilder, GlobSet, GlobSetBuilder};

use crate::advice::{Plain, TraceInput, TracerAdvice, TracerWords};
use crate::kernel::glob_syntax::{self, module_glob, NotGlob};
use crate::kernel::sites::SiteTable;
use crate::kernel::symbols::KernelImage;

/// How many close names a "matches nothing" error suggests.
const MAX_SUGGESTIONS: usize = 5;

/// Why filters could not be built or applied. Each names the glob list it
/// concerns as a `TraceInput` (`Trace`, `Notrace`, `List`), which a front end
/// words its own way (`crate::advice`).
#[derive(Debug, thiserror::Error)]
#[error("{}", self.say(&Plain))]
pub enum FilterError {
    EmptyGlob {
        input: TraceInput,
        arg: String,
    },
    BadGlob {
        input: TraceInput,
        glob: String,
        reason: String,
    },
    UnclosedBrace {
        input: TraceInput,
        arg: String,
    },
    UnopenedBrace {
        input: TraceInput,
        arg: String,
    },
    EmptyNegation {
        input: TraceInput,
        arg: String,
    },
    OnlyNegated {
        input: TraceInput,
        /// What the list selects: "trace", "list".
        verb: &'static str,
        /// The `!glob`s, comma-separated.
        globs: String,
    },
    /// A `!glob` in the notrace list: only the trace list takes them.
    NegatedNotrace {
        glob: String,
    },
    Module {
        input: TraceInput,
        glob: String,
    },
    Command {
        input: TraceInput,
        glob: String,
    },
    NoMatch {
        /// `Trace` or `Notrace`: ftrace refuses a glob that matches
        /// nothing in either file, and so does vmtrace.
        input: TraceInput,
        glob: String,
        /// Functions that match but have no ftrace call site.
        untraceable: Vec<String>,
        /// With direct entries: why each of `untraceable` was refused one
        /// (empty: ftrace sites).
        refused: Vec<String>,
        /// Traceable functions with names close to the glob.
        closest: Vec<String>,
    },
    /// The trace list's `!glob`s remove all its other globs select.
    NegatedEverything {
        /// The `!glob`s, comma-separated.
        globs: String,
    },
    /// The notrace list removes all the trace list selects.
    NothingLeft,
}

impl TracerAdvice for FilterError {
    fn problem(&self, w: &dyn TracerWords) -> String {
        let name = |i: &TraceInput| w.trace_input(*i);
        let (trace, notrace) = (
            w.trace_input(TraceInput::Trace),
            w.trace_input(TraceInput::Notrace),
        );
        match self {
            FilterError::EmptyGlob { input, arg } => format!(
                "{} has an empty glob in '{arg}'; remove the stray comma",
                name(input)
            ),
            FilterError::BadGlob {
                input,
                glob,
                reason,
            } => format!(
                "{} glob '{glob}' is invalid: {reason}; ftrace globs use *, ?, [...] and {{a,b}}",
                name(input)
            ),
            FilterError::UnclosedBrace { input, arg } => format!(
                "{} '{arg}' has an unclosed '{{'; close it: {{a,b}} matches a or b",
                name(input)
            ),
            FilterError::UnopenedBrace { input, arg } => format!(
                "{} '{arg}' has a '}}' without its '{{'; {{a,b}} matches a or b",
                name(input)
            ),
            FilterError::EmptyNegation { input, arg } => format!(
                "{} has a '!' without a glob in '{arg}'; write !GLOB, e.g. !hrtimer_wakeup",
                name(input)
            ),
            // `--args` takes its globs after `=` only (it may stand alone).
            FilterError::OnlyNegated { input, verb, globs } => format!(
                "{0} '{globs}' only removes functions; add what to {verb}, e.g. {0}{1}'*,{globs}'",
                name(input),
                if *input == TraceInput::Args { "=" } else { " " }
            ),
            FilterError::NegatedNotrace { glob } => format!(
                "{notrace} '{glob}': '!' only works in {trace} (e.g. {trace} '*,{glob}'); \
                 give {notrace} the functions not to trace"
            ),
            FilterError::Module { input, glob } => format!(
                "{} '{glob}': no module named after ':mod:'; write FUNCTION_GLOB:mod:MODULE \
                 (e.g. '*:mod:virtio_blk')",
                name(input)
            ),
            FilterError::Command { input, glob } => format!(
                "{} '{glob}': ftrace commands (FUNCTION:COMMAND, e.g. schedule:traceon) are not \
                 supported; give function globs only",
                name(input)
            ),
            FilterError::NoMatch {
                input,
                glob,
                untraceable,
                refused,
                closest,
            } => format!(
                "{} '{glob}' matches no traceable function{}",
                name(input),
                no_match_detail(untraceable, refused, closest)
            ),
            FilterError::NegatedEverything { globs } => format!(
                "{trace} '{globs}' removes every function the other {trace} globs select; narrow it"
            ),
            FilterError::NothingLeft => {
                format!("{notrace} removes every function {trace} selects; narrow {notrace}")
            }
        }
    }
}

fn no_match_detail(untraceable: &[String], refused: &[String], closest: &[String]) -> String {
    let mut s = String::new();
    if !refused.is_empty() {
        let why: Vec<String> = untraceable
            .iter()
            .zip(refused)
            .map(|(n, r)| format!("{n}: refused for a direct entry: {r}"))
            .collect();
        s.push_str(&format!(" ({})", why.join("; ")));
    } else if !untraceable.is_empty() {
        let names = untraceable.join(", ");
        s.push_str(&format!(
            " ({names}: no ftrace call site, notrace or inlined?)"
        ));
    }
    if !closest.is_empty() {
        s.push_str(&format!("; closest: {}", closest.join(", ")));
    }
    s
}

/// A list of ftrace globs over function names, `!glob`s included: a name
/// matches when it matches a positive glob (or there is no glob at all) and
/// no `!glob`.
#[derive(Debug, Clone)]
pub struct Globs {
    /// The positive globs as written.
    pub(crate) positive: Vec<String>,
    pub(crate) positive_set: GlobSet,
    /// The `!glob`s without their `!`.
    negative: Vec<String>,
    pub(crate) negative_set: GlobSet,
}

impl Globs {
    /// The values of repeated `--trace` flags, each a comma-separated list.
    pub fn for_trace(args: &[String]) -> Result<Globs, FilterError> {
        Globs::parse(TraceInput::Trace, "trace", args)
    }

    /// The globs given to `vmtrace list` (same syntax as `--trace`; none:
    /// every function). Errors name them `list`.
    pub fn for_list(args: &[String]) -> Result<Globs, FilterError> {
        Globs::parse(TraceInput::List, "list", args)
    }

    /// `--stack`'s values (same syntax as `--trace`).
    pub fn for_stack(args: &[String]) -> Result<Globs, FilterError> {
        Globs::parse(TraceInput::Stack, "stack", args)
    }

    /// The globs that filter a saved trace's events (`crate::trace::filter`).
    pub fn for_symbols(args: &[String]) -> Result<Globs, FilterError> {
        Globs::parse(TraceInput::Symbols, "show", args)
    }

    /// `--args=GLOB`'s values (same syntax as `--trace`).
    pub fn for_args(args: &[String]) -> Result<Globs, FilterError> {
        Globs::parse(TraceInput::Args, "args", args)
    }

    fn parse(input: TraceInput, verb: &'static str, args: &[String]) -> Result<Globs, FilterError> {
        let mut positive = Vec::new();
        let mut negative = Vec::new();
        for (arg, glob) in split_globs(input, args)? {
            check_syntax(input, &glob)?;
            match glob.strip_prefix('!') {
                Some(rest) => {
                    let rest = rest.trim_start();
                    if rest.is_empty() {
                        return Err(FilterError::EmptyNegation { input, arg });
                    }
                    negative.push(rest.to_string());
                }
                None => positive.push(glob),
            }
        }
        if positive.is_empty() && !negative.is_empty() {
            return Err(FilterError::OnlyNegated {
                input,
                verb,
                globs: negated(&negative),
            });
        }
        Ok(Globs {
            positive_set: glob_set(input, &positive)?,
            negative_set: glob_set(input, &negative)?,
            positive,
            negative,
        })
    }

    /// No glob at all: every function matches.
    pub fn is_empty(&self) -> bool {
        self.positive.is_empty()
    }

    /// The positive globs, as written.
    pub fn positive(&self) -> &[String] {
        &self.positive
    }

    /// The `!glob`s, without their `!`.
    pub fn negative(&self) -> &[String] {
        &self.negative
    }

    /// Whether `name` is selected.
    pub fn is_match(&self, name: &str) -> bool {
        (self.positive.is_empty() || self.positive_set.is_match(name))
            && !self.negative_set.is_match(name)
    }

    /// Like `is_match`, also setting `hits` to the indices (into
    /// `positive()`) of the positive globs `name` matches, whether or not a
    /// `!glob` removes it: such a glob did match something.
    pub fn matches_into(&self, name: &str, hits: &mut Vec<usize>) -> bool {
        hits.clear();
        if !self.positive.is_empty() {
            self.positive_set.matches_into(name, hits);
            if hits.is_empty() {
                return false;
            }
        }
        !self.negative_set.is_match(name)
    }
}

/// `!a,!b`.
fn negated(globs: &[String]) -> String {
    let each: Vec<String> = globs.iter().map(|g| format!("!{g}")).collect();
    each.join(",")
}

/// Refuses ftrace syntax vmtrace has no use for (commands) and a `:mod:`
/// without a module (`glob_syntax::check`).
fn check_syntax(input: TraceInput, glob: &str) -> Result<(), FilterError> {
    let glob_ = || glob.to_string();
    glob_syntax::check(glob).map_err(|r| match r {
        NotGlob::Module => FilterError::Module {
            input,
            glob: glob_(),
        },
        NotGlob::Command => FilterError::Command {
            input,
            glob: glob_(),
        },
    })
}

/// `--trace` / `--notrace` globs over function names.
#[derive(Debug, Clone)]
pub struct Filter {
    trace: Globs,
    notrace: GlobSet,
    /// The `--notrace` globs as written, in `notrace`'s order.
    notrace_globs: Vec<String>,
}

impl Filter {
    /// `trace` and `notrace` hold the values of repeated `--trace` and
    /// `--notrace` flags, each a comma-separated list of ftrace globs.
    pub fn new(trace: &[String], notrace: &[String]) -> Result<Self, FilterError> {
        let trace = Globs::for_trace(trace)?;
        let mut notrace_globs = Vec::new();
        for (_, glob) in split_globs(TraceInput::Notrace, notrace)? {
            check_syntax(TraceInput::Notrace, &glob)?;
            if glob.starts_with('!') {
                return Err(FilterError::NegatedNotrace { glob });
            }
            notrace_globs.push(glob);
        }
        Ok(Filter {
            trace,
            notrace: glob_set(TraceInput::Notrace, &notrace_globs)?,
            notrace_globs,
        })
    }

    /// The `--trace` globs.
    pub fn trace(&self) -> &Globs {
        &self.trace
    }

    /// Whether function `name` is selected (whatever its sites).
    pub fn is_match(&self, name: &str) -> bool {
        self.trace.is_match(name) && !self.notrace.is_match(name)
    }

    /// Whether a `!glob` or `--notrace` removes function `name`.
    pub fn removes(&self, name: &str) -> bool {
        self.trace.negative_set.is_match(name) || self.notrace.is_match(name)
    }

    /// Indices into `sites.sites` of the sites whose function matches. Every
    /// positive `--trace` glob must match some function with a site; a
    /// `!glob` may match nothing.
    pub fn select(
        &self,
        image: &KernelImage,
        sites: &SiteTable,
    ) -> Result<Vec<usize>, FilterError> {
        let mut glob_used = vec![false; self.trace.positive.len()];
        let mut notrace_used = vec![false; self.notrace_globs.len()];
        let mut hits = Vec::new();
        let mut selected = Vec::new();
        // Some site survives --trace's `!globs` (before --notrace).
        let mut any_traced = false;
        for (i, site) in sites.sites.iter().enumerate() {
            // A function with aliases is selected by any of its names and
            // removed (`!glob`, --notrace) by any.
            let (mut positive, mut negated, mut removed) = (false, false, false);
            for name in image.names(site.func as usize) {
                if !self.notrace_globs.is_empty() {
                    self.notrace.matches_into(name, &mut hits);
                    for &g in &hits {
                        notrace_used[g] = true;
                    }
                    removed |= !hits.is_empty();
                }
                // Sets `hits` whether or not a `!glob` removes the name.
                self.trace.matches_into(name, &mut hits);
                for &g in &hits {
                    glob_used[g] = true;
                }
                positive |= self.trace.positive.is_empty() || !hits.is_empty();
                negated |= self.trace.negative_set.is_match(name);
            }
            if !positive || negated {
                continue;
            }
            any_traced = true;
            if !removed {
                selected.push(i);
            }
        }
        if let Some(g) = glob_used.iter().position(|used| !used) {
            return Err(self.no_match(TraceInput::Trace, &self.trace.positive[g], image, sites));
        }
        if let Some(g) = notrace_used.iter().position(|used| !used) {
            return Err(self.no_match(TraceInput::Notrace, &self.notrace_globs[g], image, sites));
        }
        if selected.is_empty() {
            if !any_traced && !self.trace.negative.is_empty() {
                return Err(FilterError::NegatedEverything {
                    globs: negated(&self.trace.negative),
                });
            }
            return Err(FilterError::NothingLeft);
        }
        Ok(selected)
    }

    /// The error for an `input` glob that matched no function with a site.
    fn no_match(
        &self,
        input: TraceInput,
        glob: &str,
        image: &KernelImage,
        sites: &SiteTable,
    ) -> FilterError {
        let mut traceable: Vec<&str> = sites
            .sites
            .iter()
            .flat_map(|s| image.names(s.func as usize))
            .collect();
        traceable.sort_unstable();
        traceable.dedup();

        let untraceable = match compile(glob) {
            Ok(g) => {
                let m = g.compile_matcher();
                let mut names: Vec<String> = (0..image.functions.len())
                    .flat_map(|i| image.names(i))
                    .filter(|name| m.is_match(name))
                    .map(|name| crate::kernel::names::escape(name).into_owned())
                    .collect();
                names.sort_unstable();
                names.dedup();
                names.truncate(MAX_SUGGESTIONS);
                names
            }
            Err(_) => Vec::new(),
        };
        FilterError::NoMatch {
            input,
            glob: glob.to_string(),
            untraceable,
            refused: Vec::new(),
            closest: closest_names(glob, &traceable),
        }
    }
}

/// Splits comma lists into single globs (each with the argument it came
/// from), but not at a comma inside `{...}` (alternation) or `[...]`.
fn split_globs(input: TraceInput, args: &[String]) -> Result<Vec<(String, String)>, FilterError> {
    let mut globs = Vec::new();
    for arg in args {
        let mut push = |glob: &str| {
            let glob = glob.trim();
            if glob.is_empty() {
                // Silently dropping it could turn `--trace ,` into "trace all".
                return Err(FilterError::EmptyGlob {
                    input,
                    arg: arg.clone(),
                });
            }
            globs.push((arg.clone(), glob.to_string()));
            Ok(())
        };
        let mut depth = 0usize;
        let mut start = 0;
        let mut chars = arg.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            match c {
                // An escaped character is literal (globset's `\`).
                '\\' => {
                    chars.next();
                }
                '[' => skip_class(&mut chars),
                '{' => depth += 1,
                '}' if depth == 0 => {
                    return Err(FilterError::UnopenedBrace {
                        input,
                        arg: arg.clone(),
                    })
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    push(&arg[start..i])?;
                    start = i + 1;
                }
                _ => {}
            }
        }
        if depth > 0 {
            return Err(FilterError::UnclosedBrace {
                input,
                arg: arg.clone(),
            });
        }
        push(&arg[start..])?;
    }
    Ok(globs)
}

/// Skips a `[...]` class whose `[` was just read, as globset reads it: a
/// `]` (after an optional `!`) first in the class is literal. An unclosed
/// class runs to the end (globset then names the error).
fn skip_class(chars: &mut std::iter::Peekable<std::str::CharIndices>) {
    if chars.peek().is_some_and(|&(_, c)| c == '!') {
        chars.next();
    }
    if chars.peek().is_some_and(|&(_, c)| c == ']') {
        chars.next();
    }
    for (_, c) in chars.by_ref() {
        if c == ']' {
            return;
        }
    }
}

/// One glob; names have no '/', so `*` may match anything.
fn compile(glob: &str) -> Result<Glob, globset::Error> {
    GlobBuilder::new(glob)
        .literal_separator(false)
        .empty_alternates(true)
        .build()
}

fn glob_set(input: TraceInput, globs: &[String]) -> Result<GlobSet, FilterError> {
    let bad = |glob: &str, e: globset::Error| FilterError::BadGlob {
        input,
        glob: glob.to_string(),
        reason: e.kind().to_string(),
    };
    let mut builder = GlobSetBuilder::new();
    for glob in globs {
        builder.add(compile(&module_glob(glob)).map_err(|e| bad(glob, e))?);
    }
    builder.build().map_err(|e| bad(&globs.join(","), e))
}

/// Up to `MAX_SUGGESTIONS` names closest to `glob` (escaped for printing):
/// smallest edit distance between the glob's literal text and the name (a
/// leading / trailing `*` lets the name have any prefix / suffix; containing
/// the text anywhere costs 1), then the longest common prefix.
pub(crate) fn closest_names(glob: &str, names: &[&str]) -> Vec<String> {
    let free_start = glob.starts_with('*');
    let free_end = glob.ends_with('*');
    let literal = literal_text(glob);
    let mut scored: Vec<(usize, std::cmp::Reverse<usize>, &str)> = names
        .iter()
        .map(|name| {
            let name_chars: Vec<char> = name.chars().collect();
            let shaped = edit_distance(&literal, &name_chars, free_start, free_end);
            let anywhere = edit_distance(&literal, &name_chars, true, true) + 1;
            let d = shaped.min(anywhere);
            let prefix = literal
                .iter()
                .zip(&name_chars)
                .take_while(|(a, b)| a == b)
                .count();
            (d, std::cmp::Reverse(prefix), *name)
        })
        .collect();
    scored.sort_unstable();
    scored
        .into_iter()
        .take(MAX_SUGGESTIONS)
        .map(|(_, _, n)| crate::kernel::names::escape(n).into_owned())
        .collect()
}

/// The glob without its wildcards and `[...]` classes, and of each `{...}`
/// alternation only the first alternative.
fn literal_text(glob: &str) -> Vec<char> {
    let mut out = Vec::new();
    let mut in_class = false;
    let mut depth = 0usize;
    // The depth of the alternation whose later alternatives are skipped.
    let mut skip_from: Option<usize> = None;
    for c in glob.chars() {
        if in_class {
            in_class = c != ']';
            continue;
        }
        match c {
            '[' => in_class = true,
            '{' => depth += 1,
            '}' => {
                if skip_from == Some(depth) {
                    skip_from = None;
                }
                depth = depth.saturating_sub(1);
            }
            ',' if depth > 0 => {
                skip_from.get_or_insert(depth);
            }
            '*' | '?' | '\\' => {}
            _ if skip_from.is_none() => out.push(c),
            _ => {}
        }
    }
    out
}

/// Levenshtein distance from `pat` to `text`; with `free_start` / `free_end`,
/// skipping a prefix / suffix of `text` costs nothing (Sellers' variant).
fn edit_distance(pat: &[char], text: &[char], free_start: bool, free_end: bool) -> usize {
    // prev[j]: distance of pat[..i] to text[..j].
    let mut prev: Vec<usize> = (0..=text.len())
        .map(|j| if free_start { 0 } else { j })
        .collect();
    let mut cur = vec![0; text.len() + 1];
    for (i, &p) in pat.iter().enumerate() {
        cur[0] = i + 1;
        for (j, &t) in text.iter().enumerate() {
            let substitute = prev[j] + usize::from(p != t);
            cur[j + 1] = substitute.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    if free_end {
        prev.into_iter().min().unwrap_or(0)
    } else {
        prev[text.len()]
    }
}

/// A `KernelImage` and `SiteTable` made of names, for unit tests here and
/// in `crate::plan::list`.
#[cfg(test)]
pub(crate) mod testing {
    use crate::kernel::sites::{Site, SiteTable};
    use crate::kernel::symbols::{KernelImage, Symbol};

    /// Where a test function's ftrace site is.
    #[derive(Clone, Copy)]
    pub(crate) enum Has {
        Site,
        InitSite,
        NoSite,
    }

    /// Functions 0x100 bytes apart, in the order given; init sites are
    /// inside `init_text`.
    pub(crate) fn image(funcs: &[(&str, Has)]) -> (KernelImage, SiteTable) {
        const TEXT: u64 = 0xffff_ffff_8100_0000;
        const INIT: u64 = 0xffff_ffff_8300_0000;
        let mut functions = Vec::new();
        let mut sites = Vec::new();
        for (i, &(name, has)) in funcs.iter().enumerate() {
            let base = match has {
                Has::InitSite => INIT,
                _ => TEXT,
            };
            let addr = base + i as u64 * 0x100;
            functions.push(Symbol {
                name: name.to_string(),
                addr,
                size: 0x100,
            });
            if !matches!(has, Has::NoSite) {
                sites.push(Site {
                    addr,
                    func: 0,
                    init: matches!(has, Has::InitSite),
                });
            }
        }
        // Sorted by address, as `KernelImage` and `SiteTable` keep them.
        let mut order: Vec<usize> = (0..functions.len()).collect();
        order.sort_by_key(|&i| functions[i].addr);
        let functions: Vec<Symbol> = order.iter().map(|&i| functions[i].clone()).collect();
        for s in &mut sites {
            s.func = functions.iter().position(|f| f.addr == s.addr).unwrap() as u32;
        }
        sites.sort_by_key(|s| s.addr);
        let image = KernelImage {
            path: "test-vmlinux".into(),
            build_id: None,
            functions,
            aliases: Vec::new(),
            mcount_loc: sites.iter().map(|s| s.addr).collect(),
            init_text: Some((INIT, INIT + 0x10_0000)),
            text: Some((TEXT, TEXT + 0x10_0000)),
            source: "test".into(),
            linux: true,
            typed: None,
            entries: Default::default(),
            symbols: Default::default(),
            sections: Vec::new(),
            bytes: Default::default(),
            modules: Vec::new(),
        };
        let table = SiteTable {
            entries: sites.len(),
            sites,
            rejected: 0,
            weak: 0,
            rejected_examples: Vec::new(),
        };
        (image, table)
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{image, Has};
    use super::*;

    fn chars(s: &str) -> Vec<char> {
        s.chars().collect()
    }

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn filter(trace: &[&str], notrace: &[&str]) -> Result<Filter, FilterError> {
        Filter::new(&strings(trace), &strings(notrace))
    }

    const FUNCS: &[(&str, Has)] = &[
        ("hrtimer_start_range_ns", Has::Site),
        ("hrtimer_cancel", Has::Site),
        ("hrtimer_wakeup", Has::Site),
        ("hrtimer_interrupt", Has::Site),
        ("tick_sched_timer", Has::Site),
        ("schedule", Has::Site),
        ("start_kernel", Has::InitSite),
        ("mini_account", Has::NoSite),
    ];

    /// The names `select` picks.
    fn select(trace: &[&str], notrace: &[&str]) -> Result<Vec<String>, FilterError> {
        let (image, sites) = image(FUNCS);
        let idx = filter(trace, notrace)?.select(&image, &sites)?;
        let mut names: Vec<String> = idx
            .iter()
            .map(|&i| image.functions[sites.sites[i].func as usize].name.clone())
            .collect();
        names.sort();
        Ok(names)
    }

    /// A function known by two names (`__x64_sys_getpid` and its alias
    /// `__do_sys_getpid`) is selected by either and removed by either.
    #[test]
    fn aliases_select_and_remove_their_function() {
        let (mut image, sites) = image(&[("__x64_sys_getpid", Has::Site), ("schedule", Has::Site)]);
        let getpid = image
            .functions
            .iter()
            .position(|f| f.name == "__x64_sys_getpid")
            .unwrap();
        image.aliases = vec![(getpid, "__do_sys_getpid".into())];
        let names = |trace: &[&str], notrace: &[&str]| -> Result<Vec<&str>, FilterError> {
            let idx = filter(trace, notrace)?.select(&image, &sites)?;
            Ok(idx
                .iter()
                .map(|&i| image.functions[sites.sites[i].func as usize].name.as_str())
                .collect())
        };
        assert_eq!(
            names(&["__do_sys_getpid"], &[]).unwrap(),
            ["__x64_sys_getpid"]
        );
        assert_eq!(names(&["__*_getpid"], &[]).unwrap(), ["__x64_sys_getpid"]);
        assert_eq!(names(&["*", "!__do_sys_*"], &[]).unwrap(), ["schedule"]);
        assert_eq!(names(&["*"], &["__do_sys_getpid"]).unwrap(), ["schedule"]);
        // A typo's suggestions include aliases.
        let e = names(&["__do_sys_getpd"], &[]).unwrap_err();
        assert!(e.to_string().contains("closest: __do_sys_getpid"), "{e}");
    }

    #[test]
    fn matches_follows_trace_and_notrace() {
        let f = filter(&["hrtimer_*"], &["*wakeup"]).expect("filter");
        assert!(f.is_match("hrtimer_interrupt"));
        assert!(!f.is_match("hrtimer_wakeup"));
        assert!(!f.is_match("schedule"));
        let all = filter(&[], &[]).expect("filter");
        assert!(all.is_match("anything.isra.0"));
    }

    #[test]
    fn negation_in_trace_removes_whatever_the_order() {
        for trace in [
            &["hrtimer_*,!hrtimer_wakeup"][..],
            &["!hrtimer_wakeup", "hrtimer_*"],
            &["hrtimer_*", " ! hrtimer_wakeup"],
        ] {
            let got = select(trace, &[]).expect("select");
            assert_eq!(
                got,
                [
                    "hrtimer_cancel",
                    "hrtimer_interrupt",
                    "hrtimer_start_range_ns"
                ],
                "{trace:?}"
            );
        }
        // `*,!glob`: everything but.
        let got = select(&["*,!hrtimer_*"], &[]).expect("select");
        assert_eq!(got, ["schedule", "start_kernel", "tick_sched_timer"]);
    }

    #[test]
    fn negation_matching_nothing_is_fine() {
        let got = select(&["schedule,!no_such_function"], &[]).expect("select");
        assert_eq!(got, ["schedule"]);
    }

    #[test]
    fn negation_alone_is_refused() {
        let e = filter(&["!hrtimer_wakeup"], &[]).expect_err("only negated");
        assert_eq!(
            e.to_string(),
            "trace filter '!hrtimer_wakeup' only removes functions; add what to trace, \
             e.g. trace filter '*,!hrtimer_wakeup'"
        );
        let e = Globs::for_list(&strings(&["!a,!b"])).expect_err("only negated");
        assert_eq!(
            e.to_string(),
            "list globs '!a,!b' only removes functions; add what to list, e.g. list globs '*,!a,!b'"
        );
        let e = filter(&["schedule,!"], &[]).expect_err("empty negation");
        assert!(matches!(e, FilterError::EmptyNegation { .. }), "{e:?}");
    }

    #[test]
    fn negation_removing_everything_says_which() {
        let e = select(&["hrtimer_w*,!hrtimer_*"], &[]).expect_err("nothing left");
        assert!(matches!(e, FilterError::NegatedEverything { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "trace filter '!hrtimer_*' removes every function the other trace filter globs select; \
             narrow it"
        );
        let e = select(&["hrtimer_w*"], &["hrtimer_*"]).expect_err("nothing left");
        assert!(matches!(e, FilterError::NothingLeft), "{e:?}");
    }

    #[test]
    fn negation_in_notrace_is_refused() {
        let e = filter(&[], &["!schedule"]).expect_err("negated notrace");
        let msg = e.to_string();
        assert!(msg.starts_with("notrace filter '!schedule': '!' only works in trace filter"));
        assert!(!msg.contains('\n'));
    }

    #[test]
    fn a_mod_without_a_module_and_commands_are_refused() {
        for (list, glob) in [
            ("trace filter", ":mod:"),
            ("trace filter", "ext4_*:mod:"),
            ("notrace filter", "*:mod:a:b"),
        ] {
            let (t, n) = if list == "trace filter" {
                (vec![glob], vec![])
            } else {
                (vec![], vec![glob])
            };
            let e = filter(&t, &n).expect_err("module");
            assert!(matches!(e, FilterError::Module { .. }), "{e:?}");
            assert_eq!(
                e.to_string(),
                format!(
                    "{list} '{glob}': no module named after ':mod:'; write \
                     FUNCTION_GLOB:mod:MODULE (e.g. '*:mod:virtio_blk')"
                )
            );
        }
        let e = filter(&["schedule:traceon"], &[]).expect_err("command");
        assert!(matches!(e, FilterError::Command { .. }), "{e:?}");
    }

    /// `G:mod:M` selects module M's functions (named `F [M]`) that G
    /// matches; a plain glob matches the full name or (through its alias)
    /// the bare one, never a kernel function of another name.
    #[test]
    fn mod_globs_select_a_modules_functions() {
        let g = |globs: &[&str]| Globs::for_trace(&strings(globs)).unwrap();
        let all = g(&[":mod:vmt_test"]);
        assert!(all.is_match("vmt_hit [vmt_test]"));
        assert!(!all.is_match("vmt_hit"));
        assert!(!all.is_match("vmt_hit [vmt_other]"));
        let some = g(&["vmt_h*:mod:vmt_*"]);
        assert!(some.is_match("vmt_hit [vmt_other]"));
        assert!(!some.is_match("vmt_batch [vmt_test]"));
        let not = g(&["*:mod:vmt_test,!vmt_hit:mod:vmt_test"]);
        assert!(not.is_match("vmt_batch [vmt_test]"));
        assert!(!not.is_match("vmt_hit [vmt_test]"));
    }

    #[test]
    fn braces_alternate_and_do_not_split() {
        let got = select(&["hrtimer_{start,cancel}*,tick_*"], &[]).expect("select");
        assert_eq!(
            got,
            [
                "hrtimer_cancel",
                "hrtimer_start_range_ns",
                "tick_sched_timer"
            ]
        );
        // An empty alternative, and a negated alternation.
        let got = select(&["schedule{,_idle}"], &[]).expect("select");
        assert_eq!(got, ["schedule"]);
        let got = select(&["hrtimer_*,!hrtimer_{wakeup,cancel}"], &[]).expect("select");
        assert_eq!(got, ["hrtimer_interrupt", "hrtimer_start_range_ns"]);
        // Commas inside a class are not separators either.
        let split = split_globs(TraceInput::Trace, &strings(&["a[,]b,{c,[}]d},e"])).expect("split");
        let globs: Vec<&str> = split.iter().map(|(_, g)| g.as_str()).collect();
        assert_eq!(globs, ["a[,]b", "{c,[}]d}", "e"]);
    }

    #[test]
    fn unbalanced_braces_are_refused() {
        let e = filter(&["hrtimer_{start,cancel*"], &[]).expect_err("unclosed");
        assert_eq!(
            e.to_string(),
            "trace filter 'hrtimer_{start,cancel*' has an unclosed '{'; close it: {a,b} matches \
             a or b"
        );
        let e = filter(&[], &["tick_}"]).expect_err("unopened");
        assert_eq!(
            e.to_string(),
            "notrace filter 'tick_}' has a '}' without its '{'; {a,b} matches a or b"
        );
    }

    #[test]
    fn no_match_names_only_positive_globs() {
        let e = select(&["schedul"], &[]).expect_err("no match");
        let FilterError::NoMatch { glob, closest, .. } = &e else {
            panic!("{e:?}");
        };
        assert_eq!(glob, "schedul");
        assert_eq!(closest[0], "schedule");
        // An alternation's suggestions come from its first alternative.
        let e = select(&["hrtimer_{wakup,x}"], &[]).expect_err("no match");
        let FilterError::NoMatch { closest, .. } = &e else {
            panic!("{e:?}");
        };
        assert_eq!(closest[0], "hrtimer_wakeup");
        let e = select(&["mini_account"], &[]).expect_err("notrace");
        assert!(
            e.to_string().contains("mini_account: no ftrace call site"),
            "{e}"
        );
    }

    #[test]
    fn levenshtein_plain() {
        assert_eq!(
            edit_distance(&chars("kitten"), &chars("sitting"), false, false),
            3
        );
        assert_eq!(edit_distance(&chars(""), &chars("abc"), false, false), 3);
        assert_eq!(edit_distance(&chars("abc"), &chars(""), false, false), 3);
        assert_eq!(
            edit_distance(&chars("schedule"), &chars("schedule"), false, false),
            0
        );
    }

    #[test]
    fn levenshtein_with_free_ends() {
        // 'hrtimr_*' is one edit from every hrtimer_ name's prefix.
        let d = edit_distance(&chars("hrtimr_"), &chars("hrtimer_wakeup"), false, true);
        assert_eq!(d, 1);
        // '*wakup*' inside a longer name.
        let d = edit_distance(&chars("wakup"), &chars("hrtimer_wakeup"), true, true);
        assert_eq!(d, 1);
    }

    #[test]
    fn literal_text_drops_wildcards_classes_and_later_alternatives() {
        assert_eq!(literal_text("hr[ab]timer_?x*"), chars("hrtimer_x"));
        assert_eq!(literal_text("a{b,c}d"), chars("abd"));
        assert_eq!(literal_text("a{b{c,x},y}d"), chars("abcd"));
    }

    #[test]
    fn closest_prefers_distance_then_prefix() {
        let names = ["schedule", "schedule_idle", "do_idle", "hrtimer_wakeup"];
        assert_eq!(closest_names("schedul", &names)[0], "schedule");
        assert_eq!(closest_names("hrtimr_*", &names)[0], "hrtimer_wakeup");
        // A bare word also finds names containing it.
        let names = ["schedule", "do_idle", "tick_sched_timer", "mini_main"];
        assert_eq!(
            closest_names("sched", &names)[..2],
            ["schedule", "tick_sched_timer"]
        );
    }
}
