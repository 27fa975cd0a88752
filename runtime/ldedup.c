/*
 * ldedup.c: captcha.dedup{solving_ttl, solved_ttl, error_ttl, max_entries?,
 * cache_errors?} and captcha.dedup.key(task) -- the Lua face of dedup.c.
 *
 *   local d = captcha.dedup{ solving_ttl = 180, solved_ttl = 60, error_ttl = 30 }
 *   local token, source = d:solve(task_or_key, function() return client:solve(task) end)
 *   -- source: "api" (this caller led), "dedup_cache", "dedup_wait";
 *   -- on failure: nil, err, source
 *
 * The leader runs fn in its own task through lua_pcallk with a continuation, so
 * fn may wait. A to-be-closed guard below fn's frame releases the lock if the
 * leader's task is cancelled (the scheduler resets the thread, which closes
 * it); __gc on the same guard covers a coroutine dropped without a reset.
 * Results live in the registry behind a refcounted dvalue: one reference for
 * the cache entry and one per woken waiter until its deliver runs.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cr.h"
#include "dedup.h"

#define DEDUP_MT "captcha.dedup"
#define GUARD_MT "captcha.dedup.lock"
#define KEYCTX_MT "captcha.dedup.key"
#define MAX_FILE (64u << 20)   /* an image file to hash; provider limits are < 1 MB */

typedef struct ldedup {
  cr_dedup core;
  cr_runtime *rt;
  uv_timer_t *timer;   /* sweep; NULL once closed */
  double armed;        /* due time the timer is armed for (INFINITY: stopped) */
  cr_resource res;
  int open;
} ldedup;

typedef struct dvalue { int refs, ref; cr_runtime *rt; } dvalue;

typedef struct dwait {
  cr_wait w;
  cr_dedup_waiter dw;
  struct ldedup *d;
  dvalue *v;           /* the leader's value, referenced from wake until deliver */
  int status;
} dwait;

typedef struct guard { ldedup *d; uint64_t lock; int done; } guard;

/* ---- values ---- */

static dvalue *value_new(lua_State *L, int idx, cr_runtime *rt) {
  dvalue *v = malloc(sizeof *v);
  if (!v) luaL_error(L, "out of memory");
  lua_pushvalue(L, idx);
  v->ref = luaL_ref(L, LUA_REGISTRYINDEX);
  v->refs = 1;
  v->rt = rt;
  return v;
}

/* Called from libuv callbacks too: luaL_unref on the scheduler's scratch thread
 * runs no Lua code (the registry has no metamethods). */
static void value_release(dvalue *v) {
  if (!v || --v->refs > 0) return;
  luaL_unref(cr_rt_main(v->rt), LUA_REGISTRYINDEX, v->ref);
  free(v);
}

static void core_release(void *ud, void *value) { (void)ud; value_release(value); }

static void core_wake(void *ud, cr_dedup_waiter *w) {
  (void)ud;
  dwait *x = w->data;
  x->status = w->status;
  x->v = w->value;
  if (x->v) x->v->refs++;
  cr_wake(&x->w);
}

/* ---- the sweep timer ---- */

static void sweep_cb(uv_timer_t *t);

/* Armed for the earliest expiry; left alone when already armed no later than
 * that (it fires, sweeps and re-arms), so a burst of solves costs no timer
 * churn. Referenced only while callers are parked: idle caches never keep the
 * loop alive, but a parked caller is woken by solving_ttl at the latest. */
static void arm(ldedup *d) {
  if (!d->timer) return;
  double due = cr_dedup_next_expiry(&d->core);
  if (d->core.waiting) uv_ref((uv_handle_t *)d->timer);
  else uv_unref((uv_handle_t *)d->timer);
  if (isinf(due)) {
    uv_timer_stop(d->timer);
    d->armed = INFINITY;
    return;
  }
  if (uv_is_active((uv_handle_t *)d->timer) && d->armed <= due) return;
  double ms = ceil((due - cr_now()) * 1000.0);
  if (ms < 1) ms = 1;
  if (ms > 9.0e15) ms = 9.0e15;
  d->armed = due;
  uv_timer_start(d->timer, sweep_cb, (uint64_t)ms, 0);
}

static void sweep_cb(uv_timer_t *t) {
  ldedup *d = t->data;
  d->armed = INFINITY;
  cr_dedup_sweep(&d->core, cr_now());
  arm(d);
}

static void dedup_close(ldedup *d) {
  if (!d->open) return;
  d->open = 0;
  cr_dedup_close(&d->core);   /* wakes waiters with "closed", releases values */
  cr_timer_free(&d->timer);
}

static void res_close(cr_resource *r) {
  dedup_close((ldedup *)((char *)r - offsetof(ldedup, res)));
}

/* ---- waiting for a leader ---- */

static int dw_deliver(lua_State *co, cr_wait *w) {
  dwait *x = (dwait *)w;
  int n;
  if (x->status == 0) {
    lua_rawgeti(co, LUA_REGISTRYINDEX, x->v->ref);
    n = 1;
  } else {
    lua_pushnil(co);
    if (x->status == 1) lua_rawgeti(co, LUA_REGISTRYINDEX, x->v->ref);
    else lua_pushstring(co, cr_dedup_strerror(x->status));
    n = 2;
  }
  lua_pushstring(co, cr_dedup_source_name(CR_DEDUP_WAIT));
  value_release(x->v);
  free(x);
  return n + 1;
}

/* The parked task was cancelled: leave the entry (a closed cache already
 * unlinked it), drop a value handed over by a wake that raced the cancel. */
static void dw_cancel(cr_wait *w) {
  dwait *x = (dwait *)w;
  if (x->dw.entry) {
    ldedup *d = x->d;
    cr_dedup_remove(&d->core, &x->dw);
    arm(d);
  }
  value_release(x->v);
  free(x);
}

/* ---- the key ---- */

enum { F_STR, F_FLAG, F_IMAGE, F_METHOD };

/* Canonical names in sorted order; each may be spelt several ways in a task.
 * Never the proxy, the API key, callbacks or the caller's bookkeeping (id...). */
static const struct { const char *name; const char *src[2]; int kind; } key_fields[] = {
    {"action", {"action"}, F_STR},          {"api_server", {"api_server"}, F_STR},
    {"calc", {"calc"}, F_FLAG},             {"challenge", {"challenge"}, F_STR},
    {"cookies", {"cookies"}, F_STR},        {"data", {"data"}, F_STR},
    {"data-s", {"data-s", "data_s"}, F_STR}, {"domain", {"domain"}, F_STR},
    {"enterprise", {"enterprise"}, F_FLAG}, {"gt", {"gt"}, F_STR},
    {"image", {"body", "file"}, F_IMAGE},   {"imginstructions", {"imginstructions"}, F_STR},
    {"invisible", {"invisible"}, F_FLAG},   {"lang", {"lang"}, F_STR},
    {"language", {"language"}, F_STR},      {"max_len", {"max_len"}, F_STR},
    {"method", {"method"}, F_METHOD},       {"min_len", {"min_len"}, F_STR},
    {"min_score", {"min_score"}, F_STR},    {"new_captcha", {"new_captcha"}, F_FLAG},
    {"numeric", {"numeric"}, F_STR},        {"offline", {"offline"}, F_FLAG},
    {"pagedata", {"pagedata"}, F_STR},      {"pageurl", {"pageurl"}, F_STR},
    {"phrase", {"phrase"}, F_FLAG},         {"regsense", {"regsense"}, F_FLAG},
    {"sitekey", {"sitekey", "googlekey"}, F_STR},
    {"textinstructions", {"textinstructions"}, F_STR},
    {"useragent", {"userAgent", "useragent"}, F_STR}, {"version", {"version"}, F_STR},
};

/* Push the first present spelling of field i of the task at idx (or nil). */
static int get_field(lua_State *L, int idx, size_t i, const char **spelt) {
  for (int s = 0; s < 2 && key_fields[i].src[s]; s++) {
    *spelt = key_fields[i].src[s];
    if (lua_getfield(L, idx, *spelt) != LUA_TNIL) return 1;
    lua_pop(L, 1);
  }
  return 0;
}

/* 1 and 1.0 and "1" all mean the same to the provider; so do true and 1, and
 * 0.3 and "0.3" (numbers print as Lua prints them, %.14g). */
static const char *canon_scalar(lua_State *L, int idx, const char *field, size_t *len, char *buf) {
  switch (lua_type(L, idx)) {
  case LUA_TSTRING: return lua_tolstring(L, idx, len);
  case LUA_TBOOLEAN: *len = 1; return lua_toboolean(L, idx) ? "1" : "0";
  case LUA_TNUMBER: {
    double x = lua_tonumber(L, idx);
    int n = (x == floor(x) && fabs(x) < 1e15) ? snprintf(buf, 32, "%.0f", x)
                                             : snprintf(buf, 32, "%.14g", x);
    *len = (size_t)n;
    return buf;
  }
  default:
    luaL_error(L, "task field '%s': string, number or boolean expected, got %s",
               field, luaL_typename(L, idx));
    return NULL;
  }
}

static int flag_off(const char *s, size_t n) {
  return n == 0 || (n == 1 && s[0] == '0') || (n == 5 && memcmp(s, "false", 5) == 0);
}

/* Image bytes: `body` is base64 (decoded, so line breaks do not matter),
 * `file` a path read whole. Errors are pushed as a message; returns 0 or -1. */
static int add_image(lua_State *L, cr_dedup_key *k, const char *spelt, int vidx) {
  size_t n;
  if (lua_type(L, vidx) != LUA_TSTRING)
    luaL_error(L, "task field '%s' must be a string", spelt);
  const char *s = lua_tolstring(L, vidx, &n);
  if (strcmp(spelt, "body") == 0) {
    unsigned char *buf = malloc(n / 4 * 3 + 3);
    long got = buf ? cr_base64_decode(s, n, buf) : -1;
    if (got >= 0) cr_dedup_key_bytes(k, "image", buf, (size_t)got);
    free(buf);
    if (got < 0) lua_pushliteral(L, "field 'body' is not valid base64");
    return got < 0 ? -1 : 0;
  }
  FILE *f = fopen(s, "rb");
  unsigned char *buf = malloc(MAX_FILE);
  size_t got = (f && buf) ? fread(buf, 1, MAX_FILE, f) : 0;
  int bad = !f || !buf || ferror(f) || got == MAX_FILE;
  if (!bad) cr_dedup_key_bytes(k, "image", buf, got);
  else lua_pushfstring(L, "cannot read image file '%s'", s);
  free(buf);
  if (f) fclose(f);
  return bad ? -1 : 0;
}

static int add_field(lua_State *L, cr_dedup_key *k, size_t i, const char *spelt, int vidx) {
  char buf[32];
  size_t n;
  if (key_fields[i].kind == F_IMAGE) return add_image(L, k, spelt, vidx);
  const char *s = canon_scalar(L, vidx, spelt, &n, buf);
  if (key_fields[i].kind == F_FLAG) {
    if (flag_off(s, n)) return 0;
    s = "1", n = 1;
  } else if (key_fields[i].kind == F_METHOD &&
             ((n == 4 && memcmp(s, "post", 4) == 0) || (n == 6 && memcmp(s, "base64", 6) == 0))) {
    s = "image", n = 5;   /* the same image as a file or as base64 is one request */
  }
  cr_dedup_key_field(k, key_fields[i].name, s, n);
  return 0;
}

/* The digest context lives in a userdata so that a field that raises (a
 * table where a string belongs) cannot leak it: __gc frees it. */
static int keyctx_gc(lua_State *L) {
  cr_dedup_key *k = luaL_checkudata(L, 1, KEYCTX_MT);
  char hex[65];
  if (k->md) cr_dedup_key_end(k, hex);
  return 0;
}

/* Push the hex key of the task at idx, or nil and a message (unreadable image). */
static int push_key(lua_State *L, int idx) {
  char hex[65];
  idx = lua_absindex(L, idx);
  if (lua_getfield(L, idx, "method") != LUA_TSTRING)
    luaL_error(L, "task field 'method' must be a string");
  lua_pop(L, 1);
  cr_dedup_key *k = lua_newuserdatauv(L, sizeof *k, 0);
  k->md = NULL;
  luaL_setmetatable(L, KEYCTX_MT);
  int top = lua_gettop(L), rc = 0;
  if (cr_dedup_key_begin(k) != 0) return luaL_error(L, "out of memory");
  for (size_t i = 0; i < sizeof key_fields / sizeof key_fields[0]; i++) {
    const char *spelt;
    if (!get_field(L, idx, i, &spelt)) continue;
    rc = add_field(L, k, i, spelt, lua_gettop(L));
    if (rc != 0) break;           /* message on top */
    lua_pop(L, 1);
  }
  if (rc == 0 && cr_dedup_key_end(k, hex) != 0) return luaL_error(L, "out of memory");
  if (rc != 0) {
    lua_pushnil(L);
    lua_insert(L, -2);            /* nil, message */
    return 2;
  }
  lua_settop(L, top - 1);
  lua_pushlstring(L, hex, 64);
  return 1;
}

static int lcr_dedup_key(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  return push_key(L, 1);
}

/* ---- solve ---- */

static ldedup *check_dedup(lua_State *L) { return luaL_checkudata(L, 1, DEDUP_MT); }

static int push_source(lua_State *L, int src) {
  lua_pushstring(L, cr_dedup_source_name(src));
  return 1;
}

static int hit(lua_State *L, dvalue *v, int is_error) {
  if (is_error) lua_pushnil(L);
  lua_rawgeti(L, LUA_REGISTRYINDEX, v->ref);
  push_source(L, CR_DEDUP_HIT);
  return is_error ? 3 : 2;
}

/* The leader's fn returned (status OK/YIELD) or raised. Stack: 1 dedup, 2 key,
 * 3 fn, 4 guard (to-be-closed), 5.. fn's two results or the error object. */
static int solve_k(lua_State *L, int status, lua_KContext ctx) {
  (void)ctx;
  guard *g = lua_touserdata(L, 4);
  ldedup *d = g->d;
  int raised = status != LUA_OK && status != LUA_YIELD;
  int is_error = raised || !lua_toboolean(L, 5);
  if (raised) luaL_tolstring(L, 5, NULL);          /* waiters get the message */
  else if (is_error && lua_isnil(L, 6)) lua_pushliteral(L, "dedup leader returned no result");
  else lua_pushvalue(L, is_error ? 6 : 5);
  g->done = 1;
  if (d->open) {
    size_t klen;
    const char *key = lua_tolstring(L, 2, &klen);
    dvalue *v = value_new(L, -1, d->rt);
    if (cr_dedup_finish(&d->core, key, klen, g->lock, is_error, v, cr_now()) == 1) v->refs++;
    value_release(v);
    arm(d);
  }
  lua_closeslot(L, 4);
  if (raised) {
    lua_pushvalue(L, 5);
    return lua_error(L);
  }
  if (is_error) lua_pushnil(L), lua_insert(L, -2);   /* nil, err */
  push_source(L, CR_DEDUP_LEAD);
  return is_error ? 3 : 2;
}

static int lead(lua_State *L, ldedup *d, uint64_t lock) {
  guard *g = lua_newuserdatauv(L, sizeof *g, 2);   /* index 4 */
  g->d = d;
  g->lock = lock;
  g->done = 0;
  luaL_setmetatable(L, GUARD_MT);
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, 4, 1);                       /* keeps the dedup alive */
  lua_pushvalue(L, 2);
  lua_setiuservalue(L, 4, 2);                       /* the key, for an abort */
  lua_toclose(L, 4);
  lua_pushvalue(L, 3);
  return solve_k(L, lua_pcallk(L, 0, 2, 0, 0, solve_k), 0);
}

/* Released without a result: the leader's task was cancelled (__close during
 * the thread reset) or its coroutine was dropped (__gc). */
static int guard_close(lua_State *L) {
  guard *g = lua_touserdata(L, 1);
  if (!g || g->done) return 0;
  g->done = 1;
  ldedup *d = g->d;
  if (!d->open) return 0;
  lua_getiuservalue(L, 1, 2);
  size_t klen;
  const char *key = lua_tolstring(L, -1, &klen);
  cr_dedup_abort(&d->core, key, klen, g->lock, cr_now());
  lua_pop(L, 1);
  arm(d);
  return 0;
}

static int park(lua_State *L, ldedup *d, dwait *x) {
  if (!cr_can_wait(L)) {
    cr_dedup_remove(&d->core, &x->dw);
    free(x);
    arm(d);
    return luaL_error(L, "dedup:solve would wait for its leader outside a task "
                         "(use captcha.spawn or captcha.run)");
  }
  cr_wait_begin(L, &x->w, dw_deliver, dw_cancel);
  arm(d);
  return cr_yield(L);
}

static int lcr_dedup_solve(lua_State *L) {
  ldedup *d = check_dedup(L);
  if (lua_type(L, 2) == LUA_TTABLE) {
    if (push_key(L, 2) == 2) return 2;              /* nil, msg: unreadable image */
    lua_replace(L, 2);
  } else if (lua_type(L, 2) != LUA_TSTRING) {
    return luaL_typeerror(L, 2, "task table or key string");
  }
  luaL_checktype(L, 3, LUA_TFUNCTION);
  lua_settop(L, 3);
  if (!d->open) {
    lua_pushnil(L);
    lua_pushliteral(L, "closed");
    return 2;
  }
  size_t klen;
  const char *key = lua_tolstring(L, 2, &klen);
  dwait *x = calloc(1, sizeof *x);
  if (!x) return luaL_error(L, "out of memory");
  x->d = d;
  x->dw.data = x;
  uint64_t lock = 0;
  void *value = NULL;
  int is_error = 0;
  int src = cr_dedup_begin(&d->core, key, klen, cr_now(), &x->dw, &lock, &value, &is_error);
  if (src == CR_DEDUP_WAIT) return park(L, d, x);
  free(x);
  if (src == CR_DEDUP_HIT) {
    int n = hit(L, value, is_error);   /* value is borrowed: push it first */
    arm(d);
    return n;
  }
  arm(d);
  if (src == CR_DEDUP_LEAD) return lead(L, d, lock);
  lua_pushnil(L);
  lua_pushstring(L, cr_dedup_strerror(src));
  return 2;
}

/* ---- other methods ---- */

static int lcr_dedup_stats(lua_State *L) {
  ldedup *d = check_dedup(L);
  const cr_dedup_stats *s = &d->core.stats;
  lua_createtable(L, 0, 12);
  cr_setfield_int(L, "total_requests", (lua_Integer)s->total_requests);
  cr_setfield_int(L, "deduplicated", (lua_Integer)(s->by_source[CR_DEDUP_HIT] + s->by_source[CR_DEDUP_WAIT]));
  lua_pushnumber(L, cr_dedup_savings_pct(&d->core));
  lua_setfield(L, -2, "savings_pct");
  lua_createtable(L, 0, CR_DEDUP_NSOURCES);
  for (int i = 0; i < CR_DEDUP_NSOURCES; i++) cr_setfield_int(L, cr_dedup_source_name(i), (lua_Integer)s->by_source[i]);
  lua_setfield(L, -2, "breakdown");
  cr_setfield_int(L, "errors", (lua_Integer)s->errors);
  cr_setfield_int(L, "aborted", (lua_Integer)s->aborted);
  cr_setfield_int(L, "lock_expired", (lua_Integer)s->lock_expired);
  cr_setfield_int(L, "stale_finishes", (lua_Integer)s->stale_finishes);
  cr_setfield_int(L, "evicted", (lua_Integer)s->evicted);
  cr_setfield_int(L, "expired", (lua_Integer)s->expired);
  cr_setfield_int(L, "entries", (lua_Integer)d->core.count);
  cr_setfield_int(L, "waiting", (lua_Integer)d->core.waiting);
  return 1;
}

/* Drop expired entries now (the timer does it too); returns how many. */
static int lcr_dedup_sweep(lua_State *L) {
  ldedup *d = check_dedup(L);
  size_t n = d->open ? cr_dedup_sweep(&d->core, cr_now()) : 0;
  if (d->open) arm(d);
  lua_pushinteger(L, (lua_Integer)n);
  return 1;
}

static int lcr_dedup_close(lua_State *L) {
  ldedup *d = check_dedup(L);
  if (d->rt) cr_resource_remove(d->rt, &d->res);
  dedup_close(d);
  return 0;
}

static int lcr_dedup_tostring(lua_State *L) {
  ldedup *d = check_dedup(L);
  if (!d->open) lua_pushliteral(L, "captcha.dedup (closed)");
  else lua_pushfstring(L, "captcha.dedup (%p, %d entries)", (void *)d, (int)d->core.count);
  return 1;
}

/* ---- constructor ---- */

static double opt_field(lua_State *L, const char *k, double def, double min) {
  int t = lua_getfield(L, 1, k);
  double v = def;
  if (t != LUA_TNIL) {
    if (t != LUA_TNUMBER || !(lua_tonumber(L, -1) >= min) || !isfinite(lua_tonumber(L, -1)))
      luaL_argerror(L, 1, lua_pushfstring(L, "field '%s' must be a finite number >= %f", k, min));
    v = lua_tonumber(L, -1);
  }
  lua_pop(L, 1);
  return v;
}

static int lcr_dedup_new(lua_State *L) {
  lua_settop(L, 1);
  if (lua_isnil(L, 1)) lua_newtable(L), lua_replace(L, 1);
  luaL_checktype(L, 1, LUA_TTABLE);
  cr_dedup_config c = {0};
  c.solving_ttl = opt_field(L, "solving_ttl", 180, 0);
  c.solved_ttl = opt_field(L, "solved_ttl", 60, 0);
  c.error_ttl = opt_field(L, "error_ttl", 30, 0);
  c.max_entries = (size_t)opt_field(L, "max_entries", 0, 0);
  luaL_argcheck(L, c.solving_ttl > 0, 1, "field 'solving_ttl' must be > 0");
  lua_getfield(L, 1, "cache_errors");
  c.cache_errors = lua_toboolean(L, -1);
  lua_pop(L, 1);
  c.wake = core_wake;
  c.release = core_release;
  cr_runtime *rt = cr_rt_get(L);
  if (cr_rt_closing(rt)) return luaL_error(L, "runtime is shutting down");
  ldedup *d = lua_newuserdatauv(L, sizeof *d, 0);
  memset(d, 0, sizeof *d);           /* closed until everything is acquired */
  luaL_setmetatable(L, DEDUP_MT);
  d->rt = rt;
  d->armed = INFINITY;
  if (cr_dedup_init(&d->core, &c) != 0) return luaL_error(L, "out of memory");
  d->timer = cr_timer_new(rt, d);
  if (!d->timer) { cr_dedup_close(&d->core); return luaL_error(L, "out of memory"); }
  uv_unref((uv_handle_t *)d->timer);
  d->res.close = res_close;
  cr_resource_add(rt, &d->res);
  d->open = 1;
  return 1;
}

/* captcha.dedup{...}: the table's __call skips the table itself. */
static int lcr_dedup_call(lua_State *L) {
  lua_remove(L, 1);
  return lcr_dedup_new(L);
}

void cr_register_dedup(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"solve", lcr_dedup_solve}, {"stats", lcr_dedup_stats}, {"sweep", lcr_dedup_sweep},
      {"close", lcr_dedup_close}, {NULL, NULL}};
  if (luaL_newmetatable(L, DEDUP_MT)) {
    luaL_newlib(L, methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, lcr_dedup_close);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, lcr_dedup_close);
    lua_setfield(L, -2, "__close");
    lua_pushcfunction(L, lcr_dedup_tostring);
    lua_setfield(L, -2, "__tostring");
  }
  lua_pop(L, 1);
  if (luaL_newmetatable(L, KEYCTX_MT)) {
    lua_pushcfunction(L, keyctx_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
  if (luaL_newmetatable(L, GUARD_MT)) {
    lua_pushcfunction(L, guard_close);
    lua_setfield(L, -2, "__close");
    lua_pushcfunction(L, guard_close);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
  lua_createtable(L, 0, 2);                 /* captcha.dedup: callable namespace */
  lua_pushcfunction(L, lcr_dedup_key);
  lua_setfield(L, -2, "key");
  lua_pushcfunction(L, lcr_dedup_new);
  lua_setfield(L, -2, "new");
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, lcr_dedup_call);
  lua_setfield(L, -2, "__call");
  lua_setmetatable(L, -2);
  lua_setfield(L, -2, "dedup");
}
