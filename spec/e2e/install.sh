#!/usr/bin/env bash
# `cmake --install` lays out bin/, the module and the Lua library so that the
# installed captcharun finds its library next to itself (not in the source
# tree) and stock lua5.4 can require the module from the prefix.
. "$(dirname "$0")/lib.bash"
: "${CR_BUILD:?}"
PREFIX="$TMP/prefix"
cmake --install "$CR_BUILD" --prefix "$PREFIX" > "$TMP/install.log" 2>&1; expect_eq $? 0 "cmake --install"
expect_eq "$(test -x "$PREFIX/bin/captcharun" && echo yes)" yes "binary installed"
expect_eq "$(test -f "$PREFIX/lib/lua/5.4/captcha.so" && echo yes)" yes "module installed"
expect_eq "$(test -f "$PREFIX/share/lua/5.4/captcha/pipeline.lua" && echo yes)" yes "Lua library installed"

# the installed binary uses the installed library
"$PREFIX/bin/captcharun" -e 'print(package.searchpath("captcha.pipeline", package.path))' > "$TMP/out"
expect_grep "^$PREFIX/bin/../share/lua/5.4/captcha/pipeline.lua" "$TMP/out" "installed library found next to the binary"

# stock lua5.4 loads the installed module
# (a sanitizer build preloads its runtimes into the uninstrumented lua5.4)
LD_PRELOAD="${CR_LUA_PRELOAD:-}" ASAN_OPTIONS=detect_leaks=0 \
LUA_CPATH="$PREFIX/lib/lua/5.4/?.so;;" LUA_PATH="$PREFIX/share/lua/5.4/?.lua;;" lua5.4 -e '
  local c = require "captcha"
  c.run(function() c.sleep(0.01) print("ok " .. c.version) end)' > "$TMP/out" 2>&1
expect_grep "^ok captcharun" "$TMP/out" "stock lua5.4 requires the installed module"

# an installed pipeline runs from the installed tree
"$PREFIX/bin/captcharun" "$PREFIX/share/captcharun/pipelines/batch.lua" --help > "$TMP/out" 2>&1
expect_eq $? 0 "installed batch.lua --help"
finish
