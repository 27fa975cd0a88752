-- captcha.cli: the helpers the ready pipelines share for their options.
local cli = require "captcha.cli"

describe("captcha.cli", function()
  it("reads fractions and counts", function()
    assert.are.equal(0.95, cli.fraction("0.95"))
    assert.is_nil(cli.fraction("1.5"))
    assert.is_nil(cli.fraction("x"))
    assert.are.equal(20, cli.count("20"))
    assert.is_nil(cli.count("-1"))
    assert.is_nil(cli.count("2.5"))
  end)

  it("reads METHOD=TARGET lists", function()
    assert.are.same({ turnstile = 0.98, base64 = 0.9 }, cli.method_targets({ "turnstile=0.98", "base64=0.90" }))
    assert.are.same({}, cli.method_targets(nil))
    local t, bad = cli.method_targets({ "turnstile=2" })
    assert.is_nil(t)
    assert.are.equal("turnstile=2", bad)
  end)
end)
