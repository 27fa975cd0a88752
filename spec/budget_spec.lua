-- captcha.budget: the seed's formulas and status rules, hook transitions,
-- per-type keys, burn alerts, explicit timestamps and persistence. Most cases
-- replay explicit timestamps, so they are exact and need no real time; one case
-- runs the monotonic clock to see the timer recover a budget with no events.
local captcha = require "captcha"

-- The seed's report (seeds/error-budget.txt) computed from counts, in floats.
local function seed_report(target, successes, failures)
  local total = successes + failures
  local budget = total > 0 and total * (1 - target) or 0
  local remaining = math.max(0, budget - failures)
  local fraction = budget <= 0 and (failures == 0 and 1.0 or 0.0) or math.max(0, remaining / budget)
  local expected = total * (1 - target)
  return {
    current_rate = total > 0 and successes / total or 1.0,
    total_events = total, successes = successes, failures = failures,
    budget_total = budget, budget_remaining = remaining,
    budget_remaining_pct = fraction * 100,
    burn_rate = (total > 0 and expected > 0) and failures / expected or 0.0,
  }
end

local function record_n(b, n, ok, opts)
  for _ = 1, n do assert(b:record(ok, opts)) end
end

-- Collect status changes as "key:previous->status" and burn alerts as
-- "key:name+" (firing) / "key:name-" (cleared), in the order the hooks ran.
local function watch(b)
  local log, burns = {}, {}
  b:on("change", function(r, key, prev) log[#log + 1] = key .. ":" .. prev .. "->" .. r.status end)
  b:on("burn", function(alert, r, key)
    burns[#burns + 1] = key .. ":" .. alert.name .. (alert.firing and "+" or "-")
    assert.are.equal(key, r.key)
  end)
  return log, burns
end

describe("captcha.budget", function()
  it("validates its arguments, naming them", function()
    assert.error_matches(function() captcha.budget() end, "table expected")
    assert.error_matches(function() captcha.budget{target = 1.5} end, "target")
    assert.error_matches(function() captcha.budget{window = "soon"} end, "window")
    assert.error_matches(function() captcha.budget{window = 0} end, "window")
    assert.error_matches(function() captcha.budget{warning = "half"} end, "warning")
    assert.error_matches(function() captcha.budget{min_events = 1.5} end, "min_events")
    assert.error_matches(function() captcha.budget{targets = {turnstile = 2}} end, "turnstile")
    assert.error_matches(function() captcha.budget{alerts = {{name = "x", long = "1h", burn = 2}}} end, "short")
    assert.error_matches(function() captcha.budget{alerts = {{name = "x"}}} end, "burn")
    local b = captcha.budget{}
    assert.error_matches(function() b:record("yes") end, "boolean expected")
    assert.error_matches(function() b:record(true, 42) end, "table or string")
    assert.error_matches(function() b:record(true, {method = 1}) end, "method")
    assert.error_matches(function() b:on("sometimes", print) end, "invalid option")
    assert.error_matches(function() b:on("warning", 1) end, "function expected")
    assert.error_matches(function() b.report(nil) end, "captcha.budget")
    b:close()
    b:close() -- idempotent
    assert.error_matches(function() b:record(true) end, "closed budget")
    assert.matches("closed", tostring(b))
  end)

  it("parses windows: \"24h\", \"30m\", \"90s\", \"1h30m\" and seconds", function()
    for spec, seconds in pairs{["24h"] = 86400, ["30m"] = 1800, ["90s"] = 90, ["1h30m"] = 5400,
                               ["500ms"] = 0.5, ["7d"] = 604800, [60] = 60} do
      local b = captcha.budget{window = spec}
      assert.are.equal(seconds, b:report().window)
      b:close()
    end
  end)

  it("reports the seed's fields with the seed's formulas", function()
    local b = captcha.budget{target = 0.95, window = "1h"}
    local cases = {{97, 3}, {9600, 400}, {50, 0}, {1, 1}, {123, 7}}
    local t = 0
    for _, c in ipairs(cases) do
      b:close()
      b = captcha.budget{target = 0.95, window = "1h"}
      t = t + 1
      record_n(b, c[1], true, {at = t})
      record_n(b, c[2], false, {at = t})
      local got, want = b:report{at = t}, seed_report(0.95, c[1], c[2])
      for k, v in pairs(want) do
        assert.is_true(math.abs(got[k] - v) < 1e-9, ("%s: %s vs the seed's %s"):format(k, got[k], v))
      end
      assert.are.equal(0.95, got.slo_target)
      assert.are.equal("*", got.key)
      assert.are.equal(3600, got.window)
    end
    b:close()
    -- 97 ok, 3 failed: 2 of 5 failures left at 3 per hour
    b = captcha.budget{target = 0.95, window = "1h"}
    record_n(b, 97, true, {at = 0})
    record_n(b, 3, false, {at = 0})
    local r = b:report()
    assert.are.equal("warning", r.status)
    assert.is_true(math.abs(r.time_to_exhaustion - 2400) < 1e-6)
    b:close()
  end)

  it("decides thresholds exactly: 19 + 1 at 0.95 is exhausted, 50 % left is healthy", function()
    local b = captcha.budget{target = 0.95}
    record_n(b, 19, true, {at = 0})
    assert(b:record(false, {at = 0}))
    local r = b:report()
    assert.are.equal("exhausted", r.status) -- the seed's float arithmetic says critical
    assert.are.equal(0, r.budget_remaining_pct)
    b:close()
    b = captcha.budget{target = 0.95}
    record_n(b, 39, true, {at = 0})
    assert(b:record(false, {at = 0}))
    r = b:report()
    assert.are.equal(50, r.budget_remaining_pct)
    assert.are.equal("healthy", r.status)
    b:close()
  end)

  it("fires each transition once, down to exhausted and back up as the window slides", function()
    -- critical = 0.2 so that failures leaving one by one pass through every state
    local b = captcha.budget{target = 0.95, window = 100, critical = 0.2}
    local log = watch(b)
    local status_hooks = {}
    for _, s in ipairs{"healthy", "warning", "critical", "exhausted"} do
      b:on(s, function(r, key) status_hooks[#status_hooks + 1] = s .. "/" .. r.status .. "/" .. key end)
    end
    captcha.run(function()
      record_n(b, 100, true, {at = 0})
      -- failure k at t = k: warning at 3 (41.7 % left), critical at 5 (4.8 %), exhausted at 6
      for k = 1, 10 do assert(b:record(false, {at = k})) end
      -- 200 events, 10 failures: exactly no budget left (the seed's floats: critical)
      record_n(b, 90, true, {at = 20})
      assert.are.equal(0, b:report().budget_remaining)
      b:report{at = 100}   -- the events at 0 still count (t >= now - window)
      b:report{at = 100.1} -- the 100 successes left: 10 of 100 failed, exhausted
      -- failure k leaves after t = 100 + k: 4 left is critical, 3 warning, 2 healthy
      for k = 1, 10 do b:report{at = 100 + k + 0.05} end
    end)
    assert.are.same({"*:healthy->warning", "*:warning->critical", "*:critical->exhausted",
                     "*:exhausted->critical", "*:critical->warning", "*:warning->healthy"}, log)
    assert.are.same({"warning/warning/*", "critical/critical/*", "exhausted/exhausted/*",
                     "critical/critical/*", "warning/warning/*", "healthy/healthy/*"}, status_hooks)
    b:close()
  end)

  it("recovers on its own timer with no new events (monotonic clock)", function()
    local b = captcha.budget{target = 0.95, window = "300ms"}
    local healthy_at
    b:on("healthy", function(r) healthy_at = captcha.now() assert.are.equal(0, r.total_events) end)
    local exhausted = false
    b:on("exhausted", function() exhausted = true end)
    captcha.run(function()
      local start = captcha.now()
      assert(b:record(false))
      -- wait for the hook (bounded), never recording again
      while not healthy_at and captcha.now() - start < 5 do captcha.sleep(0.02) end
      assert.is_true(exhausted)
      assert.is_truthy(healthy_at, "the budget never recovered")
      assert.is_true(healthy_at - start >= 0.3, "recovered before the event left the window")
    end)
    b:close()
  end)

  it("keeps one tracker per type plus the aggregate, with per-type targets", function()
    local b = captcha.budget{target = 0.95, targets = {turnstile = 0.98}}
    local log = watch(b)
    captcha.run(function()
      record_n(b, 97, true, {method = "turnstile", at = 1})
      record_n(b, 3, false, {method = "turnstile", at = 1}) -- 0.98: 2 allowed, 3 failed
      record_n(b, 97, true, {method = "base64", at = 1})
      record_n(b, 3, false, "base64")                       -- the string form is the key
    end)
    assert.are.same({"*", "turnstile", "base64"}, b:keys())
    local t, i, all = b:report("turnstile"), b:report{key = "base64"}, b:report()
    assert.are.equal(0.98, t.slo_target)
    assert.are.equal("exhausted", t.status)
    assert.are.equal(0.95, i.slo_target)
    assert.are.equal("warning", i.status)
    assert.are.equal(200, all.total_events)
    assert.are.equal(6, all.failures)
    assert.are.equal("turnstile", t.key)
    local unknown = b:report("geetest")
    assert.are.equal(0, unknown.total_events)
    assert.are.equal("healthy", unknown.status)
    assert.are.same({"*", "turnstile", "base64"}, b:keys()) -- reading adds no key
    -- every key saw its own transitions, the last one matching its report
    local last = {}
    for _, entry in ipairs(log) do
      local key, to = entry:match("^([^:]+):%a+%->(%a+)$")
      assert.is_truthy(key, entry)
      last[key] = to
    end
    assert.are.same({["*"] = all.status, turnstile = "exhausted", base64 = "warning"}, last)
    b:close()
  end)

  it("replays explicit timestamps; older than the window is ignored, backwards is an error", function()
    local b = captcha.budget{target = 0.9, window = 100} -- resolution 0.1: whole seconds align
    local t0 = 1700000000
    assert.is_true(b:record(true, {at = t0}))
    assert.is_true(b:record(false, {at = t0 + 30}))
    local ok, err = b:record(true, {at = t0 + 10})
    assert.is_nil(ok)
    assert.matches("backwards", err)
    ok, err = b:record(true, {at = t0 - 200})
    assert.is_false(ok)
    assert.matches("outside the window", err)
    assert.are.equal(2, b:report{at = t0 + 100}.total_events)
    assert.are.equal(1, b:report{at = t0 + 100.1}.total_events)
    assert.are.equal(1, b:report().total_events) -- as of the replay's time, not the wall clock
    ok, err = b:report{at = t0}
    assert.is_nil(ok)
    assert.matches("backwards", err)
    assert.error_matches(function() b:record(true, {at = 0 / 0}) end, "at")
    b:close()
    -- a budget on the monotonic clock refuses explicit times
    b = captcha.budget{}
    assert(b:record(true))
    assert.error_matches(function() b:record(true, {at = 5}) end, "monotonic")
    b:close()
  end)

  it("fires multiwindow burn alerts once when both windows burn, and once when cleared", function()
    local b = captcha.budget{target = 0.99, window = "24h",
                             alerts = {{name = "page", long = "1h", short = "5m", burn = 14.4}}}
    local _, burns = watch(b)
    local fired_at, cleared_at
    b:on("burn", function(alert, r) if alert.firing then fired_at = r.at else cleared_at = r.at end end)
    captcha.run(function()
      local t = 0
      -- an hour clean, 20 minutes failing, 10 minutes clean; one event a second
      for _, phase in ipairs{{3600, true}, {1200, false}, {600, true}} do
        for _ = 1, phase[1] do assert(b:record(phase[2], {at = t})) t = t + 1 end
      end
    end)
    assert.are.same({"*:page+", "*:page-"}, burns)
    -- the 1 h window passes 14.4 (518.4 failures in ~3600 events) after ~519 s;
    -- the 5 min window drops below it after ~257 clean seconds
    assert.is_true(math.abs(fired_at - (3600 + 519)) <= 4, fired_at)
    assert.is_true(math.abs(cleared_at - (4800 + 257)) <= 4, cleared_at)
    b:close()
  end)

  it("has the seed FAQ's rule by default: burn > 2 or > 80 % consumed", function()
    local b = captcha.budget{target = 0.99}
    local _, burns = watch(b)
    captcha.run(function()
      record_n(b, 1000, true, {at = 0})
      record_n(b, 8, false, {at = 1}) -- 8 of 10.08 used: 79 %
      assert.is_nil(b:report().alerts)
      assert(b:record(false, {at = 1})) -- 9 of 10.09: 89 %
    end)
    assert.are.same({"*:faq+"}, burns)
    assert.are.same({"faq"}, b:report().alerts)
    b:close()
  end)

  it("supports min_events and expected_events (both off by default)", function()
    local b = captcha.budget{min_events = 20}
    assert(b:record(false, {at = 0}))
    local r = b:report()
    assert.are.equal("healthy", r.status)
    assert.is_false(r.min_events_met)
    record_n(b, 19, true, {at = 0})
    assert.are.equal("exhausted", b:report().status)
    b:close()
    b = captcha.budget{target = 0.95, expected_events = 10000}
    assert(b:record(false, {at = 0}))
    r = b:report()
    assert.are.equal(500, r.budget_total)
    assert.are.equal(499, r.budget_remaining)
    assert.are.equal("healthy", r.status)
    assert.are.equal(10000, r.expected_events)
    b:close()
  end)

  it("logs a hook that raises and goes on recording", function()
    local b = captcha.budget{target = 0.95}
    local second = false
    b:on("exhausted", function() error("hook failed on purpose") end)
    b:on("exhausted", function() second = true end)
    captcha.run(function()
      assert(b:record(false, {at = 0}))
      assert(b:record(false, {at = 1}))
    end)
    assert.is_true(second)
    assert.are.equal(2, b:report().failures)
    b:close()
  end)

  it("persists its counters atomically and restores them, dropping what left the window", function()
    local path = os.tmpname()
    os.remove(path)
    local b = captcha.budget{target = 0.95, window = 100, state = path}
    record_n(b, 19, true, {method = "turnstile", at = 10})
    assert(b:record(false, {method = "turnstile", at = 60}))
    b:close() -- saves
    local saved = captcha.json.decode(assert(io.open(path)):read("a"))
    assert.are.equal("explicit", saved.clock)
    assert.is_true(#saved.buckets >= 4)
    local b2 = captcha.budget{target = 0.95, window = 100, state = path}
    assert.are.same({"*", "turnstile"}, b2:keys())
    local r = b2:report("turnstile")
    assert.are.equal(20, r.total_events)
    assert.are.equal("exhausted", r.status)
    assert.are.equal(1, b2:report{at = 110.1}.total_events) -- the 19 at t=10 left
    b2:close()
    -- the monotonic clock is stored as wall time: a restart keeps the budget
    os.remove(path)
    b = captcha.budget{target = 0.95, window = "1h", state = path}
    record_n(b, 9, true)
    assert(b:record(false))
    b:save()
    assert.are.equal("wall", captcha.json.decode(assert(io.open(path)):read("a")).clock)
    b:close()
    b2 = captcha.budget{target = 0.95, window = "1h", state = path}
    local log = watch(b2) -- registered after the load: the restored state still fires
    captcha.run(function() r = b2:report() end)
    assert.are.equal(10, r.total_events)
    assert.are.equal(1, r.failures)
    assert.are.same({"*:healthy->exhausted"}, log)
    b2:close()
    os.remove(path)
  end)
  it("stores its configuration in the state file, and still loads files without it", function()
    local path = os.tmpname()
    os.remove(path)
    local b = captcha.budget{target = 0.9, window = "2h", warning = 0.4, critical = 0.05,
      min_events = 7, targets = {turnstile = 0.98, base64 = 0.8},
      expected_events = {["*"] = 1000, turnstile = 300}, state = path}
    assert(b:record(true, {method = "turnstile", at = 5}))
    b:close()
    local saved = captcha.json.decode(assert(io.open(path)):read("a"))
    assert.are.same({target = 0.9, targets = {turnstile = 0.98, base64 = 0.8}, warning = 0.4,
                     critical = 0.05, min_events = 7, window = 7200,
                     expected_events = {["*"] = 1000, turnstile = 300}}, saved.config)
    -- an integer expected_events is the aggregate's; no per-key target: {}
    b = captcha.budget{target = 0.95, window = 100, expected_events = 50, state = path}
    b:close()
    saved = captcha.json.decode(assert(io.open(path)):read("a"))
    assert.are.same({target = 0.95, targets = {}, warning = 0.5, critical = 0.1, min_events = 0,
                     window = 100, expected_events = {["*"] = 50}}, saved.config)
    -- a file written before the config was stored loads as before
    local f = assert(io.open(path, "w"))
    f:write('{"version":1,"clock":"explicit","now":60,"buckets":[["*",100,10,19,0],["*",100,60,0,1]]}')
    f:close()
    b = captcha.budget{target = 0.95, window = 100, state = path}
    local r = b:report()
    assert.are.equal(20, r.total_events)
    assert.are.equal("exhausted", r.status)
    b:close()
    os.remove(path)
  end)
end)
