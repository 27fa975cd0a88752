-- captcha.mock: wire shapes, error codes, knobs, /__stats, scenarios and
-- seeded determinism, driven in-process with captcha.http.request.
local captcha = require "captcha"
local json = captcha.json
local http = captcha.http

local KEY = "0123456789abcdef0123456789abcdef"
local PNG = "\137PNG\r\n\26\n" .. string.rep("\0", 120)

local function new_mock(opts)
  opts = opts or {}
  if opts.key == nil then opts.key = KEY end
  return assert(require("captcha.mock").new(opts))
end

local function get(m, path, timeout)
  local r, err = http.request{ url = m.url .. path, timeout = timeout or 5 }
  if not r then return nil, err end
  return r.body, r.status
end

local function qs(t)
  local parts = {}
  for k, v in pairs(t) do parts[#parts + 1] = k .. "=" .. v end
  table.sort(parts)
  return table.concat(parts, "&")
end

local function submit(m, fields)
  fields.key = fields.key or KEY
  return (get(m, "/in.php?" .. qs(fields)))
end

local function poll(m, id, extra)
  return (get(m, "/res.php?key=" .. KEY .. "&action=get&id=" .. id .. (extra or "")))
end

local TURNSTILE = { method = "turnstile", sitekey = "0x4AAA", pageurl = "https://example.com" }
local function copy(t, more)
  local c = {}
  for k, v in pairs(t) do c[k] = v end
  for k, v in pairs(more or {}) do c[k] = v end
  return c
end

local function mock_run(opts, fn)
  captcha.run(function()
    local m = new_mock(opts)
    local ok, err = pcall(fn, m)
    m:close()
    assert(ok, err)
  end)
end

describe("captcha.mock wire format", function()
  it("accepts in.php by GET query and answers plain and json=1", function()
    mock_run({}, function(m)
      local body = submit(m, copy(TURNSTILE))
      local id = body:match("^OK|(%d+)$")
      assert.is_string(id)
      local ans = poll(m, id)
      assert.matches("^OK|0%.mock", ans)
      local j = json.decode(poll(m, id, "&json=1"))
      assert.equal(1, j.status)
      assert.matches("^0%.mock", j.request)
      assert.is_string(j.useragent)
      j = json.decode(submit(m, copy(TURNSTILE, { json = 1 })))
      assert.equal(1, j.status)
      assert.is_string(j.request)
    end)
  end)

  it("accepts POST form, multipart and JSON bodies", function()
    mock_run({}, function(m)
      local r = assert(http.request{ url = m.url .. "/in.php", method = "POST",
        form = { key = KEY, method = "userrecaptcha", googlekey = "6Le", pageurl = "https://a.b", json = "1" } })
      assert.equal(1, json.decode(r.body).status)

      local b = "XyZbOuNdArY"
      local function part(name, value, filename)
        return "--" .. b .. "\r\nContent-Disposition: form-data; name=\"" .. name .. "\""
          .. (filename and ("; filename=\"" .. filename .. "\"\r\nContent-Type: image/png") or "")
          .. "\r\n\r\n" .. value .. "\r\n"
      end
      local body = part("key", KEY) .. part("method", "post") .. part("file", PNG, "c.png") .. "--" .. b .. "--\r\n"
      r = assert(http.request{ url = m.url .. "/in.php", method = "POST", body = body,
        headers = { ["Content-Type"] = "multipart/form-data; boundary=" .. b } })
      assert.matches("^OK|%d+$", r.body)
      local id = r.body:match("%d+")
      assert.matches("^OK|%a+$", poll(m, id))

      r = assert(http.request{ url = m.url .. "/in.php", method = "POST",
        headers = { ["Content-Type"] = "application/json" },
        body = json.encode{ key = KEY, method = "geetest", gt = "g", challenge = "ch", pageurl = "https://x", json = 1 } })
      id = json.decode(r.body).request
      local j = json.decode(poll(m, id, "&json=1"))
      assert.equal("ch", j.request.challenge)
      assert.is_string(j.request.validate)
      assert.is_string(j.request.seccode)
      assert.matches('^OK|{', poll(m, id))  -- plain: the object as JSON text
    end)
  end)

  it("answers the documented error codes", function()
    mock_run({}, function(m)
      assert.equal("ERROR_KEY_DOES_NOT_EXIST", submit(m, copy(TURNSTILE, { key = string.rep("f", 32) })))
      assert.equal("ERROR_WRONG_USER_KEY", submit(m, copy(TURNSTILE, { key = "short" })))
      assert.equal("ERROR_WRONG_USER_KEY", get(m, "/res.php?action=get&id=1"))
      assert.equal("ERROR_PAGEURL", submit(m, { method = "turnstile", sitekey = "x" }))
      assert.equal("ERROR_BAD_PARAMETERS", submit(m, { method = "turnstile", pageurl = "https://a" }))
      assert.equal("ERROR_GOOGLEKEY", submit(m, { method = "userrecaptcha", pageurl = "https://a" }))
      assert.equal("ERROR_PAGEURL", submit(m, { method = "userrecaptcha", googlekey = "k" }))
      assert.equal("ERROR_EMPTY_ACTION", submit(m, { method = "userrecaptcha", googlekey = "k",
                                                   pageurl = "https://a", version = "v3" }))
      assert.equal("ERROR_BAD_PARAMETERS", submit(m, { method = "geetest", gt = "g", pageurl = "https://a" }))
      assert.equal("ERROR_BAD_PARAMETERS", submit(m, { method = "nosuch", pageurl = "https://a" }))
      assert.equal("ERROR_BAD_PARAMETERS", submit(m, { method = "hcaptcha", sitekey = "s", pageurl = "https://a" }))
      assert.equal("ERROR_ZERO_CAPTCHA_FILESIZE", submit(m, { method = "base64" }))
      assert.equal("ERROR_IMAGE_TYPE_NOT_SUPPORTED", submit(m, { method = "base64", body = string.rep("QUFB", 50) }))
      assert.equal("ERROR_PROXY_FORMAT", submit(m, copy(TURNSTILE, { proxy = "nope" })))
      assert.equal("ERROR_WRONG_CAPTCHA_ID", poll(m, "12345"))
      assert.equal("ERROR_WRONG_ID_FORMAT", poll(m, "abc"))
      assert.equal("ERROR_BAD_PARAMETERS", poll(m, "1", "&ids=1,2"))  -- captchaai: no ids=
      local j = json.decode(submit(m, { method = "turnstile", sitekey = "s", json = 1 }))
      assert.same({ status = 0, request = "ERROR_PAGEURL", error_text = "ERROR_PAGEURL" }, j)
      assert.equal("100", get(m, "/res.php?key=" .. KEY .. "&action=getbalance"))
    end)
  end)

  it("records reports once, for finished tasks", function()
    mock_run({}, function(m)
      local id = submit(m, copy(TURNSTILE)):match("%d+")
      local rep = "/res.php?key=" .. KEY .. "&action=reportbad&id=" .. id
      assert.equal("ERROR_REPORT_NOT_RECORDED", get(m, rep))
      poll(m, id)
      assert.equal("OK_REPORT_RECORDED", get(m, rep))
      assert.equal("ERROR_DUPLICATE_REPORT", get(m, rep))
      assert.equal("ERROR_WRONG_CAPTCHA_ID", get(m, "/res.php?key=" .. KEY .. "&action=reportgood&id=99"))
      assert.equal(1, m:stats().reports.bad)
    end)
  end)

  it("batches ids= polls on the 2captcha profile", function()
    mock_run({ provider = "2captcha" }, function(m)
      local a = submit(m, copy(TURNSTILE)):match("%d+")
      local b = submit(m, copy(TURNSTILE)):match("%d+")
      m:set{ latency = 1000 }
      local c = submit(m, copy(TURNSTILE)):match("%d+")
      local out = get(m, "/res.php?key=" .. KEY .. "&action=get&ids=" .. table.concat({ a, c, "1", b }, ","))
      local parts = {}
      for s in out:gmatch("[^|]+") do parts[#parts + 1] = s end
      assert.equal(4, #parts)
      assert.matches("^0%.mock", parts[1])
      assert.equal("CAPCHA_NOT_READY", parts[2])
      assert.equal("ERROR_WRONG_CAPTCHA_ID", parts[3])
      assert.matches("^0%.mock", parts[4])
      -- json=true is json=1 here too, as for every other answer
      local j = json.decode(get(m, "/res.php?key=" .. KEY .. "&action=get&json=true&ids=" .. a))
      assert.equal(1, j.status)
      assert.matches("^0%.mock", j.request)
    end)
  end)
end)

describe("captcha.mock knobs", function()
  it("keeps a task not ready for its latency", function()
    mock_run({ latency = { turnstile = 1000, default = 0 } }, function(m)
      local t = submit(m, copy(TURNSTILE)):match("%d+")
      local g = submit(m, { method = "userrecaptcha", googlekey = "k", pageurl = "https://a" }):match("%d+")
      assert.equal("CAPCHA_NOT_READY", poll(m, t))
      assert.matches("^OK|03AG", poll(m, g))
      assert.equal(1, m:stats().solving)
    end)
  end)

  it("answers unsolvable, no slot, thread limit, rate ceiling and zero balance", function()
    mock_run({ unsolvable_rate = { turnstile = 1 } }, function(m)
      local id = submit(m, copy(TURNSTILE)):match("%d+")
      assert.equal("ERROR_CAPTCHA_UNSOLVABLE", poll(m, id))
      m:set{ unsolvable_rate = 0, no_slot_rate = 1 }
      assert.equal("ERROR_NO_SLOT_AVAILABLE", submit(m, copy(TURNSTILE)))
      m:set{ no_slot_rate = 0, threads = 2, latency = 1000 }
      assert.matches("^OK", submit(m, copy(TURNSTILE)))
      assert.matches("^OK", submit(m, copy(TURNSTILE)))
      assert.equal("ERROR_NO_SLOT_AVAILABLE", submit(m, copy(TURNSTILE)))
      m:set{ threads = json.null, zero_balance = true }
      assert.equal("ERROR_ZERO_BALANCE", submit(m, copy(TURNSTILE)))
      m:set{ zero_balance = false, submit_rate = 1 }
      -- every submit above was within the last second or not: the window
      -- holds at least this one and the next, so the next is refused
      submit(m, copy(TURNSTILE))
      assert.equal("ERROR_TOO_MUCH_REQUESTS", submit(m, copy(TURNSTILE)))
      local st = m:stats()
      assert.is_true(st.max_submits_per_second >= 2)
      assert.is_true(st.submit_answers.ERROR_TOO_MUCH_REQUESTS >= 1)
    end)
  end)

  it("charges per solve on the 2captcha profile until ERROR_ZERO_BALANCE", function()
    mock_run({ provider = "2captcha", balance = 1, price = 0.5 }, function(m)
      assert.matches("^OK", submit(m, copy(TURNSTILE)))
      assert.matches("^OK", submit(m, copy(TURNSTILE)))
      assert.equal("ERROR_ZERO_BALANCE", submit(m, copy(TURNSTILE)))
      assert.equal("0", get(m, "/res.php?key=" .. KEY .. "&action=getbalance"))
    end)
  end)

  it("injects transport faults", function()
    mock_run({ faults = { http500 = 1 } }, function(m)
      local url = "/in.php?" .. qs(copy(TURNSTILE, { key = KEY }))
      local body, status = get(m, url)
      assert.equal(500, status)
      assert.matches("500", body)
      m:set{ faults = { garbage = 1 } }
      body, status = get(m, url)
      assert.equal(200, status)
      assert.matches("garbage", body)
      m:set{ faults = { reset = 1 } }
      assert.is_nil(submit(m, copy(TURNSTILE)))
      m:set{ faults = { hang = 1 } }
      assert.is_nil(get(m, "/in.php?key=" .. KEY, 0.2))
      m:set{ faults = { drip = 1 }, drip_chunk = 5, drip_interval = 0.001 }
      assert.matches("^OK|%d+$", submit(m, copy(TURNSTILE)))
      m:set{ faults = {} }
      local f = m:stats().faults
      assert.same({ http500 = 1, garbage = 1, reset = 1, hang = 1, drip = 1 }, f)
      assert.has_error(function() m:set{ faults = { nosuch = 1 } } end)
      assert.has_error(function() m:set{ nosuch = 1 } end)
    end)
  end)
end)

describe("captcha.mock /__stats", function()
  it("counts submits, polls, answers by code and requests by endpoint", function()
    mock_run({ unsolvable_rate = 0.5, seed = 7 }, function(m)
      local ids = {}
      for i = 1, 20 do ids[i] = submit(m, copy(TURNSTILE)):match("%d+") end
      local solved, failed = 0, 0
      for _, id in ipairs(ids) do
        local a = poll(m, id)
        if a:match("^OK|") then solved = solved + 1 else failed = failed + 1 end
      end
      submit(m, { method = "turnstile", sitekey = "s" })
      local st = json.decode(get(m, "/__stats"))
      assert.equal(21, st.submits)
      assert.equal(20, st.polls)
      assert.equal(20, st.submit_answers.OK)
      assert.equal(1, st.submit_answers.ERROR_PAGEURL)
      assert.equal(solved, st.poll_answers.OK)
      assert.equal(failed, st.poll_answers.ERROR_CAPTCHA_UNSOLVABLE)
      assert.equal(solved, st.solved)
      assert.equal(failed, st.unsolvable)
      assert.is_true(solved > 0 and failed > 0)
      assert.equal(21, st.requests["in"])
      assert.equal(20, st.requests.res)
      assert.equal(1, st.requests.stats)
      assert.is_true(st.max_submits_per_second >= 1 and st.max_submits_per_second <= 21)
      assert.equal(0, st.solving)
    end)
  end)

  it("changes knobs over HTTP with POST /__set", function()
    mock_run({}, function(m)
      local r = assert(http.request{ url = m.url .. "/__set", method = "POST",
                                     body = '{"zero_balance":true}' })
      assert.equal(200, r.status)
      assert.equal("ERROR_ZERO_BALANCE", submit(m, copy(TURNSTILE)))
      r = assert(http.request{ url = m.url .. "/__set", method = "POST", body = '{"bogus":1}' })
      assert.equal(400, r.status)
    end)
  end)
end)

describe("captcha.mock scenario and determinism", function()
  it("switches knobs at the scenario's times", function()
    mock_run({ scenario = { { at = 0.05, set = { unsolvable_rate = { turnstile = 1 } } },
                            { at = 3600, set = { zero_balance = true } } } }, function(m)
      local id = submit(m, copy(TURNSTILE)):match("%d+")
      assert.matches("^OK|", poll(m, id))
      local deadline = captcha.now() + 10
      while (m:stats().scenario_step or 0) < 1 and captcha.now() < deadline do captcha.sleep(0.01) end
      assert.equal(1, m:stats().scenario_step)
      id = submit(m, copy(TURNSTILE)):match("%d+")
      assert.equal("ERROR_CAPTCHA_UNSOLVABLE", poll(m, id))
    end)
  end)

  it("loads a scenario file", function()
    local path = os.tmpname()
    local f = assert(io.open(path, "w"))
    f:write("return { { at = 0, set = { no_slot_rate = 1 } } }\n")
    f:close()
    mock_run({ scenario = path }, function(m)
      local deadline = captcha.now() + 10
      while not m:stats().scenario_step and captcha.now() < deadline do captcha.sleep(0.01) end
      assert.equal("ERROR_NO_SLOT_AVAILABLE", submit(m, copy(TURNSTILE)))
    end)
    os.remove(path)
  end)

  it("gives byte-identical object answers for the same seed in every process", function()
    -- Key order must not follow the per-process string hash seed of pairs().
    local exe = assert(os.getenv("CAPTCHARUN"), "CAPTCHARUN: path of the captcharun binary")
    local path = os.tmpname()
    local f = assert(io.open(path, "w"))
    f:write([[
local captcha = require "captcha"
captcha.run(function()
  local m = assert(require("captcha.mock").new{ seed = 3 })
  local function get(q) return assert(captcha.http.request{ url = m.url .. q, timeout = 5 }).body end
  local id = get("/in.php?key=k&method=geetest&gt=g&challenge=c&pageurl=https://a"):match("%d+")
  print(get("/res.php?key=k&action=get&id=" .. id))
  print(get("/res.php?key=k&action=get&id=" .. id .. "&json=1"))
  m:close()
end)
]])
    f:close()
    local outs = {}
    for i = 1, 8 do
      local p = assert(io.popen(exe .. " --log-level off " .. path))
      outs[i] = p:read("a")
      p:close()
    end
    os.remove(path)
    assert.matches('^OK|{"challenge":"c","validate":"%x+","seccode":"%x+|jordan"}\n', outs[1])
    assert.matches('\n{"status":1,"request":{"challenge":"c",', outs[1])
    for i = 2, 8 do assert.equal(outs[1], outs[i]) end
  end)

  it("gives the same ids, outcomes and answers for the same seed", function()
    local function transcript(seed)
      local out = {}
      mock_run({ seed = seed, unsolvable_rate = 0.5, no_slot_rate = 0.2 }, function(m)
        for _ = 1, 30 do
          local s = submit(m, copy(TURNSTILE))
          out[#out + 1] = s
          local id = s:match("^OK|(%d+)")
          if id then out[#out + 1] = poll(m, id) end
        end
      end)
      return table.concat(out, "\n")
    end
    local a, b, c = transcript(42), transcript(42), transcript(43)
    assert.equal(a, b)
    assert.not_equal(a, c)
    assert.matches("ERROR_CAPTCHA_UNSOLVABLE", a)
    assert.matches("ERROR_NO_SLOT_AVAILABLE", a)
  end)
end)
