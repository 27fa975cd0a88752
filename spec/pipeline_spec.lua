-- captcha.pipeline against the in-process mock provider.
local captcha = require "captcha"
local json = captcha.json

local function tmpfile(content)
  local path = os.tmpname()
  if content then
    local f = assert(io.open(path, "w"))
    f:write(content)
    f:close()
  end
  return path
end

local function read_lines(path)
  local out = {}
  for line in io.lines(path) do out[#out + 1] = assert(json.decode(line), line) end
  return out
end

local function by_id(lines)
  local t = {}
  for _, r in ipairs(lines) do
    local k = tostring(r.id)
    assert.is_nil(t[k], "id " .. k .. " written twice")
    t[k] = r
  end
  return t
end

local function new_mock(knobs)
  knobs = knobs or {}
  knobs.key = knobs.key or "pipeline-key-0001"
  knobs.seed = knobs.seed or 7
  knobs.latency = knobs.latency or 0.005
  return captcha.mock(knobs)
end

local function new_client(mock, key)
  return captcha.client{ key = key or "pipeline-key-0001", base_url = mock.url,
                         first_poll = 0.005, poll_interval = 0.005, timeout = 5 }
end

describe("captcha.pipeline", function()
  it("writes exactly one line per input line, invalid ones included", function()
    local input = tmpfile(table.concat({
      '{"id":"a","method":"turnstile","sitekey":"k1","pageurl":"https://staging.example/"}',
      'not json',
      '',
      '{"method":"turnstile","sitekey":"k2","pageurl":"https://staging.example/"}',
      '{"id":"no-method","sitekey":"k3"}',
      '[1,2]',
      '{"id":"b","method":"userrecaptcha","googlekey":"g1","pageurl":"https://staging.example/"}',
    }, "\n") .. "\n")
    local output = tmpfile()
    captcha.run(function()
      local mock = new_mock()
      local p = captcha.pipeline{ client = new_client(mock), input = input, output = output,
                                  concurrency = 3, quiet = true }
      local sum, code = p:run()
      mock:close()
      assert.are.equal(0, code)
      assert.are.equal(3, sum.solved)
      assert.are.equal(3, sum.invalid)
    end)
    local lines = read_lines(output)
    assert.are.equal(6, #lines)
    local r = by_id(lines)
    assert.are.equal("solved", r.a.status)
    assert.are.equal("api", r.a.source)
    assert.is_string(r.a.answer)
    assert.are.equal("solved", r["4"].status)       -- no id: the line number
    assert.are.equal("invalid", r["2"].status)
    assert.matches("line 2: invalid JSON", r["2"].error)
    assert.matches("missing 'method'", r["no-method"].error)
    assert.matches("JSON object", r["6"].error)
    assert.are.equal("solved", r.b.status)
    os.remove(input) os.remove(output)
  end)

  it("reads CSV with a header", function()
    local input = tmpfile('id,method,sitekey,pageurl\n1,turnstile,"k,1",https://staging.example/\n2,turnstile\n')
    local output = tmpfile()
    captcha.run(function()
      local mock = new_mock()
      captcha.pipeline{ client = new_client(mock), input = input, output = output, format = "csv",
                        quiet = true }:run()
      mock:close()
    end)
    local r = by_id(read_lines(output))
    assert.are.equal("solved", r["1"].status)
    assert.are.equal("invalid", r["3"].status)
    assert.matches("header has 4", r["3"].error)
    os.remove(input) os.remove(output)
  end)

  it("pays once for duplicates through the dedup cache", function()
    local tasks = {}
    for i = 1, 60 do
      tasks[i] = { id = i, method = "turnstile", sitekey = "same", pageurl = "https://staging.example/" }
    end
    local output = tmpfile()
    local submits
    captcha.run(function()
      local mock = new_mock({ latency = 0.02 })
      local p = captcha.pipeline{ client = new_client(mock), input = tasks, output = output,
                                  dedup = captcha.dedup{}, concurrency = 20, quiet = true }
      local sum = p:run()
      submits = mock:stats().submits
      mock:close()
      assert.are.equal(60, sum.solved)
      assert.are.equal(59, sum.dedup_hits)
    end)
    assert.are.equal(1, submits)
    os.remove(output)
  end)

  it("stops submitting after a fatal provider error and writes the rest as skipped", function()
    local tasks = {}
    for i = 1, 50 do tasks[i] = { method = "turnstile", sitekey = "s" .. i, pageurl = "https://staging.example/" } end
    local output = tmpfile()
    local halted_hook = 0
    captcha.run(function()
      local mock = new_mock()
      local p
      p = captcha.pipeline{ client = new_client(mock, "wrong-key-0000"), input = tasks,
        output = output, concurrency = 4, quiet = true,
        on = { halt = function(report, pl) halted_hook = halted_hook + 1 assert.are.equal(p, pl) end } }
      local sum, code = p:run()
      local seen = mock:stats().submits
      mock:close()
      assert.are.equal(4, code)
      assert.is_truthy(sum.halted)
      assert.is_true(seen <= 4, "submits after the halt: " .. seen)
    end)
    local lines = read_lines(output)
    assert.are.equal(50, #lines)
    local statuses = {}
    for _, r in ipairs(lines) do statuses[r.status] = (statuses[r.status] or 0) + 1 end
    assert.is_true((statuses.skipped or 0) >= 46)
    assert.are.equal(1, halted_hook)
    assert.is_nil(io.open(output):read("a"):find("wrong%-key"))
    os.remove(output)
  end)

  it("resumes without solving again what already has a terminal line", function()
    local tasks = {}
    for i = 1, 40 do tasks[i] = { id = "t" .. i, method = "turnstile", sitekey = "s" .. i, pageurl = "https://staging.example/" } end
    local output = tmpfile()
    local first, second
    captcha.run(function()
      local mock = new_mock()
      local client = new_client(mock)
      local n = 0
      local p
      p = captcha.pipeline{ input = tasks, output = output, concurrency = 2, quiet = true,
        solve = function(task)
          n = n + 1
          if n == 15 then p:stop("test stop") end
          return client:solve(task)
        end }
      p:run()
      first = mock:stats().submits
      p = captcha.pipeline{ client = client, input = tasks, output = output, concurrency = 4,
                            resume = true, quiet = true }
      local sum = p:run()
      second = mock:stats().submits - first
      mock:close()
      assert.are.equal(0, sum.exit_code)
      assert.is_true(sum.resumed >= 14)
    end)
    local r = by_id(read_lines(output))
    local n = 0
    for _, rec in pairs(r) do n = n + 1 assert.are.equal("solved", rec.status) end
    assert.are.equal(40, n)
    assert.are.equal(40, first + second)
    os.remove(output)
  end)

  it("releases workers waiting on the bucket when it stops", function()
    local tasks = {}
    for i = 1, 6 do tasks[i] = { id = i, method = "turnstile" } end
    local output = tmpfile()
    captcha.run(function()
      -- one token now, the next in about 11 days: only a release ends this run
      local bucket = captcha.bucket{ capacity = 1, rate = 1e-6 }
      local p
      p = captcha.pipeline{ bucket = bucket, input = tasks, output = output, concurrency = 6, quiet = true,
        solve = function(task) p:stop("enough") return { answer = "a" .. task.id } end }
      local sum = p:run()
      bucket:close()
      assert.are.equal(1, sum.solved)
      assert.are.equal(5, sum.skipped)
    end)
    local r = by_id(read_lines(output))
    local n = 0
    for _, rec in pairs(r) do
      n = n + 1
      if rec.status == "skipped" then assert.are.equal("enough", rec.error) end
    end
    assert.are.equal(6, n)
    os.remove(output)
  end)

  it("throttles and pauses through the bucket", function()
    captcha.run(function()
      local bucket = captcha.bucket{ capacity = 5, rate = 100 }
      local p = captcha.pipeline{ solve = function() return { answer = "x" } end, bucket = bucket,
                                  input = {}, output = tmpfile(), quiet = true }
      p:throttle(0.5)
      assert.are.equal(50, bucket.rate)
      p:throttle(1)
      assert.are.equal(100, bucket.rate)
      p:pause("budget")
      assert.is_true(bucket.paused)
      p:resume()
      assert.is_false(bucket.paused)
      assert.has_error(function() p:throttle(0) end)
      bucket:close()
    end)
  end)

  it("writes a failed line when a task's solve raises, and goes on", function()
    local tasks = {}
    for i = 1, 5 do tasks[i] = { id = "t" .. i, method = "turnstile" } end
    local output = tmpfile()
    captcha.run(function()
      local p = captcha.pipeline{ input = tasks, output = output, concurrency = 2, quiet = true,
        solve = function(task)
          captcha.sleep(0)
          if task.id == "t2" then error("kaboom") end
          return { answer = "a" }
        end }
      local sum, code = p:run()
      assert.are.equal(4, sum.solved)
      assert.are.equal(1, sum.failed)
      assert.are.equal(0, code)
    end)
    local r = by_id(read_lines(output))
    local n = 0
    for _ in pairs(r) do n = n + 1 end
    assert.are.equal(5, n)
    assert.are.equal("failed", r.t2.status)
    assert.are.equal("INTERNAL", r.t2.code)
    assert.matches("kaboom", r.t2.error)
    os.remove(output)
  end)

  it("throttles from the bucket's current rate, and restores it", function()
    captcha.run(function()
      local bucket = captcha.bucket{ capacity = 5, rate = 100 }
      local p = captcha.pipeline{ solve = function() return { answer = "x" } end, bucket = bucket,
                                  input = {}, output = tmpfile(), quiet = true }
      bucket:set_rate(40) -- the user retunes the bucket after building the pipeline
      p:throttle(0.5)
      assert.are.equal(20, bucket.rate)
      p:throttle(1)
      assert.are.equal(40, bucket.rate)
      bucket:close()
    end)
  end)

  it("does not fire a finished pipeline's hooks for a later run on the same budget", function()
    local fired = { first = 0, second = 0 }
    captcha.run(function()
      local budget = captcha.budget{ target = 0.5, window = "1h" }
      local function hooks(name)
        return { warning = function() fired[name] = fired[name] + 1 end,
                 critical = function() fired[name] = fired[name] + 1 end,
                 exhausted = function() fired[name] = fired[name] + 1 end }
      end
      local ok_task = { { id = 1, method = "turnstile" } }
      captcha.pipeline{ budget = budget, input = ok_task, output = tmpfile(), quiet = true,
        on = hooks("first"), solve = function() return { answer = "x" } end }:run()
      local bad = {}
      for i = 1, 6 do bad[i] = { id = i, method = "turnstile" } end
      captcha.pipeline{ budget = budget, input = bad, output = tmpfile(), quiet = true,
        on = hooks("second"), solve = function() return nil, "no", "ERROR_X" end }:run()
      captcha.sleep(0.01) -- hooks run as their own tasks
      budget:close()
    end)
    assert.is_true(fired.second >= 1)
    assert.are.equal(0, fired.first)
  end)

  it("rejects bad options with the option's name", function()
    assert.has_error(function() captcha.pipeline{ } end, nil)
    local ok, err = pcall(captcha.pipeline, { solve = function() end, concurrency = 0 })
    assert.is_false(ok)
    assert.matches("concurrency", err)
  end)
end)
