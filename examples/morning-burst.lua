-- examples/morning-burst.lua: 4,000 pages arrive at once; the token bucket
-- turns the spike into a steady flow that never exceeds the provider's limit.
-- Run: captcharun examples/morning-burst.lua        (about 9 s, no account)
--
-- The seed's story: at 9:00 a scheduler releases 4,000 pages of an authorized
-- staging crawl, and hundreds of reCAPTCHAs show up within seconds. With a
-- bucket of capacity 20 and a refill of 10/s the first 20 submissions go out
-- at once and the rest drain at 10 per second; no task is dropped, each one
-- waits its turn (first come, first served). In any T seconds at most
-- 20 + 10*T submissions leave: 30 in any one second.
--
-- Compressed time: at 10/s the burst takes 400 s. SPEED = 50 runs the same
-- story 50 times faster: the refill is 10 * SPEED per real second, a solve
-- takes (10-20 s) / SPEED, and one simulated second is 1/SPEED real seconds.
-- Capacity is a count, not a rate, so it stays 20. Set SPEED = 1 to watch it
-- in real time. Much faster than 50 and a simulated second (20 ms here) gets
-- as short as one busy pass of the event loop: send times are taken when a
-- task resumes, so a few grants can then be stamped into the next window.
local captcha = require "captcha"

local SPEED = 50
local PAGES, CAPACITY, REFILL = 4000, 20, 10          -- the seed's numbers
local SIM = 1 / SPEED                                 -- one simulated second, in real seconds

-- The provider refuses submissions over its limit (ERROR_TOO_MUCH_REQUESTS);
-- the bucket is set below it: the limit here is 10 % above the most the
-- bucket allows in a real second (capacity + refill * 1 s), room for network
-- jitter bunching a few submissions together on the way.
local LIMIT = math.floor((CAPACITY + REFILL * SPEED) * 1.1)
local mock = captcha.mock{ key = "example-key", seed = 9, latency = { 10 * SIM, 20 * SIM }, submit_rate = LIMIT }
local client = captcha.client{ key = "example-key", base_url = mock.url, max_connections = 300,
                               first_poll = 20 * SIM, poll_interval = 2 * SIM }
local bucket = captcha.bucket{ capacity = CAPACITY, rate = REFILL * SPEED, max_waiters = PAGES }

-- Every page is a distinct reCAPTCHA (no dedup to help here).
local pages = {}
for i = 1, PAGES do
  pages[i] = { id = i, method = "userrecaptcha", googlekey = "6LeStagingCrawlKey",
               pageurl = "https://staging.example.com/checkout?page=" .. i }
end

-- Note when each submission leaves (the pipeline calls `solve` right after the
-- bucket granted a token).
local sent = {}
local function solve(task)
  sent[#sent + 1] = captcha.now()
  return client:solve(task)
end

-- All 4,000 pages are in the input at once. `concurrency` is how many solves
-- may be open (the plan's threads: about refill * solve time = 10 * 15 = 150
-- are needed); the bucket, not the worker count, sets the pace.
local t0 = captcha.now()
local summary = captcha.pipeline{ solve = solve, bucket = bucket, input = pages, output = "/dev/null",
  concurrency = 300, quiet = true }:run()
local elapsed = captcha.now() - t0

-- The most submissions in any window of one simulated second (two pointers
-- over the sorted send times; the window is closed, so its edges count).
local max, j = 0, 1
for i = 1, #sent do
  while sent[i] - sent[j] > SIM do j = j + 1 end
  if i - j + 1 > max then max = i - j + 1 end
end
local first = 0
for i = 1, #sent do if sent[i] - sent[1] <= SIM then first = first + 1 end end
local st = mock:stats()

print(("%d pages: %d solved, %d failed, none dropped"):format(PAGES, summary.solved, summary.failed))
print(("took %.1f s real = %.0f s simulated (ideal: (4000 - 20) / 10 = 398 s, plus the last solve)"):format(
  elapsed, elapsed * SPEED))
print(("first simulated second: %d submissions (capacity %d + refill %d)"):format(first, CAPACITY, REFILL))
print(("max submissions in any simulated second: %d (bound %d = %d + %d/s x 1 s: %s)"):format(max,
  CAPACITY + REFILL, CAPACITY, REFILL, max <= CAPACITY + REFILL and "within" or "over: see the note on SPEED"))
print(("the provider saw at most %d submits in a real second (bucket bound %d, its limit %d) and refused %d"):format(
  st.max_submits_per_second, CAPACITY + REFILL * SPEED, LIMIT, st.submit_answers.ERROR_TOO_MUCH_REQUESTS or 0))
bucket:close()
mock:close()
