/* util.c: small helpers every binding repeats. */
#include <stdlib.h>

#include "cr.h"

static void timer_closed(uv_handle_t *h) { free(h); }

uv_timer_t *cr_timer_new(cr_runtime *rt, void *data) {
  uv_timer_t *t = malloc(sizeof *t);
  if (!t) return NULL;
  uv_timer_init(cr_rt_loop(rt), t);
  t->data = data;
  return t;
}

void cr_timer_free(uv_timer_t **t) {
  if (!*t) return;
  uv_timer_stop(*t);
  (*t)->data = NULL;
  uv_close((uv_handle_t *)*t, timer_closed);
  *t = NULL;
}

void cr_setfield_num(lua_State *L, const char *k, double v) {
  lua_pushnumber(L, v);
  lua_setfield(L, -2, k);
}

void cr_setfield_int(lua_State *L, const char *k, lua_Integer v) {
  lua_pushinteger(L, v);
  lua_setfield(L, -2, k);
}
