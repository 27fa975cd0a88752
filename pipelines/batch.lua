#!/usr/bin/env captcharun
--- pipelines/batch.lua: solve a file of tasks with a rate limit, an error budget
-- and a dedup cache; one JSON line per task out.
--
--   captcharun pipelines/batch.lua tasks.jsonl --out results.jsonl --slo 0.95 --rate 10
--   captcharun pipelines/batch.lua tasks.jsonl --mock          # no account: in-process mock
--
-- The API key comes from CAPTCHAAI_API_KEY or --key-file, never from the
-- command line (it would show in `ps`). Exit status: 0 done, 2 usage, 3 an
-- error budget ended exhausted, 4 halted by a fatal provider error, 130/143
-- interrupted (the output stays valid JSONL; rerun with --resume).
local captcha = require "captcha"
local argparse = require "argparse"
local cli = require "captcha.cli"

local usage_error = cli.usage_error("batch.lua", "captcharun pipelines/batch.lua")

local function parse_args(args)
  local p = argparse("captcharun pipelines/batch.lua",
    "Solve a JSONL (or CSV) file of CAPTCHA tasks through a token bucket, an error budget and a dedup cache.")
  p:epilog([[
Each input line is a task: {"id": "...", "method": "turnstile", "sitekey": "...", "pageurl": "..."}.
Every task yields exactly one output line: solved, failed, invalid, skipped or interrupted.

Exit status: 0 done, 1 script error, 2 usage, 3 an error budget ended exhausted,
4 halted by a fatal provider error (bad key, banned IP, ...), 130/143 interrupted.
Environment: CAPTCHAAI_API_KEY (the key; never printed), NO_COLOR.
For authorized QA, staging and monitoring pipelines only.]])
  p:argument("input", "Tasks file (.jsonl or .csv), or - for standard input.")
  p:option("--out", "Results file (JSONL), or - for standard output.", "-")
  p:option("--format", "Input format: jsonl or csv (default: by file extension)."):choices({ "jsonl", "csv" })
  p:option("--slo", "Success-rate target of the error budget.", "0.95"):convert(tonumber)
  p:option("--warning", "Warn when less than this fraction of the budget remains.", "0.50"):convert(tonumber)
  p:option("--critical", "Critical below this fraction.", "0.10"):convert(tonumber)
  p:option("--window", "Rolling window of the budget (e.g. 24h, 30m, 90s).", "24h")
  p:option("--min-events", "No budget status change below this many events.", "0"):convert(tonumber)
  p:option("--state", "Budget state file: loaded at start, saved on change and at exit.")
  p:option("--rate", "Submissions per second (token refill rate).", "10"):convert(tonumber)
  p:option("--burst", "Bucket capacity: submissions allowed at once.", "20"):convert(tonumber)
  p:option("--concurrency", "Tasks in flight (about your plan's threads).", "50"):convert(math.tointeger)
  p:option("--provider", "captchaai or 2captcha.", "captchaai"):choices({ "captchaai", "2captcha" })
  p:option("--base-url", "Provider URL (a proxy, a compatible provider, a mock).")
  p:option("--key-file", "Read the API key from this file instead of CAPTCHAAI_API_KEY.")
  p:option("--first-poll", "Seconds before the first poll (default: per method).")
  p:option("--poll-interval", "Seconds between polls.", "5"):convert(tonumber)
  p:option("--timeout", "Seconds before a task is given up.", "180"):convert(tonumber)
  p:option("--retry-base", "Backoff base in seconds for transient errors (default: the provider's advice).")
  p:option("--retry-cap", "Longest backoff in seconds.", "60"):convert(tonumber)
  p:option("--drain-timeout", "On SIGINT/SIGTERM, seconds in-flight tasks get to finish.", "30"):convert(tonumber)
  p:option("--summary-json", "Also write the summary as JSON to this file.")
  p:flag("--no-dedup", "Solve identical tasks separately.")
  p:flag("--resume", "Skip ids that already have a terminal line in --out.")
  p:flag("--quiet", "No progress line and no summary.")
  p:flag("--mock", "Use an in-process mock provider (no account, no network).")
  p:option("--mock-latency", "Mock solve time in seconds (with --mock).", "0.05"):convert(tonumber)
  p:option("--mock-unsolvable", "Mock unsolvable rate (with --mock).", "0.02"):convert(tonumber)
  p:option("--mock-seed", "Mock random seed (with --mock).", "1"):convert(math.tointeger)
  local ok, res = p:pparse(args)
  if not ok then return usage_error(res) end
  for _, k in ipairs({ "slo", "warning", "critical", "rate", "burst", "concurrency", "poll_interval",
                       "timeout", "drain_timeout", "min_events", "mock_latency", "mock_unsolvable",
                       "retry_cap", "mock_seed" }) do
    if res[k] == nil then
      return usage_error("--" .. k:gsub("_", "-") .. " needs a number")
    end
  end
  for _, k in ipairs({ "slo", "warning", "critical", "mock_unsolvable" }) do
    if not cli.fraction(res[k]) then
      return usage_error(("--%s: a number in [0, 1] expected, got %s"):format(k:gsub("_", "-"), res[k]))
    end
  end
  for _, k in ipairs({ "rate", "burst", "concurrency", "timeout" }) do
    if res[k] <= 0 then return usage_error(("--%s must be > 0"):format(k)) end
  end
  if res.retry_base and not tonumber(res.retry_base) then
    return usage_error("--retry-base needs a number")
  end
  if res.first_poll and not tonumber(res.first_poll) then
    return usage_error("--first-poll needs a number")
  end
  return res
end

local function read_key(o)
  if o.key_file then
    local f, err = io.open(o.key_file)
    if not f then return nil, "cannot read the key file: " .. err end
    local k = f:read("a"):gsub("%s+$", ""):gsub("^%s+", "")
    f:close()
    return k
  end
  local k = os.getenv("CAPTCHAAI_API_KEY")
  if k and k ~= "" then return k end
  return nil, "no API key: set CAPTCHAAI_API_KEY, use --key-file FILE, or try --mock"
end

local function main(args)
  local o = parse_args(args)
  if not o then return 2 end
  local key, base_url, mock = nil, o.base_url, nil
  if o.mock then
    key = "mock-key-" .. tostring(o.mock_seed)
    mock = captcha.mock{ key = key, seed = o.mock_seed, latency = { o.mock_latency / 2, o.mock_latency * 1.5 },
                         unsolvable_rate = o.mock_unsolvable }
    base_url = mock.url
  else
    local err
    key, err = read_key(o)
    if not key then usage_error(err) return 2 end
  end
  captcha.log.secret(key)
  local first_poll = tonumber(o.first_poll)
  if o.mock and not first_poll then first_poll = math.max(0.005, o.mock_latency / 2) end
  local client = captcha.client{ key = key, provider = o.provider, base_url = base_url,
    timeout = o.timeout, poll_interval = o.mock and math.min(o.poll_interval, o.mock_latency) or o.poll_interval,
    first_poll = first_poll, max_connections = o.concurrency,
    retry = { base = tonumber(o.retry_base), cap = o.retry_cap } }
  local budget = captcha.budget{ target = o.slo, window = o.window, warning = o.warning,
                                 critical = o.critical, min_events = o.min_events > 0 and o.min_events or nil,
                                 state = o.state }
  local p = captcha.pipeline{ client = client, budget = budget,
    bucket = captcha.bucket{ capacity = o.burst, rate = o.rate },
    dedup = not o.no_dedup and captcha.dedup{} or nil,
    concurrency = o.concurrency, input = o.input, output = o.out, format = o.format,
    resume = o.resume, quiet = o.quiet, summary_json = o.summary_json, drain_timeout = o.drain_timeout }
  local sum, code = p:run()
  budget:close()
  if mock then mock:close() end
  if not sum then io.stderr:write("batch.lua: ", code, "\n") return 1 end
  return code
end

captcha.exit(main({ ... }))
