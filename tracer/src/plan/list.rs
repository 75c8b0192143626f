//! `vmtrace list [GLOB...]`: the kernel's functions, as
//! `available_filter_functions` lists them, plus those vmtrace cannot
//! trace, each marked with why:
//!
//! ```text
//! hrtimer_interrupt
//! mini_account [notrace]
//! start_kernel [init]
//! ```
//!
//! - no marker: traceable, it has an ftrace call site outside init text;
//! - `[init]`: its site is in init text, which the kernel frees after boot:
//!   traceable only during boot, which vmtrace does not trace on Linux
//!   (such sites are skipped: `sites_skipped_init`);
//! - `[notrace]`: no ftrace call site: a `notrace` function, one that was
//!   inlined into its callers but kept a symbol, or assembly;
//! - `[no --graph]`: traceable, but `--graph` leaves it out: the guest
//!   unwinds through its return address (`crate::plan::hookable`).
//!
//! A function with aliases (symbols at its address: `__x64_sys_getpid` and
//! `__do_sys_getpid`) is listed under each name, whether its symbols come
//! from a vmlinux or from kallsyms.
//!
//! The globs are `--trace`'s (`crate::kernel::filter`: `*`, `?`, `[...]`, `{a,b}`,
//! `!glob`), so that a list previews a selection; none lists every
//! function. The summary (`Listing::summary`) is for stderr, so that the
//! list itself can be piped.

use std::io::{self, BufWriter, Write};

use crate::advice::{Plain, TraceInput, TracerAdvice, TracerWords};

use crate::kernel::filter::{closest_names, FilterError, Globs};
use crate::kernel::names::escape;
use crate::kernel::sites::SiteTable;
use crate::kernel::symbols::KernelImage;
use crate::plan::entry::DirectPlan;
use crate::plan::hookable::unhookable;

/// Why a function can be traced or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// An ftrace call site outside init text.
    Traceable,
    /// Its site is in init text: traceable only during boot.
    InitOnly,
    /// No ftrace call site: notrace, inlined or assembly.
    NoSite,
    /// Direct entries: its first instructions cannot be displaced safely
    /// (`Listed::why` says by which rule).
    Refused,
}

impl Kind {
    /// What follows the name in a listing: nothing, ` [init]`, ` [notrace]`.
    pub fn marker(self) -> &'static str {
        match self {
            Kind::Traceable => "",
            Kind::InitOnly => " [init]",
            Kind::NoSite => " [notrace]",
            Kind::Refused => " [refused]",
        }
    }
}

/// Why the functions could not be listed.
#[derive(Debug, thiserror::Error)]
#[error("{}", self.say(&Plain))]
pub enum ListError {
    Filter(#[from] FilterError),
    NoMatch {
        glob: String,
        /// The kernel image's path, as given.
        image: String,
        /// Function names close to the glob (escaped).
        closest: Vec<String>,
    },
}

impl TracerAdvice for ListError {
    fn problem(&self, w: &dyn TracerWords) -> String {
        match self {
            ListError::Filter(e) => e.problem(w),
            ListError::NoMatch {
                glob,
                image,
                closest,
            } => format!(
                "{} '{glob}' matches no function of {image}{}",
                w.trace_input(TraceInput::List),
                closest_detail(closest)
            ),
        }
    }
}

fn closest_detail(closest: &[String]) -> String {
    if closest.is_empty() {
        String::new()
    } else {
        format!("; closest: {}", closest.join(", "))
    }
}

/// One listed function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed<'a> {
    pub name: &'a str,
    pub addr: u64,
    pub kind: Kind,
    /// `Kind::Refused`: why (`crate::kernel::direct::Refusal`).
    pub why: Option<String>,
    /// `Kind::Refused`: the rule that refused it (`Refusal::rule`).
    pub rule: Option<&'static str>,
}

/// The functions a list selects, by name (then address: static functions
/// of different files can share a name, and are listed once each).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing<'a> {
    pub functions: Vec<Listed<'a>>,
    /// Listed as direct entries (`--entry direct`): "traceable" means a
    /// direct site, and the others are refused with a reason.
    pub direct: bool,
}

impl<'a> Listing<'a> {
    /// Every function of `image` matching `globs` (the arguments of
    /// `vmtrace list`, each a comma-separated list; none: all), classified
    /// by `sites` (the image's site table). Each positive glob must match
    /// some function, traceable or not.
    pub fn new(
        image: &'a KernelImage,
        sites: &SiteTable,
        globs: &[String],
    ) -> Result<Listing<'a>, ListError> {
        Listing::build(image, sites, None, globs)
    }

    /// The listing of direct entries: `sites` those of `direct`, every
    /// other function refused with its reason.
    pub fn direct(
        image: &'a KernelImage,
        sites: &SiteTable,
        direct: &DirectPlan,
        globs: &[String],
    ) -> Result<Listing<'a>, ListError> {
        Listing::build(image, sites, Some(direct), globs)
    }

    fn build(
        image: &'a KernelImage,
        sites: &SiteTable,
        direct: Option<&DirectPlan>,
        globs: &[String],
    ) -> Result<Listing<'a>, ListError> {
        let globs = Globs::for_list(globs)?;
        let none = if direct.is_some() {
            Kind::Refused
        } else {
            Kind::NoSite
        };
        let mut kinds = vec![none; image.functions.len()];
        for site in &sites.sites {
            if let Some(k) = kinds.get_mut(site.func as usize) {
                // A site outside init text wins over one inside.
                *k = if site.init && *k != Kind::Traceable {
                    Kind::InitOnly
                } else {
                    Kind::Traceable
                };
            }
        }
        let mut used = vec![false; globs.positive().len()];
        let mut hits = Vec::new();
        let mut functions = Vec::new();
        for (i, (f, kind)) in image.functions.iter().zip(kinds).enumerate() {
            // Each name of a function with aliases is listed, as what it
            // names: `--trace` takes any of them.
            for name in image.names(i) {
                let selected = globs.matches_into(name, &mut hits);
                for &g in &hits {
                    used[g] = true;
                }
                if selected {
                    let refusal = direct
                        .filter(|_| kind == Kind::Refused)
                        .and_then(|d| d.refused.get(&i));
                    functions.push(Listed {
                        name,
                        addr: f.addr,
                        kind,
                        why: refusal.map(|r| r.to_string()),
                        rule: refusal.map(|r| r.rule()),
                    });
                }
            }
        }
        if let Some(g) = used.iter().position(|u| !u) {
            let glob = &globs.positive()[g];
            let mut names: Vec<&str> = (0..image.functions.len())
                .flat_map(|i| image.names(i))
                .collect();
            names.sort_unstable();
            names.dedup();
            return Err(ListError::NoMatch {
                glob: glob.clone(),
                image: image.path.display().to_string(),
                closest: closest_names(glob, &names),
            });
        }
        functions.sort_by(|a, b| a.name.cmp(b.name).then(a.addr.cmp(&b.addr)));
        Ok(Listing {
            functions,
            direct: direct.is_some(),
        })
    }

    /// How many listed functions are of `kind`.
    pub fn count(&self, kind: Kind) -> usize {
        self.functions.iter().filter(|f| f.kind == kind).count()
    }

    /// `12 functions: 9 traceable, 1 init-only, 2 without an ftrace site`;
    /// direct entries: `... 2 refused (too-short 1, paravirt 1)`, by rule.
    pub fn summary(&self) -> String {
        let n = self.functions.len();
        if self.direct {
            let mut by: std::collections::BTreeMap<&str, usize> = Default::default();
            for rule in self.functions.iter().filter_map(|f| f.rule) {
                *by.entry(rule).or_default() += 1;
            }
            let mut by: Vec<_> = by.into_iter().collect();
            by.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
            let rules: Vec<String> = by.iter().map(|(r, n)| format!("{r} {n}")).collect();
            return format!(
                "{n} function{}: {} traceable by direct entry, {} init-only, {} refused{}",
                if n == 1 { "" } else { "s" },
                self.count(Kind::Traceable),
                self.count(Kind::InitOnly),
                self.count(Kind::Refused),
                if rules.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", rules.join(", "))
                }
            );
        }
        format!(
            "{n} function{}: {} traceable, {} init-only, {} without an ftrace site",
            if n == 1 { "" } else { "s" },
            self.count(Kind::Traceable),
            self.count(Kind::InitOnly),
            self.count(Kind::NoSite)
        )
    }

    /// One line per function: its name (through `kernel::names::escape`) and
    /// marker.
    pub fn write(&self, w: &mut dyn Write) -> io::Result<()> {
        let mut w = BufWriter::new(w);
        for f in &self.functions {
            let graph = if f.kind == Kind::Traceable && unhookable(f.name).is_some() {
                " [no --graph]"
            } else {
                ""
            };
            let marker = match (&f.why, f.rule) {
                (Some(why), Some(rule)) => format!(" [refused ({rule}): {why}]"),
                (Some(why), None) => format!(" [refused: {why}]"),
                (None, _) => f.kind.marker().to_string(),
            };
            writeln!(w, "{}{marker}{graph}", escape(f.name))?;
        }
        w.flush()
    }

    /// `write`, as a string.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        self.write(&mut out).expect("writing to a Vec cannot fail");
        String::from_utf8(out).expect("the listing is UTF-8")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::filter::testing::{image, Has};

    const FUNCS: &[(&str, Has)] = &[
        ("schedule", Has::Site),
        ("hrtimer_wakeup", Has::Site),
        ("hrtimer_interrupt", Has::Site),
        ("start_kernel", Has::InitSite),
        ("mini_account", Has::NoSite),
        ("hrtimer_init_early", Has::InitSite),
        ("entry_SYSCALL_64", Has::NoSite),
    ];

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn lists_every_function_by_name_with_markers() {
        let (img, sites) = image(FUNCS);
        let l = Listing::new(&img, &sites, &[]).expect("list");
        assert_eq!(
            l.render(),
            "entry_SYSCALL_64 [notrace]\nhrtimer_init_early [init]\nhrtimer_interrupt\n\
             hrtimer_wakeup\nmini_account [notrace]\nschedule\nstart_kernel [init]\n"
        );
        assert_eq!(
            l.summary(),
            "7 functions: 3 traceable, 2 init-only, 2 without an ftrace site"
        );
    }

    #[test]
    fn the_direct_summary_counts_refusals_by_rule() {
        let f = |name, kind, rule: Option<&'static str>| Listed {
            name,
            addr: 0,
            kind,
            why: rule.map(str::to_string),
            rule,
        };
        let l = Listing {
            functions: vec![
                f("a", Kind::Traceable, None),
                f("b", Kind::Refused, Some("paravirt")),
                f("c", Kind::Refused, Some("smp-lock")),
                f("d", Kind::Refused, Some("smp-lock")),
            ],
            direct: true,
        };
        assert_eq!(
            l.summary(),
            "4 functions: 1 traceable by direct entry, 0 init-only, 3 refused \
             (smp-lock 2, paravirt 1)"
        );
    }

    #[test]
    fn globs_are_traces() {
        let (img, sites) = image(FUNCS);
        let l = Listing::new(&img, &sites, &strings(&["hrtimer_*,!*_wakeup", "start_*"]))
            .expect("list");
        let names: Vec<&str> = l.functions.iter().map(|f| f.name).collect();
        assert_eq!(
            names,
            ["hrtimer_init_early", "hrtimer_interrupt", "start_kernel"]
        );
        assert_eq!(
            l.summary(),
            "3 functions: 1 traceable, 2 init-only, 0 without an ftrace site"
        );
        let l = Listing::new(&img, &sites, &strings(&["{schedule,mini_*}"])).expect("list");
        assert_eq!(l.render(), "mini_account [notrace]\nschedule\n");
        assert_eq!(
            l.summary(),
            "2 functions: 1 traceable, 0 init-only, 1 without an ftrace site"
        );
        let one = Listing::new(&img, &sites, &strings(&["schedule"])).expect("list");
        assert!(one.summary().starts_with("1 function: "));
    }

    #[test]
    fn glob_matching_nothing_suggests_names() {
        let (img, sites) = image(FUNCS);
        let e =
            Listing::new(&img, &sites, &strings(&["schedule", "hrtimr_*"])).expect_err("no match");
        let ListError::NoMatch { glob, closest, .. } = &e else {
            panic!("{e:?}");
        };
        assert_eq!(glob, "hrtimr_*");
        assert!(closest[0].starts_with("hrtimer_"), "{closest:?}");
        assert!(e.to_string().starts_with(
            "list globs 'hrtimr_*' matches no function of test-vmlinux; closest: hrtimer_"
        ));
        // A `!glob` may match nothing; alone it is refused, as in --trace.
        assert!(Listing::new(&img, &sites, &strings(&["*,!nothing"])).is_ok());
        let e = Listing::new(&img, &sites, &strings(&["!schedule"])).expect_err("negated");
        assert!(matches!(
            e,
            ListError::Filter(FilterError::OnlyNegated { .. })
        ));
        // A kernel image alone has no module's functions.
        let e = Listing::new(&img, &sites, &strings(&[":mod:ext4"])).expect_err("module");
        assert!(e.to_string().contains("matches no function"), "{e}");
    }

    #[test]
    fn crafted_names_cannot_forge_lines() {
        let (img, sites) = image(&[("evil\nschedule\x1b[2J", Has::Site), ("ok", Has::NoSite)]);
        let out = Listing::new(&img, &sites, &[]).expect("list").render();
        assert_eq!(out, "evil\\x0aschedule\\x1b[2J\nok [notrace]\n");
    }
}
