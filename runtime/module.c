/*
 * module.c: the `captcha` table. C primitives register themselves through
 * cr_register_<name> functions (collected by CMake into cr_registry.h); the
 * Lua layer (client, mock, pipeline, alert) loads lazily from lua/captcha/ on
 * first use, so `require "captcha"` stays cheap.
 */
#include <string.h>

#include "rt.h"

#define CR_REGISTER(fn) void fn(lua_State *L);
#include "cr_registry.h"
#undef CR_REGISTER

static const char *const lazy[][2] = {
    {"client", "captcha.client"}, {"mock", "captcha.mock"},
    {"pipeline", "captcha.pipeline"}, {"alert", "captcha.alert"},
};

/* captcha.<name>(...) -> require(mod).new(...) */
static int lazy_new(lua_State *L) {
  lua_getglobal(L, "require");
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_call(L, 1, 1);
  if (lua_getfield(L, -1, "new") != LUA_TFUNCTION)
    return luaL_error(L, "module %s has no function 'new'", lua_tostring(L, lua_upvalueindex(1)));
  lua_replace(L, -2);
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
  return lua_gettop(L);
}

/* captcha.alert and friends are tables of functions: load on first index. */
static int lazy_index(lua_State *L) {
  const char *k = luaL_checkstring(L, 2);
  for (size_t i = 0; i < sizeof lazy / sizeof lazy[0]; i++) {
    if (strcmp(k, lazy[i][0]) != 0) continue;
    lua_getglobal(L, "require");
    lua_pushstring(L, lazy[i][1]);
    lua_call(L, 1, 1);
    return 1;
  }
  return 0;
}

int cr_open_module(lua_State *L) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, (void *)cr_open_module);
  if (lua_istable(L, -1)) return 1; /* opened once per state */
  lua_pop(L, 1);
  /* one runtime per Lua state: the embedding host made it already, or we do */
  if (!cr_rt_find(L)) cr_rt_create(L);
  lua_newtable(L);
  cr_sched_open(L);
  cr_signals_open(L);
  cr_open_json(L);
  lua_setfield(L, -2, "json");
  cr_open_log(L);
  lua_setfield(L, -2, "log");
  lua_pushliteral(L, CR_VERSION_STRING);
  lua_setfield(L, -2, "version");
#define CR_REGISTER(fn) fn(L);
#include "cr_registry.h"
#undef CR_REGISTER
  /* constructors of the Lua layer: captcha.client{...}, captcha.mock{...}, ... */
  for (size_t i = 0; i < sizeof lazy / sizeof lazy[0]; i++) {
    if (strcmp(lazy[i][0], "alert") == 0) continue; /* a library, not a constructor */
    if (lua_getfield(L, -1, lazy[i][0]) != LUA_TNIL) { lua_pop(L, 1); continue; }
    lua_pop(L, 1);
    lua_pushstring(L, lazy[i][1]);
    lua_pushcclosure(L, lazy_new, 1);
    lua_setfield(L, -2, lazy[i][0]);
  }
  lua_newtable(L);
  lua_pushcfunction(L, lazy_index);
  lua_setfield(L, -2, "__index");
  lua_setmetatable(L, -2);
  lua_pushvalue(L, -1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, (void *)cr_open_module);
  return 1;
}
