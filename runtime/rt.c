/*
 * rt.c: the runtime object (loop + Lua state), its resources, signals, exit,
 * shutdown, and the public embedding API of captcharun.h.
 *
 * The runtime lives in a full userdata anchored in the registry, created when
 * the `captcha` module is first opened. Its __gc runs last at lua_close (it was
 * the first object marked for finalization), so every other finalizer still
 * finds it alive; the embedding API shuts it down explicitly before lua_close.
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <lualib.h>

#include "rt.h"

#define RT_MT "captcha.runtime"
static const char rt_key = 'r';

double cr_now(void) { return (double)uv_hrtime() / 1e9; }

cr_runtime *cr_rt_find(lua_State *L) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &rt_key);
  cr_runtime *rt = lua_touserdata(L, -1);
  lua_pop(L, 1);
  return rt;
}

cr_runtime *cr_rt_get(lua_State *L) {
  cr_runtime *rt = cr_rt_find(L);
  if (!rt) luaL_error(L, "the captcha runtime is not open in this Lua state");
  return rt;
}

uv_loop_t *cr_rt_loop(cr_runtime *rt) { return &rt->loop; }
lua_State *cr_rt_main(cr_runtime *rt) { return rt->L; }
int cr_rt_closing(cr_runtime *rt) { return rt->closing; }

/* ---- resources ---- */

void cr_resource_add(cr_runtime *rt, cr_resource *r) {
  r->prev = NULL;
  r->next = rt->resources;
  if (rt->resources) rt->resources->prev = r;
  rt->resources = r;
}

void cr_resource_remove(cr_runtime *rt, cr_resource *r) {
  if (!r->prev && rt->resources != r) return; /* not linked: idempotent */
  if (r->prev) r->prev->next = r->next; else rt->resources = r->next;
  if (r->next) r->next->prev = r->prev;
  r->prev = r->next = NULL;
}

void cr_rt_request_exit(cr_runtime *rt, int code) {
  rt->exit_requested = 1;
  rt->exit_code = code;
  uv_stop(&rt->loop);
}

/* ---- signals ---- */

static const char sig_handlers_key = 's';

static void signal_cb(uv_signal_t *h, int signum) {
  cr_runtime *rt = h->data;
  rt->signal_count++;
  if (rt->signal_count > 1 || !rt->signal_handlers) {
    cr_rt_request_exit(rt, 128 + signum);
    return;
  }
  /* Lua handlers run from the runner, never from this callback. */
  rt->pending_signal = signum;
  if (!uv_is_active((uv_handle_t *)&rt->runner)) uv_idle_start(&rt->runner, rt->runner_cb);
}

void cr_signals_dispatch(cr_runtime *rt) {
  int signum = rt->pending_signal;
  rt->pending_signal = 0;
  lua_State *L = rt->L;
  lua_rawgetp(L, LUA_REGISTRYINDEX, &sig_handlers_key);
  int n = (int)lua_rawlen(L, -1);
  for (int i = 1; i <= n; i++) {
    lua_rawgeti(L, -1, i);
    lua_pushstring(L, signum == SIGINT ? "SIGINT" : "SIGTERM");
    cr_spawn_hook(L, 1, "on_signal");
  }
  lua_pop(L, 1);
}

static void signals_start(cr_runtime *rt) {
  if (rt->signals_on) return;
  static const int sigs[2] = {SIGINT, SIGTERM};
  for (int i = 0; i < 2; i++) {
    uv_signal_init(&rt->loop, &rt->sig[i]);
    rt->sig[i].data = rt;
    uv_signal_start(&rt->sig[i], signal_cb, sigs[i]);
    uv_unref((uv_handle_t *)&rt->sig[i]); /* never keeps the process alive */
  }
  rt->signals_on = 1;
}

/* captcha.on_signal(fn): fn(signame) runs as a task at the first SIGINT/SIGTERM;
 * work goes on (drain there); a second signal exits at once with 128+signum. */
static int l_on_signal(lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  cr_runtime *rt = cr_rt_get(L);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &sig_handlers_key);
  lua_pushvalue(L, 1);
  lua_rawseti(L, -2, (lua_Integer)lua_rawlen(L, -2) + 1);
  rt->signal_handlers++;
  signals_start(rt);
  lua_settop(L, 1);
  return 1; /* the handler, for off_signal */
}

/* captcha.off_signal(fn): forget a handler given to on_signal; true if found.
 * A handler pins everything it refers to, so finished work removes its own. */
static int l_off_signal(lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  cr_runtime *rt = cr_rt_get(L);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &sig_handlers_key);
  int n = (int)lua_rawlen(L, -1), found = 0;
  for (int i = 1; i <= n; i++) {
    lua_rawgeti(L, -1, i);
    int same = lua_rawequal(L, -1, 1);
    lua_pop(L, 1);
    if (!same) continue;
    for (int j = i; j < n; j++) {
      lua_rawgeti(L, -1, j + 1);
      lua_rawseti(L, -2, j);
    }
    lua_pushnil(L);
    lua_rawseti(L, -2, n);
    rt->signal_handlers--;
    found = 1;
    break;
  }
  lua_pushboolean(L, found);
  return 1;
}

/* captcha.exit(code): stop the loop, cancel every task and exit with code. */
static int l_exit(lua_State *L) {
  cr_runtime *rt = cr_rt_get(L);
  int code;
  if (lua_isboolean(L, 1)) code = lua_toboolean(L, 1) ? 0 : 1;
  else code = (int)luaL_optinteger(L, 1, 0);
  luaL_argcheck(L, code >= 0 && code <= 255, 1, "exit code must be 0..255");
  cr_rt_request_exit(rt, code);
  if (cr_can_wait(L)) return lua_yield(L, 0); /* parked; shutdown cancels it */
  return 0;
}

void cr_signals_open(lua_State *L) {
  lua_pushcfunction(L, l_on_signal);
  lua_setfield(L, -2, "on_signal");
  lua_pushcfunction(L, l_off_signal);
  lua_setfield(L, -2, "off_signal");
  lua_pushcfunction(L, l_exit);
  lua_setfield(L, -2, "exit");
}

/* ---- creation and shutdown ---- */

static void walk_close(uv_handle_t *h, void *arg) {
  int *leaked = arg;
  if (uv_is_closing(h)) return;
  (*leaked)++;
  cr_logf(CR_LOG_ERROR, "leaked libuv handle at shutdown: %s", uv_handle_type_name(h->type));
  uv_close(h, NULL);
}

/* Cancel tasks, close resources and handles, run the loop until it can close. */
int cr_rt_shutdown(cr_runtime *rt) {
  if (rt->closing) return 0;
  cr_sched_shutdown(rt);
  rt->closing = 1;
  while (rt->resources) {
    cr_resource *r = rt->resources;
    cr_resource_remove(rt, r);
    r->close(r);
  }
  if (rt->signals_on)
    for (int i = 0; i < 2; i++) uv_close((uv_handle_t *)&rt->sig[i], NULL);
  uv_close((uv_handle_t *)&rt->runner, NULL);
  /* whatever is neither closed nor closing now belongs to nobody: a leak */
  int leaked = 0;
  uv_walk(&rt->loop, walk_close, &leaked);
  uv_run(&rt->loop, UV_RUN_DEFAULT);
  while (uv_loop_close(&rt->loop) == UV_EBUSY) {
    uv_walk(&rt->loop, walk_close, &leaked);
    uv_run(&rt->loop, UV_RUN_DEFAULT);
  }
  rt->leaked_handles = leaked;
  return leaked;
}

static int rt_gc(lua_State *L) {
  cr_runtime *rt = luaL_checkudata(L, 1, RT_MT);
  cr_rt_shutdown(rt);
  return 0;
}

cr_runtime *cr_rt_create(lua_State *L) {
  cr_runtime *rt = lua_newuserdatauv(L, sizeof *rt, 0);
  memset(rt, 0, sizeof *rt);
  int err = uv_loop_init(&rt->loop);
  if (err) luaL_error(L, "uv_loop_init: %s", uv_strerror(err));
  if (luaL_newmetatable(L, RT_MT)) {
    lua_pushcfunction(L, rt_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &rt_key);
  rt->L = lua_newthread(L); /* scratch thread for the scheduler's own pushes */
  rt->scratch_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  rt->main = lua_tothread(L, -1);
  lua_pop(L, 1);
  lua_newtable(L);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &sig_handlers_key);
  cr_sched_init(rt);
  /* a peer closing a socket must be an error value, not the death of the
   * process; a host that chose its own SIGPIPE handling keeps it */
  struct sigaction sa;
  if (sigaction(SIGPIPE, NULL, &sa) == 0 && sa.sa_handler == SIG_DFL) signal(SIGPIPE, SIG_IGN);
  return rt;
}

/* ---- the embedding API (captcharun.h) ---- */

/* Count integer keys of the registry: the references luaL_ref handed out. */
static int registry_refs(lua_State *L) {
  int n = 0;
  lua_pushnil(L);
  while (lua_next(L, LUA_REGISTRYINDEX)) {
    if (lua_isinteger(L, -2) && lua_tointeger(L, -2) > LUA_RIDX_LAST && !lua_isinteger(L, -1)) n++;
    lua_pop(L, 1);
  }
  return n;
}

static int exists_dir(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The Lua library: the option, else installed next to the executable
 * (<prefix>/bin/captcharun -> <prefix>/share/lua/5.4), else the source tree
 * the executable was built from. */
static void find_lua_dir(char *out, size_t n, const char *opt) {
  if (opt) { snprintf(out, n, "%s", opt); return; }
  char exe[PATH_MAX];
  size_t len = sizeof exe;
  if (uv_exepath(exe, &len) == 0) {
    char *slash = strrchr(exe, '/');
    if (slash) {
      *slash = '\0';
      /* snprintf's result is checked: a truncated path is no path */
      int k = snprintf(out, n, "%.*s/../%s/captcha", (int)(n / 2), exe, CR_INSTALL_LUADIR_REL);
      if (k > 0 && (size_t)k < n && exists_dir(out)) {
        out[k - (int)strlen("/captcha")] = '\0';
        return;
      }
    }
  }
  snprintf(out, n, "%s", CR_SOURCE_LUADIR);
}

static void set_paths(lua_State *L, const char *dir) {
  lua_getglobal(L, "package");
  lua_pushfstring(L, "%s/?.lua;%s/?/init.lua;", dir, dir);
  lua_getfield(L, -2, "path");
  lua_concat(L, 2);
  lua_setfield(L, -2, "path");
  lua_pop(L, 1);
}

static void set_arg(lua_State *L, const cr_options *o) {
  lua_createtable(L, o->argc, o->script_index + 1);
  for (int i = 0; i < o->argc; i++) {
    lua_pushstring(L, o->argv[i]);
    lua_rawseti(L, -2, i - o->script_index);
  }
  lua_setglobal(L, "arg");
}

cr_runtime *cr_runtime_new(const cr_options *opt) {
  cr_options defaults = {0};
  defaults.log_level = CR_LOG_INFO;
  const cr_options *o = opt ? opt : &defaults;
  lua_State *L = luaL_newstate();
  if (!L) return NULL;
  luaL_openlibs(L);
  char dir[PATH_MAX];
  find_lua_dir(dir, sizeof dir, o->lua_dir);
  set_paths(L, dir);
  set_arg(L, o);
  cr_log_configure(o->log_level, o->log_format);
  cr_rt_create(L);
  lua_pushcfunction(L, cr_open_module);
  lua_call(L, 0, 1);
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "loaded");
  lua_pushvalue(L, -3);
  lua_setfield(L, -2, "captcha");
  lua_pop(L, 3);
  cr_runtime *rt = cr_rt_get(L);
  rt->baseline_refs = registry_refs(L);
  if (o->handle_signals) signals_start(rt);
  return rt;
}

lua_State *cr_runtime_lua(cr_runtime *rt) { return rt->main; }
uv_loop_t *cr_runtime_loop(cr_runtime *rt) { return &rt->loop; }

static int run_loaded(cr_runtime *rt, int nargs) {
  lua_State *L = rt->main;
  int base = lua_gettop(L) - nargs - 1;
  rt->exit_requested = 0;
  rt->failed = 0;
  cr_spawn_main(rt, L, nargs);
  int status = cr_drive(rt);
  int main_failed = cr_main_failed(rt, L);
  if (main_failed && !rt->exit_requested) status = 1;
  lua_settop(L, base);
  return status;
}

static int script_args(lua_State *L) {
  lua_getglobal(L, "arg");
  int n = 0;
  if (lua_istable(L, -1)) {
    n = (int)lua_rawlen(L, -1);
    luaL_checkstack(L, n + 3, "too many arguments to script");
    for (int i = 1; i <= n; i++) lua_rawgeti(L, -i, i);
  }
  lua_remove(L, -n - 1);
  return n;
}

int cr_runtime_run_file(cr_runtime *rt, const char *path) {
  lua_State *L = rt->main;
  if (path && strcmp(path, "-") == 0) path = NULL;
  if (luaL_loadfilex(L, path, NULL) != LUA_OK) {
    cr_logf(CR_LOG_ERROR, "%s", lua_tostring(L, -1));
    lua_pop(L, 1);
    return 1;
  }
  return run_loaded(rt, script_args(L));
}

int cr_runtime_run_string(cr_runtime *rt, const char *code, const char *name) {
  lua_State *L = rt->main;
  if (luaL_loadbufferx(L, code, strlen(code), name ? name : "=(command line)", "t") != LUA_OK) {
    cr_logf(CR_LOG_ERROR, "%s", lua_tostring(L, -1));
    lua_pop(L, 1);
    return 1;
  }
  return run_loaded(rt, 0);
}

int cr_runtime_check_leaks(cr_runtime *rt) {
  int leaked = cr_rt_shutdown(rt);
  lua_State *L = rt->main;
  lua_gc(L, LUA_GCCOLLECT);
  lua_gc(L, LUA_GCCOLLECT);
  /* results of finished tasks whose handles are still reachable (a global,
   * a table) are owned, not leaked: each is released with its handle */
  int refs = registry_refs(L) - rt->baseline_refs - rt->result_refs;
  if (leaked || refs > 0)
    cr_logf(CR_LOG_ERROR, "leak check: %d libuv handle(s), %d registry reference(s) left", leaked, refs);
  return leaked + (refs > 0 ? refs : 0);
}

void cr_runtime_close(cr_runtime *rt) {
  if (!rt) return;
  lua_State *L = rt->main;
  cr_rt_shutdown(rt);
  lua_close(L); /* rt is freed with its userdata here */
}
