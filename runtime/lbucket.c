/*
 * lbucket.c: captcha.bucket{capacity, rate, max_waiters?} -- the Lua face of
 * bucket.c.
 *
 *   local b = captcha.bucket{ capacity = 20, rate = 10, max_waiters = 10000 }  -- 0: unbounded
 *   local ok, err = b:acquire{ n = 1, timeout = 5 }  -- true | nil, "timeout"|"queue full"|"closed"
 *                                                    -- (|"exceeds capacity" after a shrink)
 *   -- timeout nil waits forever, 0 never waits; acquire(n) is acquire{n = n}
 *   b:try_acquire(n)  -> true | false, reason
 *   b:set_rate(r) ; b:set_capacity(c) ; b:pause() ; b:resume() ; b:close() ; b:stats()
 *   b.tokens, b.rate, b.capacity, b.waiting, b.paused, b.closed (read-only)
 *
 * One uv_timer per bucket, armed for the core's next event (the head's refill or
 * the earliest deadline), so a thousand waiters cost one timer, not a thousand.
 * The timer lives in malloc'd memory freed in its close callback (a userdata may
 * be collected before libuv is done with a handle).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bucket.h"
#include "cr.h"

#define BUCKET_MT "captcha.bucket"
#define DEFAULT_MAX_WAITERS 10000

typedef struct lbucket {
  cr_bucket core;
  cr_runtime *rt;
  uv_timer_t *timer;   /* NULL once closed */
  cr_resource res;
  int open;
} lbucket;

typedef struct bwait {
  cr_wait w;
  cr_bucket_waiter bw;
  lbucket *b;
} bwait;

/* ---- the timer ---- */

static void resolve_ready(lbucket *b, double now) {
  cr_bucket_waiter *w;
  while ((w = cr_bucket_pop(&b->core, now))) cr_wake(&((bwait *)w->data)->w);
}

static void timer_cb(uv_timer_t *t);

/* Wake what is due and re-arm for the next event. A 0 ms timer re-armed inside
 * its own callback would run again in the same loop pass (libuv 1.44), so the
 * delay is at least 1 ms; firing a little early only costs one more pass. */
static void arm(lbucket *b) {
  if (!b->timer) return;
  double now = cr_now();
  resolve_ready(b, now);
  double due = cr_bucket_next_event(&b->core, now);
  if (isinf(due)) {
    uv_timer_stop(b->timer);
    return;
  }
  double ms = ceil((due - now) * 1000.0);
  if (ms < 1) ms = 1;
  if (ms > 9.0e15) ms = 9.0e15;
  uv_timer_start(b->timer, timer_cb, (uint64_t)ms, 0);
}

static void timer_cb(uv_timer_t *t) { arm(t->data); }

/* Idempotent; no Lua. Waiters wake with "closed". */
static void bucket_close(lbucket *b) {
  if (!b->open) return;
  b->open = 0;
  cr_bucket_close(&b->core);
  resolve_ready(b, cr_now());
  cr_bucket_free(&b->core);
  cr_timer_free(&b->timer);
}

/* Shutdown closes what the user did not. */
static void res_close(cr_resource *r) {
  lbucket *b = (lbucket *)((char *)r - offsetof(lbucket, res));
  bucket_close(b);
}

/* ---- waiting ---- */

static int bw_deliver(lua_State *co, cr_wait *w) {
  bwait *x = (bwait *)w;
  int st = x->bw.status;
  free(x);
  if (st == 0) {
    lua_pushboolean(co, 1);
    return 1;
  }
  lua_pushnil(co);
  lua_pushstring(co, cr_bucket_strerror(st));
  return 2;
}

/* The task was cancelled: leave the queue, or give back a grant it never used. */
static void bw_cancel(cr_wait *w) {
  bwait *x = (bwait *)w;
  lbucket *b = x->b;
  if (b->open) {
    if (x->bw.state == CR_BW_QUEUED) cr_bucket_remove(&b->core, &x->bw);
    else if (x->bw.status == 0) cr_bucket_refund(&b->core, x->bw.n, cr_now());
    arm(b);   /* the next in line may be served now */
  }
  free(x);
}

/* ---- methods ---- */

static lbucket *check_bucket(lua_State *L) {
  return luaL_checkudata(L, 1, BUCKET_MT);
}

static lbucket *check_open(lua_State *L) {
  lbucket *b = check_bucket(L);
  if (!b->open) luaL_error(L, "attempt to use a closed bucket");
  return b;
}

static double opt_n(lua_State *L, int idx, lbucket *b, double n) {
  luaL_argcheck(L, n > 0 && n <= b->core.capacity, idx,
                lua_pushfstring(L, "n must be in (0, capacity=%f], got %f", b->core.capacity, n));
  return n;
}

/* acquire{n = 1, timeout = s} (a number is taken as n). */
static void acquire_args(lua_State *L, lbucket *b, double *n, double *timeout) {
  *n = 1;
  *timeout = INFINITY;
  if (lua_isnoneornil(L, 2)) return;
  if (lua_type(L, 2) == LUA_TNUMBER) {
    *n = opt_n(L, 2, b, lua_tonumber(L, 2));
    return;
  }
  luaL_checktype(L, 2, LUA_TTABLE);
  if (lua_getfield(L, 2, "n") != LUA_TNIL) {
    luaL_argcheck(L, lua_type(L, -1) == LUA_TNUMBER, 2, "field 'n' must be a number");
    *n = opt_n(L, 2, b, lua_tonumber(L, -1));
  }
  if (lua_getfield(L, 2, "timeout") != LUA_TNIL) {
    luaL_argcheck(L, lua_type(L, -1) == LUA_TNUMBER && lua_tonumber(L, -1) >= 0, 2,
                  "field 'timeout' must be a number >= 0 (seconds; nil waits forever)");
    *timeout = lua_tonumber(L, -1);
  }
  lua_pop(L, 2);
}

static int push_fail(lua_State *L, int err) {
  lua_pushnil(L);
  lua_pushstring(L, cr_bucket_strerror(err));
  return 2;
}

static int lcr_bucket_acquire(lua_State *L) {
  lbucket *b = check_bucket(L);
  double n, timeout;
  if (!b->open) return push_fail(L, CR_BUCKET_ECLOSED);
  acquire_args(L, b, &n, &timeout);
  bwait *x = calloc(1, sizeof *x);
  if (!x) return luaL_error(L, "out of memory");
  x->b = b;
  x->bw.data = x;
  double now = cr_now();
  int rc = cr_bucket_acquire(&b->core, &x->bw, n, now + timeout, now);
  if (rc != 0 || x->bw.state == CR_BW_DONE) {
    int st = rc != 0 ? rc : x->bw.status;
    free(x);
    if (st == 0) { lua_pushboolean(L, 1); return 1; }
    return push_fail(L, st);
  }
  if (!cr_can_wait(L)) {       /* would wait, but cannot: undo, then raise */
    cr_bucket_remove(&b->core, &x->bw);
    free(x);
    arm(b);
    return luaL_error(L, "bucket:acquire would wait outside a task (use captcha.spawn or captcha.run)");
  }
  cr_wait_begin(L, &x->w, bw_deliver, bw_cancel);
  arm(b);
  return cr_yield(L);
}

static int lcr_bucket_try_acquire(lua_State *L) {
  lbucket *b = check_bucket(L);
  int rc = b->open ? CR_BUCKET_OK : CR_BUCKET_ECLOSED;
  if (rc == 0) {
    double n = opt_n(L, 2, b, luaL_optnumber(L, 2, 1));
    rc = cr_bucket_try_acquire(&b->core, n, cr_now());
  }
  lua_pushboolean(L, rc == 0);
  if (rc == 0) return 1;
  lua_pushstring(L, cr_bucket_strerror(rc));
  return 2;
}

static int lcr_bucket_set_rate(lua_State *L) {
  lbucket *b = check_open(L);
  double r = luaL_checknumber(L, 2);
  luaL_argcheck(L, r >= 0 && isfinite(r), 2, "rate must be a finite number >= 0");
  cr_bucket_set_rate(&b->core, r, cr_now());
  arm(b);
  return 0;
}

static int lcr_bucket_set_capacity(lua_State *L) {
  lbucket *b = check_open(L);
  double c = luaL_checknumber(L, 2);
  luaL_argcheck(L, c > 0 && isfinite(c), 2, "capacity must be a finite number > 0");
  cr_bucket_set_capacity(&b->core, c, cr_now());
  arm(b);
  return 0;
}

static int lcr_bucket_pause(lua_State *L) {
  lbucket *b = check_open(L);
  cr_bucket_pause(&b->core);
  arm(b);
  return 0;
}

static int lcr_bucket_resume(lua_State *L) {
  lbucket *b = check_open(L);
  cr_bucket_resume(&b->core);
  arm(b);
  return 0;
}

/* close(), __close and __gc. cr_resource_remove is idempotent. */
static int lcr_bucket_close(lua_State *L) {
  lbucket *b = check_bucket(L);
  if (b->rt) cr_resource_remove(b->rt, &b->res);
  bucket_close(b);
  return 0;
}

static int lcr_bucket_stats(lua_State *L) {
  lbucket *b = check_bucket(L);
  const cr_bucket_stats *s = &b->core.stats;
  lua_createtable(L, 0, 12);
  cr_setfield_int(L, "granted", (lua_Integer)s->granted);
  cr_setfield_num(L, "granted_tokens", s->granted_tokens);
  cr_setfield_int(L, "rejected", (lua_Integer)s->rejected);
  cr_setfield_int(L, "timeouts", (lua_Integer)s->timeouts);
  cr_setfield_int(L, "queue_full", (lua_Integer)s->queue_full);
  cr_setfield_int(L, "cancelled", (lua_Integer)s->cancelled);
  cr_setfield_int(L, "waited", (lua_Integer)s->waited);
  cr_setfield_num(L, "total_wait", s->total_wait);
  cr_setfield_num(L, "max_wait", s->max_wait);
  cr_setfield_num(L, "avg_wait", s->waited ? s->total_wait / (double)s->waited : 0);
  cr_setfield_int(L, "waiting", (lua_Integer)b->core.waiting);
  return 1;
}

/* Read-only fields, then methods. */
static int lcr_bucket_index(lua_State *L) {
  lbucket *b = check_bucket(L);
  const char *k = luaL_checkstring(L, 2);
  if (strcmp(k, "tokens") == 0) lua_pushnumber(L, b->open ? cr_bucket_tokens(&b->core, cr_now()) : 0);
  else if (strcmp(k, "rate") == 0) lua_pushnumber(L, b->core.rate);
  else if (strcmp(k, "capacity") == 0) lua_pushnumber(L, b->core.capacity);
  else if (strcmp(k, "waiting") == 0) lua_pushinteger(L, (lua_Integer)b->core.waiting);
  else if (strcmp(k, "max_waiters") == 0) lua_pushinteger(L, (lua_Integer)b->core.max_waiters);
  else if (strcmp(k, "paused") == 0) lua_pushboolean(L, b->core.paused);
  else if (strcmp(k, "closed") == 0) lua_pushboolean(L, !b->open);
  else if (strcmp(k, "backend") == 0) lua_pushstring(L, b->core.ops->name);
  else lua_rawget(L, lua_upvalueindex(1));
  return 1;
}

static int lcr_bucket_newindex(lua_State *L) {
  const char *k = luaL_checkstring(L, 2);
  return luaL_error(L, "bucket.%s is read-only (use set_rate, set_capacity, pause, resume)", k);
}

static int lcr_bucket_tostring(lua_State *L) {
  lbucket *b = check_bucket(L);
  if (!b->open) lua_pushliteral(L, "captcha.bucket (closed)");
  else lua_pushfstring(L, "captcha.bucket (%p, capacity=%f, rate=%f)", (void *)b,
                       b->core.capacity, b->core.rate);
  return 1;
}

/* ---- constructor ---- */

static double field_num(lua_State *L, const char *k, int required, double def) {
  int t = lua_getfield(L, 1, k);
  if (t == LUA_TNIL && !required) { lua_pop(L, 1); return def; }
  if (t != LUA_TNUMBER)
    luaL_argerror(L, 1, lua_pushfstring(L, "field '%s' must be a number", k));
  double v = lua_tonumber(L, -1);
  lua_pop(L, 1);
  return v;
}

static int lcr_bucket_new(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  if (lua_getfield(L, 1, "redis") != LUA_TNIL)
    luaL_argerror(L, 1, "field 'redis': the Redis backend is not available in this build yet");
  lua_pop(L, 1);
  double cap = field_num(L, "capacity", 1, 0), rate = field_num(L, "rate", 1, 0);
  double maxw = field_num(L, "max_waiters", 0, DEFAULT_MAX_WAITERS);
  luaL_argcheck(L, cap > 0 && isfinite(cap), 1, "field 'capacity' must be a finite number > 0");
  luaL_argcheck(L, rate >= 0 && isfinite(rate), 1, "field 'rate' must be a finite number >= 0");
  luaL_argcheck(L, maxw >= 0 && maxw == floor(maxw) && maxw < 1e15, 1,
                "field 'max_waiters' must be an integer >= 0 (0: unbounded)");
  cr_runtime *rt = cr_rt_get(L);
  if (cr_rt_closing(rt)) return luaL_error(L, "runtime is shutting down");
  lbucket *b = lua_newuserdatauv(L, sizeof *b, 0);
  memset(b, 0, sizeof *b);        /* closed until everything is acquired */
  luaL_setmetatable(L, BUCKET_MT);
  b->rt = rt;
  cr_bucket_init(&b->core, cap, rate, (size_t)maxw, cr_now());
  b->timer = cr_timer_new(rt, b);
  if (!b->timer) return luaL_error(L, "out of memory");
  b->res.close = res_close;
  cr_resource_add(rt, &b->res);
  b->open = 1;
  return 1;
}

void cr_register_bucket(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"acquire", lcr_bucket_acquire}, {"try_acquire", lcr_bucket_try_acquire},
      {"set_rate", lcr_bucket_set_rate}, {"set_capacity", lcr_bucket_set_capacity},
      {"pause", lcr_bucket_pause}, {"resume", lcr_bucket_resume},
      {"close", lcr_bucket_close}, {"stats", lcr_bucket_stats}, {NULL, NULL}};
  static const luaL_Reg meta[] = {
      {"__newindex", lcr_bucket_newindex}, {"__gc", lcr_bucket_close},
      {"__close", lcr_bucket_close}, {"__tostring", lcr_bucket_tostring}, {NULL, NULL}};
  if (luaL_newmetatable(L, BUCKET_MT)) {
    luaL_setfuncs(L, meta, 0);
    luaL_newlib(L, methods);
    lua_pushcclosure(L, lcr_bucket_index, 1);
    lua_setfield(L, -2, "__index");
  }
  lua_pop(L, 1);
  lua_pushcfunction(L, lcr_bucket_new);
  lua_setfield(L, -2, "bucket");
}
