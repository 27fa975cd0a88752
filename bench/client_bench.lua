-- bench/client_bench.lua: the client's CPU per solve at 1, 100 and 10,000
-- concurrent solves. Not a test: it prints figures.
--
--   captcharun bench/client_bench.lua                 # mock in another process
--   captcharun bench/client_bench.lua --in-process    # one process: CPU includes the mock
--   MOCK_URL=http://127.0.0.1:PORT captcharun bench/client_bench.lua
--   (also runs in stock lua5.4 with LUA_CPATH=<build>/?.so and LUA_PATH=<src>/lua/?.lua)
--
-- os.clock() is this process's CPU time (user + system), so with the mock out
-- of process the figure is the client alone: the scheduler, Lua, curl and the
-- kernel's share of the loopback traffic. Every solve is 1 submit + ~2 polls.
local captcha = require "captcha"

local KEY = "BENCHbench0123456789abcdefABCDEF"
local LEVELS = { 1, 100, 10000 }
local in_process = false
for _, a in ipairs(arg or {}) do if a == "--in-process" then in_process = true end end

local function start_external()
  local exe = os.getenv("CAPTCHARUN") or "captcharun"
  local port = 20000 + math.random(0, 20000)
  local cmd = string.format("%s mock --listen 127.0.0.1:%d --key %s --latency 0.05 >/dev/null 2>&1 & echo $!",
    exe, port, KEY)
  local p = assert(io.popen(cmd))
  local pid = p:read("l")
  p:close()
  return "http://127.0.0.1:" .. port, pid
end

local function wait_ready(url)
  for _ = 1, 100 do
    local r = captcha.http.request{ url = url .. "/__stats", timeout = 1 }
    if r and r.status == 200 then return true end
    captcha.sleep(0.05)
  end
  error("mock at " .. url .. " did not come up")
end

captcha.run(function()
  local url, pid, mock = os.getenv("MOCK_URL"), nil, nil
  if not url then
    if in_process then
      mock = assert(captcha.mock{ key = KEY, latency = 0.05 })
      url = mock.url
    else
      url, pid = start_external()
    end
  end
  wait_ready(url)
  print(string.format("mock: %s (%s)", url, mock and "in process: CPU includes the mock" or "out of process"))
  print(string.format("%8s %10s %12s %12s %10s %9s", "solves", "wall s", "CPU us/solve", "reqs/solve", "connects", "failed"))
  for _, n in ipairs(LEVELS) do
    local client = captcha.client{ key = KEY, base_url = url, first_poll = 0.05, poll_interval = 0.05,
      timeout = 60, max_polls = 100, max_connections = 256, retry = { base = 0.01, cap = 0.1 } }
    local conn0 = captcha.http.stats().connects
    collectgarbage()
    local c0, w0 = os.clock(), captcha.now()
    local tasks, failed = {}, 0
    for i = 1, n do
      tasks[i] = captcha.spawn(client.solve, client, { method = "turnstile", sitekey = "0x4AAA",
        pageurl = "https://example.com/" .. i })
    end
    for i = 1, n do if not tasks[i]:wait() then failed = failed + 1 end end
    local cpu, wall = os.clock() - c0, captcha.now() - w0
    local st = client:stats()
    local reqs = 0
    for _, bucket in pairs(st.requests) do for _, k in pairs(bucket) do reqs = reqs + k end end
    print(string.format("%8d %10.2f %12.1f %12.2f %10d %9d", n, wall, cpu / n * 1e6, reqs / n,
      captcha.http.stats().connects - conn0, failed))
  end
  if mock then mock:close() end
  if pid then os.execute("kill " .. pid) end
end)
