#!/usr/bin/env bash
# The API key appears nowhere in a captcharun process's stdout or stderr (debug
# logs included) while the client meets every fault kind, a fatal halt and a
# refused connection; and the job still ends with status 0.
set -euo pipefail
: "${CAPTCHARUN:?path of the captcharun binary}"
KEY=CANARYe2eKEY0123456789abcdefABCD
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

cat >"$TMP/job.lua" <<'LUA'
local captcha = require "captcha"
local KEY = os.getenv("CANARY_KEY")
local mock = assert(captcha.mock{ key = KEY, seed = 3, latency = 0.005, unsolvable_rate = 0.2,
  faults = { http500 = 0.1, garbage = 0.1, reset = 0.1, hang = 0.05, drip = 0.05 }, drip_interval = 0.001 })
local client = captcha.client{ key = KEY, base_url = mock.url, first_poll = 0.005, poll_interval = 0.005,
  request_timeout = 0.1, timeout = 5, max_polls = 100, retry = { base = 0.001, cap = 0.01 } }
client:on("halt", function(info) print("halt hook", info.code, info.reason) end)
local function show(...) print(captcha.json.encode(table.pack(...))) end
local tasks = {}
for i = 1, 40 do
  tasks[i] = captcha.spawn(function()
    return client:solve{ method = "turnstile", sitekey = "0x4AAA", pageurl = "https://example.com/?k=" .. KEY }
  end)
end
for i = 1, 40 do show(tasks[i]:wait()) end
show(client:balance())
captcha.log.info("stats", { stats = captcha.json.encode(client:stats()) })
mock:set{ key = "OTHERotherx0123456789abcdefABCDE", faults = {} }
show(client:solve{ method = "turnstile", sitekey = "0x4AAA", pageurl = "https://example.com/" })
show(client.halted, client:stats())
local refused = captcha.client{ key = KEY, base_url = "http://127.0.0.1:1", max_submit_attempts = 2,
  retry = { base = 0.001, cap = 0.001 } }
show(refused:solve{ method = "turnstile", sitekey = "x", pageurl = "https://example.com/" })
mock:close()
print("done")
LUA

CANARY_KEY="$KEY" "$CAPTCHARUN" --log-level debug "$TMP/job.lua" >"$TMP/out" 2>"$TMP/err"
grep -q '^done$' "$TMP/out" || { echo "FAIL: job did not finish"; cat "$TMP/err"; exit 1; }
grep -q 'halt hook' "$TMP/out" || { echo "FAIL: halt hook did not fire"; exit 1; }
grep -q 'ERROR_KEY_DOES_NOT_EXIST' "$TMP/out" || { echo "FAIL: no fatal error seen"; exit 1; }
grep -q 'HTTP_CONNECT' "$TMP/out" || { echo "FAIL: no connect error seen"; exit 1; }
grep -q 'retry' "$TMP/err" || { echo "FAIL: no debug retry log"; exit 1; }
if grep -q "$KEY" "$TMP/out" "$TMP/err"; then
  echo "FAIL: the key leaked:"; grep -n "$KEY" "$TMP/out" "$TMP/err" | head; exit 1
fi
echo "ok: key absent from $(wc -l <"$TMP/out") stdout and $(wc -l <"$TMP/err") stderr lines"
