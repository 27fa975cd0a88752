--- captcha.mock: a CaptchaAI / 2captcha compatible provider on 127.0.0.1.
--
--   local mock = captcha.mock{ key = "test", seed = 1,
--     latency = { turnstile = {0.01, 0.05}, default = 0.01 },
--     unsolvable_rate = 0.05, no_slot_rate = { turnstile = 0.1 },
--     threads = 50, submit_rate = 100, faults = { http500 = 0.01, reset = 0.01 } }
--   local client = captcha.client{ key = "test", base_url = mock.url }
--   ... mock:stats() ; mock:set{ unsolvable_rate = 0.3 } ; mock:close()
--
-- Wire format (PROTOCOL.md): in.php takes its fields from the query string, a
-- urlencoded or multipart form, or a JSON body; answers are plain (`OK|id`,
-- `ERROR_...`) or, with json=1, `{"status":1|0,"request":...}`. res.php serves
-- action=get (id=, and ids= on the 2captcha profile), getbalance, reportgood
-- and reportbad. GET /__stats returns the counters as JSON; POST /__set takes a
-- JSON object of knobs (what :set takes).
--
-- Solving costs no timer: a task is "ready at" submit time + latency, and a
-- poll compares the clock. A task is one slot in a ring of parallel arrays
-- (dropped `ttl` seconds after submit) plus, while it solves, one entry in a
-- heap of ready times (the thread limit). No table per task: a table each
-- was ~700 bytes per task, and a fifth of a submit's CPU went to the
-- collector marking and sweeping them (perf, 200,000 submits).
--
-- Determinism: every random choice comes from one xorshift64 generator seeded
-- with `seed`, in request order, so the same requests in the same order get
-- the same ids, outcomes, latencies and answers.
local captcha = require "captcha"
local json = captcha.json

local M = {}
local Mock = {}
Mock.__index = Mock

local METHODS = {
  post = "image", base64 = "image", userrecaptcha = "token", turnstile = "token",
  geetest = "token", hcaptcha = "token", cloudflare_challenge = "token",
  captchafox = "token", friendly_captcha = "token", lemin = "token",
}

local DEFAULTS = {
  provider = "captchaai",
  latency = 0,             -- seconds: number, {lo, hi}, or per method {turnstile = ..., default = ...}
  unsolvable_rate = 0,     -- number or per method
  no_slot_rate = 0,        -- number or per method
  threads = nil,           -- concurrent unsolved tasks; more answer ERROR_NO_SLOT_AVAILABLE
  submit_rate = nil,       -- in.php calls per sliding second; more answer ERROR_TOO_MUCH_REQUESTS
  balance = 100,
  price = 0,               -- 2captcha profile: charged per solved task; below it, ERROR_ZERO_BALANCE
  zero_balance = false,    -- every submit answers ERROR_ZERO_BALANCE (both profiles)
  faults = {},             -- { http500 =, garbage =, reset =, hang =, drip = } rates per request
  drip_chunk = 4,          -- slow answers: bytes per piece
  drip_interval = 0.05,    --   and seconds between pieces
  ttl = 900,               -- seconds a task is remembered after submit
  integer_ids = false,     -- json=1 submit answers carry the id as a JSON integer (as CA may)
  check_images = true,     -- image method: size and type (jpg/png/gif) checks
  useragent = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0 Safari/537.36",
}

local FAULTS = { "http500", "garbage", "reset", "hang", "drip" }

-- ---- random numbers ----

local fmt = string.format

-- rand() -> [0, 1). hex(n) (n <= 48) -> n random hex digits as up to three
-- integers of 16 digits each, first digit first, for string.format("%016x").
-- A digit is exactly what floor(rand() * 16) would draw (the top 4 bits of
-- the state: (s >> 11) * 2^-53 * 16 floors to s >> 60), so a seed gives the
-- same answers as when they were built a character at a time, for a fifth
-- of the cost and no intermediate strings.
local function rng_new(seed)
  local s = (math.tointeger(seed) or 1) ~ 0x2545F4914F6CDD1D
  if s == 0 then s = 1 end
  local function rand()
    s = s ~ (s << 13); s = s ~ (s >> 7); s = s ~ (s << 17)
    return (s >> 11) * 2.0^-53
  end
  local function hex(n)
    local x, a, b, c = s, 0, 0, 0
    for _ = 1, n < 16 and n or 16 do
      x = x ~ (x << 13); x = x ~ (x >> 7); x = x ~ (x << 17); a = a << 4 | x >> 60
    end
    for _ = 17, n < 32 and n or 32 do
      x = x ~ (x << 13); x = x ~ (x >> 7); x = x ~ (x << 17); b = b << 4 | x >> 60
    end
    for _ = 33, n do
      x = x ~ (x << 13); x = x ~ (x >> 7); x = x ~ (x << 17); c = c << 4 | x >> 60
    end
    s = x
    return a, b, c
  end
  return rand, hex
end

-- ---- knobs ----

function Mock:knob(name, method)
  local v = self.knobs[name]
  if type(v) == "table" and v[1] == nil and name ~= "faults" then
    local m = v[method]
    if m == nil then m = v.default end
    if m == nil then m = v["*"] end
    return m
  end
  return v
end

local function latency_of(self, method)
  local v = self:knob("latency", method) or 0
  if type(v) == "table" then
    local lo, hi = v[1], v[2] or v[1]
    return lo + (hi - lo) * self.rand()
  end
  return v
end

local function check_knobs(k)
  assert(k.provider == "captchaai" or k.provider == "2captcha",
         "mock: 'provider' must be \"captchaai\" or \"2captcha\"")
  for _, f in ipairs{ "unsolvable_rate", "no_slot_rate", "latency" } do
    local v = k[f]
    assert(v == nil or type(v) == "number" or type(v) == "table",
           "mock: '" .. f .. "' must be a number or a table")
  end
  assert(type(k.faults) == "table", "mock: 'faults' must be a table of rates")
  for name in pairs(k.faults) do
    local known = false
    for _, f in ipairs(FAULTS) do known = known or f == name end
    assert(known, "mock: unknown fault '" .. tostring(name) .. "' (http500, garbage, reset, hang, drip)")
  end
end

local KNOB_NAMES = {}
for k in pairs(DEFAULTS) do KNOB_NAMES[k] = true end
KNOB_NAMES.key = true
KNOB_NAMES.threads = true
KNOB_NAMES.submit_rate = true

--- mock:set{knob = value, ...}: change knobs now (tables replace the old value).
function Mock:set(t)
  assert(type(t) == "table", "mock:set expects a table of knobs")
  local k = setmetatable({}, { __index = self.knobs })
  for name, v in pairs(t) do
    if not KNOB_NAMES[name] then error("mock: unknown knob '" .. tostring(name) .. "'", 2) end
    if v == json.null then v = nil end
    rawset(k, name, v)
  end
  check_knobs(k)
  for name in pairs(t) do
    local v = rawget(k, name)
    self.knobs[name] = v
  end
  if t.balance then self.balance = t.balance end
  if t.key then captcha.log.secret(t.key) end
end

-- ---- counters ----

local function count(t, k) t[k] = (t[k] or 0) + 1 end

-- A binary min-heap of ready times: solving = entries still in the future.
local function heap_push(h, v)
  local n = #h + 1
  h[n] = v
  while n > 1 do
    local p = n // 2
    if h[p] <= v then break end
    h[n], h[p] = h[p], v
    n = p
  end
end

local function heap_pop(h)
  local n = #h
  local top, last = h[1], h[n]
  h[n] = nil
  n = n - 1
  if n > 0 then
    local i = 1
    while true do
      local l = 2 * i
      if l > n then break end
      if l < n and h[l + 1] < h[l] then l = l + 1 end
      if h[l] >= last then break end
      h[i] = h[l]
      i = l
    end
    h[i] = last
  end
  return top
end

function Mock:solving(now)
  local h = self.ready
  while h[1] and h[1] <= now do heap_pop(h) end
  return #h
end

-- An array 1..n filled with false: Lua keeps it in the table's array part,
-- where a ring's moving indices cost no rehash (integer keys that only ever
-- grow live in the hash part and rehash it every few thousand inserts).
local function falses(n)
  local a = {}
  for i = 1, n do a[i] = false end
  return a
end

-- The submits of the last second, as a ring of timestamps: exact sliding max.
local function window_add(self, now)
  local w = self.win
  local cap, head, n = w.cap, w.head, w.n
  local old = now - 1
  while n > 0 and w[head] <= old do
    head = head % cap + 1
    n = n - 1
  end
  if n == cap then  -- full: double it, oldest first
    local nw = falses(2 * cap)
    for i = 1, n do nw[i] = w[(head + i - 2) % cap + 1] end
    cap, head, w = 2 * cap, 1, nw
    w.cap = cap
    self.win = w
  end
  w[(head + n - 1) % cap + 1] = now
  n = n + 1
  w.head, w.n = head, n
  if n > self.st.max_submits_per_second then self.st.max_submits_per_second = n end
  return n
end

local function window_new(cap)
  local w = falses(cap)
  w.cap, w.head, w.n = cap, 1, 0
  return w
end

-- ---- tasks ----

-- Task ids are ID_BASE + seq (seq = 1, 2, ...). A task is slot seq % cap of
-- each array below (cap a power of two, doubled when the live tasks fill it).
local ID_BASE = 70000000000
local FIELDS = { "method", "created", "ready_at", "answer", "useragent", "state" }
local UNSOLVABLE, DONE, REPORTED_GOOD, REPORTED_BAD = 1, 2, 4, 8  -- `state` bits

local function tasks_new(cap)
  local t = { cap = cap, mask = cap - 1, first = 1, last = 0 }
  for _, f in ipairs(FIELDS) do t[f] = falses(cap) end
  return t
end

local function tasks_grow(t)
  local n = tasks_new(2 * t.cap)
  n.first, n.last = t.first, t.last
  local om, nm = t.mask, n.mask
  for _, f in ipairs(FIELDS) do
    local a, b = t[f], n[f]
    for seq = t.first, t.last do b[(seq & nm) + 1] = a[(seq & om) + 1] end
  end
  return n
end

-- The slot of a live task, from an id of digits only. Ids are compared as
-- strings, as a table keyed by id would: "070000000001" is not a task id.
local function task_slot(self, id)
  if #id > 18 or id:byte(1) == 48 then return nil end
  local t = self.tasks
  local seq = tonumber(id) - ID_BASE
  if seq < t.first or seq > t.last then return nil end
  return (seq & t.mask) + 1
end

-- ---- answers ----

local JSON_H = { ["Content-Type"] = "application/json" }

-- JSON text of an answer, objects (GeeTest's) in a fixed key order:
-- json.encode follows pairs(), whose order changes with each process's
-- string hash seed, and a seed must give the same bytes in every run.
local GEETEST_KEYS = { "challenge", "validate", "seccode" }
local function answer_json(v)
  if type(v) ~= "table" then return json.encode(v) end
  local out = {}
  for i, k in ipairs(GEETEST_KEYS) do out[i] = json.encode(k) .. ":" .. json.encode(v[k]) end
  return "{" .. table.concat(out, ",") .. "}"
end

-- A useragent needs no JSON escaping unless it holds '"', '\' or a control
-- character (cJSON writes the rest, UTF-8 too, as is). It is a knob, so the
-- last one found clean is remembered: scanning its 100 bytes with a pattern
-- on every poll cost more than the rest of the poll's Lua.
local function ua_clean(self, ua)
  if ua == self.clean_ua then return true end
  if ua:find('[%c"\\]') then return false end
  self.clean_ua = ua
  return true
end

-- kind: "in" (submit), "poll" (res.php get) or "other" (balance, reports).
-- ua: the useragent field of a solved Turnstile/Cloudflare task, or nil.
-- clean: `value` is known to hold only [%w._|-] (error codes, task ids and
-- the answers make_answer builds), so the per-byte check is skipped.
local function reply(self, p, kind, code, ok, value, ua, clean)
  local st = self.st
  count(st.answers, code)
  if kind == "in" then count(st.submit_answers, code)
  elseif kind == "poll" then count(st.poll_answers, code) end
  local pj = p.json
  if pj == "1" or pj == "true" then
    value = value or code
    -- The common answers are our own ASCII strings: format them directly
    -- (cJSON builds a tree per call, a third of a poll's CPU here).
    if type(value) == "string" and (clean or not value:find('[^%w%.%-_|]'))
       and (not ua or ua_clean(self, ua)) then
      if not ok then return 200, JSON_H, '{"status":0,"request":"' .. value .. '","error_text":"' .. code .. '"}' end
      if ua then return 200, JSON_H, '{"status":1,"request":"' .. value .. '","useragent":"' .. ua .. '"}' end
      return 200, JSON_H, '{"status":1,"request":"' .. value .. '"}'
    end
    local s = '{"status":' .. (ok and 1 or 0) .. ',"request":' .. answer_json(value)
    if not ok then s = s .. ',"error_text":' .. json.encode(code) end
    if ua then s = s .. ',"useragent":' .. json.encode(ua) end
    return 200, JSON_H, s .. "}"
  end
  if ok then
    if type(value) == "table" then value = answer_json(value) end
    if code == "OK" then return 200, nil, "OK|" .. tostring(value) end
    return 200, nil, tostring(value)
  end
  return 200, nil, code
end

local function fail(self, p, endpoint, code) return reply(self, p, endpoint, code, false, nil, nil, true) end

-- ---- request parameters ----

local function scalar(v)
  if math.type(v) == "integer" then return tostring(v) end
  if type(v) == "number" then return tostring(v) end
  if type(v) == "boolean" then return v and "1" or "0" end
  if type(v) == "string" then return v end
  return nil
end

local function parse_multipart(body, ctype, into, files)
  local boundary = ctype:match('boundary="([^"]+)"') or ctype:match("boundary=([^;%s]+)")
  if not boundary then return false end
  local delim = "--" .. boundary
  local pos = body:find(delim, 1, true)
  if not pos then return false end
  pos = pos + #delim
  while true do
    if body:sub(pos, pos + 1) == "--" then break end
    local hstart = body:find("\r\n", pos, true)
    if not hstart then return false end
    local hend = body:find("\r\n\r\n", hstart, true)
    if not hend then return false end
    local head = body:sub(hstart + 2, hend - 1)
    local nextb = body:find("\r\n" .. delim, hend + 4, true)
    if not nextb then return false end
    local value = body:sub(hend + 4, nextb - 1)
    local disp = head:match("[Cc]ontent%-[Dd]isposition:([^\r\n]*)") or ""
    local name = disp:match('name="([^"]*)"')
    if name then
      into[name] = value
      if disp:match('filename="') then files[name] = true end
    end
    pos = nextb + 2 + #delim
  end
  return true
end

local NO_FILES = {}

-- Every wire shape in one table of strings: query first, the body on top.
local function params_of(req)
  if req.method ~= "POST" then return req.query, NO_FILES end  -- read-only from here on
  local p, files = {}, {}
  for k, v in pairs(req.query) do p[k] = v end
  local form = req.form
  if form then
    for k, v in pairs(form) do p[k] = v end
    return p, files
  end
  local ctype = (req.headers["content-type"] or ""):lower()
  if ctype:find("multipart/form-data", 1, true) then
    if not parse_multipart(req.body, req.headers["content-type"], p, files) then return nil end
  elseif ctype:find("json", 1, true) then
    local t = json.decode(req.body)
    if type(t) ~= "table" then return nil end
    for k, v in pairs(t) do
      local s = scalar(v)
      if type(k) == "string" and s then p[k] = s end
    end
  end
  return p, files
end

-- ---- key ----

local function key_error(self, key)
  local want = self.knobs.key
  if want == nil then return (key == nil or key == "") and "ERROR_WRONG_USER_KEY" or nil end
  if key == want then return nil end
  if key == nil or #key ~= 32 or key:find("[^%w]") then return "ERROR_WRONG_USER_KEY" end
  return "ERROR_KEY_DOES_NOT_EXIST"
end

-- ---- in.php ----

local IMAGE_MAGIC = { "^\137PNG", "^\255\216\255", "^GIF8" }
local B64_MAGIC = { "^iVBORw0KGgo", "^/9j/", "^R0lGOD" }

local function image_error(self, p, files)
  local check = self.knobs.check_images
  local max = self.knobs.provider == "2captcha" and 600 * 1024 or 1024 * 1024
  local size, magic_ok
  if p.method == "post" then
    local f = p.file
    if f == nil or not files.file then return "ERROR_ZERO_CAPTCHA_FILESIZE" end
    size = #f
    for _, m in ipairs(IMAGE_MAGIC) do magic_ok = magic_ok or f:find(m) ~= nil end
  else
    local b = p.body
    if b == nil or b == "" then return "ERROR_ZERO_CAPTCHA_FILESIZE" end
    b = b:gsub("%s", "")
    if b:find("[^%w%+/=]") then return "ERROR_UPLOAD" end
    size = #b * 3 // 4
    for _, m in ipairs(B64_MAGIC) do magic_ok = magic_ok or b:find(m) ~= nil end
  end
  if size == 0 or (check and size < 100) then return "ERROR_ZERO_CAPTCHA_FILESIZE" end
  if size > max then return "ERROR_TOO_BIG_CAPTCHA_FILESIZE" end
  if check and not magic_ok then return "ERROR_IMAGE_TYPE_NOT_SUPPORTED" end
  return nil
end

local function proxy_error(p)
  if p.proxy and not (p.proxy:match("^[^:@]+:[^@]*@[%w%.%-]+:%d+$") or p.proxy:match("^[%w%.%-]+:%d+$")) then
    return "ERROR_PROXY_FORMAT"
  end
  if p.proxytype then
    local t = p.proxytype:upper()
    if t ~= "HTTP" and t ~= "HTTPS" and t ~= "SOCKS4" and t ~= "SOCKS5" then return "ERROR_PROXY_FORMAT" end
  end
  return nil
end

local function empty(v) return v == nil or v == "" end

-- The documented error for a missing or bad field, per method.
local function field_error(self, p, files)
  local m = p.method
  if empty(m) or not METHODS[m] then return "ERROR_BAD_PARAMETERS" end
  if m == "hcaptcha" and self.knobs.provider == "captchaai" then return "ERROR_BAD_PARAMETERS" end
  if METHODS[m] == "image" then return image_error(self, p, files) end
  if m == "userrecaptcha" then
    if empty(p.googlekey) then return "ERROR_GOOGLEKEY" end
    if empty(p.pageurl) then return "ERROR_PAGEURL" end
    if p.version == "v3" then
      if self.knobs.provider == "captchaai" and empty(p.action) then return "ERROR_EMPTY_ACTION" end
      local s = p.min_score and tonumber(p.min_score)
      if p.min_score and not (s and s >= 0.1 and s <= 0.9) then return "ERROR_BAD_PARAMETERS" end
    end
  elseif m == "turnstile" or m == "hcaptcha" then
    if empty(p.sitekey) then return "ERROR_BAD_PARAMETERS" end
    if empty(p.pageurl) then return "ERROR_PAGEURL" end
  elseif m == "geetest" then
    if empty(p.gt) or empty(p.challenge) then return "ERROR_BAD_PARAMETERS" end
    if empty(p.pageurl) then return "ERROR_PAGEURL" end
  else
    if empty(p.pageurl) then return "ERROR_PAGEURL" end
    if m == "cloudflare_challenge" and empty(p.proxy) then return "ERROR_BAD_PARAMETERS" end
  end
  return proxy_error(p)
end

local function digit_letter(d) return string.char(97 + tonumber(d)) end

local function make_answer(self, m, id, p)
  local hex = self.hex
  if m == "turnstile" then
    local a, b, c = hex(40)
    return fmt("0.mock%016x%016x%08x.%s", a, b, c, id)
  elseif m == "userrecaptcha" then
    local a, b, c = hex(48)
    return fmt("03AGdBq2%016x%016x%016x_mock%s", a, b, c, id)
  elseif METHODS[m] == "image" then
    return (fmt("%06x", hex(6)):gsub("%d", digit_letter))
  elseif m == "geetest" then
    local validate = fmt("%016x%016x", hex(32))
    return { challenge = p.challenge, validate = validate, seccode = fmt("%016x%016x|jordan", hex(32)) }
  end
  local a, b = hex(32)
  return fmt("mock-%s-%016x%016x-%s", m, a, b, id)
end

local function forget_old(self, now)
  local t, ttl = self.tasks, self.knobs.ttl
  local created, mask = t.created, t.mask
  local first, last = t.first, t.last
  while first <= last and now - created[(first & mask) + 1] >= ttl do
    local i = (first & mask) + 1
    for _, f in ipairs(FIELDS) do t[f][i] = false end
    first = first + 1
  end
  t.first = first
end

local function submit(self, p, files)
  local now = captcha.now()
  self.st.submits = self.st.submits + 1
  local in_window = window_add(self, now)
  local kerr = key_error(self, p.key)
  if kerr then return fail(self, p, "in", kerr) end
  local k = self.knobs
  if k.submit_rate and in_window > k.submit_rate then return fail(self, p, "in", "ERROR_TOO_MUCH_REQUESTS") end
  local ferr = field_error(self, p, files)
  if ferr then return fail(self, p, "in", ferr) end
  local m = p.method
  if k.zero_balance or (k.provider == "2captcha" and self.balance < k.price) then
    return fail(self, p, "in", "ERROR_ZERO_BALANCE")
  end
  -- Pops the finished tasks off the heap on every submit, thread limit or
  -- not, so the heap holds only the tasks still solving.
  if self:solving(now) >= (k.threads or math.huge) then return fail(self, p, "in", "ERROR_NO_SLOT_AVAILABLE") end
  local no_slot = self:knob("no_slot_rate", m) or 0
  if no_slot > 0 and self.rand() < no_slot then return fail(self, p, "in", "ERROR_NO_SLOT_AVAILABLE") end
  forget_old(self, now)
  self.next_id = self.next_id + 1
  local id = self.next_id .. ""  -- cheaper than tostring (no metamethod lookup)
  local unsolvable = (self:knob("unsolvable_rate", m) or 0)
  unsolvable = unsolvable > 0 and self.rand() < unsolvable
  local ready_at = now + latency_of(self, m)
  local answer = false
  if not unsolvable then
    answer = make_answer(self, m, id, p)
    if k.provider == "2captcha" then self.balance = self.balance - k.price end
  end
  local t = self.tasks
  if t.last - t.first + 1 == t.cap then t = tasks_grow(t); self.tasks = t end
  local seq = self.next_id - ID_BASE
  local i = (seq & t.mask) + 1
  t.last = seq
  t.method[i], t.created[i], t.ready_at[i], t.answer[i] = m, now, ready_at, answer
  t.useragent[i] = (m == "turnstile" or m == "cloudflare_challenge") and k.useragent or false
  t.state[i] = unsolvable and UNSOLVABLE or 0
  heap_push(self.ready, ready_at)
  self.st.tasks = self.st.tasks + 1
  count(self.st.tasks_by_method, m)
  if k.integer_ids and (p.json == "1" or p.json == "true") then
    return reply(self, p, "in", "OK", true, self.next_id)
  end
  return reply(self, p, "in", "OK", true, id, nil, true)
end

-- ---- res.php ----

-- One task's state: code, ok, value, useragent.
local function task_state(self, id, now)
  if not id or not id:find("^%d+$") then return "ERROR_WRONG_ID_FORMAT" end
  local i = task_slot(self, id)
  if not i then return "ERROR_WRONG_CAPTCHA_ID" end
  local t = self.tasks
  if now < t.ready_at[i] then return "CAPCHA_NOT_READY" end
  local state = t.state[i]
  if state & DONE == 0 then
    t.state[i] = state | DONE
    if state & UNSOLVABLE ~= 0 then self.st.unsolvable = self.st.unsolvable + 1
    else self.st.solved = self.st.solved + 1 end
  end
  if state & UNSOLVABLE ~= 0 then return "ERROR_CAPTCHA_UNSOLVABLE" end
  return "OK", true, t.answer[i], t.useragent[i] or nil
end

local function poll_one(self, p, now)
  local code, ok, value, ua = task_state(self, p.id, now)
  return reply(self, p, "poll", code, ok, value, ua, true)
end

local function poll_many(self, p, now)
  if self.knobs.provider ~= "2captcha" then return fail(self, p, "poll", "ERROR_BAD_PARAMETERS") end
  local out = {}
  for id in p.ids:gmatch("[^,]+") do
    local code, ok, value = task_state(self, id, now)
    if ok then out[#out + 1] = type(value) == "table" and answer_json(value) or value
    else out[#out + 1] = code end
    count(self.st.answers, code)
    count(self.st.poll_answers, code)
  end
  if #out == 0 then return fail(self, p, "poll", "ERROR_WRONG_ID_FORMAT") end
  local s = table.concat(out, "|")
  if p.json == "1" or p.json == "true" then
    return 200, JSON_H, '{"status":1,"request":' .. json.encode(s) .. "}"
  end
  return 200, nil, s
end

local function format_balance(b)
  local s = string.format("%.5f", b):gsub("0+$", ""):gsub("%.$", "")
  return s
end

local function report(self, p, good)
  local id = p.id
  local i = id and id:find("^%d+$") and task_slot(self, id)
  if not i then return fail(self, p, "other", "ERROR_WRONG_CAPTCHA_ID") end
  local t = self.tasks
  local state = t.state[i]
  if state & (REPORTED_GOOD | REPORTED_BAD) ~= 0 then return fail(self, p, "other", "ERROR_DUPLICATE_REPORT") end
  if state & DONE == 0 then return fail(self, p, "other", "ERROR_REPORT_NOT_RECORDED") end
  t.state[i] = state | (good and REPORTED_GOOD or REPORTED_BAD)
  count(self.st.reports, good and "good" or "bad")
  return reply(self, p, "other", "OK_REPORT_RECORDED", true, "OK_REPORT_RECORDED")
end

local function result(self, p)
  local now = captcha.now()
  local a = p.action
  local get = a == "get" or a == "get2"
  if get then self.st.polls = self.st.polls + 1 end
  local kerr = key_error(self, p.key)
  if kerr then return fail(self, p, get and "poll" or "other", kerr) end
  if get then
    if p.ids then return poll_many(self, p, now) end
    return poll_one(self, p, now)
  elseif a == "getbalance" then
    self.st.balance_calls = self.st.balance_calls + 1
    return reply(self, p, "other", "BALANCE", true, format_balance(self.balance))
  elseif a == "reportbad" or a == "reportgood" then
    return report(self, p, a == "reportgood")
  end
  return fail(self, p, "other", "ERROR_BAD_PARAMETERS")
end

-- ---- transport faults ----

local GARBAGE = "<html><head><title>502 Bad Gateway</title></head><body>\0\255\254 mock garbage"

-- One draw per API request picks at most one fault (the rates add up).
local function fault(self, req)
  local f = self.knobs.faults
  if not next(f) then return nil end
  local u, acc = self.rand(), 0
  for _, name in ipairs(FAULTS) do
    acc = acc + (f[name] or 0)
    if u < acc then
      count(self.st.faults, name)
      if name == "http500" then
        return 500, { ["Content-Type"] = "text/html" }, "<html><body><h1>500 Internal Server Error</h1></body></html>"
      elseif name == "garbage" then
        return 200, { ["Content-Type"] = "text/html" }, GARBAGE
      elseif name == "reset" then
        req:reset()
        return false
      elseif name == "hang" then
        req:hang()
        return false
      end
      return "drip"
    end
  end
  return nil
end

-- ---- the handler ----

function Mock:stats()
  local st = {}
  for k, v in pairs(self.st) do
    if type(v) == "table" then
      local c = {}
      for kk, vv in pairs(v) do c[kk] = vv end
      st[k] = c
    else
      st[k] = v
    end
  end
  st.solving = self:solving(captcha.now())
  st.balance = self.balance
  st.provider = self.knobs.provider
  st.uptime = captcha.now() - self.started
  st.scenario_step = self.scenario_step
  return st
end

local function stats_json(self)
  local st = self:stats()
  for _, k in ipairs{ "answers", "submit_answers", "poll_answers", "requests", "faults",
                      "reports", "tasks_by_method" } do
    if next(st[k]) == nil then st[k] = nil end  -- an empty table would encode as [] or {}; omit
  end
  return 200, { ["Content-Type"] = "application/json" }, json.encode(st)
end

local function handle(self, req)
  local path = req.path
  local endpoint = path == "/in.php" and "in" or path == "/res.php" and "res"
    or path == "/__stats" and "stats" or path == "/__set" and "set" or "other"
  count(self.st.requests, endpoint)
  if endpoint == "stats" then return stats_json(self) end
  if endpoint == "set" then
    local t = json.decode(req.body)
    if type(t) ~= "table" then return 400, nil, "JSON object of knobs expected" end
    local ok, err = pcall(self.set, self, t)
    if not ok then return 400, nil, tostring(err) end
    return stats_json(self)
  end
  if endpoint == "other" then return 404, nil, "not found" end
  local f, fh, fb = fault(self, req)
  if f == false then return nil end
  if f and f ~= "drip" then return f, fh, fb end
  local p, files = params_of(req)
  local status, headers, body
  if not p then
    status, headers, body = fail(self, req.query, endpoint == "in" and "in" or "poll", "ERROR_BAD_PARAMETERS")
  elseif endpoint == "in" then
    status, headers, body = submit(self, p, files)
  else
    status, headers, body = result(self, p)
  end
  if f == "drip" then
    req:drip(status, headers, body, self.knobs.drip_chunk, self.knobs.drip_interval)
    return nil
  end
  return status, headers, body
end

-- ---- scenario ----

local function load_scenario(s)
  if type(s) == "string" then
    local chunk, err = loadfile(s, "t", setmetatable({}, { __index = _G }))
    if not chunk then error("mock: cannot load scenario: " .. err, 3) end
    s = chunk()
  end
  assert(type(s) == "table", "mock: 'scenario' must be a table or a file returning one")
  local steps = {}
  for i, step in ipairs(s) do
    assert(type(step) == "table" and type(step.at) == "number" and type(step.set) == "table",
           "mock: scenario step " .. i .. " must be {at = seconds, set = {knobs}}")
    steps[#steps + 1] = step
  end
  table.sort(steps, function(a, b) return a.at < b.at end)
  return steps
end

local function run_scenario(self, steps)
  for i, step in ipairs(steps) do
    local wait = self.started + step.at - captcha.now()
    if wait > 0 then captcha.sleep(wait) end
    if self.closed then return end
    self:set(step.set)
    self.scenario_step = i
    captcha.log.info("mock scenario step", { step = i, at = step.at, note = step.note })
  end
end

--- captcha.mock{...} / require("captcha.mock").new{...}
function M.new(opts)
  opts = opts or {}
  assert(type(opts) == "table", "mock: options table expected")
  local self = setmetatable({}, Mock)
  self.knobs = {}
  for k, v in pairs(DEFAULTS) do self.knobs[k] = v end
  self.knobs.faults = {}
  local knobs = {}
  for k, v in pairs(opts) do
    if k ~= "listen" and k ~= "seed" and k ~= "scenario" and k ~= "host" and k ~= "port" then knobs[k] = v end
  end
  self.balance = DEFAULTS.balance
  self.rand, self.hex = rng_new(opts.seed or 1)
  self:set(knobs)
  self.st = { submits = 0, polls = 0, tasks = 0, solved = 0, unsolvable = 0, balance_calls = 0,
              max_submits_per_second = 0, answers = {}, submit_answers = {}, poll_answers = {},
              requests = {}, faults = {}, reports = {}, tasks_by_method = {} }
  self.tasks, self.ready = tasks_new(1024), {}
  self.win = window_new(1024)
  self.next_id = ID_BASE
  self.started = captcha.now()
  local host, port = opts.host or "127.0.0.1", opts.port or 0
  if opts.listen then
    host, port = tostring(opts.listen):match("^%[?([^%]]*)%]?:(%d+)$")
    assert(host, "mock: 'listen' must be HOST:PORT")
    port = tonumber(port)
  end
  local steps = opts.scenario and load_scenario(opts.scenario)
  local srv, err = captcha.http.serve{ host = host, port = port,
    handler = function(req) return handle(self, req) end }
  if not srv then return nil, err end
  self.server, self.url, self.port = srv, srv.url, srv.port
  if steps and #steps > 0 then self.scenario_task = captcha.spawn(run_scenario, self, steps) end
  return self
end

--- mock:close(): stop serving (idempotent); in-flight connections are closed.
function Mock:close()
  if self.closed then return end
  self.closed = true
  self.server:close()
  if self.scenario_task then self.scenario_task:cancel() end
end
Mock.__close = Mock.close
Mock.__gc = nil

M.Mock = Mock
M.DEFAULTS = DEFAULTS
return M
