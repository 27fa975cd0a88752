#!/usr/bin/env bash
# Error-budget figures: record throughput of the C core, and report time at
# 1k / 100k / 1M events in a 24 h window next to the seed's scan-every-event
# approach (bench/peers/budget_scan.py) on the same events, with the ratio.
#
#   bench/budget.sh [records]        (default 100,000,000 records)
#
# Not a test: it prints figures. Builds the core with -O2 into a temp dir.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

${CC:-cc} -std=c11 -O2 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -I"$src/runtime" \
  "$src/bench/budget_bench.c" "$src/runtime/budget.c" -lm -o "$tmp/budget_bench"

echo "== C core (captcharun runtime/budget.c) =="
"$tmp/budget_bench" "${1:-100000000}" | tee "$tmp/c.txt"
echo
echo "== seed approach: scan every event per report (python3 bench/peers/budget_scan.py) =="
python3 "$src/bench/peers/budget_scan.py" 1000 100000 1000000 | tee "$tmp/py.txt"
echo
echo "== report time, same events (24 h window, 5 % failures) =="
awk '
  function field(line, name,   i, n, kv) {
    n = split(line, kv, " ")
    for (i = 1; i <= n; i++) if (index(kv[i], name "=") == 1) return substr(kv[i], length(name) + 2)
    return ""
  }
  FNR == 1 { file++ }
  /^report / { ev = field($0, "events"); ns[file, ev] = field($0, "ns_per_report"); evs[ev] = 1 }
  END {
    printf "%-10s %16s %18s %12s\n", "events", "C ns/report", "python ns/report", "ratio"
    for (ev in evs) order[++k] = ev + 0
    for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (order[j] < order[i]) { t = order[i]; order[i] = order[j]; order[j] = t }
    for (i = 1; i <= k; i++) {
      ev = order[i]
      printf "%-10d %16.1f %18.1f %11.0fx\n", ev, ns[1, ev], ns[2, ev], ns[2, ev] / ns[1, ev]
    }
  }' "$tmp/c.txt" "$tmp/py.txt"
echo
cat <<'NOTE'
(the "check" lines are the same report at t = window from both: at exactly 5 %
 failures the seed's float arithmetic says critical, the exact core exhausted)
NOTE
