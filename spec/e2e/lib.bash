# Shared helpers for the end-to-end scripts (sourced, not a test itself).
set -u
: "${CAPTCHARUN:?CAPTCHARUN must name the captcharun binary}"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
PASS=0
FAIL=0

ok() { PASS=$((PASS + 1)); }
bad() { FAIL=$((FAIL + 1)); echo "FAIL: $*" >&2; }
expect_eq() { if [ "$1" = "$2" ]; then ok; else bad "$3: expected [$2], got [$1]"; fi; }
expect_grep() { if grep -q -- "$1" "$2"; then ok; else bad "$3: [$1] not in $2:"; sed 's/^/    /' "$2" >&2; fi; }
expect_no_grep() { if grep -q -- "$1" "$2"; then bad "$3: [$1] found in $2"; else ok; fi; }

# wait_for PATTERN FILE: until the file holds the pattern (bounded: 10 s).
wait_for() {
  for _ in $(seq 1 1000); do
    grep -q -- "$1" "$2" 2>/dev/null && return 0
    sleep 0.01
  done
  bad "timed out waiting for [$1] in $2"
  return 1
}

finish() {
  echo "$PASS passed, $FAIL failed"
  [ "$FAIL" -eq 0 ] && [ "$PASS" -gt 0 ]
}
