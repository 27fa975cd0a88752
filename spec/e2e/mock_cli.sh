#!/usr/bin/env bash
# `captcharun mock` end to end: start it on an ephemeral port, talk to it with
# the curl CLI, check the wire answers, /__stats, a scenario file, that the key
# never shows in its output, and that SIGINT stops it with status 0.
set -euo pipefail
: "${CAPTCHARUN:?path of the captcharun binary}"
command -v curl >/dev/null || { echo "mock_cli.sh: needs the curl CLI (Debian package curl)" >&2; exit 1; }

KEY=canaryKEY0123456789abcdef0123456
TMP=$(mktemp -d)
PID=
cleanup() { [ -n "$PID" ] && kill -KILL "$PID" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; echo "--- stderr:" >&2; cat "$TMP/err" >&2 || true; exit 1; }

# Bad options: usage error, status 2.
set +e
"$CAPTCHARUN" mock --fault nonsense >/dev/null 2>"$TMP/usage"
rc=$?
set -e
[ "$rc" = 2 ] || fail "bad option exit status $rc, expected 2"

cat >"$TMP/scenario.lua" <<'EOF'
return { { at = 0, set = { unsolvable_rate = { geetest = 1 } }, note = "geetest down" } }
EOF

"$CAPTCHARUN" mock --listen 127.0.0.1:0 --key "$KEY" --seed 5 \
  --latency turnstile=1000 --latency 0 --no-slot-rate 0 --scenario "$TMP/scenario.lua" \
  >"$TMP/out" 2>"$TMP/err" &
PID=$!
for _ in $(seq 200); do
  grep -q '^mock listening on ' "$TMP/out" && break
  kill -0 "$PID" 2>/dev/null || fail "mock exited early"
  sleep 0.05
done
URL=$(sed -n 's/^mock listening on //p' "$TMP/out")
[[ "$URL" =~ ^http://127\.0\.0\.1:[0-9]+$ ]] || fail "no URL printed: $(cat "$TMP/out")"

c() { curl -s --max-time 10 "$@"; }
expect() {  # what got want
  [ "$2" = "$3" ] || fail "$1: got '$2', want '$3'"
}
like() {
  [[ "$2" =~ $3 ]] || fail "$1: got '$2', want /$3/"
}

like "submit" "$(c "$URL/in.php?key=$KEY&method=userrecaptcha&googlekey=g&pageurl=https://a")" '^OK\|[0-9]+$'
ID=$(c "$URL/in.php?key=$KEY&method=userrecaptcha&googlekey=g&pageurl=https://a" | cut -d'|' -f2)
like "poll" "$(c "$URL/res.php?key=$KEY&action=get&id=$ID")" '^OK\|03AG'
TID=$(c -d "key=$KEY&method=turnstile&sitekey=s&pageurl=https://a&json=1" "$URL/in.php" | sed 's/.*"request":"\([0-9]*\)".*/\1/')
like "turnstile id" "$TID" '^[0-9]+$'
expect "not ready" "$(c "$URL/res.php?key=$KEY&action=get&id=$TID")" "CAPCHA_NOT_READY"
GID=$(c -F key="$KEY" -F method=geetest -F gt=g -F challenge=c -F pageurl=https://a "$URL/in.php" | cut -d'|' -f2)
expect "scenario: geetest unsolvable" "$(c "$URL/res.php?key=$KEY&action=get&id=$GID")" "ERROR_CAPTCHA_UNSOLVABLE"
expect "wrong key" "$(c "$URL/in.php?key=nope&method=turnstile")" "ERROR_WRONG_USER_KEY"
expect "unknown id" "$(c "$URL/res.php?key=$KEY&action=get&id=1")" "ERROR_WRONG_CAPTCHA_ID"
expect "json error" "$(c -H 'Content-Type: application/json' -d "{\"key\":\"$KEY\",\"method\":\"turnstile\",\"sitekey\":\"s\",\"json\":1}" "$URL/in.php")" \
  '{"status":0,"request":"ERROR_PAGEURL","error_text":"ERROR_PAGEURL"}'

STATS=$(c "$URL/__stats")
like "stats submits" "$STATS" '"submits":6[,}]'
like "stats polls" "$STATS" '"polls":4[,}]'
like "stats solving" "$STATS" '"solving":1[,}]'
like "stats unsolvable" "$STATS" '"ERROR_CAPTCHA_UNSOLVABLE":1[,}]'
like "stats max window" "$STATS" '"max_submits_per_second":[1-6][,}]'

kill -INT "$PID"
set +e
wait "$PID"
rc=$?
set -e
PID=
[ "$rc" = 0 ] || fail "exit status after SIGINT: $rc"
if grep -q "$KEY" "$TMP/out" "$TMP/err"; then fail "the key leaked into the mock's output"; fi
echo "ok: mock CLI"
