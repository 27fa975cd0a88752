#!/usr/bin/env bash
# Tasks from a pipe: read without blocking the loop, and a SIGINT drains and
# exits even while the producer keeps the pipe open.
. "$(dirname "$0")/lib.bash"
BATCH="$CR_SRC/pipelines/batch.lua"
mkfifo "$TMP/fifo"
exec 3<> "$TMP/fifo"   # held open by this script: the pipe never ends by itself
for i in $(seq 1 50); do
  echo "{\"id\":$i,\"method\":\"turnstile\",\"sitekey\":\"k$i\",\"pageurl\":\"https://staging.example/\"}" >&3
done
timeout --foreground 30 "$CAPTCHARUN" "$BATCH" - --mock --mock-latency 0.01 --rate 500 --quiet \
  --out "$TMP/out.jsonl" < "$TMP/fifo" 2> "$TMP/err" &
pid=$!
wait_for '"id":50' "$TMP/out.jsonl"
# every task that arrived is done; the run waits for more input, not stuck
expect_eq "$(wc -l < "$TMP/out.jsonl")" 50 "lines for the tasks sent so far"
echo '{"id":51,"method":"turnstile","sitekey":"k51","pageurl":"https://staging.example/"}' >&3
wait_for '"id":51' "$TMP/out.jsonl"
kill -INT $pid
wait $pid; expect_eq $? 130 "SIGINT with the pipe still open"
exec 3>&-
expect_eq "$(wc -l < "$TMP/out.jsonl")" 51 "one line per task received"
echo 'for l in io.lines(arg[1]) do assert(require("captcha").json.decode(l)) end' > "$TMP/check.lua"
"$CAPTCHARUN" "$TMP/check.lua" "$TMP/out.jsonl" 2> "$TMP/err2"
expect_eq $? 0 "valid JSONL"
finish
