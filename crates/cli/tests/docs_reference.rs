//! The reference pages say what the binary does: docs/CLI.md has every command and flag of
//! `bazaar --help`, docs/CONFIG.md every key of the agent's config file, docs/INSTALL.md's
//! guide (its `install-guide` blocks) only commands the binary has with flags they take and
//! agent configs the agent accepts, and the README's and docs' links lead to files that
//! exist. Needs no root and starts no agent.

use crate::common;

use common::EXE;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn help(path: &[String]) -> String {
    let out = Command::new(EXE).args(path).arg("--help").output().unwrap();
    assert!(out.status.success(), "bazaar {path:?} --help failed");
    String::from_utf8(out.stdout).unwrap()
}

/// The subcommands a help text lists under `Commands:` (not `help`).
fn subcommands(help: &str) -> Vec<String> {
    let Some((_, rest)) = help.split_once("\nCommands:\n") else {
        return Vec::new();
    };
    rest.lines()
        .take_while(|l| l.starts_with("  "))
        .filter(|l| !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

/// The long flags a help text lists (each on a line of its own: `-x, --flag` or `--flag`).
fn flags(help: &str) -> Vec<String> {
    help.lines()
        .map(str::trim_start)
        .map(|l| match l.as_bytes() {
            [b'-', c, b',', b' ', ..] if c.is_ascii_alphanumeric() => &l[4..],
            _ => l,
        })
        .filter(|l| l.starts_with("--") && l.len() > 2)
        .filter_map(|l| l.split([' ', '=', ',']).next())
        .map(str::to_string)
        .collect()
}

/// Every command path of the binary with its help text.
fn command_tree() -> BTreeMap<Vec<String>, String> {
    let mut tree = BTreeMap::new();
    let mut todo = vec![Vec::<String>::new()];
    while let Some(path) = todo.pop() {
        let text = help(&path);
        for sub in subcommands(&text) {
            let mut p = path.clone();
            p.push(sub);
            todo.push(p);
        }
        tree.insert(path, text);
    }
    tree
}

/// CLI.md's section of each command: from its heading to the next heading.
fn cli_sections(doc: &str) -> BTreeMap<String, String> {
    let mut sections = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    for line in doc.lines() {
        if line.starts_with('#') {
            if let Some((title, body)) = current.take() {
                sections.insert(title, body);
            }
            if let Some(title) = line
                .split_once("`bazaar")
                .and_then(|(_, r)| r.split_once('`'))
            {
                current = Some((format!("bazaar{}", title.0), String::new()));
            }
        } else if let Some((_, body)) = current.as_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    if let Some((title, body)) = current {
        sections.insert(title, body);
    }
    sections
}

#[test]
fn cli_md_has_every_command_and_flag() {
    let doc = read("docs/CLI.md");
    let sections = cli_sections(&doc);
    let tree = command_tree();
    assert!(tree.len() > 50, "{} commands", tree.len());
    let mut missing = Vec::new();
    for (path, text) in &tree {
        let title = std::iter::once("bazaar")
            .chain(path.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ");
        let Some(section) = sections.get(&title) else {
            missing.push(title);
            continue;
        };
        for flag in flags(text) {
            if !section.contains(&flag) {
                missing.push(format!("{title} {flag}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/CLI.md lacks (run scripts/cli-doc): {missing:#?}"
    );
}

#[test]
fn config_md_has_every_key_of_the_agent_config() {
    let doc = read("docs/CONFIG.md");
    let config = serde_json::to_value(bazaar_agent::config::AgentConfig::default()).unwrap();
    let keys: Vec<&String> = config.as_object().unwrap().keys().collect();
    assert!(keys.len() > 40, "{keys:?}");
    let missing: Vec<_> = keys
        .iter()
        .filter(|k| !doc.contains(&format!("| `{k}` |")))
        .collect();
    assert!(missing.is_empty(), "docs/CONFIG.md lacks {missing:?}");
}

/// The code blocks of a Markdown text whose info string is `lang install-guide`.
fn guide_blocks<'a>(doc: &'a str, lang: &str) -> Vec<&'a str> {
    let fence = format!("```{lang} install-guide\n");
    doc.split(&fence)
        .skip(1)
        .map(|rest| rest.split_once("```").expect("a closed block").0)
        .collect()
}

#[test]
fn the_install_guide_uses_commands_the_binary_has_and_configs_the_agent_takes() {
    let doc = read("docs/INSTALL.md");
    let configs = guide_blocks(&doc, "toml");
    assert!(configs.len() >= 2, "a first and a next server's config");
    let dir = tempfile::tempdir().unwrap();
    for (i, text) in configs.iter().enumerate() {
        let path = dir.path().join(format!("agent-{i}.toml"));
        std::fs::write(&path, text).unwrap();
        bazaar_agent::config::AgentConfig::from_file(&path)
            .unwrap_or_else(|e| panic!("the guide's config {i} is refused: {e:#}\n{text}"));
    }

    let tree = command_tree();
    let scripts = guide_blocks(&doc, "sh").join("\n").replace("\\\n", " ");
    let mut checked = 0;
    for (line, path, words) in bazaar_commands(&scripts, &tree) {
        let known = flags(&tree[&path]);
        for w in words.iter().filter(|w| w.starts_with("--")) {
            let flag = w.split('=').next().unwrap();
            assert!(
                known.iter().any(|f| f == flag),
                "`bazaar {}` takes no {flag}: {line}",
                path.join(" ")
            );
        }
        checked += 1;
    }
    assert!(checked >= 8, "only {checked} bazaar commands in the guide");
}

/// The `bazaar` commands of a shell text (also those inside `$(...)`): each line, the
/// longest command path its words name, and its words up to `--`.
fn bazaar_commands(
    text: &str,
    tree: &BTreeMap<Vec<String>, String>,
) -> Vec<(String, Vec<String>, Vec<String>)> {
    let mut found = Vec::new();
    for line in text.lines() {
        let line = line.split(" # ").next().unwrap();
        let segments = line
            .split("$(")
            .flat_map(|p| p.split("; "))
            .flat_map(|p| p.split("&& "))
            .flat_map(|p| p.split("| "));
        for segment in segments {
            // A command starts the segment, after `do` or environment assignments.
            let words: Vec<String> = segment
                .split([' ', ')'])
                .filter(|w| !w.is_empty())
                .skip_while(|w| *w == "do" || *w == "then" || w.contains('='))
                .take_while(|w| *w != "--")
                .map(str::to_string)
                .collect();
            if words.first().map(String::as_str) != Some("bazaar") {
                continue;
            }
            let mut path: Vec<String> = Vec::new();
            for w in &words[1..] {
                let mut p = path.clone();
                p.push(w.clone());
                if tree.contains_key(&p) {
                    path = p;
                } else {
                    break;
                }
            }
            assert!(!path.is_empty(), "not a bazaar command: {line}");
            found.push((line.to_string(), path, words));
        }
    }
    found
}

#[test]
fn scripts_tour_runs_every_command_of_the_readme_tour() {
    let readme = read("README.md");
    let tour = readme
        .split("## A 5-minute tour")
        .nth(1)
        .and_then(|t| t.split("```sh\n").nth(1))
        .and_then(|t| t.split("```").next())
        .expect("the README's tour block");
    let script = read("scripts/tour");
    let tree = command_tree();
    let commands = bazaar_commands(tour, &tree);
    assert!(commands.len() > 30, "{} commands", commands.len());
    let missing: Vec<String> = commands
        .into_iter()
        .map(|(_, path, _)| format!("bazaar {}", path.join(" ")))
        .filter(|c| !script.contains(c.as_str()))
        .collect();
    assert!(missing.is_empty(), "scripts/tour does not run {missing:?}");
}

#[test]
fn the_readme_leads_to_the_guide_and_its_links_lead_somewhere() {
    let readme = read("README.md");
    let first_section = readme.split("\n## ").nth(1).expect("a first section");
    assert!(
        first_section.contains("(docs/INSTALL.md)"),
        "the README's first section links the install guide"
    );
    let mut files = vec![PathBuf::from("README.md")];
    for e in std::fs::read_dir(repo().join("docs")).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "md") {
            files.push(Path::new("docs").join(e.file_name()));
        }
    }
    let mut broken = Vec::new();
    for rel in &files {
        let text = read(rel.to_str().unwrap());
        let base = repo().join(rel).parent().unwrap().to_path_buf();
        for link in text.split("](").skip(1) {
            let target = link.split(')').next().unwrap();
            let target = target.split('#').next().unwrap();
            if target.is_empty() || target.contains("://") || target.contains(' ') {
                continue;
            }
            if !base.join(target).exists() {
                broken.push(format!("{}: {target}", rel.display()));
            }
        }
    }
    assert!(broken.is_empty(), "links to nothing: {broken:#?}");
}
