//! The house rules of the workspace, checked over the sources' `crate::` paths:
//! - no import circles between the top-level modules of a crate (a module that uses
//!   another must not be used by it, directly or around a longer loop);
//! - the device backend does not go through the host executor: `device` uses neither
//!   `executor`, `comm` nor `group`.
//!
//! Test code (`tests.rs`, `*_tests.rs`, `#[cfg(test)] mod tests`) is left out: a test may
//! reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file belongs to (`None`: the crate root, or test code).
fn top_module(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = parts.last()?;
    if last == "tests" || last.ends_with("_tests") || parts.iter().any(|p| p == "tests") {
        return None;
    }
    match parts.first().map(String::as_str) {
        None | Some("lib") | Some("main") => None,
        Some(m) => Some(m.to_string()),
    }
}

/// Top-level module -> the top-level modules its non-test code names as `crate::m`.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let Some(m) = top_module(src, &f) else {
            continue;
        };
        let text = std::fs::read_to_string(&f).unwrap();
        let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
        let deps = g.entry(m.clone()).or_default();
        for line in code.lines() {
            let line = line.split("//").next().unwrap_or("");
            for (i, _) in line.match_indices("crate::") {
                let name: String = line[i + 7..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() && name != m {
                    deps.insert(name);
                }
            }
        }
    }
    g
}

/// Every loop of the graph, each as a path `a -> b -> ... -> a` (one per strongly
/// connected group of modules).
fn circles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    fn reach(g: &BTreeMap<String, BTreeSet<String>>, from: &str, to: &str) -> Option<Vec<String>> {
        // Breadth-first, so the path printed is a shortest one.
        let mut prev: BTreeMap<String, String> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([from.to_string()]);
        while let Some(v) = queue.pop_front() {
            for w in g.get(&v).into_iter().flatten() {
                if w == to {
                    let mut path = vec![to.to_string(), v.clone()];
                    let mut cur = v.clone();
                    while cur != from {
                        cur = prev[&cur].clone();
                        path.push(cur.clone());
                    }
                    path.reverse();
                    return Some(path);
                }
                if g.contains_key(w) && w != from && !prev.contains_key(w) {
                    prev.insert(w.clone(), v.clone());
                    queue.push_back(w.clone());
                }
            }
        }
        None
    }
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut out = Vec::new();
    for m in g.keys() {
        if seen.contains(m) {
            continue;
        }
        if let Some(path) = reach(g, m, m) {
            seen.extend(path.iter().cloned());
            out.push(path.join(" -> "));
        }
    }
    out
}

#[test]
fn no_crate_has_import_circles_between_its_modules() {
    let mut found = Vec::new();
    for krate in [
        "ccl-core",
        "probe",
        "analyzer",
        "analyzer-net",
        "ccl-ffi",
        "ccld",
    ] {
        let g = module_graph(&root().join(krate).join("src"));
        assert!(g.len() >= 2, "{krate}: the scan found its modules: {g:?}");
        for c in circles(&g) {
            found.push(format!("{krate}: {c}"));
        }
    }
    assert!(found.is_empty(), "import circles: {found:#?}");
}

#[test]
fn the_device_backend_does_not_go_through_the_host_executor() {
    let g = module_graph(&root().join("ccl-core/src"));
    let device = &g["device"];
    let bad: Vec<&String> = ["executor", "comm", "group"]
        .iter()
        .filter_map(|m| device.get(*m))
        .collect();
    assert!(bad.is_empty(), "device uses {bad:?}");
    // The scan sees real edges: the device runtime starts from the operation type.
    assert!(device.contains("op"), "{device:?}");
}

#[test]
fn the_circle_finder_finds_a_circle() {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (a, b) in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")] {
        g.entry(a.into()).or_default().insert(b.into());
        g.entry(b.into()).or_default();
    }
    g.entry("d".into()).or_default();
    assert_eq!(circles(&g), vec!["a -> b -> c -> a".to_string()]);
    g.get_mut("c").unwrap().remove("a");
    assert!(circles(&g).is_empty());
}
