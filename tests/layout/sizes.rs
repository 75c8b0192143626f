//! Rules (b) to (d): no long function without a reason, no long file, no
//! name defined twice.

use std::collections::{BTreeMap, BTreeSet};

use crate::lex::*;
use crate::loops::{modules_of, paths_in};
use crate::source::*;
use crate::{Problem, MAX_FILE_LINES, MAX_FN_LINES};

// (b) long functions

/// Non-test functions: (file, name, first line, lines, has a `Long:` comment).
pub fn functions(f: &File) -> Vec<(String, usize, usize, bool)> {
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

pub fn long_fn_problems(files: &[File]) -> Vec<Problem> {
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

// (c) long files

pub fn long_file_problems(files: &[File]) -> Vec<Problem> {
    let mut problems = Vec::new();
    for f in files.iter().filter(|f| !f.is_test) {
        // Every test item's lines come off, wherever it is: counting only up
        // to the first `#[cfg(test)]` let a `#[cfg(test)] mod x;` at the top
        // hide the whole file.
        let lines = f.code_lines();
        if lines > MAX_FILE_LINES {
            problems.push(Problem {
                key: f.path.clone(),
                msg: format!(
                    "long file: {} has {lines} lines besides its tests (at most {MAX_FILE_LINES})",
                    f.path
                ),
            });
        }
    }
    problems
}

// (d) duplicate names

/// Public items: (kind, name) for `pub struct/enum/trait/type/union/fn/const`.
pub fn pub_items(f: &File) -> Vec<(&'static str, String)> {
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

pub fn duplicate_problems(files: &[File]) -> Vec<Problem> {
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
