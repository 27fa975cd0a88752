/*
 * embed.c: a C program that embeds captcharun through its one public header.
 *
 *   ./embed_example 'captcha.sleep(0.01) print("from Lua")'
 *
 * It creates a runtime, adds a C function of its own to Lua, runs a chunk on
 * the runtime's loop (the chunk may spawn tasks and sleep), checks that the
 * loop closed cleanly, and closes the runtime.
 */
#include <stdio.h>

#include <lauxlib.h>
#include <lua.h>

#include "captcharun.h"

static int host_answer(lua_State *L) {
  lua_pushinteger(L, 42);
  return 1;
}

int main(int argc, char **argv) {
  cr_runtime *rt = cr_runtime_new(NULL);
  if (!rt) return 1;
  lua_State *L = cr_runtime_lua(rt);
  lua_pushcfunction(L, host_answer);
  lua_setglobal(L, "host_answer");
  const char *code = argc > 1 ? argv[1]
      : "captcha = require 'captcha'\n"
        "local t = captcha.spawn(function(x) captcha.sleep(0.01) return x * 2 end, host_answer())\n"
        "print('embedded: ' .. t:wait())";
  int status = cr_runtime_run_string(rt, code, "=embed");
  if (cr_runtime_check_leaks(rt) != 0 && status == 0) status = 1;
  cr_runtime_close(rt);
  return status;
}
