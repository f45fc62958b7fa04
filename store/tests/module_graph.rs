//! The store's modules depend on each other without cycles (a reader of any file needs only the
//! files below it): the graph of `crate::`, `super::` and re-exported-item references between
//! the files of `store/src` is acyclic. `pub use` lines (facades) and `mod` declarations are not
//! dependencies. The layering this checks is drawn in docs/ARCHITECTURE.md.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `store/src/a/b.rs` -> `a::b`, `store/src/a/mod.rs` -> `a`, `lib.rs` -> `crate`.
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("under src");
    let mut parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    if parts == ["lib"] {
        return "crate".into();
    }
    parts.join("::")
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read src") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The code of a file without comments, string contents and its `#[cfg(test)]` module.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
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

/// Joins `use` statements onto one line each (braces may span lines).
fn statements(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for l in code.lines() {
        let t = l.trim();
        if cur.is_empty()
            && !(t.starts_with("use ")
                || t.starts_with("pub use ")
                || t.starts_with("pub(crate) use "))
        {
            out.push(t.to_string());
            continue;
        }
        cur.push_str(t);
        cur.push(' ');
        if t.ends_with(';') {
            out.push(std::mem::take(&mut cur));
        }
    }
    out
}

#[test]
fn the_module_graph_of_store_is_acyclic() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    files(&src, &mut all);
    let modules: BTreeSet<String> = all.iter().map(|f| module_of(&src, f)).collect();
    // Items the crate root re-exports: name -> defining module.
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let mut reexport: BTreeMap<String, String> = BTreeMap::new();
    for st in statements(&code(&lib)) {
        if let Some(rest) = st.strip_prefix("pub use ") {
            let (path, items) = match rest.find('{') {
                Some(i) => (
                    &rest[..i],
                    rest[i + 1..rest.rfind('}').unwrap_or(rest.len())].to_string(),
                ),
                None => {
                    let r = rest.trim_end_matches([';', ' ']);
                    let (p, item) = r.rsplit_once("::").unwrap_or(("", r));
                    (p, item.to_string())
                }
            };
            let m = path.trim_end_matches("::");
            if modules.contains(m) {
                for item in items.split(',') {
                    let item = item.trim().trim_end_matches(';');
                    if !item.is_empty() {
                        reexport.insert(item.to_string(), m.to_string());
                    }
                }
            }
        }
    }
    // Resolves `a::b::c` (relative to the crate) to the deepest module file it names.
    let resolve = |path: &str| -> Option<String> {
        let parts: Vec<&str> = path.split("::").filter(|p| !p.is_empty()).collect();
        let mut best = None;
        for n in 1..=parts.len() {
            let cand = parts[..n].join("::");
            if modules.contains(&cand) {
                best = Some(cand);
            }
        }
        best.or_else(|| parts.first().and_then(|p| reexport.get(*p).cloned()))
    };
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &all {
        let me = module_of(&src, f);
        let parent = match me.rsplit_once("::") {
            Some((p, _)) => p.to_string(),
            None => "crate".to_string(),
        };
        let text = code(&std::fs::read_to_string(f).unwrap());
        let mut deps = BTreeSet::new();
        for st in statements(&text) {
            if st.starts_with("pub use ")
                || st.starts_with("pub(crate) use ")
                || st.starts_with("mod ")
                || st.starts_with("pub mod ")
            {
                continue;
            }
            // Every `crate::` or `super::` path in the statement, with brace groups expanded
            // one level (`use crate::{a, b::c}`).
            for (anchor, base) in [("crate::", String::new()), ("super::", parent.clone())] {
                let mut rest = st.as_str();
                while let Some(i) = rest.find(anchor) {
                    let after = &rest[i + anchor.len()..];
                    let end = after
                        .find(|c: char| {
                            !(c.is_alphanumeric()
                                || c == '_'
                                || c == ':'
                                || c == '{'
                                || c == '}'
                                || c == ','
                                || c == ' ')
                        })
                        .unwrap_or(after.len());
                    let expr = &after[..end];
                    let (head, group) = match expr.find('{') {
                        Some(j) => (&expr[..j], expr[j + 1..].split('}').next().unwrap_or("")),
                        None => (expr.split([',', ' ']).next().unwrap_or(""), ""),
                    };
                    let prefix = if base.is_empty() || base == "crate" {
                        String::new()
                    } else {
                        format!("{base}::")
                    };
                    let mut targets = Vec::new();
                    if group.is_empty() {
                        targets.push(format!("{prefix}{head}"));
                    } else {
                        for g in group.split(',') {
                            let g = g.trim();
                            if g == "self" {
                                targets.push(format!("{prefix}{}", head.trim_end_matches("::")));
                            } else if !g.is_empty() {
                                targets.push(format!("{prefix}{head}{g}"));
                            }
                        }
                    }
                    for t in targets {
                        let t = t.trim_end_matches("::").to_string();
                        let m = if t.is_empty() {
                            Some(parent.clone())
                        } else {
                            resolve(&t)
                        };
                        if let Some(m) = m {
                            if m != me && m != "crate" {
                                deps.insert(m);
                            }
                        }
                    }
                    rest = &after[end..];
                }
            }
        }
        edges.insert(me, deps);
    }
    // Depth-first search for a cycle.
    fn visit(
        m: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(m) {
            Some(1) => {
                let i = stack.iter().position(|s| s == m).unwrap_or(0);
                let mut cycle = stack[i..].to_vec();
                cycle.push(m.to_string());
                return Some(cycle);
            }
            Some(2) => return None,
            _ => {}
        }
        state.insert(m.to_string(), 1);
        stack.push(m.to_string());
        for d in edges.get(m).into_iter().flatten() {
            if let Some(c) = visit(d, edges, state, stack) {
                return Some(c);
            }
        }
        stack.pop();
        state.insert(m.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for m in edges.keys() {
        let mut stack = Vec::new();
        if let Some(c) = visit(m, &edges, &mut state, &mut stack) {
            panic!(
                "store module cycle: {}\nall edges: {edges:#?}",
                c.join(" -> ")
            );
        }
    }
    // The checker sees the dependencies it must see.
    assert!(
        edges["reader"].contains("mirror::route"),
        "{:?}",
        edges["reader"]
    );
    assert!(
        edges["mirror::stage"].contains("reader"),
        "{:?}",
        edges["mirror::stage"]
    );
    assert!(edges["fsck"].contains("reader"), "{:?}", edges["fsck"]);
}
