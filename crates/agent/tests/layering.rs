//! The agent is layered (issues 21 and 35): its state is made of parts in modules below
//! `agent` (which imports only downward), what needs the whole agent sits above it, and
//! start-up (`boot`) above everything. This reads the crate's sources ([`bazaar_layering`])
//! and fails on an import circle between its top-level modules (imports being `crate::`
//! paths and `super::` paths that leave a module), on an `impl` block in one module for a
//! type of another (the way around the imports: `impl Agent` elsewhere than `agent.rs`),
//! and on `Inner`, the agent's state, becoming reachable outside `agent.rs`.

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

/// `impl` blocks in one module for a type another module defines (`impl Agent` in
/// `operations.rs`, reaching into the agent's `Inner` as `self.0`) are a way around the
/// layers: each module adds methods to its own types only, and what needs the whole agent
/// is a function over its narrow methods (`operations::start_machine(&agent, ...)`).
#[test]
fn no_impl_blocks_for_another_modules_types() {
    let found: Vec<String> = graph()
        .foreign_impls()
        .into_iter()
        .map(|f| format!("impl {} (of {}) in {}", f.ty, f.owner, f.module))
        .collect();
    assert!(
        found.is_empty(),
        "impl blocks for a type of another module (add methods in the type's own module, or make them functions):\n{}",
        found.join("\n")
    );
}

/// No module but `agent.rs` touches `Inner`'s fields: the compiler refuses it as long as
/// the agent's handle and `Inner`'s fields are private to `agent.rs`, which this checks.
/// The other modules use the agent's narrow methods.
#[test]
fn only_agent_rs_reaches_the_agents_inner_state() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/agent.rs");
    let source = std::fs::read_to_string(path).unwrap();
    let lines: Vec<&str> = source.lines().map(str::trim).collect();
    assert!(
        lines.contains(&"pub struct Agent(Arc<Inner>);"),
        "the agent's handle on Inner must stay private to agent.rs: `pub struct Agent(Arc<Inner>);`"
    );
    let start = lines
        .iter()
        .position(|l| *l == "struct Inner {")
        .expect("agent.rs defines a private `struct Inner {`");
    let len = lines[start..]
        .iter()
        .position(|l| *l == "}")
        .expect("Inner's fields end");
    let public: Vec<&str> = lines[start + 1..start + len]
        .iter()
        .copied()
        .filter(|l| !l.starts_with("//") && !l.starts_with("#["))
        .filter(|l| l.starts_with("pub"))
        .collect();
    assert!(
        len > 10 && public.is_empty(),
        "Inner's fields must be private to agent.rs (add a narrow method instead): {public:?}"
    );
}
