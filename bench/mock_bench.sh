#!/usr/bin/env bash
# Sustained requests/s of the mock provider on one core.
#
#   bench/mock_bench.sh [path/to/captcharun] [seconds]
#
# The mock runs pinned to CPU 0 (taskset); wrk (Debian package `wrk`) runs on
# the other CPUs with 1 thread and 64 keep-alive connections for a bounded
# time (default 5 s). Measured: res.php polls (the request a pipeline makes
# most), in.php submits, and /__stats. Target: >= 20,000 requests/s each for
# polls, so the mock never bounds a client benchmark.
set -euo pipefail
CAPTCHARUN=${1:-${CAPTCHARUN:-build/captcharun}}
SECS=${2:-5}
command -v wrk >/dev/null || { echo "mock_bench: needs wrk (apt-get install wrk)" >&2; exit 2; }
command -v taskset >/dev/null || { echo "mock_bench: needs taskset (util-linux)" >&2; exit 2; }
NCPU=$(nproc)
LOADCPUS=$([ "$NCPU" -gt 1 ] && echo "1-$((NCPU - 1))" || echo 0)

OUT=$(mktemp)
trap 'kill -TERM $PID 2>/dev/null || true; rm -f "$OUT"' EXIT
taskset -c 0 "$CAPTCHARUN" mock --listen 127.0.0.1:0 --key benchkey >"$OUT" &
PID=$!
for _ in $(seq 100); do grep -q '^mock listening on ' "$OUT" && break; sleep 0.05; done
URL=$(sed -n 's/^mock listening on //p' "$OUT")
[ -n "$URL" ] || { echo "mock_bench: the mock did not start" >&2; exit 1; }

ID=$(curl -s "$URL/in.php?key=benchkey&method=turnstile&sitekey=s&pageurl=http://x" | cut -d'|' -f2)

TCK=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$PID/stat"; }

# Two figures: what wrk achieved, and the mock's capacity on its one core
# (requests per CPU-second of the mock process). On a small machine wrk itself
# saturates before the mock does (measured: the bare C server idles at 35 %
# CPU while wrk tops out near 27,000 requests/s on a 2-CPU box), so the
# capacity is the figure that says whether the mock could bound a benchmark.
run() {  # name url
  local a b out rps reqs
  a=$(cpu_ticks)
  out=$(taskset -c "$LOADCPUS" wrk -t1 -c64 -d"${SECS}s" "$2")
  b=$(cpu_ticks)
  rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
  reqs=$(awk '/requests in/ {print $1}' <<<"$out")
  awk -v n="$1" -v rps="$rps" -v reqs="$reqs" -v t=$((b - a)) -v tck="$TCK" -v secs="$SECS" 'BEGIN {
    cpu = t / tck; cap = cpu > 0 ? reqs / cpu : 0
    printf "%-8s achieved %7.0f req/s; mock CPU %4.0f%% of one core; capacity %7.0f req/s per core (%.1f us/request)\n",
           n, rps, 100 * cpu / secs, cap, (cap > 0 ? 1e6 / cap : 0) }'
}
run "res.php" "$URL/res.php?key=benchkey&action=get&id=$ID&json=1"
run "in.php" "$URL/in.php?key=benchkey&method=turnstile&sitekey=s&pageurl=http://x&json=1"
run "__stats" "$URL/__stats"
