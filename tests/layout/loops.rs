//! Rule (a): no import loops between the modules of a crate.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use crate::lex::*;
use crate::source::*;
use crate::Problem;

/// The paths a `use` tree names, from the token after `use` to its `;`.
pub fn use_paths(t: &[Tok], mut i: usize) -> Vec<Vec<String>> {
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
/// from module `cur` (the longest prefix that is a module), and the segment
/// after it: the item named in it.
pub fn resolve_item(
    path: &[String],
    cur: &[String],
    modules: &BTreeSet<Vec<String>>,
) -> Option<(Vec<String>, Option<String>)> {
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
            return Some((base, Some(seg.clone())));
        }
        base = next;
    }
    Some((base, None))
}

/// A module's `pub use` re-exports: names to (module, name) they come from,
/// and the modules it re-exports whole (`pub use child::*`).
#[derive(Default)]
pub struct Reexports {
    pub names: HashMap<String, (Vec<String>, String)>,
    pub globs: Vec<Vec<String>>,
}

/// Every module's re-exports, from `pub use` items (any `pub`) in its
/// non-test code; a path not starting with `crate`, `self` or `super` is
/// taken from the module itself (`pub use child::A` in a mod.rs).
pub fn reexports_of(
    files: &[File],
    krate: &str,
    modules: &BTreeSet<Vec<String>>,
) -> HashMap<Vec<String>, Reexports> {
    let mut out: HashMap<Vec<String>, Reexports> = HashMap::new();
    for f in files.iter().filter(|f| f.krate == krate && !f.is_test) {
        let t = &f.toks;
        for i in 0..t.len() {
            if !t[i].is("use") || f.test[i] {
                continue;
            }
            // `pub use` or `pub(…) use`
            let public = match (0..i)
                .rev()
                .find(|&k| !matches!(t[k].kind, Kind::Comment(_)))
            {
                Some(k) if t[k].is("pub") => true,
                Some(k) if t[k].is_punct(')') => (0..k)
                    .rev()
                    .find(|&o| t[o].is_punct('('))
                    .is_some_and(|o| o > 0 && t[o - 1].is("pub")),
                _ => false,
            };
            if !public {
                continue;
            }
            let mut cur = f.module.clone();
            cur.extend(f.inline_mods[f.mod_at[i]].0.iter().cloned());
            let glob = use_globs(t, i + 1);
            for mut p in use_paths(t, i + 1) {
                if !matches!(p[0].as_str(), "crate" | "self" | "super") {
                    p.insert(0, "self".into());
                }
                let Some((m, item)) = resolve_item(&p, &cur, modules) else {
                    continue;
                };
                let entry = out.entry(cur.clone()).or_default();
                match item {
                    Some(name) if p.last() == Some(&name) => {
                        entry.names.insert(name.clone(), (m, name));
                    }
                    None if glob.contains(p.last().unwrap()) => entry.globs.push(m),
                    _ => {}
                }
            }
        }
    }
    out
}

/// The last segments of the paths a `use` tree ends with `*`.
fn use_globs(t: &[Tok], i: usize) -> BTreeSet<String> {
    let end = item_end(t, i);
    (i..end)
        .filter(|&k| t[k].is_punct('*') && k >= 3)
        .filter_map(|k| t[k - 3].ident().map(String::from))
        .collect()
}

/// Whether a file defines an item named `name` outside its tests.
fn defines(f: &File, name: &str) -> bool {
    let t = &f.toks;
    (1..t.len()).any(|k| {
        !f.test[k]
            && t[k].is(name)
            && t[k - 1].ident().is_some_and(|w| {
                matches!(
                    w,
                    "struct"
                        | "enum"
                        | "fn"
                        | "const"
                        | "static"
                        | "type"
                        | "trait"
                        | "union"
                        | "mod"
                )
            })
    })
}

/// The module that defines what `path` names, through `pub use`
/// re-exports: `crate::plan::TracePlan` with `pub use build::TracePlan` in
/// plan/mod.rs is plan::build's.
pub fn defining_module(
    path: &[String],
    cur: &[String],
    modules: &BTreeSet<Vec<String>>,
    reexports: &HashMap<Vec<String>, Reexports>,
    home: &HashMap<Vec<String>, &str>,
    files: &[File],
) -> Option<Vec<String>> {
    let (mut m, mut item) = resolve_item(path, cur, modules)?;
    // Bounded: re-exports of re-exports are few, and a `pub use` loop ends.
    for _ in 0..8 {
        let Some(name) = item.clone() else { break };
        let Some(r) = reexports.get(&m) else { break };
        if let Some((to, n)) = r.names.get(&name) {
            (m, item) = (to.clone(), Some(n.clone()));
            continue;
        }
        let glob = r.globs.iter().find(|g| {
            home.get(*g)
                .is_some_and(|p| files.iter().any(|f| f.path == *p && defines(f, &name)))
        });
        match glob {
            Some(g) => m = g.clone(),
            None => break,
        }
    }
    Some(m)
}

/// Every module of a crate (file or inline) and the file holding it.
pub fn modules_of<'a>(files: &'a [File], krate: &str) -> HashMap<Vec<String>, &'a str> {
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
pub fn paths_in(f: &File) -> Vec<(Vec<String>, Vec<String>)> {
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

/// Each non-test file of a crate with the modules its paths name (through
/// re-exports, to the module defining the item) and the paths naming them.
pub fn uses_of(files: &[File], krate: &str) -> Vec<(usize, Vec<String>, Vec<String>)> {
    uses(files, krate, false)
}

/// `uses_of`, and also the module each path names as written when a
/// re-export stands between it and the item: a file that re-exports is
/// depended on too (`mod.rs` files re-exporting their children aside).
pub fn uses_as_written(files: &[File], krate: &str) -> Vec<(usize, Vec<String>, Vec<String>)> {
    uses(files, krate, true)
}

fn uses(files: &[File], krate: &str, written: bool) -> Vec<(usize, Vec<String>, Vec<String>)> {
    let home = modules_of(files, krate);
    let modules: BTreeSet<Vec<String>> = home.keys().cloned().collect();
    let reexports = reexports_of(files, krate, &modules);
    let mut out = Vec::new();
    for (n, f) in files.iter().enumerate() {
        if f.krate != krate || f.is_test {
            continue;
        }
        for (cur, p) in paths_in(f) {
            let Some(target) = defining_module(&p, &cur, &modules, &reexports, &home, files) else {
                continue;
            };
            if written {
                // A child's item re-exported by its parent names the child.
                let named = resolve_item(&p, &cur, &modules).map(|(m, _)| m);
                if let Some(m) = named.filter(|m| *m != target && !target.starts_with(m)) {
                    out.push((n, m, p.clone()));
                }
            }
            out.push((n, target, p));
        }
    }
    out
}

/// Edges between files of one crate: `a -> b` when `a` names something in
/// `b`, where it is defined or through a `pub use` there (`uses_as_written`),
/// `b` not `a` itself nor one of its descendants.
pub fn import_graph(files: &[File], krate: &str) -> BTreeMap<String, BTreeSet<String>> {
    let home = modules_of(files, krate);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (n, target, _) in uses_as_written(files, krate) {
        let f = &files[n];
        if target.starts_with(&f.module) {
            continue; // itself or a descendant
        }
        let to = home[&target];
        graph
            .entry(f.path.clone())
            .or_default()
            .insert(to.to_string());
    }
    graph
}

/// The graph's strongly connected components of more than one file.
pub fn loops(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
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
pub fn cycle_through(
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

pub fn import_loop_problems(files: &[File]) -> Vec<Problem> {
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
