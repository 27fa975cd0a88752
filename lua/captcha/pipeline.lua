--- captcha.pipeline: tasks in, one result line per task out, with the bucket,
-- the error budget and the dedup cache around every solve.
--
--   local p = captcha.pipeline{ client = client, bucket = bucket, budget = budget,
--     dedup = dedup, concurrency = 50, input = "tasks.jsonl", output = "results.jsonl",
--     on = { critical = function(report, p) p:throttle(0.5) end } }
--   local summary, code = p:run()
--
-- Flow per task: dedup -> bucket -> client:solve -> budget:record(method) ->
-- output. `concurrency` worker tasks pull from the input; every input task ends
-- in exactly one output line: solved, failed, invalid, skipped or interrupted.
--
-- Hooks receive (report, p) and run as their own tasks (they may wait: a
-- webhook, a sleep). Without `on`, the default policy follows the seeds and
-- reacts to the aggregate budget ("*"): warning -> log alert, critical ->
-- throttle to half rate, exhausted -> pause new submissions, and back to full
-- rate and running as the window slides and the status improves.
local captcha = require "captcha"
local json = captcha.json

local M = {}
local Pipeline = {}
Pipeline.__index = Pipeline
Pipeline.__name = "captcha.pipeline"

M.EXIT = { ok = 0, script = 1, usage = 2, exhausted = 3, halted = 4, SIGINT = 130, SIGTERM = 143 }

local TERMINAL = { solved = true, failed = true, invalid = true }
local STATES = { "healthy", "warning", "critical", "exhausted" }

local function argerr(name, expected, got)
  error(("bad option '%s' to 'pipeline' (%s expected, got %s)"):format(name, expected, got), 3)
end

local function check_opt(opts, name, kind, optional)
  local v = opts[name]
  if v == nil and optional then return nil end
  if kind == "posint" then
    if math.type(v) ~= "integer" or v < 1 then argerr(name, "positive integer", tostring(v)) end
  elseif kind == "number" then
    if type(v) ~= "number" or v < 0 then argerr(name, "non-negative number", type(v)) end
  elseif type(v) ~= kind then
    argerr(name, kind, type(v))
  end
  return v
end

local function iso(t)
  local s = os.date("!%Y-%m-%dT%H:%M:%S", math.floor(t))
  return ("%s.%03dZ"):format(s, math.floor((t % 1) * 1000))
end

-- ---- inputs: each reader returns next() -> item | nil -----------------
-- item = { id = ..., line = n, task = {...} } or { id = n, line = n, invalid = reason }

local function item_from(task, n)
  if type(task) ~= "table" or getmetatable(task) ~= nil or task[1] ~= nil then
    return { id = n, line = n, invalid = ("line %d: a task must be a JSON object"):format(n) }
  end
  local id = task.id
  if id == nil or id == json.null then id = n end
  if type(task.method) ~= "string" or task.method == "" then
    return { id = id, line = n, invalid = ("line %d: missing 'method'"):format(n) }
  end
  return { id = id, line = n, task = task }
end

-- The next non-blank line and its line number (first = the number of the
-- first line read), without a trailing CR; nil at the end.
local function numbered_lines(readline, first)
  local n = first - 1
  return function()
    while true do
      local line = readline()
      if not line then return nil end
      n = n + 1
      if line:find("%S") then return (line:gsub("\r$", "")), n end
    end
  end
end

local function jsonl_reader(readline)
  local next_line = numbered_lines(readline, 1)
  return function()
    local line, n = next_line()
    if not line then return nil end
    local task, err = json.decode(line)
    if task == nil then
      return { id = n, line = n, invalid = ("line %d: invalid JSON (%s)"):format(n, err) }
    end
    return item_from(task, n)
  end
end

-- RFC 4180 fields on one line: quotes, "" escapes; a header names the fields.
local function csv_split(line)
  local out, i, len = {}, 1, #line
  while i <= len + 1 do
    if line:sub(i, i) == '"' then
      local buf, j = {}, i + 1
      while true do
        local q = line:find('"', j, true)
        if not q then return nil, "unterminated quote" end
        buf[#buf + 1] = line:sub(j, q - 1)
        if line:sub(q + 1, q + 1) == '"' then
          buf[#buf + 1] = '"'
          j = q + 2
        else
          i = q + 1
          break
        end
      end
      out[#out + 1] = table.concat(buf)
      if i <= len and line:sub(i, i) ~= "," then return nil, "text after a closing quote" end
      i = i + 1
    else
      local c = line:find(",", i, true) or len + 1
      out[#out + 1] = line:sub(i, c - 1)
      i = c + 1
    end
  end
  return out
end

local function csv_reader(readline)
  local header = readline()
  local names = header and csv_split((header:gsub("\r$", "")))
  local next_line = numbered_lines(readline, 2)
  return function()
    if not names then return nil end
    local line, n = next_line()
    if not line then return nil end
    local fields, err = csv_split(line)
    if not fields then return { id = n, line = n, invalid = ("line %d: %s"):format(n, err) } end
    if #fields ~= #names then
      return { id = n, line = n, invalid = ("line %d: %d fields, the header has %d"):format(n, #fields, #names) }
    end
    local task = {}
    for k, name in ipairs(names) do
      if fields[k] ~= "" then task[name] = math.tointeger(tonumber(fields[k])) or fields[k] end
    end
    return item_from(task, n)
  end
end

local function open_input(input, format)
  if type(input) == "table" then
    local n = 0
    return function()
      n = n + 1
      if input[n] == nil then return nil end
      return item_from(input[n], n)
    end, #input
  elseif type(input) == "function" then
    local n = 0
    return function()
      local task = input()
      if task == nil then return nil end
      n = n + 1
      return item_from(task, n)
    end
  end
  local fh, err, readline, total
  if input == "-" or input == nil then
    -- a pipe or a terminal is read without blocking the loop; a redirected
    -- regular file is read like any file
    local r = captcha.reader(0)
    if r then
      fh = r
      readline = function() return r:line() end
    else
      fh = io.stdin
    end
  else
    fh, err = io.open(input, "r")
    if not fh then return nil, err end
    total = 0
    for line in fh:lines() do if line:find("%S") then total = total + 1 end end
    fh:seek("set")
  end
  readline = readline or function() return fh:read("l") end
  if format == nil then
    format = type(input) == "string" and input:lower():match("%.csv$") and "csv" or "jsonl"
  end
  if format == "csv" then
    if total then total = math.max(0, total - 1) end
    return csv_reader(readline), total, fh
  end
  return jsonl_reader(readline), total, fh
end

-- ---- output -------------------------------------------------------------

-- Resume: keep the terminal lines of an earlier run, drop the rest (they are
-- solved again), so every id appears exactly once in the finished file.
local function load_done(path)
  local done, kept = {}, {}
  local fh = io.open(path, "r")
  if not fh then return done, 0 end
  for line in fh:lines() do
    local r = json.decode(line)
    if type(r) == "table" and r.id ~= nil and TERMINAL[r.status] then
      local key = tostring(r.id)
      if not done[key] then
        done[key] = true
        kept[#kept + 1] = line
      end
    end
  end
  fh:close()
  local tmp = path .. ".resume-tmp"
  local out = assert(io.open(tmp, "w"))
  for _, line in ipairs(kept) do out:write(line, "\n") end
  out:close()
  assert(os.rename(tmp, path))
  return done, #kept
end

local function open_output(output, resume)
  local done, kept = {}, 0
  if output == nil or output == "-" then return io.stdout, done, kept end
  if type(output) ~= "string" then return output, done, kept end -- a file handle
  if resume then done, kept = load_done(output) end
  local fh, err = io.open(output, resume and "a" or "w")
  if not fh then return nil, err end
  return fh, done, kept
end

-- ---- construction ---------------------------------------------------------

function M.new(opts)
  if type(opts) ~= "table" then error("bad argument #1 to 'pipeline' (table expected, got " .. type(opts) .. ")", 2) end
  local p = setmetatable({}, Pipeline)
  p.client = opts.client
  if opts.solve ~= nil then check_opt(opts, "solve", "function") end
  p.solve_fn = opts.solve
  if not p.client and not p.solve_fn then argerr("client", "a captcha.client (or solve = fn)", "nil") end
  p.bucket = opts.bucket
  p.budget = opts.budget
  p.dedup = opts.dedup
  p.concurrency = check_opt(opts, "concurrency", "posint", true) or 50
  p.drain_timeout = check_opt(opts, "drain_timeout", "number", true) or 30
  p.acquire_timeout = check_opt(opts, "acquire_timeout", "number", true)
  p.input, p.output, p.format = opts.input, opts.output, opts.format
  p.resume_mode = opts.resume and true or false
  p.quiet = opts.quiet and true or false
  p.progress = opts.progress
  p.summary_json = opts.summary_json
  p.record_cached = opts.record_cached and true or false
  if opts.on ~= nil then check_opt(opts, "on", "table") end
  p.hooks = opts.on
  p.default_policy = opts.on == nil
  if not p.bucket then
    -- nothing limits the rate, but pause/resume still need a gate to wait on
    p.bucket = captcha.bucket{ capacity = 1e9, rate = 1e9 }
    p.own_bucket = true
  end
  p.base_rate = p.bucket.rate
  p.factor = 1
  p.stats = { total = 0, solved = 0, failed = 0, invalid = 0, skipped = 0, interrupted = 0,
              resumed = 0, dedup_hits = 0, inflight = 0, by_method = {} }
  p.current = {}   -- worker -> item being solved (drain writes them as interrupted)
  p.parked = {}    -- worker -> true while it waits for a token or for input
  p.worker_of = setmetatable({}, { __mode = "k" }) -- coroutine -> worker
  return p
end

-- ---- actions for hooks ----------------------------------------------------

--- Scale the bucket's rate: p:throttle(0.5) halves it, p:throttle(1) restores.
function Pipeline:throttle(f)
  if type(f) ~= "number" or f <= 0 then
    error("bad argument #1 to 'throttle' (positive number expected, got " .. tostring(f) .. ")", 2)
  end
  if f == self.factor then return end
  -- unthrottled, the bucket's rate is the one to restore later (the user may
  -- have retuned it since the pipeline was built)
  if self.factor == 1 then self.base_rate = self.bucket.rate end
  self.factor = f
  self.bucket:set_rate(self.base_rate * f)
  captcha.log.warn("pipeline throttled", { factor = f, rate = self.bucket.rate })
end

--- Stop new submissions (in-flight work goes on) until p:resume().
function Pipeline:pause(reason)
  if self.paused then return end
  self.paused = reason or "paused"
  self.bucket:pause()
  captcha.log.warn("pipeline paused", { reason = self.paused })
end

function Pipeline:resume()
  if not self.paused then return end
  captcha.log.info("pipeline resumed", { after = self.paused })
  self.paused = nil
  self.bucket:resume()
end

--- Stop taking input: in-flight tasks finish, the rest is written as skipped.
function Pipeline:stop(reason)
  if self.stopping then return end
  self.stopping = { status = "skipped", reason = reason or "stopped" }
  if self.paused then self.bucket:resume() end
  self:_release_waiting()
end

-- Workers parked on the bucket or on input have sent nothing yet: stop them
-- now rather than after their tokens or lines trickle in (their items, if
-- any, get the stop's status).
function Pipeline:_release_waiting()
  for i in pairs(self.parked) do
    local w = self.workers and self.workers[i]
    if w then pcall(w.cancel, w) end -- pcall: never the running task itself
    self.parked[i] = nil
  end
end

-- ---- hooks ----------------------------------------------------------------

local function default_policy(state, report, p)
  if report.key ~= nil and report.key ~= "*" then return end
  if state == "healthy" then
    p:resume() p:throttle(1)
  elseif state == "warning" then
    p:resume() p:throttle(1)
    captcha.alert.log(report)
  elseif state == "critical" then
    p:resume() p:throttle(0.5)
    captcha.alert.log(report)
  elseif state == "exhausted" then
    p:pause("error budget exhausted")
    captcha.alert.log(report)
  end
end

function Pipeline:_fire(event, report, extra)
  if self.default_policy then
    default_policy(event, report, self)
    return
  end
  local fn = self.hooks[event]
  if fn then fn(report, self, extra) end
end

-- Budgets and clients have no off(): a finished run's hooks stay registered
-- and return at once (self.closed), or a later pipeline on the same budget
-- would fire them twice and act on this one's closed bucket.
function Pipeline:_install_hooks()
  local budget = self.budget
  if budget then
    for _, state in ipairs(STATES) do
      budget:on(state, function(report, key)
        if self.closed then return end
        if type(report) == "table" and report.key == nil then report.key = key end
        self:_fire(state, report)
      end)
    end
    if not self.default_policy and self.hooks.burn then
      budget:on("burn", function(alert, report)
        if not self.closed then self.hooks.burn(report, self, alert) end
      end)
    end
  end
  if self.client and self.client.on then
    self.client:on("halt", function(reason)
      if self.closed then return end
      self.halted = self.client.halted or reason
      self:stop("provider halted: " .. tostring(self.halted))
      self.stopping.halted = true
      if self.hooks and self.hooks.halt then
        self.hooks.halt({ status = "halted", reason = tostring(self.halted) }, self)
      end
    end)
  end
end

-- ---- the per-task flow ----------------------------------------------------

function Pipeline:_write(rec)
  local line, err = json.encode(rec)
  if not line then
    line = json.encode({ id = tostring(rec.id), status = "failed", error = "unencodable result: " .. err })
  end
  -- one write per line on a line-buffered handle: never a torn line
  self.out:write(line, "\n")
  local s = self.stats
  s[rec.status] = (s[rec.status] or 0) + 1
end

function Pipeline:_method_stats(method)
  local m = self.stats.by_method[method]
  if not m then
    m = { tasks = 0, solved = 0, failed = 0, dedup_hits = 0, times = {} }
    self.stats.by_method[method] = m
  end
  return m
end

-- One API attempt for a task: bucket, client, budget.
function Pipeline:_attempt(task)
  if self.stopping then return nil, self.stopping.reason, "SKIPPED" end
  local i = self.worker_of[coroutine.running()]
  if i then self.parked[i] = true end
  local ok, berr = self.bucket:acquire{ timeout = self.acquire_timeout }
  if i then self.parked[i] = nil end
  if not ok then return nil, "rate limiter: " .. tostring(berr), "BUCKET_" .. tostring(berr):upper():gsub(" ", "_") end
  if self.stopping then return nil, self.stopping.reason, "SKIPPED" end
  local r, err, code
  local t1 = captcha.now()
  if self.solve_fn then r, err, code = self.solve_fn(task)
  else r, err, code = self.client:solve(task) end
  if r ~= nil then -- solve time: from the token to the answer (no queueing)
    local times = self:_method_stats(task.method).times
    times[#times + 1] = captcha.now() - t1
  end
  if self.budget and not (self.stopping and self.stopping.halted and r == nil) then
    self.budget:record(r ~= nil, { method = task.method })
  end
  if r == nil then return nil, err, code end
  return r
end

function Pipeline:_solve(task)
  if not self.dedup then
    local r, err, code = self:_attempt(task)
    return r, r and "api" or nil, err, code
  end
  local code
  local r, source_or_err = self.dedup:solve(task, function()
    local res, err, c = self:_attempt(task)
    if res == nil then code = c return nil, err end
    return res
  end)
  if r == nil then return nil, nil, source_or_err, code end
  return r, source_or_err
end

function Pipeline:_process(item)
  local s = self.stats
  if item.invalid then
    self:_write({ id = item.id, line = item.line, status = "invalid", error = item.invalid })
    return
  end
  local task = item.task
  local m = self:_method_stats(task.method)
  m.tasks = m.tasks + 1
  s.inflight = s.inflight + 1
  local wall0, t0 = captcha.time(), captcha.now()
  -- a raise (a user solve function, a client refusing a task's options) is
  -- this task's failure, not the death of its worker and of its output line
  local ok, r, source, err, code = pcall(self._solve, self, task)
  if not ok then
    captcha.log.error("task failed with an error", { id = tostring(item.id), error = tostring(r) })
    r, source, err, code = nil, nil, r, "INTERNAL"
  end
  s.inflight = s.inflight - 1
  local elapsed = captcha.now() - t0
  local rec = { id = item.id, method = task.method, elapsed = math.floor(elapsed * 1000) / 1000,
                started = iso(wall0), finished = iso(wall0 + elapsed), source = source }
  if r then
    rec.status = "solved"
    rec.answer = type(r) == "table" and (r.answer or r.token) or r
    rec.useragent = type(r) == "table" and r.useragent or nil
    rec.captcha_id = type(r) == "table" and r.id or nil
    rec.submit_attempts = type(r) == "table" and r.submit_attempts or nil
    rec.polls = type(r) == "table" and r.polls or nil
    m.solved = m.solved + 1
    if source ~= "api" then m.dedup_hits = m.dedup_hits + 1 s.dedup_hits = s.dedup_hits + 1 end
  elseif code == "SKIPPED" or (self.stopping and (code == nil or (self.stopping.halted and code == self.halted))) then
    rec.status = self.stopping and self.stopping.status or "skipped"
    rec.error = tostring(err)
  else
    rec.status = "failed"
    rec.error = tostring(err)
    rec.code = code
    m.failed = m.failed + 1
  end
  self:_write(rec)
end

function Pipeline:_next()
  local i = self.stream_input and self.worker_of[coroutine.running()]
  while not self.stopping do
    if i then self.parked[i] = true end
    local item = self.reader()
    if i then self.parked[i] = nil end
    if not item then return nil end
    self.stats.total = self.stats.total + 1
    if self.done[tostring(item.id)] then
      self.stats.resumed = self.stats.resumed + 1
    else
      return item
    end
  end
end

function Pipeline:_worker(i)
  self.worker_of[coroutine.running()] = i
  while true do
    local item = self:_next()
    if not item then return end
    self.current[i] = item
    self:_process(item)
    self.current[i] = nil
  end
end

-- After a stop or a drain: the input that was never started gets its line.
function Pipeline:_write_rest()
  local st = self.stopping
  for i, item in pairs(self.current) do
    self:_write({ id = item.id, method = item.task and item.task.method, status = st.status, error = st.reason })
    self.current[i] = nil
  end
  -- a pipe may never end (a producer still running): after a signal, what it
  -- has not sent yet is not ours to account for
  if self.interrupted and self.stream_input then return end
  while true do
    local item = self.reader()
    if not item then break end
    self.stats.total = self.stats.total + 1
    if not self.done[tostring(item.id)] then
      if item.invalid then
        self:_write({ id = item.id, line = item.line, status = "invalid", error = item.invalid })
      else
        self:_write({ id = item.id, method = item.task.method, status = st.status, error = st.reason })
      end
    end
  end
end

-- ---- progress and summary -------------------------------------------------

function Pipeline:_budget_states()
  if not self.budget then return "" end
  local parts = {}
  for _, key in ipairs(self.budget:keys()) do
    local r = self.budget:report(key)
    parts[#parts + 1] = key .. ":" .. r.status
  end
  return table.concat(parts, " ")
end

function Pipeline:_progress_line()
  local s = self.stats
  local cs = self.client and self.client.stats and self.client:stats() or {}
  local submits = cs.submits or 0
  local t = captcha.now()
  local rate = 0
  if self._last_t and t > self._last_t then rate = (submits - self._last_submits) / (t - self._last_t) end
  self._last_t, self._last_submits = t, submits
  local done = s.solved + s.failed + s.invalid + s.skipped + s.interrupted + s.resumed
  return ("%d/%s done  solved %d  failed %d  dedup %d  in flight %d  bucket wait %d  %.1f submits/s  %s%s"):format(
    done, self.total and tostring(self.total) or "?", s.solved, s.failed, s.dedup_hits, s.inflight,
    self.bucket.waiting or 0, rate, self:_budget_states(), self.paused and "  PAUSED" or "")
end

local function percentile(t, q)
  if #t == 0 then return nil end
  table.sort(t)
  return t[math.max(1, math.ceil(q * #t))]
end

function Pipeline:summary()
  local s = self.stats
  local out = { total = s.total, solved = s.solved, failed = s.failed, invalid = s.invalid,
    skipped = s.skipped, interrupted = s.interrupted, resumed = s.resumed, dedup_hits = s.dedup_hits,
    halted = self.halted and tostring(self.halted) or nil, methods = {} }
  local cs = self.client and self.client.stats and self.client:stats() or {}
  if type(cs.requests) == "table" then
    local n = 0
    for _, outcomes in pairs(cs.requests) do
      for _, c in pairs(outcomes) do n = n + c end
    end
    out.api_requests = n
    out.submits, out.polls = cs.submits, cs.polls
  end
  for method, m in pairs(s.by_method) do
    local row = { tasks = m.tasks, solved = m.solved, failed = m.failed, dedup_hits = m.dedup_hits,
                  p50 = percentile(m.times, 0.5), p95 = percentile(m.times, 0.95) }
    if self.budget then
      local r = self.budget:report(method)
      row.budget_status = r.status
      row.budget_remaining_pct = r.budget_remaining_pct
      row.burn_rate = r.burn_rate
    end
    out.methods[method] = row
  end
  if self.budget then
    local r = self.budget:report("*")
    out.budget = { status = r.status, budget_remaining_pct = r.budget_remaining_pct, burn_rate = r.burn_rate }
  end
  return out
end

local function fmt(v, f)
  if v == nil then return "-" end
  return (f or "%s"):format(v)
end

function Pipeline:_print_summary(sum)
  local lines = { ("%-14s %6s %6s %6s %6s %8s %8s %8s %6s"):format(
    "method", "tasks", "solved", "failed", "dedup", "p50 s", "p95 s", "budget", "burn") }
  local methods = {}
  for k in pairs(sum.methods) do methods[#methods + 1] = k end
  table.sort(methods)
  for _, k in ipairs(methods) do
    local m = sum.methods[k]
    lines[#lines + 1] = ("%-14s %6d %6d %6d %6d %8s %8s %8s %6s"):format(k, m.tasks, m.solved, m.failed,
      m.dedup_hits, fmt(m.p50, "%.2f"), fmt(m.p95, "%.2f"), fmt(m.budget_remaining_pct, "%.1f%%"),
      fmt(m.burn_rate, "%.2f"))
  end
  lines[#lines + 1] = ("total %d: solved %d, failed %d, invalid %d, skipped %d, interrupted %d, resumed %d; API requests %s%s"):format(
    sum.total, sum.solved, sum.failed, sum.invalid, sum.skipped, sum.interrupted, sum.resumed,
    fmt(sum.api_requests), sum.halted and ("; halted: " .. sum.halted) or "")
  io.stderr:write(table.concat(lines, "\n"), "\n")
end

-- ---- run --------------------------------------------------------------------

function Pipeline:_exit_code()
  if self.interrupted then return M.EXIT[self.interrupted] or 130 end
  if self.halted then return M.EXIT.halted end
  if self.budget then
    for _, key in ipairs(self.budget:keys()) do
      if self.budget:report(key).status == "exhausted" then return M.EXIT.exhausted end
    end
  end
  return M.EXIT.ok
end

function Pipeline:_start_progress()
  local tty = captcha.isatty and captcha.isatty(2)
  local show = self.progress
  if show == nil then show = tty and not self.quiet end
  if not show then return nil end
  captcha.log.status_line(true)
  return captcha.spawn(function()
    while true do
      io.stderr:write("\r\27[K", self:_progress_line())
      io.stderr:flush()
      captcha.sleep(0.25) -- at most 4 refreshes a second
    end
  end)
end

--- Run to the end of the input (or a stop, halt or signal); returns the
-- summary table and the exit code (M.EXIT).
function Pipeline:run()
  local reader, total, infh = open_input(self.input, self.format)
  if not reader then return nil, "cannot open input: " .. tostring(total) end
  local out, done, kept = open_output(self.output, self.resume_mode)
  if not out then return nil, "cannot open output: " .. tostring(done) end
  out:setvbuf("line")
  self.reader, self.total, self.out, self.done = reader, total, out, done
  self.stream_input = infh ~= nil and io.type(infh) == nil -- a captcha.reader
  self.stats.kept = kept
  self:_install_hooks()
  local on_signal = captcha.on_signal(function(sig)
    if self.finished or self.interrupted then return end
    self.interrupted = sig -- wins over a stop or a halt: the person asked to quit
    self.stopping = self.stopping or { status = "interrupted", reason = "interrupted by " .. sig }
    if self.paused then self.bucket:resume() end
    self:_release_waiting()
    captcha.log.warn("draining", { signal = sig, in_flight = self.stats.inflight, timeout = self.drain_timeout })
    -- in-flight tasks get drain_timeout to finish; run() cancels this timer
    -- as soon as they all have
    self.drain_timer = captcha.spawn(function()
      captcha.sleep(self.drain_timeout)
      for _, w in ipairs(self.workers) do w:cancel() end
    end)
  end)
  local progress = self:_start_progress()
  self.workers = {}
  for i = 1, self.concurrency do
    self.workers[i] = captcha.spawn(self._worker, self, i)
  end
  for _, w in ipairs(self.workers) do w:wait() end
  self.finished = true
  captcha.off_signal(on_signal)
  if self.drain_timer then self.drain_timer:cancel() end
  if self.stopping then self:_write_rest() end
  if progress then
    progress:cancel()
    captcha.log.status_line(false)
    io.stderr:write("\r\27[K", self:_progress_line(), "\n")
  end
  if out ~= io.stdout then out:close() else out:flush() end
  if infh and infh ~= io.stdin then infh:close() end -- a file or a captcha.reader
  local sum = self:summary()
  sum.exit_code = self:_exit_code()
  if not self.quiet then self:_print_summary(sum) end
  if self.summary_json then
    local fh = io.open(self.summary_json, "w")
    if fh then fh:write(json.encode(sum), "\n") fh:close() end
  end
  self.closed = true
  if self.own_bucket then self.bucket:close() end
  return sum, sum.exit_code
end

M.Pipeline = Pipeline
return M
