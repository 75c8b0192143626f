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
/// from module `cur`: the longest prefix that is a module.
pub fn resolve(
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

/// Edges between files of one crate: `a -> b` when `a` names something in
/// `b`, `b` not `a` itself nor one of its descendants.
pub fn import_graph(files: &[File], krate: &str) -> BTreeMap<String, BTreeSet<String>> {
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
