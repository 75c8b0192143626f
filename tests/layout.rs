//! The workspace's layout rules (issue 23), checked on the source as text:
//! no import loops between a crate's modules, no function over 80 lines
//! without a `Long:` comment saying why, no file over 650 lines before its
//! tests, no type or module defined twice under one name. A small Rust lexer
//! reads the files; nothing is compiled.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fs;
use std::path::{Path, PathBuf};

/// Lines a function may take (from `fn` to its closing brace).
const MAX_FN_LINES: usize = 80;
/// Lines a file may take before its `#[cfg(test)]` module.
const MAX_FILE_LINES: usize = 650;

/// What is allowed to break a rule, each entry `(key, why)`; the key is what
/// the failure prints in brackets. `allow_lists_name_what_is_there` fails
/// when an entry no longer matches anything: remove it then.
///
/// Import loops, keyed by their files, sorted, joined by ` `.
const ALLOWED_LOOPS: &[(&str, &str)] = &[
    (
        "src/config/mod.rs src/error.rs",
        "the lead rewrites src/config/ and the CLI's errors for issue 23 item 1",
    ),
    (
        "src/bench/results/benches.rs src/bench/results/json.rs",
        "the bench's results were just split (issue 23 item 5): its author splits them again",
    ),
    (
        "tracer/src/plan/mod.rs tracer/src/session/mod.rs",
        "Plan::new returns session's TracerError: the plan stage gets its own errors in \
         the lead's rewrite (issue 23 item 1)",
    ),
];

/// Long functions, keyed `file fn name`. These have no `Long:` comment
/// because their files are being rewritten (issue 23): empty this list then.
const ALLOWED_LONG_FNS: &[(&str, &str)] = &[];

/// Files over MAX_FILE_LINES before their tests.
const ALLOWED_LONG_FILES: &[(&str, &str)] = &[];

/// Type names defined twice, and module names used in two crates.
const ALLOWED_DUPLICATES: &[(&str, &str)] = &[(
    "mod layout",
    "exitless's layout places its code and rings inside the private slot of vmm's \
         guest memory map: a part of it, named within exitless/",
)];

// ---------------------------------------------------------------- lexer

#[derive(Clone, Debug, PartialEq)]
enum Kind {
    Ident(String),
    Punct(char),
    Lit,
    Lifetime,
    Comment(String),
}

#[derive(Clone, Debug)]
struct Tok {
    kind: Kind,
    line: usize,
}

impl Tok {
    fn is(&self, s: &str) -> bool {
        matches!(&self.kind, Kind::Ident(i) if i == s)
    }
    fn is_punct(&self, c: char) -> bool {
        self.kind == Kind::Punct(c)
    }
    fn ident(&self) -> Option<&str> {
        match &self.kind {
            Kind::Ident(i) => Some(i),
            _ => None,
        }
    }
}

struct Lexer {
    c: Vec<char>,
    i: usize,
    line: usize,
}

impl Lexer {
    fn at(&self, k: usize) -> char {
        self.c.get(self.i + k).copied().unwrap_or('\0')
    }

    fn bump(&mut self) -> char {
        let ch = self.at(0);
        self.i += 1;
        if ch == '\n' {
            self.line += 1;
        }
        ch
    }

    /// A quoted string from the opening quote: escapes, or none if raw.
    fn string(&mut self, raw: bool, hashes: usize) {
        self.bump();
        while self.i < self.c.len() {
            let ch = self.bump();
            if ch == '\\' && !raw {
                self.bump();
            } else if ch == '"' && (0..hashes).all(|k| self.at(k) == '#') {
                self.i += hashes;
                return;
            }
        }
    }

    /// A raw string if one starts here after a prefix of `skip` chars.
    fn raw_string(&mut self, skip: usize) -> bool {
        let mut k = skip;
        while self.at(k) == '#' {
            k += 1;
        }
        if self.at(k) != '"' {
            return false;
        }
        self.i += k;
        self.string(true, k - skip);
        true
    }
}

fn lex(src: &str) -> Vec<Tok> {
    let mut lx = Lexer {
        c: src.chars().collect(),
        i: 0,
        line: 1,
    };
    let mut out = Vec::new();
    while lx.i < lx.c.len() {
        let line = lx.line;
        let ch = lx.at(0);
        let kind = if ch.is_whitespace() {
            lx.bump();
            continue;
        } else if ch == '/' && lx.at(1) == '/' {
            let start = lx.i;
            while lx.i < lx.c.len() && lx.at(0) != '\n' {
                lx.i += 1;
            }
            Kind::Comment(lx.c[start..lx.i].iter().collect())
        } else if ch == '/' && lx.at(1) == '*' {
            let start = lx.i;
            let mut depth = 0;
            while lx.i < lx.c.len() {
                if lx.at(0) == '/' && lx.at(1) == '*' {
                    depth += 1;
                    lx.i += 2;
                } else if lx.at(0) == '*' && lx.at(1) == '/' {
                    depth -= 1;
                    lx.i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    lx.bump();
                }
            }
            Kind::Comment(lx.c[start..lx.i].iter().collect())
        } else if ch == '"' {
            lx.string(false, 0);
            Kind::Lit
        } else if ch == '\'' {
            if lx.at(1) == '\\' {
                lx.i += 2;
                while lx.at(0) != '\'' {
                    lx.bump();
                }
                lx.i += 1;
                Kind::Lit
            } else if lx.at(2) == '\'' {
                lx.i += 3;
                Kind::Lit
            } else {
                lx.i += 1;
                while lx.at(0).is_alphanumeric() || lx.at(0) == '_' {
                    lx.i += 1;
                }
                Kind::Lifetime
            }
        } else if ch.is_ascii_digit() {
            while lx.at(0).is_alphanumeric()
                || lx.at(0) == '_'
                || (lx.at(0) == '.' && lx.at(1).is_ascii_digit())
            {
                lx.i += 1;
            }
            Kind::Lit
        } else if ch.is_alphabetic() || ch == '_' {
            // String and char literals with a prefix: r"", r#""#, b"", br"", b'', c"".
            let (a, b) = (lx.at(1), lx.at(2));
            if ch == 'r' && (a == '"' || a == '#') && lx.raw_string(1) {
                out.push(Tok {
                    kind: Kind::Lit,
                    line,
                });
                continue;
            }
            if (ch == 'b' || ch == 'c') && a == 'r' && (b == '"' || b == '#') && lx.raw_string(2) {
                out.push(Tok {
                    kind: Kind::Lit,
                    line,
                });
                continue;
            }
            if (ch == 'b' || ch == 'c') && a == '"' {
                lx.i += 1;
                lx.string(false, 0);
                out.push(Tok {
                    kind: Kind::Lit,
                    line,
                });
                continue;
            }
            if ch == 'b' && a == '\'' {
                lx.i += 1;
                continue; // the char literal is lexed next round
            }
            if ch == 'r' && a == '#' {
                lx.i += 2; // a raw identifier
            }
            let start = lx.i;
            while lx.at(0).is_alphanumeric() || lx.at(0) == '_' {
                lx.i += 1;
            }
            Kind::Ident(lx.c[start..lx.i].iter().collect())
        } else {
            lx.bump();
            Kind::Punct(ch)
        };
        out.push(Tok { kind, line });
    }
    out
}

// ---------------------------------------------------------------- source model

/// One crate: its name, its src/ folder and its root file.
struct Crate {
    name: &'static str,
    src: &'static str,
    root: &'static str,
}

const CRATES: &[Crate] = &[
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
struct File {
    /// Relative to the workspace root, with `/`.
    path: String,
    krate: &'static str,
    /// The module path of the file within its crate (empty for the root).
    module: Vec<String>,
    toks: Vec<Tok>,
    lines: usize,
    /// Test-only tokens: inside a `#[cfg(test)]` module or item.
    test: Vec<bool>,
    /// Inline modules: their path within the file and whether test-only.
    inline_mods: Vec<(Vec<String>, bool)>,
    /// Child modules declared as `mod x;` with `#[cfg(test)]`.
    test_children: Vec<String>,
    /// The module path at each token (file module plus inline modules).
    mod_at: Vec<usize>,
    /// First line of the first `#[cfg(test)]` module, if any.
    test_mod_line: Option<usize>,
    /// Whether the whole file is a test module (declared with cfg(test)).
    is_test: bool,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
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
fn module_of(rel: &Path, krate: &Crate) -> Vec<String> {
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
fn matching(t: &[Tok], open: usize) -> Option<usize> {
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
fn preamble(t: &[Tok], i: usize) -> (Vec<Vec<String>>, Vec<String>) {
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
fn test_only(attrs: &[Vec<String>]) -> bool {
    attrs.iter().any(|a| {
        a.first().is_some_and(|w| w == "test")
            || (a.first().is_some_and(|w| w == "cfg")
                && a.iter().any(|w| w == "test")
                && !a.iter().any(|w| w == "not" || w == "any"))
    })
}

fn load(path: &Path, krate: &'static Crate) -> File {
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
fn parse(path: String, krate: &'static str, module: Vec<String>, src: &str) -> File {
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
        is_test: false,
        toks,
    };
    scan_modules(&mut f);
    f
}

/// Finds inline modules and test-only regions.
fn scan_modules(f: &mut File) {
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
        }
    }
}

/// The line of the first attribute of the item at `i`.
fn attr_line(t: &[Tok], i: usize) -> usize {
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
fn item_end(t: &[Tok], i: usize) -> usize {
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

fn workspace() -> Vec<File> {
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
fn mark_test_files(files: &mut [File]) {
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

// ---------------------------------------------------------------- (a) import loops

/// The paths a `use` tree names, from the token after `use` to its `;`.
fn use_paths(t: &[Tok], mut i: usize) -> Vec<Vec<String>> {
    fn tree(t: &[Tok], i: &mut usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
        let mut path = prefix;
        loop {
            match t.get(*i).map(|x| &x.kind) {
                Some(Kind::Ident(w)) if w == "as" => {
                    *i += 2;
                    out.push(path);
                    return;
                }
                Some(Kind::Ident(w)) => {
                    path.push(w.clone());
                    *i += 1;
                }
                Some(Kind::Punct(':')) => *i += 1,
                Some(Kind::Punct('*')) => {
                    *i += 1;
                    out.push(path);
                    return;
                }
                Some(Kind::Punct('{')) => {
                    *i += 1;
                    loop {
                        while t.get(*i).is_some_and(|x| x.is_punct(',')) {
                            *i += 1;
                        }
                        if t.get(*i).is_none_or(|x| x.is_punct('}')) {
                            *i += 1;
                            return;
                        }
                        tree(t, i, path.clone(), out);
                    }
                }
                Some(Kind::Comment(_)) => *i += 1,
                _ => {
                    out.push(path);
                    return;
                }
            }
        }
    }
    let mut out = Vec::new();
    tree(t, &mut i, Vec::new(), &mut out);
    out.retain(|p| !p.is_empty());
    for p in &mut out {
        if p.last().is_some_and(|w| w == "self") {
            p.pop();
        }
    }
    out
}

/// The module a path starting with `crate`, `super` or `self` names, seen
/// from module `cur`: the longest prefix that is a module.
fn resolve(
    path: &[String],
    cur: &[String],
    modules: &BTreeSet<Vec<String>>,
) -> Option<Vec<String>> {
    let mut base: Vec<String> = match path.first()?.as_str() {
        "crate" => Vec::new(),
        "self" | "super" => cur.to_vec(),
        _ => return None,
    };
    let mut rest = &path[1..];
    if path[0] == "super" {
        base.pop()?;
    }
    while rest.first().is_some_and(|w| w == "super") {
        base.pop()?;
        rest = &rest[1..];
    }
    for seg in rest {
        let mut next = base.clone();
        next.push(seg.clone());
        if !modules.contains(&next) {
            break;
        }
        base = next;
    }
    Some(base)
}

/// Every module of a crate (file or inline) and the file holding it.
fn modules_of<'a>(files: &'a [File], krate: &str) -> HashMap<Vec<String>, &'a str> {
    let mut home = HashMap::new();
    for f in files.iter().filter(|f| f.krate == krate) {
        for (inner, _) in &f.inline_mods {
            let mut m = f.module.clone();
            m.extend(inner.iter().cloned());
            home.entry(m).or_insert(f.path.as_str());
        }
    }
    home
}

/// The paths a file's non-test code names, each with the module it is
/// named from: `use` trees, and paths in code that start with `crate`,
/// `super`, `self` or a workspace crate.
fn paths_in(f: &File) -> Vec<(Vec<String>, Vec<String>)> {
    let t = &f.toks;
    let mut out = Vec::new();
    let mut i = 0;
    while i < t.len() {
        if f.test[i] {
            i += 1;
            continue;
        }
        let mut cur = f.module.clone();
        cur.extend(f.inline_mods[f.mod_at[i]].0.iter().cloned());
        let starts =
            |w: &str| matches!(w, "crate" | "super" | "self") || CRATES.iter().any(|c| c.name == w);
        if t[i].is("use") {
            out.extend(use_paths(t, i + 1).into_iter().map(|p| (cur.clone(), p)));
            i = item_end(t, i);
        } else if t[i].ident().is_some_and(starts)
            && t.get(i + 1).is_some_and(|x| x.is_punct(':'))
            && t.get(i + 2).is_some_and(|x| x.is_punct(':'))
            && (i == 0 || !t[i - 1].is_punct('$') && !t[i - 1].is_punct(':'))
        {
            let mut p = vec![t[i].ident().unwrap().to_string()];
            let mut k = i + 1;
            while t.get(k).is_some_and(|x| x.is_punct(':'))
                && t.get(k + 1).is_some_and(|x| x.is_punct(':'))
            {
                match t.get(k + 2).and_then(Tok::ident) {
                    Some(w) => p.push(w.to_string()),
                    None => break,
                }
                k += 3;
            }
            out.push((cur, p));
            i = k;
        }
        i += 1;
    }
    out
}

/// Edges between files of one crate: `a -> b` when `a` names something in
/// `b`, `b` not `a` itself nor one of its descendants.
fn import_graph(files: &[File], krate: &str) -> BTreeMap<String, BTreeSet<String>> {
    let home = modules_of(files, krate);
    let modules: BTreeSet<Vec<String>> = home.keys().cloned().collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files.iter().filter(|f| f.krate == krate && !f.is_test) {
        for (cur, p) in paths_in(f) {
            let Some(target) = resolve(&p, &cur, &modules) else {
                continue;
            };
            if target.starts_with(&f.module) {
                continue; // itself or a descendant
            }
            let to = home[&target];
            graph
                .entry(f.path.clone())
                .or_default()
                .insert(to.to_string());
        }
    }
    graph
}

/// The graph's strongly connected components of more than one file.
fn loops(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    // Tarjan, recursively: the graphs are small.
    struct St<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: HashMap<&'a str, usize>,
        low: HashMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<BTreeSet<String>>,
    }
    fn visit<'a>(s: &mut St<'a>, v: &'a str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on.insert(v);
        for w in s.g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = BTreeSet::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                comp.insert(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                s.out.push(comp);
            }
        }
    }
    let mut s = St {
        g: graph,
        index: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

/// A shortest cycle through `from` inside `comp`, as `a -> b -> a`.
fn cycle_through(
    graph: &BTreeMap<String, BTreeSet<String>>,
    comp: &BTreeSet<String>,
    from: &str,
) -> String {
    let mut prev: HashMap<&str, &str> = HashMap::new();
    let mut queue = VecDeque::from([from]);
    while let Some(v) = queue.pop_front() {
        for w in graph
            .get(v)
            .into_iter()
            .flatten()
            .filter(|w| comp.contains(*w))
        {
            if w == from {
                let mut path = vec![from, v];
                let mut x = v;
                while x != from {
                    x = prev[x];
                    path.push(x);
                }
                path.reverse();
                path.pop();
                path.push(from);
                return path.join(" -> ");
            }
            if !prev.contains_key(w.as_str()) {
                prev.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    unreachable!("{from} is in a loop")
}

fn import_loop_problems(files: &[File]) -> Vec<Problem> {
    let mut problems = Vec::new();
    for krate in CRATES {
        let graph = import_graph(files, krate.name);
        for comp in loops(&graph) {
            let key = comp.iter().cloned().collect::<Vec<_>>().join(" ");
            let mut cycles = BTreeSet::new();
            for v in &comp {
                let c = cycle_through(&graph, &comp, v);
                // one rotation of each cycle: the one starting at its least file
                let nodes: Vec<&str> = c.split(" -> ").collect();
                let least = nodes[..nodes.len() - 1].iter().min().unwrap();
                if least == &nodes[0] {
                    cycles.insert(c);
                }
            }
            let msg = cycles.into_iter().collect::<Vec<_>>().join("; ");
            problems.push(Problem {
                key,
                msg: format!("import loop: {msg}"),
            });
        }
    }
    problems
}

// ---------------------------------------------------------------- (b) long functions

/// Non-test functions: (file, name, first line, lines, has a `Long:` comment).
fn functions(f: &File) -> Vec<(String, usize, usize, bool)> {
    let t = &f.toks;
    let mut out = Vec::new();
    for i in 0..t.len().saturating_sub(1) {
        if !t[i].is("fn") || f.test[i] {
            continue;
        }
        let Some(name) = t[i + 1].ident() else {
            continue;
        }; // `fn(u8)`: a type
           // the body: the first `{` outside brackets, unless a `;` comes first
        let mut k = i + 2;
        let mut depth = 0i32;
        let open = loop {
            match t.get(k).map(|x| &x.kind) {
                None => break None,
                Some(Kind::Punct('(' | '[' | '<')) => depth += 1,
                Some(Kind::Punct(')' | ']')) => depth -= 1,
                Some(Kind::Punct('>')) if !t[k - 1].is_punct('-') => depth -= 1,
                Some(Kind::Punct(';')) if depth <= 0 => break None,
                Some(Kind::Punct('{')) if depth <= 0 => break Some(k),
                _ => {}
            }
            k += 1;
        };
        let Some(open) = open else { continue };
        let Some(close) = matching(t, open) else {
            continue;
        };
        let (_, comments) = preamble(t, i);
        let long_ok = comments.iter().any(|c| c.contains("Long:"));
        out.push((
            name.to_string(),
            t[i].line,
            t[close].line - t[i].line + 1,
            long_ok,
        ));
    }
    out
}

fn long_fn_problems(files: &[File]) -> Vec<Problem> {
    let mut problems = Vec::new();
    for f in files.iter().filter(|f| !f.is_test) {
        for (name, line, lines, long_ok) in functions(f) {
            if lines > MAX_FN_LINES && !long_ok {
                problems.push(Problem {
                    key: format!("{} {name}", f.path),
                    msg: format!(
                        "long function: {}:{line} fn {name} is {lines} lines (at most \
                         {MAX_FN_LINES}; split it or say why in a `// Long:` comment above it)",
                        f.path
                    ),
                });
            }
        }
    }
    problems
}

// ---------------------------------------------------------------- (c) long files

fn long_file_problems(files: &[File]) -> Vec<Problem> {
    let mut problems = Vec::new();
    for f in files.iter().filter(|f| !f.is_test) {
        let lines = f.test_mod_line.map_or(f.lines, |l| l - 1);
        if lines > MAX_FILE_LINES {
            problems.push(Problem {
                key: f.path.clone(),
                msg: format!(
                    "long file: {} has {lines} lines before its tests (at most {MAX_FILE_LINES})",
                    f.path
                ),
            });
        }
    }
    problems
}

// ---------------------------------------------------------------- (d) duplicate names

/// Public items: (kind, name) for `pub struct/enum/trait/type/union/fn/const`.
fn pub_items(f: &File) -> Vec<(&'static str, String)> {
    let t = &f.toks;
    let mut out = Vec::new();
    for i in 0..t.len().saturating_sub(1) {
        if !t[i].is("pub") || f.test[i] {
            continue;
        }
        let mut k = i + 1;
        if t[k].is_punct('(') {
            // `pub(super)`, `pub(in path)`: names seen in one corner of a
            // crate, not by its readers at large (`pub(crate)` is).
            if !t.get(k + 1).is_some_and(|x| x.is("crate")) {
                continue;
            }
            k = matching(t, k).map_or(k, |c| c + 1);
        }
        while t.get(k).is_some_and(|x| {
            x.is("const") && t.get(k + 1).is_some_and(|y| y.is("fn"))
                || x.is("unsafe")
                || x.is("async")
        }) {
            k += 1;
        }
        let kind = match t.get(k).and_then(Tok::ident) {
            Some("struct") => "struct",
            Some("enum") => "enum",
            Some("trait") => "trait",
            Some("type") => "type",
            Some("union") => "union",
            Some("fn") => "fn",
            _ => continue,
        };
        if let Some(name) = t.get(k + 1).and_then(Tok::ident) {
            out.push((kind, name.to_string()));
        }
    }
    out
}

fn duplicate_problems(files: &[File]) -> Vec<Problem> {
    let mut problems = Vec::new();
    // Types: one name, one definition in the workspace.
    let mut types: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for f in files.iter().filter(|f| !f.is_test) {
        for (kind, name) in pub_items(f) {
            if kind != "fn" {
                types
                    .entry(name)
                    .or_default()
                    .push(format!("{kind} in {}", f.path));
            }
        }
    }
    for (name, places) in &types {
        if places.len() > 1 {
            problems.push(Problem {
                key: name.clone(),
                msg: format!("duplicate type name {name}: {}", places.join(", ")),
            });
        }
    }
    // Modules: one name in two library crates, one built on the other (a
    // path from one names the other; the CLI's modules are named for their
    // commands and may share the name of the library module they call), or
    // in any two crates, holding items of the same names.
    for f in files.iter().filter(|f| !f.is_test && f.krate != "vmtrace") {
        let Some(name) = f.module.last() else {
            continue;
        };
        let mut seen = BTreeSet::new();
        for (_, p) in paths_in(f) {
            let Some(other) = CRATES.iter().find(|c| c.name == p[0] && c.name != f.krate) else {
                continue;
            };
            let home = modules_of(files, other.name);
            let mut m = Vec::new();
            for seg in &p[1..] {
                m.push(seg.clone());
                if !home.contains_key(&m) {
                    m.pop();
                    break;
                }
            }
            if m.last() == Some(name) && seen.insert(home[&m]) {
                problems.push(Problem {
                    key: format!("mod {name}"),
                    msg: format!(
                        "duplicate module {name}: {} names {}'s {} (`{}`)",
                        f.path,
                        other.name,
                        home[&m],
                        p.join("::")
                    ),
                });
            }
        }
    }
    // Modules: one name in two crates, holding items of the same names.
    let name_of = |f: &File| f.module.last().cloned();
    for (a, fa) in files.iter().enumerate().filter(|(_, f)| !f.is_test) {
        for fb in files[a + 1..]
            .iter()
            .filter(|f| !f.is_test && f.krate != fa.krate)
        {
            let Some(name) = name_of(fa).filter(|n| Some(n) == name_of(fb).as_ref()) else {
                continue;
            };
            let ia: BTreeSet<String> = pub_items(fa).into_iter().map(|(_, n)| n).collect();
            let ib: BTreeSet<String> = pub_items(fb).into_iter().map(|(_, n)| n).collect();
            let common: Vec<&String> = ia.intersection(&ib).collect();
            if !common.is_empty() {
                let common: Vec<&str> = common.iter().map(|s| s.as_str()).collect();
                problems.push(Problem {
                    key: format!("mod {name}"),
                    msg: format!(
                        "duplicate module {name}: {} and {} both define {}",
                        fa.path,
                        fb.path,
                        common.join(", ")
                    ),
                });
            }
        }
    }
    problems
}

// ---------------------------------------------------------------- the tests

/// A rule broken: `key` names it in the allow lists, `msg` says it.
struct Problem {
    key: String,
    msg: String,
}

/// Fails with every problem the allow list does not name.
fn report(what: &str, problems: Vec<Problem>, allowed: &[(&str, &str)]) {
    let left: Vec<String> = problems
        .into_iter()
        .filter(|p| !allowed.iter().any(|&(k, _)| k == p.key))
        .map(|p| format!("{} [{}]", p.msg, p.key))
        .collect();
    assert!(
        left.is_empty(),
        "{what}: {} found:\n{}",
        left.len(),
        left.join("\n")
    );
}

#[test]
fn no_import_loops() {
    report(
        "import loops",
        import_loop_problems(&workspace()),
        ALLOWED_LOOPS,
    );
}

#[test]
fn no_long_functions() {
    report(
        "long functions",
        long_fn_problems(&workspace()),
        ALLOWED_LONG_FNS,
    );
}

#[test]
fn no_long_files() {
    report(
        "long files",
        long_file_problems(&workspace()),
        ALLOWED_LONG_FILES,
    );
}

#[test]
fn no_duplicate_names() {
    report(
        "duplicate names",
        duplicate_problems(&workspace()),
        ALLOWED_DUPLICATES,
    );
}

#[test]
fn allow_lists_name_what_is_there() {
    let files = workspace();
    let lists = [
        ("ALLOWED_LOOPS", import_loop_problems(&files), ALLOWED_LOOPS),
        (
            "ALLOWED_LONG_FNS",
            long_fn_problems(&files),
            ALLOWED_LONG_FNS,
        ),
        (
            "ALLOWED_LONG_FILES",
            long_file_problems(&files),
            ALLOWED_LONG_FILES,
        ),
        (
            "ALLOWED_DUPLICATES",
            duplicate_problems(&files),
            ALLOWED_DUPLICATES,
        ),
    ];
    let mut stale = Vec::new();
    for (list, problems, allowed) in lists {
        for (key, _) in allowed {
            if !problems.iter().any(|p| p.key == *key) {
                stale.push(format!("{list}: {key:?}"));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "nothing matches these entries any more: remove them from their lists:\n{}",
        stale.join("\n")
    );
}

// ---------------------------------------------------------------- the checker's own tests

/// Files of crate `tracer` from (path under tracer/src, text).
fn synthetic(files: &[(&str, &str)]) -> Vec<File> {
    let krate = &CRATES[2];
    let mut out: Vec<File> = files
        .iter()
        .map(|&(p, src)| {
            let module = module_of(Path::new(p), krate);
            parse(format!("tracer/src/{p}"), krate.name, module, src)
        })
        .collect();
    mark_test_files(&mut out);
    out
}

#[test]
fn checker_finds_loops_but_not_a_parent_using_its_children() {
    let files = synthetic(&[
        ("lib.rs", "pub mod a; pub mod b; pub mod p;"),
        ("a.rs", "use crate::b::B;\npub struct A;"),
        // A path in code, through `super`, to a sibling's item.
        ("b.rs", "pub struct B;\nfn f() { let _ = super::a::A; }"),
        // A parent naming its children, and children naming their parent.
        (
            "p/mod.rs",
            "mod c;\nuse self::c::C;\npub fn g() { c::h(); }",
        ),
        ("p/c.rs", "use super::g;\npub struct C;\npub fn h() {}"),
        // A test module's imports are not the module's.
        (
            "p/d.rs",
            "#[cfg(test)]\nmod tests {\n    use crate::a::A;\n}",
        ),
    ]);
    let problems = import_loop_problems(&files);
    let msgs: Vec<&str> = problems.iter().map(|p| p.msg.as_str()).collect();
    assert_eq!(
        msgs,
        ["import loop: tracer/src/a.rs -> tracer/src/b.rs -> tracer/src/a.rs"]
    );
    assert_eq!(problems[0].key, "tracer/src/a.rs tracer/src/b.rs");
}

#[test]
fn checker_counts_function_lines_past_strings_comments_and_tests() {
    let body = |n: usize| "    let _ = 1;\n".repeat(n);
    let src = format!(
        "pub fn short() {{\n{}}}\n\
         /// Docs.\n#[inline]\npub(crate) fn long() {{\n    let _ = r#\"}}\"#;\n    let _ = '{{';\n    \
         /* }} /* }} */ */\n    let _x: &'static str = \"}}\";\n{}}}\n\
         // Long: one table, read top to bottom.\nfn excused() {{\n{}}}\n\
         #[cfg(test)]\nmod tests {{\n    fn in_tests() {{\n{}    }}\n}}\n",
        body(78),
        body(81),
        body(90),
        body(90)
    );
    let files = synthetic(&[("lib.rs", &src)]);
    let fns = functions(&files[0]);
    let found: Vec<(&str, usize, bool)> = fns
        .iter()
        .map(|(n, _, l, ok)| (n.as_str(), *l, *ok))
        .collect();
    assert_eq!(
        found,
        [
            ("short", 80, false),
            ("long", 87, false),
            ("excused", 92, true)
        ]
    );
    let problems = long_fn_problems(&files);
    assert_eq!(
        problems.len(),
        1,
        "{:?}",
        problems.iter().map(|p| &p.msg).collect::<Vec<_>>()
    );
    assert_eq!(problems[0].key, "tracer/src/lib.rs long");
    // The file's lines end before its tests.
    assert_eq!(files[0].test_mod_line, Some(src.lines().count() - 94));
}

#[test]
fn checker_finds_types_and_modules_named_twice() {
    let files = vec![
        parse(
            "vmm/src/payload.rs".into(),
            "vmm",
            vec!["payload".into()],
            "pub struct Payload;",
        ),
        parse(
            "tracer/src/payload.rs".into(),
            "tracer",
            vec!["payload".into()],
            "use vmm::payload::Payload;\npub struct Payload;",
        ),
        // Seen in one corner of its crate only: not a name readers meet.
        parse(
            "tracer/src/p/q.rs".into(),
            "tracer",
            vec!["p".into(), "q".into()],
            "pub(super) type Payload = u8;",
        ),
    ];
    let mut msgs: Vec<String> = duplicate_problems(&files)
        .into_iter()
        .map(|p| p.msg)
        .collect();
    msgs.sort();
    assert_eq!(
        msgs,
        [
            "duplicate module payload: tracer/src/payload.rs names vmm's vmm/src/payload.rs \
             (`vmm::payload::Payload`)"
                .to_string(),
            "duplicate module payload: vmm/src/payload.rs and tracer/src/payload.rs both define \
             Payload"
                .to_string(),
            "duplicate type name Payload: struct in vmm/src/payload.rs, struct in \
             tracer/src/payload.rs"
                .to_string(),
        ]
    );
}
