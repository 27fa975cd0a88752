-- captcha.alert and captcha.exec: alerts leave the process without stalling it.
local captcha = require "captcha"
local json = captcha.json

local report = { status = "critical", key = "turnstile", slo_target = 0.95, total_events = 100,
                 failures = 4, budget_total = 5.0, budget_remaining = 1.0,
                 budget_remaining_pct = 20.0, burn_rate = 0.8, current_rate = 0.96 }

describe("captcha.alert.webhook", function()
  it("POSTs Slack-compatible JSON with the report to a local receiver", function()
    captcha.run(function()
      local got
      local srv = assert(captcha.http.serve{ port = 0, handler = function(req)
        got = { method = req.method, path = req.path, ctype = req.headers["content-type"], body = req.body }
        return 200, {}, "ok"
      end })
      local ok, err = captcha.alert.webhook(srv.url .. "/hook", report):wait()
      srv:close()
      assert.is_true(ok, err)
      assert.are.equal("POST", got.method)
      assert.are.equal("/hook", got.path)
      assert.matches("application/json", got.ctype)
      local body = assert(json.decode(got.body))
      assert.matches("critical for turnstile", body.text)
      assert.are.equal(20.0, body.report.budget_remaining_pct)
      assert.are.equal(4, body.report.failures)
    end)
  end)

  it("retries a failing receiver and never blocks the caller", function()
    captcha.run(function()
      local calls = 0
      local srv = assert(captcha.http.serve{ port = 0, handler = function()
        calls = calls + 1
        return 500, {}, "down"
      end })
      local t0 = captcha.now()
      local task = captcha.alert.webhook(srv.url, report, { attempts = 3 })
      -- the caller goes on at once: the alert is its own task
      assert.is_true(captcha.now() - t0 < 0.05)
      local ok, err = task:wait()
      srv:close()
      assert.is_nil(ok)
      assert.matches("HTTP 500", err)
      assert.are.equal(3, calls)
    end)
  end)

  it("rejects bad arguments", function()
    assert.has_error(function() captcha.alert.webhook(nil, report) end)
    assert.has_error(function() captcha.alert.webhook("http://127.0.0.1:1/", nil) end)
  end)
end)

describe("captcha.alert.exec and captcha.exec", function()
  it("gives the command the report as JSON on stdin", function()
    captcha.run(function()
      local path = os.tmpname()
      local ok, err = captcha.alert.exec({ "sh", "-c", "cat > " .. path }, report):wait()
      assert.is_true(ok, err)
      local r = json.decode(io.open(path):read("a"))
      os.remove(path)
      assert.are.equal("turnstile", r.key)
      assert.are.equal(0.8, r.burn_rate)
    end)
  end)

  it("returns status and output, and errors as values", function()
    captcha.run(function()
      local r = captcha.exec{ "sh", "-c", "cat; echo oops >&2; exit 3", stdin = "in" }
      assert.are.equal(3, r.status)
      assert.are.equal("in", r.stdout)
      assert.are.equal("oops\n", r.stderr)
      local none, err = captcha.exec{ "/nonexistent/program" }
      assert.is_nil(none)
      assert.matches("cannot run", err)
      local slow, terr = captcha.exec{ "sleep", "10", timeout = 0.05 }
      assert.is_nil(slow)
      assert.are.equal("timeout", terr)
    end)
  end)

  it("keeps its timeout when the child exits but its output stays open", function()
    captcha.run(function()
      local t0 = captcha.now()
      -- the background sleep inherits stdout and stderr: no EOF for 3 s
      local r, err = captcha.exec{ "sh", "-c", "sleep 3 & echo started", timeout = 0.2 }
      assert.is_nil(r)
      assert.are.equal("timeout", err)
      assert.is_true(captcha.now() - t0 < 2, "returned after " .. (captcha.now() - t0) .. " s")
    end)
  end)

  it("lets other tasks run while a child runs", function()
    captcha.run(function()
      local ticks = 0
      local ticker = captcha.spawn(function() for _ = 1, 5 do captcha.sleep(0.01) ticks = ticks + 1 end end)
      captcha.exec{ "sleep", "0.2" }
      ticker:wait()
      assert.are.equal(5, ticks)
    end)
  end)

  it("logs a report as one structured line", function()
    assert.is_true(captcha.alert.log(report))
    assert.has_error(function() captcha.alert.log("x") end)
  end)
end)

describe("captcha.isatty", function()
  it("answers for file descriptors", function()
    assert.is_boolean(captcha.isatty(0))
    assert.is_false(captcha.isatty(12345))
  end)
end)
