//! The proxy is a pipeline (issue 21): its modules import downward only. This reads the
//! crate's sources and fails on an import circle between its top-level modules, or on a
//! module that imports from the crate root (the root is the composition, above every
//! stage).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The names a line takes from the crate root: `crate::a::...` and `crate::{a, b::c}`.
fn crate_paths(line: &str) -> Vec<String> {
    let mut names = Vec::new();
    for (at, _) in line.match_indices("crate::") {
        let rest = &line[at + "crate::".len()..];
        let ident = |s: &str| -> String {
            s.trim_start()
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect()
        };
        if let Some(group) = rest.strip_prefix('{') {
            let group = group.split('}').next().unwrap_or_default();
            names.extend(group.split(',').map(ident).filter(|n| !n.is_empty()));
        } else {
            names.push(ident(rest));
        }
    }
    names
}

/// The top-level modules of the crate and, for each, the root names its code uses.
fn module_uses() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut uses: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs").to_string();
        let text = std::fs::read_to_string(&file).unwrap();
        let used = uses.entry(module).or_default();
        for line in text.lines() {
            // Comments (doc links included) are not imports.
            let code = line.split("//").next().unwrap_or_default();
            used.extend(crate_paths(code));
        }
    }
    uses
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let uses = module_uses();
    let modules: BTreeSet<String> = uses.keys().filter(|m| *m != "lib").cloned().collect();
    assert!(
        modules.contains("route") && modules.contains("ingress"),
        "{modules:?}"
    );
    let mut edges: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let mut from_root = Vec::new();
    for (module, names) in &uses {
        if module == "lib" {
            continue;
        }
        for name in names {
            if modules.contains(name) {
                if name != module {
                    edges.entry(module).or_default().insert(name);
                }
            } else {
                from_root.push(format!("{module} uses crate::{name}"));
            }
        }
    }
    assert!(
        from_root.is_empty(),
        "modules importing from the crate root: {from_root:?}"
    );
    // Depth-first search for a back edge.
    fn visit<'a>(
        m: &'a str,
        edges: &BTreeMap<&'a str, BTreeSet<&'a str>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) {
        if done.contains(m) {
            return;
        }
        if let Some(at) = path.iter().position(|p| *p == m) {
            panic!("import circle: {} -> {m}", path[at..].join(" -> "));
        }
        path.push(m);
        for next in edges.get(m).into_iter().flatten() {
            visit(next, edges, path, done);
        }
        path.pop();
        done.insert(m);
    }
    let mut done = BTreeSet::new();
    for m in &modules {
        visit(m, &edges, &mut Vec::new(), &mut done);
    }
    // Route is pure: it reads the table and the balancer, nothing that does I/O.
    let route: BTreeSet<&str> = edges.get("route").cloned().unwrap_or_default();
    assert_eq!(route, BTreeSet::from(["balance", "table"]), "route imports");
}

#[test]
fn names_are_read_from_paths_and_groups() {
    assert_eq!(
        crate_paths("use crate::{a, b::c}; x(crate::d::e)"),
        ["a", "b", "d"]
    );
}
