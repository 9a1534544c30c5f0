#!/usr/bin/env bash
# Regenerates the standing comparison of docs/SIMULATION.md: every scenario of this folder,
# the stale-view and many-exchange sweeps, and the theory checks. Tables go to
# docs/sim/*.md, plots and CSV to docs/sim/. Deterministic: same seeds, same files.
#   crates/sim/scenarios/standing.sh            (uses `cargo run --example sim`)
#   SIM="bazaar sim" crates/sim/scenarios/standing.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=docs/sim
mkdir -p "$out"
if [ -z "${SIM:-}" ]; then
  cargo build --release -q -p bazaar-sim --example sim
  SIM=target/release/examples/sim
fi
for s in steady tight churn deploys fill failures heavy-tail; do
  $SIM --scenario "crates/sim/scenarios/$s.toml" --out "$out" --markdown > "$out/$s.txt"
done

# Stale views: the churn scenario with views 0 s to 30 s old.
pol=market-d2,market-d3,random,least-loaded-stale,ideal
{
  for g in 0 1000 5000 30000; do
    echo "### gossip delay ${g} ms"
    $SIM --scenario crates/sim/scenarios/churn.toml --name "stale-$g" --gossip-delay-ms "$g" --policies "$pol" --markdown | sed -n '/^| policy/,$p'
    echo
  done
} > "$out/stale.md"

# Many exchanges: 1 to 256 exchanges placing at once, 20 ms round trips, 2 s old views.
pol=market-d2,market-d3,random,least-loaded-stale
{
  for e in 1 16 256; do
    echo "### ${e} exchanges"
    $SIM --scenario crates/sim/scenarios/churn.toml --name "exchanges-$e" --exchanges "$e" --rtt-ms 20 --gossip-delay-ms 2000 --policies "$pol" --markdown | sed -n '/^| policy/,$p'
    echo
  done
} > "$out/exchanges.md"

$SIM --theory > "$out/theory.txt"
$SIM --theory --full > "$out/theory-full.txt"
