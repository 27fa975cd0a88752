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
done
finish
