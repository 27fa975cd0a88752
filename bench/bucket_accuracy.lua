-- bench/bucket_accuracy.lua: the token bucket against real time.
--
--   captcharun bench/bucket_accuracy.lua [rate] [seconds] [acquirers] [capacity]
--   LUA_CPATH='build/?.so;;' lua5.4 bench/bucket_accuracy.lua
--
-- Many tasks acquire one token at a time from one bucket for a fixed time. Each
-- grant is stamped by the task right after acquire returns (never before the
-- grant itself). For every grant t we count the grants in [t, t + 1 s] and
-- compare with the bound capacity + rate * 1 s: "max over bound" must be 0.
-- Also printed: throughput against the ideal, and waiting time percentiles.
local captcha = require "captcha"

local rate = tonumber(arg and arg[1]) or 200
local seconds = tonumber(arg and arg[2]) or 10
local acquirers = tonumber(arg and arg[3]) or 500
local capacity = tonumber(arg and arg[4]) or 20

local bucket = captcha.bucket{capacity = capacity, rate = rate, max_waiters = acquirers}
local stamps, waits = {}, {}
local cpu0 = os.clock()
local t0 = captcha.now()

captcha.run(function()
  local stop = t0 + seconds
  local tasks = {}
  for i = 1, acquirers do
    tasks[i] = captcha.spawn(function()
      while true do
        local asked = captcha.now()
        if asked >= stop then return end
        local ok = bucket:acquire{timeout = stop - asked}
        if not ok then return end
        local now = captcha.now()
        stamps[#stamps + 1] = now
        waits[#waits + 1] = now - asked
      end
    end)
  end
  for _, t in ipairs(tasks) do t:wait() end
end)

local cpu = os.clock() - cpu0
table.sort(stamps)
local n = #stamps
local bound = capacity + rate * 1.0
local maxwin, j = 0, 1
for i = 1, n do
  while j <= n and stamps[j] <= stamps[i] + 1.0 do j = j + 1 end
  local c = j - i
  if c > maxwin then maxwin = c end
end
table.sort(waits)
local function pct(p) return waits[math.max(1, math.ceil(p / 100 * #waits))] or 0 end
local ideal = capacity + rate * seconds
local s = bucket:stats()

print(("bucket accuracy: capacity=%d rate=%g/s for %g s, %d concurrent acquirers")
      :format(capacity, rate, seconds, acquirers))
print(("grants                 %d (ideal capacity + rate*T = %d, %.2f%%)"):format(n, ideal, 100 * n / ideal))
print(("max grants in any 1 s  %d (bound capacity + rate*1s = %g)"):format(maxwin, bound))
print(("max over bound         %d"):format(math.max(0, maxwin - bound)))
print(("wait p50/p99/max       %.1f / %.1f / %.1f ms (stats: avg %.1f ms, max %.1f ms)")
      :format(pct(50) * 1e3, pct(99) * 1e3, pct(100) * 1e3, s.avg_wait * 1e3, s.max_wait * 1e3))
print(("CPU                    %.3f s total, %.1f us per grant"):format(cpu, cpu / math.max(n, 1) * 1e6))
bucket:close()
if maxwin > bound then os.exit(1) end
