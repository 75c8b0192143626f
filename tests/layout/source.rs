//! The workspace's source files: each lexed, with its module path, its
//! inline modules and which of its tokens are test code.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use crate::lex::*;

/// One crate: its name, its src/ folder and its root file.
pub struct Crate {
    pub name: &'static str,
    pub src: &'static str,
    pub root: &'static str,
}

pub const CRATES: &[Crate] = &[
    Crate {
        name: "vmtrace",
        src: "src",
        root: "main.rs",
    },
    Crate {
        name: "vmm",
        src: "vmm/src",
        root: "lib.rs",
    },
    Crate {
        name: "tracer",
        src: "tracer/src",
        root: "lib.rs",
    },
];

/// One source file, lexed, with what the checks need from it.
pub struct File {
    /// Relative to the workspace root, with `/`.
    pub path: String,
    pub krate: &'static str,
    /// The module path of the file within its crate (empty for the root).
    pub module: Vec<String>,
    pub toks: Vec<Tok>,
    pub lines: usize,
    /// Test-only tokens: inside a `#[cfg(test)]` module or item.
    pub test: Vec<bool>,
    /// Inline modules: their path within the file and whether test-only.
    pub inline_mods: Vec<(Vec<String>, bool)>,
    /// Child modules declared as `mod x;` with `#[cfg(test)]`.
    pub test_children: Vec<String>,
    /// The module path at each token (file module plus inline modules).
    pub mod_at: Vec<usize>,
    /// First line of the first `#[cfg(test)]` module, if any.
    pub test_mod_line: Option<usize>,
    /// Line spans (first, last) of top-level test-only items: `#[cfg(test)]`
    /// modules inline or declared, `#[test]` and `#[cfg(test)]` functions.
    pub test_spans: Vec<(usize, usize)>,
    /// Whether the whole file is a test module (declared with cfg(test)).
    pub is_test: bool,
}

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module path a file holds, by the rules of `mod x;` without #[path].
pub fn module_of(rel: &Path, krate: &Crate) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if !(parts.is_empty() && stem == krate.root.trim_end_matches(".rs")) && stem != "mod" {
        parts.push(stem.to_string());
    }
    parts
}

/// Index of the bracket closing the one at `open`.
pub fn matching(t: &[Tok], open: usize) -> Option<usize> {
    let mut depth = 0i32;
    for (k, tok) in t.iter().enumerate().skip(open) {
        match tok.kind {
            Kind::Punct('(' | '[' | '{') => depth += 1,
            Kind::Punct(')' | ']' | '}') => {
                depth -= 1;
                if depth == 0 {
                    return Some(k);
                }
            }
            _ => {}
        }
    }
    None
}

/// The attributes and comments right before the item whose keyword is at
/// `i`, walking back over qualifiers (`pub(crate)`, `unsafe`, `extern "C"`…).
pub fn preamble(t: &[Tok], i: usize) -> (Vec<Vec<String>>, Vec<String>) {
    let (mut attrs, mut comments) = (Vec::new(), Vec::new());
    let mut k = i;
    while k > 0 {
        let p = &t[k - 1];
        match &p.kind {
            Kind::Comment(c) => {
                comments.push(c.clone());
                k -= 1;
            }
            Kind::Ident(w)
                if matches!(
                    w.as_str(),
                    "pub" | "const" | "async" | "unsafe" | "extern" | "default"
                ) =>
            {
                k -= 1
            }
            Kind::Lit if k >= 2 && t[k - 2].is("extern") => k -= 1,
            Kind::Punct(')') => {
                // `pub(crate)`, `pub(super)`, `pub(in path)`
                let open = (0..k - 1).rev().find(|&o| t[o].is_punct('('));
                match open {
                    Some(o) if o > 0 && t[o - 1].is("pub") => k = o,
                    _ => break,
                }
            }
            Kind::Punct(']') => {
                // an attribute: find its `#`
                let mut depth = 0i32;
                let mut o = k - 1;
                loop {
                    match t[o].kind {
                        Kind::Punct(']') => depth += 1,
                        Kind::Punct('[') => depth -= 1,
                        _ => {}
                    }
                    if depth == 0 || o == 0 {
                        break;
                    }
                    o -= 1;
                }
                let hash = if o >= 2 && t[o - 1].is_punct('!') {
                    o - 2
                } else {
                    o.wrapping_sub(1)
                };
                if hash >= t.len() || !t[hash].is_punct('#') {
                    break;
                }
                attrs.push(
                    t[o + 1..k - 1]
                        .iter()
                        .filter_map(|x| x.ident().map(String::from))
                        .collect(),
                );
                k = hash;
            }
            _ => break,
        }
    }
    (attrs, comments)
}

/// Whether attributes make an item test-only: `#[test]`, `#[cfg(test)]`,
/// `#[cfg(all(test, …))]` (not `#[cfg(not(test))]`).
pub fn test_only(attrs: &[Vec<String>]) -> bool {
    attrs.iter().any(|a| {
        a.first().is_some_and(|w| w == "test")
            || (a.first().is_some_and(|w| w == "cfg")
                && a.iter().any(|w| w == "test")
                && !a.iter().any(|w| w == "not" || w == "any"))
    })
}

pub fn load(path: &Path, krate: &'static Crate) -> File {
    let src = fs::read_to_string(path).unwrap();
    let rel = path
        .strip_prefix(root())
        .unwrap()
        .to_string_lossy()
        .replace('\\', "/");
    let in_src = path.strip_prefix(root().join(krate.src)).unwrap();
    parse(rel, krate.name, module_of(in_src, krate), &src)
}

/// A file of `krate` at `path` holding module `module`, from its text.
pub fn parse(path: String, krate: &'static str, module: Vec<String>, src: &str) -> File {
    let toks = lex(src);
    let mut f = File {
        path,
        krate,
        module,
        lines: src.lines().count(),
        test: vec![false; toks.len()],
        inline_mods: vec![(Vec::new(), false)],
        test_children: Vec::new(),
        mod_at: vec![0; toks.len()],
        test_mod_line: None,
        test_spans: Vec::new(),
        is_test: false,
        toks,
    };
    scan_modules(&mut f);
    f
}

/// Finds inline modules and test-only regions.
pub fn scan_modules(f: &mut File) {
    let t = &f.toks;
    // (module index, depth at which it closes)
    let mut stack: Vec<(usize, i32)> = Vec::new();
    let mut test_until: Option<usize> = None;
    let mut depth = 0i32;
    for i in 0..t.len() {
        if let Some(&(m, _)) = stack.last() {
            f.mod_at[i] = m;
        }
        if test_until.is_some_and(|e| i <= e) {
            f.test[i] = true;
        }
        match t[i].kind {
            Kind::Punct('{') => depth += 1,
            Kind::Punct('}') => {
                depth -= 1;
                if stack.last().is_some_and(|&(_, d)| d == depth) {
                    stack.pop();
                }
            }
            _ => {}
        }
        let item = t[i].is("mod") || t[i].is("fn") || t[i].is("impl") || t[i].is("use");
        if !item || i + 1 >= t.len() {
            continue;
        }
        let (attrs, _) = preamble(t, i);
        let test = test_only(&attrs);
        if t[i].is("mod") {
            let Some(name) = t[i + 1].ident().map(String::from) else {
                continue;
            };
            match t.get(i + 2).map(|x| &x.kind) {
                Some(Kind::Punct(';')) if test => f.test_children.push(name),
                Some(Kind::Punct('{')) => {
                    let parent = stack.last().map_or(0, |&(m, _)| m);
                    let mut path = f.inline_mods[parent].0.clone();
                    path.push(name);
                    let parent_test = f.inline_mods[parent].1;
                    f.inline_mods.push((path, test || parent_test));
                    stack.push((f.inline_mods.len() - 1, depth));
                }
                _ => {}
            }
            if test && depth == 0 && f.test_mod_line.is_none() {
                f.test_mod_line = Some(attr_line(t, i));
            }
        }
        if test && test_until.is_none_or(|e| i > e) {
            // the whole item: to its `;` or the end of its body
            let end = item_end(t, i);
            test_until = Some(end);
            f.test[i] = true;
            f.test_spans.push((attr_line(t, i), t[end].line));
        }
    }
}

/// The line of the first attribute of the item at `i`.
pub fn attr_line(t: &[Tok], i: usize) -> usize {
    let mut k = i;
    while k > 0 && !matches!(t[k - 1].kind, Kind::Punct(';' | '}' | '{')) {
        k -= 1;
    }
    while k < i && matches!(t[k].kind, Kind::Comment(_)) {
        k += 1;
    }
    t[k].line
}

/// Index of the token ending the item at `i`: its `;` or its body's `}`.
pub fn item_end(t: &[Tok], i: usize) -> usize {
    let mut k = i;
    let mut depth = 0i32;
    while k < t.len() {
        match t[k].kind {
            Kind::Punct('(' | '[') => depth += 1,
            Kind::Punct(')' | ']') => depth -= 1,
            Kind::Punct(';') if depth == 0 => return k,
            Kind::Punct('{') if depth == 0 => return matching(t, k).unwrap_or(t.len() - 1),
            _ => {}
        }
        k += 1;
    }
    t.len() - 1
}

impl File {
    /// Lines outside test-only items: what the file holds for its crate.
    pub fn code_lines(&self) -> usize {
        let mut test = BTreeSet::new();
        for &(a, b) in &self.test_spans {
            test.extend(a..=b);
        }
        self.lines - test.len()
    }
}

pub fn workspace() -> Vec<File> {
    let mut files = Vec::new();
    for krate in CRATES {
        let mut paths = Vec::new();
        rs_files(&root().join(krate.src), &mut paths);
        files.extend(paths.iter().map(|p| load(p, krate)));
    }
    mark_test_files(&mut files);
    files
}

/// Files declared as `#[cfg(test)] mod x;` are test code all through.
pub fn mark_test_files(files: &mut [File]) {
    let test_files: BTreeSet<(&str, Vec<String>)> = files
        .iter()
        .flat_map(|f| {
            f.test_children.iter().map(|c| {
                let mut m = f.module.clone();
                m.push(c.clone());
                (f.krate, m)
            })
        })
        .collect();
    for f in files.iter_mut() {
        let under_test =
            (1..=f.module.len()).any(|n| test_files.contains(&(f.krate, f.module[..n].to_vec())));
        if under_test {
            f.is_test = true;
            f.test.iter_mut().for_each(|x| *x = true);
        }
    }
}
