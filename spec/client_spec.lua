-- captcha.client against the in-process mock provider (and a tiny fake one
-- where the test must see the wire). Timings are tiny: nothing here is timed.
local captcha = require "captcha"
local mockmod = require "captcha.mock"
local clientmod = require "captcha.client"

local KEY = "CANARYcanary0123456789abcdefABCD"   -- 32 alnum: the mock's key format
local OTHER = "OTHERotherx0123456789abcdefABCDE"

-- a PNG header that the mock's image check accepts (magic + >= 100 bytes)
local PNG = "\137PNG\r\n\26\n\0\0\0\rIHDR" .. string.rep("\0", 120)

local TASKS = {
  { method = "turnstile", sitekey = "0x4AAAAAAA", pageurl = "https://example.com/login" },
  { method = "userrecaptcha", sitekey = "6Le-site", pageurl = "https://example.com/" },
  { method = "userrecaptcha", googlekey = "6Le-site", pageurl = "https://example.com/", version = "v3",
    action = "login", min_score = 0.3 },
  { method = "geetest", gt = "81dc9bdb52d04dc20036dbd8313ed055", challenge = "ch-1", pageurl = "https://example.com/" },
  { method = "base64", body = PNG },
}

local function quick(mock, extra)
  local o = { key = KEY, base_url = mock.url, first_poll = 0.005, poll_interval = 0.005, timeout = 5,
    request_timeout = 0.3, max_polls = 200, retry = { base = 0.002, cap = 0.01 } }
  for k, v in pairs(extra or {}) do o[k] = v end
  return clientmod.new(o)
end

-- Run fn(mock) inside captcha.run with a fresh mock; always closes it.
local function with_mock(knobs, fn)
  captcha.run(function()
    local o = { key = KEY, seed = 7 }
    for k, v in pairs(knobs) do o[k] = v end
    local mock = assert(mockmod.new(o))
    local ok, err = xpcall(fn, debug.traceback, mock)
    mock:close()
    assert(ok, err)
  end)
end

local function dump(v, seen)
  seen = seen or {}
  if type(v) ~= "table" then return tostring(v) end
  if seen[v] then return "" end
  seen[v] = true
  local out = {}
  for k, x in pairs(v) do out[#out + 1] = tostring(k) .. "=" .. dump(x, seen) end
  return "{" .. table.concat(out, ",") .. "}"
end

describe("captcha.client", function()
  it("solves every method and returns the documented result", function()
    with_mock({ latency = 0.01 }, function(mock)
      local c = quick(mock)
      for _, task in ipairs(TASKS) do
        local r, err, code = c:solve(task)
        assert.is_table(r, tostring(err) .. " " .. tostring(code))
        assert.equal(task.method, r.method)
        assert.is_string(r.id)
        assert.is_true(r.elapsed > 0)
        assert.is_true(r.polls >= 1)
        assert.equal(1, r.submit_attempts)
        if task.method == "geetest" then
          assert.is_table(r.answer)
          assert.is_string(r.answer.validate)
        else
          assert.is_string(r.answer)
        end
        if task.method == "turnstile" then
          assert.equal(r.answer, r.token)
          assert.is_string(r.useragent)
        end
      end
      local st = c:stats()
      assert.equal(#TASKS, st.solved)
      assert.equal(#TASKS, st.submits)
      assert.equal(#TASKS, mock:stats().submits)
      assert.is_number(st.solve_time.turnstile.p50)
      assert.is_number(st.solve_time.geetest.p99)
    end)
  end)

  it("uploads an image file as multipart method=post", function()
    local path = os.tmpname()
    local f = assert(io.open(path, "wb"))
    f:write(PNG)
    f:close()
    with_mock({}, function(mock)
      local c = quick(mock)
      local r, err = c:solve{ method = "post", file = path }
      assert.is_table(r, err)
      assert.is_string(r.answer)
      local r2, err2, code2 = c:solve{ method = "post", file = "/nonexistent/captcha.png" }
      assert.is_nil(r2)
      assert.equal("BAD_TASK", code2)
      assert.matches("cannot read", err2)
    end)
    os.remove(path)
  end)

  it("sends the right fields per method (no googlekey for turnstile/geetest) and coerces integer ids", function()
    local seen = {}
    captcha.run(function()
      local srv = captcha.http.serve{ handler = function(req)
        if req.path == "/in.php" then
          seen[#seen + 1] = req.form
          return 200, nil, '{"status":1,"request":70000000001}'
        end
        return 200, nil, '{"status":1,"request":"TOKEN","useragent":"UA"}'
      end }
      local c = clientmod.new{ key = KEY, base_url = srv.url, first_poll = 0.001 }
      local r = c:solve{ method = "turnstile", sitekey = "SK", pageurl = "https://p/", googlekey = "WRONG", action = "a" }
      assert.equal("70000000001", r.id)
      assert.equal("TOKEN", r.token)
      assert.equal("UA", r.useragent)
      c:solve{ method = "geetest", gt = "G", challenge = "C", pageurl = "https://p/", sitekey = "nope" }
      c:solve{ method = "userrecaptcha", sitekey = "RK", pageurl = "https://p/", version = "v3", action = "buy",
        min_score = 0.7, enterprise = true }
      c:solve{ method = "userrecaptcha", googlekey = "RK", pageurl = "https://p/", invisible = true }
      c:solve{ method = "lemin", captcha_id = "X", div_id = "D", pageurl = "https://p/" }
      srv:close()
    end)
    local ts, gt, v3, inv, lemin = seen[1], seen[2], seen[3], seen[4], seen[5]
    assert.equal("turnstile", ts.method)
    assert.equal("SK", ts.sitekey)
    assert.equal("a", ts.action)
    assert.is_nil(ts.googlekey)
    assert.equal(KEY, ts.key)
    assert.equal("1", ts.json)
    assert.is_nil(gt.googlekey)
    assert.equal("G", gt.gt)
    assert.equal("C", gt.challenge)
    assert.equal("RK", v3.googlekey)
    assert.equal("v3", v3.version)
    assert.equal("buy", v3.action)
    assert.equal("0.7", v3.min_score)
    assert.equal("1", v3.enterprise)
    assert.equal("1", inv.invisible)
    assert.is_nil(inv.version)
    assert.equal("X", lemin.captcha_id)
    assert.equal("D", lemin.div_id)
  end)

  for _, case in ipairs{
    { fault = "http500", code = "HTTP_5XX" },
    { fault = "garbage", code = "BAD_RESPONSE" },
    { fault = "reset", code = "HTTP_RESET" },
    { fault = "hang", code = "HTTP_TIMEOUT" },
    { fault = "drip", code = "HTTP_TIMEOUT" },   -- 0.05 s per 4 bytes: slower than request_timeout
  } do
    it("gives a clear error on fault " .. case.fault, function()
      with_mock({ faults = { [case.fault] = 1 }, drip_interval = 0.05 }, function(mock)
        local c = quick(mock, { max_submit_attempts = 3, request_timeout = 0.1 })
        local r, err, code = c:solve(TASKS[1])
        assert.is_nil(r)
        assert.equal(case.code, code)
        assert.matches("^" .. case.code .. ": ", err)
        assert.is_nil(c.halted)
        local st = c:stats()
        assert.equal(3, st.submits)           -- bounded retries
        assert.equal(2, st.retries)
        assert.equal(3, st.errors[case.code])
        assert.equal(3, mock:stats().requests["in"])
      end)
    end)
  end

  it("recovers from transient faults and slow answers", function()
    -- per attempt ~24% fail: 10 attempts all failing is a 1e-6 event
    with_mock({ faults = { http500 = 0.05, garbage = 0.05, reset = 0.05 }, no_slot_rate = 0.1 }, function(mock)
      local c = quick(mock, { max_submit_attempts = 10, max_poll_errors = 10 })
      local tasks = {}
      for i = 1, 40 do tasks[i] = captcha.spawn(c.solve, c, TASKS[i % #TASKS + 1]) end
      local ok, why = 0, {}
      for i = 1, 40 do
        local r, err = tasks[i]:wait()
        if r then ok = ok + 1 else why[#why + 1] = err end
      end
      assert.equal(40, ok, table.concat(why, "; "))
      assert.is_true(c:stats().retries > 0)
    end)
    with_mock({ faults = { drip = 1 }, drip_interval = 0.001, drip_chunk = 64 }, function(mock)
      local c = quick(mock, { request_timeout = 5 })
      assert.is_table(c:solve(TASKS[1]))
    end)
  end)

  it("retries ERROR_ZERO_BALANCE on captchaai (no free thread) but halts on 2captcha", function()
    with_mock({ zero_balance = true }, function(mock)
      local c = quick(mock, { max_submit_attempts = 4 })
      local r, err, code = c:solve(TASKS[1])
      assert.is_nil(r)
      assert.equal("ERROR_ZERO_BALANCE", code)
      assert.is_nil(c.halted)
      assert.equal(4, mock:stats().submits)
    end)
    with_mock({ zero_balance = true, provider = "2captcha" }, function(mock)
      local c = quick(mock, { provider = "2captcha", max_submit_attempts = 4 })
      local r, err, code = c:solve(TASKS[1])
      assert.is_nil(r)
      assert.equal("ERROR_ZERO_BALANCE", code)
      assert.equal(err, c.halted)
      assert.equal(1, mock:stats().submits)
      r, err, code = c:solve(TASKS[2])
      assert.equal("ERROR_ZERO_BALANCE", code)
      assert.equal(1, mock:stats().submits)
    end)
  end)

  it("halts on a fatal error: pending solves end at once, no further submit, hook fires once", function()
    with_mock({ latency = 0.3 }, function(mock)
      local c = quick(mock, { poll_interval = 0.05 })
      local fired = {}
      c:on("halt", function(info)
        captcha.sleep(0.001)                 -- hooks run as tasks: they may wait
        fired[#fired + 1] = info.code
      end)
      local tasks = {}
      for i = 1, 20 do tasks[i] = captcha.spawn(c.solve, c, TASKS[i % #TASKS + 1]) end
      captcha.sleep(0.05)                    -- all submitted, all polling
      assert.equal(20, mock:stats().submits)
      mock:set{ key = OTHER }                -- the key stops working
      local codes = {}
      for i = 1, 20 do
        local r, err, code = tasks[i]:wait()
        assert.is_nil(r)
        codes[code] = (codes[code] or 0) + 1
      end
      assert.same({ ERROR_KEY_DOES_NOT_EXIST = 20 }, codes)
      assert.matches("^ERROR_KEY_DOES_NOT_EXIST", c.halted)
      local seen = mock:stats()
      local r, err, code = c:solve(TASKS[1])
      assert.is_nil(r)
      assert.equal("ERROR_KEY_DOES_NOT_EXIST", code)
      assert.equal(c.halted, err)
      captcha.sleep(0.05)
      local after = mock:stats()
      assert.equal(seen.submits, after.submits)
      assert.equal(20, after.submits)
      assert.equal(seen.requests["res"], after.requests["res"])
      c:on("halt", function() fired[#fired + 1] = "late" end)
      captcha.sleep(0.01)
      assert.same({ "ERROR_KEY_DOES_NOT_EXIST", "late" }, fired)
      assert.equal(0, c:stats().active)
    end)
  end)

  it("halts at once on a wrong key", function()
    with_mock({}, function(mock)
      local c = quick(mock, { key = "short" })
      local r, err, code = c:solve(TASKS[1])
      assert.equal("ERROR_WRONG_USER_KEY", code)
      assert.is_string(c.halted)
      assert.equal(1, mock:stats().submits)
      assert.is_nil(c:balance())
    end)
  end)

  it("fails unsolvable tasks with bounded resubmits, and times out", function()
    with_mock({ unsolvable_rate = 1 }, function(mock)
      local c = quick(mock, { resubmit_unsolvable = 2 })
      local r, err, code = c:solve(TASKS[1])
      assert.is_nil(r)
      assert.equal("ERROR_CAPTCHA_UNSOLVABLE", code)
      assert.equal(3, mock:stats().submits)
      assert.equal(2, c:stats().resubmits)
    end)
    with_mock({ latency = 10 }, function(mock)
      local c = quick(mock, { timeout = 0.1 })
      local r, err, code = c:solve(TASKS[1])
      assert.is_nil(r)
      assert.equal("TIMEOUT", code)
      assert.matches("^TIMEOUT", err)
    end)
  end)

  it("caps polls per task", function()
    with_mock({ latency = 10 }, function(mock)
      local c = quick(mock, { timeout = 1, max_polls = 6, poll_interval = 0.001 })
      local r, err, code = c:solve(TASKS[1])
      assert.equal("TIMEOUT", code)
      assert.is_true(mock:stats().polls <= 6)
    end)
  end)

  it("batches due polls into ids= requests on the 2captcha profile", function()
    with_mock({ provider = "2captcha", latency = 0.02 }, function(mock)
      local c = quick(mock, { provider = "2captcha", batch_window = 0.01 })
      local tasks = {}
      for i = 1, 30 do tasks[i] = captcha.spawn(c.solve, c, TASKS[1]) end
      for i = 1, 30 do assert.is_table((tasks[i]:wait())) end
      local st = c:stats()
      local batches = 0
      for _, n in pairs(st.requests.batch) do batches = batches + n end
      assert.is_true(batches > 0)
      assert.is_true(mock:stats().requests["res"] < st.polls)
      assert.equal(0, st.batch_mismatches)
    end)
  end)

  it("falls back to single polls when a batch answer has the wrong count", function()
    captcha.run(function()
      local n = 0
      local srv = captcha.http.serve{ handler = function(req)
        if req.path == "/in.php" then
          n = n + 1
          return 200, nil, '{"status":1,"request":"' .. n .. '"}'
        end
        if req.query.ids then return 200, nil, '{"status":1,"request":"A"}' end  -- one answer for N ids
        return 200, nil, '{"status":1,"request":"T' .. req.query.id .. '"}'
      end }
      local c = clientmod.new{ key = KEY, base_url = srv.url, provider = "2captcha", first_poll = 0.01,
        batch_window = 0.005 }
      local tasks = {}
      for i = 1, 5 do tasks[i] = captcha.spawn(c.solve, c, TASKS[1]) end
      for i = 1, 5 do
        local r = tasks[i]:wait()
        assert.equal("T" .. r.id, r.answer)
      end
      assert.is_true(c:stats().batch_mismatches >= 1)
      assert.is_true(c:stats().batch_fallbacks >= 2)
      srv:close()
    end)
  end)

  it("a hung batch poll does not outlive the tasks' timeout", function()
    captcha.run(function()
      local srv = captcha.http.serve{ handler = function(req)
        if req.path == "/in.php" then return 200, nil, '{"status":1,"request":"1"}' end
        req:hang()                                 -- res.php?ids= never answers
      end }
      local c = clientmod.new{ key = KEY, base_url = srv.url, provider = "2captcha", first_poll = 0.01,
        batch_window = 0.005, timeout = 0.3, request_timeout = 20 }
      local t0 = captcha.now()
      local r, err, code = c:solve(TASKS[1])
      local took = captcha.now() - t0
      srv:close()
      assert.is_nil(r)
      assert.is_string(code, err)
      -- the request timeout (20 s) must be cut to the task's deadline (+0.5 s)
      assert.is_true(took < 2, "solve took " .. took .. " s for a 0.3 s timeout")
    end)
  end)

  it("keeps bookkeeping fields to itself, trims plain answers, polls once before a short timeout", function()
    local form
    local polls = 0
    captcha.run(function()
      local srv = captcha.http.serve{ handler = function(req)
        if req.path == "/in.php" then
          form = req.form
          return 200, nil, "OK|4242\r\n"            -- plain answer with a CRLF
        end
        polls = polls + 1
        return 200, nil, "OK|TOKEN\r\n"
      end }
      -- turnstile's first poll is 10 s; the task's timeout is 0.3 s
      local c = clientmod.new{ key = KEY, base_url = srv.url }
      local r, err = c:solve{ id = "row-17", first_poll = 10, method = "turnstile", sitekey = "SK",
                              pageurl = "https://p/", timeout = 0.3 }
      assert.has_error(function() c:solve{ method = "turnstile", sitekey = "SK", pageurl = "https://p/", timeout = 0 } end)
      srv:close()
      assert.is_table(r, err)
      assert.equal("4242", r.id)
      assert.equal("TOKEN", r.answer)
    end)
    assert.equal(1, polls)
    assert.is_nil(form.id)
    assert.is_nil(form.first_poll)
    assert.equal("SK", form.sitekey)
  end)

  it("submit/poll/balance/report for self-scheduling", function()
    with_mock({ latency = 0.02 }, function(mock)
      local c = quick(mock)
      local id = assert(c:submit(TASKS[1]))
      local r, err, code = c:poll(id)
      assert.is_nil(r)
      assert.equal("CAPCHA_NOT_READY", code)
      captcha.sleep(0.03)
      r = assert(c:poll(id))
      assert.is_string(r.answer)
      assert.equal(100, c:balance())
      assert.is_true(c:report(id, "good"))
      local ok, _, rcode = c:report(id, "bad")
      assert.is_nil(ok)
      assert.equal("ERROR_DUPLICATE_REPORT", rcode)
      assert.is_nil(c.halted)
    end)
  end)

  it("cancelling a caller cancels its solve", function()
    with_mock({ latency = 10 }, function(mock)
      local c = quick(mock, { poll_interval = 0.01 })
      local t = captcha.spawn(c.solve, c, TASKS[1])
      captcha.sleep(0.03)
      assert.equal(1, c:stats().active)
      t:cancel()
      assert.equal(0, captcha.http.stats().active)   -- an in-flight poll was removed at once
      local polls, client_polls = mock:stats().polls, c:stats().polls
      captcha.sleep(0.05)
      -- a poll already on the wire may still reach the mock; no new one is sent
      assert.is_true(mock:stats().polls <= polls + 1)
      assert.equal(client_polls, c:stats().polls)
      assert.equal(0, c:stats().active)
    end)
  end)

  it("never exposes the key in results, errors or stats", function()
    local out = {}
    with_mock({ faults = { http500 = 0.2, garbage = 0.1, reset = 0.1 }, unsolvable_rate = 0.3 }, function(mock)
      local c = quick(mock, { max_submit_attempts = 2 })
      for i = 1, 20 do out[#out + 1] = { c:solve(TASKS[i % #TASKS + 1]) } end
      out[#out + 1] = { c:solve{ method = "turnstile" } }
      out[#out + 1] = c:stats()
      out[#out + 1] = { tostring(c) }
      mock:set{ key = OTHER }
      out[#out + 1] = { c:solve(TASKS[1]) }
      out[#out + 1] = { c:balance() }
      out[#out + 1] = { c.halted }
      out[#out + 1] = c:stats()
    end)
    captcha.run(function()
      local c = clientmod.new{ key = KEY, base_url = "http://127.0.0.1:1", first_poll = 0.001,
        max_submit_attempts = 1 }
      out[#out + 1] = { c:solve(TASKS[1]) }
    end)
    local s = dump(out)
    assert.is_nil(s:find(KEY, 1, true))
    assert.truthy(s:find("HTTP_CONNECT", 1, true))
  end)

  it("raises on misuse", function()
    assert.has_error(function() clientmod.new() end)
    assert.has_error(function() clientmod.new{} end)
    assert.has_error(function() clientmod.new{ key = KEY, provider = "nope" } end)
    assert.has_error(function() clientmod.new{ key = KEY, base_url = "ftp://x" } end)
    assert.has_error(function() clientmod.new{ key = KEY, timeout = "x" } end)
    assert.has_error(function() clientmod.new{ key_file = "/nonexistent/key" } end)
    local c = clientmod.new{ key = KEY, base_url = "http://127.0.0.1:1" }
    assert.has_error(function() c:solve("x") end)
    assert.has_error(function() c:report("1", "meh") end)
    assert.has_error(function() c:on("nope", print) end)
    captcha.run(function()
      local r, err, code = c:solve{ method = "turnstile", pageurl = "https://p/" }
      assert.equal("BAD_TASK", code)
      assert.matches("sitekey", err)
    end)
  end)

  it("reads the key from key_file", function()
    local path = os.tmpname()
    local f = assert(io.open(path, "w"))
    f:write(KEY .. "\n")
    f:close()
    with_mock({}, function(mock)
      local c = clientmod.new{ key_file = path, base_url = mock.url, first_poll = 0.001 }
      assert.is_table(c:solve(TASKS[1]))
    end)
    os.remove(path)
  end)

  it("1,000 solves with 5% unsolvable, 5% no-slot, 1% transport faults: each returns once, numbers agree", function()
    with_mock({ latency = { 0.002, 0.02 }, unsolvable_rate = 0.05, no_slot_rate = 0.05,
                faults = { http500 = 0.004, garbage = 0.003, reset = 0.003 } }, function(mock)
      local c = quick(mock, { max_submit_attempts = 8, max_poll_errors = 8, max_connections = 64 })
      local N = 1000
      local returned, ok, codes = {}, 0, {}
      local tasks = {}
      for i = 1, N do
        tasks[i] = captcha.spawn(function()
          local r, err, code = c:solve(TASKS[i % #TASKS + 1])
          returned[i] = (returned[i] or 0) + 1
          if r then ok = ok + 1 else codes[code] = (codes[code] or 0) + 1 end
        end)
      end
      for i = 1, N do tasks[i]:wait() end
      for i = 1, N do assert.equal(1, returned[i]) end
      local failed = 0
      for _, n in pairs(codes) do failed = failed + n end
      assert.equal(N, ok + failed)
      local st, ms = c:stats(), mock:stats()
      -- every failure is an unsolvable task (no resubmit configured); transient
      -- errors were all absorbed by retries
      assert.same({ ERROR_CAPTCHA_UNSOLVABLE = failed }, failed > 0 and codes or {})
      assert.equal(ms.solved, ok)
      assert.equal(ms.unsolvable, failed)
      assert.equal(ms.tasks, N)
      assert.equal(st.solved, ok)
      -- the client's count of each answer code matches what the mock sent
      assert.equal(ms.submit_answers.ERROR_NO_SLOT_AVAILABLE or 0, st.requests["in"].ERROR_NO_SLOT_AVAILABLE or 0)
      assert.equal(ms.submit_answers.OK, st.requests["in"].ok)
      local faults = 0
      for _, n in pairs(ms.faults) do faults = faults + n end
      local client_faults = (st.errors.HTTP_5XX or 0) + (st.errors.BAD_RESPONSE or 0) + (st.errors.HTTP_RESET or 0)
      assert.equal(faults, client_faults)
      assert.is_true(faults > 0)
      assert.equal(0, st.active)
    end)
  end)
end)
