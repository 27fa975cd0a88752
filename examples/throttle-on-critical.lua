-- examples/throttle-on-critical.lua: slow down when the error budget runs low.
-- Run: captcharun examples/throttle-on-critical.lua        (about 6 s, no account)
--
-- When failures spike, submitting at full speed only burns the budget (and
-- money) faster. Here the hooks lower the submission rate when the budget is
-- critical and restore it when things are healthy again. A mock provider plays
-- CaptchaAI: after 1.5 s a third of the Turnstile answers fail for 2 s.
-- Every half second the script prints the submit rate the mock saw, so you can
-- watch the rate drop to a quarter and come back.
local captcha = require "captcha"

-- The provider. For real use: captcha.client{ key = os.getenv("CAPTCHAAI_API_KEY") }
local mock = captcha.mock{ key = "example-key", seed = 7, latency = { 0.02, 0.05 },
  scenario = { { at = 1.5, set = { unsolvable_rate = 0.33 } },     -- the spike ...
               { at = 3.5, set = { unsolvable_rate = 0 } } } }     -- ... and its end
local client = captcha.client{ key = "example-key", base_url = mock.url,
                               first_poll = 0.02, poll_interval = 0.02 }

-- A short window (3 s) so the example recovers within seconds; production
-- budgets use hours ("24h"). 90 % of solves must succeed.
local budget = captcha.budget{ target = 0.90, window = "3s", min_events = 20 }

local FULL = 80 -- submissions per second
local function status(report, p, what)
  -- hooks fire for every key: the aggregate "*" and each CAPTCHA type
  if report.key ~= "*" then return false end
  print(("  budget %-9s %5.1f%% left -> %s (rate now %g/s)"):format(report.status,
    report.budget_remaining_pct, what, p.bucket.rate))
  return true
end

local p = captcha.pipeline{
  client = client, budget = budget,
  bucket = captcha.bucket{ capacity = 10, rate = FULL },
  concurrency = 40, output = "/dev/null", quiet = true,
  input = (function()                         -- an iterator: 4 s of work at full speed
    local i = 0
    return function()
      i = i + 1
      if i > FULL * 4 then return nil end
      return { id = i, method = "turnstile", sitekey = "0x4AAAAAAAexample", pageurl = "https://staging.example/p" .. i }
    end
  end)(),
  on = {
    -- p:throttle(f) scales the bucket's rate; p:throttle(1) restores it
    critical = function(report, p) p:throttle(0.25) status(report, p, "throttled to 1/4") end,
    exhausted = function(report, p) p:throttle(0.25) status(report, p, "throttled to 1/4") end,
    warning = function(report, p) status(report, p, "watching") end,
    healthy = function(report, p) p:throttle(1) status(report, p, "full speed") end,
  },
}

-- Sample the mock's submit counter twice a second while the pipeline runs.
local running = true
captcha.spawn(function()
  local t0, last = captcha.now(), 0
  while running do
    captcha.sleep(0.5)
    if not running then break end
    local n = mock:stats().submits
    print(("t=%4.1fs  %5.1f submits/s"):format(captcha.now() - t0, (n - last) / 0.5))
    last = n
  end
end)

local summary = p:run()
running = false
print(("done: %d solved, %d failed"):format(summary.solved, summary.failed))
budget:close()
mock:close()
