/* captcha_module.c: the entry point stock Lua 5.4 hosts find for `require "captcha"`. */
#include <lua.h>

int cr_open_module(lua_State *L);

LUAMOD_API int luaopen_captcha(lua_State *L) { return cr_open_module(L); }
