#!/usr/bin/env bash
# Sustained requests/s of the mock provider on one core.
#
#   bench/mock_bench.sh [path/to/captcharun] [seconds]
#
# The mock runs pinned to CPU 0 (taskset); wrk (Debian package `wrk`) runs on
# the other CPUs with 1 thread and 64 keep-alive connections (no pipelining:
# one request in flight per connection, as curl sends them) for a bounded
# time per run (default 5 s). Three loads:
#
#   polls    res.php?action=get of one solved Turnstile task (json=1)
#   submits  in.php, Turnstile, json=1
#   mix      1 submit : 4 polls over four methods, polls of recent tasks with a
#            solve latency of 5-60 ms, so both CAPCHA_NOT_READY and answers
#            (bench/mock_load.lua)
#
# Per load it prints what wrk achieved, the mock's CPU (utime + stime from
# /proc, % of one core), the mock's requests per CPU-second (its capacity on
# one core) and the CPU wrk and everything else on the machine used meanwhile.
# Target (issue 3): >= 20,000 requests/s per mock core for every load, so the
# mock never bounds a client benchmark.
#
# Reading the figures: when the mock is near 100 % CPU, "achieved" is its
# sustained rate. When it is not, something else bounded the run -- wrk's core
# (on a 2-CPU machine wrk and the kernel's loopback work share CPU 1) or
# other processes -- and the capacity is the figure to read; it is, if
# anything, low, since an idle-ish event loop gets fewer requests per wake.
set -euo pipefail
CAPTCHARUN=${1:-${CAPTCHARUN:-build/captcharun}}
SECS=${2:-5}
HERE=$(cd "$(dirname "$0")" && pwd)
command -v wrk >/dev/null || { echo "mock_bench: needs wrk (apt-get install wrk)" >&2; exit 2; }
command -v taskset >/dev/null || { echo "mock_bench: needs taskset (util-linux)" >&2; exit 2; }
command -v curl >/dev/null || { echo "mock_bench: needs curl" >&2; exit 2; }
NCPU=$(nproc)
LOADCPUS=$([ "$NCPU" -gt 1 ] && echo "1-$((NCPU - 1))" || echo 0)
KEY=benchkey

OUT=$(mktemp)
ERR=$(mktemp)
WOUT=$(mktemp)
finish() {
  kill -TERM "$PID" 2>/dev/null && wait "$PID" 2>/dev/null || true
  grep -v ' info ' "$ERR" >&2 || true  # warnings, errors, sanitizer reports
  rm -f "$OUT" "$ERR" "$WOUT"
}
trap finish EXIT
taskset -c 0 "$CAPTCHARUN" mock --listen 127.0.0.1:0 --key "$KEY" >"$OUT" 2>"$ERR" &
PID=$!
for _ in $(seq 100); do grep -q '^mock listening on ' "$OUT" && break; sleep 0.05; done
URL=$(sed -n 's/^mock listening on //p' "$OUT")
[ -n "$URL" ] || { echo "mock_bench: the mock did not start" >&2; exit 1; }

submit_id() { curl -s "$URL/in.php?key=$KEY&method=turnstile&sitekey=s&pageurl=http://x" | cut -d'|' -f2; }
ID=$(submit_id)

TCK=$(getconf CLK_TCK)
mock_ticks() { awk '{print $14 + $15}' "/proc/$PID/stat"; }
busy_ticks() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8}' /proc/stat; }  # user nice system irq softirq

printf "mock provider on CPU 0, wrk -t1 -c64 on CPU %s, %s s per load (%s)\n" "$LOADCPUS" "$SECS" "$URL"
printf "%-8s %10s %10s %14s %9s %8s %8s\n" load "achieved" "mock CPU" "req/mock-CPU-s" "us/req" "wrk CPU" "others"
FAIL=0
run() {  # name wrk-args...
  local name=$1 a b ba bb out wcpu
  shift
  a=$(mock_ticks) ba=$(busy_ticks)
  wcpu=$( { TIMEFORMAT='%U %S'; time taskset -c "$LOADCPUS" wrk -t1 -c64 -d"${SECS}s" "$@" >"$WOUT" 2>&1; } 2>&1 )
  b=$(mock_ticks) bb=$(busy_ticks)
  out=$(cat "$WOUT")
  grep -q '^Requests/sec:' <<<"$out" || { echo "mock_bench: wrk failed: $out" >&2; exit 1; }
  if grep -q 'Non-2xx\|Socket errors' <<<"$out"; then echo "mock_bench: $name: $(grep 'Non-2xx\|Socket errors' <<<"$out")" >&2; FAIL=1; fi
  awk -v n="$name" -v out="$out" -v t=$((b - a)) -v busy=$((bb - ba)) -v tck="$TCK" -v secs="$SECS" -v w="$wcpu" 'BEGIN {
    match(out, /Requests\/sec: *[0-9.]+/); rps = substr(out, RSTART, RLENGTH); sub(/.*: */, "", rps)
    match(out, /[0-9]+ requests in/); reqs = substr(out, RSTART, RLENGTH) + 0
    split(w, wu, " "); wrk = wu[1] + wu[2]
    cpu = t / tck; cap = cpu > 0 ? reqs / cpu : 0
    others = busy / tck - cpu - wrk; if (others < 0) others = 0
    printf "%-8s %8.0f/s %9.0f%% %14.0f %9.1f %7.0f%% %7.0f%%\n", n, rps, 100 * cpu / secs, cap,
           (cap > 0 ? 1e6 / cap : 0), 100 * wrk / secs, 100 * others / secs
    exit (cap >= 20000 ? 0 : 1) }' || FAIL=1
}
run polls "$URL/res.php?key=$KEY&action=get&id=$ID&json=1"
run submits "$URL/in.php?key=$KEY&method=turnstile&sitekey=s&pageurl=http://x&json=1"

curl -s -d '{"latency":[0.005,0.06]}' "$URL/__set" >/dev/null
NEXT=$(( $(submit_id) + 1 ))
before=$(curl -s "$URL/__stats")
MOCK_KEY=$KEY MOCK_NEXT_ID=$NEXT run mix -s "$HERE/mock_load.lua" "$URL"
after=$(curl -s "$URL/__stats")
# What the mix asked and got, from the mock's own counters.
"$CAPTCHARUN" --log-level off - "$before" "$after" <<'EOF' || true
local json = require("captcha").json
local b, a = json.decode(arg[1]), json.decode(arg[2])
local function d(sect, k) return ((a[sect] or {})[k] or 0) - ((b[sect] or {})[k] or 0) end
local subs, polls = a.submits - b.submits, a.polls - b.polls
local ok, nr = d("poll_answers", "OK"), d("poll_answers", "CAPCHA_NOT_READY")
print(string.format("mix      %d submits (%d OK), %d polls: %.0f%% answered, %.0f%% CAPCHA_NOT_READY, %.0f%% other",
  subs, d("submit_answers", "OK"), polls, 100 * ok / polls, 100 * nr / polls, 100 * (polls - ok - nr) / polls))
EOF

if [ "$FAIL" = 0 ]; then
  echo "target met: every load >= 20,000 requests per mock CPU-second"
else
  echo "target NOT met (or wrk saw errors): see above" >&2
  exit 1
fi
