-- captcha.http.serve: the HTTP server primitive, driven in-process with
-- captcha.http.request as the client.
local captcha = require "captcha"
local http = captcha.http

local function serve(handler, opts)
  opts = opts or {}
  opts.handler = handler
  return assert(http.serve(opts))
end

describe("captcha.http.serve", function()
  it("passes method, path, query, headers, body and form to the handler", function()
    captcha.run(function()
      local seen
      local srv = serve(function(req)
        seen = { method = req.method, path = req.path, q = req.query, h = req.headers,
                 body = req.body, form = req.form, nothing = req.nothing }
        return 201, { ["X-Reply"] = "yes", ["Content-Type"] = "application/json" }, '{"a":1}'
      end)
      assert.is_true(srv.port > 0)
      assert.equal("http://127.0.0.1:" .. srv.port, srv.url)
      local r = assert(http.request{ url = srv.url .. "/x/y?a=1&b=%20two+words&c", method = "POST",
                                     headers = { ["X-Test"] = "Hi" }, form = { k = "v w", z = "&=" } })
      assert.equal(201, r.status)
      assert.equal('{"a":1}', r.body)
      assert.equal("yes", r.headers["x-reply"])
      assert.equal("application/json", r.headers["content-type"])
      assert.equal("POST", seen.method)
      assert.equal("/x/y", seen.path)
      assert.same({ a = "1", b = " two words", c = "" }, seen.q)
      assert.equal("Hi", seen.h["x-test"])
      assert.same({ k = "v w", z = "&=" }, seen.form)
      assert.is_nil(seen.nothing)
      srv:close()
      assert.is_true(srv.closed)
      srv:close() -- idempotent
    end)
  end)

  it("serves keep-alive connections and many concurrent clients", function()
    captcha.run(function()
      local n = 0
      local srv = serve(function(req)
        n = n + 1
        return 200, nil, req.query.i
      end)
      local tasks = {}
      for i = 1, 50 do
        tasks[i] = captcha.spawn(function()
          for j = 1, 10 do
            local r = assert(http.request{ url = srv.url .. "/?i=" .. (i * 100 + j) })
            assert.equal(tostring(i * 100 + j), r.body)
          end
          return true
        end)
      end
      for _, t in ipairs(tasks) do assert(t:wait()) end
      assert.equal(500, n)
      local st = srv:stats()
      assert.equal(500, st.requests)
      assert.equal(500, st.responses)
      assert.is_true(st.accepted <= 50 + 5)   -- connections were reused
      srv:close()
    end)
  end)

  it("lets a handler answer later from its own task", function()
    captcha.run(function()
      local srv = serve(function(req)
        captcha.spawn(function()
          captcha.sleep(0.01)
          assert.is_true(req:pending())
          assert.is_true(req:respond(202, nil, "later"))
          local ok, err = req:respond(200, nil, "twice")
          assert.is_nil(ok)
          assert.equal("request already answered", err)
        end)
      end)
      local r = assert(http.request{ url = srv.url .. "/" })
      assert.equal(202, r.status)
      assert.equal("later", r.body)
      srv:close()
    end)
  end)

  it("answers 500 when the handler raises, and goes on", function()
    captcha.run(function()
      local lvl = captcha.log.level("off")
      local srv = serve(function(req)
        if req.path == "/boom" then error("boom") end
        return 200, nil, "fine"
      end)
      assert.equal(500, assert(http.request{ url = srv.url .. "/boom" }).status)
      assert.equal("fine", assert(http.request{ url = srv.url .. "/ok" }).body)
      captcha.log.level(lvl)
      srv:close()
    end)
  end)

  it("answers 500 when the handler returns what respond refuses, and goes on", function()
    captcha.run(function()
      local lvl = captcha.log.level("off")
      local srv = serve(function(req)
        if req.path == "/body-as-headers" then return 200, "oops" end
        if req.path == "/bad-status" then return 42 end
        if req.path == "/bad-header" then return 200, { ["X\r\nY"] = "z" }, "" end
        return 200, nil, "fine"
      end)
      for _, path in ipairs{ "/body-as-headers", "/bad-status", "/bad-header" } do
        local r, err = http.request{ url = srv.url .. path, timeout = 2 }
        assert.is_table(r, err)
        assert.equal(500, r.status)
        assert.equal("fine", assert(http.request{ url = srv.url .. "/ok", timeout = 2 }).body)
      end
      captcha.log.level(lvl)
      srv:close()
    end)
  end)

  it("injects connection faults: reset, hang, raw garbage, slow drip", function()
    captcha.run(function()
      local srv = serve(function(req)
        if req.path == "/reset" then req:reset()
        elseif req.path == "/hang" then req:hang()
        elseif req.path == "/raw" then req:raw("this is not HTTP")
        elseif req.path == "/drip" then req:drip(200, nil, "slow but whole", 3, 0.002)
        end
      end)
      local r, err = http.request{ url = srv.url .. "/reset", timeout = 5 }
      assert.is_nil(r)
      assert.is_string(err)
      r, err = http.request{ url = srv.url .. "/hang", timeout = 0.2 }
      assert.is_nil(r)
      assert.is_string(err)
      r, err = http.request{ url = srv.url .. "/raw", timeout = 5 }
      assert.is_nil(r)
      assert.is_string(err)
      r = assert(http.request{ url = srv.url .. "/drip", timeout = 5 })
      assert.equal("slow but whole", r.body)
      srv:close()
    end)
  end)

  it("refuses oversized bodies with 413", function()
    captcha.run(function()
      local srv = serve(function() return 200, nil, "no" end, { max_body = 100 })
      local r = assert(http.request{ url = srv.url .. "/", method = "POST", body = string.rep("x", 1000) })
      assert.equal(413, r.status)
      srv:close()
    end)
  end)

  it("reports a busy port as nil, err and misuse as an error", function()
    captcha.run(function()
      local srv = serve(function() end)
      local s2, err = http.serve{ port = srv.port, handler = function() end }
      assert.is_nil(s2)
      assert.matches("cannot listen", err)
      assert.has_error(function() http.serve{ port = 0 } end)
      assert.has_error(function() http.serve{ port = 70000, handler = print } end)
      assert.has_error(function() http.serve{ host = 5, handler = print } end)
      srv:close()
    end)
  end)

  it("rejects bad response headers", function()
    captcha.run(function()
      local err, err_nul
      local srv = serve(function(req)
        local ok, e = pcall(req.respond, req, 200, { ["Bad\r\nName"] = "x" }, "")
        err = not ok and e
        -- a NUL must not hide a CR LF from the check (header injection)
        ok, e = pcall(req.respond, req, 200, { ["X-A"] = "v\0\r\nX-Injected: 1" }, "")
        err_nul = not ok and e
        return 200, nil, "after"
      end)
      local r = assert(http.request{ url = srv.url .. "/" })
      assert.equal("after", r.body)
      assert.is_nil(r.headers["x-injected"])
      assert.matches("headers", err)
      assert.matches("headers", err_nul)
      srv:close()
    end)
  end)

  it("decodes forms", function()
    assert.same({ a = "1 2", ["b c"] = "=", d = "" }, http.decode_form("a=1+2&b%20c=%3D&d&&"))
  end)
end)
