#!/usr/bin/env bash
# pipelines/batch.lua at scale against a mock process with injected faults:
# 10,000 tasks with duplicates and malformed lines give exactly one valid JSON
# line per task; SIGINT mid-run drains (exit 130, valid JSONL); a rerun with
# --resume finishes the rest without paying again for finished ids.
. "$(dirname "$0")/lib.bash"
export CAPTCHARUN_CHECK_LEAKS=1
FIX="$CR_SRC/spec/e2e/fixtures"
BATCH="$CR_SRC/pipelines/batch.lua"
KEY=e2ebatch000000000000000000000001
export CAPTCHAAI_API_KEY=$KEY

# wait_lines N FILE: until FILE has at least N lines (bounded: 30 s).
wait_lines() {
  for _ in $(seq 1 3000); do
    [ -f "$2" ] && [ "$(wc -l < "$2")" -ge "$1" ] && return 0
    sleep 0.01
  done
  bad "timed out waiting for $1 lines in $2"
  return 1
}
# val NAME FILE: the value of a "name value" line.
val() { awk -v k="$1" '$1 == k { print $2 }' "$2"; }
# mock_stat FIELD: a top-level number from the mock's /__stats.
mock_stat() { curl -s --max-time 5 "$URL/__stats" | jq -r ".$1"; }

# ---- 10,000 tasks: every 10th line repeats an earlier task's content (the
# dedup cache pays once), every 500th is broken JSON, every 777th has no
# method. Turnstile and reCAPTCHA mixed.
N=10000
awk -v n=$N 'BEGIN {
  for (i = 1; i <= n; i++) {
    if (i % 500 == 0) { print "{broken json"; continue }
    if (i % 777 == 0) { printf "{\"id\":\"nm%d\",\"sitekey\":\"s\"}\n", i; continue }
    k = (i % 10 == 0) ? int(i / 20) : i
    if (k % 3 == 0)
      printf "{\"id\":\"t%d\",\"method\":\"userrecaptcha\",\"googlekey\":\"gk%d\",\"pageurl\":\"https://staging.example/p%d\"}\n", i, k, k % 7
    else
      printf "{\"id\":\"t%d\",\"method\":\"turnstile\",\"sitekey\":\"sk%d\",\"pageurl\":\"https://staging.example/p%d\"}\n", i, k, k % 7
  }
}' > "$TMP/tasks.jsonl"
MALFORMED=$(( N / 500 + N / 777 - N / (500 * 777) ))

# ---- the mock, its own process: tiny latency, 2 % unsolvable, 1 % transport
# faults (each costs the client a backoff of up to 5 s: HTTP_5XX and garbage
# advise 5 s, so higher rates only make the tail longer)
timeout --foreground 120 "$CAPTCHARUN" mock --listen 127.0.0.1:0 --key $KEY --seed 5 --latency 0.001:0.004 \
  --unsolvable-rate 0.02 --fault http500=0.004 --fault garbage=0.004 --fault reset=0.002 \
  > "$TMP/mock.out" 2> "$TMP/mock.err" &
MOCK=$!
wait_for "mock listening on" "$TMP/mock.out" || { finish; exit 1; }
URL=$(sed -n 's/^mock listening on //p' "$TMP/mock.out")

# SLO 0.5: the 2 % failures never exhaust the budget (the default policy would
# pause), so this test is about completeness, not hooks.
COMMON=(--base-url "$URL" --first-poll 0.002 --poll-interval 0.002 --timeout 20 --slo 0.5
        --concurrency 200 --burst 200 --drain-timeout 3)

# ---- run 1: interrupted mid-run, once a good share of lines is written
timeout --foreground 60 "$CAPTCHARUN" "$BATCH" "$TMP/tasks.jsonl" --out "$TMP/results.jsonl" --rate 2000 "${COMMON[@]}" \
  2> "$TMP/run1.err" &
RUN=$!
wait_lines 3000 "$TMP/results.jsonl" && kill -INT $RUN
wait $RUN; expect_eq $? 130 "interrupted run exits 130"
expect_grep "draining" "$TMP/run1.err" "the drain is logged"
cp "$TMP/results.jsonl" "$TMP/run1.jsonl"
"$CAPTCHARUN" "$FIX/check_results.lua" "$TMP/tasks.jsonl" "$TMP/run1.jsonl" > "$TMP/check1"
expect_eq "$(val input_tasks "$TMP/check1")" "$N" "every input line is a task"
expect_eq "$(val lines "$TMP/check1")" "$N" "interrupted run: one line per task"
expect_eq "$(val bad_json "$TMP/check1")" 0 "interrupted run: valid JSONL"
expect_eq "$(val dup_ids "$TMP/check1")" 0 "interrupted run: no id twice"
expect_eq "$(val missing_ids "$TMP/check1")" 0 "interrupted run: no id missing"
expect_eq "$(val extra_ids "$TMP/check1")" 0 "interrupted run: no unknown id"
expect_eq "$(tail -c1 "$TMP/run1.jsonl" | od -An -c | tr -d ' ')" '\n' "interrupted run: last line complete"
i1=$(val status_interrupted "$TMP/check1")
if [ "${i1:-0}" -gt 0 ]; then ok; else bad "the SIGINT came after the end: no interrupted lines"; fi
s1=$(val status_solved "$TMP/check1")
if [ "${s1:-0}" -ge 2000 ]; then ok; else bad "too little solved before the SIGINT: $s1"; fi

# ---- run 2: --resume finishes the rest without solving finished ids again
tasks_before=$(mock_stat tasks)
timeout 60 "$CAPTCHARUN" "$BATCH" "$TMP/tasks.jsonl" --out "$TMP/results.jsonl" --resume --rate 5000 \
  "${COMMON[@]}" --summary-json "$TMP/sum2.json" 2> "$TMP/run2.err"
expect_eq $? 0 "resumed run exits 0"
tasks_after=$(mock_stat tasks)
"$CAPTCHARUN" "$FIX/check_results.lua" "$TMP/tasks.jsonl" "$TMP/results.jsonl" "$TMP/run1.jsonl" > "$TMP/check2"
expect_eq "$(val lines "$TMP/check2")" "$N" "finished: one line per task"
expect_eq "$(val bad_json "$TMP/check2")" 0 "finished: valid JSONL"
expect_eq "$(val dup_ids "$TMP/check2")" 0 "finished: no id twice"
expect_eq "$(val missing_ids "$TMP/check2")" 0 "finished: no id missing"
expect_eq "$(val status_interrupted "$TMP/check2")" 0 "finished: nothing left interrupted"
expect_eq "$(val status_skipped "$TMP/check2")" 0 "finished: nothing skipped"
expect_eq "$(val status_invalid "$TMP/check2")" "$MALFORMED" "malformed lines are invalid results"
expect_eq "$(val changed_terminal "$TMP/check2")" 0 "finished lines of run 1 kept as they were"
f2=$(val status_failed "$TMP/check2")
if [ "${f2:-0}" -gt 0 ]; then ok; else bad "the mock's unsolvable answers produced no failed line"; fi
expect_eq "$(jq -r .resumed "$TMP/sum2.json")" "$(val earlier_terminal "$TMP/check2")" "summary counts resumed ids"

# no re-solve: the rerun's accepted submits fit in the ids that still needed work
paid=$((tasks_after - tasks_before))
bound=$(val resolve_bound "$TMP/check2")
if [ "$paid" -gt 0 ] && [ "$paid" -le "$bound" ]; then ok
else bad "resumed run paid $paid submits, expected 1..$bound (ids not finished in run 1)"; fi

# the faults really happened and the duplicates really were deduplicated
faults=$(curl -s --max-time 5 "$URL/__stats" | jq '[.faults[]?] | add // 0')
if [ "$faults" -gt 50 ]; then ok; else bad "only $faults transport faults injected"; fi
dedup=$(grep -c '"source":"dedup_' "$TMP/results.jsonl")
if [ "$dedup" -gt 0 ]; then ok; else bad "no dedup hit among the duplicates"; fi
total_paid=$(mock_stat tasks)
valid=$((N - MALFORMED))
if [ "$total_paid" -lt "$valid" ]; then ok; else bad "paid $total_paid submits for $valid valid tasks: no saving"; fi

kill -INT $MOCK
wait $MOCK; expect_eq $? 0 "mock stops on SIGINT"
finish
