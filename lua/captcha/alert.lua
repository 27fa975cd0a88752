--- captcha.alert: tell people when an error budget burns.
--
--   captcha.alert.log(report)                       -- one structured log line
--   captcha.alert.webhook(url, report[, opts])      -- Slack-compatible JSON POST
--   captcha.alert.exec({"notify-send", "budget"}, report)  -- report JSON on stdin
--
-- webhook and exec run in their own task and return it at once: a slow or
-- failing receiver never stalls the pipeline. The task's result is
-- true, or nil and the last error, after `attempts` tries (default 3) with
-- exponential backoff and jitter; failures are also logged.
local captcha = require "captcha"
local json = captcha.json

local M = {}

local function summary_text(report)
  local pct = report.budget_remaining_pct
  return ("captcharun: error budget %s for %s: %s left, burn rate %s (%d failures in %d events, SLO %s)"):format(
    tostring(report.status), tostring(report.key or "*"),
    pct and ("%.1f%%"):format(pct) or "?", report.burn_rate and ("%.2f"):format(report.burn_rate) or "?",
    report.failures or 0, report.total_events or 0, tostring(report.slo_target))
end
M.text = summary_text

local function fields(report)
  local f = {}
  for k, v in pairs(report) do
    if type(v) ~= "table" and type(v) ~= "function" and type(v) ~= "userdata" then f[k] = v end
  end
  return f
end

function M.log(report)
  if type(report) ~= "table" then error("bad argument #1 to 'log' (report table expected)", 2) end
  local level = (report.status == "healthy") and captcha.log.info or captcha.log.warn
  level(summary_text(report), fields(report))
  return true
end

local function with_retries(what, attempts, fn)
  local err
  for i = 1, attempts do
    local ok, e = fn()
    if ok then return true end
    err = e
    if i < attempts then captcha.sleep(math.random() * 0.5 * 2 ^ (i - 1)) end
  end
  captcha.log.warn(what .. " failed", { error = tostring(err), attempts = attempts })
  return nil, err
end

--- POST {text = ..., report = {...}} to url (Slack's incoming webhooks read `text`).
function M.webhook(url, report, opts)
  if type(url) ~= "string" then error("bad argument #1 to 'webhook' (URL string expected)", 2) end
  if type(report) ~= "table" then error("bad argument #2 to 'webhook' (report table expected)", 2) end
  opts = opts or {}
  local body = { text = summary_text(report), report = fields(report) }
  return captcha.spawn(with_retries, "alert webhook", opts.attempts or 3, function()
    local r, err = captcha.http.request{ method = "POST", url = url, json = body,
                                         timeout = opts.timeout or 10 }
    if not r then return nil, err end
    if r.status < 200 or r.status > 299 then return nil, "HTTP " .. r.status end
    return true
  end)
end

--- Run argv (a list: program and arguments) with the report as JSON on stdin.
function M.exec(argv, report, opts)
  if type(argv) == "string" then argv = { "/bin/sh", "-c", argv } end
  if type(argv) ~= "table" then error("bad argument #1 to 'exec' (command list or string expected)", 2) end
  if type(report) ~= "table" then error("bad argument #2 to 'exec' (report table expected)", 2) end
  opts = opts or {}
  local cmd = { stdin = json.encode(fields(report)), timeout = opts.timeout or 30 }
  for i, a in ipairs(argv) do cmd[i] = a end
  return captcha.spawn(with_retries, "alert command", opts.attempts or 1, function()
    local r, err = captcha.exec(cmd)
    if not r then return nil, err end
    if r.status ~= 0 then return nil, ("exit status %d: %s"):format(r.status, r.stderr) end
    return true
  end)
end

return M
