//! The agent is layered (issue 21): its state is made of parts in modules below `agent`
//! (which imports only downward), what needs the whole agent sits above it, and start-up
//! (`boot`) above everything. This reads the crate's sources ([`bazaar_layering`]) and
//! fails on an import circle between its top-level modules.

use bazaar_layering::Graph;
use std::path::Path;

fn graph() -> Graph {
    Graph::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src")).unwrap()
}

/// The agent's parts: each owns a piece of its state and knows nothing of the agent.
const PARTS: [&str; 9] = [
    "addresses",
    "audit",
    "checks",
    "host_tls",
    "metrics",
    "registry",
    "store",
    "sync",
    "tokens",
];

/// The host plumbing `lib.rs` re-exports from `bazaar-runtime` (not modules of this crate).
const RUNTIME: [&str; 7] = [
    "driver",
    "exec",
    "idranges",
    "netlink",
    "network",
    "oci",
    "volume_fs",
];

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let graph = graph();
    let modules = graph.modules();
    assert!(
        modules.contains("agent") && modules.contains("boot") && modules.contains("actor"),
        "{modules:?}"
    );
    if let Some(circle) = graph.circle() {
        panic!("import circle: {}", circle.join(" -> "));
    }
    // `crate::Agent` would hide an import of `agent`: only the runtime's modules come from
    // the root.
    let from_root: Vec<String> = graph
        .root_names()
        .into_iter()
        .filter(|(_, name)| !RUNTIME.contains(name))
        .map(|(module, name)| format!("{module} uses crate::{name}"))
        .collect();
    assert!(
        from_root.is_empty(),
        "modules importing from the crate root: {from_root:?}"
    );
}

#[test]
fn the_agent_is_made_of_parts_below_it_and_started_from_above() {
    let graph = graph();
    let agent = graph.imports("agent");
    for part in PARTS {
        assert!(
            agent.contains(part),
            "agent does not hold {part}: {agent:?}"
        );
        assert!(
            !graph.imports(part).contains("agent"),
            "{part} imports agent"
        );
    }
    let above_boot: Vec<&str> = graph
        .modules()
        .into_iter()
        .filter(|m| graph.imports(m).contains("boot"))
        .collect();
    assert!(above_boot.is_empty(), "{above_boot:?} import boot");
}

/// Today's `impl` blocks in one module for a type of another (`impl Agent` blocks reaching
/// into the agent's `Inner`), as `(module, type)`: a way around the layers, to be removed
/// by a later refactor (issue 35). A new one fails the test below, and so does one that is
/// gone but still listed (a ratchet: the list only shrinks).
const FOREIGN_IMPLS: [(&str, &str); 3] = [
    ("boot", "Agent"),
    ("market", "Agent"),
    ("operations", "Agent"),
];

#[test]
fn no_new_impl_blocks_for_another_modules_types() {
    let found: Vec<(String, String)> = graph()
        .foreign_impls()
        .into_iter()
        .map(|f| (f.module, f.ty))
        .collect();
    let listed: Vec<(String, String)> = FOREIGN_IMPLS
        .iter()
        .map(|(m, t)| (m.to_string(), t.to_string()))
        .collect();
    let new: Vec<String> = found
        .iter()
        .filter(|f| !listed.contains(f))
        .map(|(m, t)| format!("(\"{m}\", \"{t}\"),"))
        .collect();
    assert!(
        new.is_empty(),
        "impl blocks for a type of another module (add methods in the type's own module):\n{}",
        new.join("\n")
    );
    let gone: Vec<&(String, String)> = listed.iter().filter(|l| !found.contains(l)).collect();
    assert!(
        gone.is_empty(),
        "{gone:?} no longer in the sources: remove them from FOREIGN_IMPLS"
    );
}

/// Modules that still reach into `Inner` through an agent handle's field (`agent.0.x`,
/// `self.agent.0.x`) outside `agent.rs`, beside the `impl Agent` blocks above (whose
/// `self.0` is theirs): a ratchet too. The others use the agent's narrow methods.
const INNER_REACHERS: [&str; 2] = ["actor", "boot"];

/// Top-level module of each source file and its text with whitespace removed.
fn sources(dir: &Path, module: Option<&str>, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        let module = module.map_or(stem.clone(), str::to_owned);
        if path.is_dir() {
            sources(&path, Some(&module), out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            out.push((module, text.split_whitespace().collect()));
        }
    }
}

#[test]
fn no_new_module_reaches_into_the_agents_inner_state() {
    let mut files = Vec::new();
    sources(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        None,
        &mut files,
    );
    assert!(files.iter().any(|(m, _)| m == "agent"), "read no sources");
    let mut reaching: Vec<String> = files
        .iter()
        .filter(|(m, text)| m != "agent" && text.contains("agent.0."))
        .map(|(m, _)| m.clone())
        .collect();
    reaching.sort();
    reaching.dedup();
    assert_eq!(
        reaching, INNER_REACHERS,
        "modules reaching into Inner through `agent.0` (use or add a narrow method in agent.rs)"
    );
}
