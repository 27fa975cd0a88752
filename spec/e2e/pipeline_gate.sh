#!/usr/bin/env bash
# pipelines/gate.lua, the deployment gate: exit 3 on an exhausted state file,
# 0 on a healthy one, 2 on usage errors; and pipelines/replay.lua, which shows
# when each hook would have fired on a past run's results.
. "$(dirname "$0")/lib.bash"
export CAPTCHARUN_CHECK_LEAKS=1
FIX="$CR_SRC/spec/e2e/fixtures"
GATE="$CR_SRC/pipelines/gate.lua"
REPLAY="$CR_SRC/pipelines/replay.lua"
BATCH="$CR_SRC/pipelines/batch.lua"
gate() { timeout 30 "$CAPTCHARUN" "$GATE" "$@"; }

for i in $(seq 1 40); do
  echo "{\"id\":$i,\"method\":\"turnstile\",\"sitekey\":\"gate-$i\",\"pageurl\":\"https://staging.example/\"}"
done > "$TMP/tasks.jsonl"

# ---- state files written by the real batch pipeline (in-process mock). 40
# tasks, concurrency 50 and a burst of 100: every task is submitted before the
# first answer, so the all-failing run cannot park anything behind its pause.
MOCKRUN=(--mock --mock-latency 0.01 --rate 1000 --burst 100 --concurrency 50 --window 1h --quiet)
timeout 30 "$CAPTCHARUN" "$BATCH" "$TMP/tasks.jsonl" --out "$TMP/ok.jsonl" --state "$TMP/healthy.json" \
  --mock-unsolvable 0 "${MOCKRUN[@]}" 2> "$TMP/err"
expect_eq $? 0 "healthy batch run exits 0"
timeout 30 "$CAPTCHARUN" "$BATCH" "$TMP/tasks.jsonl" --out "$TMP/bad.jsonl" --state "$TMP/exhausted.json" \
  --mock-unsolvable 1 "${MOCKRUN[@]}" 2> "$TMP/err"
expect_eq $? 3 "all-failing batch run exits 3 (budget exhausted)"

gate --state "$TMP/healthy.json" > "$TMP/out" 2> "$TMP/err"; expect_eq $? 0 "gate open on a healthy budget"
expect_grep "gate: open" "$TMP/out" "gate says open"
expect_grep "^turnstile *healthy" "$TMP/out" "gate prints the per-type report"
md5_before=$(md5sum < "$TMP/exhausted.json")
gate --state "$TMP/exhausted.json" > "$TMP/out" 2> "$TMP/err"; expect_eq $? 3 "gate closed on an exhausted budget"
expect_grep "gate: CLOSED" "$TMP/out" "gate says closed"
expect_grep "^\* *exhausted *0.95 *40 *40 *0.0%" "$TMP/out" "gate prints the report fields"
expect_eq "$(md5sum < "$TMP/exhausted.json")" "$md5_before" "the gate leaves the state file alone"
gate --state "$TMP/exhausted.json" --json > "$TMP/out"; expect_eq $? 3 "--json status"
expect_eq "$(jq -r '.gate + " " + (.reports[0].status) + " " + (.reports[0].failures|tostring)' "$TMP/out")" \
  "closed exhausted 40" "--json report"

# ---- per-type and thresholds, on state files written by a budget directly:
# turnstile 100 ok; image 10 ok + 10 failed (exhausted); recaptcha 100 ok + 4
# failed at 0.95 (5.2 allowed: 23 % left -> warning); hcaptcha 100 + 5 (4.8 %
# left -> critical)
timeout 30 "$CAPTCHARUN" "$FIX/make_state.lua" "$TMP/types.json" 1h \
  turnstile=100:0 base64=10:10 userrecaptcha=100:4 hcaptcha=100:5
expect_eq $? 0 "state file written by captcha.budget{state=...}"
gate --state "$TMP/types.json" > "$TMP/out"; expect_eq $? 3 "any exhausted type closes the gate"
expect_grep "'base64' is exhausted" "$TMP/out" "names the exhausted type"
expect_no_grep "'turnstile' is" "$TMP/out" "does not blame a healthy type"
gate --state "$TMP/types.json" --method turnstile > "$TMP/out"; expect_eq $? 0 "--method turnstile: open"
gate --state "$TMP/types.json" --method base64 > "$TMP/out"; expect_eq $? 3 "--method base64: closed"
gate --state "$TMP/types.json" --method userrecaptcha > "$TMP/out"; expect_eq $? 0 "warning passes by default"
expect_grep "userrecaptcha *warning" "$TMP/out" "warning status shown"
gate --state "$TMP/types.json" --method userrecaptcha --fail-on warning > /dev/null; expect_eq $? 3 "--fail-on warning"
gate --state "$TMP/types.json" --method hcaptcha > "$TMP/out"; expect_eq $? 0 "critical passes by default"
expect_grep "hcaptcha *critical" "$TMP/out" "critical status shown"
gate --state "$TMP/types.json" --method hcaptcha --fail-on critical > /dev/null; expect_eq $? 3 "--fail-on critical"
gate --state "$TMP/types.json" --method base64 --method-slo base64=0.40 > /dev/null
expect_eq $? 0 "--method-slo loosens one type (10 of 20 failed at 0.40)"
gate --state "$TMP/types.json" --method turnstile --slo 1 > /dev/null; expect_eq $? 0 "no failure at SLO 1 is healthy"
gate --state "$TMP/types.json" --window 60m --method turnstile > /dev/null; expect_eq $? 0 "--window in other units"

# ---- the gate judges with the configuration stored in the state file: base64
# at 0.40 (10 of 20 failed: 16.7 % left, critical below 0.17), hcaptcha with
# expected_events = 100 at 0.80 (3 failed of a budget of 20: healthy), the
# aggregate at 0.80 (13 of 133 failed: 51 % left), window 1h among the alert's
# 6h and 30m; each flag overrides its stored value
cat > "$TMP/make_config_state.lua" <<'LUA'
local captcha = require "captcha"
local b = captcha.budget{ target = 0.80, window = "1h", warning = 0.20, critical = 0.17,
  min_events = 5, targets = { base64 = 0.40 }, expected_events = { hcaptcha = 100 },
  alerts = { { name = "page", long = "6h", short = "30m", burn = 14.4 } }, state = arg[1] }
local function rec(m, ok, fail)
  for _ = 1, ok do b:record(true, { method = m }) end
  for _ = 1, fail do b:record(false, { method = m }) end
end
rec("turnstile", 100, 0) rec("base64", 10, 10) rec("hcaptcha", 10, 3)
b:close()
LUA
timeout 30 "$CAPTCHARUN" "$TMP/make_config_state.lua" "$TMP/config.json"; expect_eq $? 0 "state file with a configuration"
gate --state "$TMP/config.json" > "$TMP/out"; expect_eq $? 0 "stored config: open (no key exhausted)"
expect_grep "^base64 *critical *0.4 " "$TMP/out" "stored per-type target and thresholds"
expect_grep "^hcaptcha *healthy" "$TMP/out" "stored expected_events"
expect_grep "^\* *healthy *0.8 *133 *13" "$TMP/out" "stored target"
gate --state "$TMP/config.json" --json > "$TMP/out"
expect_eq "$(jq -r '.window' "$TMP/out")" 3600 "stored window, not the longest in the file"
gate --state "$TMP/config.json" --fail-on critical > /dev/null; expect_eq $? 3 "stored critical threshold closes at critical"
gate --state "$TMP/config.json" --fail-on critical --critical 0.10 > "$TMP/out"; expect_eq $? 0 "--critical overrides"
expect_grep "^base64 *warning" "$TMP/out" "--critical overrides: base64 only warning"
gate --state "$TMP/config.json" --method base64 --method-slo base64=0.95 > /dev/null; expect_eq $? 3 "--method-slo overrides"
gate --state "$TMP/config.json" --slo 0.95 --method "*" > /dev/null; expect_eq $? 3 "--slo overrides"
gate --state "$TMP/config.json" --slo 0.95 --method base64 > /dev/null; expect_eq $? 0 "--slo keeps stored per-type targets"
gate --state "$TMP/config.json" --min-events 1000 --fail-on warning > /dev/null; expect_eq $? 0 "--min-events overrides"
gate --state "$TMP/config.json" --window 6h --json > "$TMP/out"; expect_eq "$(jq -r '.window' "$TMP/out")" 21600 "--window overrides"
jq '.config.target = "high"' "$TMP/config.json" > "$TMP/badconfig.json"
gate --state "$TMP/badconfig.json" > /dev/null 2> "$TMP/err"; expect_eq $? 2 "damaged stored config"
expect_grep "bad stored configuration field 'target'" "$TMP/err" "damaged stored config message"
# a file written before the configuration was stored: the defaults, as before
jq 'del(.config)' "$TMP/config.json" > "$TMP/old.json"
gate --state "$TMP/old.json" --window 1h > "$TMP/out"; expect_eq $? 3 "old file: defaults (0.95)"
expect_grep "^\* *exhausted *0.95 *133 *13" "$TMP/out" "old file: default target"
gate --help > "$TMP/out"; expect_grep "stored in the" "$TMP/out" "--help documents the stored configuration"

# ---- usage errors: status 2 and a one-line hint
gate > /dev/null 2> "$TMP/err"; expect_eq $? 2 "no --state"
expect_grep "Try 'captcharun pipelines/gate.lua --help'" "$TMP/err" "usage hint"
gate --state "$TMP/nope.json" > /dev/null 2> "$TMP/err"; expect_eq $? 2 "missing state file"
expect_grep "cannot read the state file" "$TMP/err" "missing state file message"
gate --state "$TMP/tasks.jsonl" > /dev/null 2> "$TMP/err"; expect_eq $? 2 "not a state file"
gate --state "$TMP/types.json" --fail-on soon > /dev/null 2> "$TMP/err"; expect_eq $? 2 "bad --fail-on"
gate --state "$TMP/types.json" --method geetest > /dev/null 2> "$TMP/err"; expect_eq $? 2 "unknown --method"
expect_grep "keys: " "$TMP/err" "unknown --method lists the keys"
gate --state "$TMP/types.json" --window 24h > /dev/null 2> "$TMP/err"; expect_eq $? 2 "--window not in the file"
gate --state "$TMP/types.json" --slo 2 > /dev/null 2> "$TMP/err"; expect_eq $? 2 "--slo out of range"
gate --help > "$TMP/out"; expect_eq $? 0 "--help"
expect_grep "Exit status" "$TMP/out" "--help documents exit statuses"

# ---- replay: a known history through a 60 s window at SLO 0.9. 60 successes
# 1/s, 10 failures 1/s, then quiet, then 30 image successes at +200 s.
cat > "$TMP/gen.lua" <<'LUA'
local json = require("captcha").json
local T0 = 1796000000   -- 2026-11-30T00:53:20Z
local n = 0
local function line(status, t, method, source)
  n = n + 1
  print(json.encode({ id = n, method = method, status = status, source = source,
                      finished = os.date("!%Y-%m-%dT%H:%M:%S", t) .. ".000Z" }))
end
for i = 0, 59 do line("solved", T0 + i, "turnstile", "api") end
for i = 60, 69 do line("failed", T0 + i, "turnstile") end
print('{"id":"bad","line":3,"status":"invalid","error":"line 3: invalid JSON"}')
line("solved", T0 + 70, "turnstile", "dedup_cache")      -- no API call: not counted
line("failed", T0 + 70, "turnstile")                       -- counted
for i = 200, 229 do line("solved", T0 + i, "base64", "api") end
LUA
"$CAPTCHARUN" "$TMP/gen.lua" > "$TMP/history.jsonl"
timeout 30 "$CAPTCHARUN" "$REPLAY" "$TMP/history.jsonl" --slo 0.9 --window 60s > "$TMP/out" 2> "$TMP/err"
expect_eq $? 0 "replay exits 0"
# 4 failures in 64 events leave 37.5 % (< 50 %): warning at +63 s; 6 in 66 leave
# 0 %: exhausted at +65 s; the last failure leaves the window at +130 s
expect_grep "^2026-11-30T00:54:23.000Z  \* *warning *(was healthy)" "$TMP/out" "replay: warning time"
expect_grep "^2026-11-30T00:54:25.000Z  \* *exhausted (was warning)" "$TMP/out" "replay: exhausted time"
expect_grep "^2026-11-30T00:55:30.[0-9]*Z  \* *healthy *(was exhausted)" "$TMP/out" "replay: recovery as the window slides"
expect_grep "burn alert 'faq' fires" "$TMP/out" "replay: burn alert"
expect_grep "replayed 101 outcomes (2 lines skipped)" "$TMP/out" "replay: counts outcomes, skips dedup hits and invalid"
expect_grep "^final base64 *healthy" "$TMP/out" "replay: final per-type report"
# with a 1 h window nothing slides out: 11 failures in 101 at SLO 0.5 never
# leave healthy, no hook at all
timeout 30 "$CAPTCHARUN" "$REPLAY" "$TMP/history.jsonl" --slo 0.5 --window 1h --burn 0 --consumed 0 > "$TMP/out"
expect_grep "hooks: none" "$TMP/out" "replay: no hook at SLO 0.5"
# per-type SLO: the aggregate at 0.9 is exhausted, turnstile at 0.80 (11 of
# 71 failed: 22.5 % left) only reaches warning
timeout 30 "$CAPTCHARUN" "$REPLAY" "$TMP/history.jsonl" --slo 0.9 --method-slo turnstile=0.80 --window 1h --json > "$TMP/out"
expect_eq "$(jq -r 'select(.key == "*" and .hook == "exhausted") | .key' "$TMP/out")" "*" "replay: aggregate exhausted"
expect_eq "$(jq -r 'select(.key == "turnstile" and .hook != "burn") | .hook' "$TMP/out" | tr '\n' ' ')" "warning " "replay: --method-slo"
expect_eq "$(jq -r 'select(.final) | .events' "$TMP/out")" 101 "replay --json summary"
timeout 30 "$CAPTCHARUN" "$REPLAY" "$TMP/nope.jsonl" > /dev/null 2> "$TMP/err"; expect_eq $? 2 "replay: missing file"
timeout 30 "$CAPTCHARUN" "$REPLAY" "$TMP/history.jsonl" --slo x > /dev/null 2> "$TMP/err"; expect_eq $? 2 "replay: bad --slo"
expect_grep "Try 'captcharun pipelines/replay.lua --help'" "$TMP/err" "replay usage hint"
# replaying the batch run that exhausted the budget agrees with its state file
timeout 30 "$CAPTCHARUN" "$REPLAY" "$TMP/bad.jsonl" --window 1h > "$TMP/out"
expect_grep "^final \* *exhausted .* 40/40 failed" "$TMP/out" "replay of a real run"
finish
