#!/usr/bin/env captcharun
--- pipelines/replay.lua: replay a past run's outcomes through an error-budget
-- configuration and print when each hook would have fired. Tune the SLO, the
-- window and the thresholds on history before they page anyone.
--
--   captcharun pipelines/replay.lua results.jsonl --slo 0.95 --window 1h
--   captcharun pipelines/replay.lua results.jsonl --method-slo turnstile=0.98 --method-slo base64=0.90
--
-- Input: the JSONL a pipeline wrote (pipelines/batch.lua --out). Each line with
-- status "solved" or "failed", a method and a "finished" timestamp becomes
-- budget:record(ok, {method = m, at = epoch seconds}), in time order. As in the
-- pipeline, results that cost no API call are not counted: dedup hits
-- (source dedup_cache / dedup_wait, unless --count-dedup) and failures the
-- rate limiter produced (code BUCKET_*). Other lines are skipped.
--
-- Output: one line per hook that would have fired (status changes per key,
-- and burn-rate alerts), then the final report per key. Exit status: 0, or 2
-- on usage errors (bad options, unreadable file).
local captcha = require "captcha"
local argparse = require "argparse"
local json = captcha.json

local NAME = "captcharun pipelines/replay.lua"

local cli = require "captcha.cli"
local usage_error = cli.usage_error("replay.lua", NAME)
local fraction = cli.fraction

local function parse_args(args)
  local p = argparse(NAME, "Replay a run's results through an error budget and show when its hooks would fire.")
  p:epilog([[
Counts lines with status solved/failed, a method and a "finished" time (as
pipelines/batch.lua writes them); dedup hits and rate-limiter failures cost no
API call and are skipped like the pipeline skips them.

Exit status: 0 done, 2 usage error.]])
  p:argument("results", "Results file (JSONL) of an earlier run, or - for standard input.")
  p:option("--slo", "Success-rate target.", "0.95")
  p:option("--method-slo", "Per-type target, METHOD=TARGET (repeatable).", nil):count("*")
  p:option("--window", "Rolling window (e.g. 24h, 30m, 90s).", "24h")
  p:option("--warning", "Warning below this fraction of the budget left.", "0.50")
  p:option("--critical", "Critical below this fraction left.", "0.10")
  p:option("--min-events", "No status change below this many events.", "0")
  p:option("--burn", "Burn-rate alert threshold (the seed FAQ's 2.0; 0 turns it off).", "2.0")
  p:option("--consumed", "Alert when more than this fraction of the budget is consumed (FAQ: 0.80).", "0.80")
  p:flag("--count-dedup", "Also count dedup hits as successes.")
  p:flag("--json", "One JSON object per hook line and for the final reports.")
  local ok, res = p:pparse(args)
  if not ok then return usage_error(res) end
  for _, k in ipairs({ "slo", "warning", "critical", "consumed" }) do
    local v = fraction(res[k])
    if not v then return usage_error(("--%s: a number in [0, 1] expected, got '%s'"):format(k:gsub("_", "-"), res[k])) end
    res[k] = v
  end
  res.burn = tonumber(res.burn)
  if not res.burn or res.burn < 0 then return usage_error("--burn: a number >= 0 expected") end
  res.min_events = cli.count(res.min_events)
  if not res.min_events then return usage_error("--min-events: an integer >= 0 expected") end
  local targets, bad = cli.method_targets(res.method_slo)
  if not targets then return usage_error("--method-slo: METHOD=TARGET expected, got '" .. bad .. "'") end
  res.targets = targets
  return res
end

-- "2026-11-30T10:40:16.671Z" -> epoch seconds (UTC; os.time would read local time).
local function days_from_civil(y, m, d)
  y = m <= 2 and y - 1 or y
  local era = (y >= 0 and y or y - 399) // 400
  local yoe = y - era * 400
  local doy = (153 * (m + (m > 2 and -3 or 9)) + 2) // 5 + d - 1
  local doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
  return era * 146097 + doe - 719468
end

local function parse_iso(s)
  if type(s) ~= "string" then return nil end
  local y, mo, d, h, mi, sec, frac, tz = s:match("^(%d%d%d%d)%-(%d%d)%-(%d%d)T(%d%d):(%d%d):(%d%d)(%.?%d*)(.*)$")
  if not y then return nil end
  local t = days_from_civil(tonumber(y), tonumber(mo), tonumber(d)) * 86400
    + tonumber(h) * 3600 + tonumber(mi) * 60 + tonumber(sec) + (tonumber("0" .. frac) or 0)
  if tz == "Z" or tz == "" then return t end
  local sign, oh, om = tz:match("^([+-])(%d%d):?(%d%d)$")
  if not sign then return nil end
  local off = tonumber(oh) * 3600 + tonumber(om) * 60
  return sign == "+" and t - off or t + off
end

local function iso(t)
  return os.date("!%Y-%m-%dT%H:%M:%S", math.floor(t)) .. (".%03dZ"):format(math.floor((t % 1) * 1000))
end

-- Every countable outcome, in time order (stable on line order for ties).
local function read_events(path, count_dedup)
  local fh, err
  if path == "-" then fh = io.stdin else fh, err = io.open(path, "r") end
  if not fh then return nil, "cannot read " .. path .. ": " .. tostring(err) end
  local events, skipped, n = {}, 0, 0
  for line in fh:lines() do
    n = n + 1
    local r = json.decode(line)
    local t = type(r) == "table" and parse_iso(r.finished)
    local counted = t and type(r.method) == "string" and (r.status == "solved" or r.status == "failed")
    if counted and not count_dedup and type(r.source) == "string" and r.source:match("^dedup") then counted = false end
    if counted and type(r.code) == "string" and r.code:match("^BUCKET_") then counted = false end
    if counted then events[#events + 1] = { t = t, ok = r.status == "solved", method = r.method, line = n }
    else skipped = skipped + 1 end
  end
  if fh ~= io.stdin then fh:close() end
  table.sort(events, function(a, b)
    if a.t ~= b.t then return a.t < b.t end
    return a.line < b.line
  end)
  return events, skipped
end

local function pct(v) return v and ("%.1f%%"):format(v) or "-" end

local function main(args)
  local o = parse_args(args)
  if not o then return 2 end
  local events, skipped = read_events(o.results, o.count_dedup)
  if not events then
    usage_error(skipped)
    return 2
  end
  local alerts = {}
  if o.burn > 0 or o.consumed > 0 then
    alerts[1] = { name = "faq", burn = o.burn > 0 and o.burn or nil, consumed = o.consumed > 0 and o.consumed or nil }
  end
  local budget = captcha.budget{ target = o.slo, window = o.window, warning = o.warning, critical = o.critical,
    min_events = o.min_events > 0 and o.min_events or nil, targets = o.targets, alerts = alerts }

  -- Hooks run as tasks after record() returns; every report carries the
  -- replay time it was made at (`at`), so the order is rebuilt from it.
  local fired, seq = {}, 0
  local function add(entry)
    seq = seq + 1
    entry.seq = seq
    fired[#fired + 1] = entry
  end
  budget:on("change", function(report, key, previous)
    add({ at = report.at, key = key, hook = report.status, from = previous, report = report })
  end)
  budget:on("burn", function(alert, report, key)
    add({ at = report.at, key = key, hook = "burn", alert = alert.name, firing = alert.firing, report = report })
  end)

  -- Between two events the window slides: step through the gap (at most one
  -- window of it; after that everything has left) so a recovery shows at the
  -- time it happens, not at the next event. Steps of window/1000 (the
  -- budget's resolution): at most 1000 reports per gap, O(keys) each.
  local window = budget:report().window
  local step = window / 1000
  local function slide(from, to)
    local t, stop = from + step, math.min(to, from + window + step)
    while t < stop do
      budget:report({ at = t })
      t = t + step
    end
  end

  local outside, last = 0, nil
  for _, e in ipairs(events) do
    if last and e.t - last > step then slide(last, e.t) end
    last = e.t
    local ok, err = budget:record(e.ok, { method = e.method, at = e.t })
    if ok == false then outside = outside + 1
    elseif ok == nil then io.stderr:write("replay.lua: line ", e.line, ": ", tostring(err), "\n") end
  end
  captcha.yield() -- let the hook tasks run
  table.sort(fired, function(a, b)
    if a.at ~= b.at then return a.at < b.at end
    return a.seq < b.seq
  end)

  local counts = {}
  for _, f in ipairs(fired) do
    local r = f.report
    local name = f.hook == "burn" and ("burn:" .. f.alert .. (f.firing and "" or ":cleared")) or f.hook
    counts[name] = (counts[name] or 0) + 1
    if o.json then
      print(json.encode({ at = iso(f.at), key = f.key, hook = f.hook, from = f.from, alert = f.alert,
        firing = f.firing, failures = r.failures, total_events = r.total_events,
        budget_remaining_pct = r.budget_remaining_pct, burn_rate = r.burn_rate }))
    elseif f.hook == "burn" then
      print(("%s  %-14s burn alert '%s' %s  (burn rate %.2f, %s left, %d/%d failed)"):format(iso(f.at), f.key,
        f.alert, f.firing and "fires" or "clears", r.burn_rate, pct(r.budget_remaining_pct), r.failures, r.total_events))
    else
      print(("%s  %-14s %-9s (was %s)  %s left, burn rate %.2f, %d/%d failed"):format(iso(f.at), f.key, f.hook,
        f.from or "?", pct(r.budget_remaining_pct), r.burn_rate, r.failures, r.total_events))
    end
  end

  local finals = {}
  for _, k in ipairs(budget:keys()) do finals[#finals + 1] = budget:report(k) end
  budget:close()
  if o.json then
    for _, r in ipairs(finals) do r.at = nil end
    print(json.encode({ final = finals, events = #events, skipped = skipped, outside_window = outside, hooks = counts }))
    return 0
  end
  local names = {}
  for k, v in pairs(counts) do names[#names + 1] = ("%s x%d"):format(k, v) end
  table.sort(names)
  print(("replayed %d outcomes (%d lines skipped%s) from %s to %s; hooks: %s"):format(#events, skipped,
    outside > 0 and (", %d outside the window"):format(outside) or "",
    #events > 0 and iso(events[1].t) or "-", #events > 0 and iso(events[#events].t) or "-",
    #names > 0 and table.concat(names, ", ") or "none"))
  for _, r in ipairs(finals) do
    print(("final %-14s %-9s SLO %s  %d/%d failed  %s left  burn rate %.2f"):format(r.key, r.status,
      tostring(r.slo_target), r.failures, r.total_events, pct(r.budget_remaining_pct), r.burn_rate))
  end
  return 0
end

captcha.exit(main({ ... }))
