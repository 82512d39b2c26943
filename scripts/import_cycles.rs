//! The import graph of a Rust source tree and its circles (strongly connected components).
//!
//! Used by the test `imports::no_import_circle_inside_aggregates_and_optim`
//! (udfs/tests/it/imports.rs, which includes this file), and readable on its own: every
//! `crate::…`, `super::…` and `self::…` path in a file's code (comments and its trailing
//! `#[cfg(test)] mod tests { … }` block left out) is an arrow from the file's module to the
//! longest module prefix of that path, and a parent module's `use child::…` / `pub use child::…`
//! re-exports are arrows to the child (so importing through a re-exporting parent counts as
//! importing the parent, which imports the child). Circles are found with Tarjan's algorithm.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module path (`aggregates::dp_count`; `""` for the crate root) → source text, for every `.rs`
/// file under `root` (the crate's `src/`).
pub fn modules(root: &Path) -> BTreeMap<String, String> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<String, String>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .expect("readable source directory")
            .map(|e| e.expect("directory entry").path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, root, out);
            } else if p.extension().is_some_and(|e| e == "rs") {
                let rel = p.strip_prefix(root).expect("under root").with_extension("");
                let mut parts: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                if matches!(
                    parts.last().map(String::as_str),
                    Some("mod" | "lib" | "main")
                ) {
                    parts.pop();
                }
                let text = std::fs::read_to_string(&p).expect("readable source file");
                out.insert(parts.join("::"), text);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// The code of a file: its trailing unit-test block and every comment removed.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests {") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The paths named in `code`: `a::b::{c, d::{e}}` expands to `a::b::c`, `a::b::d::e`.
fn paths(code: &str) -> Vec<Vec<String>> {
    let b = code.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if ident(b[i]) && (i == 0 || !ident(b[i - 1]) && b[i - 1] != b':') {
            let (segs, next) = path_at(code, i, Vec::new(), &mut out);
            if segs.len() > 1 {
                out.push(segs);
            }
            i = next.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

/// Reads `seg(::seg)*` from `i`, expanding a trailing `::{…}` group into `out`; returns the plain
/// path (empty when a group was expanded) and the position after it.
fn path_at(
    code: &str,
    mut i: usize,
    mut prefix: Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> (Vec<String>, usize) {
    let b = code.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    loop {
        let start = i;
        while i < b.len() && ident(b[i]) {
            i += 1;
        }
        if i == start {
            break;
        }
        prefix.push(code[start..i].to_string());
        if code[i..].starts_with("::{") {
            i += 3;
            loop {
                while i < b.len() && (b[i].is_ascii_whitespace() || b[i] == b',') {
                    i += 1;
                }
                if i >= b.len() || b[i] == b'}' {
                    return (Vec::new(), i + 1);
                }
                if ident(b[i]) {
                    let (segs, next) = path_at(code, i, prefix.clone(), out);
                    if !segs.is_empty() {
                        out.push(segs);
                    }
                    i = next;
                    // Skip `as alias` and anything else up to the next separator.
                    while i < b.len() && b[i] != b',' && b[i] != b'}' {
                        i += 1;
                    }
                } else {
                    i += 1;
                }
            }
        }
        if code[i..].starts_with("::") {
            i += 2;
        } else {
            break;
        }
    }
    (prefix, i)
}

/// The module a path names (its longest prefix that is a module), seen from module `from`.
fn resolve(mods: &BTreeMap<String, String>, from: &str, path: &[String]) -> Option<String> {
    let here: Vec<&str> = if from.is_empty() {
        Vec::new()
    } else {
        from.split("::").collect()
    };
    let (mut base, rest): (Vec<&str>, &[String]) = match path[0].as_str() {
        "crate" => (Vec::new(), &path[1..]),
        "self" => (here.clone(), &path[1..]),
        "super" => {
            let mut base = here.clone();
            let mut k = 0;
            while k < path.len() && path[k] == "super" {
                base.pop();
                k += 1;
            }
            (base, &path[k..])
        }
        // A child of `from` named relatively (`pub use dp_count::…` in a parent module).
        child if mods.contains_key(&join(&here, child)) => (here.clone(), path),
        _ => return None,
    };
    // `super::Item` names the parent module itself.
    let mut best = Some(base.join("::")).filter(|m| mods.contains_key(m));
    for seg in rest {
        base.push(seg);
        let m = base.join("::");
        if mods.contains_key(&m) {
            best = Some(m);
        } else {
            break;
        }
    }
    best
}

fn join(here: &[&str], child: &str) -> String {
    let mut v = here.to_vec();
    v.push(child);
    v.join("::")
}

/// The arrows between the modules under the prefixes `within` (e.g. `["aggregates", "optim"]`):
/// module → modules it imports (itself left out). A parent's `mod child;` is not an arrow, its
/// `pub use child::…` is; so a child importing through its re-exporting parent closes a circle.
pub fn graph(root: &Path, within: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
    let mods = modules(root);
    let inside = |m: &str| {
        within
            .iter()
            .any(|w| m == *w || m.starts_with(&format!("{w}::")))
    };
    let mut g = BTreeMap::new();
    for (m, text) in &mods {
        if !inside(m) {
            continue;
        }
        let mut to = BTreeSet::new();
        for p in paths(&code(text)) {
            if let Some(t) = resolve(&mods, m, &p)
                && t != *m
                && inside(&t)
            {
                to.insert(t);
            }
        }
        g.insert(m.clone(), to);
    }
    g
}

/// The circles of `g`: its strongly connected components of more than one module (Tarjan).
pub fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    impl<'a> T<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on.insert(v);
            for w in self.g.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut comp = Vec::new();
                loop {
                    let w = self.stack.pop().expect("on the stack");
                    self.on.remove(w);
                    comp.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    self.out.push(comp);
                }
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.out.sort();
    t.out
}
