/*
 * lbudget.c: captcha.budget{...} -- the Lua face of budget.c.
 *
 *   local budget = captcha.budget{ target = 0.95, window = "24h",   -- or "30m", "90s", seconds
 *     warning = 0.50, critical = 0.10, resolution = nil,            -- default window / 1000
 *     min_events = nil, expected_events = nil,                      -- number ("*") or {key = n}
 *     targets = { turnstile = 0.98, base64 = 0.90 },                -- per-key SLOs
 *     alerts = { { name = "page", long = "1h", short = "5m", burn = 14.4 },
 *                { name = "faq", burn = 2.0, consumed = 0.80 } },   -- default: the FAQ rule only
 *     state = "budget.json", save_every = 60, max_keys = 64 }
 *   budget:record(ok, { method = "turnstile", at = t })  -> true | false, "outside the window"
 *                                                        | nil, "time went backwards ..."
 *   budget:report(key | { key = k, at = t })  -> table (the seed's fields + key, window, ...)
 *   budget:on("healthy"|"warning"|"critical"|"exhausted", fn(report, key))
 *   budget:on("change", fn(report, key, previous)) ; budget:on("burn", fn(alert, report, key))
 *   budget:keys() -> { "*", "turnstile", ... } ; budget:close()
 *
 * Hooks run as detached tasks (cr_spawn_hook): they may yield, their errors are
 * logged, and each fires once per transition per key. Transitions are found by
 * the core's evaluate at every record and report, and by an unref'd timer that
 * ticks once per bucket width, so a budget recovers while nothing is recorded.
 *
 * Clock: without `at` the monotonic clock; the first `at` switches a fresh
 * budget to explicit time (a replay), which then never reads the real clock.
 * State files store wall-clock times so a restarted worker keeps its budget.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "budget.h"
#include "cr.h"

#define BUDGET_MT "captcha.budget"
#define MIN_TICK 0.01 /* seconds: a 90 s window ticks every 90 ms, not faster */

enum { CLOCK_UNSET = 0, CLOCK_MONO, CLOCK_EXPLICIT };

typedef struct lbudget {
  cr_budget *core;      /* NULL once closed */
  cr_runtime *rt;
  uv_timer_t *timer;    /* freed in its close callback */
  cr_resource res;
  int clock;
  int dirty;            /* events since the last save */
  char *state;          /* state file or NULL */
  cJSON *config;        /* the SLO configuration, saved beside the counters */
  double save_every, last_save;
  cr_deferred tick;     /* the timer's Lua work, run from the runner */
} lbudget;

/* registry[&weak_key] = { [lightuserdata b] = userdata } with weak values: the
 * timer finds its budget without keeping it alive. */
static char weak_key;

static const char *const events[] = {"healthy", "warning", "critical", "exhausted",
                                     "change", "burn", NULL};

static double wall_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- persistence (pure C: also runs at shutdown) ---- */

typedef struct save_ctx { cJSON *rows; double shift; } save_ctx;

static int save_row(void *ud, const char *key, double window, double t, uint64_t ok,
                    uint64_t fail) {
  save_ctx *s = ud;
  cJSON *row = cJSON_CreateArray();
  if (!row) return -ENOMEM;
  cJSON_AddItemToArray(s->rows, row);
  cJSON_AddItemToArray(row, cJSON_CreateString(key));
  cJSON_AddItemToArray(row, cJSON_CreateNumber(window));
  cJSON_AddItemToArray(row, cJSON_CreateNumber(t + s->shift));
  cJSON_AddItemToArray(row, cJSON_CreateNumber((double)ok));
  cJSON_AddItemToArray(row, cJSON_CreateNumber((double)fail));
  return 0;
}

/* {"version":1, "clock":"wall"|"explicit", "now":t, "buckets":[[key, window, t, ok, fail]...],
 *  "config":{"target":0.95, "targets":{key:t}, "warning":0.5, "critical":0.1,
 *            "min_events":n, "expected_events":{key:n}, "window":s}}
 * Monotonic times are stored as wall-clock times: uv_hrtime restarts at boot.
 * "config" is what the budget was built with, for readers such as the gate; a
 * load ignores it (the constructor's configuration wins) and files without it
 * load as before. */
static char *state_json(lbudget *b) {
  save_ctx s = {cJSON_CreateArray(), b->clock == CLOCK_MONO ? wall_now() - cr_now() : 0};
  cJSON *root = cJSON_CreateObject();
  char *txt = NULL;
  if (root && s.rows && cr_budget_export(b->core, save_row, &s) == 0) {
    cJSON_AddNumberToObject(root, "version", 1);
    cJSON_AddStringToObject(root, "clock", b->clock == CLOCK_MONO ? "wall" : "explicit");
    cJSON_AddNumberToObject(root, "now", cr_budget_now(b->core) + s.shift);
    cJSON_AddItemToObject(root, "buckets", s.rows);
    s.rows = NULL; /* owned by root now */
    if (b->config) cJSON_AddItemReferenceToObject(root, "config", b->config);
    txt = cJSON_PrintUnformatted(root);
  }
  cJSON_Delete(root);
  cJSON_Delete(s.rows);
  return txt;
}

/* Temp file in the same directory, fsync, rename: a crash leaves the old state
 * or the new one, never half of one. Synchronous: the file is at most
 * keys * windows * 1000 rows and is written on status changes, every
 * save_every seconds while events arrive, and at close. */
static int write_atomic(const char *path, const char *txt, char *err, size_t errlen) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  FILE *f = fopen(tmp, "w");
  int ok = f && fputs(txt, f) >= 0 && fflush(f) == 0 && fsync(fileno(f)) == 0;
  if (f && fclose(f) != 0) ok = 0;
  if (ok && rename(tmp, path) == 0) return 0;
  snprintf(err, errlen, "%s: %s", path, strerror(errno));
  remove(tmp);
  return -1;
}

static void budget_save(lbudget *b) {
  if (!b->state || !b->core || b->clock == CLOCK_UNSET) return;
  char err[512];
  char *txt = state_json(b);
  if (!txt) cr_logf(CR_LOG_ERROR, "budget: cannot save state %s: out of memory", b->state);
  else if (write_atomic(b->state, txt, err, sizeof err) < 0)
    cr_logf(CR_LOG_ERROR, "budget: cannot save state: %s", err);
  else b->dirty = 0;
  free(txt);
  b->last_save = cr_now();
}

static char *slurp(const char *path, int *missing) {
  FILE *f = fopen(path, "rb");
  *missing = !f && errno == ENOENT;
  if (!f) return NULL;
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  size_t n;
  while (buf && (n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
    len += n;
    if (cap - len > 1) continue;
    char *nb = realloc(buf, cap *= 2);
    if (!nb) { free(buf); buf = NULL; }
    else buf = nb;
  }
  fclose(f);
  if (buf) buf[len] = '\0';
  return buf;
}

static int load_row(lbudget *b, const cJSON *row, double shift, double cap) {
  const cJSON *k = cJSON_GetArrayItem(row, 0), *w = cJSON_GetArrayItem(row, 1),
              *t = cJSON_GetArrayItem(row, 2), *ok = cJSON_GetArrayItem(row, 3),
              *fail = cJSON_GetArrayItem(row, 4);
  if (!cJSON_IsString(k) || !cJSON_IsNumber(w) || !cJSON_IsNumber(t) || !cJSON_IsNumber(ok) ||
      !cJSON_IsNumber(fail) || ok->valuedouble < 0 || fail->valuedouble < 0)
    return -EINVAL;
  double at = fmin(t->valuedouble + shift, cap); /* a wall clock set back: not in the future */
  return cr_budget_import(b->core, k->valuestring, w->valuedouble, at,
                          (uint64_t)ok->valuedouble, (uint64_t)fail->valuedouble);
}

/* Events that left the window while we were down are dropped by the import. */
static int load_json(lbudget *b, const cJSON *root, char *err, size_t errlen) {
  const cJSON *clock = cJSON_GetObjectItem(root, "clock"), *now = cJSON_GetObjectItem(root, "now");
  const cJSON *rows = cJSON_GetObjectItem(root, "buckets");
  if (!cJSON_IsString(clock) || !cJSON_IsArray(rows)) {
    snprintf(err, errlen, "not a budget state file");
    return -1;
  }
  int wall = strcmp(clock->valuestring, "wall") == 0;
  double shift = wall ? cr_now() - wall_now() : 0, cap = wall ? cr_now() : INFINITY;
  b->clock = wall ? CLOCK_MONO : CLOCK_EXPLICIT;
  int bad = 0;
  const cJSON *row;
  cJSON_ArrayForEach(row, rows) bad += load_row(b, row, shift, cap) < 0;
  if (bad) snprintf(err, errlen, "%d bucket(s) could not be restored", bad);
  /* set the replay's clock without evaluating: hooks are not registered yet */
  cr_budget_report r;
  if (!wall && cJSON_IsNumber(now) && now->valuedouble >= cr_budget_now(b->core))
    cr_budget_report_get(b->core, NULL, now->valuedouble, &r);
  return bad ? -1 : 0;
}

static void budget_load(lbudget *b) {
  int missing;
  char err[512] = "";
  char *txt = slurp(b->state, &missing);
  if (!txt) {
    if (!missing) cr_logf(CR_LOG_WARN, "budget: cannot read state %s: %s", b->state, strerror(errno));
    return;
  }
  if (!txt[strspn(txt, " \t\r\n")]) { /* empty, e.g. made by mktemp: a fresh budget */
    free(txt);
    return;
  }
  cJSON *root = cJSON_Parse(txt);
  if (!root) snprintf(err, sizeof err, "not JSON");
  else load_json(b, root, err, sizeof err);
  if (*err) cr_logf(CR_LOG_WARN, "budget: state %s: %s", b->state, err);
  cJSON_Delete(root);
  free(txt);
}

/* ---- closing ---- */

/* Idempotent; no Lua. Saves a last time. */
static void budget_close(lbudget *b) {
  if (!b->core) return;
  budget_save(b);
  cr_timer_free(&b->timer);
  cr_defer_cancel(b->rt, &b->tick);
  cr_budget_free(b->core);
  b->core = NULL;
  free(b->state);
  b->state = NULL;
  cJSON_Delete(b->config);
  b->config = NULL;
}

static void res_close(cr_resource *r) {
  budget_close((lbudget *)((char *)r - offsetof(lbudget, res)));
}

static lbudget *check_budget(lua_State *L) { return luaL_checkudata(L, 1, BUDGET_MT); }

static lbudget *check_open(lua_State *L) {
  lbudget *b = check_budget(L);
  if (!b->core) luaL_error(L, "attempt to use a closed budget");
  return b;
}

/* close(), __close and __gc. cr_resource_remove is idempotent. */
static int lcr_budget_close(lua_State *L) {
  lbudget *b = check_budget(L);
  if (b->rt) cr_resource_remove(b->rt, &b->res);
  budget_close(b);
  return 0;
}

/* ---- reports and hooks ---- */

static void push_alert_names(lua_State *L, lbudget *b, unsigned bits) {
  const cr_budget_config *c = cr_budget_get_config(b->core);
  lua_newtable(L);
  for (size_t i = 0, n = 0; i < c->nalerts; i++) {
    if (!(bits >> i & 1)) continue;
    lua_pushstring(L, c->alerts[i].name);
    lua_rawseti(L, -2, (lua_Integer)++n);
  }
  lua_setfield(L, -2, "alerts");
}

static void push_report(lua_State *L, lbudget *b, const char *key, double now) {
  cr_budget_report r;
  cr_budget_report_get(b->core, key, now, &r); /* -ENOENT fills an empty report */
  lua_createtable(L, 0, 18);
  lua_pushstring(L, cr_budget_status_name(r.status));
  lua_setfield(L, -2, "status");
  cr_setfield_num(L, "slo_target", r.slo_target);
  cr_setfield_num(L, "current_rate", r.current_rate);
  cr_setfield_int(L, "total_events", (lua_Integer)r.total_events);
  cr_setfield_int(L, "successes", (lua_Integer)r.successes);
  cr_setfield_int(L, "failures", (lua_Integer)r.failures);
  cr_setfield_num(L, "budget_total", r.budget_total);
  cr_setfield_num(L, "budget_remaining", r.budget_remaining);
  cr_setfield_num(L, "budget_remaining_pct", r.budget_remaining_pct);
  cr_setfield_num(L, "burn_rate", r.burn_rate);
  lua_pushstring(L, key);
  lua_setfield(L, -2, "key");
  cr_setfield_num(L, "window", r.window);
  if (isfinite(r.time_to_exhaustion)) cr_setfield_num(L, "time_to_exhaustion", r.time_to_exhaustion);
  lua_pushboolean(L, r.min_events_met);
  lua_setfield(L, -2, "min_events_met");
  if (r.expected_events) cr_setfield_int(L, "expected_events", (lua_Integer)r.expected_events);
  cr_setfield_num(L, "at", now);
  if (r.alerts_firing) push_alert_names(L, b, r.alerts_firing);
}

static void push_alert(lua_State *L, lbudget *b, const cr_budget_transition *t) {
  const cr_budget_alert_config *a = &cr_budget_get_config(b->core)->alerts[t->alert];
  lua_createtable(L, 0, 8);
  lua_pushstring(L, a->name);
  lua_setfield(L, -2, "name");
  lua_pushboolean(L, t->to);
  lua_setfield(L, -2, "firing");
  lua_pushstring(L, t->key);
  lua_setfield(L, -2, "key");
  cr_setfield_num(L, "burn", (double)a->burn_ppb / CR_PPB);
  if (a->long_window > 0) {
    cr_setfield_num(L, "long", a->long_window);
    cr_setfield_num(L, "short", a->short_window);
  }
  if (a->consumed_ppb > 0) cr_setfield_num(L, "consumed", (double)a->consumed_ppb / CR_PPB);
}

/* Spawn every hook registered for event; each gets its own report table. */
static void fire(lua_State *L, lbudget *b, int hooks, const char *event,
                 const cr_budget_transition *t, double now) {
  if (lua_getfield(L, hooks, event) != LUA_TTABLE) {
    lua_pop(L, 1);
    return;
  }
  for (lua_Integer i = 1; lua_rawgeti(L, -1, i) == LUA_TFUNCTION; i++) {
    int nargs = 2;
    if (t->alert >= 0) push_alert(L, b, t);
    push_report(L, b, t->key, now);
    lua_pushstring(L, t->key);
    if (t->alert >= 0) nargs = 3;
    else if (strcmp(event, "change") == 0) {
      lua_pushstring(L, cr_budget_status_name(t->from));
      nargs = 3;
    }
    cr_spawn_hook(L, nargs, "budget hook");
  }
  lua_pop(L, 2);
}

/* Evaluate at now and fire hooks for what changed. Returns 0 or -ERANGE. */
static int evaluate(lua_State *L, lbudget *b, int idx, double now) {
  const cr_budget_transition *tr;
  int n = cr_budget_evaluate(b->core, now, &tr);
  if (n <= 0) return n;
  lua_getiuservalue(L, idx, 1);
  int hooks = lua_gettop(L), status_changed = 0;
  for (int i = 0; i < n; i++) {
    if (tr[i].alert >= 0) {
      fire(L, b, hooks, "burn", &tr[i], now);
      continue;
    }
    status_changed = 1;
    fire(L, b, hooks, cr_budget_status_name(tr[i].to), &tr[i], now);
    fire(L, b, hooks, "change", &tr[i], now);
  }
  lua_pop(L, 1);
  if (status_changed) budget_save(b);
  return 0;
}

/* ---- the timer: the window slides with no events ---- */

static int tick_protected(lua_State *L) {
  lbudget *b = lua_touserdata(L, 1);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &weak_key);
  if (lua_rawgetp(L, -1, b) != LUA_TUSERDATA || !b->core) return 0; /* being collected */
  int idx = lua_gettop(L);
  double now = cr_now();
  if (b->clock == CLOCK_MONO) evaluate(L, b, idx, now);
  if (b->core && b->dirty && now - b->last_save >= b->save_every) budget_save(b);
  return 0;
}

/* From the runner (cr_defer), protected, with the budget pinned on the
 * stack so a collection cannot free it underneath. */
static void tick_deferred(lua_State *L, cr_deferred *d) {
  lbudget *b = (lbudget *)((char *)d - offsetof(lbudget, tick));
  lua_pushlightuserdata(L, b);
  tick_protected(L);
}

/* The callback only queues the work: no Lua runs inside a libuv callback. */
static void timer_cb(uv_timer_t *t) {
  lbudget *b = t->data;
  if (!b || !b->core) return;
  cr_defer(b->rt, &b->tick);
}

/* ---- methods ---- */

/* The time of a call: `at` when given (switching a fresh budget to explicit
 * time), else the clock the budget runs on. `fix` says whether this call
 * decides the clock (record does; a report before any event does not). */
static double call_time(lua_State *L, lbudget *b, int arg, int has_at, double at, int fix) {
  if (has_at) {
    if (b->clock == CLOCK_MONO)
      luaL_argerror(L, arg, "field 'at': this budget runs on the monotonic clock "
                            "(events were recorded without 'at')");
    luaL_argcheck(L, isfinite(at), arg, "field 'at' must be a finite number");
    b->clock = CLOCK_EXPLICIT;
    return at;
  }
  if (b->clock == CLOCK_EXPLICIT) return cr_budget_now(b->core);
  if (b->clock == CLOCK_UNSET && !fix) return fmax(cr_budget_now(b->core), 0);
  b->clock = CLOCK_MONO;
  return cr_now();
}

/* opts: a key string, or {method|key = k, at = t}. */
static const char *call_opts(lua_State *L, int arg, int *has_at, double *at) {
  *has_at = 0;
  if (lua_isnoneornil(L, arg)) return NULL;
  if (lua_type(L, arg) == LUA_TSTRING) return lua_tostring(L, arg);
  luaL_argexpected(L, lua_istable(L, arg), arg, "table or string");
  const char *key = NULL;
  if (lua_getfield(L, arg, "method") == LUA_TNIL) {
    lua_pop(L, 1);
    lua_getfield(L, arg, "key");
  }
  if (!lua_isnil(L, -1)) {
    luaL_argcheck(L, lua_type(L, -1) == LUA_TSTRING, arg, "field 'method' (or 'key') must be a string");
    key = lua_tostring(L, -1); /* still referenced by the table */
  }
  lua_pop(L, 1);
  if (lua_getfield(L, arg, "at") != LUA_TNIL) {
    luaL_argcheck(L, lua_type(L, -1) == LUA_TNUMBER, arg, "field 'at' must be a number (seconds)");
    *at = lua_tonumber(L, -1);
    *has_at = 1;
  }
  lua_pop(L, 1);
  return key;
}

static int push_backwards(lua_State *L, lbudget *b, double now) {
  lua_pushnil(L);
  lua_pushfstring(L, "time went backwards (at=%f is before the budget's latest time %f)", now,
                  cr_budget_now(b->core));
  return 2;
}

static int lcr_budget_record(lua_State *L) {
  lbudget *b = check_open(L);
  luaL_checktype(L, 2, LUA_TBOOLEAN);
  int has_at;
  double at = 0;
  const char *key = call_opts(L, 3, &has_at, &at);
  double now = call_time(L, b, 3, has_at, at, 1);
  int rc = cr_budget_record(b->core, key, lua_toboolean(L, 2), now);
  if (rc == CR_BUDGET_IGNORED) {
    lua_pushboolean(L, 0);
    lua_pushliteral(L, "outside the window");
    return 2;
  }
  if (rc == -ERANGE) return push_backwards(L, b, now);
  if (rc == -EINVAL)
    return luaL_argerror(L, 3, "method must be a non-empty string of at most 255 bytes, 'at' a sane time");
  if (rc == -ENOSPC) {
    lua_pushnil(L);
    lua_pushfstring(L, "too many keys (max_keys=%d)", (int)cr_budget_get_config(b->core)->max_keys);
    return 2;
  }
  if (rc < 0) return luaL_error(L, "budget:record: %s", strerror(-rc));
  b->dirty = 1;
  evaluate(L, b, 1, now);
  lua_pushboolean(L, 1);
  return 1;
}

static int lcr_budget_report(lua_State *L) {
  lbudget *b = check_open(L);
  int has_at;
  double at = 0;
  const char *key = call_opts(L, 2, &has_at, &at);
  double now = call_time(L, b, 2, has_at, at, 0);
  if (evaluate(L, b, 1, now) < 0) return push_backwards(L, b, now);
  push_report(L, b, key ? key : CR_BUDGET_ALL, now);
  return 1;
}

static int lcr_budget_on(lua_State *L) {
  lbudget *b = check_open(L);
  int e = luaL_checkoption(L, 2, NULL, events);
  luaL_checktype(L, 3, LUA_TFUNCTION);
  lua_getiuservalue(L, 1, 1);
  if (lua_getfield(L, -1, events[e]) != LUA_TTABLE) {
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushvalue(L, -1);
    lua_setfield(L, -3, events[e]);
  }
  lua_pushvalue(L, 3);
  lua_rawseti(L, -2, (lua_Integer)lua_rawlen(L, -2) + 1);
  /* With a hook, the sliding window can wake the program (a pipeline paused
   * until the budget recovers): the timer then counts as pending work, and a
   * run whose tasks all wait on that hook is not a deadlock. The process still
   * ends when every task has (the scheduler stops the loop then). */
  if (b->timer) uv_ref((uv_handle_t *)b->timer);
  lua_settop(L, 1);
  return 1;
}

static int lcr_budget_keys(lua_State *L) {
  lbudget *b = check_open(L);
  size_t n = cr_budget_nkeys(b->core);
  lua_createtable(L, (int)n, 0);
  for (size_t i = 0; i < n; i++) {
    lua_pushstring(L, cr_budget_key(b->core, i));
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  return 1;
}

static int lcr_budget_save(lua_State *L) {
  lbudget *b = check_open(L);
  budget_save(b);
  return 0;
}

static int lcr_budget_tostring(lua_State *L) {
  lbudget *b = check_budget(L);
  if (!b->core) lua_pushliteral(L, "captcha.budget (closed)");
  else lua_pushfstring(L, "captcha.budget (%p, window=%f)", (void *)b,
                       cr_budget_get_config(b->core)->window);
  return 1;
}

/* ---- constructor ---- */

/* "24h", "30m", "90s", "500ms", "7d", "1h30m", or a number of seconds. */
static int parse_duration(const char *s, double *out) {
  double total = 0;
  int parts = 0;
  while (*s) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || !(v >= 0)) return -1;
    s = end;
    double unit = 0;
    if (strncmp(s, "ms", 2) == 0) unit = 0.001, s += 2;
    else if (*s == 's') unit = 1, s++;
    else if (*s == 'm') unit = 60, s++;
    else if (*s == 'h') unit = 3600, s++;
    else if (*s == 'd') unit = 86400, s++;
    else if (*s == 'w') unit = 604800, s++;
    else if (!*s && !parts) unit = 1;
    else return -1;
    total += v * unit;
    parts++;
  }
  if (!parts || !isfinite(total) || total <= 0) return -1;
  *out = total;
  return 0;
}

/* The duration at stack top (popped); raises naming the field. */
static double to_duration(lua_State *L, const char *name) {
  double v = 0;
  int ok = lua_type(L, -1) == LUA_TNUMBER ? (v = lua_tonumber(L, -1), isfinite(v) && v > 0)
         : lua_type(L, -1) == LUA_TSTRING ? parse_duration(lua_tostring(L, -1), &v) == 0 : 0;
  if (!ok)
    luaL_argerror(L, 1, lua_pushfstring(L, "field '%s' must be a duration > 0 (seconds, or "
                                           "a string like \"24h\", \"30m\", \"90s\")", name));
  lua_pop(L, 1);
  return v;
}

static double duration_field(lua_State *L, int t, const char *name, double def) {
  if (lua_getfield(L, t, name) == LUA_TNIL) {
    lua_pop(L, 1);
    return def;
  }
  return to_duration(L, name);
}

static int64_t fraction_field(lua_State *L, int t, const char *name, double def) {
  double v = def;
  if (lua_getfield(L, t, name) != LUA_TNIL) {
    v = lua_tonumber(L, -1);
    if (lua_type(L, -1) != LUA_TNUMBER || !(v >= 0 && v <= 1))
      luaL_argerror(L, 1, lua_pushfstring(L, "field '%s' must be a number in [0, 1]", name));
  }
  lua_pop(L, 1);
  return llround(v * CR_PPB);
}

static uint64_t count_field(lua_State *L, int t, const char *name, double def) {
  double v = def;
  if (lua_getfield(L, t, name) != LUA_TNIL) {
    v = lua_tonumber(L, -1);
    if (lua_type(L, -1) != LUA_TNUMBER || !(v >= 0 && v < 9e15) || v != floor(v))
      luaL_argerror(L, 1, lua_pushfstring(L, "field '%s' must be an integer >= 0", name));
  }
  lua_pop(L, 1);
  return (uint64_t)v;
}

static double burn_field(lua_State *L, int t) {
  if (lua_getfield(L, t, "burn") == LUA_TNIL) {
    lua_pop(L, 1);
    return 0;
  }
  double v = lua_tonumber(L, -1);
  if (lua_type(L, -1) != LUA_TNUMBER || !(v > 0 && v <= 1e6))
    luaL_argerror(L, 1, "field 'alerts': 'burn' must be a number in (0, 1e6]");
  lua_pop(L, 1);
  return v;
}

/* alerts = {{name, long, short, burn} | {name, burn, consumed}}; nil: the FAQ rule. */
static void alerts_field(lua_State *L, cr_budget_config *c) {
  if (lua_getfield(L, 1, "alerts") == LUA_TNIL) {
    lua_pop(L, 1);
    c->nalerts = 1;
    c->alerts[0] = (cr_budget_alert_config){.name = "faq", .burn_ppb = 2 * CR_PPB,
                                            .consumed_ppb = 800000000};
    return;
  }
  luaL_argcheck(L, lua_istable(L, -1), 1, "field 'alerts' must be a list of tables");
  int list = lua_gettop(L);
  for (lua_Integer i = 1; lua_rawgeti(L, list, i) != LUA_TNIL; i++) {
    luaL_argcheck(L, lua_istable(L, -1) && c->nalerts < CR_BUDGET_MAX_ALERTS, 1,
                  "field 'alerts' must be a list of at most 8 tables");
    int a = lua_gettop(L);
    cr_budget_alert_config *x = &c->alerts[c->nalerts++];
    lua_getfield(L, a, "name"); /* kept on the stack: the core copies it later */
    x->name = lua_isstring(L, -1) ? lua_tostring(L, -1) : "alert";
    x->burn_ppb = llround(burn_field(L, a) * CR_PPB);
    x->long_window = duration_field(L, a, "long", 0);
    x->short_window = duration_field(L, a, "short", 0);
    x->consumed_ppb = fraction_field(L, a, "consumed", 0);
    luaL_argcheck(L, (x->long_window > 0) == (x->short_window > 0), 1,
                  "field 'alerts': 'long' and 'short' go together");
    luaL_argcheck(L, x->long_window > 0 ? x->burn_ppb > 0 : x->burn_ppb > 0 || x->consumed_ppb > 0,
                  1, "field 'alerts': an alert needs 'burn' (and 'long'/'short') or 'consumed'");
  }
  lua_pop(L, 1);
  /* the list and the names stay on the stack until the core is built */
}

/* One key's SLO from targets = {key = 0.98} and expected_events = n (for "*")
 * or {key = n}. */
static void key_config(lua_State *L, lbudget *b, int targets, int expected, const char *k,
                       int64_t target) {
  int64_t tg = lua_istable(L, targets) ? fraction_field(L, targets, k, (double)target / CR_PPB) : target;
  uint64_t ex = 0;
  if (lua_istable(L, expected)) ex = count_field(L, expected, k, 0);
  else if (lua_isinteger(L, expected) && strcmp(k, CR_BUDGET_ALL) == 0) ex = (uint64_t)lua_tointeger(L, expected);
  if (cr_budget_key_config(b->core, k, tg, ex) < 0)
    luaL_argerror(L, 1, lua_pushfstring(L, "key '%s': invalid name or too many keys", k));
  if (!b->config) return;
  if (strcmp(k, CR_BUDGET_ALL) != 0) {
    cJSON *t = cJSON_GetObjectItemCaseSensitive(b->config, "targets");
    cJSON_DeleteItemFromObjectCaseSensitive(t, k); /* named in both tables: once */
    cJSON_AddNumberToObject(t, k, (double)tg / CR_PPB);
  }
  if (ex) {
    cJSON *e = cJSON_GetObjectItemCaseSensitive(b->config, "expected_events");
    cJSON_DeleteItemFromObjectCaseSensitive(e, k);
    cJSON_AddNumberToObject(e, k, (double)ex);
  }
}

static void key_configs(lua_State *L, lbudget *b, int64_t target) {
  lua_getfield(L, 1, "targets");
  luaL_argcheck(L, lua_isnil(L, -1) || lua_istable(L, -1), 1, "field 'targets' must be a table");
  int targets = lua_gettop(L);
  lua_getfield(L, 1, "expected_events");
  int expected = lua_gettop(L);
  luaL_argcheck(L, lua_isnil(L, -1) || lua_istable(L, -1) ||
                   (lua_isinteger(L, -1) && lua_tointeger(L, -1) >= 0), 1,
                "field 'expected_events' must be an integer >= 0 or a table of them");
  key_config(L, b, targets, expected, CR_BUDGET_ALL, target);
  for (int t = targets; t <= expected; t++) {
    if (!lua_istable(L, t)) continue;
    for (lua_pushnil(L); lua_next(L, t); lua_pop(L, 1)) {
      luaL_argcheck(L, lua_type(L, -2) == LUA_TSTRING, 1,
                    "fields 'targets' and 'expected_events' must be keyed by method names");
      key_config(L, b, targets, expected, lua_tostring(L, -2), target);
    }
  }
  lua_pop(L, 2);
}

static void read_config(lua_State *L, cr_budget_config *c) {
  cr_budget_config_default(c);
  c->target_ppb = fraction_field(L, 1, "target", 0.95);
  c->window = duration_field(L, 1, "window", 86400);
  c->warning_ppb = fraction_field(L, 1, "warning", 0.50);
  c->critical_ppb = fraction_field(L, 1, "critical", 0.10);
  c->resolution = duration_field(L, 1, "resolution", 0);
  luaL_argcheck(L, c->resolution <= c->window && c->window / (c->resolution ? c->resolution : 1) <= 1e7,
                1, "field 'resolution' must be <= window and at least window / 1e7");
  c->min_events = count_field(L, 1, "min_events", 0);
  uint64_t mk = count_field(L, 1, "max_keys", 64);
  luaL_argcheck(L, mk >= 1 && mk <= 4096, 1, "field 'max_keys' must be in [1, 4096]");
  c->max_keys = (size_t)mk + 1; /* plus "*" */
  alerts_field(L, c);
}

/* The configuration as the state file stores it (see state_json); per-key
 * targets and expected events are added by key_config. */
static cJSON *config_json(const cr_budget_config *c) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  cJSON_AddNumberToObject(o, "target", (double)c->target_ppb / CR_PPB);
  cJSON_AddItemToObject(o, "targets", cJSON_CreateObject());
  cJSON_AddNumberToObject(o, "warning", (double)c->warning_ppb / CR_PPB);
  cJSON_AddNumberToObject(o, "critical", (double)c->critical_ppb / CR_PPB);
  cJSON_AddNumberToObject(o, "min_events", (double)c->min_events);
  cJSON_AddItemToObject(o, "expected_events", cJSON_CreateObject());
  cJSON_AddNumberToObject(o, "window", c->window);
  if (!cJSON_GetObjectItem(o, "targets") || !cJSON_GetObjectItem(o, "expected_events") ||
      !cJSON_GetObjectItem(o, "window")) {
    cJSON_Delete(o);
    return NULL;
  }
  return o;
}

static void start_timer(lua_State *L, lbudget *b) {
  b->timer = cr_timer_new(b->rt, b);
  if (!b->timer) luaL_error(L, "out of memory");
  double tick = fmax(cr_budget_tick(b->core), MIN_TICK);
  if (b->state) tick = fmin(tick, fmax(b->save_every, MIN_TICK));
  /* first tick at once: a budget restored from state fires its hooks as soon
   * as the script has registered them and the loop runs */
  uv_timer_start(b->timer, timer_cb, 1, (uint64_t)ceil(tick * 1000));
  uv_unref((uv_handle_t *)b->timer); /* no hook yet: nothing to wait for (see on) */
}

static int lcr_budget_new(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checkstack(L, 2 * CR_BUDGET_MAX_ALERTS + 20, "budget configuration");
  cr_budget_config c;
  read_config(L, &c);
  const char *state = NULL;
  if (lua_getfield(L, 1, "state") != LUA_TNIL) {
    luaL_argcheck(L, lua_type(L, -1) == LUA_TSTRING, 1, "field 'state' must be a file name");
    state = lua_tostring(L, -1);
  }
  double save_every = duration_field(L, 1, "save_every", 60);
  cr_runtime *rt = cr_rt_get(L);
  if (cr_rt_closing(rt)) return luaL_error(L, "runtime is shutting down");
  lbudget *b = lua_newuserdatauv(L, sizeof *b, 1);
  memset(b, 0, sizeof *b); /* closed until everything is acquired */
  luaL_setmetatable(L, BUDGET_MT);
  lua_newtable(L);
  lua_setiuservalue(L, -2, 1);
  int rc = cr_budget_new(&c, &b->core);
  if (rc < 0) return rc == -ENOMEM ? luaL_error(L, "out of memory")
                                   : luaL_argerror(L, 1, "invalid budget configuration");
  b->rt = rt;
  b->tick.fn = tick_deferred;
  b->save_every = save_every;
  if (state && !(b->state = strdup(state))) return luaL_error(L, "out of memory");
  if (!(b->config = config_json(&c))) return luaL_error(L, "out of memory");
  key_configs(L, b, c.target_ppb);
  if (b->state) budget_load(b);
  b->last_save = cr_now();
  lua_rawgetp(L, LUA_REGISTRYINDEX, &weak_key);
  lua_pushvalue(L, -2);
  lua_rawsetp(L, -2, b);
  lua_pop(L, 1);
  start_timer(L, b);
  b->res.close = res_close;
  cr_resource_add(rt, &b->res);
  return 1;
}

void cr_register_budget(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"record", lcr_budget_record}, {"report", lcr_budget_report}, {"on", lcr_budget_on},
      {"keys", lcr_budget_keys}, {"save", lcr_budget_save}, {"close", lcr_budget_close},
      {NULL, NULL}};
  static const luaL_Reg meta[] = {
      {"__gc", lcr_budget_close}, {"__close", lcr_budget_close},
      {"__tostring", lcr_budget_tostring}, {NULL, NULL}};
  if (luaL_newmetatable(L, BUDGET_MT)) {
    luaL_setfuncs(L, meta, 0);
    luaL_newlib(L, methods);
    lua_setfield(L, -2, "__index");
  }
  lua_pop(L, 1);
  lua_newtable(L);
  lua_createtable(L, 0, 1);
  lua_pushliteral(L, "v");
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &weak_key);
  lua_pushcfunction(L, lcr_budget_new);
  lua_setfield(L, -2, "budget");
}
