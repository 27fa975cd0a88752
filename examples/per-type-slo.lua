-- examples/per-type-slo.lua: one error budget per CAPTCHA type.
-- Run: captcharun examples/per-type-slo.lua        (about 2 s, no account)
--
-- One budget over every type hides which type burns it. The seed's advice:
-- give each type its own SLO from its measured baseline -- stricter for
-- Turnstile (98 %), looser for hard image grids (90 %). `targets` does that;
-- every record(ok, {method = ...}) counts for its type and for the aggregate "*".
--
-- The mock below fails 4 % of Turnstile tasks (twice the 2 % that 98 % allows)
-- and 6 % of images (well inside their 10 %): the Turnstile budget runs out
-- while the image budget stays usable.
local captcha = require "captcha"

local mock = captcha.mock{ key = "example-key", seed = 5, latency = { 0.01, 0.03 },
  unsolvable_rate = { turnstile = 0.04, base64 = 0.06 },
  check_images = false }                -- the example's "images" are placeholders
local client = captcha.client{ key = "example-key", base_url = mock.url,
                               first_poll = 0.01, poll_interval = 0.01 }

local budget = captcha.budget{
  target = 0.95,                        -- the default for any other type and for "*"
  targets = { turnstile = 0.98, base64 = 0.90 },
  window = "1h",
  min_events = 100,                     -- no verdict on a handful of events
}

local function show(report)
  print(("  %-10s %-9s (SLO %.2f, %d/%d failed, %.0f%% of the budget left)"):format(report.key,
    report.status, report.slo_target, report.failures, report.total_events, report.budget_remaining_pct))
end

-- Pipeline hooks receive (report, p); report.key names the type (or "*"):
-- say which type went bad. (A real job
-- could pause just that type's submissions, or page the team that owns it.)
-- Each fires once per transition per key; a budget near a threshold may cross
-- it several times, so only the first time is printed here.
local seen = {}
local function went_bad(report)
  local key = report.key
  if key == "*" or seen[key .. report.status] then return end
  seen[key .. report.status] = true
  io.write("hook: ") show(report)
end

local tasks = {}
for i = 1, 800 do
  if i % 2 == 0 then
    tasks[i] = { id = i, method = "turnstile", sitekey = "0x4AAAAAAAexample", pageurl = "https://staging.example/p" .. i }
  else
    tasks[i] = { id = i, method = "base64", body = "iVBORw0KGgoAAAANSUhEUgAAA" .. i }
  end
end

captcha.pipeline{
  client = client, budget = budget, concurrency = 40, input = tasks, output = "/dev/null", quiet = true,
  bucket = captcha.bucket{ capacity = 40, rate = 800 },
  on = { critical = went_bad, exhausted = went_bad },
}:run()

print("\nfinal budgets:")
for _, key in ipairs(budget:keys()) do show(budget:report(key)) end
budget:close()
mock:close()
