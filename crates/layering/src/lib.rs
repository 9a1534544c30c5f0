//! The import graph of a crate's top-level modules, read from its sources, for tests that
//! keep a crate layered (issue 21): a module imports only modules below it, so the graph
//! has no circle. A module's imports are the names its code takes from the crate root
//! (`crate::a::...`, `crate::{a, b::c}`, and `super::` paths that climb out of the
//! top-level module: `super::b` in `a.rs`, `super::super::b` in `a/c.rs`); comments, doc
//! links included, are not imports. The graph also knows which types each module defines
//! and the self types of its `impl` blocks, so a test can find a module adding methods to
//! a type of another module ([`Graph::foreign_impls`]), a way around the import order.
//! Every file under `src/` counts for the top-level module it sits in (`a.rs`, `a/...`);
//! the crate root (`lib.rs`, `main.rs`) is the composition above every module and is left
//! out.
//!
//! ```no_run
//! let graph = bazaar_layering::Graph::read(std::path::Path::new("src")).unwrap();
//! if let Some(circle) = graph.circle() {
//!     panic!("import circle: {}", circle.join(" -> "));
//! }
//! ```
//!
//! Pure and without dependencies: only layering tests (dev-dependencies) use it.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

mod tokens;

/// The crate root's files: not modules.
const ROOTS: [&str; 2] = ["lib", "main"];

/// Which names each top-level module of a crate takes from the crate root.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Graph {
    uses: BTreeMap<String, BTreeSet<String>>,
    /// The types each module defines.
    defines: BTreeMap<String, BTreeSet<String>>,
    /// The self types of each module's `impl` blocks.
    impls: BTreeMap<String, BTreeSet<String>>,
}

/// An `impl` block in one top-level module for a type another one defines.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ForeignImpl {
    /// The module the `impl` block is in.
    pub module: String,
    /// The type's name.
    pub ty: String,
    /// The module defining the type.
    pub owner: String,
}

impl Graph {
    /// Reads every `.rs` file under `src` (a crate's source directory).
    pub fn read(src: &Path) -> std::io::Result<Graph> {
        let mut files = Vec::new();
        sources(src, &mut files)?;
        let mut graph = Graph::default();
        for file in files {
            let rel = file.strip_prefix(src).map_err(std::io::Error::other)?;
            let Some(first) = rel.components().next() else {
                continue;
            };
            let first = first.as_os_str().to_string_lossy();
            let module = first.trim_end_matches(".rs");
            if ROOTS.contains(&module) && rel.components().count() == 1 {
                continue;
            }
            // `a.rs` and `a/mod.rs` are one level below the root, `a/b.rs` two.
            let mut depth = rel.components().count();
            if rel.file_name().is_some_and(|f| f == "mod.rs") {
                depth -= 1;
            }
            graph.add_at(module, depth, &std::fs::read_to_string(&file)?);
        }
        Ok(graph)
    }

    /// Adds `code` to `module`, as the file of the module itself (`a.rs`; tests build
    /// graphs from strings).
    pub fn add(&mut self, module: &str, code: &str) {
        self.add_at(module, 1, code);
    }

    /// Adds `code` to `module`, from a file `depth` levels below the crate root (`a.rs`:
    /// 1, `a/b.rs`: 2), which says how far `super::` climbs.
    pub fn add_at(&mut self, module: &str, depth: usize, code: &str) {
        let used = self.uses.entry(module.to_string()).or_default();
        for line in code.lines() {
            // Comments (doc links included) are not imports.
            let code = line.split("//").next().unwrap_or_default();
            used.extend(crate_paths(code));
        }
        let facts = tokens::facts(code, depth);
        used.extend(facts.supers);
        self.defines
            .entry(module.to_string())
            .or_default()
            .extend(facts.defines);
        self.impls
            .entry(module.to_string())
            .or_default()
            .extend(facts.impls);
    }

    /// The `impl` blocks in one top-level module for a type defined in another (a type
    /// named the same in the module itself counts as its own).
    pub fn foreign_impls(&self) -> Vec<ForeignImpl> {
        let mut out = Vec::new();
        for (module, types) in &self.impls {
            for ty in types {
                if self.defines.get(module).is_some_and(|d| d.contains(ty)) {
                    continue;
                }
                let owner = self
                    .defines
                    .iter()
                    .find(|(_, defined)| defined.contains(ty))
                    .map(|(owner, _)| owner);
                if let Some(owner) = owner {
                    out.push(ForeignImpl {
                        module: module.clone(),
                        ty: ty.clone(),
                        owner: owner.clone(),
                    });
                }
            }
        }
        out
    }

    /// The top-level modules.
    pub fn modules(&self) -> BTreeSet<&str> {
        self.uses.keys().map(String::as_str).collect()
    }

    /// The modules `module` imports (itself left out).
    pub fn imports(&self, module: &str) -> BTreeSet<&str> {
        self.uses
            .get(module)
            .into_iter()
            .flatten()
            .map(String::as_str)
            .filter(|name| *name != module && self.uses.contains_key(*name))
            .collect()
    }

    /// The names modules take from the crate root that are no module (re-exports and
    /// items of `lib.rs`), as `(module, name)`: such an import hides which module the
    /// name comes from.
    pub fn root_names(&self) -> Vec<(&str, &str)> {
        self.uses
            .iter()
            .flat_map(|(module, names)| {
                names
                    .iter()
                    .filter(|name| !self.uses.contains_key(*name))
                    .map(move |name| (module.as_str(), name.as_str()))
            })
            .collect()
    }

    /// An import circle, if there is one: `[a, b, ..., a]`, each module importing the next.
    pub fn circle(&self) -> Option<Vec<String>> {
        let mut done = BTreeSet::new();
        for module in self.modules() {
            let mut path = Vec::new();
            if let Some(circle) = self.visit(module, &mut path, &mut done) {
                return Some(circle);
            }
        }
        None
    }

    /// Depth-first search from `module` for a back edge onto `path`.
    fn visit<'a>(
        &'a self,
        module: &'a str,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if done.contains(module) {
            return None;
        }
        if let Some(at) = path.iter().position(|p| *p == module) {
            let mut circle: Vec<String> = path[at..].iter().map(|m| m.to_string()).collect();
            circle.push(module.to_string());
            return Some(circle);
        }
        path.push(module);
        for next in self.imports(module) {
            if let Some(circle) = self.visit(next, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        done.insert(module);
        None
    }
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            sources(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// The names a line of code takes from the crate root: `crate::a::...` and
/// `crate::{a, b::c}`.
pub fn crate_paths(line: &str) -> Vec<String> {
    let mut names = Vec::new();
    for (at, _) in line.match_indices("crate::") {
        // `$crate::` and `bazaar_crate::` are no paths from this crate's root.
        if line[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$')
        {
            continue;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_read_from_paths_and_groups() {
        assert_eq!(
            crate_paths("use crate::{a, b::c}; x(crate::d::e)"),
            ["a", "b", "d"]
        );
        assert!(crate_paths("$crate::a; other_crate::b").is_empty());
    }

    fn graph(modules: &[(&str, &str)]) -> Graph {
        let mut g = Graph::default();
        for (module, code) in modules {
            g.add(module, code);
        }
        g
    }

    #[test]
    fn a_circle_is_found_and_named() {
        let g = graph(&[
            ("a", "use crate::b::X;"),
            ("b", "use crate::{c, lib_item};"),
            ("c", "fn f() { crate::a::g() }"),
            ("d", "use crate::a;"),
        ]);
        assert_eq!(g.circle().unwrap(), ["a", "b", "c", "a"]);
        assert_eq!(g.root_names(), [("b", "lib_item")]);
    }

    #[test]
    fn layers_have_no_circle_and_comments_are_no_imports() {
        let g = graph(&[
            ("top", "use crate::{mid, low};"),
            ("mid", "use crate::low; // see [`crate::top`]"),
            (
                "low",
                "/// Used by [`crate::top`].\nfn f(x: crate::low::T) {}",
            ),
        ]);
        assert_eq!(g.circle(), None);
        assert_eq!(g.imports("top"), BTreeSet::from(["low", "mid"]));
        assert!(g.imports("low").is_empty());
    }

    #[test]
    fn a_crate_is_read_by_top_level_module() {
        let dir = std::env::temp_dir().join(format!("bazaar-layering-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("a")).unwrap();
        std::fs::write(dir.join("lib.rs"), "pub mod a; pub mod b; use crate::a::X;").unwrap();
        std::fs::write(dir.join("a/mod.rs"), "mod inner;").unwrap();
        std::fs::write(dir.join("a/inner.rs"), "use crate::b::Y;").unwrap();
        std::fs::write(dir.join("b.rs"), "use crate::a::X;").unwrap();
        let g = Graph::read(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(g.modules(), BTreeSet::from(["a", "b"]));
        assert_eq!(g.circle().unwrap(), ["a", "b", "a"]);
    }

    #[test]
    fn super_paths_that_leave_the_module_are_imports() {
        let mut g = graph(&[("b", ""), ("c", ""), ("d", "")]);
        // `a.rs`: `super::` is the crate root; inside `mod tests`, it is `a` itself.
        g.add_at(
            "a",
            1,
            "use super::b::X;\n#[cfg(test)]\nmod tests {\n    use super::*;\n    use super::Helper;\n    fn f() { let s = \"}\"; }\n}\nfn g() { super::c::h() }",
        );
        // `a/e.rs`: one `super` is `a`, two are the root.
        g.add_at(
            "a",
            2,
            "use super::Inner;\nuse super::super::{d, Root as R};",
        );
        g.add_at("b", 1, "pub(super) fn f() {}");
        assert_eq!(g.imports("a"), BTreeSet::from(["b", "c", "d"]));
        assert_eq!(g.root_names(), [("a", "Root")]);
        assert!(g.imports("b").is_empty());
    }

    #[test]
    fn impls_of_another_modules_types_are_found() {
        let g = graph(&[
            (
                "agent",
                "pub struct Agent { inner: Inner }\npub(crate) struct Inner;",
            ),
            (
                "ops",
                "impl Agent {\n    fn f(&self) -> impl Iterator<Item = u8> { todo!() }\n}\n\
                 #[cfg(test)]\nimpl<T: Into<u8>> From<T> for crate::agent::Inner { }\n\
                 impl Drop for Local { }\nstruct Local;",
            ),
            ("own", "struct Agent;\nimpl<'a> Agent { }"),
            (
                "quiet",
                "// impl Agent {}\nconst S: &str = \"impl Inner {\";\n/* impl Agent { */\n\
                 fn f(x: impl Fn() -> Agent) -> Box<dyn Fn(u8)> { todo!() }",
            ),
        ]);
        let found: Vec<(String, String, String)> = g
            .foreign_impls()
            .into_iter()
            .map(|f| (f.module, f.ty, f.owner))
            .collect();
        let want = [("ops", "Agent", "agent"), ("ops", "Inner", "agent")]
            .map(|(m, t, o)| (m.to_string(), t.to_string(), o.to_string()));
        assert_eq!(found, want);
    }
}
