-- bench/tasks.lua: the scheduler's costs. Run: captcharun bench/tasks.lua [N]
-- Prints: N tasks each sleeping a random 0-100 ms all finish; Lua memory and
-- resident memory per parked task; the cost of a spawn + first resume, and of a
-- wake + resume (sleep(0)), measured as CPU time over many tasks.
local captcha = require "captcha"
local N = tonumber(arg and arg[1]) or 10000

local function rss_kib()
  local f = io.open("/proc/self/status")
  if not f then return 0 end
  for line in f:lines() do
    local v = line:match("^VmRSS:%s+(%d+)")
    if v then f:close() return tonumber(v) end
  end
  f:close()
  return 0
end

math.randomseed(42)
collectgarbage("collect")
local lua0, rss0 = collectgarbage("count"), rss_kib()
local done, parked = 0, 0
local lua_peak, rss_peak = 0, 0
local t0 = captcha.now()
for _ = 1, N do
  captcha.spawn(function()
    parked = parked + 1
    if parked == N then -- every task is parked now: measure
      collectgarbage("collect")
      lua_peak, rss_peak = collectgarbage("count"), rss_kib()
    end
    captcha.sleep(math.random() * 0.1)
    done = done + 1
  end)
end
while done < N do captcha.sleep(0.01) end
local wall = captcha.now() - t0
print(string.format("%d tasks sleeping 0-100 ms: all %d finished in %.3f s", N, done, wall))
print(string.format("memory per parked task: %.2f KiB Lua heap, %.2f KiB resident",
  (lua_peak - lua0) / N, (rss_peak - rss0) / N))

-- spawn + first resume: tasks that return at once
local M = 100000
local c0 = os.clock()
local finished = 0
for _ = 1, M do captcha.spawn(function() finished = finished + 1 end) end
while finished < M do captcha.sleep(0) end
local spawn_us = (os.clock() - c0) / M * 1e6
print(string.format("spawn + resume + finish: %.2f us CPU per task (%d tasks)", spawn_us, M))

-- wake + resume: one task yielding through the ready queue
c0 = os.clock()
for _ = 1, M do captcha.sleep(0) end
print(string.format("wake + resume (sleep(0)): %.2f us CPU per switch", (os.clock() - c0) / M * 1e6))
