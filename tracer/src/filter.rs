//! ftrace-style function filters: `--trace` and `--notrace` globs, as in
//! `set_ftrace_filter` / `set_ftrace_notrace`.

use globset::{Glob, GlobBuilder, GlobSet, GlobSetBuilder};

use crate::sites::SiteTable;
use crate::symbols::KernelImage;

/// How many close names a "matches nothing" error suggests.
const MAX_SUGGESTIONS: usize = 5;

/// Why filters could not be built or applied.
#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    #[error("{flag} has an empty glob in '{arg}'; remove the stray comma")]
    EmptyGlob { flag: &'static str, arg: String },
    #[error("{flag} glob '{glob}' is invalid: {reason}; ftrace globs use *, ? and [...]")]
    BadGlob {
        flag: &'static str,
        glob: String,
        reason: String,
    },
    #[error(
        "--trace '{glob}' matches no traceable function{}",
        no_match_detail(untraceable, closest)
    )]
    NoMatch {
        glob: String,
        /// Functions that match but have no ftrace call site.
        untraceable: Vec<String>,
        /// Traceable functions with names close to the glob.
        closest: Vec<String>,
    },
    #[error("--notrace removes every function --trace selects; narrow --notrace")]
    NothingLeft,
}

fn no_match_detail(untraceable: &[String], closest: &[String]) -> String {
    let mut s = String::new();
    if !untraceable.is_empty() {
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

/// `--trace` / `--notrace` globs over function names.
#[derive(Debug, Clone)]
pub struct Filter {
    /// The individual `--trace` globs as written; empty means everything.
    trace_globs: Vec<String>,
    trace: GlobSet,
    notrace: GlobSet,
}

impl Filter {
    /// `trace` and `notrace` hold the values of repeated `--trace` and
    /// `--notrace` flags, each a comma-separated list of ftrace globs.
    pub fn new(trace: &[String], notrace: &[String]) -> Result<Self, FilterError> {
        let trace_globs = split_globs("--trace", trace)?;
        let notrace_globs = split_globs("--notrace", notrace)?;
        Ok(Filter {
            trace: glob_set("--trace", &trace_globs)?,
            notrace: glob_set("--notrace", &notrace_globs)?,
            trace_globs,
        })
    }

    /// Indices into `sites.sites` of the sites whose function matches. Every
    /// `--trace` glob must match some function with a site.
    pub fn select(
        &self,
        image: &KernelImage,
        sites: &SiteTable,
    ) -> Result<Vec<usize>, FilterError> {
        let mut glob_used = vec![false; self.trace_globs.len()];
        let mut hits = Vec::new();
        let mut selected = Vec::new();
        for (i, site) in sites.sites.iter().enumerate() {
            let name = function_name(image, site.func);
            if !self.trace_globs.is_empty() {
                self.trace.matches_into(name, &mut hits);
                if hits.is_empty() {
                    continue;
                }
                for &g in &hits {
                    glob_used[g] = true;
                }
            }
            if !self.notrace.is_match(name) {
                selected.push(i);
            }
        }
        if let Some(g) = glob_used.iter().position(|used| !used) {
            return Err(self.no_match(&self.trace_globs[g], image, sites));
        }
        if selected.is_empty() {
            return Err(FilterError::NothingLeft);
        }
        Ok(selected)
    }

    /// The error for a `--trace` glob that matched no function with a site.
    fn no_match(&self, glob: &str, image: &KernelImage, sites: &SiteTable) -> FilterError {
        let mut traceable: Vec<&str> = sites
            .sites
            .iter()
            .map(|s| function_name(image, s.func))
            .collect();
        traceable.sort_unstable();
        traceable.dedup();

        let untraceable = match compile(glob) {
            Ok(g) => {
                let m = g.compile_matcher();
                let mut names: Vec<String> = image
                    .functions
                    .iter()
                    .filter(|f| m.is_match(&f.name))
                    .map(|f| f.name.clone())
                    .collect();
                names.sort_unstable();
                names.dedup();
                names.truncate(MAX_SUGGESTIONS);
                names
            }
            Err(_) => Vec::new(),
        };
        FilterError::NoMatch {
            glob: glob.to_string(),
            untraceable,
            closest: closest_names(glob, &traceable),
        }
    }
}

fn function_name(image: &KernelImage, func: u32) -> &str {
    image
        .functions
        .get(func as usize)
        .map_or("", |f| f.name.as_str())
}

/// Splits comma lists into single globs.
fn split_globs(flag: &'static str, args: &[String]) -> Result<Vec<String>, FilterError> {
    let mut globs = Vec::new();
    for arg in args {
        for glob in arg.split(',').map(str::trim) {
            if glob.is_empty() {
                // Silently dropping it could turn `--trace ,` into "trace all".
                return Err(FilterError::EmptyGlob {
                    flag,
                    arg: arg.clone(),
                });
            }
            globs.push(glob.to_string());
        }
    }
    Ok(globs)
}

/// One glob; names have no '/', so `*` may match anything.
fn compile(glob: &str) -> Result<Glob, globset::Error> {
    GlobBuilder::new(glob).literal_separator(false).build()
}

fn glob_set(flag: &'static str, globs: &[String]) -> Result<GlobSet, FilterError> {
    let bad = |glob: &str, e: globset::Error| FilterError::BadGlob {
        flag,
        glob: glob.to_string(),
        reason: e.kind().to_string(),
    };
    let mut builder = GlobSetBuilder::new();
    for glob in globs {
        builder.add(compile(glob).map_err(|e| bad(glob, e))?);
    }
    builder.build().map_err(|e| bad(&globs.join(","), e))
}

/// Up to `MAX_SUGGESTIONS` names closest to `glob`: smallest edit distance
/// between the glob's literal text and the name (a leading / trailing `*` lets
/// the name have any prefix / suffix; containing the text anywhere costs 1),
/// then the longest common prefix.
fn closest_names(glob: &str, names: &[&str]) -> Vec<String> {
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
        .map(|(_, _, n)| n.to_string())
        .collect()
}

/// The glob without its wildcards and `[...]` classes.
fn literal_text(glob: &str) -> Vec<char> {
    let mut out = Vec::new();
    let mut in_class = false;
    for c in glob.chars() {
        match c {
            '[' => in_class = true,
            ']' if in_class => in_class = false,
            '*' | '?' | '\\' => {}
            _ if !in_class => out.push(c),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn chars(s: &str) -> Vec<char> {
        s.chars().collect()
    }

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    /// What `select` decides for one name: it matches a `--trace` glob (or
    /// none was given) and no `--notrace` glob.
    fn matches(f: &Filter, name: &str) -> bool {
        (f.trace_globs.is_empty() || f.trace.is_match(name)) && !f.notrace.is_match(name)
    }

    #[test]
    fn matches_follows_trace_and_notrace() {
        let f = Filter::new(&strings(&["hrtimer_*"]), &strings(&["*wakeup"])).expect("filter");
        assert!(matches(&f, "hrtimer_interrupt"));
        assert!(!matches(&f, "hrtimer_wakeup"));
        assert!(!matches(&f, "schedule"));
        let all = Filter::new(&[], &[]).expect("filter");
        assert!(matches(&all, "anything.isra.0"));
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
    fn literal_text_drops_wildcards_and_classes() {
        assert_eq!(literal_text("hr[ab]timer_?x*"), chars("hrtimer_x"));
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
