-- captcha.errors: how the client treats every in.php/res.php answer code
-- (PROTOCOL.md section 3) and every transport failure.
--
-- class:
--   not_ready  the task is still being solved: poll again later
--   transient  retry the same request after a backoff (full jitter, bounded)
--   task       this task failed; a new submit may succeed (resubmit, bounded)
--   error      this task (or call) failed; retrying the same thing is pointless
--   fatal      the account/key/IP cannot work: the client halts
-- wait: the provider's advised wait in seconds, the backoff base for that code.
--
-- Provider profiles may override a class (CaptchaAI bills by threads, so its
-- ERROR_ZERO_BALANCE means "no free thread" and is transient; on 2captcha it
-- means no funds and is fatal): see captcha.client's profiles.
local M = {}

local codes = {
  CAPCHA_NOT_READY = { "not_ready", 5, "not solved yet" },
  -- capacity and rate limits: wait and retry
  ERROR_NO_SLOT_AVAILABLE = { "transient", 3, "no slot available (all threads busy or bid too low)" },
  ERROR_ZERO_BALANCE = { "transient", 5, "zero balance / no free thread" },
  MAX_USER_TURN = { "transient", 10, "too many submits in a short time" },
  ERROR_TOO_MUCH_REQUESTS = { "transient", 10, "too many requests" },
  ["ERROR: 1001"] = { "transient", 600, "blocked 10 min: too many NO_SLOT answers" },
  ["ERROR: 1002"] = { "transient", 300, "blocked 5 min: too many ZERO_BALANCE answers" },
  ["ERROR: 1003"] = { "transient", 30, "blocked 30 s: too many NO_SLOT answers" },
  ["ERROR: 1004"] = { "transient", 600, "blocked 10 min: too many bad-key calls" },
  ["ERROR: 1005"] = { "transient", 300, "blocked 5 min: too many res.php calls" },
  ERROR_SERVER_ERROR = { "transient", 10, "provider server error" },
  ERROR_INTERNAL_SERVER_ERROR = { "transient", 10, "provider internal server error" },
  -- the account: nothing will work until a human acts
  ERROR_WRONG_USER_KEY = { "fatal", 0, "wrong API key format" },
  ERROR_KEY_DOES_NOT_EXIST = { "fatal", 0, "API key does not exist (or no plan)" },
  ERROR_IP_NOT_ALLOWED = { "fatal", 0, "this IP is not on the key's allow-list" },
  IP_BANNED = { "fatal", 300, "IP banned (bad-key flood)" },
  -- the request is wrong: fix the task
  ERROR_PAGEURL = { "error", 0, "pageurl missing or invalid" },
  ERROR_GOOGLEKEY = { "error", 0, "googlekey/sitekey missing or invalid" },
  ERROR_WRONG_GOOGLEKEY = { "error", 0, "googlekey/sitekey missing or invalid" },
  ERROR_BAD_TOKEN_OR_PAGEURL = { "error", 0, "sitekey and pageurl do not match" },
  ERROR_BAD_PARAMETERS = { "error", 0, "bad or missing parameters" },
  ERROR_PROXY_FORMAT = { "error", 0, "bad proxy format" },
  ERROR_EMPTY_ACTION = { "error", 0, "action missing (reCAPTCHA v3)" },
  ERROR_ZERO_CAPTCHA_FILESIZE = { "error", 0, "image too small" },
  ERROR_TOO_BIG_CAPTCHA_FILESIZE = { "error", 0, "image too big" },
  ERROR_WRONG_FILE_EXTENSION = { "error", 0, "image type not allowed" },
  ERROR_IMAGE_TYPE_NOT_SUPPORTED = { "error", 0, "image type not supported" },
  ERROR_UPLOAD = { "error", 0, "image upload failed (bad data)" },
  ERROR_CAPTCHAIMAGE_BLOCKED = { "error", 0, "image blocked by the provider" },
  TOO_MANY_BAD_IMAGES = { "error", 0, "too many unrecognisable images" },
  ERROR_BAD_PROXY = { "error", 0, "proxy marked bad" },
  ERROR_PROXY_CONNECTION_FAILED = { "error", 0, "provider could not use the proxy" },
  ERROR_TOKEN_EXPIRED = { "error", 0, "GeeTest challenge expired: fetch a new one" },
  ERROR_WRONG_ID_FORMAT = { "error", 0, "bad task id format" },
  ERROR_WRONG_CAPTCHA_ID = { "error", 0, "unknown task id" },
  ERROR_IP_ADDRES = { "error", 0, "pingback registered from another IP" },
  ERROR_REPORT_NOT_RECORDED = { "error", 0, "report not recorded" },
  ERROR_DUPLICATE_REPORT = { "error", 0, "task already reported" },
  -- this task failed; a new one may not
  ERROR_CAPTCHA_UNSOLVABLE = { "task", 0, "workers could not solve it" },
  ERROR_BAD_DUPLICATES = { "task", 0, "100% accuracy mode did not converge" },
  -- transport and framing (codes made by the client)
  HTTP_5XX = { "transient", 5, "provider answered HTTP 5xx" },
  HTTP_429 = { "transient", 10, "provider answered HTTP 429" },
  HTTP_4XX = { "error", 0, "provider answered an HTTP client error (check base_url)" },
  BAD_RESPONSE = { "transient", 5, "unparseable answer (HTML or garbage)" },
  HTTP_TIMEOUT = { "transient", 5, "request timed out" },
  HTTP_RESET = { "transient", 5, "connection reset or closed early" },
  HTTP_CONNECT = { "transient", 5, "cannot connect" },
  HTTP_PROTOCOL = { "transient", 5, "not an HTTP answer" },
  HTTP_TRANSPORT = { "transient", 5, "transport failure" },
  HTTP_TOO_BIG = { "transient", 5, "answer too large" },
  HTTP_CLOSED = { "error", 0, "runtime shutting down" },
  HTTP_INVALID = { "error", 0, "request could not be built (bad base_url or file)" },
  -- client outcomes
  TIMEOUT = { "error", 0, "task timed out" },
  BAD_TASK = { "error", 0, "task is missing a required field" },
  INTERNAL = { "error", 0, "client bug" },
  CANCELLED = { "error", 0, "the solve was cancelled" },
}

M.codes = {}
for code, v in pairs(codes) do
  M.codes[code] = { class = v[1], wait = v[2], text = v[3] }
end

-- curl failure kinds (captcha.http.request's third result) -> codes
M.transport = {
  timeout = "HTTP_TIMEOUT", reset = "HTTP_RESET", connect = "HTTP_CONNECT",
  protocol = "HTTP_PROTOCOL", too_big = "HTTP_TOO_BIG", closed = "HTTP_CLOSED",
  invalid = "HTTP_INVALID", nomem = "HTTP_TRANSPORT", transport = "HTTP_TRANSPORT",
}

local unknown = { class = "error", wait = 0, text = "unknown error code" }

-- classify(code, overrides) -> class, info. Unknown ERROR_* codes are task
-- errors that are not retried: retrying what we do not understand could
-- burn money or get the key banned.
function M.classify(code, overrides)
  local info = M.codes[code] or unknown
  local class = overrides and overrides[code] or info.class
  return class, info
end

-- A code looks like an API code (plain-text answers): upper case, digits,
-- '_', ':' and ' '.
function M.is_code(s)
  return type(s) == "string" and #s < 64 and s:match("^[A-Z][A-Z0-9_: ]*$") ~= nil
end

return M
