//! The proxy is a pipeline (issue 21): its modules import downward only. This reads the
//! crate's sources ([`bazaar_layering`]) and fails on an import circle between its
//! top-level modules, or on a module that imports from the crate root (the root is the
//! composition, above every stage), or on an `impl` block for another module's type.

use bazaar_layering::Graph;
use std::collections::BTreeSet;
use std::path::Path;

fn graph() -> Graph {
    Graph::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src")).unwrap()
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let graph = graph();
    let modules = graph.modules();
    assert!(
        modules.contains("route") && modules.contains("ingress"),
        "{modules:?}"
    );
    let from_root: Vec<String> = graph
        .root_names()
        .into_iter()
        .map(|(module, name)| format!("{module} uses crate::{name}"))
        .collect();
    assert!(
        from_root.is_empty(),
        "modules importing from the crate root: {from_root:?}"
    );
    if let Some(circle) = graph.circle() {
        panic!("import circle: {}", circle.join(" -> "));
    }
    // Route is pure: it reads the table and the balancer, nothing that does I/O.
    assert_eq!(
        graph.imports("route"),
        BTreeSet::from(["balance", "table"]),
        "route imports"
    );
}

#[test]
fn no_module_adds_methods_to_another_modules_types() {
    let foreign: Vec<String> = graph()
        .foreign_impls()
        .into_iter()
        .map(|f| format!("{} has impl {} (from {})", f.module, f.ty, f.owner))
        .collect();
    assert!(foreign.is_empty(), "{foreign:?}");
}
