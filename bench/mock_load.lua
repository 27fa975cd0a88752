-- bench/mock_load.lua: a wrk script (wrk runs LuaJIT) sending the mock a
-- 1:4 submit:poll mix, the shape of a pipeline's traffic.
--
--   MOCK_KEY=benchkey MOCK_NEXT_ID=70000012346 wrk -t1 -c64 -d5s -s bench/mock_load.lua URL
--
-- Every fifth request is an in.php submit, rotating over Turnstile,
-- reCAPTCHA v2, a base64 image and GeeTest, half of them with json=1. The
-- others poll res.php for one of the tasks submitted 64 to 263 submits ago:
-- old enough to exist whatever order the 64 connections deliver in, and
-- (with a solve latency of a few tens of ms) a mix of CAPCHA_NOT_READY and
-- answers. Ids are predicted: the mock numbers tasks in arrival order from
-- MOCK_NEXT_ID, and no submit of this mix is refused. Until 64 submits have
-- gone out, polls ask for task MOCK_NEXT_ID - 1, which must exist.
local key = os.getenv("MOCK_KEY") or "benchkey"
local next_id = assert(tonumber(os.getenv("MOCK_NEXT_ID")), "MOCK_NEXT_ID not set")

local image = "iVBORw0KGgo" .. string.rep("AAAA", 40)  -- PNG magic, 130 bytes decoded
local submits = {
  "method=turnstile&sitekey=0x4AAAAAAA&pageurl=https://example.com/login",
  "method=userrecaptcha&googlekey=6LfD3PIbAAAAAJs_eEHvoOl75_83eXSqpPSRFJ_u&pageurl=https://example.com/",
  "method=base64&body=" .. image,
  "method=geetest&gt=022397c99c9f646f6477822485f30404&challenge=12345678abc&pageurl=https://example.com/",
}
for i, s in ipairs(submits) do
  submits[i] = { "/in.php?key=" .. key .. "&" .. s, "/in.php?key=" .. key .. "&json=1&" .. s }
end
local poll = "/res.php?key=" .. key .. "&action=get&id="

local n, sent = 0, 0

function request()
  n = n + 1
  if n % 5 == 1 then
    sent = sent + 1
    return wrk.format("GET", submits[sent % #submits + 1][n % 2 + 1])
  end
  local back = 64 + (n * 7919) % 200
  local id = sent > back and next_id + sent - back - 1 or next_id - 1
  return wrk.format("GET", poll .. string.format("%d", id) .. (n % 2 == 0 and "&json=1" or ""))
end
