#!/usr/bin/env bash
# Budget hooks end to end, with real captcharun processes:
# - a failure spike (mock process with a scenario) drives the aggregate budget
#   healthy -> warning -> critical -> exhausted and back; the hooks throttle
#   (the submit rate drops, read from the mock's /__stats), pause (no submits
#   while exhausted) and resume;
# - a webhook alert reaches a receiver process with the report, and broken
#   receivers (HTTP 500, a hang, a refused port) do not stall the pipeline.
. "$(dirname "$0")/lib.bash"
export CAPTCHARUN_CHECK_LEAKS=1
FIX="$CR_SRC/spec/e2e/fixtures"

metric() { awk -v k="$1" '$1 == "metric" && $2 == k { print $3 }' "$2"; }
# first_t EVENT FILE [AFTER]: the time of the first EVENT line after time AFTER
first_t() { awk -v e="$1" -v a="${3:--1}" '$1 == "event" && $2 == e { t = substr($3, 3) + 0; if (t > a) { print t; exit } }' "$2"; }
lt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a != "" && b != "" && a + 0 < b + 0) }'; }

# ---- 1. the failure spike
export CAPTCHAAI_API_KEY=e2espike000000000000000000000001
timeout --foreground 60 "$CAPTCHARUN" mock --listen 127.0.0.1:0 --key $CAPTCHAAI_API_KEY --seed 3 \
  --latency 0.005:0.015 --scenario "$FIX/spike_scenario.lua" > "$TMP/mock.out" 2> "$TMP/mock.err" &
MOCK=$!
wait_for "mock listening on" "$TMP/mock.out" || { finish; exit 1; }
export SPIKE_MOCK_URL=$(sed -n 's/^mock listening on //p' "$TMP/mock.out")
timeout 60 "$CAPTCHARUN" "$FIX/budget_spike.lua" > "$TMP/spike.out" 2> "$TMP/spike.err"
expect_eq $? 0 "spike job exit status"
expect_no_grep "budget hook failed" "$TMP/spike.err" "spike hooks ran without errors"
expect_no_grep "deadlock" "$TMP/spike.err" "a paused pipeline waits for the window, it is no deadlock"
sed 's/^/    /' "$TMP/spike.out" | grep -E "^    (event|metric)" > "$TMP/spike.show"

# the hooks fired in the order of the spike, and back to healthy after exhausted
tw=$(first_t warning "$TMP/spike.out"); tc=$(first_t critical "$TMP/spike.out" "$tw")
te=$(first_t exhausted "$TMP/spike.out" "$tc"); th=$(first_t healthy "$TMP/spike.out" "$te")
if lt "$tw" "$tc" && lt "$tc" "$te" && lt "$te" "$th"; then ok
else bad "hook order: warning=$tw critical=$tc exhausted=$te healthy=$th"; cat "$TMP/spike.show" >&2; fi

# throttle: the submit rate between warning and exhausted is well below the
# healthy one (hooks set 50/s -> 25/s -> 10/s)
hr=$(metric healthy_rate "$TMP/spike.out"); tr=$(metric throttled_rate "$TMP/spike.out")
if awk -v h="$hr" -v t="$tr" 'BEGIN { exit !(h > 35 && t > 0 && t < 0.7 * h) }'; then ok
else bad "throttle: healthy rate $hr/s, throttled rate $tr/s"; cat "$TMP/spike.show" >&2; fi
# and between any two hooks the submits respect the rate each hook left in
# place: capacity (2) + rate * dt, plus 3 for tokens taken just before a change
viol=$(awk '$1 == "event" {
  t = substr($3, 3) + 0; n = substr($4, 9) + 0; r = substr($5, 6) + 0
  if (have && n - pn > 2 + pr * (t - pt) + 3) { v++; print "    " $0 " after " pn " at rate " pr > "/dev/stderr" }
  pt = t; pn = n; pr = r; have = 1 } END { print v + 0 }' "$TMP/spike.out")
expect_eq "$viol" 0 "submits between hooks within the throttled bucket bound"

# pause: not one submit while exhausted (a window long), then submits again
ps=$(metric paused_seconds "$TMP/spike.out")
if awk -v s="$ps" 'BEGIN { exit !(s > 1) }'; then ok; else bad "paused for $ps s only"; fi
expect_eq "$(metric paused_submits "$TMP/spike.out")" 0 "no submit while paused"
rs=$(metric resumed_submits "$TMP/spike.out")
if [ "${rs:-0}" -gt 10 ]; then ok; else bad "only $rs submits after the resume"; fi
expect_eq "$(metric final_rate "$TMP/spike.out")" 50 "healthy hook restored the full rate"
expect_eq "$(metric exit_code "$TMP/spike.out")" 0 "pipeline ended healthy"
# the mock really switched: failures came from its scenario, then stopped
expect_grep "mock scenario step" "$TMP/mock.err" "mock ran the scenario"
unsolv=$(curl -s --max-time 5 "$SPIKE_MOCK_URL/__stats" | jq '.answers.ERROR_CAPTCHA_UNSOLVABLE // 0')
if [ "$unsolv" -gt 10 ]; then ok; else bad "only $unsolv unsolvable answers in the spike"; fi
kill -INT $MOCK
wait $MOCK; expect_eq $? 0 "mock process stops cleanly on SIGINT"

# ---- 2. webhook alerts: a receiver process, and receivers that fail
timeout --foreground 30 "$CAPTCHARUN" "$FIX/receiver.lua" "$TMP/received" > "$TMP/recv.out" 2> "$TMP/recv.err" &
RECV=$!
wait_for "receiver listening on" "$TMP/recv.out" || { finish; exit 1; }
export RECEIVER_URL=$(sed -n 's/^receiver listening on //p' "$TMP/recv.out")
timeout 30 "$CAPTCHARUN" "$FIX/webhook_job.lua" > "$TMP/wh.out" 2> "$TMP/wh.err"
expect_eq $? 3 "webhook job ends with the exhausted status"
expect_no_grep "budget hook failed" "$TMP/wh.err" "webhook hook ran without errors"
expect_eq "$(metric tasks_done "$TMP/wh.out")" 300 "every task finished"
da=$(metric done_after_alert "$TMP/wh.out")
if [ "${da:-0}" -gt 250 ]; then ok; else bad "only $da tasks finished after the alerts were sent"; fi
expect_eq "$(metric slow_alert_pending_at_end "$TMP/wh.out")" 1 "pipeline did not wait for the stuck receiver"
rsec=$(metric run_seconds "$TMP/wh.out")
if awk -v s="$rsec" 'BEGIN { exit !(s < 2.5) }'; then ok; else bad "pipeline took $rsec s with failing receivers"; fi
expect_eq "$(metric alert_ok "$TMP/wh.out")" ok "alert to the good receiver succeeded"
expect_grep "alert_fail error:HTTP_500" "$TMP/wh.out" "HTTP 500 receiver: an error value"
expect_grep "alert_refused error:" "$TMP/wh.out" "refused receiver: an error value"
expect_grep "alert_slow error:" "$TMP/wh.out" "stuck receiver: an error value after its timeout"
expect_eq "$(grep -c '^FAIL$' "$TMP/received")" 2 "failing receiver retried (2 attempts)"
# the payload: Slack-compatible text plus the report's fields
grep '^{' "$TMP/received" > "$TMP/payloads"
expect_eq "$(wc -l < "$TMP/payloads")" 1 "one alert delivered to the good receiver"
expect_eq "$(jq -r .report.status "$TMP/payloads")" exhausted "report status"
expect_eq "$(jq -r .report.key "$TMP/payloads")" '*' "report key"
expect_eq "$(jq -r .report.slo_target "$TMP/payloads")" 0.95 "report SLO"
expect_eq "$(jq -r '.report.failures >= 1 and .report.total_events >= .report.failures' "$TMP/payloads")" true "report counts"
expect_eq "$(jq -r '.report.budget_remaining_pct' "$TMP/payloads")" 0 "report remaining"
expect_eq "$(jq -r '.text | test("exhausted")' "$TMP/payloads")" true "Slack text names the status"
kill -INT $RECV
wait $RECV; expect_eq $? 0 "receiver stops cleanly"
finish
