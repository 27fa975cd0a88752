-- examples/quickstart.lua: a whole pipeline in a few seconds, no account needed.
-- Run: captcharun examples/quickstart.lua
--
-- An in-process mock provider plays CaptchaAI with short solve times. Halfway
-- through, Turnstile failures spike (a mock scenario), the error budget burns,
-- and the default policy reacts: a log alert at `warning`, half rate at
-- `critical`, a pause at `exhausted`, and back to full speed once the short
-- window slides past the spike. Results go to quickstart-results.jsonl (one
-- JSON line per task); the progress line (on a terminal), the hook log lines
-- and the summary go to stderr.
local captcha = require "captcha"

-- 1. A provider. Swap these two lines for a real key and the real URL:
--    local client = captcha.client{ key = os.getenv("CAPTCHAAI_API_KEY") }
local mock = captcha.mock{ key = "quickstart-key", seed = 42, latency = { 0.02, 0.08 },
  unsolvable_rate = 0.01,
  scenario = { { at = 1.5, set = { unsolvable_rate = { turnstile = 0.7, default = 0.01 } } },
               { at = 2.5, set = { unsolvable_rate = 0.01 } } } }
local client = captcha.client{ key = "quickstart-key", base_url = mock.url,
                               first_poll = 0.03, poll_interval = 0.02 }

-- 2. Tasks: 600 pages, some of them duplicates (same sitekey and page).
local tasks = {}
for i = 1, 600 do
  local method = (i % 3 == 0) and "userrecaptcha" or "turnstile"
  tasks[i] = { id = "page-" .. i, method = method, pageurl = "https://staging.example/form/" .. (i % 450),
               sitekey = method == "turnstile" and "0x4AAAAAAAquickstart" or nil,
               googlekey = method == "userrecaptcha" and "6LeQuickstartKey" or nil }
end

-- 3. The three reliability tools and the pipeline.
local budget = captcha.budget{ target = 0.90, window = "3s", warning = 0.50, critical = 0.10,
                               min_events = 20 }
local p = captcha.pipeline{
  client = client,
  bucket = captcha.bucket{ capacity = 20, rate = 100 },  -- submissions per second
  budget = budget,
  dedup = captcha.dedup{ solved_ttl = 60 },
  concurrency = 30,
  input = tasks,
  output = "quickstart-results.jsonl",
}
local summary, code = p:run()

budget:close()
mock:close()
captcha.log.info("quickstart done: results in quickstart-results.jsonl",
  { solved = summary.solved, failed = summary.failed, dedup_hits = summary.dedup_hits, exit_code = code })
