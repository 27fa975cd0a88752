-- captcha.dedup: leader/waiters, cache, errors, TTLs (short ones), eviction,
-- cancellation, and captcha.dedup.key.
local captcha = require "captcha"

local TASK = {method = "turnstile", sitekey = "0x4AAA", pageurl = "https://staging.example.com/checkout"}

-- n concurrent solves of the same key; returns the tasks.
local function fan_out(d, key, n, fn)
  local tasks = {}
  for i = 1, n do
    tasks[i] = captcha.spawn(function() return d:solve(key, fn) end)
  end
  return tasks
end

local function b64(s)
  local chars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
  return ((s:gsub(".", function(x)
    local r, byte = "", x:byte()
    for i = 8, 1, -1 do r = r .. (byte % 2 ^ i - byte % 2 ^ (i - 1) > 0 and "1" or "0") end
    return r
  end) .. "0000"):gsub("%d%d%d?%d?%d?%d?", function(x)
    if #x < 6 then return "" end
    local c = 0
    for i = 1, 6 do c = c + (x:sub(i, i) == "1" and 2 ^ (6 - i) or 0) end
    return chars:sub(c + 1, c + 1)
  end) .. ({"", "==", "="})[#s % 3 + 1])
end

describe("captcha.dedup.key", function()
  local key = captcha.dedup.key

  it("is a 64-digit hex SHA-256, stable across spellings", function()
    local k = key(TASK)
    assert.matches("^%x+$", k)
    assert.are.equal(64, #k)
    assert.are.equal(k, key{method = "turnstile", googlekey = "0x4AAA", pageurl = TASK.pageurl})
    assert.are.equal(key{method = "userrecaptcha", googlekey = "a", pageurl = "p", enterprise = 1},
                     key{method = "userrecaptcha", sitekey = "a", pageurl = "p", enterprise = true})
    assert.are.equal(key{method = "userrecaptcha", googlekey = "a", pageurl = "p", invisible = 0},
                     key{method = "userrecaptcha", googlekey = "a", pageurl = "p"})
    assert.are.equal(key{method = "userrecaptcha", googlekey = "a", pageurl = "p", min_score = 0.3},
                     key{method = "userrecaptcha", googlekey = "a", pageurl = "p", min_score = "0.3"})
  end)

  it("never depends on the proxy, the API key or bookkeeping fields", function()
    local with = {method = TASK.method, sitekey = TASK.sitekey, pageurl = TASK.pageurl,
                  proxy = "user:pass@10.0.0.1:3128", proxytype = "HTTP", key = "0123456789abcdef",
                  id = 42, json = 1, soft_id = 7, pingback = "https://x/cb"}
    assert.are.equal(key(TASK), key(with))
  end)

  it("differs when an identifying field differs", function()
    local base = key(TASK)
    for field, value in pairs{method = "userrecaptcha", pageurl = "https://other/", action = "login",
                              sitekey = "0x4BBB", version = "v3", ["data-s"] = "blob"} do
      local t = {method = TASK.method, sitekey = TASK.sitekey, pageurl = TASK.pageurl}
      t[field] = value
      assert.are_not.equal(base, key(t), field)
    end
    assert.are_not.equal(key{method = "geetest", gt = "g", challenge = "c1", pageurl = "p"},
                         key{method = "geetest", gt = "g", challenge = "c2", pageurl = "p"})
  end)

  it("hashes image bytes: base64 (any line breaks) or a file, post or base64", function()
    local bytes = ("\137PNG\r\n\26\n" .. string.rep("pixel", 100))
    local enc = b64(bytes)
    local k = key{method = "base64", body = enc}
    assert.are.equal(k, key{method = "base64", body = enc:sub(1, 40) .. "\n" .. enc:sub(41)})
    local path = os.tmpname()
    local f = assert(io.open(path, "wb")); f:write(bytes); f:close()
    assert.are.equal(k, key{method = "post", file = path})
    os.remove(path)
    assert.are_not.equal(k, key{method = "base64", body = b64(bytes .. "x")})
    assert.are_not.equal(k, key{method = "base64", body = enc, numeric = 1})
    local nokey, err = key{method = "post", file = path}
    assert.is_nil(nokey)
    assert.matches("cannot read", err)
    nokey, err = key{method = "base64", body = "!!!!"}
    assert.is_nil(nokey)
    assert.matches("base64", err)
  end)

  it("raises on misuse", function()
    assert.has_error(function() key("x") end)
    assert.error_matches(function() key{sitekey = "a"} end, "method")
    assert.error_matches(function() key{method = "turnstile", pageurl = {}} end, "pageurl")
  end)
end)

describe("captcha.dedup", function()
  it("validates its arguments", function()
    assert.error_matches(function() captcha.dedup{solving_ttl = 0} end, "solving_ttl")
    assert.error_matches(function() captcha.dedup{solved_ttl = -1} end, "solved_ttl")
    assert.error_matches(function() captcha.dedup{max_entries = "x"} end, "max_entries")
    local d = captcha.dedup()
    assert.error_matches(function() d:solve(42, function() end) end, "#1")
    assert.error_matches(function() d:solve("k", "not a function") end, "function")
    d:close()
  end)

  it("leads, then serves waiters and the cache from one fn call", function()
    local d = captcha.dedup{solved_ttl = 60}
    local calls = 0
    captcha.run(function()
      local tasks = fan_out(d, TASK, 5, function()
        calls = calls + 1
        captcha.sleep(0.01)
        return "TOKEN"
      end)
      local sources = {}
      for _, t in ipairs(tasks) do
        local result, source = t:wait()
        assert.are.equal("TOKEN", result)
        sources[source] = (sources[source] or 0) + 1
      end
      assert.are.same({api = 1, dedup_wait = 4}, sources)
      assert.are.same({"TOKEN", "dedup_cache"}, {d:solve(TASK, error)})
      -- a string key is used as is
      assert.are.same({"T2", "api"}, {d:solve("my-key", function() return "T2" end)})
    end)
    assert.are.equal(1, calls)
    local s = d:stats()
    assert.are.equal(7, s.total_requests)
    assert.are.equal(5, s.deduplicated)
    assert.are.same({api = 2, dedup_cache = 1, dedup_wait = 4}, s.breakdown)
    assert.is_true(math.abs(s.savings_pct - 500 / 7) < 1e-9)
    d:close()
  end)

  it("runs fn once for 1,000 concurrent identical solves", function()
    local d = captcha.dedup()
    local calls = 0
    local result = {token = "shared"}
    captcha.run(function()
      local tasks = fan_out(d, TASK, 1000, function()
        calls = calls + 1
        captcha.sleep(0.02)
        return result
      end)
      for _, t in ipairs(tasks) do
        local r = t:wait()
        assert.are.equal(result, r) -- the very same Lua value
      end
    end)
    assert.are.equal(1, calls)
    local s = d:stats()
    assert.are.equal(1000, s.total_requests)
    assert.are.equal(999, s.deduplicated)
    assert.are.equal(99.9, s.savings_pct)
    assert.are.equal(0, s.waiting)
    d:close()
  end)

  it("returns a leader's error to its waiters; the next caller leads again", function()
    local d = captcha.dedup()
    local calls = 0
    captcha.run(function()
      local tasks = fan_out(d, TASK, 3, function()
        calls = calls + 1
        captcha.sleep(0.01)
        return nil, "ERROR_CAPTCHA_UNSOLVABLE"
      end)
      assert.are.same({nil, "ERROR_CAPTCHA_UNSOLVABLE", "api"}, {tasks[1]:wait()})
      assert.are.same({nil, "ERROR_CAPTCHA_UNSOLVABLE", "dedup_wait"}, {tasks[2]:wait()})
      assert.are.same({"OK", "api"}, {d:solve(TASK, function() calls = calls + 1; return "OK" end)})
    end)
    assert.are.equal(2, calls)
    assert.are.equal(1, d:stats().errors)
    d:close()
  end)

  it("serves a cached error for error_ttl with cache_errors", function()
    local d = captcha.dedup{cache_errors = true, error_ttl = 0.05}
    captcha.run(function()
      assert.are.same({nil, "ERROR_X", "api"}, {d:solve(TASK, function() return nil, "ERROR_X" end)})
      assert.are.same({nil, "ERROR_X", "dedup_cache"}, {d:solve(TASK, error)})
      captcha.sleep(0.06)
      assert.are.same({"OK", "api"}, {d:solve(TASK, function() return "OK" end)})
    end)
    d:close()
  end)

  it("wakes waiters with the error of a leader that raises, and re-raises it in the leader", function()
    local d = captcha.dedup()
    captcha.run(function()
      local leader = captcha.spawn(function()
        return pcall(d.solve, d, TASK, function() captcha.sleep(0.01); error("boom") end)
      end)
      captcha.sleep(0)
      local waiter = captcha.spawn(function() return d:solve(TASK, error) end)
      local ok, err = leader:wait()
      assert.is_false(ok)
      assert.matches("boom", err)
      local r, werr, source = waiter:wait()
      assert.is_nil(r)
      assert.matches("boom", werr)
      assert.are.equal("dedup_wait", source)
      assert.are.same({"again", "api"}, {d:solve(TASK, function() return "again" end)})
    end)
    d:close()
  end)

  it("wakes waiters when the leader's task is cancelled (never a hang)", function()
    local d = captcha.dedup()
    captcha.run(function()
      local leader = captcha.spawn(function() return d:solve(TASK, function() captcha.sleep(10) return "late" end) end)
      captcha.sleep(0)
      local waiter = captcha.spawn(function() return d:solve(TASK, error) end)
      captcha.sleep(0.01)
      assert.is_true(leader:cancel())
      assert.are.same({nil, "dedup leader cancelled", "dedup_wait"}, {waiter:wait()})
      assert.are.same({"next", "api"}, {d:solve(TASK, function() return "next" end)})
      assert.are.equal(1, d:stats().aborted)
    end)
    d:close()
  end)

  it("expires solved results after solved_ttl", function()
    local d = captcha.dedup{solved_ttl = 0.03}
    captcha.run(function()
      assert.are.same({"A", "api"}, {d:solve(TASK, function() return "A" end)})
      assert.are.same({"A", "dedup_cache"}, {d:solve(TASK, error)})
      captcha.sleep(0.05)
      assert.are.same({"B", "api"}, {d:solve(TASK, function() return "B" end)})
    end)
    assert.are.equal(1, d:stats().expired)
    d:close()
  end)

  it("takes the lock from a leader that outlives solving_ttl", function()
    local d = captcha.dedup{solving_ttl = 0.03}
    local calls = 0
    captcha.run(function()
      local slow = captcha.spawn(function()
        return d:solve(TASK, function() calls = calls + 1; captcha.sleep(0.1); return "slow" end)
      end)
      captcha.sleep(0)
      local waiter = captcha.spawn(function() return d:solve(TASK, error) end)
      -- the parked waiter is woken by the sweep timer, not left hanging
      assert.are.same({nil, "dedup leader timed out", "dedup_wait"}, {waiter:wait()})
      local r, source = d:solve(TASK, function() calls = calls + 1; return "fresh" end)
      assert.are.same({"fresh", "api"}, {r, source})
      -- the old leader still gets its own result; it is not cached over the new one
      assert.are.same({"slow", "api"}, {slow:wait()})
      assert.are.same({"fresh", "dedup_cache"}, {d:solve(TASK, error)})
    end)
    assert.are.equal(2, calls)
    local s = d:stats()
    assert.are.equal(1, s.lock_expired)
    assert.are.equal(1, s.stale_finishes)
    d:close()
  end)

  it("evicts the least recently used entry beyond max_entries", function()
    local d = captcha.dedup{max_entries = 2}
    captcha.run(function()
      local function v(x) return function() return x end end
      d:solve("a", v("A")); d:solve("b", v("B"))
      assert.are.same({"A", "dedup_cache"}, {d:solve("a", error)}) -- a is now fresh
      d:solve("c", v("C"))                                         -- evicts b
      assert.are.same({"A", "dedup_cache"}, {d:solve("a", error)})
      assert.are.same({"B2", "api"}, {d:solve("b", v("B2"))})
    end)
    local s = d:stats()
    assert.is_true(s.evicted >= 1)
    assert.is_true(s.entries <= 2)
    d:close()
  end)

  it("removes a cancelled waiter and releases results it no longer holds", function()
    local d = captcha.dedup{solved_ttl = 0.01}
    local weak = setmetatable({}, {__mode = "v"})
    captcha.run(function()
      local leader = captcha.spawn(function()
        return d:solve(TASK, function() captcha.sleep(0.02); local r = {"token"}; weak[1] = r; return r end)
      end)
      captcha.sleep(0)
      local w = captcha.spawn(function() return d:solve(TASK, error) end)
      captcha.sleep(0)
      assert.are.equal(1, d:stats().waiting)
      assert.is_true(w:cancel())
      assert.are.equal(0, d:stats().waiting)
      assert.are.equal("token", leader:wait()[1])
      captcha.sleep(0.02)
      d:sweep()
    end)
    collectgarbage(); collectgarbage()
    assert.is_nil(weak[1]) -- the registry reference was dropped on expiry
    assert.are.equal(0, d:stats().entries)
    d:close()
  end)

  it("releases the result handed to a waiter cancelled before it could run", function()
    local d = captcha.dedup{solved_ttl = 0.01}
    local weak = setmetatable({}, {__mode = "v"})
    captcha.run(function()
      local w = captcha.spawn(function() captcha.sleep(0.001) return d:solve(TASK, error) end)
      local r = d:solve(TASK, function()
        captcha.sleep(0.01)
        local r = {"token"}
        weak[1] = r
        return r
      end)
      -- the finish just woke w with a reference to r; cancel it before it runs
      assert.are.equal("ready", w:status())
      assert.is_true(w:cancel())
      assert.are.equal("token", r[1])
      captcha.sleep(0.02)
      d:sweep()
    end)
    collectgarbage(); collectgarbage()
    assert.is_nil(weak[1])
    d:close()
  end)

  it("needs a task only to wait", function()
    local d = captcha.dedup()
    assert.are.same({"X", "api"}, {d:solve("k", function() return "X" end)})
    assert.are.same({"X", "dedup_cache"}, {d:solve("k", error)})
    d:close()
    assert.are.same({nil, "closed"}, {d:solve("k", error)})
  end)
end)
