--- captcha.cli: what the ready pipelines share for their command lines.
--
--   local cli = require "captcha.cli"
--   local usage_error = cli.usage_error("gate.lua", "captcharun pipelines/gate.lua")
--   if bad then return usage_error("--slo: a number in [0, 1] expected") end  -- prints, returns nil
--   cli.fraction("0.95") --> 0.95 ; cli.fraction("2") --> nil
local M = {}

--- A printer of one-line usage errors with the --help hint (exit status 2 is
-- the caller's); it returns nil so `return usage_error(msg)` ends a parser.
function M.usage_error(short, full)
  return function(msg)
    io.stderr:write(short, ": ", msg, "\nTry '", full, " --help' for more information.\n")
    return nil
  end
end

--- s as a number in [0, 1], or nil.
function M.fraction(s)
  local v = tonumber(s)
  if v and v >= 0 and v <= 1 then return v end
  return nil
end

--- s as an integer >= 0, or nil.
function M.count(s)
  local v = math.tointeger(tonumber(s))
  if v and v >= 0 then return v end
  return nil
end

--- Repeated "METHOD=TARGET" options -> { method = target }, or nil and the
-- offending item.
function M.method_targets(items)
  local t = {}
  for _, item in ipairs(items or {}) do
    local m, v = item:match("^([^=]+)=(.+)$")
    if not m or not M.fraction(v) then return nil, item end
    t[m] = M.fraction(v)
  end
  return t
end

return M
