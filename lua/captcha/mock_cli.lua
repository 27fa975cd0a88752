--- `captcharun mock [options]`: run the mock provider until SIGINT/SIGTERM.
--
--   captcharun mock --listen 127.0.0.1:8080 --key test --latency 0.5:2 \
--     --unsolvable-rate 0.05 --no-slot-rate turnstile=0.1 --threads 50 \
--     --fault http500=0.01 --fault reset=0.005 --scenario scenario.lua
--
-- Prints "mock listening on http://127.0.0.1:PORT" (its first line of stdout,
-- flushed, so scripts can read the port of --listen 127.0.0.1:0), then serves.
local captcha = require "captcha"
local argparse = require "argparse"

local M = {}

-- "0.5" -> 0.5 ; "0.5:2" -> {0.5, 2}
local function number_or_range(s)
  local lo, hi = s:match("^([%d%.eE%-]+):([%d%.eE%-]+)$")
  if lo then
    lo, hi = tonumber(lo), tonumber(hi)
    if lo and hi and lo <= hi then return { lo, hi } end
    return nil
  end
  return tonumber(s)
end

-- Repeated "value" or "method=value" options -> a number/range or a per-method table.
local function per_method(list, what)
  if not list or #list == 0 then return nil end
  local t, plain = {}, nil
  for _, item in ipairs(list) do
    local m, v = item:match("^([%w_]+)=(.+)$")
    local n = number_or_range(v or item)
    if n == nil then return nil, what .. ": bad value '" .. item .. "'" end
    if m then t[m] = n else plain = n end
  end
  if next(t) == nil then return plain end
  t.default = plain
  return t
end

local function parser()
  local p = argparse("captcharun mock", "A CaptchaAI/2captcha-compatible mock provider on 127.0.0.1.")
  p:option("--listen", "HOST:PORT to listen on (port 0: any free port).", "127.0.0.1:0")
  p:option("--key", "The API key to accept (default: any non-empty key).")
  p:option("--provider", "Profile: captchaai or 2captcha.", "captchaai"):choices{ "captchaai", "2captcha" }
  p:option("--seed", "Seed of the random generator.", "1"):convert(tonumber)
  p:option("--latency", "Solve latency in seconds, S or LO:HI, optionally METHOD=...", nil):count("*")
  p:option("--unsolvable-rate", "Share of ERROR_CAPTCHA_UNSOLVABLE, optionally METHOD=RATE."):count("*")
  p:option("--no-slot-rate", "Share of ERROR_NO_SLOT_AVAILABLE on submit, optionally METHOD=RATE."):count("*")
  p:option("--threads", "Concurrent unsolved tasks; more are refused."):convert(tonumber)
  p:option("--submit-rate", "in.php calls per sliding second before ERROR_TOO_MUCH_REQUESTS."):convert(tonumber)
  p:option("--balance", "Account balance.", "100"):convert(tonumber)
  p:option("--price", "Price per solved task (2captcha profile).", "0"):convert(tonumber)
  p:flag("--zero-balance", "Answer every submit with ERROR_ZERO_BALANCE.")
  p:option("--fault", "Transport fault rate KIND=RATE (http500, garbage, reset, hang, drip)."):count("*")
  p:option("--scenario", "A Lua file returning {{at = s, set = {knobs}}, ...}.")
  p:flag("--integer-ids", "Return task ids as JSON integers (as CaptchaAI may).")
  p:flag("--no-image-checks", "Accept any image bytes.")
  return p
end

local function options(a)
  local o = { listen = a.listen, key = a.key, provider = a.provider, seed = a.seed,
              threads = a.threads, submit_rate = a.submit_rate, balance = a.balance,
              price = a.price, zero_balance = a.zero_balance or nil, scenario = a.scenario,
              integer_ids = a.integer_ids or nil, check_images = not a.no_image_checks }
  local err
  o.latency, err = per_method(a.latency, "--latency")
  if err then return nil, err end
  o.unsolvable_rate, err = per_method(a.unsolvable_rate, "--unsolvable-rate")
  if err then return nil, err end
  o.no_slot_rate, err = per_method(a.no_slot_rate, "--no-slot-rate")
  if err then return nil, err end
  o.faults = {}
  for _, f in ipairs(a.fault or {}) do
    local k, v = f:match("^(%w+)=([%d%.eE%-]+)$")
    if not k or not tonumber(v) then return nil, "--fault: KIND=RATE expected, got '" .. f .. "'" end
    o.faults[k] = tonumber(v)
  end
  return o
end

--- main(args) -> exit code. Returns at once; the server runs until a signal.
function M.main(args)
  local p = parser()
  local ok, a = p:pparse(args)
  if not ok then
    io.stderr:write("captcharun mock: ", a, "\n", p:get_usage(), "\n")
    return 2
  end
  local o, err = options(a)
  if not o then
    io.stderr:write("captcharun mock: ", err, "\n")
    return 2
  end
  local okm, mock, merr = pcall(require("captcha.mock").new, o)
  if not okm or not mock then
    io.stderr:write("captcharun mock: ", tostring(okm and merr or mock), "\n")
    return 1
  end
  io.stdout:write("mock listening on ", mock.url, "\n")
  io.stdout:flush()
  captcha.on_signal(function(sig)
    captcha.log.info("mock stopping", { signal = sig })
    mock:close()
  end)
  return 0
end

return M
