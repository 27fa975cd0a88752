-- captcha.http.request against an in-process loopback server (captcha.http.serve).
local captcha = require "captcha"
local http = captcha.http

-- Run fn(srv) with a server whose handler is `handler`; the server is closed
-- afterwards whatever happens, so captcha.run can return.
local function with_server(handler, fn)
  return captcha.run(function()
    local srv = assert(http.serve{ handler = handler })
    local ok, err = pcall(fn, srv)
    srv:close()
    assert(ok, err)
  end)
end

local function echo(req)
  return 200, { ["X-Method"] = req.method, ["X-Path"] = req.path,
    ["X-Type"] = req.headers["content-type"] or "" }, req.body
end

describe("captcha.http.request", function()
  it("returns status, lower-case headers and body", function()
    with_server(function() return 201, { ["X-Test"] = "yes" }, "hello" end, function(srv)
      local r, err = http.request{ url = srv.url .. "/a?b=1" }
      assert.is_nil(err)
      assert.equal(201, r.status)
      assert.equal("hello", r.body)
      assert.equal("yes", r.headers["x-test"])
    end)
  end)

  it("reports HTTP errors as responses, not failures", function()
    with_server(function() return 500, nil, "oops" end, function(srv)
      local r = http.request{ url = srv.url }
      assert.equal(500, r.status)
      assert.equal("oops", r.body)
    end)
  end)

  it("sends form, json, raw and multipart bodies", function()
    with_server(echo, function(srv)
      local r = http.request{ url = srv.url, form = { a = "b c&d" } }
      assert.equal("POST", r.headers["x-method"])
      assert.equal("a=b%20c%26d", r.body)
      assert.matches("x%-www%-form%-urlencoded", r.headers["x-type"])

      r = http.request{ url = srv.url, json = { x = { 1, 2 } } }
      assert.equal('{"x":[1,2]}', r.body)
      assert.equal("application/json", r.headers["x-type"])
      assert.same({ x = { 1, 2 } }, r:json())

      r = http.request{ url = srv.url, method = "put", body = "raw", headers = { ["Content-Type"] = "text/plain" } }
      assert.equal("PUT", r.headers["x-method"])
      assert.equal("raw", r.body)
      assert.equal("text/plain", r.headers["x-type"])

      local big = string.rep("\137PNG", 1000)  -- > 1 KiB: no "Expect: 100-continue" stall
      r = http.request{ url = srv.url, multipart = { { name = "method", data = "post" },
        { name = "file", data = big, filename = "c.png", type = "image/png" } } }
      assert.matches("multipart/form%-data", r.headers["x-type"])
      assert.truthy(r.body:find('name="file"; filename="c.png"', 1, true))
      assert.truthy(r.body:find(big, 1, true))
    end)
  end)

  it("uploads a file through multipart", function()
    local path = os.tmpname()
    local f = assert(io.open(path, "wb"))
    f:write("GIF89a-file-bytes")
    f:close()
    with_server(echo, function(srv)
      local r = http.request{ url = srv.url, multipart = { { name = "file", file = path } } }
      assert.truthy(r.body:find("GIF89a-file-bytes", 1, true))
      local r2, err, kind = http.request{ url = srv.url, multipart = { { name = "file", file = "/nonexistent/x" } } }
      assert.is_nil(r2)
      assert.equal("invalid", kind)
      assert.matches("http invalid", err)
    end)
    os.remove(path)
  end)

  it("classifies transport failures", function()
    with_server(function(req)
      if req.path == "/reset" then req:reset() return end
      if req.path == "/hang" then req:hang() return end
      if req.path == "/garbage" then req:raw("garbage\r\n\r\n") return end
      return 200, nil, "ok"
    end, function(srv)
      local r, err, kind = http.request{ url = srv.url .. "/reset", timeout = 5 }
      assert.is_nil(r)
      assert.equal("reset", kind)
      r, err, kind = http.request{ url = srv.url .. "/hang", timeout = 0.1 }
      assert.is_nil(r)
      assert.equal("timeout", kind)
      assert.matches("^http timeout", err)
      r, err, kind = http.request{ url = srv.url .. "/garbage", timeout = 5 }
      assert.is_nil(r)
      assert.equal("protocol", kind)
    end)
  end)

  it("reports a refused connection", function()
    local url
    with_server(echo, function(srv) url = srv.url end)  -- closed: nothing listens there now
    captcha.run(function()
      local r, err, kind = http.request{ url = url, timeout = 5 }
      assert.is_nil(r)
      assert.equal("connect", kind)
      assert.is_string(err)
    end)
  end)

  it("cancelling the task removes the request at once", function()
    with_server(function(req) req:hang() end, function(srv)
      local before = http.stats()
      local t = captcha.spawn(http.request, { url = srv.url, timeout = 30 })
      captcha.sleep(0.05)               -- let the request go out
      assert.equal(before.active + 1, http.stats().active)
      assert.is_true(t:cancel())
      local st = http.stats()
      assert.equal(before.active, st.active)
      assert.equal(before.cancelled + 1, st.cancelled)
      local ok, err = t:wait()
      assert.is_nil(ok)
      assert.equal("cancelled", err)
    end)
  end)

  it("reuses connections (keep-alive) and honours pool limits", function()
    local inflight, max_inflight = 0, 0
    with_server(function(req)
      inflight = inflight + 1
      if inflight > max_inflight then max_inflight = inflight end
      captcha.spawn(function()            -- answer a moment later: requests overlap
        captcha.sleep(0.005)
        inflight = inflight - 1
        req:respond(200, nil, "x")
      end)
    end, function(srv)
      local pool = http.pool(4)
      local before = http.stats().connects
      local tasks = {}
      for i = 1, 40 do tasks[i] = captcha.spawn(http.request, { url = srv.url, pool = pool }) end
      for i = 1, 40 do assert.equal("x", tasks[i]:wait().body) end
      assert.is_true(max_inflight <= 4)
      assert.is_true(max_inflight >= 2)
      local opened = http.stats().connects - before
      assert.is_true(opened <= 4, "opened " .. opened .. " connections for a pool of 4")
      -- sequential requests ride one connection
      before = http.stats().connects
      for _ = 1, 20 do http.request{ url = srv.url, pool = pool } end
      assert.is_true(http.stats().connects - before <= 1)
      pool:close()
    end)
  end)

  it("raises on misuse", function()
    assert.has_error(function() http.request{ url = "http://127.0.0.1:1/" } end)  -- not in a task
    captcha.run(function()
      assert.has_error(function() http.request("x") end)
      assert.has_error(function() http.request{} end, "bad argument #1 to 'request' (url (a string) is required)")
      assert.has_error(function() http.request{ url = "http://x/", timeout = -1 } end)
      assert.has_error(function() http.request{ url = "http://x/", body = "a", form = { b = "c" } } end)
      assert.has_error(function() http.request{ url = "http://x/", headers = { ["X"] = "a\r\nB: c" } } end)
      assert.has_error(function() http.request{ url = "http://x/", form = { a = {} } } end)
      local r, err, kind = http.request{ url = "ftp://127.0.0.1/" }
      assert.is_nil(r)
      assert.equal("invalid", kind)
    end)
  end)

  it("reports the engine's counters", function()
    local st = http.stats()
    for _, k in ipairs{ "requests", "completed", "failed", "cancelled", "connects", "active", "queued" } do
      assert.is_number(st[k])
    end
    assert.equal(0, st.active)
    assert.is_true(st.async_dns)
  end)
end)
