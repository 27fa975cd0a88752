#!/usr/bin/env bash
# The ready pipelines' command lines: --help tells the truth, bad input is a
# usage error (status 2, one line and a hint), never a traceback.
. "$(dirname "$0")/lib.bash"
BATCH="$CR_SRC/pipelines/batch.lua"
unset CAPTCHAAI_API_KEY

"$CAPTCHARUN" "$BATCH" --help > "$TMP/out"; expect_eq $? 0 "batch --help status"
for word in --slo --rate --burst --concurrency --window --state --provider --base-url --first-poll \
            --poll-interval --resume --mock "Exit status" "authorized"; do
  expect_grep "$word" "$TMP/out" "batch --help mentions $word"
done

usage() { # usage NAME EXPECTED-TEXT ARGS...
  local name=$1 text=$2; shift 2
  "$CAPTCHARUN" "$BATCH" "$@" > "$TMP/out" 2> "$TMP/err"; expect_eq $? 2 "$name: status"
  expect_grep "$text" "$TMP/err" "$name: message"
  expect_grep "Try 'captcharun pipelines/batch.lua --help'" "$TMP/err" "$name: hint"
  expect_no_grep "stack traceback" "$TMP/err" "$name: no traceback"
}
usage "no input" "missing argument 'input'"
usage "no key" "no API key" tasks.jsonl
usage "bad number" "malformed argument" tasks.jsonl --rate fast
usage "slo out of range" "a number in \[0, 1\] expected" tasks.jsonl --slo 1.5 --mock
usage "zero rate" "must be > 0" tasks.jsonl --rate 0 --mock
usage "unknown provider" "provider" tasks.jsonl --provider acme

# a missing input file is an error of the run, not of usage, and says which
"$CAPTCHARUN" "$BATCH" "$TMP/missing.jsonl" --mock --quiet > "$TMP/out" 2> "$TMP/err"; st=$?
expect_eq "$st" 1 "missing input: status"
expect_grep "cannot open input" "$TMP/err" "missing input: message"

"$CAPTCHARUN" "$CR_SRC/pipelines/gate.lua" --help > "$TMP/out"; expect_eq $? 0 "gate --help status"
"$CAPTCHARUN" "$CR_SRC/pipelines/gate.lua" 2> "$TMP/err"; expect_eq $? 2 "gate without --state"
"$CAPTCHARUN" "$CR_SRC/pipelines/replay.lua" --help > "$TMP/out"; expect_eq $? 0 "replay --help status"
finish
