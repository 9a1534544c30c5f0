# Sourced by .ci/run and scripts/test: `phase NAME CMD...` runs CMD and records how long it
# took in $BAZAAR_PHASES (one "seconds<TAB>name" line each); `phases_report` prints them,
# with the slowest 20 tests of the last nextest run (its JUnit report, .config/nextest.toml).
: "${BAZAAR_PHASES:=target/ci-phases.tsv}"
export BAZAAR_PHASES

phase() {
  local name=$1 start rc=0
  shift
  start=$(date +%s)
  "$@" || rc=$?
  mkdir -p "$(dirname "$BAZAAR_PHASES")"
  printf '%s\t%s\n' "$(($(date +%s) - start))" "$name" >>"$BAZAAR_PHASES"
  return "$rc"
}

phases_report() {
  local junit=${CARGO_TARGET_DIR:-target}/nextest/ci/junit.xml
  echo
  echo "== time per phase (s) =="
  [ -f "$BAZAAR_PHASES" ] && awk -F'\t' '{printf "%6d  %s\n", $1, $2; t += $1} END {printf "%6d  total\n", t}' "$BAZAAR_PHASES"
  if [ -f "$junit" ]; then
    echo "== slowest 20 tests (s) =="
    python3 - "$junit" <<'PY'
import sys, xml.etree.ElementTree as ET
cases = [(float(c.get("time", 0)), f'{c.get("classname")} {c.get("name")}')
         for c in ET.parse(sys.argv[1]).iter("testcase")]
for t, name in sorted(cases, reverse=True)[:20]:
    print(f"{t:8.1f}  {name}")
PY
  fi
}

# The fuzz phase, overlapped with the rest: `fuzz_start` builds the fuzz targets in the
# background under SCHED_IDLE (`chrt --idle`: it gets only the CPU time nothing else wants,
# such as the single-threaded links of the test build and the waits of the tests, so it
# does not slow them), in its own session (its autogroup at nice 19) so that `fuzz_stop`
# can end all of it; then, still there, it runs every target two at a time until each has
# used FUZZ_SECONDS (20 by default) of CPU (`scripts/fuzz --cpu-seconds`: the same work as
# a run of that long on a free core, wherever the CPU comes from). Its log is
# target/fuzz-build.log. `fuzz_wait` waits for it (what is left runs with the machine to
# itself once the tests are done) and prints each target's result.
fuzz_start() {
  local dir
  dir=$(mkdir -p "${CARGO_TARGET_DIR:-target}" && cd "${CARGO_TARGET_DIR:-target}" && pwd)
  export BAZAAR_FUZZ_RC="$dir/fuzz-build.rc" BAZAAR_FUZZ_LOG="$dir/fuzz-build.log"
  rm -f "$BAZAAR_FUZZ_RC"
  setsid chrt --idle 0 bash -c '
    # Its own session is its own autogroup where the kernel groups by session, which
    # would share the CPU with the checks equally whatever the policy: weight it down.
    echo 19 >/proc/self/autogroup 2>/dev/null || true
    start=$(date +%s); rc=0
    ./scripts/fuzz --build-only >"$BAZAAR_FUZZ_LOG" 2>&1 || rc=$?
    echo "fuzz: the targets built in the background in $(($(date +%s) - start)) s" >>"$BAZAAR_FUZZ_LOG"
    if [ "$rc" = 0 ]; then
      start=$(date +%s)
      ./scripts/fuzz --cpu-seconds "${FUZZ_SECONDS:-20}" --jobs 2 >>"$BAZAAR_FUZZ_LOG" 2>&1 || rc=$?
      echo "fuzz: the targets ran in the background in $(($(date +%s) - start)) s" >>"$BAZAAR_FUZZ_LOG"
    fi
    echo "$rc" >"$BAZAAR_FUZZ_RC"' </dev/null &
  export BAZAAR_FUZZ_PID=$!
}

fuzz_wait() {
  [ -n "${BAZAAR_FUZZ_RC:-}" ] || fuzz_start
  while [ ! -f "$BAZAAR_FUZZ_RC" ]; do sleep 1; done
  grep -E '^fuzz: ' "$BAZAAR_FUZZ_LOG" || true
  if [ "$(cat "$BAZAAR_FUZZ_RC")" != 0 ]; then
    tail -n 60 "$BAZAAR_FUZZ_LOG" >&2
    echo "fuzz: building or running the targets failed (log: $BAZAAR_FUZZ_LOG)" >&2
    return 1
  fi
}

# Ends a background fuzz run still going (the run stopped early, or failed before waiting).
fuzz_stop() {
  if [ -n "${BAZAAR_FUZZ_PID:-}" ] && [ ! -f "${BAZAAR_FUZZ_RC:-/nonexistent}" ]; then
    kill -- "-$BAZAAR_FUZZ_PID" 2>/dev/null || true
  fi
}
