//! `bazaar-shim`: the per-machine supervisor and `shim-exec` as a small executable of
//! their own (only [`bazaar_shim`] is linked in). The agent runs its shims from it when it
//! sits beside `bazaar` with the same version, since it loads in half the time and memory
//! of the whole `bazaar` (see `bazaar_agent::shim_executable`). It takes the same internal
//! commands as `bazaar`:
//!
//! - `bazaar-shim shim RUN_DIR`
//! - `bazaar-shim shim-exec RUN_DIR ARGV...`
//! - `bazaar-shim --version`: `bazaar-shim <version> spec <format>`, which the agent checks.

use std::path::Path;

fn main() {
    let mut args = std::env::args_os().skip(1);
    let command = args.next().unwrap_or_default();
    if command == "--version" {
        println!("{}", bazaar_shim::version_line());
        return;
    }
    let run_dir = args.next().unwrap_or_default();
    if command == "shim" {
        bazaar_shim::shim_main(Path::new(&run_dir));
    }
    if command == "shim-exec" {
        let argv: Vec<String> = args.map(|a| a.to_string_lossy().into_owned()).collect();
        bazaar_shim::exec_main(Path::new(&run_dir), &argv);
    }
    eprintln!(
        "bazaar-shim is started by the bazaar agent (commands: shim RUN_DIR, shim-exec RUN_DIR ARGV..., --version)"
    );
    std::process::exit(2);
}
