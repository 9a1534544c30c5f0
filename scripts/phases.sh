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
