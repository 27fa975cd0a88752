#!/usr/bin/env bash
# The captcharun command: options, exit statuses, arg, stdin, tracebacks,
# signals with a graceful handler, and a clean loop at exit.
. "$(dirname "$0")/lib.bash"
export CAPTCHARUN_CHECK_LEAKS=1

# --help and --version exit 0 and say what they should
"$CAPTCHARUN" --help > "$TMP/help"; expect_eq $? 0 "--help status"
expect_grep "exit status" "$TMP/help" "--help lists exit statuses"
expect_grep "130" "$TMP/help" "--help lists the signal status"
"$CAPTCHARUN" -v > "$TMP/ver"; expect_eq $? 0 "-v status"
expect_grep "^captcharun [0-9]" "$TMP/ver" "version line"

# usage errors: status 2 and a one-line hint
"$CAPTCHARUN" --bogus 2> "$TMP/err"; expect_eq $? 2 "unknown option status"
expect_grep "Try 'captcharun --help'" "$TMP/err" "usage hint"
"$CAPTCHARUN" 2> "$TMP/err"; expect_eq $? 2 "no script status"
"$CAPTCHARUN" -e 2> "$TMP/err"; expect_eq $? 2 "missing -e argument"
"$CAPTCHARUN" --log-level loud -e '' 2> "$TMP/err"; expect_eq $? 2 "bad log level"

# a script with arguments, a #! line, and the arg table
cat > "$TMP/args.lua" <<'LUA'
#!/usr/bin/env captcharun
local a, b = ...
print(arg[0], arg[1], arg[2], #arg, a, b, arg[-1] ~= nil)
LUA
"$CAPTCHARUN" "$TMP/args.lua" x "y z" > "$TMP/out"; expect_eq $? 0 "script status"
expect_eq "$(cat "$TMP/out")" "$(printf '%s\tx\ty z\t2\tx\ty z\ttrue' "$TMP/args.lua")" "arg table and ..."

# -e runs before the script; several -e run in order
"$CAPTCHARUN" -e 'X = 1' -e 'X = X + 1' -e 'print(X)' > "$TMP/out"; expect_eq "$(cat "$TMP/out")" "2" "-e in order"

# stdin as the script
echo 'print("from stdin", ...)' | "$CAPTCHARUN" - q > "$TMP/out"; expect_eq "$(cat "$TMP/out")" "$(printf 'from stdin\tq')" "stdin script"

# a script error: status 1, message and traceback on stderr
printf 'local function f() error("kaput") end\nf()\n' > "$TMP/err.lua"
"$CAPTCHARUN" "$TMP/err.lua" 2> "$TMP/err"; expect_eq $? 1 "error status"
expect_grep "err.lua:1: kaput" "$TMP/err" "error message"
expect_grep "stack traceback" "$TMP/err" "traceback"
expect_grep "in local 'f'" "$TMP/err" "traceback names the function"

# a missing script is an error, not a crash
"$CAPTCHARUN" "$TMP/nope.lua" 2> "$TMP/err"; expect_eq $? 1 "missing script status"
expect_grep "cannot open" "$TMP/err" "missing script message"

# the main chunk is a task: it sleeps and awaits
"$CAPTCHARUN" -e 'local c = require "captcha"
  local t = c.spawn(function(x) c.sleep(0.01) return x * 2 end, 21)
  c.sleep(0.005) print(t:wait())' > "$TMP/out"; expect_eq "$(cat "$TMP/out")" "42" "main task awaits"

# the process waits for every spawned task
"$CAPTCHARUN" -e 'local c = require "captcha"
  for i = 1, 3 do c.spawn(function() c.sleep(0.01 * i) print("t" .. i) end) end' > "$TMP/out"
expect_eq "$(tr '\n' ' ' < "$TMP/out")" "t1 t2 t3 " "waits for spawned tasks"

# an awaited error is a value; an un-awaited one fails the process with its traceback
"$CAPTCHARUN" -e 'local c = require "captcha"
  local t = c.spawn(function() error("caught") end)
  local ok, err = t:wait() print(ok, err)' > "$TMP/out" 2> "$TMP/err"; expect_eq $? 0 "awaited error status"
expect_grep "caught" "$TMP/out" "awaited error value"
"$CAPTCHARUN" -e 'local c = require "captcha"
  c.spawn(function() c.sleep(0.001) error("orphan") end)' 2> "$TMP/err"; expect_eq $? 1 "un-awaited error status"
expect_grep "never awaited" "$TMP/err" "un-awaited error reported"
expect_grep "orphan" "$TMP/err" "un-awaited error message"
expect_grep "stack traceback" "$TMP/err" "un-awaited error traceback"

# captcha.exit chooses the status and stops pending work
"$CAPTCHARUN" -e 'local c = require "captcha"
  c.spawn(function() c.sleep(5) print("never") end)
  c.sleep(0.001) c.exit(5)' > "$TMP/out"; expect_eq $? 5 "captcha.exit status"
expect_no_grep "never" "$TMP/out" "exit cancels pending tasks"

# JSON log lines
"$CAPTCHARUN" --log-format json -e 'require("captcha").log.info("hello", {n = 1})' 2> "$TMP/err"
cat > "$TMP/readlog.lua" <<'LUA'
local j = require("captcha").json
for line in io.lines(arg[1]) do
  local o = assert(j.decode(line))
  print(o.level, o.msg, o.fields.n, type(o.ts))
end
LUA
"$CAPTCHARUN" "$TMP/readlog.lua" "$TMP/err" > "$TMP/out" 2>&1
expect_eq "$(cat "$TMP/out")" "$(printf 'info\thello\t1\tstring')" "json log line"
# a secret that JSON escapes ('"', '\\') is redacted in JSON lines too
"$CAPTCHARUN" --log-format json -e 'local log = require("captcha").log
  local key = [[k3y"with\slash-SECRETTAIL]]
  log.secret(key) log.info("key " .. key, {key = key})' 2> "$TMP/err"
expect_no_grep "SECRETTAIL" "$TMP/err" "json log redacts escaped secrets"
expect_grep '"fields":{"key":"\*\*\*"}' "$TMP/err" "json log keeps its fields"
"$CAPTCHARUN" --log-level error -e 'require("captcha").log.info("quiet")' 2> "$TMP/err"
expect_no_grep "quiet" "$TMP/err" "log level filters"

# signals: the first SIGINT runs the Lua handler and work drains
cat > "$TMP/drain.lua" <<'LUA'
local captcha = require "captcha"
local stop = false
captcha.on_signal(function(sig) print("handler " .. sig) io.stdout:flush() stop = true end)
print("ready") io.stdout:flush()
while not stop do captcha.sleep(0.01) end
print("drained")
LUA
"$CAPTCHARUN" "$TMP/drain.lua" > "$TMP/out" 2>&1 &
pid=$!
wait_for ready "$TMP/out" && kill -INT $pid
wait $pid; expect_eq $? 0 "graceful drain status"
expect_grep "handler SIGINT" "$TMP/out" "signal handler ran"
expect_grep "drained" "$TMP/out" "work finished after the signal"

# a second signal exits at once with 130 (SIGINT) ...
cat > "$TMP/stuck.lua" <<'LUA'
local captcha = require "captcha"
captcha.on_signal(function(sig) print("handler " .. sig) io.stdout:flush() end)
print("ready") io.stdout:flush()
captcha.sleep(30)
LUA
"$CAPTCHARUN" "$TMP/stuck.lua" > "$TMP/out" 2>&1 &
pid=$!
wait_for ready "$TMP/out" && kill -INT $pid
wait_for handler "$TMP/out" && kill -INT $pid
wait $pid; expect_eq $? 130 "second SIGINT status"
# ... and with no handler, the first SIGTERM exits with 143
"$CAPTCHARUN" -e 'print("ready") io.stdout:flush() require("captcha").sleep(30)' > "$TMP/out" 2>&1 &
pid=$!
wait_for ready "$TMP/out" && kill -TERM $pid
wait $pid; expect_eq $? 143 "SIGTERM without handler status"

# reading a slow pipe waits only the reading task: the others keep running
cat > "$TMP/reader.lua" <<'LUA'
local captcha = require "captcha"
local ticks = 0
local ticker = captcha.spawn(function() while true do captcha.sleep(0.02) ticks = ticks + 1 end end)
local r = assert(captcha.reader(0))
local got = {}
for line in r:lines() do got[#got + 1] = line end
r:close()
ticker:cancel()
print(table.concat(got, ","), ticks >= 5 and "ticked" or ("stalled " .. ticks))
LUA
{ echo one; sleep 0.3; printf 'two\r\nthree'; } | "$CAPTCHARUN" "$TMP/reader.lua" > "$TMP/out"
expect_eq "$(cat "$TMP/out")" "$(printf 'one,two,three\tticked')" "captcha.reader on a slow pipe"
"$CAPTCHARUN" -e 'print(require("captcha").reader(0))' < "$TMP/args.lua" > "$TMP/out"
expect_eq "$(cat "$TMP/out")" "$(printf 'nil\tnot a pipe or a terminal')" "captcha.reader refuses a regular file"
# a line longer than the read-ahead (1 MiB) still arrives: reading must not
# stop while the waiting task has no complete line
cat > "$TMP/longline.lua" <<'LUA'
local captcha = require "captcha"
local r = assert(captcha.reader(0))
local a = r:line()
print(#a, a:match("^a*$") ~= nil, r:line(), r:line())
LUA
{ head -c 2500000 /dev/zero | tr '\0' a; printf '\nend\n'; } |
  timeout 20 "$CAPTCHARUN" "$TMP/longline.lua" > "$TMP/out" 2> "$TMP/err"
expect_eq "$?:$(cat "$TMP/out")" "$(printf '0:2500000\ttrue\tend\tnil')" "captcha.reader: a 2.5 MB line"
# a second reader on a descriptor the loop already reads is refused as a value
mkfifo "$TMP/fifo"
cat > "$TMP/reader2.lua" <<'LUA'
local captcha = require "captcha"
local r = assert(captcha.reader(0))
local first = r:line()                   -- reading has started on fd 0
local ok, r2, err = pcall(captcha.reader, 0)
io.open(arg[1], "w"):close()             -- lets the writer finish
print(first, ok, r2, err)
r:close()
LUA
{ echo one; timeout 20 cat "$TMP/fifo" > /dev/null; } |
  timeout 20 "$CAPTCHARUN" "$TMP/reader2.lua" "$TMP/fifo" > "$TMP/out" 2> "$TMP/err"
expect_eq "$?:$(cat "$TMP/out")" "$(printf '0:one\ttrue\tnil\tfile already exists')" "captcha.reader on a busy descriptor"

# several tasks reading one pipe: every line reaches exactly one of them
cat > "$TMP/readers.lua" <<'LUA'
local captcha = require "captcha"
local r = assert(captcha.reader(0))
local seen, n, tasks = {}, 0, {}
for i = 1, 4 do
  tasks[i] = captcha.spawn(function()
    for line in r:lines() do n = n + 1 seen[line] = (seen[line] or 0) + 1 end
  end)
end
for i = 1, 4 do assert(tasks[i]:wait() == nil) end
local dup = 0
for _, c in pairs(seen) do if c > 1 then dup = dup + 1 end end
print(n, dup)
LUA
{ seq 1 1000; sleep 0.2; seq 1001 2000; } | "$CAPTCHARUN" "$TMP/readers.lua" > "$TMP/out" 2> "$TMP/err"
expect_eq "$(cat "$TMP/out")" "$(printf '2000\t0')" "several readers share one pipe"

# the embedding example: a C program on the public header only
if [ -x "${CR_BUILD:-.}/embed_example" ]; then
  "${CR_BUILD:-.}/embed_example" > "$TMP/out"; expect_eq $? 0 "embed example status"
  expect_eq "$(cat "$TMP/out")" "embedded: 84" "embed example output"
else
  bad "embed_example not built"
fi

# leak check: a handle nobody closed fails the run (the check can fail)
"$CAPTCHARUN" -e 'local c = require "captcha"; c.sleep(0.001)' 2> "$TMP/err"; expect_eq $? 0 "clean loop at exit"
expect_no_grep "leak" "$TMP/err" "no leak reported"

finish
