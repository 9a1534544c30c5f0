//! The test binaries of this crate are listed by hand (`autotests = false` in its
//! Cargo.toml: one binary per area, `e2e_*.rs`, each declaring its test files as modules),
//! so a test file left out would silently never run. This checks that every test file is a
//! module of exactly one binary, and that every binary is a `[[test]]` of the crate.

use std::collections::BTreeMap;
use std::path::Path;

const TESTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests");

/// The `e2e_*.rs` binaries and the names of the modules each declares.
fn suites() -> BTreeMap<String, Vec<String>> {
    let mut suites = BTreeMap::new();
    for entry in std::fs::read_dir(TESTS).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        let Some(suite) = name.strip_suffix(".rs").filter(|n| n.starts_with("e2e_")) else {
            continue;
        };
        let source = std::fs::read_to_string(Path::new(TESTS).join(&name)).unwrap();
        let modules = source
            .lines()
            .filter_map(|l| l.trim().strip_prefix("mod ")?.strip_suffix(';'))
            .map(str::to_string)
            .collect();
        suites.insert(suite.to_string(), modules);
    }
    suites
}

#[test]
fn every_test_file_is_in_exactly_one_binary() {
    let suites = suites();
    assert!(suites.len() > 1, "no e2e_*.rs binaries found in {TESTS}");
    let mut problems = Vec::new();
    for entry in std::fs::read_dir(TESTS).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        let Some(module) = name.strip_suffix(".rs") else {
            continue;
        };
        if suites.contains_key(module) {
            continue;
        }
        let holders: Vec<&String> = suites
            .iter()
            .filter(|(_, modules)| modules.iter().any(|m| m == module))
            .map(|(suite, _)| suite)
            .collect();
        // Support modules (`common`) are in several binaries; test files in one.
        let shared = module == "common";
        if holders.is_empty() || (!shared && holders.len() > 1) {
            problems.push(format!("{name} is a module of {holders:?}"));
        }
    }
    assert!(
        problems.is_empty(),
        "every test file must be `mod NAME;` in exactly one tests/e2e_*.rs: {problems:#?}"
    );
}

#[test]
fn every_binary_is_a_test_target_of_the_crate() {
    let manifest =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")).unwrap();
    for suite in suites().keys() {
        assert!(
            manifest.contains(&format!("path = \"tests/{suite}.rs\"")),
            "tests/{suite}.rs is not a [[test]] in crates/cli/Cargo.toml"
        );
    }
}
