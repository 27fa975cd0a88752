#!/usr/bin/env captcharun
--- pipelines/gate.lua: the deployment gate (seeds/error-budget.txt): read an
-- error budget's state file, print its report, and exit 3 when the budget is
-- spent, so a CI job can freeze releases until the window recovers.
--
--   captcharun pipelines/gate.lua --state budget.json                 # any key exhausted -> 3
--   captcharun pipelines/gate.lua --state budget.json --method turnstile --fail-on critical
--
-- The state file is the one `captcha.budget{state = ...}` and
-- `pipelines/batch.lua --state` write. The gate never modifies it: it loads a
-- private copy. Events older than the window are gone, as in the pipeline, so
-- an exhausted budget opens the gate again once the window has slid past the
-- failures. The file records the budget's configuration (target, per-type
-- targets, warning, critical, min_events, expected_events, window) and the gate
-- judges with it by default; --slo, --method-slo, --warning, --critical,
-- --min-events and --window override it. Files written before the
-- configuration was stored fall back to the pipeline's defaults.
--
-- Exit status: 0 the gate is open, 3 a checked budget is at or past --fail-on,
-- 2 usage errors (bad options, unreadable or foreign state file, unknown
-- --method, a --window that matches nothing in the file).
local captcha = require "captcha"
local argparse = require "argparse"
local json = captcha.json

local NAME = "captcharun pipelines/gate.lua"
local RANK = { healthy = 0, warning = 1, critical = 2, exhausted = 3 }
local EXIT_OPEN, EXIT_CLOSED, EXIT_USAGE = 0, 3, 2

local cli = require "captcha.cli"
local usage_error = cli.usage_error("gate.lua", NAME)
local fraction = cli.fraction

-- "24h", "30m", "90s", "500ms", "1h30m" or seconds, as the budget reads them.
local UNITS = { ms = 0.001, s = 1, m = 60, h = 3600, d = 86400, w = 604800 }
local function duration(s)
  if tonumber(s) then return tonumber(s) > 0 and tonumber(s) or nil end
  local total, rest = 0, s
  while rest ~= "" do
    local n, tail = rest:match("^(%d+%.?%d*)(.*)$")
    local u = tail and (tail:match("^ms") or tail:match("^[smhdw]"))
    if not u then return nil end
    total, rest = total + tonumber(n) * UNITS[u], tail:sub(#u + 1)
  end
  return total > 0 and total or nil
end

local function parse_args(args)
  local p = argparse(NAME, "Deployment gate: exit 3 when an error budget is spent.")
  p:epilog([[
Checks every key in the state file (the aggregate "*" and each CAPTCHA type),
or only --method. Prints one line per key and a verdict.

Configuration: by default the budget is judged exactly as the run that wrote
the state file configured it: its SLO target, per-type targets, warning and
critical thresholds, min_events, expected_events and window are stored in the
file. Each of --slo, --method-slo (per type), --warning, --critical,
--min-events and --window overrides the stored value. A file written before the
configuration was stored uses 0.95, 0.50, 0.10, 0 and its longest window.

Exit status: 0 open, 3 closed (a checked budget is at or past --fail-on),
2 usage error (bad option, unreadable state file, unknown --method).]])
  p:option("--state", "Budget state file (captcha.budget{state=...}, batch.lua --state).")
  p:option("--method", "Check only this key (e.g. turnstile; \"*\" is the aggregate).")
  p:option("--fail-on", "Close the gate at this status or worse.", "exhausted")
   :choices({ "warning", "critical", "exhausted" })
  p:option("--slo", "Success-rate target (default: stored in the state file, else 0.95).")
  p:option("--method-slo", "Per-type target, METHOD=TARGET (repeatable; overrides the stored one).", nil)
   :count("*")
  p:option("--window", "Rolling window (default: the one stored in the state file).")
  p:option("--warning", "Warning below this fraction of the budget left (default: stored, else 0.50).")
  p:option("--critical", "Critical below this fraction left (default: stored, else 0.10).")
  p:option("--min-events", "No judgement below this many events (default: stored, else 0).")
  p:flag("--json", "Print the reports as one JSON object instead of a table.")
  local ok, res = p:pparse(args)
  if not ok then return usage_error(res) end
  if not res.state then return usage_error("option '--state' is required") end
  for _, k in ipairs({ "slo", "warning", "critical" }) do
    if res[k] ~= nil then
      local v = fraction(res[k])
      if not v then return usage_error(("--%s: a number in [0, 1] expected, got '%s'"):format(k, res[k])) end
      res[k] = v
    end
  end
  if res.min_events ~= nil then
    res.min_events = cli.count(res.min_events)
    if not res.min_events then return usage_error("--min-events: an integer >= 0 expected") end
  end
  local targets, bad = cli.method_targets(res.method_slo)
  if not targets then return usage_error("--method-slo: METHOD=TARGET expected, got '" .. bad .. "'") end
  res.targets = targets
  if res.window then
    res.window_s = duration(res.window)
    if not res.window_s then return usage_error("--window: a duration like 24h, 30m or 90s expected") end
  end
  return res
end

local function count(v) return math.type(v) == "integer" and v >= 0 or (type(v) == "number" and v >= 0 and v == math.floor(v)) end

-- The configuration stored by the budget (absent in older files: {}), checked
-- so that a damaged file is a usage error, not a crash in captcha.budget.
local function stored_config(path, c)
  if c == nil then return {} end
  local function bad(field) return nil, ("%s: bad stored configuration field '%s'"):format(path, field) end
  if type(c) ~= "table" then return bad("config") end
  for _, k in ipairs({ "target", "warning", "critical" }) do
    if c[k] ~= nil and not (type(c[k]) == "number" and fraction(c[k])) then return bad(k) end
  end
  if c.min_events ~= nil and not count(c.min_events) then return bad("min_events") end
  if c.window ~= nil and not (type(c.window) == "number" and c.window > 0) then return bad("window") end
  for _, k in ipairs({ "targets", "expected_events" }) do
    if c[k] ~= nil and type(c[k]) ~= "table" then return bad(k) end
    for m, v in pairs(c[k] or {}) do
      local okv = k == "targets" and type(v) == "number" and fraction(v) or k == "expected_events" and count(v)
      if type(m) ~= "string" or not okv then return bad(k .. "." .. tostring(m)) end
    end
  end
  return c
end

-- The state file as text, the windows it stores (seconds -> true) and its
-- stored configuration.
local function read_state(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, "cannot read the state file: " .. err end
  local text = f:read("a")
  f:close()
  local doc = json.decode(text)
  if type(doc) ~= "table" or type(doc.clock) ~= "string" or type(doc.buckets) ~= "table" then
    return nil, path .. ": not a budget state file"
  end
  local windows = {}
  for _, row in ipairs(doc.buckets) do
    if type(row) == "table" and type(row[2]) == "number" then windows[row[2]] = true end
  end
  local config, err = stored_config(path, doc.config)
  if not config then return nil, err end
  return text, windows, config
end

local function copy_to_temp(text)
  local path = os.tmpname()
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
  return path
end

local function fmt_pct(v) return v and ("%.1f%%"):format(v) or "-" end

local function print_table(reports)
  print(("%-16s %-10s %8s %8s %8s %10s %6s"):format("key", "status", "SLO", "events", "failures", "remaining", "burn"))
  for _, r in ipairs(reports) do
    print(("%-16s %-10s %8s %8d %8d %10s %6.2f"):format(r.key, r.status, tostring(r.slo_target),
      r.total_events, r.failures, fmt_pct(r.budget_remaining_pct), r.burn_rate or 0))
  end
end

local function main(args)
  local o = parse_args(args)
  if not o then return EXIT_USAGE end
  local text, windows, config = read_state(o.state)
  if not text then
    usage_error(windows)
    return EXIT_USAGE
  end
  -- flags override the stored configuration, which overrides the defaults
  local slo = o.slo or config.target or 0.95
  local warning, critical = o.warning or config.warning or 0.50, o.critical or config.critical or 0.10
  local min_events = o.min_events or config.min_events or 0
  local targets = {}
  for m, v in pairs(config.targets or {}) do targets[m] = v end
  for m, v in pairs(o.targets) do targets[m] = v end
  local expected = next(config.expected_events or {}) and config.expected_events or nil

  -- the budget's window must be one the file stores, or nothing is imported
  local stored = {}
  for w in pairs(windows) do stored[#stored + 1] = w end
  table.sort(stored)
  local window = o.window_s or config.window or stored[#stored] or 86400
  if #stored > 0 and not windows[window] then
    local list = {}
    for i, w in ipairs(stored) do list[i] = ("%gs"):format(w) end
    usage_error(("--window %s matches no window in %s (it has %s)"):format(o.window or ("%gs"):format(window),
      o.state, table.concat(list, ", ")))
    return EXIT_USAGE
  end

  local copy = copy_to_temp(text)
  local budget = captcha.budget{ target = slo, window = window, warning = warning, critical = critical,
    min_events = min_events > 0 and min_events or nil, targets = targets, expected_events = expected,
    state = copy }
  local keys = budget:keys()
  if o.method then
    local known = false
    for _, k in ipairs(keys) do known = known or k == o.method end
    if not known then
      budget:close()
      os.remove(copy)
      usage_error(("no events for method '%s' in %s (keys: %s)"):format(o.method, o.state, table.concat(keys, ", ")))
      return EXIT_USAGE
    end
    keys = { o.method }
  end

  local reports, worst = {}, nil
  for _, k in ipairs(keys) do
    local r = budget:report(k)
    r.at = nil -- the budget's clock, not a wall time
    reports[#reports + 1] = r
    if not worst or RANK[r.status] > RANK[worst.status] then worst = r end
  end
  budget:close()
  os.remove(copy)

  local closed = worst and RANK[worst.status] >= RANK[o.fail_on]
  if o.json then
    print(json.encode({ gate = closed and "closed" or "open", fail_on = o.fail_on, window = window,
                        checked_at = os.date("!%Y-%m-%dT%H:%M:%SZ"), reports = reports }))
  else
    print_table(reports)
    if closed then
      local over = {}
      for _, r in ipairs(reports) do
        if RANK[r.status] >= RANK[o.fail_on] then
          over[#over + 1] = ("'%s' is %s (%s left, burn rate %.2f)"):format(r.key, r.status,
            fmt_pct(r.budget_remaining_pct), r.burn_rate)
        end
      end
      print(("gate: CLOSED (fail-on %s): budget %s"):format(o.fail_on, table.concat(over, "; ")))
    else
      print(("gate: open (worst: %s; fail-on %s)"):format(worst and worst.status or "no events", o.fail_on))
    end
  end
  return closed and EXIT_CLOSED or EXIT_OPEN
end

captcha.exit(main({ ... }))
