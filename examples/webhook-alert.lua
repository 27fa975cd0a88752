-- examples/webhook-alert.lua: post an alert to a webhook when the budget burns.
-- Run: captcharun examples/webhook-alert.lua        (about 2 s, no account)
--
-- captcha.alert.webhook(url, report) POSTs Slack-compatible JSON
-- ({"text": "...", "report": {...}}) from a task of its own, with retries: a
-- slow or broken receiver never holds up the pipeline. In production the URL
-- is your Slack/Teams/PagerDuty incoming webhook, e.g. os.getenv("SLACK_URL").
-- Here a tiny HTTP server in the same script plays the receiver and prints
-- what it gets, so the example needs nothing but captcharun.
local captcha = require "captcha"
local json = captcha.json

-- 1. The receiver: captcha.http.serve answers on 127.0.0.1 (port 0: any free one).
local received = 0
local receiver = assert(captcha.http.serve{ port = 0, handler = function(req)
  local alert = json.decode(req.body)
  received = received + 1
  print("receiver got: " .. alert.text)
  return 200, { ["Content-Type"] = "text/plain" }, "ok"
end })

-- 2. A mock provider where 20 % of the answers fail: a 95 % SLO will not hold.
local mock = captcha.mock{ key = "example-key", seed = 11, latency = { 0.01, 0.03 }, unsolvable_rate = 0.2 }
local client = captcha.client{ key = "example-key", base_url = mock.url,
                               first_poll = 0.01, poll_interval = 0.01 }
local budget = captcha.budget{ target = 0.95, window = "1h", min_events = 20 }

-- 3. The hooks: alert on every change of the aggregate budget ("*"). The
-- webhook call returns at once (a task); keep the tasks to check them at the end.
local sent = {}
local function alert(report)
  if report.key == "*" then sent[#sent + 1] = captcha.alert.webhook(receiver.url .. "/hooks/captcha", report) end
end

local tasks = {}
for i = 1, 200 do
  tasks[i] = { id = i, method = "turnstile", sitekey = "0x4AAAAAAAexample", pageurl = "https://staging.example/p" .. i }
end
local summary = captcha.pipeline{
  client = client, budget = budget, concurrency = 20, input = tasks, output = "/dev/null", quiet = true,
  bucket = captcha.bucket{ capacity = 20, rate = 200 },
  -- no pause here: this job only reports (see throttle-on-critical.lua to react)
  on = { warning = alert, critical = alert, exhausted = alert, healthy = alert },
}:run()
print(("pipeline done: %d solved, %d failed"):format(summary.solved, summary.failed))

-- 4. Wait for the alerts (each task returns true, or nil and the error after
-- its retries), then stop the receiver so the script can end.
for _, t in ipairs(sent) do
  local ok, err = t:wait()
  if not ok then print("alert failed: " .. tostring(err)) end
end
print(("%d alert(s) sent, %d received"):format(#sent, received))
sent = nil
receiver:close()
budget:close()
mock:close()
