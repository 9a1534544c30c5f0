//! `bazaar-shim`: the per-machine supervisor and `shim-exec` as a small executable of
//! their own (only [`bazaar_shim`] is linked in). The agent runs its shims from it when it
//! sits beside `bazaar` with the same version, since it loads in half the time and memory
//! of the whole `bazaar` (see `bazaar_agent::shim_exe::shim_executable`). It takes the same internal
//! commands as `bazaar`:
//!
//! - `bazaar-shim shim RUN_DIR`
//! - `bazaar-shim shim-exec RUN_DIR ARGV...`
//! - `bazaar-shim --version`: `bazaar-shim <version> spec <format>`, which the agent checks.

fn main() {
    let mut args = std::env::args_os().skip(1);
    let command = args.next().unwrap_or_default();
    if command == "--version" {
        println!("{}", bazaar_shim::version_line());
        return;
    }
    bazaar_shim::dispatch(&command, args);
    eprintln!(
        "bazaar-shim is started by the bazaar agent (commands: shim RUN_DIR, shim-exec RUN_DIR ARGV..., --version)"
    );
    std::process::exit(2);
}
