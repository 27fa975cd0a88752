-- The scheduler and the small libraries of the `captcha` module, loaded into
-- stock lua5.4 (busted) and driven with captcha.run.
local captcha = require "captcha"

describe("captcha.run", function()
  it("drives the loop until the function and its tasks finish", function()
    local order = {}
    local a, b = captcha.run(function(x)
      captcha.spawn(function() captcha.sleep(0.02); order[#order + 1] = "late" end)
      captcha.sleep(0.005)
      order[#order + 1] = "main"
      return x, "two"
    end, "one")
    assert.are.equal("one", a)
    assert.are.equal("two", b)
    assert.are.same({"main", "late"}, order)
  end)

  it("raises the main function's error with a traceback", function()
    local ok, err = pcall(captcha.run, function() error("boom") end)
    assert.is_false(ok)
    assert.matches("boom", err)
    assert.matches("stack traceback", err)
  end)

  it("reports a deadlock instead of hanging", function()
    local ok, err = pcall(captcha.run, function()
      -- t waits for u, u waits for t: nothing can ever wake them
      local t, u
      t = captcha.spawn(function() captcha.sleep(0) return u:wait() end)
      u = captcha.spawn(function() captcha.sleep(0) return t:wait() end)
      return t:wait()
    end)
    assert.is_false(ok)
    assert.matches("deadlock", err)
  end)
end)

describe("tasks", function()
  it("return their results through wait", function()
    captcha.run(function()
      local t = captcha.spawn(function(a, b) captcha.sleep(0.001) return a + b, nil, "z" end, 2, 3)
      local r = table.pack(t:wait())
      assert.are.equal(3, r.n)
      assert.are.equal(5, r[1])
      assert.is_nil(r[2])
      assert.are.equal("z", r[3])
      assert.are.equal("done", t:status())
      -- waiting again gives the same results
      assert.are.equal(5, (t:wait()))
    end)
  end)

  it("return an error as a value to the task that waits", function()
    captcha.run(function()
      local t = captcha.spawn(function() captcha.sleep(0.001) error({code = 7}) end)
      local ok, err, tb = t:wait()
      assert.is_nil(ok)
      assert.are.equal(7, err.code)
      assert.matches("stack traceback", tb)
      assert.are.equal("failed", t:status())
    end)
  end)

  it("can be cancelled while they wait, and never resume afterwards", function()
    captcha.run(function()
      local resumed = false
      local t = captcha.spawn(function() captcha.sleep(0.05) resumed = true end)
      captcha.sleep(0.001)
      assert.are.equal("waiting", t:status())
      assert.is_true(t:cancel())
      assert.are.equal("cancelled", t:status())
      assert.is_false(t:cancel())
      local ok, err = t:wait()
      assert.is_nil(ok)
      assert.are.equal("cancelled", err)
      captcha.sleep(0.08)
      assert.is_false(resumed)
    end)
  end)

  it("can be cancelled by a task resumed in the same pass, before they ever run", function()
    captcha.run(function()
      local b
      local a = captcha.spawn(function() return b:cancel() end)
      b = captcha.spawn(function() error("must never run") end)
      assert.is_true(a:wait())
      assert.are.equal("cancelled", b:status())
    end)
  end)

  it("close to-be-closed variables when cancelled", function()
    captcha.run(function()
      local closed = false
      local t = captcha.spawn(function()
        local guard <close> = setmetatable({}, {__close = function() closed = true end})
        captcha.sleep(10)
      end)
      captcha.sleep(0.001)
      t:cancel()
      assert.is_true(closed)
    end)
  end)

  it("wake every task waiting for the same one", function()
    captcha.run(function()
      local target = captcha.spawn(function() captcha.sleep(0.01) return "v" end)
      local got = {}
      local waiters = {}
      for i = 1, 10 do
        waiters[i] = captcha.spawn(function() got[i] = target:wait() end)
      end
      for i = 1, 10 do waiters[i]:wait() end
      for i = 1, 10 do assert.are.equal("v", got[i]) end
    end)
  end)

  it("run in order of readiness, FIFO among equals", function()
    local order = {}
    captcha.run(function()
      for i = 1, 5 do captcha.spawn(function() order[#order + 1] = i end) end
    end)
    assert.are.same({1, 2, 3, 4, 5}, order)
  end)

  it("treat a bare coroutine.yield as a cooperative yield", function()
    local order = {}
    captcha.run(function()
      captcha.spawn(function() order[#order + 1] = "b" end)
      coroutine.yield()
      order[#order + 1] = "a"
    end)
    assert.are.same({"b", "a"}, order)
  end)

  it("make an un-awaited failure fail the run", function()
    local ok, err = pcall(captcha.run, function()
      captcha.spawn(function() error("lost") end)
      captcha.sleep(0.001)
    end)
    assert.is_false(ok)
    assert.matches("never awaited", err)
  end)

  it("make an un-awaited failure fail the run even if its only waiter was cancelled", function()
    -- b fails and wakes a; c, resumed in the same pass, cancels a before a
    -- ever sees b's error: nobody observed it, so the run must fail
    local b -- kept reachable: only the end of the run may report it
    local ok, err = pcall(captcha.run, function()
      b = captcha.spawn(function() captcha.yield() error("lost failure") end)
      local a = captcha.spawn(function() b:wait() end)
      captcha.spawn(function() captcha.yield() a:cancel() end)
    end)
    assert.is_false(ok)
    assert.matches("never awaited", err)
    assert.is_not_nil(b)
  end)

  it("refuse to wait outside a task with a clear message", function()
    local ok, err = pcall(captcha.sleep, 0.01)
    assert.is_false(ok)
    assert.matches("outside a task", err)
    local co = coroutine.wrap(function() return pcall(captcha.sleep, 0) end)
    captcha.run(function()
      local ok2, err2 = co()
      assert.is_false(ok2)
      assert.matches("outside a task", err2)
    end)
  end)

  it("name the argument when misused", function()
    assert.has_error(function() captcha.spawn(42) end)
    local ok, err = pcall(captcha.sleep, "x")
    assert.is_false(ok)
    assert.matches("bad argument #1", err)
  end)

  it("handle ten thousand concurrent sleepers", function()
    local done = 0
    captcha.run(function()
      for i = 1, 10000 do
        captcha.spawn(function() captcha.sleep((i % 10) / 1000) done = done + 1 end)
      end
    end)
    assert.are.equal(10000, done)
  end)
end)

describe("captcha.sleep and captcha.now", function()
  it("sleep at least as long as asked on the monotonic clock", function()
    captcha.run(function()
      local t0 = captcha.now()
      captcha.sleep(0.02)
      local dt = captcha.now() - t0
      assert.is_true(dt >= 0.019, "slept " .. dt)
    end)
  end)

  it("has sub-millisecond resolution", function()
    local a = captcha.now()
    local b
    repeat b = captcha.now() until b ~= a
    assert.is_true(b - a < 0.001)
  end)
end)

describe("captcha.json", function()
  local json = captcha.json

  it("round-trips nested objects and arrays", function()
    local v = {a = {1, 2, {b = "c"}}, d = true, e = json.null}
    local back = json.decode(json.encode(v))
    assert.are.equal(1, back.a[1])
    assert.are.equal("c", back.a[3].b)
    assert.is_true(back.d)
    assert.are.equal(json.null, back.e)
  end)

  it("keeps integers and floats apart", function()
    assert.are.equal("[1,1.0,1.5,-3,1e+300]", json.encode({1, 1.0, 1.5, -3, 1e300}))
    assert.are.equal(math.type(json.decode("7")), "integer")
    assert.are.equal(math.type(json.decode("7.5")), "float")
    assert.are.equal("float", math.type(json.decode("1.0")))
    assert.are.equal("[1.0,2]", json.encode(json.decode("[1.0, 2]")))
    -- integers beyond 2^53 print exactly (cJSON alone would round them)
    assert.are.equal("9007199254740993", json.encode(9007199254740993))
  end)

  it("handles unicode and escapes", function()
    local s = "héllo \"wörld\"\n\u{1F600}"
    assert.are.equal(s, json.decode(json.encode(s)))
    assert.are.equal("é", json.decode('"\\u00e9"'))
  end)

  it("encodes empty tables as objects unless marked", function()
    assert.are.equal("{}", json.encode({}))
    assert.are.equal("[]", json.encode(json.array()))
    assert.are.equal("[]", json.encode(json.decode("[]")))
  end)

  it("returns nil and the byte position for invalid input", function()
    local v, err = json.decode('{"a": 1,, }')
    assert.is_nil(v)
    assert.matches("^error at byte %d+$", err)
    v, err = json.decode('[1] x')
    assert.is_nil(v)
    assert.are.equal("error at byte 5", err)
  end)

  it("decodes integers beyond 2^53 exactly (64-bit ids)", function()
    assert.are.equal(9007199254740993, json.decode("9007199254740993"))
    assert.are.equal("integer", math.type(json.decode("9007199254740993")))
    assert.are.equal(1234567890123456789, json.decode('{"id":1234567890123456789}').id)
    assert.are.equal(math.mininteger, json.decode("-9223372036854775808"))
    assert.are.equal("[1234567890123456789]", json.encode(json.decode("[1234567890123456789]")))
    -- beyond 64 bits: a float, as before
    assert.are.equal("float", math.type(json.decode("9223372036854775808")))
  end)

  it("encodes holes of a marked array as null instead of dropping it", function()
    assert.are.equal("[1,null,3]", json.encode(json.array({1, nil, 3})))
    local a = json.decode("[1,2]")
    a[4] = 4
    assert.are.equal("[1,2,null,4]", json.encode(a))
  end)

  it("always encodes valid UTF-8", function()
    local s = assert(json.encode({ answer = "ok\xff\xfe", id = "caf\xe9" }))
    assert.is_not_nil(utf8.len(s), s)
    assert.are.equal("ok\u{FFFD}\u{FFFD}", json.decode(s).answer)
    assert.are.equal("h\u{e9}llo \u{1F600}", json.decode(json.encode("h\u{e9}llo \u{1F600}")))
  end)

  it("refuses values JSON cannot hold", function()
    local v, err = json.encode({f = print})
    assert.is_nil(v)
    assert.matches("function", err)
    v, err = json.encode(0 / 0)
    assert.is_nil(v)
    assert.matches("NaN", err)
    local cyc = {}
    cyc.self = cyc
    v, err = json.encode(cyc)
    assert.is_nil(v)
    assert.matches("cycle", err)
  end)
end)

describe("captcha.log", function()
  it("validates levels and formats", function()
    local prev = captcha.log.level("warn")
    assert.are.equal("warn", captcha.log.level(prev))
    assert.has_error(function() captcha.log.level("loud") end)
    assert.has_error(function() captcha.log.format("xml") end)
  end)

  it("redacts registered secrets", function()
    captcha.log.secret("canary-SECRET-1234")
    assert.are.equal("key=*** ok", captcha.log.redact("key=canary-SECRET-1234 ok"))
  end)
end)
