//! `bazaar sim` without the rest of bazaar: `cargo run --release -p bazaar-sim --example sim -- --help`.

use clap::Parser;

#[derive(Parser, Debug)]
#[command(name = "sim", about = "bazaar's placement simulator")]
struct Cli {
    #[command(flatten)]
    args: bazaar_sim::cli::SimArgs,
}

fn main() -> anyhow::Result<()> {
    bazaar_sim::cli::run(Cli::parse().args)
}
