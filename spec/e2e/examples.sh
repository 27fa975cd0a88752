#!/usr/bin/env bash
# Every example in examples/ runs to completion (against the in-process mock
# where it needs a provider) and exits 0, within a bounded time.
. "$(dirname "$0")/lib.bash"
export CAPTCHARUN_CHECK_LEAKS=1
for f in "$CR_SRC"/examples/*.lua; do
  name=$(basename "$f")
  ( cd "$TMP" && timeout 120 "$CAPTCHARUN" "$f" > "$TMP/$name.out" 2> "$TMP/$name.err" )
  st=$?
  if [ "$st" -eq 0 ]; then ok; else bad "$name exited $st"; sed 's/^/    /' "$TMP/$name.err" | tail -20 >&2; fi
  # a hook that raises is only logged (the pipeline goes on): catch it here
  if grep -q "hook .* failed" "$TMP/$name.err"; then bad "$name: a hook failed"; grep -A5 "hook .* failed" "$TMP/$name.err" >&2; else ok; fi
done
finish
