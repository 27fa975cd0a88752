-- captcha.bucket: the token bucket's Lua API on the real loop. Timing checks
-- only bound what cannot happen (a waiter re-timed by set_rate finishing
-- seconds early); orders and outcomes are exact.
local captcha = require "captcha"

-- Spawn one task per entry of ns that acquires n tokens and records its index.
local function acquirers(b, ns, order, opts)
  local tasks = {}
  for i, n in ipairs(ns) do
    tasks[i] = captcha.spawn(function()
      local ok, err = b:acquire{n = n, timeout = opts and opts.timeout}
      if ok then order[#order + 1] = i end
      return ok, err
    end)
  end
  return tasks
end

local function drain(b)
  while b:try_acquire(1) do end
end

describe("captcha.bucket", function()
  it("validates its arguments, naming them", function()
    assert.has_error(function() captcha.bucket() end)
    assert.error_matches(function() captcha.bucket{rate = 1} end, "capacity")
    assert.error_matches(function() captcha.bucket{capacity = 0, rate = 1} end, "capacity")
    assert.error_matches(function() captcha.bucket{capacity = 1, rate = -1} end, "rate")
    assert.error_matches(function() captcha.bucket{capacity = 1, rate = 1, max_waiters = 1.5} end, "max_waiters")
    assert.error_matches(function() captcha.bucket{capacity = 1, rate = 1, redis = "redis://x"} end, "redis")
    local b = captcha.bucket{capacity = 2, rate = 1}
    assert.error_matches(function() b:try_acquire(3) end, "capacity")
    assert.error_matches(function() b:set_rate(-1) end, "rate")
    assert.error_matches(function() b:set_capacity(0) end, "capacity")
    assert.error_matches(function() b.acquire(nil) end, "captcha.bucket")
    b:close()
  end)

  it("exposes read-only fields", function()
    local b = captcha.bucket{capacity = 20, rate = 10}
    assert.are.equal(20, b.capacity)
    assert.are.equal(10, b.rate)
    assert.are.equal(0, b.waiting)
    assert.is_false(b.paused)
    assert.is_true(b.tokens <= 20 and b.tokens > 19.9)
    assert.are.equal("local", b.backend)
    assert.error_matches(function() b.rate = 5 end, "read%-only")
    b:close()
    assert.is_true(b.closed)
    b:close() -- idempotent
  end)

  it("gives the burst at once, then try_acquire never waits", function()
    local b = captcha.bucket{capacity = 3, rate = 0.001}
    assert.is_true(b:try_acquire())
    assert.is_true(b:try_acquire(2))
    local ok, why = b:try_acquire()
    assert.is_false(ok)
    assert.are.equal("not enough tokens", why)
    -- acquiring with tokens available needs no task
    local c = captcha.bucket{capacity = 1, rate = 1}
    assert.is_true(c:acquire())
    assert.error_matches(function() c:acquire() end, "outside a task")
    assert.are.equal(0, c.waiting)
    b:close(); c:close()
  end)

  it("serves waiters strictly FIFO; a large request at the head is not starved", function()
    local b = captcha.bucket{capacity = 5, rate = 100}
    captcha.run(function()
      drain(b)
      local order = {}
      local tasks = acquirers(b, {5, 1, 1, 3, 1}, order)
      captcha.sleep(0) -- let them all queue
      assert.are.equal(5, b.waiting)
      -- small requests behind the head cannot jump it, and neither can try_acquire
      assert.is_false(b:try_acquire(1))
      for _, t in ipairs(tasks) do assert.is_true(t:wait()) end
      assert.are.same({1, 2, 3, 4, 5}, order)
      assert.are.equal(5, b:stats().waited)
    end)
    b:close()
  end)

  it("times out a waiter, and timeout = 0 does not wait at all", function()
    local b = captcha.bucket{capacity = 1, rate = 0.01}
    captcha.run(function()
      drain(b)
      local t0 = captcha.now()
      local ok, err = b:acquire{timeout = 0.05}
      assert.is_nil(ok)
      assert.are.equal("timeout", err)
      assert.is_true(captcha.now() - t0 >= 0.045)
      assert.are.equal(0, b.waiting)
      ok, err = b:acquire{timeout = 0}
      assert.are.same({nil, "timeout"}, {ok, err})
      local s = b:stats()
      assert.are.equal(2, s.timeouts)
      assert.are.equal(3, s.rejected) -- and drain's last try_acquire
    end)
    b:close()
  end)

  it("passes a timed-out head's tokens to the next in line", function()
    local b = captcha.bucket{capacity = 10, rate = 50}
    captcha.run(function()
      drain(b)
      local big = captcha.spawn(function() return b:acquire{n = 10, timeout = 0.05} end)
      local small = captcha.spawn(function() return b:acquire{n = 1} end)
      assert.are.same({nil, "timeout"}, {big:wait()})
      assert.is_true(small:wait())
    end)
    b:close()
  end)

  it("returns queue full early instead of piling up", function()
    local b = captcha.bucket{capacity = 1, rate = 0.001, max_waiters = 2}
    captcha.run(function()
      drain(b)
      local order = {}
      local tasks = acquirers(b, {1, 1}, order)
      captcha.sleep(0)
      assert.are.equal(2, b.waiting)
      local ok, err = b:acquire()
      assert.are.same({nil, "queue full"}, {ok, err})
      assert.are.equal(1, b:stats().queue_full)
      -- closing wakes the parked waiters
      b:close()
      for _, t in ipairs(tasks) do assert.are.same({nil, "closed"}, {t:wait()}) end
      assert.are.same({nil, "closed"}, {b:acquire()})
    end)
  end)

  it("re-times waiters at once when the rate changes", function()
    local b = captcha.bucket{capacity = 1, rate = 0.1} -- next token in 10 s
    captcha.run(function()
      drain(b)
      local t0 = captcha.now()
      local t = captcha.spawn(function() return b:acquire() end)
      captcha.sleep(0.01)
      b:set_rate(1000)
      assert.is_true(t:wait())
      assert.is_true(captcha.now() - t0 < 2)
      assert.are.equal(1000, b.rate)
      -- rate 0: nothing more, ever
      drain(b)
      b:set_rate(0)
      assert.are.same({nil, "timeout"}, {b:acquire{timeout = 0.02}})
    end)
    b:close()
  end)

  it("fails queued requests that no longer fit a smaller capacity", function()
    local b = captcha.bucket{capacity = 10, rate = 1}
    captcha.run(function()
      drain(b)
      local big = captcha.spawn(function() return b:acquire{n = 8} end)
      captcha.sleep(0)
      b:set_capacity(4)
      assert.are.same({nil, "exceeds capacity"}, {big:wait()})
      assert.are.equal(4, b.capacity)
    end)
    b:close()
  end)

  it("pauses and resumes", function()
    local b = captcha.bucket{capacity = 2, rate = 10}
    captcha.run(function()
      b:pause()
      assert.is_true(b.paused)
      assert.is_false(b:try_acquire())
      local t = captcha.spawn(function() return b:acquire() end)
      captcha.sleep(0.02)
      assert.are.equal("waiting", t:status())
      b:resume()
      assert.is_false(b.paused)
      assert.is_true(t:wait())
    end)
    b:close()
  end)

  it("removes a cancelled waiter from the queue", function()
    local b = captcha.bucket{capacity = 1, rate = 20}
    captcha.run(function()
      drain(b)
      local order = {}
      local tasks = acquirers(b, {1, 1, 1}, order)
      captcha.sleep(0)
      assert.are.equal(3, b.waiting)
      assert.is_true(tasks[1]:cancel())
      assert.are.equal(2, b.waiting)
      assert.is_true(tasks[2]:wait())
      assert.is_true(tasks[3]:wait())
      assert.are.same({2, 3}, order)
      assert.are.equal(1, b:stats().cancelled)
    end)
    b:close()
  end)

  it("gives back a grant whose task was cancelled before it could use it", function()
    local b = captcha.bucket{capacity = 1, rate = 0.001}
    captcha.run(function()
      b:pause()
      local t = captcha.spawn(function() return b:acquire() end)
      captcha.sleep(0)
      b:resume()                 -- grants t's token and marks t ready...
      assert.are.equal(0, b.waiting)
      assert.is_true(t:cancel()) -- ...but t is cancelled before it runs
      assert.is_true(b.tokens > 0.99)
      assert.are.equal(0, b:stats().granted)
      assert.is_true(b:try_acquire())
    end)
    b:close()
  end)

  it("never grants more than capacity + rate*T to many concurrent acquirers", function()
    -- One-sided, so scheduling noise cannot make it flaky: a task observes its
    -- grant at or after the grant, so by the time the i-th observation happens
    -- at least i grants were made since t0, and the bucket allows at most
    -- capacity + rate*(now - t0) of them. (The exact sliding-window bound is
    -- proved with a fake clock in test_bucket.c and measured in bench/.)
    local cap, rate, n = 5, 200, 60
    local b = captcha.bucket{capacity = cap, rate = rate}
    local t0 = captcha.now()
    local times = {}
    captcha.run(function()
      local tasks = {}
      for i = 1, n do
        tasks[i] = captcha.spawn(function()
          assert(b:acquire())
          times[#times + 1] = captcha.now()
        end)
      end
      for _, t in ipairs(tasks) do t:wait() end
    end)
    assert.are.equal(n, #times)
    for i = 1, n do
      assert.is_true(i <= cap + rate * (times[i] - t0) + 1e-9,
        ("%d grants after %.4f s"):format(i, times[i] - t0))
    end
    b:close()
  end)
end)
