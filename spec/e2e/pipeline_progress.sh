#!/usr/bin/env bash
# The progress line: on a terminal one line redrawn in place (at most 4 times a
# second, never torn by log lines), nothing when stderr is not a terminal or
# with --quiet. `script` gives the run a pseudo-terminal.
. "$(dirname "$0")/lib.bash"
command -v script > /dev/null || { bad "script(1) from util-linux is needed"; finish; exit 1; }
BATCH="$CR_SRC/pipelines/batch.lua"
for i in $(seq 1 300); do
  echo "{\"id\":$i,\"method\":\"turnstile\",\"sitekey\":\"k$((i % 120))\",\"pageurl\":\"https://staging.example/\"}"
done > "$TMP/tasks.jsonl"
RUN="$CAPTCHARUN $BATCH $TMP/tasks.jsonl --mock --mock-latency 0.02 --rate 150 --concurrency 20"

# on a terminal (stdout to a file, stderr to the pty)
start=$(date +%s.%N)
timeout 60 script -qfec "$RUN --out $TMP/out.jsonl" "$TMP/tty.log" > /dev/null 2>&1
expect_eq $? 0 "run on a terminal"
elapsed=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
redraws=$(grep -o $'\r\033\[K[0-9]*/300 done' "$TMP/tty.log" | wc -l)
if [ "$redraws" -ge 2 ]; then ok; else bad "progress redrawn $redraws times"; fi
max=$(awk -v e="$elapsed" 'BEGIN { printf "%d", e * 4 + 3 }')
if [ "$redraws" -le "$max" ]; then ok; else bad "$redraws redraws in ${elapsed}s: more than 4 a second"; fi
expect_grep "300/300 done" "$TMP/tty.log" "final progress line"
expect_grep "solved" "$TMP/tty.log" "progress shows solved"
expect_grep "turnstile" "$TMP/tty.log" "summary on the terminal"
expect_eq "$(wc -l < "$TMP/out.jsonl")" 300 "results complete"

# not a terminal: no progress line, the summary still printed
timeout 60 $RUN --out "$TMP/out2.jsonl" 2> "$TMP/err" > /dev/null
expect_eq $? 0 "run without a terminal"
expect_no_grep $'\033\[K' "$TMP/err" "no progress escapes without a terminal"
expect_grep "total 300" "$TMP/err" "summary without a terminal"

# --quiet on a terminal: neither progress nor summary
timeout 60 script -qfec "$RUN --out $TMP/out3.jsonl --quiet" "$TMP/tty3.log" > /dev/null 2>&1
expect_eq $? 0 "quiet run"
expect_no_grep "done  solved" "$TMP/tty3.log" "no progress with --quiet"
expect_no_grep "total 300" "$TMP/tty3.log" "no summary with --quiet"
finish
