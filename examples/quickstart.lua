-- examples/quickstart.lua: the smallest captcharun job.
-- Run: captcharun examples/quickstart.lua
--
-- Every function below runs as a task on one event loop: tasks sleep and wait
-- without blocking each other, and the process ends when all of them are done.
local captcha = require "captcha"

local function fake_solve(id)
  -- stands in for client:solve{...}; a real job talks to the mock provider
  -- (captcharun mock) or to CaptchaAI with CAPTCHAAI_API_KEY set
  captcha.sleep(0.05 + (id % 5) * 0.02)
  if id % 7 == 0 then error("ERROR_CAPTCHA_UNSOLVABLE") end
  return "token-" .. id
end

local tasks = {}
for id = 1, 20 do
  tasks[id] = captcha.spawn(fake_solve, id)
end

local solved, failed = 0, 0
for id, task in ipairs(tasks) do
  local token, err = task:wait()          -- an error comes back as a value
  if token then solved = solved + 1 else failed = failed + 1 end
  print(captcha.json.encode({id = id, status = token and "solved" or "failed",
                             token = token, error = err and tostring(err):match("[%u_]+$")}))
end
captcha.log.info("quickstart done", {solved = solved, failed = failed})
