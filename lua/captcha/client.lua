-- captcha.client: an asynchronous CaptchaAI / 2captcha client (in.php/res.php).
--
--   local client = captcha.client{ key = os.getenv("CAPTCHAAI_API_KEY") }
--   local r, err, code = client:solve{ method = "turnstile", sitekey = "...", pageurl = "..." }
--   -- r = { answer = token, token = token, id = "123", method = "turnstile",
--   --       elapsed = 11.2, polls = 2, submit_attempts = 1, useragent = "..." }
--
-- Every solve runs as its own task (a job) that the caller waits for, so that a
-- fatal error can stop all of them at once: the client halts, cancels every
-- job (their sleeps and HTTP requests end synchronously) and every pending and
-- later solve returns the fatal error. Cost: one extra task per solve (about
-- 4 us and 1.2 KB, STYLE.md), small next to the two or more HTTP requests.
--
-- The key never leaves this file except inside requests: it is registered as a
-- log secret and scrubbed from every error message and result string.
local captcha = require "captcha"
local errors = require "captcha.errors"

local http = captcha.http
local now, sleep, spawn = captcha.now, captcha.sleep, captcha.spawn
local classify = errors.classify
local random, floor, min, max = math.random, math.floor, math.min, math.max
local concat, sort, unpack = table.concat, table.sort, table.unpack

local M = {}
local Client = {}
Client.__index = Client
Client.__name = "captcha.client"

M.profiles = {
  captchaai = {
    base_url = "https://ocr.captchaai.com",
    overrides = {},                       -- ERROR_ZERO_BALANCE: no free thread, transient
    batch = false,                        -- ids= is not documented there
  },
  ["2captcha"] = {
    base_url = "https://2captcha.com",
    overrides = { ERROR_ZERO_BALANCE = "fatal" },
    batch = true,
  },
}

-- PROTOCOL.md: 5 s for images, 15-20 s for reCAPTCHA and GeeTest, 10 s Turnstile.
M.first_poll = { base64 = 5, post = 5, userrecaptcha = 15, geetest = 15, turnstile = 10, default = 10 }

-- Task fields the client consumes itself (never sent as they are), and the
-- pipeline's bookkeeping (`id` names a task in a results file, not at the provider).
local reserved = { method = true, body = true, file = true, base64 = true, sitekey = true,
  timeout = true, version = true, invisible = true, enterprise = true, filename = true,
  first_poll = true, id = true }

local function fail(msg) error(msg, 3) end

-- ---- helpers -------------------------------------------------------------

local function redact(self, s)
  if type(s) ~= "string" then return s end
  local key = self._key
  local i = s:find(key, 1, true)
  while i do
    s = s:sub(1, i - 1) .. "***" .. s:sub(i + #key)
    i = s:find(key, i + 3, true)
  end
  return s
end

local function count(t, k) t[k] = (t[k] or 0) + 1 end

local function query(params)
  local parts, n = {}, 0
  for k, v in pairs(params) do
    n = n + 1
    parts[n] = http.escape(k) .. "=" .. http.escape(tostring(v))
  end
  return concat(parts, "&")
end

local function read_key_file(path)
  local f, err = io.open(path, "r")
  if not f then fail("key_file: " .. tostring(err)) end
  local s = f:read("a") or ""
  f:close()
  return (s:gsub("^%s+", ""):gsub("%s+$", ""))
end

-- Exponential backoff with full jitter: uniform in [0, min(cap, base * 2^(n-1))].
function Client:_backoff(attempt, code)
  local info = errors.codes[code]
  local base = self.retry.base or (info and info.wait > 0 and info.wait) or 1
  return random() * min(self.retry.cap, base * 2 ^ (attempt - 1))
end

-- ---- one API call ----------------------------------------------------------

local function transport_code(status)
  if status == 429 then return "HTTP_429" end
  if status >= 500 then return "HTTP_5XX" end
  return "HTTP_4XX"
end

-- Decode an in.php/res.php answer: JSON {status, request, ...} or plain text
-- ("OK|value", "CODE"). Returns ok, value, extra(json table) | false, code, text.
local function parse_answer(body)
  local c = body:byte(1)
  if c == 123 then -- '{'
    local ok, doc = pcall(captcha.json.decode, body)
    if ok and type(doc) == "table" and doc.status ~= nil then
      if doc.status == 1 or doc.status == "1" then return true, doc.request, doc end
      local code = doc.request
      if type(code) == "string" and code ~= "" then
        return false, code, type(doc.error_text) == "string" and doc.error_text or nil
      end
    end
    return false, "BAD_RESPONSE"
  end
  local v = body:match("^OK|(.-)%s*$")
  if v then return true, v end
  local line = body:gsub("%s+$", "")
  if errors.is_code(line) then return false, line end
  return false, "BAD_RESPONSE"
end

-- self:_api(endpoint, params, opts) -> true, value, doc | false, code, message, class
function Client:_api(endpoint, params, deadline, parts)
  local st = self._stats
  -- A hung request may overrun a task's deadline by at most 0.5 s.
  local timeout = self.request_timeout
  if deadline then timeout = min(timeout, max(0.5, deadline - now())) end
  local req = { url = self._urls[endpoint], timeout = timeout,
    connect_timeout = self.connect_timeout, pool = self._pool }
  if endpoint == "in" then
    params.key = self._key
    params.json = 1
    req.method = "POST"
    if parts then
      for k, v in pairs(params) do parts[#parts + 1] = { name = k, data = tostring(v) } end
      req.multipart = parts
    else
      req.form = params
    end
  else
    req.url = self._res_prefix .. query(params)   -- key and json=1 encoded once per client
  end
  local bucket = st.requests[endpoint == "in" and "in" or params.ids and "batch" or params.action]
  local r, err, kind = http.request(req)
  local ok, value, extra, code, text
  if not r then
    code, text = errors.transport[kind] or "HTTP_TRANSPORT", err
  elseif r.status ~= 200 and (r.status >= 500 or r.status == 429 or r.body:byte(1) ~= 123) then
    code, text = transport_code(r.status), "HTTP " .. r.status
  else
    ok, value, extra = parse_answer(r.body)
    if not ok then code, text = value, extra end
  end
  if ok then
    count(bucket, "ok")
    return true, value, extra
  end
  count(bucket, code)
  local class, info = classify(code, self.profile.overrides)
  if class ~= "not_ready" then count(st.errors, code) end
  if not text or text == code or text == "" then text = info.text end
  local msg = code .. ": " .. text
  return false, code, redact(self, msg), class
end

-- ---- halting -----------------------------------------------------------------

-- Cancel a task that waits (a sleep or an HTTP request: it ends at once). A
-- task already woken ("ready") is left to run: it checks self.halted (or
-- job.abandoned) after every wait and returns by itself. Cancelling a ready
-- task is avoided on purpose: the scheduler may hold it in the pass it is
-- running (see the report to the lead).
local function stop(task)
  if task:status() == "waiting" then task:cancel() end
end

function Client:_halt(code, msg, from_job)
  if self.halted then return end
  self.halted = msg
  self.halt_code = code
  captcha.log.error("captcha client halted: no further submits", { code = code, reason = msg })
  for job in pairs(self._jobs) do
    if job ~= from_job and job.handle then stop(job.handle) end
  end
  if self._batch then
    local b = self._batch
    self._batch = nil
    if b.task then stop(b.task) end
  end
  for _, fn in ipairs(self._hooks.halt) do self:_fire(fn) end
end

function Client:_fire(fn)
  local info = { code = self.halt_code, reason = self.halted }
  spawn(function()
    local ok, err = xpcall(fn, debug.traceback, info)
    if not ok then captcha.log.error("client halt hook failed", { error = redact(self, tostring(err)) }) end
  end)
end

function Client:on(event, fn)
  if event ~= "halt" then fail("bad argument #1 to 'on' (only \"halt\" is supported)") end
  if type(fn) ~= "function" then fail("bad argument #2 to 'on' (function expected)") end
  local hooks = self._hooks.halt
  hooks[#hooks + 1] = fn
  if self.halted then self:_fire(fn) end
  return self
end

-- ---- building a task's in.php fields ---------------------------------------

local function copy_extra(task, fields)
  for k, v in pairs(task) do
    if not reserved[k] and type(k) == "string" and fields[k] == nil then
      local t = type(v)
      if t == "boolean" then fields[k] = v and 1 or 0
      elseif t == "string" or t == "number" then fields[k] = v end
    end
  end
end

local builders = {}

function builders.base64(task, f)
  if task.file then
    local fh = io.open(task.file, "rb")
    if not fh then return nil, "cannot read image file " .. tostring(task.file) end
    fh:close()
    f.method = "post"
    return f, { { name = "file", file = task.file, filename = task.filename or task.file:match("[^/]+$") } }
  end
  local b64 = task.base64 or (task.body and http.base64(task.body))
  if type(b64) ~= "string" or b64 == "" then return nil, "image task needs body (bytes), base64 or file" end
  f.method = "base64"
  f.body = b64
  return f
end
builders.post = builders.base64

function builders.userrecaptcha(task, f)
  f.googlekey = task.googlekey or task.sitekey
  if not f.googlekey then return nil, "userrecaptcha needs googlekey (or sitekey)" end
  if not task.pageurl then return nil, "userrecaptcha needs pageurl" end
  if task.version == "v3" or task.action or task.min_score then
    f.version = "v3"
    f.action = task.action or "verify"
    f.min_score = task.min_score or 0.4
  end
  if task.invisible then f.invisible = 1 end
  if task.enterprise then f.enterprise = 1 end
  return f
end

function builders.turnstile(task, f)
  f.sitekey = task.sitekey
  if not f.sitekey then return nil, "turnstile needs sitekey" end
  if not task.pageurl then return nil, "turnstile needs pageurl" end
  f.googlekey = nil                                  -- seed defect: never sent here
  return f
end

function builders.geetest(task, f)
  if not (task.gt and task.challenge and task.pageurl) then
    return nil, "geetest needs gt, challenge and pageurl"
  end
  f.googlekey = nil
  return f
end

local function build_fields(task)
  local method = task.method
  if type(method) ~= "string" then return nil, "task.method (a string) is required" end
  local f = {}
  copy_extra(task, f)
  f.method = method
  local build = builders[method]
  if not build then
    if task.sitekey then f.sitekey = task.sitekey end -- pass-through methods
    return f
  end
  return build(task, f)
end

-- ---- the solving job -------------------------------------------------------

-- Submit with bounded retries of transient errors. -> id | nil, msg, code
function Client:_submit_job(job)
  local attempt = 0
  while true do
    if self.halted then return nil, self.halted, self.halt_code end
    if job.abandoned then return nil, "CANCELLED: the solve was cancelled", "CANCELLED" end
    attempt = attempt + 1
    job.submit_attempts = job.submit_attempts + 1
    self._stats.submits = self._stats.submits + 1
    local fields = {}
    for k, v in pairs(job.fields) do fields[k] = v end
    local parts
    if job.parts then parts = { unpack(job.parts) } end
    local ok, val, msg, class = self:_api("in", fields, job.deadline, parts)
    if self.halted and class ~= "fatal" then return nil, self.halted, self.halt_code end
    if ok then
      if type(val) == "number" then val = string.format("%d", val) end -- CaptchaAI: integer ids
      if type(val) ~= "string" or val == "" then return nil, "BAD_RESPONSE: submit returned no id", "BAD_RESPONSE" end
      return val
    end
    if class == "fatal" then
      self:_halt(val, msg, job)
      return nil, msg, val
    end
    if class ~= "transient" or attempt >= self.max_submit_attempts then return nil, msg, val end
    local delay = self:_backoff(attempt, val)
    if now() + delay >= job.deadline then return nil, msg, val end
    self._stats.retries = self._stats.retries + 1
    captcha.log.debug("captcha submit retry", { code = val, attempt = attempt, delay = delay })
    sleep(delay)
  end
end

-- One poll of job.id: single res.php?action=get, or through the batcher.
function Client:_poll_once(job)
  if self._batching and job.method ~= "geetest" then return self:_batched_poll(job) end
  return self:_api("res", { action = "get", id = job.id }, job.deadline)
end

-- Poll until an answer, a failure or the deadline. -> value, doc | nil, msg, code, class
function Client:_await_answer(job)
  local first = job.first_poll or self.first_poll[job.method] or self.first_poll.default
  local t = now() + first
  if t >= job.deadline then
    -- a timeout shorter than the first-poll delay: the submit is paid, so
    -- look once just before giving up rather than never
    t = job.deadline - min(1, (job.deadline - now()) / 10)
  end
  local errs = 0
  while true do
    local remaining = job.deadline - now()
    if t >= job.deadline or job.polls >= self.max_polls then
      return nil, string.format("TIMEOUT: no answer after %d polls (%.1f s)", job.polls, now() - job.start), "TIMEOUT"
    end
    local wait = t - now()
    if wait > 0 then sleep(wait) end
    if self.halted then return nil, self.halted, self.halt_code, "fatal" end
    if job.abandoned then return nil, "CANCELLED: the solve was cancelled", "CANCELLED", "error" end
    job.polls = job.polls + 1
    self._stats.polls = self._stats.polls + 1
    local ok, val, extra, class = self:_poll_once(job)
    if ok then return val, extra end
    if self.halted and class ~= "fatal" then return nil, self.halted, self.halt_code, "fatal" end
    if class == "not_ready" then
      errs = 0
      -- Every poll_interval for the first half of max_polls (most solves end
      -- there), then what is left of the timeout is spread over the remaining
      -- polls, so a task never takes more polls than the provider tolerates.
      local interval = self.poll_interval
      if job.polls >= self.max_polls / 2 then
        remaining = job.deadline - now()
        interval = max(interval, remaining / max(1, self.max_polls - job.polls))
      end
      t = now() + interval
    elseif class == "transient" then
      errs = errs + 1
      if errs > self.max_poll_errors then return nil, extra, val, class end
      self._stats.retries = self._stats.retries + 1
      t = now() + max(self.poll_interval, self:_backoff(errs, val))
      captcha.log.debug("captcha poll retry", { code = val, id = job.id, errors = errs })
    else
      if class == "fatal" then self:_halt(val, extra, job) end
      return nil, extra, val, class
    end
  end
end

local result_skip = { status = true, request = true }

function Client:_result(job, value, doc)
  local r = { id = job.id, method = job.method, elapsed = now() - job.start, polls = job.polls,
    submit_attempts = job.submit_attempts, resubmits = job.resubmits }
  if type(value) == "table" then
    local a = {}
    for k, v in pairs(value) do a[k] = redact(self, v) end
    r.answer = a
  else
    r.answer = redact(self, tostring(value))
    if job.method ~= "base64" and job.method ~= "post" then r.token = r.answer end
  end
  if type(doc) == "table" then
    for k, v in pairs(doc) do
      if not result_skip[k] and r[k] == nil then r[k] = redact(self, v) end
    end
  end
  return r
end

function Client:_record(method, elapsed, code)
  local st = self._stats
  if code then
    st.failed = st.failed + 1
    return
  end
  st.solved = st.solved + 1
  local s = st.times[method]
  if not s then s = { n = 0 }; st.times[method] = s end
  -- A bounded ring of the last 2048 solve times per method: percentiles over a
  -- recent window, O(1) memory per method.
  s.n = s.n + 1
  s[(s.n - 1) % 2048 + 1] = elapsed
end

-- The job task: true, result | false, msg, code (nil from wait() means the
-- job was cancelled or raised).
local function run_job(self, job)
  while true do
    local id, msg, code = self:_submit_job(job)
    if not id then return false, msg, code end
    job.id = id
    local value, extra, pcode, class = self:_await_answer(job)
    if value ~= nil then return true, self:_result(job, value, extra) end
    if class == "task" and job.resubmits < self.resubmit_unsolvable and now() < job.deadline then
      job.resubmits = job.resubmits + 1
      self._stats.resubmits = self._stats.resubmits + 1
    else
      return false, extra, pcode
    end
  end
end

-- Closing the caller (its task cancelled) cancels the job it waits for.
-- It also does the job's bookkeeping, on both paths.
local guard_mt = { __close = function(g)
  local job, self = g.job, g.client
  self._jobs[job] = nil
  self._active = self._active - 1
  if not job.done and job.handle then
    job.abandoned = true
    stop(job.handle)
  end
end }

function Client:solve(task)
  if type(task) ~= "table" then fail("bad argument #1 to 'solve' (table expected, got " .. type(task) .. ")") end
  local start = now()
  if self.halted then
    self:_record(task.method, 0, self.halt_code)
    return nil, self.halted, self.halt_code
  end
  local fields, parts = build_fields(task)
  if not fields then
    count(self._stats.errors, "BAD_TASK")
    self:_record(task.method, 0, "BAD_TASK")
    return nil, "BAD_TASK: " .. redact(self, parts), "BAD_TASK"
  end
  local timeout = tonumber(task.timeout) or self.timeout
  if timeout <= 0 then fail("bad argument #1 to 'solve' (timeout must be > 0 seconds)") end
  local job = { method = task.method, fields = fields, parts = parts, start = start,
    deadline = start + timeout, polls = 0, submit_attempts = 0, resubmits = 0,
    first_poll = task.first_poll }
  self._jobs[job] = true
  self._active = self._active + 1
  job.handle = spawn(run_job, self, job)
  local guard <close> = setmetatable({ job = job, client = self }, guard_mt)
  local ok, r, code = job.handle:wait()
  job.done = true
  if ok == true then
    self:_record(job.method, now() - start)
    return r
  end
  local msg = r
  if ok == nil then                                   -- the job was cancelled or raised
    if self.halted then msg, code = self.halted, self.halt_code
    elseif r == "cancelled" then msg, code = "CANCELLED: the solve was cancelled", "CANCELLED"
    else
      msg, code = "INTERNAL: " .. redact(self, tostring(r)), "INTERNAL"
      captcha.log.error("captcha client job failed", { error = redact(self, tostring(code and r)) })
    end
    count(self._stats.errors, code)
  end
  self:_record(job.method, now() - start, code)
  return nil, msg, code
end

-- ---- batch polling (ids=, 2captcha profile) ---------------------------------

local function split_bar(s)
  local out, n = {}, 0
  for item in (s .. "|"):gmatch("([^|]*)|") do
    n = n + 1
    out[n] = item
  end
  return out, n
end

local function batch_run(self, b)
  -- Polls that fall due in the same loop pass (or within batch_window) share
  -- one request: one res.php call instead of N.
  if self.batch_window > 0 then sleep(self.batch_window) else captcha.yield() end
  if self._batch == b then self._batch = nil end
  -- The earliest deadline bounds the request, as a single poll's would: a hung
  -- batch must not hold every task in it past its timeout.
  local ids, deadline = {}, math.huge
  for i = 1, b.n do ids[i] = b.jobs[i].id; deadline = min(deadline, b.jobs[i].deadline) end
  local ok, val, msg, class = self:_api("res", { action = "get", ids = concat(ids, ",") }, deadline)
  if not ok then
    b.error = { false, val, msg, class }
    return
  end
  local items, n = split_bar(tostring(val))
  if n ~= b.n then
    -- KinanCity#62: 15 answers for 33 ids. Trust none of them.
    self._stats.batch_mismatches = self._stats.batch_mismatches + 1
    return
  end
  local res = {}
  for i = 1, n do
    local item = items[i]
    if errors.is_code(item) and (item == "CAPCHA_NOT_READY" or item:find("^ERROR") or errors.codes[item]) then
      local c, info = classify(item, self.profile.overrides)
      if c ~= "not_ready" then count(self._stats.errors, item) end
      res[b.jobs[i]] = { false, item, item .. ": " .. info.text, c }
    else
      res[b.jobs[i]] = { true, redact(self, item) }
    end
  end
  b.results = res
end

function Client:_batched_poll(job)
  local b = self._batch
  if not b then
    b = { jobs = {}, n = 0 }
    self._batch = b
    b.task = spawn(batch_run, self, b)
  end
  b.n = b.n + 1
  b.jobs[b.n] = job
  if b.n >= self.batch_max then self._batch = nil end -- full: the next poll starts another
  b.task:wait()
  local r = b.results and b.results[job]
  if r then return unpack(r, 1, 4) end
  if b.error then return unpack(b.error, 1, 4) end
  self._stats.batch_fallbacks = self._stats.batch_fallbacks + 1
  return self:_api("res", { action = "get", id = job.id }, job.deadline)
end

-- ---- self-scheduling, balance, reports ---------------------------------------

-- client:submit(task) -> id | nil, err, code (transient errors retried, bounded)
function Client:submit(task)
  if type(task) ~= "table" then fail("bad argument #1 to 'submit' (table expected, got " .. type(task) .. ")") end
  local fields, parts = build_fields(task)
  if not fields then return nil, "BAD_TASK: " .. redact(self, parts), "BAD_TASK" end
  local start = now()
  local job = { fields = fields, parts = parts, submit_attempts = 0,
    deadline = start + (tonumber(task.timeout) or self.timeout) }
  return self:_submit_job(job)
end

-- client:poll(id) -> result | nil, err, code ("CAPCHA_NOT_READY" while solving)
function Client:poll(id, method)
  if type(id) == "number" then id = string.format("%d", id) end
  if type(id) ~= "string" then fail("bad argument #1 to 'poll' (task id expected)") end
  self._stats.polls = self._stats.polls + 1
  local ok, val, extra, class = self:_api("res", { action = "get", id = id })
  if ok then
    return self:_result({ id = id, method = method, start = now(), polls = 1, submit_attempts = 0, resubmits = 0 }, val, extra)
  end
  if class == "fatal" then self:_halt(val, extra) end
  return nil, extra, val
end

-- client:balance() -> number | nil, err, code
function Client:balance()
  local ok, val, extra, class = self:_api("res", { action = "getbalance" })
  if ok then return tonumber(val) or val end
  if class == "fatal" then self:_halt(val, extra) end
  return nil, extra, val
end

-- client:report(id, "good"|"bad") -> true | nil, err, code
function Client:report(id, verdict)
  if verdict ~= "good" and verdict ~= "bad" then fail("bad argument #2 to 'report' (\"good\" or \"bad\" expected)") end
  if type(id) == "number" then id = string.format("%d", id) end
  if type(id) ~= "string" then fail("bad argument #1 to 'report' (task id expected)") end
  local ok, val, extra, class = self:_api("res", { action = "report" .. verdict, id = id })
  if ok then return true end
  if val == "OK_REPORT_RECORDED" then return true end
  if class == "fatal" then self:_halt(val, extra) end
  return nil, extra, val
end

-- ---- stats -------------------------------------------------------------------

local function percentiles(s)
  local n = min(s.n, 2048)
  local v = {}
  for i = 1, n do v[i] = s[i] end
  sort(v)
  local function p(q) return v[max(1, math.ceil(q * n))] end
  return { count = s.n, p50 = p(0.50), p90 = p(0.90), p99 = p(0.99), max = v[n] }
end

local function copy(t)
  local c = {}
  for k, v in pairs(t) do c[k] = type(v) == "table" and copy(v) or v end
  return c
end

function Client:stats()
  local st = self._stats
  local out = { submits = st.submits, polls = st.polls, retries = st.retries, resubmits = st.resubmits,
    solved = st.solved, failed = st.failed, active = self._active,
    batch_mismatches = st.batch_mismatches, batch_fallbacks = st.batch_fallbacks,
    requests = copy(st.requests), errors = copy(st.errors), solve_time = {},
    halted = self.halted, provider = self.provider }
  for method, s in pairs(st.times) do out.solve_time[method] = percentiles(s) end
  return out
end

function Client:__tostring()
  return string.format("captcha.client (%s, %s%s)", self.provider, self.base_url,
    self.halted and ", halted" or "")
end

-- ---- construction --------------------------------------------------------------

local function num_opt(opts, name, def, lo)
  local v = opts[name]
  if v == nil then return def end
  if type(v) ~= "number" or v < (lo or 0) then
    fail(string.format("bad argument #1 to 'client' (%s must be a number >= %s)", name, tostring(lo or 0)))
  end
  return v
end

function M.new(opts)
  if type(opts) ~= "table" then fail("bad argument #1 to 'client' (table expected, got " .. type(opts) .. ")") end
  local key = opts.key
  if key == nil and opts.key_file then key = read_key_file(opts.key_file) end
  if type(key) ~= "string" or key == "" then
    fail("bad argument #1 to 'client' (key or key_file required: an API key string)")
  end
  if captcha.log.secret then captcha.log.secret(key) end
  local provider = opts.provider or "captchaai"
  local profile = M.profiles[provider]
  if not profile then fail("bad argument #1 to 'client' (provider must be \"captchaai\" or \"2captcha\")") end
  local base = opts.base_url or profile.base_url
  if type(base) ~= "string" or not base:match("^https?://") then
    fail("bad argument #1 to 'client' (base_url must start with http:// or https://)")
  end
  base = base:gsub("/+$", "")
  local first = {}
  for k, v in pairs(M.first_poll) do first[k] = v end
  if opts.first_poll ~= nil then
    if type(opts.first_poll) == "number" then
      for k in pairs(first) do first[k] = opts.first_poll end
    elseif type(opts.first_poll) == "table" then
      for k, v in pairs(opts.first_poll) do first[k] = v end
    else
      fail("bad argument #1 to 'client' (first_poll must be a number or a table of method = seconds)")
    end
  end
  local retry = opts.retry or {}
  local max_conn = math.tointeger(opts.max_connections or 64)
  if not max_conn or max_conn < 1 then fail("bad argument #1 to 'client' (max_connections must be an integer >= 1)") end
  local self = setmetatable({
    _key = key, provider = provider, profile = profile, base_url = base,
    _urls = { ["in"] = base .. "/in.php", res = base .. "/res.php" },
    timeout = num_opt(opts, "timeout", 180, 0.001),
    poll_interval = num_opt(opts, "poll_interval", 5, 0),
    max_polls = num_opt(opts, "max_polls", 20, 1),
    max_poll_errors = num_opt(opts, "max_poll_errors", 5, 0),
    max_submit_attempts = num_opt(opts, "max_submit_attempts", 5, 1),
    resubmit_unsolvable = num_opt(opts, "resubmit_unsolvable", 0, 0),
    request_timeout = num_opt(opts, "request_timeout", 30, 0.001),
    connect_timeout = num_opt(opts, "connect_timeout", 10, 0.001),
    batch_window = num_opt(opts, "batch_window", 0.1, 0),
    batch_max = num_opt(opts, "batch_max", 100, 1),
    retry = { base = retry.base, cap = retry.cap or 60 },
    first_poll = first,
    _batching = profile.batch and opts.batch_polls ~= false,
    _pool = http.pool(max_conn),
    _jobs = {}, _active = 0,
    _hooks = { halt = {} },
    _stats = { submits = 0, polls = 0, retries = 0, resubmits = 0, solved = 0, failed = 0,
      batch_mismatches = 0, batch_fallbacks = 0,
      requests = { ["in"] = {}, get = {}, batch = {}, getbalance = {}, reportgood = {}, reportbad = {} },
      errors = {}, times = {} },
  }, Client)
  self._res_prefix = self._urls.res .. "?key=" .. http.escape(key) .. "&json=1&"
  if self.resubmit_unsolvable > 10 then fail("bad argument #1 to 'client' (resubmit_unsolvable must be <= 10)") end
  return self
end

return M
